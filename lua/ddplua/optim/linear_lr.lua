--- ddplua.optim.LinearLR: scale each group's lr linearly from start_factor to end_factor
-- over total_iters steps, then keep it (PyTorch's torch.optim.lr_scheduler.LinearLR; the
-- usual warm-up). Closed form:
--   lr = base_lr * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) / total_iters)
--
--   local sched = optim.LinearLR(opt, {start_factor = 1/3, end_factor = 1, total_iters = 5})
--
-- Errors: start_factor outside (0, 1], end_factor outside [0, 1], total_iters not a
-- positive integer.
local LRScheduler = require "ddplua.optim.lr_scheduler"

local LinearLR = LRScheduler.subclass("LinearLR")

--- LinearLR(optimizer, opts) -> the scheduler (a subclass of LRScheduler), opts as described
-- above; raises on an unknown or invalid option.
function LinearLR.new(optimizer, opts)
  local name = "LinearLR"
  opts = LRScheduler.options(name, opts, { start_factor = true, end_factor = true, total_iters = true, last_epoch = true })
  local self = setmetatable({}, LinearLR)
  local s, e = opts.start_factor or 1 / 3, opts.end_factor or 1
  if type(s) ~= "number" or not (s > 0 and s <= 1) then
    LRScheduler.invalid(name, "start_factor", s, "must be > 0 and <= 1")
  end
  if type(e) ~= "number" or not (e >= 0 and e <= 1) then
    LRScheduler.invalid(name, "end_factor", e, "must be in [0, 1]")
  end
  self.start_factor, self.end_factor = s, e
  self.total_iters = LRScheduler.positive_int(name, "total_iters", opts.total_iters or 5)
  return LRScheduler.init(self, optimizer, opts.last_epoch)
end

--- PyTorch's recursive form: lr * start_factor at epoch 0, then the ratio of consecutive
-- factors up to total_iters, then lr unchanged.
function LinearLR:get_lr()
  local e, s, f, n = self.last_epoch, self.start_factor, self.end_factor, self.total_iters
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    if e == 0 then
      out[i] = group.lr * s
    elseif e > n then
      out[i] = group.lr
    else
      out[i] = group.lr * (1 + (f - s) / (n * s + (e - 1) * (f - s)))
    end
  end
  return out
end

function LinearLR:closed_form_lr()
  local s, f, n = self.start_factor, self.end_factor, self.total_iters
  local out = {}
  for i, base in ipairs(self.base_lrs) do
    out[i] = base * (s + (f - s) * math.min(n, self.last_epoch) / n)
  end
  return out
end

return LinearLR
