/* runtime/backend/cpu/elementwise.c: element-wise CPU kernels (see elementwise.h). */

/* The kernels neither read errno nor trap on floating-point exceptions; telling gcc so lets
 * it if-convert the selects of relu/clamp/exp_f32 and inline sqrt, which is what makes those
 * loops vectorise (results are unchanged: IEEE semantics, NaN included, stay as written). */
#pragma GCC optimize("no-trapping-math", "no-math-errno")

#include <math.h>

#include "backend/cpu/elementwise.h"

/* Elements per thread chunk: cheap ops (memory bound) and transcendental ones. */
enum { GRAIN_CHEAP = 1 << 15, GRAIN_HEAVY = 1 << 12 };

typedef struct {
  int op, wrt;
  double alpha, p0, p1;
  int dt[4]; /* dtypes of the operands, for the general path */
} ew_ctx;

/* ---- scalar formulas (double: the general path; also the reference for the fast ones) */

static inline int64_t ipow(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e & 1 ? -1 : 1) : 0;
  int64_t r = 1;
  while (e) {
    if (e & 1) r = (int64_t)((uint64_t)r * (uint64_t)base);
    base = (int64_t)((uint64_t)base * (uint64_t)base);
    e >>= 1;
  }
  return r;
}

static inline double bin_ref(int op, double a, double b, double alpha) {
  switch (op) {
  case DDP_EW_ADD: return a + alpha * b;
  case DDP_EW_SUB: return a - alpha * b;
  case DDP_EW_MUL: return a * b;
  case DDP_EW_DIV: return a / b;
  case DDP_EW_POW: return pow(a, b);
  case DDP_EW_MAX: return a != a ? a : (a > b ? a : b);
  case DDP_EW_MIN: return a != a ? a : (a < b ? a : b);
  case DDP_EW_EQ: return a == b;
  case DDP_EW_NE: return a != b;
  case DDP_EW_LT: return a < b;
  case DDP_EW_LE: return a <= b;
  case DDP_EW_GT: return a > b;
  case DDP_EW_GE: return a >= b;
  }
  return 0;
}

static const double SQRT1_2 = 0.70710678118654752440, SQRT2_PI = 0.79788456080286535588,
                    INV_SQRT_2PI = 0.39894228040143267794, GELU_C = 0.044715;

static inline double un_ref(int op, double x, double p0, double p1) {
  switch (op) {
  case DDP_EW_NEG: return -x;
  case DDP_EW_EXP: return exp(x);
  case DDP_EW_LOG: return log(x);
  case DDP_EW_SQRT: return sqrt(x);
  case DDP_EW_RSQRT: return 1 / sqrt(x);
  case DDP_EW_ABS: return fabs(x);
  case DDP_EW_CLAMP: { double t = x < p0 ? p0 : x; return t > p1 ? p1 : t; }
  case DDP_EW_RELU: return x < 0 ? 0 : x;
  case DDP_EW_LEAKY_RELU: return x > 0 ? x : x * p0;
  case DDP_EW_GELU: return 0.5 * x * (1 + erf(x * SQRT1_2));
  case DDP_EW_GELU_TANH: return 0.5 * x * (1 + tanh(SQRT2_PI * (x + GELU_C * x * x * x)));
  case DDP_EW_TANH: return tanh(x);
  case DDP_EW_SIGMOID: return 1 / (1 + exp(-x));
  case DDP_EW_SILU: return x / (1 + exp(-x));
  }
  return 0;
}

