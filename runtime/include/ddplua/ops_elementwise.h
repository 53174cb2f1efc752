/* ddplua/ops_elementwise.h: part of the public API, included by ddplua.h only.
 *
 * Element-wise ops (runtime/ops/elementwise.c): arithmetic with NumPy broadcasting and
 * PyTorch's type promotion, unary math, activations, where, comparisons.
 *
 * Broadcasting: shapes are aligned from the last dimension; sizes must be equal or 1
 * ((2, 3) with (3,) gives (2, 3); (4, 1) with (1, 5) gives (4, 5)). Otherwise DDP_ERR_ARG
 * naming the op and both shapes.
 * Type promotion of two tensors: ddp_promote_types (bool < u8 < i32 < i64 < f16/bf16 < f32
 * < f64), except that a 0-d tensor does not raise the dtype of a tensor with dimensions
 * unless it is of a higher category (bool < integer < floating), as in PyTorch.
 * A scalar (double) operand: a floating tensor keeps its dtype; an integer or bool tensor
 * keeps it for an integral scalar (bool with a scalar gives i64) and becomes f32 for a
 * non-integral one. div always gives a floating result (integers give f32).
 * In-place forms (`_` suffix) write into self: the other operand must broadcast to self's
 * shape and the result dtype must be castable to self's (no floating into integers, nothing
 * but bool into bool), else DDP_ERR_ARG. With grad mode on they refuse a leaf that requires
 * grad; on a non-leaf they record a node that replaces self's history.
 * Autograd: every floating result of a differentiable op records a node; gradients of
 * broadcast inputs are summed back to the input's shape and cast to its dtype.
 * Every function fails with DDP_ERR_STATE for a freed tensor. Results are new contiguous
 * tensors owned by the caller.
 */

/* ---- binary arithmetic: out = a op b, broadcast, promoted ---------------------------- */

