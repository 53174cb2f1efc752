-- spec/helpers/views.lua: make non-contiguous views for specs without depending on the
-- shape ops under test: a strided view over a larger tensor, built through the FFI.
local dl = require "ddplua"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local M = {}

--- transposed(t): for a 2-d t of shape (m, n), the transpose of t as a non-contiguous
-- (n, m) view with strides (1, n) over a private copy of t.
--   returns view, owner (keep `owner` referenced while `view` is used)
function M.transposed(t)
  local owner = t:contiguous():clone()
  local s = owner:size()
  assert(#s == 2, "transposed: needs a 2-d tensor")
  local shape = ffi.new("int64_t[2]", s[2], s[1])
  local strides = ffi.new("int64_t[2]", 1, s[2])
  lib.check(C.ddp_tensor_from_blob(lib.box, C.ddp_tensor_data(owner), 2, shape, strides,
    C.ddp_tensor_dtype(owner), nil, nil))
  return lib.wrap(lib.box[0]), owner
end

--- strided(t, step): a view of every `step`-th element along the last dimension of a
-- fresh tensor whose selected elements equal t (same shape as t, non-contiguous).
--   returns view, owner
function M.strided(t, step)
  step = step or 2
  local s = t:size()
  local n = #s
  local big_shape = {}
  for i = 1, n do big_shape[i] = s[i] end
  big_shape[n] = s[n] * step
  local owner = dl.zeros(big_shape, { dtype = t:type() })
  local shape = ffi.new("int64_t[8]")
  local strides = ffi.new("int64_t[8]")
  local acc = 1
  for d = n, 1, -1 do
    shape[d - 1] = s[d]
    strides[d - 1] = (d == n) and step or acc
    acc = acc * big_shape[d]
  end
  lib.check(C.ddp_tensor_from_blob(lib.box, C.ddp_tensor_data(owner), n, shape, strides,
    C.ddp_tensor_dtype(owner), nil, nil))
  local view = lib.wrap(lib.box[0])
  dl.no_grad(function() view:copy_(t) end)
  return view, owner
end

return M
