-- spec/cuda/parity_spec.lua (#cuda): every op's forward AND backward on a CUDA device
-- against the CPU on the same random inputs, for f32, f64, f16 and bf16 (where the CPU has
-- the op in that dtype), then optimizer steps and a few training steps of the CNN and a
-- small ResNet-20 batch.
--
-- How it compares (METHOD.md of the device notes): each input is drawn on the CPU from a
-- generator seeded per case, copied to the device, and the op runs on both; outputs and the
-- gradients of every floating input (backward from a random output gradient) are compared
-- by ||device - cpu|| / ||cpu|| in f64, against a bound per dtype (TOL below): f64 1e-10,
-- f32 1e-5 (TF32 is switched off for the run), f16 1e-2, bf16 5e-2. A result over its
-- bound still passes when it is no further from the f64 reference (the case run in f64 on
-- the CPU from the same rounded inputs) than twice the CPU's own distance plus 4 units of
-- rounding of the dtype: the CPU's rounding, not the device's, is then what differs (a
-- serial f16 sum on the CPU, say). Integer and bool outputs (argmax, comparisons, pooling
-- indices, i64/i32 arithmetic) must be equal. NaN and infinities must sit at the same
-- places. Every output must be on the device its inputs were on. Inputs to max-like ops
-- (max, argmax, max_pool, maximum) hold distinct values (exact in bf16), so a tie cannot
-- make two correct kernels disagree. Not covered: ops drawing random numbers (dropout,
-- rand*), whose streams differ by device by design.
--
-- When it runs:
--   * a real GPU: dl.cuda.is_available() and the plug-in is not the simulated device:
--       busted -o spec/helpers/ci_output.lua spec/cuda/parity_spec.lua   (bench/run_gpu.sh)
--   * DDPLUA_PARITY_SIM=1: against the simulated device (build/libddplua_cuda_sim.so, set as
--     DDPLUA_CUDA_PLUGIN when not set), which runs the CPU kernels, so the bound is 0: the
--     results must be bitwise equal. This checks the spec itself and the device paths of
--     the ops layer on a machine without a GPU. Run this file alone (the plug-in is probed
--     once per process):  DDPLUA_PARITY_SIM=1 busted spec/cuda/parity_spec.lua
--     Where the ops layer or the core takes another route for device tensors than for CPU
--     ones (ddp_sum_to_shape sums broadcast gradients with the sum op on devices and
--     serially on the CPU; some backward formulas are composed of ops on devices), results
--     differ by rounding even on the simulated device: such a result passes by the f64
--     reference rule below, and the file lists them on stderr at the end ("not bitwise
--     equal"); DDPLUA_PARITY_EXACT=1 makes them fail instead.
--   * otherwise (CI, `make test`): one pending test saying why.
-- DDPLUA_PARITY_DEVICE picks the device (default cuda:0). DDPLUA_PARITY_ONLY=<lua pattern>
-- keeps the cases whose name matches.
local dl = require "ddplua"
local lib = require "ddplua.lib"
local G = require "bench.gpu_common"
local ffi, C = lib.ffi, lib.C

local SIM = os.getenv("DDPLUA_PARITY_SIM") == "1"
if SIM and not os.getenv("DDPLUA_CUDA_PLUGIN") then
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  local build = lib.lib_path:match("^(.*)/[^/]*$") or "build"
  ffi.C.setenv("DDPLUA_CUDA_PLUGIN", build .. "/libddplua_cuda_sim.so", 1)
end

local available, why = G.cuda_available()
local backend = available and G.backend_name() or ""
local skip
if SIM then
  if not available or backend ~= "cuda-sim" then
    describe("cuda parity #cuda", function()
      it("runs against the simulated device (DDPLUA_PARITY_SIM=1)", function()
        error(("DDPLUA_PARITY_SIM=1 but the simulated device is not loaded (available: %s, "
          .. "backend '%s', %s); run this file alone, after `make`, with "
          .. "DDPLUA_CUDA_PLUGIN=build/libddplua_cuda_sim.so"):format(tostring(available), backend,
          tostring(why)))
      end)
    end)
    return
  end
elseif not available then
  skip = "no GPU here (" .. tostring(why) .. "); runs on a CUDA machine (bench/run_gpu.sh), "
    .. "or against the simulated device with DDPLUA_PARITY_SIM=1"
elseif backend == "cuda-sim" then
  skip = "the CUDA plug-in is the simulated device; set DDPLUA_PARITY_SIM=1 to check against it"
end
if skip then
  describe("cuda parity #cuda", function() pending(skip) end)
  return
end

local DEV = os.getenv("DDPLUA_PARITY_DEVICE") or "cuda:0"
local DEV_INDEX = G.device_index(DEV)
local ONLY = os.getenv("DDPLUA_PARITY_ONLY")
local TOL = SIM and { f64 = 0, f32 = 0, f16 = 0, bf16 = 0 }
  or { f64 = 1e-10, f32 = 1e-5, f16 = 1e-2, bf16 = 5e-2 }
local FLOATS = { "f32", "f64", "f16", "bf16" }
local LOW = { f16 = true, bf16 = true }

-- ---- inputs ----------------------------------------------------------------------------
-- An input spec is a table {kind, shape, ...}; make_input turns it into a CPU tensor.
--   R: standard normal             P: uniform in [0.5, 2] (log, sqrt, divisors)
--   Q: small integers -3 .. 3 as floats (ties for eq/ne, exact zeros for relu/abs at 0)
--   D: distinct values: a random permutation of 0 .. m-1, minus m/2, over 8, in every
--      block of the trailing dimensions after the first (m <= 256: exact in bf16), plus
--      `offset`; for max-like ops
--   I: i64 integers in [lo, hi)      B: bool, true with probability 1/2
--   T: a fixed tensor from a Lua table (i64 unless `dtype`)
-- nograd = true keeps a floating input out of backward (running stats).
local function R(shape) return { kind = "R", shape = shape } end
local function P(shape) return { kind = "P", shape = shape } end
local function Q(shape) return { kind = "Q", shape = shape } end
local function D(shape, offset) return { kind = "D", shape = shape, offset = offset or 0 } end
local function I(shape, lo, hi) return { kind = "I", shape = shape, lo = lo, hi = hi } end
local function B(shape) return { kind = "B", shape = shape } end
local function T(data, dtype) return { kind = "T", data = data, dtype = dtype } end
local function nograd(spec) spec.nograd = true; return spec end

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- A small LCG for the permutations of D (independent of the library's generators).
local function lcg(seed)
  local s = seed
  return function(n)
    s = (s * 1103515245 + 12345) % 2147483648
    return s % n
  end
end

local function make_input(spec, dtype, gen, seed)
  local k = spec.kind
  if k == "R" then return dl.randn(spec.shape, { dtype = "f64", generator = gen }):to(dtype) end
  if k == "P" then
    return dl.rand(spec.shape, { dtype = "f64", generator = gen }):mul(1.5):add(0.5):to(dtype)
  end
  if k == "Q" then
    return dl.randint(-3, 4, spec.shape, { generator = gen }):to(dtype)
  end
  if k == "D" then
    local shape = spec.shape
    local block = numel(shape) / shape[1]
    assert(block <= 256, "D inputs: blocks of at most 256 values (exact in bf16)")
    local rnd, vals = lcg(seed), {}
    for b = 0, shape[1] - 1 do
      local perm = {}
      for i = 1, block do perm[i] = i - 1 end
      for i = block, 2, -1 do
        local j = rnd(i) + 1
        perm[i], perm[j] = perm[j], perm[i]
      end
      for i = 1, block do vals[b * block + i] = (perm[i] - block / 2) / 8 + spec.offset end
    end
    return dl.tensor(vals, { dtype = "f64" }):view(shape):to(dtype)
  end
  if k == "I" then return dl.randint(spec.lo, spec.hi, spec.shape, { generator = gen }) end
  if k == "B" then return dl.rand(spec.shape, { generator = gen }):lt(0.5) end
  if k == "T" then return dl.tensor(spec.data, { dtype = spec.dtype or "i64" }) end
  error("unknown input kind " .. tostring(k))
end

-- ---- the cases -------------------------------------------------------------------------
-- {name, inputs = {specs}, fn = function(inputs...) -> output(s)}; options:
--   dtypes (default FLOATS): the floating dtypes of the R/P/Q/D inputs
--   grad = false: forward only (integer outputs)
--   tol_scale: multiplies the dtype's bound (long reductions in f16/bf16)
local cases = {}
local function case(c) cases[#cases + 1] = c end

-- element-wise unary ops, on a contiguous input and on a transposed view
for _, name in ipairs { "neg", "exp", "abs", "relu", "tanh", "sigmoid", "silu" } do
  case { name = name, inputs = { R { 7, 13 } }, fn = function(x) return x[name](x) end }
  case { name = name .. "/transposed", inputs = { R { 13, 7 } }, fn = function(x) return x:t()[name](x:t()) end }
end
for _, name in ipairs { "log", "sqrt", "rsqrt" } do
  case { name = name, inputs = { P { 7, 13 } }, fn = function(x) return x[name](x) end }
end
case { name = "relu/at zero", inputs = { Q { 9, 11 } }, fn = function(x) return x:relu() end }
case { name = "abs/at zero", inputs = { Q { 9, 11 } }, fn = function(x) return x:abs() end }
case { name = "leaky_relu", inputs = { R { 6, 10 } }, fn = function(x) return x:leaky_relu(0.2) end }
case { name = "gelu", inputs = { R { 6, 10 } }, fn = function(x) return x:gelu() end }
case { name = "gelu/tanh", inputs = { R { 6, 10 } }, fn = function(x) return x:gelu { approximate = "tanh" } end }
case { name = "clamp", inputs = { R { 6, 10 } }, fn = function(x) return x:clamp(-0.5, 0.7) end }
case { name = "clamp/min only", inputs = { R { 6, 10 } }, fn = function(x) return x:clamp(-0.5) end }
case { name = "neg/large", inputs = { R { 1024, 257 } }, fn = function(x) return x:neg() end }
case { name = "log/negative gives NaN", inputs = { R { 6, 9 } }, fn = function(x) return x:log() end }
case { name = "exp/overflow gives inf", inputs = { R { 6, 9 } }, fn = function(x) return x:mul(60):exp() end }

-- element-wise binary ops: same shape, broadcast, views, scalars
case { name = "add", inputs = { R { 5, 6 }, R { 5, 6 } }, fn = function(a, b) return a:add(b) end }
case { name = "add/broadcast", inputs = { R { 4, 1, 5 }, R { 3, 1 } }, fn = function(a, b) return a:add(b) end }
case { name = "add/alpha", inputs = { R { 5, 6 }, R { 6 } }, fn = function(a, b) return a:add(b, { alpha = -2.5 }) end }
case { name = "add/transposed", inputs = { R { 6, 5 }, R { 5, 6 } }, fn = function(a, b) return a:t():add(b) end }
case { name = "add/scalar", inputs = { R { 5, 6 } }, fn = function(a) return a:add(2.5) end }
case { name = "sub", inputs = { R { 5, 6 }, R { 1, 6 } }, fn = function(a, b) return a:sub(b) end }
case { name = "sub/scalar left", inputs = { R { 5, 6 } }, fn = function(a) return dl.sub(2, a) end }
case { name = "mul", inputs = { R { 3, 4, 5 }, R { 4, 1 } }, fn = function(a, b) return a:mul(b) end }
case { name = "mul/scalar", inputs = { R { 5, 6 } }, fn = function(a) return a:mul(-3) end }
case { name = "div", inputs = { R { 5, 6 }, P { 5, 6 } }, fn = function(a, b) return a:div(b) end }
case { name = "div/broadcast", inputs = { R { 2, 5, 6 }, P { 6 } }, fn = function(a, b) return a:div(b) end }
case { name = "div/scalar left", inputs = { P { 5, 6 } }, fn = function(a) return dl.div(1, a) end }
case { name = "pow", inputs = { P { 5, 6 }, R { 5, 6 } }, fn = function(a, b) return a:pow(b) end }
case { name = "pow/scalar", inputs = { R { 5, 6 } }, fn = function(a) return a:pow(2) end }
case { name = "pow/sqrt", inputs = { P { 5, 6 } }, fn = function(a) return a:pow(0.5) end }
case { name = "pow/scalar base", inputs = { R { 5, 6 } }, fn = function(a) return dl.pow(2, a) end }
case { name = "maximum", inputs = { D { 4, 9 }, D({ 4, 9 }, 1 / 16) }, fn = function(a, b) return dl.maximum(a, b) end }
case { name = "minimum", inputs = { D { 4, 9 }, D({ 4, 9 }, 1 / 16) }, fn = function(a, b) return dl.minimum(a, b) end }
case { name = "maximum/broadcast", inputs = { D { 4, 9 }, D({ 1, 9 }, 1 / 16) }, fn = function(a, b) return dl.maximum(a, b) end }

-- comparisons and where
for _, name in ipairs { "eq", "ne", "lt", "le", "gt", "ge" } do
  case { name = name, inputs = { Q { 6, 7 }, Q { 6, 7 } }, grad = false, fn = function(a, b) return a[name](a, b) end }
  case { name = name .. "/scalar", inputs = { Q { 6, 7 } }, grad = false, fn = function(a) return a[name](a, 1) end }
  case { name = name .. "/broadcast", inputs = { Q { 6, 1 }, Q { 7 } }, grad = false, fn = function(a, b) return a[name](a, b) end }
end
case { name = "where", inputs = { B { 5, 6 }, R { 5, 6 }, R { 5, 6 } }, fn = function(c, a, b) return dl.where(c, a, b) end }
case { name = "where/broadcast", inputs = { B { 5, 1 }, R { 6 }, R { 5, 6 } }, fn = function(c, a, b) return dl.where(c, a, b) end }
case { name = "where/scalar", inputs = { B { 5, 6 }, R { 5, 6 } }, fn = function(c, a) return dl.where(c, a, 0) end }

-- reductions, softmax
case { name = "sum/all", inputs = { R { 13, 17 } }, fn = function(x) return x:sum() end }
case { name = "sum/dim", inputs = { R { 4, 5, 6 } }, fn = function(x) return x:sum(2) end }
case { name = "sum/dims keepdim", inputs = { R { 4, 5, 6 } }, fn = function(x) return x:sum({ 1, 3 }, { keepdim = true }) end }
case { name = "sum/transposed", inputs = { R { 6, 9 } }, fn = function(x) return x:t():sum(2) end }
case { name = "sum/large", inputs = { R { 300, 1000 } }, tol_scale = 4, fn = function(x) return x:sum(2) end }
case { name = "sum/all large", inputs = { R { 1000, 300 } }, tol_scale = 4, fn = function(x) return x:sum() end }
case { name = "sum/many rows", inputs = { R { 70000, 3 } }, fn = function(x) return x:sum(2) end }
case { name = "sum/many columns", inputs = { R { 3, 70000 } }, tol_scale = 4, fn = function(x) return x:sum(1) end }
case { name = "mean/all", inputs = { R { 13, 17 } }, fn = function(x) return x:mean() end }
case { name = "mean/dim", inputs = { R { 4, 5, 6 } }, fn = function(x) return x:mean(-1) end }
case { name = "mean/dims", inputs = { R { 4, 5, 6 } }, fn = function(x) return x:mean({ 1, 2 }) end }
case { name = "var/dim", inputs = { R { 4, 50 } }, fn = function(x) return x:var(2) end }
case { name = "var/biased all", inputs = { R { 4, 50 } }, fn = function(x) return x:var({ unbiased = false }) end }
case { name = "std/dim", inputs = { R { 6, 30 } }, fn = function(x) return x:std(1) end }
case { name = "norm/2", inputs = { R { 6, 30 } }, fn = function(x) return x:norm() end }
case { name = "norm/1 dim", inputs = { R { 6, 30 } }, fn = function(x) return x:norm(1, { dim = 2 }) end }
case { name = "max/all", inputs = { D { 1, 200 } }, fn = function(x) return x:max() end }
case { name = "max/dim", inputs = { D { 5, 7, 9 } }, fn = function(x) return x:max(2) end }
case { name = "max/last dim keepdim", inputs = { D { 5, 7, 9 } }, fn = function(x) return x:max(-1, { keepdim = true }) end }
case { name = "min/dim", inputs = { D { 5, 7, 9 } }, fn = function(x) return x:min(3) end }
case { name = "argmax/dim", inputs = { D { 5, 7, 9 } }, grad = false, fn = function(x) return x:argmax(2) end }
case { name = "argmax/all", inputs = { D { 1, 200 } }, grad = false, fn = function(x) return x:argmax() end }
case { name = "argmin/dim", inputs = { D { 5, 7, 9 } }, grad = false, fn = function(x) return x:argmin(-1) end }
case { name = "softmax/last", inputs = { R { 6, 11 } }, fn = function(x) return x:softmax(-1) end }
case { name = "softmax/first", inputs = { R { 6, 11 } }, fn = function(x) return x:softmax(1) end }
case { name = "softmax/middle", inputs = { R { 3, 5, 7 } }, fn = function(x) return x:softmax(2) end }
case { name = "softmax/many rows", inputs = { R { 70000, 4 } }, fn = function(x) return x:softmax(2) end }
case { name = "argmax/many rows", inputs = { D { 70000, 3 } }, grad = false, fn = function(x) return x:argmax(2) end }
case { name = "softmax/wide", inputs = { R { 4, 3000 } }, fn = function(x) return x:mul(4):softmax(2) end }
case { name = "log_softmax/last", inputs = { R { 6, 11 } }, fn = function(x) return x:log_softmax(-1) end }
case { name = "log_softmax/middle", inputs = { R { 3, 5, 7 } }, fn = function(x) return x:log_softmax(2) end }

-- matrix products (sizes off multiples of 8 on purpose; views for the transposed cases)
case { name = "matmul", inputs = { R { 33, 17 }, R { 17, 29 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "matmul/long K", inputs = { R { 16, 2048 }, R { 2048, 8 } }, tol_scale = 4, fn = function(a, b) return a:matmul(b) end }
case { name = "matmul/large", inputs = { R { 128, 96 }, R { 96, 80 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "matmul/a transposed", inputs = { R { 17, 33 }, R { 17, 29 } }, fn = function(a, b) return a:t():matmul(b) end }
case { name = "matmul/b transposed", inputs = { R { 33, 17 }, R { 29, 17 } }, fn = function(a, b) return a:matmul(b:t()) end }
case { name = "matmul/both transposed", inputs = { R { 17, 33 }, R { 29, 17 } }, fn = function(a, b) return a:t():matmul(b:t()) end }
case { name = "matmul/vector", inputs = { R { 12, 7 }, R { 7 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "matmul/vector left", inputs = { R { 7 }, R { 7, 12 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "matmul/dot", inputs = { R { 31 }, R { 31 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "matmul/batched broadcast", inputs = { R { 2, 1, 9, 5 }, R { 3, 5, 6 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "bmm", inputs = { R { 4, 9, 5 }, R { 4, 5, 6 } }, fn = function(a, b) return a:bmm(b) end }
case { name = "bmm/transposed", inputs = { R { 4, 5, 9 }, R { 4, 6, 5 } },
  fn = function(a, b) return a:transpose(2, 3):bmm(b:transpose(2, 3)) end }
case { name = "linear", inputs = { R { 10, 7 }, R { 5, 7 }, R { 5 } }, fn = function(x, w, b) return dl.linear(x, w, b) end }
case { name = "linear/3d no bias", inputs = { R { 2, 10, 7 }, R { 5, 7 } }, fn = function(x, w) return dl.linear(x, w) end }

-- convolution
case { name = "conv2d", inputs = { R { 2, 3, 9, 11 }, R { 4, 3, 3, 3 }, R { 4 } },
  fn = function(x, w, b) return dl.conv2d(x, w, b) end }
case { name = "conv2d/stride padding", inputs = { R { 2, 3, 9, 11 }, R { 4, 3, 3, 3 }, R { 4 } },
  fn = function(x, w, b) return dl.conv2d(x, w, b, { stride = 2, padding = 1 }) end }
case { name = "conv2d/asymmetric", inputs = { R { 2, 3, 9, 11 }, R { 5, 3, 3, 2 } },
  fn = function(x, w) return dl.conv2d(x, w, { stride = { 1, 2 }, padding = { 2, 0 } }) end }
case { name = "conv2d/dilation", inputs = { R { 2, 3, 11, 11 }, R { 4, 3, 3, 3 }, R { 4 } },
  fn = function(x, w, b) return dl.conv2d(x, w, b, { dilation = 2, padding = 2 }) end }
case { name = "conv2d/groups", inputs = { R { 2, 4, 8, 8 }, R { 6, 2, 3, 3 }, R { 6 } },
  fn = function(x, w, b) return dl.conv2d(x, w, b, { groups = 2, padding = 1 }) end }
case { name = "conv2d/depthwise", inputs = { R { 2, 4, 8, 8 }, R { 4, 1, 3, 3 } },
  fn = function(x, w) return dl.conv2d(x, w, { groups = 4, padding = 1 }) end }
case { name = "conv2d/1x1 stride 2", inputs = { R { 2, 6, 8, 8 }, R { 5, 6, 1, 1 } },
  fn = function(x, w) return dl.conv2d(x, w, { stride = 2 }) end }
case { name = "conv2d/unbatched", inputs = { R { 3, 7, 7 }, R { 2, 3, 3, 3 }, R { 2 } },
  fn = function(x, w, b) return dl.conv2d(x, w, b, { padding = 1 }) end }
case { name = "conv2d/resnet-like", inputs = { R { 4, 16, 16, 16 }, R { 32, 16, 3, 3 } }, tol_scale = 2,
  fn = function(x, w) return dl.conv2d(x, w, { stride = 2, padding = 1 }) end }

-- pooling
case { name = "max_pool2d", inputs = { D { 2, 3, 8, 8 } }, fn = function(x) return dl.max_pool2d(x, 2) end }
case { name = "max_pool2d/indices", inputs = { D { 2, 3, 8, 8 } },
  fn = function(x) return dl.max_pool2d(x, 2, { return_indices = true }) end }
case { name = "max_pool2d/stride padding", inputs = { D { 2, 3, 9, 9 } },
  fn = function(x) return dl.max_pool2d(x, 3, { stride = 2, padding = 1 }) end }
case { name = "max_pool2d/ceil dilation", inputs = { D { 2, 2, 11, 10 } },
  fn = function(x) return dl.max_pool2d(x, 2, { stride = 2, dilation = 2, ceil_mode = true }) end }
case { name = "avg_pool2d", inputs = { R { 2, 3, 8, 8 } }, fn = function(x) return dl.avg_pool2d(x, 2) end }
case { name = "avg_pool2d/padding exclude", inputs = { R { 2, 3, 9, 9 } },
  fn = function(x) return dl.avg_pool2d(x, 3, { stride = 2, padding = 1, count_include_pad = false }) end }
case { name = "avg_pool2d/ceil", inputs = { R { 2, 3, 9, 10 } },
  fn = function(x) return dl.avg_pool2d(x, 2, { ceil_mode = true }) end }
case { name = "adaptive_avg_pool2d", inputs = { R { 2, 3, 7, 9 } }, fn = function(x) return dl.adaptive_avg_pool2d(x, { 3, 4 }) end }
case { name = "adaptive_avg_pool2d/global", inputs = { R { 2, 5, 8, 8 } }, fn = function(x) return dl.adaptive_avg_pool2d(x, 1) end }

-- losses
case { name = "cross_entropy", inputs = { R { 8, 5 }, I({ 8 }, 0, 5) }, fn = function(x, t) return dl.cross_entropy(x, t) end }
case { name = "cross_entropy/sum", inputs = { R { 8, 5 }, I({ 8 }, 0, 5) },
  fn = function(x, t) return dl.cross_entropy(x, t, { reduction = "sum" }) end }
case { name = "cross_entropy/none", inputs = { R { 8, 5 }, I({ 8 }, 0, 5) },
  fn = function(x, t) return dl.cross_entropy(x, t, { reduction = "none" }) end }
case { name = "cross_entropy/weight ignore smoothing", inputs = { R { 6, 4 }, T { 0, 3, -100, 1, 2, 3 }, P { 4 } },
  fn = function(x, t, w) return dl.cross_entropy(x, t, { weight = w, label_smoothing = 0.1 }) end }
case { name = "cross_entropy/spatial", inputs = { R { 3, 5, 4, 2 }, I({ 3, 4, 2 }, 0, 5) },
  fn = function(x, t) return dl.cross_entropy(x, t) end }
case { name = "cross_entropy/probabilities", inputs = { R { 6, 5 }, nograd(R { 6, 5 }) },
  fn = function(x, p) return dl.cross_entropy(x, p:softmax(2)) end }
case { name = "cross_entropy/many classes", inputs = { R { 16, 1000 }, I({ 16 }, 0, 1000) },
  fn = function(x, t) return dl.cross_entropy(x, t) end }
case { name = "nll_loss", inputs = { R { 8, 5 }, I({ 8 }, 0, 5) },
  fn = function(x, t) return dl.nll_loss(x:log_softmax(2), t) end }
case { name = "nll_loss/weight ignore", inputs = { R { 6, 4 }, T { 0, 3, -100, 1, 2, 3 }, P { 4 } },
  fn = function(x, t, w) return dl.nll_loss(x, t, { weight = w }) end }
case { name = "mse_loss", inputs = { R { 7, 6 }, R { 7, 6 } }, fn = function(a, b) return dl.mse_loss(a, b) end }
case { name = "mse_loss/broadcast sum", inputs = { R { 7, 6 }, R { 6 } },
  fn = function(a, b) return dl.mse_loss(a, b, { reduction = "sum" }) end }
case { name = "mse_loss/none", inputs = { R { 7, 6 }, R { 7, 6 } },
  fn = function(a, b) return dl.mse_loss(a, b, { reduction = "none" }) end }

-- normalisation, embedding
case { name = "batch_norm/train 4d", inputs = { R { 4, 3, 5, 5 }, nograd(R { 3 }), nograd(P { 3 }), R { 3 }, R { 3 } },
  fn = function(x, rm, rv, w, b)
    return dl.batch_norm(x, rm, rv, { weight = w, bias = b, training = true, momentum = 0.2 }), rm, rv
  end }
case { name = "batch_norm/train 2d no affine", inputs = { R { 16, 6 } },
  fn = function(x) return dl.batch_norm(x, nil, nil, { training = true }) end }
case { name = "batch_norm/eval", inputs = { R { 4, 3, 5, 5 }, nograd(R { 3 }), nograd(P { 3 }), R { 3 }, R { 3 } },
  fn = function(x, rm, rv, w, b) return dl.batch_norm(x, rm, rv, { weight = w, bias = b }) end }
case { name = "layer_norm", inputs = { R { 4, 6, 10 }, R { 10 }, R { 10 } },
  fn = function(x, w, b) return dl.layer_norm(x, { 10 }, { weight = w, bias = b }) end }
case { name = "layer_norm/2 dims no affine", inputs = { R { 4, 6, 10 } },
  fn = function(x) return dl.layer_norm(x, { 6, 10 }) end }
case { name = "embedding", inputs = { I({ 4, 5 }, 0, 10), R { 10, 6 } },
  fn = function(i, w) return dl.embedding(i, w) end }
case { name = "embedding/padding_idx", inputs = { I({ 4, 5 }, 0, 10), R { 10, 6 } },
  fn = function(i, w) return dl.embedding(i, w, { padding_idx = 2 }) end }

-- indexing and joining
case { name = "index_select", inputs = { R { 5, 6 }, I({ 7 }, 0, 5) }, fn = function(x, i) return x:index_select(1, i) end }
case { name = "index_select/dim 2", inputs = { R { 5, 6, 3 }, I({ 4 }, 0, 6) }, fn = function(x, i) return x:index_select(2, i) end }
case { name = "gather", inputs = { R { 4, 5 }, I({ 4, 3 }, 0, 5) }, fn = function(x, i) return x:gather(2, i) end }
case { name = "gather/dim 1", inputs = { R { 4, 5 }, I({ 6, 5 }, 0, 4) }, fn = function(x, i) return x:gather(1, i) end }
case { name = "scatter_add", inputs = { R { 4, 5 }, I({ 4, 3 }, 0, 5), R { 4, 3 } },
  fn = function(x, i, s) return x:scatter_add(2, i, s) end }
case { name = "scatter_add/many duplicates", inputs = { R { 3, 4 }, I({ 200, 4 }, 0, 3), R { 200, 4 } },
  fn = function(x, i, s) return x:scatter_add(1, i, s) end }
case { name = "cat", inputs = { R { 3, 2, 4 }, R { 3, 5, 4 }, R { 3, 1, 4 } },
  fn = function(a, b, c) return dl.cat({ a, b, c }, 2) end }
case { name = "cat/dim 1 transposed", inputs = { R { 4, 3 }, R { 2, 3 } }, fn = function(a, b) return dl.cat({ a:t():t(), b }, 1) end }
case { name = "stack", inputs = { R { 3, 4 }, R { 3, 4 } }, fn = function(a, b) return dl.stack({ a, b }, 2) end }
case { name = "contiguous/permuted", inputs = { R { 3, 4, 5 } }, fn = function(x) return x:permute(3, 1, 2):contiguous() end }
case { name = "contiguous/expanded", inputs = { R { 3, 1, 5 } }, fn = function(x) return x:expand(3, 4, 5):contiguous() end }
case { name = "narrow select", inputs = { R { 6, 7 } }, fn = function(x) return x:narrow(2, 2, 4):select(1, 3):mul(2) end }

-- integer dtypes (exact; no backward)
local INTS = { "i64", "i32" }
case { name = "add/int", dtypes = INTS, grad = false, inputs = { Q { 5, 6 }, Q { 6 } }, fn = function(a, b) return a:add(b) end }
case { name = "mul/int", dtypes = INTS, grad = false, inputs = { Q { 5, 6 }, Q { 5, 6 } }, fn = function(a, b) return a:mul(b) end }
case { name = "sum/int", dtypes = INTS, grad = false, inputs = { Q { 5, 6 } }, fn = function(a) return a:sum(2) end }
case { name = "matmul/int", dtypes = INTS, grad = false, inputs = { Q { 9, 7 }, Q { 7, 5 } }, fn = function(a, b) return a:matmul(b) end }
case { name = "gt/int", dtypes = INTS, grad = false, inputs = { Q { 5, 6 }, Q { 5, 6 } }, fn = function(a, b) return a:gt(b) end }

-- ---- comparison ------------------------------------------------------------------------

local function shape_str(t) return "(" .. table.concat(t:size(), ", ") .. ")" end

-- ||a - b|| / ||b|| of two CPU tensors of one shape, in f64, NaN and infinities masked
-- (the caller checked they sit at the same places); ||a - b|| when b is all zeros. Also
-- returns ||a - b||, ||b||, the largest |a - b| and its flat index.
local function rel_err(a, b)
  a, b = a:to("f64"), b:to("f64")
  a, b = dl.where(a:ne(a), 0, a), dl.where(b:ne(b), 0, b)
  a, b = dl.where(a:abs():eq(math.huge), 0, a), dl.where(b:abs():eq(math.huge), 0, b)
  local diff = a:sub(b)
  local err, ref = diff:norm():item(), b:norm():item()
  local maxabs, idx = diff:abs():flatten():max(1)
  return ref > 0 and err / ref or err, err, ref, maxabs:item(), idx:item()
end

-- Unit roundoff of each floating dtype (half the distance from 1 to the next number).
local UNIT = { f64 = 2 ^ -53, f32 = 2 ^ -24, f16 = 2 ^ -11, bf16 = 2 ^ -8 }

-- Raise unless device tensor `got` matches CPU tensor `want` (see the top of the file)
-- within `tol`. `ref` (optional): a function returning the same result computed in f64 on
-- the CPU from the same (rounded) inputs; when the direct comparison fails, the device
-- passes if it is no further from that reference than 2 x the CPU's own distance + 4 units
-- of rounding. Returns nil when within tol, else the relative error it passed with (by the
-- reference rule).
local function compare(what, got, want, tol, ref)
  if got == nil or want == nil then
    if got ~= want then
      error(("%s: %s on the device, %s on the CPU"):format(what, got == nil and "nil" or "a tensor",
        want == nil and "nil" or "a tensor"), 0)
    end
    return
  end
  local gd = C.ddp_tensor_device(got)
  if gd ~= DEV_INDEX then
    error(("%s: the result is on %s, expected %s"):format(what, gd < 0 and "cpu" or ("cuda:" .. gd), DEV), 0)
  end
  got = G.cpu(got)
  if got:type() ~= want:type() then
    error(("%s: dtype %s on the device, %s on the CPU"):format(what, got:type(), want:type()), 0)
  end
  if shape_str(got) ~= shape_str(want) then
    error(("%s: shape %s on the device, %s on the CPU"):format(what, shape_str(got), shape_str(want)), 0)
  end
  if got:numel() == 0 then return end
  local a, b = got:to("f64"), want:to("f64")
  if not got:is_floating_point() then
    local bad = a:ne(b):sum():item()
    if bad > 0 then
      error(("%s: %d of %d values differ (integer/bool output must be equal)"):format(what, bad, got:numel()), 0)
    end
    return
  end
  -- NaN and infinities must sit at the same places with the same signs.
  local na, nb = a:ne(a), b:ne(b)
  local nan_bad = na:ne(nb):sum():item()
  if nan_bad > 0 then error(("%s: NaN at %d places on one side only"):format(what, nan_bad), 0) end
  local ia, ib = a:abs():eq(math.huge), b:abs():eq(math.huge)
  local inf_bad = ia:ne(ib):sum():item() + dl.where(ia, a, 0):ne(dl.where(ib, b, 0)):sum():item()
  if inf_bad > 0 then error(("%s: infinities differ at %d places"):format(what, inf_bad), 0) end
  local rel, err, norm, maxabs, idx = rel_err(a, b)
  if (tol == 0 and err == 0) or (tol > 0 and rel <= tol) then return end
  local detail = ""
  if ref then
    local r = ref()
    if r then
      local e_dev, e_cpu = rel_err(a, r), rel_err(b, r)
      if e_dev <= 2 * e_cpu + 4 * UNIT[want:type()] then return rel end
      detail = (", and %.3g from the f64 reference where the CPU is %.3g"):format(e_dev, e_cpu)
    end
  end
  error(("%s: relative error %.3g > bound %.3g (|diff| %.3g, |cpu| %.3g, largest difference %.3g at "
    .. "flat index %d of %s%s)"):format(what, rel, tol, err, norm, maxabs, idx, shape_str(want), detail), 0)
end

local function as_list(...)
  return { n = select("#", ...), ... }
end

-- Run case c in dtype on the CPU or the device (`dev` nil: CPU). Returns the outputs (a
-- list) and, when backward ran, the gradients of the inputs (false for those without).
-- upcast: draw the inputs (and the output gradient) in dtype, then run in f64 on the CPU
-- (the reference for low precisions).
local function run_case(c, dtype, dev, seed, upcast)
  local gen = dl.Generator(seed)
  local inputs, leaves = {}, {}
  for i, spec in ipairs(c.inputs) do
    local t = make_input(spec, dtype, gen, seed * 131 + i)
    if upcast and t:is_floating_point() then t = t:to("f64") end
    if dev then t = G.to(t, dev) end
    local wants_grad = c.grad ~= false and not spec.nograd and t:is_floating_point()
    if wants_grad then t:requires_grad_(true) end
    inputs[i], leaves[i] = t, wants_grad
  end
  local outs = as_list(c.fn(unpack(inputs, 1, #c.inputs)))
  local grads
  if c.grad ~= false then
    local y = outs[1]
    -- the output gradient: random, drawn on the CPU from its own generator
    local gy = dl.randn(y:size(), { dtype = "f64", generator = dl.Generator(seed + 7777) }):to(dtype)
    gy = gy:to(y:type())
    if dev then gy = G.to(gy, dev) end
    y:backward(gy)
    grads = {}
    for i = 1, #c.inputs do grads[i] = leaves[i] and inputs[i].grad or false end
  end
  return outs, grads
end

-- Results that passed only by the reference rule on the simulated device (reported at
-- the end: they show where the device path is not the CPU's).
local inexact = {}
local EXACT = os.getenv("DDPLUA_PARITY_EXACT") == "1"

local function check_case(c, dtype, seed, label)
  local tol = (TOL[dtype] or 0) * (c.tol_scale or 1)
  local want, want_grads = run_case(c, dtype, nil, seed)
  local got, got_grads = run_case(c, dtype, DEV, seed)
  -- the f64 reference, computed when a comparison needs it
  local ref_outs, ref_grads
  local function reference()
    if ref_outs == nil then ref_outs, ref_grads = run_case(c, dtype, nil, seed, true) end
  end
  local function note(what, rel)
    if rel == nil then return end
    if EXACT then error(("%s: not bitwise equal on the simulated device (relative error %.3g)"):format(what, rel), 0) end
    inexact[#inexact + 1] = ("%s: %s (relative error %.3g)"):format(label, what, rel)
  end
  if got.n ~= want.n then error(("%d outputs on the device, %d on the CPU"):format(got.n, want.n), 0) end
  for k = 1, want.n do
    local w, g = want[k], got[k]
    if dl.is_tensor(w) then
      local what = ("output %d"):format(k)
      note(what, compare(what, g, w, tol, w:is_floating_point() and function()
        reference()
        return ref_outs[k]
      end))
    elseif g ~= w then
      error(("output %d: %s on the device, %s on the CPU"):format(k, tostring(g), tostring(w)), 0)
    end
  end
  if want_grads then
    for i = 1, #c.inputs do
      if want_grads[i] ~= false then
        local what = ("gradient of input %d"):format(i)
        note(what, compare(what, got_grads[i] or nil, want_grads[i] or nil, tol, function()
          reference()
          return ref_grads[i] or nil
        end))
      end
    end
  end
end

-- ---- the specs ---------------------------------------------------------------------------

describe("cuda parity #cuda", function()
  local prev_tf32
  setup(function()
    -- f32 products in full f32 (TF32 would need a ~1e-3 bound)
    prev_tf32 = G.set_tf32(false)
  end)
  teardown(function()
    G.set_tf32(prev_tf32)
    if SIM and #inexact > 0 then
      io.stderr:write(("\nparity: %d results not bitwise equal on the simulated device (passed by the "
        .. "f64 reference rule; the device path is not the CPU's there):\n  %s\n"):format(#inexact,
        table.concat(inexact, "\n  ")))
    end
  end)

  it("runs on " .. DEV .. " (" .. G.device_name(DEV) .. ", plug-in " .. backend .. ")", function()
    assert.is_true(DEV_INDEX >= 0)
  end)

  describe("ops", function()
    for ci, c in ipairs(cases) do
      if ONLY == nil or c.name:match(ONLY) then
        for _, dtype in ipairs(c.dtypes or FLOATS) do
          local seed = ci * 16 + #dtype
          local label = ("%s %s"):format(c.name, dtype)
          -- f16/bf16 only where the CPU has the op in that dtype (probed here, forward and
          -- backward); f32/f64 always (a CPU failure there fails the test).
          local cpu_err
          if LOW[dtype] then
            local ok, err = pcall(run_case, c, dtype, nil, seed)
            if not ok then cpu_err = tostring(err):gsub("\n.*", "") end
          end
          if cpu_err then
            pending(label .. ": the CPU has no " .. dtype .. " for it (" .. cpu_err .. ")")
          else
            it(label, function() check_case(c, dtype, seed, label) end)
          end
        end
      end
    end
  end)

  describe("optimizers", function()
    local optim = require "ddplua.optim"
    local configs = {
      { "SGD", { lr = 0.1 } },
      { "SGD", { lr = 0.1, momentum = 0.9, weight_decay = 1e-2 } },
      { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true } },
      { "Adam", { lr = 1e-2 } },
      { "Adam", { lr = 1e-2, weight_decay = 1e-2, amsgrad = true } },
      { "AdamW", { lr = 1e-2, weight_decay = 1e-1 } },
    }
    -- three steps from the same parameters and gradients; parameters and state compared
    local function steps(name, opts, dtype, dev, seed)
      local gen = dl.Generator(seed)
      local params, grads = {}, {}
      for i, shape in ipairs { { 7, 5 }, { 5 }, { 3, 4, 2 } } do
        local p = dl.randn(shape, { dtype = "f64", generator = gen }):to(dtype)
        if dev then p = G.to(p, dev) end
        params[i] = p:requires_grad_(true)
        grads[i] = {}
        for s = 1, 3 do
          local g = dl.randn(shape, { dtype = "f64", generator = gen }):to(dtype)
          grads[i][s] = dev and G.to(g, dev) or g
        end
      end
      local opt = optim[name](params, opts)
      for s = 1, 3 do
        for i, p in ipairs(params) do p.grad = grads[i][s] end
        opt:step()
      end
      return params, opt
    end
    for ci, cfg in ipairs(configs) do
      local name, opts = cfg[1], cfg[2]
      for _, dtype in ipairs { "f32", "f64" } do
        local parts = {}
        for k, v in pairs(opts) do parts[#parts + 1] = k .. "=" .. tostring(v) end
        table.sort(parts)
        it(("%s {%s} %s: 3 steps"):format(name, table.concat(parts, ", "), dtype), function()
          local seed = 5000 + ci * 8 + #dtype
          local want, wopt = steps(name, opts, dtype, nil, seed)
          local got, gopt = steps(name, opts, dtype, DEV, seed)
          for i = 1, #want do
            compare(("parameter %d"):format(i), got[i], want[i], TOL[dtype])
            local ws, gs = wopt.state[want[i]], gopt.state[got[i]]
            for key, v in pairs(ws) do
              if dl.is_tensor(v) then compare(("parameter %d state %s"):format(i, key), gs[key], v, TOL[dtype]) end
            end
          end
        end)
      end
    end
  end)

  describe("training steps", function()
    local optim = require "ddplua.optim"

    -- Build the model twice from one seed (same initial weights), move one to the device,
    -- run `nsteps` SGD steps on one random batch on each; compare every step's loss and
    -- gradients and the parameters at the end.
    local function train_parity(make_model, x_shape, classes, dtype, tol, opt_opts)
      local function build()
        dl.manual_seed(1234)
        local m = make_model()
        if dtype ~= "f32" then m:to(dtype) end
        return m
      end
      local gen = dl.Generator(99)
      local x = dl.randn(x_shape, { dtype = "f64", generator = gen }):to(dtype)
      local y = dl.randint(0, classes, { x_shape[1] }, { generator = gen })
      local m_cpu, m_dev = build(), G.module_to(build(), DEV)
      local xd, yd = G.to(x, DEV), G.to(y, DEV)
      local o_cpu = optim.SGD(m_cpu:parameters(), opt_opts)
      local o_dev = optim.SGD(m_dev:parameters(), opt_opts)
      local p_cpu, p_dev = m_cpu:parameters(), m_dev:parameters()
      assert.are.equal(#p_cpu, #p_dev)
      for step = 1, 3 do
        o_cpu:zero_grad()
        o_dev:zero_grad()
        local l_cpu = dl.cross_entropy(m_cpu(x), y)
        local l_dev = dl.cross_entropy(m_dev(xd), yd)
        l_cpu:backward()
        l_dev:backward()
        compare(("step %d loss"):format(step), l_dev, l_cpu, tol)
        for i = 1, #p_cpu do
          compare(("step %d gradient of parameter %d"):format(step, i), p_dev[i].grad, p_cpu[i].grad, tol)
        end
        o_cpu:step()
        o_dev:step()
      end
      for i = 1, #p_cpu do compare(("parameter %d after 3 steps"):format(i), p_dev[i], p_cpu[i], tol) end
      local b_cpu, b_dev = m_cpu:buffers(), m_dev:buffers()
      for i = 1, #b_cpu do compare(("buffer %d after 3 steps"):format(i), b_dev[i], b_cpu[i], tol) end
    end

    -- bounds: three steps through a whole network compound the per-op differences
    local net_tol = SIM and { f32 = 0, f64 = 0 } or { f32 = 5e-4, f64 = 1e-9 }
    for _, dtype in ipairs { "f32", "f64" } do
      it("CNN (models/cnn.lua), batch 16, 3 SGD steps, " .. dtype, function()
        train_parity(require "models.cnn", { 16, 1, 28, 28 }, 10, dtype, net_tol[dtype],
          { lr = 0.05, momentum = 0.9 })
      end)
      it("ResNet-20 (models/resnet.lua), batch 4, 32x32x3, 3 SGD steps, " .. dtype, function()
        train_parity(require "models.resnet", { 4, 3, 32, 32 }, 10, dtype, net_tol[dtype],
          { lr = 0.1, momentum = 0.9, weight_decay = 1e-4 })
      end)
    end
  end)
end)
