/* runtime/backend/registry.c: the device registry. The library has no link-time CUDA
 * dependency: libddplua_cuda.so (next to libddplua.so, or $DDPLUA_CUDA_PLUGIN) is opened
 * with dlopen on first use and reached only through the table it returns
 * (runtime/backend/cuda/plugin.h). Any failure to load or probe (no file, no driver, no
 * device) means "CUDA is not available", with the reason kept for the error message.
 *
 * Also here: the kernel table lookup (ddp_kernels_for) and the device table the core
 * reaches device memory through (Note [device interface] in core/core.h), registered when
 * the library loads. The public stream/event/memory calls are in backend/cuda_api.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/plugin.h"
#include "backend/kernels.h"
#include "backend/registry.h"
#include "core/core.h"
#include "core/profiler.h"

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static const ddp_cuda_api *api; /* set once the plug-in loaded and found a device */
static int cuda_devices;
static char cuda_reason[512] = "not probed";

/* Note [probe without a driver]: the CUDA plug-in links cuBLAS, cuDNN and NCCL, and opening
 * it maps and relocates them: about 150 MB of resident memory (measured: a CPU run of
 * train.lua peaked at 482 MB with the plug-in present against 330 MB without), paid by
 * every process that merely asks dl.cuda.is_available(), as train.lua does when --device
 * is not given. Without the driver's library (libcuda.so.1, installed with the NVIDIA
 * driver) no CUDA call can succeed: the CUDA runtime itself opens it and reports
 * cudaErrorInsufficientDriver when it is missing. So the default plug-in is opened only
 * once libcuda.so.1 opens; otherwise CUDA is not available with that reason, and the answer
 * (false, 0 devices) is what the plug-in would have given. The handle stays open: the CUDA
 * runtime opens the same library when the plug-in loads. A plug-in named by
 * $DDPLUA_CUDA_PLUGIN (the simulated devices of the specs) needs no driver and is opened
 * as before. */
static int driver_present(void) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h) return 1;
  const char *why = dlerror();
  snprintf(cuda_reason, sizeof cuda_reason,
           "no CUDA driver: libcuda.so.1 did not load (%s); the CUDA plug-in was not opened",
           why ? why : "unknown reason");
  return 0;
}

static void probe(void) {
  char path[4096];
  const char *env = getenv("DDPLUA_CUDA_PLUGIN");
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else {
    if (!driver_present()) return; /* Note [probe without a driver] */
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

const ddp_cuda_api *ddp_cuda_plugin(void) { return cuda(); }

/* ---- kernels ------------------------------------------------------------------------ */

/* Before a tensor's kernels run its device is made current: Note [current device] in
 * backend/cuda_api.c. */
const ddp_kernels *ddp_kernels_for(int device) {
  if (DDP_PROF_ON()) ddp_prof_kernel_begin(); /* Note [profiler events] */
  if (device == DDP_DEVICE_CPU) return &ddp_cpu_kernels;
  if (!cuda() || api->set_device(device)) return NULL;
  return api->kernels;
}

int ddp_kernel_missing(const ddp_kernels *k, const char *kernel, const char *op) {
  if (DDP_PROF_ON()) ddp_prof_kernel_end(NULL); /* no kernel ran: no event */
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
  if (DDP_PROF_ON()) ddp_prof_kernel_end(op); /* Note [profiler events] */
  if (device == DDP_DEVICE_CPU || !api) return DDP_OK;
  return api->check(op);
}

/* ---- the core's device table (Note [device interface]) ------------------------------ */

static int iface_count(const char **reason) {
  if (!cuda()) {
    *reason = cuda_reason;
    return 0;
  }
  return cuda_devices;
}

static int iface_alloc(void **out, int device, size_t nbytes) {
  return api->malloc(out, device, nbytes);
}

static void iface_free(void *p) { api->free(p); }
static int iface_host_alloc(void **out, size_t nbytes) { return api->host_alloc(out, nbytes); }
static void iface_host_free(void *p) { api->host_free(p); }

static int iface_memset(void *dst, int device, int byte, size_t nbytes) {
  return api->memset(dst, device, byte, nbytes);
}

static int iface_memcpy(void *dst, int dst_device, const void *src, int src_device,
                        size_t nbytes, int async) {
  return api->memcpy(dst, dst_device, src, src_device, nbytes, async);
}

static const struct ddp_nccl_api *iface_nccl(const char **why) {
  static __thread char reason[600];
  if (!api->nccl) {
    snprintf(reason, sizeof reason, "NCCL is not available: the %s plug-in was built without it",
             api->name);
    *why = reason;
    return NULL;
  }
  *why = "";
  return api->nccl;
}

static const ddp_device_interface device_interface = {
    .count = iface_count,
    .alloc = iface_alloc,
    .free = iface_free,
    .host_alloc = iface_host_alloc,
    .host_free = iface_host_free,
    .memset = iface_memset,
    .memcpy = iface_memcpy,
    .nccl = iface_nccl,
};

/* At load, before any user code: the core reaches devices only through this table. The
 * plug-in itself is opened later, on the first call that asks for a device. */
__attribute__((constructor)) static void register_device_interface(void) {
  ddp_device_interface_set(&device_interface);
}
