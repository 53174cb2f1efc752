/* runtime/backend/cpu/loss.h: CPU kernels of the loss functions (internal).
 *
 * Class-dimension layout: a contiguous input of shape (N, C, d1, ..., dk) is seen as
 * (N, C, D) with D = d1 * ... * dk (D = 1 for (N, C)); sample i = n * D + d has its C
 * class values at x[n*C*D + c*D + d], c = 0 .. C-1 (stride D). Per-sample buffers (loss,
 * lse, target, dloss) are (N*D) in sample order.
 *
 * Forward kernels return the sum of the per-sample losses in double, added in fixed-size
 * chunks then over the chunks in order, so the result does not depend on the thread count.
 * Backward kernels accumulate into their d* buffers. `dloss` is the gradient of the
 * result: per sample ((N*D), reduction NONE: dloss_per_sample = 1) or one value (mean or
 * sum: dloss_per_sample = 0); every term is multiplied by `factor` (1 / normaliser for
 * mean, else 1). `weight` may be NULL (all ones). Target values are already checked to
 * lie in [0, C) or equal ignore_index. */
#ifndef DDP_CPU_LOSS_H
#define DDP_CPU_LOSS_H

#include <stdint.h>

/* Cross-entropy with a fused log-softmax (stable: max subtracted before exp).
 * Exactly one of target (class indices) and prob (class probabilities) is non-NULL;
 * smoothing is the label smoothing eps (see ddp_cross_entropy in ops_loss.h).
 * lse receives log(sum_c exp(x_c)) per sample, for the backward. loss may be NULL. */
double ddp_cpu_cross_entropy_forward_f32(float *loss,            // (N*D) or NULL
                                         float *lse,             // (N*D)
                                         const float *x,         // (N, C, D)
                                         const int64_t *target,  // (N*D) or NULL
                                         const float *prob,      // (N, C, D) or NULL
                                         const float *weight,    // (C) or NULL
                                         int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                         double smoothing);
double ddp_cpu_cross_entropy_forward_f64(double *loss, double *lse, const double *x,
                                         const int64_t *target, const double *prob,
                                         const double *weight, int64_t N, int64_t C, int64_t D,
                                         int64_t ignore_index, double smoothing);

/* dx += scale_i * (softmax(x_i) * sum_c q_ic - q_i): q_i is sample i's weighted (smoothed)
 * target distribution; scale_i = factor * dloss (per sample or shared). */
void ddp_cpu_cross_entropy_backward_f32(float *dx,           // (N, C, D)
                                        const float *dloss,  // (N*D) or (1)
                                        int dloss_per_sample, double factor,
                                        const float *x,         // (N, C, D)
                                        const float *lse,       // (N*D)
                                        const int64_t *target,  // (N*D) or NULL
                                        const float *prob,      // (N, C, D) or NULL
                                        const float *weight,    // (C) or NULL
                                        int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                        double smoothing);
void ddp_cpu_cross_entropy_backward_f64(double *dx, const double *dloss, int dloss_per_sample,
                                        double factor, const double *x, const double *lse,
                                        const int64_t *target, const double *prob,
                                        const double *weight, int64_t N, int64_t C, int64_t D,
                                        int64_t ignore_index, double smoothing);

/* NLL: loss_i = -weight[t_i] * x[i, t_i] (0 for ignored samples). loss may be NULL. */
double ddp_cpu_nll_forward_f32(float *loss,            // (N*D) or NULL
                               const float *x,         // (N, C, D)
                               const int64_t *target,  // (N*D)
                               const float *weight,    // (C) or NULL
                               int64_t N, int64_t C, int64_t D, int64_t ignore_index);
double ddp_cpu_nll_forward_f64(double *loss, const double *x, const int64_t *target,
                               const double *weight, int64_t N, int64_t C, int64_t D,
                               int64_t ignore_index);

/* dx[i, t_i] += -weight[t_i] * scale_i. */
void ddp_cpu_nll_backward_f32(float *dx,           // (N, C, D)
                              const float *dloss,  // (N*D) or (1)
                              int dloss_per_sample, double factor,
                              const int64_t *target,  // (N*D)
                              const float *weight,    // (C) or NULL
                              int64_t N, int64_t C, int64_t D, int64_t ignore_index);
void ddp_cpu_nll_backward_f64(double *dx, const double *dloss, int dloss_per_sample, double factor,
                              const int64_t *target, const double *weight, int64_t N, int64_t C,
                              int64_t D, int64_t ignore_index);

/* MSE over n elements: loss_i = (x_i - t_i)^2. loss may be NULL. */
double ddp_cpu_mse_forward_f32(float *loss,     // (n) or NULL
                               const float *x,  // (n)
                               const float *t,  // (n)
                               int64_t n);
double ddp_cpu_mse_forward_f64(double *loss, const double *x, const double *t, int64_t n);

/* dx += 2 (x - t) scale_i and dt -= 2 (x - t) scale_i (either may be NULL). */
void ddp_cpu_mse_backward_f32(float *dx,           // (n) or NULL
                              float *dt,           // (n) or NULL
                              const float *dloss,  // (n) or (1)
                              int dloss_per_element, double factor,
                              const float *x,  // (n)
                              const float *t,  // (n)
                              int64_t n);
void ddp_cpu_mse_backward_f64(double *dx, double *dt, const double *dloss, int dloss_per_element,
                              double factor, const double *x, const double *t, int64_t n);

/* The table entries (runtime/backend/kernels.h): the kernels above chosen by dtype
 * (DDP_F32 or DDP_F64). */
double ddp_cpu_cross_entropy_forward(int dtype, void *loss, void *lse, const void *x,
                                     const int64_t *target, const void *prob, const void *weight,
                                     int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                     double smoothing);
void ddp_cpu_cross_entropy_backward(int dtype, void *dx, const void *dloss, int dloss_per_sample,
                                    double factor, const void *x, const void *lse,
                                    const int64_t *target, const void *prob, const void *weight,
                                    int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                    double smoothing);
double ddp_cpu_nll_forward(int dtype, void *loss, const void *x, const int64_t *target,
                           const void *weight, int64_t N, int64_t C, int64_t D,
                           int64_t ignore_index);
void ddp_cpu_nll_backward(int dtype, void *dx, const void *dloss, int dloss_per_sample,
                          double factor, const int64_t *target, const void *weight, int64_t N,
                          int64_t C, int64_t D, int64_t ignore_index);
double ddp_cpu_mse_forward(int dtype, void *loss, const void *x, const void *t, int64_t n);
void ddp_cpu_mse_backward(int dtype, void *dx, void *dt, const void *dloss, int dloss_per_element,
                          double factor, const void *x, const void *t, int64_t n);

#endif /* DDP_CPU_LOSS_H */
