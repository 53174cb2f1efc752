/* runtime/backend/cpu/reduce.c: CPU kernels of the reductions and softmax over a contiguous
 * (A, R, B) block (see reduce.h). Each kernel is written once as a macro over its element
 * type T and accumulator type ACC and instantiated for the dtypes that need it.
 *
 * Note [reduction accumulation] (ddplua/ops_reduce.h) in code: a row sum keeps LANES
 * independent accumulators of type T over a block of at most SUM_BLOCK elements (the
 * compiler turns the lane loop into vector adds; float addition is not associative, so a
 * single accumulator would not vectorise), then adds the block total into ACC (double for
 * f32). A column sum adds ROW_BLOCK rows into a T buffer of COLS columns (vectorised across
 * the columns), then flushes it into ACC. */
/* Floating-point exceptions are never inspected in ddplua: without -ftrapping-math GCC
 * may if-convert the selects in exp_f32 and the max/argmax loops into vector blends
 * (otherwise "control flow in loop" keeps them scalar). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/reduce.h"
#include "backend/cpu/vexp.h"
#include "core/core.h"

enum {
  LANES = 16,          /* independent accumulators of a row sum */
  DLANES = 8,          /* the same in double (log_softmax backward) */
  SUM_BLOCK = 4096,    /* elements per f32 block before flushing into double */
  COLS = 256,          /* columns per column-reduction task */
  ROW_BLOCK = 256,     /* rows per f32 column block before flushing into double */
  PART = 1 << 16,      /* elements per task when one long row is split */
  WORK_GRAIN = 1 << 15 /* elements of cheap work per thread task */
};

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Tasks per thread chunk so that one chunk holds about `work` elements of work. */
static inline int64_t task_grain(int64_t per_task, int64_t work) {
  int64_t g = work / (per_task > 0 ? per_task : 1);
  return g < 1 ? 1 : g;
}

/* ---- sums ------------------------------------------------------------------------------ */

#define XF_PLAIN(v) (v)
#define XF_ABS(v) ((v) < 0 ? -(v) : (v))
#define XF_SQ(v) ((v) * (v))

/* Row sum and column sums of XF(x) for one element type. */
#define DEFINE_SUM_VARIANT(NAME, T, ACC, XF)                                              \
  static ACC NAME##_row(const T *x, int64_t n) {                                          \
    ACC total = 0;                                                                        \
    if (n < LANES) { /* short rows (class scores): skip the lane set-up */                \
      for (int64_t i = 0; i < n; i++) total += XF(x[i]);                                  \
      return total;                                                                       \
    }                                                                                     \
    for (int64_t b0 = 0; b0 < n; b0 += SUM_BLOCK) {                                       \
      int64_t m = min64(SUM_BLOCK, n - b0);                                               \
      const T *p = x + b0;                                                                \
      T lane[LANES] = {0};                                                                \
      int64_t i = 0;                                                                      \
      for (; i + LANES <= m; i += LANES)                                                  \
        for (int j = 0; j < LANES; j++) lane[j] += XF(p[i + j]);                          \
      ACC block = 0;                                                                      \
      for (; i < m; i++) block += XF(p[i]);                                               \
      for (int j = 0; j < LANES; j++) block += lane[j];                                   \
      total += block;                                                                     \
    }                                                                                     \
    return total;                                                                         \
  }                                                                                       \
  /* acc[j] = sum over r < R of XF(x[r * B + j]), j < w <= COLS */                        \
  static void NAME##_cols(ACC *acc, const T *x, int64_t R, int64_t B, int64_t w) {        \
    T tmp[COLS];                                                                          \
    for (int64_t j = 0; j < w; j++) acc[j] = 0;                                           \
    for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {                                       \
      int64_t r1 = min64(R, r0 + ROW_BLOCK);                                              \
      for (int64_t j = 0; j < w; j++) tmp[j] = 0;                                         \
      for (int64_t r = r0; r < r1; r++) {                                                 \
        const T *restrict row = x + r * B;                                                \
        for (int64_t j = 0; j < w; j++) tmp[j] += XF(row[j]);                             \
      }                                                                                   \
      for (int64_t j = 0; j < w; j++) acc[j] += tmp[j];                                   \
    }                                                                                     \
  }

