/* runtime/ops/reduce.c: front doors of the reductions and softmax: argument checks, the
 * (A, R, B) layout the kernels take, dtype dispatch and autograd recording.
 *
 * Layout (see ddplua/ops_reduce.h): a contiguous input whose reduced dims form one block
 * (size-1 dims ignored) is used as is; otherwise a copy with the reduced dims moved last is
 * made (then B = 1). Kernels write a contiguous (A, B) result, which is the row-major
 * layout of the output shape in both cases.
 *
 * Gradients: backward functions run with grad mode off and use core helpers, this file's
 * front doors and the private element loops below. Reduced shapes are stored in the node
 * as a bit mask of reduced dims (iattr[0]) and keepdim (iattr[1]).
 *
 * Devices (Note [reduce on devices]): every kernel is called through the table of the
 * input's device (ddp_kernels_for), outputs and scratch live on that device, and a pending
 * device error is turned into a DDP error naming the op (ddp_device_check). The private
 * element loops read memory on the host, so they serve CPU tensors only; for tensors on a
 * device the same formulas run through the element-wise front doors and the kernel table
 * (the *_device functions below), with the tensors' dtypes instead of double. */
#include <math.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/autocast.h"

/* Evaluate a status expression with grad mode off (internal conversions must not record nodes). */
#define NO_GRAD(status, expr)                                                              \
  do {                                                                                     \
    int prev_ = ddp_set_grad_enabled(0);                                                   \
    (status) = (expr);                                                                     \
    ddp_set_grad_enabled(prev_);                                                           \
  } while (0)

/* ---- dims, shapes, layout -------------------------------------------------------------- */

/* Bit mask of the reduced dims of t (all dims when dims is NULL or ndims is 0). */
static int parse_dims(const char *op, const ddp_tensor *t, const int *dims, int ndims,
                      uint32_t *mask) {
  *mask = 0;
  if (ndims < 0 || ndims > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "%s: %d dims given (at most %d)", op, ndims, DDP_MAX_DIMS);
  if (!dims || ndims == 0) {
    *mask = (uint32_t)((1u << t->ndim) - 1);
    return DDP_OK;
  }
  for (int i = 0; i < ndims; i++) {
    int d;
    DDP_TRY(ddp_normalize_dim(dims[i], t->ndim, op, &d));
    if (t->ndim == 0) continue; /* a 0-d tensor: dim 0 / -1 name the tensor itself */
    if (*mask & (1u << d))
      DDP_FAIL(DDP_ERR_ARG, "%s: dimension %d appears more than once in dims (tensor of shape %s)",
               op, d + 1, DDP_SHAPE(t));
    *mask |= 1u << d;
  }
  return DDP_OK;
}

/* The output shape: t's shape without the reduced dims, or with size 1 there. */
static int reduced_shape(const ddp_tensor *t, uint32_t mask, int keepdim, int64_t *shape) {
  int nd = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (mask & (1u << d)) {
      if (keepdim) shape[nd++] = 1;
    } else {
      shape[nd++] = t->shape[d];
    }
  }
  return nd;
}

/* Number of elements reduced into each output element. */
static int64_t reduced_count(const ddp_tensor *t, uint32_t mask) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++)
    if (mask & (1u << d)) n *= t->shape[d];
  return n;
}

/* A contiguous tensor *src with t's values laid out as (A, R, B), R the reduced elements. */
static int reduce_layout(ddp_tensor **src, ddp_tensor *t, uint32_t mask, int64_t *A, int64_t *R,
                         int64_t *B) {
  int lo = -1, hi = -1, block = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1) continue;
    if (mask & (1u << d)) {
      if (lo < 0) lo = d;
      hi = d;
    }
  }
  for (int d = lo + 1; lo >= 0 && d < hi; d++)
    if (!(mask & (1u << d)) && t->shape[d] != 1) block = 0;
  if (lo < 0) { /* nothing but size-1 dims reduced */
    *A = t->numel;
    *R = 1;
    *B = 1;
    int status;
    NO_GRAD(status, ddp_contiguous(src, t));
    return status;
  }
  if (block && ddp_tensor_is_contiguous(t)) {
    *A = *R = *B = 1;
    for (int d = 0; d < t->ndim; d++) {
      if (d < lo) *A *= t->shape[d];
      else if (d <= hi) *R *= t->shape[d];
      else *B *= t->shape[d];
    }
    ddp_tensor_retain(t);
    *src = t;
    return DDP_OK;
  }
  /* move the reduced dims last (a strided view), then copy */
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int k = 0;
  *A = *R = 1;
  *B = 1;
  for (int d = 0; d < t->ndim; d++)
    if (!(mask & (1u << d))) {
      shape[k] = t->shape[d];
      strides[k++] = t->strides[d];
      *A *= t->shape[d];
    }
  for (int d = 0; d < t->ndim; d++)
    if (mask & (1u << d)) {
      shape[k] = t->shape[d];
      strides[k++] = t->strides[d];
      *R *= t->shape[d];
    }
  ddp_tensor *view;
  DDP_TRY(ddp_tensor_view_raw(&view, t, t->ndim, shape, strides, t->offset));
  int status;
  NO_GRAD(status, ddp_clone(src, view));
  ddp_tensor_release(view);
  return status;
}

/* (A, R, B) around one dim of a contiguous tensor. */
static void dim_layout(const ddp_tensor *t, int dim, int64_t *A, int64_t *R, int64_t *B) {
  *A = *R = *B = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (d < dim) *A *= t->shape[d];
    else if (d == dim) *R *= t->shape[d];
    else *B *= t->shape[d];
  }
}

/* t converted to dtype (a new reference; t itself when it matches). */
static int as_dtype(ddp_tensor **out, ddp_tensor *t, int dtype) { return ddp_to_dtype(out, t, dtype); }

/* f16/bf16 compute in f32; f32/f64 as they are. */
static int float_compute_dtype(int dtype) {
  return dtype == DDP_F64 ? DDP_F64 : DDP_F32;
}

/* Data pointer of t as void * (ddp_data gives char *), for the typed kernels. */
static inline void *dptr(const ddp_tensor *t) { return ddp_data(t); }

static void release_all(ddp_tensor *a, ddp_tensor *b, ddp_tensor *c) {
  ddp_tensor_release(a);
  ddp_tensor_release(b);
  ddp_tensor_release(c);
}

/* A view of r (the reduced result, keepdim or not) at t's full shape, stride 0 along the
 * reduced dims: the broadcast every backward needs. */
static int expand_view(ddp_tensor **out, ddp_tensor *r, int ndim, const int64_t *shape,
                       uint32_t mask, int keepdim) {
  int64_t kshape[DDP_MAX_DIMS], kstrides[DDP_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < ndim; d++) {
    if (mask & (1u << d)) {
      kshape[d] = shape[d];
      kstrides[d] = 0;
      if (keepdim) k++;
    } else {
      kshape[d] = shape[d];
      kstrides[d] = r->strides[k++];
    }
  }
  return ddp_tensor_view_raw(out, r, ndim, kshape, kstrides, r->offset);
}

/* ---- private element loops for the backward passes --------------------------------------- */

static inline double ld(const char *p, int dt) {
  if (dt == DDP_F32) return *(const float *)p;
  if (dt == DDP_F64) return *(const double *)p;
  return ddp_load_f64(p, dt);
}

