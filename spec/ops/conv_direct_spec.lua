-- Specs for the direct f32 convolution kernels (runtime/backend/cpu/conv_direct.c), which
-- conv2d takes in f32 for 3x3 stride-1 convolutions of one input channel and for 3x3
-- stride-2 convolutions (forward up to 64 -> 128 channels, backward up to 16 -> 32):
-- forward, grad input, grad weight and grad bias against the same convolution in f64
-- (which runs im2col + GEMM), over the Fashion-MNIST CNN's and ResNet-20's shapes, then odd
-- sizes, borders, paddings, batch 1, odd widths, channel counts that are not multiples of
-- 4 or 8 and stride 2 over odd input sizes; the same bits for any thread count;
-- accumulation into existing gradients.
local dl = require "ddplua"

local seed = 100
local function randn(shape)
  seed = seed + 1
  return dl.randn(shape, { dtype = "f64", generator = dl.Generator(seed) })
end

-- max |a - b| over max(1, max |b|): f32 results against f64 references of any size, without
-- going through Lua tables.
local function rel_err(a, b)
  local d = (a:to("f64") - b):abs():max():item()
  local m = b:abs():max():item()
  return d / math.max(1, m)
end

local function assert_near(what, a, b, tol)
  local e = rel_err(a, b)
  assert(e <= tol, ("%s: relative error %.3g above %.3g"):format(what, e, tol))
end

local function bitwise_equal(what, a, b)
  assert((a - b):abs():max():item() == 0, what .. ": results differ between thread counts")
end

-- conv2d of x (N, C, H, W), w (O, C, kH, kW) and bias in dtype, with output gradient g;
-- returns out, dx (nil unless x_grad), dw, db (nil without bias).
local function run(dtype, x, w, b, g, opts, x_grad)
  local xx, ww = x:detach():to(dtype), w:detach():to(dtype)
  local bb = b and b:detach():to(dtype)
  if x_grad then xx:requires_grad_() end
  ww:requires_grad_()
  if bb then bb:requires_grad_() end
  local y = dl.conv2d(xx, ww, bb, opts)
  y:backward(g:to(dtype))
  return y:detach(), x_grad and xx.grad, ww.grad, bb and bb.grad
end

-- f32 (direct) against f64 (im2col + GEMM): forward and every gradient.
local function check_case(c)
  local x, w = randn(c.x), randn(c.w)
  local b = c.bias ~= false and randn({ c.w[1] }) or nil
  local x_grad = c.x_grad ~= false
  local y64 = dl.conv2d(x, w, b, c.o)
  local g = randn(y64:size())
  local r64 = { run("f64", x, w, b, g, c.o, x_grad) }
  local r32 = { run("f32", x, w, b, g, c.o, x_grad) }
  local name = ("x (%s), w (%s), %s"):format(table.concat(c.x, ", "), table.concat(c.w, ", "),
    c.label or "")
  assert.same(r64[1]:size(), r32[1]:size())
  assert.equal("f32", r32[1].dtype)
  local tol = 1e-5
  assert_near(name .. " forward", r32[1], r64[1], tol)
  if x_grad then assert_near(name .. " grad input", r32[2], r64[2], tol) end
  assert_near(name .. " grad weight", r32[3], r64[3], tol)
  if b then assert_near(name .. " grad bias", r32[4], r64[4], tol) end
end

