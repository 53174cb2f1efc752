/* runtime/backend/cpu/norm.h: CPU kernels of batch norm, layer norm, dropout and embedding
 * (internal; the front doors in runtime/ops/norm.c check shapes and call these).
 *
 * All buffers are contiguous. Batch-norm buffers are viewed as (N, C, S): N the batch, C the
 * channels, S the product of the spatial dims (1 for an (N, C) input). Layer-norm buffers
 * are viewed as (M, D): M rows, each normalised over its D elements. Kernels come in f32
 * and f64 (suffix); reductions accumulate in double. Backward kernels accumulate (+=) into
 * their d* buffers. Kernels split their work over the thread pool themselves. */
#ifndef DDP_CPU_NORM_H
#define DDP_CPU_NORM_H

#include <stdint.h>

/* The passes of batch norm over the data (runtime/backend/cpu/batch_norm.c), one entry per
 * pass taking the dtype (DDP_F32: AVX2/FMA loops, DDP_F64: plain loops). Reductions
 * accumulate in double (Note [batch norm f32 accumulation]) and split the channels over the
 * thread pool, so their results do not depend on the thread count.
 *
 * Per-channel mean and biased variance: mean (C), var (C) <- x (N, C, S)
 * (Note [batch norm moments by slices]). */
void ddp_cpu_bn_moments(int dtype, double *mean, double *var, const void *x, int64_t N, int64_t C,
                        int64_t S);

/* Per-channel sum and sum of squares: sum (C), sumsq (C) <- x (N, C, S). */
void ddp_cpu_bn_sums(int dtype, double *sum, double *sumsq, const void *x, int64_t N, int64_t C,
                     int64_t S);

/* y = (x - mean[c]) * scale[c] + shift[c] (one fused multiply-add):
 * y (N, C, S) <- x (N, C, S), mean (C), scale (C), shift (C). */
void ddp_cpu_bn_apply(int dtype, void *y, const void *x, const void *mean, const void *scale,
                      const void *shift, int64_t N, int64_t C, int64_t S);

/* Fused batch norm + ReLU (+ residual add), Note [fused batch norm relu] in
 * runtime/ops/norm.c: y = relu(bn_apply(x) + residual), each step rounded as the separate
 * ops round it, so y is bitwise what bn_apply, add and relu give.
 * y (N, C, S), mask (N C S / 8 bytes) or NULL <- x (N, C, S), residual (N, C, S) or NULL
 * (none), mean, scale, shift (C). mask, only for DDP_F32 with S % 8 == 0: bit j of byte i
 * is y[8 i + j] > 0, the ReLU's mask for the backward (Note [fused batch norm relu mask]). */
void ddp_cpu_bn_apply_relu(int dtype, void *y, uint8_t *mask, const void *x,
                           const void *residual, const void *mean, const void *scale,
                           const void *shift, int64_t N, int64_t C, int64_t S);

/* Per-channel sums for the backward: sum_dy[c] = sum dy, sum_dy_xmu[c] = sum dy * (x - mean[c]):
 * sum_dy (C), sum_dy_xmu (C) <- dy (N, C, S), x (N, C, S), mean (C). */
void ddp_cpu_bn_backward_reduce(int dtype, double *sum_dy, double *sum_dy_xmu, const void *dy,
                                const void *x, const void *mean, int64_t N, int64_t C, int64_t S);

/* The same sums of g = (y > 0 ? dy : 0), the gradient through the ReLU of the fused op whose
 * output is y. The mask comes from the bits of bn_apply_relu when mask is given, else from
 * y when given, else (no residual) it is recomputed as (x - mean) * scale + shift > 0
 * (Note [fused batch norm relu mask] in batch_norm.c): sum_dy (C), sum_dy_xmu (C)
 * <- dy (N, C, S), mask or NULL, y or NULL, x (N, C, S), mean, scale, shift (C). */
