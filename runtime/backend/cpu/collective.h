/* runtime/backend/cpu/collective.h: the CPU kernels of the comm layer's arithmetic, the
 * kernel-table entries reduce_inputs, reduce_inputs_all, scale_into and cast_scale (Note
 * [reduction entries] in runtime/backend/kernels.h, which gives their contracts). */
#ifndef DDP_CPU_COLLECTIVE_H
#define DDP_CPU_COLLECTIVE_H

#include <stdint.h>

/* out[i] = in[0][lo + i] op ... op in[k-1][lo + i], i in [0, n): k >= 1 inputs of dtype
 * DDP_F32 or DDP_F64 (others: nothing is written; callers check first), op a
 * ddp_reduce_op (AVG: the SUM, then divided by k). AVX2 vectors of 8 f32 / 4 f64 and the
 * scalar tail combine in the same order, so the result depends neither on alignment nor on
 * n. `out` may be exactly in[j] + lo for one j (each element is read from every input
 * before it is written) and must not overlap the inputs otherwise. */
void ddp_cpu_reduce_inputs(int dtype, void *out, const void *const *in, int k, int64_t lo,
                           int64_t n, int op);

/* The same reduction written back to every buffer: for i in [lo, lo + n), r = buf[0][i] op
 * ... op buf[k-1][i] (the order and lanes of ddp_cpu_reduce_inputs, so the same bits), then
 * buf[j][i] = r for every j. Each group of elements is loaded from every buffer before it
 * is stored to any, so each byte is read once and written once (Note [shm zero copy] in
 * runtime/comm/pg_shm.c). The k buffers must not overlap. */
void ddp_cpu_reduce_inputs_all(int dtype, void *const *buf, int k, int64_t lo, int64_t n, int op);

/* out[i] = x[i] * s, or x[i] / s when divide: f32, f16 and bf16 computed in f32, f64 in
 * f64, rounded once. out may be x; otherwise they do not overlap. */
void ddp_cpu_scale_into(int dtype, void *out, const void *x, int64_t n, double s, int divide);

/* out (out_dtype) = x cast to out_dtype, then scaled as ddp_cpu_scale_into does and
 * rounded again (s == 1: the cast alone). Dtypes F32, F64, F16, BF16. f32 -> f16 / bf16
 * and back take the bulk conversions of core (Note [f16 bulk conversion]); the rest goes
 * element by element through ddp_load_f64 / ddp_store_f64 (the same bits). */
void ddp_cpu_cast_scale(int out_dtype, void *out, int in_dtype, const void *x, int64_t n,
                        double s, int divide);

#endif /* DDP_CPU_COLLECTIVE_H */
