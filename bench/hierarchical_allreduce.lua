-- bench/hierarchical_allreduce.lua: milliseconds per dist.all_reduce of f32 tensors of a
-- few sizes in the group of all ranks (the median of REPS timed calls after warm-up calls,
-- between barriers), printed by rank 0 as "size <bytes> ms <median>". Run under a launcher
-- (bench/hierarchical_nodes.sh starts it on namespace nodes, hierarchical and flat).
-- Usage: ddplua ... bench/hierarchical_allreduce.lua [REPS=10] [SIZES_MIB=1,16,64]
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local reps = tonumber(arg and arg[1]) or 10
local sizes = {}
for s in ((arg and arg[2]) or "1,16,64"):gmatch("[^,]+") do sizes[#sizes + 1] = tonumber(s) end

dist.init_process_group {}
for _, mib in ipairs(sizes) do
  local t = dl.ones({ mib * 262144 })
  for _ = 1, 2 do dist.all_reduce(t) end
  local times = {}
  for r = 1, reps do
    dist.barrier()
    local t0 = clock.now()
    dist.all_reduce(t)
    times[r] = clock.now() - t0
  end
  table.sort(times)
  if dist.get_rank() == 0 then
    print(("size %d ms %.3f"):format(mib * 1048576, 1e3 * times[math.floor((reps + 1) / 2)]))
  end
end
dist.destroy_process_group()
