/* runtime/backend/cpu/optim.c: the fused optimizer updates and the clipping kernels (see
 * optim.h). One pass per parameter: each element's gradient, state and parameter are read
 * once and written once. The f32 and f64 kernels are the same code instantiated twice by
 * the DEFINE_* macros below (T the element type); the hyper-parameters are converted to T
 * once so the loops stay in T's precision and vectorise. */
#include "backend/cpu/optim.h"

#include <math.h>
#include <stdlib.h>

#include "core/core.h"

/* Note [optimizer update order]: every kernel follows the algorithm box of PyTorch's page
 * for the optimizer line by line (ddplua/optim.h quotes them): maximize negates the
 * gradient first, L2 weight decay is added to the gradient next (AdamW's decoupled decay
 * scales the parameter instead), then the state is updated, then the parameter. */

#define DEFINE_SGD(SUFFIX, T)                                                               \
  void ddp_cpu_sgd_##SUFFIX(T *restrict param, T *restrict buf, const T *restrict grad,     \
                            int64_t n, const ddp_sgd_hparams *h) {                          \
    /* flags read once: through h the compiler could not hoist them, and the loop would not \
     * vectorise */                                                                         \
    const T lr = (T)h->lr, mu = (T)h->momentum, damp = (T)(1.0 - h->dampening);             \
    const T wd = (T)h->weight_decay, sign = h->maximize ? (T)-1 : (T)1;                     \
    const int use_wd = h->weight_decay != 0, use_mom = h->momentum != 0 && buf;            \
    const int first = h->first_step, nesterov = h->nesterov;                                \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T g = sign * grad[i];                                                                 \
      if (use_wd) g += wd * param[i];                                                       \
      if (use_mom) {                                                                        \
        T b = first ? g : mu * buf[i] + damp * g;                                           \
        buf[i] = b;                                                                         \
        g = nesterov ? g + mu * b : b;                                                      \
      }                                                                                     \
      param[i] -= lr * g;                                                                   \
    }                                                                                       \
  }

DEFINE_SGD(f32, float)
DEFINE_SGD(f64, double)

/* The parameter step is PyTorch's rearrangement of the documented
 * p -= lr * m_hat / (sqrt(v_hat) + eps): with m_hat = m / bc1 and v_hat = v / bc2 it is
 * p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps), the same value. */
#define DEFINE_ADAM(SUFFIX, T, SQRT)                                                        \
  void ddp_cpu_adam_##SUFFIX(T *param, T *m, T *v, T *vmax, const T *grad, int64_t n,       \
                             const ddp_adam_hparams *h) {                                   \
    const T b1 = (T)h->beta1, b2 = (T)h->beta2, eps = (T)h->eps;                            \
    const T one_b1 = (T)(1.0 - h->beta1), one_b2 = (T)(1.0 - h->beta2);                     \
    const T step_size = (T)h->step_size, bc2_sqrt = (T)h->bc2_sqrt;                         \
    const T wd = (T)h->weight_decay, decay = (T)(1.0 - h->lr * h->weight_decay);            \
    const T sign = h->maximize ? (T)-1 : (T)1;                                              \
    const int l2 = !h->decoupled && h->weight_decay != 0;                                   \
    const int decoupled = h->decoupled && h->weight_decay != 0;                             \
    const int ams = h->amsgrad && vmax;                                                     \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T p = param[i];                                                                       \
      T g = sign * grad[i];                                                                 \
      if (decoupled) p *= decay;                                                            \
      if (l2) g += wd * p;                                                                  \
      T mi = b1 * m[i] + one_b1 * g;                                                        \
      T vi = b2 * v[i] + one_b2 * g * g;                                                    \
      m[i] = mi;                                                                            \
      v[i] = vi;                                                                            \
      if (ams) {                                                                            \
        T mx = vmax[i];                                                                     \
        vi = (vi > mx || vi != vi) ? vi : mx; /* NaN kept, as torch.maximum */              \
        vmax[i] = vi;                                                                       \
      }                                                                                     \
      param[i] = p - step_size * mi / (SQRT(vi) / bc2_sqrt + eps);                          \
    }                                                                                       \
  }

