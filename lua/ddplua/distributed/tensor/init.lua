--- ddplua.distributed.tensor: DTensor, after torch.distributed.tensor.
--
--   local dt = require "ddplua.distributed.tensor"
--   local mesh = dist.init_device_mesh("cpu", {2}, {mesh_dim_names = {"tp"}})
--   local w = dt.distribute_tensor(weight, mesh, {dt.Shard(1)})    -- rows cut in two
--   local y = dt.ops.linear(dt.DTensor.from_local(x, mesh, {dt.Replicate()}), w)  -- Shard(-1)
--   y:full_tensor()
--
-- Placements (Shard, Replicate, Partial) are ddplua.distributed.tensor.placement_types;
-- the sharding rules are ddplua.distributed.tensor.ops; gradients follow Note [DTensor
-- gradients] (ddplua.distributed.tensor._collectives).
local placement_types = require "ddplua.distributed.tensor.placement_types"
local DTensor = require "ddplua.distributed.tensor.dtensor"
local ops = require "ddplua.distributed.tensor.ops"

return {
  DTensor = DTensor,
  Shard = placement_types.Shard,
  Replicate = placement_types.Replicate,
  Partial = placement_types.Partial,
  distribute_tensor = DTensor.distribute_tensor,
  is_dtensor = DTensor.is_dtensor,
  ops = ops,
}
