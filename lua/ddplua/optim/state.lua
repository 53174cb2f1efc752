--- ddplua.optim.state: opt.state, the Lua view over the C optimizer-state store (Note
-- [optimizer state store] in runtime/include/ddplua/optim_state.h). The store is what the C
-- step (ddp_optim_step_params) reads and writes, and the optimizer in backward of
-- DistributedDataParallel keeps its state in one too, so every optimizer's state lives in
-- one place and goes through one state_dict code.
--
-- As PyTorch's opt.state:
--   opt.state[p]                    -- p's entry, nil before p's first step
--   opt.state[p].momentum_buffer    -- the state tensor itself (the storage the step
--                                   -- updates: an in-place change is seen by the next step)
--   opt.state[p].step               -- a number
--   opt.state[p].exp_avg = t        -- assignment keeps t (shared, not copied); nil removes
--   opt.state[p] = {step = 0, ...}  -- replaces p's entry; nil removes it
-- Values are tensors, numbers or booleans; names are strings of 1 to 63 bytes.
--
-- The departure: LuaJIT has no __pairs, so `pairs(opt.state)` and `pairs(opt.state[p])` see
-- nothing of the state. Iterate with
--   for p, entry in opt.state:items() do ... end   -- entries in creation order
--   for name, value in entry:items() do ... end    -- an entry's names in the order set
-- and use opt.state:count(), entry:table() (a plain table of the entry's values: tensors
-- shared), opt.state:clear() and opt.state:replace(t) (t: {[p] = {name = value}}).
-- Assigning a plain table to opt.state is not supported (use replace).
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"
local ffi, C = lib.ffi, lib.C

local M = {}

local is_tensor = tensor.is_tensor
local raise = lib.raise

local View = {}  -- the methods of a view (opt.state)
local Entry = {} -- the methods of an entry (opt.state[p])

local tbox = ffi.new("ddp_tensor*[1]")
local nbox = ffi.new("double[1]")
local ibox = ffi.new("int[2]")
local sbox = ffi.new("const char*[1]")
local store_box = ffi.new("ddp_optim_state*[1]")

local function address(p) return tonumber(ffi.cast("intptr_t", p)) end

-- ---- entries ------------------------------------------------------------------------------

local EntryMT = {}

local function entry_of(view, p) return setmetatable({ _view = view, _p = p }, EntryMT) end

-- The value `name` of p's entry in store s (nil when absent).
local function get_value(s, p, name)
  local kind = C.ddp_optim_state_kind(s, p, name)
  if kind == C.DDP_OPTIM_STATE_TENSOR then
    lib.check(C.ddp_optim_state_get_tensor(s, p, name, tbox))
    return lib.wrap(tbox[0])
  elseif kind == C.DDP_OPTIM_STATE_NUMBER or kind == C.DDP_OPTIM_STATE_BOOLEAN then
    lib.check(C.ddp_optim_state_get_number(s, p, name, nbox))
    if kind == C.DDP_OPTIM_STATE_BOOLEAN then return nbox[0] ~= 0 end
    return nbox[0]
  end
  return nil
end

-- Raise unless v may be stored under name (a string; a tensor, number, boolean or nil).
local function check_value(name, v)
  if type(name) ~= "string" then
    raise(("optimizer state: names are strings, got a %s"):format(type(name)))
  end
  local tv = type(v)
  if not (v == nil or tv == "number" or tv == "boolean" or is_tensor(v)) then
    raise(("optimizer state: %s must be a tensor, a number or a boolean, got a %s"):format(name, tv))
  end
end

-- Store v (checked) under name in p's entry of store s (nil removes the name).
local function set_value(s, p, name, v)
  if v == nil then
    lib.check(C.ddp_optim_state_remove(s, p, name))
  elseif type(v) == "number" then
    lib.check(C.ddp_optim_state_set_number(s, p, name, v))
  elseif type(v) == "boolean" then
    lib.check(C.ddp_optim_state_set_boolean(s, p, name, v and 1 or 0))
  else
    lib.check(C.ddp_optim_state_set_tensor(s, p, name, v))
  end
end

-- The names and values of p's entry in store s, as two lists (in the order set).
local function entry_lists(s, p)
  lib.check(C.ddp_optim_state_name_count(s, p, ibox))
  local names, values = {}, {}
  for j = 0, ibox[0] - 1 do
    lib.check(C.ddp_optim_state_name_at(s, p, j, sbox, ibox + 1))
    local name = ffi.string(sbox[0])
    names[j + 1] = name
    values[j + 1] = get_value(s, p, name)
  end
  return names, values
end

EntryMT.__index = function(e, name)
  if type(name) == "string" then
    local v = get_value(rawget(e, "_view")._s, rawget(e, "_p"), name)
    if v ~= nil then return v end
  end
  return Entry[name]
end

EntryMT.__newindex = function(e, name, v)
  check_value(name, v)
  set_value(rawget(e, "_view")._s, rawget(e, "_p"), name, v)
end

