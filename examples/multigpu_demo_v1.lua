--- examples/multigpu_demo_v1.lua: demo 1 of the multi-GPU demos (seed multigpu-demos.txt,
-- multigpu_demo_v1.py): one process, nn.DataParallel. Each batch is cut into one piece per
-- device, the model is replicated on every device, each piece runs forward on its replica
-- and the gradients sum back onto the model (lua/ddplua/nn/data_parallel.lua, Note [data
-- parallel]). The CNN of models/cnn.lua trains on Fashion-MNIST; the epoch time, the mean
-- batch time and the test accuracy go to --results for examples/compare_demos.lua.
--
--   ddplua examples/multigpu_demo_v1.lua [--epochs N] [--steps N] [--batch_size B]
--          [--subset N] [--test_subset N] [--single] [--results FILE]
--
-- Devices: every CUDA device (cuda:0 holds the model); without CUDA, DataParallel runs the
-- model unchanged on the CPU. --single trains without DataParallel on one device: the
-- seed's "single gpu" row of the comparison.
local dl = require "ddplua"
local nn, optim = require "ddplua.nn", require "ddplua.optim"
local demo = require "examples.lib.multigpu_demo"    -- what the three demos share

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "multigpu_demo_v1.lua" }
demo.add_arguments(parser, { batch_help = "batch size (default 256, as the seed)",
  results_help = "write the timing and accuracy row here (CSV)" })
parser:add_argument("--single", { action = "store_true", help = "no DataParallel: one device (the baseline row)" })
local args = parser:parse_args(arg)
local epochs, batch_size = args.epochs or 1, args.batch_size or 256

local cuda = dl.cuda.is_available()
local device = cuda and "cuda:0" or "cpu"
local device_ids = {}
if cuda then for k = 0, (args.single and 0 or dl.cuda.device_count() - 1) do device_ids[#device_ids + 1] = k end end

dl.manual_seed(0)
local net = require("models.cnn")()
net:to(device)                                           -- before the optimizer takes the parameters
local model = args.single and net or nn.DataParallel(net, { device_ids = device_ids })
local opt = optim.SGD(net:parameters(), { lr = 0.05, momentum = 0.9 })

local sampler, loader, test_loader, n_train = demo.loaders(args, batch_size, 1, 0)  -- one process
local method = args.single and "single" or "v1"
print(("%s: %s, %d device(s) (%s), batch %d, %d training samples"):format(method,
  args.single and "one device" or "DataParallel", math.max(#device_ids, 1), device, batch_size, n_train))

-- Each step: DataParallel scatters the batch from anywhere (--single moves it to the
-- device), gathers the outputs on device_ids[1], and backward sums the replicas' gradients
-- onto net's.
local epoch_time, steps, loss
for epoch = 1, epochs do
  sampler:set_epoch(epoch)
  steps, loss, epoch_time = demo.train_epoch(model, opt, loader, args.steps,
    { device = device, move_inputs = args.single, synchronize = cuda })
  print(("epoch %d: %d steps, last loss %.6f, epoch time %.3f s, batch time %.4f s"):format(
    epoch, steps, loss:item(), epoch_time, epoch_time / steps))
end

local correct, count = demo.evaluate(model, test_loader, device, args.single)
print(("test accuracy %.4f on %d samples"):format(correct / count, count))
if args.results then
  demo.write_results(args.results, { method = method, processes = 1, devices = math.max(#device_ids, 1),
    batch_size = batch_size, steps = steps, epoch_time_s = epoch_time, batch_time_s = epoch_time / steps,
    test_accuracy = correct / count, test_samples = count })
end
loader:close(); test_loader:close()
