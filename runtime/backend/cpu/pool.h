/* runtime/backend/cpu/pool.h: 2-d pooling kernels over planes. Internal. */
#ifndef DDP_CPU_POOL_H
#define DDP_CPU_POOL_H

#include "backend/kernels.h"

/* Geometry: ddp_pool2d_geom (runtime/backend/kernels.h). */
/* Contiguous buffers of dtype DDP_F32 or DDP_F64 (indices: int64_t); planes spread over the
 * runtime's threads. Backward kernels write all of d_in (uninitialised on entry): each plane
 * is zeroed, then the windows' shares are added in (oh, ow) order (negative indices, from
 * the fused relu, add nothing). */
void ddp_cpu_max_pool2d_forward(int dtype, void *out /* (P, OH, OW) */,
                                int64_t *indices /* (P, OH, OW) */, const void *in /* (P, H, W) */,
                                const ddp_pool2d_geom *g);
/* Max pooling of relu(in) in one pass, the bits of relu then max pooling (Note [fused relu
 * max pooling] in pool.c). Its indices (P, OH, OW) are u8 taps when
 * ddp_cpu_relu_max_pool2d_taps(dtype, g) (Note [relu pooling taps]), else i64 flat indices,
 * -1 - index where the window's maximum is not > 0; the backward reads them by the same rule
 * (g as the backward sees it: dh = dw = 1 for undilated windows). */
int ddp_cpu_relu_max_pool2d_taps(int dtype, const ddp_pool2d_geom *g);
void ddp_cpu_relu_max_pool2d_forward(int dtype, void *out /* (P, OH, OW) */,
                                     void *indices /* (P, OH, OW) */,
                                     const void *in /* (P, H, W) */, const ddp_pool2d_geom *g);
void ddp_cpu_relu_max_pool2d_backward(int dtype, void *d_in /* (P, H, W) */,
                                      const void *grad_out /* (P, OH, OW) */,
                                      const void *indices /* (P, OH, OW) */,
                                      const ddp_pool2d_geom *g);
void ddp_cpu_max_pool2d_backward(int dtype, void *d_in /* (P, H, W) */,
                                 const void *grad_out /* (P, OH, OW) */,
                                 const int64_t *indices /* (P, OH, OW) */, const ddp_pool2d_geom *g);
void ddp_cpu_avg_pool2d_forward(int dtype, void *out /* (P, OH, OW) */,
                                const void *in /* (P, H, W) */, const ddp_pool2d_geom *g);
void ddp_cpu_avg_pool2d_backward(int dtype, void *d_in /* (P, H, W) */,
                                 const void *grad_out /* (P, OH, OW) */, const ddp_pool2d_geom *g);
/* Adaptive average pooling: only planes, h, w, oh, ow of g are used. */
void ddp_cpu_adaptive_avg_pool2d_forward(int dtype, void *out /* (P, OH, OW) */,
                                         const void *in /* (P, H, W) */, const ddp_pool2d_geom *g);
void ddp_cpu_adaptive_avg_pool2d_backward(int dtype, void *d_in /* (P, H, W) */,
                                          const void *grad_out /* (P, OH, OW) */,
                                          const ddp_pool2d_geom *g);

#endif /* DDP_CPU_POOL_H */
