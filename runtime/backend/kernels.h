/* runtime/backend/kernels.h: the kernel table, one per device type, and what its entries
 * take: the op enums, the geometry structs and the hyper-parameter structs shared by the ops
 * layer and every backend. Every op of runtime/ops/, on every device (the CPU included),
 * reaches its kernels through ddp_kernels_for(device): one driver per op, however many
 * backends (Note [one dispatch path]).
 *
 * Note [one dispatch path]: an entry takes the compute dtype first and untyped pointers
 * (outputs first, then inputs, then sizes); the typed loops live inside each backend, which
 * switches on the dtype once per call (never per element): runtime/backend/cpu/<area>.c
 * (ddp_cpu_<name>, documented in runtime/backend/cpu/<area>.h next to its typed loops
 * ddp_cpu_<name>_f32 / _f64 ...), the entry wrappers of runtime/backend/cuda/<area>.cu,
 * and the simulated device (runtime/backend/sim/plugin.c), which uses the CPU table under
 * the device's name. Pointers are device pointers for a CUDA table, and a CUDA kernel runs
 * on the current stream of the current device (asynchronously, unless its result is
 * returned to the host, as the loss totals are). The ops layer checks the dtype before it
 * calls (each entry lists the dtypes it takes); an entry never sees another one. This is
 * also the one point where autocast will cast inputs.
 *
 * An entry may be NULL in a device table: that op has no kernel there yet, and the ops
 * layer fails with "<op>: not implemented for cuda tensors" (DDP_KERNEL below).
 *
 * A kernel cannot fail on the CPU. On a GPU a launch can: after calling into a device
 * table the ops layer calls ddp_device_check(device, op), which turns a pending CUDA error
 * into a DDP error naming the op.
 *
 * Bump DDP_CUDA_PLUGIN_ABI (runtime/backend/cuda/plugin.h) whenever ddp_kernels changes. */
#ifndef DDP_BACKEND_KERNELS_H
#define DDP_BACKEND_KERNELS_H

#include "core/core.h"

/* ---- op enums ---------------------------------------------------------------------------- */

/* Binary element-wise ops (and comparisons, whose outputs are bool). Names: BIN_NAMES in
 * runtime/ops/elementwise.c, pinned to DDP_EW_BINARY_COUNT. */
enum ddp_ew_binary {
  DDP_EW_ADD, /* a + alpha * b */
  DDP_EW_SUB, /* a - alpha * b */
  DDP_EW_MUL,
  DDP_EW_DIV, /* true division */
  DDP_EW_POW, /* a ^ b */
  DDP_EW_MAX, /* maximum, NaN propagating */
  DDP_EW_MIN, /* minimum, NaN propagating */
  DDP_EW_EQ, DDP_EW_NE, DDP_EW_LT, DDP_EW_LE, DDP_EW_GT, DDP_EW_GE,
  DDP_EW_BINARY_COUNT
};

/* The differentiable binary ops are ADD .. MIN; those with an in-place form ADD .. POW. */
enum {
  DDP_EW_DIFFERENTIABLE_COUNT = DDP_EW_MIN + 1,
  DDP_EW_INPLACE_COUNT = DDP_EW_POW + 1,
};

/* Unary element-wise ops; p0, p1 are the op's parameters. Names: UN_NAMES in
 * runtime/ops/elementwise.c, pinned to DDP_EW_UNARY_COUNT. */
enum ddp_ew_unary {
  DDP_EW_NEG, DDP_EW_EXP, DDP_EW_LOG, DDP_EW_SQRT, DDP_EW_RSQRT, DDP_EW_ABS,
  DDP_EW_CLAMP,     /* p0 = min (-inf: none), p1 = max (+inf: none) */
  DDP_EW_RELU,
  DDP_EW_LEAKY_RELU, /* p0 = negative slope */
  DDP_EW_GELU,      /* exact: x * Phi(x) (Hendrycks & Gimpel, arXiv:1606.08415) */
  DDP_EW_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), same paper */
  DDP_EW_TANH, DDP_EW_SIGMOID,
  DDP_EW_SILU,      /* x * sigmoid(x) */
  DDP_EW_UNARY_COUNT
};

