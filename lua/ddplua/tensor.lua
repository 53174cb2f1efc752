--- ddplua.tensor: the Tensor metatype over the C handle `ddp_tensor*`.
--
-- A tensor handle is a `ddp_tensor*` cdata owning one reference (released by the collector
-- or by :free()). Methods come from this file (metadata, element access, autograd, copies)
-- and from the op modules under ddplua/ops/ (installed below). Properties read with `.`:
-- `t.grad`, `t.requires_grad`, `t.is_leaf`, `t.grad_fn` (node name), `t.dtype` (name),
-- `t.device` ("cpu"), `t.shape` (table). Positions count from 1 as in Lua (Torch7).
local lib = require "ddplua.lib"
local format = require "ddplua.format"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local Tensor = {}      -- methods
local meta = {}        -- metamethods
local properties = {}  -- key -> getter(t)
local setters = {}     -- key -> setter(t, v)

local index_buf = ffi.new("int64_t[8]")
local num_out = ffi.new("double[1]")

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

--- Set the element at 1-based indices: t:set(i, j, value).
function Tensor.set(t, ...)
  local n = C.ddp_tensor_dim(t)
  local shape = C.ddp_tensor_shape(t)
  for i = 1, n do
    local v = select(i, ...)
    index_buf[i - 1] = v < 0 and shape[i - 1] + v or v - 1
  end
  check(C.ddp_tensor_set(t, index_buf, (select(n + 1, ...))))
  return t
end

--- Release what this handle holds now (memory returns at once); later use raises
-- "freed tensor". Safe to call twice.
function Tensor.free(t)
  C.ddp_tensor_free(t)
end

-- ---- autograd -----------------------------------------------------------------------

--- Back-propagate from t. gradient: a tensor of t's shape (needed unless t has one
-- element); opts.retain_graph keeps the saved tensors for another backward.
function Tensor.backward(t, gradient, opts)
  local retain = opts and opts.retain_graph and 1 or 0
  check(C.ddp_backward(t, gradient, retain))
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

function Tensor.contiguous(t)
  check(C.ddp_contiguous(box, t))
  return wrap(box[0])
end

function Tensor.clone(t)
  check(C.ddp_clone(box, t))
  return wrap(box[0])
end

--- t:to(dtype): converted copy ("f64", "i64", ...), or t when the dtype already matches.
-- t:to("cpu") returns t.
function Tensor.to(t, what)
  if what == "cpu" then return t end
  check(C.ddp_to_dtype(box, t, lib.dtype(what)))
  return wrap(box[0])
end

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

properties.grad = function(t) return wrap(C.ddp_tensor_grad(t)) end
properties.requires_grad = function(t) return C.ddp_tensor_requires_grad(t) ~= 0 end
properties.is_leaf = function(t) return C.ddp_tensor_is_leaf(t) ~= 0 end
properties.grad_fn = function(t)
  local name = C.ddp_tensor_grad_fn_name(t)
  return name ~= nil and ffi.string(name) or nil
end
properties.dtype = Tensor.type
properties.device = function(t)
  local d = C.ddp_tensor_device(t)
  return d < 0 and "cpu" or ("cuda:" .. d)
end
properties.shape = lib.size_table
properties.ndim = Tensor.dim

setters.grad = function(t, g) check(C.ddp_tensor_set_grad(t, g)) end
setters.requires_grad = function(t, v) check(C.ddp_tensor_set_requires_grad(t, v and 1 or 0)) end

-- ---- indexing -------------------------------------------------------------------------
-- t[{i, j, ...}] reads or writes one element (1-based, negative from the end). A plain
-- number key (t[i]) cannot reach a metamethod: handles are C pointers, and LuaJIT takes a
-- number index on a pointer as pointer arithmetic; use t:select(1, i), t:get(i) or t[{i}].

local function element_index(t, key)
  local n = C.ddp_tensor_dim(t)
  if #key ~= n then
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
    element_index(t, k)
    check(C.ddp_tensor_set(t, index_buf, v))
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

local op_modules = { "ddplua.ops.elementwise", "ddplua.ops.reduce", "ddplua.ops.shape", "ddplua.ops.nn",
  "ddplua.ops.norm", "ddplua.ops.loss" }
for _, name in ipairs(op_modules) do
  local mod = require(name)
  for k, v in pairs(mod.methods or {}) do Tensor[k] = v end
  for k, v in pairs(mod.meta or {}) do meta[k] = v end
end

ffi.metatype("struct ddp_tensor", meta)

local M = { methods = Tensor, meta = meta, properties = properties, op_modules = op_modules }

--- True when v is a tensor handle.
local tensor_ptr = ffi.typeof("ddp_tensor*")
function M.is_tensor(v)
  return type(v) == "cdata" and ffi.istype(tensor_ptr, v)
end

return M
