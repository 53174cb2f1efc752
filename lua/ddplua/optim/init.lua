--- ddplua.optim: optimizers, learning-rate schedulers and gradient clipping, after PyTorch's
-- torch.optim (`local optim = require "ddplua.optim"`).
--
--   optim.SGD(params, opts)      optim.Adam(params, opts)
--   optim.AdamW(params, opts)    optim.Adadelta(params, opts)
--   optim.StepLR(opt, opts)      optim.MultiStepLR(opt, opts)     optim.ExponentialLR(opt, opts)
--   optim.CosineAnnealingLR(opt, opts)  optim.LinearLR(opt, opts)  optim.OneCycleLR(opt, opts)
--   optim.LambdaLR(opt, lr_lambda)   optim.SequentialLR(opt, schedulers, milestones)
--   optim.WarmupCosineLR(opt, {warmup_iters, lr_decay_iters, min_lr})   -- nanoGPT's get_lr
--   optim.clip_grad_norm_(params, max_norm, {norm_type = 2}) -> total norm
--   optim.clip_grad_value_(params, clip_value)
--
-- The schedulers are also under optim.lr_scheduler (as in PyTorch). Each class documents
-- its options at the top of its file (lua/ddplua/optim/<name>.lua); the update formulas
-- are in runtime/include/ddplua/optim.h.
local clip = require "ddplua.optim.clip_grad"

local M = {
  Optimizer = require "ddplua.optim.optimizer",
  SGD = require "ddplua.optim.sgd",
  Adam = require "ddplua.optim.adam",
  AdamW = require "ddplua.optim.adamw",
  Adadelta = require "ddplua.optim.adadelta",
  clip_grad_norm_ = clip.clip_grad_norm_,
  clip_grad_value_ = clip.clip_grad_value_,
}

M.lr_scheduler = {
  LRScheduler = require "ddplua.optim.lr_scheduler",
  StepLR = require "ddplua.optim.step_lr",
  MultiStepLR = require "ddplua.optim.multi_step_lr",
  ExponentialLR = require "ddplua.optim.exponential_lr",
  CosineAnnealingLR = require "ddplua.optim.cosine_annealing_lr",
  LinearLR = require "ddplua.optim.linear_lr",
  OneCycleLR = require "ddplua.optim.one_cycle_lr",
  LambdaLR = require "ddplua.optim.lambda_lr",
  SequentialLR = require "ddplua.optim.sequential_lr",
  WarmupCosineLR = require "ddplua.optim.warmup_cosine_lr",
}
for k, v in pairs(M.lr_scheduler) do M[k] = v end

return M
