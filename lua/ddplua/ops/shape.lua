--- ddplua.ops.shape: shape and indexing ops (runtime/ops/shape.c).
--
-- Views share the tensor's storage (no copy; writing through a view writes the base):
-- view, reshape (when it can), transpose, t, permute, squeeze, unsqueeze, expand, narrow,
-- select, flatten, unflatten, split, chunk. Copies: index_select, gather, scatter_add, cat,
-- stack. Everything is differentiable w.r.t. floating tensors.
--
-- Dimensions and positions (narrow's start, select's index) count from 1 as in Lua,
-- negatives from the end (-1 the last). Index TENSORS hold 0-based values as in PyTorch
-- (i64). Shapes may be given as numbers or one table: t:view(2, 3) or t:view({2, 3}).
--
-- Returns { methods = {...}, functions = {...}, meta = {} } (see ddplua.tensor).
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box, dim = lib.check, lib.wrap, lib.box, lib.dim

local M = { methods = {}, functions = {}, meta = {} }
local T = M.methods

local size_buf = ffi.new("int64_t[8]")
local dims_buf = ffi.new("int[8]")
local count_out = ffi.new("int[1]")
local list_cap = 64
local list_buf = ffi.new("ddp_tensor*[?]", list_cap)

-- Sizes for `op` given as numbers (varargs) or as one table: (int64_t[8], n). Each must
-- be an integer within 64 bits (lib.size); C checks the shape itself.
local function sizes(op, first, ...)
  if type(first) == "table" then return lib.shape(first, nil, op) end
  local n = select("#", ...) + 1
  if first == nil then return size_buf, 0 end
  if n > 8 then lib.raise(op .. ": a shape has at most 8 dimensions, got " .. n) end
  size_buf[0] = lib.size(first, op, "size 1")
  for i = 2, n do size_buf[i - 1] = lib.size((select(i - 1, ...)), op, "size " .. i) end
  return size_buf, n
end

-- A Lua position (1-based, negative from the end) to C's 0-based form (negative kept).
local function pos(p, what)
  if type(p) ~= "number" or p ~= math.floor(p) then
    lib.raise(what .. " must be an integer, got " .. tostring(p))
  end
  if p == 0 then lib.raise(what .. " 0 is not valid: positions count from 1 (-1 is the last)") end
  return p > 0 and p - 1 or p
end

-- A Lua list of tensors into the C pointer array: (array, n). The table keeps them alive.
local function tensor_list(list, op)
  if type(list) ~= "table" then lib.raise(op .. ": expected a table of tensors, got " .. type(list)) end
  local n = #list
  if n > list_cap then
    list_cap = n
    list_buf = ffi.new("ddp_tensor*[?]", list_cap)
  end
  for i = 1, n do list_buf[i - 1] = list[i] end
  return list_buf, n
end

-- The n tensors in the C array `outs` as a Lua table of handles.
local function wrap_list(outs, n)
  local res = {}
  for i = 1, n do res[i] = wrap(outs[i - 1]) end
  return res
end

--- t:view(sizes...) or t:view({sizes}) -> view of shape sizes sharing t's storage; one size
-- may be -1 (inferred). Raises naming both shapes when the element counts differ or when
-- t's strides do not allow the view (then use reshape).
function T.view(t, ...)
  local buf, n = sizes("view", ...)
  check(C.ddp_view(box, t, n, buf))
  return wrap(box[0])
end

--- t:reshape(sizes...) or t:reshape({sizes}) -> a view when possible, else a contiguous copy.
function T.reshape(t, ...)
  local buf, n = sizes("reshape", ...)
  check(C.ddp_reshape(box, t, n, buf))
  return wrap(box[0])
end

--- t:transpose(d1, d2) -> view with dimensions d1 and d2 swapped.
function T.transpose(t, d1, d2)
  check(C.ddp_transpose(box, t, dim(d1), dim(d2)))
  return wrap(box[0])
end

--- t:t() -> transpose of a 2-d (M, N) tensor, (N, M); 0-d and 1-d tensors come back as they
-- are. Raises for more than 2 dimensions.
function T.t(t)
  check(C.ddp_t(box, t))
  return wrap(box[0])
end

--- t:permute(d1, d2, ...) or t:permute({d1, d2, ...}) -> view with dimension i of the result
-- being dimension d_i of t (a permutation of 1 .. ndim).
function T.permute(t, first, ...)
  local n
  if type(first) == "table" then
    n = #first
    if n > 8 then lib.raise("permute: at most 8 dimensions, got " .. n) end
    for i = 1, n do dims_buf[i - 1] = dim(first[i]) end
  else
    n = select("#", ...) + 1
    if first == nil then n = 0 end
    if n > 8 then lib.raise("permute: at most 8 dimensions, got " .. n) end
    if n > 0 then dims_buf[0] = dim(first) end
    for i = 2, n do dims_buf[i - 1] = dim((select(i - 1, ...))) end
  end
  check(C.ddp_permute(box, t, n, dims_buf))
  return wrap(box[0])
end

--- t:squeeze() -> view without the size-1 dimensions; t:squeeze(d) -> without dimension d
-- when its size is 1 (else the same shape).
function T.squeeze(t, d)
  if d == nil then check(C.ddp_squeeze(box, t))
  else check(C.ddp_squeeze_dim(box, t, dim(d))) end
  return wrap(box[0])
end

--- t:unsqueeze(d) -> view with a size-1 dimension inserted at position d (1 .. ndim+1;
-- -1 appends).
function T.unsqueeze(t, d)
  check(C.ddp_unsqueeze(box, t, dim(d)))
  return wrap(box[0])
