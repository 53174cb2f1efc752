/* runtime/backend/cpu/matmul.c: matrix-product kernels. */
#include <cblas.h>

#include "backend/cpu/matmul.h"
#include "core/core.h"

/* f16 / bf16 GEMM with f32 products and sums, a plain loop (see matmul.h). */
static float half_get(int dtype, const uint16_t *p, int64_t i) {
  return dtype == DDP_F16 ? ddp_f16_to_f32(p[i]) : ddp_bf16_to_f32(p[i]);
}

static void gemm_half(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                      int64_t ldb, float beta, uint16_t *c, int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      for (int64_t p = 0; p < k; p++)
        acc += half_get(dtype, a, trans_a ? p * lda + i : i * lda + p) *
               half_get(dtype, b, trans_b ? j * ldb + p : p * ldb + j);
      float v = alpha * acc;
      if (beta != 0) v += beta * half_get(dtype, c, i * ldc + j); /* c not read for beta 0 */
      c[i * ldc + j] = dtype == DDP_F16 ? ddp_f32_to_f16(v) : ddp_f32_to_bf16(v);
    }
}

void ddp_cpu_gemm(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                  double beta, void *c, int64_t ldc) {
  if (dtype == DDP_F16 || dtype == DDP_BF16) {
    gemm_half(dtype, trans_a, trans_b, m, n, k, (float)alpha, a, lda, b, ldb, (float)beta, c, ldc);
    return;
  }
  enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (dtype == DDP_F32)
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)alpha,
                (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb, (float)beta,
                (float *)c, (blasint)ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, alpha,
                (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb, beta,
                (double *)c, (blasint)ldc);
}

int ddp_cpu_blas_hold_single(void) {
  int previous = openblas_get_num_threads();
  if (previous > 1) openblas_set_num_threads(1);
  return previous;
}

void ddp_cpu_blas_restore(int previous) {
  if (previous > 1) openblas_set_num_threads(previous);
}

#define MATMUL_INT(T)                                                                      \
  static void matmul_##T(T *c, const T *a, int64_t sa0, int64_t sa1, const T *b,           \
                         int64_t sb0, int64_t sb1, int64_t m, int64_t n, int64_t k) {      \
    for (int64_t i = 0; i < m; i++)                                                        \
      for (int64_t j = 0; j < n; j++) {                                                    \
        uint64_t acc = 0; /* unsigned: wrapping is defined */                              \
        for (int64_t p = 0; p < k; p++)                                                    \
          acc += (uint64_t)(int64_t)a[i * sa0 + p * sa1] *                                 \
                 (uint64_t)(int64_t)b[p * sb0 + j * sb1];                                  \
        c[i * n + j] = (T)acc;                                                             \
      }                                                                                    \
  }
MATMUL_INT(int64_t)
MATMUL_INT(int32_t)
MATMUL_INT(uint8_t)

void ddp_cpu_matmul_int(int dtype, void *c, const void *a, int64_t sa0, int64_t sa1,
                        const void *b, int64_t sb0, int64_t sb1, int64_t m, int64_t n, int64_t k) {
  switch (dtype) {
  case DDP_I64: matmul_int64_t(c, a, sa0, sa1, b, sb0, sb1, m, n, k); break;
  case DDP_I32: matmul_int32_t(c, a, sa0, sa1, b, sb0, sb1, m, n, k); break;
  default: matmul_uint8_t(c, a, sa0, sa1, b, sb0, sb1, m, n, k); break;
  }
}
