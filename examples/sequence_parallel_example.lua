--- examples/sequence_parallel_example.lua: sequence parallelism (Megatron-LM, Korthikanti et
-- al. 2022, arXiv:2205.05198) on a toy model, ported from pytorch/examples
-- distributed/tensor_parallelism/sequence_parallel_example.py. Each rank holds its own part
-- of the sequence: the first Linear all-gathers the input (ColwiseParallel with
-- input_layouts = Shard(1): dimension 1 is the sequence here, PyTorch's Shard(0)), the
-- second reduce-scatters its output back to sequence pieces (RowwiseParallel with
-- output_layouts = Shard(1)). Each rank's loss is the sum of its piece of the output; their
-- sum is the loss of the whole sequence on one process (--check trains that run too and
-- prints the largest difference).
--
--   ddplua --nproc_per_node=4 examples/sequence_parallel_example.lua [--iters N] [--check]
local dl = require "ddplua"
local nn, optim = require "ddplua.nn", require "ddplua.optim"
local dist = require "ddplua.distributed"
local dt = require "ddplua.distributed.tensor"
local tp = require "ddplua.distributed.tensor.parallel"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "sequence_parallel_example.lua" }
parser:add_argument("--iters", { type = "number", metavar = "N", help = "training iterations (default 10)" })
parser:add_argument("--check", { action = "store_true", help = "also train one process on the whole sequence" })
local args = parser:parse_args(arg)

local ToyModel = nn.Module:extend("ToyModel")
function ToyModel:init()
  self.in_proj = nn.Linear(10, 32)
  self.relu = nn.ReLU()
  self.out_proj = nn.Linear(32, 5)
end
function ToyModel:forward(x) return self.out_proj(self.relu(self.in_proj(x))) end

local function toy_model()
  dl.manual_seed(0)
  return ToyModel()
end

dist.init_process_group { backend = "gloo" }
local world, rank = dist.get_world_size(), dist.get_rank()
local mesh = dist.init_device_mesh("cpu", { world }, { mesh_dim_names = { "tp" } })

local model = tp.parallelize_module(toy_model(), mesh, {
  in_proj = tp.ColwiseParallel { input_layouts = dt.Shard(1) },
  out_proj = tp.RowwiseParallel { output_layouts = dt.Shard(1) },
})
local opt = optim.AdamW(model:parameters(), { lr = 0.25 })

local SEQ = 4 * world -- rows of the whole sequence; each rank holds 4
local function train(m, o, first, count)
  local losses = {}
  for i = 1, args.iters or 10 do
    dl.manual_seed(i)
    local inp = dl.rand { SEQ, 10 }:narrow(1, first, count) -- this rank's part of the sequence
    local loss = m(inp):sum()
    o:zero_grad()
    loss:backward()
    o:step()
    losses[i] = loss:item()
  end
  return losses
end

local losses = train(model, opt, rank * 4 + 1, 4)
local total = {}
for i, l in ipairs(losses) do
  local t = dl.tensor { l }
  dist.all_reduce(t)                                     -- the whole sequence's loss
  total[i] = t:item()
  dist.print0(("Sequence Parallel iter %d completed, loss %.6f (rank 0's part %.6f)"):format(i, total[i], l))
end
if args.check then
  local alone = toy_model()
  local ref = train(alone, optim.AdamW(alone:parameters(), { lr = 0.25 }), 1, SEQ)
  local worst = 0
  for i = 1, #ref do worst = math.max(worst, math.abs(ref[i] - total[i]) / math.max(1, math.abs(ref[i]))) end
  dist.print0(("largest relative loss difference against one process: %.3g"):format(worst))
end
dist.print0("Sequence Parallel training completed!")
