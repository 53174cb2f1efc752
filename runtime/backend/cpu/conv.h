/* runtime/backend/cpu/conv.h: 2-d convolution kernels (im2col + GEMM, and Winograd F(2x2, 3x3)
 * from conv_winograd.h where it pays: Note [conv algorithm per shape] in conv.c). Internal. */
#ifndef DDP_CPU_CONV_H
#define DDP_CPU_CONV_H

#include "backend/kernels.h"

/* Geometry: ddp_conv2d_geom (runtime/backend/kernels.h). */
/* out = conv2d(in, w) + bias. Contiguous buffers of dtype DDP_F32 or DDP_F64; bias may be
 * NULL. Samples are spread over the runtime's threads. Returns a status (scratch memory). */
int ddp_cpu_conv2d_forward(int dtype, void *out /* (N, O, OH, OW) */,
                           const void *in /* (N, C, H, W) */,
                           const void *w /* (O, C / groups, kH, kW) */,
                           const void *bias /* (O) or NULL */, const ddp_conv2d_geom *g);

/* Accumulate the gradients of conv2d into d_in, d_w, d_b (each may be NULL: not wanted).
 * Contiguous buffers of dtype DDP_F32 or DDP_F64. Returns a status (scratch memory). */
int ddp_cpu_conv2d_backward(int dtype, void *d_in /* (N, C, H, W) */,
                            void *d_w /* (O, C / groups, kH, kW) */, void *d_b /* (O) */,
                            const void *grad_out /* (N, O, OH, OW) */,
                            const void *in /* (N, C, H, W) */,
                            const void *w /* (O, C / groups, kH, kW) */,
                            const ddp_conv2d_geom *g);

#endif /* DDP_CPU_CONV_H */
