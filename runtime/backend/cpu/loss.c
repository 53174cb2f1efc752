/* runtime/backend/cpu/loss.c: CPU kernels of the loss functions (see loss.h for layouts).
 *
 * Cross-entropy is fused: one forward pass per sample computes the stable log-sum-exp
 * (max subtracted first) and the loss from it; the backward computes
 * softmax * sum(q) - q straight from the saved log-sum-exp, with no log-softmax tensor in
 * between. Both kernels are written once for f32 and f64 by DEFINE_LOSS_KERNELS: f32
 * computes in float (tgmath's exp/log pick expf/logf) and adds the per-sample losses in
 * double.
 *
 * Note [deterministic loss sums]: forward sums are split into fixed-size chunks of
 * samples, each chunk summed on its own (in parallel when there are several), then the
 * chunk sums added in chunk order. The chunk size depends only on C, never on the thread
 * count, so the same inputs give the same bits with 1 or 2 threads. */
/* Float comparisons may be if-converted into selects: without this, GCC keeps a branch
 * per clamp in exp_f32 (a comparison "may trap") and no class loop vectorises. It changes
 * only floating-point exception flags, never values (NaN and inf handling stay IEEE). */
#pragma GCC optimize("no-trapping-math")

#include <stdlib.h>
#include <tgmath.h>

#include "backend/cpu/loss.h"
#include "core/core.h"

enum {
  CE_CHUNK_VALUES = 16384, /* class values per chunk of cross-entropy samples (exp-heavy) */
  MSE_CHUNK = 32768,       /* elements per chunk of the cheap element-wise MSE */
  STACK_PARTIALS = 64      /* chunk sums kept on the stack below this many chunks */
};

/* Samples per cross-entropy chunk: about CE_CHUNK_VALUES class values. */
static int64_t ce_chunk(int64_t C) {
  int64_t samples = CE_CHUNK_VALUES / (C > 0 ? C : 1);
  return samples > 0 ? samples : 1;
}

/* ---- chunked deterministic sums (Note [deterministic loss sums]) ---------------------- */

typedef double (*chunk_sum_fn)(const void *ctx, int64_t begin, int64_t end);

typedef struct {
  chunk_sum_fn fn;
  const void *ctx;
  int64_t n, chunk;
  double *partial; /* (number of chunks) */
} chunked_sum;

static void chunked_sum_range(void *vctx, int64_t begin, int64_t end) {
  chunked_sum *s = vctx;
  for (int64_t k = begin; k < end; k++) {
    int64_t lo = k * s->chunk;
    int64_t hi = lo + s->chunk < s->n ? lo + s->chunk : s->n;
    s->partial[k] = s->fn(s->ctx, lo, hi);
  }
}

/* Sum of fn over [0, n) in chunks of `chunk` items, the chunks spread over the pool. */
static double sum_in_chunks(chunk_sum_fn fn, const void *ctx, int64_t n, int64_t chunk) {
  if (n <= chunk) return n > 0 ? fn(ctx, 0, n) : 0.0;
  int64_t nchunks = (n + chunk - 1) / chunk;
  double stack[STACK_PARTIALS];
  double *partial = nchunks <= STACK_PARTIALS ? stack : malloc((size_t)nchunks * sizeof *partial);
  chunked_sum s = {fn, ctx, n, chunk, partial};
  if (partial) {
    ddp_parallel_for(nchunks, 1, chunked_sum_range, &s);
  }
  double total = 0;
  for (int64_t k = 0; k < nchunks; k++) {
    if (partial) {
      total += partial[k];
    } else { /* no memory for the chunk sums: the same chunks, serially */
      int64_t lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
      total += fn(ctx, lo, hi);
    }
  }
  if (partial && partial != stack) free(partial);
  return total;
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- a vectorisable expf ---------------------------------------------------------------
 *
 * libm's expf is a call per element, which no loop vectorises: it was most of the cost of
 * cross-entropy. This one is branch-free, so GCC turns the class loops into AVX2 code:
 * Cody-Waite range reduction x = n ln2 + r (ln2 split in a high part exact in float and a
 * low part), e^r by the degree-6 minimax polynomial of Cephes' expf (S. Moshier, Cephes
 * Math Library, expf.c; relative error about 1 ulp), and 2^n built in the exponent bits.
 * Inputs below -87.3 give 0, above 88.7 give inf, NaN stays NaN. */
ALWAYS_INLINE float exp_f32(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504f;
  float xc = x < hi ? x : hi;
  xc = xc > lo ? xc : lo;
  const float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union {
    int32_t i;
    float f;
  } scale = {.i = ((int32_t)n + 127) << 23};
  float e = p * scale.f;
  e = x < lo ? 0.0f : e;
  e = x > 88.7228390f ? __builtin_inff() : e;
  return x != x ? x : e;
}

