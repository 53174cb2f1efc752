-- The element-wise ops on devices. spec/fixtures/elementwise_device.lua runs them on a device
-- and on the CPU and compares; it runs in a child `luajit` because the CUDA plug-in is
-- probed once per process:
--  - on the simulated device (DDPLUA_CUDA_PLUGIN = build/libddplua_cuda_sim.so: host memory,
--    the CPU kernels): the device paths of the ops layer (dispatch through the kernel
--    table, outputs on the inputs' device, same-device errors naming both devices,
--    scalars kept as scalars, gradients reaching device leaves, seeded random fills
--    equal to the CPU's). Results must equal the CPU's exactly.
--  - on the emulated kernels (build/libddplua_cuda_emul.so, built where nvcc exists: the
--    simulated device with the element-wise entries of runtime/backend/cuda/elementwise.cu
--    compiled for the host, runtime/backend/sim/ew_emulation.cu): that file's geometry,
--    dispatch, host scalars and element code through every front door, within the
--    tolerances below (host libm versus the CPU kernels' own f32 exp/erf).
--  - #cuda, on a real GPU (the default plug-in build/libddplua_cuda.so): the CUDA kernels
--    of runtime/backend/cuda/elementwise.cu against the CPU, within relative error f32
--    1e-5, f64 1e-12, f16 1e-2, bf16 1e-1 (of max(1, |expected|)); integer and bool
--    results exactly. Pending where no GPU is found.
local files = require "files"

local FIXTURE = "spec/fixtures/elementwise_device.lua"

local CHECKS = {
  "binary ops over every dtype pair, broadcast and strided",
  "add and sub with alpha",
  "tensor with a number and a number with a tensor stay scalars",
  "in-place binary ops with tensors and numbers",
  "unary ops over every dtype, contiguous and strided, and in place",
  "where over dtype pairs, numbers and broadcasting",
  "copy_, fill_, zero_, clone and to(dtype) on device tensors",
  "mixed-device arguments raise naming the op and both devices",
  "gradients flow to device leaves",
  "random fills on a device tensor match the CPU's stream",
  "binary and unary ops on random inputs",
}

-- Run the fixture with the environment prefix env; returns its output (memoised per env).
local runs = {}
local function run(env)
  if not runs[env] then
    local status, out = files.run(env .. " luajit " .. FIXTURE)
    runs[env] = { status = status, out = out }
  end
  return runs[env]
end

local function expect_ok(r, name)
  assert.equal(0, r.status, r.out)
  assert.truthy(r.out:find("\ndone\n", 1, true) or r.out:find("^done\n"), "the fixture did not finish:\n" .. r.out)
  local line = r.out:match("\n(FAIL " .. name:gsub("%p", "%%%0") .. "[^\n]*)")
  assert.is_nil(line, line)
  assert.truthy(r.out:find("\nok " .. name .. "\n", 1, true), "no result for '" .. name .. "':\n" .. r.out)
end

describe("element-wise ops on the simulated device", function()
  local env = "DDPLUA_CUDA_PLUGIN=" .. files.quote("./build/libddplua_cuda_sim.so")

  it("runs on the simulated backend", function()
    local r = run(env)
    assert.truthy(r.out:find("backend cuda-sim with 2 devices", 1, true), r.out)
  end)

  for _, name in ipairs(CHECKS) do
    it(name, function() expect_ok(run(env), name) end)
  end
end)

describe("element-wise CUDA kernels compiled for the host (emulated device)", function()
  local lib = "./build/libddplua_cuda_emul.so"
  local env = "DDPLUA_EW_TOL=1 DDPLUA_CUDA_PLUGIN=" .. files.quote(lib)

  it("passes every check of the fixture", function()
    local f = io.open(lib, "rb")
    if not f then
      pending("no " .. lib .. " (built only where nvcc exists)")
      return
    end
    f:close()
    local r = run(env)
    assert.truthy(r.out:find("backend cuda-emulated with 2 devices", 1, true), r.out)
    for _, name in ipairs(CHECKS) do expect_ok(r, name) end
  end)
end)

describe("element-wise CUDA kernels against the CPU #cuda", function()
  it("passes every check of the fixture on a real GPU", function()
    -- the default plug-in (next to libddplua.so); the simulated one must not leak in
    local r = run("DDPLUA_CUDA_PLUGIN= DDPLUA_EW_TOL=1")
    local backend = r.out:match("backend (%S+) with")
    if backend ~= "cuda" then
      pending("no CUDA GPU here (" .. (r.out:match("FAIL setup: ([^\n]*)") or tostring(backend)) .. ")")
      return
    end
    for _, name in ipairs(CHECKS) do expect_ok(r, name) end
  end)
end)