#define DEFINE_SUM(SUF, T, ACC)                                                           \
  DEFINE_SUM_VARIANT(sum_plain_##SUF, T, ACC, XF_PLAIN)                                   \
  DEFINE_SUM_VARIANT(sum_abs_##SUF, T, ACC, XF_ABS)                                       \
  DEFINE_SUM_VARIANT(sum_sq_##SUF, T, ACC, XF_SQ)                                         \
  typedef ACC (*row_fn_##SUF)(const T *, int64_t);                                        \
  typedef void (*cols_fn_##SUF)(ACC *, const T *, int64_t, int64_t, int64_t);             \
  static const row_fn_##SUF row_fns_##SUF[3] = {sum_plain_##SUF##_row, sum_abs_##SUF##_row, \
                                                sum_sq_##SUF##_row};                      \
  static const cols_fn_##SUF cols_fns_##SUF[3] = {                                        \
      sum_plain_##SUF##_cols, sum_abs_##SUF##_cols, sum_sq_##SUF##_cols};                 \
  static inline T sum_post_##SUF(ACC acc, int mode, double scale) {                       \
    if (mode == DDP_SUM_SQRT) return (T)sqrt((double)acc);                                \
    return scale == 1.0 ? (T)acc : (T)((double)acc * scale);                              \
  }                                                                                       \
  typedef struct {                                                                        \
    T *out;                                                                               \
    const T *x;                                                                           \
    int64_t R, B, chunks;                                                                 \
    int mode;                                                                             \
    double scale;                                                                         \
    ACC *partial;                                                                         \
  } sum_job_##SUF;                                                                        \
  static void sum_rows_##SUF(void *vj, int64_t a0, int64_t a1) {                          \
    sum_job_##SUF *j = vj;                                                                \
    row_fn_##SUF f = row_fns_##SUF[j->mode];                                              \
    for (int64_t a = a0; a < a1; a++)                                                     \
      j->out[a] = sum_post_##SUF(f(j->x + a * j->R, j->R), j->mode, j->scale);            \
  }                                                                                       \
  static void sum_parts_##SUF(void *vj, int64_t k0, int64_t k1) {                         \
    sum_job_##SUF *j = vj;                                                                \
    row_fn_##SUF f = row_fns_##SUF[j->mode];                                              \
    for (int64_t k = k0; k < k1; k++)                                                     \
      j->partial[k] = f(j->x + k * PART, min64(PART, j->R - k * PART));                   \
  }                                                                                       \
  static void sum_cols_##SUF(void *vj, int64_t t0, int64_t t1) {                          \
    sum_job_##SUF *j = vj;                                                                \
    ACC acc[COLS];                                                                        \
    for (int64_t t = t0; t < t1; t++) {                                                   \
      int64_t a = t / j->chunks, c0 = (t % j->chunks) * COLS;                             \
      int64_t w = min64(COLS, j->B - c0);                                                 \
      cols_fns_##SUF[j->mode](acc, j->x + a * j->R * j->B + c0, j->R, j->B, w);           \
      T *o = j->out + a * j->B + c0;                                                      \
      for (int64_t i = 0; i < w; i++) o[i] = sum_post_##SUF(acc[i], j->mode, j->scale);   \
    }                                                                                     \
  }                                                                                       \
  static void sum_impl_##SUF(T *out, const T *x, int64_t A, int64_t R, int64_t B,         \
                             int mode, double scale) {                                    \
    sum_job_##SUF j = {out, x, R, B, 0, mode, scale, NULL};                               \
    if (A == 0 || B == 0) return;                                                         \
    if (B > 1) {                                                                          \
      j.chunks = (B + COLS - 1) / COLS;                                                   \
      ddp_parallel_for(A * j.chunks, task_grain(R * COLS, WORK_GRAIN), sum_cols_##SUF, &j); \
      return;                                                                             \
    }                                                                                     \
    if (A == 1 && R >= 2 * PART) { /* one long row: fixed blocks, then their sum */        \
      int64_t parts = (R + PART - 1) / PART;                                              \
      j.partial = malloc((size_t)parts * sizeof(ACC));                                    \
      if (j.partial) {                                                                    \
        ddp_parallel_for(parts, 1, sum_parts_##SUF, &j);                                  \
        ACC total = 0;                                                                    \
        for (int64_t k = 0; k < parts; k++) total += j.partial[k];                        \
        free(j.partial);                                                                  \
        out[0] = sum_post_##SUF(total, mode, scale);                                      \
        return;                                                                           \
      }                                                                                   \
    }                                                                                     \
    ddp_parallel_for(A, task_grain(R, WORK_GRAIN), sum_rows_##SUF, &j);                   \
  }

DEFINE_SUM(f32, float, double)
DEFINE_SUM(f64, double, double)
DEFINE_SUM(i64, int64_t, int64_t)

void ddp_cpu_sum_f32(float *out, const float *x, int64_t A, int64_t R, int64_t B, int mode,
                     double scale) {
  sum_impl_f32(out, x, A, R, B, mode, scale);
}

void ddp_cpu_sum_f64(double *out, const double *x, int64_t A, int64_t R, int64_t B, int mode,
                     double scale) {
  sum_impl_f64(out, x, A, R, B, mode, scale);
}

void ddp_cpu_sum_i64(int64_t *out, const int64_t *x, int64_t A, int64_t R, int64_t B) {
  sum_impl_i64(out, x, A, R, B, DDP_SUM_PLAIN, 1.0);
}

/* ---- variance (two passes: mean, then squared deviations) ------------------------------- */

#define DEFINE_VAR(SUF, T)                                                                \
  static double dev_row_##SUF(const T *x, int64_t n, T m) {                               \
    double total = 0;                                                                     \
    for (int64_t b0 = 0; b0 < n; b0 += SUM_BLOCK) {                                       \
      int64_t len = min64(SUM_BLOCK, n - b0);                                             \
      const T *p = x + b0;                                                                \
      T lane[LANES] = {0};                                                                \
      int64_t i = 0;                                                                      \
      for (; i + LANES <= len; i += LANES)                                                \
        for (int j = 0; j < LANES; j++) lane[j] += (p[i + j] - m) * (p[i + j] - m);       \
      double block = 0;                                                                   \
      for (; i < len; i++) block += (p[i] - m) * (p[i] - m);                              \
      for (int j = 0; j < LANES; j++) block += lane[j];                                   \
      total += block;                                                                     \
    }                                                                                     \
    return total;                                                                         \
  }                                                                                       \
  typedef struct {                                                                        \
    T *out;                                                                               \
    const T *x;                                                                           \
    int64_t R, B, chunks;                                                                 \
    double denom;                                                                         \
    int take_sqrt;                                                                        \
  } var_job_##SUF;                                                                        \
  static inline T var_post_##SUF(double ss, const var_job_##SUF *j) {                    \
    double v = ss / j->denom;                                                             \
    return (T)(j->take_sqrt ? sqrt(v) : v);                                               \
  }                                                                                       \
  static void var_rows_##SUF(void *vj, int64_t a0, int64_t a1) {                          \
    var_job_##SUF *j = vj;                                                                \
    for (int64_t a = a0; a < a1; a++) {                                                   \
      const T *row = j->x + a * j->R;                                                     \
      T m = (T)(sum_plain_##SUF##_row(row, j->R) / (double)j->R);                         \
      j->out[a] = var_post_##SUF(dev_row_##SUF(row, j->R, m), j);                         \
    }                                                                                     \
  }                                                                                       \
  static void var_cols_##SUF(void *vj, int64_t t0, int64_t t1) {                          \
    var_job_##SUF *j = vj;                                                                \
    double acc[COLS];                                                                     \
    T mean[COLS], tmp[COLS];                                                              \
    for (int64_t t = t0; t < t1; t++) {                                                   \
      int64_t a = t / j->chunks, c0 = (t % j->chunks) * COLS;                             \
      int64_t w = min64(COLS, j->B - c0), R = j->R, B = j->B;                             \
      const T *x = j->x + a * R * B + c0;                                                 \
      sum_plain_##SUF##_cols(acc, x, R, B, w);                                            \
      for (int64_t i = 0; i < w; i++) {                                                   \
        mean[i] = (T)(acc[i] / (double)R);                                                \
        acc[i] = 0;                                                                       \
      }                                                                                   \
      for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {                                     \
        int64_t r1 = min64(R, r0 + ROW_BLOCK);                                            \
        for (int64_t i = 0; i < w; i++) tmp[i] = 0;                                       \
        for (int64_t r = r0; r < r1; r++) {                                               \
          const T *restrict row = x + r * B;                                              \
          for (int64_t i = 0; i < w; i++) tmp[i] += (row[i] - mean[i]) * (row[i] - mean[i]); \
        }                                                                                 \
        for (int64_t i = 0; i < w; i++) acc[i] += tmp[i];                                 \
      }                                                                                   \
      T *o = j->out + a * B + c0;                                                         \
      for (int64_t i = 0; i < w; i++) o[i] = var_post_##SUF(acc[i], j);                   \
    }                                                                                     \
  }                                                                                       \
  void ddp_cpu_var_##SUF(T *out, const T *x, int64_t A, int64_t R, int64_t B,             \
                         double correction, int take_sqrt) {                              \
    var_job_##SUF j = {out, x, R, B, 0, (double)R - correction, take_sqrt};               \
    if (A == 0 || B == 0) return;                                                         \
    if (B > 1) {                                                                          \
      j.chunks = (B + COLS - 1) / COLS;                                                   \
      ddp_parallel_for(A * j.chunks, task_grain(2 * R * COLS, WORK_GRAIN), var_cols_##SUF, &j); \
    } else {                                                                              \
      ddp_parallel_for(A, task_grain(2 * R, WORK_GRAIN), var_rows_##SUF, &j);             \
    }                                                                                     \
  }

DEFINE_VAR(f32, float)
DEFINE_VAR(f64, double)

/* ---- max / min with indices -------------------------------------------------------------- */

/* v replaces best when more extreme, or when v is NaN and best is not (NaN propagates and
 * the first NaN's index is kept). For integer types v != v is always false. */
#define BETTER(v, best, is_max)                                                           \
  (((is_max) ? (v) > (best) : (v) < (best)) || ((v) != (v) && (best) == (best)))

#define DEFINE_ARGEXT(SUF, T)                                                             \
  typedef struct {                                                                        \
    T *values;                                                                            \
    int64_t *indices;                                                                     \
    const T *x;                                                                           \
    int64_t R, B, chunks;                                                                 \
    int is_max;                                                                           \
  } argext_job_##SUF;                                                                     \
  /* Two passes over a row: the extreme value in LANES running extremes (vector          \
   * compares and blends), then the first index holding it; a NaN anywhere wins instead. */ \
  static inline __attribute__((always_inline)) void argext_rows_##SUF(                    \
      argext_job_##SUF *j, int64_t a0, int64_t a1, const int is_max) {                    \
    const int64_t R = j->R;                                                               \
    for (int64_t a = a0; a < a1; a++) {                                                   \
      const T *row = j->x + a * R;                                                        \
      T best = row[0];                                                                    \
      int64_t r = 1;                                                                      \
      if (R >= 2 * LANES) {                                                               \
        T lv[LANES];                                                                      \
        for (int k = 0; k < LANES; k++) lv[k] = row[k];                                   \
        for (r = LANES; r + LANES <= R; r += LANES)                                       \
          for (int k = 0; k < LANES; k++) {                                               \
            T v = row[r + k];                                                             \
            lv[k] = (is_max ? v > lv[k] : v < lv[k]) ? v : lv[k];                         \
          }                                                                               \
        for (int k = 0; k < LANES; k++)                                                   \
          best = (is_max ? lv[k] > best : lv[k] < best) ? lv[k] : best;                   \
      }                                                                                   \
      for (; r < R; r++) best = (is_max ? row[r] > best : row[r] < best) ? row[r] : best; \
      int any_nan = 0;                                                                    \
      for (int64_t i = 0; i < R; i++) any_nan |= row[i] != row[i];                        \
      int64_t at = 0;                                                                     \
      if (any_nan) {                                                                      \
        while (row[at] == row[at]) at++;                                                  \
      } else { /* skip LANES-blocks without a match (a vector compare each) */            \
        for (; at + LANES <= R; at += LANES) {                                            \
          int hit = 0;                                                                    \
          for (int k = 0; k < LANES; k++) hit |= row[at + k] == best;                     \
          if (hit) break;                                                                 \
        }                                                                                 \
        while (row[at] != best) at++;                                                     \
      }                                                                                   \
      j->values[a] = row[at];                                                             \
      j->indices[a] = at;                                                                 \
    }                                                                                     \
  }                                                                                       \
  static inline __attribute__((always_inline)) void argext_cols_##SUF(                    \
      argext_job_##SUF *j, int64_t t0, int64_t t1, const int is_max) {                    \
    for (int64_t t = t0; t < t1; t++) {                                                   \
      int64_t a = t / j->chunks, c0 = (t % j->chunks) * COLS;                             \
      int64_t w = min64(COLS, j->B - c0), R = j->R, B = j->B;                             \
      const T *x = j->x + a * R * B + c0;                                                 \
      T *restrict best = j->values + a * B + c0;                                          \
      int64_t *restrict at = j->indices + a * B + c0;                                     \
      for (int64_t i = 0; i < w; i++) {                                                   \
        best[i] = x[i];                                                                   \
        at[i] = 0;                                                                        \
      }                                                                                   \
      for (int64_t r = 1; r < R; r++) {                                                   \
        const T *restrict row = x + r * B;                                                \
        for (int64_t i = 0; i < w; i++) {                                                 \
          T v = row[i], b = best[i];                                                      \
          int take = BETTER(v, b, is_max);                                                \
          best[i] = take ? v : b;                                                         \
          at[i] = take ? r : at[i];                                                       \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }                                                                                       \
  /* one clone per direction, so the comparison is fixed inside the vector loops */     \
  static void argext_rows_max_##SUF(void *j, int64_t b, int64_t e) { argext_rows_##SUF(j, b, e, 1); } \
  static void argext_rows_min_##SUF(void *j, int64_t b, int64_t e) { argext_rows_##SUF(j, b, e, 0); } \
  static void argext_cols_max_##SUF(void *j, int64_t b, int64_t e) { argext_cols_##SUF(j, b, e, 1); } \
  static void argext_cols_min_##SUF(void *j, int64_t b, int64_t e) { argext_cols_##SUF(j, b, e, 0); } \
  void ddp_cpu_argext_##SUF(T *values, int64_t *indices, const T *x, int64_t A, int64_t R, \
                            int64_t B, int is_max) {                                      \
    argext_job_##SUF j = {values, indices, x, R, B, 0, is_max};                           \
    if (A == 0 || B == 0 || R == 0) return;                                               \
    if (B > 1) {                                                                          \
      j.chunks = (B + COLS - 1) / COLS;                                                   \
      ddp_parallel_for(A * j.chunks, task_grain(R * COLS, WORK_GRAIN),                    \
                       is_max ? argext_cols_max_##SUF : argext_cols_min_##SUF, &j);       \
    } else {                                                                              \
      ddp_parallel_for(A, task_grain(R, WORK_GRAIN),                                      \
                       is_max ? argext_rows_max_##SUF : argext_rows_min_##SUF, &j);       \
    }                                                                                     \
  }

DEFINE_ARGEXT(f32, float)
DEFINE_ARGEXT(f64, double)
DEFINE_ARGEXT(i64, int64_t)
DEFINE_ARGEXT(i32, int32_t)
DEFINE_ARGEXT(u8, uint8_t)

/* ---- softmax and log_softmax --------------------------------------------------------- */

enum { SOFTMAX_GRAIN = 1 << 13 }; /* elements per task: exp is dearer than an add */
enum { SUB_ROWS = 64 };           /* rows per group of a row softmax */
enum { BW_TMP = 2048 };           /* elements of exp(y) buffered by log_softmax's backward */

/* Largest element of a row (LANES running maxima, so it vectorises). NaN may or may not
 * win; softmax turns a NaN anywhere in the row into NaN everywhere either way. */
#define DEFINE_ROW_MAX(SUF, T)                                                            \
  static T row_max_##SUF(const T *x, int64_t n) {                                         \
    T mx = x[0];                                                                          \
    int64_t i = 0;                                                                        \
    if (n >= LANES) {                                                                     \
      T lane[LANES];                                                                      \
      for (int j = 0; j < LANES; j++) lane[j] = x[j];                                     \
      for (i = LANES; i + LANES <= n; i += LANES)                                         \
        for (int j = 0; j < LANES; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j]; \
      for (int j = 0; j < LANES; j++) mx = lane[j] > mx ? lane[j] : mx;                   \
    }                                                                                     \
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;                                        \
    return mx;                                                                            \
  }                                                                                       \
  /* sum of x[i] * y[i] in LANES accumulators, the total in double */                     \
  static double row_dot_##SUF(const T *x, const T *y, int64_t n) {                        \
    T lane[LANES] = {0};                                                                  \
    int64_t i = 0;                                                                        \
    double total = 0;                                                                     \
    for (; i + LANES <= n; i += LANES)                                                    \
      for (int j = 0; j < LANES; j++) lane[j] += x[i + j] * y[i + j];                     \
    for (; i < n; i++) total += (double)x[i] * y[i];                                      \
    for (int j = 0; j < LANES; j++) total += lane[j];                                     \
    return total;                                                                         \
  }                                                                                       \
  /* how many y[i] exceed 1/2 (0 or 1 in a softmax row; vectorises) */                    \
  static int64_t row_above_half_##SUF(const T *restrict y, int64_t n) {                   \
    int64_t c = 0;                                                                        \
    for (int64_t i = 0; i < n; i++) c += y[i] > (T)0.5;                                   \
    return c;                                                                             \
  }                                                                                       \
  /* sum of x[i] * y[i] and of y[i], in double (Note [softmax backward pivot]; only for  \
   * a row with a dominant y, so a plain loop) */                                         \
  static void row_dot_sum_d_##SUF(const T *x, const T *y, int64_t n, double *dot,          \
                                  double *sum) {                                          \
    double td = 0, ts = 0;                                                                \
    for (int64_t i = 0; i < n; i++) {                                                     \
      td += (double)x[i] * y[i];                                                          \
      ts += y[i];                                                                         \
    }                                                                                     \
    *dot = td;                                                                            \
    *sum = ts;                                                                            \
  }                                                                                       \
  /* sum of x[i] in DLANES double accumulators */                                         \
  static double row_sum_d_##SUF(const T *restrict x, int64_t n) {                         \
    double total = 0, lane[DLANES] = {0};                                                 \
    int64_t i = 0;                                                                        \
    for (; i + DLANES <= n; i += DLANES)                                                  \
      for (int j = 0; j < DLANES; j++) lane[j] += x[i + j];                               \
    for (; i < n; i++) total += x[i];                                                     \
    for (int j = 0; j < DLANES; j++) total += lane[j];                                    \
    return total;                                                                         \
  }

