// runtime/backend/cuda/plugin.cu: the CUDA plug-in's table (build/libddplua_cuda.so),
// loaded with dlopen by runtime/core/device.c the first time CUDA is asked for. The core
// library and the executable never link CUDA, so one build runs on machines without a GPU.
//
// This file holds the probe, devices, streams, events, copies and the error check; the
// caching allocator is in allocator.cu, the kernels in the area files (elementwise.cu, ...)
// gathered by kernels.cu, the collectives in nccl.cu.
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>

#include <mutex>
#include <unordered_map>

#include "backend/cuda/cuda_internal.h"

enum { MAX_DEVICES = 64 };

int ddp_cuda_allow_tf32 = 0;

int ddp_cuda_fail(cudaError_t err, const char *op, const char *what, const char *file,
                  int line) {
  int status = err == cudaErrorMemoryAllocation ? DDP_ERR_MEMORY : DDP_ERR_STATE;
  (void)cudaGetLastError(); // reported now: not again by the next check
  return ddp_fail_at(file, line, status, "%s: %s failed: %s (%s)", op, what,
                     cudaGetErrorString(err), cudaGetErrorName(err));
}

// ---- devices -------------------------------------------------------------------------

static int probe(int *device_count, char *reason, size_t reason_len) {
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
  *device_count = count < MAX_DEVICES ? count : MAX_DEVICES;
  return 0;
}

static void versions(int *cudart, int *cublas, int *cudnn, int *nccl) {
  *cudart = 0;
  cudaRuntimeGetVersion(cudart);
  *cublas = CUBLAS_VERSION;
  *cudnn = (int)cudnnGetVersion();
  *nccl = NCCL_VERSION_CODE;
}

static int device_name(int device, char *out, size_t len) {
  cudaDeviceProp prop;
  DDP_CUDA_TRY(cudaGetDeviceProperties(&prop, device), "get_device_name");
  snprintf(out, len, "%s", prop.name);
  return DDP_OK;
}

int ddp_cuda_use_device(int device, const char *op) {
  int current = -1;
  DDP_CUDA_TRY(cudaGetDevice(&current), op);
  if (current != device) DDP_CUDA_TRY(cudaSetDevice(device), op);
  return DDP_OK;
}

int ddp_cuda_device(void) {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

static int set_device(int device) { return ddp_cuda_use_device(device, "set_device"); }

static int get_device(int *device) {
  DDP_CUDA_TRY(cudaGetDevice(device), "current_device");
  return DDP_OK;
}

static int synchronize(int device) {
  DDP_TRY(ddp_cuda_use_device(device, "synchronize"));
  DDP_CUDA_TRY(cudaDeviceSynchronize(), "synchronize");
  return DDP_OK;
}

// ---- streams -------------------------------------------------------------------------

// Per host thread and device: the stream work goes to (NULL: the legacy default stream).
static thread_local cudaStream_t current[MAX_DEVICES];

cudaStream_t ddp_cuda_stream(void) { return current[ddp_cuda_device()]; }

static int stream_create(void **out, int device, int priority) {
  DDP_TRY(ddp_cuda_use_device(device, "Stream"));
  cudaStream_t s;
  DDP_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority), "Stream");
  *out = s;
  return DDP_OK;
}

static int stream_destroy(void *s) {
  if (s) DDP_CUDA_TRY(cudaStreamDestroy((cudaStream_t)s), "Stream.free");
  return DDP_OK;
}

static int current_stream(void **out, int device) {
  if (device < 0 || device >= MAX_DEVICES)
    DDP_FAIL(DDP_ERR_ARG, "current_stream: invalid device %d", device);
  *out = current[device];
  return DDP_OK;
}

static int set_current_stream(int device, void *s) {
  if (device < 0 || device >= MAX_DEVICES)
    DDP_FAIL(DDP_ERR_ARG, "set_stream: invalid device %d", device);
  current[device] = (cudaStream_t)s;
  return DDP_OK;
}

static int stream_synchronize(void *s) {
  DDP_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s), "Stream.synchronize");
  return DDP_OK;
}

static int stream_wait_event(void *s, void *e) {
  DDP_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0), "Stream.wait_event");
  return DDP_OK;
}

// ---- events --------------------------------------------------------------------------

// The device of each event made by event_create: event_record on the NULL stream needs it
// (below). Guarded by event_lock.
static std::mutex event_lock;
static std::unordered_map<cudaEvent_t, int> *event_devices = new std::unordered_map<cudaEvent_t, int>;

static int event_create(void **out, int device, int timing) {
  DDP_TRY(ddp_cuda_use_device(device, "Event"));
  cudaEvent_t e;
  DDP_CUDA_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
               "Event");
  {
    std::lock_guard<std::mutex> g(event_lock);
    (*event_devices)[e] = device;
  }
  *out = e;
  return DDP_OK;
}

