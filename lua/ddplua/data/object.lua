--- ddplua.data.object: objects that answer `#obj` under LuaJIT.
--
-- LuaJIT (Lua 5.1 semantics) ignores __len on tables, so `#ds` on a plain table is its
-- array length. Datasets and loaders are therefore userdata proxies (newproxy) whose
-- metatable has __len and forwards field reads and writes to a state table whose own
-- metatable falls back to the class. Methods receive the proxy as self.
local M = {}

--- object(class, state): a proxy object over `state` with methods from `class`.
-- class.len(self) answers #obj; class.__tostring(self) answers tostring(obj).
function M.new(class, state)
  local p = newproxy(true)
  local mt = getmetatable(p)
  setmetatable(state, { __index = class })
  mt.__index = state
  mt.__newindex = state
  mt.__len = function(self) return class.len(self) end
  mt.__tostring = function(self)
    if class.__tostring then return class.__tostring(self) end
    return (class.name or "object")
  end
  mt.__class = class
  return p
end

--- Length of a dataset or sampler following the protocol: obj:len() when it has a `len`
-- method, else #obj (a proxy, or a userdata/cdata with __len).
function M.len(obj)
  local ok, f = pcall(function() return obj.len end)
  if ok and type(f) == "function" then return f(obj) end
  return #obj
end

return M
