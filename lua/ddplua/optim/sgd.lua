--- ddplua.optim.SGD: stochastic gradient descent with momentum, dampening, Nesterov
-- momentum, L2 weight decay and maximize (PyTorch's torch.optim.SGD,
-- https://pytorch.org/docs/stable/generated/torch.optim.SGD.html). The update is the fused
-- C kernel ddp_sgd_step_ (ddplua/optim.h gives the formula).
--
--   local opt = optim.SGD(params, {lr = 0.1, momentum = 0.9, dampening = 0,
--                                  nesterov = false, weight_decay = 0, maximize = false,
--                                  foreach = nil, fused = nil})
--
-- foreach, fused (PyTorch's names; nil, true or false; not both true): how a step runs.
-- By default (nil) and with either true, each param group is stepped by one C call over
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
local C, ffi = lib.C, lib.ffi

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

-- Arrays handed to ddp_sgd_step_foreach_, grown as needed and reused across steps.
local cap, arr_p, arr_g, arr_b, arr_first = 0, nil, nil, nil, nil
local function arrays(n)
  if n > cap then
    cap = math.max(n, 2 * cap, 16)
    arr_p, arr_g = ffi.new("ddp_tensor*[?]", cap), ffi.new("ddp_tensor*[?]", cap)
    arr_b, arr_first = ffi.new("ddp_tensor*[?]", cap), ffi.new("int[?]", cap)
  end
  return arr_p, arr_g, arr_b, arr_first
end

--- opt:step_group(group, state): the whole group in one call (see foreach above); false
-- when the group asks for the per-parameter path (foreach = false).
function SGD:step_group(g, state)
  if g.foreach == false and not g.fused then return false end
  local params = g.params
  local ps, gs, bs, first = arrays(#params)
  -- the handles of the parameters with a gradient and of their gradients: state is keyed by
  -- the parameter's own handle (a cdata read back from ps would be a new key), and the
  -- gradient handles keep their tensors alive until the call is done
  local n, with_grad, grads = 0, self._with_grad or {}, self._grads or {}
  self._with_grad, self._grads = with_grad, grads
  for _, p in ipairs(params) do
    -- A Lua handle, released at a collection as the per-parameter path's are. Released at
    -- once (tried), the gradients' blocks went back to the allocator's cache at zero_grad,
    -- were carved by the forward's allocations, and backward then found no block of a
    -- gradient's size: 3x the mremaps, 18x the munmaps and ~2% of a step in page faults in
    -- the MLP bench.
    local grad = lib.wrap(C.ddp_tensor_grad(p))
    if grad ~= nil then
      ps[n], gs[n] = p, grad
      n = n + 1
      with_grad[n], grads[n] = p, grad
    end
  end
  local use_buf = g.momentum ~= 0
  for i = 0, n - 1 do
    local p = with_grad[i + 1]
    local st = state[p]
    if not st then st = {}; state[p] = st end
    first[i] = 0
    if use_buf then
      local buf = st.momentum_buffer
      if buf == nil then
        buf = Optimizer.zeros_like(p)
        st.momentum_buffer = buf
        first[i] = 1
      end
      bs[i] = buf
    end
  end
  local status = C.ddp_sgd_step_foreach_(n, ps, gs, use_buf and bs or nil, first, g.lr, g.momentum,
    g.dampening, g.weight_decay, g.nesterov and 1 or 0, g.maximize and 1 or 0)
  for i = 0, n - 1 do ps[i], gs[i], bs[i], with_grad[i + 1], grads[i + 1] = nil, nil, nil, nil, nil end
  lib.check(status)
  return true
end

return SGD