describe("conv2d direct kernels (f32)", function()
  local threads
  before_each(function() threads = dl.get_num_threads() end)
  after_each(function() dl.set_num_threads(threads) end)

  it("match f64 at the CNN's and ResNet-20's shapes", function()
    for _, c in ipairs {
      -- Fashion-MNIST CNN, first layer: the input needs no gradient; then with one
      { x = { 64, 1, 28, 28 }, w = { 32, 1, 3, 3 }, o = { padding = 1 }, x_grad = false },
      { x = { 64, 1, 28, 28 }, w = { 32, 1, 3, 3 }, o = { padding = 1 } },
      -- ResNet-20's two downsampling convolutions (the second's backward is im2col's)
      { x = { 128, 16, 32, 32 }, w = { 32, 16, 3, 3 }, o = { padding = 1, stride = 2 },
        bias = false },
      { x = { 128, 32, 16, 16 }, w = { 64, 32, 3, 3 }, o = { padding = 1, stride = 2 },
        bias = false },
    } do
      check_case(c)
    end
  end)

  it("match f64 over odd sizes, borders, paddings, widths and channel counts", function()
    for _, c in ipairs {
      -- batch 1, widths below, at and above one vector of 8, output width not a multiple of 8
      { x = { 1, 1, 1, 1 }, w = { 1, 1, 3, 3 }, o = { padding = 1 } },
      { x = { 1, 1, 5, 3 }, w = { 3, 1, 3, 3 }, o = { padding = 1 } },
      { x = { 2, 1, 7, 8 }, w = { 5, 1, 3, 3 }, o = { padding = 1 } },
      { x = { 3, 1, 9, 17 }, w = { 7, 1, 3, 3 }, o = { padding = 1 } },
      { x = { 2, 1, 6, 25 }, w = { 9, 1, 3, 3 }, o = { padding = 1 } },
      -- no padding, more padding than the kernel reaches, padding in one direction only
      { x = { 2, 1, 10, 13 }, w = { 6, 1, 3, 3 }, o = {} },
      { x = { 2, 1, 6, 9 }, w = { 4, 1, 3, 3 }, o = { padding = 2 } },
      { x = { 2, 1, 8, 11 }, w = { 4, 1, 3, 3 }, o = { padding = { 1, 0 } } },
      { x = { 2, 1, 8, 11 }, w = { 4, 1, 3, 3 }, o = { padding = { 0, 2 } } },
      -- stride 2: odd and even input sizes, channel counts not multiples of 4 or 8
      { x = { 1, 5, 9, 11 }, w = { 9, 5, 3, 3 }, o = { padding = 1, stride = 2 } },
      { x = { 3, 7, 10, 7 }, w = { 6, 7, 3, 3 }, o = { padding = 1, stride = 2 } },
      { x = { 2, 3, 5, 6 }, w = { 5, 3, 3, 3 }, o = { stride = 2 } },
      { x = { 2, 9, 13, 13 }, w = { 11, 9, 3, 3 }, o = { padding = 2, stride = 2 } },
      { x = { 2, 6, 17, 35 }, w = { 13, 6, 3, 3 }, o = { padding = { 0, 1 }, stride = 2 } },
      { x = { 1, 1, 3, 3 }, w = { 1, 1, 3, 3 }, o = { padding = 1, stride = 2 } },
      { x = { 2, 12, 16, 16 }, w = { 20, 12, 3, 3 }, o = { padding = 1, stride = 2 } },
    } do
      check_case(c)
    end
  end)

  it("give the same bits for 1 and 2 threads, over chunks with a remainder", function()
    for _, c in ipairs {
      { x = { 37, 1, 28, 28 }, w = { 32, 1, 3, 3 }, o = { padding = 1 }, bias = true },
      { x = { 19, 1, 13, 30 }, w = { 5, 1, 3, 3 }, o = { padding = 1 } },
      { x = { 35, 16, 16, 16 }, w = { 32, 16, 3, 3 }, o = { padding = 1, stride = 2 },
        bias = true },
      { x = { 21, 16, 17, 15 }, w = { 12, 16, 3, 3 }, o = { padding = 1, stride = 2 } },
    } do
      local x, w = randn(c.x), randn(c.w)
      local b = c.bias and randn({ c.w[1] }) or nil
      local g = randn(dl.conv2d(x, w, b, c.o):size())
      local res = {}
      for _, t in ipairs { 1, 2 } do
        dl.set_num_threads(t)
        res[t] = { run("f32", x, w, b, g, c.o, true) }
      end
      for i, what in ipairs { "forward", "grad input", "grad weight", "grad bias" } do
        if res[1][i] then bitwise_equal(what, res[1][i], res[2][i]) end
      end
      assert_near("forward", res[2][1], dl.conv2d(x, w, b, c.o), 1e-5)
    end
  end)

  it("accumulate into existing gradients", function()
    for _, c in ipairs { { 1, { padding = 1 } }, { 4, { padding = 1, stride = 2 } } } do
      local o = c[2]
      local x = randn({ 3, c[1], 9, 10 }):to("f32")
      local w = randn({ 6, c[1], 3, 3 }):to("f32")
      local b = randn({ 6 }):to("f32")
      x:requires_grad_(); w:requires_grad_(); b:requires_grad_()
      local g = randn(dl.conv2d(x:detach(), w:detach(), b:detach(), o):size()):to("f32")
      dl.conv2d(x, w, b, o):backward(g)
      local once = { x.grad:clone(), w.grad:clone(), b.grad:clone() }
      dl.conv2d(x, w, b, o):backward(g)
      for i, t in ipairs { x, w, b } do
        assert_near("accumulated gradient " .. i, t.grad, (once[i] * 2):to("f64"), 1e-6)
      end
    end
  end)
end)
