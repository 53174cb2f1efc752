--- ddplua.tensor: the Tensor metatype over the C handle `ddp_tensor*`.
--
-- A tensor handle is a `ddp_tensor*` cdata owning one reference (released by the collector
-- or by :free()). Methods come from this file (metadata, element access, autograd, copies)
-- and from the op modules under ddplua/ops/ (installed below). Properties read with `.`:
-- `t.grad`, `t.requires_grad`, `t.is_leaf`, `t.grad_fn` (node name), `t._version`, `t.dtype` (name),
-- `t.device` ("cpu" or "cuda:k"), `t.is_cuda`, `t.shape` (table). Positions count from 1 as in Lua (Torch7).
local lib = require "ddplua.lib"
local format = require "ddplua.format"
local cuda = require "ddplua.cuda"
local options = require "ddplua.options"
local engine = require "ddplua.autograd.engine"
local HookHandle = require "ddplua.autograd.hook_handle"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}
local Tensor = {}      -- methods
local meta = {}        -- metamethods
local properties = {}  -- key -> getter(t)
local setters = {}     -- key -> setter(t, v)

local index_buf = ffi.new("int64_t[8]")
local num_out = ffi.new("double[1]")
local hook_id = ffi.new("int64_t[1]")
local BACKWARD_KNOWN = options.known { "retain_graph", "create_graph" }

--- Number of dimensions.
function Tensor.dim(t) return C.ddp_tensor_dim(t) end
Tensor.ndimension = Tensor.dim

--- Number of elements.
function Tensor.numel(t) return tonumber(C.ddp_tensor_numel(t)) end
Tensor.nelement = Tensor.numel

--- t:size() -> table of sizes {N, C, H, W}; t:size(d) -> size of dimension d (1-based,
-- negative from the end).
function Tensor.size(t, d)
  if d == nil then return lib.size_table(t) end
  local n = C.ddp_tensor_dim(t)
  if d < 0 then d = n + d + 1 end
  if d < 1 or d > n then
    lib.raise(("size: dimension %s is out of range for a tensor with %d dimensions"):format(tostring(d), n))
  end
  return tonumber(C.ddp_tensor_shape(t)[d - 1])
end

--- t:stride() -> table of strides (elements); t:stride(d) -> stride of dimension d.
function Tensor.stride(t, d)
  local n = C.ddp_tensor_dim(t)
  local st = C.ddp_tensor_strides(t)
  if d == nil then
    local s = {}
    for i = 1, n do s[i] = tonumber(st[i - 1]) end
    return s
  end
  if d < 0 then d = n + d + 1 end
  if d < 1 or d > n then lib.raise("stride: dimension " .. tostring(d) .. " is out of range") end
  return tonumber(st[d - 1])
end

--- dtype name: "f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool".
function Tensor.type(t) return lib.dtype_name(C.ddp_tensor_dtype(t)) end

--- t:is_contiguous() -> row-major with no gaps; t:is_floating_point() -> f32/f64/f16/bf16.
function Tensor.is_contiguous(t) return C.ddp_tensor_is_contiguous(t) ~= 0 end
function Tensor.is_floating_point(t) return C.ddp_dtype_is_floating(C.ddp_tensor_dtype(t)) ~= 0 end

--- The single element of a one-element tensor as a Lua number. Raises otherwise.
function Tensor.item(t)
  check(C.ddp_tensor_item(t, num_out))
  return num_out[0]
end

--- The elements as nested Lua tables (a number for a 0-d tensor).
function Tensor.tolist(t)
  local n = C.ddp_tensor_numel(t)
  local flat = ffi.new("double[?]", n > 0 and n or 1)
  check(C.ddp_tensor_to_f64(t, flat))
  local sizes = lib.size_table(t)
  local is_bool = C.ddp_tensor_dtype(t) == C.DDP_BOOL
  local pos = 0
  local function build(d)
    if d > #sizes then
      local v = flat[pos]
      pos = pos + 1
      if is_bool then return v ~= 0 end
      return v
    end
    local out = {}
    for i = 1, sizes[d] do out[i] = build(d + 1) end
    return out
  end
  return build(1)
