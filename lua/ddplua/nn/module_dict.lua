--- ddplua.nn.module_dict: nn.ModuleDict([modules]), PyTorch's: holds modules by name, in
-- insertion order. modules: a list of {name, module} pairs (ordered) or a table
-- name -> module (inserted in sorted name order: Lua tables have no order).
-- md:get(name) / md[name] (md[name] also finds methods: prefer get for names such as
-- "keys"), md:set(name, m) / md[name] = m, md:keys(), md:values(), md:items() (iterator),
-- md:len(), md:pop(name), md:update(modules), md:contains(name). No forward.
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local ModuleDict = module.Module:extend("ModuleDict")

function ModuleDict:init(modules)
  if modules ~= nil then self:update(modules) end
end

--- md:update(modules): add or replace each entry (list of pairs or a name -> module table).
function ModuleDict:update(modules)
  if type(modules) ~= "table" then lib.raise("ModuleDict: update expects a table, got " .. type(modules)) end
  if #modules > 0 then
    for _, pair in ipairs(modules) do self:set(pair[1], pair[2]) end
  else
    local names = {}
    for k in pairs(modules) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do self:set(k, modules[k]) end
  end
  return self
end

--- d:set(name, m) -> d: add or replace the child `name` (m must be a Module).
function ModuleDict:set(name, m)
  if not module.is_module(m) then
    lib.raise(("ModuleDict: entry '%s' must be a Module, got %s"):format(tostring(name), type(m)))
  end
  self:add_module(name, m)
  return self
end

--- d:get(name) -> the child or nil; d:contains(name) -> boolean; d:len() -> count.
function ModuleDict:get(name) return rawget(self, "_modules").values[name] end
function ModuleDict:contains(name) return rawget(self, "_modules").values[name] ~= nil end
function ModuleDict:len() return #rawget(self, "_modules").names end

--- d:keys() -> the names in insertion order.
function ModuleDict:keys()
  local out = {}
  for i, n in ipairs(rawget(self, "_modules").names) do out[i] = n end
  return out
end

--- d:values() -> the children in insertion order.
function ModuleDict:values()
  local out, mods = {}, rawget(self, "_modules")
  for i, n in ipairs(mods.names) do out[i] = mods.values[n] end
  return out
end

--- md:items() -> iterator of (name, module) in insertion order.
function ModuleDict:items()
  return lib.list_iterator(self:keys(), self:values())
end

--- md:pop(name) -> the module removed (nil when absent).
function ModuleDict:pop(name)
  local mods = rawget(self, "_modules")
  local m = mods.values[name]
  if mods.has[name] then
    mods.has[name], mods.values[name] = nil, nil
    for i, n in ipairs(mods.names) do
      if n == name then table.remove(mods.names, i); break end
    end
  end
  return m
end

function ModuleDict:forward()
  lib.raise("ModuleDict: it has no forward; call its modules")
end

return ModuleDict