static inline void st(char *p, int dt, double v) {
  if (dt == DDP_F32) *(float *)p = (float)v;
  else if (dt == DDP_F64) *(double *)p = v;
  else ddp_store_f64(p, dt, v);
}

static inline double sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : 0; }

/* What a gradient loop computes: out[i] = q[i] * f(x[i], s[i]). */
enum grad_kind {
  G_DEV,     /* q * (x - s): var, std (s: the mean) */
  G_SCALE,   /* q * x: 2-norm */
  G_SIGN,    /* q * sign(x): 1-norm */
  G_POW,     /* q * sign(x) |x|^(p - 1): p-norm */
  G_ABS_EQ,  /* |x| == s ? q * sign(x) : 0: inf-norm */
  G_EQ,      /* x == s ? q : 0: full max/min */
  G_COUNT_ABS_EQ, /* out += (|x| == s): ties of the inf-norm (serial) */
  G_COUNT_EQ      /* out += (x == s): ties of max/min (serial) */
};

typedef struct { int kind; double p; int dt[4]; } grad_ctx;

/* What small_apply computes on reduced-shape tensors a, b (see small_loop). */
enum { S_DIV_SAFE, S_DIV, S_DIV_POW_SAFE, S_MUL };

static inline int same(double a, double b) { return a == b || (a != a && b != b); }

static void grad_loop(void *vctx, char **ptr, const int64_t *s, int64_t n) {
  const grad_ctx *c = vctx;
  for (int64_t i = 0; i < n; i++) {
    char *o = ptr[0] + i * s[0];
    double x = ld(ptr[1] + i * s[1], c->dt[1]);
    double q = ld(ptr[2] + i * s[2], c->dt[2]);
    double sv = ld(ptr[3] + i * s[3], c->dt[3]);
    double v;
    switch (c->kind) {
    case G_DEV: v = q * (x - sv); break;
    case G_SCALE: v = q * x; break;
    case G_SIGN: v = q * sign(x); break;
    case G_POW: v = q * sign(x) * pow(fabs(x), c->p - 1); break;
    case G_ABS_EQ: v = same(fabs(x), sv) ? q * sign(x) : 0; break;
    case G_EQ: v = same(x, sv) ? q : 0; break;
    case G_COUNT_ABS_EQ: v = ld(o, c->dt[0]) + same(fabs(x), sv); break;
    default: v = ld(o, c->dt[0]) + same(x, sv); break;
    }
    st(o, c->dt[0], v);
  }
}

/* ---- the same formulas for tensors on a device (Note [reduce on devices]) ---------------- */

/* Release an array of n tensors (NULL entries skipped). */
static void release_n(ddp_tensor **ts, int n) {
  for (int i = 0; i < n; i++) ddp_tensor_release(ts[i]);
}

/* *out = g * sign(x) (0 where x is 0: the gradient of abs), by the unary_backward kernel of
 * x's device. g: a view of x's shape; *out: new, x's dtype. */
