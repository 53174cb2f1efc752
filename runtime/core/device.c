/* runtime/core/device.c: the core's side of devices. The core has no link-time CUDA
 * dependency: libddplua_cuda.so (next to libddplua.so, or $DDPLUA_CUDA_PLUGIN) is opened
 * with dlopen on first use and reached only through the table it returns
 * (runtime/backend/cuda/plugin.h). Any failure to load or probe (no file, no driver, no
 * device) means "CUDA is not available", with the reason kept for the error message.
 *
 * Also here: the kernel table lookup, device memory wrappers, moving tensors between
 * devices, pinned memory, and the public stream/event/memory-statistics calls. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "autograd/autograd.h"
#include "backend/cuda/plugin.h"
#include "backend/kernels.h"
#include "core/core.h"

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static const ddp_cuda_api *api; /* set once the plug-in loaded and found a device */
static int cuda_devices;
static char cuda_reason[512] = "not probed";

static void probe(void) {
  char path[4096];
  const char *env = getenv("DDPLUA_CUDA_PLUGIN");
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else {
    Dl_info info;
    if (!dladdr((void *)ddp_cuda_is_available, &info) || !info.dli_fname) {
      snprintf(cuda_reason, sizeof cuda_reason, "cannot locate libddplua.so to find the plug-in");
      return;
    }
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    snprintf(path + dir, sizeof path - dir, "libddplua_cuda.so");
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(cuda_reason, sizeof cuda_reason, "the CUDA plug-in did not load (%s)", dlerror());
    return;
  }
  const ddp_cuda_api *(*get)(void) = (const ddp_cuda_api *(*)(void))dlsym(h, "ddp_cuda_plugin_api");
  const ddp_cuda_api *a = get ? get() : NULL;
  if (!a || a->abi != DDP_CUDA_PLUGIN_ABI) {
    snprintf(cuda_reason, sizeof cuda_reason,
             "%s is not a ddplua CUDA plug-in of this version (interface %d, want %d)", path,
             a ? a->abi : -1, DDP_CUDA_PLUGIN_ABI);
    return;
  }
  int count = 0;
  if (a->probe(&count, cuda_reason, sizeof cuda_reason) == 0 && count > 0) {
    cuda_devices = count;
    cuda_reason[0] = 0;
    api = a;
  }
}

static const ddp_cuda_api *cuda(void) {
  pthread_once(&probe_once, probe);
  return api;
}

int ddp_cuda_is_available(void) { return cuda() != NULL; }

int ddp_cuda_device_count(void) {
  pthread_once(&probe_once, probe);
  return cuda_devices;
}

const char *ddp_cuda_unavailable_reason(void) {
  pthread_once(&probe_once, probe);
  return cuda_reason;
}

const char *ddp_cuda_backend_name(void) { return cuda() ? api->name : ""; }

int ddp_check_device(int device, const char *op) {
  if (device == DDP_DEVICE_CPU) return DDP_OK;
  if (device < -1) DDP_FAIL(DDP_ERR_ARG, "%s: invalid device number %d", op, device);
  if (!cuda())
    DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA is not available: %s", op, cuda_reason);
  if (device >= cuda_devices)
    DDP_FAIL(DDP_ERR_ARG, "%s: cuda:%d does not exist (%d device%s)", op, device, cuda_devices,
             cuda_devices == 1 ? "" : "s");
  return DDP_OK;
}

