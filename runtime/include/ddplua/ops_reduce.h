/* ddplua/ops_reduce.h: part of the public API, included by ddplua.h only.
 *
 * Reductions (sum, mean, max/min, argmax/argmin, var/std, norm) and softmax/log_softmax.
 *
 * Dimensions: `dims` is an array of `ndims` 0-based dimensions, negatives counting from the
 * end (-1: the last); a dimension given twice is an error. `dims` NULL or `ndims` 0 means
 * every dimension (a full reduction, giving a 0-d tensor unless keepdim). keepdim = 1 keeps
 * each reduced dimension with size 1, e.g. summing (N, D) over dim 0 gives (1, D) instead
 * of (D). A 0-d tensor accepts dims 0 and -1.
 *
 * Numerics (Note [reduction accumulation]): f32 row sums are blocked: 16 f32 lanes
 * accumulate a block of at most 4096 elements (256 adds per lane) and the block totals
 * are added in double; column sums add up to 256 rows into an f32 buffer, then flush it
 * into double. The f32 error therefore grows with the block size, not with the length
 * (PyTorch uses cascade summation for the same reason), while the loops still vectorise.
 * f64 accumulates in double lanes, integers in int64. var/std take two passes (mean, then
 * the sum of squared deviations, blocked the same way), exact up to rounding without
 * Welford's update. f16/bf16 inputs compute through f32. Results do not depend on the
 * thread count: work splits by output slices, or a long row by fixed 65536-element parts.
 * f32 softmax uses a vectorisable exp (Cephes' polynomial, within 1.5 ulp on [-87, 88],
 * 0 below -87 where the true value is denormal).
 * On CUDA tensors (runtime/backend/cuda/reduce.cu) f32 and f64 sums accumulate every
 * element in double (a tree across threads), var/std use Welford's update with Chan's
 * pairwise merge in double, softmax uses the device's expf/exp: results agree with the
 * CPU's to rounding, not bit for bit, and do not depend on the launch configuration's
 * timing (fixed reduction order per shape).
 *
 * Layout: reductions over a block of adjacent dimensions of a contiguous tensor (the last
 * dims: row sums; the leading dims: column sums, vectorised across the kept columns; or a
 * middle block) run in place; any other case (non-contiguous input, reduced dims that are
 * not adjacent) first copies the input with the reduced dims moved last.
 *
 * Errors (DDP_ERR_ARG, the message naming the op): a dimension out of range or repeated,
 * more than 8 dims, a dtype the op does not take, max/min/argmax/argmin of an empty
 * reduction.
 */

/* Sum of t over dims. `dtype`: the result dtype, or -1 for the default: t's dtype for
 * floating t, i64 for integer and bool t (as PyTorch). An explicit dtype converts t first
 * (sum of f32 into f64 accumulates in f64). Sum over nothing (an empty dim) is 0.
 * Differentiable (floating t and result): the gradient broadcasts back to t's shape. */
int ddp_sum(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int keepdim,
            int dtype);

/* Mean of t over dims: sum / (number of elements reduced); the mean of nothing is nan.
 * `dtype`: the result dtype or -1 (t's dtype). Integer and bool t need a floating dtype
 * (error otherwise, as PyTorch). Differentiable: gradient grad / count, broadcast back. */
int ddp_mean(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int keepdim,
             int dtype);

/* Largest / smallest element of t over one dimension `dim`: *values (t's dtype) and
 * *indices (i64, 0-based position along dim of the FIRST occurrence of the extreme), both
 * of t's shape without dim (or with size 1 there when keepdim). NaN counts as the largest
 * and the smallest (propagates), as PyTorch. Any dtype. Error when t's size along dim is 0.
 * Differentiable w.r.t. values: the gradient goes to the element at the index (the others
 * get 0), as PyTorch's max(dim). */
int ddp_max_dim(ddp_tensor **values, ddp_tensor **indices, ddp_tensor *t, int dim, int keepdim);
int ddp_min_dim(ddp_tensor **values, ddp_tensor **indices, ddp_tensor *t, int dim, int keepdim);

/* Largest / smallest element of the whole of t as a 0-d tensor of t's dtype. Error when t
 * is empty. Differentiable: the gradient is split evenly among all elements equal to the
 * result (PyTorch's amax/amin rule), so ties share it. */
int ddp_max(ddp_tensor **out, ddp_tensor *t);
int ddp_min(ddp_tensor **out, ddp_tensor *t);

/* Index (i64, 0-based, first occurrence) of the largest / smallest element along dim
 * (shape as ddp_max_dim's indices). Not differentiable. Error on an empty reduction. */
int ddp_argmax_dim(ddp_tensor **out, ddp_tensor *t, int dim, int keepdim);
int ddp_argmin_dim(ddp_tensor **out, ddp_tensor *t, int dim, int keepdim);

