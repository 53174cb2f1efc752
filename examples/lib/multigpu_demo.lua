--- examples/lib/multigpu_demo.lua: what the three multi-GPU demos (examples/multigpu_demo_v1.lua,
-- _v2.lua, _v3.lua; seed multigpu-demos.txt) share: their common command-line options, the
-- Fashion-MNIST loaders cut over the processes, one training epoch, the test accuracy, and
-- the results row for examples/compare_demos.lua. Each demo keeps what makes it that demo:
-- how its processes start, find each other and choose their devices, and how it wraps the
-- model (DataParallel or DistributedDataParallel).
--
--   local demo = require "examples.lib.multigpu_demo"   -- from the repository root
local data = require "ddplua.data"
local nn = require "ddplua.nn"
local dl = require "ddplua"
local DistributedSampler = require "ddplua.distributed.sampler"
local MetricsFile = require "ddplua.utils.metrics_file"
local clock = require("ddplua.os").monotonic

local M = {}

--- Add the options every demo takes to an argparse parser: --epochs, --steps, --batch_size,
-- --subset, --test_subset, --results, and --save_models when opts.save_models. opts.batch_help
-- and opts.results_help: the demo's help texts for --batch_size and --results.
function M.add_arguments(parser, opts)
  parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
  parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
  parser:add_argument("--batch_size", { type = "number", metavar = "B", help = opts.batch_help })
  parser:add_argument("--subset", { type = "number", metavar = "N", help = "train on the first N samples" })
  parser:add_argument("--test_subset", { type = "number", metavar = "N", help = "test on the first N samples" })
  parser:add_argument("--results", { metavar = "FILE", help = opts.results_help })
  if opts.save_models then
    parser:add_argument("--save_models", { metavar = "DIR", help = "every rank writes DIR/final_model_rank<R>.safetensors" })
  end
end

--- The Fashion-MNIST loaders of process `rank` of `world`: the training set (its first
-- args.subset samples) shuffled by a DistributedSampler (seed 0, set_epoch per epoch) in
-- batches of batch_size / world samples, and the test set (its first args.test_subset) in
-- batches of 256 with every sample on exactly one process. Returns sampler, loader,
-- test_loader, n_train (samples in the training subset). batch_size: the global batch.
function M.loaders(args, batch_size, world, rank)
  local train_set, test_set = data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
  local n_train = math.min(args.subset or #train_set, #train_set)
  local n_test = math.min(args.test_subset or #test_set, #test_set)
  local sampler = DistributedSampler(n_train, { num_replicas = world, rank = rank, shuffle = true, seed = 0 })
  local loader = data.DataLoader(train_set, { batch_size = batch_size / world, sampler = sampler })
  local test_loader = data.DataLoader(test_set, { batch_size = 256,
    sampler = DistributedSampler.DistributedEvalSampler(n_test, { num_replicas = world, rank = rank }) })
  return sampler, loader, test_loader, n_train
end

--- One training epoch of model with opt on loader's batches (x (B, 1, 28, 28) f32, y (B)
-- i64), cross-entropy loss, at most `steps` steps (nil: all). opts.device: where the labels
-- (and, with opts.move_inputs, the inputs) go; opts.synchronize: wait for the CUDA device
-- before reading the clock. Returns steps, the last batch's loss (a tensor), seconds.
function M.train_epoch(model, opt, loader, steps, opts)
  model:train()
  local start = clock()
  local n, loss = 0, nil
  for x, y in loader:iter() do
    opt:zero_grad()
    if opts.move_inputs then x = x:to(opts.device) end
    loss = nn.functional.cross_entropy(model(x), y:to(opts.device))
    loss:backward()
    opt:step()
    n = n + 1
    if n == steps then break end
  end
  if opts.synchronize then dl.cuda.synchronize() end
  return n, loss, clock() - start
end

--- The test samples of test_loader that model classifies right (argmax of its logits):
-- returns correct, count (this process's share). device and move_inputs as train_epoch's.
function M.evaluate(model, test_loader, device, move_inputs)
  local correct, count = 0, 0
  model:eval()
  dl.no_grad(function()
    for x, y in test_loader:iter() do
      if move_inputs then x = x:to(device) end
      correct = correct + model(x):argmax(2):eq(y:to(device)):sum():item()
      count = count + y:numel()
    end
  end)
  return correct, count
end

--- Write the demo's row (method, processes, devices, batch_size, steps, epoch_time_s (s),
-- batch_time_s (s), test_accuracy, test_samples) to the CSV file at path, the columns
-- examples/compare_demos.lua reads.
function M.write_results(path, row)
  local m = MetricsFile.open(path, { { "method", "%s" }, { "processes", "%d" }, { "devices", "%d" },
    { "batch_size", "%d" }, { "steps", "%d" }, { "epoch_time_s", "%.4f" }, { "batch_time_s", "%.5f" },
    { "test_accuracy", "%.4f" }, { "test_samples", "%d" } })
  m:write(row)
  m:close()
end

--- Save net's weights as dir/final_model_rank<rank>.safetensors (dir created), the files
-- `ddplua verify` compares (the seed's compare_models.py step).
function M.save_model(dir, rank, net)
  require("ddplua.os").mkdir_p(dir)
  require("ddplua.train_state").save_model(("%s/final_model_rank%d.safetensors"):format(dir, rank), net)
end

return M
