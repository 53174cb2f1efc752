-- Specs for the runtime's fork-join pool (runtime/core/threads.c) and what splits over it
-- outside the kernel areas' own specs: large products cut into row or column blocks
-- (runtime/backend/cpu/gemm_parallel.c), large zero fills (ddp_device_memset), fills, and
-- pooling backward kernels that write all of d_input themselves (no zeros() first).
-- Each is run at 1 to 4 threads (more threads than this machine's cores is fine: the pool
-- does not care) and compared with a plain-Lua f64 reference, and with itself across thread
-- counts: bitwise where the kernel promises it (fixed-chunk sums), within rounding for
-- products (gemm_parallel.h says why the last bits may move).
local dl = require "ddplua"
local with_threads = require("threads").with_threads
local close = require "close"

local gen = dl.Generator(7)
local function randn(shape, dtype) return dl.randn(shape, { dtype = dtype or "f64", generator = gen }) end


-- a (m, k) @ b (k, n) in f64 Lua loops over :tolist() rows
local function ref_matmul(a, b)
  local A, B = a:to("f64"):tolist(), b:to("f64"):tolist()
  local m, k, n = #A, #B, #B[1]
  local out = {}
  for i = 1, m do
    local row, Ai = {}, A[i]
    for j = 1, n do
      local s = 0
      for p = 1, k do s = s + Ai[p] * B[p][j] end
      row[j] = s
    end
    out[i] = row
  end
  return out
end

