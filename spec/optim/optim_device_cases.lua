-- spec/optim/optim_device_cases.lua: cases for optim_device_spec.lua (run through
-- spec/helpers/sim_cases.lua on the simulated device, and on a real GPU by the cuda-tagged
-- part). Each update runs twice, on CPU tensors and on copies on cuda:0, from the same
-- values; the device results, copied back, must equal the CPU's (exactly on the simulated
-- device, within a rounding tolerance on a GPU).
local dl = require "ddplua"
local optim = require "ddplua.optim"
local lib = require "ddplua.lib"
local C = lib.C

local function tol(dtype)
  if dtype == "f64" then return 1e-12, 1e-14 end
  if dtype == "f32" then return 2e-5, 1e-6 end
  return 2e-2, 2e-3 -- f16 / bf16 (computed in f32, rounded once)
end

-- Parameters (a few shapes, one non-contiguous) with gradients for `steps` steps, the same
-- values on the CPU and on `device`.
local function make_params(dtype, device, ctx, seed)
  dl.manual_seed(seed)
  local shapes = { {7, 5}, {300}, {1}, {4, 6} }
  local cpu, dev = {}, {}
  for i, s in ipairs(shapes) do
    local base = dl.randn(s, {dtype = "f64"})
    local p = base:to(dtype)
    if i == 4 then p = p:t() end -- non-contiguous parameter (transposed view)
    local q = ctx.dev(p, device)
    if i == 4 then q = q:t():contiguous():t() end
    p:requires_grad_(); q:requires_grad_()
    cpu[i], dev[i] = p, q
  end
  return cpu, dev
end

local function set_grads(cpu, dev, ctx, step, device)
  dl.manual_seed(1000 + step)
  for i = 1, #cpu do
    local g = (dl.randn(cpu[i].shape, {dtype = "f64"}) * (step == 3 and 0.05 or 1)):to(cpu[i].dtype)
    cpu[i].grad = g
    dev[i].grad = ctx.dev(g, device)
  end
end

-- Run `make_opt` over both sets for 4 steps and compare parameters and state.
local function compare_steps(ctx, dtype, make_opt, what, device)
  device = device or 0
  local cpu, dev = make_params(dtype, device, ctx, 7)
  local oc, od = make_opt(cpu), make_opt(dev)
  local rtol, atol = tol(dtype)
  for step = 1, 4 do
    set_grads(cpu, dev, ctx, step, device)
    oc:step()
    od:step()
    for i = 1, #cpu do
      assert(dev[i].device == "cuda:" .. device, "param moved off the device")
      ctx.close(ctx.cpu(dev[i]), cpu[i], ("%s %s step %d param %d"):format(what, dtype, step, i),
                rtol, atol)
      for k, v in pairs(oc.state[cpu[i]]) do
        if dl.is_tensor(v) then
          local dv = od.state[dev[i]][k]
          assert(dv.device == "cuda:" .. device, k .. " state is on " .. dv.device)
          ctx.close(ctx.cpu(dv), v, ("%s %s step %d state %s of param %d"):format(what, dtype,
                    step, k, i), rtol, atol)
        end
      end
    end
  end
end