/* d(f)/dx * g with s the saved input or output (ddp_ew_unary_uses_output). */
static inline double un_bwd_ref(int op, double g, double s, double p0, double p1) {
  switch (op) {
  case DDP_EW_NEG: return -g;
  case DDP_EW_EXP: return g * s;
  case DDP_EW_LOG: return g / s;
  case DDP_EW_SQRT: return g / (2 * s);
  case DDP_EW_RSQRT: return -0.5 * g * s * s * s;
  case DDP_EW_ABS: return s > 0 ? g : s < 0 ? -g : 0;
  case DDP_EW_CLAMP: return s >= p0 && s <= p1 ? g : 0;
  case DDP_EW_RELU: return s > 0 ? g : 0;
  case DDP_EW_LEAKY_RELU: return s > 0 ? g : g * p0;
  case DDP_EW_GELU: return g * (0.5 * (1 + erf(s * SQRT1_2)) + s * INV_SQRT_2PI * exp(-0.5 * s * s));
  case DDP_EW_GELU_TANH: {
    double t = tanh(SQRT2_PI * (s + GELU_C * s * s * s));
    return g * (0.5 * (1 + t) + 0.5 * s * (1 - t * t) * SQRT2_PI * (1 + 3 * GELU_C * s * s));
  }
  case DDP_EW_TANH: return g * (1 - s * s);
  case DDP_EW_SIGMOID: return g * s * (1 - s);
  case DDP_EW_SILU: { double sg = 1 / (1 + exp(-s)); return g * sg * (1 + s * (1 - sg)); }
  }
  return 0;
}

static inline double bin_bwd_ref(int op, int wrt, double g, double a, double b, double alpha) {
  switch (op) {
  case DDP_EW_ADD: return wrt ? alpha * g : g;
  case DDP_EW_SUB: return wrt ? -alpha * g : g;
  case DDP_EW_MUL: return wrt ? g * a : g * b;
  case DDP_EW_DIV: return wrt ? -g * a / (b * b) : g / b;
  case DDP_EW_POW:
    if (!wrt) return b == 0 ? 0 : g * b * pow(a, b - 1);
    return a == 0 && b >= 0 ? 0 : g * pow(a, b) * log(a);
  case DDP_EW_MAX:
    if (a == b) return 0.5 * g;
    return (wrt ? b > a : a > b) ? g : 0;
  case DDP_EW_MIN:
    if (a == b) return 0.5 * g;
    return (wrt ? b < a : a < b) ? g : 0;
  }
  return 0;
}

/* ---- vectorisable f32 exp and erf ----------------------------------------------------
 *
 * glibc's expf/erff are scalar calls that keep loops from vectorising (10x slower than the
 * memory traffic here). These are branch-free, so gcc vectorises loops over them:
 * exp: Cody-Waite range reduction x = n ln2 + r (|r| <= ln2/2, ln2 split in a high part
 * exact in float and a low part, Cephes' constants), e^r by its Taylor polynomial to r^7
 * (truncation < 1e-8 relative), scaled by 2^n built in two halves so that results down to
 * the subnormal range come out right; within 2 ulp of expf.
 * erf: Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), the form PyTorch's vectorised
 * CPU kernels use. */

static inline float bits_to_f32(int32_t i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}

static inline float exp_f32(float x) {
  /* clamped, and NaN replaced (converting NaN to int is undefined), restored at the end */
  float xc = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x != x ? 0.0f : x;
  float t = xc * 1.44269504088896341f;
  float n = (t + 12582912.0f) - 12582912.0f; /* round to nearest (|t| < 2^22) */
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1, n2 = ni - n1;
  float y = p * bits_to_f32((n1 + 127) << 23) * bits_to_f32((n2 + 127) << 23);
  y = x > 88.7228394f ? INFINITY : y;
  y = x < -103.972084f ? 0.0f : y;
  return x != x ? x : y;
}

static inline float erf_f32(float x) {
  float ax = fabsf(x);
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  float y = 1.0f - p * t * exp_f32(-ax * ax);
  return x < 0 ? -y : y;
}

/* ---- loop skeletons ------------------------------------------------------------------ */

/* out[i] = EXPR(a, b): contiguous runs (with one operand possibly a stride-0 scalar) get
 * plain indexed loops the compiler vectorises; the in-place case (out == a) gets its own
 * loop so no aliasing check stands in the way. */
