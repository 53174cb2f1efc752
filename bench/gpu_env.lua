--- bench/gpu_env.lua: what ddplua sees of CUDA, as key=value lines (bench/run_gpu.sh puts
-- them in env.txt and the results' header). Always exits 0; cuda_available=0 with the
-- reason when there is no usable device.
--   build/ddplua bench/gpu_env.lua
local G = require "bench.gpu_common"
local dl = require "ddplua"

print("ddplua_version=" .. tostring(dl.version))
local ok, why = G.cuda_available()
print("cuda_available=" .. (ok and 1 or 0))
if not ok then
  print("cuda_reason=" .. tostring(why))
  return
end
print("cuda_backend=" .. G.backend_name())
print("cuda_device=" .. G.device_name("cuda:0"))
local v = G.versions()
if v then
  print(("cuda_versions=cudart %d, cublas %d, cudnn %d, nccl %d"):format(v.cudart, v.cublas, v.cudnn, v.nccl))
end
print("lua_device_api=" .. ((dl.cuda ~= nil and dl.Tensor.cpu ~= nil) and "yes" or "no (C fallbacks in bench/gpu_common.lua)"))
