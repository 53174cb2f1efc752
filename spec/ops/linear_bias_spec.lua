-- linear's bias goes into the GEMM's C (the bias rows, then C += x Wᵀ with beta = 1; Note
-- [bias in C] in runtime/ops/matmul.c): the output agrees with an f64 reference to f32
-- rounding for the MLP's shapes, odd sizes, K above OpenBLAS's K block, batched and 1-d
-- inputs, with 1 and 2 threads; for a K of one block it is bitwise the old order (product,
-- then the bias added); K = 0 gives the bias; gradients are unchanged (finite differences in
-- f64).
local dl = require "ddplua"
local with_threads = require("threads").with_threads

local bits_differ = require("close").count_bit_differences
local gradcheck = require("gradcheck").gradcheck


-- max |got - want| / (sum_k |x_ik w_jk| + |b_j|): the rounding error relative to the size of
-- the terms.
local function relative_error(got, x, w, b)
  local x64, w64, b64 = x:to("f64"), w:to("f64"), b:to("f64")
  local want = dl.matmul(x64, w64:t()) + b64
  local scale = dl.matmul(x64:abs(), w64:abs():t()) + b64:abs()
  return ((got:to("f64") - want):abs() / (scale + 1e-30)):max():item()
end

describe("linear with the bias in the GEMM's C", function()
  -- (rows, in, out): the MLP's layers, odd sizes, K of several OpenBLAS blocks
  local shapes = { { 64, 784, 256 }, { 64, 256, 128 }, { 64, 128, 10 }, { 7, 3, 5 }, { 65, 1000, 33 },
    { 1, 2049, 3 }, { 300, 17, 1 } }
  for _, sh in ipairs(shapes) do
    local rows, in_f, out_f = sh[1], sh[2], sh[3]
    it(("matches the f64 reference for (%d, %d) x (%d, %d)ᵀ + b, 1 and 2 threads, f32 and f64"):format(
      rows, in_f, out_f, in_f), function()
      local g = dl.Generator(rows * 7 + in_f)
      for _, dtype in ipairs { "f32", "f64" } do
        local x = dl.randn({ rows, in_f }, { generator = g, dtype = dtype })
        local w = dl.randn({ out_f, in_f }, { generator = g, dtype = dtype })
        local b = dl.randn({ out_f }, { generator = g, dtype = dtype }) * 10
        local eps = dtype == "f32" and 2 ^ -24 or 2 ^ -53
        for _, threads in ipairs { 1, 2 } do
          local y = with_threads(threads, function() return dl.linear(x, w, b) end)
          assert.are.same({ rows, out_f }, y:size())
          assert.is_true(relative_error(y, x, w, b) <= (in_f + 1) * 2 * eps,
            ("%s threads %d: relative error %g"):format(dtype, threads, relative_error(y, x, w, b)))
        end
      end
    end)
  end

  it("is bitwise the product plus the bias for K of one block", function()
    local g = dl.Generator(5)
    for _, sh in ipairs { { 64, 64, 256 }, { 64, 128, 10 }, { 9, 33, 7 } } do
      local x = dl.randn({ sh[1], sh[2] }, { generator = g })
      local w = dl.randn({ sh[3], sh[2] }, { generator = g })
      local b = dl.randn({ sh[3] }, { generator = g })
      local y = with_threads(1, function() return dl.linear(x, w, b) end)
      local old = with_threads(1, function() return dl.matmul(x, w:t()) + b end)
      assert.are.equal(0, bits_differ(y, old))
    end
  end)

  it("keeps the batch dimensions and takes 1-d inputs and strided biases", function()
    local g = dl.Generator(6)
    local x = dl.randn({ 2, 3, 40 }, { generator = g })
    local w = dl.randn({ 6, 40 }, { generator = g })
    local b2 = dl.randn({ 6, 2 }, { generator = g })
    local b = b2:select(2, 1) -- stride 2
    local y = dl.linear(x, w, b)
    assert.are.same({ 2, 3, 6 }, y:size())
    assert.is_true(relative_error(y:reshape({ 6, 6 }), x:reshape({ 6, 40 }), w, b) <= 41 * 2 * 2 ^ -24)
    local v = dl.randn({ 40 }, { generator = g })
    local y1 = dl.linear(v, w, b)
    assert.are.same({ 6 }, y1:size())
    assert.is_true(relative_error(y1:reshape({ 1, 6 }), v:reshape({ 1, 40 }), w, b) <= 41 * 2 * 2 ^ -24)
  end)

  it("gives the bias for zero input features, and empty outputs for zero rows", function()
    local b = dl.tensor { 1, 2, 3 }
    local y = dl.linear(dl.empty({ 4, 0 }), dl.empty({ 3, 0 }), b)
    assert.are.same({ { 1, 2, 3 }, { 1, 2, 3 }, { 1, 2, 3 }, { 1, 2, 3 } }, y:tolist())
    assert.are.same({ 0, 3 }, dl.linear(dl.empty({ 0, 5 }), dl.ones({ 3, 5 }), b):size())
  end)

  it("records no history on the bias through the copy and gives finite-difference gradients", function()
    local g = dl.Generator(8)
    local x = dl.randn({ 5, 4 }, { generator = g, dtype = "f64" }):requires_grad_()
    local w = dl.randn({ 3, 4 }, { generator = g, dtype = "f64" }):requires_grad_()
    local b = dl.randn({ 3 }, { generator = g, dtype = "f64" }):requires_grad_()
    local gy = dl.randn({ 5, 3 }, { generator = g, dtype = "f64" })
    local y = dl.linear(x, w, b)
    assert.are.equal("LinearBackward", y.grad_fn)
    y:backward(gy)
    assert.is_nil(b.grad_fn)
    local x2, w2, b2 = x:detach():clone(), w:detach():clone(), b:detach():clone()
    assert.is_true(gradcheck(function(xx, ww, bb) return dl.linear(xx, ww, bb) end, { x2, w2, b2 }))
  end)
end)