EntryMT.__tostring = function(e)
  local parts = {}
  for name, v in e:items() do parts[#parts + 1] = name .. " = " .. tostring(v) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

--- entry:items() -> an iterator of name, value over the entry's values, in the order they
-- were first set (tensors are the state's own, not copies).
function Entry:items()
  return lib.list_iterator(entry_lists(self._view._s, self._p))
end

--- entry:table() -> a plain table {name = value} of the entry's values (tensors shared with
-- the state, not copied).
function Entry:table()
  local out = {}
  for name, v in self:items() do out[name] = v end
  return out
end

-- ---- the view ---------------------------------------------------------------------------------

local ViewMT = {}

ViewMT.__index = function(view, p)
  if is_tensor(p) then
    if C.ddp_optim_state_has(rawget(view, "_s"), p) ~= 0 then return entry_of(view, p) end
    return nil
  end
  return View[p]
end

-- The (name, value) lists of v, an entry's new contents (a plain table or an entry of
-- any view), checked.
local function contents(v)
  local names, values = {}, {}
  if getmetatable(v) == EntryMT then
    names, values = entry_lists(v._view._s, v._p)
  elseif type(v) == "table" and not is_tensor(v) then
    for k, x in pairs(v) do
      check_value(k, x)
      names[#names + 1], values[#values + 1] = k, x
    end
  else
    raise(("optimizer state: an entry must be a table of name = value, got a %s"):format(
      is_tensor(v) and "tensor" or type(v)))
  end
  return names, values
end

-- Replace p's entry in view's store by the (name, value) lists (nil names: remove it).
local function put(view, p, names, values)
  local s = view._s
  lib.check(C.ddp_optim_state_clear_entry(s, p))
  if names == nil then return end
  lib.check(C.ddp_optim_state_add(s, p))
  for j, name in ipairs(names) do set_value(s, p, name, values[j]) end
end

ViewMT.__newindex = function(view, p, v)
  if not is_tensor(p) then
    raise(("optimizer state: keys are parameters (tensors), got a %s"):format(type(p)))
  end
  if v == nil then return put(view, p, nil) end
  local names, values = contents(v)
  put(view, p, names, values)
end

ViewMT.__tostring = function(view)
  return ("OptimizerState(%d entries)"):format(view:count())
end

--- opt.state:count() -> the number of parameters with state.
function View:count() return tonumber(C.ddp_optim_state_count(self._s)) end

--- opt.state:items() -> an iterator of p, entry over the parameters with state, in the
-- order their entries were created. p is the optimizer's own handle of the parameter (the
-- one in param_groups) when it knows it.
function View:items()
  local s, handles = self._s, self._handles
  local n = tonumber(C.ddp_optim_state_count(s))
  local ps, entries = {}, {}
  for i = 0, n - 1 do
    lib.check(C.ddp_optim_state_param_at(s, i, tbox))
    local p = lib.wrap(tbox[0])
    ps[i + 1] = handles[address(p)] or p
    entries[i + 1] = entry_of(self, ps[i + 1])
  end
  return lib.list_iterator(ps, entries)
end

--- opt.state:clear(): remove every entry.
function View:clear() C.ddp_optim_state_clear(self._s) end

--- opt.state:replace(t): the state becomes t, a table {[p] = {name = value, ...}} (values:
-- tensors, kept shared; numbers; booleans). Everything is checked before anything
-- changes; raises naming the bad key or value.
function View:replace(t)
  if type(t) ~= "table" or is_tensor(t) then
    raise("optimizer state: replace expects a table {[param] = {name = value}}")
  end
  local todo = {}
  for p, v in pairs(t) do
    if not is_tensor(p) then
      raise(("optimizer state: keys are parameters (tensors), got a %s"):format(type(p)))
    end
    local names, values = contents(v)
    todo[#todo + 1] = { p, names, values }
  end
  self:clear()
  for _, x in ipairs(todo) do put(self, x[1], x[2], x[3]) end
end

--- State.new(handles) -> a view over a new store of its own (freed with the view).
-- handles: a table address -> parameter handle (the optimizer's), used by items().
function M.new(handles)
  lib.check(C.ddp_optim_state_new(store_box))
  local s = ffi.gc(store_box[0], C.ddp_optim_state_free)
  store_box[0] = nil
  return setmetatable({ _s = s, _handles = handles or {} }, ViewMT)
end

--- State.borrow(s, owner, handles) -> a view over store s owned by someone else (the
-- reducer of an optimizer in backward: ddp_reducer_fused_optim_state); owner is kept
-- alive with the view. Raises when s is NULL.
function M.borrow(s, owner, handles)
  if s == nil then raise("optimizer state: no store to view (NULL)") end
  return setmetatable({ _s = s, _owner = owner, _handles = handles or {} }, ViewMT)
end

--- State.is_view(x) -> true when x is an optimizer-state view.
function M.is_view(x) return getmetatable(x) == ViewMT end

--- State.store(view) -> the ddp_optim_state* of a view (for the C step calls).
function M.store(view) return view._s end

return M
