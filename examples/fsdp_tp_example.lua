--- examples/fsdp_tp_example.lua: 2-D parallelism, fully sharded data parallel across the dp
-- dimension and tensor + sequence parallelism across the tp dimension, on a Llama-2-style
-- model (models/llama.lua), ported from pytorch/examples
-- distributed/tensor_parallelism/fsdp_tp_example.py. The world is a (dp, tp) mesh with
-- tp = 2: each tp pair splits every layer Megatron-style (Llama.tp_plan) and the dp
-- groups each take their own batch while FSDP shards the tensor-parallel pieces further and
-- averages their gradients. Each iteration prints rank 0's loss; --check trains one process
-- on the dp groups' batches (their losses averaged, as FSDP's averaged gradients) and prints
-- the largest relative difference of the losses.
--
--   ddplua --nproc_per_node=4 examples/fsdp_tp_example.lua [--iters N] [--check]
package.path = "./?.lua;" .. package.path
local dl = require "ddplua"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local tp = require "ddplua.distributed.tensor.parallel"
local fsdp = require "ddplua.distributed.fsdp"
local Llama = require "models.llama"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "fsdp_tp_example.lua" }
parser:add_argument("--iters", { type = "number", metavar = "N", help = "training iterations (default 10)" })
parser:add_argument("--check", { action = "store_true", help = "also train one process and compare the losses" })
local args = parser:parse_args(arg)

local TP = 2
dist.init_process_group { backend = "gloo" }
local world = dist.get_world_size()
if world % TP ~= 0 then error(("fsdp_tp_example: the world size (%d) must be a multiple of tp = %d"):format(world, TP)) end
local DP = world / TP
local mesh = dist.init_device_mesh("cpu", { DP, TP }, { mesh_dim_names = { "dp", "tp" } })
local dp_rank = mesh:get_coordinate()[1]
dist.print0(("Device mesh created: %s"):format(tostring(mesh)))

-- The example's simple_llama2_config, smaller (dim 256, 2 layers, 16 heads, 32000 words there).
local CONFIG = { dim = 32, n_layers = 2, n_heads = 4, vocab_size = 64, multiple_of = 16, max_seq_len = 16 }
local function llama()
  dl.manual_seed(0)                                    -- the same weights on every rank
  return Llama(CONFIG)
end

local model = tp.parallelize_module(llama(), mesh["tp"], Llama.tp_plan(CONFIG, TP))
for _, layer in ipairs(model.layers:list()) do fsdp.fully_shard(layer, { mesh = mesh["dp"] }) end
fsdp.fully_shard(model, { mesh = mesh["dp"] })
local opt = optim.AdamW(model:parameters(), { lr = 3e-3 })  -- built after fully_shard

-- Batch of dp group g at iteration i: the same on the tp ranks of the group.
local function batch(i, g)
  dl.manual_seed(1000 * i + g)
  return dl.randint(0, CONFIG.vocab_size, { 4, 12 }, { dtype = "i64" })
end

local losses = {}
for i = 1, args.iters or 10 do
  local out = model(batch(i, dp_rank))
  local loss = out:sum()
  opt:zero_grad()
  loss:backward()
  opt:step()
  losses[i] = loss:item()
  dist.print0(("2D iter %d complete, loss %.6f"):format(i, losses[i]))
end
if args.check then
  local alone = llama()
  local o = optim.AdamW(alone:parameters(), { lr = 3e-3 })
  local worst = 0
  for i = 1, #losses do
    o:zero_grad()
    local total, own = nil, nil
    for g = 0, DP - 1 do
      local l = alone(batch(i, g)):sum()
      if g == dp_rank then own = l:item() end
      total = total and total + l or l
    end
    ;(total / DP):backward()                             -- FSDP averages over the dp groups
    o:step()
    worst = math.max(worst, math.abs(own - losses[i]) / math.max(1, math.abs(own)))
  end
  dist.print0(("largest relative loss difference against one process: %.3g"):format(worst))
end
dist.print0("2D training successfully completed!")
