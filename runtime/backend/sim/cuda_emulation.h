// runtime/backend/sim/cuda_emulation.h: just enough of CUDA's execution model to run the
// kernels of runtime/backend/cuda/*.cu on the host, unchanged. The Makefile compiles each
// emulatable area file with the host compiler and `-include` of this header
// (build/libddplua_cuda_emul.so, runtime/backend/sim/emul_plugin.cc); nothing in the
// production files knows about it: they launch through DDP_CUDA_LAUNCH
// (runtime/backend/cuda/cuda_internal.h), which this header defines first.
//
// Note [block emulation]: blocks of a grid run one after the other on the calling host
// thread. Each CUDA thread of a block is a coroutine (ucontext) with its own stack, so
// locals are per thread and a function-level `static` stands for __shared__. Threads run
// in order until they reach a barrier: __syncthreads (all live threads of the block) or a
// warp exchange (__shfl_*_sync: the live lanes of the warp); the scheduler resumes them
// round after round until every one has passed it. Exited threads leave the barrier counts,
// as on sm_70+. When thread 0 of a block finishes without reaching any barrier, the kernel
// does not cooperate and the block's other threads run as plain calls (fast); a barrier
// reached then is a kernel whose threads disagree about barriers, reported and aborted.
// The schedule is deterministic: atomics add in thread order, launch after launch.
//
// It shows what the code computes for a given launch geometry (index arithmetic,
// grid-stride tails, shared-memory trees, shuffles, atomics, dtype dispatch, host-side
// checks). It cannot show a GPU's memory model or real concurrency (threads never race
// here), timing, device math (host libm here) or the cuBLAS / cuDNN / NCCL areas.
#ifndef DDP_CUDA_EMULATION_H
#define DDP_CUDA_EMULATION_H

// CUDA's own host headers (the host compiler parses them): dim3, uint4, cudaError_t,
// __half, __nv_bfloat16 and their conversions. The runtime calls the kernels' host code
// makes are defined by runtime/backend/sim/emul_plugin.cc (no libcudart).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <mutex>

namespace ddp_emul {

// The position of the running CUDA thread, and the launch's geometry.
inline dim3 thread_idx, block_idx, block_dim, grid_dim;

// Run f once per CUDA thread of every block of the grid (Note [block emulation]). Launches
// from several host threads take turns. Defined in runtime/backend/sim/emul_plugin.cc.
void launch(dim3 grid, dim3 block, const std::function<void()> &f);

// Barriers of the running block: every live thread of the block, or of warp `warp`.
void sync_block(void);
void sync_warp(unsigned warp);

// The linear index of the running thread in its block, and the block's thread count.
inline unsigned lane_linear(void) {
  return (thread_idx.z * block_dim.y + thread_idx.y) * block_dim.x + thread_idx.x;
}
inline unsigned block_threads(void) { return block_dim.x * block_dim.y * block_dim.z; }

// The value of each thread's last warp exchange, by linear thread index (8 bytes each).
inline unsigned char shfl_slots[1024 * 8];

} // namespace ddp_emul

#define threadIdx ddp_emul::thread_idx
#define blockIdx ddp_emul::block_idx
#define blockDim ddp_emul::block_dim
#define gridDim ddp_emul::grid_dim
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

// The one launch form of the production files: DDP_CUDA_LAUNCH((kernel<...>), grid, block,
// shared bytes, stream, args...). Dynamic shared memory is not emulated (no kernel uses it).
#define DDP_EMUL_UNPAREN(...) __VA_ARGS__
#define DDP_CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                               \
  ((void)(smem), (void)(stream),                                                             \
   ddp_emul::launch(dim3(grid), dim3(block), [=]() { DDP_EMUL_UNPAREN kernel(__VA_ARGS__); }))

// CUDA's template form, which its headers offer only to nvcc: a __device__ variable is a
// host variable here.
template <typename S>
cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const S &symbol, size_t count, size_t offset = 0,
                                      cudaMemcpyKind kind = cudaMemcpyDeviceToHost,
                                      cudaStream_t stream = 0) {
  return ::cudaMemcpyFromSymbolAsync(dst, (const void *)&symbol, count, offset, kind, stream);
}

inline void __syncthreads() { ddp_emul::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  ddp_emul::sync_warp(ddp_emul::lane_linear() / 32);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

namespace ddp_emul {
// Every lane of the warp publishes v, then reads lane `src` (its own value when src is
// outside the warp or the block, as __shfl_down_sync past the end).
template <typename V> V exchange(V v, unsigned src_lane, bool keep_own) {
  static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
  const unsigned lin = lane_linear(), warp = lin / 32;
  memcpy(shfl_slots + lin * 8, &v, sizeof v);
  sync_warp(warp);
  V r = v;
  const unsigned src = warp * 32 + src_lane;
  if (!keep_own && src < block_threads()) memcpy(&r, shfl_slots + src * 8, sizeof r);
  sync_warp(warp);
  return r;
}
} // namespace ddp_emul

template <typename V> V __shfl_xor_sync(unsigned, V v, int lane_mask, int = 32) {
  unsigned lane = ddp_emul::lane_linear() % 32;
  return ddp_emul::exchange(v, lane ^ (unsigned)lane_mask, false);
}
template <typename V> V __shfl_down_sync(unsigned, V v, unsigned delta, int = 32) {
  unsigned lane = ddp_emul::lane_linear() % 32;
  return ddp_emul::exchange(v, lane + delta, lane + delta >= 32);
}
template <typename V> V __shfl_sync(unsigned, V v, int src_lane, int = 32) {
  return ddp_emul::exchange(v, (unsigned)src_lane % 32, false);
}

// ---- atomics: threads never interleave between barriers here, so a plain update is atomic
// (Note [block emulation]) ----

inline int atomicAdd(int *p, int v) { int o = *p; *p = o + v; return o; }
inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  unsigned long long o = *p;
  *p = o + v;
  return o;
}
// float and double: one rounding of the exact sum, as the hardware's atomic add (RN).
inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
// 16-bit floats: the sum of two is exact in double, so one rounding, as __hadd.
inline __half atomicAdd(__half *p, __half v) {
  __half o = *p;
  *p = __double2half((double)__half2float(o) + (double)__half2float(v));
  return o;
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v) {
  __nv_bfloat16 o = *p;
  *p = __double2bfloat16((double)__bfloat162float(o) + (double)__bfloat162float(v));
  return o;
}
inline unsigned atomicCAS(unsigned *p, unsigned compare, unsigned val) {
  unsigned o = *p;
  if (o == compare) *p = val;
  return o;
}
inline int atomicCAS(int *p, int compare, int val) {
  return (int)atomicCAS((unsigned *)p, (unsigned)compare, (unsigned)val);
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long compare,
                                    unsigned long long val) {
  unsigned long long o = *p;
  if (o == compare) *p = val;
  return o;
}

#endif
