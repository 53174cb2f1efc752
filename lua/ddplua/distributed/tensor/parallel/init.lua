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

--- param_spec(p) -> {mesh, placements, shape, fused} for a parameter tensor parallelize_module
-- cut (Note [parallel parameters]), else nil.
function M.param_spec(p) return style.specs[p] end

--- specs_by_name(module) -> name -> spec for every cut parameter of module, by its state_dict
-- name ("transformer.h.0.attn.c_attn.weight"); both names of a tied parameter.
function M.specs_by_name(module)
  local out = {}
  for prefix, sub in module:named_modules() do
    local specs = style.module_specs[sub]
    if specs then
      for name, spec in pairs(specs) do out[(prefix == "" and "" or prefix .. ".") .. name] = spec end
    end
  end
  return out
end

--- full_tensor(t, spec) -> the whole tensor (new) from this rank's piece t of a parameter cut
-- as spec says (param_spec); collective over spec.mesh. Returns t itself when spec
-- is nil and t was not cut. full_tensor(p) takes p's own spec.
function M.full_tensor(t, spec)
  spec = spec or style.specs[t]
  if not spec then return t end
  return dl.no_grad(function()
    if not spec.fused then
      return DTensor.from_local(t:detach(), spec.mesh, spec.placements, { shape = spec.shape }):full_tensor()
    end
    local d = spec.placements[1].dim
    local block_shape = { unpack(spec.shape) }
    block_shape[d] = block_shape[d] / spec.fused
    local parts = {}
    for b, piece in ipairs(t:detach():chunk(spec.fused, d)) do
      parts[b] = DTensor.from_local(piece:contiguous(), spec.mesh, { placement_types.Shard(d) },
        { shape = block_shape }):full_tensor()
    end
    return dl.cat(parts, d)
  end)
end

--- full_state_dict(module[, sd]) -> a state dict (name -> tensor) of module with every cut
-- parameter whole: the state dict of the module before parallelize_module, for checkpoints
-- and comparisons. sd: the tensor-parallel pieces by name (default module:state_dict(); give
-- FSDP's full state dict, fsdp.get_model_state_dict(model, {full_state_dict = true}), when FSDP shards the pieces
-- further). Collective over the tp mesh (every rank calls it; names in sorted order).
function M.full_state_dict(module, sd)
  sd = sd or module:state_dict()
  local specs = M.specs_by_name(module)
  local names = {}
  for name in pairs(sd) do names[#names + 1] = name end
  table.sort(names)
  local out = {}
  for _, name in ipairs(names) do
    out[name] = specs[name] and M.full_tensor(sd[name], specs[name]) or sd[name]
  end
  return out
end

return M
