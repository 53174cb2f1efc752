--- ddplua.distributed: process groups and collectives, as torch.distributed.
--
--   local dist = require "ddplua.distributed"
--   dist.init_process_group{backend = "gloo"}          -- env:// from torchrun's variables
--   dist.all_reduce(t, {op = "avg"})                   -- in place, blocking
--   local w = dist.all_reduce(t, {async_op = true})    -- asynchronous: w:wait()
--   dist.destroy_process_group()
--
-- Ranks are data: they count from 0, as in the environment and in PyTorch. `src`/`dst`
-- arguments are global ranks, also with a subgroup (as PyTorch). Tensors: dtypes f32, f64,
-- f16, bf16, i64, i32, u8. Backends: "gloo" takes tensors on any device (CUDA tensors are
-- staged through host memory, as PyTorch's gloo); "nccl" takes contiguous CUDA tensors on the
-- rank's device only, and its work:wait() makes the current stream wait (the host goes on;
-- work:synchronize() blocks the host), as PyTorch. Every collective has a timeout (the group's, default 300 s);
-- a dead peer or a timeout raises an error naming the collective, this rank and, when it can
-- be known, the peer's rank, and aborts the group on every rank (see abort_process_group):
-- pending and later collectives raise naming that first failure.
local c10d = require "ddplua.distributed.distributed_c10d"

-- The package: every function and constant of distributed_c10d (the same functions, so
-- dist.all_reduce == require("ddplua.distributed.distributed_c10d").all_reduce), plus the
-- modules below, loaded on first use.
local M = {}
for k, v in pairs(c10d) do M[k] = v end

--- dist.algorithms.<name>: the modules under ddplua.distributed.algorithms, loaded on first
-- use (dist.algorithms.ddp_comm_hooks.default_hooks, as torch.distributed.algorithms).
M.algorithms = setmetatable({}, { __index = function(t, k)
  local mod = require("ddplua.distributed.algorithms." .. k)
  rawset(t, k, mod)
  return mod
end })

--- dist.DistributedDataParallel(module, opts): the DDP wrapper (ddplua.distributed.ddp),
-- loaded on first use so the process-group module does not depend on nn.
--- dist.spawn(fn, nprocs, opts): torch.multiprocessing.spawn (ddplua.distributed.spawn).
--- dist.init_device_mesh(device_type, mesh_shape, opts) and dist.DeviceMesh: device meshes
-- (ddplua.distributed.device_mesh), after torch.distributed.device_mesh.
--- dist.optim: distributed optimizers, ZeroRedundancyOptimizer (ddplua.distributed.optim).
--- dist.tensor: DTensor and its placements (ddplua.distributed.tensor), dist.tensor.parallel
-- (ddplua.distributed.tensor.parallel), dist.checkpoint (ddplua.distributed.checkpoint), as
-- torch.distributed.tensor, torch.distributed.tensor.parallel, torch.distributed.checkpoint.
--- dist.fsdp: fully sharded data parallel, fully_shard and MixedPrecisionPolicy
-- (ddplua.distributed.fsdp), as torch.distributed.fsdp.
--- dist.elastic: the elastic training state, State{...} with commit / restore / sync
-- (ddplua.distributed.elastic), as horovod.torch.elastic.State.
--- dist.all_gather_object, gather_object, broadcast_object_list, scatter_object_list:
-- collectives of Lua values (ddplua.distributed.objects).
local OBJECT_COLLECTIVES = { all_gather_object = true, gather_object = true,
  broadcast_object_list = true, scatter_object_list = true }
local MODULES = {
  DistributedDataParallel = function() return require "ddplua.distributed.ddp" end,
  spawn = function() return require "ddplua.distributed.spawn" end,
  DistributedSampler = function() return require "ddplua.distributed.sampler" end,
  DeviceMesh = function() return require "ddplua.distributed.device_mesh" end,
  optim = function() return require "ddplua.distributed.optim" end,
  tensor = function()
    local t = require "ddplua.distributed.tensor"
    t.parallel = require "ddplua.distributed.tensor.parallel"
    return t
  end,
  checkpoint = function() return require "ddplua.distributed.checkpoint" end,
  fsdp = function() return require "ddplua.distributed.fsdp" end,
  elastic = function() return require "ddplua.distributed.elastic" end,
}
setmetatable(M, { __index = function(t, k)
  local load = MODULES[k]
  if load then
    local v = load()
    rawset(t, k, v)
    return v
  end
  if k == "init_device_mesh" then -- dist.init_device_mesh: ddplua.distributed.device_mesh's
    local v = require("ddplua.distributed.device_mesh").init_device_mesh
    rawset(t, k, v)
    return v
  end
  if OBJECT_COLLECTIVES[k] then
    local v = require("ddplua.distributed.objects")[k]
    rawset(t, k, v)
    return v
  end
end })

return M