/* The plug-in for a call that needs one, or the "not available" error from the caller. */
#define NEED_CUDA(op)                                                                      \
  do {                                                                                     \
    if (!cuda()) DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA is not available: %s", (op),     \
                          cuda_reason);                                                    \
  } while (0)

const char *ddp_device_str(int device) {
  static __thread char slots[4][24];
  static __thread unsigned next;
  char *buf = slots[next++ % 4];
  if (device == DDP_DEVICE_CPU) snprintf(buf, sizeof slots[0], "cpu");
  else snprintf(buf, sizeof slots[0], "cuda:%d", device);
  return buf;
}

int ddp_check_same_device(const char *op, int n, ddp_tensor *const *ts,
                          const char *const *names) {
  int first = -1;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (first < 0) {
      first = i;
      continue;
    }
    if (ts[i]->device != ts[first]->device)
      DDP_FAIL(DDP_ERR_ARG, "%s: expected all tensors on the same device, but %s is on %s and "
               "%s is on %s", op, names[first], ddp_device_str(ts[first]->device), names[i],
               ddp_device_str(ts[i]->device));
  }
  return DDP_OK;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* Note [current device]: CUDA runs kernels on the calling thread's current device, so
 * before a tensor's kernels run its device is made current (PyTorch's DeviceGuard, without
 * the restore). What the user chose with set_device is kept apart (user_device) and is
 * what "cuda" without an index means, so an op on cuda:1 never changes where the next
 * "cuda" tensor goes. */
static __thread int user_device;

const ddp_kernels *ddp_kernels_for(int device) {
  if (device == DDP_DEVICE_CPU) return &ddp_cpu_kernels;
  if (!cuda() || api->set_device(device)) return NULL;
  return api->kernels;
}

int ddp_kernel_missing(const ddp_kernels *k, const char *kernel, const char *op) {
  if (!k && api && ddp_last_status()) {
    /* The plug-in is loaded: ddp_kernels_for failed to make the device current (a lost or
     * busy GPU), and recorded why; say that, not "not implemented". */
    ddp_error_prefix("%s", op);
    return ddp_last_status();
  }
  return DDP_ERROR(DDP_ERR_UNAVAILABLE, "%s: not implemented for %s tensors yet (no %s kernel)",
                   op, k ? k->name : "cuda", kernel);
}

int ddp_device_check(int device, const char *op) {
  if (device == DDP_DEVICE_CPU || !api) return DDP_OK;
  return api->check(op);
}

/* ---- device memory ------------------------------------------------------------------ */

int ddp_device_alloc(void **out, int device, size_t nbytes) {
  NEED_CUDA("empty");
  return api->malloc(out, device, nbytes);
}

void ddp_device_free(void *p) {
  if (api) api->free(p);
}

void ddp_pinned_free(void *p) {
  if (api) api->host_free(p);
}

int ddp_device_memset(void *dst, int device, int byte, size_t nbytes, const char *op) {
  if (device == DDP_DEVICE_CPU) {
    memset(dst, byte, nbytes);
    return DDP_OK;
  }
  NEED_CUDA(op);
  int status = api->memset(dst, device, byte, nbytes);
  if (status) ddp_error_prefix("%s", op);
  return status;
}

int ddp_device_memcpy(void *dst, int dst_device, const void *src, int src_device,
                      size_t nbytes, const char *op) {
  if (dst_device == DDP_DEVICE_CPU && src_device == DDP_DEVICE_CPU) {
    memcpy(dst, src, nbytes);
    return DDP_OK;
  }
  NEED_CUDA(op);
  int status = api->memcpy(dst, dst_device, src, src_device, nbytes, 0);
  if (status) ddp_error_prefix("%s", op);
  return status;
}

/* ---- moving tensors ----------------------------------------------------------------- */

/* d(to device)/d(t): the gradient moved back to t's device. */
static int to_device_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return ddp_tensor_to_device(&gi[0], g, n->inputs[0].device, 0);
}

