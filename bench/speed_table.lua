--- bench/speed_table.lua: one row of the seeds' speed table (seed multigpu-demos.txt,
-- "Performance comparisons": epoch time and batch time per way of training), run by
-- bench/speed_table.sh; bench/speed_table_torch.py is PyTorch's side of the same rows.
--
--   build/ddplua bench/speed_table.lua --model cnn|resnet20 [--batches 20] [--warmup 2]
--                [--batch_size 256] [--threads 1] [--data_parallel]
--   build/ddplua --nproc_per_node=2 --standalone bench/speed_table.lua --model cnn ...   # DDP
--
-- Models and data: the CNN of models/cnn.lua on Fashion-MNIST (shuffled), ResNet-20 of
-- models/resnet.lua on random 32×32×3 images with random labels (made before the clock
-- starts, as CIFAR-10 shaped data). SGD lr 0.05 momentum 0.9, cross-entropy.
-- The "epoch" is --batches batches of --batch_size samples (the global batch: under the
-- launcher each of N ranks takes batch_size / N, DistributedSampler for Fashion-MNIST,
-- DistributedDataParallel over gloo, or nccl on real GPUs), after --warmup batches that are
-- not timed. --data_parallel wraps the model in nn.DataParallel over every CUDA device
-- (the real ones, or those of the simulated device, DDPLUA_CUDA_PLUGIN=build/
-- libddplua_cuda_sim.so: host memory, CPU kernels, devices run one after another).
-- Prints one line (rank 0): "model=<m> method=<single|dp|ddp> processes=<n> devices=<d>
-- batches=<N> epoch_time_s=<s> batch_time_s=<s>": epoch time is the wall time of the N
-- timed batches, data loading included; batch time is the median time of one training
-- step (forward, backward with DDP's all-reduces, optimizer step; loading excluded).
-- Exits with an error naming the option for a bad --model or a batch that does not divide.
local dl = require "ddplua"
local data = require "ddplua.data"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "speed_table.lua" }
parser:add_argument("--model", { metavar = "M", help = "cnn (Fashion-MNIST) or resnet20 (random 32x32x3)" })
parser:add_argument("--batches", { type = "number", metavar = "N", help = "timed batches, the 'epoch' (default 20)" })
parser:add_argument("--warmup", { type = "number", metavar = "N", help = "untimed batches first (default 2)" })
parser:add_argument("--batch_size", { type = "number", metavar = "B", help = "global batch (default 256, as the seed)" })
parser:add_argument("--threads", { type = "number", metavar = "T", help = "threads per process (default 1)" })
parser:add_argument("--data_parallel", { action = "store_true", help = "nn.DataParallel over every CUDA device" })
local args = parser:parse_args(arg)
local model_name = args.model or "cnn"
local batches, warmup = args.batches or 20, args.warmup or 2
local batch_size = args.batch_size or 256
if model_name ~= "cnn" and model_name ~= "resnet20" then
  error("speed_table.lua: --model must be cnn or resnet20, got " .. model_name, 0)
end
dl.set_num_threads(args.threads or 1)

local world, dist = tonumber(os.getenv("WORLD_SIZE") or "1"), nil
if batch_size % world ~= 0 then
  error(("speed_table.lua: --batch_size %d does not divide over %d processes"):format(batch_size, world), 0)
end
local real_cuda = dl.cuda.is_available() and dl.cuda.backend_name() == "cuda"
local device, device_ids = "cpu", {}
if args.data_parallel then
  if not dl.cuda.is_available() then
    error("speed_table.lua: --data_parallel needs CUDA devices (or the simulated ones): " ..
      dl.cuda.unavailable_reason(), 0)
  end
  device = "cuda:0"
  for k = 0, dl.cuda.device_count() - 1 do device_ids[#device_ids + 1] = k end
elseif world > 1 and real_cuda then
  device = require("ddplua.utils.device").choose(nil, { prog = "speed_table.lua" })   -- cuda:LOCAL_RANK
elseif real_cuda then
  device = "cuda:0"
end

dl.manual_seed(0)
local net = model_name == "cnn" and require("models.cnn")() or require("models.resnet")({ depth = 20 })
net:to(device)
local model = net
if args.data_parallel then
  model = nn.DataParallel(net, { device_ids = device_ids })
elseif world > 1 then
  dist = require "ddplua.distributed"
  dist.init_process_group { backend = device ~= "cpu" and dist.is_nccl_available() and "nccl" or "gloo" }
  model = dist.DistributedDataParallel(net, device ~= "cpu" and { device_ids = { device } } or nil)
end
local opt = optim.SGD(net:parameters(), { lr = 0.05, momentum = 0.9 })
local per_rank = batch_size / world

-- next_batch() -> x, y on the CPU: Fashion-MNIST from a DataLoader, or the pre-made random
-- batches of ResNet-20 (generated before timing so that neither side times its RNG).
local next_batch, loader
if model_name == "cnn" then
  local train_set = data.FashionMNIST { train = true }
  local opts = { batch_size = per_rank, shuffle = true, generator = dl.Generator(1) }
  if dist then
    opts.shuffle = nil
    opts.sampler = dist.DistributedSampler(#train_set, { shuffle = true })
  end
  loader = data.DataLoader(train_set, opts)
  local it = loader:iter()
  next_batch = function() return it() end
else
  local xs, ys = {}, {}
  for i = 1, warmup + batches do
    xs[i] = dl.randn({ per_rank, 3, 32, 32 })
    ys[i] = dl.randint(0, 10, { per_rank })
  end
  local i = 0
  next_batch = function() i = i + 1; return xs[i], ys[i] end
end

local sync = device ~= "cpu" and dl.cuda.synchronize or function() end
local step_times, t0 = {}, nil
for i = 1, warmup + batches do
  if i == warmup + 1 then sync(); t0 = clock.now() end
  local x, y = next_batch()
  if x == nil then error("speed_table.lua: the data ran out before " .. (warmup + batches) .. " batches", 0) end
  local s = clock.now()
  opt:zero_grad()
  if not args.data_parallel then x = x:to(device) end      -- DataParallel scatters from the CPU itself
  local loss = nn.functional.cross_entropy(model(x), y:to(device))
  loss:backward()
  opt:step()
  sync()
  if i > warmup then step_times[#step_times + 1] = clock.now() - s end
end
local epoch = clock.now() - t0
if loader then loader:close() end
table.sort(step_times)
local n = #step_times
local median = n % 2 == 1 and step_times[(n + 1) / 2] or (step_times[n / 2] + step_times[n / 2 + 1]) / 2

if not dist or dist.get_rank() == 0 then
  print(("model=%s method=%s processes=%d devices=%d batches=%d epoch_time_s=%.4f batch_time_s=%.5f"):format(
    model_name, args.data_parallel and "dp" or (dist and "ddp" or "single"), world,
    args.data_parallel and #device_ids or world, batches, epoch, median))
end
if dist then dist.destroy_process_group() end
