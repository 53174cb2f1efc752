--- bench/sharding_collectives.lua: reduce_scatter_tensor and all_gather_into_tensor against
-- the all-reduce of the same size, between the ranks of the launch (f32, SUM, the gloo group:
-- shared memory between the ranks of one host, Gloo over TCP with DDPLUA_SHM=0).
--   build/ddplua --nproc_per_node=2 --standalone bench/sharding_collectives.lua \
--       [--sizes 1048576,16777216] [--max-mb 64] [--reps-mb 256] [--shared]
-- `size` is always the full tensor: the all-reduce's tensor, reduce_scatter_tensor's input
-- (each rank gets size / n), all_gather_into_tensor's output (each rank gives size / n).
-- Bus bandwidth as nccl-tests define it (doc/PERFORMANCE.md there): algbw = size / time;
-- all-reduce busbw = algbw * 2 (n - 1) / n; reduce-scatter and all-gather busbw = algbw *
-- (n - 1) / n. For each size, after two warm-up calls of each: reps rounds (enough for about
-- --reps-mb MiB, between 5 and 200) of one call of each collective in turn, each call timed
-- alone right after a barrier (the barrier's skew between the ranks lands in it, tens of
-- µs); the median per collective.
-- --shared puts the all-reduce's tensor and reduce_scatter_tensor's input in the group's
-- shared memory (dist.shared_buffer: read in place by the peers, no staging copy); the
-- all-gather has no such path and stays as it is.
-- Rank 0 prints one line per size and collective:
--   "op=<all_reduce|reduce_scatter_tensor|all_gather_into_tensor> bytes=<size>
--    time_us=<t> busbw_gbs=<g>"
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local max_mb, sizes, reps_mb, shared = 64, nil, 256, false
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--max-mb" then max_mb = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--reps-mb" then reps_mb = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--shared" then shared = true
  elseif a == "--sizes" then
    sizes = {}
    for s in tostring(arg[i + 1]):gmatch("[^,]+") do sizes[#sizes + 1] = tonumber(s) end
    i = i + 1
  else error("unknown argument " .. a .. " (--sizes, --max-mb, --reps-mb, --shared)", 0) end
  i = i + 1
end

dist.init_process_group { backend = "gloo" }
local n, rank = dist.get_world_size(), dist.get_rank()
if not sizes then
  sizes = {}
  local bytes = 64 * 1024
  while bytes <= max_mb * 1024 * 1024 do sizes[#sizes + 1] = bytes; bytes = bytes * 4 end
end
for _, b in ipairs(sizes) do
  if b % (4 * n) ~= 0 then error(("--sizes: %d bytes is not a multiple of 4 * %d ranks"):format(b, n), 0) end
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local FACTOR = { all_reduce = 2 * (n - 1) / n, reduce_scatter_tensor = (n - 1) / n,
                 all_gather_into_tensor = (n - 1) / n }

local OPS = { "all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor" }

-- One call of op on tensors of `bytes` (size as above).
-- A tensor of `elems` ones, in the group's shared memory with --shared.
local function ones(elems)
  if not shared then return dl.ones { elems } end
  local t = dist.shared_buffer(elems)
  t:fill_(1)
  return t
end

local function caller(op, bytes)
  local elems = math.floor(bytes / 4)
  if op == "all_reduce" then
    local t = ones(elems)
    return function() dist.all_reduce(t) end
  elseif op == "reduce_scatter_tensor" then
    local input, output = ones(elems), dl.zeros { math.floor(elems / n) }
    return function() dist.reduce_scatter_tensor(output, input) end
  end
  local input, output = dl.ones { math.floor(elems / n) }, dl.zeros { elems }
  return function() dist.all_gather_into_tensor(output, input) end
end

-- The collectives of one size take turns call by call (all_reduce, reduce_scatter_tensor,
-- all_gather_into_tensor, all_reduce, ...), so that each sees the same load from other work.
local function measure(bytes)
  local calls, times = {}, {}
  for k, op in ipairs(OPS) do
    calls[k], times[k] = caller(op, bytes), {}
    calls[k](); calls[k]() -- warm-up
  end
  local reps = math.max(5, math.min(200, math.floor(reps_mb * 1024 * 1024 / bytes)))
  for r = 1, reps do
    for k = 1, #OPS do
      dist.barrier()
      local t0 = clock.now()
      calls[k]()
      times[k][r] = clock.now() - t0
    end
  end
  for k, op in ipairs(OPS) do
    local t = median(times[k])
    if rank == 0 then
      print(("op=%s bytes=%d time_us=%.2f busbw_gbs=%.3f"):format(op, bytes, t * 1e6,
                                                                 bytes / t / 1e9 * FACTOR[op]))
    end
  end
end

for _, bytes in ipairs(sizes) do measure(bytes) end
dist.destroy_process_group()