static int sign_times_device(ddp_tensor **out, ddp_tensor *g, ddp_tensor *x) {
  const char *op = "reduce backward";
  const ddp_kernels *k = ddp_kernels_for(x->device);
  *out = NULL;
  DDP_TRY(DDP_KERNEL_CHECK(k, unary_backward, op));
  DDP_TRY(ddp_tensor_empty(out, x->ndim, x->shape, x->dtype, x->device));
  k->unary_backward(*out, g, x, DDP_EW_ABS, 0, 0);
  int status = ddp_device_check(x->device, op);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

/* out = same(a, b) element-wise on a device, as the CPU loops' same(): equal, or both NaN
 * (so a NaN extreme sends its gradient as on the CPU). Bool result. */
static int same_device(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) {
  ddp_tensor *tmp[3] = {NULL, NULL, NULL}; /* a == b, a is NaN, b is NaN */
  int status = ddp_eq(&tmp[0], a, b);
  if (!status) status = ddp_ne(&tmp[1], a, a);
  if (!status) status = ddp_ne(&tmp[2], b, b);
  if (!status) status = ddp_where(out, tmp[1], tmp[2], tmp[0]); /* a NaN: tie iff b NaN */
  for (int i = 0; i < 3; i++) ddp_tensor_release(tmp[i]);
  return status;
}

/* *out = cond ? a : 0 (a 0-d zero of a's dtype on a's device, broadcast). */
static int where_or_zero(ddp_tensor **out, ddp_tensor *cond, ddp_tensor *a) {
  ddp_tensor *z;
  DDP_TRY(ddp_tensor_zeros(&z, 0, NULL, a->dtype, a->device));
  int status = ddp_where(out, cond, a, z);
  ddp_tensor_release(z);
  return status;
}

/* grad_loop's non-counting kinds through the element-wise front doors (grad mode is off in
 * backward functions): out (x's shape) = q * f(x, s), q and s expanded along mask. */
static int grad_apply_device(ddp_tensor *out, int kind, double p, ddp_tensor *x, ddp_tensor *q,
                             ddp_tensor *s, uint32_t mask, int keepdim) {
  ddp_tensor *tmp[6] = {NULL, NULL, NULL, NULL, NULL, NULL}; /* qv, sv, scratch..., result */
  ddp_tensor **qv = &tmp[0], **sv = &tmp[1], **res = &tmp[5];
  int status = expand_view(qv, q, x->ndim, x->shape, mask, keepdim);
  if (!status) status = expand_view(sv, s, x->ndim, x->shape, mask, keepdim);
  if (!status) {
    switch (kind) {
    case G_DEV: /* q (x - s) */
      status = ddp_sub(&tmp[2], x, *sv);
      if (!status) status = ddp_mul(res, *qv, tmp[2]);
      break;
    case G_SCALE: /* q x */
      status = ddp_mul(res, *qv, x);
      break;
    case G_SIGN: /* q sign(x) */
      status = sign_times_device(res, *qv, x);
      break;
    case G_POW: /* q sign(x) |x|^(p - 1) */
      status = ddp_abs(&tmp[2], x);
      if (!status) status = ddp_pow_scalar(&tmp[3], tmp[2], p - 1);
      if (!status) status = ddp_mul(&tmp[4], *qv, tmp[3]);
      if (!status) status = sign_times_device(res, tmp[4], x);
      break;
    case G_ABS_EQ: /* same(|x|, s) ? q sign(x) : 0 */
      status = ddp_abs(&tmp[2], x);
      if (!status) status = same_device(&tmp[3], tmp[2], *sv);
      if (!status) status = where_or_zero(&tmp[4], tmp[3], *qv);
      if (!status) status = sign_times_device(res, tmp[4], x);
      break;
    case G_EQ: /* same(x, s) ? q : 0 */
      status = same_device(&tmp[2], x, *sv);
      if (!status) status = where_or_zero(res, tmp[2], *qv);
      break;
    default:
      status = DDP_ERROR(DDP_ERR_STATE, "reduce backward: gradient kind %d has no device form",
                         kind);
      break;
    }
  }
  if (!status) status = ddp_copy_(out, *res);
  release_n(tmp, 6);
  return status;
}

/* small_loop through the front doors: a new tensor of a's shape and dtype. */
static int small_apply_device(ddp_tensor **out, int mode, double k, double p, ddp_tensor *a,
                              ddp_tensor *b) {
  ddp_tensor *tmp[4] = {NULL, NULL, NULL, NULL};
  int status;
  *out = NULL;
  switch (mode) {
  case S_MUL:
    return ddp_mul_scalar(out, a, k);
  case S_DIV:
    status = ddp_div(&tmp[0], a, b);
    if (!status) status = ddp_mul_scalar(out, tmp[0], k);
    break;
  default: /* S_DIV_SAFE, S_DIV_POW_SAFE: 0 where b == 0 */
    if (mode == S_DIV_POW_SAFE) status = ddp_pow_scalar(&tmp[0], b, p);
    else {
      ddp_tensor_retain(b);
      tmp[0] = b;
      status = DDP_OK;
    }
    if (!status) status = ddp_div(&tmp[1], a, tmp[0]);
    if (!status) status = ddp_mul_scalar(&tmp[2], tmp[1], k);
    if (!status) status = ddp_ne_scalar(&tmp[3], b, 0);
    if (!status) status = where_or_zero(out, tmp[3], tmp[2]);
    break;
  }
  release_n(tmp, 4);
  return status;
}

/* out (t's shape) = loop kind over x, q and s, where q and s are reduced tensors expanded
 * along mask. Count kinds write into a reduced-shape out (serially, many-to-one; CPU only). */
static int grad_apply(ddp_tensor *out, int kind, double p, ddp_tensor *x, ddp_tensor *q,
                      ddp_tensor *s, uint32_t mask, int keepdim) {
  if (x->device != DDP_DEVICE_CPU) return grad_apply_device(out, kind, p, x, q, s, mask, keepdim);
  ddp_tensor *qv = NULL, *sv = NULL, *ov = NULL;
  int status = expand_view(&qv, q, x->ndim, x->shape, mask, keepdim);
  if (!status) status = expand_view(&sv, s, x->ndim, x->shape, mask, keepdim);
  int count = kind == G_COUNT_EQ || kind == G_COUNT_ABS_EQ;
  if (!status) {
    if (count) status = expand_view(&ov, out, x->ndim, x->shape, mask, keepdim);
    else {
      ddp_tensor_retain(out);
      ov = out;
    }
  }
  if (!status) {
    grad_ctx c = {kind, p, {ov->dtype, x->dtype, qv->dtype, sv->dtype}};
    ddp_tensor *ops[4] = {ov, x, qv, sv};
    ddp_foreach(4, ops, x->ndim, x->shape, grad_loop, &c, count ? 0 : 1 << 14);
    ddp_tensor_bump_version(out);
  }
  release_all(qv, sv, ov);
  return status;
}

/* Element-wise on reduced-shape tensors: out = a / b (b == 0 -> 0 when zero_safe), or
 * out = a * k. */
typedef struct { double k, p; int mode; int dt[3]; } small_ctx;

static void small_loop(void *vctx, char **ptr, const int64_t *s, int64_t n) {
  const small_ctx *c = vctx;
  for (int64_t i = 0; i < n; i++) {
    double a = ld(ptr[1] + i * s[1], c->dt[1]), b = ld(ptr[2] + i * s[2], c->dt[2]), v;
    switch (c->mode) {
    case S_DIV_SAFE: v = b == 0 ? 0 : a * c->k / b; break;
    case S_DIV: v = a * c->k / b; break;
    case S_DIV_POW_SAFE: v = b == 0 ? 0 : a * c->k / pow(b, c->p); break;
    default: v = a * c->k; break;
    }
    st(ptr[0] + i * s[0], c->dt[0], v);
  }
}

/* A new f64 tensor of a's shape = small_loop(mode) over a and b (same shape); on a device,
 * a tensor of a's dtype by small_apply_device. */
static int small_apply(ddp_tensor **out, int mode, double k, double p, ddp_tensor *a,
                       ddp_tensor *b) {
  if (a->device != DDP_DEVICE_CPU) return small_apply_device(out, mode, k, p, a, b);
  DDP_TRY(ddp_tensor_empty(out, a->ndim, a->shape, DDP_F64, a->device));
  small_ctx c = {k, p, mode, {DDP_F64, a->dtype, b->dtype}};
  ddp_tensor *ops[3] = {*out, a, b};
  ddp_foreach(3, ops, a->ndim, a->shape, small_loop, &c, 0);
  return DDP_OK;
}

/* ---- sum and mean ----------------------------------------------------------------------- */

/* The sum kernel of `device` for dtype (f32, f64, i64), then the device's error check. */
static int sum_kernel(int device, void *o, const void *x, int dtype, int64_t A, int64_t R,
                      int64_t B, int mode, double scale, const char *op) {
  const ddp_kernels *k = ddp_kernels_for(device);
  DDP_TRY(DDP_KERNEL_CHECK(k, sum, op));
  if (dtype != DDP_F32 && dtype != DDP_F64) mode = DDP_SUM_PLAIN, scale = 1.0; /* i64 */
  k->sum(dtype, o, x, A, R, B, mode, scale);
  return ddp_device_check(device, op);
}

/* The start and end [*lo, *hi] of the last run of reduced dims of x (size-1 dims skipped)
 * when the reduced dims form two runs or more; 0 when they form at most one. */
static int last_run(const ddp_tensor *x, uint32_t mask, int *lo, int *hi) {
  int runs = 0, inside = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (x->shape[d] == 1) continue;
    if (mask & (1u << d)) {
      if (!inside) {
        runs++;
        *lo = d;
        inside = 1;
      }
      *hi = d;
    } else {
      inside = 0;
    }
  }
  return runs >= 2;
}

/* The sum kernel on x (already of a compute dtype: f32, f64, i64) into a new tensor of
 * (nd, shape). Reduced dims in several runs of a contiguous x (the bias gradient of a
 * convolution: (N, C, H, W) over N, H, W) are summed run by run from the last, each stage
 * a fast (A, R, B) pass, instead of copying x into a permuted layout. */
