--- ddplua.optim.SGD: stochastic gradient descent with momentum, dampening, Nesterov
-- momentum, L2 weight decay and maximize (PyTorch's torch.optim.SGD,
-- https://pytorch.org/docs/stable/generated/torch.optim.SGD.html). The update is the fused
-- C kernel ddp_sgd_step_ (ddplua/optim.h gives the formula).
--
--   local opt = optim.SGD(params, {lr = 0.1, momentum = 0.9, dampening = 0,
--                                  nesterov = false, weight_decay = 0, maximize = false})
--
-- lr defaults to 1e-3 (PyTorch 2.x). State per parameter: momentum_buffer (a tensor of the
-- parameter's shape and dtype, created on the parameter's first step with momentum != 0,
-- holding that step's gradient undamped, as PyTorch). Errors name the option: lr,
-- momentum or weight_decay < 0, nesterov without momentum or with dampening.
local lib = require "ddplua.lib"
local Optimizer = require "ddplua.optim.optimizer"
local C = lib.C

local SGD = Optimizer.subclass("SGD", {
  lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, maximize = false,
})

function SGD.validate(g, name)
  Optimizer.check_nonneg(g, "lr", name)
  Optimizer.check_nonneg(g, "momentum", name)
  Optimizer.check_nonneg(g, "weight_decay", name)
  if type(g.dampening) ~= "number" then Optimizer.invalid(name, "dampening", g.dampening, "must be a number") end
  Optimizer.check_bool(g, "nesterov", name)
  Optimizer.check_bool(g, "maximize", name)
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    lib.raise(("%s: nesterov momentum requires a momentum > 0 and zero dampening (momentum %s, dampening %s)"):format(
      name, tostring(g.momentum), tostring(g.dampening)))
  end
end

--- SGD(params, opts): see the top of this file.
function SGD.new(params, opts) return Optimizer.construct(SGD, params, opts) end

function SGD:update(p, grad, g, st)
  local buf, first = nil, 0
  if g.momentum ~= 0 then
    buf = st.momentum_buffer
    if buf == nil then
      buf = Optimizer.zeros_like(p)
      st.momentum_buffer = buf
      first = 1
    end
  end
  lib.check(C.ddp_sgd_step_(p, grad, buf, g.lr, g.momentum, g.dampening, g.weight_decay,
    g.nesterov and 1 or 0, g.maximize and 1 or 0, first))
end

return SGD