DEFINE_ROW_MAX(f32, float)
DEFINE_ROW_MAX(f64, double)

/* Note [softmax backward pivot]: softmax's gradient is y_i (dy_i - s), s = sum_j y_j dy_j,
 * and dy_i - s cancels in ways the data make common: one y_k close to 1 (then s is mostly
 * y_k dy_k, and dy_k - s is 2^-16 of dy_k or less), or that y_k dominant with another
 * dy_i equal to dy_k (a tie among bf16 values). There the rounding of the y_j (2^-24 of
 * each in f32) became an error of about |dy_k| 2^-24 in a difference 2^-16 of |dy_k| or
 * smaller: tens to hundreds of ulps of a bf16 result (Note [half softmax backward] in
 * runtime/ops/reduce.c). So the difference is taken about a pivot k, the y above 1/2 when
 * the row has one (at most one can dominate):
 *
 *   dy_i - s / sum_j y_j  =  (dy_i - dy_k) + (dy_k sum_j y_j - s) / sum_j y_j
 *
 * (dividing by sum_j y_j, which rounding keeps only near 1). dy_i - dy_k is exact for half
 * inputs and cancellation-free otherwise; dy_k sum_j y_j - s = sum_j y_j (dy_k - dy_j) is
 * formed in double from double sums of exact products, so its error is 2^-53 of |dy_k| and
 * the rounding of y_k drops out of it. The element loop keeps its shape (a subtraction and
 * a multiply-add per element). A row without a y above 1/2 (found by a vectorised count)
 * keeps the plain formula and its f32 sums; the column form takes dy_k = 0 there, which is
 * the plain formula normalised by sum_j y_j. Cost, measured fwd + bwd at 1 thread
 * (bench: (4096, 10), (256, 1000), (32, 64, 16, 16) over dim 2): +25%, +5%, +10%.
 * log_softmax's gradient
 * dy_i - p_i sum_j dy_j (p_i = exp(y_i)) cancels when p_i is near 1; for p_i > 1/2 it is
 * written dy_i (1 - p_i) - p_i sum_{j != i} dy_j, with 1 - p_i = -expm1(y_i) exact to its
 * last bits and the sum from the row's double sum minus dy_i. */
