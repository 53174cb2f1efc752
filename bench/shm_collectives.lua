--- bench/shm_collectives.lua: the collectives between the ranks of one host (shared memory
-- when the group has it): all-reduce bus bandwidth from 4 KiB to --max-mb (f32, SUM) for an
-- ordinary tensor and for a dist.shared_buffer tensor (zero copy, Note [shm zero copy] in
-- runtime/distributed/pg_shm.c), back-to-back all-reduce latency at 4 KiB next to the
-- barrier-synchronised one, broadcast and barrier latency, and a single-process memcpy of the
-- largest size for reference (the machine's copy rate at the time).
--   build/ddplua --nproc_per_node=2 --standalone bench/shm_collectives.lua [--max-mb 64]
-- Rank 0 prints one line per figure: "what=<name> bytes=<b> time_us=<t> busbw_gbs=<g>"
-- (busbw as nccl-tests: bytes / time * 2 (n - 1) / n; medians). Builds without
-- dist.shared_buffer skip the shared rows.
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local max_mb = 64
for i = 1, #arg do if arg[i] == "--max-mb" then max_mb = tonumber(arg[i + 1]) end end
dist.init_process_group { backend = "gloo" }
local n, rank = dist.get_world_size(), dist.get_rank()

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local function report(what, bytes, sec, bus)
  if rank ~= 0 then return end
  print(("what=%s bytes=%d time_us=%.2f busbw_gbs=%.3f"):format(what, bytes, sec * 1e6,
    bus and bytes / sec / 1e9 * 2 * (n - 1) / n or 0))
end

-- Median of reps barrier-synchronised calls of f.
local function synced(reps, f)
  local times = {}
  for r = 1, reps do
    dist.barrier()
    local t0 = clock.now()
    f()
    times[r] = clock.now() - t0
  end
  return median(times)
end

-- Median over rounds of the mean time of k back-to-back calls of f.
local function back_to_back(rounds, k, f)
  local times = {}
  for r = 1, rounds do
    dist.barrier()
    local t0 = clock.now()
    for _ = 1, k do f() end
    times[r] = (clock.now() - t0) / k
  end
  return median(times)
end

local function tensors(bytes)
  local list = { { "allreduce", dl.ones { bytes / 4 } } }
  if dist.shared_buffer then
    local t = dist.shared_buffer(bytes / 4)
    t:fill_(1)
    list[2] = { "allreduce_shared", t }
  end
  return list
end

local bytes = 4096
while bytes <= max_mb * 1024 * 1024 do
  for _, e in ipairs(tensors(bytes)) do
    local t = e[2]
    local reps = math.max(5, math.min(200, math.floor(64 * 1024 * 1024 / bytes)))
    for _ = 1, 3 do dist.all_reduce(t) end -- warm-up
    report(e[1], bytes, synced(reps, function() dist.all_reduce(t) end), true)
    if bytes == 4096 then
      report(e[1] .. "_b2b", bytes, back_to_back(7, 2000, function() dist.all_reduce(t) end), true)
    end
  end
  bytes = bytes * 4
end
for _, b in ipairs { 4096, 65536, 1048576, 16777216 } do
  local t = dl.ones { b / 4 }
  for _ = 1, 3 do dist.broadcast(t, 0) end
  report("broadcast", b, synced(math.max(5, math.min(200, math.floor(64 * 1024 * 1024 / b))),
    function() dist.broadcast(t, 0) end))
end
report("barrier_b2b", 0, back_to_back(7, 2000, function() dist.barrier() end))
-- The machine's copy rate now (rank 0 alone, the others wait in the barrier): what the
-- large all-reduces are bound by. busbw column: bytes copied per second.
local big = math.min(max_mb, 64) * 1024 * 1024
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
  print(("what=memcpy bytes=%d time_us=%.2f busbw_gbs=%.3f"):format(big, sec * 1e6, big / sec / 1e9))
end
dist.barrier()
dist.destroy_process_group()
