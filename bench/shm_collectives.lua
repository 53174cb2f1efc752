--- bench/shm_collectives.lua: the collectives between the ranks of one host (shared memory
-- when the group has it): all-reduce from 4 KiB to --max-mb (f32, SUM) for an ordinary
-- tensor (staged through the segment, Note [shm pipelined all-reduce] in
-- runtime/comm/pg_shm.c) and for a dist.shared_buffer tensor (zero copy, Note [shm
-- zero copy] there), each size both
-- barrier-synchronised and back to back; broadcast and barrier latency; and plain memcpy of
-- the same bytes for reference (the machine's copy rate at the time: rank 0 alone, and every
-- rank at once).
--   build/ddplua --nproc_per_node=2 --standalone bench/shm_collectives.lua [--max-mb 64]
-- Rank 0 prints one line per figure: "what=<name> bytes=<b> time_us=<t> busbw_gbs=<g>"
-- (busbw as nccl-tests: bytes / time * 2 (n - 1) / n; medians). Names: allreduce[_shared]
-- (barrier-synchronised: the median of up to 200 calls, each right after a barrier),
-- allreduce[_shared]_b2b (back to back: the mean over a run of calls with nothing between
-- them, median of 5 runs), broadcast, barrier_b2b, memcpy (rank 0 copies while the others
-- wait; busbw column = bytes copied per second) and memcpy_all (every rank copies its own
-- buffer at once; per rank). Builds without dist.shared_buffer skip the shared rows.
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
  local bw = 0
  if bus == "copy" then bw = bytes / sec / 1e9 elseif bus then bw = bytes / sec / 1e9 * 2 * (n - 1) / n end
  print(("what=%s bytes=%d time_us=%.2f busbw_gbs=%.3f"):format(what, bytes, sec * 1e6, bw))
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
    local k = math.max(3, math.min(2000, math.floor(256 * 1024 * 1024 / bytes)))
    report(e[1] .. "_b2b", bytes, back_to_back(5, k, function() dist.all_reduce(t) end), true)
  end
  if bytes >= 1048576 then -- the machine's copy rate for these bytes now
    local src, dst = dl.ones { bytes / 4 }, dl.zeros { bytes / 4 }
    dst:copy_(src)
    local reps = math.max(5, math.min(50, math.floor(256 * 1024 * 1024 / bytes)))
    local times = {}
    for r = 1, reps do
      dist.barrier()
      local t0 = clock.now()
      if rank == 0 then dst:copy_(src) end
      times[r] = clock.now() - t0
    end
    report("memcpy", bytes, median(times), "copy")
    report("memcpy_all", bytes, synced(reps, function() dst:copy_(src) end), "copy")
  end
  collectgarbage()
  bytes = bytes * 4
end
for _, b in ipairs { 4096, 65536, 1048576, 16777216 } do
  local t = dl.ones { b / 4 }
  for _ = 1, 3 do dist.broadcast(t, 0) end
  report("broadcast", b, synced(math.max(5, math.min(200, math.floor(64 * 1024 * 1024 / b))),
    function() dist.broadcast(t, 0) end))
end
report("barrier_b2b", 0, back_to_back(5, 2000, function() dist.barrier() end))
dist.barrier()
dist.destroy_process_group()
