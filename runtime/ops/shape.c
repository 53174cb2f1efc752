/* runtime/ops/shape.c: front doors of the shape and indexing ops: views (view, reshape,
 * transpose, permute, squeeze, unsqueeze, expand, narrow, select, flatten, unflatten,
 * split, chunk), index_select, gather, scatter_add, cat and stack, with their autograd.
 *
 * A view is one tensor header over the input's storage (ddp_tensor_view_raw) plus, when
 * the input requires grad, a single-input node whose backward applies the inverse geometry
 * to the gradient. Messages print dimensions and positions as Lua counts them (see
 * lua_pos).
 *
 * Note [shape devices]: views need nothing (a view stays on its input's device). The ops
 * that move data (index_select, gather, scatter_add, cat, stack and their backwards) check
 * that every tensor argument is on one device, allocate on it, and call the kernels through
 * ddp_kernels_for(device). Index values are checked on the host before any kernel runs, as
 * on the CPU: an index on a device is copied to the host for that (ddp_device_memcpy, one
 * synchronous transfer of the index; PyTorch checks with device-side asserts instead). */
#include <stdio.h>
#include <stdlib.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"

/* A 0-based position or dimension as the Lua front end writes it: from 1, negatives kept. */
static long long lua_pos(int64_t p) { return p >= 0 ? (long long)p + 1 : (long long)p; }

/* ---- helpers ------------------------------------------------------------------------- */

/* A contiguous version of t (t itself, retained, when already so), recording nothing. */
static int contiguous_nograd(ddp_tensor **out, ddp_tensor *t) {
  int prev = ddp_set_grad_enabled(0);
  int status = ddp_contiguous(out, t);
  ddp_set_grad_enabled(prev);
  return status;
}

/* dst <- src (same shape), recording nothing. */
static int copy_nograd(ddp_tensor *dst, const ddp_tensor *src) {
  int prev = ddp_set_grad_enabled(0);
  int status = ddp_copy_(dst, src);
  ddp_set_grad_enabled(prev);
  return status;
}

/* A view of t with the given geometry that knows its base; records `name` with backward
 * `bw` (and up to 8 attributes) when t requires grad. */
static int make_view(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape,
                     const int64_t *strides, int64_t offset, const char *name,
                     ddp_backward_fn bw, const int64_t *iattr, int n_iattr) {
  DDP_TRY(ddp_tensor_view_raw(out, t, ndim, shape, strides, offset));
  int status = DDP_OK;
  if (ddp_autograd_needed(1, &t)) status = ddp_autograd_record_unary(out, t, name, bw, iattr, n_iattr);
  if (!status) ddp_tensor_set_view_base(*out, t); /* Note [views and their base] */
  return status;
}

static int same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
  return na == nb && !memcmp(a, b, sizeof(int64_t) * (size_t)na);
}

/* ---- view / reshape -------------------------------------------------------------------- */

/* Resolve one -1 in the requested shape against numel into `shape`; fails naming `op`. */
static int infer_shape(const char *op, const ddp_tensor *t, int ndim, const int64_t *req,
                       int64_t *shape) {
  if (ndim < 0 || ndim > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "%s: %d dimensions requested, at most %d are supported", op, ndim,
             DDP_MAX_DIMS);
  if (ndim > 0 && !req) DDP_FAIL(DDP_ERR_ARG, "%s: shape is NULL", op);
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    if (req[i] == -1) {
      if (infer >= 0)
        DDP_FAIL(DDP_ERR_ARG, "%s: only one size can be -1 (inferred), got shape %s", op,
                 ddp_shape_str(ndim, req));
      infer = i;
    } else if (req[i] < 0) {
      DDP_FAIL(DDP_ERR_ARG, "%s: invalid size %lld in shape %s", op, (long long)req[i],
               ddp_shape_str(ndim, req));
    } else if (__builtin_mul_overflow(known, req[i], &known)) {
      DDP_FAIL(DDP_ERR_ARG, "%s: shape %s has more elements than fit in 64 bits", op,
               ddp_shape_str(ndim, req));
    }
    shape[i] = req[i];
  }
  if (infer >= 0) {
    if (known == 0 || t->numel % known)
      DDP_FAIL(DDP_ERR_ARG, "%s: shape %s is invalid for a tensor of shape %s (%lld elements)",
               op, ddp_shape_str(ndim, req), DDP_SHAPE(t), (long long)t->numel);
    shape[infer] = t->numel / known;
  } else if (known != t->numel) {
    DDP_FAIL(DDP_ERR_ARG, "%s: shape %s is invalid for a tensor of shape %s (%lld elements)", op,
             ddp_shape_str(ndim, req), DDP_SHAPE(t), (long long)t->numel);
  }
  /* a 0 among the sizes hides an overflowing stride from the count above */
  return ddp_shape_check(op, ndim, shape, 0); /* Note [shape arithmetic] */
}

/* Strides that show t's elements in row-major order under `shape` (same numel) without a
 * copy, or 0 when none exist. t's dimensions are cut into chunks that are each contiguous
 * in memory (stride[d-1] == size[d] * stride[d]); the new shape must regroup every chunk
 * on its own, and inside a chunk the new strides follow from the chunk's innermost stride.
 * This is PyTorch's view rule. */
static int view_strides(const ddp_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  if (t->numel == 0 || t->ndim == 0) { /* any geometry works: use row-major strides */
    ddp_contiguous_strides(ndim, shape, strides);
    return 1;
  }
  int vd = ndim - 1;                            /* next new dimension to assign, from the back */
  int64_t base = t->strides[t->ndim - 1];       /* innermost stride of the current chunk */
  int64_t chunk_numel = 1, view_numel = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    chunk_numel *= t->shape[d];
    int chunk_ends = d == 0 || (t->shape[d - 1] != 1 && t->strides[d - 1] != chunk_numel * base);
    if (!chunk_ends) continue;
    while (vd >= 0 && (view_numel < chunk_numel || shape[vd] == 1)) {
      strides[vd] = view_numel * base;
      view_numel *= shape[vd];
      vd--;
    }
    if (view_numel != chunk_numel) return 0;
    if (d > 0) {
      base = t->strides[d - 1];
      chunk_numel = view_numel = 1;
    }
  }
  return vd == -1;
}

