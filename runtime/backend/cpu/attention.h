/* runtime/backend/cpu/attention.h: CPU kernels of scaled_dot_product_attention (internal;
 * the front door in runtime/ops/attention.c checks shapes and calls these through the
 * kernel table). Buffers and the geometry are those of ddp_attention_geom
 * (runtime/backend/kernels.h); Note [flash attention] in attention.c gives the algorithm.
 * f32 (BLAS sgemm on tiles, a vectorised exp) and f64 (dgemm, libm exp). Both split their
 * work over the thread pool (forward: batch*heads x row blocks; backward: batch*heads),
 * with results independent of the thread count. */
#ifndef DDP_CPU_ATTENTION_H
#define DDP_CPU_ATTENTION_H

#include "backend/kernels.h"

/* out (BH, L, Ev), lse (BH, L) <- q (BH, L, E), k (BH, S, E), v (BH, S, Ev), mask.
 * Returns DDP_OK, or DDP_ERR_MEMORY (recorded) when a thread's tile scratch (a few tens of
 * KiB) could not be allocated; the backward likewise. */
int ddp_cpu_attention_forward(int dtype, void *out, void *lse, const void *q, const void *k,
                              const void *v, const void *mask, const ddp_attention_geom *g);

/* dq (BH, L, E), dk (BH, S, E), dv (BH, S, Ev) += the gradients; dmask (BH, L, S) = the
 * gradient of the additive mask (the scores' gradient), or NULL. */
int ddp_cpu_attention_backward(int dtype, void *dq, void *dk, void *dv, void *dmask,
                               const void *dout, const void *q, const void *k, const void *v,
                               const void *out, const void *lse, const void *mask,
                               const ddp_attention_geom *g);

/* Note [attention dropout]: 1 when element e = (bh * L + i) * S + j of the probabilities is
 * kept: word e % 4 of Philox block (offset + e / 4) under key seed is below threshold =
 * (1 - p) * 2^32 (ddp_attention_keep_threshold). The decision depends only on (seed,
 * offset, e): forward and backward, any tiling, any thread count and every device agree. */
static inline uint64_t ddp_attention_keep_threshold(double p) {
  double t = (1.0 - p) * 4294967296.0;
  return t >= 4294967296.0 ? (uint64_t)1 << 32 : (uint64_t)t;
}

#endif /* DDP_CPU_ATTENTION_H */