/* f64 keeps libm's exp: it is the reference precision (gradient checks run in f64). */
ALWAYS_INLINE double exp_f64(double x) { return exp(x); }

/* Accumulators the unit-stride class loops keep, so max and sum vectorise (a single
 * running float sum cannot be reordered by the compiler). */
enum { LANES = 8 };

/* The kernels for one floating type T (float or double), suffix SFX (f32 or f64). The
 * per-sample functions take the class stride D as an argument and are called with the
 * literal 1 for (N, C) inputs, so that common case compiles to unit-stride loops. */
#define DEFINE_LOSS_KERNELS(T, SFX)                                                                \
                                                                                                   \
  /* log(sum_c exp(x[c * D])), the maximum subtracted first. */                                    \
  ALWAYS_INLINE T log_sum_exp_##SFX(const T *x, int64_t C, int64_t D) {                            \
    T m = -INFINITY, s = 0;                                                                        \
    if (D == 1 && C >= LANES) {                                                                    \
      T mv[LANES], sv[LANES];                                                                      \
      int64_t c = LANES;                                                                           \
      for (int j = 0; j < LANES; j++) mv[j] = x[j];                                                \
      for (; c + LANES <= C; c += LANES)                                                           \
        for (int j = 0; j < LANES; j++) mv[j] = x[c + j] > mv[j] ? x[c + j] : mv[j];               \
      for (int j = 0; j < LANES; j++) m = mv[j] > m ? mv[j] : m;                                   \
      for (; c < C; c++) m = x[c] > m ? x[c] : m;                                                  \
      for (int j = 0; j < LANES; j++) sv[j] = 0;                                                   \
      for (c = 0; c + LANES <= C; c += LANES)                                                      \
        for (int j = 0; j < LANES; j++) sv[j] += exp_##SFX(x[c + j] - m);                          \
      for (int j = 0; j < LANES; j++) s += sv[j];                                                  \
      for (; c < C; c++) s += exp_##SFX(x[c] - m);                                                 \
    } else {                                                                                       \
      for (int64_t c = 0; c < C; c++) m = x[c * D] > m ? x[c * D] : m;                             \
      for (int64_t c = 0; c < C; c++) s += exp_##SFX(x[c * D] - m);                                \
    }                                                                                              \
    return m + log(s);                                                                             \
  }                                                                                                \
                                                                                                   \
  typedef struct {                                                                                 \
    T *loss, *lse;                                                                                 \
    const T *x, *prob, *weight;                                                                    \
    const int64_t *target;                                                                         \
    int64_t C, D, ignore_index;                                                                    \
    double eps;                                                                                    \
  } ce_forward_ctx_##SFX;                                                                          \
                                                                                                   \
  /* One sample's log-sum-exp and loss. */                                                         \
  ALWAYS_INLINE double ce_sample_forward_##SFX(const ce_forward_ctx_##SFX *k, int64_t i,           \
                                               int64_t D) {                                        \
    const int64_t C = k->C, n = i / D, d = i - n * D;                                              \
    const T *x = k->x + n * C * D + d;                                                             \
    const T *w = k->weight;                                                                        \
    const T l = log_sum_exp_##SFX(x, C, D);                                                        \
    k->lse[i] = l;                                                                                 \
    const T a = (T)(1 - k->eps), b = C > 0 ? (T)(k->eps / (double)C) : 0;                          \
    double loss;                                                                                   \
    if (k->target) {                                                                               \
      const int64_t y = k->target[i];                                                              \
      if (y == k->ignore_index) {                                                                  \
        loss = 0;                                                                                  \
      } else {                                                                                     \
        loss = -(double)(w ? w[y] : 1) * (double)(x[y * D] - l);                                   \
        if (k->eps > 0) { /* (1 - eps) * nll + (eps / C) * (-sum_c w_c logp_c) */                  \
          T sw = 0;                                                                                \
          if (w)                                                                                   \
            for (int64_t c = 0; c < C; c++) sw += w[c] * (x[c * D] - l);                           \
          else                                                                                     \
            for (int64_t c = 0; c < C; c++) sw += x[c * D] - l;                                    \
          loss = (double)a * loss - (double)b * (double)sw;                                        \
        }                                                                                          \
      }                                                                                            \
    } else { /* -sum_c w_c ((1 - eps) t_c + eps / C) logp_c */                                     \
      const T *t = k->prob + n * C * D + d;                                                        \
      T sw = 0;                                                                                    \
      for (int64_t c = 0; c < C; c++) {                                                            \
        T q = a * t[c * D] + b;                                                                    \
        if (w) q *= w[c];                                                                          \
        sw += q * (x[c * D] - l);                                                                  \
      }                                                                                            \
      loss = -(double)sw;                                                                          \
    }                                                                                              \
    if (k->loss) k->loss[i] = (T)loss;                                                             \
    return loss;                                                                                   \
  }                                                                                                \
                                                                                                   \
  static double ce_forward_chunk_##SFX(const void *vctx, int64_t begin, int64_t end) {             \
    const ce_forward_ctx_##SFX *k = vctx;                                                          \
    double s = 0;                                                                                  \
    if (k->D == 1)                                                                                 \
      for (int64_t i = begin; i < end; i++) s += ce_sample_forward_##SFX(k, i, 1);                 \
    else                                                                                           \
      for (int64_t i = begin; i < end; i++) s += ce_sample_forward_##SFX(k, i, k->D);              \
    return s;                                                                                      \
  }                                                                                                \
                                                                                                   \
  double ddp_cpu_cross_entropy_forward_##SFX(T *loss, T *lse, const T *x, const int64_t *target,   \
                                             const T *prob, const T *weight, int64_t N, int64_t C, \
                                             int64_t D, int64_t ignore_index, double smoothing) {  \
    ce_forward_ctx_##SFX k = {loss, lse, x, prob, weight, target, C, D, ignore_index, smoothing};  \
    return sum_in_chunks(ce_forward_chunk_##SFX, &k, N * D, ce_chunk(C));                          \
  }                                                                                                \
                                                                                                   \
  typedef struct {                                                                                 \
    T *dx;                                                                                         \
    const T *dloss, *x, *lse, *prob, *weight;                                                      \
    const int64_t *target;                                                                         \
    int dloss_per_sample;                                                                          \
    double factor, eps, weight_sum;                                                                \
    int64_t C, D, ignore_index;                                                                    \
  } ce_backward_ctx_##SFX;                                                                         \
                                                                                                   \
  /* dx_c += scale * (p_c * Q - q_c), p = exp(x - lse), Q = sum_c q_c. */                          \
  ALWAYS_INLINE void ce_sample_backward_##SFX(const ce_backward_ctx_##SFX *k, int64_t i,           \
                                              int64_t D) {                                         \
    const int64_t C = k->C, n = i / D, d = i - n * D;                                              \
    const T *x = k->x + n * C * D + d;                                                             \
    T *dx = k->dx + n * C * D + d;                                                                 \
    const T *w = k->weight;                                                                        \
    const T scale = (T)(k->factor * (double)k->dloss[k->dloss_per_sample ? i : 0]);                \
    const T l = k->lse[i];                                                                         \
    const T a = (T)(1 - k->eps), b = C > 0 ? (T)(k->eps / (double)C) : 0;                          \
    if (k->target) {                                                                               \
      const int64_t y = k->target[i];                                                              \
      if (y == k->ignore_index) return;                                                            \
      const T wy = w ? w[y] : 1;                                                                   \
      if (k->eps == 0) { /* q = wy * onehot(y) */                                                  \
        const T sc = scale * wy;                                                                   \
        for (int64_t c = 0; c < C; c++) dx[c * D] += sc * exp_##SFX(x[c * D] - l);                 \
        dx[y * D] -= sc;                                                                           \
        return;                                                                                    \
      }                                                                                            \
      /* q_c = (1 - eps) wy [c == y] + (eps / C) w_c */                                            \
      const T Q = a * wy + b * (T)k->weight_sum;                                                   \
      for (int64_t c = 0; c < C; c++)                                                              \
        dx[c * D] += scale * (exp_##SFX(x[c * D] - l) * Q - b * (w ? w[c] : 1));                   \
      dx[y * D] -= scale * a * wy;                                                                 \
    } else {                                                                                       \
      const T *t = k->prob + n * C * D + d;                                                        \
      T Q = 0;                                                                                     \
      for (int64_t c = 0; c < C; c++) Q += (a * t[c * D] + b) * (w ? w[c] : 1);                    \
      for (int64_t c = 0; c < C; c++)                                                              \
        dx[c * D] += scale * (exp_##SFX(x[c * D] - l) * Q - (a * t[c * D] + b) * (w ? w[c] : 1));  \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  static void ce_backward_range_##SFX(void *vctx, int64_t begin, int64_t end) {                    \
    const ce_backward_ctx_##SFX *k = vctx;                                                         \
    if (k->D == 1)                                                                                 \
      for (int64_t i = begin; i < end; i++) ce_sample_backward_##SFX(k, i, 1);                     \
    else                                                                                           \
      for (int64_t i = begin; i < end; i++) ce_sample_backward_##SFX(k, i, k->D);                  \
  }                                                                                                \
                                                                                                   \
  void ddp_cpu_cross_entropy_backward_##SFX(                                                       \
      T *dx, const T *dloss, int dloss_per_sample, double factor, const T *x, const T *lse,        \
      const int64_t *target, const T *prob, const T *weight, int64_t N, int64_t C, int64_t D,      \
      int64_t ignore_index, double smoothing) {                                                    \
    double weight_sum = (double)C;                                                                 \
    if (weight) {                                                                                  \
      weight_sum = 0;                                                                              \
      for (int64_t c = 0; c < C; c++) weight_sum += weight[c];                                     \
    }                                                                                              \
    ce_backward_ctx_##SFX k = {                                                                    \
        dx,     dloss,     x,          lse, prob, weight,      target, dloss_per_sample,           \
        factor, smoothing, weight_sum, C,   D,    ignore_index};                                   \
    ddp_parallel_for(N *D, ce_chunk(C), ce_backward_range_##SFX, &k);                              \
  }                                                                                                \
                                                                                                   \
  double ddp_cpu_nll_forward_##SFX(T *loss, const T *x, const int64_t *target, const T *weight,    \
                                   int64_t N, int64_t C, int64_t D, int64_t ignore_index) {        \
    double sum = 0;                                                                                \
    for (int64_t n = 0; n < N; n++)                                                                \
      for (int64_t d = 0; d < D; d++) {                                                            \
        const int64_t i = n * D + d, y = target[i];                                                \
        T li = 0;                                                                                  \
        if (y != ignore_index) li = -(weight ? weight[y] : 1) * x[(n * C + y) * D + d];            \
        if (loss) loss[i] = li;                                                                    \
        sum += li;                                                                                 \
      }                                                                                            \
    return sum;                                                                                    \
  }                                                                                                \
                                                                                                   \
  void ddp_cpu_nll_backward_##SFX(T *dx, const T *dloss, int dloss_per_sample, double factor,      \
                                  const int64_t *target, const T *weight, int64_t N, int64_t C,    \
                                  int64_t D, int64_t ignore_index) {                               \
    for (int64_t n = 0; n < N; n++)                                                                \
      for (int64_t d = 0; d < D; d++) {                                                            \
        const int64_t i = n * D + d, y = target[i];                                                \
        if (y == ignore_index) continue;                                                           \
        const double g = factor * (double)dloss[dloss_per_sample ? i : 0];                         \
        dx[(n * C + y) * D + d] -= (T)((double)(weight ? weight[y] : 1) * g);                      \
      }                                                                                            \
  }                                                                                                \
                                                                                                   \
  typedef struct {                                                                                 \
    T *loss, *dx, *dt;                                                                             \
    const T *x, *t, *dloss;                                                                        \
    int dloss_per_element;                                                                         \
    double factor;                                                                                 \
  } mse_ctx_##SFX;                                                                                 \
                                                                                                   \
  /* Squares summed in double over LANES accumulators (vectorises; float sums of a whole   \
   * chunk would lose digits). */                                                                 \
  static double mse_forward_chunk_##SFX(const void *vctx, int64_t begin, int64_t end) {            \
    const mse_ctx_##SFX *k = vctx;                                                                 \
    const T *restrict x = k->x, *restrict t = k->t;                                                \
    T *restrict loss = k->loss;                                                                    \
    double acc[LANES] = {0}, s = 0;                                                                \
    int64_t i = begin;                                                                             \
    for (; i + LANES <= end; i += LANES)                                                           \
      for (int j = 0; j < LANES; j++) {                                                            \
        const T e = x[i + j] - t[i + j];                                                           \
        if (loss) loss[i + j] = e * e;                                                             \
        acc[j] += (double)(e * e);                                                                 \
      }                                                                                            \
    for (; i < end; i++) {                                                                         \
      const T e = x[i] - t[i];                                                                     \
      if (loss) loss[i] = e * e;                                                                   \
      s += (double)(e * e);                                                                        \
    }                                                                                              \
    for (int j = 0; j < LANES; j++) s += acc[j];                                                   \
    return s;                                                                                      \
  }                                                                                                \
                                                                                                   \
  double ddp_cpu_mse_forward_##SFX(T *loss, const T *x, const T *t, int64_t n) {                   \
    mse_ctx_##SFX k = {.loss = loss, .x = x, .t = t};                                              \
    return sum_in_chunks(mse_forward_chunk_##SFX, &k, n, MSE_CHUNK);                               \
  }                                                                                                \
                                                                                                   \
  static void mse_backward_range_##SFX(void *vctx, int64_t begin, int64_t end) {                   \
    const mse_ctx_##SFX *k = vctx;                                                                 \
    const T *restrict x = k->x, *restrict t = k->t, *restrict g = k->dloss;                        \
    T *restrict dx = k->dx, *restrict dt = k->dt;                                                  \
    const T two_f = (T)(2 * k->factor);                                                            \
    for (int64_t i = begin; i < end; i++) {                                                        \
      const T v = two_f * (k->dloss_per_element ? g[i] : g[0]) * (x[i] - t[i]);                    \
      if (dx) dx[i] += v;                                                                          \
      if (dt) dt[i] -= v;                                                                          \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  void ddp_cpu_mse_backward_##SFX(T *dx, T *dt, const T *dloss, int dloss_per_element,             \
                                  double factor, const T *x, const T *t, int64_t n) {              \
    mse_ctx_##SFX k = {.dx = dx,                                                                   \
                       .dt = dt,                                                                   \
                       .x = x,                                                                     \
                       .t = t,                                                                     \
                       .dloss = dloss,                                                             \
                       .dloss_per_element = dloss_per_element,                                     \
                       .factor = factor};                                                          \
    ddp_parallel_for(n, MSE_CHUNK, mse_backward_range_##SFX, &k);                                  \
  }

