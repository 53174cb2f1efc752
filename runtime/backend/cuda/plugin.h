/* runtime/backend/cuda/plugin.h: the C interface between the runtime and a device plug-in.
 *
 * The device registry (runtime/backend/registry.c) opens build/libddplua_cuda.so with dlopen, looks up
 * ddp_cuda_plugin_api() and from then on reaches the device only through the table it
 * returns. The plug-in links against libddplua.so (for ddp_fail_at and the tensor struct),
 * never the other way round, so the core has no link-time CUDA dependency.
 *
 * Conventions for every entry:
 *  - Functions returning int give DDP_OK or a DDP_ERR_* status with the error recorded by
 *    ddp_fail_at (message naming the CUDA call and its cudaError name).
 *  - `device` is a CUDA ordinal (0 .. count-1). Streams and events are opaque pointers
 *    (cudaStream_t, cudaEvent_t); the NULL stream means the device's default stream.
 *  - Each host thread has a current device (as cudaSetDevice) and, per device, a current
 *    stream (as torch.cuda.current_stream); kernels and copies go to that stream.
 *
 * Bump DDP_CUDA_PLUGIN_ABI whenever this struct or ddp_kernels changes. */
#ifndef DDP_CUDA_PLUGIN_H
#define DDP_CUDA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define DDP_CUDA_PLUGIN_ABI 6

#ifdef __cplusplus
extern "C" {
#endif

struct ddp_kernels;
struct ddp_nccl_api;

/* Caching allocator counters of one device, bytes. allocated: held by live tensors;
 * reserved: obtained from cudaMalloc (allocated + cached). */
typedef struct ddp_cuda_memory_stats {
  int64_t allocated, max_allocated, reserved, max_reserved;
  int64_t alloc_calls, cuda_malloc_calls; /* requests served, and those that hit cudaMalloc */
} ddp_cuda_memory_stats;

typedef struct ddp_cuda_api {
  int abi; /* DDP_CUDA_PLUGIN_ABI */
  const char *name; /* "cuda", or "cuda-sim" for the host-memory test double */

  /* ---- devices ---- */
  /* Count devices: 0 with *count > 0 when usable, else non-zero with the reason written
   * into reason (reason_len bytes); never records a DDP error (runs before any is wanted). */
  int (*probe)(int *count, char *reason, size_t reason_len);
  /* Versions linked in (0 when absent): CUDA runtime, cuBLAS, cuDNN, NCCL. */
  void (*versions)(int *cudart, int *cublas, int *cudnn, int *nccl);
  int (*device_name)(int device, char *out, size_t len);
  int (*set_device)(int device);
  int (*get_device)(int *device);
  int (*synchronize)(int device); /* every stream of the device */

  /* ---- memory ---- */
  /* Caching allocator: a block of at least nbytes on `device`, for use on that device's
   * current stream. Freed blocks go back to a cache per (device, stream) and are reused
   * by later requests on that stream without a synchronisation. */
  int (*malloc)(void **out, int device, size_t nbytes);
  void (*free)(void *p);
  /* Mark block p as used by `stream` too: it is not reused until the work queued on that
   * stream at free time has finished (torch's record_stream). */
  int (*record_stream)(void *p, void *stream);
  int (*empty_cache)(void); /* cudaFree every cached block of every device */
  int (*memory_stats)(int device, ddp_cuda_memory_stats *out);
  int (*reset_peak)(int device);
  /* Page-locked host memory (cudaHostAlloc), for asynchronous copies. */
  int (*host_alloc)(void **out, size_t nbytes);
  void (*host_free)(void *p);
  /* Copy nbytes; a device of -1 means host memory. Device-side copies run on the current
   * stream of the device involved (the destination's when both are devices). With async
   * 0 the call returns once the copy is done; with async 1 it may return before (the host
   * side must then be pinned and stay alive until the stream reaches the copy). */
  int (*memcpy)(void *dst, int dst_device, const void *src, int src_device, size_t nbytes,
                int async);
  int (*memset)(void *dst, int device, int byte, size_t nbytes); /* on the current stream */

  /* ---- streams and events ---- */
  int (*stream_create)(void **out, int device, int priority); /* non-blocking stream */
  int (*stream_destroy)(void *stream);
  int (*current_stream)(void **out, int device); /* NULL: the default stream */
  int (*set_current_stream)(int device, void *stream);
  int (*stream_synchronize)(void *stream);
  int (*stream_wait_event)(void *stream, void *event);
  int (*event_create)(void **out, int device, int timing);
  int (*event_destroy)(void *event);
  int (*event_record)(void *event, void *stream);
  int (*event_synchronize)(void *event);
  int (*event_query)(void *event, int *done);
  int (*event_elapsed_ms)(void *start, void *end, float *ms);

  /* ---- kernels ---- */
  /* DDP_OK, or the pending CUDA error (a failed launch, a fault from earlier
   * asynchronous work) recorded as a DDP error naming `op`. */
  int (*check)(const char *op);
  /* TF32 tensor cores for f32 GEMM and convolution (PyTorch's allow_tf32). Off by default
   * for GEMM, as PyTorch >= 1.12. */
  void (*set_allow_tf32)(int on);
  int (*get_allow_tf32)(void);
  const struct ddp_kernels *kernels;

  /* ---- collectives (runtime/backend/cuda/nccl_api.h); NULL when built without NCCL ---- */
  const struct ddp_nccl_api *nccl;
} ddp_cuda_api;

/* The plug-in's single export: its table, or NULL. */
const ddp_cuda_api *ddp_cuda_plugin_api(void);

#ifdef __cplusplus
}
#endif

#endif
