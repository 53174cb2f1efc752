--- examples/multigpu_demo_v2.lua: demo 2 of the multi-GPU demos (seed multigpu-demos.txt,
-- multigpu_demo_v2.py): N processes on one node, started by the launcher (the seed's
-- `python -m torch.distributed.launch --nproc_per_node=2`), each with its own device and
-- DistributedDataParallel keeping the replicas in step. The CNN of models/cnn.lua trains on
-- Fashion-MNIST; rank 0 writes the timing and accuracy row for examples/compare_demos.lua.
--
--   ddplua --nproc_per_node=2 examples/multigpu_demo_v2.lua [--epochs N] [--steps N]
--          [--batch_size B] [--subset N] [--test_subset N] [--results FILE] [--save_models DIR]
--
-- --batch_size is the global batch (each of N processes takes B/N), so every demo sees the
-- same batches. Devices: cuda:LOCAL_RANK with nccl when CUDA is there, else the CPU with gloo.
-- --save_models DIR: every rank writes DIR/final_model_rank<R>.safetensors, which `ddplua
-- verify` compares (the seed's compare_models.py step).
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"
local MetricsFile = require "ddplua.utils.metrics_file"
local clock = require("ddplua.os").monotonic

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "multigpu_demo_v2.lua" }
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
parser:add_argument("--batch_size", { type = "number", metavar = "B", help = "global batch size (default 256)" })
parser:add_argument("--subset", { type = "number", metavar = "N", help = "train on the first N samples" })
parser:add_argument("--test_subset", { type = "number", metavar = "N", help = "test on the first N samples" })
parser:add_argument("--results", { metavar = "FILE", help = "rank 0 writes the timing and accuracy row here (CSV)" })
parser:add_argument("--save_models", { metavar = "DIR", help = "every rank writes DIR/final_model_rank<R>.safetensors" })
local args = parser:parse_args(arg)
local epochs, batch_size = args.epochs or 1, args.batch_size or 256

local device = require("ddplua.utils.device").choose(nil, { prog = "multigpu_demo_v2.lua" })  -- cuda:LOCAL_RANK or cpu
dist.init_process_group { backend = device ~= "cpu" and dist.is_nccl_available() and "nccl" or "gloo" }  -- env://
local rank, world = dist.get_rank(), dist.get_world_size()
if batch_size % world ~= 0 then error(("--batch_size %d does not divide over %d processes"):format(batch_size, world), 0) end

dl.manual_seed(0)                                        -- DDP broadcasts rank 0's weights anyway
local net = require("models.cnn")()
net:to(device)
local model = DDP(net, device ~= "cpu" and { device_ids = { device } } or nil)
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })

local train_set, test_set = data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
local n_train = math.min(args.subset or #train_set, #train_set)
local n_test = math.min(args.test_subset or #test_set, #test_set)
local sampler = DistributedSampler(n_train, { num_replicas = world, rank = rank, shuffle = true, seed = 0 })
local loader = data.DataLoader(train_set, { batch_size = batch_size / world, sampler = sampler })
local test_loader = data.DataLoader(test_set, { batch_size = 256,
  sampler = DistributedSampler.DistributedEvalSampler(n_test, { num_replicas = world, rank = rank }) })
dist.print0(("v2: %d processes on one node (%s), global batch %d, %d training samples"):format(
  world, device == "cpu" and "cpu" or "cuda:LOCAL_RANK", batch_size, n_train))

local epoch_time, steps, loss
for epoch = 1, epochs do
  sampler:set_epoch(epoch)
  model:train()
  local start = clock()
  steps = 0
  for x, y in loader:iter() do                           -- x (B/N, 1, 28, 28) f32, y (B/N) i64
    opt:zero_grad()
    loss = nn.functional.cross_entropy(model(x), y:to(device))
    loss:backward()                                      -- all-reduces gradients bucket by bucket
    opt:step()
    steps = steps + 1
    if steps == args.steps then break end
  end
  if device ~= "cpu" then dl.cuda.synchronize() end
  epoch_time = clock() - start
  local mean = dist.reduce_tensor(loss:detach())         -- the last batch's loss averaged over ranks
  dist.print0(("epoch %d: %d steps, last loss %.6f, epoch time %.3f s, batch time %.4f s"):format(
    epoch, steps, mean:item(), epoch_time, epoch_time / steps))
end

local correct, count = 0, 0
model:eval()
dl.no_grad(function()
  for x, y in test_loader:iter() do
    correct = correct + model(x):argmax(2):eq(y:to(device)):sum():item()
    count = count + y:numel()
  end
end)
local s = dist.sum_over_ranks({ correct, count })      -- each test sample counted once
dist.print0(("test accuracy %.4f on %d samples"):format(s[1] / s[2], s[2]))
if args.save_models then
  require("ddplua.os").mkdir_p(args.save_models)
  require("ddplua.train_state").save_model(("%s/final_model_rank%d.safetensors"):format(args.save_models, rank), net)
end
if args.results and rank == 0 then
  local m = MetricsFile.open(args.results, { { "method", "%s" }, { "processes", "%d" }, { "devices", "%d" },
    { "batch_size", "%d" }, { "steps", "%d" }, { "epoch_time_s", "%.4f" }, { "batch_time_s", "%.5f" },
    { "test_accuracy", "%.4f" }, { "test_samples", "%d" } })
  m:write { method = "v2", processes = world, devices = world, batch_size = batch_size, steps = steps,
    epoch_time_s = epoch_time, batch_time_s = epoch_time / steps, test_accuracy = s[1] / s[2], test_samples = s[2] }
  m:close()
end
loader:close(); test_loader:close()
dist.destroy_process_group()
