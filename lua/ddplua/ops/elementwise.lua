--- ddplua.ops.elementwise: element-wise arithmetic with NumPy broadcasting and PyTorch's
-- type promotion, unary math, activations, where and comparisons.
--
-- Returns { methods = {name = fn(self, ...)}, functions = {name = fn(...)},
--           meta = {__add = ..., ...} }: ddplua.tensor installs the methods and metamethods,
-- ddplua installs the functions (dl.add(a, b), dl.relu(t), dl.where(c, a, b), ...).
--
-- Shapes broadcast from the last dimension ((2, 3) with (3,) -> (2, 3); (4, 1) with (1, 5)
-- -> (4, 5)); shapes that do not raise an error naming the op and both shapes. A Lua number
-- operand does not change a floating tensor's dtype; with an integer tensor a non-integral
-- number gives f32. div is true division (integers give f32). In-place forms (`add_`, ...)
-- return self and raise for a leaf that requires grad (outside no_grad), or when the result
-- dtype cannot be stored in self (f32 into i64). Comparisons are methods (t:lt(u)), not
-- the `<` operators, which Lua requires to return booleans.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = { methods = {}, functions = {}, meta = {} }
local methods, functions, meta = M.methods, M.functions, M.meta

local tensor_ptr = ffi.typeof("ddp_tensor*")
local scalar_buf = ffi.new("double[1]")

-- A 0-d tensor holding the number v, in `like`'s dtype (f32 when like is nil); for the
-- ops that take a number only as a tensor (maximum, where, a number on the left of lt).
local function scalar_tensor(v, like)
  local dtype = like and C.ddp_tensor_dtype(like) or C.DDP_F32
  if like and C.ddp_dtype_is_floating(dtype) == 0 and v % 1 ~= 0 then dtype = C.DDP_F32 end
  scalar_buf[0] = v
  check(C.ddp_tensor_from_data(box, 0, nil, dtype, scalar_buf, C.DDP_F64))
  return wrap(box[0])
end

local function expect_tensor(v, op, what)
  if type(v) ~= "cdata" or not ffi.istype(tensor_ptr, v) then
    lib.raise(("%s: %s must be a tensor or a number, got %s"):format(op, what, type(v)))
  end
end

-- ---- binary arithmetic ----------------------------------------------------------------

--- t:add(other[, {alpha = a}]) / dl.add(a, b[, opts]): a + alpha * b, broadcast and
-- promoted; either side may be a Lua number. Differentiable.
local function add(a, b, opts)
  local alpha = opts and opts.alpha
  if type(b) == "number" then
    check(C.ddp_add_scalar(box, a, alpha and b * alpha or b))
  elseif type(a) == "number" then
    if alpha then check(C.ddp_mul_scalar(box, b, alpha)); b = wrap(box[0]) end
    check(C.ddp_add_scalar(box, b, a))
  elseif alpha then
    check(C.ddp_add_alpha(box, a, b, alpha))
  else
    check(C.ddp_add(box, a, b))
  end
  return wrap(box[0])
end

--- t:sub(other[, {alpha = a}]) / dl.sub(a, b[, opts]): a - alpha * b; a number on the left
-- gives number - tensor. Two bool tensors raise (as PyTorch).
local function sub(a, b, opts)
  local alpha = opts and opts.alpha
  if type(b) == "number" then
    check(C.ddp_sub_scalar(box, a, alpha and b * alpha or b))
  elseif type(a) == "number" then
    if alpha then check(C.ddp_mul_scalar(box, b, alpha)); b = wrap(box[0]) end
    check(C.ddp_rsub_scalar(box, b, a))
  elseif alpha then
    check(C.ddp_add_alpha(box, a, b, -alpha))
  else
    check(C.ddp_sub(box, a, b))
  end
  return wrap(box[0])
end

--- t:mul(other) / dl.mul(a, b): a * b (numbers allowed on either side).
local function mul(a, b)
  if type(b) == "number" then check(C.ddp_mul_scalar(box, a, b))
  elseif type(a) == "number" then check(C.ddp_mul_scalar(box, b, a))
  else check(C.ddp_mul(box, a, b)) end
  return wrap(box[0])
end

--- t:div(other) / dl.div(a, b): true division a / b (integers give f32).
local function div(a, b)
  if type(b) == "number" then check(C.ddp_div_scalar(box, a, b))
  elseif type(a) == "number" then check(C.ddp_rdiv_scalar(box, b, a))
  else check(C.ddp_div(box, a, b)) end
  return wrap(box[0])
end

--- t:pow(e) / dl.pow(a, b): a ^ b, tensor ^ tensor, tensor ^ number or number ^ tensor.
-- An integer tensor to a negative integral number raises (as PyTorch).
local function pow(a, b)
  if type(b) == "number" then check(C.ddp_pow_scalar(box, a, b))
  elseif type(a) == "number" then check(C.ddp_rpow_scalar(box, b, a))
  else check(C.ddp_pow(box, a, b)) end
  return wrap(box[0])
end

