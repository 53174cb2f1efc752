/* runtime/backend/cpu/shape.c: CPU kernels of the shape and indexing ops: row copies for
 * cat and index_select (memcpy of contiguous runs), index_add, gather and scatter_add. */
#include "backend/cpu/shape.h"

enum { SHAPE_GRAIN = 1 << 15 }; /* elements per thread chunk for copies */

/* Rows per parallel chunk so that a chunk moves about SHAPE_GRAIN elements. */
static int64_t row_grain(int64_t row_elems) {
  int64_t g = SHAPE_GRAIN / (row_elems > 0 ? row_elems : 1);
  return g > 0 ? g : 1;
}

/* ---- cat rows ------------------------------------------------------------------------ */

typedef struct {
  char *dst;
  const char *src;
  int64_t dst_row, dst_col, src_row;
} copy_rows_ctx;

static void copy_rows_range(void *vctx, int64_t begin, int64_t end) {
  const copy_rows_ctx *c = vctx;
  for (int64_t o = begin; o < end; o++)
    memcpy(c->dst + o * c->dst_row + c->dst_col, c->src + o * c->src_row, (size_t)c->src_row);
}

void ddp_cpu_copy_rows(char *dst, const char *src, int64_t outer, int64_t dst_row,
                       int64_t dst_col, int64_t src_row) {
  if (outer == 0 || src_row == 0) return;
  copy_rows_ctx c = {dst, src, dst_row, dst_col, src_row};
  /* grain in rows: about SHAPE_GRAIN * 4 bytes per chunk */
  int64_t grain = (int64_t)SHAPE_GRAIN * 4 / src_row;
  ddp_parallel_for(outer, grain > 0 ? grain : 1, copy_rows_range, &c);
}

/* ---- index_select / index_add -------------------------------------------------------- */

typedef struct {
  char *out;
  const char *in;
  const int64_t *index;
  int64_t size, n_index;
  size_t row_bytes;
} index_select_ctx;

/* rows r = o * n_index + k of the output */
static void index_select_range(void *vctx, int64_t begin, int64_t end) {
  const index_select_ctx *c = vctx;
  for (int64_t r = begin; r < end; r++) {
    int64_t o = r / c->n_index, k = r % c->n_index;
    memcpy(c->out + (size_t)r * c->row_bytes,
           c->in + (size_t)(o * c->size + c->index[k]) * c->row_bytes, c->row_bytes);
  }
}

void ddp_cpu_index_select(char *out, const char *in, const int64_t *index, int64_t outer,
                          int64_t size, int64_t inner, int64_t n_index, size_t esize) {
  if (outer == 0 || n_index == 0 || inner == 0) return;
  index_select_ctx c = {out, in, index, size, n_index, (size_t)inner * esize};
  ddp_parallel_for(outer * n_index, row_grain(inner), index_select_range, &c);
}

/* dst[0 .. n) += src[0 .. n) for one dtype. */
static void add_run(char *dst, const char *src, int64_t n, int dtype) {
  switch (dtype) {
  case DDP_F32: {
    float *restrict d = (float *)dst;
    const float *restrict s = (const float *)src;
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
    return;
  }
  case DDP_F64: {
    double *restrict d = (double *)dst;
    const double *restrict s = (const double *)src;
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
    return;
  }
  case DDP_I64: {
    int64_t *restrict d = (int64_t *)dst;
    const int64_t *restrict s = (const int64_t *)src;
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
    return;
  }
  default: {
    size_t es = ddp_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++)
      ddp_store_f64(dst + i * es, dtype, ddp_load_f64(dst + i * es, dtype) + ddp_load_f64(src + i * es, dtype));
  }
  }
}

void ddp_cpu_index_add(char *dst, const char *src, const int64_t *index, int64_t outer,
                       int64_t size, int64_t inner, int64_t n_index, int dtype) {
  size_t row = (size_t)inner * ddp_dtype_size(dtype);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < n_index; k++)
      add_run(dst + (size_t)(o * size + index[k]) * row, src + (size_t)(o * n_index + k) * row,
              inner, dtype);
}

/* ---- gather / scatter_add ------------------------------------------------------------ */

/* Walk the rows (all dimensions but the last) of the index shape. For each row, base
 * offsets (elements) of the indexed operand A (dimension `dim` left out) and the plain
 * operand B, then the inner loop over the last dimension. */
