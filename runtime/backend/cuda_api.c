/* runtime/backend/cuda_api.c: the public CUDA calls of ddplua/cuda.h (devices, streams,
 * events, caching-allocator statistics), each a checked call into the loaded plug-in's
 * table (runtime/backend/registry.c). */
#include <stdio.h>

#include "backend/cuda/plugin.h"
#include "backend/registry.h"
#include "core/core.h"

/* Note [current device]: CUDA runs kernels on the calling thread's current device, so
 * before a tensor's kernels run its device is made current (PyTorch's DeviceGuard, without
 * the restore: ddp_kernels_for). What the user chose with set_device is kept apart
 * (user_device) and is what "cuda" without an index means, so an op on cuda:1 never changes
 * where the next "cuda" tensor goes. */
static __thread int user_device;

/* The plug-in for a call that needs one, or the "not available" error from the caller. */
#define NEED_CUDA(op)                                                                      \
  do {                                                                                     \
    if (!ddp_cuda_plugin())                                                                \
      DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA is not available: %s", (op),               \
               ddp_cuda_unavailable_reason());                                              \
  } while (0)

int ddp_cuda_versions(int *cudart, int *cublas, int *cudnn, int *nccl) {
  NEED_CUDA("versions");
  ddp_cuda_plugin()->versions(cudart, cublas, cudnn, nccl);
  return DDP_OK;
}

int ddp_cuda_set_device(int device) {
  DDP_TRY(ddp_check_device(device, "set_device"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "set_device: expects a CUDA device, got cpu");
  DDP_TRY(ddp_cuda_plugin()->set_device(device));
  user_device = device;
  return DDP_OK;
}

int ddp_cuda_current_device(int *device) {
  NEED_CUDA("current_device");
  *device = user_device;
  return DDP_OK;
}

int ddp_cuda_device_name(int device, char *out, size_t len) {
  DDP_TRY(ddp_check_device(device, "get_device_name"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "get_device_name: expects a CUDA device");
  return ddp_cuda_plugin()->device_name(device, out, len);
}

int ddp_cuda_synchronize(int device) {
  DDP_TRY(ddp_check_device(device, "synchronize"));
  if (device == DDP_DEVICE_CPU) return DDP_OK;
  return ddp_cuda_plugin()->synchronize(device);
}

int ddp_cuda_memory_stat(int device, int which, int64_t *out) {
  *out = 0;
  DDP_TRY(ddp_check_device(device, "memory_stats"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "memory_stats: expects a CUDA device");
  ddp_cuda_memory_stats s;
  DDP_TRY(ddp_cuda_plugin()->memory_stats(device, &s));
  switch (which) {
  case DDP_CUDA_MEM_ALLOCATED: *out = s.allocated; break;
  case DDP_CUDA_MEM_MAX_ALLOCATED: *out = s.max_allocated; break;
  case DDP_CUDA_MEM_RESERVED: *out = s.reserved; break;
  case DDP_CUDA_MEM_MAX_RESERVED: *out = s.max_reserved; break;
  case DDP_CUDA_MEM_ALLOC_CALLS: *out = s.alloc_calls; break;
  case DDP_CUDA_MEM_DEVICE_CALLS: *out = s.cuda_malloc_calls; break;
  default: DDP_FAIL(DDP_ERR_ARG, "memory_stats: unknown statistic %d", which);
  }
  return DDP_OK;
}

int ddp_cuda_reset_peak_memory_stats(int device) {
  DDP_TRY(ddp_check_device(device, "reset_peak_memory_stats"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "reset_peak_memory_stats: expects a CUDA device");
  return ddp_cuda_plugin()->reset_peak(device);
}

int ddp_cuda_empty_cache(void) {
  NEED_CUDA("empty_cache");
  return ddp_cuda_plugin()->empty_cache();
}

int ddp_cuda_set_allow_tf32(int allow) {
  NEED_CUDA("allow_tf32");
  ddp_cuda_plugin()->set_allow_tf32(allow);
  return DDP_OK;
}

int ddp_cuda_get_allow_tf32(void) {
  const ddp_cuda_api *p = ddp_cuda_plugin();
  return p ? p->get_allow_tf32() : 0;
}

int ddp_cuda_stream_new(ddp_stream **out, int device, int priority) {
  *out = NULL;
  DDP_TRY(ddp_check_device(device, "Stream"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "Stream: expects a CUDA device");
  return ddp_cuda_plugin()->stream_create((void **)out, device, priority);
}

int ddp_cuda_stream_free(ddp_stream *s) { return s && ddp_cuda_plugin() ? ddp_cuda_plugin()->stream_destroy(s) : DDP_OK; }

int ddp_cuda_current_stream(ddp_stream **out, int device) {
  *out = NULL;
  DDP_TRY(ddp_check_device(device, "current_stream"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "current_stream: expects a CUDA device");
  return ddp_cuda_plugin()->current_stream((void **)out, device);
}

int ddp_cuda_set_stream(int device, ddp_stream *s) {
  DDP_TRY(ddp_check_device(device, "set_stream"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "set_stream: expects a CUDA device");
  return ddp_cuda_plugin()->set_current_stream(device, s);
}

int ddp_cuda_stream_synchronize(ddp_stream *s) {
  NEED_CUDA("Stream.synchronize");
  return ddp_cuda_plugin()->stream_synchronize(s);
}

int ddp_cuda_stream_wait_event(ddp_stream *s, ddp_event *e) {
  NEED_CUDA("Stream.wait_event");
  if (!e) DDP_FAIL(DDP_ERR_ARG, "Stream.wait_event: event is NULL");
  return ddp_cuda_plugin()->stream_wait_event(s, e);
}

int ddp_cuda_record_stream(ddp_tensor *t, ddp_stream *s) {
  DDP_TRY(ddp_check_alive(t, "record_stream", "self"));
  if (t->storage->kind != DDP_STORAGE_DEVICE)
    DDP_FAIL(DDP_ERR_ARG, "record_stream: the tensor is not in CUDA memory (it is on %s)",
             ddp_device_str(t->device));
  return ddp_cuda_plugin()->record_stream(t->storage->data, s);
}

int ddp_cuda_event_new(ddp_event **out, int device, int enable_timing) {
  *out = NULL;
  DDP_TRY(ddp_check_device(device, "Event"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "Event: expects a CUDA device");
  return ddp_cuda_plugin()->event_create((void **)out, device, enable_timing);
}

int ddp_cuda_event_free(ddp_event *e) { return e && ddp_cuda_plugin() ? ddp_cuda_plugin()->event_destroy(e) : DDP_OK; }

#define NEED_EVENT(e, op)                                                                  \
  do {                                                                                     \
    NEED_CUDA(op);                                                                         \
    if (!(e)) DDP_FAIL(DDP_ERR_ARG, "%s: event is NULL", (op));                            \
  } while (0)

int ddp_cuda_event_record(ddp_event *e, ddp_stream *s) {
  NEED_EVENT(e, "Event.record");
  return ddp_cuda_plugin()->event_record(e, s);
}

int ddp_cuda_event_synchronize(ddp_event *e) {
  NEED_EVENT(e, "Event.synchronize");
  return ddp_cuda_plugin()->event_synchronize(e);
}

int ddp_cuda_event_query(ddp_event *e, int *done) {
  NEED_EVENT(e, "Event.query");
  return ddp_cuda_plugin()->event_query(e, done);
}

int ddp_cuda_event_elapsed_ms(ddp_event *start, ddp_event *end, float *ms) {
  NEED_EVENT(start, "Event.elapsed_time");
  NEED_EVENT(end, "Event.elapsed_time");
  return ddp_cuda_plugin()->event_elapsed_ms(start, end, ms);
}

