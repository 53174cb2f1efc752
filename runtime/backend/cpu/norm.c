/* runtime/backend/cpu/norm.c: CPU kernels of batch norm's per-channel steps (finalize,
 * running update, backward coefficients), layer norm, dropout and embedding; batch norm's
 * passes over the data are in batch_norm.c. See norm.h for the shapes. Each typed kernel is written once as a macro body
 * instantiated for float and double (NORM_KERNELS at the bottom); the work is split over
 * the thread pool with ddp_parallel_for on the dimension whose slices are independent
 * (rows or columns for layer norm, columns for embedding grads). */
#include "backend/cpu/norm.h"

#include <math.h>
#include <string.h>

#include "core/core.h"

enum { ELEMENT_GRAIN = 1 << 15 }; /* ~32K elements per thread chunk for cheap work */

/* Chunk size (in slices of `per_slice` elements each) giving about ELEMENT_GRAIN elements. */
static int64_t grain_for(int64_t per_slice) {
  if (per_slice <= 0) return ELEMENT_GRAIN;
  int64_t g = ELEMENT_GRAIN / per_slice;
  return g < 1 ? 1 : g;
}

typedef struct {
  void *y, *mean, *rstd, *dx, *dw, *db;
  const void *x, *w, *b, *dy, *cmean, *crstd;
  int64_t M, D;
  double eps;
} ln_ctx;

typedef struct {
  void *dweight;
  const void *dy;
  const int64_t *idx;
  int64_t n, D, padding_idx;
} emb_ctx;

