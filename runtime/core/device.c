/* runtime/core/device.c: the core's side of devices: device names and checks, and device
 * memory through the table the backend registers (Note [device interface] in core.h). The
 * plug-in loading, the kernel tables and the public CUDA calls are the backend's
 * (runtime/backend/registry.c, runtime/backend/cuda_api.c). */
#include <stdio.h>

#include "core/core.h"

static const ddp_device_interface *iface; /* set once at load, before any thread runs */

void ddp_device_interface_set(const ddp_device_interface *i) { iface = i; }

/* Usable devices, with *reason set when there are none. */
static int device_count(const char **reason) {
  if (!iface) {
    *reason = "no device backend is registered";
    return 0;
  }
  return iface->count(reason);
}

int ddp_check_device(int device, const char *op) {
  if (device == DDP_DEVICE_CPU) return DDP_OK;
  if (device < -1) DDP_FAIL(DDP_ERR_ARG, "%s: invalid device number %d", op, device);
  const char *reason = "";
  int count = device_count(&reason);
  if (count <= 0) DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA is not available: %s", op, reason);
  if (device >= count)
    DDP_FAIL(DDP_ERR_ARG, "%s: cuda:%d does not exist (%d device%s)", op, device, count,
             count == 1 ? "" : "s");
  return DDP_OK;
}

/* The table for a call that needs a device, or the "not available" error naming op. */
#define NEED_DEVICE(op)                                                                    \
  do {                                                                                     \
    const char *why_ = "";                                                                 \
    if (device_count(&why_) <= 0)                                                          \
      DDP_FAIL(DDP_ERR_UNAVAILABLE, "%s: CUDA is not available: %s", (op), why_);          \
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

/* ---- device memory ------------------------------------------------------------------ */

int ddp_device_alloc(void **out, int device, size_t nbytes) {
  NEED_DEVICE("empty");
  return iface->alloc(out, device, nbytes);
}

/* Device and pinned blocks exist only if the table handed them out, so iface is set. */
void ddp_device_free(void *p) {
  if (iface) iface->free(p);
}

int ddp_pinned_alloc(void **out, size_t nbytes, const char *op) {
  NEED_DEVICE(op);
  return iface->host_alloc(out, nbytes);
}

void ddp_pinned_free(void *p) {
  if (iface) iface->host_free(p);
}

/* A large host memset (a zeros() of a pooling or convolution gradient) split over the
 * thread pool in 64 KiB blocks: two cores fill memory ~1.6x as fast as one here, and the
 * other core is not left idle meanwhile. */
enum { MEMSET_BLOCK = 1 << 16, MEMSET_PARALLEL = 1 << 20 };
typedef struct { char *dst; int byte; size_t nbytes; } memset_job;

static void memset_blocks(void *vctx, int64_t begin, int64_t end) {
  const memset_job *j = vctx;
  size_t lo = (size_t)begin * MEMSET_BLOCK, hi = (size_t)end * MEMSET_BLOCK;
  if (hi > j->nbytes) hi = j->nbytes;
  memset(j->dst + lo, j->byte, hi - lo);
}

int ddp_device_memset(void *dst, int device, int byte, size_t nbytes, const char *op) {
  if (device == DDP_DEVICE_CPU) {
    if (nbytes >= MEMSET_PARALLEL) {
      memset_job j = {dst, byte, nbytes};
      ddp_parallel_for((int64_t)((nbytes + MEMSET_BLOCK - 1) / MEMSET_BLOCK), 4, memset_blocks, &j);
    } else {
      memset(dst, byte, nbytes);
    }
    return DDP_OK;
  }
  NEED_DEVICE(op);
  int status = iface->memset(dst, device, byte, nbytes);
  if (status) ddp_error_prefix("%s", op);
  return status;
}

int ddp_device_memcpy_async(void *dst, int dst_device, const void *src, int src_device,
                            size_t nbytes, int async, const char *op) {
  if (dst_device == DDP_DEVICE_CPU && src_device == DDP_DEVICE_CPU) {
    memcpy(dst, src, nbytes);
    return DDP_OK;
  }
  NEED_DEVICE(op);
  int status = iface->memcpy(dst, dst_device, src, src_device, nbytes, async);
  if (status) ddp_error_prefix("%s", op);
  return status;
}

int ddp_device_memcpy(void *dst, int dst_device, const void *src, int src_device,
                      size_t nbytes, const char *op) {
  return ddp_device_memcpy_async(dst, dst_device, src, src_device, nbytes, 0, op);
}

const struct ddp_nccl_api *ddp_device_nccl(const char **why) {
  static __thread char reason[600];
  const char *no = "";
  if (device_count(&no) <= 0) {
    snprintf(reason, sizeof reason, "CUDA is not available: %s", no);
    *why = reason;
    return NULL;
  }
  return iface->nccl(why);
}
