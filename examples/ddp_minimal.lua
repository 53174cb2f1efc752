--- examples/ddp_minimal.lua: data-parallel training in the torchrun style. The launcher
-- starts the processes and sets RANK, WORLD_SIZE, MASTER_ADDR, ...; each process joins the
-- group from those (env://), reads its share of Fashion-MNIST, and DDP averages gradients.
--
--   ddplua --nproc_per_node=2 examples/ddp_minimal.lua [--epochs N] [--steps N]
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "ddp_minimal.lua" }
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
local args = parser:parse_args(arg)

dist.init_process_group { backend = "gloo" }             -- env:// (the launcher's variables)
dl.manual_seed(0)                                        -- DDP broadcasts rank 0's weights anyway
local model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)))
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
local train_set = data.FashionMNIST { train = true }
local sampler = DistributedSampler(train_set, { shuffle = true, seed = 0 })   -- this rank's share
local loader = data.DataLoader(train_set, { batch_size = 32, sampler = sampler })

for epoch = 1, args.epochs or 1 do
  sampler:set_epoch(epoch)                               -- a new shuffle every epoch
  local step, loss = 0, nil
  for x, y in loader:iter() do                           -- x (32, 1, 28, 28) f32, y (32) i64
    opt:zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss:backward()                                      -- all-reduces gradients bucket by bucket
    opt:step()
    step = step + 1
    if step % 50 == 0 then dist.print0(("epoch %d step %d loss %.4f"):format(epoch, step, loss:item())) end
    if step == args.steps then break end
  end
  local mean = dist.reduce_tensor(loss)                  -- the last batch's loss averaged over ranks
  dist.print0(("epoch %d done: %d steps per rank, last loss %.4f (mean over %d ranks)"):format(
    epoch, step, mean:item(), dist.get_world_size()))
end
loader:close()
dist.destroy_process_group()