/* Backward of every op that only regroups dimensions: the gradient reshaped back. */
static int reshape_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return ddp_reshape(&gi[0], g, n->inputs[0].ndim, n->inputs[0].shape);
}

/* t under `shape` (already inferred, numel equal): a view when possible, else (copy != 0)
 * a contiguous copy viewed so, recorded under `name`; fails with `op`'s message otherwise. */
static int reshape_to(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape, int copy,
                      const char *op, const char *name) {
  int64_t strides[DDP_MAX_DIMS];
  if (view_strides(t, ndim, shape, strides))
    return make_view(out, t, ndim, shape, strides, t->offset, name, reshape_backward, NULL, 0);
  if (!copy)
    DDP_FAIL(DDP_ERR_ARG, "%s: a tensor of shape %s with strides %s cannot be viewed as shape %s "
             "(its memory layout does not allow it; use reshape, or contiguous first)", op,
             DDP_SHAPE(t), ddp_shape_str(t->ndim, t->strides), ddp_shape_str(ndim, shape));
  ddp_tensor *c;
  DDP_TRY(contiguous_nograd(&c, t));
  ddp_contiguous_strides(ndim, shape, strides);
  int status = ddp_tensor_view_raw(out, c, ndim, shape, strides, c->offset);
  ddp_tensor_release(c);
  DDP_TRY(status);
  if (ddp_autograd_needed(1, &t))
    return ddp_autograd_record_unary(out, t, name, reshape_backward, NULL, 0);
  return DDP_OK;
}

int ddp_view(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "view", "self"));
  int64_t s[DDP_MAX_DIMS];
  DDP_TRY(infer_shape("view", t, ndim, shape, s));
  return reshape_to(out, t, ndim, s, 0, "view", "ViewBackward");
}

int ddp_reshape(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "reshape", "self"));
  int64_t s[DDP_MAX_DIMS];
  DDP_TRY(infer_shape("reshape", t, ndim, shape, s));
  return reshape_to(out, t, ndim, s, 1, "reshape", "ReshapeBackward");
}

int ddp_flatten(ddp_tensor **out, ddp_tensor *t, int start_dim, int end_dim) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "flatten", "self"));
  int s, e;
  DDP_TRY(ddp_normalize_dim(start_dim, t->ndim, "flatten", &s));
  DDP_TRY(ddp_normalize_dim(end_dim, t->ndim, "flatten", &e));
  if (s > e)
    DDP_FAIL(DDP_ERR_ARG, "flatten: start dimension %d comes after end dimension %d (tensor %s)",
             s + 1, e + 1, DDP_SHAPE(t));
  int64_t shape[DDP_MAX_DIMS];
  if (t->ndim == 0) {
    shape[0] = 1;
    return reshape_to(out, t, 1, shape, 1, "flatten", "FlattenBackward");
  }
  int n = 0;
  for (int d = 0; d < s; d++) shape[n++] = t->shape[d];
  int64_t merged = 1;
  for (int d = s; d <= e; d++) merged *= t->shape[d];
  shape[n++] = merged;
  for (int d = e + 1; d < t->ndim; d++) shape[n++] = t->shape[d];
  return reshape_to(out, t, n, shape, 1, "flatten", "FlattenBackward");
}

int ddp_unflatten(ddp_tensor **out, ddp_tensor *t, int dim, int n, const int64_t *sizes) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "unflatten", "self"));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, "unflatten", &d));
  if (t->ndim == 0) DDP_FAIL(DDP_ERR_ARG, "unflatten: cannot unflatten a 0-d tensor");
  if (n < 1 || t->ndim - 1 + n > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "unflatten: %d sizes for dimension %d of a tensor %s (at most %d "
             "dimensions in all)", n, d + 1, DDP_SHAPE(t), DDP_MAX_DIMS);
  /* resolve -1 against the size of dim, as view does against numel */
  int64_t inner[DDP_MAX_DIMS];
  ddp_tensor probe = {.numel = t->shape[d], .ndim = 1, .shape = {t->shape[d]}};
  DDP_TRY(infer_shape("unflatten", &probe, n, sizes, inner));
  int64_t shape[DDP_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < d; i++) shape[k++] = t->shape[i];
  for (int i = 0; i < n; i++) shape[k++] = inner[i];
  for (int i = d + 1; i < t->ndim; i++) shape[k++] = t->shape[i];
  return reshape_to(out, t, k, shape, 1, "unflatten", "UnflattenBackward");
}

/* ---- transpose / permute ----------------------------------------------------------------- */

static int transpose_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return ddp_transpose(&gi[0], g, (int)n->iattr[0], (int)n->iattr[1]);
}

int ddp_transpose(ddp_tensor **out, ddp_tensor *t, int dim0, int dim1) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "transpose", "self"));
  int a, b;
  DDP_TRY(ddp_normalize_dim(dim0, t->ndim, "transpose", &a));
  DDP_TRY(ddp_normalize_dim(dim1, t->ndim, "transpose", &b));
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  if (t->ndim > 0) {
    shape[a] = t->shape[b], shape[b] = t->shape[a];
    strides[a] = t->strides[b], strides[b] = t->strides[a];
  }
  int64_t attr[2] = {a, b};
  return make_view(out, t, t->ndim, shape, strides, t->offset, "TransposeBackward",
                   transpose_backward, attr, 2);
}

int ddp_t(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "t", "self"));
  if (t->ndim > 2)
    DDP_FAIL(DDP_ERR_ARG, "t: expects a tensor with at most 2 dimensions, got %s (use "
             "transpose or permute)", DDP_SHAPE(t));
  if (t->ndim < 2) {
    ddp_tensor_retain(t);
    *out = t;
    return DDP_OK;
  }
  return ddp_transpose(out, t, 0, 1);
}

/* iattr holds the inverse permutation */
static int permute_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int dims[DDP_MAX_DIMS];
  for (int i = 0; i < g->ndim; i++) dims[i] = (int)n->iattr[i];
  return ddp_permute(&gi[0], g, g->ndim, dims);
}

