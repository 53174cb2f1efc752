--- examples/tensor_parallel_example.lua: Megatron-LM style tensor parallelism on a toy model,
-- ported from pytorch/examples distributed/tensor_parallelism/tensor_parallel_example.py.
-- The first Linear is cut by columns of its output (ColwiseParallel), the second by rows of
-- its input (RowwiseParallel), so the ReLU between them runs on each rank's own columns and
-- one all-reduce after the second layer gives every rank the whole output. Every rank feeds
-- the same input (the tensor-parallel ranks see one batch); each iteration prints the loss,
-- which equals a one-process run's (--check trains that run too and prints the difference).
--
--   ddplua --nproc_per_node=4 examples/tensor_parallel_example.lua [--iters N] [--check]
local dl = require "ddplua"
local nn, optim = require "ddplua.nn", require "ddplua.optim"
local dist = require "ddplua.distributed"
local tp = require "ddplua.distributed.tensor.parallel"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "tensor_parallel_example.lua" }
parser:add_argument("--iters", { type = "number", metavar = "N", help = "training iterations (default 10)" })
parser:add_argument("--check", { action = "store_true", help = "also train one process and print the largest loss difference" })
local args = parser:parse_args(arg)

-- ToyModel: in_proj (10 -> 32), ReLU, out_proj (32 -> 5), as the PyTorch example's.
local ToyModel = nn.Module:extend("ToyModel")
function ToyModel:init()
  self.in_proj = nn.Linear(10, 32)
  self.relu = nn.ReLU()
  self.out_proj = nn.Linear(32, 5)
end
function ToyModel:forward(x) return self.out_proj(self.relu(self.in_proj(x))) end

local function toy_model()
  dl.manual_seed(0)                                     -- the same weights on every rank
  return ToyModel()
end

dist.init_process_group { backend = "gloo" }
local world = dist.get_world_size()
local mesh = dist.init_device_mesh("cpu", { world }, { mesh_dim_names = { "tp" } })
dist.print0(("Device mesh created: %s"):format(tostring(mesh)))

local model = tp.parallelize_module(toy_model(), mesh, {
  in_proj = tp.ColwiseParallel(),
  out_proj = tp.RowwiseParallel(),
})
local opt = optim.AdamW(model:parameters(), { lr = 0.25 })

local function train(m, o)
  local losses = {}
  for i = 1, args.iters or 10 do
    dl.manual_seed(i)                                   -- the same input on every tp rank
    local inp = dl.rand { 20, 10 }
    local loss = m(inp):sum()
    o:zero_grad()
    loss:backward()
    o:step()
    losses[i] = loss:item()
  end
  return losses
end

local losses = train(model, opt)
for i, l in ipairs(losses) do dist.print0(("Tensor Parallel iter %d completed, loss %.6f"):format(i, l)) end
if args.check then
  local alone = toy_model()
  local ref = train(alone, optim.AdamW(alone:parameters(), { lr = 0.25 }))
  local worst = 0
  for i = 1, #ref do worst = math.max(worst, math.abs(ref[i] - losses[i]) / math.max(1, math.abs(ref[i]))) end
  dist.print0(("largest relative loss difference against one process: %.3g"):format(worst))
end
dist.print0("Tensor Parallel training completed!")
