-- With more than one thread, a single product of a training step's size is cut in two by
-- columns (or rows) of the result, each half one single-threaded GEMM on the thread pool
-- (Note [small GEMM split] in runtime/ops/matmul.c): with 2 and 3 threads the result is
-- bitwise the two halves as one thread computes them, and with any thread count close to
-- the product in f64, for the MLP's shapes, odd sizes, transposed operands and the row
-- split; linear's output and gradients agree between 1 and 2 threads to rounding.
local dl = require "ddplua"
local with_threads = require("threads").with_threads

local bits_differ = require("close").count_bit_differences

-- max |got - want| / (sum_k |a_ik b_kj|) over the result: the rounding error relative to the
-- size of the terms (f32 GEMM: a few k * 2^-24 at most).
local function relative_error(got, a, b)
  local want = dl.matmul(a:to("f64"), b:to("f64"))
  local scale = dl.matmul(a:to("f64"):abs(), b:to("f64"):abs())
  return ((got:to("f64") - want):abs() / (scale + 1e-30)):max():item()
end


describe("small GEMM split over the thread pool", function()
  -- (n, k, m): the MLP's forward, backward-data and weight-gradient products, odd sizes,
  -- more rows than columns (row split), and one below the split's lower bound
  local shapes = { { 64, 784, 256 }, { 64, 256, 128 }, { 256, 64, 784 }, { 128, 64, 256 }, { 64, 128, 256 },
    { 65, 783, 257 }, { 33, 100, 97 }, { 257, 300, 40 }, { 1000, 64, 33 }, { 64, 128, 10 } }
  -- where part 1 starts: half the size rounded up to 32 (split_at in matmul.c)
  local function split_at(size) return math.ceil(math.ceil(size / 2) / 32) * 32 end
  -- which dimension is cut (split_by_cols in matmul.c): the one with the more equal parts,
  -- the larger one on a tie, never one of 32 or less
  local function by_cols(rows, cols)
    if cols <= 32 then return false end
    if rows <= 32 then return true end
    local ic = math.abs(2 * split_at(cols) - cols) / cols
    local ir = math.abs(2 * split_at(rows) - rows) / rows
    if ic ~= ir then return ic < ir end
    return cols >= rows
  end
  local MIN_MNK, MAX_MNK = 256 * 1024, 16 * 1024 * 1024

  for _, sh in ipairs(shapes) do
    local n, k, m = sh[1], sh[2], sh[3]
    it(("multiplies %dx%d by %dx%d as two one-thread halves, in every layout"):format(n, k, k, m), function()
      local g = dl.Generator(n * 1000 + m)
      local a, b = dl.randn({ n, k }, { generator = g }), dl.randn({ k, m }, { generator = g })
      local at, bt = dl.randn({ k, n }, { generator = g }), dl.randn({ m, k }, { generator = g })
      local split = n * k * m >= MIN_MNK and n * k * m <= MAX_MNK
      for _, ops in ipairs { { a, b }, { a, bt:t() }, { at:t(), b }, { at:t(), bt:t() } } do
        local x, y = ops[1], ops[2]
        local one = with_threads(1, function() return dl.matmul(x, y) end)
        local two = with_threads(2, function() return dl.matmul(x, y) end)
        local three = with_threads(3, function() return dl.matmul(x, y) end)
        -- the reference: the two halves, each one GEMM on one thread (below the bounds: the whole)
        local want = one
        if split then
          want = with_threads(1, function()
            if by_cols(n, m) then
              local h = split_at(m)
              return dl.cat({ dl.matmul(x, y:narrow(2, 1, h)), dl.matmul(x, y:narrow(2, h + 1, m - h)) }, 2)
            end
            local h = split_at(n)
            return dl.cat({ dl.matmul(x:narrow(1, 1, h), y), dl.matmul(x:narrow(1, h + 1, n - h), y) }, 1)
          end)
        end
        assert.are.equal(0, bits_differ(two, want))
        assert.are.equal(0, bits_differ(three, two))
        assert.is_true(relative_error(one, x, y) < k * 2 ^ -23)
        assert.is_true(relative_error(two, x, y) < k * 2 ^ -23)
      end
    end)
  end

  it("gives linear's output and gradients with 2 threads equal to 1 thread's to rounding", function()
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
    for i = 1, 4 do
      local scale = r1[i]:abs():max():item()
      assert.is_true((r1[i] - r2[i]):abs():max():item() <= 784 * 2 ^ -23 * scale, "result " .. i)
    end
  end)
end)
