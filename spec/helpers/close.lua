-- spec/helpers/close.lua: compare a tensor with nested Lua tables (or another tensor)
-- element by element within atol + rtol * |expected|; raise naming the first mismatch.
local dl = require "ddplua"

local M = {}

local function flatten(v, out)
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  elseif type(v) == "boolean" then
    out[#out + 1] = v and 1 or 0
  else
    out[#out + 1] = v
  end
  return out
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

return M