static int run_sum(ddp_tensor **out, ddp_tensor *x, uint32_t mask, int nd, const int64_t *shape,
                   int mode, double scale, const char *op) {
  int lo, hi;
  if (mode != DDP_SUM_SQRT && ddp_tensor_is_contiguous(x) && last_run(x, mask, &lo, &hi)) {
    int64_t pshape[DDP_MAX_DIMS], A = 1, R = 1, B = 1;
    uint32_t pmask = 0;
    int pn = 0;
    for (int d = 0; d < x->ndim; d++) {
      if (d < lo) A *= x->shape[d];
      else if (d <= hi) R *= x->shape[d];
      else B *= x->shape[d];
      if (d >= lo && d <= hi && (mask & (1u << d))) continue;
      if (mask & (1u << d)) pmask |= 1u << pn;
      pshape[pn++] = x->shape[d];
    }
    ddp_tensor *part;
    DDP_TRY(ddp_tensor_empty(&part, pn, pshape, x->dtype, x->device));
    int status = sum_kernel(x->device, ddp_data(part), ddp_data(x), x->dtype, A, R, B, mode, 1.0,
                            op);
    if (!status) status = run_sum(out, part, pmask, nd, shape, DDP_SUM_PLAIN, scale, op);
    ddp_tensor_release(part);
    return status;
  }
  ddp_tensor *src;
  int64_t A, R, B;
  DDP_TRY(reduce_layout(&src, x, mask, &A, &R, &B));
  int status = ddp_tensor_empty(out, nd, shape, x->dtype, x->device);
  if (!status)
    status = sum_kernel(x->device, ddp_data(*out), ddp_data(src), x->dtype, A, R, B, mode, scale,
                        op);
  ddp_tensor_release(src);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

/* sum / mean / 1-norm / 2-norm of t into result dtype odt. */
static int sum_like(ddp_tensor **out, ddp_tensor *t, uint32_t mask, int keepdim, int odt,
                    int mode, double scale, const char *op) {
  int64_t shape[DDP_MAX_DIMS];
  int nd = reduced_shape(t, mask, keepdim, shape);
  int cdt = ddp_dtype_is_floating(odt) ? float_compute_dtype(odt) : DDP_I64;
  ddp_tensor *x = NULL, *r = NULL;
  int status;
  NO_GRAD(status, as_dtype(&x, t, cdt));
  if (!status) status = run_sum(&r, x, mask, nd, shape, mode, scale, op);
  ddp_tensor_release(x);
  if (!status && cdt != odt) {
    ddp_tensor *c;
    NO_GRAD(status, as_dtype(&c, r, odt));
    ddp_tensor_release(r);
    r = status ? NULL : c;
  }
  *out = r;
  return status;
}

/* Broadcast g back to the input's shape and dtype, times scale. */
static int expand_grad(ddp_tensor **gi, ddp_tensor *g, const ddp_input_meta *m, uint32_t mask,
                       int keepdim, double scale) {
  ddp_tensor *view, *gs = g;
  *gi = NULL;
  if (scale != 1.0 && g->device != DDP_DEVICE_CPU) { /* g's dtype, through the front door */
    DDP_TRY(ddp_mul_scalar(&gs, g, scale));
  } else if (scale != 1.0) {
    DDP_TRY(ddp_tensor_empty(&gs, g->ndim, g->shape, DDP_F64, g->device));
    small_ctx c = {scale, 0, S_MUL, {DDP_F64, g->dtype, g->dtype}};
    ddp_tensor *ops[3] = {gs, g, g};
    ddp_foreach(3, ops, g->ndim, g->shape, small_loop, &c, 0);
  }
  int status = expand_view(&view, gs, m->ndim, m->shape, mask, keepdim);
  if (!status) status = ddp_tensor_empty(gi, m->ndim, m->shape, m->dtype, g->device);
  if (!status) status = ddp_copy_(*gi, view);
  if (!status) (*gi)->storage->version = 0;
  else {
    ddp_tensor_release(*gi);
    *gi = NULL;
  }
  if (gs != g) ddp_tensor_release(gs);
  ddp_tensor_release(view);
  return status;
}

static int sum_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return expand_grad(&gi[0], g, &n->inputs[0], (uint32_t)n->iattr[0], (int)n->iattr[1],
                     n->fattr[0]);
}

/* Record a node for a reduction whose backward needs nothing saved (sum, mean). */
static int record_reduce(ddp_tensor **out, ddp_tensor *t, const char *name, ddp_backward_fn bw,
                         uint32_t mask, int keepdim, double scale, int n_saved, ddp_node **node) {
  *node = NULL;
  if (!ddp_autograd_needed(1, &t) || !ddp_dtype_is_floating((*out)->dtype)) return DDP_OK;
  ddp_node *n = ddp_node_new(name, bw, 1, &t, n_saved);
  if (!n) {
    ddp_tensor_release(*out);
    *out = NULL;
    return ddp_last_status();
  }
  n->iattr[0] = mask;
  n->iattr[1] = keepdim;
  n->fattr[0] = scale;
  ddp_autograd_set_output(*out, n);
  *node = n;
  return DDP_OK;
}

/* Save tensors into a just-recorded node; on failure drop the output. */
static int save_or_drop(ddp_tensor **out, ddp_node *n, ddp_tensor *a, ddp_tensor *b) {
  if (!n) return DDP_OK;
  int status = ddp_node_save(n, 0, a);
  if (!status && b) status = ddp_node_save(n, 1, b);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

static int check_dtype_arg(const char *op, int dtype) {
  if (dtype < -1 || dtype >= DDP_DTYPE_COUNT) DDP_FAIL(DDP_ERR_ARG, "%s: unknown dtype %d", op, dtype);
  return DDP_OK;
}

int ddp_sum(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int keepdim, int dtype) {
  *out = NULL;
  ddp_tensor *ac_in[1] = {t}, *ac[1]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_SUM, 1, ac_in, ac, ddp_sum(out, ac[0], dims, ndims, keepdim, dtype));
  uint32_t mask;
  DDP_TRY(ddp_check_alive(t, "sum", "self"));
  DDP_TRY(check_dtype_arg("sum", dtype));
  DDP_TRY(parse_dims("sum", t, dims, ndims, &mask));
  int odt = dtype >= 0 ? dtype : ddp_dtype_is_floating(t->dtype) ? t->dtype : DDP_I64;
  DDP_TRY(sum_like(out, t, mask, keepdim, odt, DDP_SUM_PLAIN, 1.0, "sum"));
  ddp_node *n;
  return record_reduce(out, t, "SumBackward", sum_backward, mask, keepdim, 1.0, 0, &n);
}

int ddp_mean(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int keepdim, int dtype) {
  *out = NULL;
  ddp_tensor *ac_in[1] = {t}, *ac[1]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_MEAN, 1, ac_in, ac, ddp_mean(out, ac[0], dims, ndims, keepdim, dtype));
  uint32_t mask;
  DDP_TRY(ddp_check_alive(t, "mean", "self"));
  DDP_TRY(check_dtype_arg("mean", dtype));
  DDP_TRY(parse_dims("mean", t, dims, ndims, &mask));
  int odt = dtype >= 0 ? dtype : t->dtype;
  if (!ddp_dtype_is_floating(odt))
    DDP_FAIL(DDP_ERR_ARG, "mean: could not infer the output dtype: input of shape %s has dtype %s "
             "and mean needs a floating dtype (convert with :float() or pass dtype)",
             DDP_SHAPE(t), ddp_dtype_name(odt));
  double scale = 1.0 / (double)reduced_count(t, mask); /* 1/0 = inf: 0 * inf = nan */
  DDP_TRY(sum_like(out, t, mask, keepdim, odt, DDP_SUM_PLAIN, scale, "mean"));
  ddp_node *n;
  return record_reduce(out, t, "MeanBackward", sum_backward, mask, keepdim, scale, 0, &n);
}

/* ---- max / min / argmax / argmin ----------------------------------------------------------- */

/* values (x's dtype) and indices of the extreme along the (A, R, B) layout of contiguous x,
 * by the kernel of x's device. */
static int run_argext(void *values, int64_t *indices, ddp_tensor *x, int64_t A, int64_t R,
                      int64_t B, int is_max, const char *op) {
  const ddp_kernels *k = ddp_kernels_for(x->device);
  const void *s = ddp_data(x);
  DDP_TRY(DDP_KERNEL_CHECK(k, argext, op));
  k->argext(x->dtype, values, indices, s, A, R, B, is_max); /* u8 and bool alike */
  return ddp_device_check(x->device, op);
}

