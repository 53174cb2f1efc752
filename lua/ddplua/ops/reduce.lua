--- ddplua.ops.reduce: reductions (sum, mean, max, min, argmax, argmin, var, std, norm) and
-- softmax / log_softmax, as tensor methods and functions (dl.sum(t, ...) is t:sum(...)).
--
-- Dimensions count from 1 (negative from the end, -1 the last), as everywhere in ddplua;
-- the indices max/min/argmax/argmin return are data and count from 0, as in PyTorch.
-- A reduction takes its dims as a number or a list and options in a trailing table:
--   t:sum()                          full sum, a 0-d tensor
--   t:sum(2)                         over dimension 2
--   t:sum({1, 3}, {keepdim = true})  over dimensions 1 and 3, keeping them with size 1
--   t:sum({dtype = "f64"})           options alone: a full reduction
-- Errors (raised at the caller's line) name the op and the dimension or dtype at fault.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = { methods = {}, functions = {}, meta = {} }
local methods = M.methods

local dims_buf = ffi.new("int[8]")
local box2 = ffi.new("ddp_tensor*[1]") -- second out parameter (indices)
local huge = math.huge

-- "sum" -> "sum: dim" for lib.dim's messages, made once (no string work per call).
local dim_what = setmetatable({}, { __index = function(t, op)
  local w = op .. ": dim"
  t[op] = w
  return w
end })

-- (dims, opts) arguments -> number of dims written to dims_buf (0: all), opts.
local function parse_dims(op, dims, opts)
  if dims == nil then return 0, opts end
  local kind = type(dims)
  if kind == "number" then
    dims_buf[0] = lib.dim(dims, dim_what[op])
    return 1, opts
  end
  if kind == "table" then
    if dims[1] == nil and next(dims) ~= nil then return 0, dims end -- options only
    local n = #dims
    if n > 8 then lib.raise(("%s: %d dims given (at most 8)"):format(op, n)) end
    for i = 1, n do dims_buf[i - 1] = lib.dim(dims[i], dim_what[op]) end
    return n, opts
  end
  lib.raise(("%s: dims must be a number or a list of numbers, got %s"):format(op, kind))
end

local function keepdim_of(opts) return (opts and opts.keepdim) and 1 or 0 end
local function dtype_of(opts) return opts and opts.dtype and lib.dtype(opts.dtype) or -1 end

--- t:sum([dims], [opts]) -> tensor. Sum over dims (a number, a list, or none: every
-- dimension, giving a 0-d tensor). opts.keepdim keeps reduced dims with size 1;
-- opts.dtype sets the result dtype (default: t's dtype for floating t, i64 for integer
-- and bool t, as PyTorch). The sum of no elements is 0. Differentiable.
function methods.sum(t, dims, opts)
  local n
  n, opts = parse_dims("sum", dims, opts)
  check(C.ddp_sum(box, t, dims_buf, n, keepdim_of(opts), dtype_of(opts)))
  return wrap(box[0])
end

--- t:mean([dims], [opts]) -> tensor. Mean over dims (as t:sum). Integer and bool tensors
-- need opts.dtype (a floating dtype) and raise otherwise, as PyTorch. The mean of no
-- elements is nan. Differentiable.
function methods.mean(t, dims, opts)
  local n
  n, opts = parse_dims("mean", dims, opts)
  check(C.ddp_mean(box, t, dims_buf, n, keepdim_of(opts), dtype_of(opts)))
  return wrap(box[0])
end

-- max and min share their shape: no dim -> 0-d value; a dim -> values, indices.
local function extreme(op, all_fn, dim_fn)
  local what = op .. ": dim"
  return function(t, dim, opts)
    if dim == nil then
      check(all_fn(box, t))
      return wrap(box[0])
    end
    if type(dim) ~= "number" then
      lib.raise(("%s: dim must be a number, got %s (for the element-wise %s of two tensors "
        .. "use dl.%s)"):format(op, type(dim), op == "max" and "maximum" or "minimum",
        op == "max" and "maximum" or "minimum"))
    end
    check(dim_fn(box, box2, t, lib.dim(dim, what), keepdim_of(opts)))
    local values = wrap(box[0])
    return values, wrap(box2[0])
  end
end

--- t:max() -> 0-d tensor: the largest element (raises on an empty tensor). Its gradient
-- is split evenly among the elements equal to it (PyTorch's amax rule).
-- t:max(dim, [opts]) -> values, indices: the largest element along dim and its 0-based
-- index (i64, first occurrence), as torch.max(t, dim); opts.keepdim. NaN propagates.
-- The gradient of values goes to the element at the index. Raises when dim has size 0.
methods.max = extreme("max", C.ddp_max, C.ddp_max_dim)

--- t:min() / t:min(dim, [opts]): as t:max, for the smallest element.
methods.min = extreme("min", C.ddp_min, C.ddp_min_dim)

local function arg_extreme(op, all_fn, dim_fn)
  local what = op .. ": dim"
  return function(t, dim, opts)
    if dim == nil then
      check(all_fn(box, t))
    else
      check(dim_fn(box, t, lib.dim(dim, what), keepdim_of(opts)))
    end
    return wrap(box[0])
  end
end

--- t:argmax([dim], [opts]) -> i64 tensor of 0-based indices of the largest elements along
-- dim (first occurrence; opts.keepdim), or without dim the index into t flattened in
-- row-major order (a 0-d tensor). Raises on an empty reduction. Not differentiable.
methods.argmax = arg_extreme("argmax", C.ddp_argmax, C.ddp_argmax_dim)

--- t:argmin([dim], [opts]): as t:argmax, for the smallest elements.
methods.argmin = arg_extreme("argmin", C.ddp_argmin, C.ddp_argmin_dim)

local function correction_of(op, opts)
  if opts == nil then return 1 end
  if opts.correction ~= nil then
    local c = opts.correction
    if type(c) ~= "number" or c ~= math.floor(c) or c < 0 then
      lib.raise(("%s: correction must be an integer >= 0, got %s"):format(op, tostring(c)))
    end
    return c
  end
  return opts.unbiased == false and 0 or 1
end

--- t:var([dims], [opts]) -> tensor: variance over dims (all when none), floating t.
-- opts.unbiased (default true) divides by n - 1 (Bessel's correction), false by n;
-- opts.correction = c divides by n - c; opts.keepdim. n - c <= 0 gives nan or inf, as
-- PyTorch. Differentiable.
function methods.var(t, dims, opts)
  local n
  n, opts = parse_dims("var", dims, opts)
  check(C.ddp_var(box, t, dims_buf, n, correction_of("var", opts), keepdim_of(opts)))
  return wrap(box[0])
end

--- t:std([dims], [opts]) -> tensor: sqrt(t:var(dims, opts)). Differentiable.
function methods.std(t, dims, opts)
  local n
  n, opts = parse_dims("std", dims, opts)
  check(C.ddp_std(box, t, dims_buf, n, correction_of("std", opts), keepdim_of(opts)))
  return wrap(box[0])
end

--- t:norm([p], [opts]) -> tensor: the vector p-norm (sum |x|^p)^(1/p) over opts.dim (a
-- number or a list; default every dimension, giving a 0-d tensor), opts.keepdim.
-- p: a number > 0 (default 2), math.huge or "inf" for max |x|, "fro" for 2. Floating t.
-- Examples: t:norm(), t:norm(1), t:norm(2, {dim = 2}), t:norm({dim = {1, 2}}).
-- Differentiable (the gradient is 0 where the norm is 0).
function methods.norm(t, p, opts)
  if type(p) == "table" then p, opts = nil, p end
  if p == nil or p == "fro" then p = 2
  elseif p == "inf" then p = huge
  elseif type(p) ~= "number" then
    lib.raise(("norm: p must be a number, \"inf\" or \"fro\", got %s"):format(tostring(p)))
  end
  local n = parse_dims("norm", opts and opts.dim)
  check(C.ddp_norm(box, t, p, dims_buf, n, keepdim_of(opts)))
  return wrap(box[0])
end

--- t:softmax(dim) -> tensor of t's shape and dtype: exp(x) / sum(exp(x)) along dim,
-- computed stably (the max is subtracted first; f16/bf16 in f32). Floating t.
-- Differentiable.
function methods.softmax(t, dim)
  check(C.ddp_softmax(box, t, lib.dim(dim, "softmax: dim")))
  return wrap(box[0])
end

--- t:log_softmax(dim) -> tensor of t's shape and dtype: x - log(sum(exp(x))) along dim,
-- computed stably. Floating t. Differentiable.
function methods.log_softmax(t, dim)
  check(C.ddp_log_softmax(box, t, lib.dim(dim, "log_softmax: dim")))
  return wrap(box[0])
end

-- dl.sum(t, ...), dl.softmax(t, dim), ...: the same functions with the tensor first.
for _, name in ipairs { "sum", "mean", "max", "min", "argmax", "argmin", "var", "std", "norm",
  "softmax", "log_softmax" } do
  M.functions[name] = methods[name]
end

return M
