-- Specs for ddplua.ops.reduce: sum, mean, max/min (dim and full), argmax/argmin, var, std,
-- norm, softmax and log_softmax against references written here in plain Lua loops over
-- :tolist(), on seeded random inputs (contiguous and strided views, every dim, keepdim
-- both ways, zero-size), gradchecks in f64 and the error messages.
local dl = require "ddplua"
local close = require "close"
local views = require "views"
local gradcheck = require("gradcheck").gradcheck

local gen = dl.Generator(42)
local function randn(shape, dtype) return dl.randn(shape, { dtype = dtype or "f32", generator = gen }) end

-- ---- reference helpers ---------------------------------------------------------------------

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  elseif type(v) == "boolean" then
    out[#out + 1] = v and 1 or 0
  else
    out[#out + 1] = v
  end
  return out
end

-- Groups of input values per output element: dimset[d] = true for reduced dims (1-based).
-- Returns groups (list of lists, output row-major order; each in reduced row-major order)
-- and the output shape.
local function groups_of(t, dimset, keepdim)
  local sizes = t:size()
  local vals = flatten(t:tolist())
  local out_shape, kept = {}, {}
  for d = 1, #sizes do
    if dimset[d] then
      if keepdim then out_shape[#out_shape + 1] = 1 end
    else
      out_shape[#out_shape + 1] = sizes[d]
      kept[#kept + 1] = d
    end
  end
  local nout = 1
  for _, d in ipairs(kept) do nout = nout * sizes[d] end
  local groups = {}
  for i = 1, nout do groups[i] = {} end
  local idx = {}
  for d = 1, #sizes do idx[d] = 0 end
  for k = 1, #vals do
    local key = 0
    for _, d in ipairs(kept) do key = key * sizes[d] + idx[d] end
    local g = groups[key + 1]
    g[#g + 1] = vals[k]
    for d = #sizes, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] < sizes[d] then break end
      idx[d] = 0
    end
  end
  return groups, out_shape
end

local function set_of(dims, ndim)
  local s = {}
  if dims == nil or #dims == 0 then
    for d = 1, ndim do s[d] = true end
  else
    for _, d in ipairs(dims) do s[d < 0 and ndim + d + 1 or d] = true end
  end
  return s
end

-- Compare op output with reference fn(group) -> number over the groups.
local function check_reduce(actual, t, dims, keepdim, fn, tol)
  local groups, shape = groups_of(t, set_of(dims, t:dim()), keepdim)
  assert.same(shape, actual:size())
  local expected = {}
  for i, g in ipairs(groups) do expected[i] = fn(g) end
  close.assert_close(actual, expected, tol or { atol = 1e-5, rtol = 1e-5 })
end

local function ref_sum(g)
  local s = 0
  for _, v in ipairs(g) do s = s + v end
  return s
end
local function ref_mean(g) return ref_sum(g) / #g end
local function ref_var(c)
  return function(g)
    local m, s = ref_mean(g), 0
    for _, v in ipairs(g) do s = s + (v - m) ^ 2 end
    return s / (#g - c)
  end
end
local function ref_norm(p)
  return function(g)
    local s = 0
    for _, v in ipairs(g) do
      if p == math.huge then s = math.max(s, math.abs(v)) else s = s + math.abs(v) ^ p end
    end
    return p == math.huge and s or s ^ (1 / p)
  end
end

-- Every dims choice worth testing for an n-d tensor: each single dim (also negative),
-- adjacent and non-adjacent pairs, and all (nil).
local function dim_choices(n)
  local c = { {} }
  for d = 1, n do
    c[#c + 1] = { d }
    c[#c + 1] = { d - n - 1 }
  end
  if n >= 2 then c[#c + 1] = { 1, 2 } end
  if n >= 3 then
    c[#c + 1] = { 1, 3 }
    c[#c + 1] = { 2, 3 }
    c[#c + 1] = { 3, 1 }
  end
  return c
end

local shapes = { { 7 }, { 3, 5 }, { 2, 3, 4 }, { 2, 1, 3, 2 } }

-- Inputs: a contiguous tensor and strided / transposed views with the same values shape.
local function inputs_for(shape, dtype)
  local list = { randn(shape, dtype) }
  local v, owner = views.strided(randn(shape, dtype), 2)
  list[#list + 1] = v
  list.owner1 = owner
  if #shape == 2 then
    local tv, o2 = views.transposed(randn({ shape[2], shape[1] }, dtype))
    list[#list + 1] = tv
    list.owner2 = o2
  end
  return list
end

-- Drive: for each shape, input kind, dims choice and keepdim, call op(t, dims, opts).
local function for_all(fn)
  for _, shape in ipairs(shapes) do
    local ins = inputs_for(shape)
    for _, t in ipairs(ins) do
      for _, dims in ipairs(dim_choices(#shape)) do
        for _, keepdim in ipairs { false, true } do fn(t, dims, keepdim) end
      end
    end
  end
end

local function lua_dims(dims)
  if #dims == 0 then return nil end
  if #dims == 1 then return dims[1] end
  return dims
end

describe("ddplua.ops.reduce", function()
  describe("sum and mean", function()
    it("match plain loops over every dims choice, keepdim both ways, strided views", function()
      for_all(function(t, dims, keepdim)
        local o = { keepdim = keepdim }
        check_reduce(t:sum(lua_dims(dims), o), t, dims, keepdim, ref_sum)
        check_reduce(t:mean(lua_dims(dims), o), t, dims, keepdim, ref_mean)
        check_reduce(dl.sum(t, dims, o), t, dims, keepdim, ref_sum)
      end)
    end)

    it("give a 0-d tensor for full reductions and accept options alone", function()
      local t = randn({ 3, 4 })
      assert.equal(0, t:sum():dim())
      assert.equal(0, t:mean():dim())
      assert.same({ 1, 1 }, t:sum({ keepdim = true }):size())
      assert.equal("f64", t:sum({ dtype = "f64" }).dtype)
      close.assert_close(t:sum({ dtype = "f64" }), ref_sum(flatten(t:tolist())), { atol = 1e-5 })
    end)

    it("sum long rows, long columns and middle blocks accurately", function()
      for _, shape in ipairs { { 600, 300 }, { 140000 }, { 3, 20000 }, { 4, 300, 5 }, { 100, 1000 } } do
        local t = randn(shape)
        for d = 0, #shape do
          local dims = d == 0 and {} or { d }
          check_reduce(t:sum(lua_dims(dims)), t, dims, false, ref_sum, { atol = 1e-3, rtol = 1e-5 })
        end
      end
      -- blocked accumulation: a naive f32 running sum of ones stalls at 2^24
      local big = dl.ones({ 2 ^ 24 + 4 })
      assert.equal(2 ^ 24 + 4, big:sum():item())
    end)

    it("sum reduced dims in separate runs (a conv bias gradient) without mixing them up", function()
      local t = randn({ 3, 4, 5, 6 })
      for _, dims in ipairs { { 1, 3, 4 }, { 1, 3 }, { 2, 4 }, { 1, 2, 4 } } do
        for _, keepdim in ipairs { false, true } do
          check_reduce(t:sum(dims, { keepdim = keepdim }), t, dims, keepdim, ref_sum)
          check_reduce(t:mean(dims, { keepdim = keepdim }), t, dims, keepdim, ref_mean)
          check_reduce(t:norm(1, { dim = dims, keepdim = keepdim }), t, dims, keepdim, ref_norm(1))
        end
      end
      local i = dl.randint(-9, 9, { 2, 3, 4 }, { generator = gen })
      check_reduce(i:sum({ 1, 3 }), i, { 1, 3 }, false, ref_sum)
      local e = dl.zeros({ 2, 0, 3, 2 })
      assert.same({ 0 }, e:sum({ 1, 3, 4 }):size())
      assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, e:sum({ 2, 4 }):tolist())
    end)

    it("sum integers and bools into i64 and convert with dtype", function()
      local i = dl.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "i32" })
      assert.equal("i64", i:sum().dtype)
      assert.equal(21, i:sum():item())
      assert.same({ 5, 7, 9 }, i:sum(1):tolist())
      assert.equal("i64", dl.tensor({ 1, 2 }, { dtype = "u8" }):sum().dtype)
      local b = dl.tensor { true, false, true, true }
      assert.equal("i64", b:sum().dtype)
      assert.equal(3, b:sum():item())
      local big = dl.tensor({ 2 ^ 53, 1, 1 }, { dtype = "i64" })
      -- int64 accumulation: a double running sum would lose both ones
      assert.equal(2 ^ 53 + 2, big:sum():item())
      assert.equal("f64", i:sum({ dtype = "f64" }).dtype)
      assert.equal(21, i:sum({ dtype = "f64" }):item())
    end)

    it("compute f16 and bf16 in f32 and keep their dtype", function()
      for _, dt in ipairs { "f16", "bf16" } do
        local t = randn({ 4, 6 }):to(dt)
        local s = t:sum(2)
        assert.equal(dt, s.dtype)
        check_reduce(s, t, { 2 }, false, ref_sum, { atol = 0.05, rtol = 0.01 })
        check_reduce(t:mean(1), t, { 1 }, false, ref_mean, { atol = 0.02, rtol = 0.01 })
      end
    end)

    it("refuse the mean of integers unless a floating dtype is given", function()
      local i = dl.tensor({ 1, 2, 4 }, { dtype = "i64" })
      assert.matches("mean:.*i64.*floating", select(2, pcall(function() return i:mean() end)))
      close.assert_close(i:mean({ dtype = "f64" }), 7 / 3)
    end)

    it("handle zero-size inputs: sum 0, mean nan", function()
      assert.equal(0, dl.zeros({ 0 }):sum():item())
      local m = dl.zeros({ 0 }):mean():item()
      assert.is_true(m ~= m)
      local e = dl.zeros({ 3, 0 })
      assert.same({ 0, 0, 0 }, e:sum(2):tolist())
      assert.same({ 0 }, e:sum(1):size())
      assert.same({ 3, 1 }, e:sum(2, { keepdim = true }):size())
      local mm = e:mean(2):tolist()
      assert.is_true(mm[1] ~= mm[1])
      assert.equal(0, dl.zeros({ 0 }, { dtype = "i64" }):sum():item())
    end)

    it("reduce 0-d tensors over dim 1 / -1", function()
      local s = dl.tensor(2.5)
      assert.equal(2.5, s:sum():item())
      assert.equal(2.5, s:sum(1):item())
      assert.equal(2.5, s:mean(-1):item())
    end)

    it("raise for out-of-range, repeated and zero dims naming the op", function()
      local t = randn({ 2, 3 })
      assert.matches("sum: dimension 3 is out of range", select(2, pcall(function() return t:sum(3) end)))
      assert.matches("mean: dimension %-3 is out of range", select(2, pcall(function() return t:mean(-3) end)))
      assert.matches("sum: dimension 2 appears more than once",
        select(2, pcall(function() return t:sum({ 2, -1 }) end)))
      assert.matches("sum: dim 0 is not valid", select(2, pcall(function() return t:sum(0) end)))
      assert.matches("sum: dims must be", select(2, pcall(function() return t:sum("x") end)))
    end)

    it("pass gradcheck in f64 (dims, keepdim, full, strided input)", function()
      for _, dims in ipairs { {}, { 1 }, { 2 }, { 1, 3 }, { -1 } } do
        for _, keepdim in ipairs { false, true } do
          local o = { keepdim = keepdim }
          assert.is_true(gradcheck(function(x) return x:sum(lua_dims(dims), o) end, { randn({ 2, 3, 2 }, "f64") }))
          assert.is_true(gradcheck(function(x) return x:mean(lua_dims(dims), o) end, { randn({ 2, 3, 2 }, "f64") }))
        end
      end
      local v, owner = views.transposed(randn({ 3, 4 }, "f64"))
      assert.is_true(gradcheck(function(x) return x:sum(1) end, { v }))
      assert.is_truthy(owner)
    end)

    it("give the gradient in the input's dtype when summing into another dtype", function()
      local w = dl.ones({ 2, 3 }, { requires_grad = true })
      w:sum({ dtype = "f64" }):backward()
      assert.equal("f32", w.grad.dtype)
      assert.same({ { 1, 1, 1 }, { 1, 1, 1 } }, w.grad:tolist())
      local h = dl.ones({ 4 }, { dtype = "f16", requires_grad = true })
      h:mean():backward()
      assert.equal("f16", h.grad.dtype)
      close.assert_close(h.grad, { 0.25, 0.25, 0.25, 0.25 })
      assert.equal("SumBackward", dl.ones({ 2 }, { requires_grad = true }):sum().grad_fn)
    end)
  end)

  -- Collect until two collections in a row leave the live bytes as they were (at most 10):
  -- a handle held only by an object with a finaliser needs one more cycle per link of such
  -- a chain, so a fixed two collections could leave an earlier spec's tensor to be freed
  -- inside the window.
  local function settle()
    local live, same = dl.memory_stats().live, 0
    for _ = 1, 10 do
      collectgarbage("collect")
      local now = dl.memory_stats().live
      same = now == live and same + 1 or 0
      if same == 2 then return end
      live = now
    end
  end

  it("frees everything it allocates, forward and backward", function()
    local function work()
      local x = randn({ 3, 4, 5 }, "f64"):requires_grad_()
      local v = x:max(2)
      local parts = { x:sum({ 1, 3 }), x:mean(2, { keepdim = true }), v, x:min(), x:var(1), x:std(),
        x:norm(), x:norm(3, { dim = 2 }), x:norm(math.huge), x:softmax(3), x:log_softmax(1),
        x:to("f32"):sum(2), x:to("f16"):log_softmax(2) }
      for _, p in ipairs(parts) do p:to("f64"):sum():backward() end
      local a = x:argmax(2)
      local ok = pcall(function() return x:sum(9) end)
      assert.is_false(ok)
      assert.is_truthy(a)
    end
    work()
    settle()
    local before = dl.memory_stats().live
    for _ = 1, 5 do work() end
    settle()
    assert.equal(before, dl.memory_stats().live)
  end)

  describe("max, min, argmax, argmin", function()
    -- reference over one dim: values and first index
    local function ref_ext(g, is_max)
      local best, at = g[1], 0
      for i = 2, #g do
        local v = g[i]
        if (is_max and v > best) or (not is_max and v < best) then best, at = v, i - 1 end
      end
      return best, at
    end

    it("return values and first-occurrence indices along every dim", function()
      for _, shape in ipairs(shapes) do
        -- small integers in f32 make ties, so first occurrence is tested
        local ins = { dl.randint(0, 4, shape, { dtype = "f32", generator = gen }),
          dl.randint(-5, 5, shape, { dtype = "i64", generator = gen }), randn(shape) }
        local sv, owner = views.strided(randn(shape), 3)
        ins[#ins + 1] = sv
        for _, t in ipairs(ins) do
          for d = 1, #shape do
            for _, keepdim in ipairs { false, true } do
              for _, op in ipairs { "max", "min" } do
                local is_max = op == "max"
                local v, i = t[op](t, d, { keepdim = keepdim })
                assert.equal("i64", i.dtype)
                assert.equal(t.dtype, v.dtype)
                check_reduce(v, t, { d }, keepdim, function(g) return (ref_ext(g, is_max)) end)
                check_reduce(i, t, { d }, keepdim, function(g) return select(2, ref_ext(g, is_max)) end)
                local a = is_max and t:argmax(d, { keepdim = keepdim }) or t:argmin(d, { keepdim = keepdim })
                check_reduce(a, t, { d }, keepdim, function(g) return select(2, ref_ext(g, is_max)) end)
              end
            end
          end
          local vals = flatten(t:tolist())
          local mx, amx = ref_ext(vals, true)
          local mn, amn = ref_ext(vals, false)
          assert.equal(0, t:max():dim())
          close.assert_close(t:max(), mx)
          close.assert_close(t:min(), mn)
          assert.equal(amx, t:argmax():item())
          assert.equal(amn, t:argmin():item())
        end
        assert.is_truthy(owner)
      end
    end)

    it("work over long columns and rows, bools, u8 and f16", function()
      local t = randn({ 500, 300 })
      local v, i = t:max(1)
      check_reduce(v, t, { 1 }, false, function(g) return (ref_ext(g, true)) end)
      check_reduce(i, t, { 1 }, false, function(g) return select(2, ref_ext(g, true)) end)
      local b = dl.tensor { { false, true, true }, { false, false, false } }
      local bv, bi = b:max(2)
      assert.same({ true, false }, bv:tolist())
      assert.same({ 1, 0 }, bi:tolist())
      local u = dl.tensor({ 3, 9, 2, 9 }, { dtype = "u8" })
      assert.equal(1, u:argmax():item())
      assert.equal(2, u:argmin():item())
      local h = dl.tensor({ { 1, 5, 2 } }, { dtype = "f16" })
      local hv, hi = h:max(2)
      assert.equal("f16", hv.dtype)
      assert.same({ 5 }, hv:tolist())
      assert.same({ 1 }, hi:tolist())
    end)

    it("find the first extreme in long rows (vector lanes) with ties and NaN", function()
      local t = dl.randint(0, 6, { 5, 301 }, { dtype = "f32", generator = gen })
      for _, op in ipairs { "max", "min" } do
        local is_max = op == "max"
        local v, i = t[op](t, 2)
        check_reduce(v, t, { 2 }, false, function(g) return (ref_ext(g, is_max)) end)
        check_reduce(i, t, { 2 }, false, function(g) return select(2, ref_ext(g, is_max)) end)
      end
      local li = dl.randint(-100, 100, { 3, 77 }, { generator = gen })
      check_reduce(li:argmin(2), li, { 2 }, false, function(g) return select(2, ref_ext(g, false)) end)
      local n = dl.zeros({ 100 })
      n:set(40, 0 / 0)
      n:set(70, 5)
      assert.equal(39, n:argmax():item())
      assert.equal(39, n:argmin():item())
      n:set(40, 1)
      assert.equal(69, n:argmax():item())
    end)

    it("give the same results with one thread and with two", function()
      local t = randn({ 300, 700 })
      local prev = dl.get_num_threads()
      local results = {}
      for _, nt in ipairs { 1, 2 } do
        dl.set_num_threads(nt)
        results[nt] = { t:sum(), t:sum(1), t:sum(2), t:max(1), t:argmax(2), t:var(1), t:softmax(2) }
      end
      dl.set_num_threads(prev)
      for k = 1, #results[1] do assert.same(results[1][k]:tolist(), results[2][k]:tolist()) end
      local long = randn({ 140000 })
      dl.set_num_threads(1)
      local one = long:sum():item()
      dl.set_num_threads(2)
      assert.equal(one, long:sum():item())
      dl.set_num_threads(prev)
    end)

    it("propagate NaN with its first index", function()
      local t = dl.tensor { 1, 0 / 0, 3, 0 / 0 }
      local v, i = t:max(1)
      assert.is_true(v:item() ~= v:item())
      assert.equal(1, i:item())
      local mn = t:min():item()
      assert.is_true(mn ~= mn)
      assert.equal(1, t:argmin():item())
    end)

    it("raise on empty reductions naming the op, allow empty outputs", function()
      assert.matches("max: .*empty", select(2, pcall(function() return dl.zeros({ 0 }):max() end)))
      assert.matches("argmin: .*empty", select(2, pcall(function() return dl.zeros({ 2, 0 }):argmin() end)))
      assert.matches("min: dimension 2 .*size 0", select(2, pcall(function() return dl.zeros({ 3, 0 }):min(2) end)))
      local v, i = dl.zeros({ 0, 3 }):max(2)
      assert.same({ 0 }, v:size())
      assert.same({ 0 }, i:size())
      assert.matches("argmax: dimension 3 is out of range",
        select(2, pcall(function() return randn({ 2, 2 }):argmax(3) end)))
      assert.matches("max: dim must be a number", select(2, pcall(function() return randn({ 2 }):max("a") end)))
    end)

    it("send max(dim)'s gradient to the index and pass gradcheck", function()
      local x = dl.tensor({ { 1, 7, 7 }, { 4, 2, 0 } }, { requires_grad = true })
      local v = x:max(2)
      v:backward(dl.tensor { 10, 20 })
      assert.same({ { 0, 10, 0 }, { 20, 0, 0 } }, x.grad:tolist())
      assert.equal("MaxBackward", v.grad_fn)
      for d = 1, 3 do
        for _, keepdim in ipairs { false, true } do
          assert.is_true(gradcheck(function(a) return (a:max(d, { keepdim = keepdim })) end, { randn({ 2, 3, 4 }, "f64") }))
          assert.is_true(gradcheck(function(a) return (a:min(d, { keepdim = keepdim })) end, { randn({ 2, 3, 4 }, "f64") }))
        end
      end
      assert.is_true(gradcheck(function(a) return a:max() end, { randn({ 3, 4 }, "f64") }))
      assert.is_true(gradcheck(function(a) return a:min() end, { randn({ 3, 4 }, "f64") }))
    end)

    it("split the full max's gradient evenly among ties (amax rule)", function()
      local x = dl.tensor({ 1, 3, 3, -2, 3 }, { requires_grad = true })
      x:max():backward(dl.tensor(6))
      close.assert_close(x.grad, { 0, 2, 2, 0, 2 })
      local y = dl.tensor({ { -1, -1 }, { 5, -1 } }, { requires_grad = true })
      y:min():backward()
      close.assert_close(y.grad, { { 1 / 3, 1 / 3 }, { 0, 1 / 3 } })
    end)
  end)

  describe("var and std", function()
    it("match plain loops with unbiased on and off", function()
      for_all(function(t, dims, keepdim)
        for _, unbiased in ipairs { true, false } do
          local o = { keepdim = keepdim, unbiased = unbiased }
          local c = unbiased and 1 or 0
          local n = 1
          local sizes = t:size()
          local set = set_of(dims, t:dim())
          for d = 1, #sizes do if set[d] then n = n * sizes[d] end end
          if n > c then
            check_reduce(t:var(lua_dims(dims), o), t, dims, keepdim, ref_var(c), { atol = 1e-5, rtol = 1e-4 })
            check_reduce(t:std(lua_dims(dims), o), t, dims, keepdim,
              function(g) return math.sqrt(ref_var(c)(g)) end, { atol = 1e-5, rtol = 1e-4 })
          end
        end
      end)
    end)

    it("are exact for shifted data, take correction, f64 and long columns", function()
      local t = dl.tensor({ 1e4 + 1, 1e4 + 2, 1e4 + 3, 1e4 + 4 })
      close.assert_close(t:var(), 5 / 3, { rtol = 1e-5 })
      close.assert_close(t:var({ correction = 2 }), 2.5, { rtol = 1e-5 })
      local big = randn({ 700, 260 }, "f64")
      check_reduce(big:var(1), big, { 1 }, false, ref_var(1), { atol = 1e-10, rtol = 1e-10 })
      check_reduce(big:std(2, { unbiased = false }), big, { 2 }, false,
        function(g) return math.sqrt(ref_var(0)(g)) end, { atol = 1e-10, rtol = 1e-10 })
      local one = dl.tensor { 3 }
      local v = one:var():item()
      assert.is_true(v ~= v) -- 0 / 0, as PyTorch
      assert.equal(0, one:var({ unbiased = false }):item())
    end)

    it("refuse integer inputs and bad corrections", function()
      local i = dl.tensor({ 1, 2 }, { dtype = "i64" })
      assert.matches("var: .*i64.*floating", select(2, pcall(function() return i:var() end)))
      assert.matches("std: dimension 2 is out of range",
        select(2, pcall(function() return randn({ 3 }):std(2) end)))
      assert.matches("var: correction", select(2, pcall(function() return randn({ 3 }):var({ correction = -1 }) end)))
    end)

    it("pass gradcheck in f64", function()
      for _, dims in ipairs { {}, { 1 }, { 2 }, { 1, 3 } } do
        for _, keepdim in ipairs { false, true } do
          for _, unbiased in ipairs { true, false } do
            local o = { keepdim = keepdim, unbiased = unbiased }
            assert.is_true(gradcheck(function(x) return x:var(lua_dims(dims), o) end, { randn({ 2, 3, 2 }, "f64") }))
            assert.is_true(gradcheck(function(x) return x:std(lua_dims(dims), o) end, { randn({ 2, 3, 2 }, "f64") }))
          end
        end
      end
      local v, owner = views.transposed(randn({ 3, 4 }, "f64"))
      assert.is_true(gradcheck(function(x) return x:std(2) end, { v }))
      assert.is_truthy(owner)
    end)
  end)

  describe("norm", function()
    it("matches plain loops for p = 2, 1, inf, 3 over dims and in full", function()
      for _, p in ipairs { 2, 1, math.huge, 3 } do
        for_all(function(t, dims, keepdim)
          local o = { keepdim = keepdim, dim = lua_dims(dims) }
          check_reduce(t:norm(p, o), t, dims, keepdim, ref_norm(p), { atol = 1e-5, rtol = 1e-5 })
        end)
      end
      local t = randn({ 3, 4 })
      close.assert_close(t:norm(), ref_norm(2)(flatten(t:tolist())), { rtol = 1e-5 })
      close.assert_close(t:norm("inf"), ref_norm(math.huge)(flatten(t:tolist())))
      close.assert_close(t:norm("fro"), t:norm(2))
      close.assert_close(t:norm({ dim = 2 }), t:norm(2, { dim = 2 }))
      close.assert_close(dl.norm(t, 1), ref_norm(1)(flatten(t:tolist())), { rtol = 1e-5 })
      assert.equal(0, dl.zeros({ 0 }):norm():item())
    end)

    it("refuses bad p, integer inputs and bad dims", function()
      local t = randn({ 3 })
      assert.matches("norm: p must be > 0", select(2, pcall(function() return t:norm(0) end)))
      assert.matches("norm: p must be", select(2, pcall(function() return t:norm("x") end)))
      assert.matches("norm: .*i64", select(2, pcall(function() return dl.tensor({ 1 }, { dtype = "i64" }):norm() end)))
      assert.matches("norm: dimension 2 is out of range", select(2, pcall(function() return t:norm(2, { dim = 2 }) end)))
    end)

    it("passes gradcheck in f64 and gives 0 gradient at a zero norm", function()
      for _, p in ipairs { 2, 1, 3, math.huge } do
        for _, dims in ipairs { {}, { 1 }, { 2, 3 } } do
          assert.is_true(gradcheck(function(x) return x:norm(p, { dim = lua_dims(dims), keepdim = true }) end,
            { randn({ 2, 3, 2 }, "f64") }))
          assert.is_true(gradcheck(function(x) return x:norm(p, { dim = lua_dims(dims) }) end,
            { randn({ 2, 3, 2 }, "f64") }))
        end
      end
      local z = dl.zeros({ 3 }, { requires_grad = true })
      z:norm():backward()
      assert.same({ 0, 0, 0 }, z.grad:tolist())
      local w = dl.tensor({ 1, -3, 3 }, { requires_grad = true })
      w:norm(math.huge):backward()
      close.assert_close(w.grad, { 0, -0.5, 0.5 })
    end)
  end)

  describe("softmax and log_softmax", function()
    local function ref_softmax(t, d, is_log)
      -- reference over slices along d: expected values in t's row-major order
      local sizes = t:size()
      local vals = flatten(t:tolist())
      local n = #vals
      local stride = 1
      for k = d + 1, #sizes do stride = stride * sizes[k] end
      local R = sizes[d] or 1
      local out = {}
      for k = 0, n - 1 do
        local r = math.floor(k / stride) % R
        local base = k - r * stride
        local mx = -math.huge
        for j = 0, R - 1 do mx = math.max(mx, vals[base + j * stride + 1]) end
        local s = 0
        for j = 0, R - 1 do s = s + math.exp(vals[base + j * stride + 1] - mx) end
        local x = vals[k + 1]
        out[k + 1] = is_log and (x - mx - math.log(s)) or math.exp(x - mx) / s
      end
      return out
    end

    it("match plain loops along every dim, on strided views", function()
      for _, shape in ipairs { { 7 }, { 3, 5 }, { 2, 3, 4 }, { 64, 10 }, { 3, 300, 2 } } do
        for _, t in ipairs(inputs_for(shape)) do
          for d = 1, #shape do
            for _, is_log in ipairs { false, true } do
              local y = is_log and t:log_softmax(d) or t:softmax(d)
              assert.same(shape, y:size())
              close.assert_close(y, ref_softmax(t, d, is_log), { atol = 1e-6, rtol = 1e-5 })
              local yn = is_log and t:log_softmax(d - #shape - 1) or dl.softmax(t, d - #shape - 1)
              close.assert_close(yn, y)
            end
          end
        end
      end
    end)

    it("are stable for large inputs and compute f16 in f32", function()
      local t = dl.tensor { { 1000, 1001, 1002 }, { -1000, -1000, -1000 } }
      close.assert_close(t:softmax(2), ref_softmax(t, 2, false), { atol = 1e-6 })
      close.assert_close(t:log_softmax(2), ref_softmax(t, 2, true), { atol = 1e-4 })
      local h = randn({ 4, 5 }):to("f16")
      local y = h:log_softmax(2)
      assert.equal("f16", y.dtype)
      close.assert_close(y, ref_softmax(h, 2, true), { atol = 1e-2, rtol = 1e-2 })
      assert.same({ 0, 3 }, dl.zeros({ 0, 3 }):softmax(2):size())
      assert.same({ 2, 0 }, dl.zeros({ 2, 0 }):log_softmax(2):size())
      assert.equal(1, dl.tensor(5):softmax(1):item())
    end)

    it("refuse integer inputs and out-of-range dims naming the op", function()
      assert.matches("softmax: dimension 3 is out of range",
        select(2, pcall(function() return randn({ 2, 2 }):softmax(3) end)))
      assert.matches("log_softmax: .*i64", select(2, pcall(function()
        return dl.tensor({ 1 }, { dtype = "i64" }):log_softmax(1) end)))
      assert.matches("softmax: dim must be an integer", select(2, pcall(function() return randn({ 2 }):softmax() end)))
    end)

    it("pass gradcheck in f64 along every dim", function()
      for d = 1, 3 do
        assert.is_true(gradcheck(function(x) return x:softmax(d) end, { randn({ 2, 3, 4 }, "f64") }))
        assert.is_true(gradcheck(function(x) return x:log_softmax(d) end, { randn({ 2, 3, 4 }, "f64") }))
      end
      local v, owner = views.transposed(randn({ 3, 4 }, "f64"))
      assert.is_true(gradcheck(function(x) return x:log_softmax(2) end, { v }))
      assert.is_truthy(owner)
      local h = randn({ 2, 3 }):to("f16"):requires_grad_()
      h:softmax(2):sum():backward()
      assert.equal("f16", h.grad.dtype)
      close.assert_close(h.grad, { { 0, 0, 0 }, { 0, 0, 0 } }, { atol = 1e-3 })
    end)

    it("have fused backwards matching the formulas on long rows and columns", function()
      for _, shape in ipairs { { 2, 3000 }, { 40, 3 } } do
        for _, is_log in ipairs { false, true } do
          for d = 1, 2 do
            local x = randn(shape):requires_grad_()
            local g = randn(shape)
            local y = is_log and x:log_softmax(d) or x:softmax(d)
            y:backward(g)
            -- reference: softmax dx = y (g - sum(g y)), log_softmax dx = g - exp(y) sum(g)
            local yl, gl = flatten(y:tolist()), flatten(g:tolist())
            local R, stride = shape[d], d == 1 and shape[2] or 1
            local expected = {}
            for k = 0, #yl - 1 do
              local r = math.floor(k / stride) % R
              local base = k - r * stride
              local s = 0
              for jj = 0, R - 1 do
                local m = base + jj * stride + 1
                s = s + (is_log and gl[m] or gl[m] * yl[m])
              end
              expected[k + 1] = is_log and gl[k + 1] - math.exp(yl[k + 1]) * s or yl[k + 1] * (gl[k + 1] - s)
            end
            close.assert_close(x.grad, expected, { atol = 1e-5, rtol = 1e-4 })
          end
        end
      end
    end)

    it("refuse a second backward without retain_graph", function()
      local x = randn({ 2, 3 }):requires_grad_()
      local y = x:softmax(2)
      y:backward(dl.ones({ 2, 3 }))
      assert.has_error(function() y:backward(dl.ones({ 2, 3 })) end)
    end)
  end)
end)
