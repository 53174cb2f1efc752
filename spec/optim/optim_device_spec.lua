-- Specs of the optimizer updates and gradient clipping on devices (runtime/ops/optim.c,
-- runtime/backend/cuda/optim.cu). The cases (optim_device_cases.lua) run every update on
-- CPU tensors and on copies on a device and compare.
--  - On the simulated device (a child luajit with DDPLUA_CUDA_PLUGIN; its kernels are the
--    CPU's): the device paths of the ops layer (dispatch, state and work copies on the
--    param's device, mixed-device errors) with results identical to the CPU's.
--  - Tagged #cuda, on a real GPU (skipped otherwise): the same cases in this process, the
--    CUDA kernels against the CPU within rounding tolerances.
local sim = require "sim_cases"

local CASES = "spec/optim/optim_device_cases.lua"

describe("optimizers on the simulated device", function()
  local results
  setup(function() results = sim.run_sim(CASES) end)
  for _, name in ipairs(sim.names(CASES)) do
    it(name, function()
      local r = results[name]
      if not r then error("the child did not run this case; its output:\n" .. results[1][2]) end
      if not r[1] then error(r[2]) end
    end)
  end
end)

describe("optimizers on a real GPU #cuda", function()
  local lib = require "ddplua.lib"
  local available = lib.C.ddp_cuda_is_available() ~= 0
  local backend = lib.ffi.string(lib.C.ddp_cuda_backend_name())
  if not available or backend ~= "cuda" then
    pending("no CUDA GPU here (" .. (available and "backend " .. backend
            or lib.ffi.string(lib.C.ddp_cuda_unavailable_reason())) .. "): skipped")
    return
  end
  local results
  setup(function() results = sim.run_here(CASES, false) end)
  for _, name in ipairs(sim.names(CASES)) do
    it(name, function()
      local r = results[name]
      if not r[1] then error(r[2]) end
    end)
  end
end)
