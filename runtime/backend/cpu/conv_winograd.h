/* runtime/backend/cpu/conv_winograd.h: f32 conv2d by Winograd F(2x2, 3x3) on NCHW tensors
 * (Lavin, Gray, CVPR 2016). Internal; conv.c chooses it per shape. */
#ifndef DDP_CPU_CONV_WINOGRAD_H
#define DDP_CPU_CONV_WINOGRAD_H

#include "backend/kernels.h"

/* 1 when the kernels below can compute geometry g in dtype: DDP_F32, 3x3 kernel, stride 1,
 * dilation 1, one group, any padding, at least one sample, channel and output element.
 * Whether it pays is conv.c's choice (Note [conv algorithm per shape]). */
int ddp_cpu_winograd_fits(int dtype, const ddp_conv2d_geom *g);

/* out (N, O, OH, OW) = conv2d(in (N, C, H, W), w (O, C, 3, 3)) + bias (O, or NULL);
 * contiguous f32. Samples are spread over the runtime's threads (OpenBLAS held at one
 * thread meanwhile). Returns a status: DDP_ERR_MEMORY for scratch. */
int ddp_cpu_winograd_forward(float *out, const float *in, const float *w, const float *bias,
                             const ddp_conv2d_geom *g);

/* Accumulate conv2d's gradients into d_in (N, C, H, W), d_w (O, C, 3, 3) and d_b (O); each
 * may be NULL (not wanted). grad_out (N, O, OH, OW), in, w as in the forward; contiguous
 * f32. Bitwise the same for any thread count (Note [Winograd chunks and determinism]).
 * Returns a status: DDP_ERR_MEMORY for scratch. */
int ddp_cpu_winograd_backward(float *d_in, float *d_w, float *d_b, const float *grad_out,
                              const float *in, const float *w, const ddp_conv2d_geom *g);

#endif /* DDP_CPU_CONV_WINOGRAD_H */
