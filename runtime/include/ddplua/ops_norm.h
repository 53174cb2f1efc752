/* ddplua/ops_norm.h: part of the public API, included by ddplua.h only.
 *
 * Normalisation, dropout and embedding (runtime/ops/norm.c, kernels in
 * runtime/backend/cpu/norm.c). Every op here is differentiable unless said otherwise.
 * Floating inputs only (f32, f64 natively; f16 and bf16 computed through f32), CPU.
 */

/* Batch normalisation (Ioffe, Szegedy 2015, "Batch Normalization: Accelerating Deep Network
 * Training by Reducing Internal Covariate Shift"), with PyTorch's semantics.
 *
 *   input:        (N, C), (N, C, L) or (N, C, H, W) (any rank >= 2: channels are dim 1)
 *   running_mean: (C) or NULL     running_var: (C) or NULL   (any floating dtype)
 *   weight:       (C) or NULL (gamma)   bias: (C) or NULL (beta)   (input's dtype)
 *   out:          input's shape and dtype
 *
 * training != 0: y = (x - mean) / sqrt(var + eps) * weight + bias with the batch mean and
 * BIASED batch variance per channel (over N and the spatial dims); when running stats are
 * given they are updated in place (bumping their versions), as PyTorch:
 *   running_mean = (1 - momentum) * running_mean + momentum * mean
 *   running_var  = (1 - momentum) * running_var  + momentum * var * M / (M - 1)
 * (M = N * spatial size: the UNBIASED variance). Needs M > 1.
 * training == 0: normalises with running_mean and running_var (both required).
 * Gradients flow to input, weight and bias (not to the running stats). The backward is the
 * closed form  dx = weight * invstd / M * (M dy - sum(dy) - xhat * sum(dy * xhat))  in
 * training and dx = dy * weight * invstd in eval; dweight = sum(dy * xhat), dbias = sum(dy).
 * Errors (DDP_ERR_ARG, naming batch_norm): input rank < 2 or not floating, a per-channel
 * tensor whose shape is not (C) or whose dtype mismatches, eval without running stats,
 * training with one value per channel, eps < 0, an in-place update of running stats that
 * are leaves requiring grad while grad mode is on. */
int ddp_batch_norm(ddp_tensor **out, ddp_tensor *input, ddp_tensor *running_mean,
                   ddp_tensor *running_var, ddp_tensor *weight, ddp_tensor *bias, int training,
                   double momentum, double eps);

/* Fused batch norm + ReLU (+ residual add): out = relu(batch_norm(input, ...) + residual),
 * the two steps of a ResNet block's tail, in one pass over the data and one autograd node
 * (BatchNormReluBackward) that saves input and out only (Note [fused batch norm relu] in
 * runtime/ops/norm.c). The arguments and the running-stat updates are batch_norm's;
 *   residual: NULL (out = relu(batch_norm(input))) or input's shape, dtype and device.
 * Values and gradients (to input, weight, bias and residual) are bitwise those of
 * ddp_batch_norm, ddp_add and ddp_relu in a row on the CPU; relu's gradient is 0 where
 * out is 0. Devices without the fused kernels (CUDA), f16/bf16 inputs and autocast run that
 * composition. Errors: batch_norm's (naming batch_norm_relu), and DDP_ERR_ARG for a
 * residual whose shape, dtype or device differs from input's. */
int ddp_batch_norm_relu(ddp_tensor **out, ddp_tensor *input, ddp_tensor *residual,
                        ddp_tensor *running_mean, ddp_tensor *running_var, ddp_tensor *weight,
                        ddp_tensor *bias, int training, double momentum, double eps);

/* Per-channel batch statistics of input (N, C, *) (rank >= 2, floating): out_mean (C) the
 * mean and out_invstd (C) = 1 / sqrt(biased var + eps), over N and the spatial dims; f64
 * for an f64 input, else f32. Not differentiable (records nothing): the building block of
 * a synchronised batch norm. Errors: as ddp_batch_norm for the input; M = 0. */
int ddp_batch_norm_stats(ddp_tensor **out_mean, ddp_tensor **out_invstd, ddp_tensor *input,
                         double eps);

/* Per-channel sums of input (N, C, *) (rank >= 2, floating): out_sum (C) = sum of x and
 * out_sumsq (C) = sum of x^2 over N and the spatial dims, in f64 (what a synchronised batch
 * norm all-reduces across ranks before forming the mean and variance). Not differentiable.
 * Errors: as ddp_batch_norm_stats. */
int ddp_batch_norm_sums(ddp_tensor **out_sum, ddp_tensor **out_sumsq, ddp_tensor *input);

/* Per-channel moments of input (N, C, *) (rank >= 2, floating; N may be 0): out (2, C) f64,
 * row 0 the mean and row 1 the BIASED variance over N and the spatial dims (zeros when there
 * are no values), from the kernels of batch norm's training forward. Differentiable
 * (BatchNormMomentsBackward: dx = dmean / M + 2 dvar (x - mean) / M with M values per
 * channel; Note [differentiable sync batch norm steps] in runtime/ops/norm.c): the local
 * statistics of nn.SyncBatchNorm. Errors: as ddp_batch_norm_stats (an empty batch allowed). */
int ddp_batch_norm_moments(ddp_tensor **out, ddp_tensor *input);

