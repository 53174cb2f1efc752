/* runtime/backend/cpu/matmul.h: matrix-product kernels (OpenBLAS for floating types, a
 * plain loop for integers). Internal to the runtime. */
#ifndef DDP_CPU_MATMUL_H
#define DDP_CPU_MATMUL_H

#include <stdint.h>

/* c (m, n) row-major with leading dimension ldc = alpha * op(a) op(b) + beta * c, where
 * op(a) is (m, k) and op(b) is (k, n); trans_a says a is stored as (k, m) (row-major, lda),
 * else as (m, k); likewise b. dtype DDP_F32 or DDP_F64 (OpenBLAS), or DDP_F16 / DDP_BF16
 * (f32 products and sums, alpha and beta as f32, c not read when beta is 0: the semantics
 * of the CUDA table's cuBLAS GEMM; a plain loop, for the simulated device: the CPU ops
 * layer converts such operands to f32 and calls OpenBLAS instead). Leading dimensions must
 * be >= 1 and at least the stored row length (cblas rules); m, n, k >= 1. */
void ddp_cpu_gemm(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                  double beta, void *c, int64_t ldc);

/* Integer product c (m, n) contiguous = a · b, a (m, k) with element strides (sa0, sa1),
 * b (k, n) with strides (sb0, sb1); dtype DDP_I64, DDP_I32 or DDP_U8; sums wrap as the
 * dtype does. */
void ddp_cpu_matmul_int(int dtype, void *c, const void *a, int64_t sa0, int64_t sa1,
                        const void *b, int64_t sb0, int64_t sb1, int64_t m, int64_t n, int64_t k);

/* Hold OpenBLAS at one thread while our own pool runs several GEMMs side by side (one per
 * sample or batch entry); returns the previous count for ddp_cpu_blas_restore. The setting
 * is process-wide: BLAS calls from other threads meanwhile run on one thread too. */
int ddp_cpu_blas_hold_single(void);
void ddp_cpu_blas_restore(int previous);

#endif /* DDP_CPU_MATMUL_H */
