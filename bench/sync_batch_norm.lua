--- bench/sync_batch_norm.lua: what nn.SyncBatchNorm costs over nn.BatchNorm2d per layer
-- step (forward, then backward of sum(y * g)), f32, on the ranks of the launch, for a few
-- (N per rank, C, H = W) shapes. The two layers are timed alternately (BN, Sync, Sync, BN
-- in each round, after a barrier) so both see the same machine load; medians over rounds.
--   build/ddplua --nproc_per_node=2 --standalone bench/sync_batch_norm.lua [--rounds 15]
-- Rank 0 prints one line per shape: "N=<n> C=<c> HW=<h>x<h> bn_ms=<t> sync_ms=<t> ratio=<r>".
local dl = require "ddplua"
local nn = require "ddplua.nn"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local rounds = 15
for i = 1, #arg do if arg[i] == "--rounds" then rounds = tonumber(arg[i + 1]) end end
dist.init_process_group { backend = "gloo" }
local rank = dist.get_rank()

local SHAPES = { { 8, 16, 8 }, { 32, 64, 8 }, { 32, 64, 16 }, { 64, 128, 16 } }

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

for _, s in ipairs(SHAPES) do
  local N, C, H = s[1], s[2], s[3]
  dl.manual_seed(rank)
  local x = dl.randn({ N, C, H, H }):requires_grad_()
  local g = dl.randn({ N, C, H, H })
  local layers = { bn = nn.BatchNorm2d(C), sync = nn.SyncBatchNorm(C) }
  local times = { bn = {}, sync = {} }
  local reps = 5
  for round = 0, rounds do
    for _, name in ipairs { "bn", "sync", "sync", "bn" } do
      dist.barrier()
      local t0 = clock.now()
      for _ = 1, reps do (layers[name](x) * g):sum():backward() end
      if round > 0 then table.insert(times[name], (clock.now() - t0) / reps) end -- round 0 warms up
    end
  end
  local b, y = median(times.bn), median(times.sync)
  if rank == 0 then
    print(("N=%d C=%d HW=%dx%d bn_ms=%.3f sync_ms=%.3f ratio=%.2f"):format(N, C, H, H, b * 1e3, y * 1e3, y / b))
  end
end
dist.destroy_process_group()