local cases = {}
local function case(name, fn) cases[#cases + 1] = {name, fn} end

for _, dtype in ipairs({"f32", "f64"}) do
  case("SGD on cuda:0 equals the CPU (" .. dtype .. ")", function(ctx)
    local configs = {
      {lr = 0.1},
      {lr = 0.05, momentum = 0.9},
      {lr = 0.05, momentum = 0.9, dampening = 0.3, weight_decay = 0.01},
      {lr = 0.05, momentum = 0.8, nesterov = true, maximize = true},
      {lr = 0.02, weight_decay = 0.1, maximize = true},
    }
    for i, o in ipairs(configs) do
      compare_steps(ctx, dtype, function(ps) return optim.SGD(ps, o) end, "SGD config " .. i)
    end
  end)

  case("Adam and AdamW on cuda:0 equal the CPU (" .. dtype .. ")", function(ctx)
    local configs = {
      {lr = 0.01},
      {lr = 0.01, amsgrad = true},
      {lr = 0.01, weight_decay = 0.1, maximize = true},
      {lr = 0.02, betas = {0.8, 0.95}, eps = 1e-6, amsgrad = true, weight_decay = 0.05},
    }
    for i, o in ipairs(configs) do
      compare_steps(ctx, dtype, function(ps) return optim.Adam(ps, o) end, "Adam config " .. i)
      compare_steps(ctx, dtype, function(ps) return optim.AdamW(ps, o) end, "AdamW config " .. i)
    end
  end)

  case("Adadelta on cuda:0 equals the CPU (" .. dtype .. ")", function(ctx)
    local configs = { {lr = 1.0}, {lr = 0.5, rho = 0.8, weight_decay = 0.1, maximize = true} }
    for i, o in ipairs(configs) do
      compare_steps(ctx, dtype, function(ps) return optim.Adadelta(ps, o) end, "Adadelta config " .. i)
    end
  end)
end

case("f16 and bf16 parameters update on the device through f32 work copies", function(ctx)
  for _, dtype in ipairs({"f16", "bf16"}) do
    compare_steps(ctx, dtype, function(ps) return optim.Adam(ps, {lr = 0.01, amsgrad = true}) end, "Adam")
    compare_steps(ctx, dtype, function(ps) return optim.SGD(ps, {lr = 0.1, momentum = 0.9}) end, "SGD")
  end
end)

case("updates on cuda:1 stay on cuda:1", function(ctx)
  if ctx.devices < 2 then return end
  compare_steps(ctx, "f32", function(ps) return optim.Adam(ps, {lr = 0.01}) end, "Adam", 1)
  compare_steps(ctx, "f32", function(ps) return optim.SGD(ps, {lr = 0.1, momentum = 0.5}) end, "SGD", 1)
end)

-- clip_grad_norm_ / clip_grad_value_ -------------------------------------------------------

local function grads_on(devices, dtype, ctx, scale)
  dl.manual_seed(42)
  local cpu, dev = {}, {}
  local shapes = { {40, 30}, {17}, {3, 3, 3} }
  for i, s in ipairs(shapes) do
    local g = (dl.randn(s, {dtype = "f64"}) * scale):to(dtype)
    local p, q = dl.zeros(s, {dtype = dtype}), ctx.dev(dl.zeros(s, {dtype = dtype}), devices[i])
    p.grad, q.grad = g, ctx.dev(g:clone(), devices[i])
    cpu[i], dev[i] = p, q
  end
  return cpu, dev
end

case("clip_grad_norm_ on device gradients equals the CPU (norms 2, 1, 3, inf; f32, f64)", function(ctx)
  for _, dtype in ipairs({"f32", "f64"}) do
    local rtol, atol = tol(dtype)
    for _, nt in ipairs({2, 1, 3, math.huge}) do
      for _, max_norm in ipairs({0.5, 1e9}) do
        local cpu, dev = grads_on({0, 0, 0}, dtype, ctx, 1)
        local a = optim.clip_grad_norm_(cpu, max_norm, {norm_type = nt})
        local b = optim.clip_grad_norm_(dev, max_norm, {norm_type = nt})
        local what = ("%s norm %g max %g"):format(dtype, nt, max_norm)
        -- the device sums in another order (one pass instead of fixed blocks)
        if ctx.exact then assert(math.abs(a - b) <= 1e-12 * a, what .. ": " .. a .. " vs " .. b)
        else assert(math.abs(a - b) <= 1e-5 * a, what .. ": " .. a .. " vs " .. b) end
        for i = 1, #cpu do
          assert(dev[i].grad.device == "cuda:0")
          ctx.close(ctx.cpu(dev[i].grad), cpu[i].grad, what .. " grad " .. i, 1e-6, 1e-7)
        end
      end
    end
  end
end)

case("clip_grad_norm_ takes gradients spread over cpu, cuda:0 and cuda:1", function(ctx)
  if ctx.devices < 2 then return end
  local cpu, dev = grads_on({-1, 0, 1}, "f64", ctx, 2)
  local a = optim.clip_grad_norm_(cpu, 1.0)
  local b = optim.clip_grad_norm_(dev, 1.0)
  assert(math.abs(a - b) <= 1e-12 * a, a .. " vs " .. b)
  local want = {"cpu", "cuda:0", "cuda:1"}
  for i = 1, #cpu do
    assert(dev[i].grad.device == want[i])
    ctx.close(ctx.cpu(dev[i].grad), cpu[i].grad, "grad " .. i, 1e-12, 1e-14)
  end
end)

case("clip_grad_norm_ on the device: NaN total, error_if_nonfinite, f16 gradients", function(ctx)
  local g = dl.tensor({1, 0 / 0, 3})
  local p = ctx.dev(dl.zeros({3}), 0)
  p.grad = ctx.dev(g, 0)
  local n = optim.clip_grad_norm_({p}, 1.0, {norm_type = math.huge})
  assert(n ~= n, "inf norm of a NaN gradient is NaN, got " .. n)
  ctx.raises(function() optim.clip_grad_norm_({p}, 1.0, {error_if_nonfinite = true}) end,
             "non-finite")
  local cpu, dev = grads_on({0, 0, 0}, "f16", ctx, 1)
  local a = optim.clip_grad_norm_(cpu, 0.1)
  local b = optim.clip_grad_norm_(dev, 0.1)
  assert(math.abs(a - b) <= 1e-6 * a, a .. " vs " .. b)
  for i = 1, #cpu do ctx.close(ctx.cpu(dev[i].grad), cpu[i].grad, "f16 grad " .. i, 1e-3, 1e-4) end
end)

case("clip_grad_value_ on device gradients equals the CPU", function(ctx)
  for _, dtype in ipairs({"f32", "f64", "bf16"}) do
    local cpu, dev = grads_on({0, ctx.devices > 1 and 1 or 0, 0}, dtype, ctx, 2)
    optim.clip_grad_value_(cpu, 0.7)
    optim.clip_grad_value_(dev, 0.7)
    for i = 1, #cpu do ctx.close(ctx.cpu(dev[i].grad), cpu[i].grad, dtype .. " grad " .. i) end
  end
end)

case("large tensors (more elements than one grid covers) update and clip as on the CPU", function(ctx)
  local n = 300000 -- > 256 threads x 1024 blocks of the reduction
  dl.manual_seed(77)
  local p = dl.randn({n}):requires_grad_()
  local q = ctx.dev(p:detach(), 0):requires_grad_()
  local g = dl.randn({n})
  p.grad, q.grad = g, ctx.dev(g, 0)
  local oc, od = optim.Adam({p}, {lr = 0.01, amsgrad = true}), optim.Adam({q}, {lr = 0.01, amsgrad = true})
  oc:step(); od:step()
  ctx.close(ctx.cpu(q), p, "Adam on a large param", 2e-5, 1e-6)
  for _, nt in ipairs({2, math.huge}) do
    local a = optim.clip_grad_norm_({p}, 1.0, {norm_type = nt})
    local b = optim.clip_grad_norm_({q}, 1.0, {norm_type = nt})
    assert(math.abs(a - b) <= 1e-9 * a, ("norm %g: %.17g vs %.17g"):format(nt, a, b))
  end
  ctx.close(ctx.cpu(q.grad), p.grad, "clipped large grad", 1e-6, 1e-9)
end)

case("load_state_dict moves saved state to the parameter's device", function(ctx)
  local cpu, dev = make_params("f32", 0, ctx, 9)
  local oc, od = optim.Adam(cpu, {lr = 0.01, amsgrad = true}), optim.Adam(dev, {lr = 0.01, amsgrad = true})
  set_grads(cpu, dev, ctx, 1, 0)
  oc:step()
  od:load_state_dict(oc:state_dict()) -- CPU state into the device optimizer (no step yet)
  for i = 1, #dev do
    -- load the CPU parameters' values as well
    dl.no_grad(function() dev[i]:copy_(ctx.dev(cpu[i]:detach(), 0)) end)
    for k, v in pairs(od.state[dev[i]]) do
      if dl.is_tensor(v) then assert(v.device == "cuda:0", k .. " stayed on " .. v.device) end
    end
  end
  set_grads(cpu, dev, ctx, 2, 0)
  oc:step()
  od:step()
  for i = 1, #cpu do ctx.close(ctx.cpu(dev[i]), cpu[i], "param " .. i .. " after a loaded step", 2e-5, 1e-6) end
end)

-- errors ---------------------------------------------------------------------------------------

case("a gradient or state on another device is refused naming both devices", function(ctx)
  if ctx.devices < 2 then return end
  local p = ctx.dev(dl.zeros({3}), 0)
  local g_cpu, g1 = dl.ones({3}), ctx.dev(dl.ones({3}), 1)
  ctx.raises(function() lib.check(C.ddp_sgd_step_(p, g_cpu, nil, 0.1, 0, 0, 0, 0, 0, 1)) end,
             "sgd_step_: grad is on cpu but param is on cuda:0")
  ctx.raises(function() lib.check(C.ddp_sgd_step_(p, g1, nil, 0.1, 0, 0, 0, 0, 0, 1)) end,
             "sgd_step_: grad is on cuda:1 but param is on cuda:0")
  local g0 = ctx.dev(dl.ones({3}), 0)
  local m_cpu, v0 = dl.zeros({3}), ctx.dev(dl.zeros({3}), 0)
  ctx.raises(function()
    lib.check(C.ddp_adam_step_(p, g0, m_cpu, v0, nil, 1, 0.1, 0.9, 0.999, 1e-8, 0, 0, 0))
  end, "adam_step_: exp_avg is on cpu but param is on cuda:0")
  local buf1 = ctx.dev(dl.zeros({3}), 1)
  ctx.raises(function() lib.check(C.ddp_sgd_step_(p, g0, buf1, 0.1, 0.9, 0, 0, 0, 0, 0)) end,
             "sgd_step_: momentum_buffer is on cuda:1 but param is on cuda:0")
  ctx.raises(function()
    lib.check(C.ddp_adadelta_step_(p, g0, ctx.dev(dl.zeros({3}), 0), dl.zeros({3}), 1, 0.9,
                                   1e-6, 0, 0))
  end, "adadelta_step_: acc_delta is on cpu but param is on cuda:0")
  -- nothing was written by the refused calls
  ctx.close(ctx.cpu(p), dl.zeros({3}), "param after refused updates")
end)

case("state made by the optimizer lives on the parameter's device", function(ctx)
  if ctx.devices < 2 then return end
  local p = ctx.dev(dl.ones({5}), 1):requires_grad_()
  p.grad = ctx.dev(dl.ones({5}), 1)
  local o = optim.Adam({p}, {lr = 0.1, amsgrad = true})
  o:step()
  for k, v in pairs(o.state[p]) do
    if dl.is_tensor(v) then assert(v.device == "cuda:1", k .. " is on " .. v.device) end
  end
  local s = optim.SGD({p}, {lr = 0.1, momentum = 0.9})
  s:step()
  assert(s.state[p].momentum_buffer.device == "cuda:1")
end)

return cases
