--- ddplua.optim.Adam: Adam with optional AMSGrad, L2 weight decay and maximize (PyTorch's
-- torch.optim.Adam, https://pytorch.org/docs/stable/generated/torch.optim.Adam.html;
-- Kingma & Ba, "Adam: A Method for Stochastic Optimization"). The update is the fused C
-- kernel ddp_adam_step_ (ddplua/optim.h gives the formula, bias corrections included), run
-- over the optimizer-state store by ddp_optim_step_params (ddplua/optim_state.h).
--
--   local opt = optim.Adam(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--                                   weight_decay = 0, amsgrad = false, maximize = false})
--
-- State per parameter: step (a number, the updates done), exp_avg, exp_avg_sq and, with
-- amsgrad, max_exp_avg_sq (tensors of the parameter's shape and dtype). Errors name the
-- option: lr, eps or weight_decay < 0, a beta outside [0, 1).
local lib = require "ddplua.lib"
local Optimizer = require "ddplua.optim.optimizer"
local C = lib.C

local Adam = Optimizer.subclass("Adam", {
  lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0, amsgrad = false, maximize = false,
})

--- Validation shared with AdamW.
function Adam.validate(g, name)
  Optimizer.check_nonneg(g, "lr", name)
  Optimizer.check_nonneg(g, "eps", name)
  Optimizer.check_nonneg(g, "weight_decay", name)
  Optimizer.check_bool(g, "amsgrad", name)
  Optimizer.check_bool(g, "maximize", name)
  local b = g.betas
  if type(b) ~= "table" or #b ~= 2 then Optimizer.invalid(name, "betas", b, "must be a table {beta1, beta2}") end
  for i = 1, 2 do
    if type(b[i]) ~= "number" or not (b[i] >= 0 and b[i] < 1) then
      lib.raise(("%s: invalid betas[%d] %s (betas must be in [0, 1))"):format(name, i, tostring(b[i])))
    end
  end
end

--- Adam(params, opts): see the top of this file.
function Adam.new(params, opts) return Optimizer.construct(Adam, params, opts) end

--- Adam.configure_kind(kind, group, cfg) -> cfg filled for group with kind
-- (C.DDP_OPTIM_ADAM or C.DDP_OPTIM_ADAMW); shared with AdamW.
function Adam.configure_kind(kind, g, c)
  c.kind = kind
  c.lr, c.beta1, c.beta2, c.eps, c.weight_decay = g.lr, g.betas[1], g.betas[2], g.eps, g.weight_decay
  c.amsgrad, c.maximize = g.amsgrad and 1 or 0, g.maximize and 1 or 0
  return c
end

--- Adam.configure(group, cfg) -> cfg filled for group (a ddp_optim_config: Optimizer's C step).
function Adam.configure(g, c) return Adam.configure_kind(C.DDP_OPTIM_ADAM, g, c) end

return Adam
