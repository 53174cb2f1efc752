-- Specs for the device paths of matmul, bmm, linear, conv2d and the pooling ops.
--
-- 1. On the simulated device (build/libddplua_cuda_sim.so: host memory, CPU kernels), in a
--    child luajit with DDPLUA_CUDA_PLUGIN set (the plug-in is probed once per process):
--    outputs and gradients live on the inputs' device, equal the CPU's, and mixing devices
--    raises naming the op, the arguments and both devices. The sim cannot say whether a
--    CUDA kernel is right.
-- 2. The CUDA pooling kernels (runtime/backend/cuda/pool.cu) on the host under an emulation
--    of CUDA blocks, against the CPU kernels (spec/fixtures/pool_emulation.cc).
-- 3. Tagged #cuda, on a real GPU only (skipped with a message otherwise): the cuBLAS GEMM
--    (every transpose, f32 / f64 / f16 / bf16, TF32 on and off), cuDNN conv2d forward and
--    backward and the pooling kernels against the CPU.
local files = require "files"

local root = os.getenv("PWD") or "."

-- Run `body` (Lua source) in a child luajit on the simulated device; returns its output.
-- The prelude gives it dl, lib, C, to(t, device), randn(shape, dtype), same(a, b, tol),
-- raises(pattern, fn) and case(name, fn), which prints "PASS name" or "FAIL name: error".
local prelude = [[
package.path = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;spec/helpers/?.lua;" .. package.path
local dl = require "ddplua"
local lib = require "ddplua.lib"
local close = require "close"
local C = lib.C
assert(C.ddp_cuda_is_available() == 1, "simulated device not available")
local function to(t, device) return lib.call(C.ddp_tensor_to_device, t, device, 0) end
local seed = 0
local function randn(shape, dtype)
  seed = seed + 1
  return dl.randn(shape, { dtype = dtype or "f64", generator = dl.Generator(seed) })
end
-- a (on a device) equals b (on the CPU): shape, dtype and values within tol (0: exact)
local function same(a, b, tol)
  assert(a.device ~= "cpu", "result is on the cpu, expected a device")
  assert(a.dtype == b.dtype, ("dtype %s, expected %s"):format(tostring(a.dtype), tostring(b.dtype)))
  close.assert_close(to(a, -1), b, { atol = tol or 0, rtol = tol or 0 })
end
local function raises(pattern, fn)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching " .. pattern)
  assert(tostring(err):find(pattern), ("error %q does not match %q"):format(tostring(err), pattern))
end
local function case(name, fn)
  local ok, err = pcall(fn)
  print((ok and "PASS " or "FAIL ") .. name .. (ok and "" or (": " .. tostring(err))))
end
]]

local function run_sim(body)
  local dir = files.tmpdir("mmdev")
  local path = dir .. "/child.lua"
  local f = assert(io.open(path, "w"))
  f:write(prelude, body)
  f:close()
  local status, out = files.run(("cd %s && DDPLUA_CUDA_PLUGIN=%s/build/libddplua_cuda_sim.so " ..
    "DDPLUA_SIM_DEVICES=2 luajit %s"):format(files.quote(root), files.quote(root), files.quote(path)))
  files.remove(dir)
  return status, out
end

