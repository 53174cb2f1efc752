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

-- The foreach step of group g over its n parameters with a gradient (with_grad[1..n], in
-- ps/gs/bs/first[0..n-1]): the momentum buffers made where missing, then one C call; its
-- status. A function of its own (not a closure made per step) so that the JIT compiles
-- the step (a closure per call makes LuaJIT fall back to the interpreter there).
local function foreach_step(g, state, n, with_grad, ps, gs, bs, first)
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
  return C.ddp_sgd_step_foreach_(n, ps, gs, use_buf and bs or nil, first, g.lr, g.momentum,
    g.dampening, g.weight_decay, g.nesterov and 1 or 0, g.maximize and 1 or 0)
end

-- Note [step releases its grads]: a Lua handle to a gradient holds its memory until the
-- collector finds the handle dead, which with zero_grad's set_to_none is the gradient's only
-- other holder. Through handles, every step's gradients (the MLP's 940 KB) stayed allocated
-- until the next collection: a collection every ~10 MLP steps instead of ~30, and each
-- step's dW landing in a block last touched tens of steps before. So the foreach step takes
-- the gradients as C references and releases them when the call returns: zero_grad then
-- frees each gradient, and backward's next gradient of that size gets the same block back,
-- warm (Note [block cache], runtime/core/alloc.c). MLP bench, 2 threads: the optimizer step
-- 90 -> 52 us, 13 collections in 400 steps instead of 41. (Tried before the block cache
-- reused blocks in place, the freed blocks were carved by the forward's requests and
-- backward faulted in new ones.)

--- opt:step_group(group, state): the whole group in one call (see foreach above); false
-- when the group asks for the per-parameter path (foreach = false).
function SGD:step_group(g, state)
  if g.foreach == false and not g.fused then return false end
  local params = g.params
  local ps, gs, bs, first = arrays(#params)
  -- the handles of the parameters with a gradient (state is keyed by the parameter's own
  -- handle: a cdata read back from ps would be a new key); the gradients as C references
  local n, with_grad = 0, self._with_grad or {}
  self._with_grad = with_grad
  for _, p in ipairs(params) do
    local grad = C.ddp_tensor_grad(p)
    if grad ~= nil then
      ps[n], gs[n] = p, grad
      n = n + 1
      with_grad[n] = p
    end
  end
  local ok, status = pcall(foreach_step, g, state, n, with_grad, ps, gs, bs, first)
  for i = 0, n - 1 do -- Note [step releases its grads], also when the step raised
    C.ddp_tensor_release(gs[i])
    ps[i], gs[i], bs[i], with_grad[i + 1] = nil, nil, nil, nil
  end
  if not ok then error(status, 0) end
  lib.check(status)
  return true
end

return SGD
