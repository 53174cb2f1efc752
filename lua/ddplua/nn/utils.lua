--- ddplua.nn.utils: nn.utils, as PyTorch's torch.nn.utils: clip_grad_norm_(params,
-- max_norm, opts) and clip_grad_value_(params, clip_value), re-exported from
-- ddplua.optim.clip_grad (loaded on first use), and parameters_to_vector /
-- vector_to_parameters.
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"

local M = {}

local function clip_grad(name)
  return function(...)
    local ok, mod = pcall(require, "ddplua.optim.clip_grad")
    if not ok or not mod[name] then lib.raise("nn.utils." .. name .. ": ddplua.optim.clip_grad is not available") end
    return mod[name](...)
  end
end

--- nn.utils.clip_grad_norm_(params, max_norm[, opts]) and clip_grad_value_(params, v):
-- see ddplua.optim.clip_grad.
M.clip_grad_norm_ = clip_grad("clip_grad_norm_")
M.clip_grad_value_ = clip_grad("clip_grad_value_")

--- nn.utils.parameters_to_vector(params) -> a 1-d tensor concatenating the parameters
-- (flattened, in list order), cut from the graph.
function M.parameters_to_vector(params)
  local flat = {}
  for i, p in ipairs(params) do flat[i] = p:detach():reshape(-1) end
  if #flat == 0 then lib.raise("nn.utils.parameters_to_vector: empty parameter list") end
  return dl.cat(flat, 1)
end

--- nn.utils.vector_to_parameters(vec, params): copy consecutive slices of the 1-d vec into
-- the parameters (in list order), under no_grad. Raises when the sizes do not add up.
function M.vector_to_parameters(vec, params)
  local total = 0
  for _, p in ipairs(params) do total = total + p:numel() end
  if vec:dim() ~= 1 or vec:numel() ~= total then
    lib.raise(("nn.utils.vector_to_parameters: expected a 1-d vector of %d elements, got shape (%s)"):format(
      total, table.concat(vec:size(), ", ")))
  end
  dl.no_grad(function()
    local offset = 1
    for _, p in ipairs(params) do
      local n = p:numel()
      if n > 0 then p:copy_(vec:narrow(1, offset, n):view(p:size())) end
      offset = offset + n
    end
  end)
end

return M