-- Every case of the child passed (and there were `n` of them).
local function assert_all_pass(status, out, n)
  local passed, failed = 0, {}
  for line in out:gmatch("[^\n]+") do
    if line:match("^PASS ") then passed = passed + 1
    elseif line:match("^FAIL ") then failed[#failed + 1] = line end
  end
  assert(status == 0 and #failed == 0 and passed == n,
    ("child exited %s, %d passed of %d:\n%s"):format(tostring(status), passed, n, out))
end

-- The pooling case, run on the simulated device and with the emulated CUDA pooling kernels.
local pool_case = [[
case("pooling forward and backward", function()
  local x = randn({ 2, 3, 7, 6 })
  local dx = to(x, 0)
  x:requires_grad_(true); dx:requires_grad_(true)
  local ops = {
    function(t) return dl.max_pool2d(t, 2) end,
    function(t) return dl.max_pool2d(t, 3, { stride = 1, padding = 1, dilation = 1 }) end,
    function(t) return dl.max_pool2d(t, { 2, 3 }, { stride = { 1, 2 }, dilation = 2 }) end,
    function(t) return dl.avg_pool2d(t, 3, { stride = 2, padding = 1, ceil_mode = true }) end,
    function(t) return dl.avg_pool2d(t, 2, { stride = 1, count_include_pad = false, padding = 1 }) end,
    function(t) return dl.adaptive_avg_pool2d(t, { 3, 4 }) end,
    function(t) return dl.adaptive_avg_pool2d(t, { 9, 8 }) end,
  }
  for _, op in ipairs(ops) do
    x.grad, dx.grad = nil, nil
    local y, dy = op(x), op(dx)
    same(dy, y, 1e-12)
    local gy = randn(y:size())
    y:backward(gy)
    dy:backward(to(gy, 0))
    same(dx.grad, x.grad, 1e-12)
  end
  local out, idx = dl.max_pool2d(dx, 2, { return_indices = true })
  assert(idx.device == "cuda:0" and out.device == "cuda:0")
  same(dl.max_pool2d(to(x:detach():half(), 0), 2), dl.max_pool2d(x:detach():half(), 2), 0)
end)
]]

describe("matmul, conv2d and pooling on the simulated device", function()
  it("multiply on the operands' device and match the CPU, gradients included", function()
    local status, out = run_sim([[
case("matmul, every transpose", function()
  local a, b = randn({ 4, 5 }), randn({ 5, 3 })
  local at, bt = randn({ 5, 4 }), randn({ 3, 5 })
  -- to() copies into a contiguous tensor: transpose on the device, so the GEMM sees the
  -- transposed layouts
  local da, db, dat, dbt = to(a, 0), to(b, 0), to(at, 0), to(bt, 0)
  same(dl.matmul(da, db), dl.matmul(a, b))
  same(dl.matmul(dat:t(), db), dl.matmul(at:t(), b))
  same(dl.matmul(da, dbt:t()), dl.matmul(a, bt:t()))
  same(dl.matmul(dat:t(), dbt:t()), dl.matmul(at:t(), bt:t()))
end)
case("matmul, vectors and broadcast batches", function()
  local v, m, b3 = randn({ 5 }), randn({ 5, 3 }), randn({ 2, 4, 5 })
  same(dl.matmul(to(v, 1), to(m, 1)), dl.matmul(v, m))
  same(dl.matmul(to(b3, 0), to(m, 0)), dl.matmul(b3, m))
  local b4 = randn({ 3, 1, 5, 2 })
  same(dl.matmul(to(b3, 0), to(b4, 0)), dl.matmul(b3, b4))
  assert(dl.matmul(to(v, 1), to(m, 1)).device == "cuda:1")
end)
case("bmm and integer matmul", function()
  local a, b = randn({ 3, 2, 4 }), randn({ 3, 4, 5 })
  same(dl.bmm(to(a, 0), to(b, 0)), dl.bmm(a, b))
  local ia = dl.tensor({ { 1, -2, 3 }, { 4, 5, -6 } }, { dtype = "i64" })
  local ib = dl.tensor({ { 7, 8 }, { -9, 10 }, { 11, 12 } }, { dtype = "i64" })
  same(dl.matmul(to(ia, 0), to(ib, 0)), dl.matmul(ia, ib))
  same(dl.matmul(to(ia, 0):t(), to(ib, 0):t()), dl.matmul(ia:t(), ib:t()))
end)
case("f16 and bf16 go to the device GEMM as they are", function()
  for _, dt in ipairs { "f16", "bf16" } do
    local a, b = randn({ 6, 7 }, dt), randn({ 7, 5 }, dt)
    same(dl.matmul(to(a, 0), to(b, 0)), dl.matmul(a, b), dt == "f16" and 1e-2 or 5e-2)
    same(dl.matmul(to(a, 0), to(b:t():contiguous(), 0):t()), dl.matmul(a, b), dt == "f16" and 1e-2 or 5e-2)
  end
end)
case("matmul and linear backward on the device", function()
  local x, w, bias = randn({ 2, 3, 4 }), randn({ 5, 4 }), randn({ 5 })
  local dx, dw, db = to(x, 0), to(w, 0), to(bias, 0)
  for _, t in ipairs { x, w, bias, dx, dw, db } do t:requires_grad_(true) end
  dl.linear(x, w, bias):sum():backward()
  dl.linear(dx, dw, db):sum():backward()
  same(dx.grad, x.grad, 1e-12); same(dw.grad, w.grad, 1e-12); same(db.grad, bias.grad, 1e-12)
  local a, b = randn({ 2, 3, 4 }), randn({ 4, 2 })
  local da, dbm = to(a, 1), to(b, 1)
  for _, t in ipairs { a, b, da, dbm } do t:requires_grad_(true) end
  dl.matmul(a, b):sum():backward()
  dl.matmul(da, dbm):sum():backward()
  same(da.grad, a.grad, 1e-12); same(dbm.grad, b.grad, 1e-12)
  assert(dbm.grad.device == "cuda:1")
end)
case("conv2d forward and backward: stride, padding, dilation, groups, bias", function()
  local geoms = {
    { x = { 2, 4, 7, 6 }, w = { 6, 2, 3, 2 }, opts = { stride = { 2, 1 }, padding = { 1, 0 }, dilation = { 1, 2 }, groups = 2 } },
    { x = { 1, 8, 6, 6 }, w = { 8, 8, 3, 3 }, opts = { padding = 1 } }, -- the CPU's Winograd path
    { x = { 5, 6, 5 }, w = { 2, 5, 1, 1 } },                                 -- unbatched, 1x1
  }
  for _, g in ipairs(geoms) do
    for _, with_bias in ipairs { true, false } do
      local x, w = randn(g.x), randn(g.w)
      local b = with_bias and randn({ g.w[1] }) or nil
      local dx, dw, db = to(x, 0), to(w, 0), b and to(b, 0)
      for _, t in ipairs { x, w, dx, dw, b or x, db or x } do t:requires_grad_(true) end
      local y, dy = dl.conv2d(x, w, b, g.opts), dl.conv2d(dx, dw, db, g.opts)
      same(dy, y, 1e-12)
      local gy = randn(y:size())
      y:backward(gy)
      dy:backward(to(gy, 0))
      same(dx.grad, x.grad, 1e-12); same(dw.grad, w.grad, 1e-12)
      if b then same(db.grad, b.grad, 1e-12) end
    end
  end
  local x, w = randn({ 1, 2, 5, 5 }, "f32"), randn({ 3, 2, 3, 3 }, "f32")
  same(dl.conv2d(to(x, 0):half(), to(w, 0):half()), dl.conv2d(x:half(), w:half()), 1e-2)
end)
]] .. pool_case)
    assert_all_pass(status, out, 7)
  end)

  it("raise naming the op, the arguments and both devices when devices are mixed", function()
    local status, out = run_sim [[
case("mixed devices", function()
  local a, b = randn({ 2, 3 }), randn({ 3, 4 })
  raises("matmul: expected all tensors on the same device, but self is on cuda:0 and other is on cpu",
         function() dl.matmul(to(a, 0), b) end)
  raises("bmm: .*self is on cpu and other is on cuda:1",
         function() dl.bmm(randn({ 1, 2, 3 }), to(randn({ 1, 3, 4 }), 1)) end)
  raises("linear: .*input is on cuda:0 and bias is on cpu",
         function() dl.linear(to(a, 0), to(randn({ 4, 3 }), 0), randn({ 4 })) end)
  raises("linear: .*input is on cuda:0 and weight is on cuda:1",
         function() dl.linear(to(a, 0), to(randn({ 4, 3 }), 1)) end)
  local x, w = randn({ 1, 2, 5, 5 }), randn({ 3, 2, 3, 3 })
  raises("conv2d: .*input is on cuda:1 and weight is on cuda:0",
         function() dl.conv2d(to(x, 1), to(w, 0)) end)
  raises("conv2d: .*input is on cuda:0 and bias is on cpu",
         function() dl.conv2d(to(x, 0), to(w, 0), randn({ 3 })) end)
end)
]]
    assert_all_pass(status, out, 1)
  end)
end)

-- ---- the pooling kernels under host emulation --------------------------------------------

describe("CUDA pooling kernels under host emulation", function()
  -- runtime/backend/cuda/pool.cu compiled for the host with every CUDA thread a host thread
  -- (spec/fixtures/cuda_block_emulation.h, atomicAdd a host atomic) and compared with the
  -- CPU kernels (spec/fixtures/pool_emulation.cc): max / avg / adaptive avg pooling,
  -- forward and backward, f32 and f64, random geometries (padding, stride, dilation,
  -- ceil_mode, count_include_pad, adaptive up- and down-sampling), ties and NaN for max,
  -- grids of the real size and capped ones (grid-stride loops). Index arithmetic and
  -- results only: not a GPU's timing, memory model or math library.
  it("give the CPU kernels' results on random geometries", function()
    local dir = files.tmpdir("pool-emul")
    finally(function() files.remove(dir) end)
    local exe = dir .. "/pool_emulation"
    local pwd = io.popen("pwd")
    local here = pwd:read("*l")
    pwd:close()
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -Iruntime/include -Iruntime "
      .. "-Ispec/fixtures spec/fixtures/pool_emulation.cc -o %s -Lbuild -lddplua "
      .. "-Wl,-rpath,%s"):format(os.getenv("CXX") or "c++", files.quote(exe),
        files.quote(here .. "/build")))
    assert.are.equal(0, status, out)
    status, out = files.run(files.quote(exe))
    assert.are.equal(0, status, out)
    local n = tonumber(out:match("(%d+) checks, 0 failed"))
    assert.is_truthy(n, out)
    assert.is_true(n > 2000, out)
  end)

  -- the simulated device with its pooling entries replaced by the emulated kernels
  -- (pool_emulation.cc built as a plug-in): front doors, backward passes and the CUDA
  -- kernels together
  it("give the CPU's results and gradients through the front doors", function()
    local dir = files.tmpdir("pool-emul-plugin")
    finally(function() files.remove(dir) end)
    local pwd = io.popen("pwd")
    local here = pwd:read("*l")
    pwd:close()
    local so = dir .. "/pool_emulation.so"
    local status, out = files.run(("%s -std=c++20 -O1 -pthread -fPIC -shared "
      .. "-DPOOL_EMULATION_PLUGIN -Iruntime/include -Iruntime -Ispec/fixtures "
      .. "spec/fixtures/pool_emulation.cc -o %s -Lbuild -lddplua -ldl -Wl,-rpath,%s")
      :format(os.getenv("CXX") or "c++", files.quote(so), files.quote(here .. "/build")))
    assert.are.equal(0, status, out)
    local path = dir .. "/child.lua"
    local f = assert(io.open(path, "w"))
    f:write(prelude, "print('BACKEND ' .. lib.ffi.string(C.ddp_cuda_backend_name()))\n", pool_case)
    f:close()
    status, out = files.run(("DDPLUA_SIM_PLUGIN=%s DDPLUA_CUDA_PLUGIN=%s DDPLUA_SIM_DEVICES=2 "
      .. "luajit %s"):format(files.quote(here .. "/build/libddplua_cuda_sim.so"),
        files.quote(so), files.quote(path)))
    assert.matches("BACKEND cuda%-emulated", out)
    assert_all_pass(status, out, 1)
  end)