#define LOOP3(TO, TA, TB, EXPR)                                                              \
  do {                                                                                       \
    const int64_t so = sizeof(TO), sa = sizeof(TA), sb = sizeof(TB);                         \
    if (s[0] == so && s[1] == sa && s[2] == sb) {                                            \
      if ((void *)p[0] == (void *)p[1]) {                                                    \
        TO *restrict o_ = (TO *)p[0];                                                        \
        const TB *restrict y_ = (const TB *)p[2];                                            \
        for (int64_t i = 0; i < n; i++) { TA a = (TA)o_[i]; TB b = y_[i]; o_[i] = (EXPR); } \
      } else {                                                                               \
        TO *restrict o_ = (TO *)p[0];                                                        \
        const TA *restrict x_ = (const TA *)p[1];                                            \
        const TB *restrict y_ = (const TB *)p[2];                                            \
        for (int64_t i = 0; i < n; i++) { TA a = x_[i]; TB b = y_[i]; o_[i] = (EXPR); }     \
      }                                                                                      \
    } else if (s[0] == so && s[1] == sa && s[2] == 0) {                                      \
      const TB b = *(const TB *)p[2];                                                        \
      if ((void *)p[0] == (void *)p[1]) {                                                    \
        TO *restrict o_ = (TO *)p[0];                                                        \
        for (int64_t i = 0; i < n; i++) { TA a = (TA)o_[i]; o_[i] = (EXPR); }               \
      } else {                                                                               \
        TO *restrict o_ = (TO *)p[0];                                                        \
        const TA *restrict x_ = (const TA *)p[1];                                            \
        for (int64_t i = 0; i < n; i++) { TA a = x_[i]; o_[i] = (EXPR); }                   \
      }                                                                                      \
    } else if (s[0] == so && s[1] == 0 && s[2] == sb) {                                      \
      TO *restrict o_ = (TO *)p[0];                                                          \
      const TB *restrict y_ = (const TB *)p[2];                                              \
      const TA a = *(const TA *)p[1];                                                        \
      for (int64_t i = 0; i < n; i++) { TB b = y_[i]; o_[i] = (EXPR); }                     \
    } else {                                                                                 \
      for (int64_t i = 0; i < n; i++) {                                                      \
        TA a = *(const TA *)(p[1] + i * s[1]);                                               \
        TB b = *(const TB *)(p[2] + i * s[2]);                                               \
        *(TO *)(p[0] + i * s[0]) = (EXPR);                                                   \
      }                                                                                      \
    }                                                                                        \
  } while (0)

/* out[i] = EXPR(x) */
#define LOOP2(TO, TX, EXPR)                                                                  \
  do {                                                                                       \
    if (s[0] == sizeof(TO) && s[1] == sizeof(TX)) {                                          \
      if ((void *)p[0] == (void *)p[1]) {                                                    \
        TO *restrict o_ = (TO *)p[0];                                                        \
        for (int64_t i = 0; i < n; i++) { TX x = (TX)o_[i]; o_[i] = (EXPR); }               \
      } else {                                                                               \
        TO *restrict o_ = (TO *)p[0];                                                        \
        const TX *restrict x_ = (const TX *)p[1];                                            \
        for (int64_t i = 0; i < n; i++) { TX x = x_[i]; o_[i] = (EXPR); }                   \
      }                                                                                      \
    } else {                                                                                 \
      for (int64_t i = 0; i < n; i++) {                                                      \
        TX x = *(const TX *)(p[1] + i * s[1]);                                               \
        *(TO *)(p[0] + i * s[0]) = (EXPR);                                                   \
      }                                                                                      \
    }                                                                                        \
  } while (0)

/* ---- binary forward ------------------------------------------------------------------ */

#define MAXF(a, b) ((a) != (a) ? (a) : ((a) > (b) ? (a) : (b)))
#define MINF(a, b) ((a) != (a) ? (a) : ((a) < (b) ? (a) : (b)))
#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))