DEFINE_LOSS_KERNELS(float, f32)
DEFINE_LOSS_KERNELS(double, f64)

/* ---- table entries: one dtype switch per call (Note [one dispatch path]) ---------------- */

double ddp_cpu_cross_entropy_forward(int dtype, void *loss, void *lse, const void *x,
                                     const int64_t *target, const void *prob, const void *weight,
                                     int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                     double smoothing) {
  if (dtype == DDP_F64)
    return ddp_cpu_cross_entropy_forward_f64(loss, lse, x, target, prob, weight, N, C, D,
                                             ignore_index, smoothing);
  return ddp_cpu_cross_entropy_forward_f32(loss, lse, x, target, prob, weight, N, C, D,
                                           ignore_index, smoothing);
}

void ddp_cpu_cross_entropy_backward(int dtype, void *dx, const void *dloss, int dloss_per_sample,
                                    double factor, const void *x, const void *lse,
                                    const int64_t *target, const void *prob, const void *weight,
                                    int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                    double smoothing) {
  if (dtype == DDP_F64)
    ddp_cpu_cross_entropy_backward_f64(dx, dloss, dloss_per_sample, factor, x, lse, target, prob,
                                       weight, N, C, D, ignore_index, smoothing);
  else
    ddp_cpu_cross_entropy_backward_f32(dx, dloss, dloss_per_sample, factor, x, lse, target, prob,
                                       weight, N, C, D, ignore_index, smoothing);
}

