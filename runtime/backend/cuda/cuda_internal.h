// runtime/backend/cuda/cuda_internal.h: what the plug-in's .cu files share: the core's
// tensor struct and error recording, the kernel table, the current stream, launch sizes
// and error checks. Included by runtime/backend/cuda/*.cu only.
#ifndef DDP_CUDA_INTERNAL_H
#define DDP_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

// The CPU headers are C99; `restrict` is spelled __restrict__ in C++.
#define restrict __restrict__
extern "C" {
#include "backend/kernels.h"
#include "core/core.h"
}
#undef restrict

#include "backend/cuda/plugin.h"

// The stream kernels of this thread go to: the current stream of the current device
// (runtime/backend/cuda/plugin.cu).
cudaStream_t ddp_cuda_stream(void);
// The current device of this thread.
int ddp_cuda_device(void);
// Make `device` current for this thread (cudaSetDevice), recording a DDP error on failure.
int ddp_cuda_use_device(int device, const char *op);

// Record a failed CUDA call as a DDP error: "<op>: <what> failed: <message> (<name>)". It
// also clears the runtime's last-error state (cudaGetLastError), so a failure that has been
// reported here is not reported a second time, under another op's name, by the next
// ddp_device_check (sticky errors stay: CUDA keeps returning them).
int ddp_cuda_fail(cudaError_t err, const char *op, const char *what, const char *file, int line);

// cudaEventQuery for polling: cudaSuccess when done, cudaErrorNotReady while pending, else
// the error. The runtime records cudaErrorNotReady as the thread's last error, which the
// next ddp_device_check (cudaGetLastError) would report as a failure ("device not ready"):
// it is cleared here, and a different error that was pending before the query is kept as
// a deferred error (Note [deferred errors]) rather than lost. Every event poll in the
// plug-in goes through this (PyTorch clears it the same way, pytorch#18584, #61554).
cudaError_t ddp_cuda_query_event(cudaEvent_t e);

// Note [deferred errors]: a table entry that returns void (gemm, the pooling kernels) can
// fail outside a kernel launch, in a library call (cuBLAS). It records the failure here
// ("<what> failed: <reason>"), and the ops layer's next ddp_device_check(device, op) (the
// plug-in's check) reports it as "<op>: <what> failed: <reason>" with `status`, and clears
// it. Per host thread; the first failure is kept until it is reported.
void ddp_cuda_defer_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Evaluate a CUDA runtime call; on failure record the error and return its status.
#define DDP_CUDA_TRY(call, op)                                                             \
  do {                                                                                     \
    cudaError_t ddp_cuda_err_ = (call);                                                    \
    if (ddp_cuda_err_ != cudaSuccess)                                                      \
      return ddp_cuda_fail(ddp_cuda_err_, (op), #call, __FILE__, __LINE__);                \
  } while (0)

// Note [one launch form]: every kernel launch of runtime/backend/cuda/*.cu is
//   DDP_CUDA_LAUNCH((kernel<...>), grid, block, shared_bytes, stream, args...);
// (the kernel in parentheses, so template commas pass through). Here it is CUDA's <<<>>>;
// the emulated device (runtime/backend/sim/cuda_emulation.h, given to the host compiler with
// -include before this header) defines it first, to run the same files on the host.
#define DDP_CUDA_UNPAREN(...) __VA_ARGS__
#ifndef DDP_CUDA_LAUNCH
#define DDP_CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                              \
  DDP_CUDA_UNPAREN kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

// Threads per block for element-wise kernels, and the grid for n elements (grid-stride
// loops cover the rest: the grid is capped so huge tensors do not overflow gridDim.x).
enum { DDP_CUDA_THREADS = 256 };
static inline unsigned ddp_cuda_blocks(int64_t n, int threads = DDP_CUDA_THREADS) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 8) b = 65535LL * 8;
  return (unsigned)b;
}

// A kernel table area registers its entries here (runtime/backend/cuda/kernels.cu calls
// every register function that was linked in).
extern "C" {
void ddp_cuda_register_elementwise(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_reduce(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_matmul(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_conv(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_pool(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_loss(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_norm(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_optim(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_shape(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_attention(ddp_kernels *k) __attribute__((weak));
void ddp_cuda_register_collective(ddp_kernels *k) __attribute__((weak));
}

// TF32 switch (runtime/backend/cuda/plugin.cu), read by the GEMM and convolution kernels.
extern int ddp_cuda_allow_tf32;

#endif
