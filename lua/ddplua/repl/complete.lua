--- ddplua.repl.complete: what Tab offers at the prompt.
--
-- The word under the cursor (libedit cuts it at spaces, operators and brackets, never at
-- '.' or ':') is one of:
--   name             globals, the prompt's locals and Lua's keywords starting with it
--   a.b.par          fields of a.b (a table, a module, a class): its own keys, then those
--                    its metatable's __index chain provides
--   obj:me           methods of obj: tensors (the Tensor metatype), nn modules, optimizers,
--                    process groups and any object whose class is reached through its
--                    metatable
--   require "dd      inside the string of a require: module names (those loaded, those in
--                    package.preload and every module of lua/ listed in the doc index)
-- The names on the left are looked up without calling anything but __index, so completion
-- runs no user code besides property getters. Keys starting with '_' are offered only when
-- the typed part starts with '_'.
local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function",
  "goto", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until",
  "while" }

-- Add the string keys of table t to `keys`.
local function add_keys(keys, t)
  if type(t) ~= "table" then return end
  for k in pairs(t) do
    if type(k) == "string" then keys[k] = true end
  end
end

-- Keys an object offers through its metatable: the __index table chain; for classes whose
-- __index is a function (nn modules), the metatable itself and its own chain.
local function add_class_keys(keys, mt, depth)
  if type(mt) ~= "table" or depth > 10 then return end
  local index = rawget(mt, "__index")
  if type(index) == "table" then
    add_keys(keys, index)
    add_class_keys(keys, getmetatable(index), depth + 1)
  elseif type(index) == "function" then
    add_keys(keys, mt)
    add_class_keys(keys, getmetatable(mt), depth + 1)
  end
end

-- The submodules of a loaded module that its table hands out on first use (dl.nn, dl.optim:
-- loaded lazily through __index), from the doc index's module list.
local function add_submodules(keys, value)
  local name
  for n, mod in pairs(package.loaded) do
    if mod == value and type(n) == "string" then name = n end
  end
  local index = name and require("ddplua.repl.help").index()
  if not index then return end
  for _, m in ipairs(index.modules) do
    local sub = m:sub(#name + 2)
    if m:sub(1, #name + 1) == name .. "." and sub:match("^[%w_]+$") and rawget(value, sub) == nil then
      local ok, v = pcall(function() return value[sub] end)
      if ok and v ~= nil then keys[sub] = true end
    end
  end
end

-- Every key that `value.key` may find.
local function keys_of(value)
  local keys = {}
  local tensor = package.loaded["ddplua.tensor"]
  if type(value) == "cdata" and tensor and tensor.is_tensor(value) then
    add_keys(keys, tensor.methods)
    add_keys(keys, tensor.properties)
    return keys
  end
  if type(value) == "table" then
    add_keys(keys, value)
    -- nn modules keep parameters, buffers, children and attributes in side tables
    for _, side in ipairs { "_parameters", "_buffers", "_modules" } do
      local s = rawget(value, side)
      if type(s) == "table" then add_keys(keys, s.values) end
    end
    add_keys(keys, rawget(value, "_attrs"))
    add_submodules(keys, value)
  end
  if type(value) == "table" or type(value) == "userdata" then
    add_class_keys(keys, getmetatable(value), 0)
  elseif type(value) == "string" then
    add_keys(keys, string)
  end
  return keys
end

-- Sorted words `prefix .. key` for keys starting with `part` (only functions when
-- `methods`; keys must be names unless `dotted`).
local function matching(keys, part, prefix, value, methods, dotted)
  local words = {}
  local hidden = part:sub(1, 1) ~= "_"
  for k in pairs(keys) do
    if k:sub(1, #part) == part and not (hidden and k:sub(1, 1) == "_")
       and k:match(dotted and "^[%a_][%w_.]*$" or "^[%a_][%w_]*$") then
      local ok, v = true, nil
      if methods then ok, v = pcall(function() return value[k] end) end
      if not methods or (ok and (type(v) == "function" or type(v) == "table")) then
        words[#words + 1] = prefix .. k
      end
    end
  end
  table.sort(words)
  return words
end

-- Module names for a require string.
local function module_names(part)
  local names = {}
  for name in pairs(package.loaded) do
    if type(name) == "string" then names[name] = true end
  end
  add_keys(names, package.preload)
  local index = require("ddplua.repl.help").index()
  if index then
    for _, name in ipairs(index.modules or {}) do names[name] = true end
  end
  return matching(names, part, "", nil, false, true)
end

--- complete.candidates(line, start, stop, lookup, locals) -> sorted list of words that may
-- replace line:sub(start, stop). lookup(name) gives the value of a prompt-level name (a saved
-- local, else the global); `locals` lists the saved locals' names.
function M.candidates(line, start, stop, lookup, locals)
  local word = line:sub(start, stop)
  local before = line:sub(1, start - 1)
  if before:match("require%s*%(?%s*[\"']$") or before:match("require%s*%(?%s*%[%[$") then
    return module_names(word)
  end
  local base, sep, part = word:match("^(.-)([.:])([%w_]*)$")
  if not base then
    if not word:match("^[%a_][%w_]*$") and word ~= "" then return {} end
    local keys = {}
    add_keys(keys, _G)
    for _, k in ipairs(locals or {}) do keys[k] = true end
    for _, k in ipairs(KEYWORDS) do keys[k] = true end
    local words = matching(keys, word, "", nil, false)
    return words
  end
  if not base:match("^[%a_][%w_]*$") and not base:match("^[%a_][%w_.]*[%w_]$") then return {} end
  local ok, value = pcall(function()
    local v
    for piece in base:gmatch("[^.]+") do
      if v == nil then v = lookup(piece) else v = v[piece] end
      if v == nil then return nil end
    end
    return v
  end)
  if not ok or value == nil then return {} end
  return matching(keys_of(value), part, base .. sep, value, sep == ":")
end

return M
