-- A single product of a training step's size is split over the thread pool by columns (or
-- rows) of the result, each block one single-threaded GEMM (Note [small GEMM split] in
-- runtime/ops/matmul.c): the result is bitwise the one-thread product, and close to the
-- product in f64, for the MLP's shapes, odd sizes, transposed operands and the row split;
-- linear's forward and both gradients are bitwise the same with 1 and 2 threads.
local dl = require "ddplua"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local function bits_differ(a, b)
  assert.same(a:size(), b:size())
  a, b = a:contiguous(), b:contiguous()
  local pa = ffi.cast("const uint32_t *", C.ddp_tensor_data(a))
  local pb = ffi.cast("const uint32_t *", C.ddp_tensor_data(b))
  local n = 0
  for i = 0, a:numel() - 1 do
    if pa[i] ~= pb[i] then n = n + 1 end
  end
  return n
end

-- max |got - want| / (sum_k |a_ik b_kj|) over the result: the rounding error relative to the
-- size of the terms (f32 GEMM: a few k * 2^-24 at most).
local function relative_error(got, a, b)
  local want = dl.matmul(a:to("f64"), b:to("f64"))
  local scale = dl.matmul(a:to("f64"):abs(), b:to("f64"):abs())
  return ((got:to("f64") - want):abs() / (scale + 1e-30)):max():item()
end

local function with_threads(n, fn)
  local before = dl.get_num_threads()
  dl.set_num_threads(n)
  local ok, a, b, c, d = pcall(fn)
  dl.set_num_threads(before)
  assert(ok, a)
  return a, b, c, d
end

describe("small GEMM split over the thread pool", function()
  -- (n, k, m): the MLP's forward, backward-data and weight-gradient products, odd sizes,
  -- more rows than columns (row split), and one below the split's lower bound
  local shapes = { { 64, 784, 256 }, { 64, 256, 128 }, { 256, 64, 784 }, { 128, 64, 256 }, { 64, 128, 256 },
    { 65, 783, 257 }, { 33, 100, 97 }, { 257, 300, 40 }, { 1000, 64, 33 }, { 64, 128, 10 } }
  for _, sh in ipairs(shapes) do
    local n, k, m = sh[1], sh[2], sh[3]
    it(("multiplies %dx%d by %dx%d bitwise as one thread does, in every layout"):format(n, k, k, m), function()
      local g = dl.Generator(n * 1000 + m)
      local a, b = dl.randn({ n, k }, { generator = g }), dl.randn({ k, m }, { generator = g })
      local at, bt = dl.randn({ k, n }, { generator = g }), dl.randn({ m, k }, { generator = g })
      for _, ops in ipairs { { a, b }, { a, bt:t() }, { at:t(), b }, { at:t(), bt:t() } } do
        local one = with_threads(1, function() return dl.matmul(ops[1], ops[2]) end)
        local two = with_threads(2, function() return dl.matmul(ops[1], ops[2]) end)
        assert.are.equal(0, bits_differ(one, two))
        assert.is_true(relative_error(two, ops[1], ops[2]) < k * 2 ^ -23)
      end
    end)
  end

  it("gives linear's output and gradients bitwise equal with 1 and 2 threads", function()
    local g = dl.Generator(3)
    local x0 = dl.randn({ 64, 784 }, { generator = g })
    local w0, b0 = dl.randn({ 256, 784 }, { generator = g }) * 0.05, dl.randn({ 256 }, { generator = g })
    local gy = dl.randn({ 64, 256 }, { generator = g })
    local function run()
      local x, w, b = x0:clone():requires_grad_(), w0:clone():requires_grad_(), b0:clone():requires_grad_()
      local y = dl.linear(x, w, b)
      y:backward(gy)
      return y:detach(), x.grad, w.grad, b.grad
    end
    local r1 = { with_threads(1, run) }
    local r2 = { with_threads(2, run) }
    for i = 1, 4 do assert.are.equal(0, bits_differ(r1[i], r2[i])) end
  end)
end)
