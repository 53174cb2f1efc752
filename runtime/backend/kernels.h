/* runtime/backend/kernels.h: the kernel table, one per device type. The ops layer finds
 * its kernels through ddp_kernels_for(device) instead of calling the CPU backend directly,
 * so the same front doors (shape checks, dtype promotion, autograd) drive the CPU kernels
 * and the CUDA plug-in's.
 *
 * Every entry has the signature of the CPU kernel of the same name (ddp_cpu_<name> in
 * runtime/backend/cpu/<area>.h, where each is documented): pointers are device pointers
 * for a CUDA table, and a CUDA kernel runs on the current stream of the current device
 * (asynchronously, unless its result is returned to the host, as the loss totals are).
 *
 * An entry may be NULL in a device table: that op has no kernel there yet, and the ops
 * layer fails with "<op>: not implemented for cuda tensors" (DDP_KERNEL below).
 *
 * A kernel cannot fail on the CPU. On a GPU a launch can: after calling into a device
 * table the ops layer calls ddp_device_check(device, op), which turns a pending CUDA error
 * into a DDP error naming the op. */
#ifndef DDP_BACKEND_KERNELS_H
#define DDP_BACKEND_KERNELS_H

#include "backend/cpu/conv.h"
#include "backend/cpu/optim.h"
#include "backend/cpu/pool.h"
#include "core/core.h"