end)

-- ---- on a real GPU ---------------------------------------------------------------------

local dl = require "ddplua"
local lib = require "ddplua.lib"
local C = lib.C

-- nil when a real CUDA device can run these, else why not.
local function no_gpu()
  if C.ddp_cuda_is_available() ~= 1 then
    return "CUDA is not available: " .. lib.ffi.string(C.ddp_cuda_unavailable_reason())
  end
  -- DDPLUA_CUDA_SPEC_ON_SIM=1 runs them on the simulated device anyway: a check of the specs
  -- themselves, not of the CUDA kernels
  if lib.ffi.string(C.ddp_cuda_backend_name()) ~= "cuda" and not os.getenv("DDPLUA_CUDA_SPEC_ON_SIM") then
    return "the simulated device is loaded"
  end
  return nil
end

describe("cuBLAS, cuDNN and the pooling kernels against the CPU #cuda", function()
  local why = no_gpu()
  if why then
    pending("cuda spec skipped: " .. why)
    return
  end
  local close = require "close"
  local function to(t, device) return lib.call(C.ddp_tensor_to_device, t, device, 0) end
  local seed = 100
  local function randn(shape, dtype)
    seed = seed + 1
    return dl.randn(shape, { dtype = dtype or "f64", generator = dl.Generator(seed) })
  end
  local function near(dev, cpu, tol)
    assert.are.equal(cpu.dtype, dev.dtype)
    close.assert_close(to(dev, -1):double(), cpu:double(), { atol = tol, rtol = tol })
  end
  local function set_tf32(on) C.ddp_cuda_set_allow_tf32(on and 1 or 0) end

  it("gemm: every transpose, f32 / f64 / f16 / bf16, TF32 off and on", function()
    local tols = { f64 = 1e-12, f32 = 1e-4, f16 = 2e-2, bf16 = 1e-1 }
    for _, tf32 in ipairs { false, true } do
      set_tf32(tf32)
      for dt, tol in pairs(tols) do
        if tf32 and dt == "f32" then tol = 2e-2 end -- TF32: 10-bit mantissa products
        local m, k, n = 37, 129, 23
        for ta = 0, 1 do
          for tb = 0, 1 do
            -- stored (k, m) / (n, k) and transposed on the device: the GEMM's trans flags
            local sa = ta == 1 and randn({ k, m }, dt) or randn({ m, k }, dt)
            local sb = tb == 1 and randn({ n, k }, dt) or randn({ k, n }, dt)
            local da, db = to(sa, 0), to(sb, 0)
            if ta == 1 then sa, da = sa:t(), da:t() end
            if tb == 1 then sb, db = sb:t(), db:t() end
            local want = dl.matmul(sa:double(), sb:double()) -- f64 on the CPU
            near(dl.matmul(da, db), want:to(dt), tol * math.sqrt(k))
          end
        end
      end
    end
    set_tf32(false)
  end)

  it("batched matmul, integer matmul and linear backward", function()
    local a, b = randn({ 3, 17, 9 }), randn({ 9, 11 })
    near(dl.matmul(to(a, 0), to(b, 0)), dl.matmul(a, b), 1e-12)
    local ia = dl.randint(-50, 50, { 33, 19 }, { dtype = "i64", generator = dl.Generator(1) })
    local ib = dl.randint(-50, 50, { 19, 21 }, { dtype = "i64", generator = dl.Generator(2) })
    near(dl.matmul(to(ia, 0), to(ib, 0)), dl.matmul(ia, ib), 0)
    near(dl.matmul(to(ia:int(), 0), to(ib:int(), 0)), dl.matmul(ia:int(), ib:int()), 0)
    local x, w = randn({ 8, 16 }), randn({ 4, 16 })
    local dx, dw = to(x, 0), to(w, 0)
    for _, t in ipairs { x, w, dx, dw } do t:requires_grad_(true) end
    dl.linear(x, w):sum():backward()
    dl.linear(dx, dw):sum():backward()
    near(dx.grad, x.grad, 1e-10)
    near(dw.grad, w.grad, 1e-10)
  end)

  it("conv2d forward and backward: strides, padding, dilation, groups", function()
    local geoms = {
      { x = { 2, 4, 9, 8 }, w = { 6, 2, 3, 2 }, opts = { stride = { 2, 1 }, padding = { 1, 0 }, dilation = { 1, 2 }, groups = 2 } },
      { x = { 4, 16, 14, 14 }, w = { 32, 16, 3, 3 }, opts = { padding = 1 } },
      { x = { 2, 8, 11, 11 }, w = { 8, 1, 5, 5 }, opts = { stride = 2, padding = 2, groups = 8 } },
      { x = { 2, 3, 6, 6 }, w = { 5, 3, 1, 1 } },
    }
    for _, tf32 in ipairs { false, true } do
      set_tf32(tf32)
      for _, g in ipairs(geoms) do
        for _, dt in ipairs { "f64", "f32" } do
          local tol = dt == "f64" and 1e-10 or (tf32 and 3e-2 or 1e-4)
          local x, w, b = randn(g.x, dt), randn(g.w, dt), randn({ g.w[1] }, dt)
          local dx, dw, db = to(x, 0), to(w, 0), to(b, 0)
          for _, t in ipairs { x, w, b, dx, dw, db } do t:requires_grad_(true) end
          local y, dy = dl.conv2d(x, w, b, g.opts), dl.conv2d(dx, dw, db, g.opts)
          near(dy, y, tol)
          local gy = randn(y:size(), dt)
          y:backward(gy)
          dy:backward(to(gy, 0))
          near(dx.grad, x.grad, tol); near(dw.grad, w.grad, tol * 10); near(db.grad, b.grad, tol * 10)
        end
      end
    end
    set_tf32(false)
  end)

  it("pooling forward and backward", function()
    for _, dt in ipairs { "f64", "f32" } do
      local x = randn({ 3, 4, 13, 11 }, dt)
      local dx = to(x, 0)
      x:requires_grad_(true); dx:requires_grad_(true)
      local ops = {
        function(t) return dl.max_pool2d(t, 2) end,
        function(t) return dl.max_pool2d(t, 3, { stride = 1, padding = 1 }) end,
        function(t) return dl.max_pool2d(t, { 2, 3 }, { stride = { 1, 2 }, dilation = 2, ceil_mode = true }) end,
        function(t) return dl.avg_pool2d(t, 3, { stride = 2, padding = 1, ceil_mode = true }) end,
        function(t) return dl.avg_pool2d(t, 3, { stride = 1, padding = 1, count_include_pad = false }) end,
        function(t) return dl.adaptive_avg_pool2d(t, { 5, 4 }) end,
        function(t) return dl.adaptive_avg_pool2d(t, { 17, 13 }) end,
      }
      for _, op in ipairs(ops) do
        x.grad, dx.grad = nil, nil
        local y, dy = op(x), op(dx)
        near(dy, y, 0)
        local gy = randn(y:size(), dt)
        y:backward(gy)
        dy:backward(to(gy, 0))
        near(dx.grad, x.grad, dt == "f64" and 1e-12 or 1e-5)
      end
    end
  end)
end)