DEFINE_ADAM(f32, float, sqrtf)
DEFINE_ADAM(f64, double, sqrt)

#define DEFINE_ADADELTA(SUFFIX, T, SQRT)                                                    \
  void ddp_cpu_adadelta_##SUFFIX(T *param, T *sq, T *acc, const T *grad, int64_t n,         \
                                 const ddp_adadelta_hparams *h) {                           \
    const T lr = (T)h->lr, rho = (T)h->rho, one_rho = (T)(1.0 - h->rho), eps = (T)h->eps;   \
    const T wd = (T)h->weight_decay, sign = h->maximize ? (T)-1 : (T)1;                     \
    const int use_wd = h->weight_decay != 0;                                                \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T g = sign * grad[i];                                                                 \
      if (use_wd) g += wd * param[i];                                                       \
      T v = rho * sq[i] + one_rho * g * g;                                                  \
      T dx = SQRT(acc[i] + eps) / SQRT(v + eps) * g;                                        \
      sq[i] = v;                                                                            \
      acc[i] = rho * acc[i] + one_rho * dx * dx;                                            \
      param[i] -= lr * dx;                                                                  \
    }                                                                                       \
  }

DEFINE_ADADELTA(f32, float, sqrtf)
DEFINE_ADADELTA(f64, double, sqrt)

#define DEFINE_CLIP(SUFFIX, T)                                                              \
  double ddp_cpu_abs_pow_sum_##SUFFIX(const T *x, int64_t n, double p) {                    \
    double s = 0;                                                                           \
    if (p == 2) {                                                                           \
      for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];                     \
    } else if (p == 1) {                                                                    \
      for (int64_t i = 0; i < n; i++) s += fabs((double)x[i]);                              \
    } else {                                                                                \
      for (int64_t i = 0; i < n; i++) s += pow(fabs((double)x[i]), p);                      \
    }                                                                                       \
    return s;                                                                               \
  }                                                                                         \
  double ddp_cpu_abs_max_##SUFFIX(const T *x, int64_t n) {                                  \
    double m = 0;                                                                           \
    for (int64_t i = 0; i < n; i++) {                                                       \
      double a = fabs((double)x[i]);                                                        \
      if (a != a) return a;                                                                 \
      if (a > m) m = a;                                                                     \
    }                                                                                       \
    return m;                                                                               \
  }                                                                                         \
  void ddp_cpu_scale_##SUFFIX(T *x, int64_t n, double s) {                                  \
    const T c = (T)s;                                                                       \
    for (int64_t i = 0; i < n; i++) x[i] *= c;                                              \
  }                                                                                         \
  void ddp_cpu_clamp_##SUFFIX(T *x, int64_t n, double lo, double hi) {                      \
    const T l = (T)lo, u = (T)hi;                                                           \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T v = x[i];                                                                           \
      if (v < l) v = l;                                                                     \
      if (v > u) v = u;                                                                     \
      x[i] = v;                                                                             \
    }                                                                                       \
  }

DEFINE_CLIP(f32, float)
DEFINE_CLIP(f64, double)

/* Note [unscale in one pass]: GradScaler.unscale_ (PyTorch's
 * _amp_foreach_non_finite_check_and_unscale_) reads each gradient element once: it tests
 * the element for inf/NaN and multiplies it by 1/scale in the same pass. Every element is
 * multiplied, found or not (the step is skipped anyway when one was found), and the test
 * looks at the element before the multiplication, as PyTorch's kernel does. */
#define DEFINE_UNSCALE(SUFFIX, T)                                                           \
  int ddp_cpu_unscale_##SUFFIX(T *x, int64_t n, double inv_scale) {                         \
    const T c = (T)inv_scale;                                                               \
    int found = 0;                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                       \
      T v = x[i];                                                                           \
      found |= !isfinite(v);                                                                \
      x[i] = v * c;                                                                         \
    }                                                                                       \
    return found;                                                                           \
  }

