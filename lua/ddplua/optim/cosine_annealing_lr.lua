--- ddplua.optim.CosineAnnealingLR: cosine annealing from base_lr to eta_min over T_max
-- epochs (PyTorch's torch.optim.lr_scheduler.CosineAnnealingLR; Loshchilov & Hutter, "SGDR:
-- Stochastic Gradient Descent with Warm Restarts", without the restarts). Closed form:
--   lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
-- (past T_max it rises again, a cosine of period 2 * T_max, as PyTorch).
--
--   local sched = optim.CosineAnnealingLR(opt, {T_max = 100, eta_min = 0})
--
-- Errors: T_max not a positive integer, eta_min not a number.
local LRScheduler = require "ddplua.optim.lr_scheduler"

local CosineAnnealingLR = LRScheduler.subclass("CosineAnnealingLR")

--- CosineAnnealingLR(optimizer, opts) -> the scheduler (a subclass of LRScheduler), opts as described
-- above; raises on an unknown or invalid option.
function CosineAnnealingLR.new(optimizer, opts)
  local name = "CosineAnnealingLR"
  opts = LRScheduler.options(name, opts, { T_max = true, eta_min = true, last_epoch = true })
  local self = setmetatable({}, CosineAnnealingLR)
  self.T_max = LRScheduler.positive_int(name, "T_max", opts.T_max)
  self.eta_min = LRScheduler.number(name, "eta_min", opts.eta_min or 0)
  return LRScheduler.init(self, optimizer, opts.last_epoch)
end

--- PyTorch's recursive form: each step multiplies (lr - eta_min) by the ratio of
-- consecutive cosine factors; at the restart points of the period it adds the step back.
function CosineAnnealingLR:get_lr()
  local e, T, eta_min = self.last_epoch, self.T_max, self.eta_min
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    local base = self.base_lrs[i]
    if e == 0 then
      out[i] = group.lr
    elseif self._step_count == 1 and e > 0 then
      out[i] = eta_min + (base - eta_min) * (1 + math.cos(e * math.pi / T)) / 2
    elseif (e - 1 - T) % (2 * T) == 0 then
      out[i] = group.lr + (base - eta_min) * (1 - math.cos(math.pi / T)) / 2
    else
      out[i] = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T))
        * (group.lr - eta_min) + eta_min
    end
  end
  return out
end

function CosineAnnealingLR:closed_form_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do
    out[i] = self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
  end
  return out
end

return CosineAnnealingLR
