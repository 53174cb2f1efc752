--- ddplua.distributed.tensor.dtensor: the DTensor, after PyTorch's
-- torch.distributed.tensor.DTensor: a local tensor, the device mesh it is spread over and one
-- placement per mesh dimension (ddplua.distributed.tensor.placement_types), with the global
-- shape they describe.
--
--   local dt = DTensor.from_local(x_local, mesh, {Shard(1)})   -- pieces along dim 1
--   dt:full_tensor()                                            -- the whole tensor everywhere
--   dt:redistribute(mesh, {Replicate()}):to_local()             -- the same, in two steps
--
-- The local tensor takes part in autograd as any tensor: every placement change is a
-- differentiable operation (ddplua.distributed.tensor._collectives, Note [DTensor
-- gradients]), so a loss reached through DTensors differentiates back to the local tensors
-- they were made from. Ops on DTensors follow the sharding rules of
-- ddplua.distributed.tensor.ops; any other op raises naming the op and the placements.
--
-- Note [nested shards]: placements apply in mesh-dimension order: with {Shard(1), Shard(1)}
-- on a (2, 2) mesh, dimension 1 is cut in two along mesh dimension 1 and each half in two
-- again along mesh dimension 2 (PyTorch's order). Redistribution undoes shards from the
-- last mesh dimension to the first and makes new ones from the first to the last, so
-- nested shards of one tensor dimension round-trip.
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local placement_types = require "ddplua.distributed.tensor.placement_types"
local coll = require "ddplua.distributed.tensor._collectives"

local raise = lib.raise
local tuple = placement_types.tuple

local DTensor = { __name = "DTensor" }

local function mesh_module() return require "ddplua.distributed.device_mesh" end

local function is_dtensor(v) return getmetatable(v) == DTensor end

-- Checked placements of length mesh.ndim, negative shard dims resolved against ndim.
local function check_placements(mesh, placements, ndim, op)
  if not mesh_module().is_device_mesh(mesh) then
    raise(op .. ": device_mesh must be a DeviceMesh (dist.init_device_mesh), got " .. type(mesh))
  end
  if type(placements) ~= "table" or #placements ~= mesh.ndim then
    raise(("%s: placements must be a list of %d placements (one per mesh dimension), got %s"):format(
      op, mesh.ndim, type(placements) == "table" and (#placements .. " entries") or type(placements)))
  end
  local out = {}
  for i, p in ipairs(placements) do
    if not placement_types.is_placement(p) then
      raise(("%s: placements[%d] must be Shard(d), Replicate() or Partial(), got %s"):format(op, i, tostring(p)))
    end
    out[i] = placement_types.normalize(p, ndim)
  end
  return out
end

-- The local shape of a tensor of global `shape` at this rank (Note [nested shards]).
local function local_shape(mesh, placements, shape)
  local s = { unpack(shape) }
  local coord = mesh:get_coordinate()
  for i, p in ipairs(placements) do
    if p.kind == "shard" then
      local _, len = placement_types.local_range(s[p.dim], mesh.shape[i], coord[i])
      s[p.dim] = len
    end
  end
  return s
end

local function new(local_tensor, mesh, placements, shape)
  return setmetatable({ _local_tensor = local_tensor, device_mesh = mesh, placements = placements,
    _shape = shape }, DTensor)
end

--- DTensor.from_local(local_tensor, device_mesh, placements, {shape = }) -> a DTensor of
-- this rank's local_tensor. The global shape is `shape` when given, else computed assuming
-- even pieces (each Shard(d) multiplies dimension d by the mesh dimension's size, as
-- PyTorch without run_check). Local (no communication); the DTensor's gradient flows to
-- local_tensor. Raises for a mesh this rank is not in, a wrong number of placements, a
-- shard dimension outside the tensor, or a shape whose pieces do not match local_tensor.
function DTensor.from_local(local_tensor, mesh, placements, opts)
  if not dl.is_tensor(local_tensor) then
    raise("DTensor.from_local: local_tensor must be a tensor, got " .. type(local_tensor))
  end
  local ndim = local_tensor:dim()
  placements = check_placements(mesh, placements, ndim, "DTensor.from_local")
  if not mesh:get_coordinate() then raise("DTensor.from_local: this rank is not in the mesh " .. tostring(mesh)) end
  local shape = opts and opts.shape and { unpack(opts.shape) }
  if not shape then
    shape = local_tensor:size()
    for i, p in ipairs(placements) do
      if p.kind == "shard" then shape[p.dim] = shape[p.dim] * mesh.shape[i] end
    end
  end
  local want = local_shape(mesh, placements, shape)
  local have = local_tensor:size()
  for d = 1, ndim do
    if want[d] ~= have[d] then
      raise(("DTensor.from_local: the local tensor has shape (%s) but placements %s of shape (%s) give this rank (%s)")
            :format(table.concat(have, ", "), tuple(placements), table.concat(shape, ", "), table.concat(want, ", ")))
    end
  end
  return new(local_tensor, mesh, placements, shape)
end

--- distribute_tensor(tensor, device_mesh, placements) -> a DTensor whose pieces are cut
-- from `tensor`, which every rank of the mesh must hold whole and equal (as PyTorch's
-- distribute_tensor with src_data_rank = None; nothing is sent). Replicate keeps it,
-- Shard(d) cuts it (Note [uneven shards]), Partial() keeps it on the mesh dimension's first
-- rank and zeros elsewhere (sum) or everywhere (avg). Differentiable. Raises as from_local.
function DTensor.distribute_tensor(tensor, mesh, placements)
  if not dl.is_tensor(tensor) then raise("distribute_tensor: tensor must be a tensor, got " .. type(tensor)) end
  placements = check_placements(mesh, placements or {}, tensor:dim(), "distribute_tensor")
  local x = tensor
  for i, p in ipairs(placements) do
    if p.kind == "shard" then x = coll.scatter(x, p.dim, mesh:get_group(i))
    elseif p.kind == "partial" then x = coll.partition(x, p.reduce_op, mesh:get_group(i)) end
  end
  return new(x, mesh, placements, tensor:size())
end

--- dt:to_local() -> this rank's local tensor (the tensor itself: its gradient is the
-- DTensor's, Note [DTensor gradients]).
function DTensor:to_local() return self._local_tensor end

--- dt:redistribute(device_mesh, placements) -> a DTensor of the same value with new
-- placements on the same mesh (device_mesh may be nil). Collectives per mesh dimension
-- (Note [nested shards]): Shard -> Replicate all-gathers, Partial -> Replicate all-reduces,
-- Partial -> Shard reduce-scatters, Replicate -> Shard takes the piece, Shard(i) -> Shard(j)
-- gathers along i then cuts along j. Differentiable. Raises for another mesh or bad
-- placements.
function DTensor:redistribute(mesh, placements)
  mesh = mesh or self.device_mesh
  if mesh ~= self.device_mesh then
    raise("DTensor:redistribute: moving to another device mesh is not supported (from " ..
          tostring(self.device_mesh) .. " to " .. tostring(mesh) .. ")")
  end
  placements = check_placements(mesh, placements, #self._shape, "DTensor:redistribute")
  local cur = { unpack(self.placements) }
  local x = self._local_tensor
  -- the global size along d of the tensor as it lies after mesh dims 1 .. i-1 (Note [nested shards])
  local function size_before(i, d)
    local n = self._shape[d]
    local coord = mesh:get_coordinate()
    for j = 1, i - 1 do
      if cur[j].kind == "shard" and cur[j].dim == d then
        local _, len = placement_types.local_range(n, mesh.shape[j], coord[j])
        n = len
      end
    end
    return n
  end
  for i = mesh.ndim, 1, -1 do -- undo: last mesh dimension first
    local c, t = cur[i], placements[i]
    if c ~= t then
      local g = mesh:get_group(i)
      if c.kind == "partial" and t.kind == "shard" then
        x = coll.reduce_scatter(x, t.dim, c.reduce_op, g)
        cur[i] = t
      elseif c.kind == "partial" then
        x = coll.reduce(x, c.reduce_op, g)
        cur[i] = placement_types.Replicate()
      elseif c.kind == "shard" then
        for j = i + 1, mesh.ndim do
          if cur[j].kind == "shard" and cur[j].dim == c.dim then
            raise(("DTensor:redistribute: from %s to %s changes mesh dimension %d's shard of tensor dimension %d " ..
                   "while mesh dimension %d keeps sharding it (nested shards change innermost first: Note [nested shards])")
                  :format(tuple(self.placements), tuple(placements), i, c.dim, j))
          end
        end
        x = coll.gather(x, c.dim, size_before(i, c.dim), g)
        cur[i] = placement_types.Replicate()
      end
    end
  end
  for i = 1, mesh.ndim do -- make: first mesh dimension first
    local c, t = cur[i], placements[i]
    if c ~= t then
      local g = mesh:get_group(i)
      if t.kind == "shard" then x = coll.scatter(x, t.dim, g)
      elseif t.kind == "partial" then x = coll.partition(x, t.reduce_op, g) end
      cur[i] = t
    end
  end
  return new(x, mesh, placements, self._shape)
end

--- dt:full_tensor() -> the whole tensor on every rank (redistributed to Replicate on every
-- mesh dimension), a plain tensor. Differentiable.
function DTensor:full_tensor()
  local r = {}
  for i = 1, self.device_mesh.ndim do r[i] = placement_types.Replicate() end
  return self:redistribute(self.device_mesh, r):to_local()
end

--- dt:size([d]) -> the global shape (a list) or its size along d; dt.shape is the list.
function DTensor:size(d)
  if d == nil then return { unpack(self._shape) } end
  if d < 0 then d = #self._shape + 1 + d end
  return self._shape[d]
end

--- dt:dim() -> the number of dimensions.
function DTensor:dim() return #self._shape end

--- dt:numel() -> the number of elements of the whole tensor.
function DTensor:numel()
  local n = 1
  for _, s in ipairs(self._shape) do n = n * s end
  return n
end

--- tostring(dt): "DTensor(shape=(8, 6), placements=(Shard(dim=1),), local=(4, 6))".
DTensor.__tostring = function(self)
  return ("DTensor(shape=(%s), placements=%s, local=(%s), mesh=%s)"):format(table.concat(self._shape, ", "),
    tuple(self.placements), table.concat(self._local_tensor:size(), ", "), tostring(self.device_mesh))
end

-- Fields read through the table: shape, dtype, device, requires_grad, grad_fn (the local
-- tensor's); methods; then the sharding rules of ddplua.distributed.tensor.ops, which
-- raise for ops without a rule.
local FIELDS = {
  shape = function(self) return { unpack(self._shape) } end,
  dtype = function(self) return self._local_tensor.dtype end,
  device = function(self) return self._local_tensor.device end,
  requires_grad = function(self) return self._local_tensor.requires_grad end,
}
DTensor.__index = function(self, k)
  local m = rawget(DTensor, k)
  if m ~= nil then return m end
  local f = FIELDS[k]
  if f then return f(self) end
  local ops = rawget(DTensor, "_ops") -- installed by ddplua.distributed.tensor.ops
  if ops then return ops.method(self, k) end
  raise(("DTensor: op '%s' has no sharding rule (placements %s)"):format(tostring(k), tuple(rawget(self, "placements"))))
end

--- is_dtensor(v) -> true for a DTensor.
DTensor.is_dtensor = is_dtensor
DTensor._new = new
DTensor._local_shape = local_shape
DTensor._check_placements = check_placements

return DTensor
