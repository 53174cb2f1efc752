-- spec/helpers/sim_cases.lua: run a file of device cases on the simulated CUDA device (or
-- in-process on a real GPU), for specs of the device paths of the ops layer.
--
-- A cases file returns a list of {name, fn(ctx)}; fn raises on failure. ctx holds:
--   ctx.dev(t, device)    a copy of tensor t on `device` (-1: the CPU, k: cuda:k)
--   ctx.cpu(t)            a copy of t on the CPU
--   ctx.devices           how many devices there are (cases needing cuda:1 skip below 2)
--   ctx.exact             true on the simulated device (its kernels are the CPU's, so
--                         results must be identical); false on a real GPU
--   ctx.close(a, b, what, rtol, atol)  compare two CPU tensors or numbers (exactly when
--                         ctx.exact, else within the tolerances; NaN equals NaN)
--   ctx.raises(fn, pattern) fn must raise an error whose message contains pattern (plain)
--
-- Parent side (the spec): M.run_sim(path) runs `luajit spec/helpers/sim_cases.lua path`
-- in a child whose environment names the simulated plug-in (the plug-in is probed once per
-- process, so it cannot be switched on inside busted) and returns {name = {ok, message}}.
-- M.run_here(path) runs the cases in this process (for the cuda-tagged specs on a GPU).
-- M.names(path) lists the case names in order.
local M = {}

local function make_ctx(exact)
  local lib = require "ddplua.lib"
  local ffi, C = lib.ffi, lib.C
  local box = ffi.new("ddp_tensor*[1]")
  local ctx = {exact = exact, devices = C.ddp_cuda_device_count()}

  function ctx.dev(t, device)
    lib.check(C.ddp_tensor_to_device(box, t, device, 0))
    return lib.wrap(box[0])
  end
  function ctx.cpu(t) return ctx.dev(t, -1) end

  local function flat(v, out)
    if type(v) == "table" then for i = 1, #v do flat(v[i], out) end else out[#out + 1] = v end
    return out
  end
  local function values(x)
    if type(x) == "number" then return {x} end
    if type(x) == "table" then return flat(x, {}) end
    assert(x.device == "cpu", "close: compare CPU tensors (got one on " .. x.device .. ")")
    local v = x:tolist()
    return type(v) == "table" and flat(v, {}) or {v}
  end
  function ctx.close(a, b, what, rtol, atol)
    what = what or "value"
    if type(a) ~= "number" and type(b) ~= "number" and type(a) ~= "table" then
      local sa, sb = table.concat(a.shape, ","), table.concat(b.shape, ",")
      if sa ~= sb then error(("%s: shape (%s) vs (%s)"):format(what, sa, sb), 2) end
    end
    local va, vb = values(a), values(b)
    if #va ~= #vb then error(("%s: %d vs %d elements"):format(what, #va, #vb), 2) end
    for i = 1, #va do
      local x, y = va[i], vb[i]
      if type(x) == "boolean" then x, y = x and 1 or 0, y and 1 or 0 end
      local same = x == y or (x ~= x and y ~= y)
      if not same and not exact then
        same = math.abs(x - y) <= (atol or 1e-6) + (rtol or 1e-5) * math.abs(y)
      end
      if not same then
        error(("%s: element %d is %.17g, expected %.17g"):format(what, i, x, y), 2)
      end
    end
  end
  function ctx.raises(fn, pattern)
    local ok, err = pcall(fn)
    if ok then error("expected an error containing: " .. pattern, 2) end
    if not tostring(err):find(pattern, 1, true) then
      error(("expected an error containing %q, got: %s"):format(pattern, tostring(err)), 2)
    end
  end
  return ctx
end