DEFINE_UNSCALE(f32, float)
DEFINE_UNSCALE(f64, double)

/* ---- table entries: a dtype switch per thread chunk, never per element ------------------- */

enum {
  SGD_GRAIN = 1 << 15,   /* cheap element-wise work: ~32K elements per thread chunk */
  ADAM_GRAIN = 1 << 14,  /* a sqrt and a division per element */
  CLIP_BLOCK = 1 << 14,  /* elements per partial result of the clipping norm */
};

enum { KIND_SGD, KIND_ADAM, KIND_ADADELTA, KIND_SCALE, KIND_CLAMP };

typedef struct {
  int kind, dtype;
  const void *h;         /* hyper-parameters (updates) */
  char *base[5];         /* buffers in entry argument order (NULL: absent) */
  double s, lo, hi;      /* scale, clamp */
} range_ctx;

/* Buffer k of c advanced to element `begin`. */
static void *at(const range_ctx *c, int k, int64_t begin) {
  if (!c->base[k]) return NULL;
  return c->base[k] + (size_t)begin * ddp_dtype_size(c->dtype);
}

static void run_range(void *vctx, int64_t begin, int64_t end) {
  const range_ctx *c = vctx;
  int64_t n = end - begin;
  int f64 = c->dtype == DDP_F64;
  void *b0 = at(c, 0, begin), *b1 = at(c, 1, begin), *b2 = at(c, 2, begin), *b3 = at(c, 3, begin),
       *b4 = at(c, 4, begin);
  switch (c->kind) {
  case KIND_SGD:
    if (f64) ddp_cpu_sgd_f64(b0, b1, b2, n, c->h);
    else ddp_cpu_sgd_f32(b0, b1, b2, n, c->h);
    break;
  case KIND_ADAM:
    if (f64) ddp_cpu_adam_f64(b0, b1, b2, b3, b4, n, c->h);
    else ddp_cpu_adam_f32(b0, b1, b2, b3, b4, n, c->h);
    break;
  case KIND_ADADELTA:
    if (f64) ddp_cpu_adadelta_f64(b0, b1, b2, b3, n, c->h);
    else ddp_cpu_adadelta_f32(b0, b1, b2, b3, n, c->h);
    break;
  case KIND_SCALE:
    if (f64) ddp_cpu_scale_f64(b0, n, c->s);
    else ddp_cpu_scale_f32(b0, n, c->s);
    break;
  case KIND_CLAMP:
    if (f64) ddp_cpu_clamp_f64(b0, n, c->lo, c->hi);
    else ddp_cpu_clamp_f32(b0, n, c->lo, c->hi);
    break;
  }
}

void ddp_cpu_sgd(int dtype, void *param, void *momentum_buffer, const void *grad, int64_t n,
                 const ddp_sgd_hparams *h) {
  range_ctx c = {KIND_SGD, dtype, h, {param, momentum_buffer, (char *)grad}};
  ddp_parallel_for(n, SGD_GRAIN, run_range, &c);
}

/* Note [multi-tensor SGD]: an optimizer step over many parameters (PyTorch's foreach
 * path, torch/optim/sgd.py _multi_tensor_sgd) is one job here: the parameters' elements
 * are numbered one after another (parameter 0's, then 1's, ...) and that range is split
 * over the pool by SGD_GRAIN elements, each piece running the per-tensor kernel over its
 * part of one or more parameters. One fork-join per step instead of one per parameter, and
 * the small tensors (biases) ride along with the big ones. Every element is computed by
 * the same typed kernel with the same hyper-parameters as ddp_cpu_sgd computes it, so the
 * result is bitwise the same as the per-parameter step whatever the split. */
