// runtime/backend/cuda/plugin.cu: the CUDA plug-in (build/libddplua_cuda.so), loaded with
// dlopen by runtime/core/device.c the first time CUDA is asked for. The core library and
// the executable never link CUDA, so one build runs on machines without a GPU.
//
// For now the plug-in answers the probe (driver present? how many devices?) and proves the
// toolchain: it is built for sm_80 and sm_90 with explicit -gencode, links cuBLAS and NCCL
// from the toolkit, and never links -lcuda. Device tensors, kernels and the nccl backend
// arrive with the CUDA issue.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

#include "backend/cuda/plugin.h"

// A trivial kernel, so the fat binary really holds sm_80 and sm_90 code.
__global__ void ddp_cuda_fill_kernel(float *out, float value, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

extern "C" int ddp_cuda_plugin_probe(int *device_count, char *reason, size_t reason_len) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    snprintf(reason, reason_len, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(err),
             cudaGetErrorName(err));
    *device_count = 0;
    return 1;
  }
  if (count == 0) {
    snprintf(reason, reason_len, "no CUDA device found");
    *device_count = 0;
    return 1;
  }
  *device_count = count;
  return 0;
}

extern "C" int ddp_cuda_plugin_abi_version(void) { return DDP_CUDA_PLUGIN_ABI; }

// Versions of the libraries the plug-in was linked against, for `make config` and reports.
extern "C" void ddp_cuda_plugin_versions(int *cudart, int *cublas, int *nccl) {
  cudaRuntimeGetVersion(cudart);
  *cublas = CUBLAS_VERSION;
  *nccl = NCCL_VERSION_CODE;
}