/* 1 when unary op's backward reads the output (exp, sqrt, rsqrt, relu, tanh, sigmoid), 0
 * when it reads the input, -1 when it reads neither (neg): what the ops layer saves. */
static inline int ddp_ew_unary_uses_output(int op) {
  switch (op) {
  case DDP_EW_NEG: return -1;
  case DDP_EW_EXP: case DDP_EW_SQRT: case DDP_EW_RSQRT: case DDP_EW_RELU: case DDP_EW_TANH:
  case DDP_EW_SIGMOID:
    return 1;
  default: return 0;
  }
}

/* What a sum kernel adds up, and what it writes. */
enum ddp_sum_mode {
  DDP_SUM_PLAIN = 0, /* out = scale * sum x */
  DDP_SUM_ABS = 1,   /* out = scale * sum |x| */
  DDP_SUM_SQRT = 2,  /* out = sqrt(sum x^2) (the 2-norm) */
  DDP_SUM_MODE_COUNT
};

/* ---- geometry ------------------------------------------------------------------------------ */

/* Sizes and options of one conv2d call. */
typedef struct {
  int64_t n, c, h, w;  /* input (N, C, H, W) */
  int64_t o, kh, kw;   /* weight (O, C / groups, kH, kW) */
  int64_t oh, ow;      /* output (N, O, OH, OW) */
  int64_t sh, sw, ph, pw, dh, dw, groups;
} ddp_conv2d_geom;

/* Sizes and options of one pooling call; planes = N * C. */
typedef struct {
  int64_t planes, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int count_include_pad;
} ddp_pool2d_geom;

/* What an attention mask holds (ddp_attention_geom.mask). */
enum ddp_attention_mask {
  DDP_ATTN_MASK_NONE = 0,
  DDP_ATTN_MASK_ADD = 1,  /* the compute dtype, added to the scaled scores */
  DDP_ATTN_MASK_BOOL = 2, /* u8 (bool): nonzero = the pair takes part, 0 = -inf */
};

/* Sizes and options of one scaled_dot_product_attention call (Note [flash attention] in
 * runtime/backend/cpu/attention.c). q (BH, L, E), k (BH, S, E) and v (BH, S, Ev) are
 * read in place from views: element (bh, i, c) of q at sum_d b_d * q_sb[d] + i * q_sl + c
 * (likewise k, v), with (b_0 .. b_nb-1) bh's batch index over the nb batch dims
 * batch_shape (row-major, BH their product); rows are contiguous and q_sl >= E (a BLAS
 * leading dimension; the same for k, v). out (BH, L, Ev), lse (BH, L) (the row logsumexp
 * of the masked, scaled scores; what backward recomputes the probabilities from), dout
 * and the gradients dq, dk, dv are contiguous. The mask, when any, is read at element
 * (bh, i, j) = sum_d b_d * mask_sb[d] + i * mask_sl + j * mask_ss (strides 0 where the
 * mask broadcasts). Dropout (dropout_p > 0) keeps element (bh, i, j) of the probabilities
 * by Note [attention dropout]. */
typedef struct {
  int64_t bh, l, s, e, ev;
  int64_t q_sb[DDP_MAX_DIMS], k_sb[DDP_MAX_DIMS], v_sb[DDP_MAX_DIMS];
  int64_t q_sl, k_sl, v_sl;
  double scale;   /* multiplies q k^T */
  int causal;     /* 1: j > i takes no part (top-left aligned, PyTorch's is_causal) */
  int mask;       /* enum ddp_attention_mask */
  int nb;
  int64_t batch_shape[DDP_MAX_DIMS], mask_sb[DDP_MAX_DIMS];
  int64_t mask_sl, mask_ss;
  double dropout_p;      /* in [0, 1) */
  uint64_t seed, offset; /* Philox key and first counter block of the dropout draws */
} ddp_attention_geom;

