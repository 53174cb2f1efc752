/* ddplua/ops_shape.h: part of the public API, included by ddplua.h only.
 *
 * Shape and indexing ops (runtime/ops/shape.c, kernels in runtime/backend/cpu/shape.c and
 * runtime/backend/cuda/shape.cu). Semantics follow PyTorch's ops of the same names.
 *
 * Devices: a view stays on its input's device. Ops taking several tensors (index_select,
 * gather, scatter_add(_), cat, stack) need them all on one device, where the result is made;
 * another device is DDP_ERR_ARG naming the arguments and both devices. Index values on a
 * device are copied to the host for the bounds check (one synchronous transfer).
 *
 * Views (view, reshape when it can, transpose, t, permute, squeeze, unsqueeze, expand,
 * narrow, select, flatten, unflatten, split, chunk) share the input's storage: no element is
 * copied, writing through the view writes the base, and the result costs one tensor header
 * (plus one autograd node when the input requires grad). Every op here is differentiable
 * w.r.t. its floating tensor inputs (index tensors carry no gradient).
 *
 * Dimensions are 0-based and may be negative (-1 the last). Positions (narrow's start,
 * select's index) are 0-based, negative from the end. VALUES of index tensors are 0-based,
 * never negative, and bounds-checked: an error names the op, the value, the dimension and
 * its size. Error messages print dimensions and positions as the Lua front end counts them
 * (from 1; negatives as given). Errors are DDP_ERR_ARG unless said otherwise.
 */

/* view: t with a new shape of the same number of elements, sharing t's storage. One entry
 * of shape may be -1 (inferred). Fails naming both shapes when the element counts differ,
 * or when t's strides cannot express the new shape without a copy (use reshape). Rule as
 * PyTorch's view (each group of merged dimensions of t must be contiguous in memory). */
int ddp_view(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape);

/* reshape: a view when ddp_view would succeed, else a contiguous copy with the new shape.
 * One -1 allowed as in view. */
int ddp_reshape(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape);

/* transpose: the view of t with dimensions dim0 and dim1 swapped. */
int ddp_transpose(ddp_tensor **out, ddp_tensor *t, int dim0, int dim1);

/* t: the transpose of a 2-d tensor (M, N) -> (N, M) (a view); a 0-d or 1-d tensor is
 * returned as it is (a new reference to t). Fails for more than 2 dimensions. */
int ddp_t(ddp_tensor **out, ddp_tensor *t);

/* permute: the view with out.shape[i] = t.shape[dims[i]]; dims (ndim entries, negatives
 * allowed) must be a permutation of t's dimensions. */
int ddp_permute(ddp_tensor **out, ddp_tensor *t, int ndim, const int *dims);

/* squeeze: the view of t without its size-1 dimensions. */
int ddp_squeeze(ddp_tensor **out, ddp_tensor *t);

/* squeeze_dim: the view of t without dimension dim when its size is 1; otherwise a view of
 * t unchanged (as PyTorch). */
int ddp_squeeze_dim(ddp_tensor **out, ddp_tensor *t, int dim);

/* unsqueeze: the view of t with a size-1 dimension inserted at dim (dim in
 * -(ndim+1) .. ndim). */
int ddp_unsqueeze(ddp_tensor **out, ddp_tensor *t, int dim);

/* expand: the view of t broadcast to `sizes` (ndim >= t's ndim entries; new dimensions go
 * in front) with stride 0 along expanded dimensions. -1 keeps t's size (not allowed for a
 * new leading dimension); a size of t may only change when it is 1. Writing into an
 * expanded view writes one element many times. Backward sums the gradient back
 * (ddp_sum_to_shape). */
int ddp_expand(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *sizes);

/* narrow: the view t[..., start : start + length, ...] along dim. start may be negative
 * (from the end); 0 <= start and start + length <= size after that. */
int ddp_narrow(ddp_tensor **out, ddp_tensor *t, int dim, int64_t start, int64_t length);

/* select: the view of element `index` along dim, that dimension removed: (A, B, C) with
 * dim 1 gives (A, C). index in -size .. size-1. Fails for a 0-d tensor. */
int ddp_select(ddp_tensor **out, ddp_tensor *t, int dim, int64_t index);

/* flatten: dimensions start_dim .. end_dim (inclusive) merged into one, a view when the
 * strides allow, else a copy (as reshape). A 0-d tensor gives shape (1). */
