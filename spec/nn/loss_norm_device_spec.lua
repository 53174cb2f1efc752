-- Specs for the losses, batch/layer norm, dropout and embedding on a device: each case of
-- spec/fixtures/loss_norm_device.lua runs in a child luajit (the CUDA plug-in is probed
-- once per process).
--
-- On the simulated device (build/libddplua_cuda_sim.so: host memory, the CPU kernels) the
-- device paths of runtime/ops/loss.c and runtime/ops/norm.c must give the CPU's values and
-- gradients bit for bit, keep every result on cuda:0, and name both devices when the
-- arguments are on different ones. The second block runs the CUDA kernels of loss.cu and
-- norm.cu on the host under an emulation of CUDA blocks against the CPU kernels
-- (spec/fixtures/lossnorm_emulation.cc), the third the cases below through the front doors
-- with those emulated kernels in the simulated device's table. The `cuda` block runs the
-- same cases on a real GPU (runtime/backend/cuda/loss.cu and norm.cu against the CPU
-- kernels, within tolerances); it skips with a message where there is none.
local files = require "files"

local root = os.getenv("PWD") or "."
local sim = root .. "/build/libddplua_cuda_sim.so"
local cases = { "cross_entropy", "nll_mse", "loss_errors", "batch_norm", "layer_norm", "dropout", "embedding" }

local function run_case(case, mode, plugin, device)
  local env = plugin and ("DDPLUA_CUDA_PLUGIN=" .. files.quote(plugin) .. " ") or ""
  return files.run(env .. "luajit spec/fixtures/loss_norm_device.lua " .. case .. " " .. mode ..
    " " .. (device or 0))
end

describe("losses and norms on the simulated device", function()
  for _, case in ipairs(cases) do
    it(case .. " matches the CPU exactly, results stay on cuda:0", function()
      local status, out = run_case(case, "exact", sim)
      assert.equal(0, status, out)
      assert.truthy(out:find("ok " .. case .. " %(%d+ checks, cuda%-sim, cuda:0%)"), out)
    end)
  end
  -- the second simulated device: outputs, statistics and gradients stay on cuda:1
  for _, case in ipairs { "cross_entropy", "batch_norm", "layer_norm", "embedding" } do
    it(case .. " on cuda:1 stays on cuda:1", function()
      local status, out = run_case(case, "exact", sim, 1)
      assert.equal(0, status, out)
      assert.truthy(out:find("ok " .. case .. " %(%d+ checks, cuda%-sim, cuda:1%)"), out)
    end)
  end
end)

describe("loss and norm CUDA kernels under host emulation", function()
  -- runtime/backend/cuda/loss.cu and norm.cu compiled for the host with every CUDA thread a
  -- host thread (spec/fixtures/cuda_block_emulation.h), against the CPU kernels on random
  -- inputs (spec/fixtures/lossnorm_emulation.cc): every kernel, every launch form (warp and
  -- thread per sample, capped forward grids, channel and row blocks, 2D tiles, atomics),
  -- index arithmetic and tree reductions (not GPU timing, memory model or math library)
  it("give the CPU kernels' results for every launch form", function()
    local dir = files.tmpdir("lossnorm-emul")
    finally(function() files.remove(dir) end)
    local exe = dir .. "/lossnorm_emulation"
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -Iruntime/include -Iruntime "
      .. "-Ispec/fixtures spec/fixtures/lossnorm_emulation.cc -o %s -Lbuild -lddplua "
      .. "-Wl,-rpath,%s"):format(os.getenv("CXX") or "c++", files.quote(exe),
        files.quote(root .. "/build")))
    assert.are.equal(0, status, out)
    status, out = files.run(files.quote(exe))
    assert.are.equal(0, status, out)
    assert.matches("%d+ checks, 0 failed", out)
  end)
end)

describe("losses and norms through the emulated CUDA kernels", function()
  -- the simulated device with its loss and norm kernels replaced by loss.cu and norm.cu
  -- under the block emulation (spec/fixtures/lossnorm_emulation.cc built as a plug-in): the
  -- front doors, their backward passes and the CUDA kernels together, within tolerances
  it("give the CPU's values and gradients in every case", function()
    local dir = files.tmpdir("lossnorm-emul-plugin")
    finally(function() files.remove(dir) end)
    local so = dir .. "/lossnorm_emulation.so"
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -fPIC -shared "
      .. "-DLOSSNORM_EMULATION_PLUGIN -Iruntime/include -Iruntime -Ispec/fixtures "
      .. "spec/fixtures/lossnorm_emulation.cc -o %s -Lbuild -lddplua -ldl -Wl,-rpath,%s")
      :format(os.getenv("CXX") or "c++", files.quote(so), files.quote(root .. "/build")))
    assert.are.equal(0, status, out)
    for _, case in ipairs(cases) do
      status, out = files.run(("DDPLUA_SIM_PLUGIN=%s DDPLUA_CUDA_PLUGIN=%s luajit "
        .. "spec/fixtures/loss_norm_device.lua %s close 0"):format(files.quote(sim), files.quote(so),
          case))
      assert.equal(0, status, out)
      assert.truthy(out:find("ok " .. case .. " %(%d+ checks, cuda%-emulated, cuda:0%)"), out)
    end
  end)
end)

describe("loss and norm CUDA kernels against the CPU #cuda", function()
  -- Is a real GPU there? Asked in a child, so this process never loads the plug-in.
  local status, probe = files.run([[luajit -e 'package.path = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;" .. package.path
    local lib = require "ddplua.lib"
    local C, ffi = lib.C, lib.ffi
    if C.ddp_cuda_is_available() == 0 then print("none: " .. ffi.string(C.ddp_cuda_unavailable_reason()))
    else print("backend: " .. ffi.string(C.ddp_cuda_backend_name())) end']])
  local gpu = status == 0 and probe:match("backend: cuda\n") ~= nil
  for _, case in ipairs(cases) do
    it(case .. " on a GPU", function()
      if not gpu then
        pending(("skipped %s: no GPU (%s)"):format(case, (probe:gsub("%s+$", ""))))
        return
      end
      local run_status, out = run_case(case, "close", nil)
      assert.equal(0, run_status, out)
      assert.truthy(out:find("ok " .. case .. " %(%d+ checks, cuda, cuda:0%)"), out)
    end)
  end
end)