#define NORM_KERNELS(T, SFX)                                                                   \
  void ddp_cpu_bn_finalize_##SFX(T *mean_out, T *scale, T *shift, T *invstd, const double *mean, \
                                 const double *var, const T *w, const T *b, int64_t C,          \
                                 double eps) {                                                  \
    for (int64_t c = 0; c < C; c++) {                                                          \
      double is = 1.0 / sqrt(var[c] + eps);                                                    \
      if (mean_out) mean_out[c] = (T)mean[c];                                                  \
      if (scale) scale[c] = (T)((w ? (double)w[c] : 1.0) * is);                                \
      if (shift) shift[c] = b ? b[c] : (T)0;                                                   \
      if (invstd) invstd[c] = (T)is;                                                           \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  void ddp_cpu_bn_backward_coef_##SFX(T *a, T *b, T *d, T *dweight, T *dbias,                  \
                                      const double *sum_dy, const double *sum_dy_xmu,          \
                                      const T *invstd, const T *w, int64_t C, double M,        \
                                      int training) {                                          \
    for (int64_t c = 0; c < C; c++) {                                                          \
      double is = invstd[c], wc = w ? (double)w[c] : 1.0, k = wc * is / M;                     \
      if (a) a[c] = (T)(wc * is);                                                              \
      if (b) b[c] = training ? (T)(-k * is * is * sum_dy_xmu[c]) : (T)0;                       \
      if (d) d[c] = training ? (T)(-k * sum_dy[c]) : (T)0;                                     \
      if (dweight) dweight[c] = (T)(sum_dy_xmu[c] * is);                                       \
      if (dbias) dbias[c] = (T)sum_dy[c];                                                      \
    }                                                                                          \
  }                                                                                            \
                                                                                               \
  /* rows [r0, r1) */                                                                          \
  static void ln_forward_range_##SFX(void *vctx, int64_t r0, int64_t r1) {                   \
    const ln_ctx *k = vctx;                                                                    \
    T *y = k->y, *mean = k->mean, *rstd = k->rstd;                                             \
    const T *x = k->x, *w = k->w, *b = k->b;                                                   \
    int64_t D = k->D;                                                                          \
    for (int64_t r = r0; r < r1; r++) {                                                        \
      const T *restrict xr = x + r * D;                                                        \
      T *restrict yr = y + r * D;                                                              \
      double acc = 0;                                                                          \
      for (int64_t j = 0; j < D; j++) acc += xr[j];                                            \
      double m = acc / (double)D, sq = 0;                                                      \
      for (int64_t j = 0; j < D; j++) sq += (xr[j] - m) * (xr[j] - m);                         \
      double rs = 1.0 / sqrt(sq / (double)D + k->eps);                                         \
      mean[r] = (T)m;                                                                          \
      rstd[r] = (T)rs;                                                                         \
      T mt = (T)m, rt = (T)rs;                                                                 \
      if (w && b)                                                                              \
        for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt * w[j] + b[j];               \
      else if (w)                                                                              \
        for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt * w[j];                      \
      else if (b)                                                                              \
        for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt + b[j];                      \
      else                                                                                     \
        for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt;                             \
    }                                                                                          \
  }                                                                                            \
  void ddp_cpu_ln_forward_##SFX(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,    \
                                int64_t M, int64_t D, double eps) {                            \
    ln_ctx k = {.y = y, .mean = mean, .rstd = rstd, .x = x, .w = w, .b = b, .M = M, .D = D,    \
                .eps = eps};                                                                   \
    ddp_parallel_for(M, grain_for(D), ln_forward_range_##SFX, &k);                             \
  }                                                                                            \
                                                                                               \
  /* rows [r0, r1) of dx: g = dy * w, dx += rstd / D (D g - sum g - xhat sum(g xhat)) */       \
  static void ln_backward_dx_range_##SFX(void *vctx, int64_t r0, int64_t r1) {               \
    const ln_ctx *k = vctx;                                                                    \
    T *dx = k->dx;                                                                             \
    const T *x = k->x, *w = k->w, *dy = k->dy, *mean = k->cmean, *rstd = k->crstd;             \
    int64_t D = k->D;                                                                          \
    for (int64_t r = r0; r < r1; r++) {                                                        \
      const T *restrict xr = x + r * D, *restrict dyr = dy + r * D;                            \
      T *restrict dxr = dx + r * D;                                                            \
      T m = mean[r], rs = rstd[r];                                                             \
      double sum_g = 0, sum_g_xhat = 0;                                                        \
      for (int64_t j = 0; j < D; j++) {                                                        \
        T g = w ? dyr[j] * w[j] : dyr[j];                                                      \
        sum_g += g;                                                                            \
        sum_g_xhat += g * (xr[j] - m) * rs;                                                    \
      }                                                                                        \
      T c1 = (T)(rs / (double)D), mg = (T)sum_g, mgx = (T)sum_g_xhat, Dt = (T)D;               \
      for (int64_t j = 0; j < D; j++) {                                                        \
        T g = w ? dyr[j] * w[j] : dyr[j];                                                      \
        dxr[j] += c1 * (Dt * g - mg - (xr[j] - m) * rs * mgx);                                 \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
  /* columns [j0, j1) of dw and db, summed over every row in order */                          \
  static void ln_backward_dwdb_range_##SFX(void *vctx, int64_t j0, int64_t j1) {             \
    const ln_ctx *k = vctx;                                                                    \
    T *dw = k->dw, *db = k->db;                                                                \
    const T *x = k->x, *dy = k->dy, *mean = k->cmean, *rstd = k->crstd;                        \
    int64_t D = k->D;                                                                          \
    for (int64_t r = 0; r < k->M; r++) {                                                       \
      const T *restrict xr = x + r * D, *restrict dyr = dy + r * D;                            \
      T m = mean[r], rs = rstd[r];                                                             \
      if (dw)                                                                                  \
        for (int64_t j = j0; j < j1; j++) dw[j] += dyr[j] * (xr[j] - m) * rs;                  \
      if (db)                                                                                  \
        for (int64_t j = j0; j < j1; j++) db[j] += dyr[j];                                     \
    }                                                                                          \
  }                                                                                            \
  void ddp_cpu_ln_backward_##SFX(T *dx, T *dw, T *db, const T *dy, const T *x, const T *mean,  \
                                 const T *rstd, const T *w, int64_t M, int64_t D) {            \
    ln_ctx k = {.dx = dx, .dw = dw, .db = db, .dy = dy, .x = x, .cmean = mean, .crstd = rstd,  \
                .w = w, .M = M, .D = D};                                                       \
    if (dx) ddp_parallel_for(M, grain_for(D), ln_backward_dx_range_##SFX, &k);                 \
    if (dw || db) ddp_parallel_for(D, grain_for(M), ln_backward_dwdb_range_##SFX, &k);         \
  }                                                                                            \
                                                                                               \
  typedef struct {                                                                             \
    T *y;                                                                                      \
    const T *x;                                                                                \
    const uint8_t *mask;                                                                       \
    T scale;                                                                                   \
  } masked_ctx_##SFX;                                                                          \
  static void masked_scale_range_##SFX(void *vctx, int64_t i0, int64_t i1) {                 \
    const masked_ctx_##SFX *k = vctx;                                                          \
    T *restrict y = k->y;                                                                      \
    const T *restrict x = k->x;                                                                \
    const uint8_t *restrict mask = k->mask;                                                    \
    T scale = k->scale;                                                                        \
    for (int64_t i = i0; i < i1; i++) y[i] = x[i] * (T)mask[i] * scale;                        \
  }                                                                                            \
  void ddp_cpu_masked_scale_##SFX(T *y, const T *x, const uint8_t *mask, T scale, int64_t n) { \
    masked_ctx_##SFX k = {y, x, mask, scale};                                                  \
    ddp_parallel_for(n, ELEMENT_GRAIN, masked_scale_range_##SFX, &k);                          \
  }                                                                                            \
                                                                                               \
  static void embedding_backward_range_##SFX(void *vctx, int64_t j0, int64_t j1) {           \
    const emb_ctx *k = vctx;                                                                   \
    T *dweight = k->dweight;                                                                   \
    const T *dy = k->dy;                                                                       \
    for (int64_t i = 0; i < k->n; i++) {                                                       \
      int64_t v = k->idx[i];                                                                   \
      if (v == k->padding_idx) continue;                                                       \
      T *restrict dst = dweight + v * k->D;                                                    \
      const T *restrict src = dy + i * k->D;                                                   \
      for (int64_t j = j0; j < j1; j++) dst[j] += src[j];                                      \
    }                                                                                          \
  }                                                                                            \
  void ddp_cpu_embedding_backward_##SFX(T *dweight, const T *dy, const int64_t *idx, int64_t n, \
                                        int64_t D, int64_t padding_idx) {                      \
    emb_ctx k = {.dweight = dweight, .dy = dy, .idx = idx, .n = n, .D = D,                     \
                 .padding_idx = padding_idx};                                                  \
    ddp_parallel_for(D, grain_for(n), embedding_backward_range_##SFX, &k);                     \
  }

NORM_KERNELS(float, f32)
NORM_KERNELS(double, f64)

void ddp_cpu_bn_running_update_f32(float *running, const double *value, int64_t C,
                                   double momentum, double correction) {
  for (int64_t c = 0; c < C; c++) {
    double v = value[c] * correction;
    running[c] = (float)((1 - momentum) * (double)running[c] + momentum * v);
  }
}

void ddp_cpu_bn_running_update_f64(double *running, const double *value, int64_t C,
                                   double momentum, double correction) {
  for (int64_t c = 0; c < C; c++) {
    double v = value[c] * correction;
    running[c] = (1 - momentum) * running[c] + momentum * v;
  }
}

typedef struct {
  char *out;
  const char *weight;
  const int64_t *idx;
  int64_t row_bytes;
} gather_ctx;

static void embedding_forward_range(void *vctx, int64_t i0, int64_t i1) {
  const gather_ctx *k = vctx;
  for (int64_t i = i0; i < i1; i++)
    memcpy(k->out + i * k->row_bytes, k->weight + k->idx[i] * k->row_bytes, (size_t)k->row_bytes);
}

void ddp_cpu_embedding_forward(char *out, const char *weight, const int64_t *idx, int64_t n,
                               int64_t row_bytes) {
  gather_ctx k = {out, weight, idx, row_bytes};
  ddp_parallel_for(n, grain_for(row_bytes / 4 + 1), embedding_forward_range, &k);
}

/* ---- table entries: one dtype switch per call (Note [one dispatch path]) ---------------- */

void ddp_cpu_bn_finalize(int dtype, void *mean_out, void *scale, void *shift, void *invstd,
                         const double *mean, const double *var, const void *w, const void *b,
                         int64_t C, double eps) {
  if (dtype == DDP_F64) ddp_cpu_bn_finalize_f64(mean_out, scale, shift, invstd, mean, var, w, b, C, eps);
  else ddp_cpu_bn_finalize_f32(mean_out, scale, shift, invstd, mean, var, w, b, C, eps);
}

void ddp_cpu_bn_running_update(int dtype, void *running, const double *value, int64_t C,
                               double momentum, double correction) {
  if (dtype == DDP_F64) ddp_cpu_bn_running_update_f64(running, value, C, momentum, correction);
  else ddp_cpu_bn_running_update_f32(running, value, C, momentum, correction);
}

void ddp_cpu_bn_backward_coef(int dtype, void *a, void *b, void *d, void *dweight, void *dbias,
                              const double *sum_dy, const double *sum_dy_xmu, const void *invstd,
                              const void *w, int64_t C, double M, int training) {
  if (dtype == DDP_F64)
    ddp_cpu_bn_backward_coef_f64(a, b, d, dweight, dbias, sum_dy, sum_dy_xmu, invstd, w, C, M,
                                 training);
  else
    ddp_cpu_bn_backward_coef_f32(a, b, d, dweight, dbias, sum_dy, sum_dy_xmu, invstd, w, C, M,
                                 training);
}

void ddp_cpu_ln_forward(int dtype, void *y, void *mean, void *rstd, const void *x, const void *w,
                        const void *b, int64_t M, int64_t D, double eps) {
  if (dtype == DDP_F64) ddp_cpu_ln_forward_f64(y, mean, rstd, x, w, b, M, D, eps);
  else ddp_cpu_ln_forward_f32(y, mean, rstd, x, w, b, M, D, eps);
}

void ddp_cpu_ln_backward(int dtype, void *dx, void *dw, void *db, const void *dy, const void *x,
                         const void *mean, const void *rstd, const void *w, int64_t M, int64_t D) {
  if (dtype == DDP_F64) ddp_cpu_ln_backward_f64(dx, dw, db, dy, x, mean, rstd, w, M, D);
  else ddp_cpu_ln_backward_f32(dx, dw, db, dy, x, mean, rstd, w, M, D);
}

void ddp_cpu_masked_scale(int dtype, void *y, const void *x, const uint8_t *mask, double scale,
                          int64_t n) {
  if (dtype == DDP_F64) ddp_cpu_masked_scale_f64(y, x, mask, scale, n);
  else ddp_cpu_masked_scale_f32(y, x, mask, (float)scale, n);
}

void ddp_cpu_embedding_backward(int dtype, void *dweight, const void *dy, const int64_t *idx,
                                int64_t n, int64_t D, int64_t padding_idx) {
  if (dtype == DDP_F64) ddp_cpu_embedding_backward_f64(dweight, dy, idx, n, D, padding_idx);
  else ddp_cpu_embedding_backward_f32(dweight, dy, idx, n, D, padding_idx);
}