/* a + b. */
int ddp_add(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
/* a + alpha * b (PyTorch's add with alpha; sub with alpha is add with -alpha). */
int ddp_add_alpha(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, double alpha);
/* a - b. Two bool tensors: DDP_ERR_ARG (as PyTorch). */
int ddp_sub(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
/* a * b. */
int ddp_mul(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
/* a / b, true division: integer inputs give f32. */
int ddp_div(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
/* a ^ b. Gradients as PyTorch: d/da = b a^(b-1) (0 where b == 0), d/db = a^b log(a) (0
 * where a == 0 and b >= 0). */
int ddp_pow(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
/* Element-wise maximum / minimum (NaN propagates). At ties each input gets half the
 * gradient (PyTorch). */
int ddp_maximum(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_minimum(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);

/* In place: self = self op other (other broadcasts to self's shape). */
int ddp_add_(ddp_tensor *self, ddp_tensor *other);
int ddp_add_alpha_(ddp_tensor *self, ddp_tensor *other, double alpha);
int ddp_sub_(ddp_tensor *self, ddp_tensor *other);
int ddp_mul_(ddp_tensor *self, ddp_tensor *other);
int ddp_div_(ddp_tensor *self, ddp_tensor *other);
int ddp_pow_(ddp_tensor *self, ddp_tensor *other);

/* ---- with a scalar (a Lua number): out = a op s, or s op a for the r- forms ----------- */

int ddp_add_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_sub_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_mul_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_div_scalar(ddp_tensor **out, ddp_tensor *a, double s);
/* a ^ s. An integer tensor with a negative integral s: DDP_ERR_ARG (as PyTorch). */
int ddp_pow_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_rsub_scalar(ddp_tensor **out, ddp_tensor *a, double s); /* s - a */
int ddp_rdiv_scalar(ddp_tensor **out, ddp_tensor *a, double s); /* s / a */
int ddp_rpow_scalar(ddp_tensor **out, ddp_tensor *a, double s); /* s ^ a */

/* In place: self = self op s (self keeps its dtype; a leaf that requires grad is refused
 * with grad mode on, as above). */
int ddp_add_scalar_(ddp_tensor *self, double s);
int ddp_sub_scalar_(ddp_tensor *self, double s);
int ddp_mul_scalar_(ddp_tensor *self, double s);
int ddp_div_scalar_(ddp_tensor *self, double s);
int ddp_pow_scalar_(ddp_tensor *self, double s);

/* ---- unary ops: out (*) = f(x (*)) --------------------------------------------------- */
/* Integer inputs: neg, abs, relu and clamp keep the dtype; exp, log, sqrt, rsqrt, tanh and
 * sigmoid give f32; leaky_relu, gelu and silu refuse them (DDP_ERR_ARG). Bool inputs are
 * refused by all but the f32-giving ones. */

int ddp_neg(ddp_tensor **out, ddp_tensor *x);
int ddp_exp(ddp_tensor **out, ddp_tensor *x);
int ddp_log(ddp_tensor **out, ddp_tensor *x);
int ddp_sqrt(ddp_tensor **out, ddp_tensor *x);
int ddp_rsqrt(ddp_tensor **out, ddp_tensor *x);  /* 1 / sqrt(x) */
int ddp_abs(ddp_tensor **out, ddp_tensor *x);    /* gradient sign(x), 0 at 0 */
/* min(max(x, lo), hi); has_lo / has_hi 0 leaves that side open (NaN bounds also count as
 * absent). Gradient passes where lo <= x <= hi (PyTorch). An integer tensor with a
 * non-integral bound gives f32. */
int ddp_clamp(ddp_tensor **out, ddp_tensor *x, int has_lo, double lo, int has_hi, double hi);
int ddp_relu(ddp_tensor **out, ddp_tensor *x);  /* max(x, 0); gradient 0 at 0 */
/* x for x > 0, negative_slope * x otherwise (PyTorch's default slope is 0.01). */
int ddp_leaky_relu(ddp_tensor **out, ddp_tensor *x, double negative_slope);
/* GELU (Hendrycks & Gimpel 2016, arXiv:1606.08415): approximate 0 gives the exact
 * x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default); 1 gives the tanh form
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate="tanh"). */
int ddp_gelu(ddp_tensor **out, ddp_tensor *x, int approximate_tanh);
int ddp_tanh(ddp_tensor **out, ddp_tensor *x);
int ddp_sigmoid(ddp_tensor **out, ddp_tensor *x); /* 1 / (1 + exp(-x)) */
int ddp_silu(ddp_tensor **out, ddp_tensor *x);    /* x * sigmoid(x) (swish) */

/* In place: self = f(self); the dtype must stay (exp_ of an integer tensor: DDP_ERR_ARG). */
int ddp_neg_(ddp_tensor *self);
int ddp_exp_(ddp_tensor *self);
int ddp_log_(ddp_tensor *self);
int ddp_sqrt_(ddp_tensor *self);
int ddp_rsqrt_(ddp_tensor *self);
int ddp_abs_(ddp_tensor *self);
int ddp_clamp_(ddp_tensor *self, int has_lo, double lo, int has_hi, double hi);
int ddp_relu_(ddp_tensor *self);
int ddp_leaky_relu_(ddp_tensor *self, double negative_slope);
int ddp_gelu_(ddp_tensor *self, int approximate_tanh);
int ddp_tanh_(ddp_tensor *self);
int ddp_sigmoid_(ddp_tensor *self);
int ddp_silu_(ddp_tensor *self);

/* ---- selection and comparison -------------------------------------------------------- */

/* out = cond ? a : b, the three broadcast together; cond bool (or u8), a and b promoted.
 * Differentiable w.r.t. a and b. */
int ddp_where(ddp_tensor **out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b);

/* Comparisons: a bool tensor of the broadcast shape, compared in the promoted dtype. Not
 * differentiable. */
int ddp_eq(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_ne(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_lt(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_le(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_gt(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_ge(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b);
int ddp_eq_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_ne_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_lt_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_le_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_gt_scalar(ddp_tensor **out, ddp_tensor *a, double s);
int ddp_ge_scalar(ddp_tensor **out, ddp_tensor *a, double s);
