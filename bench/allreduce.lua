--- bench/allreduce.lua: all-reduce latency and bus bandwidth between the ranks of the launch
-- (f32, SUM; the gloo group, which uses shared memory between the ranks of one host).
-- Definitions as nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
--   build/ddplua --nproc_per_node=2 bench/allreduce.lua [--max-mb 256]
--   build/ddplua --nproc_per_node=2 --standalone bench/allreduce.lua --sizes 4096,1048576 \
--       --b2b [--rounds 5] [--shared] [--memcpy]
-- Sizes: 4 KiB, 16 KiB, ... (x4) up to --max-mb MiB, or the byte counts of --sizes.
-- For each size, after a warm-up, the barrier-synchronised figure: the median over up to 200
-- calls, each timed alone right after a barrier (what a script that times one call sees; the
-- barrier's skew between the ranks lands in it). With --b2b also the back-to-back figure:
-- k calls in a row with nothing in between, timed together and divided by k, median over
-- --rounds rounds (k is chosen by rank 0 so one round takes about 0.1 s, between 3 and 2000
-- calls, and broadcast so every rank makes the same calls).
-- --shared repeats each size on a dist.shared_buffer tensor (zero copy: the peers' tensors
-- are read in place). --memcpy adds one line: rank 0 alone copying the largest size (the
-- machine's copy rate at the time, the reference for the large all-reduces).
-- Rank 0 prints one line per size and tensor kind:
--   "bytes=<b> tensor=<ordinary|shared> time_us=<t> busbw_gbs=<g> [b2b_us=<t> b2b_busbw_gbs=<g>]"
-- and with --memcpy "memcpy bytes=<b> time_us=<t> gbs=<bytes copied per second / 1e9>".
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local max_mb, sizes, b2b, rounds, shared, memcpy = 256, nil, false, 5, false, false
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--max-mb" then max_mb = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--sizes" then
    sizes = {}
    for s in tostring(arg[i + 1]):gmatch("[^,]+") do
      local b = tonumber(s)
      if not b or b < 4 or b % 4 ~= 0 then error("--sizes: byte counts that are multiples of 4, got " .. s, 0) end
      sizes[#sizes + 1] = b
    end
    i = i + 1
  elseif a == "--rounds" then rounds = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--b2b" then b2b = true
  elseif a == "--shared" then shared = true
  elseif a == "--memcpy" then memcpy = true
  else error("unknown argument " .. a .. " (--max-mb, --sizes, --b2b, --rounds, --shared, --memcpy)", 0) end
  i = i + 1
end
if not sizes then
  sizes = {}
  local bytes = 4096
  while bytes <= max_mb * 1024 * 1024 do sizes[#sizes + 1] = bytes; bytes = bytes * 4 end
end
if shared and not dist.shared_buffer then error("--shared: this build has no dist.shared_buffer", 0) end

dist.init_process_group { backend = "gloo" }
local n, rank = dist.get_world_size(), dist.get_rank()

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local function busbw(bytes, sec) return bytes / sec / 1e9 * 2 * (n - 1) / n end

-- Back-to-back calls per round: rank 0's choice (about 0.1 s a round) given to every rank.
local k_box = dl.zeros { 1 }
local function calls_per_round(t_one)
  k_box:fill_(math.max(3, math.min(2000, math.floor(0.1 / t_one))))
  dist.broadcast(k_box, 0)
  return k_box:item()
end

local function measure(bytes, kind)
  local t
  if kind == "shared" then
    t = dist.shared_buffer(bytes / 4)
    t:fill_(1)
  else
    t = dl.ones { bytes / 4 }
  end
  local reps = math.max(3, math.min(200, math.floor(64 * 1024 * 1024 / bytes)))
  for _ = 1, 2 do dist.all_reduce(t) end -- warm-up
  local times = {}
  for r = 1, reps do
    dist.barrier()
    local t0 = clock.now()
    dist.all_reduce(t)
    times[r] = clock.now() - t0
  end
  local sync = median(times)
  local line = ("bytes=%d tensor=%s time_us=%.2f busbw_gbs=%.3f"):format(bytes, kind, sync * 1e6, busbw(bytes, sync))
  if b2b then
    local k = calls_per_round(sync)
    local per = {}
    for r = 1, rounds do
      dist.barrier()
      local t0 = clock.now()
      for _ = 1, k do dist.all_reduce(t) end
      per[r] = (clock.now() - t0) / k
    end
    local bb = median(per)
    line = line .. (" b2b_us=%.2f b2b_busbw_gbs=%.3f"):format(bb * 1e6, busbw(bytes, bb))
  end
  if rank == 0 then print(line) end
  t = nil -- dropped, so that its (shared) memory is free for the next size
  collectgarbage("collect")
end

for _, bytes in ipairs(sizes) do
  measure(bytes, "ordinary")
  if shared then measure(bytes, "shared") end
end

if memcpy then
  local big = sizes[#sizes]
  local src, dst = dl.ones { big / 4 }, dl.zeros { big / 4 }
  if rank == 0 then
    dst:copy_(src)
    local times = {}
    for r = 1, 7 do
      local t0 = clock.now()
      dst:copy_(src)
      times[r] = clock.now() - t0
    end
    local sec = median(times)
    print(("memcpy bytes=%d time_us=%.2f gbs=%.3f"):format(big, sec * 1e6, big / sec / 1e9))
  end
  dist.barrier()
end
dist.destroy_process_group()
