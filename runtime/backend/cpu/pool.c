/* runtime/backend/cpu/pool.c: max, average and adaptive average pooling over (P, H, W)
 * planes, forward and backward. Window formulas follow PyTorch's CPU kernels
 * (aten/src/ATen/native/cpu/{MaxPoolKernel,AvgPoolKernel,AdaptiveAvgPoolKernel}.cpp). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/pool.h"
#include "core/core.h"

/* PyTorch's adaptive window: [floor(i * in / out), ceil((i + 1) * in / out)). */
static int64_t start_index(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
static int64_t end_index(int64_t i, int64_t out, int64_t in) { return ((i + 1) * in + out - 1) / out; }

/* Kernel taps [*k0, *k1) of a window starting at `start` (step `dil`, `k` taps) that fall
 * inside [0, size). */
static void window_range(int64_t start, int64_t dil, int64_t k, int64_t size, int64_t *k0, int64_t *k1) {
  int64_t lo, hi;
  if (dil == 1) { /* no divisions in the common case */
    lo = start >= 0 ? 0 : -start;
    hi = size - start <= 0 ? 0 : size - start;
  } else {
    lo = start >= 0 ? 0 : (-start + dil - 1) / dil;
    hi = size - start <= 0 ? 0 : (size - start + dil - 1) / dil;
  }
  if (hi > k) hi = k;
  if (lo > hi) lo = hi;
  *k0 = lo, *k1 = hi;
}

typedef struct {
  const ddp_pool2d_geom *g;
  void *out, *d_in;
  const void *in, *grad_out;
  int64_t *indices;
  const int64_t *cindices;
  int relu; /* max forward: pool relu(in), indices encoded (Note [fused relu max pooling]) */
  uint8_t *taps;         /* fused relu 2x2 forward: the window's tap, or 4 (Note [relu pooling taps]) */
  const uint8_t *ctaps;  /* its backward */
} pool_job;

/* Planes per thread chunk: about 32K window elements of work. */
static int64_t plane_grain(const ddp_pool2d_geom *g, int64_t window) {
  int64_t work = g->oh * g->ow * (window > 0 ? window : 1);
  return work >= 32768 ? 1 : 32768 / (work + 1) + 1;
}

/* Note [fused relu max pooling]: relu_max_pool2d pools relu(x) (relu(v) = v < 0 ? +0 : v,
 * NaN and -0 kept) in one pass, with the taps compared exactly as max pooling of the relu's
 * output would, so values and winning taps are those of relu then max_pool2d bit for bit.
 * The backward of that pair gives a window's gradient to its tap when the tap's relu output
 * (= the window's maximum) is > 0 and 0 otherwise; the forward records this in the index:
 * a window whose maximum is not > 0 (0, -0 or NaN) stores -1 - tap, and the backward kernels
 * skip negative indices (the 2x2 one finds no tap at a negative offset), leaving the +0 the
 * cell gets in relu's backward. A cell shared by overlapping windows is the tap of windows
 * that all agree on its relu output, so the zero-then-add order of sums is kept too. */
/* Note [relu pooling taps]: in the case of the AVX2 2x2 kernels (f32, undilated 2x2 stride-2
 * windows) the fused forward stores one byte a window instead of an i64 index: the winning
 * tap 0..3 (row-major in the window), or 4 where the window's maximum is not > 0 and its
 * gradient is 0. An eighth of the index traffic, written in the forward and read in the
 * backward (3.2 MB -> 0.4 MB a step at the CNN's first pooling), and of the saved memory. */
#define RELU(v) ((v) < 0 ? 0 : (v))

#define POOL_KERNELS(T)                                                                    \
  /* 2x2 windows, stride 2, no padding or dilation (the usual CNN pooling): the four taps  \
   * unrolled, comparisons turned into selects */                                          \
  static void max_fwd_2x2_##T(void *vctx, int64_t begin, int64_t end) {                    \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    int64_t W = g->w;                                                                      \
    for (int64_t p = begin; p < end; p++) {                                                \
      const T *in = (const T *)j->in + p * g->h * W;                                       \
      T *out = (T *)j->out + p * g->oh * g->ow;                                            \
      int64_t *idx = j->indices + p * g->oh * g->ow;                                       \
      for (int64_t oh = 0; oh < g->oh; oh++) {                                             \
        const T *r0 = in + 2 * oh * W, *r1 = r0 + W;                                       \
        T *o = out + oh * g->ow;                                                           \
        int64_t *io = idx + oh * g->ow;                                                    \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];        \
          if (j->relu) a = RELU(a), b = RELU(b), c = RELU(c), d = RELU(d);                 \
          int64_t at = 2 * oh * W + 2 * ow, bi = at;                                       \
          T best = a;                                                                      \
          int take = (b > best) | (b != b);                                                \
          best = take ? b : best, bi = take ? at + 1 : bi;                                 \
          take = (c > best) | (c != c);                                                    \
          best = take ? c : best, bi = take ? at + W : bi;                                 \
          take = (d > best) | (d != d);                                                    \
          best = take ? d : best, bi = take ? at + W + 1 : bi;                             \
          o[ow] = best;                                                                    \
          io[ow] = j->relu && !(best > 0) ? -1 - bi : bi;                                  \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
  }                                                                                        \
  static void max_fwd_##T(void *vctx, int64_t begin, int64_t end) {                        \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    for (int64_t p = begin; p < end; p++) {                                                \
      const T *in = (const T *)j->in + p * g->h * g->w;                                    \
      T *out = (T *)j->out + p * g->oh * g->ow;                                            \
      int64_t *idx = j->indices + p * g->oh * g->ow;                                       \
      for (int64_t oh = 0; oh < g->oh; oh++) {                                             \
        int64_t h0 = oh * g->sh - g->ph, ki0, ki1;                                         \
        window_range(h0, g->dh, g->kh, g->h, &ki0, &ki1);                                  \
        for (int64_t ow = 0; ow < g->ow; ow++) {                                           \
          int64_t w0 = ow * g->sw - g->pw, kj0, kj1;                                       \
          window_range(w0, g->dw, g->kw, g->w, &kj0, &kj1);                                \
          int64_t first = (h0 + ki0 * g->dh) * g->w + w0 + kj0 * g->dw;                    \
          T best = ki0 < ki1 && kj0 < kj1 ? in[first] : -INFINITY;                         \
          if (j->relu) best = RELU(best);                                                  \
          int64_t best_i = ki0 < ki1 && kj0 < kj1 ? first : 0;                             \
          for (int64_t ki = ki0; ki < ki1; ki++) {                                         \
            const T *row = in + (h0 + ki * g->dh) * g->w;                                  \
            for (int64_t kj = kj0; kj < kj1; kj++) {                                       \
              int64_t iw = w0 + kj * g->dw;                                                \
              T v = j->relu ? RELU(row[iw]) : row[iw];                                     \
              /* branch-free (random data mispredicts a branch half the time); NaN wins and \
               * stays, as in PyTorch */                                                   \
              int take = (v > best) | (v != v);                                            \
              best = take ? v : best;                                                      \
              best_i = take ? (h0 + ki * g->dh) * g->w + iw : best_i;                      \
            }                                                                              \
          }                                                                                \
          out[oh * g->ow + ow] = best;                                                     \
          idx[oh * g->ow + ow] = j->relu && !(best > 0) ? -1 - best_i : best_i;            \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
  }                                                                                        \
  /* each plane zeroed right before its scatter, while it is in cache (faster here than    \
   * writing each cell of a 2x2 block once with selects, and than one zeros() up front) */ \
  static void max_bwd_##T(void *vctx, int64_t begin, int64_t end) {                        \
    const pool_job *j = vctx;                                                              \
    const ddp_pool2d_geom *g = j->g;                                                       \
    int64_t L = g->oh * g->ow;                                                             \
    for (int64_t p = begin; p < end; p++) {                                                \
      T *d = (T *)j->d_in + p * g->h * g->w;                                               \
      const T *go = (const T *)j->grad_out + p * L;                                        \
      const int64_t *idx = j->cindices + p * L;                                            \
      memset(d, 0, sizeof(T) * (size_t)(g->h * g->w));                                     \
      for (int64_t l = 0; l < L; l++)                                                      \
        if (idx[l] >= 0) d[idx[l]] += go[l]; /* < 0: a fused relu's zero (see the Note) */ \
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
      memset(d, 0, sizeof(T) * (size_t)(g->h * g->w));                                     \
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
      memset(d, 0, sizeof(T) * (size_t)(g->h * g->w));                                     \
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

/* Lane masks for the last, partial vector of a row: the first n of 8 lanes (n in 0..8). */
static inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* max_fwd_2x2 for f32 with AVX2, eight windows at a time: even and odd columns split by
 * shuffles, the running maximum and the winning tap (0..3) kept by compare-and-blend (a
 * NaN tap wins, as in the scalar code). The tap turns into the flat index at the end, or,
 * for the fused relu (taps of relu(in)), is stored as a byte (Note [relu pooling taps]). The
 * last windows of a row (OW % 8 of them; all of them when OW < 8, e.g. 7 at 14x14) go
 * through the same code with masked loads and stores, so no window takes a scalar path. */
static void max_fwd_2x2_avx(void *vctx, int64_t begin, int64_t end) {
  const pool_job *j = vctx;
  const ddp_pool2d_geom *g = j->g;
  int64_t W = g->w, OW = g->ow;
  const __m256i lanes2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i one = _mm256_set1_epi32(1), wv = _mm256_set1_epi32((int)W);
  for (int64_t p = begin; p < end; p++) {
    const float *in = (const float *)j->in + p * g->h * W;
    float *out = (float *)j->out + p * g->oh * OW;
    int64_t *idx = j->indices + p * g->oh * OW;
    for (int64_t oh = 0; oh < g->oh; oh++) {
      const float *r0 = in + 2 * oh * W, *r1 = r0 + W;
      for (int64_t ow = 0; ow < OW; ow += 8) {
        int64_t n = OW - ow < 8 ? OW - ow : 8; /* windows in this vector */
        __m256 x0, x1, y0, y1;
        __m256i m0 = first_lanes(2 * n), m1 = first_lanes(2 * n - 8), m = first_lanes(n);
        if (n == 8) {
          x0 = _mm256_loadu_ps(r0 + 2 * ow), x1 = _mm256_loadu_ps(r0 + 2 * ow + 8);
          y0 = _mm256_loadu_ps(r1 + 2 * ow), y1 = _mm256_loadu_ps(r1 + 2 * ow + 8);
        } else { /* the masked-off lanes are neither read nor written */
          x0 = _mm256_maskload_ps(r0 + 2 * ow, m0), x1 = _mm256_maskload_ps(r0 + 2 * ow + 8, m1);
          y0 = _mm256_maskload_ps(r1 + 2 * ow, m0), y1 = _mm256_maskload_ps(r1 + 2 * ow + 8, m1);
        }
#define DEINTERLEAVE(u, v, sel)                                                         \
  _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(u, v, sel)), \
                                         _MM_SHUFFLE(3, 1, 2, 0)))
        __m256 a = DEINTERLEAVE(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 b = DEINTERLEAVE(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
        __m256 c = DEINTERLEAVE(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 d = DEINTERLEAVE(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
#undef DEINTERLEAVE
        if (j->relu) { /* v < 0 ? +0 : v (NaN and -0 kept) */
          a = _mm256_and_ps(a, _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NLT_UQ));
          b = _mm256_and_ps(b, _mm256_cmp_ps(b, _mm256_setzero_ps(), _CMP_NLT_UQ));
          c = _mm256_and_ps(c, _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_NLT_UQ));
          d = _mm256_and_ps(d, _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NLT_UQ));
        }
        __m256 best = a, tap = _mm256_setzero_ps();
        __m256 t_ = _mm256_or_ps(_mm256_cmp_ps(b, best, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, b, t_), tap = _mm256_blendv_ps(tap, _mm256_set1_ps(1), t_);
        t_ = _mm256_or_ps(_mm256_cmp_ps(c, best, _CMP_GT_OQ), _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, c, t_), tap = _mm256_blendv_ps(tap, _mm256_set1_ps(2), t_);
        t_ = _mm256_or_ps(_mm256_cmp_ps(d, best, _CMP_GT_OQ), _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, d, t_), tap = _mm256_blendv_ps(tap, _mm256_set1_ps(3), t_);
        __m256i t = _mm256_cvtps_epi32(tap);
        __m256i off = _mm256_add_epi32(_mm256_and_si256(t, one),
                                       _mm256_mullo_epi32(_mm256_srli_epi32(t, 1), wv));
        __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int)(2 * oh * W + 2 * ow)),
                                      _mm256_add_epi32(lanes2, off));
        if (j->relu) { /* the tap, or 4 where the maximum is not > 0, one byte a window */
          __m256i pos = _mm256_castps_si256(_mm256_cmp_ps(best, _mm256_setzero_ps(), _CMP_GT_OQ));
          __m256i code = _mm256_blendv_epi8(_mm256_set1_epi32(4), t, pos);
          __m256i w16 = _mm256_packs_epi32(code, code);   /* t0..t3 t0..t3 | t4..t7 t4..t7 */
          __m256i w8 = _mm256_packus_epi16(w16, w16);     /* bytes t0..t3 (x4) | t4..t7 (x4) */
          __m128i b8 = _mm256_castsi256_si128(
              _mm256_permutevar8x32_epi32(w8, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)));
          uint8_t *tp = j->taps + p * g->oh * OW + oh * OW + ow;
          if (n == 8) {
            _mm_storel_epi64((__m128i *)tp, b8);
          } else { /* byte by byte from a register (no round trip through the stack) */
            uint64_t v = (uint64_t)_mm_cvtsi128_si64(b8);
            for (int64_t i = 0; i < n; i++) tp[i] = (uint8_t)(v >> (8 * i));
          }
          if (n == 8) _mm256_storeu_ps(out + oh * OW + ow, best);
          else _mm256_maskstore_ps(out + oh * OW + ow, m, best);
          continue;
        }
        __m256i at_lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(at));
        __m256i at_hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(at, 1));
        int64_t *io = idx + oh * OW + ow;
        if (n == 8) {
          _mm256_storeu_ps(out + oh * OW + ow, best);
          _mm256_storeu_si256((__m256i *)io, at_lo);
          _mm256_storeu_si256((__m256i *)(io + 4), at_hi);
        } else {
          _mm256_maskstore_ps(out + oh * OW + ow, m, best);
          _mm256_maskstore_epi64((long long *)io, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m)), at_lo);
          _mm256_maskstore_epi64((long long *)(io + 4),
                                 _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1)), at_hi);
        }
      }
    }
  }
}

