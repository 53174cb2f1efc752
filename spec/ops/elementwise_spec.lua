-- Specs for ddplua.ops.elementwise: arithmetic with broadcasting and type promotion, unary
-- ops and activations, where, comparisons, in-place forms, operators, autograd and errors.
-- References are plain Lua loops over :tolist() values.
local dl = require "ddplua"
local close = require "close"
local gradcheck = require("gradcheck").gradcheck
local views = require "views"

-- ---- reference machinery ---------------------------------------------------------------

local function flatten(v, out)
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  else
    out[#out + 1] = type(v) == "boolean" and (v and 1 or 0) or v
  end
  return out
end

-- flat row-major values and shape of a tensor (or a number: shape {})
local function values(x)
  if type(x) == "number" then return { x }, {} end
  return flatten(x:tolist(), {}), x:size()
end

local function broadcast_shape(sa, sb)
  local n = math.max(#sa, #sb)
  local out = {}
  for i = 1, n do
    local da = sa[i - (n - #sa)] or 1
    local db = sb[i - (n - #sb)] or 1
    assert(da == db or da == 1 or db == 1, "reference: shapes do not broadcast")
    out[i] = da == 1 and db or da
  end
  return out
end

-- offset into a tensor of shape s for the output index idx (broadcasting s to #idx dims)
local function source_offset(s, idx)
  local off, stride = 0, 1
  for d = #s, 1, -1 do
    local i = idx[d + (#idx - #s)]
    if s[d] ~= 1 then off = off + (i - 1) * stride end
    stride = stride * s[d]
  end
  return off
end

-- f applied element-wise over the broadcast of any number of tensors/numbers:
-- returns flat values and the output shape
local function ref(f, ...)
  local args = { ... }
  local vals, shapes, shape = {}, {}, {}
  for k, x in ipairs(args) do
    vals[k], shapes[k] = values(x)
    shape = broadcast_shape(shape, shapes[k])
  end
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local out = {}
  local idx = {}
  for k = 0, n - 1 do
    local r = k
    for d = #shape, 1, -1 do
      idx[d] = r % shape[d] + 1
      r = math.floor(r / shape[d])
    end
    local xs = {}
    for j = 1, #args do xs[j] = vals[j][source_offset(shapes[j], idx) + 1] end
    out[k + 1] = f(unpack(xs, 1, #args))
  end
  return out, shape
end

local function check_ref(actual, f, inputs, opts)
  local expected, shape = ref(f, unpack(inputs))
  assert.same(shape, actual:size())
  close.assert_close(actual, expected, opts)
end

local gen = dl.Generator(7)
local function randn(shape, dtype) return dl.randn(shape, { dtype = dtype or "f32", generator = gen }) end
-- values in [lo, hi)
local function rand(shape, lo, hi, dtype)
  return dl.rand(shape, { dtype = dtype or "f32", generator = gen }):mul(hi - lo):add(lo)
end

-- erf by its Maclaurin series (exact to ~1e-12 for |x| < 4)
local function erf(x)
  local sum, term, n = 0, x, 0
  while true do
    local t = term / (2 * n + 1)
    sum = sum + t
    if math.abs(t) < 1e-17 then break end
    n = n + 1
    term = -term * x * x / n
    if n > 200 then break end
  end
  return 2 / math.sqrt(math.pi) * sum
end

local function tanh(x)
  local e = math.exp(2 * x)
  if e == math.huge then return 1 end
  return (e - 1) / (e + 1)
end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

local BINARY = {
  add = function(a, b) return a + b end,
  sub = function(a, b) return a - b end,
  mul = function(a, b) return a * b end,
  div = function(a, b) return a / b end,
  pow = function(a, b) return a ^ b end,
  maximum = function(a, b) return math.max(a, b) end,
  minimum = function(a, b) return math.min(a, b) end,
}

local UNARY = {
  neg = function(x) return -x end,
  exp = math.exp,
  log = math.log,
  sqrt = math.sqrt,
  rsqrt = function(x) return 1 / math.sqrt(x) end,
  abs = math.abs,
  relu = function(x) return x > 0 and x or 0 end,
  tanh = tanh,
  sigmoid = sigmoid,
  silu = function(x) return x * sigmoid(x) end,
  gelu = function(x) return 0.5 * x * (1 + erf(x / math.sqrt(2))) end,
  leaky_relu = function(x) return x > 0 and x or 0.01 * x end,
}
-- ops whose input must be positive
local POSITIVE = { log = true, sqrt = true, rsqrt = true }

local SHAPE_PAIRS = {
  { { 2, 3 }, { 2, 3 } }, { { 2, 3 }, { 3 } }, { { 4, 1 }, { 1, 5 } }, { {}, { 2, 2 } },
  { { 3, 1, 2 }, { 4, 1 } }, { { 0, 3 }, { 3 } }, { { 2, 2 }, {} },
}

-- operands for a binary op (pow gets a positive base)
local function operands(name, sa, sb, dtype)
  local a = name == "pow" and rand(sa, 0.5, 2, dtype) or randn(sa, dtype)
  local b = name == "div" and rand(sb, 0.5, 2, dtype) or randn(sb, dtype)
  return a, b
end

describe("ddplua.ops.elementwise", function()
  -- ---- binary ---------------------------------------------------------------------------

  it("computes binary ops with broadcasting against plain Lua loops", function()
    for name, f in pairs(BINARY) do
      for _, pair in ipairs(SHAPE_PAIRS) do
        for _, dtype in ipairs { "f32", "f64" } do
          local a, b = operands(name, pair[1], pair[2], dtype)
          local out = a[name](a, b)
          assert.equal(dtype, out.dtype)
          check_ref(out, f, { a, b }, { rtol = 1e-5, atol = 1e-5 })
          check_ref(dl[name](b, a), function(x, y) return f(y, x) end, { a, b },
            name == "pow" and { rtol = 1e-4, atol = 1e-4 } or { rtol = 1e-5, atol = 1e-5 })
        end
      end
    end
  end)

  it("reads non-contiguous inputs (transposed and strided views)", function()
    for name, f in pairs(BINARY) do
      local a, b = operands(name, { 3, 4 }, { 4, 3 })
      local at, keep = views.transposed(b) -- (3, 4), strides (1, 3)
      local as, keep2 = views.strided(a, 3)
      assert.is_false(at:is_contiguous())
      check_ref(as[name](as, at), f, { a, at }, { rtol = 1e-5, atol = 1e-5 })
      local row, keep3 = views.strided(name == "div" and rand({ 4 }, 0.5, 2) or randn { 4 }, 2)
      check_ref(at[name](at, row), f, { at, row }, { rtol = 1e-5, atol = 1e-5 })
      assert.truthy(keep and keep2 and keep3)
    end
    -- a large non-contiguous input crosses the thread split
    local big = randn { 300, 200 }
    local bt, keep = views.transposed(big)
    local s = bt:add(1)
    local ev, sv = big:tolist(), s:tolist()
    for i = 1, 200, 37 do
      for j = 1, 300, 41 do
        assert.near(ev[j][i] + 1, sv[i][j], 1e-5)
      end
    end
    assert.truthy(keep)
  end)

  it("computes large contiguous tensors the same on the fast and the threaded paths", function()
    local a, b = randn { 1000, 300 }, randn { 300 }
    local sum = a + b
    local av, bv, sv = a:tolist(), b:tolist(), sum:tolist()
    for i = 1, 1000, 97 do
      for j = 1, 300, 29 do assert.near(av[i][j] + bv[j], sv[i][j], 1e-6) end
    end
    local m = a * a
    local mv = m:tolist()
    for i = 1, 1000, 101 do assert.near(av[i][7] * av[i][7], mv[i][7], 1e-5) end
  end)

  it("takes numbers on either side, in methods, functions and operators", function()
    local t = randn { 2, 3 }
    local p = rand({ 2, 3 }, 0.5, 2)
    local cases = {
      { t:add(2), function(x) return x + 2 end, t },
      { t + 2, function(x) return x + 2 end, t },
      { 2 + t, function(x) return 2 + x end, t },
      { t - 2, function(x) return x - 2 end, t },
      { 2 - t, function(x) return 2 - x end, t },
      { dl.sub(2, t), function(x) return 2 - x end, t },
      { t * 3, function(x) return 3 * x end, t },
      { 3 * t, function(x) return 3 * x end, t },
      { t / 4, function(x) return x / 4 end, t },
      { 2 / p, function(x) return 2 / x end, p },
      { dl.div(2, p), function(x) return 2 / x end, p },
      { p ^ 2.5, function(x) return x ^ 2.5 end, p },
      { 2 ^ t, function(x) return 2 ^ x end, t },
      { dl.pow(3, t), function(x) return 3 ^ x end, t },
      { -t, function(x) return -x end, t },
      { t:maximum(0.1), function(x) return math.max(x, 0.1) end, t },
      { dl.minimum(0.1, t), function(x) return math.min(x, 0.1) end, t },
    }
    for i, c in ipairs(cases) do
      assert.equal("f32", c[1].dtype, "case " .. i)
      check_ref(c[1], c[2], { c[3] }, { rtol = 1e-5, atol = 1e-5 })
    end
    local u = randn { 3 }
    check_ref(t + u, BINARY.add, { t, u })
    check_ref(t - u, BINARY.sub, { t, u })
    check_ref(t * u, BINARY.mul, { t, u })
    check_ref(t / u, BINARY.div, { t, u }, { rtol = 1e-5, atol = 1e-4 })
    check_ref(p ^ u, BINARY.pow, { p, u }, { rtol = 1e-5, atol = 1e-5 })
  end)

  it("survives hot loops of tensor + number under the JIT (Note [pointer plus number])", function()
    -- crashed LuaJIT once the loop was compiled, before __add/__sub were kept out of the JIT
    local acc = 0
    for _ = 1, 3000 do
      local x = dl.zeros { 2 }
      acc = acc + (x + 2):get(1) + (2 + x):get(2) + (x - 1):get(1)
    end
    assert.equal(3000 * 3, acc)
  end)

  it("supports alpha on add and sub", function()
    local a, b = randn { 2, 3 }, randn { 3 }
    check_ref(a:add(b, { alpha = 2.5 }), function(x, y) return x + 2.5 * y end, { a, b })
    check_ref(dl.sub(a, b, { alpha = -3 }), function(x, y) return x + 3 * y end, { a, b })
    check_ref(a:add(2, { alpha = 3 }), function(x) return x + 6 end, { a })
    local c = a:clone()
    c:add_(b, { alpha = 0.5 })
    check_ref(c, function(x, y) return x + 0.5 * y end, { a, b })
    c = a:clone()
    c:sub_(b, { alpha = 2 })
    check_ref(c, function(x, y) return x - 2 * y end, { a, b })
  end)

  it("promotes dtypes as PyTorch", function()
    local f32, f64 = randn({ 3 }, "f32"), randn({ 3 }, "f64")
    local i64 = dl.tensor({ 7, -3, 4 }, { dtype = "i64" })
    local i32 = dl.tensor({ 2, 5, -2 }, { dtype = "i32" })
    local u8 = dl.tensor({ 1, 2, 3 }, { dtype = "u8" })
    local bool = dl.tensor { true, false, true }
    assert.equal("f64", (f32 + f64).dtype)
    assert.equal("f32", (i64 + f32).dtype)
    assert.equal("i64", (i64 + i32).dtype)
    assert.equal("i32", (u8 + i32).dtype)
    assert.equal("i64", (i64 * 3).dtype)
    assert.equal("f32", (i64 * 2.5).dtype)
    assert.equal("f64", (f64 * 2.5).dtype)
    assert.equal("i64", (bool + 1).dtype)
    assert.equal("bool", (bool + bool).dtype)
    assert.same({ true, false, true }, (bool + bool):tolist())
    assert.same({ 21, -9, 12 }, (i64 * 3):tolist())
    assert.same({ 9, 2, 2 }, (i64 + i32):tolist())
    close.assert_close(i64 * 2.5, { 17.5, -7.5, 10 })
    -- true division of integers gives f32
    local q = i64 / i32
    assert.equal("f32", q.dtype)
    close.assert_close(q, { 3.5, -0.6, -2 })
    assert.equal("f32", (i64 / 2).dtype)
    close.assert_close(i64 / 2, { 3.5, -1.5, 2 })
    close.assert_close(1 / i32, { 0.5, 0.2, -0.5 })
    -- integer powers stay integers
    assert.same({ 49, 9, 16 }, (i64 ^ 2):tolist())
    assert.equal("i64", (i64 ^ 2).dtype)
    assert.same({ 4, 32, 0 }, (2 ^ i32):tolist())
    -- a 0-d tensor does not promote a dimensioned one of the same category
    local h = randn({ 4 }, "f16")
    local z32 = dl.tensor(2, { dtype = "f32" })
    assert.equal("f16", (h * z32).dtype)
    assert.equal("f64", (i64 + dl.tensor(1.5, { dtype = "f64" })).dtype)
    assert.equal("f64", (z32 + dl.tensor(1, { dtype = "f64" })).dtype) -- both 0-d
    -- mixed f32/f64 values computed in f64
    check_ref(f32 * f64, BINARY.mul, { f32, f64 }, { rtol = 1e-12, atol = 1e-12 })
  end)

  it("computes f16 and bf16 close to f32 within their precision", function()
    local a, b = randn { 4, 5 }, rand({ 5 }, 0.5, 2)
    for _, dt in ipairs { "f16", "bf16" } do
      local tol = dt == "f16" and { rtol = 2e-3, atol = 2e-3 } or { rtol = 1.6e-2, atol = 1.6e-2 }
      local ah, bh = a:to(dt), b:to(dt)
      for name, f in pairs(BINARY) do
        if name ~= "pow" then
          local out = ah[name](ah, bh)
          assert.equal(dt, out.dtype)
          check_ref(out:to("f32"), f, { ah, bh }, tol)
        end
      end
      for _, name in ipairs { "exp", "tanh", "sigmoid", "silu", "gelu", "relu", "neg", "abs" } do
        local out = ah[name](ah)
        assert.equal(dt, out.dtype)
        check_ref(out, UNARY[name], { ah }, { rtol = tol.rtol * 2, atol = tol.atol * 2 })
      end
      check_ref(ah + 0.1, function(x) return x + 0.1 end, { ah }, tol)
    end
  end)

  it("handles zero-size inputs", function()
    local e = dl.zeros { 0, 3 }
    assert.same({ 0, 3 }, (e + dl.ones { 3 }):size())
    assert.same({ 0, 3 }, (e * 2):size())
    assert.same({ 0, 3 }, e:exp():size())
    assert.same({ 0, 3 }, e:lt(1):size())
    assert.same({ 0, 3 }, dl.where(e:gt(0), e, 1):size())
    assert.same({ 2, 0 }, (dl.ones { 2, 1 } + dl.zeros { 0 }):size())
    local w = dl.zeros({ 0, 2 }, { dtype = "f64", requires_grad = true })
    local y = w:mul(3):relu()
    y:backward(dl.zeros({ 0, 2 }, { dtype = "f64" }))
    assert.same({ 0, 2 }, w.grad:size())
  end)

  -- ---- unary ----------------------------------------------------------------------------

  it("computes unary ops and activations against plain Lua", function()
    for name, f in pairs(UNARY) do
      for _, dtype in ipairs { "f32", "f64" } do
        local x = POSITIVE[name] and rand({ 3, 4 }, 0.1, 3, dtype) or randn({ 3, 4 }, dtype)
        local tol = dtype == "f64" and { rtol = 1e-10, atol = 1e-10 } or { rtol = 2e-6, atol = 2e-6 }
        local out = x[name](x)
        assert.equal(dtype, out.dtype)
        check_ref(out, f, { x }, tol)
        check_ref(dl[name](x), f, { x }, tol)
        -- non-contiguous input
        local xt, keep = views.transposed(x)
        check_ref(xt[name](xt), f, { xt }, tol)
        assert.truthy(keep)
        -- in place on a copy
        local c = x:clone()
        assert.equal(c, c[name .. "_"](c))
        check_ref(c, f, { x }, tol)
      end
    end
  end)

  it("takes options for leaky_relu, gelu and clamp", function()
    local x = randn { 5, 4 }
    check_ref(x:leaky_relu(0.2), function(v) return v > 0 and v or 0.2 * v end, { x })
    check_ref(dl.leaky_relu(x, { negative_slope = 0.3 }), function(v) return v > 0 and v or 0.3 * v end, { x })
    local k = math.sqrt(2 / math.pi)
    local function gelu_tanh(v) return 0.5 * v * (1 + tanh(k * (v + 0.044715 * v ^ 3))) end
    check_ref(x:gelu({ approximate = "tanh" }), gelu_tanh, { x }, { rtol = 1e-5, atol = 1e-6 })
    check_ref(dl.gelu(x, "tanh"), gelu_tanh, { x }, { rtol = 1e-5, atol = 1e-6 })
    check_ref(x:gelu({ approximate = "none" }), UNARY.gelu, { x }, { rtol = 1e-5, atol = 1e-6 })
    assert.has_error(function() x:gelu({ approximate = "fast" }) end)
    check_ref(x:clamp(-0.5, 0.5), function(v) return math.min(math.max(v, -0.5), 0.5) end, { x })
    check_ref(x:clamp(nil, 0.5), function(v) return math.min(v, 0.5) end, { x })
    check_ref(x:clamp(-0.5), function(v) return math.max(v, -0.5) end, { x })
    check_ref(dl.clamp(x, { max = 0 }), function(v) return math.min(v, 0) end, { x })
    check_ref(x:clone():clamp_(0, 0.25), function(v) return math.min(math.max(v, 0), 0.25) end, { x })
    local i = dl.tensor({ -3, 0, 4, 9 }, { dtype = "i64" })
    assert.same({ 0, 0, 4, 5 }, i:clamp(0, 5):tolist())
    assert.equal("i64", i:clamp(0, 5).dtype)
    assert.equal("f32", i:clamp(0.5).dtype)
    assert.same({ 3, 0, 4, 9 }, i:abs():tolist())
    assert.same({ 0, 0, 4, 9 }, i:relu():tolist())
    assert.same({ 3, 0, -4, -9 }, (-i):tolist())
    assert.equal("f32", i:exp().dtype)
    close.assert_close(i:sigmoid(), { sigmoid(-3), 0.5, sigmoid(4), sigmoid(9) })
  end)

  it("relu, neg, abs and relu's gradient of f16/bf16 keep signed zeros, infinities and NaN (Note [half sign ops])", function()
    local inf = math.huge
    for _, dtype in ipairs { "f16", "bf16" } do
      local base = { -inf, -2.5, -1e-6, -0.0, 0, 1e-6, 3, inf, 0 / 0 }
      local x = dl.tensor(base, { dtype = "f64" }):to(dtype)
      -- strided too: every other element of a longer tensor
      local col = x:view(9, 1)
      local wide = dl.cat({ col, col }, 2):select(2, 1) -- stride 2
      for _, t in ipairs { x, wide } do
        local v = t:to("f64"):tolist()
        for name, f in pairs { relu = function(a) return a < 0 and 0 or a end, neg = function(a) return -a end,
                               abs = math.abs } do
          local got = t[name](t):to("f64"):tolist()
          for i = 1, #v do
            local e = f(v[i])
            local same = got[i] == e and (e ~= 0 or 1 / got[i] == 1 / e) or (got[i] ~= got[i] and e ~= e)
            assert.is_true(same, ("%s %s of %s: %s, expected %s"):format(dtype, name, v[i], got[i], e))
          end
        end
      end
      local xr = x:detach():requires_grad_()
      xr:relu():backward(dl.full({ 9 }, 2, { dtype = dtype }))
      assert.same({ 0, 0, 0, 0, 0, 2, 2, 2, 0 }, xr.grad:to("f64"):tolist())
    end
  end)

  it("keeps NaN through relu, clamp, maximum and minimum", function()
    local x = dl.tensor { 0 / 0, 1, -1 }
    local r = x:relu():tolist()
    assert.is_true(r[1] ~= r[1])
    local c = x:clamp(0, 0.5):tolist()
    assert.is_true(c[1] ~= c[1])
    local m = dl.maximum(x, dl.zeros { 3 }):tolist()
    assert.is_true(m[1] ~= m[1])
    local n = dl.minimum(dl.zeros { 3 }, x):tolist()
    assert.is_true(n[1] ~= n[1])
    for _, name in ipairs { "exp", "sigmoid", "silu", "gelu", "tanh" } do
      local v = x[name](x):tolist()
      assert.is_true(v[1] ~= v[1], name)
    end
    -- exp at the ends of the f32 range
    local e = dl.tensor({ -1 / 0, 1 / 0, 89, -110, -100, 88 }):exp():tolist()
    assert.same({ 0, math.huge, math.huge, 0 }, { e[1], e[2], e[3], e[4] })
    assert.near(math.exp(-100), e[5], 1e-45)
    assert.near(math.exp(88), e[6], math.exp(88) * 2e-7)
  end)

  -- ---- where and comparisons ------------------------------------------------------------

  it("selects with where, broadcasting the condition and both values", function()
    local a, b = randn { 2, 3 }, randn { 3 }
    local c = dl.tensor { true, false, true }
    local function sel(cond, x, y) return cond ~= 0 and x or y end
    check_ref(dl.where(c, a, b), sel, { c, a, b })
    local c2 = randn({ 4, 1 }):gt(0)
    local a2, b2 = randn { 1, 5 }, randn {}
    check_ref(dl.where(c2, a2, b2), sel, { c2, a2, b2 })
    check_ref(a:where(c, 0), function(cond, x) return cond ~= 0 and x or 0 end, { c, a })
    check_ref(dl.where(c, 1, b), function(cond, y) return cond ~= 0 and 1 or y end, { c, b })
    assert.equal("f64", dl.where(c, a, b:double()).dtype)
    local i = dl.tensor({ 1, 2, 3 }, { dtype = "i64" })
    assert.same({ 1, 0, 3 }, dl.where(c, i, 0):tolist())
    assert.equal("i64", dl.where(c, i, 0).dtype)
  end)

  it("compares tensors and numbers into bool tensors", function()
    local a, b = randn { 2, 3 }, randn { 3 }
    b = b:mul(0) + a:get(1, 2) -- one equal element at least
    local cmp = {
      eq = function(x, y) return x == y end, ne = function(x, y) return x ~= y end,
      lt = function(x, y) return x < y end, le = function(x, y) return x <= y end,
      gt = function(x, y) return x > y end, ge = function(x, y) return x >= y end,
    }
    for name, f in pairs(cmp) do
      local out = a[name](a, b)
      assert.equal("bool", out.dtype)
      check_ref(out, function(x, y) return f(x, y) and 1 or 0 end, { a, b })
      check_ref(a[name](a, 0.25), function(x) return f(x, 0.25) and 1 or 0 end, { a })
      check_ref(dl[name](0.25, a), function(x) return f(0.25, x) and 1 or 0 end, { a })
      local at, keep = views.transposed(randn { 3, 2 })
      check_ref(at[name](at, b), function(x, y) return f(x, y) and 1 or 0 end, { at, b })
      assert.truthy(keep)
    end
    -- compared in the promoted dtype
    local i = dl.tensor({ 1, 2, 3 }, { dtype = "i64" })
    assert.same({ true, false, false }, i:lt(1.5):tolist())
    assert.same({ false, true, false }, i:eq(dl.tensor({ 0.5, 2, 2.5 }, { dtype = "f64" })):tolist())
    assert.is_false(i:lt(2).requires_grad)
    local w = randn({ 3 }):requires_grad_()
    assert.is_false(w:gt(0).requires_grad)
  end)

  -- ---- autograd -------------------------------------------------------------------------

  it("passes gradcheck for every binary op with broadcasting (f64)", function()
    for name in pairs(BINARY) do
      for _, pair in ipairs { { { 2, 3 }, { 3 } }, { { 4, 1 }, { 1, 5 } }, { {}, { 2, 2 } }, { { 2, 2 }, { 2, 2 } } } do
        local a, b = operands(name, pair[1], pair[2], "f64")
        if name == "maximum" or name == "minimum" then b = b:add(0.01) end -- no ties
        assert.is_true(gradcheck(function(x, y) return x[name](x, y) end, { a, b }))
      end
    end
    -- pow w.r.t. a negative base and integer exponent
    assert.is_true(gradcheck(function(x) return x ^ 3 end, { randn({ 4 }, "f64") }))
  end)

  it("passes gradcheck for the scalar forms and alpha (f64)", function()
    local x = rand({ 2, 3 }, 0.5, 2, "f64")
    local fns = {
      function(t) return t + 2 end, function(t) return 2 - t end, function(t) return t - 2 end,
      function(t) return t * -3 end, function(t) return t / 4 end, function(t) return 3 / t end,
      function(t) return t ^ 2.5 end, function(t) return 2 ^ t end, function(t) return -t end,
      function(t) return t:add(t, { alpha = 3 }) end,
      function(t) return t:sub(t:mul(t), { alpha = 0.5 }) end,
      function(t) return t:maximum(1) end,
    }
    for _, f in ipairs(fns) do assert.is_true(gradcheck(f, { x:detach():clone() })) end
  end)

  it("passes gradcheck for every unary op (f64), away from kinks", function()
    for name in pairs(UNARY) do
      local x = randn({ 3, 4 }, "f64")
      if POSITIVE[name] then
        x = rand({ 3, 4 }, 0.2, 3, "f64")
      elseif name == "abs" or name == "relu" or name == "leaky_relu" then
        x = dl.where(x:ge(0), x + 0.1, x - 0.1) -- |x| >= 0.1: no kink in reach
      end
      assert.is_true(gradcheck(function(t) return t[name](t) end, { x }), name)
    end
    local x = randn({ 3, 4 }, "f64")
    assert.is_true(gradcheck(function(t) return t:gelu({ approximate = "tanh" }) end, { x }))
    local y = randn({ 3, 4 }, "f64")
    assert.is_true(gradcheck(function(t) return t:leaky_relu(0.2) end, { dl.where(y:ge(0), y + 0.1, y - 0.1) }))
    -- clamp: keep inputs away from the bounds
    local c = dl.tensor({ -1.2, -0.3, 0.2, 0.9, 1.5, -2 }, { dtype = "f64" })
    assert.is_true(gradcheck(function(t) return t:clamp(-0.5, 0.5) end, { c }))
    assert.is_true(gradcheck(function(t) return t:clamp(nil, 0.5) end, { c:detach():clone() }))
    assert.is_true(gradcheck(function(t) return t:clamp(-0.5) end, { c:detach():clone() }))
  end)

  it("passes gradcheck for where w.r.t. both values (f64)", function()
    local c = randn({ 4, 1 }):gt(0)
    assert.is_true(gradcheck(function(a, b) return dl.where(c, a, b) end,
      { randn({ 1, 5 }, "f64"), randn({ 4, 5 }, "f64") }))
  end)

  it("casts gradients back to each input's dtype and shape", function()
    local a = randn({ 2, 3 }, "f32"):requires_grad_()
    local b = randn({ 3 }, "f64"):requires_grad_()
    local y = a * b
    assert.equal("f64", y.dtype)
    y:backward(dl.ones({ 2, 3 }, { dtype = "f64" }))
    assert.equal("f32", a.grad.dtype)
    assert.same({ 3 }, b.grad:size())
    assert.equal("f64", b.grad.dtype)
    local av = a:tolist()
    close.assert_close(b.grad, { av[1][1] + av[2][1], av[1][2] + av[2][2], av[1][3] + av[2][3] })
    close.assert_close(a.grad, { b:tolist(), b:tolist() }, { rtol = 1e-6 })
    assert.equal("MulBackward", y.grad_fn)
    assert.equal("ReluBackward", a:relu().grad_fn)
  end)

  it("records nothing under no_grad and for integer results", function()
    local w = randn({ 3 }):requires_grad_()
    local y = dl.no_grad(function() return w * 2 + w end)
    assert.is_false(y.requires_grad)
    assert.is_true((w:exp()).requires_grad)
  end)

  -- ---- in-place -------------------------------------------------------------------------

  it("computes in-place forms with broadcasting of the other operand", function()
    local a, b = randn { 2, 3 }, rand({ 3 }, 0.5, 2)
    for _, name in ipairs { "add", "sub", "mul", "div" } do
      local c = a:clone()
      assert.equal(c, c[name .. "_"](c, b))
      check_ref(c, BINARY[name], { a, b })
      c = a:clone()
      c[name .. "_"](c, 1.5)
      check_ref(c, function(x) return BINARY[name](x, 1.5) end, { a })
    end
    local p = rand({ 2, 3 }, 0.5, 2)
    check_ref(p:clone():pow_(b), BINARY.pow, { p, b }, { rtol = 1e-5 })
    check_ref(p:clone():pow_(2), function(x) return x * x end, { p }, { rtol = 1e-5 })
    -- in place on a non-contiguous view writes through to its storage
    local v, owner = views.strided(a, 2)
    v:mul_(2)
    check_ref(v, function(x) return 2 * x end, { a })
    assert.truthy(owner)
    -- integers in place, f64 into f32
    local i = dl.tensor({ 1, 2, 3 }, { dtype = "i64" })
    i:add_(dl.tensor({ 1, 1, 1 }, { dtype = "i32" })):mul_(3)
    assert.same({ 6, 9, 12 }, i:tolist())
    local f = dl.zeros { 3 }
    f:add_(dl.tensor({ 0.5, 1, 1.5 }, { dtype = "f64" }))
    assert.same({ 0.5, 1, 1.5 }, f:tolist())
    assert.equal("f32", f.dtype)
  end)

  it("refuses in-place results that do not fit self", function()
    local i = dl.tensor({ 1, 2 }, { dtype = "i64" })
    assert.has_error(function() i:add_(0.5) end, nil)
    local ok, err = pcall(function() i:div_(2) end)
    assert.is_false(ok)
    assert.matches("div_: result type f32 can't be cast to the desired output type i64", err)
    ok, err = pcall(function() i:exp_() end)
    assert.matches("exp_: result type f32", err)
    ok, err = pcall(function() dl.zeros { 3 }:add_(dl.zeros { 2, 3 }) end)
    assert.is_false(ok)
    assert.matches("add_: .*%(3,%).*%(2, 3%)", err)
  end)

  it("records in-place ops on non-leaf tensors and differentiates through them", function()
    local ops = {
      function(t, u) return t:mul(1):add_(u) end,
      function(t, u) return t:mul(1):sub_(u, { alpha = 2 }) end,
      function(t, u) return t:mul(1):mul_(u) end,
      function(t, u) return t:mul(1):div_(u) end,
      function(t, u) return t:mul(1):pow_(u) end,
      function(t, u) return t:mul(1):mul_(3):add_(u) end,
      function(t, u) return t:add(0):pow_(2):mul_(u) end,
      function(t, u) return t:mul(u):exp_() end,
      function(t, u) return t:mul(u):sigmoid_() end,
      function(t, u) return t:mul(u):tanh_() end,
      function(t, u) return t:mul(u):silu_() end,
      function(t, u) return t:mul(u):gelu_() end,
      function(t, u) return t:mul(u):log_() end,
      function(t, u) return t:mul(u):sqrt_() end,
      function(t, u) return t:mul(u):rsqrt_() end,
      function(t, u) return t:mul(u):neg_() end,
      function(t, u) return t:mul(u):clamp_(0.5, 2) end,
      function(t, u) return t:mul(u):relu_() end,
      function(t, u) return t:mul(-1):abs_() end,
      function(t, u) return t:mul(-1):leaky_relu_(0.1) end,
    }
    for k, f in ipairs(ops) do
      local t = rand({ 2, 3 }, 0.6, 1.5, "f64")
      local u = rand({ 3 }, 0.6, 1.5, "f64")
      local ok, err = pcall(gradcheck, f, { t, u })
      assert(ok, "in-place case " .. k .. ": " .. tostring(err))
    end
    local t = randn({ 3 }):requires_grad_()
    local y = t:mul(2)
    y:relu_()
    assert.equal("ReluBackward", y.grad_fn)
    -- a tensor that does not require grad becomes part of the graph when other does
    local buf = dl.zeros { 3 }
    buf:add_(t)
    assert.is_true(buf.requires_grad)
    assert.equal("AddBackward", buf.grad_fn)
  end)

  it("refuses in-place ops on leaves that require grad, unless under no_grad", function()
    local w = randn({ 3 }):requires_grad_()
    local ok, err = pcall(function() w:mul_(2) end)
    assert.is_false(ok)
    assert.matches("mul_: a leaf Variable that requires grad", err)
    ok, err = pcall(function() w:relu_() end)
    assert.matches("relu_: a leaf Variable that requires grad", err)
    local before = w:tolist()
    dl.no_grad(function() w:mul_(2) end)
    close.assert_close(w, { 2 * before[1], 2 * before[2], 2 * before[3] })
    assert.is_true(w.is_leaf)
  end)

  it("detects a saved tensor modified in place before backward", function()
    local w = randn({ 3 }, "f64"):requires_grad_()
    local x = w:mul(1)
    local y = x:mul(w)   -- saves x
    x:add_(1)            -- modifies it
    local ok, err = pcall(function() y:backward(dl.ones({ 3 }, { dtype = "f64" })) end)
    assert.is_false(ok)
    assert.matches("MulBackward.*modified by an in%-place", err)
    local s = w:sigmoid()  -- saves its output
    s:mul_(2)
    ok, err = pcall(function() s:backward(dl.ones({ 3 }, { dtype = "f64" })) end)
    assert.is_false(ok)
    assert.matches("modified by an in%-place", err)
  end)

  it("refuses a second backward through ops that saved tensors", function()
    local w = randn({ 3 }, "f64"):requires_grad_()
    local y = w:mul(w)
    y:backward(dl.ones({ 3 }, { dtype = "f64" }))
    local ok, err = pcall(function() y:backward(dl.ones({ 3 }, { dtype = "f64" })) end)
    assert.is_false(ok)
    assert.matches("second time", err)
  end)

  -- ---- errors ---------------------------------------------------------------------------

  it("names the op and both shapes when shapes do not broadcast", function()
    local a, b = dl.zeros { 2, 3 }, dl.zeros { 4 }
    for _, name in ipairs { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "lt" } do
      local ok, err = pcall(function() return a[name](a, b) end)
      assert.is_false(ok)
      assert.matches(name .. ": the shapes %(2, 3%) and %(4,%) cannot be broadcast", err)
    end
    local ok, err = pcall(function() return a + b end)
    assert.matches("add: the shapes %(2, 3%) and %(4,%)", err)
    assert.matches("elementwise_spec", err) -- raised at the caller's line
    ok, err = pcall(function() return dl.where(dl.zeros({ 5 }, { dtype = "bool" }), a, a) end)
    assert.matches("where: the shapes %(5,%) %(condition%), %(2, 3%) and %(2, 3%)", err)
  end)

  it("raises for bad dtypes and arguments", function()
    local ok, err = pcall(function() return dl.where(dl.zeros { 3 }, dl.zeros { 3 }, 1) end)
    assert.matches("where: the condition must be a bool tensor, got f32", err)
    local bool = dl.tensor { true, false }
    ok, err = pcall(function() return bool - bool end)
    assert.matches("sub: subtraction of bool tensors", err)
    local i = dl.tensor({ 1, 2 }, { dtype = "i64" })
    ok, err = pcall(function() return i ^ -1 end)
    assert.matches("pow: integers to negative integer powers", err)
    ok, err = pcall(function() return i:gelu() end)
    assert.matches("gelu: not supported for i64", err)
    ok, err = pcall(function() return bool:neg() end)
    assert.matches("neg: not supported for bool", err)
    ok, err = pcall(function() return dl.zeros { 2 }:clamp("a") end)
    assert.matches("clamp: min must be a number", err)
  end)

  it("raises, never crashes, for freed tensors", function()
    local a, b = dl.ones { 2 }, dl.ones { 2 }
    b:free()
    for _, f in ipairs {
      function() return a + b end, function() return b * 2 end, function() return b:exp() end,
      function() return a:add_(b) end, function() return b:relu_() end,
      function() return dl.where(a:gt(0), a, b) end, function() return a:lt(b) end,
    } do
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.matches("freed", err)
    end
  end)
end)