#define DEF_BIN_FLOAT(T, SUF, POW)                                                           \
  static void bin_##SUF(void *vc, char **p, const int64_t *s, int64_t n) {                   \
    const ew_ctx *c = vc;                                                                    \
    const T alpha = (T)c->alpha;                                                             \
    switch (c->op) {                                                                         \
    case DDP_EW_ADD: LOOP3(T, T, T, a + alpha * b); break;                                   \
    case DDP_EW_SUB: LOOP3(T, T, T, a - alpha * b); break;                                   \
    case DDP_EW_MUL: LOOP3(T, T, T, a * b); break;                                           \
    case DDP_EW_DIV: LOOP3(T, T, T, a / b); break;                                           \
    case DDP_EW_POW: LOOP3(T, T, T, POW(a, b)); break;                                       \
    case DDP_EW_MAX: LOOP3(T, T, T, MAXF(a, b)); break;                                      \
    case DDP_EW_MIN: LOOP3(T, T, T, MINF(a, b)); break;                                      \
    case DDP_EW_EQ: LOOP3(uint8_t, T, T, a == b); break;                                     \
    case DDP_EW_NE: LOOP3(uint8_t, T, T, a != b); break;                                     \
    case DDP_EW_LT: LOOP3(uint8_t, T, T, a < b); break;                                      \
    case DDP_EW_LE: LOOP3(uint8_t, T, T, a <= b); break;                                     \
    case DDP_EW_GT: LOOP3(uint8_t, T, T, a > b); break;                                      \
    case DDP_EW_GE: LOOP3(uint8_t, T, T, a >= b); break;                                     \
    }                                                                                        \
  }
DEF_BIN_FLOAT(float, f32, powf)
DEF_BIN_FLOAT(double, f64, pow)

/* Integers wrap on overflow as in C (and PyTorch): computed in unsigned arithmetic. */
#define DEF_BIN_INT(T, UT, SUF)                                                              \
  static void bin_##SUF(void *vc, char **p, const int64_t *s, int64_t n) {                   \
    const ew_ctx *c = vc;                                                                    \
    const UT alpha = (UT)(T)c->alpha;                                                        \
    switch (c->op) {                                                                         \
    case DDP_EW_ADD: LOOP3(T, T, T, (T)((UT)a + alpha * (UT)b)); break;                      \
    case DDP_EW_SUB: LOOP3(T, T, T, (T)((UT)a - alpha * (UT)b)); break;                      \
    case DDP_EW_MUL: LOOP3(T, T, T, (T)((UT)a * (UT)b)); break;                              \
    case DDP_EW_POW: LOOP3(T, T, T, (T)ipow(a, b)); break;                                   \
    case DDP_EW_MAX: LOOP3(T, T, T, MAXI(a, b)); break;                                      \
    case DDP_EW_MIN: LOOP3(T, T, T, MINI(a, b)); break;                                      \
    case DDP_EW_EQ: LOOP3(uint8_t, T, T, a == b); break;                                     \
    case DDP_EW_NE: LOOP3(uint8_t, T, T, a != b); break;                                     \
    case DDP_EW_LT: LOOP3(uint8_t, T, T, a < b); break;                                      \
    case DDP_EW_LE: LOOP3(uint8_t, T, T, a <= b); break;                                     \
    case DDP_EW_GT: LOOP3(uint8_t, T, T, a > b); break;                                      \
    case DDP_EW_GE: LOOP3(uint8_t, T, T, a >= b); break;                                     \
    }                                                                                        \
  }
DEF_BIN_INT(int64_t, uint64_t, i64)
DEF_BIN_INT(int32_t, uint32_t, i32)

/* Any dtypes: load as double, compute, store. */
static void bin_any(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  for (int64_t i = 0; i < n; i++) {
    double a = ddp_load_f64(p[1] + i * s[1], c->dt[1]);
    double b = ddp_load_f64(p[2] + i * s[2], c->dt[2]);
    ddp_store_f64(p[0] + i * s[0], c->dt[0], bin_ref(c->op, a, b, c->alpha));
  }
}

static int is_cmp(int op) { return op >= DDP_EW_EQ; }