int ddp_tensor_to_device(ddp_tensor **out, ddp_tensor *t, int device, int non_blocking) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "to", "self"));
  DDP_TRY(ddp_check_device(device, "to"));
  if (t->device == device) {
    ddp_tensor_retain(t);
    *out = t;
    return DDP_OK;
  }
  ddp_tensor *src = t;
  if (!ddp_tensor_is_contiguous(t)) { /* pack on the source device first (no graph) */
    ddp_tensor *alias = ddp_tensor_alias(t);
    if (!alias) return ddp_last_status();
    int status = ddp_tensor_empty(&src, t->ndim, t->shape, t->dtype, t->device);
    if (!status) status = ddp_copy_(src, alias);
    ddp_tensor_release(alias);
    if (status) {
      ddp_tensor_release(src);
      return status;
    }
  }
  int status = ddp_tensor_empty(out, t->ndim, t->shape, t->dtype, device);
  size_t nbytes = (size_t)t->numel * ddp_dtype_size(t->dtype);
  /* Asynchronous only when the host side is pinned: pageable memory could be reused by
   * the caller before the copy engine reads it. */
  int host_pinned = (device == DDP_DEVICE_CPU ? (*out && (*out)->storage->kind == DDP_STORAGE_PINNED)
                                              : src->storage->kind == DDP_STORAGE_PINNED);
  if (!status) {
    status = api->memcpy(ddp_data(*out), device, ddp_data(src), t->device, nbytes,
                         non_blocking && host_pinned);
    if (status) ddp_error_prefix("to(%s)", ddp_device_str(device));
  }
  if (src != t) ddp_tensor_release(src);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  if (ddp_autograd_needed(1, &t))
    return ddp_autograd_record_unary(out, t, "ToCopyBackward", to_device_backward, NULL, 0);
  return DDP_OK;
}

int ddp_tensor_pin_memory(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "pin_memory", "self"));
  if (t->device != DDP_DEVICE_CPU)
    DDP_FAIL(DDP_ERR_ARG, "pin_memory: the tensor is on %s; only CPU tensors can be pinned",
             ddp_device_str(t->device));
  NEED_CUDA("pin_memory");
  ddp_storage *s = calloc(1, sizeof *s);
  if (!s) DDP_FAIL(DDP_ERR_MEMORY, "pin_memory: out of memory");
  size_t nbytes = (size_t)t->numel * ddp_dtype_size(t->dtype);
  int status = api->host_alloc(&s->data, nbytes);
  if (status) {
    free(s);
    return status;
  }
  s->refcount = 1;
  s->nbytes = nbytes;
  s->device = DDP_DEVICE_CPU;
  s->kind = DDP_STORAGE_PINNED;
  ddp_tensor *h = ddp_tensor_over_storage(s, t->dtype, t->ndim, t->shape);
  if (!h) {
    api->host_free(s->data);
    free(s);
    DDP_FAIL(DDP_ERR_MEMORY, "pin_memory: out of memory");
  }
  status = ddp_copy_(h, t);
  if (status) {
    ddp_tensor_release(h);
    return status;
  }
  *out = h;
  return DDP_OK;
}

int ddp_tensor_is_pinned(const ddp_tensor *t) {
  return t && t->storage && t->storage->kind == DDP_STORAGE_PINNED;
}

/* ---- the public CUDA calls ---------------------------------------------------------- */

int ddp_cuda_versions(int *cudart, int *cublas, int *cudnn, int *nccl) {
  NEED_CUDA("versions");
  api->versions(cudart, cublas, cudnn, nccl);
  return DDP_OK;
}

