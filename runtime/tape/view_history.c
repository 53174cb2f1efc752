/* runtime/tape/view_history.c: the history of in-place writes, through views included.
 * Part of the tape layer (ops call it to record an in-place op); it reaches tensors through
 * the core and copies through the kernel table only.
 *
 * Note [views and their base]: every view op (narrow, select, view, reshape when it views,
 * t, transpose, permute, squeeze, unsqueeze, expand, split, chunk, flatten, unflatten) calls
 * ddp_tensor_set_view_base, so a view holds its base: the tensor that owns the storage
 * (a view of a view holds the first one's base). detach() and the runtime's own internal
 * views are not views in this sense. The view also remembers which grad_fn the base had
 * when the view's own grad_fn was made (view_base_fn).
 *
 * Note [in-place on views] (PyTorch's CopySlices, autograd/functions/tensor.cpp): an
 * in-place op on a view v of base b writes b's values, so b's history must change too:
 *
 *   b.grad_fn := CopySlices(b's old grad_fn, op's node)
 *   v.grad_fn := AsStridedBackward(b.grad_fn)         (v is b's elements at v's geometry)
 *
 * CopySlices' backward takes b's gradient g, gives the op's node the part of g at v's
 * geometry, puts the op's gradient for v's old values back into that part (what flows on
 * to b's old history) and passes the op's gradients for its other operands through.
 * Storage positions are the common frame: b and v are both (shape, strides, offset) of the
 * same storage, so gradients are laid out in a zero "storage-shaped" tensor and b's and v's
 * geometries are views of it. A view whose base's history changed after it was made (by
 * a write through the base or another view: grad_fn != view_base_fn) is stale; its grad_fn
 * is regenerated as AsStridedBackward of the base the next time it is used
 * (ddp_autograd_refresh_view), as PyTorch regenerates it from the view's version.
 *
 * Writes through views with overlapping elements (an expanded view) are not detected here;
 * their gradients follow the last write of each element. */
#include <stdlib.h>

#include "tape/tape.h"
#include "backend/kernels.h"

/* A view's and its base's geometry in their common storage. */
typedef struct {
  int32_t ndim, base_ndim;
  int64_t offset, base_offset, storage_numel;
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int64_t base_shape[DDP_MAX_DIMS], base_strides[DDP_MAX_DIMS];
} view_geometry;

static view_geometry *geometry_of(const ddp_tensor *view, const ddp_tensor *base) {
  view_geometry *g = calloc(1, sizeof *g);
  if (!g) {
    DDP_ERROR(DDP_ERR_MEMORY, "in-place on a view: out of memory recording the graph");
    return NULL;
  }
  g->ndim = view->ndim;
  g->offset = view->offset;
  memcpy(g->shape, view->shape, sizeof g->shape);
  memcpy(g->strides, view->strides, sizeof g->strides);
  g->base_ndim = base->ndim;
  g->base_offset = base->offset;
  memcpy(g->base_shape, base->shape, sizeof g->base_shape);
  memcpy(g->base_strides, base->strides, sizeof g->base_strides);
  g->storage_numel = (int64_t)(base->storage->nbytes / ddp_dtype_size(base->dtype));
  return g;
}

/* dst <- src (same shape, any strides and dtypes), through dst's device's table. */
static int copy_into(ddp_tensor *dst, const ddp_tensor *src, const char *op) {
  const ddp_kernels *k = ddp_kernels_for(dst->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, copy, op));
  k->copy(dst, src);
  return ddp_device_check(dst->device, op);
}

/* A zero storage-shaped tensor of g's dtype and device (Note [in-place on views]) and the
 * base's and the view's geometry over it. */
static int storage_frame(const view_geometry *geo, const ddp_tensor *like, ddp_tensor **flat,
                         ddp_tensor **base, ddp_tensor **view) {
  *flat = *base = *view = NULL;
  int64_t n = geo->storage_numel;
  int status = ddp_tensor_zeros(flat, 1, &n, like->dtype, like->device);
  if (!status)
    status = ddp_tensor_view_raw(base, *flat, geo->base_ndim, geo->base_shape, geo->base_strides,
                                 geo->base_offset);
  if (!status)
    status = ddp_tensor_view_raw(view, *flat, geo->ndim, geo->shape, geo->strides, geo->offset);
  return status;
}

static void release3(ddp_tensor *a, ddp_tensor *b, ddp_tensor *c) {
  ddp_tensor_release(a);
  ddp_tensor_release(b);
  ddp_tensor_release(c);
}

/* d(view of base)/d(base): g (the view's shape) placed at the view's elements, zeros
 * elsewhere, in the base's shape. */
static int as_strided_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  const view_geometry *geo = n->extra;
  ddp_tensor *flat, *base, *view;
  int status = storage_frame(geo, g, &flat, &base, &view);
  if (!status) status = copy_into(view, g, "AsStridedBackward");
  if (!status) {
    gi[0] = base;
    base = NULL;
  }
  release3(flat, base, view);
  return status;
}

/* Note [in-place on views]: the base's gradient g with the wrapped op replayed on the
 * view's part of it. */