void ddp_cpu_binary(ddp_tensor *out, ddp_tensor *a, ddp_tensor *b, int op, double alpha) {
  ew_ctx c = {.op = op, .alpha = alpha, .dt = {out->dtype, a->dtype, b->dtype}};
  ddp_tensor *ops[3] = {out, a, b};
  ddp_loop_fn fn = bin_any;
  int same = a->dtype == b->dtype && (is_cmp(op) ? out->dtype == DDP_BOOL : out->dtype == a->dtype);
  if (same) {
    switch (a->dtype) {
    case DDP_F32: fn = bin_f32; break;
    case DDP_F64: fn = bin_f64; break;
    case DDP_I64: if (op != DDP_EW_DIV) fn = bin_i64; break;
    case DDP_I32: if (op != DDP_EW_DIV) fn = bin_i32; break;
    }
  }
  int64_t grain = op == DDP_EW_POW || fn == bin_any ? GRAIN_HEAVY : GRAIN_CHEAP;
  ddp_foreach(3, ops, out->ndim, out->shape, fn, &c, grain);
}

/* ---- binary backward ----------------------------------------------------------------- */

#define DEF_BIN_BWD(T, SUF, POW, LOG)                                                        \
  static void bin_bwd_##SUF(void *vc, char **p, const int64_t *s, int64_t n) {               \
    const ew_ctx *c = vc;                                                                    \
    const T alpha = (T)c->alpha;                                                             \
    int key = c->op * 2 + c->wrt;                                                            \
    for (int64_t i = 0; i < n; i++) {                                                        \
      T g = *(const T *)(p[1] + i * s[1]);                                                   \
      T a = *(const T *)(p[2] + i * s[2]);                                                   \
      T b = *(const T *)(p[3] + i * s[3]);                                                   \
      T d;                                                                                   \
      switch (key) {                                                                         \
      case DDP_EW_MUL * 2: d = g * b; break;                                                 \
      case DDP_EW_MUL * 2 + 1: d = g * a; break;                                             \
      case DDP_EW_DIV * 2: d = g / b; break;                                                 \
      case DDP_EW_DIV * 2 + 1: d = -g * a / (b * b); break;                                  \
      default: d = (T)bin_bwd_ref(c->op, c->wrt, g, a, b, alpha); break;                     \
      }                                                                                      \
      *(T *)(p[0] + i * s[0]) = d;                                                           \
    }                                                                                        \
  }
DEF_BIN_BWD(float, f32, powf, logf)
DEF_BIN_BWD(double, f64, pow, log)

/* The common case of training (mul's backward, all contiguous or b a scalar) gets a
 * vectorised loop; the rest goes through the per-element switch above. */
static void mul_bwd_f32(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  int k = c->wrt ? 2 : 3; /* the other factor */
  if (s[0] == 4 && s[1] == 4 && (s[k] == 4 || s[k] == 0)) {
    float *restrict d = (float *)p[0];
    const float *restrict g = (const float *)p[1];
    const float *restrict f = (const float *)p[k];
    if (s[k] == 0) {
      float v = f[0];
      for (int64_t i = 0; i < n; i++) d[i] = g[i] * v;
    } else {
      for (int64_t i = 0; i < n; i++) d[i] = g[i] * f[i];
    }
    return;
  }
  bin_bwd_f32(vc, p, s, n);
}

static void bin_bwd_any(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  for (int64_t i = 0; i < n; i++) {
    double g = ddp_load_f64(p[1] + i * s[1], c->dt[1]);
    double a = ddp_load_f64(p[2] + i * s[2], c->dt[2]);
    double b = ddp_load_f64(p[3] + i * s[3], c->dt[3]);
    ddp_store_f64(p[0] + i * s[0], c->dt[0], bin_bwd_ref(c->op, c->wrt, g, a, b, c->alpha));
  }
}

void ddp_cpu_binary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b, int op,
                             int wrt, double alpha) {
  ew_ctx c = {.op = op, .wrt = wrt, .alpha = alpha,
              .dt = {d->dtype, g->dtype, a->dtype, b->dtype}};
  ddp_tensor *ops[4] = {d, g, a, b};
  ddp_loop_fn fn = bin_bwd_any;
  if (d->dtype == g->dtype && g->dtype == a->dtype && a->dtype == b->dtype) {
    if (d->dtype == DDP_F32) fn = op == DDP_EW_MUL ? mul_bwd_f32 : bin_bwd_f32;
    else if (d->dtype == DDP_F64) fn = bin_bwd_f64;
  }
  ddp_foreach(4, ops, d->ndim, d->shape, fn, &c, GRAIN_HEAVY);
}