typedef struct ddp_kernels {
  const char *name; /* "cpu" or "cuda": for messages */
  /* ---- copies and fills (runtime/backend/cpu/copy.h) ---- */
  void (*copy)(ddp_tensor *dst, const ddp_tensor *src);
  void (*fill)(ddp_tensor *t, double value);
  /* ---- elementwise (runtime/backend/cpu/elementwise.h) ---- */
  void (*binary)(ddp_tensor *out, ddp_tensor *a, ddp_tensor *b, int op, double alpha);
  void (*binary_backward)(ddp_tensor *d, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b, int op,
                          int wrt, double alpha);
  void (*unary)(ddp_tensor *out, ddp_tensor *x, int op, double p0, double p1);
  void (*unary_backward)(ddp_tensor *d, ddp_tensor *g, ddp_tensor *s, int op, double p0, double p1);
  void (*where)(ddp_tensor *out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b);
  /* ---- reduce (runtime/backend/cpu/reduce.h) ---- */
  void (*sum_f32)(float *out, const float *x, int64_t A, int64_t R, int64_t B, int mode,
                  double scale);
  void (*sum_f64)(double *out, const double *x, int64_t A, int64_t R, int64_t B, int mode,
                  double scale);
  void (*sum_i64)(int64_t *out, const int64_t *x, int64_t A, int64_t R, int64_t B);
  void (*var_f32)(float *out, const float *x, int64_t A, int64_t R, int64_t B, double correction,
                  int take_sqrt);
  void (*var_f64)(double *out, const double *x, int64_t A, int64_t R, int64_t B, double correction,
                  int take_sqrt);
  void (*argext_f32)(float *values, int64_t *indices, const float *x, int64_t A, int64_t R,
                     int64_t B, int is_max);
  void (*argext_f64)(double *values, int64_t *indices, const double *x, int64_t A, int64_t R,
                     int64_t B, int is_max);
  void (*argext_i64)(int64_t *values, int64_t *indices, const int64_t *x, int64_t A, int64_t R,
                     int64_t B, int is_max);
  void (*argext_i32)(int32_t *values, int64_t *indices, const int32_t *x, int64_t A, int64_t R,
                     int64_t B, int is_max);
  void (*argext_u8)(uint8_t *values, int64_t *indices, const uint8_t *x, int64_t A, int64_t R,
                    int64_t B, int is_max);
  void (*softmax_f32)(float *y, const float *x, int64_t A, int64_t R, int64_t B, int log);
  void (*softmax_f64)(double *y, const double *x, int64_t A, int64_t R, int64_t B, int log);
  void (*softmax_backward_f32)(float *dx, const float *y, const float *dy, int64_t A, int64_t R,
                               int64_t B, int log);
  void (*softmax_backward_f64)(double *dx, const double *y, const double *dy, int64_t A, int64_t R,
                               int64_t B, int log);
  /* ---- matmul (runtime/backend/cpu/matmul.h) ---- */
  void (*gemm)(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
               int64_t ldc);
  void (*matmul_int)(int dtype, void *c, const void *a, int64_t sa0, int64_t sa1, const void *b,
                     int64_t sb0, int64_t sb1, int64_t m, int64_t n, int64_t k);
  /* ---- conv (runtime/backend/cpu/conv.h) ---- */
  int (*conv2d_forward)(int dtype, void *out, const void *in, const void *w, const void *bias,
                        const ddp_conv2d_geom *g);
  int (*conv2d_backward)(int dtype, void *d_in, void *d_w, void *d_b, const void *grad_out,
                         const void *in, const void *w, const ddp_conv2d_geom *g);
  /* ---- pool (runtime/backend/cpu/pool.h) ---- */
  void (*max_pool2d_forward)(int dtype, void *out, int64_t *indices, const void *in,
                             const ddp_pool2d_geom *g);
  void (*max_pool2d_backward)(int dtype, void *d_in, const void *grad_out, const int64_t *indices,
                              const ddp_pool2d_geom *g);
  void (*avg_pool2d_forward)(int dtype, void *out, const void *in, const ddp_pool2d_geom *g);
  void (*avg_pool2d_backward)(int dtype, void *d_in, const void *grad_out,
                              const ddp_pool2d_geom *g);
  void (*adaptive_avg_pool2d_forward)(int dtype, void *out, const void *in,
                                      const ddp_pool2d_geom *g);
  void (*adaptive_avg_pool2d_backward)(int dtype, void *d_in, const void *grad_out,
                                       const ddp_pool2d_geom *g);
  /* ---- loss (runtime/backend/cpu/loss.h) ---- */
  double (*cross_entropy_forward_f32)(float *loss, float *lse, const float *x,
                                      const int64_t *target, const float *prob, const float *weight,
                                      int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                      double smoothing);
  double (*cross_entropy_forward_f64)(double *loss, double *lse, const double *x,
                                      const int64_t *target, const double *prob,
                                      const double *weight, int64_t N, int64_t C, int64_t D,
                                      int64_t ignore_index, double smoothing);
  void (*cross_entropy_backward_f32)(float *dx, const float *dloss, int dloss_per_sample,
                                     double factor, const float *x, const float *lse,
                                     const int64_t *target, const float *prob, const float *weight,
                                     int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                     double smoothing);
  void (*cross_entropy_backward_f64)(double *dx, const double *dloss, int dloss_per_sample,
                                     double factor, const double *x, const double *lse,
                                     const int64_t *target, const double *prob,
                                     const double *weight, int64_t N, int64_t C, int64_t D,
                                     int64_t ignore_index, double smoothing);
  double (*nll_forward_f32)(float *loss, const float *x, const int64_t *target, const float *weight,
                            int64_t N, int64_t C, int64_t D, int64_t ignore_index);
  double (*nll_forward_f64)(double *loss, const double *x, const int64_t *target,
                            const double *weight, int64_t N, int64_t C, int64_t D,
                            int64_t ignore_index);
  void (*nll_backward_f32)(float *dx, const float *dloss, int dloss_per_sample, double factor,
                           const int64_t *target, const float *weight, int64_t N, int64_t C,
                           int64_t D, int64_t ignore_index);
  void (*nll_backward_f64)(double *dx, const double *dloss, int dloss_per_sample, double factor,
                           const int64_t *target, const double *weight, int64_t N, int64_t C,
                           int64_t D, int64_t ignore_index);
  double (*mse_forward_f32)(float *loss, const float *x, const float *t, int64_t n);
  double (*mse_forward_f64)(double *loss, const double *x, const double *t, int64_t n);
  void (*mse_backward_f32)(float *dx, float *dt, const float *dloss, int dloss_per_element,
                           double factor, const float *x, const float *t, int64_t n);
  void (*mse_backward_f64)(double *dx, double *dt, const double *dloss, int dloss_per_element,
                           double factor, const double *x, const double *t, int64_t n);
  /* ---- norm (runtime/backend/cpu/norm.h) ---- */
  void (*bn_moments_f32)(double *mean, double *var, const float *x, int64_t N, int64_t C,
                         int64_t S);
  void (*bn_moments_f64)(double *mean, double *var, const double *x, int64_t N, int64_t C,
                         int64_t S);
  void (*bn_sums_f32)(double *sum, double *sumsq, const float *x, int64_t N, int64_t C, int64_t S);
  void (*bn_sums_f64)(double *sum, double *sumsq, const double *x, int64_t N, int64_t C, int64_t S);
  void (*bn_apply_f32)(float *y, const float *x, const float *mean, const float *scale,
                       const float *shift, int64_t N, int64_t C, int64_t S);
  void (*bn_apply_f64)(double *y, const double *x, const double *mean, const double *scale,
                       const double *shift, int64_t N, int64_t C, int64_t S);
  void (*bn_backward_reduce_f32)(double *sum_dy, double *sum_dy_xmu, const float *dy,
                                 const float *x, const float *mean, int64_t N, int64_t C,
                                 int64_t S);
  void (*bn_backward_reduce_f64)(double *sum_dy, double *sum_dy_xmu, const double *dy,
                                 const double *x, const double *mean, int64_t N, int64_t C,
                                 int64_t S);
  void (*bn_backward_elemt_f32)(float *dx, const float *dy, const float *x, const float *mean,
                                const float *a, const float *b, const float *d, int64_t N,
                                int64_t C, int64_t S);
  void (*bn_backward_elemt_f64)(double *dx, const double *dy, const double *x, const double *mean,
                                const double *a, const double *b, const double *d, int64_t N,
                                int64_t C, int64_t S);
  void (*bn_finalize_f32)(float *mean_out, float *scale, float *shift, float *invstd,
                          const double *mean, const double *var, const float *w, const float *b,
                          int64_t C, double eps);
  void (*bn_finalize_f64)(double *mean_out, double *scale, double *shift, double *invstd,
                          const double *mean, const double *var, const double *w,
                          const double *b, int64_t C, double eps);
  void (*bn_running_update_f32)(float *running, const double *value, int64_t C, double momentum,
                                double correction);
  void (*bn_running_update_f64)(double *running, const double *value, int64_t C,
                                double momentum, double correction);
  void (*bn_backward_coef_f32)(float *a, float *b, float *d, float *dweight, float *dbias,
                               const double *sum_dy, const double *sum_dy_xmu,
                               const float *invstd, const float *w, int64_t C, double M,
                               int training);
  void (*bn_backward_coef_f64)(double *a, double *b, double *d, double *dweight, double *dbias,
                               const double *sum_dy, const double *sum_dy_xmu,
                               const double *invstd, const double *w, int64_t C, double M,
                               int training);
  void (*ln_forward_f32)(float *y, float *mean, float *rstd, const float *x, const float *w,
                         const float *b, int64_t M, int64_t D, double eps);
  void (*ln_forward_f64)(double *y, double *mean, double *rstd, const double *x, const double *w,
                         const double *b, int64_t M, int64_t D, double eps);
  void (*ln_backward_f32)(float *dx, float *dw, float *db, const float *dy, const float *x,
                          const float *mean, const float *rstd, const float *w, int64_t M,
                          int64_t D);
  void (*ln_backward_f64)(double *dx, double *dw, double *db, const double *dy, const double *x,
                          const double *mean, const double *rstd, const double *w, int64_t M,
                          int64_t D);
  void (*masked_scale_f32)(float *y, const float *x, const uint8_t *mask, float scale, int64_t n);
  void (*masked_scale_f64)(double *y, const double *x, const uint8_t *mask, double scale,
                           int64_t n);
  void (*embedding_forward)(char *out, const char *weight, const int64_t *idx, int64_t n,
                            int64_t row_bytes);
  void (*embedding_backward_f32)(float *dweight, const float *dy, const int64_t *idx, int64_t n,
                                 int64_t D, int64_t padding_idx);
  void (*embedding_backward_f64)(double *dweight, const double *dy, const int64_t *idx, int64_t n,
                                 int64_t D, int64_t padding_idx);
  /* ---- optim (runtime/backend/cpu/optim.h) ---- */
  void (*sgd_f32)(float *param, float *momentum_buffer, const float *grad, int64_t n,
                  const ddp_sgd_hparams *h);
  void (*sgd_f64)(double *param, double *momentum_buffer, const double *grad, int64_t n,
                  const ddp_sgd_hparams *h);
  void (*adam_f32)(float *param, float *exp_avg, float *exp_avg_sq, float *max_exp_avg_sq,
                   const float *grad, int64_t n, const ddp_adam_hparams *h);
  void (*adam_f64)(double *param, double *exp_avg, double *exp_avg_sq, double *max_exp_avg_sq,
                   const double *grad, int64_t n, const ddp_adam_hparams *h);
  void (*adadelta_f32)(float *param, float *square_avg, float *acc_delta, const float *grad,
                       int64_t n, const ddp_adadelta_hparams *h);
  void (*adadelta_f64)(double *param, double *square_avg, double *acc_delta, const double *grad,
                       int64_t n, const ddp_adadelta_hparams *h);
  double (*abs_pow_sum_f32)(const float *x, int64_t n, double p);
  double (*abs_pow_sum_f64)(const double *x, int64_t n, double p);
  double (*abs_max_f32)(const float *x, int64_t n);
  double (*abs_max_f64)(const double *x, int64_t n);
  void (*scale_f32)(float *x, int64_t n, double s);
  void (*scale_f64)(double *x, int64_t n, double s);
  void (*clamp_f32)(float *x, int64_t n, double lo, double hi);
  void (*clamp_f64)(double *x, int64_t n, double lo, double hi);
  /* ---- shape (runtime/backend/cpu/shape.h) ---- */
  void (*copy_rows)(char *dst, const char *src, int64_t outer, int64_t dst_row, int64_t dst_col,
                    int64_t src_row);
  void (*index_select)(char *out, const char *in, const int64_t *index, int64_t outer, int64_t size,
                       int64_t inner, int64_t n_index, size_t esize);
  void (*index_add)(char *dst, const char *src, const int64_t *index, int64_t outer, int64_t size,
                    int64_t inner, int64_t n_index, int dtype);
  void (*gather)(char *out, const int64_t *out_strides, const char *in, const int64_t *in_strides,
                 const int64_t *index, int ndim, const int64_t *shape, int dim, size_t esize);
  void (*scatter_add)(char *self, const int64_t *self_strides, const char *src,
                      const int64_t *src_strides, const int64_t *index, int ndim,
                      const int64_t *shape, int dim, int dtype);
} ddp_kernels;