/* The core of every max/min/argmax/argmin: dim < 0 means the whole tensor flattened.
 * *values (NULL: not wanted) in t's dtype, *indices (NULL: not wanted) in i64. */
static int argext(ddp_tensor **values, ddp_tensor **indices, ddp_tensor *t, int dim, int keepdim,
                  int is_max, const char *op) {
  int64_t shape[DDP_MAX_DIMS];
  int nd = 0;
  ddp_tensor *x = NULL, *v = NULL, *ix = NULL;
  int64_t A, R, B;
  if (dim < 0) {
    if (t->numel == 0)
      DDP_FAIL(DDP_ERR_ARG, "%s: the input of shape %s is empty: the reduction has no identity "
               "(pass a dim with non-zero size)", op, DDP_SHAPE(t));
    A = 1, R = t->numel, B = 1;
  } else {
    int64_t size = t->ndim ? t->shape[dim] : 1;
    if (size == 0)
      DDP_FAIL(DDP_ERR_ARG, "%s: dimension %d of the input of shape %s has size 0: the reduction "
               "has no identity", op, dim + 1, DDP_SHAPE(t));
    nd = reduced_shape(t, t->ndim ? 1u << dim : 0, keepdim, shape);
  }
  int half = t->dtype == DDP_F16 || t->dtype == DDP_BF16;
  int status;
  NO_GRAD(status, half ? as_dtype(&x, t, DDP_F32) : ddp_contiguous(&x, t));
  if (status) return status;
  if (dim >= 0) dim_layout(x, dim, &A, &R, &B);
  status = ddp_tensor_empty(&v, nd, shape, x->dtype, t->device);
  if (!status) status = ddp_tensor_empty(&ix, nd, shape, DDP_I64, t->device);
  if (!status) status = run_argext(dptr(v), dptr(ix), x, A, R, B, is_max, op);
  if (!status && half && values) {
    ddp_tensor *c;
    NO_GRAD(status, as_dtype(&c, v, t->dtype));
    ddp_tensor_release(v);
    v = status ? NULL : c;
  }
  ddp_tensor_release(x);
  if (status) {
    release_all(v, ix, NULL);
    return status;
  }
  if (values) *values = v;
  else ddp_tensor_release(v);
  if (indices) *indices = ix;
  else ddp_tensor_release(ix);
  return DDP_OK;
}

/* d(max along dim)/dx: g lands at the saved index of each slice. */
typedef struct { int64_t R, B; int gdt, odt; } scatter_ctx;

/* maxdim_backward on a device: gi (zeros, the input's shape, contiguous) receives gc
 * (contiguous, the output's elements) at the saved indices ix, by the scatter_add kernel
 * (the indices come from the forward kernel: no bounds check needed). */
static int maxdim_backward_device(ddp_tensor *gi, ddp_tensor *gc, ddp_tensor *ix, int dim) {
  const char *op = "max backward";
  if (gi->ndim == 0) return ddp_copy_(gi, gc); /* one element: the gradient itself */
  const ddp_kernels *k = ddp_kernels_for(gi->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, scatter_add, op));
  ddp_tensor *src;
  DDP_TRY(ddp_to_dtype(&src, gc, gi->dtype));
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  for (int d = 0; d < gi->ndim; d++) shape[d] = d == dim ? 1 : gi->shape[d];
  ddp_contiguous_strides(gi->ndim, shape, strides); /* gc and ix: (A, 1, B) row-major */
  k->scatter_add(ddp_data(gi), gi->strides, ddp_data(src), strides, (const int64_t *)ddp_data(ix),
                 gi->ndim, shape, dim, gi->dtype);
  ddp_tensor_release(src);
  int status = ddp_device_check(gi->device, op);
  if (!status) ddp_tensor_bump_version(gi);
  return status;
}

static int maxdim_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *ix = ddp_node_saved(n, 0);
  if (!ix) return ddp_last_status();
  const ddp_input_meta *m = &n->inputs[0];
  int dim = (int)n->iattr[0];
  ddp_tensor *gc;
  ddp_tensor *both[2] = {g, ix};
  const char *names[2] = {"grad", "indices"};
  DDP_TRY(ddp_check_same_device("max backward", 2, both, names));
  DDP_TRY(ddp_contiguous(&gc, g));
  int status = ddp_tensor_zeros(&gi[0], m->ndim, m->shape, m->dtype, g->device);
  if (status) {
    ddp_tensor_release(gc);
    return status;
  }
  if (g->device != DDP_DEVICE_CPU) {
    status = maxdim_backward_device(gi[0], gc, ix, dim);
    ddp_tensor_release(gc);
    if (status) {
      ddp_tensor_release(gi[0]);
      gi[0] = NULL;
    }
    return status;
  }
  int64_t A = 1, R = 1, B = 1;
  for (int d = 0; d < m->ndim; d++) {
    if (d < dim) A *= m->shape[d];
    else if (d == dim) R *= m->shape[d];
    else B *= m->shape[d];
  }
  const int64_t *idx = (const int64_t *)ddp_data(ix);
  const char *gp = ddp_data(gc);
  char *op = ddp_data(gi[0]);
  size_t ges = ddp_dtype_size(gc->dtype), oes = ddp_dtype_size(m->dtype);
  for (int64_t a = 0; a < A; a++)
    for (int64_t b = 0; b < B; b++) {
      int64_t k = a * B + b;
      int64_t at = (a * R + idx[k]) * B + b;
      st(op + at * oes, m->dtype, ld(gp + k * ges, gc->dtype));
    }
  ddp_tensor_release(gc);
  return DDP_OK;
}

static int ext_dim(ddp_tensor **values, ddp_tensor **indices, ddp_tensor *t, int dim, int keepdim,
                   int is_max, const char *op) {
  *values = NULL;
  *indices = NULL;
  DDP_TRY(ddp_check_alive(t, op, "self"));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, op, &d));
  DDP_TRY(argext(values, indices, t, d, keepdim, is_max, op));
  if (ddp_autograd_needed(1, &t) && ddp_dtype_is_floating(t->dtype)) {
    ddp_node *n = ddp_node_new(is_max ? "MaxBackward" : "MinBackward", maxdim_backward, 1, &t, 1);
    int status = n ? ddp_node_save(n, 0, *indices) : ddp_last_status();
    if (status) {
      ddp_node_release(n);
      release_all(*values, *indices, NULL);
      *values = *indices = NULL;
      return status;
    }
    n->iattr[0] = t->ndim ? d : 0;
    n->iattr[1] = keepdim;
    ddp_autograd_set_output(*values, n);
  }
  return DDP_OK;
}

int ddp_max_dim(ddp_tensor **values, ddp_tensor **indices, ddp_tensor *t, int dim, int keepdim) {
  return ext_dim(values, indices, t, dim, keepdim, 1, "max");
}

int ddp_min_dim(ddp_tensor **values, ddp_tensor **indices, ddp_tensor *t, int dim, int keepdim) {
  return ext_dim(values, indices, t, dim, keepdim, 0, "min");
}

/* Dims list of a mask (for calling ddp_mean and ddp_sum from backward). */
static int mask_dims(uint32_t mask, int ndim, int *dims) {
  int k = 0;
  for (int d = 0; d < ndim; d++)
    if (mask & (1u << d)) dims[k++] = d;
  return k;
}