int ddp_flatten(ddp_tensor **out, ddp_tensor *t, int start_dim, int end_dim);

/* unflatten: dimension dim replaced by n dimensions `sizes` (one may be -1) whose product is
 * its size; a view when the strides allow, else a copy. */
int ddp_unflatten(ddp_tensor **out, ddp_tensor *t, int dim, int n, const int64_t *sizes);

/* index_select: out = t with dimension dim gathered at the values of index, a 0-d or 1-d
 * i64 tensor of K values in 0 .. size-1: for t (A, B, C) and dim 1, out (A, K, C) with
 * out[a][k][c] = t[a][index[k]][c]. Any dtype. A new contiguous tensor. Backward
 * (w.r.t. t): index_add of the gradient into zeros. */
int ddp_index_select(ddp_tensor **out, ddp_tensor *t, int dim, ddp_tensor *index);

/* gather: out has index's shape; for dim 1 of 3-d tensors,
 * out[i][j][k] = t[i][index[i][j][k]][k]. index: i64 with t's number of dimensions,
 * index.size(d) <= t.size(d) for d != dim, values in 0 .. t.size(dim)-1. Any dtype.
 * Backward (w.r.t. t): scatter_add of the gradient into zeros. */
int ddp_gather(ddp_tensor **out, ddp_tensor *t, int dim, ddp_tensor *index);

/* scatter_add: a copy of self with src added at the positions index names: for dim 1,
 * out[i][index[i][j][k]][k] += src[i][j][k] over every (i, j, k) of index. index: i64 with
 * the same number of dimensions as self and src, index.size(d) <= src.size(d) for every d
 * and index.size(d) <= self.size(d) for d != dim; values in 0 .. self.size(dim)-1. src has
 * self's dtype. Backward: d/dself = grad, d/dsrc = gather(grad, dim, index) (zeros where src
 * is larger than index). Dtypes: f32, f64, f16, bf16, i64, i32, u8. */
int ddp_scatter_add(ddp_tensor **out, ddp_tensor *self, int dim, ddp_tensor *index,
                    ddp_tensor *src);

/* scatter_add_: the same in place on self (bumps its version). Refuses a leaf that
 * requires grad while grad mode is on, and a self whose elements overlap (stride 0). */
int ddp_scatter_add_(ddp_tensor *self, int dim, ddp_tensor *index, ddp_tensor *src);

/* cat: the n tensors (n >= 1) joined along dim into a new contiguous tensor. Every tensor
 * has the same number of dimensions and the same sizes except along dim; the result dtype
 * is the promotion of all dtypes. As PyTorch, 1-d empty tensors of shape (0) are skipped
 * whatever their shape. Errors name the tensor's position (from 1) and both shapes.
 * Backward: narrows of the gradient. */
int ddp_cat(ddp_tensor **out, ddp_tensor **tensors, int n, int dim);

/* stack: the n tensors (n >= 1) of one shape (S...) joined along a new dimension dim
 * (in -(ndim+1) .. ndim): for dim 0 the result is (n, S...). A new contiguous tensor. */
int ddp_stack(ddp_tensor **out, ddp_tensor **tensors, int n, int dim);

/* split: t cut along dim into pieces of split_size (>= 1; 0 only when the dimension is
 * empty), the last one smaller when the size does not divide: ceil(size / split_size)
 * pieces (one when the size is 0). *n_out receives the count; with outs NULL nothing else
 * happens, otherwise outs must have room for `cap` >= count entries and receives that many
 * new views, each with its own autograd node (backward: the gradient placed into zeros). */
int ddp_split(ddp_tensor **outs, int cap, int *n_out, ddp_tensor *t, int64_t split_size,
              int dim);

/* split_with_sizes: t cut along dim into n pieces of the given sizes (each >= 0, summing to
 * the size of dim); outs receives n new views. */
int ddp_split_with_sizes(ddp_tensor **outs, ddp_tensor *t, int n, const int64_t *sizes, int dim);

/* chunk: t cut along dim into at most `chunks` (>= 1) pieces of ceil(size / chunks)
 * elements, as PyTorch (fewer pieces when they run out; `chunks` empty pieces when the
 * dimension is empty). *n_out and outs/cap as ddp_split. */
int ddp_chunk(ddp_tensor **outs, int cap, int *n_out, ddp_tensor *t, int chunks, int dim);