static int copy_slices_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  const view_geometry *geo = n->extra;
  ddp_node *op = n->wrapped;
  ddp_tensor *flat, *base, *view, *part = NULL;
  ddp_tensor *sub_stack[8], **sub = sub_stack;
  if (op->n_inputs > 8 && !(sub = calloc((size_t)op->n_inputs, sizeof *sub)))
    return DDP_ERROR(DDP_ERR_MEMORY, "CopySlices: out of memory");
  for (int i = 0; i < op->n_inputs; i++) sub[i] = NULL;
  int status = storage_frame(geo, g, &flat, &base, &view);
  if (!status) status = copy_into(base, g, "CopySlices");
  if (!status) status = ddp_tensor_empty(&part, geo->ndim, geo->shape, g->dtype, g->device);
  if (!status) status = copy_into(part, view, "CopySlices");
  if (!status) status = op->backward(op, part, sub);
  if (!status) { /* the view's old values get the op's gradient for its input */
    if (sub[0]) {
      status = copy_into(view, sub[0], "CopySlices");
    } else {
      const ddp_kernels *k = ddp_kernels_for(view->device);
      status = DDP_KERNEL_CHECK(k, fill, "CopySlices");
      if (!status) {
        k->fill(view, 0);
        status = ddp_device_check(view->device, "CopySlices");
      }
    }
  }
  if (!status) {
    gi[0] = base;
    base = NULL;
    for (int i = 1; i < op->n_inputs; i++) {
      gi[i] = sub[i];
      sub[i] = NULL;
    }
  }
  for (int i = 0; i < op->n_inputs; i++) ddp_tensor_release(sub[i]);
  if (sub != sub_stack) free(sub);
  ddp_tensor_release(part);
  release3(flat, base, view);
  return status;
}

/* Note [in-place on a view of a leaf] (PyTorch's check_inplace, torch/csrc/autograd/
 * VariableTypeUtils.h): a view is refused when it requires grad and its base is a leaf
 * (no grad_fn). The view may require grad through its base (the base is a leaf that
 * requires grad), or on its own: t = zeros(2, 2); x = t:view(4); x.requires_grad = true
 * makes x a leaf that is also a view of t, and x, x:narrow(...) and every other view of it
 * hold t as their base (Note [views and their base]), which requires no grad. Looking
 * only at the base's flag let x:narrow(1, 1, 2):mul_(2) through, writing a leaf's values
 * behind autograd's back. A view that requires no grad (nor its base) may be written: an
 * in-place op on it then gives the base a history. */
int ddp_autograd_check_inplace(const ddp_tensor *self, const char *op) {
  if (!ddp_grad_enabled()) return DDP_OK;
  const ddp_tensor *base = self->view_base;
  if (base && (self->requires_grad || base->requires_grad) && !base->grad_fn)
    DDP_FAIL(DDP_ERR_ARG, "%s: a view of a leaf Variable that requires grad is being used in an "
             "in-place operation.", op);
  if (!base && self->requires_grad && !self->grad_fn)
    DDP_FAIL(DDP_ERR_ARG, "%s: a leaf Variable that requires grad is being used in an in-place "
             "operation.", op);
  return DDP_OK;
}

int ddp_autograd_refresh_view(ddp_tensor *t) {
  if (!ddp_autograd_view_is_stale(t)) return DDP_OK;
  ddp_tensor *base = t->view_base;
  ddp_node *fn = NULL;
  if (base->requires_grad) {
    view_geometry *geo = geometry_of(t, base);
    if (!geo) return ddp_last_status();
    t->view_base_fn = base->grad_fn; /* before: ddp_node_new refreshes its inputs */
    fn = ddp_node_new("AsStridedBackward", as_strided_backward, 1, &base, 0);
    if (!fn) {
      free(geo);
      t->view_base_fn = NULL; /* still stale: retried at the next use */
      return ddp_last_status();
    }
    fn->extra = geo;
    fn->extra_free = free;
  }
  ddp_node *old = t->grad_fn;
  t->grad_fn = fn;
  t->requires_grad = base->requires_grad;
  t->view_base_fn = base->grad_fn;
  ddp_node_release(old);
  return DDP_OK;
}

int ddp_autograd_rebase(ddp_tensor *self, ddp_node *n) {
  ddp_tensor *base = self->view_base;
  if (!base) {
    ddp_node_release(self->grad_fn);
    self->grad_fn = NULL;
    ddp_autograd_set_output(self, n);
    return DDP_OK;
  }
  ddp_tensor *ins_stack[8], **ins = ins_stack;
  if (n->n_inputs > 8 && !(ins = calloc((size_t)n->n_inputs, sizeof *ins))) {
    ddp_node_release(n);
    return DDP_ERROR(DDP_ERR_MEMORY, "in-place on a view: out of memory");
  }
  for (int i = 0; i < n->n_inputs; i++) ins[i] = NULL;
  ins[0] = base;
  view_geometry *geo = geometry_of(self, base);
  ddp_node *cs = geo ? ddp_node_new("CopySlices", copy_slices_backward, n->n_inputs, ins, 0) : NULL;
  if (ins != ins_stack) free(ins);
  if (!cs) {
    free(geo);
    ddp_node_release(n);
    return ddp_last_status();
  }
  for (int i = 1; i < n->n_inputs; i++) { /* the op's other operands, as the op saw them */
    cs->edges[i] = n->edges[i];
    ddp_node_retain(cs->edges[i].fn);
    ddp_tensor_retain(cs->edges[i].leaf);
    cs->inputs[i] = n->inputs[i];
  }
  cs->extra = geo;
  cs->extra_free = free;
  cs->wrapped = n;
  ddp_node *old = base->grad_fn;
  base->grad_fn = cs;
  base->requires_grad = 1;
  ddp_node_release(old);
  return ddp_autograd_refresh_view(self);
}