-- Run every case of `path` with ctx; returns a list of {name, ok, message}.
local function run_cases(path, ctx)
  local cases = dofile(path)
  local out = {}
  for _, case in ipairs(cases) do
    local ok, err = xpcall(case[2], debug.traceback, ctx)
    out[#out + 1] = {case[1], ok, ok and "" or tostring(err)}
    collectgarbage()
  end
  return out
end

function M.names(path)
  local names = {}
  for i, case in ipairs(dofile(path)) do names[i] = case[1] end
  return names
end

function M.run_here(path, exact)
  local res = {}
  for _, r in ipairs(run_cases(path, make_ctx(exact))) do res[r[1]] = {r[2], r[3]} end
  return res
end

function M.run_sim(path)
  local files = require "files"
  local cmd = ("cd %s && DDPLUA_CUDA_PLUGIN=%s DDPLUA_SIM_DEVICES=2 LUA_PATH=%s luajit %s %s")
      :format(files.quote("."), files.quote("build/libddplua_cuda_sim.so"),
              files.quote("lua/?.lua;lua/?/init.lua;build/lua/?.lua;spec/helpers/?.lua;;"),
              files.quote("spec/helpers/sim_cases.lua"), files.quote(path))
  local status, out = files.run(cmd)
  local res = {}
  for name, ok, msg in out:gmatch("CASE\t([^\t]*)\t(%a+)\t([^\1]-)\1\n") do
    res[name] = {ok == "ok", msg}
  end
  res[1] = {status == 0, out} -- the child's exit status and whole output, for messages
  return res
end

--- Define the three describe blocks of a device spec from a cases file (inside busted):
--   opts.cases  path of the cases file
--   opts.title  what the cases are about ("optimizers", ...)
--   opts.emul   {title =, part =} the host emulation of the CUDA file
--               (spec/fixtures/optimshape_emulation.cc run with `part`), or nil
-- 1. the cases on the simulated device (a child luajit), results identical to the CPU's;
-- 2. the CUDA kernels compiled for the host, against the CPU kernels;
-- 3. #cuda: the cases in this process on a real GPU (pending otherwise).
function M.describe_all(opts)
  -- busted's functions live in the calling spec file's environment, not in _G
  local env = getfenv(2)
  local describe, it, setup, pending, assert =
    env.describe, env.it, env.setup, env.pending, env.assert
  local cases = opts.cases
  describe(opts.title .. " on the simulated device", function()
    local results
    setup(function() results = M.run_sim(cases) end)
    for _, name in ipairs(M.names(cases)) do
      it(name, function()
        local r = results[name]
        if not r then error("the child did not run this case; its output:\n" .. results[1][2]) end
        if not r[1] then error(r[2]) end
      end)
    end
  end)

  if opts.emul then
    describe(opts.emul.title .. " under host emulation", function()
      -- compiled for the host with every CUDA thread a host thread or, for kernels whose
      -- threads do not cooperate, run in turn (spec/fixtures/cuda_block_emulation.h),
      -- against the CPU kernels (spec/fixtures/optimshape_emulation.cc): index arithmetic,
      -- launch geometry, grid-stride tails, branches and atomics (not GPU timing or math)
      it("give the CPU kernels' results for every branch and launch form", function()
        local files = require "files"
        local dir = files.tmpdir("optimshape-emul")
        local exe = dir .. "/optimshape_emulation"
        local pwd = io.popen("pwd")
        local root = pwd:read("*l")
        pwd:close()
        local cuda_include = (os.getenv("CUDA_HOME") or "/usr/local/cuda") .. "/include"
        local probe = io.open(cuda_include .. "/cuda_fp16.h")
        if not probe then
          files.remove(dir)
          pending("skipped: no CUDA toolkit headers in " .. cuda_include .. " (set CUDA_HOME)")
          return
        end
        probe:close()
        local status, out = files.run(("%s -std=c++20 -O1 -pthread -I%s -Iruntime/include "
          .. "-Iruntime -Ispec/fixtures spec/fixtures/optimshape_emulation.cc -o %s -Lbuild "
          .. "-lddplua -Wl,-rpath,%s"):format(os.getenv("CXX") or "c++",
          files.quote(cuda_include), files.quote(exe), files.quote(root .. "/build")))
        local run_status, run_out
        if status == 0 then run_status, run_out = files.run(files.quote(exe) .. " " .. opts.emul.part) end
        files.remove(dir)
        assert.are.equal(0, status, out)
        assert.are.equal(0, run_status, run_out)
        assert.matches("%d+ checks, 0 failed", run_out)
      end)
    end)
  end

  describe(opts.title .. " on a real GPU #cuda", function()
    local lib = require "ddplua.lib"
    local available = lib.C.ddp_cuda_is_available() ~= 0
    local backend = lib.ffi.string(lib.C.ddp_cuda_backend_name())
    if not available or backend ~= "cuda" then
      pending("no CUDA GPU here (" .. (available and "backend " .. backend
              or lib.ffi.string(lib.C.ddp_cuda_unavailable_reason())) .. "): skipped")
      return
    end
    local results
    setup(function() results = M.run_here(cases, false) end)
    for _, name in ipairs(M.names(cases)) do
      it(name, function()
        local r = results[name]
        if not r[1] then error(r[2]) end
      end)
    end
  end)
end

-- As a script in the child: run the cases of arg[1] on the simulated device and print one
-- record per case (\1 ends a message, which may span lines).
if arg and arg[0] and arg[0]:match("sim_cases%.lua$") and arg[1] then
  local lib = require "ddplua.lib"
  local available = lib.C.ddp_cuda_is_available() ~= 0
  local backend = lib.ffi.string(lib.C.ddp_cuda_backend_name())
  if not available or backend ~= "cuda-sim" then
    io.write("the simulated device did not load: ",
             lib.ffi.string(lib.C.ddp_cuda_unavailable_reason()), "\n")
    os.exit(3)
  end
  for _, r in ipairs(run_cases(arg[1], make_ctx(true))) do
    io.write("CASE\t", r[1], "\t", r[2] and "ok" or "fail", "\t", r[3], "\1\n")
  end
  io.stdout:flush()
  os.exit(0)
end

return M
