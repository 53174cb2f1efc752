/* runtime/backend/cpu/reduce.h: CPU kernels of the reductions and softmax.
 *
 * Every kernel sees its input as a contiguous (A, R, B) block and reduces R: A counts the
 * kept slices before the reduced block, B the kept elements after it (B = 1: row
 * reductions over the last dims; A = 1: column reductions over the leading dims, which
 * run vectorised across B). Outputs are contiguous (A, B). Kernels split the work over
 * the thread pool themselves (ddp_parallel_for), by output slices or, for one long row,
 * by fixed blocks (so results never depend on the thread count).
 * See Note [reduction accumulation] in ddplua/ops_reduce.h. */
#ifndef DDP_CPU_REDUCE_H
#define DDP_CPU_REDUCE_H

#include "backend/kernels.h"

/* Sum modes: enum ddp_sum_mode (runtime/backend/kernels.h). */
void ddp_cpu_sum_f32(float *out,          // (A, B)
                     const float *x,      // (A, R, B)
                     int64_t A, int64_t R, int64_t B, int mode, double scale);
void ddp_cpu_sum_f64(double *out,         // (A, B)
                     const double *x,     // (A, R, B)
                     int64_t A, int64_t R, int64_t B, int mode, double scale);
void ddp_cpu_sum_i64(int64_t *out,        // (A, B)
                     const int64_t *x,    // (A, R, B)
                     int64_t A, int64_t R, int64_t B);

/* out = sum((x - mean)^2) / (R - correction), its square root when take_sqrt. */
void ddp_cpu_var_f32(float *out,          // (A, B)
                     const float *x,      // (A, R, B)
                     int64_t A, int64_t R, int64_t B, double correction, int take_sqrt);
void ddp_cpu_var_f64(double *out,         // (A, B)
                     const double *x,     // (A, R, B)
                     int64_t A, int64_t R, int64_t B, double correction, int take_sqrt);

/* Extreme along R (R >= 1): values and 0-based index of the first occurrence; NaN wins.
 * is_max 1: largest, 0: smallest. u8 serves u8 and bool. */
void ddp_cpu_argext_f32(float *values, int64_t *indices,      // (A, B), (A, B)
                        const float *x,                       // (A, R, B)
                        int64_t A, int64_t R, int64_t B, int is_max);
void ddp_cpu_argext_f64(double *values, int64_t *indices,     // (A, B), (A, B)
                        const double *x,                      // (A, R, B)
                        int64_t A, int64_t R, int64_t B, int is_max);
void ddp_cpu_argext_i64(int64_t *values, int64_t *indices,    // (A, B), (A, B)
                        const int64_t *x,                     // (A, R, B)
                        int64_t A, int64_t R, int64_t B, int is_max);
void ddp_cpu_argext_i32(int32_t *values, int64_t *indices,    // (A, B), (A, B)
                        const int32_t *x,                     // (A, R, B)
                        int64_t A, int64_t R, int64_t B, int is_max);
void ddp_cpu_argext_u8(uint8_t *values, int64_t *indices,     // (A, B), (A, B)
                       const uint8_t *x,                      // (A, R, B)
                       int64_t A, int64_t R, int64_t B, int is_max);

/* Softmax (log = 0) or log_softmax (log = 1) along R, max subtracted first. */
void ddp_cpu_softmax_f32(float *y,        // (A, R, B)
                         const float *x,  // (A, R, B)
                         int64_t A, int64_t R, int64_t B, int log);
void ddp_cpu_softmax_f64(double *y,       // (A, R, B)
                         const double *x, // (A, R, B)
                         int64_t A, int64_t R, int64_t B, int log);

/* Backward, accumulated into dx: softmax dx += y * (dy - sum(dy * y));
 * log_softmax dx += dy - exp(y) * sum(dy). */
void ddp_cpu_softmax_backward_f32(float *dx,        // (A, R, B)
                                  const float *y,   // (A, R, B)
                                  const float *dy,  // (A, R, B)
                                  int64_t A, int64_t R, int64_t B, int log);
void ddp_cpu_softmax_backward_f64(double *dx,       // (A, R, B)
                                  const double *y,  // (A, R, B)
                                  const double *dy, // (A, R, B)
                                  int64_t A, int64_t R, int64_t B, int log);

/* The table entries (runtime/backend/kernels.h): the kernels above chosen by dtype. */
void ddp_cpu_sum(int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B, int mode,
                 double scale);
void ddp_cpu_var(int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B,
                 double correction, int take_sqrt);
void ddp_cpu_argext(int dtype, void *values, int64_t *indices, const void *x, int64_t A,
                    int64_t R, int64_t B, int is_max);
void ddp_cpu_softmax(int dtype, void *y, const void *x, int64_t A, int64_t R, int64_t B, int log);
void ddp_cpu_softmax_backward(int dtype, void *dx, const void *y, const void *dy, int64_t A,
                              int64_t R, int64_t B, int log);

#endif /* DDP_CPU_REDUCE_H */