/* ---- unary forward ------------------------------------------------------------------- */

#define DEF_UN_FLOAT(T, SUF, EXP, LOG, SQRT, FABS, ERF, TANH)                                \
  static void un_##SUF(void *vc, char **p, const int64_t *s, int64_t n) {                    \
    const ew_ctx *c = vc;                                                                    \
    const T p0 = (T)c->p0, p1 = (T)c->p1;                                                    \
    switch (c->op) {                                                                         \
    case DDP_EW_NEG: LOOP2(T, T, -x); break;                                                 \
    case DDP_EW_EXP: LOOP2(T, T, EXP(x)); break;                                             \
    case DDP_EW_LOG: LOOP2(T, T, LOG(x)); break;                                             \
    case DDP_EW_SQRT: LOOP2(T, T, SQRT(x)); break;                                           \
    case DDP_EW_RSQRT: LOOP2(T, T, 1 / SQRT(x)); break;                                      \
    case DDP_EW_ABS: LOOP2(T, T, FABS(x)); break;                                            \
    case DDP_EW_CLAMP: LOOP2(T, T, (x < p0 ? p0 : x) > p1 ? p1 : (x < p0 ? p0 : x)); break;  \
    case DDP_EW_RELU: LOOP2(T, T, x < 0 ? (T)0 : x); break;                                  \
    case DDP_EW_LEAKY_RELU: LOOP2(T, T, x > 0 ? x : x * p0); break;                          \
    case DDP_EW_GELU: LOOP2(T, T, (T)0.5 * x * (1 + ERF(x * (T)SQRT1_2))); break;            \
    case DDP_EW_GELU_TANH:                                                                   \
      LOOP2(T, T, (T)0.5 * x * (1 + TANH((T)SQRT2_PI * (x + (T)GELU_C * x * x * x)))); break; \
    case DDP_EW_TANH: LOOP2(T, T, TANH(x)); break;                                           \
    case DDP_EW_SIGMOID: LOOP2(T, T, 1 / (1 + EXP(-x))); break;                              \
    case DDP_EW_SILU: LOOP2(T, T, x / (1 + EXP(-x))); break;                                 \
    }                                                                                        \
  }
DEF_UN_FLOAT(float, f32, exp_f32, logf, sqrtf, fabsf, erf_f32, tanhf)
DEF_UN_FLOAT(double, f64, exp, log, sqrt, fabs, erf, tanh)

static void un_any(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  for (int64_t i = 0; i < n; i++) {
    double x = ddp_load_f64(p[1] + i * s[1], c->dt[1]);
    ddp_store_f64(p[0] + i * s[0], c->dt[0], un_ref(c->op, x, c->p0, c->p1));
  }
}

/* Note [half sign ops]: relu, neg and abs of f16/bf16 (autocast's activations) only look at
 * and change the sign bit, so they run on the 16-bit patterns, with the results of the
 * double path (un_any) bit for bit for every input but a signalling NaN (which the double
 * path quiets). `inf` is the pattern of +inf (bf16 0x7f80, f16 0x7c00): h - 1 < inf (as
 * unsigned 16-bit) holds exactly for the positive values, +inf included; NaNs are above. */
static int un_half_bits_op(int op) { return op == DDP_EW_RELU || op == DDP_EW_NEG || op == DDP_EW_ABS; }

