--- bench/comm_hooks.lua: DDP communication hooks (ddp:register_comm_hook) on Fashion-MNIST:
-- bytes handed to all-reduces per step and step time for each hook, or the test accuracy
-- after some epochs.
--   build/ddplua --nproc_per_node=2 --standalone bench/comm_hooks.lua --model cnn|mlp \
--     --hook none|allreduce|fp16|bf16|powersgd [--psgd-rank 2] [--steps 60] [--warmup 10]
--   ... bench/comm_hooks.lua --model cnn --hook powersgd --epochs 3     # accuracy mode
-- Timing mode prints (rank 0) "model=<m> hook=<h> bytes_per_step=<b> ms_per_step=<t>":
-- bytes_per_step is what one rank hands to all-reduces per step in the wire dtype (no hook:
-- the f32 buckets; a built-in hook: ddp:comm_hook_bytes()); ms_per_step the mean wall time
-- of the timed steps (forward, backward with the reduction, SGD step), data loading included.
-- PowerSGD (matrix_approximation_rank --psgd-rank, error feedback and warm start on) starts
-- compressing at step --warmup (timing) or after 10 steps (accuracy), so the timed steps are
-- compressed. Accuracy mode: --epochs E over the whole training set (batch 64 per rank, SGD
-- lr 0.05 momentum 0.9, cosine annealing as configs/fashion_mnist_cnn.lua), then rank 0
-- evaluates on the 10 000 test samples and prints "... test_acc=<a> seconds=<s>".
local dl = require "ddplua"
local data = require "ddplua.data"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"
local dist = require "ddplua.distributed"

local model_name, hook_name, steps, warmup, epochs, psgd_rank = "cnn", "none", 60, 10, nil, 2
for i = 1, #arg do
  if arg[i] == "--model" then model_name = arg[i + 1] end
  if arg[i] == "--hook" then hook_name = arg[i + 1] end
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--warmup" then warmup = tonumber(arg[i + 1]) end
  if arg[i] == "--epochs" then epochs = tonumber(arg[i + 1]) end
  if arg[i] == "--psgd-rank" then psgd_rank = tonumber(arg[i + 1]) end
end
dl.set_num_threads(1)
dl.manual_seed(0)
dist.init_process_group { backend = "gloo" }
local rank, world = dist.get_rank(), dist.get_world_size()

local model = require("models." .. model_name)()
local net = dist.DistributedDataParallel(model)
local hooks = dist.algorithms.ddp_comm_hooks
local psgd_state
if hook_name == "powersgd" then
  psgd_state = hooks.powerSGD_hook.PowerSGDState {
    matrix_approximation_rank = psgd_rank, start_powerSGD_iter = epochs and 10 or math.max(warmup, 2) }
  net:register_comm_hook(psgd_state, hooks.powerSGD_hook.powerSGD_hook)
elseif hook_name ~= "none" then
  local hook = ({ allreduce = hooks.default_hooks.allreduce_hook, fp16 = hooks.default_hooks.fp16_compress_hook,
                  bf16 = hooks.default_hooks.bf16_compress_hook })[hook_name]
  assert(hook, "unknown --hook " .. hook_name)
  net:register_comm_hook(nil, hook)
end

local train_set = data.FashionMNIST { train = true }
local sampler = dist.DistributedSampler(#train_set, { shuffle = true, seed = 0 })
local loader = data.DataLoader(train_set, { batch_size = 64, sampler = sampler })
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })

local f32_bytes = 0
for _, p in ipairs(model:parameters()) do f32_bytes = f32_bytes + 4 * p:numel() end
local function hook_bytes() return hook_name == "none" and 0 or net:comm_hook_bytes() end

local function step(x, y)
  opt:zero_grad()
  dl.cross_entropy(net(x), y):backward()
  opt:step()
end

if not epochs then
  local done, t0, b0 = 0, nil, nil
  for x, y in loader:iter() do
    if done == warmup then t0, b0 = clock.now(), hook_bytes() end
    step(x, y)
    done = done + 1
    if done == warmup + steps then break end
  end
  local seconds = clock.now() - t0
  local bytes = hook_name == "none" and f32_bytes or (hook_bytes() - b0) / steps
  loader:close()
  if rank == 0 then
    print(("model=%s hook=%s bytes_per_step=%d ms_per_step=%.3f"):format(model_name, hook_name, bytes,
      1e3 * seconds / steps))
  end
else
  local sched = optim.CosineAnnealingLR(opt, { T_max = epochs * #loader })
  local t0 = clock.now()
  for epoch = 1, epochs do
    sampler:set_epoch(epoch - 1)
    for x, y in loader:iter() do
      step(x, y)
      sched:step()
    end
  end
  local seconds = clock.now() - t0
  loader:close()
  if rank == 0 then
    local test = data.DataLoader(data.FashionMNIST { train = false }, { batch_size = 256 })
    local correct, count = 0, 0
    model:eval()
    dl.no_grad(function()
      for x, y in test:iter() do
        correct = correct + model(x):argmax(2):eq(y):sum():item()
        count = count + y:numel()
      end
    end)
    test:close()
    local extra = psgd_state and (" compress_rate=%.1f"):format((psgd_state:compression_stats())) or ""
    print(("model=%s hook=%s epochs=%d test_acc=%.4f seconds=%.1f%s"):format(model_name, hook_name, epochs,
      correct / count, seconds, extra))
  end
end
dist.destroy_process_group()
