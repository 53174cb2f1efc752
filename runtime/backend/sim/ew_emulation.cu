// runtime/backend/sim/ew_emulation.cu: a test double for the specs (built as
// build/libddplua_cuda_emul.so where nvcc exists): the simulated device
// (libddplua_cuda_sim.so, beside this library: host memory, the CPU kernels) with the
// element-wise entries of its kernel table replaced by the CUDA ones of
// runtime/backend/cuda/elementwise.cu compiled for the host (DDP_EW_HOST_EMULATION): the
// kernels' loops run on the CPU with start 0 and step 1 instead of a grid.
//
// It lets a machine without a GPU run that file's host side (geometry, coalescing, the
// 32/64-bit index choice, dtype dispatch, host scalars, the float4 paths' indexing) and its
// element code (loads, stores, conversions, formulas) through every element-wise front
// door. It cannot catch what only a GPU shows: launch configuration, races between
// threads, device math differing from the host's libm.
#define DDP_EW_HOST_EMULATION 1
#include "backend/cuda/elementwise.cu"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

extern "C" const ddp_cuda_api *ddp_cuda_plugin_api(void) {
  static ddp_cuda_api api;
  static ddp_kernels kernels;
  static const ddp_cuda_api *base;
  if (base) return &api;
  Dl_info info;
  char path[4096];
  if (!dladdr((void *)ddp_cuda_plugin_api, &info) || !info.dli_fname) return nullptr;
  snprintf(path, sizeof path, "%s", info.dli_fname);
  char *slash = strrchr(path, '/');
  size_t dir = slash ? (size_t)(slash - path + 1) : 0;
  snprintf(path + dir, sizeof path - dir, "libddplua_cuda_sim.so");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return nullptr;
  auto get = (const ddp_cuda_api *(*)(void))dlsym(h, "ddp_cuda_plugin_api");
  const ddp_cuda_api *sim = get ? get() : nullptr;
  if (!sim || !sim->kernels) return nullptr;
  kernels = *sim->kernels;
  ddp_cuda_register_elementwise(&kernels);
  api = *sim;
  api.name = "cuda-emulated";
  api.kernels = &kernels;
  base = sim;
  return &api;
}
