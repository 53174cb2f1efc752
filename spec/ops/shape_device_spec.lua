-- Specs of the shape and indexing ops on devices (runtime/ops/shape.c,
-- runtime/backend/cuda/shape.cu): index_select, gather, scatter_add, cat, stack (forward and
-- backward), views, index checks and mixed-device errors. The cases
-- (shape_device_cases.lua) run every op on CPU tensors and on copies on a device and compare.
--  - On the simulated device (a child luajit with DDPLUA_CUDA_PLUGIN; its kernels are the
--    CPU's): the device paths of the ops layer, with results identical to the CPU's.
--  - Tagged #cuda, on a real GPU (skipped otherwise): the same cases in this process, the
--    CUDA kernels against the CPU.
local sim = require "sim_cases"

local CASES = "spec/ops/shape_device_cases.lua"

describe("shape and indexing ops on the simulated device", function()
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

describe("shape and indexing ops on a real GPU #cuda", function()
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
