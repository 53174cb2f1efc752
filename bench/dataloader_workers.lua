--- bench/dataloader_workers.lua: samples/s of data.DataLoader over a Lua dataset whose
-- ds:get is costly (a per-sample augmentation loop written in Lua), with num_workers = N;
-- ddplua's side of bench/dataloader_workers_torch.py (same data, same augmentation, same
-- batch). Run by bench/dataloader_workers.sh, which alternates the two.
--   build/ddplua bench/dataloader_workers.lua [--workers N] [--samples N] [--batch B]
--                                             [--passes P] [--runs R] [--persistent 0|1]
-- Defaults: 0 workers, 10000 samples, batch 64, 16 blur passes, 3 timed runs, new workers
-- each epoch (--persistent 1: one loader with persistent_workers for every run).
-- Prints "framework=ddplua workers=N samples_per_s=X main_cpu_ms_per_1k=Y
-- total_cpu_ms_per_1k=Z": medians over the timed runs (one untimed run first; each run is
-- one epoch of a new loader, the workers' start included, as with PyTorch's non-persistent
-- workers) of the samples/s, of the CPU time the training process itself spent per 1000
-- samples (user + system, its workers not counted: what is left on the training thread),
-- and of the CPU time of the training process and its workers together (the workers are
-- reaped at the epoch's end, so /proc/self/stat's cutime + cstime count them): the cost of
-- the work, which barely moves with the machine's load, unlike samples/s.
--
-- The augmentation of a Fashion-MNIST image (1, 28, 28) u8, per sample: a random shift by
-- dx, dy in -2..2 (zeros come in), P passes of the 3x3 blur [1 2 1; 2 4 2; 1 2 1] / 16
-- (zero padding), then v = clamp(v / 255 * contrast + brightness, 0, 1) with contrast in
-- [0.8, 1.2) and brightness in [-0.1, 0.1), normalised with Fashion-MNIST's mean 0.2860
-- and std 0.3530: 9 * P * 784 multiply-adds per sample, all in Lua (JIT-compiled loops
-- over zero-bordered planes).
local dl = require "ddplua"
local data = require "ddplua.data"
local object = require "ddplua.data.object"
local clock = require "ddplua.clock"
local dlos = require "ddplua.os"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local opts = { workers = 0, samples = 10000, batch = 64, passes = 16, runs = 3, persistent = 0 }
local k = 1
while k <= #arg do
  local name = arg[k]:match("^%-%-(.+)$")
  if not name or opts[name] == nil or not tonumber(arg[k + 1]) then
    error("usage: dataloader_workers.lua [--workers N] [--samples N] [--batch B] [--passes P] [--runs R] " ..
      "[--persistent 0|1]")
  end
  opts[name] = tonumber(arg[k + 1])
  k = k + 2
end
dl.set_num_threads(1)

local images = data.read_idx("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
local labels = data.read_idx("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")
assert(opts.samples <= images:size(1), "at most " .. images:size(1) .. " samples")

local H, W = 28, 28
local PW = W + 2 -- rows of the padded planes: a zero border of 1 around the image

local Augmented = { name = "AugmentedFashionMNIST" }
function Augmented.len(self) return opts.samples end
--- ds:get(i) -> the augmented image (1, 28, 28) f32 and its label (0 .. 9).
function Augmented.get(self, i)
  local src = self.src + (i - 1) * H * W
  local a, b = self.a, self.b -- (H + 2) x (W + 2) planes whose border stays 0
  local dx, dy = math.random(-2, 2), math.random(-2, 2)
  for y = 0, H - 1 do
    local sy = y + dy
    for x = 0, W - 1 do
      local sx = x + dx
      a[(y + 1) * PW + x + 1] = (sy >= 0 and sy < H and sx >= 0 and sx < W) and src[sy * W + sx] or 0
    end
  end
  for _ = 1, opts.passes do
    for y = 1, H do
      local r = y * PW
      for p = r + 1, r + W do
        b[p] = (a[p - PW - 1] + 2 * a[p - PW] + a[p - PW + 1] + 2 * a[p - 1] + 4 * a[p] + 2 * a[p + 1]
          + a[p + PW - 1] + 2 * a[p + PW] + a[p + PW + 1]) * 0.0625
      end
    end
    a, b = b, a
  end
  local contrast = 0.8 + 0.4 * math.random()
  local brightness = -0.1 + 0.2 * math.random()
  local out = dl.empty({ 1, H, W })
  local dst = ffi.cast("float *", C.ddp_tensor_data(out))
  for y = 0, H - 1 do
    for x = 0, W - 1 do
      local v = a[(y + 1) * PW + x + 1] / 255 * contrast + brightness
      v = v < 0 and 0 or (v > 1 and 1 or v)
      dst[y * W + x] = (v - 0.2860) / 0.3530
    end
  end
  return out, self.labels[i - 1]
end

local ds = object.new(Augmented, {
  src = ffi.cast("const uint8_t *", C.ddp_tensor_data(images)), images = images,
  labels = ffi.cast("const uint8_t *", C.ddp_tensor_data(labels)), labels_t = labels,
  a = ffi.new("double[?]", (H + 2) * PW), b = ffi.new("double[?]", (H + 2) * PW),
})

local function cpu_seconds()
  local u = dlos.resource_usage()
  return u.user_seconds + u.system_seconds
end

-- CPU seconds of the reaped children (cutime + cstime of /proc/self/stat, in clock ticks
-- of 1/100 s: USER_HZ on Linux).
local function children_cpu_seconds()
  local f = assert(io.open("/proc/self/stat"))
  local stat = f:read("*a")
  f:close()
  local fields = {}
  for v in stat:match("%) (.*)$"):gmatch("%S+") do fields[#fields + 1] = v end
  -- fields[1] is field 3 (state): cutime and cstime are fields 16 and 17
  return (tonumber(fields[14]) + tonumber(fields[15])) / 100
end

-- One epoch (of a new loader, or of the persistent one): samples/s, the training process's
-- CPU ms per 1000 samples, and the CPU ms per 1000 samples of the process and its workers
-- together (persistent workers are never reaped: their CPU time is not counted then).
local persistent_loader
local function run()
  local loader = persistent_loader or data.DataLoader(ds, { batch_size = opts.batch, shuffle = true,
    num_workers = opts.workers, persistent_workers = opts.persistent == 1 })
  if opts.persistent == 1 then persistent_loader = loader end
  local t0, c0, k0 = clock.now(), cpu_seconds(), children_cpu_seconds()
  local n = 0
  for x, y in loader:iter() do n = n + x:size(1) end
  assert(n == opts.samples)
  local main = cpu_seconds() - c0
  return n / (clock.now() - t0), main * 1e6 / n, (main + children_cpu_seconds() - k0) * 1e6 / n
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

run()
local rates, cpus, totals = {}, {}, {}
for r = 1, opts.runs do rates[r], cpus[r], totals[r] = run() end
print(("framework=ddplua workers=%d samples_per_s=%.0f main_cpu_ms_per_1k=%.1f total_cpu_ms_per_1k=%.1f"):format(
  opts.workers, median(rates), median(cpus), median(totals)))
