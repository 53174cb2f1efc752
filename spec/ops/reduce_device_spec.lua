-- Specs for the reductions and softmax on devices (sum, mean, var, std, norm, max/min,
-- argmax/argmin, softmax, log_softmax and their gradients): the checks of
-- spec/fixtures/reduce_device_checks.lua compare each op on a device tensor with the same
-- op on the CPU (results on the input's device, same values within per-dtype tolerances,
-- gradients reaching device leaves, errors for mixed devices).
--
-- The first block runs them on the simulated device (runtime/backend/sim/plugin.c) in a
-- child luajit, since the plug-in is probed once per process: it exercises the ops layer's
-- device paths (kernel table dispatch, outputs and scratch on the device, the front-door
-- forms of the backward passes). The second runs the CUDA kernels of
-- runtime/backend/cuda/reduce.cu on the host under an emulation of CUDA blocks
-- (spec/fixtures/reduce_emulation.cc) against the CPU kernels, for every launch form; the
-- third runs a quick subset of the checks through the front doors with those emulated
-- kernels in the simulated device's table. The last (tag cuda) runs the checks on a real
-- GPU in this process, with large shapes too; it is skipped with a message elsewhere.
local files = require "files"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local LUA_PATH = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;spec/helpers/?.lua;;"

-- Lines "FAIL name: message" of a check run, joined (or "" when all passed).
local function failures(lines)
  local bad = {}
  for _, l in ipairs(lines) do
    if l:match("^FAIL ") then bad[#bad + 1] = l end
  end
  return table.concat(bad, "\n")
end

describe("ops.reduce on the simulated device", function()
  local output

  local function run_child()
    if output then return output end
    local cmd = ("DDPLUA_CUDA_PLUGIN=%s LUA_PATH=%s luajit spec/fixtures/reduce_device_checks.lua")
        :format(files.quote("build/libddplua_cuda_sim.so"), files.quote(LUA_PATH))
    local status, out = files.run(cmd)
    output = { status = status, text = out, lines = {} }
    for l in out:gmatch("[^\n]+") do output.lines[#output.lines + 1] = l end
    return output
  end

  it("runs every check to the end", function()
    local o = run_child()
    assert.are.equal(0, o.status, o.text)
    assert.are.equal("DONE", o.lines[#o.lines], o.text)
    assert.are.equal("BACKEND cuda-sim", o.lines[1], o.text)
    local passed = 0
    for _, l in ipairs(o.lines) do
      if l:match("^PASS ") then passed = passed + 1 end
    end
    assert.is_true(passed > 1000, "only " .. passed .. " checks passed:\n" .. o.text)
  end)

  for _, group in ipairs {
    { "forward results match the CPU on the device", "^%a[%w_]* [fiu]%d+ %(" },
    { "ties and NaN follow the CPU rules", "ties and NaN" },
    { "softmax of NaN rows matches the CPU", "softmax of a NaN row" },
    { "f16 and bf16 go through f32 as on the CPU", "^sum/max/softmax" },
    { "gradients reach device leaves and match the CPU", "^gradient of" },
    { "mixed devices in backward raise, naming both devices", "^mixed devices" },
    { "empty reductions keep the CPU's answers", "^empty reductions" },
    { "results and gradients stay on a second device", "^outputs on the input's device" },
  } do
    it(group[1], function()
      local o = run_child()
      local seen, bad = 0, {}
      for _, l in ipairs(o.lines) do
        local verdict, rest = l:match("^(%u+) (.*)$")
        if (verdict == "PASS" or verdict == "FAIL") and rest:match(group[2]) then
          seen = seen + 1
          if verdict == "FAIL" then bad[#bad + 1] = l end
        end
      end
      assert.is_true(seen > 0, "no check of this group ran:\n" .. failures(o.lines) .. "\n" .. o.text:sub(1, 2000))
      assert.are.equal("", table.concat(bad, "\n"))
    end)
  end
end)

describe("CUDA reduce kernels under host emulation", function()
  -- runtime/backend/cuda/reduce.cu compiled for the host with every CUDA thread a host
  -- thread (spec/fixtures/cuda_block_emulation.h), against the CPU kernels: launch forms,
  -- splits, shared-memory trees and shuffles, tie and NaN rules (not GPU timing or math)
  it("give the CPU kernels' results for every launch form", function()
    local dir = files.tmpdir("reduce-emul")
    finally(function() files.remove(dir) end)
    local exe = dir .. "/reduce_emulation"
    local cc = os.getenv("CXX") or "c++"
    local pwd = io.popen("pwd")
    local root = pwd:read("*l")
    pwd:close()
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -Iruntime/include -Iruntime "
      .. "-Ispec/fixtures spec/fixtures/reduce_emulation.cc -o %s -Lbuild -lddplua "
      .. "-Wl,-rpath,%s"):format(cc, files.quote(exe), files.quote(root .. "/build")))
    assert.are.equal(0, status, out)
    status, out = files.run(files.quote(exe))
    assert.are.equal(0, status, out)
    assert.matches("%d+ checks, 0 failed", out)
  end)
end)

describe("ops.reduce through the emulated CUDA kernels", function()
  -- the simulated device with its reduce kernels replaced by runtime/backend/cuda/reduce.cu
  -- under the block emulation (spec/fixtures/reduce_emulation.cc built as a plug-in): the
  -- front doors, their backward passes and the CUDA kernels together (a quick subset:
  -- every emulated launch runs 256 host threads)
  it("gives the CPU's results and gradients", function()
    local dir = files.tmpdir("reduce-emul-plugin")
    finally(function() files.remove(dir) end)
    local pwd = io.popen("pwd")
    local root = pwd:read("*l")
    pwd:close()
    local so = dir .. "/reduce_emulation.so"
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -fPIC -shared "
      .. "-DREDUCE_EMULATION_PLUGIN -Iruntime/include -Iruntime -Ispec/fixtures "
      .. "spec/fixtures/reduce_emulation.cc -o %s -Lbuild -lddplua -ldl -Wl,-rpath,%s")
      :format(os.getenv("CXX") or "c++", files.quote(so), files.quote(root .. "/build")))
    assert.are.equal(0, status, out)
    status, out = files.run(("DDPLUA_SIM_PLUGIN=%s DDPLUA_CUDA_PLUGIN=%s LUA_PATH=%s luajit "
      .. "spec/fixtures/reduce_device_checks.lua quick")
      :format(files.quote(root .. "/build/libddplua_cuda_sim.so"), files.quote(so),
        files.quote(LUA_PATH)))
    assert.are.equal(0, status, out)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal("DONE", lines[#lines], out)
    assert.are.equal("", failures(lines))
    assert.matches("BACKEND cuda%-emulated", out)
    assert.matches("PASS gradient of log_softmax f32", out)
  end)
end)

describe("ops.reduce on a GPU #cuda", function()
  local function gpu_reason()
    if C.ddp_cuda_is_available() == 0 then
      return "CUDA is not available: " .. ffi.string(C.ddp_cuda_unavailable_reason())
    end
    -- DDPLUA_CUDA_SPEC_ON_SIM=1 runs it on the simulated device anyway: a check of the spec
    -- itself (with DDPLUA_CUDA_PLUGIN=build/libddplua_cuda_sim.so), not of the kernels
    local name = ffi.string(C.ddp_cuda_backend_name())
    if name ~= "cuda" and not os.getenv("DDPLUA_CUDA_SPEC_ON_SIM") then
      return "the " .. name .. " backend is loaded, not a GPU"
    end
    return nil
  end

  it("every reduction matches the CPU on random inputs of several shapes, large ones too", function()
    local why = gpu_reason()
    if why then
      pending("skipped: " .. why)
      return
    end
    local checks = dofile("spec/fixtures/reduce_device_checks.lua")
    local results = checks.run { device = 0, big = true, seed = 11 }
    local bad = {}
    for _, r in ipairs(results) do
      if r.err then bad[#bad + 1] = r.name .. ": " .. r.err end
    end
    assert.is_true(#results > 1000)
    assert.are.equal("", table.concat(bad, "\n"))
  end)
end)
