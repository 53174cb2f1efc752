--- ddplua.optim.SequentialLR: hand the schedule from one scheduler to the next at given
-- epochs (PyTorch's torch.optim.lr_scheduler.SequentialLR, 1.13 semantics).
--
--   local warm = optim.LinearLR(opt, {start_factor = 0.01, total_iters = 100})
--   local cos = optim.CosineAnnealingLR(opt, {T_max = 1900, eta_min = 1e-4})
--   local sched = optim.SequentialLR(opt, {warm, cos}, {100})
--   -- or optim.SequentialLR(opt, {schedulers = {warm, cos}, milestones = {100}})
--
-- Semantics (as PyTorch): construction puts every group's lr back to its initial_lr, moves
-- each scheduler's last_epoch back by one (undoing their construction steps) and takes
-- the first scheduler's construction step again, so epoch 0 is the first scheduler's.
-- step() advances last_epoch to e; scheduler k = #{milestones <= e} (0-based) runs: at
-- its milestone (e == milestones[k]) with step(0) (its closed form at epoch 0: the
-- schedule restarts from the initial lr), otherwise with step(). The schedulers keep their
-- own last_epoch; SequentialLR's counts every step. get_last_lr() is the running
-- scheduler's. state_dict() holds SequentialLR's fields and each scheduler's state_dict
-- under `_schedulers`.
-- Errors (PyTorch's texts): a scheduler of another optimizer, milestones not one fewer
-- than the schedulers; also milestones that are not increasing positive integers.
local lib = require "ddplua.lib"
local LRScheduler = require "ddplua.optim.lr_scheduler"
local Optimizer = require "ddplua.optim.optimizer"

local SequentialLR = LRScheduler.subclass("SequentialLR")

--- SequentialLR(optimizer, schedulers, milestones[, opts]) or SequentialLR(optimizer,
-- {schedulers =, milestones =, last_epoch =}) -> the scheduler. schedulers: a list of
-- schedulers built on `optimizer`; milestones: #schedulers - 1 increasing epochs. Raises as
-- described at the top of this file.
function SequentialLR.new(optimizer, schedulers, milestones, opts)
  local name = "SequentialLR"
  if type(schedulers) == "table" and schedulers.schedulers ~= nil then
    if milestones ~= nil or opts ~= nil then
      lib.raise(name .. ": give schedulers and milestones either in the options table or as arguments")
    end
    opts = LRScheduler.options(name, schedulers, { schedulers = true, milestones = true, last_epoch = true })
    schedulers, milestones = opts.schedulers, opts.milestones
  else
    opts = LRScheduler.options(name, opts, { last_epoch = true })
  end
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    lib.raise(name .. ": the first argument must be an optimizer")
  end
  if type(schedulers) ~= "table" or #schedulers == 0 then
    LRScheduler.invalid(name, "schedulers", schedulers, "must be a non-empty list of schedulers")
  end
  for i, s in ipairs(schedulers) do
    if type(s) ~= "table" or type(s.step) ~= "function" then
      LRScheduler.invalid(name, ("schedulers[%d]"):format(i), s, "must be a scheduler")
    end
    if s.optimizer ~= optimizer then
      lib.raise(("%s: Sequential Schedulers expects all schedulers to belong to the same optimizer, but got "
        .. "schedulers at index %d to be different than the optimizer passed in."):format(name, i - 1))
    end
  end
  if type(milestones) ~= "table" or #milestones ~= #schedulers - 1 then
    lib.raise(("%s: Sequential Schedulers expects number of schedulers provided to be one more than the number "
      .. "of milestone points, but got number of schedulers %d and the number of milestones to be equal to %s"):format(
      name, #schedulers, type(milestones) == "table" and #milestones or tostring(milestones)))
  end
  for i, m in ipairs(milestones) do
    if type(m) ~= "number" or m < 1 or m % 1 ~= 0 or (i > 1 and m <= milestones[i - 1]) then
      LRScheduler.invalid(name, ("milestones[%d]"):format(i), m, "milestones must be increasing positive integers")
    end
  end
  local last_epoch = opts.last_epoch or -1
  if type(last_epoch) ~= "number" or last_epoch < -1 or last_epoch % 1 ~= 0 then
    LRScheduler.invalid(name, "last_epoch", last_epoch, "an integer >= -1")
  end
  local self = setmetatable({}, SequentialLR)
  self.optimizer = optimizer
  self._schedulers = {}
  for i, s in ipairs(schedulers) do self._schedulers[i] = s end
  self._milestones = {}
  for i, m in ipairs(milestones) do self._milestones[i] = m end
  self.last_epoch = last_epoch + 1
  for _, group in ipairs(optimizer.param_groups) do group.lr = group.initial_lr end
  for _, s in ipairs(self._schedulers) do s.last_epoch = s.last_epoch - 1 end
  self._schedulers[1]:initial_step()
  self._last_lr = self._schedulers[1]:get_last_lr()
  return self
end

--- sched:step(): one epoch (or iteration) of the running scheduler (see the top).
function SequentialLR:step()
  self.last_epoch = self.last_epoch + 1
  local e, ms = self.last_epoch, self._milestones
  local k = 0 -- milestones passed: bisect_right(milestones, e)
  while k < #ms and ms[k + 1] <= e do k = k + 1 end
  local s = self._schedulers[k + 1]
  if k > 0 and ms[k] == e then s:step(0) else s:step() end
  self._last_lr = s:get_last_lr()
end

--- sched:state_dict(): SequentialLR's fields and `_schedulers`, the list of each
-- scheduler's state_dict().
function SequentialLR:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" and k ~= "_schedulers" then sd[k] = Optimizer.copy_value(v) end
  end
  sd._schedulers = {}
  for i, s in ipairs(self._schedulers) do sd._schedulers[i] = s:state_dict() end
  return sd
end

--- sched:load_state_dict(sd): the fields back, and each scheduler's state into it. Raises
-- when sd holds another number of schedulers.
function SequentialLR:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd._schedulers) ~= "table" then
    lib.raise("SequentialLR: load_state_dict expects a table made by state_dict() (with _schedulers)")
  end
  if #sd._schedulers ~= #self._schedulers then
    lib.raise(("SequentialLR: loaded state holds %d schedulers, this one has %d"):format(
      #sd._schedulers, #self._schedulers))
  end
  for k, v in pairs(sd) do
    if k ~= "optimizer" and k ~= "_schedulers" then self[k] = Optimizer.copy_value(v) end
  end
  for i, s in ipairs(self._schedulers) do s:load_state_dict(sd._schedulers[i]) end
end

return SequentialLR
