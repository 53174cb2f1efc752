/* runtime/backend/cpu/conv_direct.h: direct f32 convolution kernels (AVX2/FMA, register
 * blocking) for the conv2d shapes where im2col + GEMM is poor. Internal: reached only from
 * ddp_cpu_conv2d_forward / ddp_cpu_conv2d_backward (runtime/backend/cpu/conv.c). */
#ifndef DDP_CPU_CONV_DIRECT_H
#define DDP_CPU_CONV_DIRECT_H

#include "backend/kernels.h"

/* 1 when the direct kernels take conv2d of this dtype and geometry, 0 when the caller keeps
 * its own algorithms; `backward` 0 asks for the forward pass, 1 for the backward passes.
 * Taken: DDP_F32, one group, dilation 1, 3x3 kernels, where the direct kernels measured
 * faster than im2col + GEMM on this project's 2-core machine (bench/RESULTS.md, "Direct
 * convolution kernels"):
 *  - stride 1 with one input channel (the Fashion-MNIST CNN's first layer; with 3, ResNet's
 *    first layer, OpenBLAS's GEMM was as fast);
 *  - stride 2: forward up to 64 input and 128 output channels, backward up to 16 and 32
 *    (ResNet-20's downsampling; 32 -> 64 backward measured level with im2col).
 * 1x1 stride 2 (ResNet's option-B shortcuts) measured no faster: its cost is memory traffic.
 * Never fails. */
int ddp_cpu_conv_direct_applies(int dtype, const ddp_conv2d_geom *g, int backward);

/* out = conv2d(in, w) + bias for a geometry ddp_cpu_conv_direct_applies() took. Contiguous
 * DDP_F32 buffers; bias may be NULL. Samples are spread over the runtime's threads; the
 * result does not depend on the thread count. Returns a status (DDP_ERR_MEMORY when the
 * scratch cannot be allocated). */
int ddp_cpu_conv_direct_forward(float *out /* (N, O, OH, OW) */, const float *in /* (N, C, H, W) */,
                                const float *w /* (O, C, kH, kW) */,
                                const float *bias /* (O) or NULL */, const ddp_conv2d_geom *g);

/* Accumulate the gradients of conv2d into d_in, d_w, d_b (each may be NULL: not wanted) for
 * a geometry ddp_cpu_conv_direct_applies() took. Contiguous DDP_F32 buffers. Fixed chunks of
 * samples are spread over the runtime's threads and their weight and bias gradients added
 * in chunk order, so the result does not depend on the thread count. Returns a status
 * (DDP_ERR_MEMORY when the scratch cannot be allocated). */
int ddp_cpu_conv_direct_backward(float *d_in /* (N, C, H, W) */, float *d_w /* (O, C, kH, kW) */,
                                 float *d_b /* (O) */, const float *grad_out /* (N, O, OH, OW) */,
                                 const float *in /* (N, C, H, W) */,
                                 const float *w /* (O, C, kH, kW) */, const ddp_conv2d_geom *g);

#endif /* DDP_CPU_CONV_DIRECT_H */
