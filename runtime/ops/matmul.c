/* runtime/ops/matmul.c: front doors of matmul, bmm and linear, and their backward.
 *
 * Every product reduces to mm_batched: a (..., N, K) · b (..., K, M) with broadcast batch
 * dimensions, on detached operands. Each operand's 2-d slices go to cblas as stored when
 * their strides allow it (row-major, or a transposed row-major view passed as CblasTrans);
 * only other layouts are copied.
 *
 * Devices: the products go through the kernel table of the operands' device (gemm,
 * matmul_int); on a CUDA device f16 and bf16 operands go to gemm as they are (cuBLAS
 * multiplies them with f32 sums) where the CPU converts them to f32 first to use OpenBLAS.
 * Batch entries are multiplied one after another on the calling thread there (each GEMM
 * is queued on the current stream); the CPU spreads small ones over the thread pool. */
#include <limits.h>
#include <stdlib.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/autocast.h"
#include "ops/copy.h"

/* ---- layout of one operand ------------------------------------------------------------ */

/* How 2-d slices of `rows` x `cols` with element strides (sr, sc) reach cblas. */
typedef struct {
  int trans;  /* stored as (cols, rows) row-major: CblasTrans */
  int64_t ld; /* leading dimension of the stored matrix */
} gemm_layout;

/* Fill *lay and return 1 when the slices can be passed to cblas as they are; 0 when they
 * need a contiguous copy. Sizes of 1 make the matching stride irrelevant. */
static int gemm_layout_of(int64_t rows, int64_t cols, int64_t sr, int64_t sc, gemm_layout *lay) {
  int64_t cmin = cols > 1 ? cols : 1, rmin = rows > 1 ? rows : 1;
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= cmin)) {
    lay->trans = 0;
    lay->ld = rows == 1 ? cmin : sr;
    return lay->ld <= INT_MAX;
  }
  if ((rows == 1 || sr == 1) && (cols == 1 || sc >= rmin)) {
    lay->trans = 1;
    lay->ld = cols == 1 ? rmin : sc;
    return lay->ld <= INT_MAX;
  }
  return 0;
}

/* A detached view of t with the last two dimensions swapped (t has ndim >= 2). */
static int transpose_last2(ddp_tensor **out, const ddp_tensor *t) {
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int nd = t->ndim;
  memcpy(shape, t->shape, sizeof(int64_t) * nd);
  memcpy(strides, t->strides, sizeof(int64_t) * nd);
  shape[nd - 2] = t->shape[nd - 1], shape[nd - 1] = t->shape[nd - 2];
  strides[nd - 2] = t->strides[nd - 1], strides[nd - 1] = t->strides[nd - 2];
  return ddp_tensor_view_raw(out, t, nd, shape, strides, t->offset);
}

/* A detached view of t with shape (ndim, shape); t must be contiguous with that numel. */
static int reshape_contiguous(ddp_tensor **out, const ddp_tensor *t, int ndim, const int64_t *shape) {
  int64_t strides[DDP_MAX_DIMS];
  ddp_contiguous_strides(ndim, shape, strides);
  return ddp_tensor_view_raw(out, t, ndim, shape, strides, t->offset);
}

/* A contiguous detached tensor with t's values (t itself, retained, when contiguous). */
static int contiguous_detached(ddp_tensor **out, ddp_tensor *t) {
  ddp_tensor *alias = ddp_tensor_alias(t);
  if (!alias) return ddp_last_status();
  int status = ddp_contiguous(out, alias); /* the alias needs no grad: nothing recorded */
  ddp_tensor_release(alias);
  return status;
}

/* ---- the batched product ---------------------------------------------------------------- */

typedef struct {
  int dtype;
  int nbd;                          /* batch dimensions of the output */
  int64_t bshape[DDP_MAX_DIMS];     /* batch shape */
  int64_t astr[DDP_MAX_DIMS], bstr[DDP_MAX_DIMS]; /* batch strides, 0 where broadcast */
  const char *a, *b;                /* element (0, ..., 0) */
  char *c;
  int64_t n, m, k, esize;
  int64_t sa0, sa1, sb0, sb1;       /* element strides of the 2-d slices */
  double beta;                      /* 0, or 1 when c holds the bias rows (Note [bias in C]) */
  gemm_layout la, lb;
  const ddp_kernels *kern;          /* the operands' device's kernels */
} mm_job;

