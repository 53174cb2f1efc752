--- examples/amp_ddp_overview.lua: the program of the "DP and DDP overview" walkthrough
-- (init_ddp, reduce_tensor, get_ddp_generator, convert_sync_batchnorm, GradScaler + autocast,
-- DistributedSampler with set_epoch, rank-0 logging, validation with a metric reduced over
-- ranks), torchrun style.
--
--   ddplua --nproc_per_node=2 examples/amp_ddp_overview.lua [--epochs N] [--steps N] [--subset N]
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local dist = require "ddplua.distributed"                -- import torch.distributed as dist
local DDP = require "ddplua.distributed.ddp"             -- DistributedDataParallel
local DistributedSampler = require "ddplua.distributed.sampler"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "amp_ddp_overview.lua" }
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
parser:add_argument("--subset", { type = "number", metavar = "N", help = "validate on the first N test samples" })
local args = parser:parse_args(arg)

-- init_ddp: env:// (the launcher set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); gloo on the CPU.
local function init_ddp() dist.init_process_group { backend = "gloo", init_method = "env://" } end
-- reduce_tensor: the mean of a tensor over the ranks (all_reduce SUM / world_size).
local reduce_tensor = dist.reduce_tensor
-- get_ddp_generator: a generator seeded seed + rank, so random streams differ per rank.
local function get_ddp_generator(seed) return dist.generator_for_rank(seed or 3407) end

init_ddp()
local rank, world_size = dist.get_rank(), dist.get_world_size()
dl.manual_seed(0)                                        -- DDP broadcasts rank 0's weights anyway
local g = get_ddp_generator()                            -- per rank: dropout masks differ
local model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.BatchNorm1d(256), nn.ReLU(),
                           nn.Dropout(0.1, { generator = g }), nn.Linear(256, 10))
-- model = nn.SyncBatchNorm.convert_sync_batchnorm(model): batch statistics over every rank's batch
model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
local n_sync = 0
for _, m in ipairs(model:modules()) do
  if m:_get_name() == "SyncBatchNorm" then n_sync = n_sync + 1 end
end
dist.print0(("convert_sync_batchnorm: %d SyncBatchNorm layer(s)"):format(n_sync))
model = DDP(model)
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
local scaler = dl.amp.GradScaler()                       -- scaler = GradScaler()
local function autocast(fn) return dl.autocast("cpu", { dtype = "bf16" }, fn) end  -- bf16 on the CPU

-- get_dataloader: each rank reads its own share; the test share counts each sample once.
local train_set, test_set = data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
local sampler = DistributedSampler(train_set, { shuffle = true, seed = 0 })
local train_loader = data.DataLoader(train_set, { batch_size = 32, sampler = sampler })
local n_val = math.min(args.subset or #test_set, #test_set)
local test_loader = data.DataLoader(test_set, { batch_size = 256,
  sampler = DistributedSampler.DistributedEvalSampler(n_val) })

local function train(epoch)                              -- train(model, ..., scaler, args)
  model:train()
  local step = 0
  for x, y in train_loader:iter() do
    opt:zero_grad()
    local loss = autocast(function() return nn.functional.cross_entropy(model(x), y) end)
    scaler:scale(loss):backward()                        -- each rank backprops its own loss;
    scaler:step(opt)                                     -- DDP averaged the gradients
    scaler:update()
    step = step + 1
    local reduced_loss = reduce_tensor(loss)             -- for logging only
    if step % 20 == 0 or step == args.steps then
      dist.print0(("epoch %d step %d loss %.4f scale %g"):format(epoch, step, reduced_loss:item(), scaler:get_scale()))
    end
    if step == args.steps then break end
  end
end

local function validate()                                -- @torch.no_grad() def validate
  model:eval()
  local eval_loss, correct, count = 0, 0, 0
  dl.no_grad(function()
    for x, y in test_loader:iter() do
      local out, loss = autocast(function()               -- with autocast(): output, loss (f32)
        local o = model(x)
        return o, nn.functional.cross_entropy(o, y, { reduction = "sum" })
      end)
      eval_loss, count = eval_loss + loss:item(), count + y:numel()
      correct = correct + out:argmax(2):eq(y):sum():item()
    end
  end)
  -- the metric over all ranks: sums of (loss, correct, count), then the ratios
  local s = dist.sum_over_ranks({ eval_loss, correct, count })
  return s[1] / s[3], s[2] / s[3], s[3]
end

for epoch = 1, args.epochs or 1 do
  if rank == 0 then print(("epoch %d: %d ranks, %d samples per rank"):format(epoch, world_size, sampler:len())) end
  sampler:set_epoch(epoch)                               -- train_dataloader.sampler.set_epoch(epoch)
  train(epoch)
  local val_loss, acc, n = validate()
  dist.print0(("epoch %d validation loss %.4f accuracy %.4f on %d samples"):format(epoch, val_loss, acc, n))
end
train_loader:close(); test_loader:close()
dist.destroy_process_group()
