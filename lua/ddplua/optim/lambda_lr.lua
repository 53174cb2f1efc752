--- ddplua.optim.LambdaLR: each group's lr is its initial lr times a function of the epoch
-- (PyTorch's torch.optim.lr_scheduler.LambdaLR). Closed form:
--   lr[i] = base_lr[i] * lr_lambda[i](epoch)
--
--   local sched = optim.LambdaLR(opt, function(epoch) return 0.95 ^ epoch end)
--   local sched = optim.LambdaLR(opt, {f1, f2})          -- one function per param group
--   local sched = optim.LambdaLR(opt, {lr_lambda = f, last_epoch = -1})   -- options form
--
-- epoch counts the step() calls (0 after construction). state_dict() leaves the functions
-- out (PyTorch keeps only callable objects' fields; a Lua function has none), so a resumed
-- run builds the scheduler with its functions again and then loads the state.
-- Errors: lr_lambda neither a function nor a list of them, a list whose length is not the
-- number of param groups ("Expected 2 lr_lambdas, but got 3", PyTorch's text), a function
-- that returns something other than a number (naming the group and the epoch).
local lib = require "ddplua.lib"
local LRScheduler = require "ddplua.optim.lr_scheduler"

local LambdaLR = LRScheduler.subclass("LambdaLR")

-- Is v a list of lr_lambdas (rather than an options table)?
local function is_function_list(v)
  return type(v) == "table" and v.lr_lambda == nil and v.last_epoch == nil
end

--- LambdaLR(optimizer, lr_lambda[, opts]) or LambdaLR(optimizer, {lr_lambda =, last_epoch =})
-- -> the scheduler (a subclass of LRScheduler). lr_lambda: a function(epoch) -> factor, or a
-- list of such functions, one per param group. opts.last_epoch as every scheduler (-1: a
-- new schedule). Raises as described at the top of this file.
function LambdaLR.new(optimizer, lr_lambda, opts)
  local name = "LambdaLR"
  if type(lr_lambda) == "table" and not is_function_list(lr_lambda) then
    if opts ~= nil then lib.raise(name .. ": give lr_lambda either in the options table or as the second argument") end
    opts = LRScheduler.options(name, lr_lambda, { lr_lambda = true, last_epoch = true })
    lr_lambda = opts.lr_lambda
  else
    opts = LRScheduler.options(name, opts, { last_epoch = true })
  end
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    lib.raise(name .. ": the first argument must be an optimizer")
  end
  local ngroups = #optimizer.param_groups
  local self = setmetatable({}, LambdaLR)
  local lambdas = {}
  if type(lr_lambda) == "function" then
    for i = 1, ngroups do lambdas[i] = lr_lambda end
  elseif type(lr_lambda) == "table" then
    if #lr_lambda ~= ngroups then
      lib.raise(("%s: Expected %d lr_lambdas, but got %d"):format(name, ngroups, #lr_lambda))
    end
    for i = 1, ngroups do
      if type(lr_lambda[i]) ~= "function" then
        LRScheduler.invalid(name, ("lr_lambda[%d]"):format(i), lr_lambda[i], "must be a function(epoch) -> factor")
      end
      lambdas[i] = lr_lambda[i]
    end
  else
    LRScheduler.invalid(name, "lr_lambda", lr_lambda, "must be a function(epoch) -> factor or a list of them, one per param group")
  end
  self.lr_lambdas = lambdas
  return LRScheduler.init(self, optimizer, opts.last_epoch)
end

--- base_lr[i] * lr_lambdas[i](last_epoch) for every group (the closed form is the only form).
function LambdaLR:get_lr()
  local out, e = {}, self.last_epoch
  for i, base in ipairs(self.base_lrs) do
    local f = self.lr_lambdas[i](e)
    if type(f) ~= "number" then
      lib.raise(("LambdaLR: lr_lambda of param group %d returned %s at epoch %d, expected a number"):format(
        i, type(f), e))
    end
    out[i] = base * f
  end
  return out
end

--- sched:state_dict(): every field but the optimizer and the functions.
function LambdaLR:state_dict()
  local fns = self.lr_lambdas
  self.lr_lambdas = nil
  local ok, sd = pcall(LRScheduler.state_dict, self)
  self.lr_lambdas = fns
  if not ok then error(sd, 0) end
  return sd
end

--- sched:load_state_dict(sd): take the fields back; the functions stay this scheduler's.
function LambdaLR:load_state_dict(sd)
  local fns = self.lr_lambdas
  LRScheduler.load_state_dict(self, sd)
  self.lr_lambdas = fns
end

return LambdaLR