end

--- t:expand(sizes...) or t:expand({sizes}) -> view broadcast to sizes (stride 0 along
-- expanded dimensions; new dimensions in front; -1 keeps a size). Only size-1 dimensions
-- can grow. Backward sums the gradient back.
function T.expand(t, ...)
  local buf, n = sizes("expand", ...)
  check(C.ddp_expand(box, t, n, buf))
  return wrap(box[0])
end

--- t:expand_as(other) -> t:expand(other's shape).
function T.expand_as(t, other)
  check(C.ddp_expand(box, t, C.ddp_tensor_dim(other), C.ddp_tensor_shape(other)))
  return wrap(box[0])
end

--- t:narrow(d, start, length) -> view of `length` elements from position `start` (1-based,
-- negative from the end) along dimension d.
function T.narrow(t, d, start, length)
  check(C.ddp_narrow(box, t, dim(d), pos(start, "narrow: start"), length))
  return wrap(box[0])
end

--- t:select(d, i) -> view of element i (1-based, negative from the end) along d, that
-- dimension removed: (A, B, C):select(2, i) is (A, C). t[i] is t:select(1, i).
function T.select(t, d, i)
  check(C.ddp_select(box, t, dim(d), pos(i, "select: index")))
  return wrap(box[0])
end

--- t:flatten([start_d[, end_d]]) -> dimensions start_d .. end_d (default 1 .. -1) merged
-- into one: a view when the strides allow, else a copy. A 0-d tensor gives shape (1).
function T.flatten(t, s, e)
  check(C.ddp_flatten(box, t, s == nil and 0 or dim(s), e == nil and -1 or dim(e)))
  return wrap(box[0])
end

--- t:unflatten(d, {sizes}) -> dimension d replaced by sizes (one may be -1; the product is
-- its size).
function T.unflatten(t, d, sz)
  local buf, n = lib.shape(sz, nil, "unflatten")
  check(C.ddp_unflatten(box, t, dim(d), n, buf))
  return wrap(box[0])
end

--- t:index_select(d, index) -> copy of t with dimension d taken at the values of index
-- (a 1-d i64 tensor of K values, 0-based): (A, B, C) with d = 2 gives (A, K, C).
function T.index_select(t, d, index)
  check(C.ddp_index_select(box, t, dim(d), index))
  return wrap(box[0])
end

--- t:gather(d, index) -> tensor of index's shape with out[i][j][k] = t[i][index[i][j][k]][k]
-- for d = 2 (index: i64, 0-based values, as many dimensions as t, no larger than t
-- outside d).
function T.gather(t, d, index)
  check(C.ddp_gather(box, t, dim(d), index))
  return wrap(box[0])
end

--- t:scatter_add(d, index, src) -> copy of t with out[i][index[i][j][k]][k] += src[i][j][k]
-- for d = 2 (index: i64, 0-based; src of t's dtype, at least index's size).
function T.scatter_add(t, d, index, src)
  check(C.ddp_scatter_add(box, t, dim(d), index, src))
  return wrap(box[0])
end

--- t:scatter_add_(d, index, src) -> t, the same in place.
function T.scatter_add_(t, d, index, src)
  check(C.ddp_scatter_add_(t, dim(d), index, src))
  return t
end

--- t:split(size, d) -> table of views of `size` elements along d (default 1), the last
-- smaller; t:split({s1, s2, ...}, d) -> views of those sizes (summing to the size of d).
function T.split(t, sz, d)
  local cd = d == nil and 0 or dim(d)
  if type(sz) == "table" then
    local buf, n = lib.shape(sz, nil, "split")
    local outs = ffi.new("ddp_tensor*[?]", n)
    check(C.ddp_split_with_sizes(outs, t, n, buf, cd))
    return wrap_list(outs, n)
  end
  check(C.ddp_split(nil, 0, count_out, t, sz, cd))
  local n = count_out[0]
  local outs = ffi.new("ddp_tensor*[?]", n)
  check(C.ddp_split(outs, n, count_out, t, sz, cd))
  return wrap_list(outs, n)
end

--- t:chunk(n, d) -> table of at most n views along d (default 1) of ceil(size / n) elements
-- each (fewer pieces when they run out, as PyTorch).
function T.chunk(t, chunks, d)
  local cd = d == nil and 0 or dim(d)
  check(C.ddp_chunk(nil, 0, count_out, t, chunks, cd))
  local n = count_out[0]
  local outs = ffi.new("ddp_tensor*[?]", n)
  check(C.ddp_chunk(outs, n, count_out, t, chunks, cd))
  return wrap_list(outs, n)
end

local F = M.functions
for name, fn in pairs(T) do F[name] = fn end

--- dl.cat({a, b, ...}, d) -> new tensor joining the tensors along d (default 1). Sizes must
-- match outside d; the dtype is the promotion of all; 1-d empty tensors are skipped.
-- Raises naming the tensor's position and the shapes.
function F.cat(list, d)
  local arr, n = tensor_list(list, "cat")
  check(C.ddp_cat(box, arr, n, d == nil and 0 or dim(d)))
  return wrap(box[0])
end
F.concat = F.cat

--- dl.stack({a, b, ...}, d) -> new tensor joining tensors of one shape (S...) along a new
-- dimension d (default 1; 1 .. ndim+1): for d = 1, (n, S...).
function F.stack(list, d)
  local arr, n = tensor_list(list, "stack")
  check(C.ddp_stack(box, arr, n, d == nil and 0 or dim(d)))
  return wrap(box[0])
end

return M
