--- ddplua.distributed.fsdp.fsdp_param: FSDPParam, one parameter managed by fully_shard (as
-- PyTorch's torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam): its shard, the
-- unsharded parameter the module's forward uses, and the row arithmetic between the two.
--
-- Note [fsdp sharding]: a parameter of shape (R, ...) is split along dimension 1 (PyTorch's
-- dim 0, placement Shard(0)) with torch.chunk's rule: every rank but the trailing ones holds
-- c = ceil(R / W) rows; rank r (0-based, in the mesh's group) holds rows r*c .. min((r+1)*c,
-- R) - 1, so trailing ranks may hold fewer rows or none (a (1, n) parameter on 2 ranks: rank
-- 1 holds a (0, n) shard). For the collectives every shard is padded to c rows: the group's
-- flat all-gather input is, per parameter in group order, c * row_numel elements (the
-- shard's values, then zeros), so the all-gather output is W such flat shards one after
-- another, and the unsharded parameter's rows of rank r are copied out of rank r's part
-- ("copy-out"). Gradients go the same way backwards: the unsharded gradient's rows of rank r
-- are copied into rank r's part of a flat (W * S) buffer (zeros in the padding), and the
-- reduce-scatter leaves each rank its S elements. The shard is the module's registered
-- parameter between steps (a leaf of its own, requires_grad as the original), so
-- model:parameters() lists shards, any optimizer steps them, and the names (state_dict keys)
-- are unchanged; the unsharded parameter is a separate persistent leaf whose storage is freed
-- (resize to 0, Note [storage resize] in runtime/core/tensor.c) whenever it is resharded.
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local C = lib.C

local FSDPParam = {}
FSDPParam.__index = FSDPParam

-- Bytes of one element of the dtype named `dtype`.
local function elem_size(dtype) return tonumber(C.ddp_dtype_size(lib.dtype(dtype))) end

-- The shape list of t with its first size replaced by `rows`.
local function with_rows(shape, rows)
  local s = { rows }
  for i = 2, #shape do s[i] = shape[i] end
  return s
end

--- FSDPParam.new(param, infos, rank, world, param_dtype) -> the FSDPParam of `param` (a
-- module's registered parameter of shape (R, ...), at least 1-d). infos: the list of {module,
-- name} places the parameter is registered at (a shared parameter has several). rank, world:
-- this rank and the size of the sharding group. param_dtype: the unsharded parameter's dtype
-- (mixed precision) or nil for the parameter's own. Makes the shard (a new leaf holding this
-- rank's rows, Note [fsdp sharding]) and the unsharded leaf (storage freed); registers
-- nothing yet (see to_sharded). Raises for a 0-d parameter.
function FSDPParam.new(param, infos, rank, world, param_dtype)
  local shape = param:size()
  if #shape == 0 then
    lib.raise(("fully_shard: parameter '%s' is 0-d; FSDP shards parameters along their first "
      .. "dimension (Shard(0)) and needs at least one"):format(infos[1][2]))
  end
  local R = shape[1]
  local row_numel = R > 0 and param:numel() / R or 0
  local c = math.ceil(R / world)
  local self = setmetatable({
    infos = infos, shape = shape, rows = R, row_numel = row_numel, chunk_rows = c,
    world = world, rank = rank, dtype = param.dtype, requires_grad = param.requires_grad,
    param_dtype = param_dtype or param.dtype, padded_numel = c * row_numel,
  }, FSDPParam)
  local first = self:rows_of(rank)
  self.shard_offset = rank * c
  self.local_rows = first
  local shard = dl.no_grad(function()
    if first > 0 then return param:detach():narrow(1, rank * c + 1, first):clone() end
    return dl.zeros(with_rows(shape, 0), { dtype = param.dtype, device = param.device })
  end)
  if self.requires_grad then shard:requires_grad_(true) end
  self.sharded = shard
  local full = dl.empty(shape, { dtype = self.param_dtype, device = param.device })
  if self.requires_grad then full:requires_grad_(true) end
  self.unsharded = full
  self.unsharded_bytes = param:numel() * elem_size(self.param_dtype)
  self.is_unsharded = true -- until the group's first reshard frees it (hooks go on first)
  return self
end

--- fp:rows_of(r) -> how many rows rank r holds (Note [fsdp sharding]; 0 for trailing ranks).
function FSDPParam:rows_of(r)
  return math.max(0, math.min(self.chunk_rows, self.rows - r * self.chunk_rows))
end

-- Register t at every place of this parameter (no nn.Parameter mark needed: the registry
-- entry is what parameters() and state_dict() walk; the name keeps its place in the order).
local function register(self, t)
  for _, info in ipairs(self.infos) do
    local params = rawget(info[1], "_parameters")
    params.values[info[2]] = t
  end
end

--- fp:to_sharded(): the shard becomes the registered parameter at every place.
function FSDPParam:to_sharded() register(self, self.sharded) end

--- fp:to_unsharded(): the unsharded parameter becomes the registered one (forward uses it).
function FSDPParam:to_unsharded() register(self, self.unsharded) end

--- fp:copy_in(flat, offset): write this rank's shard (converted to the flat buffer's dtype)
-- into flat (1-d) at elements offset+1 .. offset+local_rows*row_numel; the padding stays
-- as the caller left it (zeros).
function FSDPParam:copy_in(flat, offset)
  local n = self.local_rows * self.row_numel
  if n > 0 then flat:narrow(1, offset + 1, n):copy_(self.sharded:detach():reshape(-1)) end
end

--- fp:alloc_unsharded(): give the unsharded parameter its storage back (contents to be
-- written by copy_out). Returns the storage version to restore after the copy-out.
function FSDPParam:alloc_unsharded()
  local v = self.unsharded._version
  lib.check(C.ddp_tensor_storage_resize_(self.unsharded, self.unsharded_bytes))
  return v
end

--- fp:copy_out(out, S, offset, version): fill the unsharded parameter from the all-gather
-- output `out` ((W * S) elements, rank r's flat shard at r*S) where this parameter sits at
-- `offset` of each flat shard; then set the storage version back to `version` (the values
-- are the very ones autograd saved: Note [storage resize]).
function FSDPParam:copy_out(out, S, offset, version)
  local full = self.unsharded:detach()
  for r = 0, self.world - 1 do
    local rows = self:rows_of(r)
    if rows > 0 then
      full:narrow(1, r * self.chunk_rows + 1, rows):copy_(
        out:narrow(1, r * S + offset + 1, rows * self.row_numel):view(with_rows(self.shape, rows)))
    end
  end
  C.ddp_tensor_version_restore(self.unsharded, version)
  self.is_unsharded = true
end

--- fp:free_unsharded(): release the unsharded parameter's storage (resize to 0).
function FSDPParam:free_unsharded()
  lib.check(C.ddp_tensor_storage_resize_(self.unsharded, 0))
  self.is_unsharded = false
end

--- fp:take_unsharded_grad() -> the unsharded parameter's gradient summed with what earlier
-- backwards without gradient sync kept (set_requires_gradient_sync(false)), or nil when
-- there is none; the unsharded parameter's .grad is cleared.
function FSDPParam:take_unsharded_grad()
  local g = self.unsharded.grad
  if g ~= nil then self.unsharded.grad = nil end
  local acc = self.accumulated_grad
  self.accumulated_grad = nil
  if acc and g then
    acc:add_(g)
    g:free()
    return acc
  end
  return g or acc
end

--- fp:stash_unsharded_grad(): keep the unsharded gradient for a later synced backward (the
-- unsharded parameter itself is then freed; Note [fsdp no sync]).
function FSDPParam:stash_unsharded_grad()
  self.accumulated_grad = self:take_unsharded_grad()
end

--- fp:copy_grad_in(flat, S, offset, grad): write the rows of `grad` (the unsharded gradient,
-- the parameter's shape) that rank r holds into rank r's part of flat ((W * S) elements,
-- converted to flat's dtype), for every r.
function FSDPParam:copy_grad_in(flat, S, offset, grad)
  for r = 0, self.world - 1 do
    local rows = self:rows_of(r)
    if rows > 0 then
      flat:narrow(1, r * S + offset + 1, rows * self.row_numel):copy_(
        grad:narrow(1, r * self.chunk_rows + 1, rows):reshape(-1))
    end
  end
end

--- fp:accumulate_sharded_grad(out, offset): add this rank's reduced rows (elements offset+1
-- .. of the reduce-scatter output `out`) into the shard's .grad (converted to the shard's
-- dtype; set when it has none, as autograd accumulates).
function FSDPParam:accumulate_sharded_grad(out, offset)
  local shape = with_rows(self.shape, self.local_rows)
  local part
  if self.local_rows > 0 then
    part = out:narrow(1, offset + 1, self.local_rows * self.row_numel):view(shape)
  else
    part = dl.zeros(shape, { dtype = out.dtype, device = out.device })
  end
  local g = self.sharded.grad
  if g ~= nil then
    g:add_(part)
  else
    self.sharded.grad = part:to(self.dtype):clone()
  end
end

return FSDPParam