/* ---- optimizer hyper-parameters (formulas: ddplua/optim.h) ---------------------------------- */

/* Hyper-parameters of one SGD update (see ddp_sgd_step_). */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
  int first_step; /* 1: the momentum buffer is created now (b <- g) */
} ddp_sgd_hparams;

/* Hyper-parameters of one Adam / AdamW update, with the bias corrections of step t
 * precomputed: step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  double step_size, bc2_sqrt;
  int decoupled; /* 1: AdamW, p *= 1 - lr * weight_decay; 0: Adam, g += weight_decay * p */
  int amsgrad, maximize;
} ddp_adam_hparams;

/* Hyper-parameters of one Adadelta update. */
typedef struct {
  double lr, rho, eps, weight_decay;
  int maximize;
} ddp_adadelta_hparams;

/* ---- the table ------------------------------------------------------------------------------ */

/* Dtypes an entry takes, as its comment says them: FLOAT = DDP_F32 or DDP_F64. Shapes are
 * those of the CPU kernel of the same name (runtime/backend/cpu/<area>.h). */
typedef struct ddp_kernels {
  const char *name; /* "cpu" or "cuda": for messages */
  /* ---- copies and fills (runtime/backend/cpu/copy.h): tensors carry their dtypes ---- */
  void (*copy)(ddp_tensor *dst, const ddp_tensor *src);
  void (*fill)(ddp_tensor *t, double value);
  /* ---- elementwise (runtime/backend/cpu/elementwise.h): tensors carry their dtypes ---- */
  void (*binary)(ddp_tensor *out, ddp_tensor *a, ddp_tensor *b, int op, double alpha);
  void (*binary_backward)(ddp_tensor *d, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b, int op,
                          int wrt, double alpha);
  void (*unary)(ddp_tensor *out, ddp_tensor *x, int op, double p0, double p1);
  void (*unary_backward)(ddp_tensor *d, ddp_tensor *g, ddp_tensor *s, int op, double p0, double p1);
  void (*where)(ddp_tensor *out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b);
  /* ---- reduce (runtime/backend/cpu/reduce.h) ---- */
  /* FLOAT with any mode, or DDP_I64 with DDP_SUM_PLAIN and scale 1. */
  void (*sum)(int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B, int mode,
              double scale);
  void (*var)(int dtype /* FLOAT */, void *out, const void *x, int64_t A, int64_t R, int64_t B,
              double correction, int take_sqrt);
  /* FLOAT, DDP_I64, DDP_I32 or DDP_U8 (bool too: its bytes are u8). */
  void (*argext)(int dtype, void *values, int64_t *indices, const void *x, int64_t A, int64_t R,
                 int64_t B, int is_max);
  void (*softmax)(int dtype /* FLOAT */, void *y, const void *x, int64_t A, int64_t R, int64_t B,
                  int log);
  void (*softmax_backward)(int dtype /* FLOAT */, void *dx, const void *y, const void *dy,
                           int64_t A, int64_t R, int64_t B, int log);
  /* ---- matmul (runtime/backend/cpu/matmul.h) ---- */
  void (*gemm)(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
               int64_t ldc);
  void (*matmul_int)(int dtype, void *c, const void *a, int64_t sa0, int64_t sa1, const void *b,
                     int64_t sb0, int64_t sb1, int64_t m, int64_t n, int64_t k);
  /* Around several GEMMs run side by side on the CPU's own pool: hold the BLAS library at one
   * thread (returns the previous setting), then restore it. NULL where the GEMM library has
   * no thread pool of its own (devices). */
  int (*gemm_threads_hold)(void);
  void (*gemm_threads_restore)(int previous);
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
  /* optional, all three or none (NULL: relu_max_pool2d runs relu then max_pool2d): max
   * pooling of relu(in) in one pass; its indices are u8 when relu_max_pool2d_taps(dtype, g)
   * is 1, else i64 (CPU: Note [fused relu max pooling], Note [relu pooling taps]) */
  int (*relu_max_pool2d_taps)(int dtype, const ddp_pool2d_geom *g);
  void (*relu_max_pool2d_forward)(int dtype, void *out, void *indices, const void *in,
                                  const ddp_pool2d_geom *g);
  void (*relu_max_pool2d_backward)(int dtype, void *d_in, const void *grad_out,
                                   const void *indices, const ddp_pool2d_geom *g);
  void (*avg_pool2d_forward)(int dtype, void *out, const void *in, const ddp_pool2d_geom *g);
  void (*avg_pool2d_backward)(int dtype, void *d_in, const void *grad_out,
                              const ddp_pool2d_geom *g);
  void (*adaptive_avg_pool2d_forward)(int dtype, void *out, const void *in,
                                      const ddp_pool2d_geom *g);
  void (*adaptive_avg_pool2d_backward)(int dtype, void *d_in, const void *grad_out,
                                       const ddp_pool2d_geom *g);
  /* ---- loss (runtime/backend/cpu/loss.h): dtype FLOAT; forwards return the total ---- */
  double (*cross_entropy_forward)(int dtype, void *loss, void *lse, const void *x,
                                  const int64_t *target, const void *prob, const void *weight,
                                  int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                  double smoothing);
  void (*cross_entropy_backward)(int dtype, void *dx, const void *dloss, int dloss_per_sample,
                                 double factor, const void *x, const void *lse,
                                 const int64_t *target, const void *prob, const void *weight,
                                 int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                 double smoothing);
  double (*nll_forward)(int dtype, void *loss, const void *x, const int64_t *target,
                        const void *weight, int64_t N, int64_t C, int64_t D,
                        int64_t ignore_index);
  void (*nll_backward)(int dtype, void *dx, const void *dloss, int dloss_per_sample,
                       double factor, const int64_t *target, const void *weight, int64_t N,
                       int64_t C, int64_t D, int64_t ignore_index);
  double (*mse_forward)(int dtype, void *loss, const void *x, const void *t, int64_t n);
  void (*mse_backward)(int dtype, void *dx, void *dt, const void *dloss, int dloss_per_element,
                       double factor, const void *x, const void *t, int64_t n);
  /* ---- norm (runtime/backend/cpu/norm.h): dtype FLOAT; statistics in double ---- */
  void (*bn_moments)(int dtype, double *mean, double *var, const void *x, int64_t N, int64_t C,
                     int64_t S);
  void (*bn_sums)(int dtype, double *sum, double *sumsq, const void *x, int64_t N, int64_t C,
                  int64_t S);
  void (*bn_apply)(int dtype, void *y, const void *x, const void *mean, const void *scale,
                   const void *shift, int64_t N, int64_t C, int64_t S);
  void (*bn_backward_reduce)(int dtype, double *sum_dy, double *sum_dy_xmu, const void *dy,
                             const void *x, const void *mean, int64_t N, int64_t C, int64_t S);
  void (*bn_backward_elemt)(int dtype, void *dx, const void *dy, const void *x, const void *mean,
                            const void *a, const void *b, const void *d, int64_t N, int64_t C,
                            int64_t S);
  /* Optional, fused batch norm + ReLU (+ residual add) (Note [fused batch norm relu] in
   * runtime/ops/norm.c); a table without them gets the composition batch_norm, add, relu.
   * The forward may also write the ReLU mask as bits (f32, S % 8 == 0); the backward takes
   * the mask from those bits, else from y, else (no residual) recomputes it from x, scale
   * and shift; bn_backward_elemt_relu writes dx (it does not accumulate). */
  void (*bn_apply_relu)(int dtype, void *y, uint8_t *mask, const void *x, const void *residual,
                        const void *mean, const void *scale, const void *shift, int64_t N,
                        int64_t C, int64_t S);
  void (*bn_backward_reduce_relu)(int dtype, double *sum_dy, double *sum_dy_xmu, const void *dy,
                                  const uint8_t *mask, const void *y, const void *x,
                                  const void *mean, const void *scale, const void *shift,
                                  int64_t N, int64_t C, int64_t S);
  void (*bn_backward_elemt_relu)(int dtype, void *dx, void *dresidual, const void *dy,
                                 const uint8_t *mask, const void *y, const void *x,
                                 const void *mean, const void *scale, const void *shift,
                                 const void *a, const void *b, const void *d, int64_t N,
                                 int64_t C, int64_t S);
  void (*bn_finalize)(int dtype, void *mean_out, void *scale, void *shift, void *invstd,
                      const double *mean, const double *var, const void *w, const void *b,
                      int64_t C, double eps);
  void (*bn_running_update)(int dtype, void *running, const double *value, int64_t C,
                            double momentum, double correction);
  void (*bn_backward_coef)(int dtype, void *a, void *b, void *d, void *dweight, void *dbias,
                           const double *sum_dy, const double *sum_dy_xmu, const void *invstd,
                           const void *w, int64_t C, double M, int training);
  void (*ln_forward)(int dtype, void *y, void *mean, void *rstd, const void *x, const void *w,
                     const void *b, int64_t M, int64_t D, double eps);
  void (*ln_backward)(int dtype, void *dx, void *dw, void *db, const void *dy, const void *x,
                      const void *mean, const void *rstd, const void *w, int64_t M, int64_t D);
  /* scale is rounded to the dtype first (f32: (float)scale). */
  void (*masked_scale)(int dtype, void *y, const void *x, const uint8_t *mask, double scale,
                       int64_t n);
  /* Any dtype: rows are copied as bytes. */
  void (*embedding_forward)(char *out, const char *weight, const int64_t *idx, int64_t n,
                            int64_t row_bytes);
  void (*embedding_backward)(int dtype, void *dweight, const void *dy, const int64_t *idx,
                             int64_t n, int64_t D, int64_t padding_idx);
  /* ---- attention (runtime/backend/cpu/attention.h): dtype FLOAT ---- */
  /* out (BH, L, Ev) and lse (BH, L) <- q, k, v, mask (per g->mask; NULL when none).
   * Both return DDP_OK, or DDP_ERR_MEMORY (recorded) when the CPU's tile scratch could not
   * be allocated. */
  int (*attention_forward)(int dtype, void *out, void *lse, const void *q, const void *k,
                            const void *v, const void *mask, const ddp_attention_geom *g);
  /* dq, dk, dv (zeroed by the caller; accumulated) and dmask (BH, L, S) (written; NULL when
   * no mask gradient is wanted) <- dout (BH, L, Ev) and the forward's q, k, v, out, lse,
   * mask. Recomputes the probabilities tile by tile from lse. */
  int (*attention_backward)(int dtype, void *dq, void *dk, void *dv, void *dmask,
                             const void *dout, const void *q, const void *k, const void *v,
                             const void *out, const void *lse, const void *mask,
                             const ddp_attention_geom *g);
  /* ---- optim (runtime/backend/cpu/optim.h): dtype FLOAT, contiguous buffers of n ---- */
  void (*sgd)(int dtype, void *param, void *momentum_buffer, const void *grad, int64_t n,
              const ddp_sgd_hparams *h);
  /* The SGD update of `count` parameters in one call (ddp_sgd_step_foreach_): param[i],
   * momentum_buffer[i] (NULL when momentum == 0) and grad[i], numel[i] elements each;
   * first_step[i] replaces h->first_step for parameter i. Optional (NULL: the front door
   * runs `sgd` per parameter). */
  void (*sgd_multi)(int dtype, int64_t count, void *const *param, void *const *momentum_buffer,
                    const void *const *grad, const int64_t *numel, const int *first_step,
                    const ddp_sgd_hparams *h);
  void (*adam)(int dtype, void *param, void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
               const void *grad, int64_t n, const ddp_adam_hparams *h);
  void (*adadelta)(int dtype, void *param, void *square_avg, void *acc_delta, const void *grad,
                   int64_t n, const ddp_adadelta_hparams *h);
  /* Sum of |x|^p, resp. max |x| (NaN propagating), returned to the host. */
  double (*abs_pow_sum)(int dtype, const void *x, int64_t n, double p);
  double (*abs_max)(int dtype, const void *x, int64_t n);
  void (*scale)(int dtype, void *x, int64_t n, double s);
  void (*clamp)(int dtype, void *x, int64_t n, double lo, double hi);
  /* GradScaler's unscale (Note [unscale in one pass], cpu/optim.c): x *= inv_scale in place;
   * returns 1.0 when any element was inf or NaN before, else 0.0, to the host
   * (synchronously); NaN with the error recorded when the kernel failed. */
  double (*non_finite_check_and_unscale)(int dtype, void *x, int64_t n, double inv_scale);
  /* ---- shape (runtime/backend/cpu/shape.h): element sizes or dtypes as each says ---- */
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
  /* ---- the comm layer's arithmetic (Note [reduction entries]; CPU:
   *      runtime/backend/cpu/collective.h, CUDA: runtime/backend/cuda/collective.cu) ---- */
  /* out[i] = (((in[0][lo+i] op in[1][lo+i]) op in[2][lo+i]) ... op in[k-1][lo+i]) for i in
   * [0, n); AVG is that SUM divided by k. dtype F32 or F64; `in` is a host array of k >= 1
   * pointers (device pointers on a device; k <= DDP_REDUCE_INPUTS_MAX there). */
  void (*reduce_inputs)(int dtype, void *out, const void *const *in, int k, int64_t lo,
                        int64_t n, int op);
  /* The same reduction written back into every buffer: buf[j][i] = r for every j, i in
   * [lo, lo + n); the k buffers do not overlap. */
  void (*reduce_inputs_all)(int dtype, void *const *buf, int k, int64_t lo, int64_t n, int op);
  /* out[i] = x[i] * s (divide = 0) or x[i] / s (divide = 1), computed in f32 for f32, f16
   * and bf16 and in f64 for f64, rounded once; out may be x. */
  void (*scale_into)(int dtype, void *out, const void *x, int64_t n, double s, int divide);
  /* out[i] = round_out(round_out(x[i]) * s) (divide = 0) or round_out(round_out(x[i]) / s)
   * (divide = 1): x cast to out_dtype, then scaled there as scale_into does (PyTorch's
   * x.to(out_dtype).div_(s) of the compress hooks); s == 1 is a plain cast. Both dtypes
   * among F32, F64, F16, BF16; out and x do not overlap. */
  void (*cast_scale)(int out_dtype, void *out, int in_dtype, const void *x, int64_t n, double s,
                     int divide);
} ddp_kernels;