/* Products of batch entries [begin, end). */
static void mm_range(void *vctx, int64_t begin, int64_t end) {
  const mm_job *j = vctx;
  for (int64_t bi = begin; bi < end; bi++) {
    int64_t rest = bi, aoff = 0, boff = 0;
    for (int d = j->nbd - 1; d >= 0; d--) {
      int64_t idx = rest % j->bshape[d];
      rest /= j->bshape[d];
      aoff += idx * j->astr[d];
      boff += idx * j->bstr[d];
    }
    const char *pa = j->a + aoff * j->esize, *pb = j->b + boff * j->esize;
    char *pc = j->c + bi * j->n * j->m * j->esize;
    if (ddp_dtype_is_floating(j->dtype))
      j->kern->gemm(j->dtype, j->la.trans, j->lb.trans, j->n, j->m, j->k, 1.0, pa, j->la.ld, pb,
                    j->lb.ld, j->beta, pc, j->m);
    else
      j->kern->matmul_int(j->dtype, pc, pa, j->sa0, j->sa1, pb, j->sb0, j->sb1, j->n, j->m, j->k);
  }
}

/* Note [small GEMM split]: one product of a training step at batch 64 is small (the MLP's
 * 64x784 · 784x256 is 13 M multiply-adds, ~0.1 ms): OpenBLAS splits it over its own
 * threads, which then spin in sched_yield between products (~10% of a 2-thread MLP profile),
 * and its partition of such sizes kept the second core busy less than half the time (an
 * MLP step with 2 threads ran 11% faster than with 1). With more than one thread, a single
 * product of SPLIT_MIN_MNK to SPLIT_MAX_MNK multiply-adds is therefore cut in two by us: the
 * columns or the rows of the result (split_by_cols below), the first part a multiple
 * of SPLIT_ALIGN, each part one single-threaded GEMM, the two on the thread pool. The parts
 * do not depend on the number of threads (2 or more), so the result is bitwise the same
 * for any count above one, and it is the two half products as one thread computes them. One
 * thread keeps the whole product in one GEMM: cut in two there it re-packs an operand and
 * ran ~5% slower; its bits may differ from the split's by rounding (as OpenBLAS's threading
 * made them differ before: its small-size kernels' sums depend on a column's place in the
 * block), each element within k * 2^-24 of exact relative to the size of its terms. Two
 * parts only: beyond 16 M multiply-adds the backend's gemm splits the product over the pool
 * itself (ddp_cpu_gemm_parallel, runtime/backend/cpu/gemm_parallel.h); inside this split
 * each part runs whole on its thread (a nested parallel call runs inline). */
enum { SPLIT_ALIGN = 32 };
#define SPLIT_MIN_MNK (256.0 * 1024)       /* below: one GEMM (a fork-join would dominate) */
#define SPLIT_MAX_MNK (16.0 * 1024 * 1024) /* above: OpenBLAS's own threading */

