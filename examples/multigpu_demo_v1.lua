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
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local DistributedSampler = require "ddplua.distributed.sampler"
local MetricsFile = require "ddplua.utils.metrics_file"
local clock = require("ddplua.os").monotonic

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "multigpu_demo_v1.lua" }
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
parser:add_argument("--batch_size", { type = "number", metavar = "B", help = "batch size (default 256, as the seed)" })
parser:add_argument("--subset", { type = "number", metavar = "N", help = "train on the first N samples" })
parser:add_argument("--test_subset", { type = "number", metavar = "N", help = "test on the first N samples" })
parser:add_argument("--single", { action = "store_true", help = "no DataParallel: one device (the baseline row)" })
parser:add_argument("--results", { metavar = "FILE", help = "write the timing and accuracy row here (CSV)" })
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

local train_set, test_set = data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
local n_train = math.min(args.subset or #train_set, #train_set)
local n_test = math.min(args.test_subset or #test_set, #test_set)
local sampler = DistributedSampler(n_train, { num_replicas = 1, rank = 0, shuffle = true, seed = 0 })
local loader = data.DataLoader(train_set, { batch_size = batch_size, sampler = sampler })
local test_loader = data.DataLoader(test_set, { batch_size = 256,
  sampler = DistributedSampler.DistributedEvalSampler(n_test, { num_replicas = 1, rank = 0 }) })
local method = args.single and "single" or "v1"
print(("%s: %s, %d device(s) (%s), batch %d, %d training samples"):format(method,
  args.single and "one device" or "DataParallel", math.max(#device_ids, 1), device, batch_size, n_train))

local epoch_time, steps, loss
for epoch = 1, epochs do
  sampler:set_epoch(epoch)
  model:train()
  local start = clock()
  steps = 0
  for x, y in loader:iter() do                           -- x (B, 1, 28, 28) f32, y (B) i64
    opt:zero_grad()
    if args.single then x = x:to(device) end            -- DataParallel scatters from anywhere
    loss = nn.functional.cross_entropy(model(x), y:to(device))  -- outputs gathered on device_ids[1]
    loss:backward()                                      -- replicas' gradients sum onto net's
    opt:step()
    steps = steps + 1
    if steps == args.steps then break end
  end
  if cuda then dl.cuda.synchronize() end
  epoch_time = clock() - start
  print(("epoch %d: %d steps, last loss %.6f, epoch time %.3f s, batch time %.4f s"):format(
    epoch, steps, loss:item(), epoch_time, epoch_time / steps))
end

local correct, count = 0, 0
model:eval()
dl.no_grad(function()
  for x, y in test_loader:iter() do
    if args.single then x = x:to(device) end
    correct = correct + model(x):argmax(2):eq(y:to(device)):sum():item()
    count = count + y:numel()
  end
end)
print(("test accuracy %.4f on %d samples"):format(correct / count, count))
if args.results then
  local m = MetricsFile.open(args.results, { { "method", "%s" }, { "processes", "%d" }, { "devices", "%d" },
    { "batch_size", "%d" }, { "steps", "%d" }, { "epoch_time_s", "%.4f" }, { "batch_time_s", "%.5f" },
    { "test_accuracy", "%.4f" }, { "test_samples", "%d" } })
  m:write { method = method, processes = 1, devices = math.max(#device_ids, 1), batch_size = batch_size,
    steps = steps, epoch_time_s = epoch_time, batch_time_s = epoch_time / steps,
    test_accuracy = correct / count, test_samples = count }
  m:close()
end
loader:close(); test_loader:close()