/* max_bwd for f32 when the windows are 2x2 with stride 2 and no padding (each input cell
 * in at most one window), in one pass that writes every cell of d_in once: eight windows
 * at a time, each window's gradient placed on the tap its index names and +0 on the three
 * others (0 + g, so a -0 gradient lands as +0 exactly as in max_bwd's zero-then-add), the
 * taps interleaved back into the two input rows; the cells of an odd last row or column,
 * which no window covers, get +0. Bit for bit the result of max_bwd_float. The tap comes
 * from the i64 index (j->cindices; a negative one, from the fused relu, names no tap) or
 * from the fused relu's byte (j->ctaps; 4 names none). */
static void max_bwd_2x2_avx(void *vctx, int64_t begin, int64_t end) {
  const pool_job *j = vctx;
  const ddp_pool2d_geom *g = j->g;
  int64_t W = g->w, H = g->h, OW = g->ow, OH = g->oh, L = OH * OW;
  const __m256i lanes2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i low32 = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i wv = _mm256_set1_epi32((int)W), w1v = _mm256_set1_epi32((int)W + 1);
  const __m256i onev = _mm256_set1_epi32(1);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t p = begin; p < end; p++) {
    float *d = (float *)j->d_in + p * H * W;
    const float *go = (const float *)j->grad_out + p * L;
    const int64_t *idx = j->ctaps ? NULL : j->cindices + p * L;
    for (int64_t oh = 0; oh < OH; oh++) {
      float *r0 = d + 2 * oh * W, *r1 = r0 + W;
      for (int64_t ow = 0; ow < OW; ow += 8) {
        int64_t n = OW - ow < 8 ? OW - ow : 8;
        __m256i m = first_lanes(n), m0 = first_lanes(2 * n), m1 = first_lanes(2 * n - 8);
        __m256 gv = n == 8 ? _mm256_loadu_ps(go + oh * OW + ow) : _mm256_maskload_ps(go + oh * OW + ow, m);
        __m256i i_lo = _mm256_setzero_si256(), i_hi = _mm256_setzero_si256();
        if (!j->ctaps) {
          const int64_t *io = idx + oh * OW + ow;
          if (n == 8) {
            i_lo = _mm256_loadu_si256((const __m256i *)io);
            i_hi = _mm256_loadu_si256((const __m256i *)(io + 4));
          } else {
            i_lo = _mm256_maskload_epi64((const long long *)io, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m)));
            i_hi = _mm256_maskload_epi64((const long long *)(io + 4),
                                         _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1)));
          }
        }
        __m256i rel;
        if (j->ctaps) { /* tap 0..3 (4: none) -> the offsets 0, 1, W, W + 1 (none: -1) */
          const uint8_t *tp = j->ctaps + p * L + oh * OW + ow;
          /* the n bytes gathered in a register: a load of 8 from bytes just stored on the
           * stack would stall on store forwarding (every vector of a 7-window row is a tail) */
          uint64_t v = 0;
          if (n == 8) memcpy(&v, tp, 8);
          else
            for (int64_t i = 0; i < n; i++) v |= (uint64_t)tp[i] << (8 * i);
          __m256i t = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v));
          rel = _mm256_add_epi32(_mm256_and_si256(t, onev), _mm256_mullo_epi32(_mm256_srli_epi32(t, 1), wv));
          rel = _mm256_blendv_epi8(rel, _mm256_set1_epi32(-1), _mm256_cmpeq_epi32(t, _mm256_set1_epi32(4)));
        } else {
          /* the low 32 bits of the eight indices, in lane order (they fit: H * W < 2^31) */
          __m256i i32 = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(i_lo, low32),
                                                  _mm256_permutevar8x32_epi32(i_hi, low32), 0x20);
          rel = _mm256_sub_epi32(i32, _mm256_add_epi32(_mm256_set1_epi32((int)(2 * oh * W + 2 * ow)), lanes2));
        }
        __m256 a = _mm256_add_ps(zero, _mm256_and_ps(gv, _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, _mm256_setzero_si256()))));
        __m256 b = _mm256_add_ps(zero, _mm256_and_ps(gv, _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, onev))));
        __m256 c = _mm256_add_ps(zero, _mm256_and_ps(gv, _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, wv))));
        __m256 e = _mm256_add_ps(zero, _mm256_and_ps(gv, _mm256_castsi256_ps(_mm256_cmpeq_epi32(rel, w1v))));
        /* (a0 b0 a1 b1 | a4 b4 a5 b5), (a2 b2 a3 b3 | a6 b6 a7 b7) -> the 16 cells of a row */
        __m256 ab_lo = _mm256_unpacklo_ps(a, b), ab_hi = _mm256_unpackhi_ps(a, b);
        __m256 ce_lo = _mm256_unpacklo_ps(c, e), ce_hi = _mm256_unpackhi_ps(c, e);
        __m256 top0 = _mm256_permute2f128_ps(ab_lo, ab_hi, 0x20), top1 = _mm256_permute2f128_ps(ab_lo, ab_hi, 0x31);
        __m256 bot0 = _mm256_permute2f128_ps(ce_lo, ce_hi, 0x20), bot1 = _mm256_permute2f128_ps(ce_lo, ce_hi, 0x31);
        if (n == 8) {
          _mm256_storeu_ps(r0 + 2 * ow, top0), _mm256_storeu_ps(r0 + 2 * ow + 8, top1);
          _mm256_storeu_ps(r1 + 2 * ow, bot0), _mm256_storeu_ps(r1 + 2 * ow + 8, bot1);
        } else {
          _mm256_maskstore_ps(r0 + 2 * ow, m0, top0), _mm256_maskstore_ps(r0 + 2 * ow + 8, m1, top1);
          _mm256_maskstore_ps(r1 + 2 * ow, m0, bot0), _mm256_maskstore_ps(r1 + 2 * ow + 8, m1, bot1);
        }
      }
      for (int64_t x = 2 * OW; x < W; x++) r0[x] = 0, r1[x] = 0; /* an odd last column */
    }
    if (2 * OH < H) memset(d + 2 * OH * W, 0, sizeof(float) * (size_t)((H - 2 * OH) * W));
  }
}