typedef struct {
  int dtype;
  int64_t count;
  void *const *param, *const *buf;
  const void *const *grad;
  const int64_t *numel, *start; /* start[i]: index of parameter i's element 0 */
  const int *first;
  const ddp_sgd_hparams *h;
} multi_ctx;

static void run_multi(void *vctx, int64_t begin, int64_t end) {
  const multi_ctx *c = vctx;
  size_t es = ddp_dtype_size(c->dtype);
  int64_t i = 0;
  while (i + 1 < c->count && c->start[i + 1] <= begin) i++;
  for (; i < c->count && c->start[i] < end; i++) {
    int64_t lo = begin > c->start[i] ? begin - c->start[i] : 0;
    int64_t hi = end - c->start[i] < c->numel[i] ? end - c->start[i] : c->numel[i];
    if (hi <= lo) continue;
    ddp_sgd_hparams h = *c->h;
    h.first_step = c->first[i];
    char *p = (char *)c->param[i] + (size_t)lo * es, *g = (char *)c->grad[i] + (size_t)lo * es;
    char *b = c->buf[i] ? (char *)c->buf[i] + (size_t)lo * es : NULL;
    if (c->dtype == DDP_F64) ddp_cpu_sgd_f64((double *)p, (double *)b, (const double *)g, hi - lo, &h);
    else ddp_cpu_sgd_f32((float *)p, (float *)b, (const float *)g, hi - lo, &h);
  }
}

void ddp_cpu_sgd_multi(int dtype, int64_t count, void *const *param, void *const *momentum_buffer,
                       const void *const *grad, const int64_t *numel, const int *first_step,
                       const ddp_sgd_hparams *h) {
  enum { ON_STACK = 64 };
  int64_t stack_start[ON_STACK], *start = stack_start, total = 0;
  if (count > ON_STACK && !(start = malloc(sizeof(int64_t) * (size_t)count))) {
    for (int64_t i = 0; i < count; i++) { /* no memory for the offsets: one job per tensor */
      ddp_sgd_hparams hi = *h;
      hi.first_step = first_step[i];
      ddp_cpu_sgd(dtype, param[i], momentum_buffer[i], grad[i], numel[i], &hi);
    }
    return;
  }
  for (int64_t i = 0; i < count; i++) start[i] = total, total += numel[i];
  multi_ctx c = {dtype, count, param, momentum_buffer, grad, numel, start, first_step, h};
  ddp_parallel_for(total, SGD_GRAIN, run_multi, &c);
  if (start != stack_start) free(start);
}

void ddp_cpu_adam(int dtype, void *param, void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
                  const void *grad, int64_t n, const ddp_adam_hparams *h) {
  range_ctx c = {KIND_ADAM, dtype, h, {param, exp_avg, exp_avg_sq, max_exp_avg_sq, (char *)grad}};
  ddp_parallel_for(n, ADAM_GRAIN, run_range, &c);
}

void ddp_cpu_adadelta(int dtype, void *param, void *square_avg, void *acc_delta, const void *grad,
                      int64_t n, const ddp_adadelta_hparams *h) {
  range_ctx c = {KIND_ADADELTA, dtype, h, {param, square_avg, acc_delta, (char *)grad}};
  ddp_parallel_for(n, ADAM_GRAIN, run_range, &c);
}

void ddp_cpu_scale(int dtype, void *x, int64_t n, double s) {
  range_ctx c = {KIND_SCALE, dtype, NULL, {x}, .s = s};
  ddp_parallel_for(n, SGD_GRAIN, run_range, &c);
}

void ddp_cpu_clamp(int dtype, void *x, int64_t n, double lo, double hi) {
  range_ctx c = {KIND_CLAMP, dtype, NULL, {x}, .lo = lo, .hi = hi};
  ddp_parallel_for(n, SGD_GRAIN, run_range, &c);
}

typedef struct {
  const char *data;
  int dtype;
  int64_t n;
  double p;        /* norm order; INFINITY: max |x| */
  double *partial; /* one per block */
} norm_ctx;

