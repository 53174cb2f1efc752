--- ddplua.distributed.algorithms.ddp_comm_hooks.grad_bucket: GradBucket, what a
-- communication hook written in Lua receives for each gradient bucket (PyTorch's
-- torch.distributed.GradBucket). Made by DistributedDataParallel while its backward runs.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check = lib.check

local GradBucket = {}
GradBucket.__index = GradBucket

local box = ffi.new("ddp_tensor*[1]")
local idx = ffi.new("int[?]", 4096)

--- GradBucket.new(reducer, k, params) -> the bucket k (0-based) of reducer (a ddp_reducer*);
-- params: the DDP module's parameter list (registration order).
function GradBucket.new(reducer, k, params)
  return setmetatable({ _reducer = reducer, _index = k, _params = params }, GradBucket)
end

--- GradBucket.zeros_like(reducer, k, params) -> bucket k over zeros: buffer() is a new zero
-- tensor of bucket k's dtype, size (numel,) and device, gradients() are views into it with
-- the parameters' shapes (PyTorch's Reducer._get_zeros_like_grad_buckets). What a joined
-- rank's hook reduces in its shadow of the other ranks' backward (Note [join shadow with a
-- comm hook], ddplua/reducer_join.h); the bucket's own buffer is not touched.
function GradBucket.zeros_like(reducer, k, params)
  check(C.ddp_reducer_bucket_buffer(reducer, k, box))
  local zeros = require("ddplua.functions").zeros_like(lib.wrap(box[0]))
  local b = GradBucket.new(reducer, k, params)
  b._buffer, b._zeros = zeros, zeros
  return b
end

--- bucket:index() -> the bucket's index, 0-based; bucket 0 is reduced first (Note [bucket
-- order]).
function GradBucket:index() return self._index end

--- bucket:buffer() -> the flat buffer (numel,) of the bucket's gradients, in slot order,
-- NOT divided by the world size (Note [comm hooks]); or the tensor set_buffer gave.
function GradBucket:buffer()
  if self._buffer then return self._buffer end
  check(C.ddp_reducer_bucket_buffer(self._reducer, self._index, box))
  self._buffer = lib.wrap(box[0])
  return self._buffer
end

--- bucket:set_buffer(t): replace the tensor buffer() returns (PyTorch's set_buffer; the
-- compress wrappers hand their inner hook a cast copy this way).
function GradBucket:set_buffer(t) self._buffer = t end

-- The parameter indices (1-based) of the bucket's slots.
local function slots(self)
  local n = C.ddp_reducer_bucket_params(self._reducer, self._index, idx, 4096)
  local out = {}
  for s = 1, math.min(n, 4096) do out[s] = idx[s - 1] + 1 end
  return out
end

--- bucket:gradients() -> list of per-parameter views into the bucket buffer, each with its
-- parameter's shape, in slot order.
function GradBucket:gradients()
  local out, off = {}, 0
  for s = 1, #slots(self) do
    check(C.ddp_reducer_bucket_view(self._reducer, self._index, s - 1, box))
    out[s] = lib.wrap(box[0])
    if self._zeros then -- the same slot in the zero buffer (slots are packed in order)
      local n = out[s]:numel()
      out[s] = self._zeros:narrow(1, off + 1, n):view(out[s]:size())
      off = off + n
    end
  end
  return out
end

--- bucket:parameters() -> list of the bucket's parameters, in the order of gradients().
function GradBucket:parameters()
  local out = {}
  for s, i in ipairs(slots(self)) do out[s] = self._params[i] end
  return out
end

--- bucket:is_last() -> true for the last bucket of an iteration (the last to be reduced).
function GradBucket:is_last() return C.ddp_reducer_bucket_is_last(self._reducer, self._index) ~= 0 end

function GradBucket:__tostring() return ("GradBucket(index=%d)"):format(self._index) end

return GradBucket
