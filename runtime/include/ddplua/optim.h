/* ddplua/optim.h: part of the public API, included by ddplua.h only.
 *
 * Fused optimizer updates and gradient clipping (runtime/ops/optim.c, kernels in
 * runtime/backend/cpu/optim.c and runtime/backend/cuda/optim.cu). Each update makes one pass
 * over a parameter, reading its gradient and the optimizer state and writing the parameter
 * and the state in place.
 *
 * Common contract of the ddp_*_step_ calls:
 *  - `param` is updated in place without autograd (as under torch.no_grad(): no node is
 *    recorded, a leaf that requires grad is accepted) and its version counter is bumped;
 *    so is each state tensor's.
 *  - `grad` and every state tensor must have param's shape and dtype (any strides: non-
 *    contiguous operands are worked on through a contiguous copy written back after).
 *  - State tensors belong to the caller. The optimizers keep theirs in an optimizer-state
 *    store (ddplua/optim_state.h), whose ddp_optim_step_param creates them (zeros of the
 *    param's shape, dtype and device) and calls these kernels.
 *  - dtypes: f32 and f64 natively; f16 and bf16 are computed through f32 (each operand
 *    converted to f32, updated, rounded back, so the state keeps the param's dtype as in
 *    PyTorch). Other dtypes fail with DDP_ERR_ARG.
 *  - `maximize` != 0 negates the gradient before anything else (g <- -grad), as PyTorch's
 *    implementation does and as its Adam/AdamW/Adadelta pages write it.
 *  - Devices: param, grad and every state tensor live on one device (CPU or cuda:k), where
 *    the update runs; another device is DDP_ERR_ARG naming the argument and both devices.
 *    Clipping takes gradients spread over several devices (each one's norm is computed on
 *    its device and summed on the host, in double).
 *  - Errors (DDP_ERR_ARG) name the call and the argument: freed tensors, shape or dtype
 *    mismatch, a missing state tensor, a bad hyper-parameter.
 * Formulas: the algorithm boxes of PyTorch's documentation,
 * https://pytorch.org/docs/stable/generated/torch.optim.<Name>.html.
 */

/* SGD (torch.optim.SGD), for t = 1, 2, ... with lr gamma, momentum mu, dampening tau,
 * weight decay lambda:
 *   g <- grad (negated when maximize); if lambda != 0: g <- g + lambda * p
 *   if mu != 0: b <- g when first_step != 0 (the buffer is created holding g, not damped),
 *               else b <- mu * b + (1 - tau) * g;
 *               g <- g + mu * b when nesterov, else g <- b
 *   p <- p - gamma * g
 * param, grad: any shape (*). momentum_buffer: (*) like param, required when momentum != 0
 * (may be NULL otherwise). nesterov requires momentum > 0 and dampening == 0 (else
 * DDP_ERR_ARG). Note: PyTorch's SGD page writes `maximize` as `p <- p + gamma * g` on the
 * last line; its implementation (followed here) negates the gradient first; the two differ
 * only when weight_decay != 0. */
int ddp_sgd_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *momentum_buffer, double lr,
                  double momentum, double dampening, double weight_decay, int nesterov,
                  int maximize, int first_step);

/* The SGD step of n parameters in one call (PyTorch's foreach / fused SGD): for each i,
 * exactly ddp_sgd_step_(param[i], grad[i], momentum_buffer[i], lr, momentum, dampening,
 * weight_decay, nesterov, maximize, first_step[i]), bit for bit, with the same checks.
 * param, grad: n tensors each; momentum_buffer: n tensors when momentum != 0 (may be NULL
 * otherwise); first_step: n flags. Every argument is checked before any parameter changes
 * (errors name the call and the entry, e.g. "grad[3]"). When all tensors are contiguous
 * CPU tensors of one dtype (f32 or f64) the update is one job over the thread pool (Note
 * [multi-tensor SGD], runtime/backend/cpu/optim.c); otherwise the parameters are stepped
 * one by one. n == 0 does nothing. */
int ddp_sgd_step_foreach_(int64_t n, ddp_tensor *const *param, ddp_tensor *const *grad,
                          ddp_tensor *const *momentum_buffer, const int *first_step, double lr,
                          double momentum, double dampening, double weight_decay, int nesterov,
                          int maximize);

