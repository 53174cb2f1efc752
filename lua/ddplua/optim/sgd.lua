--- ddplua.optim.SGD: stochastic gradient descent with momentum, dampening, Nesterov
-- momentum, L2 weight decay and maximize (PyTorch's torch.optim.SGD,
-- https://pytorch.org/docs/stable/generated/torch.optim.SGD.html). The update is the fused
-- C kernel ddp_sgd_step_ (ddplua/optim.h gives the formula), run over the optimizer-state
-- store by ddp_optim_step_params (ddplua/optim_state.h).
--
--   local opt = optim.SGD(params, {lr = 0.1, momentum = 0.9, dampening = 0,
--                                  nesterov = false, weight_decay = 0, maximize = false,
--                                  foreach = nil, fused = nil})
--
-- foreach, fused (PyTorch's names; nil, true or false; not both true): how a step runs.
-- By default (nil) and with either true, each param group is stepped by one kernel call over
-- all its parameters (ddp_sgd_step_foreach_: on the CPU one job over the thread pool, Note
-- [multi-tensor SGD]); foreach = false (fused not true) steps the parameters one by one.
-- The results are the same bit for bit either way; the one-call path saves a call and a
-- fork-join per parameter.
-- lr defaults to 1e-3 (PyTorch 2.x). State per parameter: momentum_buffer (a tensor of the
-- parameter's shape and dtype, created on the parameter's first step with momentum != 0,
-- holding that step's gradient undamped, as PyTorch). Errors name the option: lr,
-- momentum or weight_decay < 0, nesterov without momentum or with dampening.
local lib = require "ddplua.lib"
local Optimizer = require "ddplua.optim.optimizer"
local C = lib.C

local SGD = Optimizer.subclass("SGD", {
  lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, maximize = false,
}, { "foreach", "fused" })

function SGD.validate(g, name)
  Optimizer.check_nonneg(g, "lr", name)
  Optimizer.check_nonneg(g, "momentum", name)
  Optimizer.check_nonneg(g, "weight_decay", name)
  if type(g.dampening) ~= "number" then Optimizer.invalid(name, "dampening", g.dampening, "must be a number") end
  Optimizer.check_bool(g, "nesterov", name)
  Optimizer.check_bool(g, "maximize", name)
  for _, key in ipairs { "foreach", "fused" } do
    if g[key] ~= nil then Optimizer.check_bool(g, key, name) end
  end
  if g.foreach and g.fused then
    lib.raise(name .. ": `fused` and `foreach` cannot be `True` together")
  end
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    lib.raise(("%s: nesterov momentum requires a momentum > 0 and zero dampening (momentum %s, dampening %s)"):format(
      name, tostring(g.momentum), tostring(g.dampening)))
  end
end

--- SGD(params, opts): see the top of this file.
function SGD.new(params, opts) return Optimizer.construct(SGD, params, opts) end

--- SGD.configure(group, cfg) -> cfg filled for group (a ddp_optim_config: Optimizer's C
-- step). foreach = false (fused not true) steps the group's parameters one by one.
function SGD.configure(g, c)
  c.kind = C.DDP_OPTIM_SGD
  c.lr, c.momentum, c.dampening, c.weight_decay = g.lr, g.momentum, g.dampening, g.weight_decay
  c.nesterov, c.maximize = g.nesterov and 1 or 0, g.maximize and 1 or 0
  c.foreach = (g.foreach == false and not g.fused) and 0 or 1
  return c
end

return SGD
