/* ddplua/ops_loss.h: part of the public API, included by ddplua.h only.
 *
 * Loss functions with PyTorch's semantics (torch.nn.functional.nll_loss, cross_entropy,
 * mse_loss). Layouts: input (N, C) or (N, C, d1, ..., dk) with the classes in dimension 1,
 * or (C) for one sample; class-index targets (N) / (N, d1, ..., dk) / () hold 0-based class
 * numbers 0 .. C-1 (data values, as in PyTorch). Inputs may have any strides. f32 and f64
 * compute natively; f16 and bf16 compute in f32 and return their own dtype.
 */

/* How a loss over many elements becomes the result: NONE keeps one loss per sample (the
 * target's shape), MEAN divides the sum by the op's normaliser (see each op), SUM adds. */
enum ddp_reduction {
  DDP_REDUCTION_NONE = 0,
  DDP_REDUCTION_MEAN = 1,
  DDP_REDUCTION_SUM = 2
};

/* Negative log-likelihood loss on log-probabilities.
 *   input:  (N, C), (N, C, d1, ..., dk) or (C); floating
 *   target: (N), (N, d1, ..., dk) or () accordingly; integer dtype (i64, i32, u8), values in
 *           0 .. C-1 or equal to ignore_index
 *   weight: (C) floating class weights, or NULL for all ones
 * loss_i = -weight[t_i] * input[i, t_i] (0 where t_i == ignore_index). NONE gives the
 * target's shape; SUM the sum; MEAN the sum divided by the sum of weight[t_i] over the
 * non-ignored targets (nan when that is 0, e.g. N = 0), as torch.nn.functional.nll_loss.
 * Differentiable w.r.t. input (not target or weight).
 * Errors (DDP_ERR_ARG): target shape not matching input (names both shapes), floating
 * target, weight not of C elements, unknown reduction, a target outside [0, C) that is not
 * ignore_index (names the value, its position in target and C). */
int ddp_nll_loss(ddp_tensor **out, ddp_tensor *input, ddp_tensor *target, ddp_tensor *weight,
                 int reduction, int64_t ignore_index);

/* Cross-entropy loss on logits: a fused, numerically stable log-softmax over dimension 1
 * (dimension 0 of a (C) input) and the loss in one pass, as
 * torch.nn.functional.cross_entropy. With p = log_softmax(input) and eps = label_smoothing:
 *  - class indices (target as for ddp_nll_loss, integer dtype):
 *      loss_i = (1 - eps) * (-w[t_i] p[i, t_i]) + (eps / C) * (-sum_c w[c] p[i, c]),
 *      0 where t_i == ignore_index; MEAN divides the sum by sum_i w[t_i] over the
 *      non-ignored targets (the count when weight is NULL), as PyTorch;
 *  - class probabilities (target floating, of input's shape; ignore_index must be < 0):
 *      q = (1 - eps) * target + eps / C, loss_i = -sum_c w[c] q[i, c] p[i, c];
 *      MEAN divides the sum by N * d1 * ... * dk (nan when 0).
 * weight: (C) floating or NULL (all ones). label_smoothing in [0, 1].
 * Differentiable w.r.t. input only (the backward is one fused kernel:
 * scale * (softmax * sum_c q_c - q)).
 * Errors (DDP_ERR_ARG): as ddp_nll_loss, plus a floating target whose shape differs from
 * input's, an integer target of input's shape, label_smoothing outside [0, 1],
 * ignore_index >= 0 with probability targets. */
int ddp_cross_entropy(ddp_tensor **out, ddp_tensor *input, ddp_tensor *target,
                      ddp_tensor *weight, int reduction, int64_t ignore_index,
                      double label_smoothing);

/* Mean squared error: (input - target)^2 element-wise, broadcasting input and target
 * (NumPy rules; PyTorch broadcasts too, with a warning). Both floating; the result has
 * their promoted dtype. NONE gives the broadcast shape; MEAN divides the sum by the number
 * of broadcast elements (nan when 0); SUM adds. Differentiable w.r.t. input and target
 * (torch.nn.functional.mse_loss).
 * Errors (DDP_ERR_ARG): shapes that do not broadcast (names both), integer dtypes, unknown
 * reduction. */
int ddp_mse_loss(ddp_tensor **out, ddp_tensor *input, ddp_tensor *target, int reduction);
