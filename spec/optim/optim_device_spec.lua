-- Specs of the optimizer updates and gradient clipping on devices (runtime/ops/optim.c,
-- runtime/backend/cuda/optim.cu). The cases (optim_device_cases.lua) run every update on
-- CPU tensors and on copies on a device and compare.
--  - On the simulated device (a child luajit with DDPLUA_CUDA_PLUGIN; its kernels are the
--    CPU's): the device paths of the ops layer (dispatch, state and work copies on the
--    param's device, mixed-device errors) with results identical to the CPU's.
--  - The CUDA kernels of runtime/backend/cuda/optim.cu compiled for the host under an
--    emulation of CUDA blocks (spec/fixtures/optimshape_emulation.cc), against the CPU's.
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

describe("CUDA optimizer and clipping kernels under host emulation", function()
  -- runtime/backend/cuda/optim.cu (SGD, Adam/AdamW/amsgrad, Adadelta, abs_pow_sum, abs_max,
  -- scale, clamp)
  -- compiled for the host with every CUDA thread a host thread or, for kernels whose threads
  -- do not cooperate, run in turn (spec/fixtures/cuda_block_emulation.h), against the CPU
  -- kernels (spec/fixtures/optimshape_emulation.cc, its "optim" part): index arithmetic,
  -- launch geometry, grid-stride tails, branches and atomics (not GPU timing or math)
  local files = require "files"
  it("give the CPU kernels' results for every branch and launch form", function()
    local dir = files.tmpdir("optimshape-emul")
    finally(function() files.remove(dir) end)
    local exe = dir .. "/optimshape_emulation"
    local pwd = io.popen("pwd")
    local root = pwd:read("*l")
    pwd:close()
    local cuda_include = (os.getenv("CUDA_HOME") or "/usr/local/cuda") .. "/include"
    local probe = io.open(cuda_include .. "/cuda_fp16.h")
    if not probe then
      pending("skipped: no CUDA toolkit headers in " .. cuda_include .. " (set CUDA_HOME)")
      return
    end
    probe:close()
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -I%s -Iruntime/include "
      .. "-Iruntime -Ispec/fixtures spec/fixtures/optimshape_emulation.cc -o %s -Lbuild "
      .. "-lddplua -Wl,-rpath,%s"):format(os.getenv("CXX") or "c++", files.quote(cuda_include),
      files.quote(exe), files.quote(root .. "/build")))
    assert.are.equal(0, status, out)
    status, out = files.run(files.quote(exe) .. " optim")
    assert.are.equal(0, status, out)
    assert.matches("%d+ checks, 0 failed", out)
  end)
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
