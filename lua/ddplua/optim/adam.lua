--- ddplua.optim.Adam: Adam with optional AMSGrad, L2 weight decay and maximize (PyTorch's
-- torch.optim.Adam, https://pytorch.org/docs/stable/generated/torch.optim.Adam.html;
-- Kingma & Ba, "Adam: A Method for Stochastic Optimization"). The update is the fused C
-- kernel ddp_adam_step_ (ddplua/optim.h gives the formula, bias corrections included).
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

--- One update through `kernel` (C.ddp_adam_step_ or C.ddp_adamw_step_); shared with AdamW.
function Adam.adam_update(kernel, p, grad, g, st)
  if st.step == nil then
    st.step = 0
    st.exp_avg = Optimizer.zeros_like(p)
    st.exp_avg_sq = Optimizer.zeros_like(p)
  end
  if g.amsgrad and st.max_exp_avg_sq == nil then st.max_exp_avg_sq = Optimizer.zeros_like(p) end
  local step = st.step + 1
  lib.check(kernel(p, grad, st.exp_avg, st.exp_avg_sq, g.amsgrad and st.max_exp_avg_sq or nil, step,
    g.lr, g.betas[1], g.betas[2], g.eps, g.weight_decay, g.amsgrad and 1 or 0, g.maximize and 1 or 0))
  st.step = step
end

function Adam:update(p, grad, g, st) Adam.adam_update(C.ddp_adam_step_, p, grad, g, st) end

return Adam
