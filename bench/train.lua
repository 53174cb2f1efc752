--- bench/train.lua: training throughput of one model on Fashion-MNIST, for the side-by-side
-- comparison with PyTorch (bench/train_torch.py does the same there).
--   build/ddplua bench/train.lua --model cnn|mlp --threads N [--steps 200] [--warmup 20] [--amp bf16|f16]
--   build/ddplua --nproc_per_node=2 bench/train.lua --model cnn --threads 1   # DDP
-- Prints one line (rank 0): "model=<m> threads=<n> amp=<a> samples_per_s=<x> peak_rss_mb=<y>";
-- --amp runs the forward under dl.autocast("cpu", {dtype = ...}) (f16 adds a GradScaler),
-- as train.lua --amp does (ddplua.utils.mixed_precision);
-- under the launcher the model is wrapped in DDP, each rank takes batches of 64 from its
-- DistributedSampler shard, and samples/s counts all ranks.
-- Same model, data, batch size (64) and optimizer (SGD lr 0.05 momentum 0.9) as train.lua;
-- the timed steps exclude the warm-up steps and the data loading set-up.
local dl = require "ddplua"
local data = require "ddplua.data"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"

local model_name, threads, steps, warmup, amp_mode = "cnn", 1, 200, 20, nil
for i = 1, #arg do
  if arg[i] == "--model" then model_name = arg[i + 1] end
  if arg[i] == "--threads" then threads = tonumber(arg[i + 1]) end
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--warmup" then warmup = tonumber(arg[i + 1]) end
  if arg[i] == "--amp" then amp_mode = arg[i + 1] end
end
dl.set_num_threads(threads)
dl.manual_seed(0)

local world, dist = tonumber(os.getenv("WORLD_SIZE") or "1"), nil
local model = require("models." .. model_name)()
local net = model
local train_set = data.FashionMNIST { train = true }
local loader_opts = { batch_size = 64, shuffle = true, generator = dl.Generator(1) }
if world > 1 then
  dist = require "ddplua.distributed"
  dist.init_process_group { backend = "gloo" }
  net = dist.DistributedDataParallel(model)
  loader_opts.shuffle = nil
  loader_opts.sampler = dist.DistributedSampler(#train_set, { shuffle = true })
end
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
local loader = data.DataLoader(train_set, loader_opts)
local amp = require("ddplua.utils.mixed_precision").new(amp_mode, "cpu", "bench/train.lua")

-- Epoch after epoch until warm-up + steps batches ran (as bench/train_torch.py): --steps
-- beyond one epoch (938 batches in one process, 469 per rank of 2) keep counting real steps.
local done, t0, epoch = 0, nil, 0
while done < warmup + steps do
  if loader_opts.sampler then loader_opts.sampler:set_epoch(epoch) end
  for x, y in loader:iter() do
    if done == warmup then t0 = clock.now() end
    opt:zero_grad()
    local loss = amp:run(function() return dl.cross_entropy(net(x), y) end)
    amp:backward(loss)
    amp:step(opt)
    done = done + 1
    if done == warmup + steps then break end
  end
  epoch = epoch + 1
end
local seconds = clock.now() - t0
loader:close()

local peak_rss = require("ddplua.os").resource_usage().peak_rss_bytes
if not dist or dist.get_rank() == 0 then
  print(("model=%s threads=%d amp=%s samples_per_s=%.1f peak_rss_mb=%.1f"):format(model_name, threads,
    amp_mode or "f32", world * steps * 64 / seconds, peak_rss / 2^20))
end
if dist then dist.destroy_process_group() end
