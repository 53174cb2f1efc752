--- ddplua.optim.WarmupCosineLR: nanoGPT's learning-rate schedule, a linear warm-up then a
-- cosine decay to min_lr, as a LambdaLR (train.py's get_lr in karpathy/nanoGPT):
--   it <  warmup_iters:   lr = base_lr * (it + 1) / (warmup_iters + 1)
--   it >  lr_decay_iters: lr = min_lr
--   otherwise:            lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * r)) / 2,
--                         r = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
-- where `it` is the scheduler's epoch (0 after construction: step() once per iteration,
-- after opt:step(), as every scheduler) and base_lr each group's initial lr. min_lr is an
-- absolute lr, nanoGPT's (learning_rate / 10 there), shared by the groups; a group whose
-- base_lr is 0 stays at 0.
--
--   local sched = optim.WarmupCosineLR(opt, {warmup_iters = 100, lr_decay_iters = 2000, min_lr = 1e-4})
--
-- The same shape from PyTorch's parts: SequentialLR of a LinearLR warm-up and a
-- CosineAnnealingLR (which starts the warm-up at start_factor rather than 1/(warmup+1)).
-- The result is a LambdaLR (its state_dict and resume are LambdaLR's; build it again with
-- the same options before loading). Errors: warmup_iters not an integer >= 0,
-- lr_decay_iters not an integer > warmup_iters, min_lr not a number >= 0.
local LRScheduler = require "ddplua.optim.lr_scheduler"
local LambdaLR = require "ddplua.optim.lambda_lr"

local M = {}

--- WarmupCosineLR.lr(it, base_lr, opts) -> nanoGPT's get_lr(it) for learning_rate = base_lr
-- and opts {warmup_iters, lr_decay_iters, min_lr} (checked by the constructor).
function M.lr(it, base_lr, o)
  if it < o.warmup_iters then return base_lr * (it + 1) / (o.warmup_iters + 1) end
  if it > o.lr_decay_iters then return o.min_lr end
  local r = (it - o.warmup_iters) / (o.lr_decay_iters - o.warmup_iters)
  return o.min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (base_lr - o.min_lr)
end

--- WarmupCosineLR(optimizer, opts) -> a LambdaLR following nanoGPT's get_lr (see the top).
-- opts: warmup_iters (integer >= 0), lr_decay_iters (integer > warmup_iters), min_lr (>= 0,
-- default 0), last_epoch (-1). Raises naming a bad option.
function M.new(optimizer, opts)
  local name = "WarmupCosineLR"
  opts = LRScheduler.options(name, opts, { warmup_iters = true, lr_decay_iters = true, min_lr = true, last_epoch = true })
  local o = { warmup_iters = opts.warmup_iters, lr_decay_iters = opts.lr_decay_iters, min_lr = opts.min_lr or 0 }
  if type(o.warmup_iters) ~= "number" or o.warmup_iters < 0 or o.warmup_iters % 1 ~= 0 then
    LRScheduler.invalid(name, "warmup_iters", o.warmup_iters, "must be an integer >= 0")
  end
  if type(o.lr_decay_iters) ~= "number" or o.lr_decay_iters <= o.warmup_iters or o.lr_decay_iters % 1 ~= 0 then
    LRScheduler.invalid(name, "lr_decay_iters", o.lr_decay_iters, "must be an integer > warmup_iters")
  end
  if type(o.min_lr) ~= "number" or not (o.min_lr >= 0) then
    LRScheduler.invalid(name, "min_lr", o.min_lr, "must be a number >= 0")
  end
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    LRScheduler.invalid(name, "optimizer", optimizer, "the first argument must be an optimizer")
  end
  local lambdas = {}
  for i, group in ipairs(optimizer.param_groups) do
    local base = group.initial_lr or group.lr -- what LambdaLR takes as this group's base_lr
    lambdas[i] = function(it)
      if base == 0 then return 0 end
      return M.lr(it, base, o) / base
    end
  end
  local sched = LambdaLR.new(optimizer, lambdas, { last_epoch = opts.last_epoch })
  sched.warmup_cosine = o
  return sched
end

return setmetatable(M, { __call = function(_, ...) return M.new(...) end })
