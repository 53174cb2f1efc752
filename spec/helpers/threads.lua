-- spec/helpers/threads.lua: run spec code at a given thread-pool size.
local dl = require "ddplua"

local M = {}

--- with_threads(n, fn): fn() with dl.set_num_threads(n), the previous count restored
-- afterwards even when fn raises (the error is re-raised as it was); returns fn's first
-- four results.
function M.with_threads(n, fn)
  local before = dl.get_num_threads()
  dl.set_num_threads(n)
  local ok, a, b, c, d = pcall(fn)
  dl.set_num_threads(before)
  if not ok then error(a, 0) end
  return a, b, c, d
end

return M
