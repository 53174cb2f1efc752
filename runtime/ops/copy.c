/* runtime/ops/copy.c: the copy ops: copy_ across dtypes, strides and devices, fill_,
 * zero_, contiguous, clone and the dtype cast (to). Kernels through the device's table
 * (ddp_kernels_for); bytes between devices through the core's device memory calls. */
#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/copy.h"

/* dst = src where the two live on different devices: src is made contiguous on its own
 * device, moved as bytes, then converted and scattered on dst's device. A contiguous dst
 * of src's shape and dtype takes the bytes directly. */
static int copy_across_devices(ddp_tensor *dst, const ddp_tensor *src, const char *op) {
  ddp_tensor *packed = NULL, *staged = NULL;
  int status = DDP_OK;
  if (ddp_tensor_is_contiguous(src)) {
    packed = ddp_tensor_alias(src);
    if (!packed) return ddp_last_status();
  } else {
    status = ddp_tensor_empty(&packed, src->ndim, src->shape, src->dtype, src->device);
    if (!status) status = ddp_copy_raw(packed, src, op);
  }
  size_t nbytes = (size_t)src->numel * ddp_dtype_size(src->dtype);
  int direct = dst->dtype == src->dtype && ddp_tensor_is_contiguous(dst) &&
               dst->ndim == src->ndim &&
               !memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)dst->ndim);
  if (!status && direct) {
    status = ddp_device_memcpy(ddp_data(dst), dst->device, ddp_data(packed), src->device,
                               nbytes, op);
    if (!status) ddp_tensor_bump_version(dst);
  } else if (!status) {
    status = ddp_tensor_empty(&staged, src->ndim, src->shape, src->dtype, dst->device);
    if (!status)
      status = ddp_device_memcpy(ddp_data(staged), dst->device, ddp_data(packed), src->device,
                                 nbytes, op);
    if (!status) status = ddp_copy_raw(dst, staged, op);
  }
  ddp_tensor_release(packed);
  ddp_tensor_release(staged);
  return status;
}

int ddp_copy_raw(ddp_tensor *dst, const ddp_tensor *src, const char *op) {
  if (dst->device != src->device) return copy_across_devices(dst, src, op);
  ddp_tensor *view;
  DDP_TRY(ddp_broadcast_view(&view, src, dst->ndim, dst->shape, op));
  const ddp_kernels *k = ddp_kernels_for(dst->device);
  int status = DDP_KERNEL_CHECK(k, copy, op);
  if (!status) {
    k->copy(dst, view);
    status = ddp_device_check(dst->device, op);
  }
  ddp_tensor_release(view);
  if (!status) ddp_tensor_bump_version(dst);
  return status;
}

/* The gradient of a tensor whose every element an in-place op overwrote: zeros of its
 * shape (PyTorch's CopyBackwards and FillBackward give zeros, not nothing, so a leaf under
 * it still gets a .grad). */
static int overwritten_grad(ddp_node *n, int i, const ddp_tensor *g, ddp_tensor **gi) {
  const ddp_input_meta *in = &n->inputs[i];
  if (!n->edges[i].fn && !n->edges[i].leaf) return DDP_OK;
  return ddp_tensor_zeros(&gi[i], in->ndim, in->shape, in->dtype, g->device);
}

/* The gradient g summed back to input i's shape, in its dtype and on its device (the
 * source of a copy_, or the input of a cast). */
static int to_input(ddp_node *n, int i, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *summed;
  const ddp_input_meta *in = &n->inputs[i];
  DDP_TRY(ddp_sum_to_shape(&summed, g, in->ndim, in->shape));
  if (summed->dtype == in->dtype && summed->device == in->device) {
    gi[i] = summed;
    return DDP_OK;
  }
  /* back to the source's dtype and device (a copy_ from another device) */
  int status = ddp_tensor_empty(&gi[i], in->ndim, in->shape, in->dtype, in->device);
  if (!status) status = ddp_copy_raw(gi[i], summed, "copy_ backward");
  ddp_tensor_release(summed);
  if (status) {
    ddp_tensor_release(gi[i]);
    gi[i] = NULL;
  }
  return status;
}

/* d(cast)/d(input): the gradient in the input's dtype. */
static int copy_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) { return to_input(n, 0, g, gi); }

/* d(copy_)/d(self, src): zeros for self's old values, src's part of g for src. */
static int copy_inplace_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  DDP_TRY(overwritten_grad(n, 0, g, gi));
  if (!n->edges[1].fn && !n->edges[1].leaf) return DDP_OK;
  return to_input(n, 1, g, gi);
}

int ddp_copy_(ddp_tensor *dst, const ddp_tensor *src) {
  DDP_TRY(ddp_check_alive(dst, "copy_", "self"));
  DDP_TRY(ddp_check_alive(src, "copy_", "src"));
  ddp_tensor *inputs[2] = {dst, (ddp_tensor *)src};
  int record = ddp_autograd_needed(2, inputs);
  DDP_TRY(ddp_autograd_check_inplace(dst, "copy_"));
  ddp_node *n = NULL;
  if (record && !(n = ddp_node_new("CopyBackwards", copy_inplace_backward, 2, inputs, 0)))
    return ddp_last_status();
  int status = ddp_copy_raw(dst, src, "copy_");
  if (status) {
    ddp_node_release(n);
    return status;
  }
  return n ? ddp_autograd_rebase(dst, n) : DDP_OK; /* Note [in-place on views] */
}

