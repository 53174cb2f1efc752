/* runtime/backend/cpu/pool.c: max, average and adaptive average pooling over (P, H, W)
 * planes, forward and backward. Window formulas follow PyTorch's CPU kernels
 * (aten/src/ATen/native/cpu/{MaxPoolKernel,AvgPoolKernel,AdaptiveAvgPoolKernel}.cpp). */
#include <math.h>

#include "backend/cpu/pool.h"
#include "core/core.h"

/* PyTorch's adaptive window: [floor(i * in / out), ceil((i + 1) * in / out)). */
static int64_t start_index(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
static int64_t end_index(int64_t i, int64_t out, int64_t in) { return ((i + 1) * in + out - 1) / out; }

typedef struct {
  const ddp_pool2d_geom *g;
  void *out, *d_in;
  const void *in, *grad_out;
  int64_t *indices;
  const int64_t *cindices;
} pool_job;

/* Planes per thread chunk: about 32K window elements of work. */
static int64_t plane_grain(const ddp_pool2d_geom *g, int64_t window) {
  int64_t work = g->oh * g->ow * (window > 0 ? window : 1);
  return work >= 32768 ? 1 : 32768 / (work + 1) + 1;
}

#define POOL_KERNELS(T)                                                                    \
  static void max_fwd_##T(void *vctx, int64_t begin, int64_t end) {                        \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    for (int64_t p = begin; p < end; p++) {                                                \
      const T *in = (const T *)j->in + p * g->h * g->w;                                    \
      T *out = (T *)j->out + p * g->oh * g->ow;                                            \
      int64_t *idx = j->indices + p * g->oh * g->ow;                                       \
      for (int64_t oh = 0; oh < g->oh; oh++)                                               \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          int64_t h0 = oh * g->sh - g->ph, w0 = ow * g->sw - g->pw;                        \
          T best = -INFINITY;                                                              \
          int64_t best_i = -1;                                                             \
          for (int64_t ki = 0; ki < g->kh; ki++) {                                         \
            int64_t ih = h0 + ki * g->dh;                                                  \
            if (ih < 0 || ih >= g->h) continue;                                            \
            for (int64_t kj = 0; kj < g->kw; kj++) {                                       \
              int64_t iw = w0 + kj * g->dw;                                                \
              if (iw < 0 || iw >= g->w) continue;                                          \
              T v = in[ih * g->w + iw];                                                    \
              /* NaN wins and stays, as in PyTorch */                                      \
              if (best_i < 0 || v > best || isnan(v)) best = v, best_i = ih * g->w + iw;   \
            }                                                                              \
          }                                                                                \
          out[oh * g->ow + ow] = best;                                                     \
          idx[oh * g->ow + ow] = best_i < 0 ? 0 : best_i;                                  \
        }                                                                                  \
    }                                                                                      \
  }                                                                                        \
  static void max_bwd_##T(void *vctx, int64_t begin, int64_t end) {                        \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    int64_t L = g->oh * g->ow;                                                             \
    for (int64_t p = begin; p < end; p++) {                                                \
      T *d = (T *)j->d_in + p * g->h * g->w;                                               \
      const T *go = (const T *)j->grad_out + p * L;                                        \
      const int64_t *idx = j->cindices + p * L;                                            \
      for (int64_t l = 0; l < L; l++) d[idx[l]] += go[l];                                  \
    }                                                                                      \
  }                                                                                        \
  /* the divisor and clipped window of avg_pool2d's output cell (oh, ow) */                \
  static T avg_window_##T(const ddp_pool2d_geom *g, int64_t oh, int64_t ow, int64_t *hs,   \
                          int64_t *he, int64_t *ws, int64_t *we) {                         \
    int64_t h0 = oh * g->sh - g->ph, w0 = ow * g->sw - g->pw;                              \
    int64_t h1 = h0 + g->kh, w1 = w0 + g->kw;                                              \
    if (h1 > g->h + g->ph) h1 = g->h + g->ph;                                              \
    if (w1 > g->w + g->pw) w1 = g->w + g->pw;                                              \
    int64_t padded = (h1 - h0) * (w1 - w0);                                                \
    *hs = h0 < 0 ? 0 : h0, *ws = w0 < 0 ? 0 : w0;                                          \
    *he = h1 > g->h ? g->h : h1, *we = w1 > g->w ? g->w : w1;                              \
    int64_t count = g->count_include_pad ? padded : (*he - *hs) * (*we - *ws);             \
    return count > 0 ? (T)1 / (T)count : 0;                                                \
  }                                                                                        \
  static void avg_fwd_##T(void *vctx, int64_t begin, int64_t end) {                        \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    for (int64_t p = begin; p < end; p++) {                                                \
      const T *in = (const T *)j->in + p * g->h * g->w;                                    \
      T *out = (T *)j->out + p * g->oh * g->ow;                                            \
      for (int64_t oh = 0; oh < g->oh; oh++)                                               \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          int64_t hs, he, ws, we;                                                          \
          T scale = avg_window_##T(g, oh, ow, &hs, &he, &ws, &we), s = 0;                  \
          for (int64_t ih = hs; ih < he; ih++)                                             \
            for (int64_t iw = ws; iw < we; iw++) s += in[ih * g->w + iw];                  \
          out[oh * g->ow + ow] = s * scale;                                                \
        }                                                                                  \
    }                                                                                      \
  }                                                                                        \
  static void avg_bwd_##T(void *vctx, int64_t begin, int64_t end) {                        \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    for (int64_t p = begin; p < end; p++) {                                                \
      T *d = (T *)j->d_in + p * g->h * g->w;                                               \
      const T *go = (const T *)j->grad_out + p * g->oh * g->ow;                            \
      for (int64_t oh = 0; oh < g->oh; oh++)                                               \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          int64_t hs, he, ws, we;                                                          \
          T v = go[oh * g->ow + ow] * avg_window_##T(g, oh, ow, &hs, &he, &ws, &we);       \
          for (int64_t ih = hs; ih < he; ih++)                                             \
            for (int64_t iw = ws; iw < we; iw++) d[ih * g->w + iw] += v;                   \
        }                                                                                  \
    }                                                                                      \
  }                                                                                        \
  static void adaptive_fwd_##T(void *vctx, int64_t begin, int64_t end) {                   \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    for (int64_t p = begin; p < end; p++) {                                                \
      const T *in = (const T *)j->in + p * g->h * g->w;                                    \
      T *out = (T *)j->out + p * g->oh * g->ow;                                            \
      for (int64_t oh = 0; oh < g->oh; oh++) {                                             \
        int64_t hs = start_index(oh, g->oh, g->h), he = end_index(oh, g->oh, g->h);        \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          int64_t ws = start_index(ow, g->ow, g->w), we = end_index(ow, g->ow, g->w);      \
          T s = 0;                                                                         \
          for (int64_t ih = hs; ih < he; ih++)                                             \
            for (int64_t iw = ws; iw < we; iw++) s += in[ih * g->w + iw];                  \
          out[oh * g->ow + ow] = s / (T)((he - hs) * (we - ws));                           \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
  }                                                                                        \
  static void adaptive_bwd_##T(void *vctx, int64_t begin, int64_t end) {                   \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    for (int64_t p = begin; p < end; p++) {                                                \
      T *d = (T *)j->d_in + p * g->h * g->w;                                               \
      const T *go = (const T *)j->grad_out + p * g->oh * g->ow;                            \
      for (int64_t oh = 0; oh < g->oh; oh++) {                                             \
        int64_t hs = start_index(oh, g->oh, g->h), he = end_index(oh, g->oh, g->h);        \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          int64_t ws = start_index(ow, g->ow, g->w), we = end_index(ow, g->ow, g->w);      \
          T v = go[oh * g->ow + ow] / (T)((he - hs) * (we - ws));                          \
          for (int64_t ih = hs; ih < he; ih++)                                             \
            for (int64_t iw = ws; iw < we; iw++) d[ih * g->w + iw] += v;                   \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
  }
