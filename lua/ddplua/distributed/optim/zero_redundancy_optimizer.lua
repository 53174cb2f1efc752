--- ddplua.distributed.optim.ZeroRedundancyOptimizer: an optimizer whose state is sharded
-- across the ranks of a process group (ZeRO stage 1: Rajbhandari et al., "ZeRO: Memory
-- Optimizations Toward Training Trillion Parameter Models", https://arxiv.org/abs/1910.02054),
-- after PyTorch's torch/distributed/optim/zero_redundancy_optimizer.py.
--
--   local ZeRO = require "ddplua.distributed.optim".ZeroRedundancyOptimizer
--   local model = DDP(Net())
--   local opt = ZeRO(model:parameters(), {optimizer_class = optim.Adam, lr = 1e-3})
--   crit(model(x), y):backward()            -- DDP averages the gradients
--   opt:step()                              -- step this rank's shard, then sync parameters
--
-- Every rank holds every parameter, but each parameter belongs to one rank (Note [ZeRO
-- partition]); each rank builds the local optimizer (`opt.optim`, of optimizer_class) over
-- its own parameters only, so the optimizer state (Adam's exp_avg and exp_avg_sq, SGD's
-- momentum_buffer) exists once in the group instead of once per rank: about 1/world of it
-- per rank. step() steps the local optimizer, then every rank's parameters are broadcast
-- from their owner (Note [ZeRO parameter sync]). The weights are those of the plain
-- optimizer fed the same gradients: each parameter gets the same kernel on the same
-- gradient, on its owner, and the others receive the result bit for bit.
--
-- Options (opts): optimizer_class (required: an optimizer class of ddplua.optim, such as
-- optim.Adam or optim.SGD), process_group (default: the world), parameters_as_bucket_view
-- = false (true: one flat buffer per owner rank is broadcast instead of one broadcast per
-- parameter: `world` collectives a step instead of one per parameter, at the cost of a
-- copy of the parameters; unlike PyTorch the parameters are not turned into views of the
-- buffer, ddplua having no way to re-point a parameter's storage), overlap_with_ddp = false
-- (true raises: it needs PyTorch's ddp_zero_hook.py communication hooks, not provided),
-- partition = "parameters" (the default and PyTorch's only one: each parameter whole on
-- one rank, Note [ZeRO partition]) or "elements" (a ddplua extension: each param group
-- laid flat and cut into equal per-rank ranges of elements, parameters possibly split, as
-- DeepSpeed's ZeRO stage 1: Note [ZeRO element partition] in element_partition.lua; the
-- state per rank is then 1/world of the plain optimizer's, to one padding element per
-- state tensor, however the sizes are spread; it needs an element-wise optimizer_class --
-- optim.SGD, Adam, AdamW, Adadelta, or a class of your own declaring `elementwise = true`
-- -- and refuses parameters_as_bucket_view, its sync being one all-gather per group).
-- Every other key is an option of optimizer_class (lr, betas, momentum, ...), checked by it.
--
-- opt.param_groups is PyTorch's view: every parameter of each group with the group's
-- options; changing an option there (an LR scheduler does) reaches the local optimizer at
-- the next step, and the local optimizer's options are copied back after it (PyTorch's
-- _sync_param_groups). Construction, step, zero_grad's peers, add_param_group,
-- consolidate_state_dict and load_state_dict are collective or must be called on every
-- rank with the same arguments, as in PyTorch.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local tensor = require "ddplua.tensor"
local Optimizer = require "ddplua.optim.optimizer"
local state_broadcast = require "ddplua.distributed.optim.state_broadcast"
local ElementPartition = require "ddplua.distributed.optim.element_partition"
local ffi, C = lib.ffi, lib.C
local raise = lib.raise

local NAME = "ZeroRedundancyOptimizer"

local ZeRO = {}
ZeRO.__index = ZeRO
ZeRO.name = NAME
setmetatable(ZeRO, { __call = function(cls, ...) return cls.new(...) end })

local is_tensor = tensor.is_tensor

local function dist() return require "ddplua.distributed.distributed_c10d" end
local function dl() return require "ddplua.functions" end

-- Address of a tensor handle's C object: two handles of one tensor give the same key.
local function address(p) return tonumber(ffi.cast("intptr_t", p)) end

-- The options ZeroRedundancyOptimizer reads itself; the rest go to optimizer_class.
local OWN = { optimizer_class = true, process_group = true, parameters_as_bucket_view = true,
  overlap_with_ddp = true, partition = true }

-- ---- the partition ------------------------------------------------------------------------

-- Note [ZeRO partition]: PyTorch's sorted-greedy partition (_partition_parameters): the
-- running total of elements per rank starts at 0 for every rank; for each param group in
-- order, its parameters are sorted by element count, largest first (a stable sort: equal
-- counts keep their order in the group), and each goes to the rank with the smallest total
-- so far (the lowest rank on a tie), whose total then grows by its count. The totals carry
-- over from one group to the next. Every rank computes the same partition from the same
-- shapes, so no communication is needed; each parameter is owned by exactly one rank and
-- never split. The result is partition[r + 1][g] = the parameters of group g owned by group
-- rank r, in assignment order: the local optimizer of rank r has these groups, so its
-- state dict's parameter ids count along them (what state_dict() translates back).

--- ZeroRedundancyOptimizer.partition(param_groups, world) -> partition, totals:
-- partition[r + 1][g] lists the parameters of param_groups[g] (tables with `params`) that
-- group rank r owns (Note [ZeRO partition]); totals[r + 1] is rank r's element count.
function ZeRO.partition(param_groups, world)
  local partition, totals = {}, {}
  for r = 1, world do partition[r], totals[r] = {}, 0 end
  for g, group in ipairs(param_groups) do
    local order = {}
    for i, p in ipairs(group.params) do order[i] = { p = p, n = p:numel(), i = i } end
    table.sort(order, function(a, b)
      if a.n ~= b.n then return a.n > b.n end
      return a.i < b.i
    end)
    for r = 1, world do partition[r][g] = {} end
    for _, e in ipairs(order) do
      local best = 1
      for r = 2, world do if totals[r] < totals[best] then best = r end end
      local list = partition[best][g]
      list[#list + 1] = e.p
      totals[best] = totals[best] + e.n
    end
  end
  return partition, totals
end

-- ---- construction -------------------------------------------------------------------------

-- Raise unless cls is an optimizer class made by Optimizer.subclass (optim.Adam, optim.SGD, ...).
local function check_optimizer_class(cls)
  local ok = type(cls) == "table" and getmetatable(cls) ~= nil and getmetatable(cls).__index == Optimizer
    and type(cls.new) == "function" and type(cls.defaults) == "table"
  if not ok then
    raise(("%s: optimizer_class must be an optimizer class such as optim.Adam or optim.SGD, got %s"):format(
      NAME, cls == nil and "nothing" or type(cls) == "table" and "a table that is not one" or type(cls)))
  end
end

-- Raise unless params is a non-empty list of tensors of one dtype on one device (PyTorch's
-- _verify_and_init_params and _verify_same_dense_param_type, with its messages).
local function check_params(params)
  if is_tensor(params) or type(params) ~= "table" then
    raise(("%s: params argument should be an iterable of Tensors, but got %s"):format(NAME,
      is_tensor(params) and "a tensor" or type(params)))
  end
  if #params == 0 then raise(NAME .. " got an empty parameter list") end
  local first
  for i, p in ipairs(params) do
    if not is_tensor(p) then
      raise(("%s: params argument should be an iterable of Tensors, but got an iterable containing %s (entry %d)"):format(
        NAME, type(p), i))
    end
    local kind = ("%s on %s"):format(p:type(), p.device)
    if first == nil then
      first = kind
    elseif kind ~= first then
      raise(("%s only supports using the same dense type for all parameters but got both %s and %s (parameter %d)"):format(
        NAME, first, kind, i))
    end
  end
end

local function group_rank_to_global(group, r) return group.ranks[r + 1] end

-- The classes of ddplua.optim whose update is element-wise (Note [ZeRO element partition]).
local function elementwise(cls)
  if cls.elementwise == true then return true end
  local optim = require "ddplua.optim"
  return cls == optim.SGD or cls == optim.Adam or cls == optim.AdamW or cls == optim.Adadelta
end

-- The partition option: "parameters" (default) or "elements"; raises for anything else,
-- for "elements" with an optimizer_class whose update is not element-wise, and for
-- "elements" with parameters_as_bucket_view.
local function partition_mode(opts, cls)
  local mode = opts.partition
  if mode == nil then return "parameters" end
  if mode ~= "parameters" and mode ~= "elements" then
    raise(('%s: partition must be "parameters" or "elements", got %s'):format(NAME, tostring(mode)))
  end
  if mode == "elements" then
    if not elementwise(cls) then
      raise(('%s: partition = "elements" needs an optimizer whose update is element-wise (SGD, Adam, AdamW, ' ..
        'Adadelta, or a class declaring elementwise = true), and %s is not known to be: a parameter cut ' ..
        'between ranks would get another update; use partition = "parameters"'):format(NAME, tostring(cls.name)))
    end
    if opts.parameters_as_bucket_view then
      raise(NAME .. ': parameters_as_bucket_view = true does not apply to partition = "elements", whose ' ..
        "updated ranges are already gathered as one flat buffer per param group")
    end
  end
  return mode
end

--- ZeroRedundancyOptimizer(params, opts) (or .new): see the top of this file. params: a
-- list of tensors (leaves requiring grad, one dtype, one device; param groups come with
-- add_param_group, as PyTorch). Raises naming the problem: a bad optimizer_class, a bad
-- params list, overlap_with_ddp = true, a bad partition (or "elements" with an optimizer
-- not known to be element-wise, or with parameters_as_bucket_view), no process group, an
-- option neither it nor optimizer_class knows (options.check's message), an invalid
-- option value (optimizer_class's message).
function ZeRO.new(params, opts)
  if opts ~= nil and type(opts) ~= "table" then
    raise(("%s: options must be a table, got %s"):format(NAME, type(opts)))
  end
  opts = opts or {}
  local cls = opts.optimizer_class
  check_optimizer_class(cls)
  -- A misspelt option is named among ZeRO's own and optimizer_class's.
  local known = {}
  for k in pairs(OWN) do known[k] = true end
  for k in pairs(cls.defaults) do known[k] = true end
  options.check(NAME, opts, known)
  check_params(params)
  if opts.overlap_with_ddp ~= nil and type(opts.overlap_with_ddp) ~= "boolean" then
    raise(NAME .. ": overlap_with_ddp must be true or false, got " .. tostring(opts.overlap_with_ddp))
  end
  if opts.overlap_with_ddp then
    raise(NAME .. ": overlap_with_ddp = true is not supported (it needs the DDP communication hooks of " ..
      "PyTorch's ddp_zero_hook.py, which ddplua does not have); use overlap_with_ddp = false")
  end
  local bucket_view = opts.parameters_as_bucket_view
  if bucket_view ~= nil and type(bucket_view) ~= "boolean" then
    raise(NAME .. ": parameters_as_bucket_view must be true or false, got " .. tostring(bucket_view))
  end
  local mode = partition_mode(opts, cls)
  local defaults = {}
  for k, v in pairs(opts) do if not OWN[k] then defaults[k] = v end end
  local group = opts.process_group
  if group == nil then
    local d = dist()
    if not d.is_initialized() then
      raise(NAME .. ": the default process group is not initialised (call dist.init_process_group first, " ..
        "or pass process_group =)")
    end
    group = d.get_default_group()
  elseif getmetatable(group) ~= require("ddplua.distributed.group") then
    raise(NAME .. ": process_group must be a process group (dist.new_group or the default group)")
  end
  group:ptr(NAME) -- raises for a destroyed group or a non-member
  local self = setmetatable({
    optimizer_class = cls,
    process_group = group,
    world_size = group:size(),
    rank = group:rank(),
    parameters_as_bucket_view = bucket_view == true,
    partition = mode,
    _optim_defaults = defaults,
    _device = C.ddp_tensor_device(params[1]),
    _all_state_dicts = {},
  }, ZeRO)
  self.global_rank = group_rank_to_global(group, self.rank)
  if mode == "elements" then
    self._elements = ElementPartition.new { world = self.world_size, rank = self.rank, device = self._device,
      dtype = params[1]:type(), process_group = group }
  end
  -- Note [ZeRO param groups]: the exposed param groups belong to an instance of
  -- optimizer_class over every parameter that is never stepped (so it holds no state). It
  -- gives PyTorch's Optimizer base for free: the checks of each parameter (a leaf requiring
  -- grad, not twice), the class defaults filled into each group, the option checks of
  -- add_param_group and load_state_dict, zero_grad over every parameter, and state_dict's
  -- layout with global ids.
  self._all = cls.new(params, defaults)
  self.param_groups = self._all.param_groups
  self.defaults = self._all.defaults
  self:_repartition()
  local local_groups = {}
  for g, grp in ipairs(self.param_groups) do local_groups[g] = self:_local_group(grp, g) end
  self.optim = cls.new(local_groups, defaults)
  ZeRO._sync_param_groups(self.optim.param_groups, self.param_groups)
  return self
end

-- A group for the local optimizer: group's options with this rank's parameters of group g.
function ZeRO:_local_group(group, g)
  local out = {}
  for k, v in pairs(group) do if k ~= "params" then out[k] = v end end
  out.params = self._elements and self._elements:local_params(g) or self._partition[self.rank + 1][g]
  return out
end

-- Recompute the partition and what derives from it: the owner and global index of each
-- parameter (by address), the per-rank flat buffers of parameters_as_bucket_view. With
-- partition = "elements" the groups already laid out keep their shards (and so their
-- state); a new group gets its own.
function ZeRO:_repartition()
  self._rank_of, self._index_of, self._index_to_param = {}, {}, {}
  if self._elements then
    for g = #self._elements.groups + 1, #self.param_groups do
      self._elements:add_group(self.param_groups[g].params)
    end
    self._partition = self._elements:touched()
  else
    self._partition = ZeRO.partition(self.param_groups, self.world_size)
    for r = 1, self.world_size do
      for _, list in ipairs(self._partition[r]) do
        for _, p in ipairs(list) do self._rank_of[address(p)] = r - 1 end
      end
    end
  end
  local id = 0
  for _, group in ipairs(self.param_groups) do
    for _, p in ipairs(group.params) do
      self._index_of[address(p)] = id
      self._index_to_param[id] = p
      id = id + 1
    end
  end
  self:_build_param_buckets()
end

--- ZeroRedundancyOptimizer._sync_param_groups(src, dst): copy every option but `params` of
-- each group of src into the group of dst at the same position (PyTorch's helper of the
-- same name). Raises when the numbers of groups differ.
function ZeRO._sync_param_groups(src, dst)
  if #src ~= #dst then
    raise(("%s: mismatch between the number of source (%d) and destination (%d) parameter groups"):format(
      NAME, #src, #dst))
  end
  for g, sg in ipairs(src) do
    local dg = dst[g]
    for k, v in pairs(sg) do if k ~= "params" then dg[k] = v end end
  end
end

-- ---- parameter synchronisation ---------------------------------------------------------------

-- Note [ZeRO parameter sync]: after the local step, the parameters of group rank r are
-- broadcast from r (global rank group.ranks[r + 1]) to every rank, r = 0 .. world - 1, each
-- parameter in partition order: PyTorch's _sync_params. All broadcasts are submitted
-- asynchronously, then all are waited for (each with the group's timeout); every rank
-- submits the same sequence, since every rank computed the same partition. With
-- parameters_as_bucket_view the owner first copies its parameters into its rank's flat
-- buffer (one (n_r) tensor per rank, n_r its element count, on the parameters' device),
-- the `world` buffers are broadcast (ranks owning nothing are skipped on every rank), and
-- each rank copies the other ranks' buffers back into their parameters. Broadcasting is
-- what PyTorch does, not an all-gather, because the shards have different sizes.

-- The flat buffer of each rank and the views of its parameters in it.
function ZeRO:_build_param_buckets()
  self._buckets = nil
  if not self.parameters_as_bucket_view then return end
  local buckets = {}
  local proto = self.param_groups[1].params[1]
  for r = 1, self.world_size do
    local params, total = {}, 0
    for _, list in ipairs(self._partition[r]) do
      for _, p in ipairs(list) do
        params[#params + 1] = p
        total = total + p:numel()
      end
    end
    local b = { params = params, views = {}, numel = total }
    if total > 0 then
      b.tensor = dl().empty({ total }, { dtype = proto:type(), device = self._device >= 0 and self._device or nil })
      local offset = 0
      for i, p in ipairs(params) do
        local n = p:numel()
        b.views[i] = b.tensor:narrow(1, offset + 1, n):view(p:size())
        offset = offset + n
      end
    end
    buckets[r] = b
  end
  self._buckets = buckets
end

local function wait_all(works)
  for _, w in ipairs(works) do w:wait() end
end

-- Broadcast every rank's parameters from their owner (Note [ZeRO parameter sync]).
function ZeRO:_sync_params()
  local d, group = dist(), self.process_group
  local opts = { group = group, async_op = true }
  local works = {}
  if self._buckets then
    local own = self._buckets[self.rank + 1]
    if own.tensor then
      dl().no_grad(function()
        for i, p in ipairs(own.params) do own.views[i]:copy_(p) end
      end)
    end
    for r = 1, self.world_size do
      local b = self._buckets[r]
      if b.tensor then works[#works + 1] = d.broadcast(b.tensor, group_rank_to_global(group, r - 1), opts) end
    end
    wait_all(works)
    dl().no_grad(function()
      for r = 1, self.world_size do
        local b = self._buckets[r]
        if r ~= self.rank + 1 and b.tensor then
          for i, p in ipairs(b.params) do p:copy_(b.views[i]) end
        end
      end
    end)
    return
  end
  for r = 1, self.world_size do
    local src = group_rank_to_global(group, r - 1)
    for _, list in ipairs(self._partition[r]) do
      for _, p in ipairs(list) do works[#works + 1] = d.broadcast(p, src, opts) end
    end
  end
  wait_all(works)
end

-- ---- the step -------------------------------------------------------------------------------

-- The generic Join (ddplua.distributed.algorithms.join), when this build has it: looked up
-- once, on the first step.
local join_module
local function join()
  if join_module == nil then
    local name = "ddplua.distributed.algorithms.join"
    join_module = package.loaded[name]
      or (package.searchpath(name, package.path) and require "ddplua.distributed.algorithms.join") or false
  end
  return join_module
end

-- The local step and the parameter sync, without telling a join context (PyTorch's
-- _local_step then _sync_params).
function ZeRO:_step(closure)
  if self._elements then return self:_element_step(closure) end
  ZeRO._sync_param_groups(self.param_groups, self.optim.param_groups)
  local loss = self.optim:step(closure)
  ZeRO._sync_param_groups(self.optim.param_groups, self.param_groups)
  self:_sync_params()
  return loss
end

-- The same with partition = "elements" (Note [ZeRO element partition]): the closure runs
-- first (it may recompute the gradients), then the shards take the parameters' values and
-- gradients, the local optimizer steps them, and the updated ranges are all-gathered.
function ZeRO:_element_step(closure)
  local loss
  if closure then loss = dl().enable_grad(closure) end
  local part = self._elements
  local has = part:check_grads()
  ZeRO._sync_param_groups(self.param_groups, self.optim.param_groups)
  part:load(has)
  self.optim:step()
  ZeRO._sync_param_groups(self.optim.param_groups, self.param_groups)
  part:gather()
  return loss
end

--- opt:step(closure) -> closure's result: step the local optimizer over this rank's
-- parameters (those with a .grad; closure, if given, is called first with grad mode on, as
-- the plain optimizer does), then broadcast every rank's parameters from their owner (Note
-- [ZeRO parameter sync]). Collective. Inside a Join, it first notifies the join context
-- (Join.notify_join_context, as PyTorch's _local_step). Raises as the local optimizer and
-- the collectives do. With partition = "elements": steps this rank's flat range of each
-- param group whose parameters have gradients, then all-gathers the ranges (Note [ZeRO
-- element partition]); raises, before any collective, when a group's parameters have a
-- .grad for some and not others.
function ZeRO:step(closure)
  local j = join()
  if j then j.notify_join_context(self) end
  return self:_step(closure)
end

--- opt:zero_grad(opts): forget the gradients of EVERY parameter (not only this rank's
-- shard), as PyTorch's ZeroRedundancyOptimizer (its Optimizer base); opts.set_to_none as
-- Optimizer:zero_grad.
function ZeRO:zero_grad(opts) self._all:zero_grad(opts) end

--- opt:add_param_group(group): add {params = {...}, <option> = ...} on every rank (the
-- options checked by optimizer_class), then partition again (Note [ZeRO partition]: the
-- earlier groups keep their owners, as a group's assignment depends only on the groups
-- before it) and give the local optimizer its share of the new group (possibly none; with
-- partition = "elements", the new group's own flat range, the earlier groups' shards and
-- state unchanged). Must be called on every rank.
function ZeRO:add_param_group(group)
  -- The same dense type as the first parameter, checked before anything changes (the rest
  -- is checked by optimizer_class's add_param_group).
  local first = self.param_groups[1].params[1]
  local list = type(group) == "table" and not is_tensor(group) and group.params or nil
  if is_tensor(list) then list = { list } end
  if type(list) == "table" then
    for _, p in ipairs(list) do
      if is_tensor(p) and (p:type() ~= first:type() or C.ddp_tensor_device(p) ~= self._device) then
        raise(("%s only supports using the same dense type for all parameters but got both %s on %s and %s on %s"):format(
          NAME, first:type(), first.device, p:type(), p.device))
      end
    end
  end
  self._all:add_param_group(group)
  self:_repartition()
  local g = #self.param_groups
  self.optim:add_param_group(self:_local_group(self.param_groups[g], g))
end

-- ---- state dicts ----------------------------------------------------------------------------

local function cpu(t) return t:cpu() end
local function to_cpu(v) return Optimizer.map_tensors(v, cpu) end

--- opt:consolidate_state_dict(to): gather every rank's local optimizer state dict on
-- group rank `to` (default 0), kept there (on the CPU) for state_dict(). Collective: every
-- rank must call it. As PyTorch, each rank's state goes to every rank by broadcast (Note
-- [state dict broadcast]) and the ranks other than `to` drop it. Raises when `to` is not a
-- group rank.
function ZeRO:consolidate_state_dict(to)
  to = to or 0
  if type(to) ~= "number" or to % 1 ~= 0 or to < 0 or to >= self.world_size then
    raise(("%s: consolidate_state_dict: to must be a rank of the group, 0 .. %d, got %s"):format(
      NAME, self.world_size - 1, tostring(to)))
  end
  ZeRO._sync_param_groups(self.param_groups, self.optim.param_groups)
  local all = {}
  for r = 0, self.world_size - 1 do
    local src = group_rank_to_global(self.process_group, r)
    if r == to then
      if self.rank == to then all[r + 1] = to_cpu(self.optim:state_dict()) end
    else
      local sd = self.rank == r and self.optim:state_dict() or nil
      local got = state_broadcast.broadcast(sd, src, self.process_group, self._device)
      if self.rank == to then all[r + 1] = got end
    end
  end
  self._all_state_dicts = self.rank == to and all or {}
end

--- opt:state_dict() -> the whole optimizer state as consolidated last on this rank, in the
-- plain optimizer_class's layout (Optimizer:state_dict: parameter ids count from 0 along
-- param_groups), so a plain optimizer over the same parameters can load it. Tensors are CPU
-- copies. Raises PyTorch's error unless consolidate_state_dict(to = this rank) ran before
-- (the state may be older than the last step: it is the one of that call). With partition
-- = "elements", each parameter's state is reassembled from the ranks' ranges
-- (ElementPartition.state_of), so it is the plain layout too.
function ZeRO:state_dict()
  if #self._all_state_dicts == 0 then
    raise(("Optimizer state has not been consolidated on this rank. Please call " ..
      "`consolidate_state_dict(to=%d)` on all ranks beforehand if you meant to save the global state."):format(self.rank))
  end
  local sd = self._all:state_dict() -- the param groups with global ids; no state of its own
  if self._elements then
    sd.state = self:_element_state()
    return sd
  end
  local state = {}
  for r, local_sd in ipairs(self._all_state_dicts) do
    local groups = self._partition[r]
    local lgroups = local_sd.param_groups
    if #lgroups ~= #groups then
      raise(("%s: the consolidated state of rank %d has %d parameter groups, the partition %d " ..
        "(add_param_group after consolidate_state_dict? call it again)"):format(NAME, r - 1, #lgroups, #groups))
    end
    for g, list in ipairs(groups) do
      local ids = lgroups[g].params
      if #ids ~= #list then
        raise(("%s: the consolidated state of rank %d has %d parameters in group %d, the partition %d"):format(
          NAME, r - 1, #ids, g, #list))
      end
      for i, p in ipairs(list) do
        local st = local_sd.state[ids[i]]
        if st ~= nil then state[self._index_of[address(p)]] = st end
      end
    end
  end
  sd.state = state
  return sd
end

-- The consolidated shard states reassembled per parameter (partition = "elements"), keyed
-- by global id (ElementPartition.state_of).
function ZeRO:_element_state()
  local part, state = self._elements, {}
  for g, layout in ipairs(part.groups) do
    local rank_states = {}
    for r = 1, self.world_size do
      local lgroups = self._all_state_dicts[r].param_groups
      if #lgroups ~= #part.groups then
        raise(("%s: the consolidated state of rank %d has %d parameter groups, the optimizer %d " ..
          "(add_param_group after consolidate_state_dict? call it again)"):format(NAME, r - 1, #lgroups, #part.groups))
      end
      local id = lgroups[g].params[1]
      if id ~= nil then rank_states[r] = self._all_state_dicts[r].state[id] end
    end
    local states = ElementPartition.state_of(layout, rank_states, g, self.world_size)
    for i, e in ipairs(layout.entries) do
      if states[i] ~= nil then state[self._index_of[address(e.p)]] = states[i] end
    end
  end
  return state
end

-- Note [ZeRO load checks]: every rank must accept or refuse a state dict alike, or the
-- ranks that accepted would wait in the next step's broadcasts for one that raised. The
-- entries of this rank's parameters are checked (and copied) by Optimizer:load_state_dict
-- (Note [validate loaded state]); the others, which this rank drops, get the same checks
-- here without a copy: a table, a step that is a count, tensors of the parameter's shape.
local function check_foreign_state(name, id, st, p)
  local where = ("%s: loaded state of parameter %s"):format(name, tostring(id))
  if type(st) ~= "table" or is_tensor(st) then raise(where .. " is a " .. type(st) .. ", not a table") end
  for k, v in pairs(st) do
    if k == "step" then
      if is_tensor(v) and v:numel() == 1 then v = v:item() end
      if type(v) ~= "number" or v < 0 or v % 1 ~= 0 then
        raise(("%s: step must be a count >= 0, got %s"):format(where, is_tensor(v) and "a tensor" or tostring(v)))
      end
    elseif is_tensor(v) then
      local a, b = v:size(), p:size()
      local same = #a == #b
      for d = 1, #a do same = same and a[d] == b[d] end
      if not same then
        raise(("%s: %s has shape (%s), the parameter (%s)"):format(where, tostring(k),
          table.concat(a, ", "), table.concat(b, ", ")))
      end
    elseif type(v) ~= "number" and type(v) ~= "boolean" then
      raise(("%s: %s is a %s, expected a tensor"):format(where, tostring(k), type(v)))
    end
  end
end

--- opt:load_state_dict(sd): load a whole optimizer state (from state_dict(), or from a plain
-- optimizer_class over the same parameters in the same order): the group options go to
-- every rank's param groups, and each rank keeps the state of the parameters it owns only
-- (PyTorch's load_state_dict; with partition = "elements", each group's states cut to this
-- rank's range). Must be called on every rank with the same sd (no communication). Raises
-- on every rank alike, before changing anything, as Optimizer:load_state_dict (Notes
-- [validate loaded state], [ZeRO load checks]): another number of groups or of
-- parameters, an invalid option, a state entry naming no parameter, a bad step or a
-- tensor of another shape; with partition = "elements" also when a group's parameters
-- do not all share one step and one set of state keys (or some have state and others not).
function ZeRO:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" or type(sd.state) ~= "table" then
    raise(NAME .. ": load_state_dict expects a table {state = ..., param_groups = ...}")
  end
  if self._elements then return self:_element_load(sd) end
  local mine = {}
  for id, st in pairs(sd.state) do
    local p = self._index_to_param[tonumber(id)]
    -- An id naming no parameter is kept, so the check below reports it.
    if p == nil or self._rank_of[address(p)] == self.rank then
      mine[id] = st
    else
      check_foreign_state(self.optimizer_class.name, id, st, p)
    end
  end
  -- Checks everything, then sets the options of every group and this rank's state.
  self._all:load_state_dict({ state = mine, param_groups = sd.param_groups })
  local st = self._all.state
  ZeRO._sync_param_groups(self.param_groups, self.optim.param_groups)
  local local_state = {}
  for _, list in ipairs(self._partition[self.rank + 1]) do
    for _, p in ipairs(list) do
      local entry = st[p]
      if entry ~= nil then local_state[p] = entry:table() end
    end
  end
  st:clear()
  self.optim.state:replace(local_state)
end

-- load_state_dict with partition = "elements": every rank checks every entry (Note [ZeRO
-- load checks]) and cuts each group's states into its shard's range (ElementPartition:cut,
-- which raises alike on every rank when a group's states cannot share one step), all
-- before anything changes; then the options are set and the shards' states replaced.
function ZeRO:_element_load(sd)
  local unknown = {}
  local by_param = {}
  for id, st in pairs(sd.state) do
    local p = self._index_to_param[tonumber(id)]
    if p == nil then
      unknown[id] = st -- Optimizer:load_state_dict names it
    else
      check_foreign_state(self.optimizer_class.name, id, st, p)
      by_param[address(p)] = st
    end
  end
  local part = self._elements
  local cuts = {}
  if next(unknown) == nil then
    for g, layout in ipairs(part.groups) do
      local states = {}
      for i, e in ipairs(layout.entries) do states[i] = by_param[address(e.p)] end
      cuts[g] = part:cut(g, states)
    end
  end
  self._all:load_state_dict({ state = unknown, param_groups = sd.param_groups })
  self._all.state:clear()
  ZeRO._sync_param_groups(self.param_groups, self.optim.param_groups)
  local local_state = {}
  for g, layout in ipairs(part.groups) do
    if layout.tensor and cuts[g] then local_state[layout.tensor] = cuts[g] end
  end
  self.optim.state:replace(local_state)
end

-- ---- join -----------------------------------------------------------------------------------

--- opt:join_hook(opts) -> a JoinHook {main_hook = function() ... end} for the generic Join
-- (ddplua.distributed.algorithms.join; PyTorch's _ZeROJoinHook). main_hook runs on a rank
-- that has joined, once per iteration the others still run: it performs this optimizer's
-- step -- the local step over whatever gradients this rank holds (as PyTorch, the
-- gradients must be set before it runs; parameters without a .grad are not updated) and
-- the broadcasts of every rank's parameters -- so the broadcasts of the ranks still
-- stepping find their peers (with partition = "elements", the all-gathers; a joined rank
-- without gradients leaves its range as it is). Unlike PyTorch's, whose main_hook calls step() and so
-- notifies the join context from a rank that has joined, it skips the notification: the
-- Join's own presence all-reduce stands for it on a joined rank, so the collectives match
-- whether or not this optimizer is the first joinable. opts (the Join's keyword options)
-- are not used. No post_hook.
function ZeRO:join_hook(opts)
  local _ = opts
  return { main_hook = function() self:_step() end }
end

--- opt:join_device() -> the device ordinal the Join's collectives run on: the parameters'
-- (-1 for the CPU).
function ZeRO:join_device() return self._device end

--- opt:join_process_group() -> the process group (a ddplua.distributed group object).
function ZeRO:join_process_group() return self.process_group end

-- ---- introspection --------------------------------------------------------------------------

--- opt:_partition_parameters() -> partition[r + 1][g]: the parameters of group g owned by
-- group rank r (Note [ZeRO partition]; PyTorch's name). With partition = "elements": the
-- parameters with elements in rank r's range (a cut one under each rank it spans).
function ZeRO:_partition_parameters() return self._partition end

--- opt:_owner(p) -> the group rank that owns parameter p (nil when p is not one of ours).
-- With partition = "elements": first, last, the ranks holding p's first and last element.
function ZeRO:_owner(p)
  if self._elements then return self._elements:owners(p) end
  return self._rank_of[address(p)]
end

function ZeRO:__tostring()
  return ("%s(%s, rank %d of %d)"):format(NAME, self.optimizer_class.name, self.rank, self.world_size)
end

return ZeRO
