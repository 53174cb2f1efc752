/* ddplua/ops_nn.h: part of the public API, included by ddplua.h only.
 *
 * GEMM-based ops (matmul, bmm, linear, conv2d) and 2-d pooling, each differentiable.
 * Floating dtypes throughout (f32 and f64 natively, f16 and bf16 computed through f32);
 * matmul and bmm also take the integer dtypes i64, i32 and u8 (no gradient). The operands
 * of one call must share a dtype: a mismatch is an error naming both dtypes.
 * Matrix products go through OpenBLAS (cblas_sgemm / cblas_dgemm); a 2-d operand that is a
 * transposed contiguous view is passed as CblasTrans, not copied.
 */

/* out = a · b with torch.matmul's semantics:
 *   (K) · (K)                 -> ()              dot product
 *   (N, K) · (K, M)           -> (N, M)
 *   (K) · (..., K, M)         -> (..., M)        a promoted to (1, K), the 1 dropped after
 *   (..., N, K) · (K)         -> (..., N)        b promoted to (K, 1), the 1 dropped after
 *   (..., N, K) · (..., K, M) -> (..., N, M)     batch dimensions broadcast (NumPy rules)
 * Errors (DDP_ERR_ARG): a 0-d operand, dtype mismatch (both dtypes named), inner dimensions
 * that differ (both shapes named), batch dimensions that do not broadcast, bool tensors. */
int ddp_matmul(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);

/* Batched product without broadcasting: a (B, N, K) · b (B, K, M) -> (B, N, M).
 * Errors: operands not 3-d, batch sizes or inner dimensions that differ (shapes named),
 * dtype mismatch. */
int ddp_bmm(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);

/* torch.nn.functional.linear: out (..., out) = input (..., in) · weightᵀ + bias, with
 * weight (out, in) and bias (out) or NULL. input may be 1-d (in) -> (out).
 * Errors: weight not 2-d, bias not (out), in-feature mismatch (shapes named), dtypes. */
int ddp_linear(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias);

/* torch.nn.functional.conv2d (cross-correlation, as every DL framework):
 *   input (N, C, H, W) or unbatched (C, H, W); weight (O, C / groups, kH, kW); bias (O) or
 *   NULL; out (N, O, OH, OW) (or (O, OH, OW)) with
 *   OH = floor((H + 2 padding_h - dilation_h (kH - 1) - 1) / stride_h) + 1 (the same for W).
 * stride and dilation >= 1, padding >= 0, groups >= 1 dividing both C and O.
 * Computed by im2col + GEMM, or in f32 for 3x3 kernels with stride 1, dilation 1, one group
 * and >= 8 channels in and out by Winograd F(2x2, 3x3) (Lavin, Gray, CVPR 2016); samples are
 * spread over the runtime's threads with OpenBLAS held at one thread meanwhile, with results
 * independent of the thread count.
 * Errors: bad ranks, channels not matching weight (shape named), C or O not divisible by
 * groups, dilated kernel larger than the padded input (sizes named), bad options, dtypes. */
int ddp_conv2d(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias,
               int64_t stride_h, int64_t stride_w, int64_t padding_h, int64_t padding_w,
               int64_t dilation_h, int64_t dilation_w, int64_t groups);

/* torch.nn.functional.max_pool2d with return_indices:
 *   input (N, C, H, W) or (C, H, W) -> out of the same rank with (OH, OW) last, and
 *   indices (i64, out's shape): position of each maximum flattened over (H, W), 0-based.
 * OH = floor((H + 2 padding_h - dilation_h (kH - 1) - 1) / stride_h) + 1, or the ceiling
 * when ceil_mode (then a last window that starts inside the right padding is dropped), as
 * PyTorch's pooling_output_shape. Padding counts as -inf; NaN propagates.
 * `indices` may be NULL when not wanted. Errors: kernel, stride, dilation < 1; padding < 0 or
 * more than half the kernel; an output size < 1 (sizes named); a non-floating input. */
int ddp_max_pool2d(ddp_tensor **out, ddp_tensor **indices, ddp_tensor *input,
                   int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                   int64_t padding_h, int64_t padding_w, int64_t dilation_h, int64_t dilation_w,
                   int ceil_mode);

/* max_pool2d(relu(input)) in one pass (no relu output kept): out as ddp_max_pool2d's, bit
 * for bit those of ddp_relu then ddp_max_pool2d, and so is the input's gradient (one
 * differentiable op). Used by nn.Sequential for a ReLU followed by a MaxPool2d. Devices
 * without the fused kernel run the two ops. Errors: as ddp_max_pool2d, naming
 * relu_max_pool2d. */
int ddp_relu_max_pool2d(ddp_tensor **out, ddp_tensor *input, int64_t kernel_h, int64_t kernel_w,
                        int64_t stride_h, int64_t stride_w, int64_t padding_h, int64_t padding_w,
                        int64_t dilation_h, int64_t dilation_w, int ceil_mode);

/* torch.nn.functional.avg_pool2d: input (N, C, H, W) or (C, H, W); the window mean, its
 * divisor being the window clipped to the padded input when count_include_pad (PyTorch's
 * default), else the window clipped to the input. Output size as max_pool2d with dilation 1.
 * Errors: as max_pool2d. */
int ddp_avg_pool2d(ddp_tensor **out, ddp_tensor *input, int64_t kernel_h, int64_t kernel_w,
                   int64_t stride_h, int64_t stride_w, int64_t padding_h, int64_t padding_w,
                   int ceil_mode, int count_include_pad);

/* torch.nn.functional.adaptive_avg_pool2d: input (N, C, H, W) or (C, H, W) -> (..., OH, OW);
 * output cell (i, j) averages rows floor(i H / OH) .. ceil((i + 1) H / OH) - 1 and likewise
 * columns (PyTorch's start_index / end_index). Errors: OH or OW < 1, an empty H or W. */
int ddp_adaptive_avg_pool2d(ddp_tensor **out, ddp_tensor *input, int64_t out_h, int64_t out_w);
