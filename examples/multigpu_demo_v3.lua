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
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local demo = require "examples.lib.multigpu_demo"    -- what the three demos share

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "multigpu_demo_v3.lua" }
parser:add_argument("--init_method", { metavar = "URL", help = "file:///path (a file all processes can reach)" })
parser:add_argument("--rank", { type = "number", metavar = "R", help = "this process's rank, 0 .. world_size-1" })
parser:add_argument("--world_size", { type = "number", metavar = "N", help = "number of processes" })
demo.add_arguments(parser, { batch_help = "global batch size (default 256)",
  results_help = "rank 0 writes the timing and accuracy row here (CSV)", save_models = true })
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

local sampler, loader, test_loader, n_train = demo.loaders(args, batch_size, world, rank)  -- B/N per process
dist.print0(("v3: %d processes joined through %s (%s), global batch %d, %d training samples"):format(
  world, args.init_method, device == "cpu" and "cpu" or "cuda", batch_size, n_train))

-- Each step: backward all-reduces the gradients bucket by bucket, so every replica steps
-- with the same averaged gradients.
local epoch_time, steps, loss
for epoch = 1, epochs do
  sampler:set_epoch(epoch)
  steps, loss, epoch_time = demo.train_epoch(model, opt, loader, args.steps,
    { device = device, synchronize = device ~= "cpu" })
  local mean = dist.reduce_tensor(loss:detach())         -- the last batch's loss averaged over ranks
  dist.print0(("epoch %d: %d steps, last loss %.6f, epoch time %.3f s, batch time %.4f s"):format(
    epoch, steps, mean:item(), epoch_time, epoch_time / steps))
end

local s = dist.sum_over_ranks({ demo.evaluate(model, test_loader, device) })  -- each test sample counted once
dist.print0(("test accuracy %.4f on %d samples"):format(s[1] / s[2], s[2]))
if args.save_models then demo.save_model(args.save_models, rank, net) end
if args.results and rank == 0 then
  demo.write_results(args.results, { method = "v3", processes = world, devices = world, batch_size = batch_size,
    steps = steps, epoch_time_s = epoch_time, batch_time_s = epoch_time / steps, test_accuracy = s[1] / s[2],
    test_samples = s[2] })
end
loader:close(); test_loader:close()
dist.destroy_process_group()
