/* runtime/core/device.c: finding the CUDA plug-in. The core has no link-time CUDA
 * dependency: libddplua_cuda.so (next to libddplua.so, or $DDPLUA_CUDA_PLUGIN) is opened
 * with dlopen on first use; any failure (no file, no driver, no device) means "CUDA is not
 * available" with the reason kept for the error message. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/plugin.h"
#include "core/core.h"

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
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
  int (*abi)(void) = (int (*)(void))dlsym(h, "ddp_cuda_plugin_abi_version");
  int (*probe_fn)(int *, char *, size_t) =
      (int (*)(int *, char *, size_t))dlsym(h, "ddp_cuda_plugin_probe");
  if (!abi || !probe_fn || abi() != DDP_CUDA_PLUGIN_ABI) {
    snprintf(cuda_reason, sizeof cuda_reason, "%s is not a matching ddplua CUDA plug-in", path);
    return;
  }
  int count = 0;
  if (probe_fn(&count, cuda_reason, sizeof cuda_reason) == 0 && count > 0) {
    cuda_devices = count;
    cuda_reason[0] = 0;
  }
}

int ddp_cuda_is_available(void) {
  pthread_once(&probe_once, probe);
  return cuda_devices > 0;
}

int ddp_cuda_device_count(void) {
  pthread_once(&probe_once, probe);
  return cuda_devices;
}

const char *ddp_cuda_unavailable_reason(void) {
  pthread_once(&probe_once, probe);
  return cuda_reason;
}

int ddp_check_device(int device, const char *op) {
  if (device == DDP_DEVICE_CPU) return DDP_OK;
  if (device < -1) DDP_FAIL(DDP_ERR_ARG, "%s: invalid device number %d", op, device);
  if (!ddp_cuda_is_available())
    DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA is not available: %s", op, ddp_cuda_unavailable_reason());
  if (device >= cuda_devices)
    DDP_FAIL(DDP_ERR_ARG, "%s: cuda:%d does not exist (%d device%s)", op, device, cuda_devices,
             cuda_devices == 1 ? "" : "s");
  DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA tensors are not implemented yet (cuda:%d found)", op,
           device);
}
