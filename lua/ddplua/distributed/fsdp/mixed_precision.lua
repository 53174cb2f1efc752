--- ddplua.distributed.fsdp.mixed_precision: MixedPrecisionPolicy, fully_shard's mp_policy (as
-- PyTorch's torch.distributed.fsdp.MixedPrecisionPolicy).
--
--   fsdp.fully_shard(model, {mp_policy = fsdp.MixedPrecisionPolicy{param_dtype = "bf16",
--     reduce_dtype = "f32"}})
--
-- param_dtype: the dtype parameters are all-gathered in and the forward and backward compute
-- in (the module's floating tensor arguments are cast to it); nil: the parameters' own.
-- reduce_dtype: the dtype gradients are reduce-scattered in (nil: param_dtype). The shards,
-- their .grad and the optimizer's state stay in the parameters' own dtype.
local lib = require "ddplua.lib"

local MixedPrecisionPolicy = {}
MixedPrecisionPolicy.__index = MixedPrecisionPolicy

local FLOATING = { f32 = true, f64 = true, f16 = true, bf16 = true }

local function dtype_arg(v, name)
  if v == nil then return nil end
  if not FLOATING[v] then
    lib.raise(("MixedPrecisionPolicy: %s must be a floating dtype name (f32, f64, f16, bf16), got %s"):format(
      name, tostring(v)))
  end
  return v
end

--- MixedPrecisionPolicy{param_dtype =, reduce_dtype =} -> a policy (fields as given). Raises
-- for a field that is not a floating dtype name or an unknown field.
setmetatable(MixedPrecisionPolicy, { __call = function(_, t)
  t = t or {}
  for k in pairs(t) do
    if k ~= "param_dtype" and k ~= "reduce_dtype" then
      lib.raise(("MixedPrecisionPolicy: unknown field '%s' (param_dtype, reduce_dtype)"):format(tostring(k)))
    end
  end
  return setmetatable({ param_dtype = dtype_arg(t.param_dtype, "param_dtype"),
    reduce_dtype = dtype_arg(t.reduce_dtype, "reduce_dtype") }, MixedPrecisionPolicy)
end })

--- MixedPrecisionPolicy.is_policy(v) -> true for a policy made by MixedPrecisionPolicy{...}.
function MixedPrecisionPolicy.is_policy(v) return getmetatable(v) == MixedPrecisionPolicy end

return MixedPrecisionPolicy
