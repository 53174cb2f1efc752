--- ddplua.optim.StepLR: multiply each group's lr by gamma every step_size epochs (PyTorch's
-- torch.optim.lr_scheduler.StepLR). Closed form: lr = base_lr * gamma^floor(epoch / step_size).
--
--   local sched = optim.StepLR(opt, {step_size = 30, gamma = 0.1, last_epoch = -1})
--
-- Errors: step_size not a positive integer, gamma not a number.
local LRScheduler = require "ddplua.optim.lr_scheduler"

local StepLR = LRScheduler.subclass("StepLR")

--- StepLR(optimizer, opts) -> the scheduler (a subclass of LRScheduler), opts as described
-- above; raises on an unknown or invalid option.
function StepLR.new(optimizer, opts)
  opts = LRScheduler.options("StepLR", opts, { step_size = true, gamma = true, last_epoch = true })
  local self = setmetatable({}, StepLR)
  self.step_size = LRScheduler.positive_int("StepLR", "step_size", opts.step_size)
  self.gamma = LRScheduler.number("StepLR", "gamma", opts.gamma or 0.1)
  return LRScheduler.init(self, optimizer, opts.last_epoch)
end

--- Recursive form (PyTorch's get_lr): lr * gamma at each multiple of step_size, else lr.
function StepLR:get_lr()
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then out[i] = group.lr
    else out[i] = group.lr * self.gamma end
  end
  return out
end

function StepLR:closed_form_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do
    out[i] = base * self.gamma ^ math.floor(self.last_epoch / self.step_size)
  end
  return out
end

return StepLR
