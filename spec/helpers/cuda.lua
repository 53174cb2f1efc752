--- spec/helpers/cuda.lua: what CUDA specs need.
--
--   local cuda = require "cuda"
--   describe("kernels #cuda", function()
--     it("adds", function()
--       if cuda.skip_unless_gpu() then return end      -- pending on machines without a GPU
--       ...
--     end)
--   end)
--   local status, out = cuda.run_sim([[ print(dl.cuda.device_count()) ]])  -- 2 simulated devices
--
-- The CUDA plug-in is probed once per process, so specs that need the simulated device
-- (build/libddplua_cuda_sim.so, a test double backed by host memory and the CPU kernels)
-- run their code in a child luajit with DDPLUA_CUDA_PLUGIN set: run_sim.
local files = require "files"

local M = {}

local function root()
  local p = io.popen("pwd")
  local dir = p:read("*l")
  p:close()
  return dir
end

--- Absolute path of the simulated device plug-in (build/libddplua_cuda_sim.so, beside
-- $DDPLUA_LIB when that is set).
function M.sim_plugin()
  local lib = os.getenv("DDPLUA_LIB")
  local dir = lib and lib:match("^(.*)/[^/]*$") or (root() .. "/build")
  if dir:sub(1, 1) ~= "/" then dir = root() .. "/" .. dir end
  return dir .. "/libddplua_cuda_sim.so"
end

--- Absolute path of the runtime library the children load ($DDPLUA_LIB or build/libddplua.so).
function M.lib_path()
  local lib = os.getenv("DDPLUA_LIB")
  if lib and lib:sub(1, 1) == "/" then return lib end
  return root() .. "/" .. (lib or "build/libddplua.so")
end

--- True only on a machine with a real GPU: CUDA is available and the plug-in is the real
-- one (not "cuda-sim").
function M.real_gpu()
  local dl = require "ddplua"
  return dl.cuda.is_available() and dl.cuda.backend_name() ~= "cuda-sim"
end

--- The number of real CUDA devices with NCCL (0 without a GPU, without NCCL, or when the
-- plug-in is the simulated device), probed in a child ddplua ($DDPLUA_EXE or build/ddplua,
-- DDPLUA_CUDA_PLUGIN unset) so this process's plug-in choice is untouched.
function M.nccl_gpus()
  local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
  local p = io.popen("cd " .. files.quote(root()) .. " && env -u DDPLUA_CUDA_PLUGIN " .. exe .. " -e " ..
    "'local C = require(\"ddplua.lib\").C; local ffi = require(\"ffi\"); " ..
    "print(C.ddp_cuda_is_available() ~= 0 and ffi.string(C.ddp_cuda_backend_name()) == \"cuda\" " ..
    "and C.ddp_pg_nccl_available(nil, 0) ~= 0 and C.ddp_cuda_device_count() or 0)' 2>/dev/null")
  local text = p:read("*a")
  p:close()
  return tonumber(text:match("(%d+)%s*$")) or 0
end

--- Mark the running test pending (with the reason) and return true when there is no real
-- GPU: `if cuda.skip_unless_gpu() then return end`. busted's `pending` lives in the spec
-- file's environment, so it is taken from the caller's (or pass it: skip_unless_gpu(pending)).
function M.skip_unless_gpu(pending_fn)
  if M.real_gpu() then return false end
  local pending = pending_fn or getfenv(2).pending
  local dl = require "ddplua"
  local why = dl.cuda.is_available() and "the CUDA plug-in is the simulated device"
    or ("CUDA is not available: " .. dl.cuda.unavailable_reason())
  pending("needs a GPU (" .. why .. ")")
  return true
end

--- Run Lua `code` in a child luajit where `dl` is require "ddplua" and the CUDA plug-in is
-- the simulated device (opts.devices of them, default 2). opts.plugin: another plug-in
-- path, or false for a file that does not exist (CUDA then is not available); opts.env:
-- extra "NAME=value" words. Returns (exit status, output with stderr merged).
function M.run_sim(code, opts)
  opts = opts or {}
  local dir = files.tmpdir("cuda")
  local script = dir .. "/snippet.lua"
  local f = assert(io.open(script, "w"))
  f:write(("package.path = %q .. package.path\nlocal dl = require 'ddplua'\n"):format(
    root() .. "/lua/?.lua;" .. root() .. "/lua/?/init.lua;" .. root() .. "/build/lua/?.lua;" .. root() .. "/?.lua;"))
  f:write(code)
  f:close()
  local plugin = opts.plugin
  if plugin == nil then plugin = M.sim_plugin() end
  if plugin == false then plugin = dir .. "/no-such-plugin.so" end
  local env = ("DDPLUA_CUDA_PLUGIN=%s DDPLUA_LIB=%s DDPLUA_SIM_DEVICES=%d DDP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 %s"):format(
    files.quote(plugin), files.quote(M.lib_path()), opts.devices or 2, opts.env or "")
  local status, out = files.run("cd " .. files.quote(root()) .. " && env " .. env .. " luajit " .. files.quote(script))
  files.remove(dir)
  return status, out
end

return M
