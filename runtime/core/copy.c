/* runtime/core/copy.c: copies across dtypes and strides, fills, contiguous, clone, casts,
 * and the in-place accumulation the autograd engine sums gradients with. */
#include "autograd/autograd.h"
#include "core/core.h"

enum { COPY_GRAIN = 1 << 16 }; /* elements per thread chunk: below this, one thread */

typedef struct { int dst_dtype, src_dtype; } convert_ctx;

static void copy_loop(void *vctx, char **p, const int64_t *s, int64_t n) {
  const convert_ctx *c = vctx;
  char *d = p[0], *src = p[1];
  if (c->dst_dtype == c->src_dtype) {
    size_t es = ddp_dtype_size(c->dst_dtype);
    if (s[0] == (int64_t)es && s[1] == (int64_t)es) {
      memcpy(d, src, (size_t)n * es);
      return;
    }
    switch (es) {
    case 8: for (int64_t i = 0; i < n; i++) *(uint64_t *)(d + i * s[0]) = *(const uint64_t *)(src + i * s[1]); return;
    case 4: for (int64_t i = 0; i < n; i++) *(uint32_t *)(d + i * s[0]) = *(const uint32_t *)(src + i * s[1]); return;
    case 2: for (int64_t i = 0; i < n; i++) *(uint16_t *)(d + i * s[0]) = *(const uint16_t *)(src + i * s[1]); return;
    default: for (int64_t i = 0; i < n; i++) d[i * s[0]] = src[i * s[1]]; return;
    }
  }
  if (c->dst_dtype == DDP_F32 && c->src_dtype == DDP_F64) {
    for (int64_t i = 0; i < n; i++) *(float *)(d + i * s[0]) = (float)*(const double *)(src + i * s[1]);
    return;
  }
  if (c->dst_dtype == DDP_F64 && c->src_dtype == DDP_F32) {
    for (int64_t i = 0; i < n; i++) *(double *)(d + i * s[0]) = *(const float *)(src + i * s[1]);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    ddp_store_f64(d + i * s[0], c->dst_dtype, ddp_load_f64(src + i * s[1], c->src_dtype));
}

/* Copy without autograd or checks beyond broadcasting. */
static int copy_raw(ddp_tensor *dst, const ddp_tensor *src, const char *op) {
  ddp_tensor *view;
  DDP_TRY(ddp_broadcast_view(&view, src, dst->ndim, dst->shape, op));
  convert_ctx c = {dst->dtype, src->dtype};
  ddp_tensor *ops[2] = {dst, view};
  ddp_foreach(2, ops, dst->ndim, dst->shape, copy_loop, &c, COPY_GRAIN);
  ddp_tensor_release(view);
  ddp_tensor_bump_version(dst);
  return DDP_OK;
}

/* d(copy)/d(src): the gradient summed back to src's shape, in src's dtype. */
static int copy_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *summed;
  DDP_TRY(ddp_sum_to_shape(&summed, g, n->inputs[0].ndim, n->inputs[0].shape));
  if (summed->dtype == n->inputs[0].dtype) {
    gi[0] = summed;
    return DDP_OK;
  }
  int status = ddp_to_dtype(&gi[0], summed, n->inputs[0].dtype);
  ddp_tensor_release(summed);
  return status;
}

int ddp_copy_(ddp_tensor *dst, const ddp_tensor *src) {
  DDP_TRY(ddp_check_alive(dst, "copy_", "self"));
  DDP_TRY(ddp_check_alive(src, "copy_", "src"));
  ddp_tensor *inputs[2] = {dst, (ddp_tensor *)src};
  int record = ddp_autograd_needed(2, inputs);
  if (record && dst->requires_grad && !dst->grad_fn)
    DDP_FAIL(DDP_ERR_ARG, "copy_: a leaf tensor that requires grad is being used in an in-place "
             "operation (wrap it in no_grad)");
  DDP_TRY(copy_raw(dst, src, "copy_"));
  if (record) {
    ddp_node *n = ddp_node_new("CopyBackward", copy_backward, 1, &inputs[1], 0);
    if (!n) return ddp_last_status();
    ddp_node_release(dst->grad_fn); /* every element overwritten: the old history is gone */
    ddp_autograd_set_output(dst, n);
  }
  return DDP_OK;
}

typedef struct { char value[8]; size_t esize; } fill_ctx;

