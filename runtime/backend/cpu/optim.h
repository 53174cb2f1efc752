/* runtime/backend/cpu/optim.h: CPU kernels of the fused optimizer updates and of gradient
 * clipping (internal; the front doors in runtime/ops/optim.c check the tensors, make the
 * operands contiguous and split the work over the thread pool).
 *
 * Every buffer is contiguous and holds n elements; kernels update a range in place, so a
 * caller may hand disjoint sub-ranges to different threads. Kernels come in f32 and f64
 * (suffix) and compute in their own precision, as PyTorch's do. Formulas: see
 * ddplua/optim.h (PyTorch's torch.optim documentation). */
#ifndef DDP_CPU_OPTIM_H
#define DDP_CPU_OPTIM_H

#include <stdint.h>

/* Hyper-parameters of one SGD update (see ddp_sgd_step_). */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
  int first_step; /* 1: the momentum buffer is created now (b <- g) */
} ddp_sgd_hparams;

/* Hyper-parameters of one Adam / AdamW update, with the bias corrections of step t
 * precomputed: step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  double step_size, bc2_sqrt;
  int decoupled; /* 1: AdamW, p *= 1 - lr * weight_decay; 0: Adam, g += weight_decay * p */
  int amsgrad, maximize;
} ddp_adam_hparams;

/* Hyper-parameters of one Adadelta update. */
typedef struct {
  double lr, rho, eps, weight_decay;
  int maximize;
} ddp_adadelta_hparams;

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

#endif /* DDP_CPU_OPTIM_H */