--- t:maximum(other) / dl.maximum(a, b): element-wise maximum (NaN propagates; ties share
-- the gradient). A number operand becomes a 0-d tensor of the other's dtype.
local function maximum(a, b)
  if type(b) == "number" then b = scalar_tensor(b, a) elseif type(a) == "number" then a = scalar_tensor(a, b) end
  check(C.ddp_maximum(box, a, b))
  return wrap(box[0])
end

--- t:minimum(other) / dl.minimum(a, b): element-wise minimum.
local function minimum(a, b)
  if type(b) == "number" then b = scalar_tensor(b, a) elseif type(a) == "number" then a = scalar_tensor(a, b) end
  check(C.ddp_minimum(box, a, b))
  return wrap(box[0])
end

methods.add, methods.sub, methods.mul, methods.div, methods.pow = add, sub, mul, div, pow
methods.maximum, methods.minimum = maximum, minimum
functions.add, functions.sub, functions.mul, functions.div, functions.pow = add, sub, mul, div, pow
functions.maximum, functions.minimum = maximum, minimum
methods.multiply, methods.divide, methods.subtract = mul, div, sub

--- In place: t:add_(other[, {alpha = a}]), t:sub_(...), t:mul_(other), t:div_(other),
-- t:pow_(e); other a tensor broadcasting to t's shape, or a number. Return t.
function methods.add_(t, o, opts)
  local alpha = opts and opts.alpha
  if type(o) == "number" then check(C.ddp_add_scalar_(t, alpha and o * alpha or o))
  elseif alpha then check(C.ddp_add_alpha_(t, o, alpha))
  else check(C.ddp_add_(t, o)) end
  return t
end
function methods.sub_(t, o, opts)
  local alpha = opts and opts.alpha
  if type(o) == "number" then check(C.ddp_sub_scalar_(t, alpha and o * alpha or o))
  elseif alpha then check(C.ddp_add_alpha_(t, o, -alpha))
  else check(C.ddp_sub_(t, o)) end
  return t
end
function methods.mul_(t, o)
  if type(o) == "number" then check(C.ddp_mul_scalar_(t, o)) else check(C.ddp_mul_(t, o)) end
  return t
end
function methods.div_(t, o)
  if type(o) == "number" then check(C.ddp_div_scalar_(t, o)) else check(C.ddp_div_(t, o)) end
  return t
end
function methods.pow_(t, o)
  if type(o) == "number" then check(C.ddp_pow_scalar_(t, o)) else check(C.ddp_pow_(t, o)) end
  return t
end