void ddp_cpu_bn_backward_reduce_relu(int dtype, double *sum_dy, double *sum_dy_xmu,
                                     const void *dy, const uint8_t *mask, const void *y,
                                     const void *x, const void *mean, const void *scale,
                                     const void *shift, int64_t N, int64_t C, int64_t S);

/* dx += a[c] * dy + (b[c] * (x - mean[c]) + d[c]), the per-channel affine form both the
 * training and the eval backward of batch norm reduce to:
 * dx (N, C, S) <- dy (N, C, S), x (N, C, S), mean (C), a (C), b (C), d (C). */
void ddp_cpu_bn_backward_elemt(int dtype, void *dx, const void *dy, const void *x,
                               const void *mean, const void *a, const void *b, const void *d,
                               int64_t N, int64_t C, int64_t S);

/* The fused op's backward: g = (y > 0 ? dy : 0) (mask from the bits, y, or x, scale and
 * shift, as above); dresidual = g and dx = 0 + (a[c] g + (b[c] (x - mean[c]) + d[c])),
 * WRITTEN (not accumulated: bitwise the accumulation into a zero fill); dx and dresidual
 * (N, C, S) may each be NULL (not wanted)
 * <- dy (N, C, S), mask or NULL, y or NULL, x (N, C, S), mean, scale, shift, a, b, d (C). */
void ddp_cpu_bn_backward_elemt_relu(int dtype, void *dx, void *dresidual, const void *dy,
                                    const uint8_t *mask, const void *y, const void *x,
                                    const void *mean, const void *scale, const void *shift,
                                    const void *a, const void *b, const void *d, int64_t N,
                                    int64_t C, int64_t S);

/* Per-channel coefficients of the batch-norm forward from double statistics:
 * invstd = 1 / sqrt(var + eps), scale = w * invstd, shift = b, mean_out = mean, computed in
 * double and rounded to T. mean_out, scale, shift, invstd (C) may each be NULL (not
 * wanted) <- mean (C), var (C), w (C) or NULL (ones), b (C) or NULL (zeros). */
void ddp_cpu_bn_finalize_f32(float *mean_out, float *scale, float *shift, float *invstd,
                             const double *mean, const double *var, const float *w,
                             const float *b, int64_t C, double eps);
void ddp_cpu_bn_finalize_f64(double *mean_out, double *scale, double *shift, double *invstd,
                             const double *mean, const double *var, const double *w,
                             const double *b, int64_t C, double eps);

/* Running statistic update of batch norm (PyTorch's momentum form), in double, in place:
 * running[c] = (1 - momentum) * running[c] + momentum * (value[c] * correction), rounded to
 * T; running (C) <- value (C). correction is M / (M - 1) for the variance (unbiased), else 1. */
void ddp_cpu_bn_running_update_f32(float *running, const double *value, int64_t C,
                                   double momentum, double correction);
void ddp_cpu_bn_running_update_f64(double *running, const double *value, int64_t C,
                                   double momentum, double correction);

/* Per-channel coefficients of the batch-norm backward, in double, rounded to T. With
 * k = w invstd / M: a = w invstd, b = -k invstd^2 sum_dy_xmu and d = -k sum_dy when training
 * (0 in eval mode, where the statistics are constants), dweight = sum_dy_xmu invstd,
 * dbias = sum_dy. Outputs a, b, d, dweight, dbias (C) may each be NULL (not wanted)
 * <- sum_dy (C), sum_dy_xmu (C), invstd (C), w (C) or NULL (ones). */
void ddp_cpu_bn_backward_coef_f32(float *a, float *b, float *d, float *dweight, float *dbias,
                                  const double *sum_dy, const double *sum_dy_xmu,
                                  const float *invstd, const float *w, int64_t C, double M,
                                  int training);
void ddp_cpu_bn_backward_coef_f64(double *a, double *b, double *d, double *dweight, double *dbias,
                                  const double *sum_dy, const double *sum_dy_xmu,
                                  const double *invstd, const double *w, int64_t C, double M,
                                  int training);

