/* runtime/backend/cpu/gemm_parallel.h: a GEMM split over the runtime's thread pool.
 * Internal to the runtime. */
#ifndef DDP_CPU_GEMM_PARALLEL_H
#define DDP_CPU_GEMM_PARALLEL_H

#include <stdint.h>

/* ddp_cpu_gemm (backend/cpu/matmul.h: same arguments, dtypes and rules) with a large
 * product split over the thread pool: c's rows (when m > n) or columns in blocks of 16,
 * one block range per thread, each a single-threaded ddp_cpu_gemm call (OpenBLAS stays at
 * one thread: Note [pool and OpenBLAS threads] in runtime/core/threads.c). Split when
 * m * n * k > 2^18 multiply-adds (the size from which OpenBLAS would use a second thread)
 * and the split dimension has more than 16 entries; a call from inside a parallel region (a
 * kernel's own split) runs whole on its thread.
 * Numerics: each element of c is the same k-sum as in the unsplit call, except that
 * OpenBLAS may pick another kernel for the smaller parts (its "small matrix" kernels,
 * which sum k in one run instead of in blocks): then the last bits of an element can
 * depend on the thread count. Replicas with the same thread count get identical bits. */
void ddp_cpu_gemm_parallel(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                           double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                           double beta, void *c, int64_t ldc);

#endif /* DDP_CPU_GEMM_PARALLEL_H */
