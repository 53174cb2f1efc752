--- examples/multigpu_demo_v3.lua: demo 3 of the multi-GPU demos (seed multigpu-demos.txt,
-- multigpu_demo_v3.py): processes started by hand, one per node (or several on one
-- machine), that find each other through a file every one of them can reach (`file://` on
-- a shared file system such as NFS) and are told their rank and the world size on the
-- command line. DistributedDataParallel keeps the replicas in step; the file is removed when
-- the last process closes its store. Rank 0 writes the row for examples/compare_demos.lua.
--
--   # node 1, node 2, node 3 (the same file, on a file system all of them see):
--   ddplua examples/multigpu_demo_v3.lua --init_method file:///nfs/job.store --rank 0 --world_size 3
--   ddplua examples/multigpu_demo_v3.lua --init_method file:///nfs/job.store --rank 1 --world_size 3
--   ddplua examples/multigpu_demo_v3.lua --init_method file:///nfs/job.store --rank 2 --world_size 3
--      [--epochs N] [--steps N] [--batch_size B] [--subset N] [--test_subset N]
--      [--results FILE] [--save_models DIR]
--
-- --batch_size is the global batch (each of N processes takes B/N). Devices: cuda:(rank mod
-- the node's device count) with nccl when CUDA is there, else the CPU with gloo. The seed's
-- --gpu_devices (several GPUs per process, DataParallel inside DDP) is left out: DDP takes
-- one device per process here, as PyTorch recommends. Under Slurm, pass --rank
-- $SLURM_PROCID --world_size $SLURM_NTASKS (the seed's sbatch array does the same).
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"
local MetricsFile = require "ddplua.utils.metrics_file"
local clock = require("ddplua.os").monotonic

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "multigpu_demo_v3.lua" }
parser:add_argument("--init_method", { metavar = "URL", help = "file:///path (a file all processes can reach)" })
parser:add_argument("--rank", { type = "number", metavar = "R", help = "this process's rank, 0 .. world_size-1" })
parser:add_argument("--world_size", { type = "number", metavar = "N", help = "number of processes" })
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
parser:add_argument("--batch_size", { type = "number", metavar = "B", help = "global batch size (default 256)" })
parser:add_argument("--subset", { type = "number", metavar = "N", help = "train on the first N samples" })
parser:add_argument("--test_subset", { type = "number", metavar = "N", help = "test on the first N samples" })
parser:add_argument("--results", { metavar = "FILE", help = "rank 0 writes the timing and accuracy row here (CSV)" })
parser:add_argument("--save_models", { metavar = "DIR", help = "every rank writes DIR/final_model_rank<R>.safetensors" })
local args = parser:parse_args(arg)
local epochs, batch_size = args.epochs or 1, args.batch_size or 256

if not (args.init_method and args.rank and args.world_size) then
  error("multigpu_demo_v3.lua: --init_method, --rank and --world_size are required (see --help)", 0)
end
local device = "cpu"
if dl.cuda.is_available() then                           -- no launcher here: rank mod device count
  device = require("ddplua.utils.device").choose("cuda:" .. args.rank % dl.cuda.device_count(),
    { local_rank = false, prog = "multigpu_demo_v3.lua" })
end
dist.init_process_group { backend = device ~= "cpu" and dist.is_nccl_available() and "nccl" or "gloo",
  init_method = args.init_method, rank = args.rank, world_size = args.world_size }
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
dist.print0(("v3: %d processes joined through %s (%s), global batch %d, %d training samples"):format(
  world, args.init_method, device == "cpu" and "cpu" or "cuda", batch_size, n_train))

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
  m:write { method = "v3", processes = world, devices = world, batch_size = batch_size, steps = steps,
    epoch_time_s = epoch_time, batch_time_s = epoch_time / steps, test_accuracy = s[1] / s[2], test_samples = s[2] }
  m:close()
end
loader:close(); test_loader:close()
dist.destroy_process_group()