/* ties_backward on a device: count = sum(same(x, r)) over mask (|x| for the inf-norm),
 * then gi = same(x, r) ? g / count : 0 (times sign(x) for the inf-norm); NaN ties NaN, as
 * on the CPU. */
static int ties_backward_device(ddp_tensor **gi, ddp_tensor *g, ddp_tensor *x, ddp_tensor *r,
                                uint32_t mask, int keepdim, int abs_kind) {
  ddp_tensor *tmp[5] = {NULL, NULL, NULL, NULL, NULL}; /* rv, |x|, eq, count, q */
  int dims[DDP_MAX_DIMS];
  int nd = mask_dims(mask, x->ndim, dims);
  int status = expand_view(&tmp[0], r, x->ndim, x->shape, mask, keepdim);
  if (!status) {
    if (abs_kind) status = ddp_abs(&tmp[1], x);
    else {
      ddp_tensor_retain(x);
      tmp[1] = x;
    }
  }
  if (!status) status = same_device(&tmp[2], tmp[1], tmp[0]);
  if (!status) status = ddp_sum(&tmp[3], tmp[2], dims, nd, keepdim, g->dtype);
  if (!status) status = ddp_div(&tmp[4], g, tmp[3]);
  if (!status) status = ddp_tensor_empty(&gi[0], x->ndim, x->shape, x->dtype, x->device);
  if (!status) status = grad_apply(gi[0], abs_kind ? G_ABS_EQ : G_EQ, 0, x, tmp[4], r, mask, keepdim);
  release_n(tmp, 5);
  return status;
}

/* Gradient split evenly among the elements equal to the extreme (amax/amin rule, and the
 * inf-norm with |x|): count the ties per output element, then g / count where equal. */
static int ties_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi, int abs_kind) {
  ddp_tensor *x = ddp_node_saved(n, 0), *r = ddp_node_saved(n, 1);
  if (!x || !r) return ddp_last_status();
  uint32_t mask = (uint32_t)n->iattr[0];
  int keepdim = (int)n->iattr[1];
  ddp_tensor *both[2] = {g, x};
  const char *names[2] = {"grad", "input"};
  DDP_TRY(ddp_check_same_device(abs_kind ? "norm backward" : "max backward", 2, both, names));
  if (x->device != DDP_DEVICE_CPU) return ties_backward_device(gi, g, x, r, mask, keepdim, abs_kind);
  ddp_tensor *count = NULL, *q = NULL;
  int status = ddp_tensor_zeros(&count, r->ndim, r->shape, DDP_F64, r->device);
  if (!status) status = grad_apply(count, abs_kind ? G_COUNT_ABS_EQ : G_COUNT_EQ, 0, x, count, r,
                                   mask, keepdim);
  if (!status) status = small_apply(&q, S_DIV, 1.0, 0, g, count);
  if (!status) status = ddp_tensor_empty(&gi[0], x->ndim, x->shape, x->dtype, x->device);
  if (!status) status = grad_apply(gi[0], abs_kind ? G_ABS_EQ : G_EQ, 0, x, q, r, mask, keepdim);
  release_all(count, q, NULL);
  return status;
}

static int amax_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return ties_backward(n, g, gi, 0);
}

static int ext_all(ddp_tensor **out, ddp_tensor *t, int is_max, const char *op) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, op, "self"));
  DDP_TRY(argext(out, NULL, t, -1, 0, is_max, op));
  ddp_node *n;
  DDP_TRY(record_reduce(out, t, is_max ? "AmaxBackward" : "AminBackward", amax_backward,
                        (uint32_t)((1u << t->ndim) - 1), 0, 1.0, 2, &n));
  return save_or_drop(out, n, t, *out);
}

int ddp_max(ddp_tensor **out, ddp_tensor *t) { return ext_all(out, t, 1, "max"); }
int ddp_min(ddp_tensor **out, ddp_tensor *t) { return ext_all(out, t, 0, "min"); }

static int arg_dim(ddp_tensor **out, ddp_tensor *t, int dim, int keepdim, int is_max,
                   const char *op) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, op, "self"));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, op, &d));
  return argext(NULL, out, t, d, keepdim, is_max, op);
}

int ddp_argmax_dim(ddp_tensor **out, ddp_tensor *t, int dim, int keepdim) {
  return arg_dim(out, t, dim, keepdim, 1, "argmax");
}

int ddp_argmin_dim(ddp_tensor **out, ddp_tensor *t, int dim, int keepdim) {
  return arg_dim(out, t, dim, keepdim, 0, "argmin");
}

int ddp_argmax(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "argmax", "self"));
  return argext(NULL, out, t, -1, 0, 1, "argmax");
}

int ddp_argmin(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "argmin", "self"));
  return argext(NULL, out, t, -1, 0, 0, "argmin");
}

/* ---- var and std -------------------------------------------------------------------------- */

static int require_floating(const char *op, const ddp_tensor *t) {
  if (!ddp_dtype_is_floating(t->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: input of shape %s has dtype %s; %s needs a floating dtype "
             "(convert with :float())", op, DDP_SHAPE(t), ddp_dtype_name(t->dtype), op);
  return DDP_OK;
}


/* var: g * 2 (x - mean) / (n - c); std: g (x - mean) / ((n - c) std). */
static int var_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *x = ddp_node_saved(n, 0);
  if (!x) return ddp_last_status();
  int is_std = (int)n->iattr[2];
  ddp_tensor *r = NULL;
  if (is_std && !(r = ddp_node_saved(n, 1))) return ddp_last_status();
  uint32_t mask = (uint32_t)n->iattr[0];
  int keepdim = (int)n->iattr[1];
  ddp_tensor *both[2] = {g, x};
  const char *names[2] = {"grad", "input"};
  DDP_TRY(ddp_check_same_device(is_std ? "std backward" : "var backward", 2, both, names));
  double denom = (double)reduced_count(x, mask) - n->fattr[0];
  int dims[DDP_MAX_DIMS];
  int nd = mask_dims(mask, x->ndim, dims);
  ddp_tensor *mean = NULL, *q = NULL;
  int status = ddp_mean(&mean, x, dims, nd, 1, -1);
  if (!status) {
    if (is_std) status = small_apply(&q, S_DIV, 1.0 / denom, 0, g, r);
    else status = small_apply(&q, S_MUL, 2.0 / denom, 0, g, g);
  }
  if (!status) status = ddp_tensor_empty(&gi[0], x->ndim, x->shape, x->dtype, x->device);
  /* mean has keepdim shape; q has the output's */
  ddp_tensor *mv = NULL;
  if (!status) status = expand_view(&mv, mean, x->ndim, x->shape, mask, 1);
  if (!status && x->device != DDP_DEVICE_CPU) { /* (x - mean) q by the front doors */
    ddp_tensor *tmp[3] = {NULL, NULL, NULL};
    status = expand_view(&tmp[0], q, x->ndim, x->shape, mask, keepdim);
    if (!status) status = ddp_sub(&tmp[1], x, mv);
    if (!status) status = ddp_mul(&tmp[2], tmp[1], tmp[0]);
    if (!status) status = ddp_copy_(gi[0], tmp[2]);
    release_n(tmp, 3);
  } else if (!status) {
    ddp_tensor *qv;
    status = expand_view(&qv, q, x->ndim, x->shape, mask, keepdim);
    if (!status) {
      grad_ctx c = {G_DEV, 0, {gi[0]->dtype, x->dtype, qv->dtype, mv->dtype}};
      ddp_tensor *ops[4] = {gi[0], x, qv, mv};
      ddp_foreach(4, ops, x->ndim, x->shape, grad_loop, &c, 1 << 14);
      ddp_tensor_release(qv);
    }
  }
  release_all(mean, q, mv);
  return status;
}