/* Note [reduction entries]: what the communication layer (runtime/comm/) and its clients
 * (the DDP reducer and comm hooks in runtime/distributed/) compute on data is four entries
 * of the kernel table, never typed loops of their own: reduce_inputs (sum, avg, min, max,
 * product of k inputs into an output, in rank order: the shared-memory collectives reduce
 * each rank's slice with it straight from the peers' buffers), reduce_inputs_all (the same,
 * stored back into every input: the zero-copy shared-memory all-reduce), scale_into (the
 * reducer's gradient averaging, AVG's division after a Gloo sum) and cast_scale (the fp16 /
 * bf16 compress hooks' cast and division, and their cast back). Each element is combined in
 * the order in[0], in[1], ..., in[k-1] in every lane, so every rank that computes an element
 * computes the same bits whatever its alignment, n or slice. MIN / MAX keep
 * `x < acc ? x : acc` / `x > acc ? x : acc` with x the next input (a NaN in acc is replaced
 * by x, a NaN in x is skipped), as the vector min/max instructions do. The ops layer reaches
 * them as ops too (ddp_reduce_tensors, ddp_scale_into, ddp_cast_scale_into in
 * ddplua/ops_reduce.h), which is how the backend-ops harness checks every device against
 * the CPU. */
enum { DDP_REDUCE_INPUTS_MAX = 64 };

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
