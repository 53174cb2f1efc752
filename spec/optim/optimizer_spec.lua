-- Specs for ddplua.optim's optimizers (SGD, Adam, AdamW, Adadelta): several steps of every
-- option combination against plain-Lua implementations of PyTorch's documented algorithms
-- written here, step by step; param groups; zero_grad; state_dict round trips; errors.
local dl = require "ddplua"
local optim = require "ddplua.optim"
local views = require "views"

-- ---- helpers ------------------------------------------------------------------------------

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then for i = 1, #v do flatten(v[i], out) end else out[#out + 1] = v end
  return out
end
local function flat(t) return flatten(t:tolist()) end

-- Deterministic values in [-1, 1) from a small LCG (independent of the library's RNG).
local function values(n, seed)
  local out, s = {}, seed
  for i = 1, n do
    s = (s * 1103515245 + 12345) % 2147483648
    out[i] = s / 1073741824 - 1
  end
  return out
end

local function assert_list_close(actual, expected, rtol, atol, what)
  assert.are.equal(#expected, #actual, what)
  for i = 1, #expected do
    local a, e = actual[i], expected[i]
    if not (math.abs(a - e) <= atol + rtol * math.abs(e)) then
      error(("%s: element %d is %.12g, expected %.12g"):format(what, i, a, e), 2)
    end
  end
end

-- A ddp_tensor*[n] array of the tensors of list (for the C calls taking lists).
local function ffi_arr(list)
  local a = require("ddplua.lib").ffi.new("ddp_tensor*[?]", #list)
  for i, t in ipairs(list) do a[i - 1] = t end
  return a
end

local function copy(list) local o = {} for i, v in ipairs(list) do o[i] = v end return o end

-- Every combination of the option lists in `space` ({name = {v1, v2}, ...}).
local function combinations(space)
  local keys = {}
  for k in pairs(space) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = { {} }
  for _, k in ipairs(keys) do
    local next_out = {}
    for _, partial in ipairs(out) do
      for _, v in ipairs(space[k]) do
        local c = {}
        for kk, vv in pairs(partial) do c[kk] = vv end
        c[k] = v
        next_out[#next_out + 1] = c
      end
    end
    out = next_out
  end
  return out
end

local function describe_opts(o)
  local parts = {}
  for k, v in pairs(o) do
    parts[#parts + 1] = k .. "=" .. (type(v) == "table" and ("{" .. table.concat(v, ",") .. "}") or tostring(v))
  end
  table.sort(parts)
  return table.concat(parts, " ")
end

-- Gradient of step k: values scaled so later steps can be much smaller (amsgrad's max then
-- differs from v).
local SCALES = { 1, 3, 0.1, 0.05, 2 }
local function grad_at(n, k) 
  local g = values(n, 100 + k)
  for i = 1, n do g[i] = g[i] * SCALES[(k - 1) % #SCALES + 1] end
  return g
end

-- ---- references: PyTorch's algorithm boxes, element by element ----------------------------

-- torch.optim.SGD. state = {b = {...}} (nil before the first step).
local function ref_sgd(p, grad, o, st)
  local lr, mu, tau, wd = o.lr, o.momentum or 0, o.dampening or 0, o.weight_decay or 0
  for i = 1, #p do
    local g = grad[i]
    if o.maximize then g = -g end
    if wd ~= 0 then g = g + wd * p[i] end
    if mu ~= 0 then
      if st.b == nil then st.b = {} end
      local b
      if st.b[i] == nil then b = g else b = mu * st.b[i] + (1 - tau) * g end
      st.b[i] = b
      if o.nesterov then g = g + mu * b else g = b end
    end
    p[i] = p[i] - lr * g
  end
end

-- torch.optim.Adam / AdamW (decoupled). state = {t, m, v, vmax}.
local function ref_adam(p, grad, o, st, decoupled)
  local lr, b1, b2, eps = o.lr or 1e-3, o.betas and o.betas[1] or 0.9, o.betas and o.betas[2] or 0.999, o.eps or 1e-8
  local wd = o.weight_decay or (decoupled and 1e-2 or 0)
  st.t = (st.t or 0) + 1
  st.m, st.v, st.vmax = st.m or {}, st.v or {}, st.vmax or {}
  local t = st.t
  for i = 1, #p do
    local g = grad[i]
    if o.maximize then g = -g end
    if decoupled then p[i] = p[i] - lr * wd * p[i]
    elseif wd ~= 0 then g = g + wd * p[i] end
    local m = b1 * (st.m[i] or 0) + (1 - b1) * g
    local v = b2 * (st.v[i] or 0) + (1 - b2) * g * g
    st.m[i], st.v[i] = m, v
    local m_hat = m / (1 - b1 ^ t)
    local v_hat
    if o.amsgrad then
      st.vmax[i] = math.max(st.vmax[i] or 0, v)
      v_hat = st.vmax[i] / (1 - b2 ^ t)
    else
      v_hat = v / (1 - b2 ^ t)
    end
    p[i] = p[i] - lr * m_hat / (math.sqrt(v_hat) + eps)
  end
end

-- torch.optim.Adadelta. state = {v, u}.
local function ref_adadelta(p, grad, o, st)
  local lr, rho, eps, wd = o.lr or 1, o.rho or 0.9, o.eps or 1e-6, o.weight_decay or 0
  st.v, st.u = st.v or {}, st.u or {}
  for i = 1, #p do
    local g = grad[i]
    if o.maximize then g = -g end
    if wd ~= 0 then g = g + wd * p[i] end
    local v = rho * (st.v[i] or 0) + (1 - rho) * g * g
    local dx = math.sqrt((st.u[i] or 0) + eps) / math.sqrt(v + eps) * g
    st.v[i] = v
    st.u[i] = rho * (st.u[i] or 0) + (1 - rho) * dx * dx
    p[i] = p[i] - lr * dx
  end
end

-- Run `steps` steps of optimizer class `cls` with options o on a (2, 3) parameter of dtype,
-- comparing after every step with ref.
local function check_against(cls, ref, o, dtype, steps, tol)
  local n = 6
  local init = values(n, 7)
  local p = dl.tensor({ { init[1], init[2], init[3] }, { init[4], init[5], init[6] } },
    { dtype = dtype, requires_grad = true })
  local expected = flat(p) -- the stored initial values (f32-rounded when f32)
  local opt = cls(p and { p } or nil, o)
  local st = {}
  for k = 1, steps do
    local g = grad_at(n, k)
    p.grad = dl.tensor({ { g[1], g[2], g[3] }, { g[4], g[5], g[6] } }, { dtype = dtype })
    local g_stored = flat(p.grad)
    opt:step()
    ref(expected, g_stored, o, st)
    assert_list_close(flat(p), expected, tol, tol, ("%s %s step %d (%s)"):format(cls.name, dtype, k, describe_opts(o)))
  end
  return opt, p
end

-- ---- SGD ------------------------------------------------------------------------------------

describe("ddplua.optim.SGD", function()
  local space = {
    lr = { 0.1 }, momentum = { 0, 0.9 }, dampening = { 0, 0.3 }, nesterov = { false, true },
    weight_decay = { 0, 0.1 }, maximize = { false, true },
  }
  local function valid(o)
    return not (o.nesterov and (o.momentum == 0 or o.dampening ~= 0))
  end

  it("matches the documented algorithm for every option combination (f64, 5 steps)", function()
    local count = 0
    for _, o in ipairs(combinations(space)) do
      if valid(o) then
        check_against(optim.SGD, ref_sgd, o, "f64", 5, 1e-12)
        count = count + 1
      end
    end
    assert.are.equal(20, count)
  end)

  it("matches in f32 within f32 rounding", function()
    for _, o in ipairs(combinations(space)) do
      if valid(o) then check_against(optim.SGD, ref_sgd, o, "f32", 5, 2e-5) end
    end
  end)

  it("creates the momentum buffer from the first gradient, undamped", function()
    local p = dl.tensor({ 1, 2 }, { dtype = "f64", requires_grad = true })
    local opt = optim.SGD({ p }, { lr = 0.5, momentum = 0.9, dampening = 0.5 })
    p.grad = dl.tensor({ 4, -2 }, { dtype = "f64" })
    opt:step()
    assert.are.same({ 4, -2 }, opt.state[p].momentum_buffer:tolist())
    assert.are.same({ 1 - 0.5 * 4, 2 + 0.5 * 2 }, p:tolist())
    opt:step()
    -- b = 0.9 * 4 + 0.5 * 4 = 5.6, 0.9 * -2 + 0.5 * -2 = -2.8
    assert_list_close(opt.state[p].momentum_buffer:tolist(), { 5.6, -2.8 }, 1e-12, 1e-12, "buffer")
  end)

  it("bumps the parameter's version and leaves no graph", function()
    local p = dl.tensor({ 1, 2 }, { requires_grad = true })
    local lib = require "ddplua.lib"
    local v0 = tonumber(lib.C.ddp_tensor_version(p))
    p.grad = dl.tensor { 1, 1 }
    optim.SGD({ p }, { lr = 1 }):step()
    assert.is_true(tonumber(lib.C.ddp_tensor_version(p)) > v0)
    assert.is_true(p.is_leaf)
    assert.is_true(p.requires_grad)
    assert.is_nil(p.grad_fn)
  end)

  it("updates a non-contiguous parameter through its strides", function()
    local base = dl.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "f64" })
    local p, owner = views.transposed(base) -- (3, 2) view, strides (1, 3)
    p.requires_grad = true
    assert.is_false(p:is_contiguous())
    local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.5 })
    local expected, st = flat(p), {}
    for k = 1, 3 do
      local g = grad_at(6, k)
      p.grad = dl.tensor({ { g[1], g[2] }, { g[3], g[4] }, { g[5], g[6] } }, { dtype = "f64" })
      opt:step()
      ref_sgd(expected, g, { lr = 0.1, momentum = 0.5 }, st)
    end
    assert_list_close(flat(p), expected, 1e-12, 1e-12, "strided param")
    -- the owner's storage holds the update (row-major of the transpose)
    assert_list_close(flat(owner), { expected[1], expected[3], expected[5], expected[2], expected[4], expected[6] },
      1e-12, 1e-12, "owner")
  end)

  it("computes f16 and bf16 parameters through f32", function()
    for _, dtype in ipairs { "f16", "bf16" } do
      local p = dl.tensor({ 1, -2, 0.5 }, { dtype = dtype, requires_grad = true })
      local opt = optim.SGD({ p }, { lr = 0.25, momentum = 0.5 })
      p.grad = dl.tensor({ 1, 2, -4 }, { dtype = dtype })
      opt:step()
      opt:step()
      -- b1 = g, b2 = 1.5 g; p = p0 - 0.25 * 2.5 g (exact in both formats)
      assert.are.same({ 1 - 0.625, -2 - 1.25, 0.5 + 2.5 }, p:tolist())
      assert.are.equal(dtype, opt.state[p].momentum_buffer:type())
    end
  end)

  it("handles a large parameter split over threads like a small one", function()
    local n = 200003
    local p = dl.randn({ n }, { dtype = "f64", generator = dl.Generator(3) })
    p.requires_grad = true
    local p0 = flat(p)
    local g = dl.randn({ n }, { dtype = "f64", generator = dl.Generator(4) })
    p.grad = g
    local gl = flat(g)
    local opt = optim.SGD({ p }, { lr = 0.01, momentum = 0.9, weight_decay = 0.01 })
    opt:step(); opt:step()
    local st = {}
    local o = { lr = 0.01, momentum = 0.9, weight_decay = 0.01 }
    ref_sgd(p0, gl, o, st); ref_sgd(p0, gl, o, st)
    local got = flat(p)
    for _, i in ipairs { 1, 2, 65536, 65537, 131072, 199999, n } do
      assert.is_true(math.abs(got[i] - p0[i]) < 1e-12, "element " .. i)
    end
  end)
end)

describe("ddplua.optim.SGD foreach / fused (one call per group)", function()
  local lib = require "ddplua.lib"
  local C = lib.C
  -- Sizes: odd ones, a single element, and ones that cross the pool's 32768-element pieces
  -- in the middle of a parameter and at a parameter's end.
  local SIZES = { { 7, 13 }, { 1 }, { 40003 }, { 5 }, { 3, 9001 }, { 32768 - 91 } }

  -- Parameters (and their gradients, drawn for `steps` steps) for dtype; skip lists the
  -- indices that get no gradient.
  local function make(dtype, seed)
    local ps = {}
    for i, shape in ipairs(SIZES) do
      ps[i] = dl.randn(shape, { dtype = dtype, generator = dl.Generator(seed + i) })
      ps[i].requires_grad = true
    end
    return ps
  end

  -- The parameters and momentum buffers after `steps` steps of SGD with options o.
  local function run(o, dtype, threads, steps, skip)
    local prev = dl.get_num_threads()
    dl.set_num_threads(threads)
    local ps = make(dtype, 10)
    local opt = optim.SGD(ps, o)
    for k = 1, steps do
      for i, p in ipairs(ps) do
        if skip[i] and k > 1 then p.grad = nil
        else p.grad = dl.randn(SIZES[i], { dtype = dtype, generator = dl.Generator(1000 * k + i) }) end
      end
      opt:step()
    end
    dl.set_num_threads(prev)
    local out = {}
    for i, p in ipairs(ps) do
      local st = opt.state[p]
      out[i] = { p = p, b = st and st.momentum_buffer or false }
    end
    return out
  end

  -- Equal elements (a zero difference everywhere; the values are finite).
  local function same(a, b) return (a - b):abs():max():item() == 0 end

  local function same_bits(a, b, what)
    for i = 1, #a do
      assert.is_true(same(a[i].p, b[i].p), what .. ": parameter " .. i)
      assert.are.equal(a[i].b == false, b[i].b == false, what .. ": momentum buffer presence " .. i)
      if a[i].b then assert.is_true(same(a[i].b, b[i].b), what .. ": momentum buffer " .. i) end
    end
  end

  local function with(o, k, v)
    local c = {}
    for kk, vv in pairs(o) do c[kk] = vv end
    c[k] = v
    return c
  end

  it("is bitwise the per-parameter step for every option, dtype and thread count", function()
    local space = {
      lr = { 0.05 }, momentum = { 0, 0.9 }, dampening = { 0, 0.3 }, nesterov = { false, true },
      weight_decay = { 0, 0.01 }, maximize = { false, true },
    }
    local count = 0
    -- parameter 2 has a gradient on the first step only: its buffer is made then and it is
    -- skipped after
    local skip = { [2] = true }
    for _, o in ipairs(combinations(space)) do
      if not (o.nesterov and (o.momentum == 0 or o.dampening ~= 0)) then
        for _, dtype in ipairs { "f32", "f64" } do
          local want = run(with(o, "foreach", false), dtype, 1, 3, skip)
          for _, threads in ipairs { 1, 2 } do
            same_bits(run(o, dtype, threads, 3, skip), want,
              ("%s %s threads %d"):format(dtype, describe_opts(o), threads))
          end
          count = count + 1
        end
      end
    end
    assert.are.equal(40, count)
    local o = { lr = 0.05, momentum = 0.9, weight_decay = 0.01 }
    local want = run(with(o, "foreach", false), "f32", 1, 3, skip)
    for _, flag in ipairs { "foreach", "fused" } do
      same_bits(run(with(o, flag, true), "f32", 2, 3, skip), want, flag .. " = true")
    end
  end)

  it("is bitwise the per-parameter step for many parameters and for mixed dtypes", function()
    -- 70 parameters (more than the C side keeps on its stack) of sizes 1 .. 70, and a
    -- group mixing f32 and f64 (the per-parameter fallback)
    for _, mixed in ipairs { false, true } do
      local function go(foreach)
        local ps = {}
        for i = 1, 70 do
          local dtype = (mixed and i % 2 == 0) and "f64" or "f32"
          ps[i] = dl.randn({ i }, { dtype = dtype, generator = dl.Generator(i) })
          ps[i].requires_grad = true
        end
        local opt = optim.SGD(ps, { lr = 0.1, momentum = 0.9, nesterov = true, foreach = foreach })
        for k = 1, 2 do
          for i, p in ipairs(ps) do
            p.grad = dl.randn({ i }, { dtype = p:type(), generator = dl.Generator(100 * k + i) })
          end
          opt:step()
        end
        return ps, opt
      end
      local a, oa = go(nil)
      local b, ob = go(false)
      for i = 1, 70 do
        assert.is_true(same(a[i], b[i]), "parameter " .. i)
        assert.is_true(same(oa.state[a[i]].momentum_buffer, ob.state[b[i]].momentum_buffer), "buffer " .. i)
      end
    end
  end)

  it("steps a parameter listed twice in the C call twice, as the per-parameter path", function()
    local p = dl.tensor({ 1, 2, 3 }, { dtype = "f64" })
    local g = dl.tensor({ 0.5, -1, 2 }, { dtype = "f64" })
    local ps = ffi_arr({ p, p })
    local gs = ffi_arr({ g, g })
    local first = lib.ffi.new("int[2]", { 0, 0 })
    lib.check(C.ddp_sgd_step_foreach_(2, ps, gs, nil, first, 0.5, 0, 0, 0, 0, 0))
    assert.are.same({ 1 - 0.5, 2 + 1, 3 - 2 }, p:tolist())
  end)

  it("leaves the gradients to the caller and keeps one state entry per parameter", function()
    local ps = make("f32", 3)
    local opt = optim.SGD(ps, { lr = 0.1, momentum = 0.9 })
    for k = 1, 3 do
      for i, p in ipairs(ps) do p.grad = dl.ones(SIZES[i], { dtype = "f32" }) end
      opt:step()
    end
    local n = 0
    for _ in opt.state:items() do n = n + 1 end
    assert.are.equal(#ps, n)
    for i, p in ipairs(ps) do assert.is_true(same(p.grad, dl.ones(SIZES[i], { dtype = "f32" })), "grad " .. i) end
  end)

  it("holds no reference to the gradients after the step: zero_grad frees them at once", function()
    -- Note [step releases its grads] (ddplua/optim/sgd.lua): no collection runs in between,
    -- so a gradient handle made by the step would keep its memory live until one did
    local w = dl.randn({ 256, 784 }, { generator = dl.Generator(1) })
    w.requires_grad = true
    local opt = optim.SGD({ w }, { lr = 0.1, momentum = 0.9 })
    local x = dl.randn({ 64, 784 }, { generator = dl.Generator(2) })
    local grad_bytes = 256 * 784 * 4
    collectgarbage("stop")
    local ok, err = pcall(function()
      for k = 1, 3 do
        opt:zero_grad()
        local loss = (x:matmul(w:t())):sum()
        loss:backward()
        loss = nil
        local before = dl.memory_stats().live
        opt:step()
        opt:zero_grad()
        local freed = before - dl.memory_stats().live
        -- (the first step also makes the momentum buffer, of the gradient's size)
        if k > 1 then assert.is_true(freed >= grad_bytes, ("zero_grad after the step freed %d bytes, the gradient has %d"):format(freed, grad_bytes)) end
      end
    end)
    collectgarbage("restart")
    assert(ok, err)
  end)

  it("refuses foreach and fused together, and non-boolean values", function()
    local p = dl.tensor({ 1 }, { requires_grad = true })
    assert.has_error(function() optim.SGD({ p }, { foreach = true, fused = true }) end,
      "SGD: `fused` and `foreach` cannot be `True` together")
    assert.has_error(function() optim.SGD({ p }, { foreach = 1 }) end,
      "SGD: invalid foreach 1 (must be true or false)")
    assert.has_error(function() optim.SGD({ p }, { fused = "yes" }) end,
      "SGD: invalid fused yes (must be true or false)")
  end)

  it("checks every entry before changing any parameter, naming it", function()
    local a = dl.tensor({ 1, 2 }, { dtype = "f64" })
    local b = dl.tensor({ 3, 4, 5 }, { dtype = "f64" })
    local ga = dl.tensor({ 1, 1 }, { dtype = "f64" })
    local gb = dl.tensor({ 1, 1 }, { dtype = "f64" }) -- wrong shape
    local first = lib.ffi.new("int[2]", { 0, 0 })
    local ok, err = pcall(lib.check, C.ddp_sgd_step_foreach_(2, ffi_arr({ a, b }), ffi_arr({ ga, gb }),
      nil, first, 0.1, 0, 0, 0, 0, 0))
    assert.is_false(ok)
    assert.matches("sgd_step_foreach_: grad%[1%] has shape %(2,%) but param has shape %(3,%)", err)
    assert.are.same({ 1, 2 }, a:tolist())
    ok, err = pcall(lib.check, C.ddp_sgd_step_foreach_(2, ffi_arr({ a, b }), ffi_arr({ ga, ga }),
      nil, first, 0.1, 0.9, 0, 0, 0, 0))
    assert.is_false(ok)
    assert.matches("momentum_buffer", err)
  end)
end)

-- ---- Adam / AdamW -------------------------------------------------------------------------------

describe("ddplua.optim.Adam", function()
  local space = {
    lr = { 0.01 }, betas = { { 0.9, 0.999 }, { 0.5, 0.8 } }, eps = { 1e-8, 1e-3 },
    weight_decay = { 0, 0.1 }, amsgrad = { false, true }, maximize = { false, true },
  }

  it("matches the documented algorithm with bias correction for every combination (f64, 5 steps)", function()
    for _, o in ipairs(combinations(space)) do
      check_against(optim.Adam, function(p, g, oo, st) ref_adam(p, g, oo, st, false) end, o, "f64", 5, 1e-12)
    end
  end)

  it("matches in f32", function()
    for _, o in ipairs(combinations(space)) do
      check_against(optim.Adam, function(p, g, oo, st) ref_adam(p, g, oo, st, false) end, o, "f32", 5, 2e-5)
    end
  end)

  it("uses the defaults lr 1e-3, betas (0.9, 0.999), eps 1e-8", function()
    local opt = check_against(optim.Adam, function(p, g, oo, st) ref_adam(p, g, oo, st, false) end, {}, "f64", 3, 1e-12)
    local g = opt.param_groups[1]
    assert.are.same({ 1e-3, 0.9, 0.999, 1e-8, 0, false }, { g.lr, g.betas[1], g.betas[2], g.eps, g.weight_decay, g.amsgrad })
  end)

  it("amsgrad keeps the running maximum of v", function()
    local p = dl.tensor({ 0 }, { dtype = "f64", requires_grad = true })
    local opt = optim.Adam({ p }, { betas = { 0.5, 0.5 }, amsgrad = true })
    p.grad = dl.tensor({ 2 }, { dtype = "f64" }); opt:step()
    p.grad = dl.tensor({ 0 }, { dtype = "f64" }); opt:step()
    local st = opt.state[p]
    assert.are.equal(2, st.step)
    assert.are.equal(1, st.exp_avg_sq:tolist()[1])      -- 0.5 * 2 + 0
    assert.are.equal(2, st.max_exp_avg_sq:tolist()[1])  -- max(2, 1)
  end)
end)

describe("ddplua.optim.AdamW", function()
  local space = {
    lr = { 0.01, 0.5 }, betas = { { 0.9, 0.999 }, { 0.5, 0.8 } },
    weight_decay = { 0, 0.1 }, amsgrad = { false, true }, maximize = { false, true },
  }
  local ref = function(p, g, o, st) ref_adam(p, g, o, st, true) end

  it("matches the documented algorithm with decoupled weight decay (f64 and f32, 5 steps)", function()
    for _, o in ipairs(combinations(space)) do
      check_against(optim.AdamW, ref, o, "f64", 5, 1e-12)
      check_against(optim.AdamW, ref, o, "f32", 5, 2e-5)
    end
  end)

  it("defaults weight_decay to 0.01 and decays p by 1 - lr * wd before the Adam step", function()
    check_against(optim.AdamW, ref, { lr = 0.1 }, "f64", 3, 1e-12)
    local p = dl.tensor({ 2 }, { dtype = "f64", requires_grad = true })
    local opt = optim.AdamW({ p }, { lr = 0.1 })
    assert.are.equal(0.01, opt.param_groups[1].weight_decay)
    p.grad = dl.tensor({ 0 }, { dtype = "f64" })
    opt:step() -- zero gradient: only the decay moves p
    assert.are.equal(2 * (1 - 0.1 * 0.01), p:tolist()[1])
  end)

  -- nanoGPT's optimizer: decay on the matrices, none on the vectors, each group with its
  -- own options, under the warm-up + cosine schedule; PyTorch 1.13 runs the same steps.
  it("two param groups under WarmupCosineLR equal PyTorch 1.13's AdamW after 8 steps, state_dict round trip included", function()
    local pytorch = require "pytorch"
    local w0, b0 = values(6, 11), values(3, 12)
    -- gradient of step s for parameter element i: a fixed formula both sides compute
    local function grad_of(n, s, salt)
      local g = {}
      for i = 1, n do g[i] = math.sin(i * 0.7 + s * 1.3 + salt) end
      return g
    end
    local function py_list(v) -- %.17g keeps every bit of the starting values
      local parts = {}
      for i, x in ipairs(v) do parts[i] = ("%.17g"):format(x) end
      return "[" .. table.concat(parts, ", ") .. "]"
    end
    local ref, why = pytorch.run(([==[
w0, b0 = %s, %s
w = torch.tensor(w0).reshape(2, 3).requires_grad_()
b = torch.tensor(b0).requires_grad_()
opt = torch.optim.AdamW([{"params": [w], "weight_decay": 0.1},
                         {"params": [b], "weight_decay": 0.0, "lr": 5e-2, "betas": (0.8, 0.95)}],
                        lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
def lr_at(it, lr, warmup=3, decay=6, min_lr=1e-3):
    if it < warmup: return lr * (it + 1) / (warmup + 1)
    if it > decay: return min_lr
    r = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)
sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda it: lr_at(it, 1e-2) / 1e-2, lambda it: lr_at(it, 5e-2) / 5e-2])
for s in range(8):
    w.grad = torch.tensor([math.sin(i * 0.7 + s * 1.3 + 1) for i in range(1, 7)]).reshape(2, 3)
    b.grad = torch.tensor([math.sin(i * 0.7 + s * 1.3 + 2) for i in range(1, 4)])
    opt.step(); sched.step()
print(json.dumps({"w": w.detach().flatten().tolist(), "b": b.detach().tolist(),
                  "lrs": [g["lr"] for g in opt.param_groups]}))
]==]):format(py_list(w0), py_list(b0)))
    local function run(resume_at)
      local w = dl.tensor({ { w0[1], w0[2], w0[3] }, { w0[4], w0[5], w0[6] } }, { dtype = "f64", requires_grad = true })
      local b = dl.tensor(b0, { dtype = "f64", requires_grad = true })
      local function make(wp, bp)
        local opt = optim.AdamW({ { params = { wp }, weight_decay = 0.1 },
          { params = { bp }, weight_decay = 0, lr = 5e-2, betas = { 0.8, 0.95 } } }, { lr = 1e-2, betas = { 0.9, 0.99 } })
        return opt, optim.WarmupCosineLR(opt, { warmup_iters = 3, lr_decay_iters = 6, min_lr = 1e-3 })
      end
      local opt, sched = make(w, b)
      for s = 0, 7 do
        if s == resume_at then -- a fresh optimizer and scheduler from the state dicts
          local osd, ssd = opt:state_dict(), sched:state_dict()
          assert.are.equal(0.1, osd.param_groups[1].weight_decay)
          assert.are.same({ 1 }, osd.param_groups[2].params)
          opt, sched = make(w, b)
          opt:load_state_dict(osd)
          sched:load_state_dict(ssd)
        end
        local gw = grad_of(6, s, 1)
        w.grad = dl.tensor({ { gw[1], gw[2], gw[3] }, { gw[4], gw[5], gw[6] } }, { dtype = "f64" })
        b.grad = dl.tensor(grad_of(3, s, 2), { dtype = "f64" })
        opt:step()
        sched:step()
      end
      return flat(w), flat(b), { opt.param_groups[1].lr, opt.param_groups[2].lr }, opt
    end
    local w, b, lrs, opt = run(nil)
    assert.are.equal(0.1, opt.param_groups[1].weight_decay)
    assert.are.equal(0, opt.param_groups[2].weight_decay)
    local w2, b2 = run(4)
    assert.are.same(w, w2)
    assert.are.same(b, b2)
    if not ref then pending(why) return end
    assert_list_close(w, ref.w, 1e-12, 1e-14, "w (decayed group)")
    assert_list_close(b, ref.b, 1e-12, 1e-14, "b (no-decay group)")
    assert_list_close(lrs, ref.lrs, 1e-12, 0, "lrs")
  end)
end)

describe("ddplua.optim.Adadelta", function()
  local space = { lr = { 1.0, 0.5 }, rho = { 0.9, 0.5 }, eps = { 1e-6, 1e-2 }, weight_decay = { 0, 0.1 }, maximize = { false, true } }

  it("matches the documented algorithm for every combination (f64 and f32, 5 steps)", function()
    for _, o in ipairs(combinations(space)) do
      check_against(optim.Adadelta, ref_adadelta, o, "f64", 5, 1e-12)
      check_against(optim.Adadelta, ref_adadelta, o, "f32", 5, 2e-5)
    end
  end)

  it("defaults lr to 1.0, rho 0.9, eps 1e-6", function()
    local opt = check_against(optim.Adadelta, ref_adadelta, {}, "f64", 3, 1e-12)
    local g = opt.param_groups[1]
    assert.are.same({ 1.0, 0.9, 1e-6 }, { g.lr, g.rho, g.eps })
  end)
end)

-- ---- the Optimizer contract ----------------------------------------------------------------------

describe("ddplua.optim.Optimizer", function()
  local function leaf(list, dtype) return dl.tensor(list, { dtype = dtype or "f64", requires_grad = true }) end

  it("accepts param groups with their own options", function()
    local a, b = leaf { 1, 2 }, leaf { 3 }
    local opt = optim.SGD({ { params = { a } }, { params = { b }, lr = 0.5, momentum = 0.9 } }, { lr = 0.1 })
    assert.are.equal(2, #opt.param_groups)
    assert.are.equal(0.1, opt.param_groups[1].lr)
    assert.are.equal(0, opt.param_groups[1].momentum)
    assert.are.equal(0.5, opt.param_groups[2].lr)
    assert.are.equal(0.9, opt.param_groups[2].momentum)
    assert.are.equal(a, opt.param_groups[1].params[1])
    a.grad = dl.tensor({ 1, 1 }, { dtype = "f64" })
    b.grad = dl.tensor({ 2 }, { dtype = "f64" })
    opt:step()
    assert.are.same({ 0.9, 1.9 }, a:tolist())
    assert.are.same({ 2 }, b:tolist())
    assert.is_nil(opt.state[a].momentum_buffer) -- no momentum in group 1: no buffer
    assert.are.same({ 2 }, opt.state[b].momentum_buffer:tolist())
  end)

  it("skips parameters without a gradient", function()
    local a, b = leaf { 1 }, leaf { 5 }
    local opt = optim.Adam({ a, b }, { lr = 0.1 })
    a.grad = dl.tensor({ 1 }, { dtype = "f64" })
    opt:step()
    assert.are.same({ 5 }, b:tolist())
    assert.is_nil(opt.state[b])
    assert.are.equal(1, opt.state[a].step)
  end)

  it("zero_grad drops .grad by default and zeroes it in place with set_to_none = false", function()
    local a = leaf { 1, 2 }
    local opt = optim.SGD({ a }, { lr = 0.1 })
    a.grad = dl.tensor({ 3, 4 }, { dtype = "f64" })
    opt:zero_grad()
    assert.is_nil(a.grad)
    local g = dl.tensor({ 3, 4 }, { dtype = "f64" })
    a.grad = g
    opt:zero_grad({ set_to_none = false })
    assert.are.same({ 0, 0 }, a.grad:tolist())
    assert.are.same({ 0, 0 }, g:tolist()) -- the same tensor, zeroed in place
    opt:zero_grad({ set_to_none = true })
    assert.is_nil(a.grad)
  end)

  it("runs a closure with grad mode on and returns its result", function()
    local a = leaf { 1 }
    local opt = optim.SGD({ a }, { lr = 1 })
    local loss = dl.no_grad(function()
      return opt:step(function()
        assert.is_true(dl.is_grad_enabled())
        a.grad = dl.tensor({ 0.5 }, { dtype = "f64" })
        return 42
      end)
    end)
    assert.are.equal(42, loss)
    assert.are.same({ 0.5 }, a:tolist())
  end)

  for _, case in ipairs {
    { "SGD", { lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01 } },
    { "Adam", { lr = 0.05, amsgrad = true, weight_decay = 0.1 } },
    { "AdamW", { lr = 0.05, betas = { 0.8, 0.9 } } },
    { "Adadelta", { lr = 0.7, rho = 0.8 } },
  } do
    local name, o = case[1], case[2]
    it(name .. ": state_dict round trip continues identically", function()
      local a = leaf({ { 1, -2 }, { 0.5, 3 } })
      local b = leaf({ 4, -1, 2 })
      local opt = optim[name]({ { params = { a } }, { params = { b }, lr = 0.01 } }, o)
      local function grads(k, pa, pb)
        local g = grad_at(5, k)
        pa.grad = dl.tensor({ { g[1], g[2] }, { g[3], g[4] } }, { dtype = "f64" })
        pb.grad = dl.tensor({ g[5], -g[1], g[2] * 2 }, { dtype = "f64" })
      end
      for k = 1, 3 do grads(k, a, b); opt:step() end
      local sd = opt:state_dict()
      -- PyTorch's structure: ids from 0 across groups, options, copies of the tensors
      assert.are.same({ 0 }, sd.param_groups[1].params)
      assert.are.same({ 1 }, sd.param_groups[2].params)
      assert.are.equal(0.01, sd.param_groups[2].lr)
      assert.is_table(sd.state[0])
      assert.is_table(sd.state[1])
      local a2, b2 = a:detach():clone(), b:detach():clone()
      a2.requires_grad = true
      b2.requires_grad = true
      local opt2 = optim[name]({ { params = { a2 } }, { params = { b2 } } }, { lr = 123 })
      opt2:load_state_dict(sd)
      assert.are.equal(0.01, opt2.param_groups[2].lr)
      assert.are.equal(o.lr, opt2.param_groups[1].lr)
      -- the saved tensors are copies: stepping A must not change sd
      local before = {}
      for id, st in pairs(sd.state) do
        for k, v in pairs(st) do if dl.is_tensor(v) then before[id .. k] = flat(v) end end
      end
      for k = 4, 5 do
        grads(k, a, b); opt:step()
        grads(k, a2, b2); opt2:step()
      end
      assert.are.same(flat(a), flat(a2))
      assert.are.same(flat(b), flat(b2))
      for id, st in pairs(sd.state) do
        for k, v in pairs(st) do if dl.is_tensor(v) then assert.are.same(before[id .. k], flat(v)) end end
      end
    end)
  end

  it("load_state_dict refuses a different group layout", function()
    local a, b = leaf { 1 }, leaf { 2 }
    local sd = optim.SGD({ a, b }, { lr = 0.1 }):state_dict()
    local opt = optim.SGD({ { params = { a } }, { params = { b } } }, { lr = 0.1 })
    assert.has_error(function() opt:load_state_dict(sd) end)
    local ok, err = pcall(opt.load_state_dict, opt, sd)
    assert.is_false(ok)
    assert.matches("parameter groups", err)
    local opt3 = optim.SGD({ a }, { lr = 0.1 })
    ok, err = pcall(opt3.load_state_dict, opt3, sd)
    assert.matches("group 1 has 2 parameters", err)
  end)

  describe("errors name the option", function()
    local function err_of(fn)
      local ok, e = pcall(fn)
      assert.is_false(ok)
      return tostring(e)
    end
    local p = leaf { 1 }

    it("lr, momentum, weight_decay, eps, rho, betas", function()
      assert.matches("SGD: invalid lr %-1", err_of(function() optim.SGD({ p }, { lr = -1 }) end))
      assert.matches("invalid momentum", err_of(function() optim.SGD({ p }, { momentum = -0.1 }) end))
      assert.matches("invalid weight_decay", err_of(function() optim.Adam({ p }, { weight_decay = -1 }) end))
      assert.matches("invalid eps", err_of(function() optim.AdamW({ p }, { eps = -1e-8 }) end))
      assert.matches("invalid rho", err_of(function() optim.Adadelta({ p }, { rho = 1.5 }) end))
      assert.matches("Adam: invalid betas%[1%] 1 ", err_of(function() optim.Adam({ p }, { betas = { 1, 0.9 } }) end))
      assert.matches("invalid betas%[2%] %-0.1", err_of(function() optim.Adam({ p }, { betas = { 0.9, -0.1 } }) end))
      assert.matches("invalid lr %-0.5", err_of(function() optim.SGD({ { params = { p }, lr = -0.5 } }) end))
      assert.matches("unknown option 'lrr'", err_of(function() optim.SGD({ p }, { lrr = 1 }) end))
      assert.matches("invalid nesterov", err_of(function() optim.SGD({ p }, { nesterov = 1 }) end))
    end)

    it("nesterov without momentum or with dampening", function()
      assert.matches("nesterov momentum requires a momentum", err_of(function() optim.SGD({ p }, { nesterov = true }) end))
      assert.matches("nesterov", err_of(function() optim.SGD({ p }, { nesterov = true, momentum = 0.9, dampening = 0.1 }) end))
    end)

    it("a parameter that is not a tensor, does not require grad, is repeated, or an empty list", function()
      assert.matches("parameter 2 of param group 1 is not a tensor", err_of(function() optim.SGD({ p, 3 }) end))
      local q = dl.tensor { 1 }
      assert.matches("parameter 1 of param group 1 does not require grad", err_of(function() optim.Adam({ q }) end))
      assert.matches("more than one", err_of(function() optim.SGD({ p, p }) end))
      assert.matches("empty parameter list", err_of(function() optim.SGD({}) end))
      assert.matches("params must be a list", err_of(function() optim.SGD(p) end))
    end)

    it("the C kernels refuse bad shapes, dtypes and options", function()
      local lib = require "ddplua.lib"
      local C = lib.C
      local a = leaf { 1, 2 }
      local g3 = dl.tensor({ 1, 2, 3 }, { dtype = "f64" })
      local g32 = dl.tensor({ 1, 2 })
      local function c_err(status)
        assert.are_not.equal(0, status)
        return lib.ffi.string(C.ddp_last_error())
      end
      assert.matches("sgd_step_: grad has shape %(3,?%) but param has shape %(2,?%)",
        c_err(C.ddp_sgd_step_(a, g3, nil, 0.1, 0, 0, 0, 0, 0, 0)))
      assert.matches("grad has dtype f32 but param has dtype f64",
        c_err(C.ddp_sgd_step_(a, g32, nil, 0.1, 0, 0, 0, 0, 0, 0)))
      assert.matches("momentum_buffer is required",
        c_err(C.ddp_sgd_step_(a, dl.tensor({ 1, 1 }, { dtype = "f64" }), nil, 0.1, 0.9, 0, 0, 0, 0, 0)))
      local m, v = dl.zeros({ 2 }, { dtype = "f64" }), dl.zeros({ 2 }, { dtype = "f64" })
      local g = dl.tensor({ 1, 1 }, { dtype = "f64" })
      assert.matches("step must be >= 1", c_err(C.ddp_adam_step_(a, g, m, v, nil, 0, 0.1, 0.9, 0.9, 1e-8, 0, 0, 0)))
      assert.matches("max_exp_avg_sq is required", c_err(C.ddp_adam_step_(a, g, m, v, nil, 1, 0.1, 0.9, 0.9, 1e-8, 0, 1, 0)))
      assert.matches("adamw_step_: invalid beta parameter at index 1",
        c_err(C.ddp_adamw_step_(a, g, m, v, nil, 1, 0.1, 0.9, 1.0, 1e-8, 0, 0, 0)))
      local i = dl.tensor({ 1, 2 }, { dtype = "i64" })
      assert.matches("param has dtype i64", c_err(C.ddp_adadelta_step_(i, i, i, i, 1, 0.9, 1e-6, 0, 0)))
      assert.matches("grad shares its storage with param", c_err(C.ddp_sgd_step_(a, a, nil, 0.1, 0, 0, 0, 0, 0, 0)))
      assert.matches("exp_avg_sq shares its storage with param", c_err(C.ddp_adam_step_(a, g, m, a, nil, 1, 0.1, 0.9, 0.9, 1e-8, 0, 0, 0)))
    end)
  end)
end)