static inline double log_softmax_grad_near_1(double log_y, double dy, double sum_dy) {
  return dy * -expm1(log_y) - exp(log_y) * (sum_dy - dy);
}
#define LOG_HALF (-0.69314718055994530942)

#define DEFINE_SOFTMAX(SUF, T, EXP)                                                  \
  typedef struct {                                                                        \
    T *y;                                                                                 \
    const T *x, *dy;                                                                      \
    T *dx;                                                                                \
    int64_t R, B, chunks;                                                                 \
    int log; /* 1: log_softmax */                                                         \
  } softmax_job_##SUF;                                                                    \
  /* Rows go in groups of up to SUB_ROWS: x - max of every row of the group goes into y,  \
   * then one long exp loop over the whole group (vectorised even for rows of 10 class    \
   * scores), then per-row sums and the normalisation. */                                \
  static void softmax_rows_##SUF(void *vj, int64_t a0, int64_t a1) {                      \
    softmax_job_##SUF *j = vj;                                                            \
    const int64_t R = j->R;                                                               \
    T mxs[SUB_ROWS];                                                                      \
    for (int64_t g0 = a0; g0 < a1; g0 += SUB_ROWS) {                                      \
      int64_t rows = min64(SUB_ROWS, a1 - g0);                                            \
      const T *restrict x = j->x + g0 * R;                                                \
      T *restrict y = j->y + g0 * R;                                                      \
      for (int64_t k = 0; k < rows; k++) {                                                \
        T mx = row_max_##SUF(x + k * R, R);                                               \
        mxs[k] = mx;                                                                      \
        for (int64_t r = 0; r < R; r++) y[k * R + r] = x[k * R + r] - mx;                 \
      }                                                                                   \
      for (int64_t k = 0; k < rows * R; k++) y[k] = EXP(y[k]);                            \
      for (int64_t k = 0; k < rows; k++) {                                                \
        double sum = sum_plain_##SUF##_row(y + k * R, R);                                 \
        T *restrict yr = y + k * R;                                                       \
        const T *restrict xr = x + k * R;                                                 \
        if (j->log) { /* recomputed from x: exact where exp underflowed */                \
          T l = (T)log(sum), mx = mxs[k];                                                 \
          for (int64_t r = 0; r < R; r++) yr[r] = (xr[r] - mx) - l;                       \
        } else {                                                                          \
          T inv = (T)(1.0 / sum);                                                         \
          for (int64_t r = 0; r < R; r++) yr[r] *= inv;                                   \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }                                                                                       \
  /* Column form (softmax over channels of (N, C, H, W): B = H W): per chunk of COLS       \
   * columns, the max over R, then exp into y and the sums, then the normalisation; every \
   * inner loop runs across the columns and vectorises. */                                \
  static void softmax_cols_##SUF(void *vj, int64_t t0, int64_t t1) {                      \
    softmax_job_##SUF *j = vj;                                                            \
    T mx[COLS], fin[COLS];                                                                \
    double s[COLS];                                                                       \
    for (int64_t t = t0; t < t1; t++) {                                                   \
      int64_t a = t / j->chunks, c0 = (t % j->chunks) * COLS;                             \
      int64_t w = min64(COLS, j->B - c0), R = j->R, B = j->B;                             \
      const T *x = j->x + a * R * B + c0;                                                 \
      T *y = j->y + a * R * B + c0;                                                       \
      for (int64_t i = 0; i < w; i++) {                                                   \
        mx[i] = x[i];                                                                     \
        s[i] = 0;                                                                         \
      }                                                                                   \
      for (int64_t r = 1; r < R; r++) {                                                   \
        const T *restrict xr = x + r * B;                                                 \
        for (int64_t i = 0; i < w; i++) mx[i] = xr[i] > mx[i] ? xr[i] : mx[i];            \
      }                                                                                   \
      for (int64_t r = 0; r < R; r++) {                                                   \
        const T *restrict xr = x + r * B;                                                 \
        T *restrict yr = y + r * B;                                                       \
        for (int64_t i = 0; i < w; i++) yr[i] = EXP(xr[i] - mx[i]);                       \
        for (int64_t i = 0; i < w; i++) s[i] += yr[i];                                    \
      }                                                                                   \
      for (int64_t i = 0; i < w; i++)                                                     \
        fin[i] = j->log ? (T)log(s[i]) : (T)(1.0 / s[i]);                                 \
      for (int64_t r = 0; r < R; r++) {                                                   \
        const T *restrict xr = x + r * B;                                                 \
        T *restrict yr = y + r * B;                                                       \
        if (j->log)                                                                       \
          for (int64_t i = 0; i < w; i++) yr[i] = (xr[i] - mx[i]) - fin[i];               \
        else                                                                              \
          for (int64_t i = 0; i < w; i++) yr[i] *= fin[i];                                \
      }                                                                                   \
    }                                                                                     \
  }                                                                                       \
  void ddp_cpu_softmax_##SUF(T *y, const T *x, int64_t A, int64_t R, int64_t B, int is_log) { \
    softmax_job_##SUF j = {y, x, NULL, NULL, R, B, 0, is_log};                               \
    if (A == 0 || B == 0 || R == 0) return;                                               \
    if (B > 1) {                                                                          \
      j.chunks = (B + COLS - 1) / COLS;                                                   \
      ddp_parallel_for(A * j.chunks, task_grain(R * COLS, SOFTMAX_GRAIN), softmax_cols_##SUF, &j); \
    } else {                                                                              \
      ddp_parallel_for(A, task_grain(R, SOFTMAX_GRAIN), softmax_rows_##SUF, &j);          \
    }                                                                                     \
  }                                                                                       \
  /* log_softmax: exp(y) of a group of short rows in one vectorised loop into a stack     \
   * buffer; long rows (R > BW_TMP) call EXP inside their own long loop. */               \
  static void softmax_bw_rows_##SUF(void *vj, int64_t a0, int64_t a1) {                   \
    softmax_job_##SUF *j = vj;                                                            \
    const int64_t R = j->R;                                                               \
    T e[BW_TMP];                                                                          \
    int64_t group = R <= BW_TMP ? BW_TMP / (R > 0 ? R : 1) : 1;                           \
    for (int64_t g0 = a0; g0 < a1; g0 += group) {                                         \
      int64_t rows = min64(group, a1 - g0);                                               \
      const T *restrict y = j->y + g0 * R, *restrict dy = j->dy + g0 * R;                 \
      T *restrict dx = j->dx + g0 * R;                                                    \
      if (j->log && R <= BW_TMP)                                                          \
        for (int64_t k = 0; k < rows * R; k++) e[k] = EXP(y[k]);                          \
      for (int64_t k = 0; k < rows; k++) {                                                \
        const T *restrict yr = y + k * R, *restrict dyr = dy + k * R;                     \
        T *restrict dxr = dx + k * R;                                                     \
        if (j->log) { /* Note [softmax backward pivot], the log_softmax part */           \
          int64_t big = -1;                                                               \
          for (int64_t r = 0; r < R; r++) big = yr[r] > (T)LOG_HALF ? r : big;            \
          T keep = big >= 0 ? dxr[big] : 0;                                               \
          double s_dy = row_sum_d_##SUF(dyr, R);                                          \
          T st = (T)s_dy;                                                                 \
          if (R <= BW_TMP) {                                                              \
            const T *restrict er = e + k * R;                                             \
            for (int64_t r = 0; r < R; r++) dxr[r] += dyr[r] - er[r] * st;                \
          } else {                                                                        \
            for (int64_t r = 0; r < R; r++) dxr[r] += dyr[r] - EXP(yr[r]) * st;           \
          }                                                                               \
          if (big >= 0) dxr[big] = keep + (T)log_softmax_grad_near_1(yr[big], dyr[big], s_dy); \
        } else if (row_above_half_##SUF(yr, R) == 0) {                                    \
          T st = (T)row_dot_##SUF(dyr, yr, R);                                            \
          for (int64_t r = 0; r < R; r++) dxr[r] += yr[r] * (dyr[r] - st);                \
        } else { /* a dominant y: Note [softmax backward pivot] */                        \
          double s_dy_y, s_y;                                                             \
          row_dot_sum_d_##SUF(dyr, yr, R, &s_dy_y, &s_y);                                 \
          int64_t piv = 0;                                                                \
          while (piv < R - 1 && !(yr[piv] > (T)0.5)) piv++;                               \
          T dyk = dyr[piv];                                                               \
          T dn = (T)(((double)dyk * s_y - s_dy_y) / s_y);                                 \
          for (int64_t r = 0; r < R; r++) dxr[r] += yr[r] * ((dyr[r] - dyk) + dn);        \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }                                                                                       \
  static void softmax_bw_cols_##SUF(void *vj, int64_t t0, int64_t t1) {                   \
    softmax_job_##SUF *j = vj;                                                            \
    double s[COLS], sy[COLS];                                                             \
    T st[COLS], keep[COLS];                                                               \
    int64_t piv[COLS]; /* Note [softmax backward pivot]: -1 for none */                   \
    const T near1 = j->log ? (T)LOG_HALF : (T)0.5;                                        \
    for (int64_t t = t0; t < t1; t++) {                                                   \
      int64_t a = t / j->chunks, c0 = (t % j->chunks) * COLS;                             \
      int64_t w = min64(COLS, j->B - c0), R = j->R, B = j->B;                             \
      const T *y = j->y + a * R * B + c0, *dy = j->dy + a * R * B + c0;                   \
      T *dx = j->dx + a * R * B + c0;                                                     \
      for (int64_t i = 0; i < w; i++) {                                                   \
        s[i] = sy[i] = 0;                                                                 \
        piv[i] = -1;                                                                      \
      }                                                                                   \
      for (int64_t r = 0; r < R; r++) {                                                   \
        const T *restrict yr = y + r * B, *restrict dyr = dy + r * B;                     \
        if (j->log)                                                                       \
          for (int64_t i = 0; i < w; i++) s[i] += dyr[i];                                 \
        else                                                                              \
          for (int64_t i = 0; i < w; i++) {                                               \
            s[i] += (double)dyr[i] * yr[i];                                               \
            sy[i] += yr[i];                                                               \
          }                                                                               \
        for (int64_t i = 0; i < w; i++) piv[i] = yr[i] > near1 ? r : piv[i];              \
      }                                                                                   \
      for (int64_t i = 0; i < w; i++) {                                                   \
        if (j->log) {                                                                     \
          st[i] = (T)s[i];                                                                \
          keep[i] = piv[i] >= 0 ? dx[piv[i] * B + i] : 0;                                  \
        } else { /* st: the pivot's dy; keep: (dy_k sum y - s) / sum y */                 \
          T dyk = piv[i] >= 0 ? dy[piv[i] * B + i] : 0;                                    \
          st[i] = dyk;                                                                    \
          keep[i] = (T)(((double)dyk * sy[i] - s[i]) / sy[i]);                            \
        }                                                                                 \
      }                                                                                   \
      for (int64_t r = 0; r < R; r++) {                                                   \
        const T *restrict yr = y + r * B, *restrict dyr = dy + r * B;                     \
        T *restrict dxr = dx + r * B;                                                     \
        if (j->log)                                                                       \
          for (int64_t i = 0; i < w; i++) dxr[i] += dyr[i] - EXP(yr[i]) * st[i];          \
        else                                                                              \
          for (int64_t i = 0; i < w; i++) dxr[i] += yr[i] * ((dyr[i] - st[i]) + keep[i]); \
      }                                                                                   \
      if (j->log)                                                                         \
        for (int64_t i = 0; i < w; i++) {                                                 \
          if (piv[i] < 0) continue;                                                       \
          int64_t at = piv[i] * B + i;                                                    \
          dx[at] = keep[i] + (T)log_softmax_grad_near_1(y[at], dy[at], s[i]);             \
        }                                                                                 \
    }                                                                                     \
  }                                                                                       \
  void ddp_cpu_softmax_backward_##SUF(T *dx, const T *y, const T *dy, int64_t A, int64_t R, \
                                      int64_t B, int is_log) {                             \
    softmax_job_##SUF j = {(T *)y, NULL, dy, dx, R, B, 0, is_log};                         \
    if (A == 0 || B == 0 || R == 0) return;                                               \
    if (B > 1) {                                                                          \
      j.chunks = (B + COLS - 1) / COLS;                                                   \
      ddp_parallel_for(A * j.chunks, task_grain(R * COLS, SOFTMAX_GRAIN), softmax_bw_cols_##SUF, &j); \
    } else {                                                                              \
      ddp_parallel_for(A, task_grain(R, SOFTMAX_GRAIN), softmax_bw_rows_##SUF, &j);       \
    }                                                                                     \
  }

DEFINE_SOFTMAX(f32, float, exp_f32)
DEFINE_SOFTMAX(f64, double, exp)

/* ---- table entries: one dtype switch per call (Note [one dispatch path]) ---------------- */

void ddp_cpu_sum(int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B, int mode,
                 double scale) {
  if (dtype == DDP_F32) ddp_cpu_sum_f32(out, x, A, R, B, mode, scale);
  else if (dtype == DDP_F64) ddp_cpu_sum_f64(out, x, A, R, B, mode, scale);
  else ddp_cpu_sum_i64(out, x, A, R, B);
}

void ddp_cpu_var(int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B,
                 double correction, int take_sqrt) {
  if (dtype == DDP_F64) ddp_cpu_var_f64(out, x, A, R, B, correction, take_sqrt);
  else ddp_cpu_var_f32(out, x, A, R, B, correction, take_sqrt);
}

void ddp_cpu_argext(int dtype, void *values, int64_t *indices, const void *x, int64_t A,
                    int64_t R, int64_t B, int is_max) {
  switch (dtype) {
  case DDP_F32: ddp_cpu_argext_f32(values, indices, x, A, R, B, is_max); break;
  case DDP_F64: ddp_cpu_argext_f64(values, indices, x, A, R, B, is_max); break;
  case DDP_I64: ddp_cpu_argext_i64(values, indices, x, A, R, B, is_max); break;
  case DDP_I32: ddp_cpu_argext_i32(values, indices, x, A, R, B, is_max); break;
  default: ddp_cpu_argext_u8(values, indices, x, A, R, B, is_max); break; /* u8, bool */
  }
}

void ddp_cpu_softmax(int dtype, void *y, const void *x, int64_t A, int64_t R, int64_t B, int log) {
  if (dtype == DDP_F64) ddp_cpu_softmax_f64(y, x, A, R, B, log);
  else ddp_cpu_softmax_f32(y, x, A, R, B, log);
}

void ddp_cpu_softmax_backward(int dtype, void *dx, const void *y, const void *dy, int64_t A,
                              int64_t R, int64_t B, int log) {
  if (dtype == DDP_F64) ddp_cpu_softmax_backward_f64(dx, y, dy, A, R, B, log);
  else ddp_cpu_softmax_backward_f32(dx, y, dy, A, R, B, log);
}