static int event_destroy(void *e) {
  if (!e) return DDP_OK;
  {
    std::lock_guard<std::mutex> g(event_lock);
    event_devices->erase((cudaEvent_t)e);
  }
  DDP_CUDA_TRY(cudaEventDestroy((cudaEvent_t)e), "Event.free");
  return DDP_OK;
}

// A NULL stream is the legacy default stream of the CURRENT device, and cudaEventRecord
// refuses an event and a stream of different devices (cudaErrorInvalidResourceHandle).
// The current device need not be the event's: the user's device (set_device) and CUDA's
// current one part after an op on another device (Note [current device]). So for the NULL
// stream the event's device (from event_create) is made current first: "the default
// stream of the event's device", which is what the callers mean (Event:record,
// runtime/comm/pg_nccl.c). A non-NULL stream carries its device. (stream_wait_event and
// stream_synchronize with the NULL stream still mean the current device's default
// stream: the API does not say which device the caller had in mind.)
// First GPU run: with two GPUs, run an op on cuda:1, then record an event of cuda:0 on its
// default stream and wait on it.
static int event_record(void *e, void *s) {
  if (!s) {
    int device = -1;
    {
      std::lock_guard<std::mutex> g(event_lock);
      auto it = event_devices->find((cudaEvent_t)e);
      if (it != event_devices->end()) device = it->second;
    }
    if (device >= 0) DDP_TRY(ddp_cuda_use_device(device, "Event.record"));
  }
  DDP_CUDA_TRY(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s), "Event.record");
  return DDP_OK;
}

static int event_synchronize(void *e) {
  DDP_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)e), "Event.synchronize");
  return DDP_OK;
}

static int event_query(void *e, int *done) {
  cudaError_t err = ddp_cuda_query_event((cudaEvent_t)e);
  if (err == cudaErrorNotReady) {
    *done = 0;
    return DDP_OK;
  }
  DDP_CUDA_TRY(err, "Event.query");
  *done = 1;
  return DDP_OK;
}

static int event_elapsed_ms(void *start, void *end, float *ms) {
  DDP_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end),
               "Event.elapsed_time");
  return DDP_OK;
}

// ---- copies --------------------------------------------------------------------------

// Between two devices: cudaMemcpyPeerAsync on the destination's current stream `s`, ordered
// both ways with the source device's current stream by events (no host wait): the copy
// starts after the work queued there (the source's producer), and later work there (a
// kernel overwriting the source, or the caching allocator handing a freed source block to
// a new tensor of that stream) waits for the copy. As PyTorch's copy_ between devices.
// cudaMemcpyPeerAsync works without peer access enabled (the driver stages through the
// host then); cudaDeviceEnablePeerAccess is never called here. Leaves the destination
// device current.
static int peer_copy(void *dst, int dst_device, const void *src, int src_device, size_t nbytes,
                     cudaStream_t s) {
  const char *op = "copy";
  cudaEvent_t src_done = NULL, copy_done = NULL;
  cudaError_t err = cudaSuccess;
  DDP_TRY(ddp_cuda_use_device(src_device, op));
  err = cudaEventCreateWithFlags(&src_done, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(src_done, current[src_device]);
  if (err == cudaSuccess) err = cudaSetDevice(dst_device);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(s, src_done, 0);
  if (err == cudaSuccess) err = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, s);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(copy_done, s);
  if (err == cudaSuccess) err = cudaSetDevice(src_device);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(current[src_device], copy_done, 0);
  if (err == cudaSuccess) err = cudaSetDevice(dst_device);
  // destroying a recorded event is fine: its resources go once the stream reaches it
  if (src_done) cudaEventDestroy(src_done);
  if (copy_done) cudaEventDestroy(copy_done);
  if (err != cudaSuccess)
    return ddp_cuda_fail(err, op, "copy between devices (events, cudaMemcpyPeerAsync)", __FILE__,
                         __LINE__);
  return DDP_OK;
}

static int copy(void *dst, int dst_device, const void *src, int src_device, size_t nbytes,
                int async) {
  if (nbytes == 0) return DDP_OK;
  int device = dst_device >= 0 ? dst_device : src_device;
  cudaMemcpyKind kind = dst_device >= 0 ? (src_device >= 0 ? cudaMemcpyDeviceToDevice
                                                           : cudaMemcpyHostToDevice)
                                        : (src_device >= 0 ? cudaMemcpyDeviceToHost
                                                           : cudaMemcpyHostToHost);
  if (device >= 0) DDP_TRY(ddp_cuda_use_device(device, "copy"));
  cudaStream_t s = device >= 0 ? current[device] : 0;
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
    DDP_TRY(peer_copy(dst, dst_device, src, src_device, nbytes, s));
  } else {
    // Host side pageable (not from host_alloc): still correct with async 1, as CUDA stages
    // such copies (host to device returns once the source is staged; device to host
    // returns once the copy is done), only not overlapped.
    DDP_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, kind, s), "copy");
  }
  if (!async) DDP_CUDA_TRY(cudaStreamSynchronize(s), "copy");
  return DDP_OK;
}

