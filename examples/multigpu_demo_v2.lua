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
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local demo = require "examples.lib.multigpu_demo"    -- what the three demos share

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "multigpu_demo_v2.lua" }
demo.add_arguments(parser, { batch_help = "global batch size (default 256)",
  results_help = "rank 0 writes the timing and accuracy row here (CSV)", save_models = true })
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

local sampler, loader, test_loader, n_train = demo.loaders(args, batch_size, world, rank)  -- B/N per process
dist.print0(("v2: %d processes on one node (%s), global batch %d, %d training samples"):format(
  world, device == "cpu" and "cpu" or "cuda:LOCAL_RANK", batch_size, n_train))

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
  demo.write_results(args.results, { method = "v2", processes = world, devices = world, batch_size = batch_size,
    steps = steps, epoch_time_s = epoch_time, batch_time_s = epoch_time / steps, test_accuracy = s[1] / s[2],
    test_samples = s[2] })
end
loader:close(); test_loader:close()
dist.destroy_process_group()
