--- ddplua.distributed.optim.state_broadcast: broadcast one optimizer state dict -- a plain
-- table of numbers, booleans, strings and tensors, as Optimizer:state_dict() makes -- from
-- one rank to every rank of a group. ZeroRedundancyOptimizer:consolidate_state_dict uses
-- it to bring each rank's shard of the optimizer state to the target rank (the role of
-- _broadcast_object in PyTorch's torch/distributed/optim/zero_redundancy_optimizer.py,
-- which pickles the state dict, tensors included).
--
-- Note [state dict broadcast]: the object collectives (ddplua.distributed.objects) send
-- plain Lua values only, never tensors, and sending a tensor's elements as Lua numbers
-- would cost a double per element through the serialiser. So the source splits the state
-- dict into a skeleton, where each tensor is replaced by a stub {__tensor = k}, and a
-- description of tensor k (its dtype and shape); the skeleton and the descriptions go by
-- broadcast_object_list, then the tensors themselves go as ONE flat tensor per dtype (the
-- dtypes in sorted order, the tensors in stub order), broadcast with the tensor
-- collectives on `device` (the parameters' device: nccl needs its rank's device). Every
-- rank learns the sizes from the skeleton before the flat broadcasts, so all ranks call
-- the same collectives with the same shapes. Received tensors are copies on the CPU, as
-- PyTorch keeps the consolidated state on the CPU to spare device memory.
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"
local C = lib.C

local M = {}

local is_tensor = tensor.is_tensor

local function dist() return require "ddplua.distributed.distributed_c10d" end
local function dl() return require "ddplua.functions" end

-- A copy of v with its tensors replaced by stubs; tensors[k] is the k-th tensor met.
local function skeleton_of(v, tensors)
  if is_tensor(v) then
    tensors[#tensors + 1] = v
    return { __tensor = #tensors }
  end
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = skeleton_of(x, tensors) end
  return out
end

-- v with its stubs replaced by received[k].
local function fill(v, received)
  if type(v) ~= "table" then return v end
  if v.__tensor ~= nil then return received[v.__tensor] end
  local out = {}
  for k, x in pairs(v) do out[k] = fill(x, received) end
  return out
end

-- The dtype names of the descriptions, sorted (the order of the flat broadcasts).
local function dtypes_of(descs)
  local seen, list = {}, {}
  for _, d in ipairs(descs) do
    if not seen[d.dtype] then
      seen[d.dtype] = true
      list[#list + 1] = d.dtype
    end
  end
  table.sort(list)
  return list
end

local function numel_of(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

--- state_broadcast.broadcast(sd, src, group, device) -> the state dict of global rank src,
-- on every rank of group. On src, sd is the table to send (returned as it is); elsewhere sd
-- is ignored and a new table is returned whose tensors are contiguous CPU copies of src's,
-- of the same dtypes and shapes. device: the ordinal (-1 CPU) the flat tensors travel on.
-- Collective: every rank of group calls it with the same src (Note [state dict broadcast]).
-- Raises as the collectives do (a dead peer, a timeout), or on src when sd holds a value
-- the object collectives cannot send (a function, a table with a metatable).
function M.broadcast(sd, src, group, device)
  local d = dist()
  local me_src = d.get_rank() == src
  local tensors = {}
  local msg = { nil, nil }
  if me_src then
    local skel = skeleton_of(sd, tensors)
    local descs = {}
    for k, t in ipairs(tensors) do descs[k] = { dtype = t:type(), shape = t:size() } end
    msg = { skel, descs }
  end
  require("ddplua.distributed.objects").broadcast_object_list(msg, src, { group = group })
  local skel, descs = msg[1], msg[2]
  local received = {}
  for _, dtype in ipairs(dtypes_of(descs)) do
    local members, total = {}, 0
    for k, desc in ipairs(descs) do
      if desc.dtype == dtype then
        members[#members + 1] = k
        total = total + numel_of(desc.shape)
      end
    end
    local flat
    if me_src then
      local parts = {}
      for _, k in ipairs(members) do
        local t = tensors[k]
        if C.ddp_tensor_device(t) ~= device then t = t:to(device < 0 and "cpu" or ("cuda:" .. device)) end
        if t:numel() > 0 then parts[#parts + 1] = t:reshape({ -1 }) end
      end
      if total > 0 then flat = dl().cat(parts, 1) end
    elseif total > 0 then
      flat = dl().empty({ total }, { dtype = dtype, device = device >= 0 and device or nil })
    end
    if total > 0 then d.broadcast(flat, src, { group = group }) end
    if not me_src then
      local host = total > 0 and flat:cpu() or nil
      local offset = 0
      for _, k in ipairs(members) do
        local shape = descs[k].shape
        local n = numel_of(shape)
        if n == 0 then
          received[k] = dl().zeros(shape, { dtype = dtype })
        else
          received[k] = host:narrow(1, offset + 1, n):view(shape):clone()
        end
        offset = offset + n
      end
    end
  end
  if me_src then return sd end
  return fill(skel, received)
end

return M
