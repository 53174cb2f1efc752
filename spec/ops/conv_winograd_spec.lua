-- Specs for the CPU's f32 Winograd F(2x2, 3x3) convolution (runtime/backend/cpu/conv_winograd.c):
-- forward, input gradient, weight gradient and bias gradient against the f64 convolution
-- (im2col + GEMM, itself checked against the definition and by gradcheck in nn_spec.lua),
-- over odd and even sizes, borders and paddings, batch 1, channel counts that are not
-- multiples of 8, tile rows wider than one 8-tile vector, chunks that split a sample, 32
-- channels and more (the weight gradient's transposed V, with channel and tile tails), and
-- the same bits for 1 and 2 threads.
local dl = require "ddplua"

local seed = 1000
local function randn(shape)
  seed = seed + 1
  return dl.randn(shape, { dtype = "f64", generator = dl.Generator(seed) })
end

local flatten = require("close").flatten
local function flat(t) return flatten(t:tolist(), {}) end

-- Largest |got - want| over the largest |want| (f32 result against the f64 one).
local function rel_err(got, want)
  local a, b = flat(got), flat(want)
  assert.equal(#b, #a)
  local err, scale = 0, 0
  for i = 1, #a do
    err = math.max(err, math.abs(a[i] - b[i]))
    scale = math.max(scale, math.abs(b[i]))
  end
  return err / scale
end

-- y, dx, dw, db of conv2d in dtype for f64 inputs x, w, b and output gradient g.
local function run(dtype, x, w, b, g, opts)
  local xx, ww, bb = x:detach():to(dtype), w:detach():to(dtype), b:detach():to(dtype)
  xx:requires_grad_(); ww:requires_grad_(); bb:requires_grad_()
  local y = dl.conv2d(xx, ww, bb, opts)
  y:backward(g:to(dtype))
  return { y, xx.grad, ww.grad, bb.grad }
end

-- x (N, C, H, W), weight (O, C, 3, 3), padding
local cases = {
  { { 1, 8, 5, 7 }, 8, 1 },      -- batch 1, odd sizes: partial last tiles in both directions
  { { 3, 9, 6, 6 }, 12, 1 },     -- channels not multiples of 8
  { { 2, 12, 1, 1 }, 9, 1 },     -- one pixel: every tap but the centre reads padding
  { { 2, 8, 3, 4 }, 10, 0 },     -- no padding, a 1 x 2 output
  { { 2, 10, 17, 33 }, 8, 1 },   -- 17 tiles a row: three 8-tile vectors, the last partial
  { { 1, 8, 9, 16 }, 8, 2 },     -- padding 2: whole tiles of zeros at the border
  { { 2, 11, 7, 6 }, 13, { 2, 0 } }, -- unequal padding
  { { 4, 16, 8, 8 }, 16, 1 },    -- ResNet-20's last stage, scaled down: 4-tile rows in pairs
  { { 3, 8, 5, 7 }, 9, 1 },      -- 4-tile rows, an odd count: the last one unpaired
  { { 2, 9, 7, 8 }, 8, 1 },      -- 4-tile rows, the last output line missing
  { { 1, 8, 10, 9 }, 8, 0 },     -- 4-tile rows without padding
  { { 72, 80, 7, 7 }, 80, 1 },   -- 4-tile rows, backward chunks of 17 tile rows: pairs split
  { { 2, 16, 66, 70 }, 24, 1 },  -- chunks of ~8 tile rows: a sample spans several chunks
  -- 32 channels and more: the weight gradient takes a transposed copy of V
  -- (Note [Winograd weight gradient layout]), in 8 x 8 blocks with channel and tile tails
  { { 3, 33, 9, 11 }, 7, 1 },    -- 33 channels (a tail of 1), 5 x 6 tiles: a tail of 6 tiles
  { { 2, 45, 13, 13 }, 10, 1 },  -- 45 channels (a tail of 5), 7-tile rows
  { { 5, 32, 14, 14 }, 64, 1 },  -- the Fashion-MNIST CNN's second conv at batch 5
  { { 2, 40, 30, 31 }, 17, 0 },  -- no padding, 14 x 15 tiles, chunks of several tile rows
}

describe("conv2d f32 by Winograd F(2x2, 3x3)", function()
  it("matches the f64 convolution and its gradients over sizes, borders and channels", function()
    for _, c in ipairs(cases) do
      local x, w, b = randn(c[1]), randn({ c[2], c[1][2], 3, 3 }), randn({ c[2] })
      local opts = { padding = c[3] }
      local y64 = dl.conv2d(x, w, b, opts)
      local g = randn(y64:size())
      local want = run("f64", x, w, b, g, opts)
      local got = run("f32", x, w, b, g, opts)
      for i, name in ipairs { "output", "input gradient", "weight gradient", "bias gradient" } do
        assert.same(want[i]:size(), got[i]:size())
        local e = rel_err(got[i], want[i])
        -- f32 rounding of sums of up to a few thousand terms: ~1e-6 seen, bound 1e-5
        assert(e < 1e-5, ("%s of x (%s): relative error %.3g"):format(
          name, table.concat(c[1], ", "), e))
      end
    end
  end)

  it("accumulates into existing gradients and honours a missing bias or input gradient", function()
    local x, w = randn({ 2, 8, 6, 5 }), randn({ 9, 8, 3, 3 })
    local g = randn({ 2, 9, 6, 5 })
    local opts = { padding = 1 }
    -- weight only (a first layer: the input needs no gradient), twice: gradients add up
    local ww = w:to("f32"); ww:requires_grad_()
    local xf = x:to("f32")
    for _ = 1, 2 do dl.conv2d(xf, ww, opts):backward(g:to("f32")) end
    local w64 = w:detach(); w64:requires_grad_()
    dl.conv2d(x, w64, opts):backward(g)
    assert(rel_err(ww.grad, w64.grad * 2) < 1e-5)
    -- input only
    local xx = x:to("f32"); xx:requires_grad_()
    dl.conv2d(xx, w:to("f32"), opts):backward(g:to("f32"))
    local x64 = x:detach(); x64:requires_grad_()
    dl.conv2d(x64, w, opts):backward(g)
    assert(rel_err(xx.grad, x64.grad) < 1e-5)
    -- bias only (input and weight frozen): the bias gradient without the tile units
    local b = randn({ 9 })
    local bb = b:to("f32"); bb:requires_grad_()
    dl.conv2d(x:to("f32"), w:to("f32"), bb, opts):backward(g:to("f32"))
    local b64 = b:detach(); b64:requires_grad_()
    dl.conv2d(x, w, b64, opts):backward(g)
    assert(rel_err(bb.grad, b64.grad) < 1e-5)
  end)

  it("gives the same bits for 1 and 2 threads", function()
    local before = dl.get_num_threads()
    -- 13 samples: 12 work units of unequal size; 40 x 36: several chunks a unit;
    -- 16 channels (dU from V as it is) and 33 (from its transposed copy)
    for _, c in ipairs { { 16, 20, 40, 36 }, { 33, 24, 20, 18 } } do
      local cin, cout, h, wd = c[1], c[2], c[3], c[4]
      local x, w, b = randn({ 13, cin, h, wd }), randn({ cout, cin, 3, 3 }), randn({ cout })
      local g = randn({ 13, cout, h, wd })
      local results = {}
      for _, threads in ipairs { 1, 2 } do
        dl.set_num_threads(threads)
        results[threads] = run("f32", x, w, b, g, { padding = 1 })
      end
      dl.set_num_threads(before)
      for i = 1, 4 do
        local a, d = flat(results[1][i]), flat(results[2][i])
        assert.equal(#a, #d)
        local same = true
        for k = 1, #a do
          if a[k] ~= d[k] then same = false break end
        end
        assert.is_true(same, ("result %d differs between 1 and 2 threads (%d channels)"):format(i, cin))
      end
    end
  end)
end)
