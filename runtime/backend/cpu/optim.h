/* runtime/backend/cpu/optim.h: CPU kernels of the fused optimizer updates and of gradient
 * clipping (internal; the front doors in runtime/ops/optim.c check the tensors and make the
 * operands contiguous; the table entries at the end split the work over the thread pool).
 *
 * Every buffer is contiguous and holds n elements; the typed kernels update a range in place,
 * so the entries hand disjoint sub-ranges to different threads. Kernels come in f32 and f64
 * (suffix) and compute in their own precision, as PyTorch's do. Formulas: see
 * ddplua/optim.h (PyTorch's torch.optim documentation). */
#ifndef DDP_CPU_OPTIM_H
#define DDP_CPU_OPTIM_H

#include "backend/kernels.h"

/* Hyper-parameters: ddp_sgd_hparams, ddp_adam_hparams, ddp_adadelta_hparams
 * (runtime/backend/kernels.h). */
/* param (n), momentum_buffer (n; NULL when momentum == 0) <- grad (n). */
void ddp_cpu_sgd_f32(float *restrict param, float *restrict momentum_buffer, const float *restrict grad, int64_t n,
                     const ddp_sgd_hparams *h);
void ddp_cpu_sgd_f64(double *param, double *momentum_buffer, const double *grad, int64_t n,
                     const ddp_sgd_hparams *h);

/* param (n), exp_avg (n), exp_avg_sq (n), max_exp_avg_sq (n; NULL unless amsgrad)
 * <- grad (n). */
void ddp_cpu_adam_f32(float *param, float *exp_avg, float *exp_avg_sq, float *max_exp_avg_sq,
                      const float *grad, int64_t n, const ddp_adam_hparams *h);
void ddp_cpu_adam_f64(double *param, double *exp_avg, double *exp_avg_sq,
                      double *max_exp_avg_sq, const double *grad, int64_t n,
                      const ddp_adam_hparams *h);

/* param (n), square_avg (n), acc_delta (n) <- grad (n). */
void ddp_cpu_adadelta_f32(float *param, float *square_avg, float *acc_delta, const float *grad,
                          int64_t n, const ddp_adadelta_hparams *h);
void ddp_cpu_adadelta_f64(double *param, double *square_avg, double *acc_delta,
                          const double *grad, int64_t n, const ddp_adadelta_hparams *h);

/* sum |x|^p over x (n) in double (p == 2 and p == 1 take fast paths). */
double ddp_cpu_abs_pow_sum_f32(const float *x, int64_t n, double p);
double ddp_cpu_abs_pow_sum_f64(const double *x, int64_t n, double p);

/* max |x| over x (n) (0 for n == 0; NaN when any element is NaN, as torch.norm(inf)). */
double ddp_cpu_abs_max_f32(const float *x, int64_t n);
double ddp_cpu_abs_max_f64(const double *x, int64_t n);

/* x (n) *= s. */
void ddp_cpu_scale_f32(float *x, int64_t n, double s);
void ddp_cpu_scale_f64(double *x, int64_t n, double s);

/* x (n) <- min(max(x, lo), hi) (NaN kept). */
void ddp_cpu_clamp_f32(float *x, int64_t n, double lo, double hi);
void ddp_cpu_clamp_f64(double *x, int64_t n, double lo, double hi);

/* GradScaler's unscale (Note [unscale in one pass], optim.c): x (n) *= inv_scale (rounded to
 * the element type first); returns 1 when any element was inf or NaN, else 0. */
int ddp_cpu_unscale_f32(float *x, int64_t n, double inv_scale);
int ddp_cpu_unscale_f64(double *x, int64_t n, double inv_scale);

/* The table entries (runtime/backend/kernels.h): dtype DDP_F32 or DDP_F64, whole contiguous
 * buffers of n elements. Each splits its work over the thread pool (the updates, scale and
 * clamp by element ranges; the norms by fixed blocks of CLIP_BLOCK elements whose partial
 * results are combined in block order, so they do not depend on the thread count).
 * abs_pow_sum and abs_max record an error and return NaN when out of memory. */
void ddp_cpu_sgd(int dtype, void *param, void *momentum_buffer, const void *grad, int64_t n,
                 const ddp_sgd_hparams *h);
/* The SGD update of `count` parameters as one job over the pool (Note [multi-tensor SGD]
 * in optim.c): param[i], momentum_buffer[i] (NULL when momentum == 0), grad[i] hold
 * numel[i] elements each; first_step[i] stands for h->first_step of parameter i. */
void ddp_cpu_sgd_multi(int dtype, int64_t count, void *const *param, void *const *momentum_buffer,
                       const void *const *grad, const int64_t *numel, const int *first_step,
                       const ddp_sgd_hparams *h);
void ddp_cpu_adam(int dtype, void *param, void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
                  const void *grad, int64_t n, const ddp_adam_hparams *h);
void ddp_cpu_adadelta(int dtype, void *param, void *square_avg, void *acc_delta, const void *grad,
                      int64_t n, const ddp_adadelta_hparams *h);
double ddp_cpu_abs_pow_sum(int dtype, const void *x, int64_t n, double p);
double ddp_cpu_abs_max(int dtype, const void *x, int64_t n);
void ddp_cpu_scale(int dtype, void *x, int64_t n, double s);
void ddp_cpu_clamp(int dtype, void *x, int64_t n, double lo, double hi);
/* 1.0 when x held an inf or NaN, else 0.0; x scaled in place either way; NaN (error
 * recorded) when out of memory. */
double ddp_cpu_non_finite_check_and_unscale(int dtype, void *x, int64_t n, double inv_scale);

#endif /* DDP_CPU_OPTIM_H */