describe("thread pool", function()
  describe("matmul split over the pool", function()
    -- (m, k, n): each above 2^18 multiply-adds so that 2+ threads split it; n >= m splits
    -- c's columns, m > n its rows; sizes not multiples of the 16-wide blocks
    local shapes = { { 37, 61, 150 }, { 150, 61, 37 }, { 64, 500, 128 }, { 17, 1000, 33 } }

    it("matches an f64 reference at 1 to 4 threads, plain and transposed operands", function()
      for _, s in ipairs(shapes) do
        local m, k, n = s[1], s[2], s[3]
        local a, b = randn({ m, k }), randn({ k, n })
        local at, bt = randn({ k, m }), randn({ n, k }) -- stored transposed: trans flags
        local expected = ref_matmul(a, b)
        local expected_t = ref_matmul(at:t(), bt:t())
        for threads = 1, 4 do
          with_threads(threads, function()
            close.assert_close(dl.matmul(a, b), expected, { atol = 1e-10, rtol = 1e-10 })
            close.assert_close(dl.matmul(at:t(), bt:t()), expected_t, { atol = 1e-10, rtol = 1e-10 })
            close.assert_close(dl.matmul(a:to("f32"), b:to("f32")), expected, { atol = 1e-3, rtol = 1e-4 })
            close.assert_close(dl.matmul(at:t():to("f32"), bt:t():to("f32")), expected_t,
              { atol = 1e-3, rtol = 1e-4 })
          end)
        end
      end
    end)

    it("gives a linear layer's forward and both gradients alike at 1 and 2 threads", function()
      local x, w, b = randn({ 64, 700 }), randn({ 96, 700 }), randn({ 96 })
      local g = randn({ 64, 96 })
      local res = {}
      for threads = 1, 2 do
        res[threads] = with_threads(threads, function()
          local xx, ww = x:to("f32"), w:to("f32")
          xx:requires_grad_(); ww:requires_grad_()
          local y = dl.linear(xx, ww, b:to("f32"))
          y:backward(g:to("f32"))
          return { y, xx.grad, ww.grad }
        end)
      end
      local ref_y = ref_matmul(x, w:t())
      for i = 1, 64 do for j = 1, 96 do ref_y[i][j] = ref_y[i][j] + b:tolist()[j] end end
      close.assert_close(res[1][1], ref_y, { atol = 1e-3, rtol = 1e-4 })
      close.assert_close(res[1][2], ref_matmul(g, w), { atol = 1e-3, rtol = 1e-4 })
      close.assert_close(res[1][3], ref_matmul(g:t(), x), { atol = 1e-3, rtol = 1e-4 })
      for i = 1, 3 do close.assert_close(res[2][i], res[1][i], { atol = 1e-4, rtol = 1e-5 }) end
    end)
  end)

  describe("jobs", function()
    it("give the same bits for fixed-chunk sums whatever the thread count, small and large jobs interleaved", function()
      -- with 4 threads a small job needs 2 of the 3 workers and a large one all of them:
      -- the third worker skips some jobs and must pick up the next one it is needed for
      local small, large = randn({ 3, 70000 }, "f32"), randn({ 600000 }, "f32")
      local want = with_threads(1, function()
        return { small:sum(2):tolist(), large:sum():item(), large:softmax(1):sum():item() }
      end)
      for _, threads in ipairs { 2, 3, 4, 2, 4 } do
        with_threads(threads, function()
          for _ = 1, 20 do
            assert.same(want[1], small:sum(2):tolist())
            assert.equal(want[2], large:sum():item())
            assert.equal(want[3], large:softmax(1):sum():item())
          end
        end)
      end
    end)

    it("run inline when one thread is set, and pick up again after the count grows", function()
      local t = randn({ 500, 500 })
      local want = with_threads(1, function() return (t * 2 + 1):sum():item() end)
      for _, threads in ipairs { 4, 1, 2, 1, 3 } do
        assert.equal(want, with_threads(threads, function() return (t * 2 + 1):sum():item() end))
      end
    end)
  end)

  describe("fills", function()
    it("zero large tensors fully at 1 to 3 threads (the pool's memset)", function()
      for threads = 1, 3 do
        with_threads(threads, function()
          for _, numel in ipairs { 262144 + 7, 1000003 } do -- about 1 and 4 MiB of f32
            local z = dl.zeros({ numel })
            assert.equal(0, z:abs():max():item())
            local o = dl.ones({ numel }, { dtype = "f64" })
            o:zero_()
            assert.equal(0, o:abs():max():item())
          end
        end)
      end
    end)

    it("fill every dtype, contiguous and strided, with zero, -0.0 and other values", function()
      for threads = 1, 2 do
        with_threads(threads, function()
          for _, dtype in ipairs { "f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool" } do
            for _, v in ipairs { 0, 1, 3 } do
              local want = dtype == "bool" and (v ~= 0 and 1 or 0) or v
              local c = dl.zeros({ 300, 700 }, { dtype = dtype }):fill_(v)
              local s = dl.ones({ 700, 300 }, { dtype = dtype }):t():fill_(v) -- strided view
              for _, t in ipairs { c, s } do
                local f = t:to("f64")
                assert.equal(want, f:min():item())
                assert.equal(want, f:max():item())
              end
            end
          end
          local negz = dl.ones({ 300, 700 }):t():fill_(-0.0)
          assert.equal(-math.huge, 1 / negz:min():item())
          assert.equal(-math.huge, 1 / dl.ones({ 300, 700 }):fill_(-0.0):max():item())
        end)
      end
    end)
  end)

  describe("pooling backward", function()
    -- Freed blocks of the size d_input will take, filled with NaN, so that a cell the
    -- kernel fails to write shows (the allocator hands recycled blocks back).
    local function poison(shape, dtype)
      for _ = 1, 4 do
        local t = dl.zeros(shape, { dtype = dtype }):fill_(0 / 0)
        t = nil
      end
      collectgarbage()
      collectgarbage()
    end

    -- x.grad of sum(pool(x) * g) for x of shape (N, C, H, W), by its definition: windows
    -- of (oh, ow) listed by window(oh, ow) -> {{ih, iw, weight}, ...} (1-based cells)
    local function ref_grad(shape, g, window)
      local N, C, H, W = shape[1], shape[2], shape[3], shape[4]
      local G = g:to("f64"):tolist()
      local out = {}
      for n = 1, N do
        out[n] = {}
        for c = 1, C do
          local plane = {}
          for ih = 1, H do plane[ih] = {} for iw = 1, W do plane[ih][iw] = 0 end end
          local gp = G[n][c]
          for oh = 1, #gp do
            for ow = 1, #gp[1] do
              for _, cell in ipairs(window(n, c, oh, ow)) do
                plane[cell[1]][cell[2]] = plane[cell[1]][cell[2]] + gp[oh][ow] * cell[3]
              end
            end
          end
          out[n][c] = plane
        end
      end
      return out
    end

    it("max writes every cell (2x2 with odd sizes, dilated and 3x3 windows) at 1 and 2 threads", function()
      for _, c in ipairs {
        { shape = { 3, 5, 7, 9 }, opts = {} },                      -- 2x2, odd H and W: uncovered cells
        { shape = { 2, 3, 8, 8 }, opts = {} },
        { shape = { 2, 3, 9, 9 }, opts = { dilation = 2 } },        -- windows overlap
        { shape = { 2, 2, 7, 7 }, opts = { kernel = 3, stride = 2 } },
      } do
        local x = randn(c.shape)
        for threads = 1, 2 do
          for _, dtype in ipairs { "f64", "f32" } do
            with_threads(threads, function()
              local xx = x:detach():to(dtype)
              xx:requires_grad_()
              local opts = { return_indices = true, dilation = c.opts.dilation, stride = c.opts.stride }
              local out, idx = dl.max_pool2d(xx, c.opts.kernel or 2, opts)
              local g = randn(out:size()):to(dtype)
              poison(c.shape, dtype)
              out:backward(g)
              local I = idx:tolist()
              local W = c.shape[4]
              local want = ref_grad(c.shape, g, function(n, ch, oh, ow)
                local flat = I[n][ch][oh][ow]
                return { { math.floor(flat / W) + 1, flat % W + 1, 1 } }
              end)
              close.assert_close(xx.grad, want, { atol = 0 })
            end)
          end
        end
      end
    end)

    it("average and adaptive average write every cell at 1 and 2 threads", function()
      local shape = { 2, 3, 7, 9 }
      local x = randn(shape)
      for threads = 1, 2 do
        with_threads(threads, function()
          -- avg_pool2d kernel 3 stride 2, no padding: each window 3x3, weight 1/9
          local xx = x:detach()
          xx:requires_grad_()
          local out = dl.avg_pool2d(xx, 3, { stride = 2 })
          local g = randn(out:size())
          poison(shape, "f64")
          out:backward(g)
          close.assert_close(xx.grad, ref_grad(shape, g, function(_, _, oh, ow)
            local cells = {}
            for i = 0, 2 do for j = 0, 2 do cells[#cells + 1] = { 2 * (oh - 1) + i + 1, 2 * (ow - 1) + j + 1, 1 / 9 } end end
            return cells
          end), { atol = 1e-12 })
          -- adaptive to (3, 4): PyTorch's windows [floor(i in / out), ceil((i + 1) in / out))
          xx = x:detach()
          xx:requires_grad_()
          out = dl.adaptive_avg_pool2d(xx, { 3, 4 })
          g = randn(out:size())
          poison(shape, "f64")
          out:backward(g)
          close.assert_close(xx.grad, ref_grad(shape, g, function(_, _, oh, ow)
            local hs, he = math.floor((oh - 1) * 7 / 3), math.ceil(oh * 7 / 3)
            local ws, we = math.floor((ow - 1) * 9 / 4), math.ceil(ow * 9 / 4)
            local cells = {}
            for i = hs, he - 1 do for j = ws, we - 1 do cells[#cells + 1] = { i + 1, j + 1, 1 / ((he - hs) * (we - ws)) } end end
            return cells
          end), { atol = 1e-12 })
        end)
      end
    end)
  end)
end)
