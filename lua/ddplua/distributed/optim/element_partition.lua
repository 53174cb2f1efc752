--- ddplua.distributed.optim.ElementPartition: the element-wise partition behind
-- ZeroRedundancyOptimizer's `partition = "elements"` (Note [ZeRO element partition]). The
-- idea is DeepSpeed's ZeRO stage 1 (deepspeed/runtime/zero/stage_1_and_2.py: each param
-- group flattened and padded, cut into equal per-rank partitions, each rank stepping its
-- flat partition whose .grad is the matching slice of the gradients, the partitions then
-- all-gathered) and PyTorch FSDP's flat parameters (torch/distributed/fsdp/_flat_param.py,
-- padded to a multiple of the world size); it is written here from that description.
--
-- One instance per optimizer: ZeroRedundancyOptimizer calls add_group once per param group
-- (in order), hands local_params(g) to its local optimizer, and around each local step
-- calls check_grads, load and gather; state_of / cut translate optimizer states between the
-- flat shards and the plain per-parameter layout.
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"

local ffi = lib.ffi
local raise = lib.raise
local is_tensor = tensor.is_tensor

local NAME = "ZeroRedundancyOptimizer"

local M = {}
M.__index = M

local function dist() return require "ddplua.distributed.distributed_c10d" end
local function dl() return require "ddplua.functions" end

-- Address of a tensor handle's C object: two handles of one tensor give the same key.
local function address(p) return tonumber(ffi.cast("intptr_t", p)) end

