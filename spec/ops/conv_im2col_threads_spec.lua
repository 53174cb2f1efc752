-- The im2col + GEMM convolution (runtime/backend/cpu/conv.c: f64, and f32 shapes that neither
-- Winograd nor the direct kernels take, e.g. ResNet-20's first layer and its 1x1 stride-2
-- shortcuts) gives the same bits for any thread count: its weight and bias gradients are
-- summed per fixed unit of samples and the units added in order (Note [im2col weight-gradient
-- units]), for batches below, at and above the unit count, groups, dilation, accumulation into
-- existing gradients; and the results stay those of the f64 convolution.
local dl = require "ddplua"

local seed = 300
local function randn(shape, dtype)
  seed = seed + 1
  return dl.randn(shape, { dtype = dtype or "f64", generator = dl.Generator(seed) })
end

-- forward, grad input, grad weight, grad bias of one conv2d (bias when b), the weight's and
-- bias's gradients accumulated onto `acc` when given.
local function run(x, w, b, g, opts, acc)
  local xx, ww = x:detach():requires_grad_(), w:detach():requires_grad_()
  local bb = b and b:detach():requires_grad_()
  if acc then
    ww.grad = acc:clone()
    if bb then bb.grad = dl.ones({ b:size()[1] }, { dtype = b.dtype }) end
  end
  local y = dl.conv2d(xx, ww, bb, opts)
  y:backward(g)
  return { y:detach(), xx.grad, ww.grad, bb and bb.grad }
end

local function same_bits(what, a, b)
  assert.same(a:size(), b:size())
  assert((a - b):abs():max():item() == 0, what .. ": the bits differ between thread counts")
end

describe("conv2d im2col path", function()
  local threads
  before_each(function() threads = dl.get_num_threads() end)
  after_each(function() dl.set_num_threads(threads) end)

  local cases = {
    { x = { 37, 3, 32, 32 }, w = { 16, 3, 3, 3 }, o = { padding = 1 }, bias = true, dtype = "f32" },
    { x = { 29, 16, 17, 17 }, w = { 32, 16, 1, 1 }, o = { stride = 2 }, bias = true, dtype = "f32" },
    { x = { 5, 4, 9, 11 }, w = { 6, 2, 3, 3 }, o = { padding = 1, groups = 2 }, bias = true, dtype = "f32" },
    { x = { 13, 3, 10, 10 }, w = { 5, 3, 3, 3 }, o = { padding = 2, dilation = 2 }, dtype = "f32" },
    { x = { 12, 8, 8, 8 }, w = { 8, 8, 3, 3 }, o = { padding = 1 }, bias = true, dtype = "f64" },
    { x = { 1, 3, 7, 7 }, w = { 4, 3, 3, 3 }, o = {}, bias = true, dtype = "f32" },
  }

  it("gives the same bits at 1, 2 and 3 threads, also when accumulating", function()
    for _, c in ipairs(cases) do
      local x, w = randn(c.x, c.dtype), randn(c.w, c.dtype)
      local b = c.bias and randn({ c.w[1] }, c.dtype) or nil
      local g = randn(dl.conv2d(x, w, b, c.o):size(), c.dtype)
      local acc = randn(c.w, c.dtype)
      for _, accumulate in ipairs { false, true } do
        local res = {}
        for _, t in ipairs { 1, 2, 3 } do
          dl.set_num_threads(t)
          res[t] = run(x, w, b, g, c.o, accumulate and acc or nil)
        end
        for t = 2, 3 do
          for i, what in ipairs { "forward", "grad input", "grad weight", "grad bias" } do
            if res[1][i] then
              same_bits(("x (%s) %s, %d threads%s"):format(table.concat(c.x, ", "), what, t,
                accumulate and ", accumulating" or ""), res[1][i], res[t][i])
            end
          end
        end
      end
    end
  end)

  it("matches the f64 convolution", function()
    for _, c in ipairs(cases) do
      if c.dtype == "f32" then
        local x, w = randn(c.x), randn(c.w)
        local b = c.bias and randn({ c.w[1] }) or nil
        local g = randn(dl.conv2d(x, w, b, c.o):size())
        local r64 = run(x, w, b, g, c.o)
        dl.set_num_threads(2)
        local r32 = run(x:to("f32"), w:to("f32"), b and b:to("f32"), g:to("f32"), c.o)
        for i, what in ipairs { "forward", "grad input", "grad weight", "grad bias" } do
          if r64[i] then
            local err = (r32[i]:to("f64") - r64[i]):abs():max():item() / math.max(1, r64[i]:abs():max():item())
            assert(err < 1e-5, ("x (%s) %s: relative error %.3g"):format(table.concat(c.x, ", "), what, err))
          end
        end
      end
    end
  end)
end)
