-- The f32 2x2 stride-2 max pooling kernels (runtime/backend/cpu/pool.c: max_fwd_2x2_avx with
-- masked loads and stores for the last windows of a row, max_bwd_2x2_avx writing d_in in one
-- pass) against the window maximum by definition and, bit for bit, against the f64 path
-- (the plain per-window loops, whose f32 inputs and results are exact in f64): every row
-- length from 1 to 19 windows (full vectors, partial ones, and rows of fewer than 8), odd
-- heights and widths (cells no window covers), ties, NaN, signed zeros, ceil_mode, 1 and 2
-- threads.
local dl = require "ddplua"
local assert_same_bits = require("close").assert_same_bits

local seed = 1600
local function gen() seed = seed + 1; return dl.Generator(seed) end

-- f32 values from a small set (ties are frequent), with NaN and -0 sprinkled in when `odd`.
local function values(shape, odd)
  local x = dl.randint(-4, 5, shape, { generator = gen() }):to("f32") * 0.5
  if odd then
    local u = dl.rand(shape, { generator = gen() })
    x = dl.where(u:lt(0.03), dl.full(shape, 0 / 0), x)
    x = dl.where(u:gt(0.95), dl.full(shape, -0.0), x)
  end
  return x
end

local function flat(t) return t:contiguous():reshape({ -1 }):tolist() end


-- Window maximum and first flat index of the largest value (no NaN in x).
local function ref_forward(x)
  local s = x:size()
  local N, C, H, W = s[1], s[2], s[3], s[4]
  local OH, OW = math.floor(H / 2), math.floor(W / 2)
  local X, vals, idxs = flat(x), {}, {}
  for p = 0, N * C - 1 do
    for oy = 0, OH - 1 do
      for ox = 0, OW - 1 do
        local best, bi
        for ky = 0, 1 do
          for kx = 0, 1 do
            local at = (2 * oy + ky) * W + 2 * ox + kx
            local v = X[p * H * W + at + 1]
            if bi == nil or v > best then best, bi = v, at end
          end
        end
        vals[#vals + 1], idxs[#idxs + 1] = best, bi
      end
    end
  end
  return vals, idxs
end

-- forward values, indices and the input gradient for grad g (f32 or f64 throughout).
local function run(x, g, opts)
  local xx = x:detach():requires_grad_()
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.return_indices = true
  local y, idx = dl.max_pool2d(xx, 2, o)
  y:backward(g)
  return y:detach(), idx, xx.grad
end

describe("max_pool2d 2x2 f32 kernels", function()
  local threads
  before_each(function() threads = dl.get_num_threads() end)
  after_each(function() dl.set_num_threads(threads) end)

  local shapes = {}
  for w = 2, 39, 1 do shapes[#shapes + 1] = { 2, 3, 4, w } end
  for _, hw in ipairs { { 28, 28 }, { 14, 14 }, { 5, 7 }, { 3, 17 }, { 7, 32 }, { 2, 2 } } do
    shapes[#shapes + 1] = { 3, 5, hw[1], hw[2] }
  end

  it("matches the window maximum and its first flat index", function()
    for _, s in ipairs(shapes) do
      local x = values(s, false)
      local vals, idxs = ref_forward(x)
      local y, idx = dl.max_pool2d(x, 2, { return_indices = true })
      assert.same(vals, flat(y))
      assert.same(idxs, flat(idx))
    end
  end)

  it("keeps dilated 2x2 windows (which overlap) off the one-pass backward", function()
    for _, s in ipairs { { 2, 3, 9, 9 }, { 1, 2, 6, 21 } } do
      local x = values(s, true)
      local g = values(dl.max_pool2d(x, 2, { dilation = 2 }):size(), true)
      local _, _, want_dx = run(x:to("f64"), g:to("f64"), { dilation = 2 })
      local _, _, dx = run(x, g, { dilation = 2 })
      assert_same_bits("dilated " .. table.concat(s, "x"), dx, want_dx:to("f32"))
    end
  end)

  it("gives the f64 path's bits forward and backward, NaN and -0 included, at 1 and 2 threads", function()
    for _, s in ipairs(shapes) do
      for _, ceil in ipairs { false, true } do
        local x = values(s, true)
        local ys = dl.max_pool2d(x, 2, { ceil_mode = ceil }):size()
        local g = values(ys, true)
        local want_y, want_i, want_dx = run(x:to("f64"), g:to("f64"), { ceil_mode = ceil })
        for _, t in ipairs { 1, 2 } do
          dl.set_num_threads(t)
          local y, idx, dx = run(x, g, { ceil_mode = ceil })
          local what = ("shape %s ceil %s threads %d"):format(table.concat(s, "x"), tostring(ceil), t)
          assert.equal("f32", dx.dtype)
          assert_same_bits(what .. " forward", y, want_y:to("f32"))
          assert.same(flat(want_i), flat(idx))
          assert_same_bits(what .. " backward", dx, want_dx:to("f32"))
        end
      end
    end
  end)
end)
