--- bench/gpu_gemm.lua: square matrix product throughput (TFLOP/s) of dl.matmul on one GPU,
-- ddplua's side of the comparison with torch.matmul (bench/gpu_gemm_torch.py; bench/run_gpu.sh
-- alternates the two and takes medians).
--
--   build/ddplua bench/gpu_gemm.lua [--sizes 1024,2048,4096,8192] [--modes f32,tf32,f16,bf16]
--       [--device cuda:0] [--trials 5] [--trial-ms 50]
--   build/ddplua bench/gpu_gemm.lua --dry     # n = 64 on the CPU: proves the script runs
--
-- Modes: f32 (TF32 off: full f32 products), tf32 (f32 tensors, TF32 tensor cores allowed),
-- f16, bf16. C = A · B, all n × n, A and B random normal (never zeros: zeros run faster than
-- real data on these chips). Inputs rotate among several sets when one set is small enough to
-- sit in L2 (up to 8 sets, about 200 MB in all), so the time is not the cache's.
-- Timing: 3 warm-up products, then `trials` trials of k back-to-back products each (k chosen
-- so a trial lasts about trial-ms), each trial bracketed by device synchronisations and read
-- with a host clock; the median trial gives time per product; TFLOP/s = 2 n^3 / time. Each
-- product's output is freed at once (back to the caching allocator, stream-ordered), as
-- PyTorch's refcounting does.
-- Correctness, per mode, at the smallest size: ||C - C_ref|| / ||C_ref|| with C_ref computed in
-- f64 on the CPU from the same (rounded) inputs: about 1e-6 for f32, 1e-4..1e-3 for tf32 (which
-- also shows whether the TF32 switch works), 1e-3 for f16, 1e-2 for bf16.
--
-- Prints one line per (mode, size):
--   framework=ddplua mode=f32 n=1024 ms=... tflops=... rel_err=...
local G = require "bench.gpu_common"
local dl = require "ddplua"
local clock = require "ddplua.clock"

local ok_args, opts = pcall(G.parse_args, arg or {}, {
  sizes = "1024,2048,4096,8192", modes = "f32,tf32,f16,bf16", device = "cuda:0", trials = 5, trial_ms = 50,
})
if not ok_args then
  io.stderr:write("gpu_gemm: " .. tostring(opts) .. "\n")
  os.exit(2)
end
local function list(s)
  local out = {}
  for v in tostring(s):gmatch("[^,]+") do out[#out + 1] = tonumber(v) or v end
  return out
end
local sizes, modes, dev = list(opts.sizes), list(opts.modes), opts.device
if opts.dry then sizes, dev, opts.trials, opts.trial_ms = { 64 }, "cpu", 2, 5 end

local function fail(msg)
  io.stderr:write("gpu_gemm: " .. msg .. "\n")
  os.exit(1)
end
if dev ~= "cpu" then
  local ok, why = G.cuda_available()
  if not ok then fail("no CUDA device: " .. tostring(why)) end
  if G.backend_name() == "cuda-sim" and not opts.allow_sim then
    fail("the CUDA plug-in is the simulated device (cuda-sim): no GPU timing to take (--allow-sim runs anyway)")
  end
end

local DTYPE = { f32 = "f32", tf32 = "f32", f16 = "f16", bf16 = "bf16" }
local ELEM = { f32 = 4, f16 = 2, bf16 = 2 } -- bytes per element

local function measure(mode, n, check)
  local dtype = DTYPE[mode]
  if not dtype then error("unknown mode " .. tostring(mode) .. " (f32, tf32, f16, bf16)") end
  if dev ~= "cpu" then G.set_tf32(mode == "tf32") end
  local set_bytes = 3 * n * n * ELEM[dtype]
  local nsets = math.max(1, math.min(8, math.floor(200e6 / set_bytes)))
  local gen = dl.Generator(n)
  local As, Bs = {}, {}
  for s = 1, nsets do
    As[s] = G.to(dl.randn({ n, n }, { generator = gen }):to(dtype), dev)
    Bs[s] = G.to(dl.randn({ n, n }, { generator = gen }):to(dtype), dev)
  end
  local rel = -1
  if check then
    local c = G.cpu(dl.matmul(As[1], Bs[1])):to("f64")
    local ref = dl.matmul(G.cpu(As[1]):to("f64"), G.cpu(Bs[1]):to("f64"))
    rel = c:sub(ref):norm():item() / ref:norm():item()
  end
  local s = 0
  local function product()
    s = s % nsets + 1
    dl.matmul(As[s], Bs[s]):free()
  end
  for _ = 1, 3 do product() end
  G.synchronize(dev)
  -- products per trial from one timed product (at least 1, at most 10 000)
  local t0 = clock.now()
  product()
  G.synchronize(dev)
  local one = math.max(clock.now() - t0, 1e-6)
  local k = math.max(1, math.min(10000, math.floor(opts.trial_ms / 1e3 / one)))
  local times = {}
  for t = 1, opts.trials do
    G.synchronize(dev)
    local a = clock.now()
    for _ = 1, k do product() end
    G.synchronize(dev)
    times[t] = (clock.now() - a) / k
  end
  local sec = G.median(times)
  for i = 1, nsets do As[i]:free(); Bs[i]:free() end
  return sec, rel
end

local ok, err = pcall(function()
  for _, mode in ipairs(modes) do
    for i, n in ipairs(sizes) do
      local sec, rel = measure(mode, n, i == 1)
      print(("framework=ddplua mode=%s n=%d ms=%.4f tflops=%.2f rel_err=%s"):format(mode, n, sec * 1e3,
        2 * n ^ 3 / sec / 1e12, rel >= 0 and ("%.2e"):format(rel) or "-"))
      io.stdout:flush()
    end
  end
end)
if dev ~= "cpu" then G.set_tf32(false) end
if not ok then fail(tostring(err)) end