end

--- Element at 1-based indices (one per dimension; negative from the end) as a number.
function Tensor.get(t, ...)
  local n = C.ddp_tensor_dim(t)
  local shape = C.ddp_tensor_shape(t)
  for i = 1, n do
    local v = select(i, ...)
    if v == nil then lib.raise(("get: %d indices given for a tensor with %d dimensions"):format(i - 1, n)) end
    index_buf[i - 1] = v < 0 and shape[i - 1] + v or v - 1
  end
  check(C.ddp_tensor_get(t, index_buf, num_out))
  return num_out[0]
end

--- Set the element at 1-based indices: t:set(i, j, value), as t[{i, j}] = value (recorded
-- by autograd when t requires grad: ddp_set_element_).
function Tensor.set(t, ...)
  local n = C.ddp_tensor_dim(t)
  local shape = C.ddp_tensor_shape(t)
  for i = 1, n do
    local v = select(i, ...)
    if v == nil then lib.raise(("set: %d indices given for a tensor with %d dimensions"):format(i - 1, n)) end
    index_buf[i - 1] = v < 0 and shape[i - 1] + v or v - 1
  end
  check(C.ddp_set_element_(t, index_buf, (select(n + 1, ...))))
  return t
end

--- Release what this handle holds now (memory returns at once); later use raises
-- "freed tensor". Safe to call twice.
function Tensor.free(t)
  C.ddp_tensor_free(t)
end

-- ---- autograd -----------------------------------------------------------------------

--- Back-propagate from t: every leaf that requires grad accumulates d(t)/d(leaf)
-- (contracted with `gradient`) into its .grad. gradient: a tensor of t's shape (needed
-- unless t has one element). opts.retain_graph keeps the saved tensors for another
-- backward; opts.create_graph = true raises (first-order gradients only). Hooks and
-- Functions defined in Lua run during it (Note [Lua in backward], ddplua.autograd.engine).
function Tensor.backward(t, gradient, opts)
  if opts ~= nil then
    opts = options.check("backward", opts, BACKWARD_KNOWN)
    if opts.create_graph then engine.refuse_create_graph("backward") end
  end
  engine.run1(t, gradient, opts and opts.retain_graph)
end

--- Register hook(grad) on t (requires grad): it sees the gradient w.r.t. t during each
-- backward and may return a tensor of the same shape to use instead (nil keeps it). On a
-- leaf it runs before the gradient is accumulated into .grad. Returns a handle with
-- :remove(). As PyTorch's Tensor.register_hook.
function Tensor.register_hook(t, hook)
  if type(hook) ~= "function" then lib.raise("register_hook: hook must be a function, got " .. type(hook)) end
  check(C.ddp_tensor_add_deferred_hook(t, C.DDP_HOOK_GRAD, hook_id))
  local id = tonumber(hook_id[0])
  engine.add_hook(id, hook)
  engine.forget_dropped()
  return HookHandle.new(t, id)
end

