/* runtime/backend/cpu/gemm_parallel.c: ddp_cpu_gemm split over the thread pool by blocks
 * of c's rows or columns (see gemm_parallel.h). Which dimension: splitting c's columns
 * makes every thread pack all of op(a) (m x k) and its share of op(b); splitting rows,
 * all of op(b) (k x n). The larger of m and n is split, so the duplicated packing is of
 * the smaller operand. */
#include "backend/cpu/gemm_parallel.h"

#include "backend/cpu/matmul.h"
#include "core/core.h"

enum { BLOCK = 16 };                         /* rows / columns per block: whole micro-tiles */
static const double SPLIT_WORK = 262144.0;   /* 2^18 multiply-adds: below, one thread */

typedef struct {
  int dtype, trans_a, trans_b, by_rows;
  int64_t m, n, k, lda, ldb, ldc;
  size_t es;
  double alpha, beta;
  const char *a, *b;
  char *c;
} gemm_job;

/* Blocks [begin, end) of c's rows (by_rows) or columns. */
static void gemm_blocks(void *vctx, int64_t begin, int64_t end) {
  const gemm_job *j = vctx;
  int64_t lo = begin * BLOCK, hi = end * BLOCK, dim = j->by_rows ? j->m : j->n;
  if (hi > dim) hi = dim;
  if (lo >= hi) return;
  const char *a = j->a, *b = j->b;
  char *c;
  if (j->by_rows) { /* op(a) rows lo..hi: a is (m, k), or (k, m) when transposed */
    a += (size_t)(j->trans_a ? lo : lo * j->lda) * j->es;
    c = j->c + (size_t)(lo * j->ldc) * j->es;
    ddp_cpu_gemm(j->dtype, j->trans_a, j->trans_b, hi - lo, j->n, j->k, j->alpha, a, j->lda, b,
                 j->ldb, j->beta, c, j->ldc);
  } else { /* op(b) columns lo..hi: b is (k, n), or (n, k) when transposed */
    b += (size_t)(j->trans_b ? lo * j->ldb : lo) * j->es;
    c = j->c + (size_t)lo * j->es;
    ddp_cpu_gemm(j->dtype, j->trans_a, j->trans_b, j->m, hi - lo, j->k, j->alpha, a, j->lda, b,
                 j->ldb, j->beta, c, j->ldc);
  }
}

void ddp_cpu_gemm_parallel(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                           double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                           double beta, void *c, int64_t ldc) {
  double work = (double)m * (double)n * (double)k;
  int threads = work > SPLIT_WORK ? ddp_get_num_threads() : 1;
  int by_rows = m > n;
  int64_t blocks = ((by_rows ? m : n) + BLOCK - 1) / BLOCK;
  if (threads < 2 || blocks < 2) {
    ddp_cpu_gemm(dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  /* at most one part per thread, each part at least SPLIT_WORK / 2 */
  int64_t parts = (int64_t)(work / (SPLIT_WORK / 2));
  if (parts > threads) parts = threads;
  if (parts > blocks) parts = blocks;
  gemm_job j = {.dtype = dtype, .trans_a = trans_a, .trans_b = trans_b, .by_rows = by_rows,
                .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                .es = ddp_dtype_size(dtype), .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c};
  ddp_parallel_for(blocks, blocks / parts, gemm_blocks, &j);
}