static void fill_loop(void *vctx, char **p, const int64_t *s, int64_t n) {
  const fill_ctx *c = vctx;
  for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], c->value, c->esize);
}

int ddp_fill_(ddp_tensor *t, double value) {
  DDP_TRY(ddp_check_alive(t, "fill_", "self"));
  if (t->requires_grad && !t->grad_fn && ddp_grad_enabled())
    DDP_FAIL(DDP_ERR_ARG, "fill_: a leaf tensor that requires grad is being used in an in-place "
             "operation (wrap it in no_grad)");
  fill_ctx c = {.esize = ddp_dtype_size(t->dtype)};
  ddp_store_f64(c.value, t->dtype, value);
  ddp_foreach(1, &t, t->ndim, t->shape, fill_loop, &c, COPY_GRAIN);
  ddp_tensor_bump_version(t);
  if (t->grad_fn) { /* the values no longer depend on the history */
    ddp_node_release(t->grad_fn);
    t->grad_fn = NULL;
    t->requires_grad = 0;
  }
  return DDP_OK;
}

int ddp_zero_(ddp_tensor *t) {
  DDP_TRY(ddp_check_alive(t, "zero_", "self"));
  if (ddp_tensor_is_contiguous(t) && !t->grad_fn &&
      !(t->requires_grad && ddp_grad_enabled())) {
    memset(ddp_data(t), 0, (size_t)t->numel * ddp_dtype_size(t->dtype));
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
  int status = copy_raw(*out, t, op);
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

/* ---- accumulation ------------------------------------------------------------------- */

static void acc_loop(void *vctx, char **p, const int64_t *s, int64_t n) {
  const convert_ctx *c = vctx;
  char *d = p[0], *src = p[1];
  if (c->dst_dtype == DDP_F32 && c->src_dtype == DDP_F32) {
    if (s[0] == 4 && s[1] == 4) {
      float *restrict df = (float *)d;
      const float *restrict sf = (const float *)src;
      for (int64_t i = 0; i < n; i++) df[i] += sf[i];
    } else {
      for (int64_t i = 0; i < n; i++) *(float *)(d + i * s[0]) += *(const float *)(src + i * s[1]);
    }
    return;
  }
  if (c->dst_dtype == DDP_F64 && c->src_dtype == DDP_F64) {
    for (int64_t i = 0; i < n; i++) *(double *)(d + i * s[0]) += *(const double *)(src + i * s[1]);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    ddp_store_f64(d + i * s[0], c->dst_dtype,
                  ddp_load_f64(d + i * s[0], c->dst_dtype) + ddp_load_f64(src + i * s[1], c->src_dtype));
}

int ddp_accumulate_(ddp_tensor *dst, const ddp_tensor *src) {
  ddp_tensor *view;
  DDP_TRY(ddp_broadcast_view(&view, src, dst->ndim, dst->shape, "accumulate"));
  convert_ctx c = {dst->dtype, src->dtype};
  ddp_tensor *ops[2] = {dst, view};
  ddp_foreach(2, ops, dst->ndim, dst->shape, acc_loop, &c, COPY_GRAIN);
  ddp_tensor_release(view);
  ddp_tensor_bump_version(dst);
  return DDP_OK;
}

int ddp_sum_to_shape(ddp_tensor **out, ddp_tensor *grad, int ndim, const int64_t *shape) {
  *out = NULL;
  if (grad->ndim == ndim && !memcmp(grad->shape, shape, sizeof(int64_t) * ndim)) {
    ddp_tensor_retain(grad);
    *out = grad;
    return DDP_OK;
  }
  ddp_tensor *acc, *view;
  DDP_TRY(ddp_tensor_zeros(&acc, ndim, shape, grad->dtype, grad->device));
  /* acc viewed at grad's shape (stride 0 over summed dims) += grad, serially: many grad
   * elements land on one acc element */
  int status = ddp_broadcast_view(&view, acc, grad->ndim, grad->shape, "sum_to_shape");
  if (status) {
    ddp_tensor_release(acc);
    return status;
  }
  convert_ctx c = {acc->dtype, grad->dtype};
  ddp_tensor *ops[2] = {view, grad};
  ddp_foreach(2, ops, grad->ndim, grad->shape, acc_loop, &c, 0);
  ddp_tensor_release(view);
  *out = acc;
  return DDP_OK;
}