--- Register hook(t) on the leaf t (requires grad): it runs once t.grad holds every
-- contribution of a backward (the moment DDP's reducer uses). Returns a handle with
-- :remove(). As PyTorch's Tensor.register_post_accumulate_grad_hook.
function Tensor.register_post_accumulate_grad_hook(t, hook)
  if type(hook) ~= "function" then
    lib.raise("register_post_accumulate_grad_hook: hook must be a function, got " .. type(hook))
  end
  check(C.ddp_tensor_add_deferred_hook(t, C.DDP_HOOK_POST_ACCUMULATE, hook_id))
  local id = tonumber(hook_id[0])
  engine.add_hook(id, hook)
  engine.forget_dropped()
  return HookHandle.new(t, id)
end

--- Set requires_grad (default true) in place; returns t.
function Tensor.requires_grad_(t, flag)
  check(C.ddp_tensor_set_requires_grad(t, flag == false and 0 or 1))
  return t
end

--- Keep the gradient of this non-leaf tensor in .grad during backward; returns t.
function Tensor.retain_grad(t)
  check(C.ddp_tensor_retain_grad(t))
  return t
end

--- A tensor sharing t's data, cut from the graph.
function Tensor.detach(t)
  check(C.ddp_tensor_detach(box, t))
  return wrap(box[0])
end

-- ---- copies and conversions -----------------------------------------------------------

--- Copy src (broadcast to t's shape, converted to t's dtype) into t; returns t.
function Tensor.copy_(t, src)
  check(C.ddp_copy_(t, src))
  return t
end

--- Fill with a number; returns t.
function Tensor.fill_(t, v)
  check(C.ddp_fill_(t, v))
  return t
end

--- Set to zero; returns t.
function Tensor.zero_(t)
  check(C.ddp_zero_(t))
  return t
end

--- t:contiguous() -> a contiguous tensor with the same values (a copy, even when t is
-- already contiguous, as the C call makes one).
function Tensor.contiguous(t)
  check(C.ddp_contiguous(box, t))
  return wrap(box[0])
end

--- t:clone() -> a copy with its own storage (recorded by autograd).
function Tensor.clone(t)
  check(C.ddp_clone(box, t))
  return wrap(box[0])
end

-- Move t to C device number `dev` (differentiable; t itself when it is there already).
local function to_device(t, dev, non_blocking)
  if C.ddp_tensor_device(t) == dev then return t end
  check(C.ddp_tensor_to_device(box, t, dev, non_blocking and 1 or 0))
  return wrap(box[0])
end

local function to_dtype(t, dt)
  if C.ddp_tensor_dtype(t) == dt then return t end
  check(C.ddp_to_dtype(box, t, dt))
  return wrap(box[0])
end

--- t:to(...) -> t converted to another device and/or dtype, as PyTorch's Tensor.to; t
-- itself when nothing changes. Differentiable (the gradient goes back to t's device and
-- dtype). Forms:
--   t:to("f64")              dtype ("f32", "f64", "f16", "bf16", "i64", ... or the enum)
--   t:to("cuda:1")           device ("cpu", "cuda" = the current device, "cuda:k")
--   t:to("cuda", "f16")      both
--   t:to(other)              other tensor's device and dtype
--   t:to(..., {non_blocking = true})   a host <-> device copy that may return before it
--       finishes, when the host side is pinned (t:pin_memory()); ordered on the current
--       stream, as PyTorch's non_blocking=True (pageable memory copies synchronously).
-- Also t:to{device = "cuda", dtype = "f16", non_blocking = true}. Moving to a device
-- converts the dtype on the CPU side (before a move to a device, after a move back).
-- Raises for an unknown dtype or device, or "CUDA is not available: ..." without CUDA.
function Tensor.to(t, a, b, c)
  local device, dtype, opts
  local function take(v)
    if v == nil then return end
    if type(v) == "table" then
      opts = v
      if v.device ~= nil then device = v.device end
      if v.dtype ~= nil then dtype = v.dtype end
    elseif M.is_tensor(v) then
      device, dtype = C.ddp_tensor_device(v), C.ddp_tensor_dtype(v)
    elseif cuda.is_device(v) then
      device = v
    else
      dtype = v
    end
  end
  take(a); take(b); take(c)
  local dev = device ~= nil and cuda.parse_device(device) or nil
  local dt = dtype ~= nil and lib.dtype(dtype) or nil
  local non_blocking = opts and opts.non_blocking
  local out = t
  if dev ~= nil and dev ~= C.ddp_tensor_device(t) then
    if dev >= 0 and C.ddp_tensor_device(t) < 0 and dt then out = to_dtype(out, dt) end -- convert on the CPU
    out = to_device(out, dev, non_blocking)
  end
  if dt then out = to_dtype(out, dt) end
  return out
end

--- t:cuda([k[, opts]]) -> t on cuda:k (default: the current device); t itself when it is
-- there already. opts.non_blocking as in to().
function Tensor.cuda(t, k, opts)
  if type(k) == "table" then k, opts = nil, k end
  local dev = k == nil and cuda.current_device() or cuda.parse_device(k)
  if dev < 0 then lib.raise("cuda: expected a CUDA device, got cpu") end
  return to_device(t, dev, opts and opts.non_blocking)
end

--- t:cpu() -> t on the CPU (a host copy of a device tensor; t itself on the CPU).
function Tensor.cpu(t) return to_device(t, C.DDP_DEVICE_CPU, false) end

--- t:pin_memory() -> a copy of CPU tensor t in page-locked host memory (t itself when it
-- is pinned already), which devices copy from asynchronously (to(..., {non_blocking =
-- true})). Raises for a device tensor, or without CUDA.
function Tensor.pin_memory(t)
  if C.ddp_tensor_is_pinned(t) ~= 0 then return t end
  check(C.ddp_tensor_pin_memory(box, t))
  return wrap(box[0])
end

--- t:is_pinned() -> true when t lives in pinned host memory.
function Tensor.is_pinned(t) return C.ddp_tensor_is_pinned(t) ~= 0 end

--- t:record_stream(s): t's device memory is also used by work queued on stream s (a
-- dl.cuda.Stream): the caching allocator keeps it from reuse until that work is done, even
-- after t is freed (torch's Tensor.record_stream). Raises for a CPU tensor.
function Tensor.record_stream(t, s)
  if not cuda.is_stream(s) then lib.raise("record_stream: expected a dl.cuda.Stream, got " .. type(s)) end
  check(C.ddp_cuda_record_stream(t, s.handle))
  return t
end

--- t:float() / :double() / :long() / :int() / :half() / :bfloat16() / :byte() / :bool():
-- t:to(dtype) for f32, f64, i64, i32, f16, bf16, u8, bool (t itself when it has that dtype).
function Tensor.float(t) return Tensor.to(t, C.DDP_F32) end
function Tensor.double(t) return Tensor.to(t, C.DDP_F64) end
function Tensor.long(t) return Tensor.to(t, C.DDP_I64) end
function Tensor.int(t) return Tensor.to(t, C.DDP_I32) end
function Tensor.half(t) return Tensor.to(t, C.DDP_F16) end
function Tensor.bfloat16(t) return Tensor.to(t, C.DDP_BF16) end
function Tensor.byte(t) return Tensor.to(t, C.DDP_U8) end
function Tensor.bool(t) return Tensor.to(t, C.DDP_BOOL) end

--- In-place random fills (generator: a ddplua Generator or nil for the default).
function Tensor.uniform_(t, lo, hi, gen)
  check(C.ddp_uniform_(t, lo or 0, hi or 1, gen and gen.handle))
  return t
end
function Tensor.normal_(t, mean, std, gen)
  check(C.ddp_normal_(t, mean or 0, std or 1, gen and gen.handle))
  return t
end
function Tensor.bernoulli_(t, p, gen)
  check(C.ddp_bernoulli_(t, p or 0.5, gen and gen.handle))
  return t
end

-- ---- properties -----------------------------------------------------------------------

--- Properties (t.grad, t.requires_grad, t.is_leaf, t.grad_fn, t.dtype, t.device,
-- t.is_cuda, t.shape, t.ndim): getters called by __index; see the top of this file.
properties.grad = function(t) return wrap(C.ddp_tensor_grad(t)) end
properties.requires_grad = function(t) return C.ddp_tensor_requires_grad(t) ~= 0 end
properties.is_leaf = function(t) return C.ddp_tensor_is_leaf(t) ~= 0 end
-- times the storage was written in place (shared by every view of it), PyTorch's _version
properties._version = function(t) return tonumber(C.ddp_tensor_version(t)) end
--- t.grad_fn: the name of the node that made t (PyTorch's grad_fn class name, e.g.
-- "AddBackward0"), nil for a leaf or a tensor made without grad.
properties.grad_fn = function(t)
  local name = C.ddp_tensor_grad_fn_name(t)
  return name ~= nil and ffi.string(name) or nil
end
properties.dtype = Tensor.type
--- t.device: "cpu" or "cuda:K", the device t's storage is on.
properties.device = function(t)
  local d = C.ddp_tensor_device(t)
  return d < 0 and "cpu" or ("cuda:" .. d)
end
--- t.is_cuda: true when t is on a CUDA device.
properties.is_cuda = function(t) return C.ddp_tensor_device(t) >= 0 end
properties.shape = lib.size_table
properties.ndim = Tensor.dim

--- Settable properties: t.grad = g (a tensor of t's shape, or nil), t.requires_grad = bool.
setters.grad = function(t, g) check(C.ddp_tensor_set_grad(t, g)) end
setters.requires_grad = function(t, v) check(C.ddp_tensor_set_requires_grad(t, v and 1 or 0)) end

-- ---- indexing -------------------------------------------------------------------------
-- t[{i, j, ...}] with one index per dimension reads or writes one element (1-based,
-- negative from the end); with fewer indices it is the view t:select(1, i):select(1, j)...
-- (a row of a matrix, say), and writing it fills the view with a number or copies a tensor
-- into it (broadcast), as PyTorch's t[i] = v. Writes are in-place ops autograd records
-- (fill_ / copy_ of a view: Note [in-place on views]), so an overwritten element of a
-- tensor that requires grad gets a zero gradient. A plain number key (t[i]) cannot reach a
-- metamethod: handles are C pointers, and LuaJIT takes a number index on a pointer as
-- pointer arithmetic; use t:select(1, i), t:get(i) or t[{i}].

-- The view t[{i, j, ...}] for fewer indices than t has dimensions.
local function sub_view(t, key)
  local v = t
  for i = 1, #key do v = v:select(1, key[i]) end
  return v
end

local function element_index(t, key)
  local n = C.ddp_tensor_dim(t)
  if #key > n or #key == 0 and n > 0 then
    lib.raise(("index: %d indices given for a tensor with %d dimensions"):format(#key, n))
  end
  local shape = C.ddp_tensor_shape(t)
  for i = 1, n do
    local v = key[i]
    index_buf[i - 1] = v < 0 and shape[i - 1] + v or v - 1
  end
end

meta.__index = function(t, k)
  local m = Tensor[k]
  if m ~= nil then return m end
  if type(k) == "table" then
    if #k < C.ddp_tensor_dim(t) and #k > 0 then return sub_view(t, k) end
    element_index(t, k)
    check(C.ddp_tensor_get(t, index_buf, num_out))
    return num_out[0]
  end
  local p = properties[k]
  if p then return p(t) end
  return nil
end

meta.__newindex = function(t, k, v)
  if type(k) == "table" then
    if #k < C.ddp_tensor_dim(t) and #k > 0 then
      local view = sub_view(t, k)
      if M.is_tensor(v) then check(C.ddp_copy_(view, v)) else check(C.ddp_fill_(view, v)) end
      return
    end
    element_index(t, k)
    check(C.ddp_set_element_(t, index_buf, v))
    return
  end
  local s = setters[k]
  if s then return s(t, v) end
  lib.raise("cannot set field '" .. tostring(k) .. "' of a tensor")
end

meta.__len = function(t)
  if C.ddp_tensor_dim(t) == 0 then return 0 end
  return tonumber(C.ddp_tensor_shape(t)[0])
end

meta.__tostring = format.tensor

-- ---- the op modules ---------------------------------------------------------------------

-- In this order (a later module's method of the same name wins); ddplua.functions takes their
-- `functions` (dl.add, dl.cat, ...) from this list.
local op_modules = { require "ddplua.ops.elementwise", require "ddplua.ops.reduce",
  require "ddplua.ops.shape", require "ddplua.ops.nn", require "ddplua.ops.norm", require "ddplua.ops.loss" }
for _, mod in ipairs(op_modules) do
  for k, v in pairs(mod.methods or {}) do Tensor[k] = v end
  for k, v in pairs(mod.meta or {}) do meta[k] = v end
end

ffi.metatype("struct ddp_tensor", meta)

M.methods, M.meta, M.properties, M.op_modules = Tensor, meta, properties, op_modules


local tensor_ptr = ffi.typeof("ddp_tensor*")
--- True when v is a tensor handle.
function M.is_tensor(v)
  return type(v) == "cdata" and ffi.istype(tensor_ptr, v)
end

return M