int ddp_permute(ddp_tensor **out, ddp_tensor *t, int ndim, const int *dims) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "permute", "self"));
  if (ndim != t->ndim)
    DDP_FAIL(DDP_ERR_ARG, "permute: %d dimensions given for a tensor %s with %d", ndim,
             DDP_SHAPE(t), t->ndim);
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS], inverse[DDP_MAX_DIMS];
  int seen[DDP_MAX_DIMS] = {0};
  for (int i = 0; i < ndim; i++) {
    int d;
    DDP_TRY(ddp_normalize_dim(dims[i], t->ndim, "permute", &d));
    if (seen[d])
      DDP_FAIL(DDP_ERR_ARG, "permute: dimension %d appears twice (tensor %s)", d + 1, DDP_SHAPE(t));
    seen[d] = 1;
    shape[i] = t->shape[d];
    strides[i] = t->strides[d];
    inverse[d] = i;
  }
  return make_view(out, t, ndim, shape, strides, t->offset, "PermuteBackward", permute_backward,
                   inverse, ndim);
}

/* ---- squeeze / unsqueeze / expand ------------------------------------------------------ */

int ddp_squeeze(ddp_tensor **out, ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "squeeze", "self"));
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 1) continue;
    shape[n] = t->shape[d];
    strides[n++] = t->strides[d];
  }
  return make_view(out, t, n, shape, strides, t->offset, "SqueezeBackward", reshape_backward,
                   NULL, 0);
}

int ddp_squeeze_dim(ddp_tensor **out, ddp_tensor *t, int dim) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "squeeze", "self"));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, "squeeze", &d));
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (i == d && t->shape[i] == 1) continue;
    shape[n] = t->shape[i];
    strides[n++] = t->strides[i];
  }
  return make_view(out, t, n, shape, strides, t->offset, "SqueezeBackward", reshape_backward,
                   NULL, 0);
}

int ddp_unsqueeze(ddp_tensor **out, ddp_tensor *t, int dim) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "unsqueeze", "self"));
  if (t->ndim >= DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "unsqueeze: tensor %s already has the most dimensions (%d)",
             DDP_SHAPE(t), DDP_MAX_DIMS);
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim + 1, "unsqueeze", &d));
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  for (int i = 0, j = 0; i <= t->ndim; i++) {
    if (i == d) {
      shape[i] = 1;
      strides[i] = d < t->ndim ? t->shape[d] * t->strides[d] : 1;
    } else {
      shape[i] = t->shape[j];
      strides[i] = t->strides[j++];
    }
  }
  return make_view(out, t, t->ndim + 1, shape, strides, t->offset, "UnsqueezeBackward",
                   reshape_backward, NULL, 0);
}

static int expand_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  return ddp_sum_to_shape(&gi[0], g, n->inputs[0].ndim, n->inputs[0].shape);
}

int ddp_expand(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *sizes) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "expand", "self"));
  if (ndim < t->ndim || ndim > DDP_MAX_DIMS || (ndim > 0 && !sizes))
    DDP_FAIL(DDP_ERR_ARG, "expand: %d sizes given for a tensor %s (need %d to %d)", ndim,
             DDP_SHAPE(t), t->ndim, DDP_MAX_DIMS);
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int i = 0; i < ndim; i++) {
    int j = i - lead;
    int64_t want = sizes[i];
    if (j < 0) {
      if (want < 0)
        DDP_FAIL(DDP_ERR_ARG, "expand: size %lld is not allowed for the new leading dimension "
                 "%d (tensor %s to %s)", (long long)want, i + 1, DDP_SHAPE(t),
                 ddp_shape_str(ndim, sizes));
      shape[i] = want;
      strides[i] = 0;
      continue;
    }
    if (want == -1) want = t->shape[j];
    if (want < 0)
      DDP_FAIL(DDP_ERR_ARG, "expand: invalid size %lld for dimension %d (tensor %s to %s)",
               (long long)want, i + 1, DDP_SHAPE(t), ddp_shape_str(ndim, sizes));
    if (want == t->shape[j]) {
      shape[i] = want;
      strides[i] = t->strides[j];
    } else if (t->shape[j] == 1) {
      shape[i] = want;
      strides[i] = 0;
    } else {
      DDP_FAIL(DDP_ERR_ARG, "expand: the size %lld of dimension %d of tensor %s must be 1 to "
               "expand it to %lld (target %s)", (long long)t->shape[j], j + 1, DDP_SHAPE(t),
               (long long)want, ddp_shape_str(ndim, sizes));
    }
  }
  DDP_TRY(ddp_shape_check("expand", ndim, shape, 0)); /* Note [shape arithmetic] */
  return make_view(out, t, ndim, shape, strides, t->offset, "ExpandBackward", expand_backward,
                   NULL, 0);
}

/* ---- narrow / select / split / chunk ----------------------------------------------------- */

/* Gradient of a narrow (iattr: dim, start, length) or select (iattr: dim, index, -1): the
 * gradient copied into that region of zeros of the input's shape. */
static int region_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_input_meta *m = &n->inputs[0];
  int dim = (int)n->iattr[0];
  ddp_tensor *z, *region;
  DDP_TRY(ddp_tensor_zeros(&z, m->ndim, m->shape, g->dtype, g->device));
  int status = n->iattr[2] >= 0 ? ddp_narrow(&region, z, dim, n->iattr[1], n->iattr[2])
                                : ddp_select(&region, z, dim, n->iattr[1]);
  if (!status) {
    status = ddp_copy_(region, g);
    ddp_tensor_release(region);
  }
  if (status) {
    ddp_tensor_release(z);
    return status;
  }
  z->storage->version = 0;
  gi[0] = z;
  return DDP_OK;
}

/* narrow with start already normalised and checked, recorded under `name`. */
static int narrow_raw(ddp_tensor **out, ddp_tensor *t, int d, int64_t start, int64_t length,
                      const char *name) {
  int64_t shape[DDP_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[d] = length;
  int64_t attr[3] = {d, start, length};
  return make_view(out, t, t->ndim, shape, t->strides, t->offset + start * t->strides[d], name,
                   region_backward, attr, 3);
}

int ddp_narrow(ddp_tensor **out, ddp_tensor *t, int dim, int64_t start, int64_t length) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "narrow", "self"));
  if (t->ndim == 0) DDP_FAIL(DDP_ERR_ARG, "narrow: cannot narrow a 0-d tensor");
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, "narrow", &d));
  int64_t size = t->shape[d], s = start < 0 ? start + size : start;
  if (s < 0 || s > size)
    DDP_FAIL(DDP_ERR_ARG, "narrow: start %lld is out of range for dimension %d of size %lld "
             "(tensor %s)", lua_pos(start), d + 1, (long long)size, DDP_SHAPE(t));
  if (length < 0 || s + length > size)
    DDP_FAIL(DDP_ERR_ARG, "narrow: start %lld with length %lld runs past the end of dimension "
             "%d of size %lld (tensor %s)", lua_pos(s), (long long)length, d + 1, (long long)size,
             DDP_SHAPE(t));
  return narrow_raw(out, t, d, s, length, "NarrowBackward");
}

