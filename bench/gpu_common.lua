--- bench/gpu_common.lua: what the GPU benchmarks (bench/gpu_*.lua) and the backend-ops harness
-- (spec/helpers/backend_ops.lua) share: device strings, moving tensors and modules to a
-- device, synchronising, TF32, device memory, and the checks that say whether a real GPU
-- is there.
--
-- It prefers the front end's device API (t:to("cuda:0"), t:cpu(), m:cuda(), dl.cuda.*)
-- and falls back to the C API of runtime/include/ddplua/cuda.h through the FFI where a
-- piece of the front end is missing, so the scripts keep working while the Lua device
-- API lands (the fallbacks say once on stderr what they stand in for). Every failure
-- names what is missing.
--
--   local G = require "bench.gpu_common"
--   local ok, why = G.real_gpu()         -- false, "CUDA is not available: ..." here
--   local xg = G.to(x, "cuda:0")         -- x's data on the device (differentiable copy)
--   G.module_to(model, "cuda:0")         -- parameters and buffers moved in place
--   G.synchronize("cuda:0")              -- wait for the device's queued work
local dl = require "ddplua"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local M = {}

local warned = {}
local function note_fallback(what)
  if not warned[what] then
    warned[what] = true
    io.stderr:write(("gpu_common: the front end has no %s yet; using the C API instead\n"):format(what))
  end
end

--- Device index of a device string: "cpu" -> -1 (DDP_DEVICE_CPU), "cuda" -> 0 (the
-- current device when dl.cuda says so), "cuda:k" -> k. Raises on anything else.
function M.device_index(dev)
  if dev == nil or dev == "cpu" then return -1 end
  if dev == "cuda" then
    local out = ffi.new("int[1]")
    if C.ddp_cuda_current_device(out) == 0 then return out[0] end
    return 0
  end
  local k = type(dev) == "string" and dev:match("^cuda:(%d+)$")
  if not k then error(("gpu_common: unknown device '%s' (cpu, cuda, cuda:K)"):format(tostring(dev)), 2) end
  return tonumber(k)
end

--- Name of the loaded CUDA plug-in: "cuda", "cuda-sim" or "" (none).
function M.backend_name()
  if dl.cuda and dl.cuda.backend_name then return dl.cuda.backend_name() end
  return ffi.string(C.ddp_cuda_backend_name())
end

--- true when CUDA is available (a plug-in loaded and found a device: the simulated device
-- counts), else false and the reason.
function M.cuda_available()
  local ok
  if dl.cuda and dl.cuda.is_available then ok = dl.cuda.is_available()
  else ok = C.ddp_cuda_is_available() ~= 0 end
  if ok then return true end
  local why = ffi.string(C.ddp_cuda_unavailable_reason())
  return false, (why ~= "" and why or "CUDA is not available")
end

--- true when a real GPU is there (CUDA available and the plug-in is not the simulated
-- device), else false and why.
function M.real_gpu()
  local ok, why = M.cuda_available()
  if not ok then return false, why end
  local name = M.backend_name()
  if name == "cuda-sim" then return false, "the CUDA plug-in is the simulated device (cuda-sim)" end
  return true
end

--- The device's name ("NVIDIA H100 80GB HBM3"), "cpu", or "?" when it cannot be read.
function M.device_name(dev)
  local k = M.device_index(dev)
  if k < 0 then return "cpu" end
  local buf = ffi.new("char[256]")
  if C.ddp_cuda_device_name(k, buf, 256) ~= 0 then return "?" end
  return ffi.string(buf)
end

--- Versions the plug-in was built with: {cudart=, cublas=, cudnn=, nccl=} or nil.
function M.versions()
  local v = ffi.new("int[4]")
  if C.ddp_cuda_versions(v, v + 1, v + 2, v + 3) ~= 0 then return nil end
  return { cudart = v[0], cublas = v[1], cudnn = v[2], nccl = v[3] }
end

local has_device_to -- does t:to() take device strings? (probed once)

--- A copy of tensor t on device dev ("cpu", "cuda", "cuda:k"), or t when it is there
-- already. Differentiable: the gradient flows back to t. Through t:to(dev) when the front
-- end has it, else ddp_tensor_to_device.
function M.to(t, dev)
  if has_device_to == nil then has_device_to = dl.cuda ~= nil and dl.Tensor.cpu ~= nil end
  if has_device_to then return t:to(dev) end
  local k = M.device_index(dev)
  if C.ddp_tensor_device(t) == k then return t end
  note_fallback("t:to(device)")
  lib.check(C.ddp_tensor_to_device(lib.box, t, k, 0))
  return lib.wrap(lib.box[0])
end

