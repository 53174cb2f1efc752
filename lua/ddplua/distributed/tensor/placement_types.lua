--- ddplua.distributed.tensor.placement_types: how a DTensor lies on one dimension of its
-- device mesh, as PyTorch's torch.distributed.tensor.placement_types:
--
--   Shard(d)      the tensor is cut along its dimension d (counting from 1, as every ddplua
--                 dimension; negative from the end) into one piece per rank of the mesh
--                 dimension, torch.chunk's way: ceil(n / W) elements each, the last ranks
--                 holding fewer or none (Note [uneven shards])
--   Replicate()   every rank holds the whole tensor
--   Partial(op)   every rank holds a tensor of the whole shape; the value is their
--                 reduction ("sum", the default, or "avg")
--
-- Note [uneven shards]: rank k of W along a mesh dimension holds elements
-- [k c, min((k + 1) c, n)) of a tensor dimension of size n, c = ceil(n / W) (0 elements when
-- k c >= n), as PyTorch's Shard._split_tensor. Collectives pad every piece to c elements
-- and cut the padding off again, so any n works.
local lib = require "ddplua.lib"

local M = {}

local Placement = {}
Placement.__index = Placement

--- p:is_shard([dim]) -> true for Shard (of tensor dimension dim when given).
function Placement:is_shard(dim) return self.kind == "shard" and (dim == nil or self.dim == dim) end
--- p:is_replicate() -> true for Replicate.
function Placement:is_replicate() return self.kind == "replicate" end
--- p:is_partial() -> true for Partial.
function Placement:is_partial() return self.kind == "partial" end

Placement.__eq = function(a, b)
  return a.kind == b.kind and a.dim == b.dim and a.reduce_op == b.reduce_op
end

--- tostring(p): PyTorch's repr with ddplua's dimension numbers: "Shard(dim=1)",
-- "Replicate()", "Partial(sum)".
Placement.__tostring = function(p)
  if p.kind == "shard" then return ("Shard(dim=%d)"):format(p.dim) end
  if p.kind == "replicate" then return "Replicate()" end
  return ("Partial(%s)"):format(p.reduce_op)
end

--- Shard(dim) -> the placement cutting tensor dimension dim (an integer, not 0; negative
-- counts from the end and is resolved against the tensor's dimensions where it is used).
function M.Shard(dim)
  if type(dim) ~= "number" or dim % 1 ~= 0 or dim == 0 then
    lib.raise("Shard: dim must be a nonzero integer (dimensions count from 1), got " .. tostring(dim))
  end
  return setmetatable({ kind = "shard", dim = dim }, Placement)
end

--- Replicate() -> the placement of a tensor held whole by every rank.
function M.Replicate() return setmetatable({ kind = "replicate" }, Placement) end

--- Partial(reduce_op) -> the placement of a pending reduction: "sum" (default) or "avg".
function M.Partial(reduce_op)
  reduce_op = reduce_op or "sum"
  if reduce_op ~= "sum" and reduce_op ~= "avg" then
    lib.raise("Partial: reduce_op must be 'sum' or 'avg', got " .. tostring(reduce_op))
  end
  return setmetatable({ kind = "partial", reduce_op = reduce_op }, Placement)
end

--- is_placement(v) -> true for a value made by Shard, Replicate or Partial.
function M.is_placement(v) return getmetatable(v) == Placement end

--- normalize(p, ndim) -> p with a negative Shard dim resolved against ndim dimensions.
-- Raises when the dimension is outside 1 .. ndim.
function M.normalize(p, ndim)
  if p.kind ~= "shard" then return p end
  local d = p.dim < 0 and ndim + 1 + p.dim or p.dim
  if d < 1 or d > ndim then
    lib.raise(("Shard(dim=%d) is outside the %d dimensions of the tensor"):format(p.dim, ndim))
  end
  return d == p.dim and p or M.Shard(d)
end

--- local_range(n, world, k) -> start (0-based), length of rank k's piece of a dimension of
-- size n cut over world ranks (Note [uneven shards]), and the padded piece size c.
function M.local_range(n, world, k)
  local c = math.floor((n + world - 1) / world)
  local start = math.min(k * c, n)
  return start, math.max(0, math.min(c, n - start)), c
end

--- tuple(placements) -> "(Shard(dim=1), Replicate())", PyTorch's way of printing them.
function M.tuple(placements)
  local parts = {}
  for i, p in ipairs(placements) do parts[i] = tostring(p) end
  if #parts == 1 then return "(" .. parts[1] .. ",)" end
  return "(" .. table.concat(parts, ", ") .. ")"
end

return M
