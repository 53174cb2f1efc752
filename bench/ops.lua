--- bench/ops.lua: engine-core benchmarks (issue 2). Prints a Markdown table and, with
-- --out FILE, writes it there.
--   matmul 1024^3 f32 against raw cblas_sgemm measured in the same run;
--   conv2d forward+backward at the Fashion-MNIST CNN's shapes (batch 64), and at the end
--   at ResNet-20's first and downsampling layers (batch 128);
--   element-wise ops on 16 MiB tensors against memcpy bandwidth measured in the same run;
--   the cost of one small op called from Lua (dispatch, tape, allocation, release) over
--   10^6 calls.
-- Run: build/ddplua bench/ops.lua [--threads N] [--out FILE]
--      build/ddplua bench/ops.lua --threads N --sgemm-only
-- --sgemm-only times raw cblas_sgemm 1024^3 alone (7 runs of 3 calls, after one) and prints
-- "sgemm_gflops=<median> sgemm_best_gflops=<fastest run> sgemm_cpu_gflops=<median by CPU
-- time> threads=<n> core=<OpenBLAS kernel set>": the FMA-peak reference of
-- bench/reference_table.sh (OPENBLAS_CORETYPE=Haswell picks OpenBLAS's AVX2 kernels). The
-- CPU-time rate (FLOP / the process's user + system seconds) counts only the time the
-- threads ran, so other processes on the machine barely move it; with --threads 1 it is
-- one core's rate.
local dl = require "ddplua"
local clock = require "ddplua.clock"
local ffi = require "ffi"

local threads, out_path, sgemm_only = nil, nil, false
for i = 1, #arg do
  if arg[i] == "--threads" then threads = tonumber(arg[i + 1]) end
  if arg[i] == "--out" then out_path = arg[i + 1] end
  if arg[i] == "--sgemm-only" then sgemm_only = true end
end
if threads then dl.set_num_threads(threads) end

-- OpenBLAS itself is the reference row of the matmul table (not libc: the C API has no
-- reason to re-export it). Copies use ffi.copy, LuaJIT's own memcpy.
pcall(ffi.cdef, [[
  void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
  char *openblas_get_corename(void);
]])
local blas = ffi.load("libopenblas.so.0")

if sgemm_only then
  local n = 1024
  local a, b, c = dl.randn { n, n }, dl.randn { n, n }, dl.zeros { n, n }
  local C = require("ddplua.lib").C
  local pa = ffi.cast("float*", C.ddp_tensor_data(a))
  local pb = ffi.cast("float*", C.ddp_tensor_data(b))
  local pc = ffi.cast("float*", C.ddp_tensor_data(c))
  local os_ = require "ddplua.os"
  local function cpu()
    local u = os_.resource_usage()
    return u.user_seconds + u.system_seconds
  end
  local times, cpu_times = {}, {}
  for r = 0, 7 do
    local t0, c0 = clock.now(), cpu()
    for _ = 1, 3 do blas.cblas_sgemm(101, 111, 111, n, n, n, 1, pa, n, pb, n, 0, pc, n) end
    if r > 0 then times[r], cpu_times[r] = (clock.now() - t0) / 3, (cpu() - c0) / 3 end
  end
  table.sort(times)
  table.sort(cpu_times)
  local ok, core = pcall(function() return ffi.string(blas.openblas_get_corename()) end)
  local flop = 2 * n ^ 3
  print(("sgemm_gflops=%.1f sgemm_best_gflops=%.1f sgemm_cpu_gflops=%.1f threads=%d core=%s"):format(
    flop / times[4] / 1e9, flop / times[1] / 1e9, flop / cpu_times[4] / 1e9, dl.get_num_threads(),
    ok and core or "?"))
  os.exit(0)
end

local rows = {}
local function row(name, value, unit, limit, limit_name)
  local ratio = limit and string.format("%.0f%%", 100 * value / limit) or ""
  rows[#rows + 1] = string.format("| %s | %.1f %s | %s | %s |", name, value, unit,
    limit and string.format("%.1f %s (%s)", limit, unit, limit_name) or "", ratio)
  io.stderr:write(rows[#rows], "\n")
end

-- matmul 1024^3 -----------------------------------------------------------------------
local n = 1024
local a, b = dl.randn { n, n }, dl.randn { n, n }
local c = dl.zeros { n, n }
local C = require("ddplua.lib").C
local pa = ffi.cast("float*", C.ddp_tensor_data(a))
local pb = ffi.cast("float*", C.ddp_tensor_data(b))
local pc = ffi.cast("float*", C.ddp_tensor_data(c))
local flops = 2 * n * n * n
local t_raw, t_mm = clock.paired_median_time(function()
  blas.cblas_sgemm(101, 111, 111, n, n, n, 1, pa, n, pb, n, 0, pc, n)
end, function() local _ = a:matmul(b) end, 3, 7)
local raw_gflops = flops / t_raw / 1e9
row("matmul 1024³ f32", flops / t_mm / 1e9, "GFLOP/s", raw_gflops, "raw cblas_sgemm")

-- conv2d forward + backward at the CNN's shapes --------------------------------------
local function conv_case(name, cin, cout, hw)
  local x = dl.randn { 64, cin, hw, hw }
  local w = dl.randn({ cout, cin, 3, 3 }, { requires_grad = true })
  local bias = dl.zeros({ cout }, { requires_grad = true })
  x:requires_grad_(cin > 1) -- the first layer's input needs no gradient
  local gout = dl.randn { 64, cout, hw, hw }
  local conv_flops = 3 * 2 * 64 * cout * cin * 9 * hw * hw -- forward + 2 backward GEMMs
  if cin == 1 then conv_flops = 2 * 2 * 64 * cout * cin * 9 * hw * hw end
  local t = clock.median_time(function()
    local y = dl.conv2d(x, w, bias, { padding = 1 })
    y:backward(gout)
    w.grad = nil
    bias.grad = nil
    if cin > 1 then x.grad = nil end
  end, 5, 5)
  row(name, conv_flops / t / 1e9, "GFLOP/s", raw_gflops, "raw cblas_sgemm 1024³")
  return t
end
conv_case("conv2d fwd+bwd 64×1×28×28 → 32, 3×3 pad 1", 1, 32, 28)
conv_case("conv2d fwd+bwd 64×32×14×14 → 64, 3×3 pad 1", 32, 64, 14)

-- element-wise on 16 MiB tensors -------------------------------------------------------
local m = 4 * 1024 * 1024 -- elements (16 MiB of f32)
local x, y = dl.randn { m }, dl.randn { m }
local dst = ffi.new("float[?]", m)
local px = ffi.cast("float*", C.ddp_tensor_data(x))
local t_copy = clock.median_time(function() ffi.copy(dst, px, m * 4) end, 10, 5)
local memcpy_gbs = 2 * m * 4 / t_copy / 1e9 -- read + write
local function ew(name, fn, streams)
  local t = clock.median_time(fn, 10, 5)
  row(name, streams * m * 4 / t / 1e9, "GB/s", memcpy_gbs, "memcpy, read+write")
end
ew("add (16 MiB f32)", function() local _ = x + y end, 3)
ew("mul (16 MiB f32)", function() local _ = x * y end, 3)
ew("relu (16 MiB f32)", function() local _ = x:relu() end, 2)
ew("exp (16 MiB f32)", function() local _ = x:exp() end, 2)
ew("add_ in place (16 MiB f32)", function() x:add_(y) end, 3)

-- one small op from Lua ----------------------------------------------------------------
-- t:add(u) and t + u (both JIT-compiled: Note [pointer plus number] in
-- lua/ddplua/ops/elementwise.lua keeps only a number operand out of the JIT), tape on and
-- off. Each call makes a handle, which the collector releases (Note [handle registry] and
-- Note [collector pacing] in lua/ddplua/lib.lua): that cost is in the figure.
-- bench/small_op_torch.py measures PyTorch's `a + b` the same way.
-- The 16 MiB memcpy buffer above lives in the Lua heap, which paces the collector (Note
-- [collector pacing]): dropped first, so these rows see the heap of a plain script.
dst, px = nil, nil
collectgarbage("collect")
local s1, s2 = dl.randn { 4 }, dl.randn({ 4 }, { requires_grad = true })
local calls = 1000000
local function small(name, fn)
  local t = clock.median_time(function() for _ = 1, calls do fn() end end, 1, 3) / calls
  rows[#rows + 1] = string.format("| small op from Lua: %s, 10⁶ calls | %.3f µs/call | target ≤ 0.5 µs with the tape on | |", name, t * 1e6)
  io.stderr:write(rows[#rows], "\n")
end
small("`a:add(b)` of (4,) tensors, tape on", function() local _ = s1:add(s2) end)
small("`a:add(b)` of (4,) tensors, no grad", function() local _ = s1:add(s1) end)
small("`a + b` of (4,) tensors, tape on", function() local _ = s1 + s2 end)
small("`a + b` of (4,) tensors, no grad", function() local _ = s1 + s1 end)

-- conv2d forward + backward at ResNet-20's first layer (batch 128, 3 -> 16 at 32x32, the
-- input needs no gradient; im2col + GEMM) and its two 3x3 stride-2 downsampling
-- convolutions (input gradient too; the direct kernels of runtime/backend/cpu/conv_direct.c
-- for the forwards and the first one's backward). FLOPs: 2 per multiply-add, forward + one
-- GEMM-equivalent per gradient.
local function conv_case_resnet(name, n, cin, cout, hw, stride, x_grad)
  local x = dl.randn { n, cin, hw, hw }
  local w = dl.randn({ cout, cin, 3, 3 }, { requires_grad = true })
  x:requires_grad_(x_grad)
  local o = { padding = 1, stride = stride }
  local ohw = math.floor((hw + 2 - 3) / stride) + 1
  local gout = dl.randn { n, cout, ohw, ohw }
  local passes = x_grad and 3 or 2
  local conv_flops = passes * 2 * n * cout * cin * 9 * ohw * ohw
  local t = clock.median_time(function()
    local y = dl.conv2d(x, w, nil, o)
    y:backward(gout)
    w.grad = nil
    if x_grad then x.grad = nil end
  end, 3, 5)
  row(name, conv_flops / t / 1e9, "GFLOP/s", raw_gflops, "raw cblas_sgemm 1024³")
end
conv_case_resnet("conv2d fwd+bwd 128×3×32×32 → 16, 3×3 pad 1", 128, 3, 16, 32, 1, false)
conv_case_resnet("conv2d fwd+bwd 128×16×32×32 → 32, 3×3 stride 2 pad 1", 128, 16, 32, 32, 2,
  true)
conv_case_resnet("conv2d fwd+bwd 128×32×16×16 → 64, 3×3 stride 2 pad 1", 128, 32, 64, 16, 2,
  true)

local header = {
  "| benchmark | ddplua | machine limit (same run) | ratio |",
  "|---|---|---|---|",
}
local text = table.concat(header, "\n") .. "\n" .. table.concat(rows, "\n") .. "\n"
if out_path then
  local f = assert(io.open(out_path, "w"))
  f:write(text)
  f:close()
end
print(text)
