--- ddplua.distributed.tensor.parallel.api: parallelize_module, after PyTorch's
-- torch.distributed.tensor.parallel.parallelize_module.
local lib = require "ddplua.lib"
local style = require "ddplua.distributed.tensor.parallel.style"

local raise = lib.raise

local M = {}

-- A Lua pattern matching the module names of a plan key: "." literal, "*" one name part.
local function key_pattern(key)
  local p = key:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", "[^.]+")
  return "^" .. p .. "$"
end

--- parallelize_module(module, device_mesh, parallelize_plan) -> module, its submodules
-- parallelized in place. device_mesh: a 1-D DeviceMesh (the tensor-parallel ranks; slice a
-- larger mesh: mesh["tp"]). parallelize_plan: a style (ColwiseParallel, ...) for module
-- itself, or a table {["name.pattern"] = style} of submodule names as named_modules gives
-- them, "*" standing for one part ("transformer.h.*.mlp.c_fc"), applied in named_modules
-- order. Collective-free. Raises for a mesh of more than one dimension (PyTorch's text), a
-- key that matches no submodule, or a style that does not apply to the module it matches.
function M.parallelize_module(module, mesh, plan)
  local DeviceMesh = require "ddplua.distributed.device_mesh"
  if not DeviceMesh.is_device_mesh(mesh) then
    raise("parallelize_module: device_mesh must be a DeviceMesh, got " .. type(mesh))
  end
  if mesh.ndim ~= 1 then
    raise(("parallelize_module: Tensor Parallel only accepts a 1D DeviceMesh, but found %dD! If you have a 2-D or " ..
           "N-D device_mesh, consider passing in device_mesh[\"tp\"]"):format(mesh.ndim))
  end
  if style.is_style(plan) then
    plan.apply(plan, module, mesh)
    return module
  end
  if type(plan) ~= "table" then raise("parallelize_module: parallelize_plan must be a style or a table of them") end
  local keys = {}
  for k, s in pairs(plan) do
    if type(k) ~= "string" or not style.is_style(s) then
      raise("parallelize_module: parallelize_plan entries must be name = style, got " .. tostring(k))
    end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  local matched = {}
  for name, sub in module:named_modules() do
    for _, k in ipairs(keys) do
      if name:match(key_pattern(k)) then
        plan[k].apply(plan[k], sub, mesh)
        matched[k] = true
      end
    end
  end
  for _, k in ipairs(keys) do
    if not matched[k] then raise(("parallelize_module: no submodule of the module matches '%s'"):format(k)) end
  end
  return module
end

return M