typedef struct {
  int ndim, dim;
  const int64_t *shape;
  char *a; /* indexed operand: gather's input, scatter's self */
  const int64_t *a_strides;
  char *b; /* plain operand: gather's output, scatter's src */
  const int64_t *b_strides;
  const int64_t *index;
  size_t esize;
  int dtype;
} walk_ctx;

/* Base element offsets of row r in A (without dim) and B. */
static void row_bases(const walk_ctx *c, int64_t r, int64_t *a_base, int64_t *b_base) {
  int64_t a = 0, b = 0;
  for (int d = c->ndim - 2; d >= 0; d--) {
    int64_t i = r % c->shape[d];
    r /= c->shape[d];
    if (d != c->dim) a += i * c->a_strides[d];
    b += i * c->b_strides[d];
  }
  *a_base = a;
  *b_base = b;
}

#define GATHER_ROW(T)                                                                       \
  for (int64_t k = 0; k < n; k++)                                                           \
    ((T *)c->b)[bb + k * bs] = ((const T *)c->a)[ab + (last_is_dim ? 0 : k * as) + idx[k] * ds];

static void gather_range(void *vctx, int64_t begin, int64_t end) {
  const walk_ctx *c = vctx;
  int last = c->ndim - 1, last_is_dim = last == c->dim;
  int64_t n = c->shape[last];
  int64_t as = c->a_strides[last], bs = c->b_strides[last], ds = c->a_strides[c->dim];
  for (int64_t r = begin; r < end; r++) {
    int64_t ab, bb;
    row_bases(c, r, &ab, &bb);
    const int64_t *idx = c->index + r * n;
    switch (c->esize) {
    case 8: GATHER_ROW(uint64_t) break;
    case 4: GATHER_ROW(uint32_t) break;
    case 2: GATHER_ROW(uint16_t) break;
    default: GATHER_ROW(uint8_t) break;
    }
  }
}

void ddp_cpu_gather(char *out, const int64_t *out_strides, const char *in,
                    const int64_t *in_strides, const int64_t *index, int ndim,
                    const int64_t *shape, int dim, size_t esize) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel == 0) return;
  walk_ctx c = {ndim, dim, shape, (char *)in, in_strides, out, out_strides, index, esize, 0};
  int64_t n = shape[ndim - 1];
  ddp_parallel_for(numel / n, row_grain(n), gather_range, &c);
}

#define SCATTER_ROW(T)                                                                      \
  for (int64_t k = 0; k < n; k++)                                                           \
    ((T *)c->a)[ab + (last_is_dim ? 0 : k * as) + idx[k] * ds] += ((const T *)c->b)[bb + k * bs];

void ddp_cpu_scatter_add(char *self, const int64_t *self_strides, const char *src,
                         const int64_t *src_strides, const int64_t *index, int ndim,
                         const int64_t *shape, int dim, int dtype) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel == 0) return;
  walk_ctx wc = {ndim, dim, shape, self, self_strides, (char *)src, src_strides, index,
                 ddp_dtype_size(dtype), dtype};
  const walk_ctx *c = &wc;
  int last = ndim - 1, last_is_dim = last == dim;
  int64_t n = shape[last], rows = numel / n;
  int64_t as = self_strides[last], bs = src_strides[last], ds = self_strides[dim];
  size_t es = wc.esize;
  for (int64_t r = 0; r < rows; r++) {
    int64_t ab, bb;
    row_bases(c, r, &ab, &bb);
    const int64_t *idx = index + r * n;
    switch (dtype) {
    case DDP_F32: SCATTER_ROW(float) break;
    case DDP_F64: SCATTER_ROW(double) break;
    case DDP_I64: SCATTER_ROW(int64_t) break;
    case DDP_I32: SCATTER_ROW(int32_t) break;
    default:
      for (int64_t k = 0; k < n; k++) {
        char *d = self + (ab + (last_is_dim ? 0 : k * as) + idx[k] * ds) * (int64_t)es;
        const char *s = src + (bb + k * bs) * (int64_t)es;
        ddp_store_f64(d, dtype, ddp_load_f64(d, dtype) + ddp_load_f64(s, dtype));
      }
    }
  }
}