/* Index (i64 0-d tensor, 0-based) of the largest / smallest element of t flattened in
 * row-major order (first occurrence). Error when t is empty. */
int ddp_argmax(ddp_tensor **out, ddp_tensor *t);
int ddp_argmin(ddp_tensor **out, ddp_tensor *t);

/* Variance of t over dims: sum((x - mean)^2) / (n - correction), n the number of elements
 * reduced; correction 1 is the unbiased (Bessel) estimate, 0 the population variance
 * (PyTorch's `unbiased` / `correction`). n - correction <= 0 gives nan or inf as PyTorch
 * (0/0, x/0). Floating t only. Differentiable: d var / dx = 2 (x - mean) / (n - correction). */
int ddp_var(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int correction,
            int keepdim);

/* Standard deviation: sqrt(ddp_var). Differentiable: d std / dx = (x - mean) /
 * ((n - correction) std); where std is 0 the gradient is nan/inf, as PyTorch. */
int ddp_std(ddp_tensor **out, ddp_tensor *t, const int *dims, int ndims, int correction,
            int keepdim);

/* Vector p-norm of t over dims: (sum |x|^p)^(1/p) for p > 0 (p = 2: the Euclidean norm,
 * p = 1: sum |x|), max |x| for p = +inf (HUGE_VAL). p = 0, negative p and nan are
 * errors. Floating t only. Differentiable: g * sign(x) |x|^(p-1) / norm^(p-1) (p = 2:
 * g x / norm; p = 1: g sign(x)); for p = inf the gradient is split evenly among the
 * elements with |x| equal to the norm. Where the norm is 0 the gradient is 0 (as PyTorch).
 * p = 1 and 2 run the vectorised sum kernels; other p and inf a scalar loop in f64. The
 * norm of no elements is 0. */
int ddp_norm(ddp_tensor **out, ddp_tensor *t, double p, const int *dims, int ndims,
             int keepdim);

/* Softmax of t along dim: exp(x - max) / sum(exp(x - max)), numerically stable (the max is
 * subtracted). Same shape and dtype as t; floating t only (f16/bf16 compute in f32).
 * Differentiable (fused backward: y * (g - sum(g * y))). */
int ddp_softmax(ddp_tensor **out, ddp_tensor *t, int dim);

/* log_softmax of t along dim: x - max - log(sum(exp(x - max))). Same shape and dtype as t;
 * floating t only. Differentiable (fused backward: g - exp(y) * sum(g)). */
int ddp_log_softmax(ddp_tensor **out, ddp_tensor *t, int dim);

/* ---- the comm layer's arithmetic (Note [reduction entries] in runtime/backend/kernels.h) --
 * Element-wise combinations of whole tensors, as the collectives and DDP's comm hooks
 * compute them, through the kernel table of the tensors' device. None records autograd;
 * each writes into a tensor the caller made (bumping its version). Every tensor must be
 * live, contiguous and on one device; errors (DDP_ERR_ARG) name the function and the
 * argument at fault. */

/* out = inputs[0] op inputs[1] ... op inputs[k-1], element by element in that order (the
 * order every rank of a collective uses), op a ddp_reduce_op (ddplua/pg.h): SUM, AVG (the
 * sum divided by k), MIN, MAX (x < acc ? x : acc with x the next input: a NaN input is
 * skipped, as in the collectives), PRODUCT. 1 <= k <= 64; the inputs and out all f32 or
 * all f64, with out's numel (shapes may differ). out may be one of the inputs and must not
 * share storage with the others otherwise. */
int ddp_reduce_tensors(ddp_tensor *out, ddp_tensor *const *inputs, int k, int op);

/* The same reduction written back into every buffer: afterwards each of bufs[0 .. k-1]
 * holds the result. The bufs share no storage and are all f32 or all f64 of one numel. */
int ddp_reduce_tensors_all(ddp_tensor *const *bufs, int k, int op);

/* out = x * s (divide = 0) or x / s (divide = 1), in x's dtype (f32, f64, f16, bf16; the
 * last two computed in f32 and rounded once). out has x's numel and dtype and may be x
 * (else it shares no storage with x). */
int ddp_scale_into(ddp_tensor *out, ddp_tensor *x, double s, int divide);

/* out = x.to(out.dtype) * s (divide = 0) or x.to(out.dtype) / s (divide = 1): the cast,
 * then the scaling in out's dtype as ddp_scale_into does, each rounded (the fp16 / bf16
 * compress hooks' x.to(f16).div_(world)); s = 1 is the cast alone. Dtypes f32, f64, f16,
 * bf16; out has x's numel and shares no storage with x. */
int ddp_cast_scale_into(ddp_tensor *out, ddp_tensor *x, double s, int divide);