int ddp_select(ddp_tensor **out, ddp_tensor *t, int dim, int64_t index) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "select", "self"));
  if (t->ndim == 0) DDP_FAIL(DDP_ERR_ARG, "select: cannot select from a 0-d tensor");
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, "select", &d));
  int64_t size = t->shape[d], i = index < 0 ? index + size : index;
  if (i < 0 || i >= size)
    DDP_FAIL(DDP_ERR_ARG, "select: index %lld is out of range for dimension %d of size %lld "
             "(tensor %s)", lua_pos(index), d + 1, (long long)size, DDP_SHAPE(t));
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  for (int k = 0, j = 0; k < t->ndim; k++) {
    if (k == d) continue;
    shape[j] = t->shape[k];
    strides[j++] = t->strides[k];
  }
  int64_t attr[3] = {d, i, -1};
  return make_view(out, t, t->ndim - 1, shape, strides, t->offset + i * t->strides[d],
                   "SelectBackward", region_backward, attr, 3);
}

/* Make n pieces of t along d with the given sizes (summing to the size); on failure the
 * pieces made so far are released. */
static int split_pieces(ddp_tensor **outs, ddp_tensor *t, int d, int n, const int64_t *sizes,
                        const char *name) {
  int64_t start = 0;
  for (int i = 0; i < n; i++) {
    int status = narrow_raw(&outs[i], t, d, start, sizes[i], name);
    if (status) {
      for (int k = 0; k < i; k++) {
        ddp_tensor_release(outs[k]);
        outs[k] = NULL;
      }
      return status;
    }
    start += sizes[i];
  }
  return DDP_OK;
}

/* Checks shared by split and chunk: alive, not 0-d, dim in range. */
static int split_prepare(ddp_tensor *t, int dim, const char *op, int *d) {
  DDP_TRY(ddp_check_alive(t, op, "self"));
  if (t->ndim == 0) DDP_FAIL(DDP_ERR_ARG, "%s: cannot split a 0-d tensor", op);
  return ddp_normalize_dim(dim, t->ndim, op, d);
}

/* Pieces of `piece` elements (last smaller) covering `size`: the count. */
static int64_t even_count(int64_t size, int64_t piece) {
  if (piece == 0) return 1;
  int64_t c = (size + piece - 1) / piece;
  return c > 0 ? c : 1;
}

/* Fill outs with even pieces of `piece` (count pieces), the last taking what is left. */
static int even_pieces(ddp_tensor **outs, ddp_tensor *t, int d, int64_t count, int64_t piece,
                       const char *name) {
  int64_t sizes_local[64];
  int64_t *sizes = count <= 64 ? sizes_local : malloc(sizeof(int64_t) * (size_t)count);
  if (!sizes) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", name);
  int64_t left = t->shape[d];
  for (int64_t i = 0; i < count; i++) {
    sizes[i] = piece < left ? piece : left;
    left -= sizes[i];
  }
  int status = split_pieces(outs, t, d, (int)count, sizes, name);
  if (sizes != sizes_local) free(sizes);
  return status;
}

int ddp_split(ddp_tensor **outs, int cap, int *n_out, ddp_tensor *t, int64_t split_size,
              int dim) {
  int d;
  DDP_TRY(split_prepare(t, dim, "split", &d));
  int64_t size = t->shape[d];
  if (split_size < 0 || (split_size == 0 && size > 0))
    DDP_FAIL(DDP_ERR_ARG, "split: split_size %lld is invalid for dimension %d of size %lld "
             "(tensor %s; it must be >= 1, or 0 for an empty dimension)", (long long)split_size,
             d + 1, (long long)size, DDP_SHAPE(t));
  int64_t count = even_count(size, split_size);
  if (n_out) *n_out = (int)count;
  if (!outs) return DDP_OK;
  if (count > cap)
    DDP_FAIL(DDP_ERR_ARG, "split: %lld pieces do not fit an output array of %d", (long long)count,
             cap);
  return even_pieces(outs, t, d, count, split_size, "SplitBackward");
}

int ddp_split_with_sizes(ddp_tensor **outs, ddp_tensor *t, int n, const int64_t *sizes,
                         int dim) {
  int d;
  DDP_TRY(split_prepare(t, dim, "split", &d));
  if (n < 1 || !sizes || !outs) DDP_FAIL(DDP_ERR_ARG, "split: expected at least one size");
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0)
      DDP_FAIL(DDP_ERR_ARG, "split: size %lld (entry %d) is negative", (long long)sizes[i], i + 1);
    total += sizes[i];
  }
  if (total != t->shape[d])
    DDP_FAIL(DDP_ERR_ARG, "split: sizes %s sum to %lld but dimension %d of tensor %s has size "
             "%lld", ddp_shape_str(n <= DDP_MAX_DIMS ? n : DDP_MAX_DIMS, sizes), (long long)total,
             d + 1, DDP_SHAPE(t), (long long)t->shape[d]);
  return split_pieces(outs, t, d, n, sizes, "SplitWithSizesBackward");
}

int ddp_chunk(ddp_tensor **outs, int cap, int *n_out, ddp_tensor *t, int chunks, int dim) {
  int d;
  DDP_TRY(split_prepare(t, dim, "chunk", &d));
  if (chunks < 1)
    DDP_FAIL(DDP_ERR_ARG, "chunk: the number of chunks must be at least 1, got %d", chunks);
  int64_t size = t->shape[d], piece = (size + chunks - 1) / chunks;
  int64_t count = size == 0 ? chunks : even_count(size, piece);
  if (n_out) *n_out = (int)count;
  if (!outs) return DDP_OK;
  if (count > cap)
    DDP_FAIL(DDP_ERR_ARG, "chunk: %lld pieces do not fit an output array of %d", (long long)count,
             cap);
  return even_pieces(outs, t, d, count, piece, "ChunkBackward");
}

/* ---- index checks ------------------------------------------------------------------------ */

