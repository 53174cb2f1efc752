--- ddplua.distributed.tensor._collectives: the placement changes of one mesh dimension as
-- differentiable operations on local tensors, what DTensor's redistribute and sharding rules
-- are built from.
--
-- Note [DTensor gradients]: a DTensor's local tensor is an ordinary tensor of the autograd
-- graph, and its gradient follows one convention: the gradient of a Replicate or Partial
-- local tensor is the gradient of the whole (logical) tensor, the same on every rank; the
-- gradient of a Shard local tensor is the whole tensor's gradient at the rank's piece. (So
-- a loss computed the same way on every rank, as tensor parallelism computes it, gives
-- every rank the full gradients of everything replicated.) Each operation below pairs its
-- forward collective with the backward that keeps the convention, PyTorch's DTensor
-- Redistribute backward and Megatron-LM's region mappings:
--
--   gather    Shard(d) -> Replicate   all-gather along d     | backward: take own piece
--   scatter   Replicate -> Shard(d)   take own piece         | backward: all-gather
--   reduce    Partial -> Replicate    all-reduce             | backward: identity
--   reduce_scatter Partial -> Shard(d) reduce-scatter along d | backward: all-gather
--   partition Replicate -> Partial    rank 0 keeps the value, others zeros (sum; avg keeps
--                                     it everywhere)          | backward: identity
--   copy      the input of a computation each rank does on its own piece (a column-
--             sharded matmul of a replicated input): identity | backward: all-reduce
--
-- Uneven pieces (Note [uneven shards]) are padded to ceil(n / W) along d for the
-- collectives and cut back after.
local dl = require "ddplua.functions"
local Function = require "ddplua.autograd.function"
local placement_types = require "ddplua.distributed.tensor.placement_types"

local M = {}

local function dist() return require "ddplua.distributed.distributed_c10d" end

-- t (a fresh tensor, with d = 1 first) with dimensions 1 and d swapped back, as a tensor of
-- its own (a Function's output may not be a view: a transpose that leaves the tensor
-- contiguous, as with a dimension of size 1, is a view that contiguous() keeps).
local function unswap(t, d)
  if d == 1 then return t end
  local s = t:size()
  local out = t:transpose(1, d):contiguous()
  if s[1] == 1 or s[d] == 1 then out = out:clone() end
  return out
end

-- x along dimension d padded with zeros to c elements (x itself when it has c).
local function pad_to(x, d, c)
  local s = x:size()
  if s[d] == c then return x end
  s[d] = c - s[d]
  return dl.cat({ x, dl.zeros(s, { dtype = x.dtype, device = x.device }) }, d)
end