static void un_half_bits(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  const uint16_t inf = c->dt[1] == DDP_BF16 ? 0x7f80 : 0x7c00;
  if (c->op == DDP_EW_RELU && s[0] == 2 && s[1] == 2) { /* contiguous: a loop that vectorises */
    uint16_t *restrict o = (uint16_t *)p[0];
    const uint16_t *restrict x = (const uint16_t *)p[1];
    for (int64_t i = 0; i < n; i++) {
      uint16_t h = x[i];
      o[i] = (h & 0x8000) && (uint16_t)((h & 0x7fff) - 1) < inf ? 0 : h;
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    uint16_t h = *(const uint16_t *)(p[1] + i * s[1]), r;
    switch (c->op) {
    case DDP_EW_RELU: r = (h & 0x8000) && (uint16_t)((h & 0x7fff) - 1) < inf ? 0 : h; break;
    case DDP_EW_NEG: r = h ^ 0x8000; break;
    default: r = h & 0x7fff; break; /* abs */
    }
    *(uint16_t *)(p[0] + i * s[0]) = r;
  }
}

/* relu backward of f16/bf16 (Note [half sign ops]): g where y > 0, else +0. */
static void relu_bwd_half_bits(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  const uint16_t inf = c->dt[2] == DDP_BF16 ? 0x7f80 : 0x7c00;
  if (s[0] == 2 && s[1] == 2 && s[2] == 2) { /* contiguous: a loop that vectorises */
    uint16_t *restrict d = (uint16_t *)p[0];
    const uint16_t *restrict g = (const uint16_t *)p[1], *restrict y = (const uint16_t *)p[2];
    for (int64_t i = 0; i < n; i++) d[i] = (uint16_t)(y[i] - 1) < inf ? g[i] : 0;
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    uint16_t g = *(const uint16_t *)(p[1] + i * s[1]), y = *(const uint16_t *)(p[2] + i * s[2]);
    *(uint16_t *)(p[0] + i * s[0]) = (uint16_t)(y - 1) < inf ? g : 0;
  }
}

static int un_cheap(int op) {
  return op == DDP_EW_NEG || op == DDP_EW_ABS || op == DDP_EW_CLAMP || op == DDP_EW_RELU ||
         op == DDP_EW_LEAKY_RELU || op == DDP_EW_SQRT || op == DDP_EW_RSQRT;
}

void ddp_cpu_unary(ddp_tensor *out, ddp_tensor *x, int op, double p0, double p1) {
  ew_ctx c = {.op = op, .p0 = p0, .p1 = p1, .dt = {out->dtype, x->dtype}};
  ddp_tensor *ops[2] = {out, x};
  ddp_loop_fn fn = un_any;
  if (out->dtype == x->dtype) {
    if (x->dtype == DDP_F32) fn = un_f32;
    else if (x->dtype == DDP_F64) fn = un_f64;
    else if ((x->dtype == DDP_BF16 || x->dtype == DDP_F16) && un_half_bits_op(op)) fn = un_half_bits;
  }
  ddp_foreach(2, ops, out->ndim, out->shape, fn, &c,
              un_cheap(op) && fn != un_any ? GRAIN_CHEAP : GRAIN_HEAVY);
}

/* ---- unary backward ------------------------------------------------------------------ */

/* d = g * f' with s the saved tensor; the ops of every training step (relu, tanh, sigmoid)
 * get vectorisable loops, the others the per-element formula. */
#define DEF_UN_BWD(T, SUF, EXP, ERF)                                                              \
  static void un_bwd_##SUF(void *vc, char **p, const int64_t *s, int64_t n) {                \
    const ew_ctx *c = vc;                                                                    \
    const T p0 = (T)c->p0;                                                                   \
    if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {                       \
      T *restrict d = (T *)p[0];                                                             \
      const T *restrict g = (const T *)p[1], *restrict y = (const T *)p[2];                  \
      switch (c->op) {                                                                       \
      case DDP_EW_RELU: for (int64_t i = 0; i < n; i++) d[i] = y[i] > 0 ? g[i] : 0; return;  \
      case DDP_EW_LEAKY_RELU:                                                                \
        for (int64_t i = 0; i < n; i++) d[i] = y[i] > 0 ? g[i] : g[i] * p0;                  \
        return;                                                                              \
      case DDP_EW_TANH: for (int64_t i = 0; i < n; i++) d[i] = g[i] * (1 - y[i] * y[i]); return; \
      case DDP_EW_SIGMOID:                                                                   \
        for (int64_t i = 0; i < n; i++) d[i] = g[i] * y[i] * (1 - y[i]);                     \
        return;                                                                              \
      case DDP_EW_EXP: for (int64_t i = 0; i < n; i++) d[i] = g[i] * y[i]; return;           \
      case DDP_EW_NEG: for (int64_t i = 0; i < n; i++) d[i] = -g[i]; return;                 \
      case DDP_EW_SILU:                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                    \
          T x = y[i], sg = 1 / (1 + EXP(-x));                                                \
          d[i] = g[i] * sg * (1 + x * (1 - sg));                                             \
        }                                                                                    \
        return;                                                                              \
      case DDP_EW_GELU:                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                    \
          T x = y[i];                                                                        \
          d[i] = g[i] * ((T)0.5 * (1 + ERF(x * (T)SQRT1_2)) +                                \
                         x * (T)INV_SQRT_2PI * EXP((T)-0.5 * x * x));                        \
        }                                                                                    \
        return;                                                                              \
      }                                                                                      \
    }                                                                                        \
    for (int64_t i = 0; i < n; i++) {                                                        \
      T g = *(const T *)(p[1] + i * s[1]);                                                   \
      T y = *(const T *)(p[2] + i * s[2]);                                                   \
      *(T *)(p[0] + i * s[0]) = (T)un_bwd_ref(c->op, g, y, c->p0, c->p1);                    \
    }                                                                                        \
  }
