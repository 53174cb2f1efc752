--- bench/join_overhead.lua: what ddp:join costs per training step when the inputs are even
-- (its presence and join-state all-reduces, Note [join shadow iteration]) and what a joined
-- rank's shadow step costs, on the Fashion-MNIST MLP (models/mlp.lua, batch 64 per rank,
-- random data, SGD).
--   build/ddplua --nproc_per_node=2 --standalone bench/join_overhead.lua [--steps 100] [--rounds 7]
-- Modes run alternately in each round (so all see the same machine load): plain DDP,
-- ddp:join with enable = false, ddp:join (enable = true), and uneven: rank 0 with no batch
-- (it shadows every step) against rank 1 with `steps`. Rank 0 prints one line per mode with
-- the median over rounds of the per-step time of rank 1 (ms) and its ratio to plain DDP.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local clock = require "ddplua.clock"

local steps, rounds = 100, 7
for i = 1, #arg do
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--rounds" then rounds = tonumber(arg[i + 1]) end
end
dist.init_process_group { backend = "gloo" }
local rank = dist.get_rank()

dl.manual_seed(0)
local model = DDP(require("models.mlp")())
local opt = optim.SGD(model:parameters(), { lr = 0.01 })
local x, y = dl.randn({ 64, 784 }), dl.randint(0, 10, { 64 })

local function train(n)
  for _ = 1, n do
    opt:zero_grad()
    nn.functional.cross_entropy(model(x), y):backward()
    opt:step()
  end
end

local modes = {
  { "plain DDP", function() train(steps) end },
  { "ddp:join, enable = false", function() model:join({ enable = false }, train, steps) end },
  { "ddp:join (even inputs)", function() model:join({}, train, steps) end },
  { "ddp:join, rank 0 shadows every step", function() model:join({}, train, rank == 0 and 0 or steps) end },
}

local times = {}
for _, m in ipairs(modes) do times[m[1]] = {} end
for round = 0, rounds do
  for _, m in ipairs(modes) do
    dist.barrier()
    local t0 = clock.now()
    m[2]()
    -- rank 1 trains in every mode: its time per step is the figure
    local t = dl.tensor({ rank == 1 and (clock.now() - t0) / steps or 0 }, { dtype = "f64" })
    dist.all_reduce(t)
    if round > 0 then table.insert(times[m[1]], t:item()) end
  end
end

local function median(list)
  table.sort(list)
  return list[math.floor((#list + 1) / 2)]
end
if rank == 0 then
  local base = median(times["plain DDP"])
  for _, m in ipairs(modes) do
    local med = median(times[m[1]])
    print(("%-40s %7.3f ms/step  %.3fx plain"):format(m[1], med * 1e3, med / base))
  end
end
dist.destroy_process_group()
