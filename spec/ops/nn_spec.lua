-- Specs for ddplua.ops.nn: matmul, bmm, linear, conv2d, max_pool2d, avg_pool2d and
-- adaptive_avg_pool2d against plain-Lua references (naive products, convolution and pooling
-- by their definitions), gradchecks in f64 and the error messages.
local dl = require "ddplua"
local lib = require "ddplua.lib"
local close = require "close"
local views = require "views"
local gradcheck = require("gradcheck").gradcheck
local ffi, C = lib.ffi, lib.C

-- ---- helpers ---------------------------------------------------------------------------

local seed = 0
local function randn(shape, dtype)
  seed = seed + 1
  return dl.randn(shape, { dtype = dtype or "f64", generator = dl.Generator(seed) })
end

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  else
    out[#out + 1] = v
  end
  return out
end

-- Row-major flat values of a tensor (1-based Lua array).
local function flat(t) return flatten(t:tolist()) end

-- Nested tables of `shape` from a flat row-major array.
local function nest(values, shape)
  if #shape == 0 then return values[1] end
  local pos = 0
  local function build(d)
    local out = {}
    for i = 1, shape[d] do
      if d == #shape then
        pos = pos + 1
        out[i] = values[pos]
      else
        out[i] = build(d + 1)
      end
    end
    return out
  end
  return build(1)
end

-- Row-major strides of a shape.
local function strides_of(shape)
  local s, acc = {}, 1
  for d = #shape, 1, -1 do
    s[d] = acc
    acc = acc * shape[d]
  end
  return s
end

-- A tensor with t's values and shape whose last two dimensions are stored transposed
-- (non-contiguous), and the owner of its memory.
local function transposed_last2(t)
  local s = t:size()
  local n = #s
  local perm = {}
  for i = 1, n do perm[i] = s[i] end
  perm[n - 1], perm[n] = s[n], s[n - 1]
  -- owner holds t with its last two dimensions swapped, contiguous
  local vals, tv = {}, flat(t)
  local count = #tv
  local ps = strides_of(perm)
  for k = 0, count - 1 do
    -- k is a position in t; find its index and store it at the swapped position
    local rest, off = k, 0
    for d = n, 1, -1 do
      local i = rest % s[d]
      rest = math.floor(rest / s[d])
      local pd = (d == n) and n - 1 or ((d == n - 1) and n or d)
      off = off + i * ps[pd]
    end
    vals[off + 1] = tv[k + 1]
  end
  local owner = dl.tensor(nest(vals, perm), { dtype = t.dtype })
  local shape, strides = ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
  for d = 1, n do
    shape[d - 1] = s[d]
    strides[d - 1] = ps[d]
  end
  strides[n - 2], strides[n - 1] = ps[n], ps[n - 1]
  lib.check(C.ddp_tensor_from_blob(lib.box, C.ddp_tensor_data(owner), n, shape, strides,
    C.ddp_tensor_dtype(owner), nil, nil))
  return lib.wrap(lib.box[0]), owner
end

-- torch.matmul by its definition, on flat arrays; returns nested tables.
local function ref_matmul(a, b)
  local A, B, sa, sb = flat(a), flat(b), a:size(), b:size()
  if #sa == 1 and #sb == 1 then
    local s = 0
    for i = 1, sa[1] do s = s + A[i] * B[i] end
    return s
  end
  local a1, b1 = #sa == 1, #sb == 1
  if a1 then sa = { 1, sa[1] } end
  if b1 then sb = { sb[1], 1 } end
  local n, k, m = sa[#sa - 1], sa[#sa], sb[#sb]
  local nba, nbb = #sa - 2, #sb - 2
  local nb = math.max(nba, nbb)
  local bs = {}
  for d = 1, nb do
    local da, db = d - (nb - nba), d - (nb - nbb)
    local x, y = da >= 1 and sa[da] or 1, db >= 1 and sb[db] or 1
    assert(x == y or x == 1 or y == 1)
    bs[d] = math.max(x, y)
    if x == 0 or y == 0 then bs[d] = 0 end
  end
  local stA, stB = strides_of(sa), strides_of(sb)
  local total = 1
  for d = 1, nb do total = total * bs[d] end
  local out = {}
  for bi = 0, total - 1 do
    local rest, offa, offb = bi, 0, 0
    for d = nb, 1, -1 do
      local i = rest % bs[d]
      rest = math.floor(rest / bs[d])
      local da, db = d - (nb - nba), d - (nb - nbb)
      if da >= 1 and sa[da] > 1 then offa = offa + i * stA[da] end
      if db >= 1 and sb[db] > 1 then offb = offb + i * stB[db] end
    end
    for i = 0, n - 1 do
      for j = 0, m - 1 do
        local s = 0
        for p = 0, k - 1 do
          s = s + A[offa + i * k + p + 1] * B[offb + p * m + j + 1]
        end
        out[#out + 1] = s
      end
    end
  end
  local shape = {}
  for d = 1, nb do shape[#shape + 1] = bs[d] end
  if not a1 then shape[#shape + 1] = n end
  if not b1 then shape[#shape + 1] = m end
  return nest(out, shape), shape
end

-- conv2d by its definition (cross-correlation), o = {stride, padding, dilation, groups} as
-- {h, w} pairs.
local function ref_conv2d(x, w, b, o)
  local X, W = flat(x), flat(w)
  local Bv = b and flat(b)
  local xs, ws = x:size(), w:size()
  local N, Cin, H, Wd = xs[1], xs[2], xs[3], xs[4]
  local O, Cg, KH, KW = ws[1], ws[2], ws[3], ws[4]
  local sh, sw = o.stride[1], o.stride[2]
  local ph, pw = o.padding[1], o.padding[2]
  local dh, dw = o.dilation[1], o.dilation[2]
  local groups = o.groups
  local OH = math.floor((H + 2 * ph - dh * (KH - 1) - 1) / sh) + 1
  local OW = math.floor((Wd + 2 * pw - dw * (KW - 1) - 1) / sw) + 1
  local Og = O / groups
  local out = {}
  for n = 0, N - 1 do
    for oc = 0, O - 1 do
      local g = math.floor(oc / Og)
      for oy = 0, OH - 1 do
        for ox = 0, OW - 1 do
          local s = Bv and Bv[oc + 1] or 0
          for ic = 0, Cg - 1 do
            local c = g * Cg + ic
            for ky = 0, KH - 1 do
              for kx = 0, KW - 1 do
                local iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
                if iy >= 0 and iy < H and ix >= 0 and ix < Wd then
                  s = s + X[((n * Cin + c) * H + iy) * Wd + ix + 1] * W[((oc * Cg + ic) * KH + ky) * KW + kx + 1]
                end
              end
            end
          end
          out[#out + 1] = s
        end
      end
    end
  end
  return nest(out, { N, O, OH, OW })
end

-- The gradients of conv2d by its definition (groups 1): for out = conv2d(x, w, b) and the
-- output gradient g, dx, dw and db as nested tables.
local function ref_conv2d_grads(x, w, g, o)
  local X, W, G = flat(x), flat(w), flat(g)
  local xs, ws, gs = x:size(), w:size(), g:size()
  local N, Cin, H, Wd = xs[1], xs[2], xs[3], xs[4]
  local O, KH, KW = ws[1], ws[3], ws[4]
  local OH, OW = gs[3], gs[4]
  local sh, sw, ph, pw = o.stride[1], o.stride[2], o.padding[1], o.padding[2]
  local dh, dw = o.dilation[1], o.dilation[2]
  local dx, dwt, db = {}, {}, {}
  for i = 1, #X do dx[i] = 0 end
  for i = 1, #W do dwt[i] = 0 end
  for i = 1, O do db[i] = 0 end
  for n = 0, N - 1 do
    for oc = 0, O - 1 do
      for oy = 0, OH - 1 do
        for ox = 0, OW - 1 do
          local gv = G[((n * O + oc) * OH + oy) * OW + ox + 1]
          db[oc + 1] = db[oc + 1] + gv
          for c = 0, Cin - 1 do
            for ky = 0, KH - 1 do
              for kx = 0, KW - 1 do
                local iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
                if iy >= 0 and iy < H and ix >= 0 and ix < Wd then
                  local xi = ((n * Cin + c) * H + iy) * Wd + ix + 1
                  local wi = ((oc * Cin + c) * KH + ky) * KW + kx + 1
                  dx[xi] = dx[xi] + gv * W[wi]
                  dwt[wi] = dwt[wi] + gv * X[xi]
                end
              end
            end
          end
        end
      end
    end
  end
  return nest(dx, xs), nest(dwt, ws), db
end

-- Output size of PyTorch's pooling_output_shape.
local function pooled(size, k, p, s, d, ceil)
  local num = size + 2 * p - d * (k - 1) - 1 + (ceil and s - 1 or 0)
  local out = math.floor(num / s) + 1
  if ceil and (out - 1) * s >= size + p then out = out - 1 end
  return out
end

-- Pooling by definition over (N, C, H, W): kind "max" (returns values and 0-based flat
-- indices), "avg" (o.count_include_pad) or "adaptive" (o.size = {oh, ow}).
local function ref_pool(x, kind, o)
  local X, xs = flat(x), x:size()
  local N, Cn, H, W = xs[1], xs[2], xs[3], xs[4]
  local OH, OW
  if kind == "adaptive" then
    OH, OW = o.size[1], o.size[2]
  else
    OH = pooled(H, o.k[1], o.p[1], o.s[1], o.d[1], o.ceil)
    OW = pooled(W, o.k[2], o.p[2], o.s[2], o.d[2], o.ceil)
  end
  local vals, idxs = {}, {}
  for plane = 0, N * Cn - 1 do
    local base = plane * H * W
    for oy = 0, OH - 1 do
      for ox = 0, OW - 1 do
        if kind == "max" then
          local best, bi = -math.huge, nil
          for ky = 0, o.k[1] - 1 do
            for kx = 0, o.k[2] - 1 do
              local iy, ix = oy * o.s[1] - o.p[1] + ky * o.d[1], ox * o.s[2] - o.p[2] + kx * o.d[2]
              if iy >= 0 and iy < H and ix >= 0 and ix < W then
                local v = X[base + iy * W + ix + 1]
                if bi == nil or v > best then best, bi = v, iy * W + ix end
              end
            end
          end
          vals[#vals + 1], idxs[#idxs + 1] = best, bi
        elseif kind == "avg" then
          local y0, x0 = oy * o.s[1] - o.p[1], ox * o.s[2] - o.p[2]
          local y1, x1 = math.min(y0 + o.k[1], H + o.p[1]), math.min(x0 + o.k[2], W + o.p[2])
          local padded = (y1 - y0) * (x1 - x0)
          y0, x0, y1, x1 = math.max(y0, 0), math.max(x0, 0), math.min(y1, H), math.min(x1, W)
          local s = 0
          for iy = y0, y1 - 1 do
            for ix = x0, x1 - 1 do s = s + X[base + iy * W + ix + 1] end
          end
          vals[#vals + 1] = s / (o.count_include_pad and padded or (y1 - y0) * (x1 - x0))
        else
          local y0, y1 = math.floor(oy * H / OH), math.ceil((oy + 1) * H / OH)
          local x0, x1 = math.floor(ox * W / OW), math.ceil((ox + 1) * W / OW)
          local s = 0
          for iy = y0, y1 - 1 do
            for ix = x0, x1 - 1 do s = s + X[base + iy * W + ix + 1] end
          end
          vals[#vals + 1] = s / ((y1 - y0) * (x1 - x0))
        end
      end
    end
  end
  return nest(vals, { N, Cn, OH, OW }), nest(idxs, { N, Cn, OH, OW })
end

-- A tensor of `shape` holding distinct values (a shuffled 0.5-spaced ramp), f64.
local function distinct(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local v = {}
  for i = 1, n do v[i] = (i - n / 2) * 0.5 end
  math.randomseed(n)
  for i = n, 2, -1 do
    local j = math.random(i)
    v[i], v[j] = v[j], v[i]
  end
  return dl.tensor(nest(v, shape), { dtype = "f64" })
end

local function raises(pattern, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  assert.matches(pattern, tostring(err))
end

-- ---- specs -----------------------------------------------------------------------------

describe("ddplua.ops.nn", function()
  describe("matmul", function()
    it("matches the naive product for every rank case", function()
      local cases = {
        { { 4 }, { 4 } }, { { 3, 4 }, { 4, 5 } }, { { 4 }, { 4, 5 } }, { { 3, 4 }, { 4 } },
        { { 2, 3, 4 }, { 4, 5 } }, { { 3, 4 }, { 2, 4, 5 } }, { { 2, 3, 4 }, { 4 } },
        { { 4 }, { 2, 4, 5 } }, { { 2, 1, 3, 4 }, { 5, 4, 2 } }, { { 1, 3, 4 }, { 2, 4, 3 } },
      }
      for _, c in ipairs(cases) do
        for _, dtype in ipairs { "f64", "f32" } do
          local a, b = randn(c[1], dtype), randn(c[2], dtype)
          local expected = ref_matmul(a, b)
          local got = dl.matmul(a, b)
          if type(expected) == "number" then
            assert.equal(0, got:dim())
            close.assert_close(got, { expected }, { atol = 1e-5 })
          else
            close.assert_close(got, expected, { atol = 1e-5, rtol = 1e-5 })
          end
          assert.equal(dtype, got.dtype)
        end
      end
      local a, b = randn({ 2, 3 }), randn({ 3, 2 })
      close.assert_close(a:matmul(b), ref_matmul(a, b))
    end)

    it("takes transposed and strided operands without changing results", function()
      local a, b = randn({ 5, 3 }, "f32"), randn({ 4, 5 }, "f32")
      local at, own_a = views.transposed(a) -- (3, 5), strides (1, 3)
      local bt, own_b = views.transposed(b) -- (5, 4)
      local expected = ref_matmul(at:contiguous(), bt:contiguous())
      close.assert_close(dl.matmul(at, bt), expected, { atol = 1e-5 })
      close.assert_close(dl.matmul(at:contiguous(), bt), expected, { atol = 1e-5 })
      close.assert_close(dl.matmul(at, bt:contiguous()), expected, { atol = 1e-5 })
      local as, own_s = views.strided(randn({ 3, 5 }, "f32"), 3)
      close.assert_close(dl.matmul(as, bt), ref_matmul(as:contiguous(), bt:contiguous()), { atol = 1e-5 })
      local batched = randn({ 2, 3, 4 })
      local bv, own_v = transposed_last2(batched) -- (2, 3, 4) stored as (2, 4, 3)
      assert.is_false(bv:is_contiguous())
      local rhs = randn({ 2, 4, 2 })
      close.assert_close(dl.matmul(bv, rhs), ref_matmul(batched, rhs))
      local lhs = randn({ 2, 4, 3 })
      close.assert_close(dl.matmul(lhs, bv), ref_matmul(lhs, batched))
      local _ = { own_a, own_b, own_s, own_v }
    end)

    it("handles zero-size batches and empty inner dimensions", function()
      local out = dl.matmul(randn({ 0, 2, 3 }), randn({ 3, 4 }))
      assert.same({ 0, 2, 4 }, out:size())
      assert.same({ 2, 0, 4 }, dl.matmul(randn({ 2, 0, 3 }), randn({ 2, 3, 4 })):size())
      local z = dl.matmul(dl.zeros({ 2, 0 }), dl.zeros({ 0, 3 }))
      assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, z:tolist())
    end)

    it("computes integer and half products", function()
      local a = dl.tensor({ { 1, -2 }, { 3, 4 } }, { dtype = "i64" })
      local b = dl.tensor({ { 5, 6 }, { 7, -8 } }, { dtype = "i64" })
      local got = dl.matmul(a, b)
      assert.equal("i64", got.dtype)
      assert.same({ { -9, 22 }, { 43, -14 } }, got:tolist())
      local h1, h2 = randn({ 3, 4 }), randn({ 4, 2 })
      local hh = dl.matmul(h1:to("f16"), h2:to("f16"))
      assert.equal("f16", hh.dtype)
      close.assert_close(hh, ref_matmul(h1, h2), { atol = 2e-2, rtol = 2e-2 })
      close.assert_close(dl.matmul(h1:to("bf16"), h2:to("bf16")), ref_matmul(h1, h2), { atol = 1e-1, rtol = 5e-2 })
    end)

    it("passes gradcheck in every rank case", function()
      local cases = {
        { { 3 }, { 3 } }, { { 2, 3 }, { 3, 2 } }, { { 3 }, { 3, 2 } }, { { 2, 3 }, { 3 } },
        { { 2, 2, 3 }, { 3, 2 } }, { { 2, 3 }, { 2, 3, 2 } }, { { 2, 2, 3 }, { 3 } },
        { { 3 }, { 2, 3, 2 } }, { { 2, 1, 2, 3 }, { 2, 3, 2 } },
      }
      for _, c in ipairs(cases) do
        assert.is_true(gradcheck(dl.matmul, { randn(c[1]), randn(c[2]) }))
      end
      local bt, own = views.transposed(randn({ 2, 3 }))
      assert.is_true(gradcheck(function(a) return dl.matmul(a, bt) end, { randn({ 2, 3 }) }))
      local _ = own
    end)

    it("raises naming the op, the shapes and the dtypes", function()
      raises("matmul.*%(2, 3%).*%(4, 5%)", function() dl.matmul(randn({ 2, 3 }), randn({ 4, 5 })) end)
      raises("matmul.*%(3,?%).*%(4,?%)", function() dl.matmul(randn({ 3 }), randn({ 4 })) end)
      raises("matmul.*f32.*f64", function() dl.matmul(randn({ 2, 3 }, "f32"), randn({ 3, 2 })) end)
      raises("matmul.*%(2, 2, 3%).*%(3, 3, 2%).*broadcast", function()
        dl.matmul(randn({ 2, 2, 3 }), randn({ 3, 3, 2 }))
      end)
      raises("matmul.*1 dimension", function() dl.matmul(dl.tensor(2, { dtype = "f64" }), randn({ 2 })) end)
    end)
  end)

  describe("bmm", function()
    it("matches per-batch products, with transposed batches", function()
      local a, b = randn({ 3, 2, 4 }), randn({ 3, 4, 5 })
      close.assert_close(dl.bmm(a, b), ref_matmul(a, b))
      local bv, own = transposed_last2(b)
      close.assert_close(a:bmm(bv), ref_matmul(a, b))
      assert.same({ 0, 2, 5 }, dl.bmm(randn({ 0, 2, 4 }), randn({ 0, 4, 5 })):size())
      -- batch entries spread over the threads
      local big_a, big_b = randn({ 4, 64, 48 }, "f32"), randn({ 4, 48, 64 }, "f32")
      close.assert_close(dl.bmm(big_a, big_b), ref_matmul(big_a, big_b), { atol = 1e-4, rtol = 1e-4 })
      local _ = own
    end)

    it("passes gradcheck", function()
      assert.is_true(gradcheck(dl.bmm, { randn({ 2, 2, 3 }), randn({ 2, 3, 2 }) }))
    end)

    it("refuses other ranks, batch and inner mismatches", function()
      raises("bmm.*%(2, 3%)", function() dl.bmm(randn({ 2, 3 }), randn({ 1, 3, 2 })) end)
      raises("bmm.*%(2, 2, 3%).*%(3, 3, 2%)", function() dl.bmm(randn({ 2, 2, 3 }), randn({ 3, 3, 2 })) end)
      raises("bmm.*%(2, 2, 3%).*%(2, 4, 2%)", function() dl.bmm(randn({ 2, 2, 3 }), randn({ 2, 4, 2 })) end)
    end)
  end)

  describe("linear", function()
    local function ref_linear(x, w, b)
      local wt = w:contiguous()
      local W = flat(wt)
      local s = wt:size()
      local tr = {}
      for i = 1, s[2] do
        tr[i] = {}
        for o = 1, s[1] do tr[i][o] = W[(o - 1) * s[2] + i] end
      end
      local y, shape = ref_matmul(x, dl.tensor(tr, { dtype = x.dtype }))
      if not b then return y end
      local yv, bv = flatten(y), flat(b)
      for i = 1, #yv do yv[i] = yv[i] + bv[(i - 1) % #bv + 1] end
      return nest(yv, shape)
    end

    it("computes x Wᵀ + b for 1-d, 2-d and 3-d inputs", function()
      local w, b = randn({ 4, 3 }), randn({ 4 })
      for _, shape in ipairs { { 3 }, { 5, 3 }, { 2, 5, 3 } } do
        local x = randn(shape)
        close.assert_close(dl.linear(x, w, b), ref_linear(x, w, b))
        close.assert_close(x:linear(w), ref_linear(x, w))
      end
      local wt, own = views.transposed(randn({ 3, 4 })) -- a non-contiguous (4, 3) weight
      local x = randn({ 2, 3 })
      close.assert_close(dl.linear(x, wt, b), ref_linear(x, wt, b))
      assert.same({ 0, 4 }, dl.linear(randn({ 0, 3 }), w, b):size())
      local _ = own
    end)

    it("passes gradcheck with and without bias", function()
      assert.is_true(gradcheck(dl.linear, { randn({ 2, 3 }), randn({ 4, 3 }), randn({ 4 }) }))
      assert.is_true(gradcheck(dl.linear, { randn({ 2, 2, 3 }), randn({ 2, 3 }), randn({ 2 }) }))
      assert.is_true(gradcheck(function(x, w) return dl.linear(x, w) end, { randn({ 3 }), randn({ 2, 3 }) }))
    end)

    it("f16 and bf16 round once: the bias is added to the f32 product (Note [half linear rounds once])", function()
      dl.manual_seed(11)
      for _, dtype in ipairs({ "f16", "bf16" }) do
        -- multiples of 1/256 up to 256 in magnitude: exact in f32, not in a half dtype
        local x = (dl.randint(-64, 65, { 64, 16 }):to("f64") / 16):to(dtype)
        local w = (dl.randint(-64, 65, { 32, 16 }):to("f64") / 16):to(dtype)
        local b = randn({ 32 }):to(dtype)
        local once = dl.linear(x:to("f64"), w:to("f64"), b:to("f64")):to(dtype)
        assert.same(once:tolist(), dl.linear(x, w, b):tolist())
      end
    end)

    it("raises on feature, bias and dtype mismatches", function()
      raises("linear.*%(2, 3%).*%(4, 5%)", function() dl.linear(randn({ 2, 3 }), randn({ 4, 5 })) end)
      raises("linear.*bias.*%(3,?%)", function() dl.linear(randn({ 2, 3 }), randn({ 4, 3 }), randn({ 3 })) end)
      raises("linear.*f32.*f64", function() dl.linear(randn({ 2, 3 }, "f32"), randn({ 4, 3 })) end)
    end)
  end)

  describe("conv2d", function()
    local function opts_of(o)
      local function p(v, d)
        v = v or d
        return type(v) == "table" and v or { v, v }
      end
      return { stride = p(o.stride, 1), padding = p(o.padding, 0), dilation = p(o.dilation, 1),
        groups = o.groups or 1 }
    end
    local cases = {
      { x = { 2, 3, 6, 6 }, w = { 4, 3, 3, 3 }, o = {} },
      { x = { 2, 3, 6, 6 }, w = { 4, 3, 3, 3 }, o = { padding = 1 } },
      { x = { 1, 2, 7, 8 }, w = { 3, 2, 3, 2 }, o = { stride = { 2, 3 }, padding = { 1, 2 } } },
      { x = { 2, 2, 7, 7 }, w = { 2, 2, 3, 3 }, o = { dilation = 2, padding = 2 } },
      { x = { 2, 4, 5, 5 }, w = { 6, 2, 3, 3 }, o = { groups = 2, padding = 1 } },
      { x = { 1, 4, 6, 5 }, w = { 4, 1, 2, 2 }, o = { groups = 4, stride = 2, dilation = { 2, 1 } } },
      { x = { 2, 3, 4, 4 }, w = { 5, 3, 1, 1 }, o = {} },
      { x = { 2, 1, 8, 8 }, w = { 3, 1, 3, 3 }, o = { padding = 1 } },
      -- 3x3, stride 1, >= 8 channels: the Winograd path, with odd and even output sizes
      { x = { 3, 8, 5, 6 }, w = { 9, 8, 3, 3 }, o = { padding = 1 } },
      { x = { 2, 8, 6, 7 }, w = { 8, 8, 3, 3 }, o = {} },
      { x = { 2, 9, 4, 5 }, w = { 8, 9, 3, 3 }, o = { padding = { 2, 0 } } },
    }

    it("matches the direct convolution for stride, padding, dilation and groups", function()
      for _, c in ipairs(cases) do
        local x, w, b = randn(c.x), randn(c.w), randn({ c.w[1] })
        close.assert_close(dl.conv2d(x, w, b, c.o), ref_conv2d(x, w, b, opts_of(c.o)), { atol = 1e-10 })
        close.assert_close(x:conv2d(w, nil, c.o), ref_conv2d(x, w, nil, opts_of(c.o)), { atol = 1e-10 })
        local xf, wf = x:to("f32"), w:to("f32")
        close.assert_close(dl.conv2d(xf, wf, c.o), ref_conv2d(x, w, nil, opts_of(c.o)), { atol = 1e-4, rtol = 1e-4 })
      end
    end)

    it("takes non-contiguous, unbatched, half and zero-batch inputs", function()
      local x, w = randn({ 2, 3, 5, 5 }), randn({ 2, 3, 3, 3 })
      local xs, own = views.strided(x, 2)
      assert.is_false(xs:is_contiguous())
      local o = { padding = 1 }
      close.assert_close(dl.conv2d(xs, w, o), ref_conv2d(x, w, nil, opts_of(o)), { atol = 1e-10 })
      local single = randn({ 1, 3, 5, 5 })
      local want = ref_conv2d(single, w, nil, opts_of(o))[1]
      local three = dl.tensor(single:tolist()[1], { dtype = "f64" })
      local got = dl.conv2d(three, w, o)
      assert.same({ 2, 5, 5 }, got:size())
      close.assert_close(got, want, { atol = 1e-10 })
      local xh, wh = x:to("f16"), w:to("f16")
      xh:requires_grad_(); wh:requires_grad_()
      local h = dl.conv2d(xh, wh, o)
      assert.equal("f16", h.dtype)
      close.assert_close(h, ref_conv2d(x, w, nil, opts_of(o)), { atol = 5e-2, rtol = 2e-2 })
      local gh = randn(h:size())
      h:backward(gh:to("f16"))
      local dx, dw = ref_conv2d_grads(x, w, gh, opts_of(o))
      assert.equal("f16", xh.grad.dtype)
      close.assert_close(xh.grad, dx, { atol = 5e-2, rtol = 2e-2 })
      close.assert_close(wh.grad, dw, { atol = 1e-1, rtol = 2e-2 })
      assert.same({ 0, 2, 5, 5 }, dl.conv2d(randn({ 0, 3, 5, 5 }), w, o):size())
      local _ = own
    end)

    it("passes gradcheck with stride, padding, dilation and groups", function()
      local gcases = {
        { x = { 2, 2, 5, 5 }, w = { 3, 2, 3, 3 }, o = { padding = 1 } },
        { x = { 1, 2, 6, 5 }, w = { 2, 2, 2, 3 }, o = { stride = { 2, 1 }, padding = { 1, 0 }, dilation = { 1, 2 } } },
        { x = { 1, 4, 4, 4 }, w = { 4, 2, 2, 2 }, o = { groups = 2, dilation = 2, padding = 1 } },
        { x = { 2, 2, 3, 3 }, w = { 3, 2, 1, 1 }, o = {} },
        { x = { 2, 8, 3, 4 }, w = { 8, 8, 3, 3 }, o = { padding = 1 } }, -- Winograd's shape (f64: im2col)
      }
      for _, c in ipairs(gcases) do
        assert.is_true(gradcheck(function(x, w, b) return dl.conv2d(x, w, b, c.o) end,
          { randn(c.x), randn(c.w), randn({ c.w[1] }) }))
      end
      -- only the weight needs a gradient (a first layer)
      local x = randn({ 2, 1, 4, 4 })
      assert.is_true(gradcheck(function(xx, w) return dl.conv2d(xx, w, { padding = 1 }) end,
        { x, randn({ 2, 1, 3, 3 }) }, { skip = { [1] = true } }))
      -- Winograd's shapes (in f32; f64 takes im2col) with only the weight, then only the
      -- input needing a gradient; spec/ops/conv_winograd_spec.lua checks f32 against these
      local x8 = randn({ 1, 8, 3, 3 })
      assert.is_true(gradcheck(function(xx, w) return dl.conv2d(xx, w, { padding = 1 }) end,
        { x8, randn({ 8, 8, 3, 3 }) }, { skip = { [1] = true } }))
      local w8 = randn({ 8, 8, 3, 3 })
      assert.is_true(gradcheck(function(xx, w) return dl.conv2d(xx, w, { padding = 1 }) end,
        { randn({ 1, 8, 3, 3 }), w8 }, { skip = { [2] = true } }))
    end)

    it("matches the gradients by definition over many samples and threads", function()
      -- 12 samples of 14 x 14: several Winograd chunks per thread; then the im2col path
      for _, c in ipairs {
        { x = { 12, 8, 14, 14 }, w = { 8, 8, 3, 3 }, o = { padding = 1 } },
        { x = { 12, 3, 9, 9 }, w = { 4, 3, 3, 3 }, o = { padding = 1, stride = 2 } },
      } do
        local x, w, b = randn(c.x), randn(c.w), randn({ c.w[1] })
        local o = opts_of(c.o)
        for _, dtype in ipairs { "f64", "f32" } do
          local xx, ww, bb = x:detach():to(dtype), w:detach():to(dtype), b:detach():to(dtype)
          xx:requires_grad_(); ww:requires_grad_(); bb:requires_grad_()
          local y = dl.conv2d(xx, ww, bb, c.o)
          local tol = dtype == "f64" and { atol = 1e-9 } or { atol = 1e-3, rtol = 1e-4 }
          close.assert_close(y, ref_conv2d(x, w, b, o), tol)
          local g = randn(y:size())
          y:backward(g:to(dtype))
          local dx, dw, db = ref_conv2d_grads(x, w, g, o)
          close.assert_close(xx.grad, dx, tol)
          close.assert_close(ww.grad, dw, tol)
          close.assert_close(bb.grad, db, tol)
        end
      end
    end)

    it("accumulates f32 gradients like f64 ones at the CNN layer sizes", function()
      for _, c in ipairs { { 4, 5 }, { 16, 12 } } do -- im2col, then Winograd
      local x, w, b = randn({ 5, c[1], 6, 6 }), randn({ c[2], c[1], 3, 3 }), randn({ c[2] })
      local g = randn({ 5, c[2], 6, 6 })
      local grads = {}
      for _, dtype in ipairs { "f64", "f32" } do
        local xx, ww, bb = x:detach():to(dtype), w:detach():to(dtype), b:detach():to(dtype)
        xx:requires_grad_(); ww:requires_grad_(); bb:requires_grad_()
        dl.conv2d(xx, ww, bb, { padding = 1 }):backward(g:to(dtype))
        grads[dtype] = { xx.grad, ww.grad, bb.grad }
      end
      for i = 1, 3 do
        close.assert_close(grads.f32[i], grads.f64[i], { atol = 1e-3, rtol = 1e-4 })
      end
      end
    end)

    it("raises naming the op, the shapes and the options", function()
      raises("conv2d.*divisible by groups 2", function()
        dl.conv2d(randn({ 1, 3, 5, 5 }), randn({ 2, 1, 3, 3 }), { groups = 2 })
      end)
      raises("conv2d.*%(1, 3, 5, 5%).*3 channels.*%(2, 2, 3, 3%)", function()
        dl.conv2d(randn({ 1, 3, 5, 5 }), randn({ 2, 2, 3, 3 }))
      end)
      raises("conv2d: kernel size %(5, 5%).*larger than the padded input %(4, 4%)", function()
        dl.conv2d(randn({ 1, 1, 4, 4 }), randn({ 1, 1, 5, 5 }))
      end)
      raises("conv2d.*dilated: %(5, 5%).*%(4, 4%)", function()
        dl.conv2d(randn({ 1, 1, 4, 4 }), randn({ 1, 1, 3, 3 }), { dilation = 2 })
      end)
      raises("conv2d.*bias.*%(2,?%)", function()
        dl.conv2d(randn({ 1, 1, 4, 4 }), randn({ 2, 1, 3, 3 }), randn({ 3 }))
      end)
      raises("conv2d.*stride", function() dl.conv2d(randn({ 1, 1, 4, 4 }), randn({ 1, 1, 3, 3 }), { stride = 0 }) end)
      raises("conv2d.*f32.*f64", function() dl.conv2d(randn({ 1, 1, 4, 4 }, "f32"), randn({ 1, 1, 3, 3 })) end)
      raises("conv2d.*%(4, 4%)", function() dl.conv2d(randn({ 4, 4 }), randn({ 1, 1, 3, 3 })) end)
      raises("conv2d.*padding", function() dl.conv2d(randn({ 1, 1, 4, 4 }), randn({ 1, 1, 3, 3 }), { padding = "x" }) end)
    end)
  end)

  describe("max_pool2d", function()
    local function o_of(k, s, p, d, ceil)
      return { k = k, s = s or k, p = p or { 0, 0 }, d = d or { 1, 1 }, ceil = ceil }
    end
    local cases = {
      { shape = { 2, 2, 6, 6 }, kernel = 2, opts = nil, o = o_of({ 2, 2 }) },
      { shape = { 2, 3, 5, 21 }, kernel = 2, opts = nil, o = o_of({ 2, 2 }) }, -- 8 windows a row
      { shape = { 1, 2, 7, 7 }, kernel = 3, opts = { stride = 2, padding = 1 }, o = o_of({ 3, 3 }, { 2, 2 }, { 1, 1 }) },
      { shape = { 1, 1, 8, 7 }, kernel = { 2, 3 }, opts = { stride = { 1, 2 }, dilation = 2 },
        o = o_of({ 2, 3 }, { 1, 2 }, nil, { 2, 2 }) },
      { shape = { 2, 1, 7, 5 }, kernel = 2, opts = { ceil_mode = true }, o = o_of({ 2, 2 }, nil, nil, nil, true) },
      { shape = { 1, 1, 6, 6 }, kernel = 3, opts = { stride = 2, padding = 1, ceil_mode = true },
        o = o_of({ 3, 3 }, { 2, 2 }, { 1, 1 }, nil, true) },
    }

    it("matches the window maximum and its flat index", function()
      for _, c in ipairs(cases) do
        local x = distinct(c.shape)
        local want, want_idx = ref_pool(x, "max", c.o)
        local opts = {}
        for k, v in pairs(c.opts or {}) do opts[k] = v end
        opts.return_indices = true
        local out, idx = dl.max_pool2d(x, c.kernel, opts)
        close.assert_close(out, want, { atol = 0 })
        assert.equal("i64", idx.dtype)
        assert.same(want_idx, idx:tolist())
        local opts32 = {}
        for k, v in pairs(opts) do opts32[k] = v end
        local out32, idx32 = x:to("f32"):max_pool2d(c.kernel, opts32)
        close.assert_close(out32, want, { atol = 0 })
        assert.same(want_idx, idx32:tolist())
      end
    end)

    it("propagates NaN with its index, in f32 and f64", function()
      local rows = {}
      for i = 1, 4 do
        rows[i] = {}
        for k = 1, 18 do rows[i][k] = (i * 31 + k * 17) % 23 end
      end
      rows[2][6] = 0 / 0 -- window (1, 3) of the 2x2 pooling: flat index 1 * 18 + 5
      for _, dtype in ipairs { "f32", "f64" } do
        local x = dl.tensor({ { rows } }, { dtype = dtype })
        local out, idx = dl.max_pool2d(x, 2, { return_indices = true })
        local o, i = out:tolist()[1][1], idx:tolist()[1][1]
        assert.is_true(o[1][3] ~= o[1][3])
        assert.equal(23, i[1][3])
        assert.is_true(o[1][4] == o[1][4])
      end
    end)

    it("takes unbatched, non-contiguous and zero-batch inputs", function()
      local x = distinct({ 1, 2, 4, 4 })
      local want = ref_pool(x, "max", o_of({ 2, 2 }))
      close.assert_close(dl.max_pool2d(dl.tensor(x:tolist()[1], { dtype = "f64" }), 2), want[1], { atol = 0 })
      local xs, own = views.strided(x, 3)
      close.assert_close(dl.max_pool2d(xs, 2), want, { atol = 0 })
      assert.same({ 0, 2, 2, 2 }, dl.max_pool2d(dl.zeros({ 0, 2, 4, 4 }), 2):size())
      local _ = own
    end)

    it("passes gradcheck (distinct values)", function()
      for _, c in ipairs(cases) do
        assert.is_true(gradcheck(function(x) return dl.max_pool2d(x, c.kernel, c.opts) end, { distinct(c.shape) }))
      end
    end)

    it("raises on bad windows, naming the op and the sizes", function()
      raises("max_pool2d.*padding %(2, 2%).*half the kernel %(3, 3%)", function()
        dl.max_pool2d(randn({ 1, 1, 5, 5 }), 3, { padding = 2 })
      end)
      raises("max_pool2d.*%(1, 1, 2, 2%).*too small", function() dl.max_pool2d(randn({ 1, 1, 2, 2 }), 3) end)
      raises("max_pool2d.*%(5, 5%)", function() dl.max_pool2d(randn({ 5, 5 }), 2) end)
      raises("max_pool2d.*kernel", function() dl.max_pool2d(randn({ 1, 1, 5, 5 }), 0) end)
    end)
  end)

  describe("avg_pool2d", function()
    local cases = {
      { shape = { 2, 2, 6, 6 }, kernel = 2, opts = nil, o = { k = { 2, 2 }, s = { 2, 2 }, p = { 0, 0 }, count_include_pad = true } },
      { shape = { 1, 2, 5, 7 }, kernel = 3, opts = { stride = 2, padding = 1 },
        o = { k = { 3, 3 }, s = { 2, 2 }, p = { 1, 1 }, count_include_pad = true } },
      { shape = { 1, 2, 5, 7 }, kernel = 3, opts = { stride = 2, padding = 1, count_include_pad = false },
        o = { k = { 3, 3 }, s = { 2, 2 }, p = { 1, 1 }, count_include_pad = false } },
      { shape = { 1, 1, 6, 5 }, kernel = { 3, 2 }, opts = { stride = { 2, 2 }, padding = { 1, 1 }, ceil_mode = true },
        o = { k = { 3, 2 }, s = { 2, 2 }, p = { 1, 1 }, ceil = true, count_include_pad = true } },
    }
    for _, c in ipairs(cases) do c.o.d = { 1, 1 } end

    it("matches the window mean with and without padding in the divisor", function()
      for _, c in ipairs(cases) do
        local x = randn(c.shape)
        local want = ref_pool(x, "avg", c.o)
        close.assert_close(dl.avg_pool2d(x, c.kernel, c.opts), want, { atol = 1e-12 })
        close.assert_close(x:to("f32"):avg_pool2d(c.kernel, c.opts), want, { atol = 1e-5 })
      end
      local x = randn({ 1, 2, 4, 4 })
      local xs, own = views.strided(x, 2)
      close.assert_close(dl.avg_pool2d(xs, 2), ref_pool(x, "avg", cases[1].o), { atol = 1e-12 })
      assert.same({ 0, 1, 2, 2 }, dl.avg_pool2d(dl.zeros({ 0, 1, 4, 4 }), 2):size())
      local _ = own
    end)

    it("passes gradcheck", function()
      for _, c in ipairs(cases) do
        assert.is_true(gradcheck(function(x) return dl.avg_pool2d(x, c.kernel, c.opts) end, { randn(c.shape) }))
      end
    end)

    it("raises on bad windows", function()
      raises("avg_pool2d.*padding", function() dl.avg_pool2d(randn({ 1, 1, 5, 5 }), 2, { padding = 2 }) end)
      raises("avg_pool2d.*too small", function() dl.avg_pool2d(randn({ 1, 1, 2, 2 }), 3) end)
    end)
  end)

  describe("adaptive_avg_pool2d", function()
    it("uses PyTorch's floor/ceil windows", function()
      for _, c in ipairs { { { 1, 2, 5, 7 }, { 3, 4 } }, { { 2, 1, 4, 4 }, { 2, 2 } }, { { 1, 1, 3, 5 }, { 5, 2 } } } do
        local x = randn(c[1])
        close.assert_close(dl.adaptive_avg_pool2d(x, c[2]), ref_pool(x, "adaptive", { size = c[2] }), { atol = 1e-12 })
      end
      local x = randn({ 1, 2, 6, 6 })
      close.assert_close(x:adaptive_avg_pool2d(1), ref_pool(x, "adaptive", { size = { 1, 1 } }), { atol = 1e-12 })
      local three = dl.adaptive_avg_pool2d(randn({ 2, 6, 6 }), { 2, 3 })
      assert.same({ 2, 2, 3 }, three:size())
    end)

    it("passes gradcheck", function()
      assert.is_true(gradcheck(function(x) return dl.adaptive_avg_pool2d(x, { 3, 2 }) end, { randn({ 1, 2, 5, 4 }) }))
    end)

    it("raises on an empty output size", function()
      raises("adaptive_avg_pool2d.*%(0, 2%).*%(1, 1, 4, 4%)", function() dl.adaptive_avg_pool2d(randn({ 1, 1, 4, 4 }), { 0, 2 }) end)
    end)
  end)
end)