/* index must be a live i64 tensor. */
static int check_index_tensor(ddp_tensor *index, const char *op) {
  DDP_TRY(ddp_check_alive(index, op, "index"));
  if (index->dtype != DDP_I64)
    DDP_FAIL(DDP_ERR_ARG, "%s: index must be an i64 tensor, got %s (shape %s)", op,
             ddp_dtype_name(index->dtype), DDP_SHAPE(index));
  return DDP_OK;
}

/* Every value of the contiguous i64 `idx` (n values) in 0 .. size-1, or fail naming it. */
static int check_index_values(const int64_t *idx, int64_t n, int64_t size, int d,
                              const char *op) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= size)
      DDP_FAIL(DDP_ERR_ARG, "%s: index value %lld is out of bounds for dimension %d of size "
               "%lld (index values count from 0)", op, (long long)idx[i], d + 1, (long long)size);
  return DDP_OK;
}

/* check_index_values for the contiguous i64 tensor idx on any device: a device index is
 * copied to the host first (Note [shape devices]). */
static int check_index_tensor_values(const ddp_tensor *idx, int64_t size, int d, const char *op) {
  if (idx->device == DDP_DEVICE_CPU)
    return check_index_values((const int64_t *)ddp_data(idx), idx->numel, size, d, op);
  if (idx->numel == 0) return DDP_OK;
  int64_t *host = malloc(sizeof(int64_t) * (size_t)idx->numel);
  if (!host) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory copying the index to the host", op);
  int status = ddp_device_memcpy(host, DDP_DEVICE_CPU, ddp_data(idx), idx->device,
                                 sizeof(int64_t) * (size_t)idx->numel, op);
  if (!status) status = check_index_values(host, idx->numel, size, d, op);
  free(host);
  return status;
}

/* self and index (and src when given) on one device, or fail naming both. */
static int check_index_devices(const char *op, ddp_tensor *self, ddp_tensor *index,
                               ddp_tensor *src) {
  ddp_tensor *ts[3] = {self, index, src};
  static const char *const names[3] = {"self", "index", "src"};
  return ddp_check_same_device(op, 3, ts, names);
}

/* Product of shape[from .. to). */
static int64_t prod(const int64_t *shape, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= shape[i];
  return p;
}

/* ---- index_select ---------------------------------------------------------------------- */

/* index_select without checks or autograd: t (dims ndim, shape) -> out (contiguous). */
static int index_select_raw(ddp_tensor **out, ddp_tensor *t, int d, ddp_tensor *idx,
                            int out_ndim) {
  int64_t shape[DDP_MAX_DIMS];
  int nd = t->ndim > 0 ? t->ndim : 1;
  const int64_t *tshape = t->ndim > 0 ? t->shape : (const int64_t[]){1};
  memcpy(shape, tshape, sizeof(int64_t) * (size_t)nd);
  shape[d] = idx->numel;
  ddp_tensor *src;
  DDP_TRY(contiguous_nograd(&src, t));
  const ddp_kernels *k = ddp_kernels_for(t->device);
  int status = DDP_KERNEL_CHECK(k, index_select, "index_select");
  if (!status) status = ddp_tensor_empty(out, out_ndim, shape, t->dtype, t->device);
  if (!status) {
    k->index_select(ddp_data(*out), ddp_data(src), (const int64_t *)ddp_data(idx),
                    prod(tshape, 0, d), tshape[d], prod(tshape, d + 1, nd), idx->numel,
                    ddp_dtype_size(t->dtype));
    status = ddp_device_check(t->device, "index_select");
    if (status) {
      ddp_tensor_release(*out);
      *out = NULL;
    }
  }
  ddp_tensor_release(src);
  return status;
}

static int index_select_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *idx = ddp_node_saved(n, 0);
  if (!idx) return ddp_last_status();
  ddp_input_meta *m = &n->inputs[0];
  int d = (int)n->iattr[0], nd = m->ndim > 0 ? m->ndim : 1;
  const int64_t *shape = m->ndim > 0 ? m->shape : (const int64_t[]){1};
  ddp_tensor *z, *gc;
  const ddp_kernels *k = ddp_kernels_for(g->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, index_add, "index_select backward"));
  DDP_TRY(ddp_tensor_zeros(&z, m->ndim, m->shape, g->dtype, g->device));
  int status = contiguous_nograd(&gc, g);
  if (status) {
    ddp_tensor_release(z);
    return status;
  }
  k->index_add(ddp_data(z), ddp_data(gc), (const int64_t *)ddp_data(idx), prod(shape, 0, d),
               shape[d], prod(shape, d + 1, nd), idx->numel, g->dtype);
  ddp_tensor_release(gc);
  status = ddp_device_check(g->device, "index_select backward");
  if (status) {
    ddp_tensor_release(z);
    return status;
  }
  gi[0] = z;
  return DDP_OK;
}

int ddp_index_select(ddp_tensor **out, ddp_tensor *t, int dim, ddp_tensor *index) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "index_select", "self"));
  DDP_TRY(check_index_tensor(index, "index_select"));
  if (index->ndim > 1)
    DDP_FAIL(DDP_ERR_ARG, "index_select: index must be 0-d or 1-d, got shape %s",
             DDP_SHAPE(index));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, "index_select", &d));
  if (t->ndim == 0 && index->numel != 1)
    DDP_FAIL(DDP_ERR_ARG, "index_select: a 0-d tensor takes an index of 1 value, got shape %s",
             DDP_SHAPE(index));
  DDP_TRY(check_index_devices("index_select", t, index, NULL));
  ddp_tensor *idx;
  DDP_TRY(contiguous_nograd(&idx, index));
  int64_t size = t->ndim > 0 ? t->shape[d] : 1;
  int status = check_index_tensor_values(idx, size, d, "index_select");
  if (!status) status = index_select_raw(out, t, d, idx, t->ndim);
  if (!status && ddp_autograd_needed(1, &t)) {
    ddp_node *n = ddp_node_new("IndexSelectBackward", index_select_backward, 1, &t, 1);
    status = n ? ddp_node_save(n, 0, idx) : ddp_last_status();
    if (n) n->iattr[0] = d;
    if (status) {
      ddp_node_release(n);
      ddp_tensor_release(*out);
      *out = NULL;
    } else {
      ddp_autograd_set_output(*out, n);
    }
  }
  ddp_tensor_release(idx);
  return status;
}

/* ---- gather / scatter_add ---------------------------------------------------------------- */

