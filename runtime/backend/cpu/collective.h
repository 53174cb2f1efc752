/* runtime/comm/pg_shm_reduce.h: the element-wise reduction of the shared-memory
 * collectives (pg_shm.c): one output from the same range of several ranks' inputs, in rank
 * order, so that every rank computing an element computes the same bits. */
#ifndef DDP_PG_SHM_REDUCE_H
#define DDP_PG_SHM_REDUCE_H

#include <stddef.h>

/* out[i] = ((in[0][lo + i] op in[1][lo + i]) op in[2][lo + i]) ... op in[k-1][lo + i] for
 * i in [0, n): k >= 1 inputs of dtype DDP_F32 or DDP_F64 (other dtypes: nothing is written;
 * pg_shm.c checks first), op one of DDP_REDUCE_SUM, _PRODUCT, _MIN, _MAX (AVG is SUM here;
 * the caller divides). The order above is the only one used, in every lane (AVX2 vectors of
 * 8 f32 / 4 f64 or the scalar tail), so the result does not depend on alignment, on n, or on
 * which rank computes it. MIN / MAX keep `x < acc ? x : acc` / `x > acc ? x : acc` with x
 * the next input: a NaN in acc is replaced by x, a NaN in x is skipped (as the scalar code
 * always did). `out` may be exactly in[j] + lo for one j (each element is read from every
 * input before it is written), and must not overlap the inputs otherwise. */
void ddp_shm_reduce(void *out, const void *const *in, int k, size_t lo, size_t n, int dtype,
                    int op);

/* The same reduction written back to every input: for i in [lo, lo + n), r = (buf[0][i] op
 * buf[1][i]) ... op buf[k-1][i] (the order and lanes of ddp_shm_reduce, so the same bits),
 * then buf[j][i] = r for every j. Each group of elements is loaded from every buffer before
 * it is stored to any, so the result reaches every rank's buffer in one pass: each byte is
 * read once and written once (Note [shm zero copy] in pg_shm.c). The k buffers must not
 * overlap. Same dtypes and ops as ddp_shm_reduce. */
void ddp_shm_reduce_all(void *const *buf, int k, size_t lo, size_t n, int dtype, int op);

#endif /* DDP_PG_SHM_REDUCE_H */
