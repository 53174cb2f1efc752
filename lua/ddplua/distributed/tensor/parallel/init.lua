--- ddplua.distributed.tensor.parallel: tensor parallelism, as torch.distributed.tensor.parallel.
--
--   local tp = require "ddplua.distributed.tensor.parallel"
--   tp.parallelize_module(model, mesh["tp"], {
--     ["mlp.fc1"] = tp.ColwiseParallel(), ["mlp.fc2"] = tp.RowwiseParallel() })
--   tp.full_state_dict(model)         -- every parameter whole (collective over the mesh)
--
-- Styles: ddplua.distributed.tensor.parallel.style; parallelize_module:
-- ddplua.distributed.tensor.parallel.api. loss_parallel(fn) runs fn: cross entropy on
-- class-sharded DTensor logits (F.cross_entropy / DTensor ops) is always the
-- vocabulary-parallel loss in ddplua, so it only marks the region, as PyTorch's context.
local style = require "ddplua.distributed.tensor.parallel.style"
local api = require "ddplua.distributed.tensor.parallel.api"
local DTensor = require "ddplua.distributed.tensor.dtensor"
local placement_types = require "ddplua.distributed.tensor.placement_types"
local dl = require "ddplua.functions"

local M = {
  parallelize_module = api.parallelize_module,
  ColwiseParallel = style.ColwiseParallel,
  RowwiseParallel = style.RowwiseParallel,
  SequenceParallel = style.SequenceParallel,
  PrepareModuleInput = style.PrepareModuleInput,
  PrepareModuleOutput = style.PrepareModuleOutput,
}

--- loss_parallel(fn) -> what fn returns (see above).
function M.loss_parallel(fn) return fn() end

--- param_spec(p) -> {mesh, placements, shape, fused} for a parameter parallelize_module cut
-- (Note [parallel parameters]), else nil.
function M.param_spec(p) return style.specs[p] end

--- full_tensor(p) -> the whole parameter p (a new tensor) from its pieces: collective over
-- the tp mesh when p was cut; p itself when not.
function M.full_tensor(p)
  local spec = style.specs[p]
  if not spec then return p end
  return dl.no_grad(function()
    if not spec.fused then
      return DTensor.from_local(p, spec.mesh, spec.placements, { shape = spec.shape }):full_tensor()
    end
    local d = spec.placements[1].dim
    local block_shape = { unpack(spec.shape) }
    block_shape[d] = block_shape[d] / spec.fused
    local parts = {}
    for b, piece in ipairs(p:chunk(spec.fused, d)) do
      parts[b] = DTensor.from_local(piece:contiguous(), spec.mesh, { placement_types.Shard(d) },
        { shape = block_shape }):full_tensor()
    end
    return dl.cat(parts, d)
  end)
end

--- full_state_dict(module) -> a state dict (name -> tensor) of module with every cut
-- parameter whole: the state dict of the module before parallelize_module, for
-- checkpoints and comparisons. Collective over the tp mesh (every rank calls it).
function M.full_state_dict(module)
  local sd = module:state_dict()
  local names = {}
  for name in pairs(sd) do names[#names + 1] = name end
  table.sort(names) -- the same order on every rank: each cut parameter is one collective
  local out, whole = {}, {}
  for _, name in ipairs(names) do
    local ok, p = pcall(module.get_parameter, module, name)
    if ok and p ~= nil and style.specs[p] then
      whole[p] = whole[p] or M.full_tensor(p) -- a tied parameter is gathered once
      out[name] = whole[p]
    else
      out[name] = sd[name]
    end
  end
  return out
end

return M