/* The CPU table (runtime/backend/cpu/kernels.c): every entry set. */
extern const ddp_kernels ddp_cpu_kernels;

/* The table for `device`: the CPU's for DDP_DEVICE_CPU, the CUDA plug-in's otherwise.
 * Callers have checked the device (ddp_check_device) first: for a CUDA device with no
 * plug-in loaded this returns NULL. */
const ddp_kernels *ddp_kernels_for(int device);

/* After device kernels ran: DDP_OK, or the pending device error as a DDP error prefixed
 * with `op`. Free on the CPU. */
int ddp_device_check(int device, const char *op);

/* Record "<op>: not implemented for <device> tensors (kernel <kernel>)" and return its
 * status (DDP_ERR_UNAVAILABLE). k may be NULL (no plug-in). */
int ddp_kernel_missing(const ddp_kernels *k, const char *kernel, const char *op);

/* DDP_OK when table k has the kernel `name`, else the error of ddp_kernel_missing. */
#define DDP_KERNEL_CHECK(k, name, op) \
  ((k) && (k)->name ? DDP_OK : ddp_kernel_missing((k), #name, (op)))

/* fn = the kernel `name` for `device`, or return the ddp_kernel_missing error from the
 * enclosing function. */
#define DDP_KERNEL(fn, device, name, op)                                                   \
  do {                                                                                     \
    const ddp_kernels *ddp_k_ = ddp_kernels_for(device);                                   \
    DDP_TRY(DDP_KERNEL_CHECK(ddp_k_, name, op));                                           \
    (fn) = ddp_k_->name;                                                                   \
  } while (0)

#endif /* DDP_BACKEND_KERNELS_H */