-- Operators: a number may stand on either side (2 - t, 1 / t, 2 ^ t).
--
-- Note [pointer plus number]: a tensor handle is a pointer to an opaque struct, so for
-- `t + 2`, `2 + t` and `t - 2` LuaJIT first considers pointer arithmetic; its trace recorder
-- (Debian's 2.1.0-beta3) then compiled the fallback to the metamethod wrongly and the
-- process crashed once the loop was hot (reproduced with a bare opaque struct, no ddplua,
-- while every handle still had its own ffi.gc finaliser). A number operand therefore goes
-- through a function kept out of the JIT, so a trace that records pointer-plus-number
-- arithmetic always aborts and that form runs interpreted; tensor + tensor never takes
-- that path and is compiled like t:add(u).
local function add_number(a, b) return add(a, b) end
local function sub_number(a, b) return sub(a, b) end
jit.off(add_number)
jit.off(sub_number)
meta.__add = function(a, b)
  if type(a) == "number" or type(b) == "number" then return add_number(a, b) end
  return add(a, b)
end
meta.__sub = function(a, b)
  if type(a) == "number" or type(b) == "number" then return sub_number(a, b) end
  return sub(a, b)
end
meta.__mul = mul
meta.__div = div
meta.__pow = pow
meta.__unm = function(a)
  check(C.ddp_neg(box, a))
  return wrap(box[0])
end

-- ---- unary ops and activations ---------------------------------------------------------

-- name -> C function; each gets t:name(), dl.name(t) and the in-place t:name_().
local unary = {
  neg = { C.ddp_neg, C.ddp_neg_ }, exp = { C.ddp_exp, C.ddp_exp_ }, log = { C.ddp_log, C.ddp_log_ },
  sqrt = { C.ddp_sqrt, C.ddp_sqrt_ }, rsqrt = { C.ddp_rsqrt, C.ddp_rsqrt_ },
  abs = { C.ddp_abs, C.ddp_abs_ }, relu = { C.ddp_relu, C.ddp_relu_ },
  tanh = { C.ddp_tanh, C.ddp_tanh_ }, sigmoid = { C.ddp_sigmoid, C.ddp_sigmoid_ },
  silu = { C.ddp_silu, C.ddp_silu_ },
}
--- t:neg(), t:exp(), t:log(), t:sqrt(), t:rsqrt() (1 / sqrt), t:abs(), t:relu(), t:tanh(),
-- t:sigmoid(), t:silu() (x * sigmoid(x)); the same as dl.exp(t), ...; in place t:exp_(), ...
-- Shape (*) -> (*). Integer tensors: neg, abs, relu keep the dtype; exp, log, sqrt, rsqrt,
-- tanh, sigmoid give f32; silu raises. Differentiable (relu's and abs's gradient is 0 at 0).
for name, fns in pairs(unary) do
  local f, f_ = fns[1], fns[2]
  local function op(t)
    check(f(box, t))
    return wrap(box[0])
  end
  methods[name], functions[name] = op, op
  methods[name .. "_"] = function(t)
    check(f_(t))
    return t
  end
end
methods.negative, functions.negative = methods.neg, methods.neg

-- clamp's bound: nil (absent) or a number.
local function bound(v, what)
  if v == nil then return 0, 0 end
  if type(v) ~= "number" then lib.raise(("clamp: %s must be a number or nil, got %s"):format(what, type(v))) end
  return 1, v
end

--- t:clamp(min, max) / dl.clamp(t, min, max): min(max(t, min), max); either bound may be
-- nil (open); also t:clamp({min = a, max = b}). The gradient passes where min <= t <= max.
local function clamp(t, lo, hi)
  if type(lo) == "table" then lo, hi = lo.min, lo.max end
  local hl, l = bound(lo, "min")
  local hh, h = bound(hi, "max")
  check(C.ddp_clamp(box, t, hl, l, hh, h))
  return wrap(box[0])
end
methods.clamp, functions.clamp, methods.clip, functions.clip = clamp, clamp, clamp, clamp
function methods.clamp_(t, lo, hi)
  if type(lo) == "table" then lo, hi = lo.min, lo.max end
  local hl, l = bound(lo, "min")
  local hh, h = bound(hi, "max")
  check(C.ddp_clamp_(t, hl, l, hh, h))
  return t
end

--- t:leaky_relu([negative_slope]) / dl.leaky_relu(t[, negative_slope]): x for x > 0, else
-- negative_slope * x (default 0.01, as PyTorch). Floating tensors only.
local function leaky_relu(t, slope)
  if type(slope) == "table" then slope = slope.negative_slope end
  check(C.ddp_leaky_relu(box, t, slope or 0.01))
  return wrap(box[0])
end
methods.leaky_relu, functions.leaky_relu = leaky_relu, leaky_relu
function methods.leaky_relu_(t, slope)
  if type(slope) == "table" then slope = slope.negative_slope end
  check(C.ddp_leaky_relu_(t, slope or 0.01))
  return t
end

local function approximate(opts)
  local a = type(opts) == "table" and opts.approximate or opts
  if a == nil or a == "none" then return 0 end
  if a == "tanh" then return 1 end
  lib.raise("gelu: approximate must be \"none\" or \"tanh\", got " .. tostring(a))
end

--- t:gelu([{approximate = "tanh"}]) / dl.gelu(t[, opts]): GELU, exact x * Phi(x) by default
-- (PyTorch's), or the tanh approximation (Hendrycks & Gimpel, arXiv:1606.08415).
local function gelu(t, opts)
  check(C.ddp_gelu(box, t, approximate(opts)))
  return wrap(box[0])
end
methods.gelu, functions.gelu = gelu, gelu
function methods.gelu_(t, opts)
  check(C.ddp_gelu_(t, approximate(opts)))
  return t
end

-- ---- where and comparisons -------------------------------------------------------------

--- dl.where(cond, a, b): cond ? a : b element-wise, the three broadcast together; cond a bool
-- tensor; a or b may be numbers (taking the other's dtype). Differentiable w.r.t. a and b.
-- t:where(cond, other) is dl.where(cond, t, other), as PyTorch.
local function where(cond, a, b)
  expect_tensor(cond, "where", "condition")
  if type(a) == "number" then a = scalar_tensor(a, type(b) ~= "number" and b or nil) end
  if type(b) == "number" then b = scalar_tensor(b, a) end
  check(C.ddp_where(box, cond, a, b))
  return wrap(box[0])
end
functions.where = where
function methods.where(t, cond, other) return where(cond, t, other) end

local function comparison(name, f, fs, mirror)
  local function cmp(a, b)
    if type(b) == "number" then check(fs(box, a, b))
    elseif type(a) == "number" then check(mirror(box, b, a)) -- 2 < t is t > 2
    else check(f(box, a, b)) end
    return wrap(box[0])
  end
  methods[name], functions[name] = cmp, cmp
end
--- t:eq(u), t:ne(u), t:lt(u), t:le(u), t:gt(u), t:ge(u) (u a tensor or a number) and
-- dl.eq(a, b), ...: a bool tensor of the broadcast shape. Not differentiable.
comparison("eq", C.ddp_eq, C.ddp_eq_scalar, C.ddp_eq_scalar)
comparison("ne", C.ddp_ne, C.ddp_ne_scalar, C.ddp_ne_scalar)
comparison("lt", C.ddp_lt, C.ddp_lt_scalar, C.ddp_gt_scalar)
comparison("le", C.ddp_le, C.ddp_le_scalar, C.ddp_ge_scalar)
comparison("gt", C.ddp_gt, C.ddp_gt_scalar, C.ddp_lt_scalar)
comparison("ge", C.ddp_ge, C.ddp_ge_scalar, C.ddp_le_scalar)

return M
