--- ddplua.optim.Adadelta (PyTorch's torch.optim.Adadelta,
-- https://pytorch.org/docs/stable/generated/torch.optim.Adadelta.html; Zeiler, "ADADELTA:
-- An Adaptive Learning Rate Method"). The update is the fused C kernel ddp_adadelta_step_
-- (ddplua/optim.h gives the formula), run over the optimizer-state store by
-- ddp_optim_step_params (ddplua/optim_state.h).
--
--   local opt = optim.Adadelta(params, {lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0,
--                                       maximize = false})
--
-- State per parameter: step (a number), square_avg and acc_delta (tensors of the
-- parameter's shape and dtype). Errors name the option: lr, eps or weight_decay < 0, rho
-- outside [0, 1].
local lib = require "ddplua.lib"
local Optimizer = require "ddplua.optim.optimizer"
local C = lib.C

local Adadelta = Optimizer.subclass("Adadelta", {
  lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0, maximize = false,
})

function Adadelta.validate(g, name)
  Optimizer.check_nonneg(g, "lr", name)
  Optimizer.check_nonneg(g, "eps", name)
  Optimizer.check_nonneg(g, "weight_decay", name)
  Optimizer.check_bool(g, "maximize", name)
  if type(g.rho) ~= "number" or not (g.rho >= 0 and g.rho <= 1) then
    Optimizer.invalid(name, "rho", g.rho, "must be in [0, 1]")
  end
end

--- Adadelta(params, opts): see the top of this file.
function Adadelta.new(params, opts) return Optimizer.construct(Adadelta, params, opts) end

--- Adadelta.configure(group, cfg) -> cfg filled for group (a ddp_optim_config: Optimizer's
-- C step).
function Adadelta.configure(g, c)
  c.kind = C.DDP_OPTIM_ADADELTA
  c.lr, c.rho, c.eps, c.weight_decay = g.lr, g.rho, g.eps, g.weight_decay
  c.maximize = g.maximize and 1 or 0
  return c
end

return Adadelta
