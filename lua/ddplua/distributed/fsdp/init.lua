--- ddplua.distributed.fsdp: fully sharded data parallel, PyTorch's FSDP2
-- (torch.distributed.fsdp.fully_shard). Also reachable as dist.fsdp.
--
--   local fsdp = require "ddplua.distributed.fsdp"        -- or dist.fsdp
--   for _, block in ipairs(model.transformer.h:list()) do fsdp.fully_shard(block) end
--   fsdp.fully_shard(model)                               -- the root, last (bottom-up)
--   local opt = optim.AdamW(model:parameters(), {lr = 1e-3})  -- steps the shards
--   local logits, loss = model(x, y); loss:backward(); opt:step(); opt:zero_grad()
--
-- Each fully_shard(module, opts) call puts the module's parameters that no earlier call
-- manages (those of nested fully_shard'ed modules are theirs) into one param group. Every
-- such parameter is sharded along its first dimension over the mesh's ranks (Shard(0), Note
-- [fsdp sharding] in ddplua.distributed.fsdp.fsdp_param), and the module's registered
-- parameter becomes this rank's shard under the same name: model:parameters() lists the
-- shards, any optimizer steps them, state_dict() keys stay the same (its values are the
-- shards; see get_model_state_dict for the full tensors). Around the module's forward and
-- backward the group is all-gathered, prefetched, resharded and its gradients reduce-
-- scattered (Note [fsdp hooks] in ddplua.distributed.fsdp.state). Gradients are averaged
-- over the mesh's ranks (each rank's loss a mean over its own batch makes the result that of
-- one process on the whole batch). The module's class becomes "FSDP" .. its class name (a
-- subclass, as PyTorch's FSDPModule), with the FSDPModule methods below.
--
-- opts: mesh (a 1-D DeviceMesh; default: one over the whole world), reshard_after_forward
-- (default true: free the unsharded parameters after forward and gather them again for
-- backward; false keeps them until the end of backward: less communication, more memory;
-- the root never reshards after forward), mp_policy (MixedPrecisionPolicy{param_dtype,
-- reduce_dtype}: all-gather and compute in param_dtype, floating tensor arguments of the
-- forward cast to it; reduce gradients in reduce_dtype, default param_dtype; the shards,
-- their gradients and the optimizer stay in the parameters' own dtype).
-- The original parameter tensors are freed once sharded (Note [fsdp original parameters]
-- below): build the optimizer from model:parameters() AFTER fully_shard; a tensor taken
-- before raises "... is a freed tensor" when used.
-- Differences from PyTorch: parameters are plain tensors, not DTensors (the sharded state
-- dict gives each shard's global shape and offsets instead); prefetching is implicit from
-- the first step's forward order (set_prefetch(false) turns it off);
-- a group's parameters must share a dtype unless param_dtype is set; a parameter
-- that gets no gradient on any rank in a backward gets a zero gradient when others of its
-- group got one.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local c10d = require "ddplua.distributed.distributed_c10d"
local FSDPParam = require "ddplua.distributed.fsdp.fsdp_param"
local FSDPParamGroup = require "ddplua.distributed.fsdp.param_group"
local FSDPState = require "ddplua.distributed.fsdp.state"
local MixedPrecisionPolicy = require "ddplua.distributed.fsdp.mixed_precision"
local state_dict = require "ddplua.distributed.fsdp.state_dict"

local raise = lib.raise

local M = {}

M.MixedPrecisionPolicy = MixedPrecisionPolicy

-- Note [fsdp lifetimes]: a module's FSDPState lives in the module itself (the plain
-- attribute _fsdp_state, as PyTorch keeps its state on the module), never in a table of
-- this file keyed by module: LuaJIT's weak-keyed tables are no ephemerons, so a state that
-- refers back to its module (and to every shard) would keep them all alive for ever; the
-- unsharded parameters' post-accumulate-grad hooks reach the state through a weak
-- reference for the same reason (the engine's hook registry holds the hooks strongly).
-- states_of[m] reads that attribute. `managed` (weak keys, value true) marks every tensor a
-- fully_shard call already took (originals, shards, unsharded parameters).
local states_of = setmetatable({}, { __index = function(_, m)
  local attrs = type(m) == "table" and rawget(m, "_attrs")
  return attrs and rawget(attrs, "_fsdp_state") or nil
end, __newindex = function() error("fsdp: states_of is read-only", 2) end })
local managed = setmetatable({}, { __mode = "k" })

-- tensor (shard or unsharded parameter) -> its FSDPParam, for every FSDP module under model
local function param_map(model)
  local map = {}
  for _, m in ipairs(model:modules()) do
    local s = states_of[m]
    if s then
      for _, fp in ipairs(s.group.params) do map[fp.sharded], map[fp.unsharded] = fp, fp end
    end
  end
  return map
end

-- FSDP forwards under way (a forward with none around it is a root's).
local active_forwards = 0

--- FSDPModule: the methods fully_shard adds to a module (PyTorch's FSDPModule).
local FSDPModule = {}
M.FSDPModule = FSDPModule

local function state(self, op)
  local s = states_of[self]
  if not s then raise(op .. ": the module is not fully_shard'ed") end
  return s
end

-- The FSDPStates of self and the modules under it.
local function states_below(self)
  local list = {}
  for _, m in ipairs(self:modules()) do
    if states_of[m] then list[#list + 1] = states_of[m] end
  end
  return list
end

--- module:reshard(): register the shards and free the unsharded parameters now.
function FSDPModule:reshard() state(self, "reshard").group:reshard() end

--- module:unshard([async]) -> nil: all-gather the module's parameters and register them
-- unsharded (async = true only starts the all-gather; the next forward finishes it).
function FSDPModule:unshard(async) state(self, "unshard").group:unshard(async) end

--- module:set_requires_gradient_sync(requires_sync[, recurse = true]): false keeps the
-- unsharded gradients accumulating over backwards without communication (Note [fsdp no
-- sync]); the next backward with true reduce-scatters the sum. As PyTorch's FSDPModule.
function FSDPModule:set_requires_gradient_sync(requires_sync, recurse)
  local list = recurse == false and { state(self, "set_requires_gradient_sync") } or states_below(self)
  for _, s in ipairs(list) do s.group.requires_gradient_sync = requires_sync and true or false end
end

--- module:set_reshard_after_forward(flag[, recurse = true]) as PyTorch's.
function FSDPModule:set_reshard_after_forward(flag, recurse)
  local list = recurse == false and { state(self, "set_reshard_after_forward") } or states_below(self)
  for _, s in ipairs(list) do s.group.reshard_after_forward = flag and true or false end
end

--- module:set_prefetch(enabled): on the root, turn the implicit all-gather prefetch (the
-- next module's all-gather issued while this one computes, Note [fsdp hooks]) on or off
-- (default on). ddplua's own switch (bench/fsdp.lua compares the two).
function FSDPModule:set_prefetch(enabled)
  for _, s in ipairs(states_below(self)) do s.prefetch = enabled and true or false end
end

--- module:_get_fsdp_state() -> the FSDPState (ddplua.distributed.fsdp.state) fully_shard
-- attached, as PyTorch's: its .group (the FSDPParamGroup: .state is "sharded", "gathering"
-- while an all-gather is in flight, or "unsharded"), for tests and tools.
function FSDPModule:_get_fsdp_state() return state(self, "_get_fsdp_state") end

-- The FSDP subclass of each class (one per class, as PyTorch's cls_to_fsdp_cls).
local fsdp_classes = setmetatable({}, { __mode = "k" })

local function fsdp_class(cls)
  local fc = fsdp_classes[cls]
  if fc then return fc end
  -- nn.Module's own extend (a container class may define extend as a method of its own,
  -- as Sequential's list extend does): the base class is the end of the super chain
  local base = cls
  while rawget(base, "super") do base = rawget(base, "super") end
  fc = rawget(base, "extend")(cls, "FSDP" .. cls.__name)
  for k, v in pairs(FSDPModule) do fc[k] = v end
  local inner = cls.forward
  -- the forward: pre-forward, the class's own forward, post-forward (Note [fsdp hooks])
  local function after(s, ok, ...)
    active_forwards = active_forwards - 1
    if not ok then error((...), 0) end
    s:post_forward(...)
    return ...
  end
  fc.forward = function(self, ...)
    local s = states_of[self]
    if active_forwards == 0 and s.is_root == nil then s:lazy_init(states_of) end
    local n = select("#", ...)
    local cast = s:pre_forward(n, ...)
    active_forwards = active_forwards + 1
    if cast then return after(s, pcall(inner, self, unpack(cast, 1, n))) end
    return after(s, pcall(inner, self, ...))
  end
  fsdp_classes[cls] = fc
  return fc
end

local KNOWN = options.known { "mesh", "reshard_after_forward", "mp_policy" }

--- fsdp.fully_shard(module[, opts]) -> module (its class now "FSDP<Name>"): see the top.
-- Collective-free, but every rank must call it with the same module structure. Raises when
-- module is not a Module or already fully_shard'ed, for a 0-d parameter, for a mesh that is
-- not 1-D, and when the process group is not initialized.
function M.fully_shard(module, opts)
  opts = options.check("fully_shard", opts, KNOWN)
  if type(module) ~= "table" or rawget(module, "_modules") == nil then
    raise("fully_shard: module must be an nn.Module, got " .. type(module))
  end
  if states_of[module] then raise("fully_shard: the module is already fully_shard'ed") end
  local mesh = opts and opts.mesh
  local group
  if mesh ~= nil then
    if not require("ddplua.distributed.device_mesh").is_device_mesh(mesh) then
      raise("fully_shard: mesh must be a DeviceMesh (dist.init_device_mesh)")
    end
    if mesh.ndim ~= 1 then
      raise(("fully_shard: expected a 1-D mesh (slice one out: mesh['dp']), got %d dimensions"):format(mesh.ndim))
    end
    group = mesh:get_group()
  else
    group = c10d.get_default_group()
  end
  local mp = opts and opts.mp_policy
  if mp ~= nil and not MixedPrecisionPolicy.is_policy(mp) then
    raise("fully_shard: mp_policy must be a MixedPrecisionPolicy{param_dtype =, reduce_dtype =}")
  end
  local reshard = true
  if opts and opts.reshard_after_forward ~= nil then reshard = opts.reshard_after_forward and true or false end
  local rank, world = c10d.get_rank(group), c10d.get_world_size(group)
  -- the parameters no earlier call manages, each with every place it is registered at
  local order, places = {}, {}
  for _, m in ipairs(module:modules()) do
    local params = rawget(m, "_parameters")
    for _, name in ipairs(params.names) do
      local p = params.values[name]
      if p ~= nil and not managed[p] then
        if not places[p] then order[#order + 1] = p; places[p] = {} end
        local list = places[p]
        list[#list + 1] = { m, name }
      end
    end
  end
  local fsdp_params = {}
  for i, p in ipairs(order) do
    local fp = FSDPParam.new(p, places[p], rank, world, mp and mp.param_dtype)
    fp.group = group
    fsdp_params[i] = fp
    managed[p], managed[fp.sharded], managed[fp.unsharded] = true, true, true
    fp:to_sharded()
    -- Note [fsdp original parameters]: the whole original tensor is freed now (its handle
    -- stays, as a freed tensor): its bytes are what sharding saves, and a handle something
    -- still holds must not keep them. bench/fsdp.lua measured the whole model's bytes still
    -- live after a collection in about one run in two before this (some reference to the
    -- original handles outlived them). An optimizer built on the originals would also train
    -- tensors no forward uses: using one raises instead.
    p:free()
  end
  local group_state = FSDPParamGroup.new(fsdp_params, group, { reshard_after_forward = reshard,
    param_dtype = mp and mp.param_dtype, reduce_dtype = mp and mp.reduce_dtype })
  local s = FSDPState.new(module, group_state, { param_dtype = mp and mp.param_dtype })
  s:register_grad_hooks()
  group_state:reshard() -- frees the unsharded storages (allocated so the hooks could go on)
  rawget(module, "_attrs")._fsdp_state = s -- Note [fsdp lifetimes]
  setmetatable(module, fsdp_class(getmetatable(module)))
  return module
end

--- fsdp.is_fsdp_module(v) -> true when fully_shard was applied to v.
function M.is_fsdp_module(v) return type(v) == "table" and states_of[v] ~= nil end

--- fsdp.get_model_state_dict(model[, opts]) and fsdp.get_sharded_state_dict(model),
-- fsdp.set_model_state_dict(model, sd): see ddplua.distributed.fsdp.state_dict.
function M.get_model_state_dict(model, opts)
  return state_dict.get_model_state_dict(model, param_map(model), opts)
end
function M.get_sharded_state_dict(model) return state_dict.get_sharded_state_dict(model, param_map(model)) end
function M.set_model_state_dict(model, sd) return state_dict.set_model_state_dict(model, param_map(model), sd) end

return M
