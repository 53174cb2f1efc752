--- ddplua.optim.MultiStepLR: multiply each group's lr by gamma at each milestone epoch
-- (PyTorch's torch.optim.lr_scheduler.MultiStepLR; a milestone listed twice applies gamma
-- twice). Closed form: lr = base_lr * gamma^(number of milestones <= epoch).
--
--   local sched = optim.MultiStepLR(opt, {milestones = {30, 80}, gamma = 0.1})
--
-- Errors: milestones not a list of non-negative integers, gamma not a number.
local LRScheduler = require "ddplua.optim.lr_scheduler"

local MultiStepLR = LRScheduler.subclass("MultiStepLR")

--- MultiStepLR(optimizer, opts) -> the scheduler (a subclass of LRScheduler), opts as described
-- above; raises on an unknown or invalid option.
function MultiStepLR.new(optimizer, opts)
  local name = "MultiStepLR"
  opts = LRScheduler.options(name, opts, { milestones = true, gamma = true, last_epoch = true })
  local self = setmetatable({}, MultiStepLR)
  local ms = opts.milestones
  if type(ms) ~= "table" then LRScheduler.invalid(name, "milestones", ms, "must be a list of epochs") end
  local sorted = {}
  for i, m in ipairs(ms) do
    if type(m) ~= "number" or m < 0 or m % 1 ~= 0 then
      LRScheduler.invalid(name, "milestones", m, "entries must be integers >= 0")
    end
    sorted[i] = m
  end
  table.sort(sorted)
  self.milestones = sorted
  self.gamma = LRScheduler.number(name, "gamma", opts.gamma or 0.1)
  return LRScheduler.init(self, optimizer, opts.last_epoch)
end

--- Recursive form: lr * gamma^(times last_epoch is listed), else lr.
function MultiStepLR:get_lr()
  local count = 0
  for _, m in ipairs(self.milestones) do if m == self.last_epoch then count = count + 1 end end
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    out[i] = count == 0 and group.lr or group.lr * self.gamma ^ count
  end
  return out
end

function MultiStepLR:closed_form_lr()
  local passed = 0
  for _, m in ipairs(self.milestones) do if m <= self.last_epoch then passed = passed + 1 end end
  local out = {}
  for i, base in ipairs(self.base_lrs) do out[i] = base * self.gamma ^ passed end
  return out
end

return MultiStepLR
