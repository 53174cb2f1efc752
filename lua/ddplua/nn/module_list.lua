--- ddplua.nn.module_list: nn.ModuleList([list]), PyTorch's: holds modules in a list, named
-- "0", "1", ... (state_dict keys "layers.0.weight" as PyTorch). ml[i] is the i-th (1-based,
-- negative from the end), ml[i] = m replaces it, ml:len(), ml:append(m), ml:extend(list),
-- ml:insert(i, m) (1-based; renames the ones after, as PyTorch). Iterate with
-- `for i = 1, ml:len() do local m = ml[i] ... end` or ipairs(ml:list()). No forward.
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local ModuleList = module.Module:extend("ModuleList")

function ModuleList:init(list)
  if list ~= nil then self:extend(list) end
end

local function index_of(self, i)
  local n = self:len()
  if type(i) ~= "number" or i % 1 ~= 0 then lib.raise("ModuleList: index must be an integer, got " .. tostring(i)) end
  if i < 0 then i = n + i + 1 end
  return i, n
end

function ModuleList:__getitem(i)
  local k, n = index_of(self, i)
  if k < 1 or k > n then return nil end
  return rawget(self, "_modules").values[tostring(k - 1)]
end

function ModuleList:__setitem(i, m)
  local k, n = index_of(self, i)
  if k < 1 or k > n then lib.raise(("ModuleList: index %d is out of range for %d modules"):format(i, n)) end
  self:add_module(tostring(k - 1), m)
end

--- ml:len() -> the number of modules.
function ModuleList:len() return #rawget(self, "_modules").names end

--- ml:list() -> a Lua list of the modules, in order.
function ModuleList:list()
  local out, mods = {}, rawget(self, "_modules")
  for i, name in ipairs(mods.names) do out[i] = mods.values[name] end
  return out
end

--- ml:append(m) -> ml.
function ModuleList:append(m)
  if not module.is_module(m) then lib.raise("ModuleList: append expects a Module, got " .. type(m)) end
  self:add_module(tostring(self:len()), m)
  return self
end

--- ml:extend(list) -> ml.
function ModuleList:extend(list)
  if module.is_module(list) and list.list then list = list:list() end
  if type(list) ~= "table" or module.is_module(list) then
    lib.raise("ModuleList: extend expects a list of modules, got " .. type(list))
  end
  for _, m in ipairs(list) do self:append(m) end
  return self
end

--- ml:insert(i, m) -> ml: insert m before position i (1-based; len + 1 appends).
function ModuleList:insert(i, m)
  local items = self:list()
  local k = index_of(self, i)
  if k < 1 or k > #items + 1 then lib.raise(("ModuleList: insert position %d is out of range"):format(i)) end
  table.insert(items, k, m)
  for j = 1, #items do self:add_module(tostring(j - 1), items[j]) end
  return self
end

function ModuleList:forward()
  lib.raise("ModuleList: it has no forward; call its modules")
end

return ModuleList
