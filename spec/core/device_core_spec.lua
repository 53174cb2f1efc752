-- The device layer through the C API (runtime/core/device.c, runtime/backend/registry.c,
-- runtime/ops/device_copy.c): loading the plug-in,
-- device tensors, moves between devices, autograd across them, pinned memory, the memory
-- counters. Device paths run in a child luajit on the simulated device
-- (build/libddplua_cuda_sim.so: host memory, CPU kernels), because the plug-in is probed
-- once per process. Whether CUDA kernels compute the right thing is for the cuda-tagged
-- specs on a real GPU.
local files = require "files"

local root = io.popen("pwd"):read("*l")
local lib = os.getenv("DDPLUA_LIB") or (root .. "/build/libddplua.so")
local build = lib:match("^(.*)/[^/]*$")
local sim = build .. "/libddplua_cuda_sim.so"

-- Run Lua code in a child luajit with `C` (the runtime's FFI namespace), `ffi`, `check`
-- (errors with the runtime's message on a non-zero status) and `new_tensor` defined.
local function child(code, env)
  local dir = files.tmpdir("device")
  local path = dir .. "/child.lua"
  local f = assert(io.open(path, "w"))
  f:write([[
package.path = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;" .. package.path
local ffi = require "ffi"
local C = require("ddplua.lib").C
local function check(status)
  if status ~= 0 then error(ffi.string(C.ddp_last_error()), 2) end
end
local function out() return ffi.new("ddp_tensor*[1]") end
local function new_tensor(values, shape)
  local o = out()
  local data = ffi.new("double[?]", #values, values)
  local dims = ffi.new("int64_t[?]", #shape, shape)
  check(C.ddp_tensor_from_data(o, #shape, dims, C.DDP_F64, data, C.DDP_F64))
  return o[0]
end
local function values(t)
  local n = tonumber(C.ddp_tensor_numel(t))
  local buf = ffi.new("double[?]", n)
  check(C.ddp_tensor_to_f64(t, buf))
  local r = {}
  for i = 0, n - 1 do r[#r + 1] = buf[i] end
  return table.concat(r, ",")
end
]] .. code)
  f:close()
  local vars = ""
  for k, v in pairs(env or {}) do vars = vars .. k .. "=" .. files.quote(v) .. " " end
  local status, output = files.run(("cd %s && env DDPLUA_LIB=%s %s luajit %s"):format(
    files.quote(root), files.quote(lib), vars, files.quote(path)))
  files.remove(dir)
  return status, output
end

local function sim_child(code) return child(code, {DDPLUA_CUDA_PLUGIN = sim}) end

describe("the device layer", function()
  it("reports why CUDA is not available when the plug-in does not load", function()
    local status, output = child([[
      assert(C.ddp_cuda_is_available() == 0)
      local o = out()
      local dims = ffi.new("int64_t[1]", 3)
      assert(C.ddp_tensor_empty(o, 1, dims, C.DDP_F32, 0) ~= 0)
      print(ffi.string(C.ddp_last_error()))
    ]], {DDPLUA_CUDA_PLUGIN = "/nonexistent/libddplua_cuda.so"})
    assert.are.equal(0, status, output)
    assert.matches("empty: CUDA is not available: the CUDA plug-in did not load", output, 1, true)
  end)

  it("finds the simulated devices and refuses a device that does not exist", function()
    local status, output = sim_child([[
      assert(C.ddp_cuda_is_available() == 1)
      print("count", C.ddp_cuda_device_count(), ffi.string(C.ddp_cuda_backend_name()))
      local o = out()
      local dims = ffi.new("int64_t[1]", 3)
      assert(C.ddp_tensor_empty(o, 1, dims, C.DDP_F32, 5) ~= 0)
      print(ffi.string(C.ddp_last_error()))
    ]])
    assert.are.equal(0, status, output)
    assert.matches("count\t2\tcuda-sim", output, 1, true)
    assert.matches("cuda:5 does not exist (2 devices)", output, 1, true)
  end)

  it("moves tensors between the CPU and devices, strided sources included", function()
    local status, output = sim_child([[
      local t = new_tensor({1, 2, 3, 4, 5, 6}, {2, 3})
      local tt = out()
      check(C.ddp_transpose(tt, t, 0, 1))                -- (3, 2), not contiguous
      local d0, d1, back = out(), out(), out()
      check(C.ddp_tensor_to_device(d0, tt[0], 0, 0))
      check(C.ddp_tensor_to_device(d1, d0[0], 1, 0))
      check(C.ddp_tensor_to_device(back, d1[0], -1, 0))
      print("devices", C.ddp_tensor_device(d0[0]), C.ddp_tensor_device(d1[0]),
            C.ddp_tensor_device(back[0]))
      print("values", values(back[0]))
      print("device values", values(d1[0]))
      -- a copy_ from a CPU f64 tensor into a device f32 view converts on the way
      local z, dims = out(), ffi.new("int64_t[2]", 3, 2)
      check(C.ddp_tensor_zeros(z, 2, dims, C.DDP_F32, 1))
      check(C.ddp_copy_(z[0], tt[0]))
      print("copied", values(z[0]), C.ddp_tensor_dtype(z[0]) == C.DDP_F32)
      -- element access goes through the device
      local v = ffi.new("double[1]")
      local idx = ffi.new("int64_t[2]", 2, 1)
      check(C.ddp_tensor_set(z[0], idx, 42))
      check(C.ddp_tensor_get(z[0], idx, v))
      print("element", v[0])
    ]])
    assert.are.equal(0, status, output)
    assert.matches("devices\t0\t1\t-1", output, 1, true)
    assert.matches("values\t1,4,2,5,3,6", output, 1, true)
    assert.matches("device values\t1,4,2,5,3,6", output, 1, true)
    assert.matches("copied\t1,4,2,5,3,6\ttrue", output, 1, true)
    assert.matches("element\t42", output, 1, true)
  end)

  it("sends gradients back across a move to a device", function()
    local status, output = sim_child([[
      local x = new_tensor({1, 2, 3}, {3})
      check(C.ddp_tensor_set_requires_grad(x, 1))
      local y, z = out(), out()
      check(C.ddp_tensor_to_device(y, x, 1, 0))
      check(C.ddp_tensor_to_device(z, y[0], -1, 0))
      local g = new_tensor({10, 20, 30}, {3})
      check(C.ddp_backward(z[0], g, 0))
      local grad = C.ddp_tensor_grad(x)
      print("grad", values(grad), C.ddp_tensor_device(grad))
    ]])
    assert.are.equal(0, status, output)
    assert.matches("grad\t10,20,30\t-1", output, 1, true)
  end)

  it("counts device memory up and down", function()
    local status, output = sim_child([[
      local v = ffi.new("int64_t[1]")
      local function allocated()
        check(C.ddp_cuda_memory_stat(0, C.DDP_CUDA_MEM_ALLOCATED, v))
        return tonumber(v[0])
      end
      local before = allocated()
      local o, dims = out(), ffi.new("int64_t[1]", 1000)
      check(C.ddp_tensor_zeros(o, 1, dims, C.DDP_F64, 0))
      local during = allocated()
      C.ddp_tensor_release(o[0])
      print("memory", during - before, allocated() - before)
      check(C.ddp_cuda_memory_stat(0, C.DDP_CUDA_MEM_MAX_ALLOCATED, v))
      print("peak", tonumber(v[0]) >= during)
    ]])
    assert.are.equal(0, status, output)
    assert.matches("memory\t8000\t0", output, 1, true)
    assert.matches("peak\ttrue", output, 1, true)
  end)

  it("pins CPU tensors and refuses to pin device tensors", function()
    local status, output = sim_child([[
      local t = new_tensor({1, 2, 3, 4}, {2, 2})
      local p, d, bad = out(), out(), out()
      check(C.ddp_tensor_pin_memory(p, t))
      print("pinned", C.ddp_tensor_is_pinned(p[0]), C.ddp_tensor_is_pinned(t), values(p[0]))
      check(C.ddp_tensor_to_device(d, p[0], 0, 1))
      check(C.ddp_cuda_synchronize(0))
      print("moved", values(d[0]))
      assert(C.ddp_tensor_pin_memory(bad, d[0]) ~= 0)
      print(ffi.string(C.ddp_last_error()))
    ]])
    assert.are.equal(0, status, output)
    assert.matches("pinned\t1\t0\t1,2,3,4", output, 1, true)
    assert.matches("moved\t1,2,3,4", output, 1, true)
    assert.matches("pin_memory: the tensor is on cuda:0; only CPU tensors can be pinned", output, 1, true)
  end)

  it("keeps the core library free of any link-time CUDA dependency", function()
    local status, output = files.run("ldd " .. files.quote(lib))
    assert.are.equal(0, status, output)
    assert.is_nil(output:find("libcuda", 1, true), output)
    assert.is_nil(output:find("libcublas", 1, true), output)
    assert.is_nil(output:find("libnccl", 1, true), output)
  end)
end)
