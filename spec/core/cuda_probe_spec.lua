-- The CUDA probe on a host without the NVIDIA driver (Note [probe without a driver] in
-- runtime/backend/registry.c): dl.cuda.is_available() answers false without opening the
-- CUDA plug-in, whose cuBLAS / cuDNN / NCCL cost a CPU process about 150 MB of resident
-- memory; a plug-in named by $DDPLUA_CUDA_PLUGIN is still opened without a driver. Each
-- case runs in a child luajit, because the probe runs once per process.
local ffi = require "ffi"
local files = require "files"

local root = io.popen("pwd"):read("*l")
local lib = os.getenv("DDPLUA_LIB") or (root .. "/build/libddplua.so")
local build = lib:match("^(.*)/[^/]*$")
local plugin = build .. "/libddplua_cuda.so"
local sim = build .. "/libddplua_cuda_sim.so"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Run `code` in a child luajit with `C` (the runtime's FFI namespace), `ffi`, `hwm()` (the
-- process's peak resident set, MB) and `mapped(name)` (whether a mapped file's path holds
-- `name`) defined; `plugin_env` is the child's $DDPLUA_CUDA_PLUGIN (nil: unset).
local function child(code, plugin_env)
  local dir = files.tmpdir("cuda_probe")
  local path = dir .. "/child.lua"
  local f = assert(io.open(path, "w"))
  f:write([[
package.path = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;" .. package.path
local ffi = require "ffi"
local C = require("ddplua.lib").C
local function status()
  local fh = assert(io.open("/proc/self/status")); local s = fh:read("*a"); fh:close(); return s
end
local function hwm() return tonumber(status():match("VmHWM:%s*(%d+)")) / 1024 end
local function mapped(name)
  for line in io.lines("/proc/self/maps") do
    if line:find(name, 1, true) then return true end
  end
  return false
end
]] .. code)
  f:close()
  local setenv = plugin_env and ("DDPLUA_CUDA_PLUGIN=" .. files.quote(plugin_env)) or ""
  local status, output = files.run(("cd %s && env -u DDPLUA_CUDA_PLUGIN DDPLUA_LIB=%s %s luajit %s"):format(
    files.quote(root), files.quote(lib), setenv, files.quote(path)))
  files.remove(dir)
  return status, output
end

local driver = pcall(ffi.load, "libcuda.so.1")

describe("the CUDA probe without a driver", function()
  it("answers false without opening the plug-in, naming libcuda.so.1, at no memory cost", function()
    if driver then return pending("this host has the NVIDIA driver (libcuda.so.1 loads)") end
    if not exists(plugin) then return pending("no CUDA plug-in built (" .. plugin .. ")") end
    local status, output = child([[
      local before = hwm()
      assert(C.ddp_cuda_is_available() == 0, "available without a driver")
      assert(C.ddp_cuda_device_count() == 0)
      assert(ffi.string(C.ddp_cuda_backend_name()) == "")
      print("reason: " .. ffi.string(C.ddp_cuda_unavailable_reason()))
      print("plugin mapped: " .. tostring(mapped("libddplua_cuda.so")))
      print("cublas mapped: " .. tostring(mapped("libcublas")))
      print(("probe cost MB: %.1f"):format(hwm() - before))
    ]], nil)
    assert.are.equal(0, status, output)
    assert.matches("reason: no CUDA driver: libcuda.so.1 did not load", output, 1, true)
    assert.matches("plugin mapped: false", output, 1, true)
    assert.matches("cublas mapped: false", output, 1, true)
    local cost = tonumber(output:match("probe cost MB: ([%d.-]+)"))
    assert.is_true(cost ~= nil and cost < 10, output) -- 150 MB when the plug-in was opened
  end)

  it("still opens a plug-in that $DDPLUA_CUDA_PLUGIN names (the simulated device)", function()
    if not exists(sim) then return pending("no simulated plug-in built (" .. sim .. ")") end
    local status, output = child([[
      assert(C.ddp_cuda_is_available() == 1, ffi.string(C.ddp_cuda_unavailable_reason()))
      print("backend: " .. ffi.string(C.ddp_cuda_backend_name()))
      print("devices: " .. C.ddp_cuda_device_count())
    ]], sim)
    assert.are.equal(0, status, output)
    assert.matches("backend: cuda-sim", output, 1, true)
    assert.matches("devices: 2", output, 1, true)
  end)
end)