POOL_KERNELS(float)
POOL_KERNELS(double)

#define DISPATCH(name, window)                                                             \
  ddp_parallel_for(g->planes, plane_grain(g, window),                                      \
                   dtype == DDP_F32 ? name##_float : name##_double, &j)

void ddp_cpu_max_pool2d_forward(int dtype, void *out, int64_t *indices, const void *in,
                                const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .out = out, .indices = indices, .in = in};
  DISPATCH(max_fwd, g->kh * g->kw);
}

void ddp_cpu_max_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                 const int64_t *indices, const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .d_in = d_in, .grad_out = grad_out, .cindices = indices};
  DISPATCH(max_bwd, 1);
}

void ddp_cpu_avg_pool2d_forward(int dtype, void *out, const void *in, const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .out = out, .in = in};
  DISPATCH(avg_fwd, g->kh * g->kw);
}

void ddp_cpu_avg_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                 const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .d_in = d_in, .grad_out = grad_out};
  DISPATCH(avg_bwd, g->kh * g->kw);
}

void ddp_cpu_adaptive_avg_pool2d_forward(int dtype, void *out, const void *in,
                                         const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .out = out, .in = in};
  DISPATCH(adaptive_fwd, (g->h / (g->oh ? g->oh : 1) + 1) * (g->w / (g->ow ? g->ow : 1) + 1));
}

void ddp_cpu_adaptive_avg_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                          const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .d_in = d_in, .grad_out = grad_out};
  DISPATCH(adaptive_bwd, (g->h / (g->oh ? g->oh : 1) + 1) * (g->w / (g->ow ? g->ow : 1) + 1));
}