DEF_UN_BWD(float, f32, exp_f32, erf_f32)
DEF_UN_BWD(double, f64, exp, erf)

static void un_bwd_any(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  for (int64_t i = 0; i < n; i++) {
    double g = ddp_load_f64(p[1] + i * s[1], c->dt[1]);
    double y = ddp_load_f64(p[2] + i * s[2], c->dt[2]);
    ddp_store_f64(p[0] + i * s[0], c->dt[0], un_bwd_ref(c->op, g, y, c->p0, c->p1));
  }
}

void ddp_cpu_unary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *s, int op, double p0,
                            double p1) {
  ew_ctx c = {.op = op, .p0 = p0, .p1 = p1, .dt = {d->dtype, g->dtype, s->dtype}};
  ddp_tensor *ops[3] = {d, g, s};
  ddp_loop_fn fn = un_bwd_any;
  if (d->dtype == g->dtype && g->dtype == s->dtype) {
    if (d->dtype == DDP_F32) fn = un_bwd_f32;
    else if (d->dtype == DDP_F64) fn = un_bwd_f64;
    else if ((d->dtype == DDP_BF16 || d->dtype == DDP_F16) && op == DDP_EW_RELU) fn = relu_bwd_half_bits;
  }
  ddp_foreach(3, ops, d->ndim, d->shape, fn, &c, GRAIN_HEAVY);
}

/* ---- where --------------------------------------------------------------------------- */

#define WHERE_LOOP(T)                                                                        \
  for (int64_t i = 0; i < n; i++)                                                            \
    *(T *)(p[0] + i * s[0]) = p[1][i * s[1]] ? *(const T *)(p[2] + i * s[2])                 \
                                             : *(const T *)(p[3] + i * s[3]);

/* Same dtype everywhere: a selection of bytes, by element size. */
static void where_same(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  switch (ddp_dtype_size(c->dt[0])) {
  case 8: WHERE_LOOP(uint64_t) break;
  case 4: WHERE_LOOP(uint32_t) break;
  case 2: WHERE_LOOP(uint16_t) break;
  default: WHERE_LOOP(uint8_t) break;
  }
}

static void where_any(void *vc, char **p, const int64_t *s, int64_t n) {
  const ew_ctx *c = vc;
  for (int64_t i = 0; i < n; i++) {
    double v = p[1][i * s[1]] ? ddp_load_f64(p[2] + i * s[2], c->dt[2])
                              : ddp_load_f64(p[3] + i * s[3], c->dt[3]);
    ddp_store_f64(p[0] + i * s[0], c->dt[0], v);
  }
}

void ddp_cpu_where(ddp_tensor *out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b) {
  ew_ctx c = {.dt = {out->dtype, cond->dtype, a->dtype, b->dtype}};
  ddp_tensor *ops[4] = {out, cond, a, b};
  int same = out->dtype == a->dtype && a->dtype == b->dtype;
  ddp_foreach(4, ops, out->ndim, out->shape, same ? where_same : where_any, &c, GRAIN_CHEAP);
}
