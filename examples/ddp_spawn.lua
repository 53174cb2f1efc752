--- examples/ddp_spawn.lua: the same data-parallel training as ddp_minimal.lua, in the
-- torch.multiprocessing.spawn style: one `ddplua` process forks the workers itself
-- (dl.spawn sets RANK, WORLD_SIZE, MASTER_ADDR, ... in each child), so no launcher is needed.
--
--   ddplua examples/ddp_spawn.lua [--nprocs N] [--epochs N] [--steps N]
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "ddp_spawn.lua" }
parser:add_argument("--nprocs", { type = "number", metavar = "N", help = "processes (default 2)" })
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
local args = parser:parse_args(arg)

--- One worker: rank counts from 0; the other arguments come from spawn's `args`.
local function worker(rank, epochs, steps)
  dist.init_process_group { backend = "gloo" }           -- env://, set by dl.spawn
  dl.manual_seed(0)
  local model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)))
  local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
  local train_set = data.FashionMNIST { train = true }
  local sampler = DistributedSampler(train_set, { shuffle = true, seed = 0 })
  local loader = data.DataLoader(train_set, { batch_size = 32, sampler = sampler })
  for epoch = 1, epochs do
    sampler:set_epoch(epoch)
    local step, loss = 0, nil
    for x, y in loader:iter() do
      opt:zero_grad()
      loss = nn.functional.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      step = step + 1
      if step % 50 == 0 then dist.print0(("epoch %d step %d loss %.4f"):format(epoch, step, loss:item())) end
      if step == steps then break end
    end
    local mean = dist.reduce_tensor(loss)
    dist.print0(("epoch %d done: %d steps per rank, last loss %.4f (mean over %d ranks)"):format(
      epoch, step, mean:item(), dist.get_world_size()))
  end
  loader:close()
  dist.destroy_process_group()
end

-- Returns once every worker has finished; raises naming the rank when one fails.
dl.spawn(worker, args.nprocs or 2, { args = { args.epochs or 1, args.steps or -1 } })
print("all workers finished")