/* Where part 1 of a dimension of `size` starts: half of it, rounded up to SPLIT_ALIGN. */
static int64_t split_at(int64_t size) {
  int64_t half = (size + 1) / 2;
  return (half + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
}

/* Note [small GEMM split] continued: which dimension of the (rows, cols) result is cut. The
 * one whose two parts are closer to equal (|part 0 - part 1| relative to the dimension),
 * so neither thread waits long for the other: the MLP's weight gradient (256, 784) cut by
 * columns gave parts of 416 and 368 (the second thread idle 12% of it); by rows, 128 and
 * 128. On a tie the larger dimension (the smaller operand is the one packed twice). A
 * dimension of SPLIT_ALIGN or less cannot be cut. */
static int split_by_cols(int64_t rows, int64_t cols) {
  if (cols <= SPLIT_ALIGN) return 0;
  if (rows <= SPLIT_ALIGN) return 1;
  double imb_c = (double)llabs(2 * split_at(cols) - cols) / (double)cols;
  double imb_r = (double)llabs(2 * split_at(rows) - rows) / (double)rows;
  if (imb_c != imb_r) return imb_c < imb_r;
  return cols >= rows;
}

/* Parts [begin, end) (of 0, 1) of the single product j, cut by columns (Note [small GEMM
 * split]). */
static void mm_cols(void *vctx, int64_t begin, int64_t end) {
  const mm_job *j = vctx;
  for (int64_t part = begin; part < end; part++) {
    int64_t c0 = part ? split_at(j->m) : 0, c1 = part ? j->m : split_at(j->m);
    /* column c0 of b: (k, m) row-major starts at c0; stored transposed (m, k) at row c0 */
    const char *pb = j->b + (j->lb.trans ? c0 * j->lb.ld : c0) * j->esize;
    j->kern->gemm(j->dtype, j->la.trans, j->lb.trans, j->n, c1 - c0, j->k, 1.0, j->a, j->la.ld,
                  pb, j->lb.ld, j->beta, j->c + c0 * j->esize, j->m);
  }
}

/* Parts [begin, end) (of 0, 1) of the single product j, cut by rows (Note [small GEMM
 * split]). */
static void mm_rows(void *vctx, int64_t begin, int64_t end) {
  const mm_job *j = vctx;
  for (int64_t part = begin; part < end; part++) {
    int64_t r0 = part ? split_at(j->n) : 0, r1 = part ? j->n : split_at(j->n);
    /* row r0 of a: (n, k) row-major at row r0; stored transposed (k, n) at column r0 */
    const char *pa = j->a + (j->la.trans ? r0 : r0 * j->la.ld) * j->esize;
    j->kern->gemm(j->dtype, j->la.trans, j->lb.trans, r1 - r0, j->m, j->k, 1.0, pa, j->la.ld,
                  j->b, j->lb.ld, j->beta, j->c + r0 * j->m * j->esize, j->m);
  }
}

/* Note [bias in C]: a GEMM computes C = alpha A B + beta C. With beta = 0 OpenBLAS first
 * runs a separate pass zeroing C (memset, or its beta kernel for a strided C), then its
 * micro-kernels add their sums into C; the linear layer then made a third pass adding the
 * bias. Filling C with the bias rows first and running the GEMM with beta = 1 does the same
 * in one pass before the kernel, as PyTorch's addmm (linear's bias path) does. The sums
 * land on the bias instead of on zero: when OpenBLAS splits K into blocks (K above its
 * GEMM_Q, a few hundred) each block's partial sum is added into C in turn, so the bias is
 * added first rather than last, a change of summation order within rounding (each element
 * within (K + 1) * 2^-24 of exact relative to the sum of the magnitudes of its terms, as
 * before); for a single K block the result is bit for bit the old one (acc + bias rounded
 * once either way). cuBLAS reads C for beta = 1 just the same (one launch less than the
 * separate bias add). */

/* out (batch..., N, M), new and contiguous = a (..., N, K) · b (..., K, M), the batch
 * dimensions broadcast, plus init (M) on every row when init is given (floating dtypes;
 * Note [bias in C]). a and b: detached, ndim >= 2, on one device, the same dtype (f32, f64
 * or an integer type; f16 and bf16 too on a CUDA device), inner sizes already checked;
 * init: detached, a's dtype and device. */
static int mm_batched(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, ddp_tensor *init,
                      const char *op) {
  *out = NULL;
  mm_job j = {.dtype = a->dtype, .esize = (int64_t)ddp_dtype_size(a->dtype),
              .kern = ddp_kernels_for(a->device)};
  if (ddp_dtype_is_floating(a->dtype)) DDP_TRY(DDP_KERNEL_CHECK(j.kern, gemm, op));
  else DDP_TRY(DDP_KERNEL_CHECK(j.kern, matmul_int, op));
  int ba = a->ndim - 2, bb = b->ndim - 2;
  j.nbd = ddp_broadcast_shapes(ba, a->shape, bb, b->shape, j.bshape);
  if (j.nbd < 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: batch dimensions of %s and %s do not broadcast", op,
             DDP_SHAPE(a), DDP_SHAPE(b));
  if (j.nbd + 2 > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "%s: result of %s and %s would have more than %d dimensions", op,
             DDP_SHAPE(a), DDP_SHAPE(b), DDP_MAX_DIMS);
  j.n = a->shape[ba], j.k = a->shape[ba + 1], j.m = b->shape[bb + 1];
  int64_t shape[DDP_MAX_DIMS];
  memcpy(shape, j.bshape, sizeof(int64_t) * j.nbd);
  shape[j.nbd] = j.n, shape[j.nbd + 1] = j.m;
  int floating = ddp_dtype_is_floating(j.dtype);
  if (floating && (j.n > INT_MAX || j.m > INT_MAX || j.k > INT_MAX))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s and %s exceed the BLAS size limit (%d)", op, DDP_SHAPE(a),
             DDP_SHAPE(b), INT_MAX);
  if (j.k == 0 && !init) return ddp_tensor_zeros(out, j.nbd + 2, shape, j.dtype, a->device);
  DDP_TRY(ddp_tensor_empty(out, j.nbd + 2, shape, j.dtype, a->device));
  if (init) { /* Note [bias in C]: the bias rows, then C += A B */
    int st = ddp_copy_(*out, init);
    if (st) {
      ddp_tensor_release(*out);
      *out = NULL;
      return st;
    }
    j.beta = 1.0;
  }
  if ((*out)->numel == 0 || j.k == 0) return DDP_OK;

  ddp_tensor *ac = a, *bc = b; /* operands as passed to the kernel (maybe copies) */
  ddp_tensor_retain(ac);
  ddp_tensor_retain(bc);
  int status = DDP_OK;
  int64_t batches = 1;
  for (int d = 0; d < j.nbd; d++) batches *= j.bshape[d];
  if (floating && bb == 0 && ba > 0 && ddp_tensor_is_contiguous(a) &&
      a->numel / j.k <= INT_MAX) {
    /* b is one matrix and a's batch folds into its rows: a single GEMM (linear layers) */
    j.n = a->numel / j.k;
    j.nbd = 0;
    batches = 1;
    j.la = (gemm_layout){0, j.k};
  } else if (floating &&
             !gemm_layout_of(j.n, j.k, a->strides[ba], a->strides[ba + 1], &j.la)) {
    ddp_tensor_release(ac);
    status = contiguous_detached(&ac, a);
    if (!status) gemm_layout_of(j.n, j.k, ac->strides[ba], ac->strides[ba + 1], &j.la);
  }
  if (!status && floating &&
      !gemm_layout_of(j.k, j.m, b->strides[bb], b->strides[bb + 1], &j.lb)) {
    ddp_tensor_release(bc);
    status = contiguous_detached(&bc, b);
    if (!status) gemm_layout_of(j.k, j.m, bc->strides[bb], bc->strides[bb + 1], &j.lb);
  }
  if (status) {
    ddp_tensor_release(ac);
    ddp_tensor_release(bc);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  /* batch strides aligned to the right, 0 where an operand broadcasts */
  for (int d = 0; d < j.nbd; d++) {
    int da = d - (j.nbd - ba), db = d - (j.nbd - bb);
    j.astr[d] = (da >= 0 && ac->shape[da] != 1) ? ac->strides[da] : 0;
    j.bstr[d] = (db >= 0 && bc->shape[db] != 1) ? bc->strides[db] : 0;
  }
  j.sa0 = ac->strides[ba], j.sa1 = ac->strides[ba + 1];
  j.sb0 = bc->strides[bb], j.sb1 = bc->strides[bb + 1];
  j.a = ddp_data(ac), j.b = ddp_data(bc), j.c = ddp_data(*out);
  /* Many small products (at most 2^18 multiply-adds each, below what OpenBLAS would thread
   * itself) go over our pool, one GEMM per thread at a time; bigger ones one after another,
   * each threaded by OpenBLAS. */
  double mnk = (double)j.n * (double)j.m * (double)j.k;
  int64_t grain = (int64_t)(65536.0 / (mnk + 1.0)) + 1;
  int cpu_pool = a->device == DDP_DEVICE_CPU && j.kern->gemm_threads_hold;
  if (cpu_pool && ddp_get_num_threads() > 1 && batches >= 2 * grain && mnk <= 262144.0) {
    int blas_threads = j.kern->gemm_threads_hold();
    ddp_parallel_for(batches, grain, mm_range, &j);
    j.kern->gemm_threads_restore(blas_threads);
  } else if (cpu_pool && ddp_get_num_threads() > 1 && batches == 1 && floating &&
             mnk >= SPLIT_MIN_MNK && mnk <= SPLIT_MAX_MNK && (j.m > SPLIT_ALIGN || j.n > SPLIT_ALIGN)) {
    /* Note [small GEMM split]: two parts, whatever the thread count above one */
    int blas_threads = j.kern->gemm_threads_hold();
    ddp_parallel_for(2, 1, split_by_cols(j.n, j.m) ? mm_cols : mm_rows, &j);
    j.kern->gemm_threads_restore(blas_threads);
  } else {
    /* on a device: this thread, whose current stream and library handles are the ones */
    mm_range(&j, 0, batches);
  }
  ddp_tensor_release(ac);
  ddp_tensor_release(bc);
  status = ddp_device_check(a->device, op); /* a failed launch or cuBLAS call */
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

/* mm_batched for any supported dtype: on the CPU f16 and bf16 go through f32 (OpenBLAS);
 * a device's gemm takes them as they are. */
static int mm_any(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, const char *op) {
  if ((a->dtype != DDP_F16 && a->dtype != DDP_BF16) || a->device != DDP_DEVICE_CPU)
    return mm_batched(out, a, b, NULL, op);
  *out = NULL;
  ddp_tensor *af = NULL, *bf = NULL, *of = NULL;
  int status = ddp_to_dtype(&af, a, DDP_F32);
  if (!status) status = ddp_to_dtype(&bf, b, DDP_F32);
  if (!status) status = mm_batched(&of, af, bf, NULL, op);
  if (!status) status = ddp_to_dtype(out, of, a->dtype);
  ddp_tensor_release(af);
  ddp_tensor_release(bf);
  ddp_tensor_release(of);
  return status;
}

/* ---- checks ----------------------------------------------------------------------------- */

static int check_pair(ddp_tensor *a, ddp_tensor *b, const char *op) {
  DDP_TRY(ddp_check_alive(a, op, "self"));
  DDP_TRY(ddp_check_alive(b, op, "other"));
  ddp_tensor *ts[2] = {a, b};
  const char *names[2] = {"self", "other"};
  DDP_TRY(ddp_check_same_device(op, 2, ts, names));
  if (a->dtype != b->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: expected both operands to have the same dtype, got %s %s and %s %s",
             op, ddp_dtype_name(a->dtype), DDP_SHAPE(a), ddp_dtype_name(b->dtype), DDP_SHAPE(b));
  if (a->dtype == DDP_BOOL)
    DDP_FAIL(DDP_ERR_ARG, "%s: not supported for bool tensors %s and %s", op, DDP_SHAPE(a),
             DDP_SHAPE(b));
  return DDP_OK;
}

static int needs_grad(const ddp_node *n, int i) { return n->edges[i].fn || n->edges[i].leaf; }

/* t itself (one more reference) where mm_any may take it as is (mm_batched records
 * nothing: it copies through detached aliases); its f16/bf16 path converts dtypes, which
 * would record autograd on a tensor that requires grad, so those get a detached alias.
 * Saves header allocations on the small-op path. */
static int as_is(ddp_tensor **out, const ddp_tensor *t) {
  if (t->dtype == DDP_F16 || t->dtype == DDP_BF16)
    return ddp_tensor_view_raw(out, t, t->ndim, t->shape, t->strides, t->offset);
  ddp_tensor_retain((ddp_tensor *)t);
  *out = (ddp_tensor *)t;
  return DDP_OK;
}

/* a as a matrix: itself for ndim >= 2, else the (1, K) view. */
static int as_lhs(ddp_tensor **out, const ddp_tensor *a) {
  if (a->ndim >= 2) return as_is(out, a);
  int64_t shape[2] = {1, a->shape[0]}, strides[2] = {a->shape[0] * a->strides[0], a->strides[0]};
  return ddp_tensor_view_raw(out, a, 2, shape, strides, a->offset);
}

/* b as a matrix: itself for ndim >= 2, else the (K, 1) view. */
static int as_rhs(ddp_tensor **out, const ddp_tensor *b) {
  if (b->ndim >= 2) return as_is(out, b);
  int64_t shape[2] = {b->shape[0], 1}, strides[2] = {b->strides[0], 1};
  return ddp_tensor_view_raw(out, b, 2, shape, strides, b->offset);
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* grad (batch..., [N], [M]) seen as (batch..., N, M): size-1 dimensions put back where a 1-d
 * operand dropped them. */
static int grad_as_batched(ddp_tensor **out, ddp_tensor *g, int a_1d, int b_1d) {
  int64_t shape[DDP_MAX_DIMS], strides[DDP_MAX_DIMS];
  int nbd = g->ndim - !a_1d - !b_1d, nd = 0;
  for (int d = 0; d < nbd; d++) shape[nd] = g->shape[d], strides[nd++] = g->strides[d];
  int src = nbd;
  if (a_1d) shape[nd] = 1, strides[nd++] = 1;
  else shape[nd] = g->shape[src], strides[nd++] = g->strides[src], src++;
  if (b_1d) shape[nd] = 1, strides[nd++] = 1;
  else shape[nd] = g->shape[src], strides[nd++] = g->strides[src];
  return ddp_tensor_view_raw(out, g, nd, shape, strides, g->offset);
}

/* t (contiguous, new reference) summed to (ndim, shape) batch-wise, then viewed as the
 * input's own shape. Consumes t. */
static int reduce_to_input(ddp_tensor **out, ddp_tensor *t, const ddp_tensor *as,
                           const ddp_input_meta *meta) {
  ddp_tensor *s = NULL;
  int status = ddp_sum_to_shape(&s, t, as->ndim, as->shape);
  ddp_tensor_release(t);
  if (status) return status;
  status = reshape_contiguous(out, s, meta->ndim, meta->shape);
  ddp_tensor_release(s);
  return status;
}

/* d(a·b): grad_a = grad · bᵀ, grad_b = aᵀ · grad, each summed over the batch dimensions its
 * operand was broadcast along. Shared by matmul and bmm. */
static int matmul_backward(ddp_node *node, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *a = ddp_node_saved(node, 0), *b = ddp_node_saved(node, 1);
  if (!a || !b) return ddp_last_status();
  ddp_tensor *a2 = NULL, *b2 = NULL, *g3 = NULL, *tmp = NULL, *prod = NULL;
  int status = as_lhs(&a2, a);
  if (!status) status = as_rhs(&b2, b);
  if (!status) status = grad_as_batched(&g3, g, a->ndim == 1, b->ndim == 1);
  if (!status && needs_grad(node, 0)) {
    status = transpose_last2(&tmp, b2);
    if (!status) status = mm_any(&prod, g3, tmp, "matmul backward");
    ddp_tensor_release(tmp), tmp = NULL;
    if (!status) status = reduce_to_input(&gi[0], prod, a2, &node->inputs[0]);
    prod = NULL;
  }
  if (!status && needs_grad(node, 1)) {
    if (b->ndim <= 2 && a->ndim > 2 && a2->shape[a2->ndim - 1] > 0) {
      /* one weight matrix shared by every batch entry: fold the batch into one GEMM,
       * (K, B N) · (B N, M), instead of B products summed afterwards */
      ddp_tensor *ac = NULL, *gc = NULL, *af = NULL, *gf = NULL, *aft = NULL;
      int64_t rows = a2->numel / a2->shape[a2->ndim - 1];
      int64_t ashape[2] = {rows, a2->shape[a2->ndim - 1]}, gshape[2] = {rows, b2->shape[1]};
      status = contiguous_detached(&ac, a2);
      if (!status) status = contiguous_detached(&gc, g3);
      if (!status) status = reshape_contiguous(&af, ac, 2, ashape);
      if (!status) status = reshape_contiguous(&gf, gc, 2, gshape);
      if (!status) status = transpose_last2(&aft, af);
      if (!status) status = mm_any(&prod, aft, gf, "matmul backward");
      ddp_tensor_release(ac), ddp_tensor_release(gc), ddp_tensor_release(af);
      ddp_tensor_release(gf), ddp_tensor_release(aft);
    } else {
      status = transpose_last2(&tmp, a2);
      if (!status) status = mm_any(&prod, tmp, g3, "matmul backward");
      ddp_tensor_release(tmp), tmp = NULL;
    }
    if (!status) status = reduce_to_input(&gi[1], prod, b2, &node->inputs[1]);
  }
  ddp_tensor_release(a2), ddp_tensor_release(b2), ddp_tensor_release(g3);
  return status;
}

/* Record a two-input product node saving both inputs. */
static int record_product(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, const char *name) {
  ddp_tensor *inputs[2] = {a, b};
  if (!ddp_autograd_needed(2, inputs)) return DDP_OK;
  ddp_node *n = ddp_node_new(name, matmul_backward, 2, inputs, 2);
  int status = n ? ddp_node_save(n, 0, a) : ddp_last_status();
  if (!status) status = ddp_node_save(n, 1, b);
  if (status) {
    if (n) ddp_node_release(n);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}

int ddp_matmul(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) {
  *out = NULL;
  ddp_tensor *ac_in[2] = {a, b}, *ac[2]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_MATMUL, 2, ac_in, ac, ddp_matmul(out, ac[0], ac[1]));
  DDP_TRY(check_pair(a, b, "matmul"));
  if (a->ndim < 1 || b->ndim < 1)
    DDP_FAIL(DDP_ERR_ARG, "matmul: both arguments need at least 1 dimension, got %s and %s",
             DDP_SHAPE(a), DDP_SHAPE(b));
  int64_t ka = a->shape[a->ndim - 1], kb = b->shape[b->ndim == 1 ? 0 : b->ndim - 2];
  if (ka != kb)
    DDP_FAIL(DDP_ERR_ARG, "matmul: shapes %s and %s cannot be multiplied (inner sizes %lld and %lld)",
             DDP_SHAPE(a), DDP_SHAPE(b), (long long)ka, (long long)kb);
  ddp_tensor *a2 = NULL, *b2 = NULL, *o3 = NULL;
  int status = as_lhs(&a2, a);
  if (!status) status = as_rhs(&b2, b);
  if (!status) status = mm_any(&o3, a2, b2, "matmul");
  ddp_tensor_release(a2);
  ddp_tensor_release(b2);
  if (status) return status;
  /* drop the size-1 dimensions a 1-d operand brought in */
  int64_t shape[DDP_MAX_DIMS];
  int nd = 0, nbd = o3->ndim - 2;
  for (int d = 0; d < nbd; d++) shape[nd++] = o3->shape[d];
  if (a->ndim >= 2) shape[nd++] = o3->shape[nbd];
  if (b->ndim >= 2) shape[nd++] = o3->shape[nbd + 1];
  if (nd == o3->ndim) {
    *out = o3;
  } else {
    status = reshape_contiguous(out, o3, nd, shape);
    ddp_tensor_release(o3);
    if (status) return status;
  }
  return record_product(out, a, b, "MmBackward");
}

int ddp_bmm(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) {
  *out = NULL;
  ddp_tensor *ac_in[2] = {a, b}, *ac[2]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_BMM, 2, ac_in, ac, ddp_bmm(out, ac[0], ac[1]));
  DDP_TRY(check_pair(a, b, "bmm"));
  if (a->ndim != 3 || b->ndim != 3)
    DDP_FAIL(DDP_ERR_ARG, "bmm: expected 3-d tensors (B, N, K) and (B, K, M), got %s and %s",
             DDP_SHAPE(a), DDP_SHAPE(b));
  if (a->shape[0] != b->shape[0])
    DDP_FAIL(DDP_ERR_ARG, "bmm: batch sizes of %s and %s differ", DDP_SHAPE(a), DDP_SHAPE(b));
  if (a->shape[2] != b->shape[1])
    DDP_FAIL(DDP_ERR_ARG, "bmm: shapes %s and %s cannot be multiplied (inner sizes %lld and %lld)",
             DDP_SHAPE(a), DDP_SHAPE(b), (long long)a->shape[2], (long long)b->shape[1]);
  ddp_tensor *a2 = ddp_tensor_alias(a), *b2 = ddp_tensor_alias(b);
  int status = (a2 && b2) ? mm_any(out, a2, b2, "bmm") : ddp_last_status();
  ddp_tensor_release(a2);
  ddp_tensor_release(b2);
  if (status) return status;
  return record_product(out, a, b, "BmmBackward");
}

/* ---- linear ----------------------------------------------------------------------------- */

/* d(x Wᵀ + b): grad_x = grad · W, grad_W = gradᵀ · x over all rows, grad_b = column sums. */
static int linear_backward(ddp_node *node, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *x = ddp_node_saved(node, 0), *w = ddp_node_saved(node, 1);
  if (!x || !w) return ddp_last_status();
  int64_t in_f = w->shape[1], out_f = w->shape[0];
  int64_t rows = in_f ? x->numel / in_f : 0;
  if (!in_f) { /* x has no features: rows from the gradient */
    rows = out_f ? g->numel / out_f : 0;
  }
  ddp_tensor *gc = NULL, *gf = NULL, *prod = NULL;
  int status = contiguous_detached(&gc, g);
  int64_t gshape[2] = {rows, out_f};
  if (!status) status = reshape_contiguous(&gf, gc, 2, gshape);
  if (!status && needs_grad(node, 0)) {
    status = mm_any(&prod, gf, w, "linear backward"); /* (rows, in) */
    if (!status) status = reshape_contiguous(&gi[0], prod, node->inputs[0].ndim, node->inputs[0].shape);
    ddp_tensor_release(prod), prod = NULL;
  }
  if (!status && needs_grad(node, 1)) {
    ddp_tensor *xc = NULL, *xf = NULL, *gft = NULL;
    int64_t xshape[2] = {rows, in_f};
    status = contiguous_detached(&xc, x);
    if (!status) status = reshape_contiguous(&xf, xc, 2, xshape);
    if (!status) status = transpose_last2(&gft, gf);
    if (!status) status = mm_any(&gi[1], gft, xf, "linear backward"); /* (out, in) */
    ddp_tensor_release(xc), ddp_tensor_release(xf), ddp_tensor_release(gft);
  }
  if (!status && node->iattr[0] && needs_grad(node, 2)) {
    int rows_dim = 0; /* bias gradient: the column sums of gf (rows, out), vectorised */
    status = ddp_sum(&gi[2], gf, &rows_dim, 1, 0, -1);
  }
  ddp_tensor_release(gc), ddp_tensor_release(gf);
  return status;
}

int ddp_linear(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias) {
  *out = NULL;
  ddp_tensor *ac_in[3] = {input, weight, bias}, *ac[3]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_LINEAR, 3, ac_in, ac, ddp_linear(out, ac[0], ac[1], ac[2]));
  DDP_TRY(ddp_check_affine_args("linear", input, weight, bias));
  if (weight->ndim != 2)
    DDP_FAIL(DDP_ERR_ARG, "linear: weight must be 2-d (out_features, in_features), got %s",
             DDP_SHAPE(weight));
  if (input->ndim < 1 || input->shape[input->ndim - 1] != weight->shape[1])
    DDP_FAIL(DDP_ERR_ARG, "linear: input %s does not end in in_features of weight %s",
             DDP_SHAPE(input), DDP_SHAPE(weight));
  if (bias && (bias->ndim != 1 || bias->shape[0] != weight->shape[0]))
    DDP_FAIL(DDP_ERR_ARG, "linear: bias must be (%lld,) for weight %s, got %s",
             (long long)weight->shape[0], DDP_SHAPE(weight), DDP_SHAPE(bias));
  /* Note [half linear rounds once]: PyTorch's f16/bf16 linear (addmm) adds the bias to the
   * f32 accumulator and rounds the sum once. On the CPU the product of half operands is made
   * in f32 anyway (mm_any), so the f32 product is kept, the bias added there, and the sum
   * rounded once; rounding the product first and adding the bias in half rounded twice (up
   * to 4 ulp off). A device's half gemm returns the half product: the bias add rounds again
   * there (cuBLAS' epilogue would fuse it; not done yet). */
  int half_cpu = (input->dtype == DDP_F16 || input->dtype == DDP_BF16) &&
                 input->device == DDP_DEVICE_CPU;
  /* Note [bias in C]: an f32 / f64 bias goes into the GEMM's C (on every device: each
   * table's gemm honours beta) */
  int bias_in_c = bias && (input->dtype == DDP_F32 || input->dtype == DDP_F64);
  ddp_tensor *x2 = NULL, *wt = NULL, *o2 = NULL, *xf = NULL, *wf = NULL;
  int status = as_lhs(&x2, input);
  if (!status) status = transpose_last2(&wt, weight); /* (in, out): CblasTrans, no copy */
  if (!status && half_cpu) {
    status = ddp_to_dtype(&xf, x2, DDP_F32);
    if (!status) status = ddp_to_dtype(&wf, wt, DDP_F32);
    if (!status) status = mm_batched(&o2, xf, wf, NULL, "linear");
  } else if (!status && bias_in_c) {
    ddp_tensor *b = ddp_tensor_alias(bias); /* detached: the copy into C records nothing */
    status = b ? mm_batched(&o2, x2, wt, b, "linear") : ddp_last_status();
    ddp_tensor_release(b);
  } else if (!status) {
    status = mm_any(&o2, x2, wt, "linear");
  }
  ddp_tensor_release(x2);
  ddp_tensor_release(wt);
  ddp_tensor_release(xf);
  ddp_tensor_release(wf);
  if (status) return status;
  int64_t shape[DDP_MAX_DIMS];
  memcpy(shape, input->shape, sizeof(int64_t) * input->ndim);
  shape[input->ndim - 1] = weight->shape[0];
  status = reshape_contiguous(out, o2, input->ndim, shape);
  ddp_tensor_release(o2);
  if (!status && bias && !bias_in_c) status = ddp_accumulate_(*out, bias); /* f32 += bias when half_cpu */
  if (!status && half_cpu) {
    ddp_tensor *o32 = *out;
    status = ddp_to_dtype(out, o32, input->dtype); /* the one rounding */
    ddp_tensor_release(o32);
    if (status) *out = NULL;
  }
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  (*out)->storage->version = 0;
  ddp_tensor *inputs[3] = {input, weight, bias};
  if (!ddp_autograd_needed(3, inputs)) return DDP_OK;
  ddp_node *n = ddp_node_new("LinearBackward", linear_backward, 3, inputs, 2);
  status = n ? ddp_node_save(n, 0, input) : ddp_last_status();
  if (!status) status = ddp_node_save(n, 1, weight);
  if (status) {
    if (n) ddp_node_release(n);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  n->iattr[0] = bias != NULL;
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}
