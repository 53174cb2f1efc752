/* runtime/backend/cpu/elementwise.h: CPU kernels of the element-wise ops (internal).
 *
 * Every kernel takes tensors that already have the output's shape: broadcast operands come
 * in as stride-0 views (header-only views made by the caller), and scalars as stride-0
 * one-element views. The loops run through ddp_foreach, which coalesces dimensions, so
 * contiguous operands give one long run; that run has tight loops the compiler vectorises
 * when every operand has the same dtype (f32, f64, i64, i32), and a general path through
 * double for mixed dtypes, f16, bf16, u8 and bool (f16/bf16 thus compute in higher
 * precision and round once when stored). Big tensors are split over the thread pool.
 *
 * Device tables (runtime/backend/kernels.h) take the same arguments with device memory;
 * there an input may also be a host scalar: a stride-0 one-element view of host memory
 * with device DDP_DEVICE_CPU (the ops layer's number operands and 0-d CPU tensors), whose
 * value the device kernel reads on the host (runtime/backend/cuda/elementwise.cu). The
 * CPU kernels need no such distinction. */
#ifndef DDP_CPU_ELEMENTWISE_H
#define DDP_CPU_ELEMENTWISE_H

#include "backend/kernels.h"

/* Op codes: enum ddp_ew_binary and enum ddp_ew_unary (runtime/backend/kernels.h). */

/* out = a op b. out: (*) of any dtype (bool for comparisons); a, b: views of out's shape
 * (*), any dtypes. out may be a itself (in-place). */
void ddp_cpu_binary(ddp_tensor *out, ddp_tensor *a, ddp_tensor *b, int op, double alpha);

/* d = g * d(a op b)/d(a) (wrt = 0) or d/d(b) (wrt = 1), for op ADD .. MIN. d: (*) fresh,
 * written (not accumulated: it is a new tensor handed to the engine); g, a, b: views of
 * d's shape (*). Gradients of pow and maximum/minimum follow PyTorch's derivatives.yaml
 * (pow: 0 where the exponent is 0, resp. where a == 0 and b >= 0; ties share half). */
void ddp_cpu_binary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b, int op,
                             int wrt, double alpha);

/* out = f(x). out: (*), x: (*) (out may be x: in-place). */
void ddp_cpu_unary(ddp_tensor *out, ddp_tensor *x, int op, double p0, double p1);

/* d = g * f'(.) where s is the saved input x or output y as ddp_ew_unary_uses_output says.
 * d: (*) fresh, written; g, s: (*). */
void ddp_cpu_unary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *s, int op, double p0,
                            double p1);

/* out = cond ? a : b. out: (*); cond: (*) bool/u8 view; a, b: (*) views, any dtypes. */
void ddp_cpu_where(ddp_tensor *out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b);

#endif /* DDP_CPU_ELEMENTWISE_H */
