--- ddplua.optim.LRScheduler: the base class of the learning-rate schedulers (PyTorch's
-- torch.optim.lr_scheduler.LRScheduler,
-- https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate).
--
-- Constructing a scheduler records each group's `initial_lr` (when last_epoch is -1; an
-- existing initial_lr is kept, as PyTorch's setdefault), takes base_lrs from them and calls
-- step() once, so after construction last_epoch is 0 and the groups hold the epoch-0 lr.
-- sched:step() advances last_epoch and sets every group's lr from get_lr(), the recursive
-- ("chainable") form PyTorch's step uses; closed_form_lr() gives the closed form where
-- the class has one. Subclasses (one per file) give `name` and get_lr().
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local Optimizer = require "ddplua.optim.optimizer"

local M = {}
M.__index = M

--- LRScheduler.subclass(name): a new scheduler class, callable as Class(optimizer, opts).
function M.subclass(name)
  local cls = { name = name }
  cls.__index = cls
  return setmetatable(cls, { __index = M, __call = function(c, ...) return c.new(...) end })
end

--- Common construction: self gets `optimizer`, base_lrs, last_epoch; then one step().
-- last_epoch other than -1 resumes: every group must then hold initial_lr.
function M.init(self, optimizer, last_epoch)
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    lib.raise(self.name .. ": the first argument must be an optimizer")
  end
  last_epoch = last_epoch or -1
  if type(last_epoch) ~= "number" or last_epoch < -1 or last_epoch % 1 ~= 0 then
    lib.raise(self.name .. ": invalid last_epoch " .. tostring(last_epoch) .. " (an integer >= -1)")
  end
  self.optimizer = optimizer
  for i, group in ipairs(optimizer.param_groups) do
    if last_epoch == -1 then
      if group.initial_lr == nil then group.initial_lr = group.lr end
    elseif group.initial_lr == nil then
      lib.raise(("%s: param 'initial_lr' is not specified in param_groups[%d] when resuming (last_epoch %d)"):format(
        self.name, i, last_epoch))
    end
  end
  self.base_lrs = {}
  for i, group in ipairs(optimizer.param_groups) do self.base_lrs[i] = group.initial_lr end
  self.last_epoch = last_epoch
  self:initial_step()
  return self
end

--- sched:initial_step(): reset the step count and take the construction step (PyTorch's
-- _initial_step; SequentialLR calls it on its first scheduler).
function M:initial_step()
  self._step_count = 0
  self:step()
end

--- sched:step([epoch]): advance one epoch (or iteration) and set each group's lr.
-- With `epoch` (an integer >= 0; PyTorch deprecates it for users, SequentialLR uses it at
-- its milestones) last_epoch jumps to it and the lr comes from closed_form_lr() where the
-- class has one, else from get_lr(), as PyTorch's step(epoch). Raises on a bad epoch.
function M:step(epoch)
  self._step_count = self._step_count + 1
  local values
  if epoch == nil then
    self.last_epoch = self.last_epoch + 1
    values = self:get_lr()
  else
    if type(epoch) ~= "number" or epoch < 0 or epoch % 1 ~= 0 then
      lib.raise(self.name .. ": step(epoch): epoch must be an integer >= 0, got " .. tostring(epoch))
    end
    self.last_epoch = epoch
    values = self.closed_form_lr and self:closed_form_lr() or self:get_lr()
  end
  local last = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    group.lr = values[i]
    last[i] = values[i]
  end
  self._last_lr = last
end

--- sched:get_last_lr(): the lr of each group set by the last step() (a new table).
function M:get_last_lr()
  local out = {}
  for i, v in ipairs(self._last_lr) do out[i] = v end
  return out
end

--- sched:state_dict(): every field but the optimizer, copied (numbers, booleans, strings,
-- tables of them), as PyTorch's {k: v for k, v in __dict__ if k != "optimizer"}.
function M:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" then sd[k] = Optimizer.copy_value(v) end
  end
  return sd
end

--- sched:load_state_dict(sd): take the fields back (the optimizer stays).
function M:load_state_dict(sd)
  if type(sd) ~= "table" then lib.raise(self.name .. ": load_state_dict expects a table") end
  for k, v in pairs(sd) do
    if k ~= "optimizer" then self[k] = Optimizer.copy_value(v) end
  end
end

-- ---- option helpers shared by the subclasses ---------------------------------------------

--- The options table (nil gives {}); raises on a key not in `allowed`.
function M.options(name, opts, allowed)
  return options.check(name, opts, allowed)
end

--- Raise "<Name>: invalid <option> <value> (<why>)".
function M.invalid(name, option, value, why)
  lib.raise(("%s: invalid %s %s (%s)"):format(name, option, tostring(value), why))
end

--- A positive integer option.
function M.positive_int(name, option, v)
  if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then M.invalid(name, option, v, "must be a positive integer") end
  return v
end

--- A number option.
function M.number(name, option, v)
  if type(v) ~= "number" or v ~= v then M.invalid(name, option, v, "must be a number") end
  return v
end

return M