static void norm_blocks(void *vctx, int64_t begin, int64_t end) {
  const norm_ctx *c = vctx;
  size_t es = ddp_dtype_size(c->dtype);
  for (int64_t b = begin; b < end; b++) {
    int64_t lo = b * CLIP_BLOCK, len = c->n - lo < CLIP_BLOCK ? c->n - lo : CLIP_BLOCK;
    const void *x = c->data + (size_t)lo * es;
    if (isinf(c->p))
      c->partial[b] = c->dtype == DDP_F64 ? ddp_cpu_abs_max_f64(x, len) : ddp_cpu_abs_max_f32(x, len);
    else
      c->partial[b] = c->dtype == DDP_F64 ? ddp_cpu_abs_pow_sum_f64(x, len, c->p)
                                          : ddp_cpu_abs_pow_sum_f32(x, len, c->p);
  }
}

/* Sum of |x|^p (or max |x| for p = inf) from fixed-size blocks, combined in block order. */
static double norm_reduce(int dtype, const void *x, int64_t n, double p) {
  int64_t nblocks = (n + CLIP_BLOCK - 1) / CLIP_BLOCK;
  double *partial = malloc(sizeof(double) * (size_t)(nblocks > 0 ? nblocks : 1));
  if (!partial) {
    DDP_ERROR(DDP_ERR_MEMORY, "clip_grad_norm_: out of memory");
    return NAN;
  }
  norm_ctx c = {x, dtype, n, p, partial};
  ddp_parallel_for(nblocks, 2, norm_blocks, &c);
  double acc = 0;
  for (int64_t b = 0; b < nblocks; b++) {
    if (isinf(p)) acc = (partial[b] > acc || partial[b] != partial[b]) ? partial[b] : acc;
    else acc += partial[b];
  }
  free(partial);
  return acc;
}

double ddp_cpu_abs_pow_sum(int dtype, const void *x, int64_t n, double p) {
  return norm_reduce(dtype, x, n, p);
}

double ddp_cpu_abs_max(int dtype, const void *x, int64_t n) {
  return norm_reduce(dtype, x, n, INFINITY);
}

typedef struct {
  char *data;
  int dtype;
  int64_t n;
  double inv_scale;
  unsigned char *found; /* one flag per block of CLIP_BLOCK elements */
} unscale_ctx;

static void unscale_blocks(void *vctx, int64_t begin, int64_t end) {
  const unscale_ctx *c = vctx;
  size_t es = ddp_dtype_size(c->dtype);
  for (int64_t b = begin; b < end; b++) {
    int64_t lo = b * CLIP_BLOCK, len = c->n - lo < CLIP_BLOCK ? c->n - lo : CLIP_BLOCK;
    void *x = c->data + (size_t)lo * es;
    c->found[b] = (unsigned char)(c->dtype == DDP_F64 ? ddp_cpu_unscale_f64(x, len, c->inv_scale)
                                                      : ddp_cpu_unscale_f32(x, len, c->inv_scale));
  }
}

/* Blocks of CLIP_BLOCK elements over the thread pool, each with its own flag (no two
 * threads write one flag), or-ed here. */
double ddp_cpu_non_finite_check_and_unscale(int dtype, void *x, int64_t n, double inv_scale) {
  int64_t nblocks = (n + CLIP_BLOCK - 1) / CLIP_BLOCK;
  unsigned char *found = calloc((size_t)(nblocks > 0 ? nblocks : 1), 1);
  if (!found) {
    DDP_ERROR(DDP_ERR_MEMORY, "unscale_: out of memory");
    return NAN;
  }
  unscale_ctx c = {x, dtype, n, inv_scale, found};
  ddp_parallel_for(nblocks, 2, unscale_blocks, &c);
  int any = 0;
  for (int64_t b = 0; b < nblocks; b++) any |= found[b];
  free(found);
  return any ? 1.0 : 0.0;
}
