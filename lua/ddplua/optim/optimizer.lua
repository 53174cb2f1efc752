--- ddplua.optim.Optimizer: the base class of the optimizers (PyTorch's torch.optim.Optimizer).
--
-- An optimizer holds `param_groups` (a list of tables, each with its options and `params`,
-- a list of leaf tensors that require grad) and `state`, the per-parameter state: a view
-- (ddplua.optim.state) over a C optimizer-state store (Note [optimizer state store] in
-- runtime/include/ddplua/optim_state.h), opt.state[p] giving p's entry (nil before its
-- first step), opt.state[p].exp_avg a state tensor, opt.state[p].step a number, as in
-- PyTorch. One difference: LuaJIT has no __pairs, so iterate with opt.state:items() and
-- entry:items(), not pairs (ddplua.optim.state documents the view).
--
-- The step runs in C over that store: a subclass gives `configure(group, cfg)`, which fills
-- cfg (a ddp_optim_config: the kind and hyper-parameters of the group) and returns it; the
-- step is then one ddp_optim_step_params per group (state created lazily in C, each
-- parameter's update by the fused kernels of ddplua/optim.h). A subclass may instead give
-- `update(p, grad, group, state)` (one parameter's step, reading and writing state, its
-- entry of opt.state, which exists, empty before the first step). Subclasses (one per file) also give
-- `name`, `defaults` (every option with its default) and `validate(group)`, and may give
-- `optional` (options without a default, nil unless given: PyTorch's None).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local tensor = require "ddplua.tensor"
local State = require "ddplua.optim.state"
local ffi, C = lib.ffi, lib.C

local M = {}
M.__index = M

local is_tensor = tensor.is_tensor
local raise = lib.raise

--- Optimizer.subclass(name, defaults[, optional]): a new optimizer class, callable as
-- Class(params, opts). optional: a list of option names that have no default (nil unless
-- given).
function M.subclass(name, defaults, optional)
  local cls = { name = name, defaults = defaults, optional = optional or {} }
  cls.__index = cls
  return setmetatable(cls, { __index = M, __call = function(c, ...) return c.new(...) end })
end

--- Optimizer.map_tensors(v, fn): a copy of v (a state entry, an option value, a whole
-- state dict) with every tensor t in it replaced by fn(t): tables copied deeply, other
-- values as they are. E.g. map_tensors(sd, function(t) return t:cpu() end).
local function map_tensors(v, fn)
  if is_tensor(v) then return fn(v) end
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = map_tensors(x, fn) end
  return out
end
M.map_tensors = map_tensors

-- A copy of v: tables deeply, tensors cloned, other values as they are.
local function clone(t) return t:clone() end
local function copy_value(v) return map_tensors(v, clone) end
M.copy_value = copy_value

-- Address of a tensor handle's C object: two handles of one tensor give the same key.
local function address(p) return tonumber(ffi.cast("intptr_t", p)) end

--- Construct an optimizer of class cls over params (a list of tensors or a list of param
-- groups {params = {...}, <option> = ...}) with opts (the class defaults filled in).
-- Raises naming the bad option or parameter.
function M.construct(cls, params, opts)
  local ids = {} -- address -> the parameter's handle (as passed in)
  local self = setmetatable({ state = State.new(ids), param_groups = {}, _ids = ids }, cls)
  local known = {}
  for k in pairs(cls.defaults) do known[k] = true end
  for _, k in ipairs(cls.optional) do known[k] = true end
  opts = options.check(cls.name, opts, known)
  local defaults = {}
  for k, v in pairs(cls.defaults) do defaults[k] = copy_value(v) end
  for k, v in pairs(opts) do defaults[k] = copy_value(v) end
  cls.validate(defaults, cls.name)
  self.defaults = defaults
  if is_tensor(params) or type(params) ~= "table" then
    raise(cls.name .. ": params must be a list of tensors or of param groups, got " ..
      (is_tensor(params) and "a tensor" or type(params)))
  end
  if #params == 0 then raise(cls.name .. ": optimizer got an empty parameter list") end
  if is_tensor(params[1]) then
    self:add_param_group({ params = params })
  else
    for _, group in ipairs(params) do self:add_param_group(group) end
  end
  return self
end

--- opt:add_param_group(group): add {params = {...}, <option> = ...}; options not given take
-- the optimizer's defaults. Raises when a parameter is not a leaf tensor requiring grad, is
-- already in a group, or an option is invalid.
function M:add_param_group(group)
  local name = self.name
  local gi = #self.param_groups + 1
  if type(group) ~= "table" or is_tensor(group) then
    raise(("%s: param group %d must be a table {params = {...}, ...}"):format(name, gi))
  end
  local params = group.params
  if is_tensor(params) then params = { params } end
  if type(params) ~= "table" then
    raise(("%s: param group %d has no params list"):format(name, gi))
  end
  local g = {}
  for k, v in pairs(group) do if k ~= "params" then g[k] = copy_value(v) end end
  for k, v in pairs(self.defaults) do if g[k] == nil then g[k] = copy_value(v) end end
  self.validate(g, name)
  local list = {}
  for i, p in ipairs(params) do
    if not is_tensor(p) then
      raise(("%s: parameter %d of param group %d is not a tensor (got %s)"):format(name, i, gi, type(p)))
    end
    if not p.requires_grad then
      raise(("%s: parameter %d of param group %d does not require grad"):format(name, i, gi))
    end
    if not p.is_leaf then
      raise(("%s: parameter %d of param group %d is not a leaf tensor (can't optimize a non-leaf)"):format(name, i, gi))
    end
    local id = address(p)
    if self._ids[id] then
      raise(("%s: parameter %d of param group %d appears in more than one place"):format(name, i, gi))
    end
    self._ids[id] = p
    list[i] = p
  end
  g.params = list
  self.param_groups[gi] = g
end

--- opt:zero_grad(opts): forget the gradients. opts.set_to_none (default true, as PyTorch
-- 2.x) drops each .grad; false zeroes it in place.
function M:zero_grad(opts)
  local to_none = not (opts and opts.set_to_none == false)
  for _, group in ipairs(self.param_groups) do
    for _, p in ipairs(group.params) do
      if to_none then
        lib.check(C.ddp_tensor_set_grad(p, nil))
      else
        local g = C.ddp_tensor_grad(p)
        if g ~= nil then
          local status = C.ddp_zero_(g)
          C.ddp_tensor_release(g)
          lib.check(status)
        end
      end
    end
  end
end

-- The profiler's name of an optimizer step: PyTorch's "Optimizer.step#SGD.step".
local function profile_name(opt)
  local mt = getmetatable(opt)
  local cls = mt and rawget(mt, "name")
  return ("Optimizer.step#%s.step"):format(type(cls) == "string" and cls or "Optimizer")
end

--- opt:step(closure): one update of every parameter that has a .grad (those without are
-- skipped and get no state). closure (optional) is called first with grad mode on, to
-- recompute the loss; its result is returned. While a profiler records, the update is one
-- range named "Optimizer.step#<Class>.step" (ddplua.profiler).
function M:step(closure)
  local loss
  if closure then
    local prev = C.ddp_set_grad_enabled(1)
    local ok, res = pcall(closure)
    C.ddp_set_grad_enabled(prev)
    if not ok then error(res, 0) end
    loss = res
  end
  if C.ddp_profiler_enabled() ~= 0 then -- Note [profiler events]: one optimizer range
    lib.check(C.ddp_profiler_range_push(profile_name(self), C.DDP_PROF_OPTIMIZER))
    local ok, err = pcall(self.step_all, self)
    lib.check(C.ddp_profiler_range_pop())
    if not ok then error(err, 0) end
  else
    self:step_all()
  end
  return loss
end

-- Note [step releases its grads]: a Lua handle to a gradient holds its memory until the
-- collector finds the handle dead, which with zero_grad's set_to_none is the gradient's only
-- other holder. Through handles, every step's gradients (the MLP's 940 KB) stayed allocated
-- until the next collection: a collection every ~10 MLP steps instead of ~30, and each
-- step's dW landing in a block last touched tens of steps before. So the step takes the
-- gradients as C references inside ddp_optim_step_params and releases them when the call
-- returns: zero_grad then frees each gradient, and backward's next gradient of that size
-- gets the same block back, warm (Note [block cache], runtime/core/alloc.c). MLP bench, 2
-- threads: the optimizer step 90 -> 52 us, 13 collections in 400 steps instead of 41.

local cfg_box = ffi.new("ddp_optim_config")
-- The parameter array handed to ddp_optim_step_params, grown as needed, cleared after use.
local cap, arr = 0, nil
local function param_array(n)
  if n > cap then
    cap = math.max(n, 2 * cap, 16)
    arr = ffi.new("ddp_tensor*[?]", cap)
  end
  return arr
end

-- One group's step in C (a class with `configure`): its status.
local function step_group_c(store, cfg, params)
  local n = #params
  local ps = param_array(n)
  for i = 1, n do ps[i - 1] = params[i] end
  local status = C.ddp_optim_step_params(store, cfg, n, ps)
  for i = 0, n - 1 do ps[i] = nil end
  return status
end

--- opt:step_all(): the update of every group (step's body, without the closure): one
-- ddp_optim_step_params per group for a class with `configure`, else `update` per
-- parameter with a gradient.
function M:step_all()
  local state = self.state
  local configure = self.configure
  for _, group in ipairs(self.param_groups) do
    if configure then
      lib.check(step_group_c(State.store(state), configure(group, cfg_box), group.params))
    else
      for _, p in ipairs(group.params) do
        local g = lib.wrap(C.ddp_tensor_grad(p))
        if g ~= nil then
          if state[p] == nil then state[p] = {} end
          self:update(p, g, group, state[p])
        end
      end
    end
  end
end

--- opt:update(p, grad, group, entry): one parameter's step with gradient grad (p's shape,
-- dtype and device) and the options of group, by the class's C step
-- (ddp_optim_step_param over opt.state's store; entry is not used: the store is read).
-- Raises what the kernel refuses (a state tensor of another shape, a bad option).
function M:update(p, grad, group)
  lib.check(C.ddp_optim_step_param(State.store(self.state), self.configure(group, cfg_box), p, grad))
end

--- A zero tensor of p's shape and dtype (optimizer state).
function M.zeros_like(p)
  lib.check(C.ddp_tensor_zeros(lib.box, C.ddp_tensor_dim(p), C.ddp_tensor_shape(p),
    C.ddp_tensor_dtype(p), C.ddp_tensor_device(p)))
  return lib.wrap(lib.box[0])
end

--- opt:state_dict(): PyTorch's structure, a plain table of numbers, booleans, strings and
-- tensors: {state = {[i] = {step = n, exp_avg = tensor, ...}}, param_groups = {{lr = ...,
-- params = {i, ...}}, ...}} where i numbers the parameters across the groups in order
-- FROM 0, as PyTorch does (they are ids in a serialised structure, not Lua positions).
-- Tensors are copies.
function M:state_dict()
  local index, next_id = {}, 0 -- parameter address -> id
  local groups = {}
  for gi, group in ipairs(self.param_groups) do
    local g, ids = {}, {}
    for k, v in pairs(group) do if k ~= "params" then g[k] = copy_value(v) end end
    for i, p in ipairs(group.params) do
      index[address(p)] = next_id
      ids[i] = next_id
      next_id = next_id + 1
    end
    g.params = ids
    groups[gi] = g
  end
  local state = {}
  for p, st in self.state:items() do
    local id = index[address(p)]
    if id ~= nil then state[id] = copy_value(st:table()) end
  end
  return { state = state, param_groups = groups }
end

-- Note [validate loaded state]: a state dict comes from a file, and what is wrong in it
-- (a buffer of another shape, a step that is not a count, a negative lr) used to surface
-- only at the next opt:step(), far from the load, as a kernel's shape error. So
-- load_state_dict checks everything before it changes anything: each group's options as
-- the constructor would (the class's validate), each state entry's id (a parameter of this
-- optimizer), its `step` (a count >= 0; a 0-d tensor, as PyTorch saves it, is taken as its
-- value) and its tensors (the parameter's shape), and raises naming the group, the
-- parameter (its id) and the field.

-- The checked copy of one loaded state entry (Note [validate loaded state]).
local function checked_state(name, id, st, p)
  local where = ("%s: loaded state of parameter %s"):format(name, tostring(id))
  if type(st) ~= "table" or is_tensor(st) then raise(where .. " is a " .. type(st) .. ", not a table") end
  local out = {}
  for k, v in pairs(st) do
    if k == "step" then
      if is_tensor(v) and v:numel() == 1 then v = v:item() end
      if type(v) ~= "number" or v < 0 or v % 1 ~= 0 then
        raise(("%s: step must be a count >= 0, got %s"):format(where, is_tensor(v) and "a tensor" or tostring(v)))
      end
      out[k] = v
    elseif is_tensor(v) then
      local a, b = v:size(), p:size()
      local same = #a == #b
      for d = 1, #a do same = same and a[d] == b[d] end
      if not same then
        raise(("%s: %s has shape (%s), the parameter (%s)"):format(where, tostring(k),
          table.concat(a, ", "), table.concat(b, ", ")))
      end
      if v:is_floating_point() then
        -- PyTorch's rule: floating state follows its parameter's device and dtype.
        local moved = v:to(p.device, p.dtype)
        out[k] = moved == v and v:clone() or moved
      else
        out[k] = copy_value(v)
      end
    elseif type(v) == "number" or type(v) == "boolean" then
      out[k] = v
    else
      raise(("%s: %s is a %s, expected a tensor"):format(where, tostring(k), type(v)))
    end
  end
  return out
end

--- opt:load_state_dict(sd): restore options and state from a table made by state_dict()
-- (ids may be numbers or numeric strings). Floating state tensors are copied and
-- converted to their parameter's dtype, except `step`. Raises, before changing anything,
-- when the groups or their sizes differ from this optimizer's, when a group's options are
-- invalid, or when a state entry names no parameter of this optimizer, has a step that is
-- not a count, or holds a tensor of another shape than its parameter (Note [validate
-- loaded state]).
function M:load_state_dict(sd)
  local name = self.name
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" or type(sd.state) ~= "table" then
    raise(name .. ": load_state_dict expects a table {state = ..., param_groups = ...}")
  end
  local saved = sd.param_groups
  if #saved ~= #self.param_groups then
    raise(("%s: loaded state dict has %d parameter groups, the optimizer has %d"):format(
      name, #saved, #self.param_groups))
  end
  local by_id = {}
  for gi, group in ipairs(self.param_groups) do
    local ids = saved[gi].params
    if type(ids) ~= "table" or #ids ~= #group.params then
      raise(("%s: loaded param group %d has %s parameters, the optimizer's has %d"):format(
        name, gi, type(ids) == "table" and #ids or "no", #group.params))
    end
    for i, p in ipairs(group.params) do by_id[tonumber(ids[i])] = p end
  end
  local state = {}
  for id, st in pairs(sd.state) do
    local p = by_id[tonumber(id)]
    if p == nil then
      raise(("%s: loaded state names parameter %s, which no param group holds"):format(name, tostring(id)))
    end
    state[p] = checked_state(name, id, st, p)
  end
  local groups = {}
  for gi, group in ipairs(self.param_groups) do
    local g = {}
    for k, v in pairs(self.defaults) do g[k] = copy_value(v) end
    for k, v in pairs(saved[gi]) do if k ~= "params" then g[k] = copy_value(v) end end
    self.validate(g, ("%s (loaded param group %d)"):format(name, gi))
    g.params = group.params
    groups[gi] = g
  end
  for gi, g in ipairs(groups) do self.param_groups[gi] = g end
  self.state:replace(state)
end

-- ---- validation helpers shared by the subclasses ---------------------------------------

--- Raise "<Name>: invalid <option> <value> (<why>)".
function M.invalid(name, option, value, why)
  raise(("%s: invalid %s %s (%s)"):format(name, option, tostring(value), why))
end

--- Check group[key] is a number >= 0.
function M.check_nonneg(group, key, name)
  local v = group[key]
  if type(v) ~= "number" or not (v >= 0) then M.invalid(name, key, v, "must be a number >= 0") end
end

--- Check group[key] is a boolean.
function M.check_bool(group, key, name)
  local v = group[key]
  if type(v) ~= "boolean" then M.invalid(name, key, v, "must be true or false") end
end

return M