int ddp_cuda_set_device(int device) {
  DDP_TRY(ddp_check_device(device, "set_device"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "set_device: expects a CUDA device, got cpu");
  DDP_TRY(api->set_device(device));
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
  return api->device_name(device, out, len);
}

int ddp_cuda_synchronize(int device) {
  DDP_TRY(ddp_check_device(device, "synchronize"));
  if (device == DDP_DEVICE_CPU) return DDP_OK;
  return api->synchronize(device);
}

int ddp_cuda_memory_stat(int device, int which, int64_t *out) {
  *out = 0;
  DDP_TRY(ddp_check_device(device, "memory_stats"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "memory_stats: expects a CUDA device");
  ddp_cuda_memory_stats s;
  DDP_TRY(api->memory_stats(device, &s));
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
  return api->reset_peak(device);
}

int ddp_cuda_empty_cache(void) {
  NEED_CUDA("empty_cache");
  return api->empty_cache();
}

int ddp_cuda_set_allow_tf32(int allow) {
  NEED_CUDA("allow_tf32");
  api->set_allow_tf32(allow);
  return DDP_OK;
}

int ddp_cuda_get_allow_tf32(void) { return cuda() ? api->get_allow_tf32() : 0; }

int ddp_cuda_stream_new(ddp_stream **out, int device, int priority) {
  *out = NULL;
  DDP_TRY(ddp_check_device(device, "Stream"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "Stream: expects a CUDA device");
  return api->stream_create((void **)out, device, priority);
}

int ddp_cuda_stream_free(ddp_stream *s) { return s && api ? api->stream_destroy(s) : DDP_OK; }

int ddp_cuda_current_stream(ddp_stream **out, int device) {
  *out = NULL;
  DDP_TRY(ddp_check_device(device, "current_stream"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "current_stream: expects a CUDA device");
  return api->current_stream((void **)out, device);
}

int ddp_cuda_set_stream(int device, ddp_stream *s) {
  DDP_TRY(ddp_check_device(device, "set_stream"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "set_stream: expects a CUDA device");
  return api->set_current_stream(device, s);
}

int ddp_cuda_stream_synchronize(ddp_stream *s) {
  NEED_CUDA("Stream.synchronize");
  return api->stream_synchronize(s);
}

int ddp_cuda_stream_wait_event(ddp_stream *s, ddp_event *e) {
  NEED_CUDA("Stream.wait_event");
  if (!e) DDP_FAIL(DDP_ERR_ARG, "Stream.wait_event: event is NULL");
  return api->stream_wait_event(s, e);
}

int ddp_cuda_record_stream(ddp_tensor *t, ddp_stream *s) {
  DDP_TRY(ddp_check_alive(t, "record_stream", "self"));
  if (t->storage->kind != DDP_STORAGE_DEVICE)
    DDP_FAIL(DDP_ERR_ARG, "record_stream: the tensor is not in CUDA memory (it is on %s)",
             ddp_device_str(t->device));
  return api->record_stream(t->storage->data, s);
}

int ddp_cuda_event_new(ddp_event **out, int device, int enable_timing) {
  *out = NULL;
  DDP_TRY(ddp_check_device(device, "Event"));
  if (device == DDP_DEVICE_CPU) DDP_FAIL(DDP_ERR_ARG, "Event: expects a CUDA device");
  return api->event_create((void **)out, device, enable_timing);
}

int ddp_cuda_event_free(ddp_event *e) { return e && api ? api->event_destroy(e) : DDP_OK; }

#define NEED_EVENT(e, op)                                                                  \
  do {                                                                                     \
    NEED_CUDA(op);                                                                         \
    if (!(e)) DDP_FAIL(DDP_ERR_ARG, "%s: event is NULL", (op));                            \
  } while (0)

int ddp_cuda_event_record(ddp_event *e, ddp_stream *s) {
  NEED_EVENT(e, "Event.record");
  return api->event_record(e, s);
}

int ddp_cuda_event_synchronize(ddp_event *e) {
  NEED_EVENT(e, "Event.synchronize");
  return api->event_synchronize(e);
}

int ddp_cuda_event_query(ddp_event *e, int *done) {
  NEED_EVENT(e, "Event.query");
  return api->event_query(e, done);
}

int ddp_cuda_event_elapsed_ms(ddp_event *start, ddp_event *end, float *ms) {
  NEED_EVENT(start, "Event.elapsed_time");
  NEED_EVENT(end, "Event.elapsed_time");
  return api->event_elapsed_ms(start, end, ms);
}

const struct ddp_nccl_api *ddp_device_nccl(const char **why) {
  static __thread char reason[600];
  if (!cuda()) {
    snprintf(reason, sizeof reason, "CUDA is not available: %s", cuda_reason);
    *why = reason;
    return NULL;
  }
  if (!api->nccl) {
    snprintf(reason, sizeof reason, "NCCL is not available: the %s plug-in was built without it",
             api->name);
    *why = reason;
    return NULL;
  }
  *why = "";
  return api->nccl;
}
