--- ddplua.optim.ExponentialLR: multiply each group's lr by gamma every epoch (PyTorch's
-- torch.optim.lr_scheduler.ExponentialLR). Closed form: lr = base_lr * gamma^epoch.
--
--   local sched = optim.ExponentialLR(opt, {gamma = 0.9})
--
-- Errors: gamma missing or not a number.
local LRScheduler = require "ddplua.optim.lr_scheduler"

local ExponentialLR = LRScheduler.subclass("ExponentialLR")

--- ExponentialLR(optimizer, opts) -> the scheduler (a subclass of LRScheduler), opts as described
-- above; raises on an unknown or invalid option.
function ExponentialLR.new(optimizer, opts)
  opts = LRScheduler.options("ExponentialLR", opts, { gamma = true, last_epoch = true })
  local self = setmetatable({}, ExponentialLR)
  self.gamma = LRScheduler.number("ExponentialLR", "gamma", opts.gamma)
  return LRScheduler.init(self, optimizer, opts.last_epoch)
end

--- Recursive form: lr at epoch 0, then lr * gamma.
function ExponentialLR:get_lr()
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    out[i] = self.last_epoch == 0 and group.lr or group.lr * self.gamma
  end
  return out
end

function ExponentialLR:closed_form_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do out[i] = base * self.gamma ^ self.last_epoch end
  return out
end

return ExponentialLR
