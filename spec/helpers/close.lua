-- spec/helpers/close.lua: compare a tensor with nested Lua tables (or another tensor)
-- element by element within atol + rtol * |expected|; raise naming the first mismatch.
local dl = require "ddplua"

local M = {}

--- flatten(v[, out]): the numbers of a nested table (a tensor's tolist()) in order, appended
-- to `out` (a new table when nil); booleans as 1 and 0.
local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  elseif type(v) == "boolean" then
    out[#out + 1] = v and 1 or 0
  else
    out[#out + 1] = v
  end
  return out
end

M.flatten = flatten

--- count_bit_differences(a, b): how many elements of two 4-byte-element tensors (f32, i32) of
-- the same shape differ in their bits (0: bitwise equal). Raises when the shapes differ.
function M.count_bit_differences(a, b)
  local lib = require "ddplua.lib"
  local ffi, C = lib.ffi, lib.C
  local sa, sb = table.concat(a:size(), ","), table.concat(b:size(), ",")
  if sa ~= sb then error(("count_bit_differences: shape (%s) ~= (%s)"):format(sa, sb), 2) end
  a, b = a:contiguous(), b:contiguous()
  local pa = ffi.cast("const uint32_t *", C.ddp_tensor_data(a))
  local pb = ffi.cast("const uint32_t *", C.ddp_tensor_data(b))
  local n = 0
  for i = 0, a:numel() - 1 do
    if pa[i] ~= pb[i] then n = n + 1 end
  end
  return n
end

--- assert_close(actual, expected, opts): actual a tensor; expected a tensor, nested tables or
-- a number. opts.atol (1e-6), opts.rtol (1e-5). Shapes must agree when expected is a tensor.
function M.assert_close(actual, expected, opts)
  opts = opts or {}
  local atol, rtol = opts.atol or 1e-6, opts.rtol or 1e-5
  if dl.is_tensor(expected) then
    local sa, se = table.concat(actual:size(), ","), table.concat(expected:size(), ",")
    if sa ~= se then error(("assert_close: shape (%s) ~= expected (%s)"):format(sa, se), 2) end
    expected = expected:tolist()
  end
  local a = flatten(actual:tolist(), {})
  local e = flatten(expected, {})
  if #a ~= #e then error(("assert_close: %d elements, expected %d"):format(#a, #e), 2) end
  for i = 1, #a do
    local x, y = a[i], e[i]
    local ok = (x ~= x and y ~= y) or x == y or math.abs(x - y) <= atol + rtol * math.abs(y)
    if not ok then
      error(("assert_close: element %d is %.10g, expected %.10g"):format(i, x, y), 2)
    end
  end
  return true
end

--- assert_same_bits(what, a, b): raise (naming `what` and the first differing element) unless
-- tensors a and b have the same dtype, size and values bit for bit: the sign of zero
-- included, NaN where the other has NaN. Compares through f64, which holds every f32, f16
-- and bf16 value exactly.
function M.assert_same_bits(what, a, b)
  assert(a.dtype == b.dtype, ("%s: dtype %s, want %s"):format(what, tostring(a.dtype), tostring(b.dtype)))
  local fa = flatten(a:to("f64"):contiguous():reshape({ -1 }):tolist())
  local fb = flatten(b:to("f64"):contiguous():reshape({ -1 }):tolist())
  assert(#fa == #fb, ("%s: %d elements, want %d"):format(what, #fa, #fb))
  for i = 1, #fa do
    local x, y = fa[i], fb[i]
    local same = (x ~= x and y ~= y) or (x == y and (x ~= 0 or 1 / x == 1 / y))
    if not same then error(("%s: element %d is %s, want %s"):format(what, i, tostring(x), tostring(y)), 2) end
  end
end

return M
