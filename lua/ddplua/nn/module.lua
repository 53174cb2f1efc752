--- ddplua.nn.module: nn.Module, the base class of every layer and model, and
-- nn.Parameter, as PyTorch's torch.nn.Module and torch.nn.Parameter.
--
-- Defining a model (the one idiom: `Base:extend(name)` makes a subclass):
--
--   local Net = nn.Module:extend("Net")
--   function Net:init(n) self.fc = nn.Linear(n, 10) end   -- the constructor's body
--   function Net:forward(x) return self.fc(x) end
--   local net = Net(784)        -- calling a class constructs an instance
--   local y = net(x)            -- calling an instance runs forward
--
-- A subclass of a subclass calls its parent's init explicitly when it wants it:
-- `function MyLinear:init(i, o) nn.Linear.init(self, i, o); ... end`.
--
-- Registration (Note [registration order]): assigning a Module to a field registers a
-- child, assigning an nn.Parameter registers a parameter, self:register_buffer(name, t)
-- registers a buffer; each kind keeps its names in assignment order. Iteration follows
-- PyTorch exactly: named_modules is a pre-order walk (a module, then its children in
-- order); named_parameters / named_buffers list each module's own entries in that walk;
-- state_dict lists, for each module in the walk, its parameters and then its persistent
-- buffers. The DDP reducer buckets parameters in this order, so it must never depend on
-- `pairs`. Every other field is a plain attribute (plain tensors too, as in PyTorch).
--
-- Every field assignment passes through the class's __newindex (attributes live in a side
-- table, never in the instance itself), so re-assigning a name of another kind moves it
-- (a Module over a number, nil over a child) exactly as PyTorch's __setattr__ does.
--
-- Lookup order for `m.name` (as Python's): class members (methods) first, then plain
-- attributes, parameters, buffers, children.
--
-- Iteration: parameters(), buffers(), children(), modules() return Lua lists;
-- named_parameters(), named_buffers(), named_children(), named_modules() return iterators:
--   for name, p in net:named_parameters() do ... end
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local ffi = lib.ffi

local M = {}

-- ---- parameters ----------------------------------------------------------------------

-- Tensors marked as parameters (weak keys: a mark never keeps a tensor alive).
local parameter_marks = setmetatable({}, { __mode = "k" })

--- nn.Parameter(t[, requires_grad]) -> a leaf tensor sharing t's data, marked as a
-- parameter, with requires_grad (default true; floating tensors only, as PyTorch).
-- A tensor already marked is returned as is. Raises when t is not a tensor.
function M.Parameter(t, requires_grad)
  if not dl.is_tensor(t) then
    lib.raise("nn.Parameter: expected a tensor, got " .. type(t))
  end
  if parameter_marks[t] then return t end
  local p = t:detach()
  if requires_grad ~= false then p:requires_grad_(true) end
  parameter_marks[p] = true
  return p
end

--- nn.is_parameter(v): true when v is a tensor made by nn.Parameter.
function M.is_parameter(v)
  return dl.is_tensor(v) and parameter_marks[v] == true
end
local is_parameter = M.is_parameter

-- The address of the C tensor: the identity used to deduplicate shared parameters.
local function tensor_key(t)
  return tonumber(ffi.cast("intptr_t", t))
end

-- ---- ordered dictionaries (names in registration order) ------------------------------

-- An entry whose value is nil stays registered (PyTorch's `register_parameter("bias",
-- None)`): it is skipped by iteration and by state_dict.
local function odict() return { names = {}, values = {}, has = {} } end

local function odict_set(d, name, v)
  if not d.has[name] then
    d.has[name] = true
    d.names[#d.names + 1] = name
  end
  d.values[name] = v
end

local function odict_remove(d, name)
  if not d.has[name] then return end
  d.has[name], d.values[name] = nil, nil
  for i, n in ipairs(d.names) do
    if n == name then table.remove(d.names, i); break end
  end
end

-- ---- the class system ----------------------------------------------------------------

local Module = {}
M.Module = Module

local METAMETHODS = { "__index", "__newindex", "__call", "__tostring", "__eq", "__len", "__concat" }

local function is_module(v)
  return type(v) == "table" and rawget(v, "_modules") ~= nil
end
M.is_module = is_module

-- Instance lookup for class `cls`: class members first (methods), then attributes,
-- parameters, buffers, children; numbers go to the class's __getitem (containers).
local function make_index(cls)
  return function(self, k)
    local v = cls[k]
    if v ~= nil then return v end
    v = rawget(self, "_attrs")[k]
    if v ~= nil then return v end
    if type(k) == "number" then
      local getitem = cls.__getitem
      if getitem then return getitem(self, k) end
      return nil
    end
    v = rawget(self, "_parameters").values[k]
    if v ~= nil then return v end
    v = rawget(self, "_buffers").values[k]
    if v ~= nil then return v end
    return rawget(self, "_modules").values[k]
  end
end

local function type_name(v)
  if dl.is_tensor(v) then return "a tensor" end
  if is_module(v) then return "a Module" end
  return "a " .. type(v)
end

local function newindex(self, k, v)
  if type(k) == "number" then
    local setitem = getmetatable(self).__setitem
    if setitem then return setitem(self, k, v) end
  end
  local params, buffers, mods = rawget(self, "_parameters"), rawget(self, "_buffers"), rawget(self, "_modules")
  local attrs = rawget(self, "_attrs")
  if is_module(v) then
    odict_remove(params, k); odict_remove(buffers, k); attrs[k] = nil
    rawget(self, "_non_persistent")[k] = nil
    odict_set(mods, k, v)
  elseif is_parameter(v) then
    odict_remove(mods, k); odict_remove(buffers, k); attrs[k] = nil
    rawget(self, "_non_persistent")[k] = nil
    odict_set(params, k, v)
  elseif params.has[k] then
    if v ~= nil then
      lib.raise(("%s: cannot assign %s as parameter '%s' (nn.Parameter or nil expected)"):format(
        self:_get_name(), type_name(v), tostring(k)))
    end
    params.values[k] = nil
  elseif buffers.has[k] then
    if v ~= nil and not dl.is_tensor(v) then
      lib.raise(("%s: cannot assign %s as buffer '%s' (a tensor or nil expected)"):format(
        self:_get_name(), type_name(v), tostring(k)))
    end
    buffers.values[k] = v
  elseif mods.has[k] then
    if v ~= nil then
      lib.raise(("%s: cannot assign %s as child module '%s' (a Module or nil expected)"):format(
        self:_get_name(), type_name(v), tostring(k)))
    end
    mods.values[k] = nil
  else
    attrs[k] = v
  end
end

-- Construct an instance of `cls`: the registries, training mode, then cls.init(self, ...).
local function construct(cls, ...)
  local self = setmetatable({
    _parameters = odict(), _buffers = odict(), _modules = odict(),
    _non_persistent = {}, _attrs = { training = true },
  }, cls)
  self:init(...)
  return self
end

--- Class:extend(name) -> a subclass named `name` (the name printed by tostring). Define
-- `init` (the constructor's body; receives the constructor's arguments) and `forward`.
-- The subclass's parent is Class.super.
function Module.extend(parent, name)
  if type(name) ~= "string" then
    lib.raise("Module:extend(name): name must be a string, got " .. type(name))
  end
  local cls = {}
  for _, mm in ipairs(METAMETHODS) do cls[mm] = rawget(parent, mm) end
  cls.__name = name
  cls.super = parent
  cls.__index = make_index(cls)
  return setmetatable(cls, {
    __index = parent,
    __call = construct,
    __tostring = function() return "class " .. name end,
  })
end

Module.__name = "Module"
Module.__index = make_index(Module)
Module.__newindex = newindex
setmetatable(Module, { __call = construct, __tostring = function() return "class Module" end })

--- Module:init(...): the constructor's body; the base does nothing (nn.Module() is an
-- empty module to which children can be assigned).
function Module:init() end

--- Module:forward(...): the computation; subclasses define it.
function Module:forward()
  lib.raise(self:_get_name() .. ": forward is not defined (define " .. self:_get_name() .. ":forward)")
end

--- m(...) runs m:forward(...).
Module.__call = function(self, ...) return self:forward(...) end

--- The class name ("Linear", "Net").
function Module:_get_name() return getmetatable(self).__name end

-- ---- registration --------------------------------------------------------------------

local function check_name(self, what, name)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    lib.raise(("%s: %s name must be a non-empty string without '.', got %s"):format(
      self:_get_name(), what, tostring(name)))
  end
  if rawget(self, "_attrs")[name] ~= nil or getmetatable(self)[name] ~= nil then
    lib.raise(("%s: attribute '%s' already exists"):format(self:_get_name(), name))
  end
end

--- m:register_parameter(name, p): register p (an nn.Parameter, or nil to reserve the name
-- as PyTorch's None) as parameter `name`. Raises for another kind of value.
function Module:register_parameter(name, p)
  check_name(self, "parameter", name)
  if p ~= nil and not is_parameter(p) then
    lib.raise(("%s: cannot assign %s as parameter '%s' (nn.Parameter or nil expected)"):format(
      self:_get_name(), type_name(p), name))
  end
  odict_remove(rawget(self, "_modules"), name); odict_remove(rawget(self, "_buffers"), name)
  odict_set(rawget(self, "_parameters"), name, p)
end

--- m:register_buffer(name, t[, opts]): register tensor t (or nil) as buffer `name`: state
-- saved with the module that is not a parameter (BatchNorm's running_mean). opts.persistent
-- (default true): false keeps it out of state_dict.
function Module:register_buffer(name, t, opts)
  check_name(self, "buffer", name)
  if t ~= nil and not dl.is_tensor(t) then
    lib.raise(("%s: cannot assign %s as buffer '%s' (a tensor or nil expected)"):format(
      self:_get_name(), type_name(t), name))
  end
  odict_remove(rawget(self, "_modules"), name); odict_remove(rawget(self, "_parameters"), name)
  odict_set(rawget(self, "_buffers"), name, t)
  rawget(self, "_non_persistent")[name] = (opts and opts.persistent == false) or nil
end

--- m:add_module(name, child) (alias register_module): register child (a Module or nil)
-- under `name`; the way to use names that are not identifiers ("0", "conv.1" is refused).
function Module:add_module(name, child)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    lib.raise(("%s: module name must be a non-empty string without '.', got %s"):format(
      self:_get_name(), tostring(name)))
  end
  if child ~= nil and not is_module(child) then
    lib.raise(("%s: %s is not a Module (child '%s')"):format(self:_get_name(), type_name(child), name))
  end
  odict_remove(rawget(self, "_parameters"), name); odict_remove(rawget(self, "_buffers"), name)
  rawget(self, "_attrs")[name] = nil
  odict_set(rawget(self, "_modules"), name, child)
end
Module.register_module = Module.add_module

-- ---- iteration -----------------------------------------------------------------------

-- Pre-order list of {prefix, module}, each module once (PyTorch's named_modules with memo).
local function walk(self, prefix, out, memo)
  if memo[self] then return out end
  memo[self] = true
  out[#out + 1] = { prefix, self }
  local mods = rawget(self, "_modules")
  for _, name in ipairs(mods.names) do
    local child = mods.values[name]
    if child then walk(child, prefix == "" and name or (prefix .. "." .. name), out, memo) end
  end
  return out
end

-- List of {name, tensor} of one registry kind over the module tree, each tensor once.
local function named_members(self, registry, recurse, prefix)
  local mods = recurse == false and { { prefix or "", self } } or walk(self, prefix or "", {}, {})
  local out, seen = {}, {}
  for _, entry in ipairs(mods) do
    local mprefix, m = entry[1], entry[2]
    local d = rawget(m, registry)
    for _, name in ipairs(d.names) do
      local t = d.values[name]
      if t ~= nil then
        local key = tensor_key(t)
        if not seen[key] then
          seen[key] = true
          out[#out + 1] = { mprefix == "" and name or (mprefix .. "." .. name), t }
        end
      end
    end
  end
  return out
end

-- An iterator of the {name, value} entries of list (Note [traces keep closures] in
-- ddplua/lib.lua: not a closure over the list).
local entry_pairs = lib.iterator(function(it)
  local i = it.i + 1
  local e = it.list[i]
  if e == nil then return nil end
  it.i = i
  return e[1], e[2]
end)
local function pair_iterator(list) return entry_pairs { list = list, i = 0 } end

local function values_of(list)
  local out = {}
  for i, e in ipairs(list) do out[i] = e[2] end
  return out
end

--- m:parameters([recurse]) -> list of the parameters (each once), in registration order
-- (Note [registration order]). recurse (default true): false lists m's own only.
function Module:parameters(recurse) return values_of(named_members(self, "_parameters", recurse)) end

--- m:named_parameters([prefix[, recurse]]) -> iterator of (dotted name, parameter):
-- `for name, p in m:named_parameters() do`; names as PyTorch's ("features.0.weight").
function Module:named_parameters(prefix, recurse)
  return pair_iterator(named_members(self, "_parameters", recurse, prefix))
end

--- m:buffers([recurse]) -> list of the buffers (each once), in registration order.
function Module:buffers(recurse) return values_of(named_members(self, "_buffers", recurse)) end

--- m:named_buffers([prefix[, recurse]]) -> iterator of (dotted name, buffer).
function Module:named_buffers(prefix, recurse)
  return pair_iterator(named_members(self, "_buffers", recurse, prefix))
end

local function named_children_list(self)
  local mods, out, seen = rawget(self, "_modules"), {}, {}
  for _, name in ipairs(mods.names) do
    local child = mods.values[name]
    if child and not seen[child] then
      seen[child] = true
      out[#out + 1] = { name, child }
    end
  end
  return out
end

--- m:children() -> list of the direct children, in registration order.
function Module:children() return values_of(named_children_list(self)) end

--- m:named_children() -> iterator of (name, child).
function Module:named_children() return pair_iterator(named_children_list(self)) end

--- m:modules() -> list of every module of the tree, m first (pre-order, each once).
function Module:modules() return values_of(walk(self, "", {}, {})) end

--- m:named_modules([prefix]) -> iterator of (dotted name, module), m first with name "".
function Module:named_modules(prefix) return pair_iterator(walk(self, prefix or "", {}, {})) end

--- m:get_submodule(target) -> the module at dotted path target ("features.0"; "" is m).
-- Raises naming the first missing part.
function Module:get_submodule(target)
  local m = self
  if target == "" then return m end
  for part in (target .. "."):gmatch("([^.]*)%.") do
    local child = rawget(m, "_modules").values[part]
    if not child then
      lib.raise(("%s has no attribute `%s` (looking up '%s')"):format(m:_get_name(), part, target))
    end
    m = child
  end
  return m
end

--- m:get_parameter(target) -> the parameter at dotted path target ("features.0.weight").
function Module:get_parameter(target)
  local path, name = target:match("^(.*)%.([^.]*)$")
  if not path then path, name = "", target end
  local m = self:get_submodule(path)
  local p = rawget(m, "_parameters").values[name]
  if p == nil then lib.raise(("%s has no parameter `%s` (looking up '%s')"):format(m:_get_name(), name, target)) end
  return p
end

-- ---- modes, gradients, apply ---------------------------------------------------------

--- m:train([mode]) -> m: set training mode (default true) on m and every descendant
-- (self.training; Dropout and BatchNorm read it).
function Module:train(mode)
  if mode == nil then mode = true end
  if type(mode) ~= "boolean" then
    lib.raise(self:_get_name() .. ":train: mode must be a boolean, got " .. type(mode))
  end
  rawget(self, "_attrs").training = mode
  for _, child in ipairs(self:children()) do child:train(mode) end
  return self
end

--- m:eval() -> m: m:train(false).
function Module:eval() return self:train(false) end

--- m:requires_grad_([flag]) -> m: set requires_grad of every parameter (default true).
function Module:requires_grad_(flag)
  for _, p in ipairs(self:parameters()) do p:requires_grad_(flag ~= false) end
  return self
end

--- m:zero_grad([set_to_none]) (or {set_to_none = b}): drop every parameter's gradient
-- (set_to_none, the default, as PyTorch 2) or fill it with zeros.
function Module:zero_grad(set_to_none)
  if type(set_to_none) == "table" then set_to_none = set_to_none.set_to_none end
  for _, p in ipairs(self:parameters()) do
    local g = p.grad
    if g ~= nil then
      if set_to_none == false then
        dl.no_grad(function() g:zero_() end)
      else
        p.grad = nil
      end
    end
  end
end

--- m:apply(fn) -> m: call fn(module) on every child tree (children first) and then on m,
-- as PyTorch's (used for custom initialisation).
function Module:apply(fn)
  for _, child in ipairs(self:children()) do child:apply(fn) end
  fn(self)
  return self
end

-- ---- state_dict ----------------------------------------------------------------------

-- The ordered key list of each state dict made here (weak: the dict owns nothing extra).
local state_order = setmetatable({}, { __mode = "k" })

--- nn.state_dict_keys(sd) -> the names of a state dict in order: the order state_dict made
-- them in (PyTorch's), then any keys added later (sorted). Any table name -> tensor works.
function M.state_dict_keys(sd)
  local order, out, seen = state_order[sd] or {}, {}, {}
  for _, k in ipairs(order) do
    if sd[k] ~= nil then out[#out + 1] = k; seen[k] = true end
  end
  local extra = {}
  for k in pairs(sd) do
    if not seen[k] then extra[#extra + 1] = k end
  end
  table.sort(extra, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(extra) do out[#out + 1] = k end
  return out
end

-- {name, tensor} for each parameter and persistent buffer, in PyTorch's state_dict order:
-- per module in pre-order, its parameters then its persistent buffers. Not deduplicated
-- (a shared parameter or module appears under each name, as PyTorch).
local function state_entries(self)
  local out = {}
  -- No memo: a module shared under two names is saved under both, as PyTorch's.
  local function visit(m, prefix)
    local function add(name, t)
      out[#out + 1] = { prefix == "" and name or (prefix .. "." .. name), t }
    end
    local params = rawget(m, "_parameters")
    for _, name in ipairs(params.names) do
      if params.values[name] ~= nil then add(name, params.values[name]) end
    end
    local buffers, np = rawget(m, "_buffers"), rawget(m, "_non_persistent")
    for _, name in ipairs(buffers.names) do
      if buffers.values[name] ~= nil and not np[name] then add(name, buffers.values[name]) end
    end
    local mods = rawget(m, "_modules")
    for _, name in ipairs(mods.names) do
      local child = mods.values[name]
      if child then visit(child, prefix == "" and name or (prefix .. "." .. name)) end
    end
  end
  visit(self, "")
  return out
end

--- m:state_dict() -> table name -> tensor of every parameter and persistent buffer, the
-- names as PyTorch's ("0.weight", "bn.running_mean"; never a "module." prefix). The
-- tensors are detached views of the module's (they share data: clone to snapshot).
-- The order (PyTorch's) is given by nn.state_dict_keys(sd); `pairs` has none.
function Module:state_dict()
  local sd, order = {}, {}
  for _, e in ipairs(state_entries(self)) do
    sd[e[1]] = e[2]:detach()
    order[#order + 1] = e[1]
  end
  state_order[sd] = order
  return sd
end

local function shape_text(t)
  local s = t:size()
  return "(" .. table.concat(s, ", ") .. (#s == 1 and "," or "") .. ")"
end

local function same_shape(a, b)
  local sa, sb = a:size(), b:size()
  if #sa ~= #sb then return false end
  for i = 1, #sa do if sa[i] ~= sb[i] then return false end end
  return true
end

local function quoted(list)
  local q = {}
  for i, k in ipairs(list) do q[i] = '"' .. tostring(k) .. '"' end
  return table.concat(q, ", ")
end

--- m:load_state_dict(sd[, opts]) -> report: copy the tensors of sd (name -> tensor, as
-- state_dict makes) into m's parameters and persistent buffers, converting dtypes, under
-- no_grad (the Parameter objects stay the same). report = {missing_keys = {...},
-- unexpected_keys = {...}, mismatched = {{name, expected_shape, got_shape}, ...}} (shapes
-- as tables; lists in state_dict order, unexpected keys sorted). A shape-mismatched entry
-- is never copied. opts.strict (default true): raise, before copying anything, when any
-- list is non-empty, with PyTorch's message naming the keys. (PyTorch raises for a shape
-- mismatch even when not strict; here strict = false reports it.)
function Module:load_state_dict(sd, opts)
  if type(sd) ~= "table" then
    lib.raise(self:_get_name() .. ":load_state_dict: expected a table name -> tensor, got " .. type(sd))
  end
  local strict = not (opts and opts.strict == false)
  local report = { missing_keys = {}, unexpected_keys = {}, mismatched = {} }
  local expected, copies = {}, {}
  for _, e in ipairs(state_entries(self)) do
    local name, dst = e[1], e[2]
    expected[name] = true
    local src = sd[name]
    if src == nil then
      report.missing_keys[#report.missing_keys + 1] = name
    elseif not dl.is_tensor(src) then
      lib.raise(("%s:load_state_dict: entry '%s' is %s, expected a tensor"):format(
        self:_get_name(), name, type_name(src)))
    elseif not same_shape(src, dst) then
      report.mismatched[#report.mismatched + 1] = { name, dst:size(), src:size() }
    else
      copies[#copies + 1] = { dst, src }
    end
  end
  for k in pairs(sd) do
    if not expected[k] then report.unexpected_keys[#report.unexpected_keys + 1] = k end
  end
  table.sort(report.unexpected_keys, function(a, b) return tostring(a) < tostring(b) end)
  if strict and (#report.missing_keys + #report.unexpected_keys + #report.mismatched) > 0 then
    local msgs = {}
    if #report.unexpected_keys > 0 then
      msgs[#msgs + 1] = "Unexpected key(s) in state_dict: " .. quoted(report.unexpected_keys) .. "."
    end
    if #report.missing_keys > 0 then
      msgs[#msgs + 1] = "Missing key(s) in state_dict: " .. quoted(report.missing_keys) .. "."
    end
    for _, mm in ipairs(report.mismatched) do
      msgs[#msgs + 1] = ("size mismatch for %s: copying a param with shape %s from checkpoint, "
        .. "the shape in current model is %s."):format(mm[1], shape_text(sd[mm[1]]),
          "(" .. table.concat(mm[2], ", ") .. (#mm[2] == 1 and "," or "") .. ")")
    end
    lib.raise("Error(s) in loading state_dict for " .. self:_get_name() .. ":\n\t" .. table.concat(msgs, "\n\t"))
  end
  dl.no_grad(function()
    for _, c in ipairs(copies) do c[1]:copy_(c[2]) end
  end)
  return report
end

-- ---- device and dtype conversion ----------------------------------------------------

--- m:to(...) -> m: move every parameter and buffer to a device and/or convert the floating
-- ones to a dtype, in place in the module (as PyTorch's Module.to). Forms: m:to("f64"),
-- m:to("cuda:1") ("cpu", "cuda" = the current device, "cuda:k"), m:to("cuda", "f16"),
-- m:to{device =, dtype =, non_blocking =}. Integer buffers (num_batches_tracked) move but
-- keep their dtype; a dtype must be floating.
--
-- Note [module to]: every parameter and buffer keeps its identity: the same Lua handle
-- (and C tensor) takes the moved or converted data (ddp_tensor_set_data, PyTorch's
-- `param.data = new`), keeping requires_grad and hooks; a gradient is moved or converted
-- with it. So an optimizer built before to() still updates the right tensors (PyTorch
-- advises building it after; either works here), and references held elsewhere stay
-- valid. Do not call to() between a forward and its backward. A tensor shared between
-- modules is converted once.
function Module:to(a, b)
  local device, dtype, non_blocking
  for _, v in ipairs { a, b } do
    if type(v) == "table" then
      device, dtype, non_blocking = v.device or device, v.dtype or dtype, v.non_blocking
    elseif dl.cuda.is_device(v) then
      device = v
    elseif v ~= nil then
      dtype = v
    end
  end
  local dev = device ~= nil and dl.cuda.parse_device(device) or nil
  local name
  if dtype ~= nil then
    name = lib.dtype_name(lib.dtype(dtype))
    if not ({ f32 = true, f64 = true, f16 = true, bf16 = true })[name] then
      lib.raise(self:_get_name() .. ":to: expected a floating dtype, got " .. tostring(dtype))
    end
  end
  if dev == nil and name == nil then return self end
  local opts = { non_blocking = non_blocking }
  local function convert(t)
    local dt = (name and t:is_floating_point()) and name or nil
    return t:to(dev ~= nil and dl.cuda.device_name(dev) or nil, dt, opts)
  end
  local function changes(t)
    if dev ~= nil and lib.C.ddp_tensor_device(t) ~= dev then return true end
    return name ~= nil and t:is_floating_point() and t:type() ~= name
  end
  local done = {}
  dl.no_grad(function()
    for _, m in ipairs(self:modules()) do
      for _, registry in ipairs { "_parameters", "_buffers" } do
        local d = rawget(m, registry)
        for _, n in ipairs(d.names) do
          local t = d.values[n]
          if t ~= nil then
            local key = tensor_key(t)
            if not done[key] and changes(t) then
              local g = t.grad
              local new_g = g ~= nil and changes(g) and convert(g) or nil
              lib.check(lib.C.ddp_tensor_set_data(t, convert(t)))
              if new_g ~= nil then t.grad = new_g end
            end
            done[key] = true
          end
        end
      end
    end
  end)
  return self
end

--- m:cuda([k]) -> m: m:to("cuda:k") (default: the current device). See Note [module to].
function Module:cuda(k)
  if k == nil then return self:to("cuda") end
  return self:to(dl.cuda.device_name(dl.cuda.parse_device(k)))
end

--- m:cpu() -> m: m:to("cpu"). See Note [module to].
function Module:cpu() return self:to("cpu") end

--- m:float() / m:double() / m:half() / m:bfloat16() -> m: m:to(dtype) for f32, f64, f16,
-- bf16 (floating parameters and buffers only).
function Module:float() return self:to("f32") end
function Module:double() return self:to("f64") end
function Module:half() return self:to("f16") end
function Module:bfloat16() return self:to("bf16") end

-- ---- printing ------------------------------------------------------------------------

--- m:extra_repr() -> the text inside the parentheses of m's line (layers override it).
function Module:extra_repr() return "" end

-- Indent every line but the first by `n` spaces (PyTorch's _addindent).
local function add_indent(s, n)
  local pad = string.rep(" ", n)
  return (s:gsub("\n", "\n" .. pad))
end

--- tostring(m): the module tree as PyTorch's repr:
--   Sequential(
--     (0): Linear(in_features=4, out_features=2, bias=True)
--     (1): ReLU()
--   )
Module.__tostring = function(self)
  local extra = self:extra_repr()
  local lines = {}
  local n_extra = 0
  if extra ~= "" then
    for line in (extra .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line; n_extra = n_extra + 1 end
  end
  local mods = rawget(self, "_modules")
  local n_child = 0
  for _, name in ipairs(mods.names) do
    local child = mods.values[name]
    lines[#lines + 1] = "(" .. name .. "): " .. add_indent(child and tostring(child) or "None", 2)
    n_child = n_child + 1
  end
  local s = self:_get_name() .. "("
  if #lines > 0 then
    if n_extra == 1 and n_child == 0 then
      s = s .. lines[1]
    else
      s = s .. "\n  " .. table.concat(lines, "\n  ") .. "\n"
    end
  end
  return s .. ")"
end

-- ---- helpers for layers (PyTorch's repr of Python values) ----------------------------

--- nn.repr(v): a Lua value as Python prints it in a module repr: true -> True, nil ->
-- None, 1e-5 -> 1e-05, 1 -> 1, 0.1 -> 0.1, {3, 3} -> (3, 3), strings quoted.
function M.repr(v)
  local tv = type(v)
  if v == nil then return "None" end
  if tv == "boolean" then return v and "True" or "False" end
  if tv == "string" then return "'" .. v .. "'" end
  if tv == "number" then
    if v % 1 == 0 and math.abs(v) < 1e16 then return string.format("%d", v) end
    for prec = 1, 17 do
      local s = string.format("%." .. prec .. "g", v)
      if tonumber(s) == v then return s end
    end
    return string.format("%.17g", v)
  end
  if tv == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = M.repr(x) end
    return "(" .. table.concat(parts, ", ") .. (#parts == 1 and "," or "") .. ")"
  end
  return tostring(v)
end

--- nn.repr_float(v): a float as Python prints one (1.0, 0.1, 1e-05).
function M.repr_float(v)
  if v == nil then return "None" end
  local s = M.repr(v)
  if not s:find("[%.e]") and not s:find("n") then s = s .. ".0" end
  return s
end

return M