static int var_like(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int correction,
                    int keepdim, int is_std, const char *op) {
  *out = NULL;
  uint32_t mask;
  DDP_TRY(ddp_check_alive(t, op, "self"));
  DDP_TRY(require_floating(op, t));
  DDP_TRY(parse_dims(op, t, dims, ndims, &mask));
  if (correction < 0) DDP_FAIL(DDP_ERR_ARG, "%s: correction must be >= 0, got %d", op, correction);
  int64_t shape[DDP_MAX_DIMS];
  int nd = reduced_shape(t, mask, keepdim, shape);
  int cdt = float_compute_dtype(t->dtype);
  ddp_tensor *x = NULL, *src = NULL, *r = NULL;
  int64_t A, R, B;
  int status;
  NO_GRAD(status, as_dtype(&x, t, cdt));
  if (!status) status = reduce_layout(&src, x, mask, &A, &R, &B);
  if (!status) status = ddp_tensor_empty(&r, nd, shape, cdt, t->device);
  if (!status) {
    const ddp_kernels *k = ddp_kernels_for(t->device);
    status = DDP_KERNEL_CHECK(k, var, op);
    if (!status) k->var(cdt, dptr(r), dptr(src), A, R, B, correction, is_std);
    if (!status) status = ddp_device_check(t->device, op);
  }
  release_all(x, src, NULL);
  if (!status && cdt != t->dtype) {
    ddp_tensor *c;
    NO_GRAD(status, as_dtype(&c, r, t->dtype));
    ddp_tensor_release(r);
    r = status ? NULL : c;
  }
  if (status) {
    ddp_tensor_release(r);
    return status;
  }
  *out = r;
  ddp_node *n;
  DDP_TRY(record_reduce(out, t, is_std ? "StdBackward" : "VarBackward", var_backward, mask,
                        keepdim, correction, 2, &n));
  if (n) n->iattr[2] = is_std;
  return save_or_drop(out, n, t, is_std ? *out : NULL);
}

int ddp_var(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int correction,
            int keepdim) {
  return var_like(out, t, dims, ndims, correction, keepdim, 0, "var");
}

int ddp_std(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int correction,
            int keepdim) {
  return var_like(out, t, dims, ndims, correction, keepdim, 1, "std");
}

/* ---- norm ---------------------------------------------------------------------------------- */

/* General p and inf in double over the (A, R, B) layout of a contiguous f64 x. */
static void norm_generic(double *out, const double *x, int64_t A, int64_t R, int64_t B, double p) {
  for (int64_t a = 0; a < A; a++)
    for (int64_t b = 0; b < B; b++) {
      double acc = 0;
      for (int64_t r = 0; r < R; r++) {
        double v = fabs(x[(a * R + r) * B + b]);
        if (isinf(p)) acc = v > acc || v != v ? v : acc;
        else acc += pow(v, p);
      }
      out[a * B + b] = isinf(p) ? acc : pow(acc, 1.0 / p);
    }
}

/* norm_generic on a device: r (f64, A B elements) from the contiguous f64 (A, R, B) src:
 * the inf-norm is the max of |x| by the argext kernel (NaN wins as in the CPU loop; 0 when
 * R is 0), the p-norm (sum |x|^p)^(1/p) by the front doors and the sum kernel. */
static int norm_generic_device(ddp_tensor *r, ddp_tensor *src, int64_t A, int64_t R, int64_t B,
                               double p) {
  const char *op = "norm";
  if (R == 0) return ddp_zero_(r);
  ddp_tensor *tmp[4] = {NULL, NULL, NULL, NULL}; /* |x|, |x|^p, indices, sums */
  int status = ddp_abs(&tmp[0], src);
  if (!status && isinf(p)) {
    int64_t ab = A * B;
    status = ddp_tensor_empty(&tmp[2], 1, &ab, DDP_I64, src->device);
    if (!status) status = run_argext(dptr(r), dptr(tmp[2]), tmp[0], A, R, B, 1, op);
  } else if (!status) {
    int64_t ab = A * B;
    status = ddp_pow_scalar(&tmp[1], tmp[0], p);
    if (!status) status = ddp_tensor_empty(&tmp[3], 1, &ab, DDP_F64, src->device);
    if (!status)
      status = sum_kernel(src->device, dptr(tmp[3]), dptr(tmp[1]), DDP_F64, A, R, B, DDP_SUM_PLAIN,
                          1.0, op);
    if (!status) {
      ddp_tensor *root = NULL, *rv = NULL;
      status = ddp_pow_scalar(&root, tmp[3], 1.0 / p);
      if (!status) status = ddp_view(&rv, r, 1, &ab);
      if (!status) status = ddp_copy_(rv, root);
      ddp_tensor_release(root);
      ddp_tensor_release(rv);
    }
  }
  release_n(tmp, 4);
  return status;
}

static int norm_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  double p = n->fattr[0];
  if (isinf(p)) return ties_backward(n, g, gi, 1);
  ddp_tensor *x = ddp_node_saved(n, 0), *r = ddp_node_saved(n, 1);
  if (!x || !r) return ddp_last_status();
  uint32_t mask = (uint32_t)n->iattr[0];
  int keepdim = (int)n->iattr[1];
  ddp_tensor *q = NULL;
  ddp_tensor *both[2] = {g, x};
  const char *names[2] = {"grad", "input"};
  DDP_TRY(ddp_check_same_device("norm backward", 2, both, names));
  int kind = p == 1 ? G_SIGN : p == 2 ? G_SCALE : G_POW;
  int status = p == 1 ? small_apply(&q, S_MUL, 1.0, 0, g, g)
             : p == 2 ? small_apply(&q, S_DIV_SAFE, 1.0, 0, g, r)
                      : small_apply(&q, S_DIV_POW_SAFE, 1.0, p - 1, g, r);
  if (!status) status = ddp_tensor_empty(&gi[0], x->ndim, x->shape, x->dtype, x->device);
  if (!status) status = grad_apply(gi[0], kind, p, x, q, r, mask, keepdim);
  ddp_tensor_release(q);
  return status;
}

