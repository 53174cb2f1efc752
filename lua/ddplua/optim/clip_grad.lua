--- ddplua.optim.clip_grad: gradient clipping (PyTorch's torch.nn.utils.clip_grad_norm_ and
-- clip_grad_value_), in place on the parameters' .grad through the C calls of
-- ddplua/optim.h. Parameters without a .grad are skipped. nn.utils re-exports these.
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"
local ffi, C = lib.ffi, lib.C

local M = {}

local norm_out = ffi.new("double[1]")

-- The .grad handles of params (a tensor or a list of tensors) that have one, as a C array
-- and its length. (Each gradient stays alive through its parameter, which owns it.)
local function grads_of(params, op)
  if tensor.is_tensor(params) then params = { params } end
  if type(params) ~= "table" then lib.raise(op .. ": params must be a tensor or a list of tensors, got " .. type(params)) end
  local handles = {}
  for i, p in ipairs(params) do
    if not tensor.is_tensor(p) then
      lib.raise(("%s: parameter %d is not a tensor (got %s)"):format(op, i, type(p)))
    end
    local g = p.grad
    if g ~= nil then handles[#handles + 1] = g end
  end
  local arr = ffi.new("ddp_tensor*[?]", #handles > 0 and #handles or 1)
  for i, g in ipairs(handles) do arr[i - 1] = g end
  return arr, #handles
end

--- clip_grad_norm_(params, max_norm, opts) -> total_norm (a Lua number).
-- params: a tensor or a list of tensors. The total norm of order opts.norm_type (default
-- 2; any p > 0 or math.huge / "inf" for the largest |g|) of all gradients taken together
-- (the norm of the per-tensor norms). When max_norm / (total + 1e-6) < 1 every gradient
-- is multiplied in place by that coefficient (PyTorch's rule). opts.error_if_nonfinite
-- (default false) raises when the total is NaN or infinite. Unlike PyTorch, the total is
-- returned as a number, not a 0-d tensor.
function M.clip_grad_norm_(params, max_norm, opts)
  if type(max_norm) ~= "number" then lib.raise("clip_grad_norm_: max_norm must be a number, got " .. type(max_norm)) end
  local norm_type = opts and opts.norm_type or 2
  if norm_type == "inf" then norm_type = math.huge end
  if type(norm_type) ~= "number" then lib.raise("clip_grad_norm_: invalid norm_type " .. tostring(norm_type)) end
  local arr, n = grads_of(params, "clip_grad_norm_")
  lib.check(C.ddp_clip_grad_norm_(norm_out, arr, n, max_norm, norm_type,
    opts and opts.error_if_nonfinite and 1 or 0))
  return norm_out[0]
end

--- clip_grad_value_(params, clip_value): clamp every gradient element in place into
-- [-clip_value, clip_value]. params: a tensor or a list of tensors. Raises when clip_value
-- is negative.
function M.clip_grad_value_(params, clip_value)
  if type(clip_value) ~= "number" then lib.raise("clip_grad_value_: clip_value must be a number, got " .. type(clip_value)) end
  local arr, n = grads_of(params, "clip_grad_value_")
  lib.check(C.ddp_clip_grad_value_(arr, n, clip_value))
end

return M