/* The elementwise steps of a synchronised batch norm (nn.SyncBatchNorm), after PyTorch's
 * torch.batch_norm_elemt, torch.batch_norm_backward_reduce and
 * torch.batch_norm_backward_elemt (used by torch/nn/modules/_functions.py): the statistics
 * come from elsewhere (all ranks of a group), these ops do the passes over the data.
 * ddp_batch_norm_elemt is differentiable in input, weight, bias, mean and var
 * (BatchNormElemtBackward, Note [differentiable sync batch norm steps] in
 * runtime/ops/norm.c); the two backward steps record nothing. Inputs f32 or f64 (f16/bf16 computed in f32 and
 * answered in f32); per-channel tensors (C) of any floating dtype, converted; every tensor
 * on input's device; per-channel arithmetic in double, as ddp_batch_norm.
 *
 *   input, grad_out: (N, C, *) (N may be 0)      weight, bias: (C) or NULL
 *
 * ddp_batch_norm_elemt: out = (input - mean) / sqrt(var + eps) * weight + bias with the
 * given mean and BIASED var (C): the same kernels as ddp_batch_norm's training forward, so
 * with the batch's own moments the output is that op's, bit for bit.
 * ddp_batch_norm_backward_reduce: out_sum_dy = sum(grad_out), out_sum_dy_xmu =
 * sum(grad_out * (input - mean)) per channel over N and the spatial dims, (C) f64.
 * ddp_batch_norm_backward_elemt: grad_in = weight * invstd * (grad_out - mean_dy -
 * (input - mean) * invstd^2 * mean_dy_xmu), where mean_dy and mean_dy_xmu are the two sums
 * above (over every rank) divided by the global count: the input gradient of batch norm
 * (Note the closed form at ddp_batch_norm) with global statistics.
 * Errors (DDP_ERR_ARG, naming the op): input rank < 2 or not floating, a per-channel tensor
 * not of shape (C) or not floating, a required one missing, grad_out of another shape,
 * tensors on different devices, eps < 0. */
int ddp_batch_norm_elemt(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias,
                         ddp_tensor *mean, ddp_tensor *var, double eps);
int ddp_batch_norm_backward_reduce(ddp_tensor **out_sum_dy, ddp_tensor **out_sum_dy_xmu,
                                   ddp_tensor *grad_out, ddp_tensor *input, ddp_tensor *mean);
int ddp_batch_norm_backward_elemt(ddp_tensor **grad_in, ddp_tensor *grad_out, ddp_tensor *input,
                                  ddp_tensor *mean, ddp_tensor *invstd, ddp_tensor *weight,
                                  ddp_tensor *mean_dy, ddp_tensor *mean_dy_xmu);

/* Layer normalisation (Ba, Kiros, Hinton 2016, "Layer Normalization"), as PyTorch.
 *
 *   input:            (..., *normalized_shape) floating
 *   normalized_shape: n_normalized (>= 1) sizes, equal to input's last n_normalized dims
 *   weight, bias:     normalized_shape or NULL (input's dtype)
 *   out:              input's shape and dtype
 *
 * Each row of the trailing dims is normalised with its mean and biased variance:
 * y = (x - mean) / sqrt(var + eps) * weight + bias. Gradients to input, weight, bias; the
 * backward is the closed form  dx = rstd / D * (D g - sum(g) - xhat * sum(g * xhat))  with
 * g = dy * weight and D the row length. Errors (naming layer_norm): normalized_shape not
 * matching the trailing dims of input, weight or bias of another shape or dtype, eps < 0. */
int ddp_layer_norm(ddp_tensor **out, ddp_tensor *input, int n_normalized,
                   const int64_t *normalized_shape, ddp_tensor *weight, ddp_tensor *bias,
                   double eps);

/* Inverted dropout (Srivastava et al. 2014, "Dropout: A Simple Way to Prevent Neural
 * Networks from Overfitting"; scaling at training time as PyTorch).
 *
 *   input: any shape, floating        out: input's shape and dtype
 *
 * training != 0 and 0 < p < 1: each element is zeroed with probability p, the kept ones
 * are scaled by 1 / (1 - p); the keep mask (u8, 1 = kept) is drawn from g (NULL: the
 * default generator) with ddp_bernoulli_(mask, 1 - p, g) and saved for backward
 * (d input = dy * mask / (1 - p)). p == 1: zeros (no random numbers drawn). p == 0 or
 * training == 0: input itself (a new reference). Errors (naming dropout): p outside
 * [0, 1], input not floating. */
int ddp_dropout(ddp_tensor **out, ddp_tensor *input, double p, int training, ddp_generator *g);

/* Embedding lookup, as PyTorch's F.embedding.
 *
 *   weight:  (V, D), any dtype (floating for gradients)
 *   indices: any shape (up to 7 dims), i64 or i32, values in [0, V) (0-based data)
 *   out:     (*indices.shape, D), weight's dtype
 *
 * out[..., :] = weight[indices[...], :]. The gradient w.r.t. weight is a (V, D) tensor
 * whose row v is the sum of dy over the positions holding index v (index_add); the row
 * padding_idx (a row in [0, V); -1 for none) gets no gradient. No gradient for indices.
 * Errors (naming embedding): weight not 2-d, indices not integer, an index out of [0, V)
 * (the message gives the value and V), padding_idx out of [-1, V). */
int ddp_embedding(ddp_tensor **out, ddp_tensor *weight, ddp_tensor *indices,
                  int64_t padding_idx);