static int fill_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return overwritten_grad(n, 0, g, gi);
}

int ddp_fill_(ddp_tensor *t, double value) {
  DDP_TRY(ddp_check_alive(t, "fill_", "self"));
  DDP_TRY(ddp_autograd_check_inplace(t, "fill_"));
  ddp_node *n = NULL;
  if (ddp_autograd_needed(1, &t) && !(n = ddp_node_new("FillBackward", fill_backward, 1, &t, 0)))
    return ddp_last_status();
  const ddp_kernels *k = ddp_kernels_for(t->device);
  int status = DDP_KERNEL_CHECK(k, fill, "fill_");
  if (!status) {
    k->fill(t, value);
    status = ddp_device_check(t->device, "fill_");
  }
  if (status) {
    ddp_node_release(n);
    return status;
  }
  ddp_tensor_bump_version(t);
  /* the values no longer depend on the history, but the tensor keeps one (PyTorch's
   * FillBackward: zeros flow to the old history) */
  return n ? ddp_autograd_rebase(t, n) : DDP_OK;
}

int ddp_set_element_(ddp_tensor *t, const int64_t *index, double value) {
  DDP_TRY(ddp_check_alive(t, "set", "self"));
  if (!ddp_autograd_needed(1, &t)) return ddp_tensor_set(t, index, value);
  DDP_TRY(ddp_tensor_check_index(t, index, "set"));
  /* the element as a 0-d view, selected one dimension at a time (each a recorded view) */
  ddp_tensor *elem = t;
  ddp_tensor_retain(elem);
  for (int d = 0; d < t->ndim; d++) {
    ddp_tensor *next;
    int status = ddp_select(&next, elem, 0, index[d]);
    ddp_tensor_release(elem);
    if (status) return status;
    elem = next;
  }
  int status = ddp_fill_(elem, value);
  ddp_tensor_release(elem);
  return status;
}

int ddp_zero_(ddp_tensor *t) {
  DDP_TRY(ddp_check_alive(t, "zero_", "self"));
  if (ddp_tensor_is_contiguous(t) && !ddp_autograd_needed(1, &t)) {
    DDP_TRY(ddp_autograd_check_inplace(t, "zero_"));
    DDP_TRY(ddp_device_memset(ddp_data(t), t->device, 0,
                              (size_t)t->numel * ddp_dtype_size(t->dtype), "zero_"));
    ddp_tensor_bump_version(t);
    return DDP_OK;
  }
  return ddp_fill_(t, 0);
}

static int clone_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor_retain(g);
  gi[0] = g;
  return DDP_OK;
}

/* A contiguous copy of t in dtype, recording `name` when autograd needs it. */
static int copy_out(ddp_tensor **out, ddp_tensor *t, int dtype, const char *op,
                    const char *node_name) {
  *out = NULL;
  DDP_TRY(ddp_tensor_empty(out, t->ndim, t->shape, dtype, t->device));
  int status = ddp_copy_raw(*out, t, op);
  (*out)->storage->version = 0;
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  if (ddp_autograd_needed(1, &t)) {
    if (!ddp_dtype_is_floating(dtype)) return DDP_OK; /* integers carry no gradient */
    return ddp_autograd_record_unary(out, t, node_name,
                                     dtype == t->dtype ? clone_backward : copy_backward, NULL, 0);
  }
  return DDP_OK;
}

int ddp_contiguous(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "contiguous", "self"));
  if (ddp_tensor_is_contiguous(t)) {
    ddp_tensor_retain(t);
    *out = t;
    return DDP_OK;
  }
  return copy_out(out, t, t->dtype, "contiguous", "CloneBackward");
}

int ddp_clone(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "clone", "self"));
  return copy_out(out, t, t->dtype, "clone", "CloneBackward");
}

int ddp_to_dtype(ddp_tensor **out, ddp_tensor *t, int dtype) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "to", "self"));
  if (dtype < 0 || dtype >= DDP_DTYPE_COUNT) DDP_FAIL(DDP_ERR_ARG, "to: unknown dtype %d", dtype);
  if (dtype == t->dtype) {
    ddp_tensor_retain(t);
    *out = t;
    return DDP_OK;
  }
  return copy_out(out, t, dtype, "to", "ToCopyBackward");
}

int ddp_detached_as(ddp_tensor **out, ddp_tensor *t, int dtype) {
  *out = NULL;
  ddp_tensor *alias = ddp_tensor_alias(t);
  if (!alias) return ddp_last_status();
  ddp_tensor *converted;
  int status = ddp_to_dtype(&converted, alias, dtype);
  ddp_tensor_release(alias);
  if (status) return status;
  status = ddp_contiguous(out, converted);
  ddp_tensor_release(converted);
  return status;
}