/* 2x2 windows, stride 2, no padding, every window inside the input (no ceil_mode window
 * hanging over the edge): the windows tile the input without overlap. */
static int tiles_2x2(const ddp_pool2d_geom *g) {
  return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 &&
         g->oh * 2 <= g->h && g->ow * 2 <= g->w;
}

#define DISPATCH(name, window)                                                             \
  ddp_parallel_for(g->planes, plane_grain(g, window),                                      \
                   dtype == DDP_F32 ? name##_float : name##_double, &j)

/* The AVX2 2x2 kernels' case: f32, undilated 2x2 stride-2 windows, indices in 32 bits. */
static int avx_2x2(int dtype, const ddp_pool2d_geom *g) {
  return dtype == DDP_F32 && tiles_2x2(g) && g->dh == 1 && g->dw == 1 && g->h * g->w < INT32_MAX;
}

static void max_forward(int dtype, void *out, void *indices, const void *in,
                        const ddp_pool2d_geom *g, int relu) {
  pool_job j = {.g = g, .out = out, .in = in, .relu = relu};
  if (relu && avx_2x2(dtype, g)) j.taps = indices;
  else j.indices = indices;
  if (tiles_2x2(g) && g->dh == 1 && g->dw == 1) {
    if (avx_2x2(dtype, g))
      ddp_parallel_for(g->planes, plane_grain(g, 4), max_fwd_2x2_avx, &j);
    else
      DISPATCH(max_fwd_2x2, 4);
    return;
  }
  DISPATCH(max_fwd, g->kh * g->kw);
}

void ddp_cpu_max_pool2d_forward(int dtype, void *out, int64_t *indices, const void *in,
                                const ddp_pool2d_geom *g) {
  max_forward(dtype, out, indices, in, g, 0);
}

void ddp_cpu_max_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                 const int64_t *indices, const ddp_pool2d_geom *g) {
  pool_job j = {.g = g, .d_in = d_in, .grad_out = grad_out, .cindices = indices};
  if (avx_2x2(dtype, g)) {
    ddp_parallel_for(g->planes, plane_grain(g, 4), max_bwd_2x2_avx, &j);
    return;
  }
  DISPATCH(max_bwd, 1);
}

int ddp_cpu_relu_max_pool2d_taps(int dtype, const ddp_pool2d_geom *g) { return avx_2x2(dtype, g); }

void ddp_cpu_relu_max_pool2d_forward(int dtype, void *out, void *indices, const void *in,
                                     const ddp_pool2d_geom *g) {
  max_forward(dtype, out, indices, in, g, 1);
}

void ddp_cpu_relu_max_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                      const void *indices, const ddp_pool2d_geom *g) {
  if (!avx_2x2(dtype, g)) { /* i64 indices, -1 - tap where the gradient is 0 */
    ddp_cpu_max_pool2d_backward(dtype, d_in, grad_out, indices, g);
    return;
  }
  pool_job j = {.g = g, .d_in = d_in, .grad_out = grad_out, .ctaps = indices};
  ddp_parallel_for(g->planes, plane_grain(g, 4), max_bwd_2x2_avx, &j);
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