double ddp_cpu_nll_forward(int dtype, void *loss, const void *x, const int64_t *target,
                           const void *weight, int64_t N, int64_t C, int64_t D,
                           int64_t ignore_index) {
  if (dtype == DDP_F64)
    return ddp_cpu_nll_forward_f64(loss, x, target, weight, N, C, D, ignore_index);
  return ddp_cpu_nll_forward_f32(loss, x, target, weight, N, C, D, ignore_index);
}

void ddp_cpu_nll_backward(int dtype, void *dx, const void *dloss, int dloss_per_sample,
                          double factor, const int64_t *target, const void *weight, int64_t N,
                          int64_t C, int64_t D, int64_t ignore_index) {
  if (dtype == DDP_F64)
    ddp_cpu_nll_backward_f64(dx, dloss, dloss_per_sample, factor, target, weight, N, C, D,
                             ignore_index);
  else
    ddp_cpu_nll_backward_f32(dx, dloss, dloss_per_sample, factor, target, weight, N, C, D,
                             ignore_index);
}

double ddp_cpu_mse_forward(int dtype, void *loss, const void *x, const void *t, int64_t n) {
  if (dtype == DDP_F64) return ddp_cpu_mse_forward_f64(loss, x, t, n);
  return ddp_cpu_mse_forward_f32(loss, x, t, n);
}

void ddp_cpu_mse_backward(int dtype, void *dx, void *dt, const void *dloss, int dloss_per_element,
                          double factor, const void *x, const void *t, int64_t n) {
  if (dtype == DDP_F64) ddp_cpu_mse_backward_f64(dx, dt, dloss, dloss_per_element, factor, x, t, n);
  else ddp_cpu_mse_backward_f32(dx, dt, dloss, dloss_per_element, factor, x, t, n);
}