-- The pieces of all ranks of `group` (W ranks, this one k) joined along d: n elements in
-- all (Note [uneven shards]).
local function gather_dim(x, d, n, group)
  local W = dist().get_world_size(group)
  local _, _, c = placement_types.local_range(n, W, 0)
  local padded = pad_to(x, d, c):transpose(1, d):contiguous() -- (c, ...)
  local s = padded:size()
  s[1] = W * c
  local out = dl.empty(s, { dtype = x.dtype, device = x.device })
  dist().all_gather_into_tensor(out, padded, { group = group })
  if W * c == n then return unswap(out, d) end -- no padding to cut off
  local pieces = {}
  for r = 0, W - 1 do
    local _, len = placement_types.local_range(n, W, r)
    if len > 0 then pieces[#pieces + 1] = out:narrow(1, r * c + 1, len) end
  end
  return unswap(dl.cat(pieces, 1), d)
end

-- This rank's piece along d of a tensor whole along d (a copy).
local function piece(x, d, group)
  local W, k = dist().get_world_size(group), dist().get_rank(group)
  local start, len = placement_types.local_range(x:size(d), W, k)
  return x:narrow(d, start + 1, len):contiguous()
end

-- op over the ranks of group of x, whole along d, then this rank's piece along d.
local function reduce_scatter_dim(x, d, op, group)
  local W, k = dist().get_world_size(group), dist().get_rank(group)
  local n = x:size(d)
  local _, len, c = placement_types.local_range(n, W, k)
  local padded = pad_to(x, d, W * c):transpose(1, d):contiguous() -- (W c, ...)
  local s = padded:size()
  s[1] = c
  local out = dl.empty(s, { dtype = x.dtype, device = x.device })
  dist().reduce_scatter_tensor(out, padded, { op = op, group = group })
  if len < c then out = out:narrow(1, 1, len):clone() end
  return unswap(out, d)
end

local function all_reduce(x, op, group)
  local y = x:clone()
  dist().all_reduce(y, { op = op, group = group })
  return y
end

local Gather = Function:extend("DTensorGather")
function Gather.forward(ctx, x, d, n, group)
  ctx.d, ctx.group = d, group
  return gather_dim(x, d, n, group)
end
--- Gather's backward: this rank's piece of the whole gradient.
function Gather.backward(ctx, g) return piece(g, ctx.d, ctx.group) end

local Scatter = Function:extend("DTensorScatter")
function Scatter.forward(ctx, x, d, group)
  ctx.d, ctx.n, ctx.group = d, x:size(d), group
  return piece(x, d, group)
end
--- Scatter's backward: the pieces' gradients all-gathered into the whole.
function Scatter.backward(ctx, g) return gather_dim(g:contiguous(), ctx.d, ctx.n, ctx.group) end

local Reduce = Function:extend("DTensorReduce")
function Reduce.forward(ctx, x, op, group) return all_reduce(x, op, group) end
--- Reduce's backward: the gradient as it is (Replicate: whole on every rank).
function Reduce.backward(ctx, g) return g end

local ReduceScatter = Function:extend("DTensorReduceScatter")
function ReduceScatter.forward(ctx, x, d, op, group)
  ctx.d, ctx.n, ctx.group = d, x:size(d), group
  return reduce_scatter_dim(x, d, op, group)
end
--- ReduceScatter's backward: the pieces' gradients all-gathered.
function ReduceScatter.backward(ctx, g) return gather_dim(g:contiguous(), ctx.d, ctx.n, ctx.group) end

local Partition = Function:extend("DTensorPartition")
function Partition.forward(ctx, x, op, group)
  if op == "avg" or dist().get_rank(group) == 0 then return x:clone() end
  return dl.zeros_like(x)
end
--- Partition's backward: the gradient as it is.
function Partition.backward(ctx, g) return g end

local Copy = Function:extend("DTensorCopy")
function Copy.forward(ctx, x, group)
  ctx.group = group
  return x:clone()
end
--- Copy's backward: the gradient all-reduced (summed) over the group.
function Copy.backward(ctx, g) return all_reduce(g, "sum", ctx.group) end

--- gather(x, d, n, group) -> Shard(d) -> Replicate: the pieces of every rank of group joined
-- along d (n elements in all). Backward: this rank's piece of the gradient.
function M.gather(x, d, n, group) return Gather.apply(x, d, n, group) end

--- scatter(x, d, group) -> Replicate -> Shard(d): this rank's piece along d. Backward:
-- the pieces' gradients all-gathered.
function M.scatter(x, d, group) return Scatter.apply(x, d, group) end

--- reduce(x, op, group) -> Partial(op) -> Replicate: the all-reduce. Backward: identity.
function M.reduce(x, op, group) return Reduce.apply(x, op, group) end

--- reduce_scatter(x, d, op, group) -> Partial(op) -> Shard(d). Backward: all-gather.
function M.reduce_scatter(x, d, op, group) return ReduceScatter.apply(x, d, op, group) end

--- partition(x, op, group) -> Replicate -> Partial(op). Backward: identity.
function M.partition(x, op, group) return Partition.apply(x, op, group) end

--- copy(x, group) -> x, whose gradient is all-reduced over group in backward (the input
-- of a computation each rank does on its own part: Note [DTensor gradients]).
function M.copy(x, group) return Copy.apply(x, group) end

return M
