/* runtime/core/iter.c: broadcasting and the strided element iterator behind the element-wise
 * kernels, copies and conversions. */
#include "core/core.h"

int ddp_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t da = i < n - na ? 1 : a[i - (n - na)];
    int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
    if (da != db && da != 1 && db != 1) return -1;
    out[i] = da == 1 ? db : da;
  }
  return n;
}

int ddp_broadcast_view(ddp_tensor **out, const ddp_tensor *t, int ndim, const int64_t *shape,
                       const char *op) {
  int64_t strides[DDP_MAX_DIMS];
  if (t->ndim > ndim) goto bad;
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - t->ndim);
    if (j < 0) {
      strides[i] = 0;
    } else if (t->shape[j] == shape[i]) {
      strides[i] = shape[i] == 1 ? 0 : t->strides[j];
    } else if (t->shape[j] == 1) {
      strides[i] = 0;
    } else {
      goto bad;
    }
  }
  return ddp_tensor_view_raw(out, t, ndim, shape, strides, t->offset);
bad:
  DDP_FAIL(DDP_ERR_ARG, "%s: tensor of shape %s cannot be broadcast to shape %s", op,
           DDP_SHAPE(t), ddp_shape_str(ndim, shape));
}

/* The iteration plan: coalesced dims (outermost first) with byte strides per operand. */
typedef struct {
  int nops, ndim;
  int64_t shape[DDP_MAX_DIMS];
  int64_t strides[DDP_MAX_DIMS][DDP_ITER_MAX_OPERANDS]; /* bytes */
  char *base[DDP_ITER_MAX_OPERANDS];
  ddp_loop_fn fn;
  void *ctx;
} iter_plan;

/* Run the inner dimension for outer rows [begin, end) (rows in row-major order over all but
 * the last dimension). */
static void run_rows(iter_plan *p, int64_t begin, int64_t end) {
  int nd = p->ndim, k = p->nops;
  int64_t inner = p->shape[nd - 1];
  int64_t inner_strides[DDP_ITER_MAX_OPERANDS];
  for (int o = 0; o < k; o++) inner_strides[o] = p->strides[nd - 1][o];
  int64_t idx[DDP_MAX_DIMS];
  int64_t rem = begin;
  for (int d = nd - 2; d >= 0; d--) {
    idx[d] = rem % p->shape[d];
    rem /= p->shape[d];
  }
  for (int64_t row = begin; row < end; row++) {
    char *ptrs[DDP_ITER_MAX_OPERANDS];
    for (int o = 0; o < k; o++) {
      char *q = p->base[o];
      for (int d = 0; d < nd - 1; d++) q += idx[d] * p->strides[d][o];
      ptrs[o] = q;
    }
    p->fn(p->ctx, ptrs, inner_strides, inner);
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < p->shape[d]) break;
      idx[d] = 0;
    }
  }
}

/* Threaded form: split rows; or, when there is one row, split the inner run itself. */
static void run_range(void *vp, int64_t begin, int64_t end) {
  iter_plan *p = vp;
  if (p->ndim == 1) { /* one long run: offset the pointers */
    char *ptrs[DDP_ITER_MAX_OPERANDS];
    int64_t strides[DDP_ITER_MAX_OPERANDS];
    for (int o = 0; o < p->nops; o++) {
      strides[o] = p->strides[0][o];
      ptrs[o] = p->base[o] + begin * strides[o];
    }
    p->fn(p->ctx, ptrs, strides, end - begin);
  } else {
    run_rows(p, begin, end);
  }
}

void ddp_foreach(int nops, ddp_tensor *const *ops, int ndim, const int64_t *shape, ddp_loop_fn fn,
                 void *ctx, int64_t grain) {
  iter_plan p;
  p.nops = nops;
  p.fn = fn;
  p.ctx = ctx;
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel == 0) return;
  int64_t es[DDP_ITER_MAX_OPERANDS]; /* element sizes, bytes */
  for (int o = 0; o < nops; o++) {
    p.base[o] = ddp_data(ops[o]);
    es[o] = (int64_t)ddp_dtype_size(ops[o]->dtype);
  }
  /* drop size-1 dims, then merge neighbours whose strides chain for every operand */
  int nd = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    if (nd > 0) {
      int mergeable = 1;
      for (int o = 0; o < nops; o++)
        if (p.strides[nd - 1][o] != shape[d] * ops[o]->strides[d] * es[o]) mergeable = 0;
      if (mergeable) {
        p.shape[nd - 1] *= shape[d];
        for (int o = 0; o < nops; o++) p.strides[nd - 1][o] = ops[o]->strides[d] * es[o];
        continue;
      }
    }
    p.shape[nd] = shape[d];
    for (int o = 0; o < nops; o++) p.strides[nd][o] = ops[o]->strides[d] * es[o];
    nd++;
  }
  if (nd == 0) { /* a single element */
    p.shape[0] = 1;
    for (int o = 0; o < nops; o++) p.strides[0][o] = 0;
    nd = 1;
  }
  p.ndim = nd;
  int64_t rows = numel / p.shape[nd - 1];
  if (grain > 0 && numel >= 2 * grain && ddp_get_num_threads() > 1) {
    if (nd == 1) {
      ddp_parallel_for(numel, grain, run_range, &p);
    } else {
      int64_t row_grain = grain / p.shape[nd - 1];
      ddp_parallel_for(rows, row_grain < 1 ? 1 : row_grain, run_range, &p);
    }
  } else {
    run_rows(&p, 0, rows);
  }
}

int ddp_normalize_dim(int dim, int ndim, const char *op, int *out) {
  int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    DDP_FAIL(DDP_ERR_ARG, "%s: dimension %lld is out of range for a tensor with %d dimension%s "
             "(Lua counts dimensions from 1; -1 is the last)", op,
             dim >= 0 ? (long long)dim + 1 : (long long)dim, ndim, ndim == 1 ? "" : "s");
  *out = dim < 0 ? dim + n : dim;
  return DDP_OK;
}