-- Note [ZeRO element partition]: the parameters of each param group are laid end to end in
-- group order (parameter i's elements, row-major, at offsets [o_i, o_i + n_i) of a virtual
-- flat vector of N = sum n_i elements). With W ranks, each rank owns a contiguous range of
-- L = ceil(N / W) elements: group rank r owns [r L, (r + 1) L); the last ranks' ranges end
-- in padding (W L - N < W elements, beyond N) and a rank may own padding only. A parameter
-- may be cut between ranks. Each rank keeps its range as ONE flat leaf tensor (L) per group
-- (the "shard"), which its local optimizer steps as its only parameter of that group, so
-- the optimizer state (Adam's exp_avg, exp_avg_sq) is (L) per group: N / W elements plus
-- at most one of padding per state tensor. The groups are flattened separately because
-- each has its own options (lr, weight decay, ...), which the local optimizer applies per
-- group; all parameters share one dtype and device (ZeroRedundancyOptimizer checks it), so
-- no further split by dtype is needed.
--
-- A step: check_grads (each group's parameters all have a .grad or none has: the shard is
-- stepped as a whole, with one step count), load (the shard takes the current values of
-- its range from the parameters -- so a change made to the parameters between steps is
-- kept -- and a fresh (L) gradient buffer takes the gradients' slices, zero on the padding,
-- as the shard's .grad), the local optimizer's step, gather (the shard's .grad dropped and
-- its buffer freed; every group's shard all-gathered into a fresh (W, L) buffer, submitted
-- together then waited for, each wait bounded by the group's timeout; every parameter
-- copied out of it; the buffer freed). Only the shards persist between steps, so the extra
-- memory outside a step is N / W elements per group; during it, N + N / W more.
--
-- Bitwise equality with the plain optimizer needs an element-wise update: element k of the
-- new parameter depends only on element k of the parameter, gradient and state (and on the
-- group's options and the step count, which are the same for the whole group). SGD (with
-- momentum, Nesterov, weight decay), Adam, AdamW and Adadelta are; an update with a norm or
-- a sum over the parameter (LAMB's trust ratio, Adafactor's factored moments) is not, and
-- ZeroRedundancyOptimizer refuses such a class in this mode. The padding is harmless for
-- these updates: zero parameter, gradient and state stay zero (Adam: 0 / (sqrt(0) + eps)).

--- ElementPartition.layout(params, world) -> {numel = N, shard = L, entries = {{p =, offset
-- =, numel =}, ...}}: where each parameter of a group lies in the group's flat order
-- (offsets count elements from 0) and the per-rank shard length L = ceil(N / world) (Note
-- [ZeRO element partition]).
function M.layout(params, world)
  local entries, n = {}, 0
  for i, p in ipairs(params) do
    local k = p:numel()
    entries[i] = { p = p, offset = n, numel = k }
    n = n + k
  end
  return { numel = n, shard = math.ceil(n / world), entries = entries }
end

--- ElementPartition.pieces(layout, r) -> the parts of parameters in group rank r's range,
-- in flat order: {entry = i (index in layout.entries), p =, param_start = first element in
-- p (from 0, row-major), shard_start = first element in the shard (from 0), numel =}.
function M.pieces(layout, r)
  local L = layout.shard
  local first, last = r * L, (r + 1) * L
  local out = {}
  for i, e in ipairs(layout.entries) do
    local lo, hi = math.max(e.offset, first), math.min(e.offset + e.numel, last)
    if lo < hi then
      out[#out + 1] = { entry = i, p = e.p, param_start = lo - e.offset, shard_start = lo - first, numel = hi - lo }
    end
  end
  return out
end

--- ElementPartition.new{world =, rank =, device =, dtype =, process_group =}: an empty
-- partition for group rank `rank` of a group of `world` ranks; shards are made on `device`
-- (ordinal, -1 for the CPU) with `dtype` (the parameters' dtype name).
function M.new(opts)
  return setmetatable({
    world = opts.world, rank = opts.rank, device = opts.device, dtype = opts.dtype,
    process_group = opts.process_group, groups = {},
  }, M)
end

-- The factory options for a tensor on this partition's device.
function M:_factory(requires_grad)
  return { dtype = self.dtype, device = self.device >= 0 and self.device or nil, requires_grad = requires_grad }
end

--- part:add_group(params) -> the layout of a new param group (the next index): its entries,
-- this rank's pieces and, when the group has elements, its shard (`tensor`, a leaf (L)
-- requiring grad, zeros until the first load; `data`, the same storage outside autograd).
function M:add_group(params)
  local layout = M.layout(params, self.world)
  layout.pieces = M.pieces(layout, self.rank)
  if layout.shard > 0 then
    layout.tensor = dl().zeros({ layout.shard }, self:_factory(true))
    layout.data = layout.tensor:detach()
  end
  self.groups[#self.groups + 1] = layout
  return layout
end

--- part:local_params(g) -> the local optimizer's parameters for group g: {shard}, or {}
-- when the group has no elements.
function M:local_params(g)
  local t = self.groups[g].tensor
  return t and { t } or {}
end

--- part:touched() -> touched[r + 1][g]: the parameters of group g with elements in group
-- rank r's range (a cut parameter is listed under every rank it spans).
function M:touched()
  local out = {}
  for r = 1, self.world do
    out[r] = {}
    for g, layout in ipairs(self.groups) do
      local list = {}
      for i, pc in ipairs(M.pieces(layout, r - 1)) do list[i] = pc.p end
      out[r][g] = list
    end
  end
  return out
end

--- part:owners(p) -> first, last: the group ranks holding p's first and last element (nil
-- when p is not in any group, or has no elements).
function M:owners(p)
  local key = address(p)
  for _, layout in ipairs(self.groups) do
    for _, e in ipairs(layout.entries) do
      if address(e.p) == key then
        if e.numel == 0 then return nil end
        local L = layout.shard
        return math.floor(e.offset / L), math.floor((e.offset + e.numel - 1) / L)
      end
    end
  end
  return nil
end

-- ---- the step --------------------------------------------------------------------------------

--- part:check_grads() -> has[g] (true: group g's parameters have gradients). Raises, naming
-- the group and two parameters, when some parameters of a group have a .grad and others
-- do not (the shard is stepped as one tensor with one step count; Note [ZeRO element
-- partition]). Every rank holds every parameter, so ranks with the same gradients decide
-- alike.
function M:check_grads()
  local has = {}
  for g, layout in ipairs(self.groups) do
    local with, without
    for i, e in ipairs(layout.entries) do
      if e.p.grad ~= nil then with = with or i else without = without or i end
    end
    if with and without then
      raise(("%s: partition = \"elements\" steps each param group as one flat tensor, so all parameters of a " ..
        "group need a .grad or none: in param group %d, parameter %d has one and parameter %d has none " ..
        "(give the unused ones a zero gradient, or use partition = \"parameters\")"):format(NAME, g, with, without))
    end
    has[g] = with ~= nil
  end
  return has
end

--- part:load(has): before the local step, copy the current values of this rank's range into
-- each shard and, for each group g with has[g], the gradients' slices into a fresh (L)
-- buffer (zero on the padding) set as the shard's .grad (Note [ZeRO element partition]).
function M:load(has)
  dl().no_grad(function()
    for g, layout in ipairs(self.groups) do
      if layout.tensor then
        local buf = has[g] and dl().zeros({ layout.shard }, self:_factory(false)) or nil
        for _, pc in ipairs(layout.pieces) do
          local a, n = pc.param_start + 1, pc.numel
          layout.data:narrow(1, pc.shard_start + 1, n):copy_(pc.p:reshape({ -1 }):narrow(1, a, n))
          if buf then buf:narrow(1, pc.shard_start + 1, n):copy_(pc.p.grad:reshape({ -1 }):narrow(1, a, n)) end
        end
        layout.tensor.grad = buf
        layout.grad_buffer = buf
      end
    end
  end)
end

--- part:gather(): after the local step, drop each shard's gradient buffer, all-gather every
-- group's shard (an equal-length all_gather into a (world, L) buffer per group, all
-- submitted, then all waited for) and copy every parameter out of its group's buffer.
-- Collective over the process group. Raises as the collectives do (e.g. on a timeout).
function M:gather()
  local d = dist()
  local opts = { group = self.process_group, async_op = true }
  local works, outs = {}, {}
  for g, layout in ipairs(self.groups) do
    if layout.tensor then
      layout.tensor.grad = nil
      if layout.grad_buffer then layout.grad_buffer:free(); layout.grad_buffer = nil end
      local out = dl().empty({ self.world, layout.shard }, self:_factory(false))
      works[#works + 1] = d.all_gather(out, layout.data, opts)
      outs[g] = out
    end
  end
  for _, w in ipairs(works) do w:wait() end
  dl().no_grad(function()
    for g, out in pairs(outs) do
      local flat = out:view({ self.world * self.groups[g].shard })
      for _, e in ipairs(self.groups[g].entries) do
        if e.numel > 0 then
          local piece = flat:narrow(1, e.offset + 1, e.numel)
          local src = piece:view(e.p:size())
          e.p:copy_(src)
          src:free()
          piece:free()
        end
      end
      flat:free()
      out:free()
    end
  end)
end

-- ---- states ----------------------------------------------------------------------------------

-- The group ranks whose ranges hold entry e's elements (for an empty parameter: the rank at
-- its offset, so its state still comes from one rank).
local function ranks_of(e, L, world)
  if e.numel == 0 then
    local r = math.min(math.floor(e.offset / L), world - 1)
    return r, r
  end
  return math.floor(e.offset / L), math.floor((e.offset + e.numel - 1) / L)
end

-- "a" == "b" for state values that are not tensors (numbers, booleans, strings).
local function same_plain(a, b) return a == b end

--- ElementPartition.state_of(layout, rank_states, g, world) -> states[i]: the per-parameter
-- optimizer state of each entry of group g (nil where none), reassembled from the ranks'
-- shard states: rank_states[r + 1] is group rank r's local state of group g's shard (step,
-- (L) tensors), or nil. Tensors are cut from the ranks' (L) tensors, joined and shaped as
-- the parameter (on the shards' device: CPU after consolidation); other values (step) are
-- taken from the first rank. Raises when the ranks holding a parameter disagree (one has
-- state, another none; different steps or keys).
function M.state_of(layout, rank_states, g, world)
  local L = layout.shard
  local states = {}
  for i, e in ipairs(layout.entries) do
    if L > 0 then
      local first, last = ranks_of(e, L, world)
      local have, lacking
      for r = first, last do
        if rank_states[r + 1] ~= nil then have = have or r else lacking = lacking or r end
      end
      if have and lacking then
        raise(("%s: parameter %d of param group %d spans ranks %d to %d, and rank %d has optimizer state for " ..
          "it but rank %d has none (were their steps different?)"):format(NAME, i, g, first, last, have, lacking))
      end
      if have then
        local ref = rank_states[first + 1]
        local st, parts = {}, {}
        for k, v in pairs(ref) do
          if is_tensor(v) then parts[k] = {} else st[k] = v end
        end
        for r = first, last do
          local rs = rank_states[r + 1]
          local lo = math.max(e.offset, r * L)
          local hi = math.min(e.offset + e.numel, (r + 1) * L)
          for k, v in pairs(rs) do
            if is_tensor(v) ~= (parts[k] ~= nil) or (not is_tensor(v) and not same_plain(v, st[k])) then
              raise(("%s: parameter %d of param group %d: the states of ranks %d and %d differ in %s"):format(
                NAME, i, g, first, r, tostring(k)))
            end
            if is_tensor(v) and hi > lo then
              local list = parts[k]
              list[#list + 1] = v:narrow(1, lo - r * L + 1, hi - lo)
            end
          end
          for k in pairs(parts) do
            if rs[k] == nil then
              raise(("%s: parameter %d of param group %d: rank %d's state has no %s"):format(NAME, i, g, r, tostring(k)))
            end
          end
        end
        for k, list in pairs(parts) do
          local joined
          if #list == 0 then
            joined = dl().zeros(e.p:size(), { dtype = ref[k]:type() })
          else
            joined = (#list == 1 and list[1]:clone() or dl().cat(list, 1)):reshape(e.p:size())
          end
          st[k] = joined
        end
        states[i] = st
      end
    end
  end
  return states
end

--- part:cut(g, states) -> this rank's shard state for group g (nil for none) from states[i],
-- the per-parameter states of group g's entries (checked for shape and step by the
-- caller): each tensor becomes an (L) tensor holding this rank's range (on the shard's
-- device; floating state in the parameters' dtype, as Optimizer:load_state_dict), zero on
-- the padding; other values are kept. Raises, on every rank alike, when some parameters of
-- the group have state and others none, or their steps, other values or tensor keys
-- differ (one shard has one step count and one set of tensors).
function M:cut(g, states)
  local layout = self.groups[g]
  local ref_i, ref, lacking
  for i in ipairs(layout.entries) do
    if states[i] ~= nil then ref_i = ref_i or i; ref = ref or states[i] else lacking = lacking or i end
  end
  if ref == nil then return nil end
  if lacking then
    raise(("%s: partition = \"elements\" keeps one state per param group: in the loaded state, parameter %d " ..
      "of param group %d has state and parameter %d has none"):format(NAME, ref_i, g, lacking))
  end
  for i in ipairs(layout.entries) do
    local st = states[i]
    for k, v in pairs(st) do
      local rv = ref[k]
      local bad = rv == nil or is_tensor(v) ~= is_tensor(rv)
      if not bad and not is_tensor(v) then
        local a = k == "step" and is_tensor(v) and v:item() or v
        local b = k == "step" and is_tensor(rv) and rv:item() or rv
        bad = a ~= b
      end
      if bad then
        raise(("%s: partition = \"elements\" keeps one state per param group: in the loaded state, parameters " ..
          "%d and %d of param group %d differ in %s (%s and %s)"):format(NAME, ref_i, i, g, tostring(k),
          is_tensor(rv) and "a tensor" or tostring(rv), is_tensor(v) and "a tensor" or tostring(v)))
      end
    end
    for k in pairs(ref) do
      if st[k] == nil then
        raise(("%s: partition = \"elements\" keeps one state per param group: in the loaded state, parameter %d " ..
          "of param group %d has %s and parameter %d has none"):format(NAME, ref_i, g, tostring(k), i))
      end
    end
  end
  if layout.tensor == nil then return nil end
  local out = {}
  for k, v in pairs(ref) do
    if k == "step" and is_tensor(v) and v:numel() == 1 then
      out[k] = v:item()
    elseif is_tensor(v) then
      local factory = self:_factory(false)
      if not v:is_floating_point() then factory.dtype = v:type() end
      local t = dl().zeros({ layout.shard }, factory)
      dl().no_grad(function()
        for _, pc in ipairs(layout.pieces) do
          local v_i = states[pc.entry][k]
          if v_i.device ~= t.device then v_i = v_i:to(t.device) end
          local src = v_i:reshape({ -1 }):narrow(1, pc.param_start + 1, pc.numel)
          t:narrow(1, pc.shard_start + 1, pc.numel):copy_(src)
        end
      end)
      out[k] = t
    else
      out[k] = v
    end
  end
  return out
end

return M