--- t's data on the CPU (t itself when it is there).
function M.cpu(t) return M.to(t, "cpu") end

--- Move every parameter and buffer of module m to dev in place; returns m.
-- m:to(dev) (or m:cuda() / m:cpu()) when the front end has it. The fallback replaces each
-- floating or integer parameter/buffer in the module's registries by a device copy
-- (parameters stay nn.Parameters with their requires_grad): build optimizers after it.
function M.module_to(m, dev)
  if dl.cuda ~= nil and m.cuda ~= nil then
    if dev == "cpu" then return m:cpu() end
    return m:to(dev)
  end
  note_fallback("Module:cuda()/to(device)")
  local nn = require "ddplua.nn"
  local k = M.device_index(dev)
  local done = {}
  dl.no_grad(function()
    for _, mod in ipairs(m:modules()) do
      for _, registry in ipairs { "_parameters", "_buffers" } do
        local d = rawget(mod, registry)
        if d == nil then error("gpu_common.module_to: module has no " .. registry .. " registry", 2) end
        for _, n in ipairs(d.names) do
          local t = d.values[n]
          if t ~= nil and C.ddp_tensor_device(t) ~= k then
            local key = tonumber(ffi.cast("intptr_t", t))
            local new = done[key]
            if not new then
              lib.check(C.ddp_tensor_to_device(lib.box, t, k, 0))
              new = lib.wrap(lib.box[0])
              if registry == "_parameters" then new = nn.Parameter(new, t.requires_grad) end
              done[key] = new
            end
            d.values[n] = new
          end
        end
      end
    end
  end)
  return m
end

--- Wait for all queued work on dev (no-op for "cpu").
function M.synchronize(dev)
  local k = M.device_index(dev)
  if k < 0 then return end
  if dl.cuda and dl.cuda.synchronize then return dl.cuda.synchronize(k) end
  lib.check(C.ddp_cuda_synchronize(k))
end

--- Allow (true) or forbid (false) TF32 tensor cores for f32 matmul and convolution.
-- Returns the previous setting. No-op (returns false) without CUDA.
function M.set_tf32(flag)
  if not M.cuda_available() then return false end
  local prev = C.ddp_cuda_get_allow_tf32() ~= 0
  if dl.cuda and dl.cuda.set_allow_tf32 then dl.cuda.set_allow_tf32(flag)
  else lib.check(C.ddp_cuda_set_allow_tf32(flag and 1 or 0)) end
  return prev
end

--- Bytes held by live tensors on dev (0 for "cpu" or without CUDA).
function M.memory_allocated(dev)
  local k = M.device_index(dev)
  if k < 0 then return 0 end
  local out = ffi.new("int64_t[1]")
  if C.ddp_cuda_memory_stat(k, C.DDP_CUDA_MEM_ALLOCATED, out) ~= 0 then return 0 end
  return tonumber(out[0])
end

--- Peak bytes held on dev since the start (0 for "cpu").
function M.max_memory_allocated(dev)
  local k = M.device_index(dev)
  if k < 0 then return 0 end
  local out = ffi.new("int64_t[1]")
  if C.ddp_cuda_memory_stat(k, C.DDP_CUDA_MEM_MAX_ALLOCATED, out) ~= 0 then return 0 end
  return tonumber(out[0])
end

-- LuaJIT's collector does not see device memory (DESIGN.md, Tensors): the front end's
-- pressure counts CPU bytes. Benchmarks call this once per step so dead device tensors
-- go back to the caching allocator before the card fills up.
local gc_limit = 4 * 1024 ^ 3
--- Run a full collection when more than 4 GiB are held on dev; returns true when it did.
function M.collect_device_garbage(dev)
  if M.memory_allocated(dev) > gc_limit then
    collectgarbage("collect")
    return true
  end
  return false
end

--- Median of a list of numbers (the lower middle for an even count).
function M.median(xs)
  local s = {}
  for i = 1, #xs do s[i] = xs[i] end
  table.sort(s)
  return s[math.floor((#s + 1) / 2)]
end

--- Command-line flags of the form --name value / --flag into a table (values as strings,
-- bare flags as true).
function M.parse_args(argv, defaults)
  local opts = {}
  for k, v in pairs(defaults or {}) do opts[k] = v end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local name = a:match("^%-%-([%w_-]+)$")
    if not name then error("unexpected argument '" .. a .. "'", 0) end
    name = name:gsub("-", "_")
    local nxt = argv[i + 1]
    if nxt ~= nil and not nxt:match("^%-%-") then
      opts[name] = tonumber(nxt) or nxt
      i = i + 2
    else
      opts[name] = true
      i = i + 1
    end
  end
  return opts
end

return M