static int fill_bytes(void *dst, int device, int byte, size_t nbytes) {
  if (nbytes == 0) return DDP_OK;
  DDP_TRY(ddp_cuda_use_device(device, "zero_"));
  DDP_CUDA_TRY(cudaMemsetAsync(dst, byte, nbytes, current[device]), "zero_");
  return DDP_OK;
}

static int host_alloc(void **out, size_t nbytes) {
  *out = NULL;
  DDP_CUDA_TRY(cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable), "pin_memory");
  return DDP_OK;
}

static void host_free(void *p) {
  if (p) cudaFreeHost(p);
}

// ---- checks and flags ----------------------------------------------------------------

// Note [deferred errors] in cuda_internal.h.
static thread_local int deferred_status;
static thread_local char deferred_message[512];

cudaError_t ddp_cuda_query_event(cudaEvent_t e) {
  cudaError_t pending = cudaPeekAtLastError();
  cudaError_t err = cudaEventQuery(e);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError(); // "not ready" is no failure
    if (pending != cudaSuccess && pending != cudaErrorNotReady)
      ddp_cuda_defer_error(DDP_ERR_STATE, "CUDA error: %s (%s)", cudaGetErrorString(pending),
                           cudaGetErrorName(pending));
  }
  return err;
}

void ddp_cuda_defer_error(int status, const char *fmt, ...) {
  if (deferred_status) return; // the first failure is the one to report
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(deferred_message, sizeof deferred_message, fmt, ap);
  va_end(ap);
  deferred_status = status ? status : DDP_ERR_STATE;
}

static int check(const char *op) {
  if (deferred_status) {
    int status = deferred_status;
    deferred_status = 0;
    return ddp_fail_at(__FILE__, __LINE__, status, "%s: %s", op, deferred_message);
  }
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return DDP_OK;
  return ddp_fail_at(__FILE__, __LINE__, DDP_ERR_STATE, "%s: CUDA error: %s (%s)", op,
                     cudaGetErrorString(err), cudaGetErrorName(err));
}

static void set_allow_tf32(int on) { ddp_cuda_allow_tf32 = on != 0; }
static int get_allow_tf32(void) { return ddp_cuda_allow_tf32; }

// ---- the table -----------------------------------------------------------------------

// allocator.cu
extern "C" int ddp_cuda_caching_malloc(void **out, int device, size_t nbytes);
extern "C" void ddp_cuda_caching_free(void *p);
extern "C" int ddp_cuda_caching_record_stream(void *p, void *stream);
extern "C" int ddp_cuda_caching_empty_cache(void);
extern "C" int ddp_cuda_caching_stats(int device, ddp_cuda_memory_stats *out);
extern "C" int ddp_cuda_caching_reset_peak(int device);
// kernels.cu, nccl.cu
extern "C" const ddp_kernels *ddp_cuda_kernel_table(void);
extern "C" const struct ddp_nccl_api *ddp_cuda_nccl_table(void) __attribute__((weak));

extern "C" const ddp_cuda_api *ddp_cuda_plugin_api(void) {
  static ddp_cuda_api api;
  static bool ready;
  if (!ready) {
    api.abi = DDP_CUDA_PLUGIN_ABI;
    api.name = "cuda";
    api.probe = probe;
    api.versions = versions;
    api.device_name = device_name;
    api.set_device = set_device;
    api.get_device = get_device;
    api.synchronize = synchronize;
    api.malloc = ddp_cuda_caching_malloc;
    api.free = ddp_cuda_caching_free;
    api.record_stream = ddp_cuda_caching_record_stream;
    api.empty_cache = ddp_cuda_caching_empty_cache;
    api.memory_stats = ddp_cuda_caching_stats;
    api.reset_peak = ddp_cuda_caching_reset_peak;
    api.host_alloc = host_alloc;
    api.host_free = host_free;
    api.memcpy = copy;
    api.memset = fill_bytes;
    api.stream_create = stream_create;
    api.stream_destroy = stream_destroy;
    api.current_stream = current_stream;
    api.set_current_stream = set_current_stream;
    api.stream_synchronize = stream_synchronize;
    api.stream_wait_event = stream_wait_event;
    api.event_create = event_create;
    api.event_destroy = event_destroy;
    api.event_record = event_record;
    api.event_synchronize = event_synchronize;
    api.event_query = event_query;
    api.event_elapsed_ms = event_elapsed_ms;
    api.check = check;
    api.set_allow_tf32 = set_allow_tf32;
    api.get_allow_tf32 = get_allow_tf32;
    api.kernels = ddp_cuda_kernel_table();
    api.nccl = ddp_cuda_nccl_table ? ddp_cuda_nccl_table() : NULL;
    ready = true; // the core calls this once, under pthread_once
  }
  return &api;
}
