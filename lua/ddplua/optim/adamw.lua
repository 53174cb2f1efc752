--- ddplua.optim.AdamW: Adam with decoupled weight decay (PyTorch's torch.optim.AdamW,
-- https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html; Loshchilov & Hutter,
-- "Decoupled Weight Decay Regularization"): each step first p <- p * (1 - lr * weight_decay),
-- then the Adam update without an L2 term (fused C kernel ddp_adamw_step_).
--
--   local opt = optim.AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--                                    weight_decay = 1e-2, amsgrad = false, maximize = false})
--
-- State and errors as optim.Adam.
local lib = require "ddplua.lib"
local Optimizer = require "ddplua.optim.optimizer"
local Adam = require "ddplua.optim.adam"
local C = lib.C

local AdamW = Optimizer.subclass("AdamW", {
  lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, amsgrad = false, maximize = false,
})

AdamW.validate = Adam.validate

--- AdamW(params, opts): see the top of this file.
function AdamW.new(params, opts) return Optimizer.construct(AdamW, params, opts) end

--- AdamW.configure(group, cfg) -> cfg filled for group (a ddp_optim_config: Optimizer's C step).
function AdamW.configure(g, c) return Adam.configure_kind(C.DDP_OPTIM_ADAMW, g, c) end

return AdamW
