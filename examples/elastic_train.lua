--- examples/elastic_train.lua: elastic data-parallel training (README "Elastic training").
-- Nodes may leave and join while it runs: the elastic launcher restarts every node's
-- workers with the new world size, and the training state committed last (model,
-- optimizer, epoch, the sampler's position in the epoch) comes back through
-- ddplua.distributed.elastic's State (Horovod's commit / sync), so each epoch still trains
-- every sample once (Note [elastic resume] in lua/ddplua/distributed/sampler.lua).
--
--   export DDPLUA_STORE_SECRET=...   # the same on every node
--   ddplua --nnodes=2:3 --rdzv_endpoint=node0:29400 --rdzv_id=job1 --max_restarts=3 \
--          --nproc_per_node=1 examples/elastic_train.lua --state /shared/elastic.safetensors
--
-- The data is synthetic (a noisy linear target of 8 features, N samples), so the example
-- needs no files. --record DIR writes, for each step, the sample indices this rank trained
-- (DIR/rank<R>_round<K>.txt: "step <epoch> <position> <world> <i1>,<i2>,...") and, on rank
-- 0, where each round resumed (DIR/resume_round<K>.txt: "resume <epoch> <position>"):
-- spec/multinode/elastic_spec.lua checks from them that no sample was skipped or repeated.
local dl = require "ddplua"
local nn, optim = require "ddplua.nn", require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"
local elastic = require "ddplua.distributed.elastic"
local dos = require "ddplua.os"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "elastic_train.lua" }
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 3)" })
parser:add_argument("--samples", { type = "number", metavar = "N", help = "samples per epoch (default 240)" })
parser:add_argument("--batch", { type = "number", metavar = "B", help = "batch size per rank (default 4)" })
parser:add_argument("--commit_every", { type = "number", metavar = "K",
  help = "commit whenever the epoch's position is a multiple of K samples (default 24)" })
parser:add_argument("--state", { metavar = "FILE", help = "where rank 0 writes each commit (default: memory only)" })
parser:add_argument("--step_sleep", { type = "number", metavar = "S", help = "seconds to sleep per step (default 0)" })
parser:add_argument("--record", { metavar = "DIR", help = "write the indices each rank trained per step into DIR" })
local args = parser:parse_args(arg)
local N, B, EPOCHS = args.samples or 240, args.batch or 4, args.epochs or 3
local COMMIT = args.commit_every or 24

dist.init_process_group { backend = "gloo", timeout = 30 }
local rank, world = dist.get_rank(), dist.get_world_size()
local round = os.getenv("TORCHELASTIC_RESTART_COUNT") or "0"

-- the data: y = x . w* + noise, the same on every rank
local g = dl.Generator():manual_seed(7)
local x = dl.randn({ N, 8 }, { generator = g })
local y = x:matmul(dl.arange(1, 9, 1, { dtype = "f32" }):view(8, 1)) + dl.randn({ N, 1 }, { generator = g }) * 0.1

dl.manual_seed(0)
local model = DDP(nn.Linear(8, 1))
local opt = optim.SGD(model:parameters(), { lr = 0.02 })
local sampler = DistributedSampler(N, { shuffle = true, seed = 0 })
local state = elastic.State { model = model.module, optimizer = opt, sampler = sampler, path = args.state }
state:sync() -- the newest commit any rank holds (or rank 0's fresh model)

local function append(name, line)
  local f = assert(io.open(args.record .. "/" .. name, "a"))
  f:write(line, "\n")
  f:close()
end
if args.record and rank == 0 then
  append("resume_round" .. round .. ".txt", ("resume %d %d"):format(state.epoch, sampler.processed))
end
dist.print0(("round %s: world size %d, resuming epoch %d at sample %d of %d (commit %d)"):format(
  round, world, state.epoch, sampler.processed, N, state.serial))

for epoch = state.epoch, EPOCHS - 1 do
  state.epoch = epoch
  sampler:set_epoch(epoch) -- a resumed epoch keeps its position
  local idx = sampler:indices():tolist()
  local loss
  for first = 1, #idx, B do
    local batch = {}
    for i = first, math.min(first + B - 1, #idx) do batch[#batch + 1] = idx[i] end
    if args.record then
      append(("rank%d_round%s.txt"):format(rank, round), ("step %d %d %d %s"):format(epoch, sampler.processed, world,
        table.concat(batch, ",")))
    end
    local ib = dl.tensor(batch, { dtype = "i64" })
    opt:zero_grad()
    loss = nn.functional.mse_loss(model(x:index_select(1, ib)), y:index_select(1, ib))
    loss:backward()
    opt:step()
    sampler:record_batch(#batch)
    state.step = state.step + 1
    if sampler.processed % COMMIT == 0 or sampler.processed == N then state:commit() end
    if args.step_sleep then dos.sleep(args.step_sleep) end
  end
  if loss then
    dist.print0(("epoch %d done at world size %d: loss %.4f"):format(epoch, world, dist.reduce_tensor(loss):item()))
  end
end
dist.destroy_process_group()