int ddp_norm(ddp_tensor **out, ddp_tensor *t, double p, const int *dims, int ndims, int keepdim) {
  *out = NULL;
  uint32_t mask;
  DDP_TRY(ddp_check_alive(t, "norm", "self"));
  DDP_TRY(require_floating("norm", t));
  if (!(p > 0)) DDP_FAIL(DDP_ERR_ARG, "norm: p must be > 0 or inf, got %g", p);
  DDP_TRY(parse_dims("norm", t, dims, ndims, &mask));
  int status;
  if (p == 1 || p == 2) {
    DDP_TRY(sum_like(out, t, mask, keepdim, t->dtype, p == 1 ? DDP_SUM_ABS : DDP_SUM_SQRT, 1.0,
                     "norm"));
  } else {
    int64_t shape[DDP_MAX_DIMS];
    int nd = reduced_shape(t, mask, keepdim, shape);
    ddp_tensor *x = NULL, *src = NULL, *r = NULL;
    int64_t A, R, B;
    NO_GRAD(status, as_dtype(&x, t, DDP_F64));
    if (!status) status = reduce_layout(&src, x, mask, &A, &R, &B);
    if (!status) status = ddp_tensor_empty(&r, nd, shape, DDP_F64, t->device);
    if (!status && t->device != DDP_DEVICE_CPU) status = norm_generic_device(r, src, A, R, B, p);
    else if (!status) norm_generic(dptr(r), dptr(src), A, R, B, p);
    release_all(x, src, NULL);
    if (!status) {
      NO_GRAD(status, as_dtype(out, r, t->dtype));
    }
    ddp_tensor_release(r);
    if (status) return status;
  }
  ddp_node *n;
  DDP_TRY(record_reduce(out, t, "NormBackward", norm_backward, mask, keepdim, p, 2, &n));
  return save_or_drop(out, n, t, *out);
}

/* ---- softmax and log_softmax ---------------------------------------------------------------- */

/* Note [half softmax backward]: f16 and bf16 softmax and log_softmax compute in f32 and
 * round once, forward and backward. The backward needs the output y: softmax's gradient is
 * y * (dy - sum(dy * y)), and dy - sum(dy * y) often cancels, so the 2^-9 relative error
 * of a y rounded to bf16 became hundreds of bf16 ulps in small gradient elements (measured
 * against the f64 computation rounded to bf16: up to 431 ulps for rows of 1000, and up to
 * 40 for log_softmax, whose gradient is dy - exp(y) sum(dy)). So the node saves y in f32,
 * as the kernel made it, not the rounded output the caller gets: twice the bytes of that
 * output, kept only while the graph holds the node. With the CPU kernel's pivot (Note
 * [softmax backward pivot] in runtime/backend/cpu/reduce.c) the gradient is then within 1
 * ulp of the exactly rounded one on spec/ops/softmax_half_spec.lua's inputs. What remains
 * is the f32 rounding of y itself: where dy_i - sum(dy * y) cancels by chance to 2^-16 of
 * dy or less (rows of 1000 elements meet that now and then), a result may be a few ulps
 * off. */
static int softmax_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *y = ddp_node_saved(n, 0);
  if (!y) return ddp_last_status();
  int dim = (int)n->iattr[0], is_log = (int)n->iattr[1];
  ddp_tensor *both[2] = {g, y};
  const char *names[2] = {"grad", "output"};
  DDP_TRY(ddp_check_same_device(is_log ? "log_softmax backward" : "softmax backward", 2, both,
                                names));
  int cdt = float_compute_dtype(y->dtype);
  ddp_tensor *yc = NULL, *gc = NULL, *dx = NULL;
  int status = as_dtype(&yc, y, cdt); /* contiguous: made by the forward */
  if (!status) {
    ddp_tensor *g1;
    status = as_dtype(&g1, g, cdt);
    if (!status) {
      status = ddp_contiguous(&gc, g1);
      ddp_tensor_release(g1);
    }
  }
  if (!status) status = ddp_tensor_zeros(&dx, y->ndim, y->shape, cdt, y->device);
  if (!status) {
    int64_t A, R, B;
    dim_layout(y, dim, &A, &R, &B);
    const char *op = is_log ? "log_softmax backward" : "softmax backward";
    const ddp_kernels *k = ddp_kernels_for(y->device);
    status = DDP_KERNEL_CHECK(k, softmax_backward, op);
    if (!status) k->softmax_backward(cdt, dptr(dx), dptr(yc), dptr(gc), A, R, B, is_log);
    if (!status) status = ddp_device_check(y->device, op);
  }
  int in_dtype = n->inputs[0].dtype; /* y may be wider (Note [half softmax backward]) */
  if (!status && cdt != in_dtype) {
    status = as_dtype(&gi[0], dx, in_dtype);
    ddp_tensor_release(dx);
  } else if (!status) {
    gi[0] = dx;
  } else {
    ddp_tensor_release(dx);
  }
  release_all(yc, gc, NULL);
  return status;
}

static int softmax_like(ddp_tensor **out, ddp_tensor *t, int dim, int is_log, const char *op) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, op, "self"));
  DDP_TRY(require_floating(op, t));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, op, &d));
  if (t->ndim == 0) d = 0;
  int cdt = float_compute_dtype(t->dtype);
  ddp_tensor *x = t, *y = NULL;
  int status = DDP_OK;
  if (t->dtype != cdt || !ddp_tensor_is_contiguous(t)) {
    ddp_tensor *c;
    NO_GRAD(status, as_dtype(&c, t, cdt));
    if (!status) {
      NO_GRAD(status, ddp_contiguous(&x, c));
      ddp_tensor_release(c);
    }
    if (status) return status;
  }
  status = ddp_tensor_empty(&y, t->ndim, t->shape, cdt, t->device);
  if (!status) {
    int64_t A, R, B;
    dim_layout(x, t->ndim ? d : 0, &A, &R, &B);
    const ddp_kernels *k = ddp_kernels_for(t->device);
    status = DDP_KERNEL_CHECK(k, softmax, op);
    if (!status) k->softmax(cdt, dptr(y), dptr(x), A, R, B, is_log);
    if (!status) status = ddp_device_check(t->device, op);
  }
  if (x != t) ddp_tensor_release(x);
  ddp_tensor *result = y; /* y stays in the compute dtype: Note [half softmax backward] */
  if (!status && cdt != t->dtype) {
    NO_GRAD(status, as_dtype(&result, y, t->dtype));
    if (status) result = NULL;
  }
  if (status) {
    ddp_tensor_release(y);
    return status;
  }
  *out = result;
  ddp_node *n = NULL;
  if (ddp_autograd_needed(1, &t)) {
    n = ddp_node_new(is_log ? "LogSoftmaxBackward" : "SoftmaxBackward", softmax_backward, 1, &t,
                     1);
    if (!n) status = ddp_last_status();
  }
  if (n) {
    n->iattr[0] = t->ndim ? d : 0;
    n->iattr[1] = is_log;
    ddp_autograd_set_output(*out, n);
    status = save_or_drop(out, n, y, NULL);
  } else if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  if (y != result) ddp_tensor_release(y);
  return status;
}

int ddp_softmax(ddp_tensor **out, ddp_tensor *t, int dim) {
  ddp_tensor *ac_in[1] = {t}, *ac[1]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_SOFTMAX, 1, ac_in, ac, ddp_softmax(out, ac[0], dim));
  return softmax_like(out, t, dim, 0, "softmax");
}

int ddp_log_softmax(ddp_tensor **out, ddp_tensor *t, int dim) {
  ddp_tensor *ac_in[1] = {t}, *ac[1]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_LOG_SOFTMAX, 1, ac_in, ac, ddp_log_softmax(out, ac[0], dim));
  return softmax_like(out, t, dim, 1, "log_softmax");
}