/* Geometry of a gather/scatter: dims (>= 1; a 0-d tensor counts as (1)). */
typedef struct {
  int ndim;
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
} geom;

static geom geom_of(const ddp_tensor *t) {
  geom g = {.ndim = t->ndim > 0 ? t->ndim : 1, .shape = {1}, .strides = {1}};
  for (int i = 0; i < t->ndim; i++) g.shape[i] = t->shape[i], g.strides[i] = t->strides[i];
  return g;
}

/* index has t's dims and fits inside t except along d (and inside src everywhere when
 * src is given). */
static int check_scatter_shapes(const char *op, ddp_tensor *t, int d, ddp_tensor *index,
                                ddp_tensor *src) {
  int tn = t->ndim > 0 ? t->ndim : 1, in = index->ndim > 0 ? index->ndim : 1;
  if (tn != in)
    DDP_FAIL(DDP_ERR_ARG, "%s: index %s must have as many dimensions as self %s", op,
             DDP_SHAPE(index), DDP_SHAPE(t));
  geom gt = geom_of(t), gx = geom_of(index);
  for (int i = 0; i < tn; i++)
    if (i != d && gx.shape[i] > gt.shape[i])
      DDP_FAIL(DDP_ERR_ARG, "%s: index %s is larger than self %s in dimension %d", op,
               DDP_SHAPE(index), DDP_SHAPE(t), i + 1);
  if (!src) return DDP_OK;
  int sn = src->ndim > 0 ? src->ndim : 1;
  if (sn != in)
    DDP_FAIL(DDP_ERR_ARG, "%s: index %s must have as many dimensions as src %s", op,
             DDP_SHAPE(index), DDP_SHAPE(src));
  geom gs = geom_of(src);
  for (int i = 0; i < sn; i++)
    if (gx.shape[i] > gs.shape[i])
      DDP_FAIL(DDP_ERR_ARG, "%s: index %s is larger than src %s in dimension %d", op,
               DDP_SHAPE(index), DDP_SHAPE(src), i + 1);
  return DDP_OK;
}

/* dst[... index ...] += src over index's shape (dst and src any strides, all three on one
 * device), no value checks. */
static int scatter_add_raw(ddp_tensor *dst, int d, ddp_tensor *idx, ddp_tensor *src,
                           const char *op) {
  const ddp_kernels *k = ddp_kernels_for(dst->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, scatter_add, op));
  geom gd = geom_of(dst), gs = geom_of(src), gx = geom_of(idx);
  k->scatter_add(ddp_data(dst), gd.strides, ddp_data(src), gs.strides,
                 (const int64_t *)ddp_data(idx), gx.ndim, gx.shape, d, dst->dtype);
  return ddp_device_check(dst->device, op);
}

/* out = gather(t, d, idx) (idx contiguous, checked, on t's device), no autograd. */
static int gather_raw(ddp_tensor **out, ddp_tensor *t, int d, ddp_tensor *idx, const char *op) {
  const ddp_kernels *k = ddp_kernels_for(t->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, gather, op));
  DDP_TRY(ddp_tensor_empty(out, idx->ndim, idx->shape, t->dtype, t->device));
  geom gt = geom_of(t), go = geom_of(*out), gx = geom_of(idx);
  k->gather(ddp_data(*out), go.strides, ddp_data(t), gt.strides, (const int64_t *)ddp_data(idx),
            gx.ndim, gx.shape, d, ddp_dtype_size(t->dtype));
  int status = ddp_device_check(t->device, op);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

static int gather_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *idx = ddp_node_saved(n, 0);
  if (!idx) return ddp_last_status();
  ddp_tensor *z;
  DDP_TRY(ddp_tensor_zeros(&z, n->inputs[0].ndim, n->inputs[0].shape, g->dtype, g->device));
  int status = scatter_add_raw(z, (int)n->iattr[0], idx, g, "gather backward");
  if (status) {
    ddp_tensor_release(z);
    return status;
  }
  gi[0] = z;
  return DDP_OK;
}

/* Make idx a contiguous copy of index and check its values against t's dimension d. */
static int prepare_index(ddp_tensor **idx, ddp_tensor *t, int d, ddp_tensor *index,
                         const char *op) {
  DDP_TRY(contiguous_nograd(idx, index));
  int status = check_index_tensor_values(*idx, geom_of(t).shape[d], d, op);
  if (status) {
    ddp_tensor_release(*idx);
    *idx = NULL;
  }
  return status;
}

/* Record node `name` over inputs (n of them) saving idx with iattr[0] = d. */
static int record_indexed(ddp_tensor *out, const char *name, ddp_backward_fn bw, int n_inputs,
                          ddp_tensor *const *inputs, ddp_tensor *idx, int d) {
  ddp_node *n = ddp_node_new(name, bw, n_inputs, inputs, 1);
  if (!n) return ddp_last_status();
  n->iattr[0] = d;
  int status = ddp_node_save(n, 0, idx);
  if (status) {
    ddp_node_release(n);
    return status;
  }
  return ddp_autograd_rebase(out, n); /* in place: the old history is an input of n now */
}

int ddp_gather(ddp_tensor **out, ddp_tensor *t, int dim, ddp_tensor *index) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "gather", "self"));
  DDP_TRY(check_index_tensor(index, "gather"));
  int d;
  DDP_TRY(ddp_normalize_dim(dim, t->ndim, "gather", &d));
  DDP_TRY(check_scatter_shapes("gather", t, d, index, NULL));
  DDP_TRY(check_index_devices("gather", t, index, NULL));
  ddp_tensor *idx;
  DDP_TRY(prepare_index(&idx, t, d, index, "gather"));
  int status = gather_raw(out, t, d, idx, "gather");
  if (!status && ddp_autograd_needed(1, &t)) {
    status = record_indexed(*out, "GatherBackward", gather_backward, 1, &t, idx, d);
    if (status) {
      ddp_tensor_release(*out);
      *out = NULL;
    }
  }
  ddp_tensor_release(idx);
  return status;
}

/* d/dself = grad; d/dsrc = gather(grad) placed in zeros of src's shape where src is larger
 * than index. */
