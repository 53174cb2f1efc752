/* ---------------------------------------------------------------------------------------
 * CUDA devices: moving tensors, memory, streams and events (runtime/ops/device_copy.c,
 * runtime/backend/registry.c, runtime/backend/cuda_api.c)
 *
 * Devices are numbered as in ddp_tensor_device: DDP_DEVICE_CPU (-1) or a CUDA ordinal.
 * Everything here goes through the CUDA plug-in (build/libddplua_cuda.so, opened on first
 * use; $DDPLUA_CUDA_PLUGIN names another). Without it, or without a driver or a GPU, every
 * call that needs a device fails with DDP_ERR_UNAVAILABLE "CUDA is not available: <why>".
 * ------------------------------------------------------------------------------------- */

/* A copy of t on `device` (any device to any other; t itself, retained, when it is there
 * already), contiguous. non_blocking 1 lets a copy between pinned host memory and a device
 * return before it finishes (it is ordered on the device's current stream; as PyTorch's
 * non_blocking=True). Differentiable: the gradient is copied back to t's device. */
int ddp_tensor_to_device(ddp_tensor **out, ddp_tensor *t, int device, int non_blocking);

/* A copy of CPU tensor t in page-locked (pinned) host memory, which the device can copy
 * from and to asynchronously. Errors: DDP_ERR_ARG when t is not on the CPU;
 * DDP_ERR_UNAVAILABLE without CUDA. */
int ddp_tensor_pin_memory(ddp_tensor **out, ddp_tensor *t);
/* 1 when t's memory is pinned host memory. */
int ddp_tensor_is_pinned(const ddp_tensor *t);

/* Name of the plug-in in use: "cuda", or "cuda-sim" for the simulated device of the specs
 * (runtime/backend/sim/plugin.c); "" when none loaded. */
const char *ddp_cuda_backend_name(void);

/* Versions the plug-in was built with (0 when unknown): CUDA runtime (e.g. 13000), cuBLAS,
 * cuDNN, NCCL. DDP_ERR_UNAVAILABLE without CUDA. */
int ddp_cuda_versions(int *cudart, int *cublas, int *cudnn, int *nccl);

/* The calling thread's current device: where tensors made for "cuda" without an index go
 * (torch.cuda.set_device). Each op runs on its tensors' device whatever this says. */
int ddp_cuda_set_device(int device);
int ddp_cuda_current_device(int *device);
/* The device's marketing name, e.g. "NVIDIA H100 80GB HBM3", into out (len bytes). */
int ddp_cuda_device_name(int device, char *out, size_t len);
/* Wait for all work queued on every stream of the device. */
int ddp_cuda_synchronize(int device);

/* Caching allocator counters of a device, bytes (torch.cuda.memory_allocated and friends). */
enum ddp_cuda_memory_stat {
  DDP_CUDA_MEM_ALLOCATED = 0,     /* held by live tensors */
  DDP_CUDA_MEM_MAX_ALLOCATED = 1, /* peak of the above since start or the last reset */
  DDP_CUDA_MEM_RESERVED = 2,      /* obtained from cudaMalloc: allocated + cached */
  DDP_CUDA_MEM_MAX_RESERVED = 3,
  DDP_CUDA_MEM_ALLOC_CALLS = 4,   /* allocations served (a count, not bytes) */
  DDP_CUDA_MEM_DEVICE_CALLS = 5   /* of which went to cudaMalloc (a count) */
};
/* *out = the counter `which` (enum ddp_cuda_memory_stat) of `device`; resetting sets the
 * two peaks to the current values. DDP_ERR_UNAVAILABLE without CUDA. */
int ddp_cuda_memory_stat(int device, int which, int64_t *out);
int ddp_cuda_reset_peak_memory_stats(int device);
/* Give every cached (free) block back to the driver. */
int ddp_cuda_empty_cache(void);

/* Allow TF32 tensor cores for f32 matmul and convolution (torch.backends.cuda.matmul.
 * allow_tf32); off by default. Faster, with about 10 bits of mantissa in the products. */
int ddp_cuda_set_allow_tf32(int allow);
int ddp_cuda_get_allow_tf32(void);

/* Streams: queues of device work. A thread's current stream per device receives its
 * kernels and copies; NULL stands for the device's default stream. */
typedef struct ddp_stream ddp_stream;
typedef struct ddp_event ddp_event;
/* A new non-blocking stream on device; priority: 0 normal, negative higher. */
int ddp_cuda_stream_new(ddp_stream **out, int device, int priority);
int ddp_cuda_stream_free(ddp_stream *s);
int ddp_cuda_current_stream(ddp_stream **out, int device); /* NULL: the default stream */
int ddp_cuda_set_stream(int device, ddp_stream *s);
int ddp_cuda_stream_synchronize(ddp_stream *s);
/* Work queued on s after this call waits until e has happened. */
int ddp_cuda_stream_wait_event(ddp_stream *s, ddp_event *e);
/* Device t's memory is also used by work on stream s: the caching allocator keeps it from
 * reuse until that work is done, even after t is freed (torch's Tensor.record_stream). */
int ddp_cuda_record_stream(ddp_tensor *t, ddp_stream *s);

/* Events: markers in a stream, for ordering and timing. */
int ddp_cuda_event_new(ddp_event **out, int device, int enable_timing);
int ddp_cuda_event_free(ddp_event *e);
int ddp_cuda_event_record(ddp_event *e, ddp_stream *s);
int ddp_cuda_event_synchronize(ddp_event *e);
int ddp_cuda_event_query(ddp_event *e, int *done); /* 1 once everything before it ran */
/* Milliseconds between two recorded timing events. */
int ddp_cuda_event_elapsed_ms(ddp_event *start, ddp_event *end, float *ms);