/* Adam (torch.optim.Adam) at step `step` (t >= 1, counting this update), lr gamma, betas
 * (beta1, beta2), eps, weight decay lambda (L2, added to the gradient):
 *   g <- grad (negated when maximize); if lambda != 0: g <- g + lambda * p
 *   m <- beta1 * m + (1 - beta1) * g
 *   v <- beta2 * v + (1 - beta2) * g^2
 *   m_hat <- m / (1 - beta1^t)
 *   amsgrad: v_max <- max(v_max, v); v_hat <- v_max / (1 - beta2^t)
 *   else:    v_hat <- v / (1 - beta2^t)
 *   p <- p - gamma * m_hat / (sqrt(v_hat) + eps)
 * param, grad, exp_avg (m), exp_avg_sq (v): (*). max_exp_avg_sq (v_max): (*), required when
 * amsgrad != 0, else may be NULL. Errors: step < 1, lr < 0, eps < 0, betas outside [0, 1),
 * weight_decay < 0. */
int ddp_adam_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *exp_avg,
                   ddp_tensor *exp_avg_sq, ddp_tensor *max_exp_avg_sq, int64_t step, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int amsgrad,
                   int maximize);

/* AdamW (torch.optim.AdamW; Loshchilov & Hutter, "Decoupled Weight Decay Regularization"):
 * as ddp_adam_step_ except that weight decay is decoupled from the gradient: first
 *   p <- p - gamma * lambda * p   (i.e. p *= 1 - lr * weight_decay)
 * then the Adam update with g <- grad (negated when maximize), no L2 term. Same arguments and
 * errors as ddp_adam_step_. */
int ddp_adamw_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *exp_avg,
                    ddp_tensor *exp_avg_sq, ddp_tensor *max_exp_avg_sq, int64_t step, double lr,
                    double beta1, double beta2, double eps, double weight_decay, int amsgrad,
                    int maximize);

/* Adadelta (torch.optim.Adadelta; Zeiler, "ADADELTA: an adaptive learning rate method"),
 * lr gamma, rho, eps, weight decay lambda:
 *   g <- grad (negated when maximize); if lambda != 0: g <- g + lambda * p
 *   v <- rho * v + (1 - rho) * g^2
 *   dx <- sqrt(u + eps) / sqrt(v + eps) * g
 *   u <- rho * u + (1 - rho) * dx^2
 *   p <- p - gamma * dx
 * param, grad, square_avg (v), acc_delta (u): (*). Errors: lr < 0, rho outside [0, 1],
 * eps < 0, weight_decay < 0. */
int ddp_adadelta_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *square_avg,
                       ddp_tensor *acc_delta, double lr, double rho, double eps,
                       double weight_decay, int maximize);

/* torch.nn.utils.clip_grad_norm_ over the n tensors grads[0..n-1] (floating, any shapes; n
 * may be 0): the total norm of order norm_type (> 0, or +inf: the largest |g|) of all their
 * elements taken together, i.e. the norm of the vector of per-tensor norms, accumulated in
 * double, into *total_norm. Then, as PyTorch, coef = max_norm / (total + 1e-6) and, when
 * coef < 1, every gradient is scaled in place by coef (versions bumped); when the total is
 * NaN, coef is NaN and the gradients become NaN as in PyTorch. error_if_nonfinite != 0 makes
 * a NaN or infinite total a DDP_ERR_ARG error before anything is scaled. Errors: NULL or
 * freed grads[i], a non-floating gradient, norm_type <= 0 or NaN. */
int ddp_clip_grad_norm_(double *total_norm, ddp_tensor **grads, int n, double max_norm,
                        double norm_type, int error_if_nonfinite);

/* torch.nn.utils.clip_grad_value_: clamp every element of grads[0..n-1] in place into
 * [-clip_value, clip_value] (NaN stays NaN). Errors: clip_value < 0 or NaN (PyTorch does not
 * check; a negative bound has no meaning), NULL or freed or non-floating grads[i]. */
int ddp_clip_grad_value_(ddp_tensor **grads, int n, double clip_value);

/* GradScaler's unscale_ (PyTorch's torch._amp_foreach_non_finite_check_and_unscale_): every
 * element of grads[0..n-1] (floating, any shapes and devices; n may be 0) is multiplied in
 * place by inv_scale (versions bumped), and *found_inf is set to 1 when any element was inf or
 * NaN before the multiplication, else 0. One pass over each gradient through its device's
 * kernel table (Note [unscale in one pass], runtime/backend/cpu/optim.c); f16/bf16 gradients
 * are computed in f32 and rounded once. Errors: NULL found_inf, inf or NaN inv_scale, NULL or
 * freed or non-floating grads[i]. */
int ddp_amp_unscale_(int *found_inf, ddp_tensor **grads, int n, double inv_scale);