static int scatter_add_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *idx = ddp_node_saved(n, 0);
  if (!idx) return ddp_last_status();
  if (n->edges[0].fn || n->edges[0].leaf) {
    ddp_tensor_retain(g);
    gi[0] = g;
  }
  if (!n->edges[1].fn && !n->edges[1].leaf) return DDP_OK;
  int d = (int)n->iattr[0];
  ddp_tensor *gathered;
  DDP_TRY(gather_raw(&gathered, g, d, idx, "scatter_add backward"));
  ddp_input_meta *m = &n->inputs[1];
  if (same_shape(m->ndim, m->shape, gathered->ndim, gathered->shape)) {
    gi[1] = gathered;
    return DDP_OK;
  }
  ddp_tensor *z, *region;
  int status = ddp_tensor_zeros(&z, m->ndim, m->shape, g->dtype, g->device);
  if (!status) {
    status = ddp_tensor_view_raw(&region, z, idx->ndim, idx->shape, z->strides, 0);
    if (!status) {
      status = copy_nograd(region, gathered);
      ddp_tensor_release(region);
    }
    if (status) ddp_tensor_release(z);
    else gi[1] = z;
  }
  ddp_tensor_release(gathered);
  return status;
}

/* Checks of scatter_add and scatter_add_; the checked contiguous index in *idx. */
static int scatter_prepare(const char *op, ddp_tensor *self, int dim, ddp_tensor *index,
                           ddp_tensor *src, int *d, ddp_tensor **idx) {
  DDP_TRY(ddp_check_alive(self, op, "self"));
  DDP_TRY(check_index_tensor(index, op));
  DDP_TRY(ddp_check_alive(src, op, "src"));
  if (src->dtype != self->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: src dtype %s does not match self dtype %s", op,
             ddp_dtype_name(src->dtype), ddp_dtype_name(self->dtype));
  if (self->dtype == DDP_BOOL)
    DDP_FAIL(DDP_ERR_ARG, "%s: bool tensors are not supported", op);
  DDP_TRY(ddp_normalize_dim(dim, self->ndim, op, d));
  DDP_TRY(check_scatter_shapes(op, self, *d, index, src));
  DDP_TRY(check_index_devices(op, self, index, src));
  return prepare_index(idx, self, *d, index, op);
}

int ddp_scatter_add(ddp_tensor **out, ddp_tensor *self, int dim, ddp_tensor *index,
                    ddp_tensor *src) {
  *out = NULL;
  int d;
  ddp_tensor *idx;
  DDP_TRY(scatter_prepare("scatter_add", self, dim, index, src, &d, &idx));
  int prev = ddp_set_grad_enabled(0);
  int status = ddp_clone(out, self);
  ddp_set_grad_enabled(prev);
  if (!status) status = scatter_add_raw(*out, d, idx, src, "scatter_add");
  if (!status) {
    (*out)->storage->version = 0;
    ddp_tensor *inputs[2] = {self, src};
    if (ddp_autograd_needed(2, inputs))
      status = record_indexed(*out, "ScatterAddBackward", scatter_add_backward, 2, inputs, idx, d);
    if (status) {
      ddp_tensor_release(*out);
      *out = NULL;
    }
  }
  ddp_tensor_release(idx);
  return status;
}

int ddp_scatter_add_(ddp_tensor *self, int dim, ddp_tensor *index, ddp_tensor *src) {
  int d;
  ddp_tensor *idx;
  DDP_TRY(ddp_check_alive(self, "scatter_add_", "self"));
  ddp_tensor *inputs[2] = {self, src};
  int record = ddp_autograd_needed(2, inputs);
  DDP_TRY(ddp_autograd_check_inplace(self, "scatter_add_"));
  for (int i = 0; i < self->ndim; i++)
    if (self->strides[i] == 0 && self->shape[i] > 1)
      DDP_FAIL(DDP_ERR_ARG, "scatter_add_: self %s has overlapping elements (stride 0 in "
               "dimension %d, e.g. from expand): clone it first", DDP_SHAPE(self), i + 1);
  DDP_TRY(scatter_prepare("scatter_add_", self, dim, index, src, &d, &idx));
  int status = scatter_add_raw(self, d, idx, src, "scatter_add_");
  ddp_tensor_bump_version(self);
  if (!status && record)
    status = record_indexed(self, "ScatterAddBackward", scatter_add_backward, 2, inputs, idx, d);
  ddp_tensor_release(idx);
  return status;
}

/* ---- cat / stack ------------------------------------------------------------------------- */

