-- Specs for ddplua.ops.norm: batch_norm, layer_norm, dropout, embedding, against references
-- written here in plain Lua loops over :tolist(), plus gradchecks in f64 and the errors.
local dl = require "ddplua"
local gradcheck = require("gradcheck").gradcheck
local assert_close = require("close").assert_close
local views = require "views"

-- ---- helpers ------------------------------------------------------------------------------

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  else
    out[#out + 1] = v
  end
  return out
end

local function flat(t) return flatten(t:tolist()) end

local function randn(shape, seed, dtype)
  return dl.randn(shape, { dtype = dtype or "f64", generator = dl.Generator(seed) })
end

local function prod(shape, from)
  local p = 1
  for i = from or 1, #shape do p = p * shape[i] end
  return p
end

-- Reference batch norm over flat x of shape (N, C, *): returns y, the batch mean and the
-- biased and unbiased variances per channel (or uses rm/rv when not training).
local function ref_batch_norm(x, shape, rm, rv, w, b, training, eps)
  local N, Cn, S = shape[1], shape[2], prod(shape, 3)
  local mean, var, unbiased = {}, {}, {}
  for c = 1, Cn do
    if training then
      local s, cnt = 0, N * S
      for n = 0, N - 1 do
        for k = 1, S do s = s + x[(n * Cn + c - 1) * S + k] end
      end
      local m = s / cnt
      local sq = 0
      for n = 0, N - 1 do
        for k = 1, S do sq = sq + (x[(n * Cn + c - 1) * S + k] - m) ^ 2 end
      end
      mean[c], var[c], unbiased[c] = m, sq / cnt, sq / (cnt - 1)
    else
      mean[c], var[c] = rm[c], rv[c]
    end
  end
  local y = {}
  for n = 0, N - 1 do
    for c = 1, Cn do
      for k = 1, S do
        local i = (n * Cn + c - 1) * S + k
        y[i] = (x[i] - mean[c]) / math.sqrt(var[c] + eps) * (w and w[c] or 1) + (b and b[c] or 0)
      end
    end
  end
  return y, mean, var, unbiased
end

-- Reference layer norm over rows of length D of flat x.
local function ref_layer_norm(x, D, w, b, eps)
  local y = {}
  for r = 0, #x / D - 1 do
    local s = 0
    for j = 1, D do s = s + x[r * D + j] end
    local m = s / D
    local sq = 0
    for j = 1, D do sq = sq + (x[r * D + j] - m) ^ 2 end
    local rs = 1 / math.sqrt(sq / D + eps)
    for j = 1, D do y[r * D + j] = (x[r * D + j] - m) * rs * (w and w[j] or 1) + (b and b[j] or 0) end
  end
  return y
end

-- A tensor of `shape` from a flat Lua list (row-major).
local function from_flat(list, shape, dtype)
  local pos = 0
  local function build(d)
    if d > #shape then
      pos = pos + 1
      return list[pos]
    end
    local out = {}
    for i = 1, shape[d] do out[i] = build(d + 1) end
    return out
  end
  if #shape == 0 then return dl.tensor(list[1], { dtype = dtype or "f64" }) end
  if prod(shape) == 0 then return dl.zeros(shape, { dtype = dtype or "f64" }) end
  return dl.tensor(build(1), { dtype = dtype or "f64" })
end

-- Random data of `shape`: normal * scale + shift (a non-zero mean exercises the centring).
local function data(shape, seed, dtype, scale, shift)
  local v = flat(randn(shape, seed))
  for i = 1, #v do v[i] = v[i] * (scale or 1) + (shift or 0) end
  return from_flat(v, shape, dtype), v
end

local function raises(pattern, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.matches(pattern, tostring(err))
end

describe("ddplua.ops.norm", function()
  -- ---- inputs big enough to split over threads ----------------------------------------------
  describe("threaded kernels", function()
    it("give the reference results on large inputs", function()
      local threads = dl.get_num_threads()
      finally(function() dl.set_num_threads(threads) end)
      dl.set_num_threads(2)
      local shape = { 16, 4, 32, 32 }
      local x, xv = data(shape, 90, "f32", 1, 0.5)
      local y = dl.batch_norm(x, nil, nil, { training = true })
      assert_close(y, (ref_batch_norm(xv, shape, nil, nil, nil, nil, true, 1e-5)), { atol = 1e-4, rtol = 1e-4 })
      local M, D = 512, 128
      local lx, lxv = data({ M, D }, 91)
      local w = dl.ones({ D }, { dtype = "f64", requires_grad = true })
      local b = dl.zeros({ D }, { dtype = "f64", requires_grad = true })
      local ly = dl.layer_norm(lx, { D }, { weight = w, bias = b })
      local ey = ref_layer_norm(lxv, D, nil, nil, 1e-5)
      assert_close(ly, ey, { atol = 1e-10 })
      ly:backward(dl.ones({ M, D }, { dtype = "f64" }))
      local edw, edb = {}, {}
      for j = 1, D do
        edw[j], edb[j] = 0, M
        for r = 0, M - 1 do edw[j] = edw[j] + ey[r * D + j] end
      end
      assert_close(w.grad, edw, { atol = 1e-9 })
      assert_close(b.grad, edb, { atol = 1e-9 })
      local ew = dl.zeros({ 10, D }, { dtype = "f64", requires_grad = true })
      local idxv = {}
      for i = 1, 1000 do idxv[i] = (i * 7) % 10 end
      local out = dl.embedding(from_flat(idxv, { 1000 }, "i64"), ew)
      out:backward(dl.ones({ 1000, D }, { dtype = "f64" }))
      local counts = {}
      for _, v in ipairs(idxv) do counts[v] = (counts[v] or 0) + 1 end
      local eg = {}
      for v = 0, 9 do for j = 1, D do eg[v * D + j] = counts[v] or 0 end end
      assert_close(ew.grad, eg, { atol = 0 })
    end)
  end)

  -- ---- batch norm ---------------------------------------------------------------------------
  describe("batch_norm", function()
    for _, shape in ipairs { { 5, 3 }, { 4, 3, 6 }, { 3, 2, 4, 5 } } do
      it("normalises with batch stats and updates the running stats, rank " .. #shape, function()
        local Cn = shape[2]
        local x, xv = data(shape, 1, "f64", 2, 3)
        local w, wv = data({ Cn }, 2)
        local b, bv = data({ Cn }, 3)
        local rm, rmv = data({ Cn }, 4, "f32")
        local rv0 = {}
        for c = 1, Cn do rv0[c] = 0.5 + c end
        local rv = from_flat(rv0, { Cn }, "f32")
        local y = dl.batch_norm(x, rm, rv, { weight = w, bias = b, training = true, momentum = 0.2, eps = 1e-3 })
        local ey, mean, _, unbiased = ref_batch_norm(xv, shape, nil, nil, wv, bv, true, 1e-3)
        assert_close(y, ey, { atol = 1e-10 })
        local erm, erv = {}, {}
        for c = 1, Cn do
          erm[c] = 0.8 * rmv[c] + 0.2 * mean[c]
          erv[c] = 0.8 * rv0[c] + 0.2 * unbiased[c]
        end
        assert_close(rm, erm, { atol = 1e-5 })
        assert_close(rv, erv, { atol = 1e-5 })
        -- f32 input, default options, no affine
        local x32 = x:to("f32")
        local y32 = dl.batch_norm(x32, nil, nil, { training = true })
        assert.equal("f32", y32.dtype)
        assert_close(y32, (ref_batch_norm(xv, shape, nil, nil, nil, nil, true, 1e-5)), { atol = 1e-4 })
      end)

      it("uses the running stats in eval mode, rank " .. #shape, function()
        local Cn = shape[2]
        local x, xv = data(shape, 5, "f64", 1.5, -1)
        local w, wv = data({ Cn }, 6)
        local rm, rmv = data({ Cn }, 7)
        local rv0 = {}
        for c = 1, Cn do rv0[c] = 0.25 * c end
        local rv = from_flat(rv0, { Cn })
        local y = x:batch_norm(rm, rv, { weight = w, eps = 1e-4 })
        assert_close(y, (ref_batch_norm(xv, shape, rmv, rv0, wv, nil, false, 1e-4)), { atol = 1e-10 })
        assert_close(rm, rmv) -- untouched
        assert_close(rv, rv0)
      end)
    end

    it("takes non-contiguous inputs", function()
      local base, bv = data({ 3, 6 }, 8) -- (C, N) transposed to (N, C) = (6, 3)
      local xt, owner = views.transposed(base)
      assert.is_false(xt:is_contiguous())
      local xv = {}
      for n = 1, 6 do for c = 1, 3 do xv[(n - 1) * 3 + c] = bv[(c - 1) * 6 + n] end end
      assert_close(dl.batch_norm(xt, nil, nil, { training = true }),
        (ref_batch_norm(xv, { 6, 3 }, nil, nil, nil, nil, true, 1e-5)), { atol = 1e-10 })
      local x4, x4v = data({ 2, 3, 2, 2 }, 9)
      local xs, owner2 = views.strided(x4, 2)
      assert.is_false(xs:is_contiguous())
      assert_close(dl.batch_norm(xs, nil, nil, { training = true }),
        (ref_batch_norm(x4v, { 2, 3, 2, 2 }, nil, nil, nil, nil, true, 1e-5)), { atol = 1e-10 })
      assert.truthy(owner and owner2)
    end)

    it("computes half inputs through f32", function()
      local x, xv = data({ 8, 2, 3 }, 10)
      local y = dl.batch_norm(x:to("bf16"), nil, nil, { training = true })
      assert.equal("bf16", y.dtype)
      local rounded = flat(x:to("bf16"))
      assert_close(y, (ref_batch_norm(rounded, { 8, 2, 3 }, nil, nil, nil, nil, true, 1e-5)), { atol = 2e-2, rtol = 1e-2 })
      local yh = dl.batch_norm(x:to("f16"), nil, nil, { training = true })
      assert.equal("f16", yh.dtype)
      assert.truthy(#xv > 0)
    end)

    it("handles an empty batch in eval mode", function()
      local y = dl.batch_norm(dl.zeros({ 0, 3, 2 }), dl.zeros { 3 }, dl.ones { 3 })
      assert.same({ 0, 3, 2 }, y:size())
    end)

    it("has the closed-form gradient (gradcheck, training and eval, with and without affine)", function()
      local shape = { 3, 2, 3 }
      local x = data(shape, 11, "f64", 1, 0.5)
      local w, b = data({ 2 }, 12), data({ 2 }, 13)
      gradcheck(function(xx, ww, bb)
        return dl.batch_norm(xx, nil, nil, { weight = ww, bias = bb, training = true })
      end, { x, w, b })
      local x2 = data(shape, 14)
      gradcheck(function(xx) return dl.batch_norm(xx, nil, nil, { training = true }) end, { x2 })
      -- training with running stats given: they are updated on every call, the output is not
      local x3 = data({ 4, 3 }, 15)
      local rm, rv = dl.zeros({ 3 }, { dtype = "f64" }), dl.ones({ 3 }, { dtype = "f64" })
      gradcheck(function(xx) return dl.batch_norm(xx, rm, rv, { training = true }) end, { x3 })
      local rme, rve = data({ 2 }, 16), dl.full({ 2 }, 0.7, { dtype = "f64" })
      local x4, w4, b4 = data(shape, 17), data({ 2 }, 18), data({ 2 }, 19)
      gradcheck(function(xx, ww, bb)
        return dl.batch_norm(xx, rme, rve, { weight = ww, bias = bb })
      end, { x4, w4, b4 })
      gradcheck(function(xx) return dl.batch_norm(xx, rme, rve) end, { data(shape, 20) })
      assert.equal("BatchNormBackward", dl.batch_norm(x, nil, nil, { training = true }).grad_fn)
    end)

    it("gives the gradient of weight alone and of f32 inputs", function()
      local x = data({ 6, 2 }, 21, "f32")
      local w = dl.ones({ 2 }, { requires_grad = true })
      local y = dl.batch_norm(x, nil, nil, { weight = w, training = true })
      y:backward(dl.ones { 6, 2 })
      -- sum over the batch of xhat is 0
      assert_close(w.grad, { 0, 0 }, { atol = 1e-5 })
      assert.is_nil(x.grad)
    end)

    it("computes per-channel statistics and sums", function()
      local shape = { 4, 3, 5 }
      local x, xv = data(shape, 22, "f64", 2, 1)
      local _, mean, var = ref_batch_norm(xv, shape, nil, nil, nil, nil, true, 0)
      local m, invstd = dl.batch_norm_stats(x, 1e-3)
      local einv = {}
      for c = 1, 3 do einv[c] = 1 / math.sqrt(var[c] + 1e-3) end
      assert_close(m, mean, { atol = 1e-12 })
      assert_close(invstd, einv, { atol = 1e-12 })
      local s, sq = dl.batch_norm_sums(x:to("f32"))
      local es, esq = {}, {}
      for c = 1, 3 do es[c], esq[c] = 0, 0 end
      local x32 = flat(x:to("f32"))
      for i = 1, #x32 do
        local c = math.floor((i - 1) / 5) % 3 + 1
        es[c], esq[c] = es[c] + x32[i], esq[c] + x32[i] ^ 2
      end
      assert.equal("f64", s.dtype)
      assert_close(s, es, { atol = 1e-9 })
      assert_close(sq, esq, { atol = 1e-9 })
    end)

    it("has the elementwise steps of a synchronised batch norm (batch_norm_elemt, _backward_reduce, _backward_elemt)", function()
      local shape = { 5, 3, 2, 2 }
      for _, dtype in ipairs { "f64", "f32" } do
        local x, dy = randn(shape, 31, dtype), randn(shape, 32, dtype)
        local w, b = randn({ 3 }, 33, dtype), randn({ 3 }, 34, dtype)
        -- with the batch's own moments the output and input gradient are batch_norm's, bit for bit
        local mean, var = x:to("f64"):mean({ 1, 3, 4 }), x:to("f64"):var({ 1, 3, 4 }, { correction = 0 })
        local xr, wr, br = x:clone():requires_grad_(), w:clone():requires_grad_(), b:clone():requires_grad_()
        local yr = dl.batch_norm(xr, nil, nil, { weight = wr, bias = br, training = true, eps = 1e-3 })
        yr:backward(dy)
        local y = dl.batch_norm_elemt(x, w, b, mean, var, 1e-3)
        assert.equal(dtype, y.dtype)
        assert_close(y, yr, { atol = dtype == "f64" and 1e-13 or 1e-5 })
        local sum_dy, sum_dy_xmu = dl.batch_norm_backward_reduce(dy, x, mean)
        assert.equal("f64", sum_dy.dtype)
        assert_close(sum_dy, dy:to("f64"):sum({ 1, 3, 4 }), { atol = 1e-9 })
        assert_close(sum_dy_xmu, (dy:to("f64") * (x:to("f64") - mean:view({ 1, 3, 1, 1 }))):sum({ 1, 3, 4 }), { atol = 1e-9 })
        local invstd, M = (var + 1e-3):rsqrt(), 5 * 2 * 2
        local dx = dl.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy / M, sum_dy_xmu / M)
        assert.equal(dtype, dx.dtype)
        assert_close(dx, xr.grad, { atol = dtype == "f64" and 1e-12 or 1e-5 })
        assert_close(sum_dy_xmu * invstd, wr.grad, { atol = dtype == "f64" and 1e-12 or 1e-5 })
      end
      -- an empty batch: zero sums, empty results
      local e = dl.zeros({ 0, 3 })
      local s1, s2 = dl.batch_norm_backward_reduce(e, e, dl.zeros({ 3 }))
      assert.same({ 0, 0, 0 }, s1:tolist())
      assert.same({ 0, 0, 0 }, s2:tolist())
      assert.same({ 0, 3 }, dl.batch_norm_elemt(e, nil, nil, dl.zeros({ 3 }), dl.ones({ 3 }), 1e-5):size())
      -- errors name the op and the argument
      local x = dl.randn({ 4, 3 })
      local function fails(text, fn, ...)
        local ok, err = pcall(fn, ...)
        assert.is_false(ok)
        assert.matches(text, tostring(err), 1, true)
      end
      fails("batch_norm_elemt: mean of shape (2,) does not match the 3 channels (dim 2) of input (4, 3)",
        dl.batch_norm_elemt, x, nil, nil, dl.zeros({ 2 }), dl.ones({ 3 }))
      fails("batch_norm_elemt: mean and var are required", dl.batch_norm_elemt, x, nil, nil, nil, dl.ones({ 3 }))
      fails("batch_norm_backward_reduce: grad_out of shape (4, 2) does not match input (4, 3)",
        dl.batch_norm_backward_reduce, dl.randn({ 4, 2 }), x, dl.zeros({ 3 }))
      fails("batch_norm_backward_elemt: mean, invstd, mean_dy and mean_dy_xmu are required",
        dl.batch_norm_backward_elemt, x, x, dl.zeros({ 3 }), nil, nil, dl.zeros({ 3 }), dl.zeros({ 3 }))
    end)

    -- Note [differentiable sync batch norm steps]: nn.SyncBatchNorm's two passes over the
    -- data record nodes, so the tape derives the layer's backward
    it("differentiates batch_norm_moments and batch_norm_elemt (gradcheck in every argument)", function()
      local shape = { 3, 2, 2 }
      local x = randn(shape, 41, "f64")
      local m = dl.batch_norm_moments(x)
      assert.equal("f64", m.dtype)
      assert.same({ 2, 2 }, m:size())
      assert_close(m:select(1, 1), x:mean({ 1, 3 }), { atol = 1e-13 })
      assert_close(m:select(1, 2), x:var({ 1, 3 }, { correction = 0 }), { atol = 1e-13 })
      gradcheck(function(xx) return dl.batch_norm_moments(xx) end, { randn(shape, 42, "f64") })
      gradcheck(function(xx) return dl.batch_norm_moments(xx) end, { randn({ 4, 3 }, 43, "f64") })
      local mean, var = randn({ 2 }, 44, "f64"), randn({ 2 }, 45, "f64"):abs() + 0.5
      gradcheck(function(xx, ww, bb, mm, vv) return dl.batch_norm_elemt(xx, ww, bb, mm, vv, 1e-3) end,
        { randn(shape, 46, "f64"), randn({ 2 }, 47, "f64"), randn({ 2 }, 48, "f64"), mean, var })
      gradcheck(function(xx, mm, vv) return dl.batch_norm_elemt(xx, nil, nil, mm, vv, 1e-3) end,
        { randn(shape, 49, "f64"), randn({ 2 }, 51, "f64"), randn({ 2 }, 52, "f64"):abs() + 0.5 })
      -- f32 input: gradients in the inputs' dtypes; an empty batch: zero moments, empty gradient
      local x32 = randn(shape, 50, "f32"):requires_grad_()
      dl.batch_norm_elemt(x32, nil, nil, mean, var, 1e-3):sum():backward()
      assert.equal("f32", x32.grad.dtype)
      local e = dl.zeros({ 0, 2 }):requires_grad_()
      local me = dl.batch_norm_moments(e)
      assert.same({ { 0, 0 }, { 0, 0 } }, me:tolist())
      me:sum():backward()
      assert.same({ 0, 2 }, e.grad:size())
    end)

    it("raises naming batch_norm on bad arguments", function()
      local x = dl.zeros { 4, 3, 2 }
      raises("batch_norm: running_mean of shape %(4,%) does not match the 3 channels", function()
        dl.batch_norm(x, dl.zeros { 4 }, dl.ones { 3 }, { training = true })
      end)
      raises("batch_norm: running_var of shape %(2,%)", function()
        dl.batch_norm(x, dl.zeros { 3 }, dl.ones { 2 })
      end)
      raises("batch_norm: weight of shape %(2, 3%) does not match the 3 channels .* input %(4, 3, 2%)", function()
        dl.batch_norm(x, nil, nil, { weight = dl.ones { 2, 3 }, training = true })
      end)
      raises("batch_norm: bias has dtype f64 but input has dtype f32", function()
        dl.batch_norm(x, nil, nil, { bias = dl.ones({ 3 }, { dtype = "f64" }), training = true })
      end)
      raises("batch_norm: running_mean and running_var are required in eval mode", function()
        dl.batch_norm(x, nil, nil)
      end)
      raises("batch_norm: expected more than 1 value per channel when training, got input %(1, 3%)", function()
        dl.batch_norm(dl.zeros { 1, 3 }, nil, nil, { training = true })
      end)
      raises("batch_norm: input must be .* at least 2 dimensions, got %(3,%)", function()
        dl.batch_norm(dl.zeros { 3 }, nil, nil, { training = true })
      end)
      raises("batch_norm: input must be floating, got i64", function()
        dl.batch_norm(dl.zeros({ 2, 3 }, { dtype = "i64" }), nil, nil, { training = true })
      end)
      raises("batch_norm: running_mean is a leaf tensor that requires grad", function()
        dl.batch_norm(x, dl.zeros({ 3 }, { requires_grad = true }), dl.ones { 3 }, { training = true })
      end)
    end)

    it("refuses backward after the input was modified in place", function()
      local x = data({ 4, 2 }, 23)
      x.requires_grad = true
      local y = dl.batch_norm(x, nil, nil, { training = true })
      dl.no_grad(function() x:fill_(1) end)
      raises("BatchNormBackward: a tensor of shape %(4, 2%) saved for the gradient was modified", function()
        y:backward(dl.ones({ 4, 2 }, { dtype = "f64" }))
      end)
    end)
  end)

  -- ---- layer norm ---------------------------------------------------------------------------
  describe("layer_norm", function()
    it("normalises over the last dimension", function()
      local x, xv = data({ 3, 4, 5 }, 30, "f64", 2, 1)
      local w, wv = data({ 5 }, 31)
      local b, bv = data({ 5 }, 32)
      assert_close(dl.layer_norm(x, { 5 }, { weight = w, bias = b }), ref_layer_norm(xv, 5, wv, bv, 1e-5), { atol = 1e-10 })
      assert_close(x:layer_norm(5, { eps = 1e-2 }), ref_layer_norm(xv, 5, nil, nil, 1e-2), { atol = 1e-10 })
      assert_close(dl.layer_norm(x:to("f32"), { 5 }, { weight = w:to("f32") }),
        ref_layer_norm(xv, 5, wv, nil, 1e-5), { atol = 1e-4 })
    end)

    it("normalises over the last two dimensions", function()
      local x, xv = data({ 2, 3, 4 }, 33, "f64", 1, -2)
      local w, wv = data({ 3, 4 }, 34)
      local b, bv = data({ 3, 4 }, 35)
      assert_close(dl.layer_norm(x, { 3, 4 }, { weight = w, bias = b }), ref_layer_norm(xv, 12, wv, bv, 1e-5), { atol = 1e-10 })
      assert_close(dl.layer_norm(x, { 3, 4 }, { bias = b }), ref_layer_norm(xv, 12, nil, bv, 1e-5), { atol = 1e-10 })
    end)

    it("takes non-contiguous, half and empty inputs", function()
      local base, bv = data({ 4, 6 }, 36)
      local xt, owner = views.transposed(base) -- (6, 4)
      local xv = {}
      for i = 1, 6 do for j = 1, 4 do xv[(i - 1) * 4 + j] = bv[(j - 1) * 6 + i] end end
      assert_close(dl.layer_norm(xt, { 4 }), ref_layer_norm(xv, 4, nil, nil, 1e-5), { atol = 1e-10 })
      local xs, owner2 = views.strided(base, 3)
      assert_close(dl.layer_norm(xs, { 6 }), ref_layer_norm(bv, 6, nil, nil, 1e-5), { atol = 1e-10 })
      local yh = dl.layer_norm(base:to("f16"), { 6 })
      assert.equal("f16", yh.dtype)
      assert_close(yh, ref_layer_norm(flat(base:to("f16")), 6, nil, nil, 1e-5), { atol = 1e-2, rtol = 1e-2 })
      assert.same({ 0, 6 }, dl.layer_norm(dl.zeros { 0, 6 }, { 6 }):size())
      assert.truthy(owner and owner2)
    end)

    it("has the closed-form gradient (gradcheck)", function()
      local x, w, b = data({ 3, 4 }, 37, "f64", 1, 1), data({ 4 }, 38), data({ 4 }, 39)
      gradcheck(function(xx, ww, bb) return dl.layer_norm(xx, { 4 }, { weight = ww, bias = bb }) end, { x, w, b })
      local x2, w2 = data({ 2, 2, 3 }, 40), data({ 2, 3 }, 41)
      gradcheck(function(xx, ww) return dl.layer_norm(xx, { 2, 3 }, { weight = ww }) end, { x2, w2 })
      gradcheck(function(xx) return dl.layer_norm(xx, { 3 }) end, { data({ 2, 3 }, 42) })
      assert.equal("LayerNormBackward", dl.layer_norm(x, { 4 }).grad_fn)
    end)

    it("raises naming layer_norm on bad arguments", function()
      local x = dl.zeros { 2, 3, 4 }
      raises("layer_norm: normalized_shape %(3,%) does not match the last 1 dims of input %(2, 3, 4%)", function()
        dl.layer_norm(x, { 3 })
      end)
      raises("layer_norm: normalized_shape must have 1 to 3 dimensions", function()
        dl.layer_norm(x, { 1, 2, 3, 4 })
      end)
      raises("layer_norm: weight of shape %(3,%) does not match normalized_shape %(4,%)", function()
        dl.layer_norm(x, { 4 }, { weight = dl.ones { 3 } })
      end)
      raises("layer_norm: bias has dtype f64 but input has dtype f32", function()
        dl.layer_norm(x, { 4 }, { bias = dl.ones({ 4 }, { dtype = "f64" }) })
      end)
    end)
  end)

  -- ---- dropout ------------------------------------------------------------------------------
  describe("dropout", function()
    it("zeroes about a fraction p and scales the kept values by 1/(1-p)", function()
      local n = 100000
      local x = dl.full({ n }, 2.0)
      local y = dl.dropout(x, 0.3, { generator = dl.Generator(7) })
      local v = flat(y)
      local zeros = 0
      for i = 1, n do
        if v[i] == 0 then zeros = zeros + 1
        else assert(math.abs(v[i] - 2 / 0.7) < 1e-5, "kept value " .. v[i]) end
      end
      assert.is_true(math.abs(zeros / n - 0.3) < 0.01, "zero fraction " .. zeros / n)
    end)

    it("draws the same mask from the same generator seed", function()
      local x = randn({ 50, 20 }, 50, "f32")
      local a = flat(x:dropout(0.5, { generator = dl.Generator(11) }))
      local b = flat(x:dropout(0.5, { generator = dl.Generator(11) }))
      local c = flat(x:dropout(0.5, { generator = dl.Generator(12) }))
      assert.same(a, b)
      assert.are_not.same(a, c)
      -- the default generator follows dl.manual_seed
      dl.manual_seed(5)
      local d = flat(x:dropout(0.5))
      dl.manual_seed(5)
      assert.same(d, flat(x:dropout(0.5)))
    end)

    it("is the identity in eval mode and for p = 0; gives zeros for p = 1", function()
      local x = randn({ 3, 4 }, 51, "f32")
      local xv = flat(x)
      assert.same(xv, flat(dl.dropout(x, 0.5, { training = false })))
      assert.same(xv, flat(dl.dropout(x, 0)))
      local z = flat(dl.dropout(x, 1))
      for i = 1, #z do assert.equal(0, z[i]) end
      assert.same({ 0, 5 }, dl.dropout(dl.zeros { 0, 5 }, 0.5):size())
    end)

    it("takes non-contiguous and half inputs", function()
      local base = randn({ 8, 16 }, 52, "f32")
      local xt, owner = views.transposed(base)
      local y = flat(dl.dropout(xt, 0.25, { generator = dl.Generator(3) }))
      local ref = flat(dl.dropout(xt:contiguous(), 0.25, { generator = dl.Generator(3) }))
      assert.same(ref, y)
      local xv = flat(xt)
      for i = 1, #y do assert.is_true(y[i] == 0 or math.abs(y[i] - xv[i] / 0.75) < 1e-5) end
      local yh = dl.dropout(base:to("f16"), 0.5, { generator = dl.Generator(3) })
      assert.equal("f16", yh.dtype)
      assert.truthy(owner)
    end)

    it("has gradient mask * scale", function()
      local x = randn({ 40, 30 }, 53)
      x.requires_grad = true
      local y = dl.dropout(x, 0.4, { generator = dl.Generator(9) })
      assert.equal("DropoutBackward", y.grad_fn)
      local R = randn({ 40, 30 }, 54)
      y:backward(R)
      local yv, xv, rv, gv = flat(y), flat(x), flat(R), flat(x.grad)
      for i = 1, #yv do
        local kept = yv[i] ~= 0 and 1 or 0
        assert(math.abs(gv[i] - rv[i] * kept / 0.6) < 1e-12, "gradient at " .. i)
        assert(kept == 0 or math.abs(yv[i] - xv[i] / 0.6) < 1e-12)
      end
      gradcheck(function(xx)
        return dl.dropout(xx, 0.3, { generator = dl.Generator(21) }) -- reseeded: same mask each call
      end, { randn({ 4, 5 }, 55) })
    end)

    it("raises naming dropout for p outside [0, 1]", function()
      raises("dropout: probability p must be in %[0, 1%], got 1.5", function() dl.dropout(dl.ones { 2 }, 1.5) end)
      raises("dropout: probability p must be in %[0, 1%], got %-0.1", function() dl.dropout(dl.ones { 2 }, -0.1) end)
      raises("dropout: input must be floating", function() dl.dropout(dl.ones({ 2 }, { dtype = "i64" }), 0.5) end)
    end)
  end)

  -- ---- embedding ----------------------------------------------------------------------------
  describe("embedding", function()
    local function ids(list, shape, dtype) return from_flat(list, shape, dtype or "i64") end

    it("looks up rows for indices of any shape", function()
      local V, D = 6, 3
      local w, wv = data({ V, D }, 60)
      local idxv = { 5, 0, 2, 2, 1, 4 }
      for _, shape in ipairs { { 6 }, { 2, 3 }, { 3, 1, 2 } } do
        local out = dl.embedding(ids(idxv, shape), w)
        local expected_shape = {}
        for i = 1, #shape do expected_shape[i] = shape[i] end
        expected_shape[#shape + 1] = D
        assert.same(expected_shape, out:size())
        local e = {}
        for k, v in ipairs(idxv) do
          for j = 1, D do e[(k - 1) * D + j] = wv[v * D + j] end
        end
        assert_close(out, e, { atol = 0 })
      end
      local out32 = ids({ 3, 1 }, { 2 }, "i32"):embedding(w:to("f32"))
      assert_close(out32, { wv[10], wv[11], wv[12], wv[4], wv[5], wv[6] }, { atol = 1e-6 })
      assert.same({ 0, D }, dl.embedding(dl.zeros({ 0 }, { dtype = "i64" }), w):size())
    end)

    it("takes non-contiguous weights and indices", function()
      local base, bv = data({ 3, 5 }, 61) -- weight (5, 3) as a transposed view
      local wt, owner = views.transposed(base)
      local ibase = ids({ 4, 0, 1, 4 }, { 2, 2 })
      local it_, owner2 = views.transposed(ibase) -- indices {{4, 1}, {0, 4}}
      local out = dl.embedding(it_, wt)
      local e = {}
      for k, v in ipairs { 4, 1, 0, 4 } do
        for j = 1, 3 do e[(k - 1) * 3 + j] = bv[(j - 1) * 5 + v + 1] end
      end
      assert_close(out, e, { atol = 0 })
      assert.truthy(owner and owner2)
    end)

    it("accumulates gradients of repeated indices and skips padding_idx", function()
      local V, D = 5, 2
      local w = data({ V, D }, 62)
      w.requires_grad = true
      local idxv = { 1, 3, 1, 0, 3, 1, 4 }
      local out = dl.embedding(ids(idxv, { 7 }), w, { padding_idx = 3 })
      local R, rv = data({ 7, D }, 63)
      out:backward(R)
      local e = {}
      for i = 1, V * D do e[i] = 0 end
      for k, v in ipairs(idxv) do
        if v ~= 3 then
          for j = 1, D do e[v * D + j] = e[v * D + j] + rv[(k - 1) * D + j] end
        end
      end
      assert_close(w.grad, e, { atol = 1e-12 })
      -- padding_idx counted from the end
      local w2 = data({ V, D }, 64)
      w2.requires_grad = true
      dl.embedding(ids({ 4, 2 }, { 2 }), w2, { padding_idx = -1 }):backward(dl.ones({ 2, D }, { dtype = "f64" }))
      assert_close(w2.grad, { 0, 0, 0, 0, 1, 1, 0, 0, 0, 0 })
    end)

    it("has the gradient w.r.t. weight (gradcheck)", function()
      local idx = ids({ 0, 2, 2, 1, 0, 2 }, { 2, 3 })
      gradcheck(function(ww) return dl.embedding(idx, ww) end, { data({ 3, 4 }, 65) })
      -- padding_idx deliberately drops a true gradient: check the other rows only
      local idx2 = ids({ 0, 2, 2, 0 }, { 4 })
      gradcheck(function(ww) return dl.embedding(idx2, ww, { padding_idx = 1 }) end, { data({ 3, 4 }, 66) })
      local wf = data({ 3, 2 }, 67, "f32")
      wf.requires_grad = true
      dl.embedding(idx, wf):backward(dl.ones { 2, 3, 2 })
      assert_close(wf.grad, { 2, 2, 1, 1, 3, 3 })
    end)

    it("raises naming embedding on bad indices and weights", function()
      local w = dl.zeros { 4, 2 }
      raises("embedding: index 4 is out of range %[0, 4%) for weight %(4, 2%) %(V = 4%)", function()
        dl.embedding(ids({ 0, 4 }, { 2 }), w)
      end)
      raises("embedding: index %-1 is out of range", function() dl.embedding(ids({ -1 }, { 1 }), w) end)
      raises("embedding: indices must be i64 or i32, got f32", function() dl.embedding(dl.zeros { 2 }, w) end)
      raises("embedding: weight must be 2%-d %(V, D%), got %(4,%)", function()
        dl.embedding(ids({ 0 }, { 1 }), dl.zeros { 4 })
      end)
      raises("embedding: padding_idx 4 is out of range", function()
        dl.embedding(ids({ 0 }, { 1 }), w, { padding_idx = 4 })
      end)
    end)
  end)
end)
