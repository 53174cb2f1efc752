--- bench/allreduce.lua: all-reduce latency and bus bandwidth over gloo between the ranks of
-- the launch, for sizes 4 KiB .. 256 MiB (f32, SUM). Definitions as nccl-tests: algbw =
-- bytes / time, busbw = algbw * 2 (n - 1) / n. Medians over repetitions after a warm-up.
--   build/ddplua --nproc_per_node=2 bench/allreduce.lua [--max-mb 256]
-- Rank 0 prints one line per size: "bytes=<b> time_us=<t> busbw_gbs=<g>".
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local max_mb = 256
for i = 1, #arg do if arg[i] == "--max-mb" then max_mb = tonumber(arg[i + 1]) end end
dist.init_process_group { backend = "gloo" }
local n, rank = dist.get_world_size(), dist.get_rank()

local bytes = 4096
while bytes <= max_mb * 1024 * 1024 do
  local t = dl.ones { bytes / 4 }
  local reps = math.max(3, math.min(200, math.floor(64 * 1024 * 1024 / bytes)))
  for _ = 1, 2 do dist.all_reduce(t) end -- warm-up
  local times = {}
  for r = 1, reps do
    dist.barrier()
    local t0 = clock.now()
    dist.all_reduce(t)
    times[r] = clock.now() - t0
  end
  table.sort(times)
  local med = times[math.floor((#times + 1) / 2)]
  if rank == 0 then
    print(("bytes=%d time_us=%.1f busbw_gbs=%.3f"):format(bytes, med * 1e6, bytes / med / 1e9 * 2 * (n - 1) / n))
  end
  bytes = bytes * 4
end
dist.destroy_process_group()