/* PyTorch's legacy rule: a 1-d empty tensor joins any cat (it is skipped). */
static int cat_skipped(const ddp_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

/* Check the list, find the result dtype, the reference tensor and the result shape. */
static int cat_check(ddp_tensor **tensors, int n, int dim, const char *op, int *d, int *dtype,
                     int64_t *shape, int *ndim) {
  if (n < 1 || !tensors) DDP_FAIL(DDP_ERR_ARG, "%s: expected a non-empty list of tensors", op);
  char arg[32];
  int ref = -1;
  for (int i = 0; i < n; i++) {
    snprintf(arg, sizeof arg, "tensors[%d]", i + 1);
    DDP_TRY(ddp_check_alive(tensors[i], op, arg));
    if (ref < 0 && !cat_skipped(tensors[i])) ref = i;
    if (tensors[i]->device != tensors[0]->device)
      DDP_FAIL(DDP_ERR_ARG, "%s: expected all tensors on the same device, but tensors[1] is on "
               "%s and %s is on %s", op, ddp_device_str(tensors[0]->device), arg,
               ddp_device_str(tensors[i]->device));
  }
  if (ref < 0) ref = 0;
  const ddp_tensor *r = tensors[ref];
  if (r->ndim == 0) DDP_FAIL(DDP_ERR_ARG, "%s: zero-dimensional tensor (at position %d) cannot "
                             "be concatenated", op, ref + 1);
  DDP_TRY(ddp_normalize_dim(dim, r->ndim, op, d));
  *dtype = r->dtype;
  *ndim = r->ndim;
  memcpy(shape, r->shape, sizeof(int64_t) * (size_t)r->ndim);
  shape[*d] = 0;
  for (int i = 0; i < n; i++) {
    const ddp_tensor *t = tensors[i];
    *dtype = ddp_promote_types(*dtype, t->dtype);
    if (cat_skipped(t) && i != ref) continue;
    int ok = t->ndim == r->ndim;
    for (int k = 0; ok && k < r->ndim; k++) ok = k == *d || t->shape[k] == r->shape[k];
    if (!ok)
      DDP_FAIL(DDP_ERR_ARG, "%s: tensor %d has shape %s but tensor %d has shape %s: sizes must "
               "match except in dimension %d", op, i + 1, DDP_SHAPE(t), ref + 1, DDP_SHAPE(r),
               *d + 1);
    shape[*d] += t->shape[*d];
  }
  return DDP_OK;
}

/* out (contiguous, shape with d) <- the inputs one after the other along d, no autograd. */
static int cat_fill(ddp_tensor *out, ddp_tensor *const *tensors, int n, int d) {
  size_t es = ddp_dtype_size(out->dtype);
  int64_t outer = prod(out->shape, 0, d), inner = prod(out->shape, d + 1, out->ndim);
  int64_t at = 0; /* position along d */
  for (int i = 0; i < n; i++) {
    ddp_tensor *t = tensors[i];
    if (cat_skipped(t) && out->ndim != 1) continue;
    int64_t len = t->shape[d];
    if (len > 0 && t->numel > 0) {
      const ddp_kernels *k = ddp_kernels_for(out->device);
      if (t->dtype == out->dtype && ddp_tensor_is_contiguous(t) && k && k->copy_rows) {
        k->copy_rows(ddp_data(out), ddp_data(t), outer, out->shape[d] * inner * (int64_t)es,
                     at * inner * (int64_t)es, len * inner * (int64_t)es);
        DDP_TRY(ddp_device_check(out->device, "cat"));
      } else { /* a strided copy_ (devices without copy_rows go here too) */
        int64_t shape[DDP_MAX_DIMS];
        memcpy(shape, out->shape, sizeof shape);
        shape[d] = len;
        ddp_tensor *region;
        DDP_TRY(ddp_tensor_view_raw(&region, out, out->ndim, shape, out->strides,
                                    at * out->strides[d]));
        int status = copy_nograd(region, t);
        ddp_tensor_release(region);
        DDP_TRY(status);
      }
    }
    at += len;
  }
  out->storage->version = 0;
  return DDP_OK;
}

static int cat_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int d = (int)n->iattr[0];
  int64_t at = 0;
  for (int i = 0; i < n->n_inputs; i++) {
    ddp_input_meta *m = &n->inputs[i];
    if (m->ndim != g->ndim) { /* a skipped (0) tensor: a zero gradient of its size, as PyTorch */
      if (n->edges[i].fn || n->edges[i].leaf)
        DDP_TRY(ddp_tensor_zeros(&gi[i], m->ndim, m->shape, m->dtype, g->device));
      continue;
    }
    int64_t len = m->shape[d];
    if (n->edges[i].fn || n->edges[i].leaf) DDP_TRY(ddp_narrow(&gi[i], g, d, at, len));
    at += len;
  }
  return DDP_OK;
}

int ddp_cat(ddp_tensor **out, ddp_tensor **tensors, int n, int dim) {
  *out = NULL;
  int d, dtype, ndim;
  int64_t shape[DDP_MAX_DIMS];
  DDP_TRY(cat_check(tensors, n, dim, "cat", &d, &dtype, shape, &ndim));
  DDP_TRY(ddp_tensor_empty(out, ndim, shape, dtype, tensors[0]->device));
  int status = cat_fill(*out, tensors, n, d);
  if (!status && ddp_autograd_needed(n, tensors)) {
    ddp_node *node = ddp_node_new("CatBackward", cat_backward, n, tensors, 0);
    if (node) {
      node->iattr[0] = d;
      ddp_autograd_set_output(*out, node);
    } else {
      status = ddp_last_status();
    }
  }
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

static int stack_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  for (int i = 0; i < n->n_inputs; i++)
    if (n->edges[i].fn || n->edges[i].leaf) DDP_TRY(ddp_select(&gi[i], g, (int)n->iattr[0], i));
  return DDP_OK;
}

int ddp_stack(ddp_tensor **out, ddp_tensor **tensors, int n, int dim) {
  *out = NULL;
  if (n < 1 || !tensors) DDP_FAIL(DDP_ERR_ARG, "stack: expected a non-empty list of tensors");
  char arg[32];
  for (int i = 0; i < n; i++) {
    snprintf(arg, sizeof arg, "tensors[%d]", i + 1);
    DDP_TRY(ddp_check_alive(tensors[i], "stack", arg));
    if (!same_shape(tensors[i]->ndim, tensors[i]->shape, tensors[0]->ndim, tensors[0]->shape))
      DDP_FAIL(DDP_ERR_ARG, "stack: tensor %d has shape %s but tensor 1 has shape %s: stack "
               "needs tensors of one shape", i + 1, DDP_SHAPE(tensors[i]), DDP_SHAPE(tensors[0]));
  }
  if (tensors[0]->ndim >= DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "stack: tensors %s already have the most dimensions (%d)",
             DDP_SHAPE(tensors[0]), DDP_MAX_DIMS);
  int d;
  DDP_TRY(ddp_normalize_dim(dim, tensors[0]->ndim + 1, "stack", &d));
  /* cat of the inputs unsqueezed at d (raw views, no graph) */
  ddp_tensor *local[16];
  ddp_tensor **views = n <= 16 ? local : calloc((size_t)n, sizeof *views);
  if (!views) DDP_FAIL(DDP_ERR_MEMORY, "stack: out of memory");
  int made = 0, status = DDP_OK;
  int prev = ddp_set_grad_enabled(0);
  for (; made < n && !status; made++) status = ddp_unsqueeze(&views[made], tensors[made], d);
  if (status) made--;
  ddp_set_grad_enabled(prev);
  if (!status) {
    int cd, dtype, ndim;
    int64_t shape[DDP_MAX_DIMS];
    status = cat_check(views, n, d, "stack", &cd, &dtype, shape, &ndim);
    if (!status) status = ddp_tensor_empty(out, ndim, shape, dtype, tensors[0]->device);
    if (!status) status = cat_fill(*out, views, n, d);
  }
  for (int i = 0; i < made; i++) ddp_tensor_release(views[i]);
  if (views != local) free(views);
  if (!status && ddp_autograd_needed(n, tensors)) {
    ddp_node *node = ddp_node_new("StackBackward", stack_backward, n, tensors, 0);
    if (node) {
      node->iattr[0] = d;
      ddp_autograd_set_output(*out, node);
    } else {
      status = ddp_last_status();
    }
  }
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}