/* Layer norm forward: y (M, D), mean (M), rstd (M) <- x (M, D), w (D) or NULL, b (D) or NULL;
 * rstd = 1 / sqrt(biased var + eps). */
void ddp_cpu_ln_forward_f32(float *y, float *mean, float *rstd, const float *x, const float *w,
                            const float *b, int64_t M, int64_t D, double eps);
void ddp_cpu_ln_forward_f64(double *y, double *mean, double *rstd, const double *x, const double *w,
                            const double *b, int64_t M, int64_t D, double eps);

/* Layer norm backward; each of dx (M, D), dw (D), db (D) may be NULL (not wanted):
 * <- dy (M, D), x (M, D), mean (M), rstd (M), w (D) or NULL. */
void ddp_cpu_ln_backward_f32(float *dx, float *dw, float *db, const float *dy, const float *x,
                             const float *mean, const float *rstd, const float *w, int64_t M, int64_t D);
void ddp_cpu_ln_backward_f64(double *dx, double *dw, double *db, const double *dy, const double *x,
                             const double *mean, const double *rstd, const double *w, int64_t M,
                             int64_t D);

/* y = x * mask * scale (dropout forward, and its backward with x = dy):
 * y (n) <- x (n), mask (n) u8 0/1. */
void ddp_cpu_masked_scale_f32(float *y, const float *x, const uint8_t *mask, float scale, int64_t n);
void ddp_cpu_masked_scale_f64(double *y, const double *x, const uint8_t *mask, double scale, int64_t n);

/* Embedding lookup: out (n, row_bytes) <- weight (V, row_bytes), idx (n), every idx in [0, V)
 * (checked by the caller). */
void ddp_cpu_embedding_forward(char *out, const char *weight, const int64_t *idx, int64_t n,
                               int64_t row_bytes);

/* Embedding backward (index_add of rows): dweight[idx[i], :] += dy[i, :] for every i with
 * idx[i] != padding_idx (-1: none). dweight (V, D) <- dy (n, D), idx (n). Deterministic: the
 * columns are split over threads, rows are added in order. */
void ddp_cpu_embedding_backward_f32(float *dweight, const float *dy, const int64_t *idx, int64_t n,
                                    int64_t D, int64_t padding_idx);
void ddp_cpu_embedding_backward_f64(double *dweight, const double *dy, const int64_t *idx, int64_t n,
                                    int64_t D, int64_t padding_idx);

/* The table entries (runtime/backend/kernels.h): the kernels above chosen by dtype
 * (DDP_F32 or DDP_F64; masked_scale rounds scale to the dtype). */
void ddp_cpu_bn_finalize(int dtype, void *mean_out, void *scale, void *shift, void *invstd,
                         const double *mean, const double *var, const void *w, const void *b,
                         int64_t C, double eps);
void ddp_cpu_bn_running_update(int dtype, void *running, const double *value, int64_t C,
                               double momentum, double correction);
void ddp_cpu_bn_backward_coef(int dtype, void *a, void *b, void *d, void *dweight, void *dbias,
                              const double *sum_dy, const double *sum_dy_xmu, const void *invstd,
                              const void *w, int64_t C, double M, int training);
void ddp_cpu_ln_forward(int dtype, void *y, void *mean, void *rstd, const void *x, const void *w,
                        const void *b, int64_t M, int64_t D, double eps);
void ddp_cpu_ln_backward(int dtype, void *dx, void *dw, void *db, const void *dy, const void *x,
                         const void *mean, const void *rstd, const void *w, int64_t M, int64_t D);
void ddp_cpu_masked_scale(int dtype, void *y, const void *x, const uint8_t *mask, double scale,
                          int64_t n);
void ddp_cpu_embedding_backward(int dtype, void *dweight, const void *dy, const int64_t *idx,
                                int64_t n, int64_t D, int64_t padding_idx);

#endif /* DDP_CPU_NORM_H */
