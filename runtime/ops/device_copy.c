/* runtime/ops/device_copy.c: moving tensors between devices (to(device), recorded as
 * ToCopyBackward) and pinned host copies (pin_memory). Bytes move through the core's device
 * memory calls (Note [device interface] in core/core.h); packing a strided source is a
 * copy op. */
#include <stdio.h>

#include "tape/tape.h"
#include "core/core.h"
#include "ops/copy.h"

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
    int status = ddp_tensor_empty(&src, t->ndim, t->shape, t->dtype, t->device);
    if (!status) status = ddp_copy_raw(src, t, "to");
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
    char op[32];
    snprintf(op, sizeof op, "to(%s)", ddp_device_str(device));
    status = ddp_device_memcpy_async(ddp_data(*out), device, ddp_data(src), t->device, nbytes,
                                     non_blocking && host_pinned, op);
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
  ddp_tensor *h;
  DDP_TRY(ddp_tensor_empty_pinned(&h, t->ndim, t->shape, t->dtype, "pin_memory"));
  int status = ddp_copy_(h, t);
  if (status) {
    ddp_tensor_release(h);
    return status;
  }
  *out = h;
  return DDP_OK;
}
