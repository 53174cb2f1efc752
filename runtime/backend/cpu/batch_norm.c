/* runtime/backend/cpu/batch_norm.c: the passes of batch norm over the data on the CPU
 * (moments, sums, apply, backward reduce, backward elemt) and their fused ReLU (+ residual
 * add) forms; see norm.h for the shapes. The small per-channel steps (finalize, coef,
 * running update) stay in norm.c.
 *
 * f32 is vectorised with AVX2/FMA (8 floats per step); f64 keeps plain loops (it is the
 * reference of the specs' finite-difference checks, not a training dtype here).
 * Reductions split the channels over the thread pool (each channel is summed by one thread
 * in a fixed order, so the result does not depend on the thread count); element-wise
 * passes split the batch rows.
 *
 * Note [batch norm f32 accumulation]: every f32 reduction accumulates in double. Each f32
 * value is converted exactly to double (_mm256_cvtps_pd) and added into four (or two pairs
 * of) __m256d accumulators, i.e. 16 interleaved partial sums per channel that are folded
 * in a fixed order at the end; the scalar tail of a slice (S mod 16 or S mod 8) goes to one
 * more double. The error bound of plain recursive double summation (n u64 sum|x|, u64 =
 * 2^-53) therefore still holds (the partial sums only shorten the chains); only the order
 * of the additions changed from the scalar loop. Products (x - mean)^2 and dy (x - mean) are
 * formed in double (FMA) from the exact conversions, one rounding fewer than the old scalar
 * loop, which rounded dy (x - mean) to f32 first.
 *
 * Note [batch norm moments by slices]: for large slices (S >= CHAN_MIN_S) the mean and
 * variance take one pass over memory instead of two: each (n, c) slice of S contiguous
 * values (at most a few KiB, in L1) gets its own two-pass mean and sum of squared
 * deviations, and the slices of a channel are merged in order n = 0, 1, ... with the
 * pairwise update of Chan, Golub and LeVeque ("Algorithms for computing the sample
 * variance", 1983): delta = mean_b - mean_a, mean += delta n_b / n, M2 = M2_a + M2_b +
 * delta^2 n_a n_b / n. M2 is a sum of nonnegative terms, so the merge has no cancellation:
 * the relative error of the variance is O((S + 3N) u64) (plus the error of delta, O(S u64)
 * times the slice means), about 1e-12 at S = 1024, N = 128, far below the f32 rounding the
 * statistics get at the end. Small slices use the two global passes (mean, then squared
 * deviations around it), as before. The textbook one-pass sum and sum of squares is not
 * used for the moments: its cancellation (sumsq / M - mean^2) loses digits when |mean| >>
 * std. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/norm.h"
#include "core/core.h"

enum { ELEMENT_GRAIN = 1 << 15 }; /* ~32K elements per thread chunk */
enum { CHAN_MIN_S = 256 };        /* slices at least this long: moments by slices */

/* Chunk size (in slices of `per_slice` elements each) giving about ELEMENT_GRAIN elements. */
static int64_t grain_for(int64_t per_slice) {
  if (per_slice <= 0) return ELEMENT_GRAIN;
  int64_t g = ELEMENT_GRAIN / per_slice;
  return g < 1 ? 1 : g;
}

/* Context of every pass: buffers as void pointers, cast by the typed range function. */
typedef struct {
  void *out0, *out1; /* y; dx, dresidual; or the two f64 per-channel sums */
  const void *x, *dy, *y, *res, *mean, *a, *b, *d, *scale, *shift;
  uint8_t *mask_out;    /* forward: the ReLU's bit mask, or NULL */
  const uint8_t *mask;  /* backward: the same, or NULL */
  int64_t N, C, S;
  int relu; /* backward: RELU_NONE, RELU_FROM_Y, RELU_FROM_X, RELU_FROM_BITS (forward: 0/1) */
} bn_pass;

/* Where the backward passes take the ReLU's mask from (Note [fused batch norm relu mask]). */
enum { RELU_NONE, RELU_FROM_Y, RELU_FROM_X, RELU_FROM_BITS };


#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The 8 lanes of bit mask byte `bits` (lane j set when bit j is) as a float mask. */
ALWAYS_INLINE __m256 lanes_of(uint8_t bits) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  __m256i v = _mm256_and_si256(_mm256_set1_epi32(bits), lane_bit);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, lane_bit));
}

/* Bit i of the bit mask (element i of the tensor). */
static inline int bit_of(const uint8_t *mask, int64_t i) { return (mask[i >> 3] >> (i & 7)) & 1; }

/* ---- f32 helpers ------------------------------------------------------------------------ */

/* The 4 doubles of v summed in a fixed order: (v0 + v2) + (v1 + v3). */
ALWAYS_INLINE double hsum_pd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* Four accumulators folded in a fixed order. */
ALWAYS_INLINE double fold4(__m256d a0, __m256d a1, __m256d a2, __m256d a3) {
  return hsum_pd(_mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
}

/* 4 floats at p, converted exactly to double. */
ALWAYS_INLINE __m256d load4_pd(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }

/* sum of p[0, S) in double (Note [batch norm f32 accumulation]). */
static double slice_sum_f32(const float *p, int64_t S) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t s = 0;
  for (; s + 16 <= S; s += 16) {
    a0 = _mm256_add_pd(a0, load4_pd(p + s));
    a1 = _mm256_add_pd(a1, load4_pd(p + s + 4));
    a2 = _mm256_add_pd(a2, load4_pd(p + s + 8));
    a3 = _mm256_add_pd(a3, load4_pd(p + s + 12));
  }
  double t = 0;
  for (; s < S; s++) t += p[s];
  return fold4(a0, a1, a2, a3) + t;
}

/* sum of (p[s] - m)^2 over [0, S) in double. */
static double slice_sqdev_f32(const float *p, int64_t S, double m) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, vm = _mm256_set1_pd(m);
  int64_t s = 0;
  for (; s + 16 <= S; s += 16) {
    __m256d t0 = _mm256_sub_pd(load4_pd(p + s), vm), t1 = _mm256_sub_pd(load4_pd(p + s + 4), vm);
    __m256d t2 = _mm256_sub_pd(load4_pd(p + s + 8), vm);
    __m256d t3 = _mm256_sub_pd(load4_pd(p + s + 12), vm);
    a0 = _mm256_fmadd_pd(t0, t0, a0);
    a1 = _mm256_fmadd_pd(t1, t1, a1);
    a2 = _mm256_fmadd_pd(t2, t2, a2);
    a3 = _mm256_fmadd_pd(t3, t3, a3);
  }
  double t = 0;
  for (; s < S; s++) {
    double v = (double)p[s] - m;
    t = fma(v, v, t);
  }
  return fold4(a0, a1, a2, a3) + t;
}

/* ---- f32 reductions (channels [c0, c1)) -------------------------------------------------- */

static void bn_moments_range_f32(void *vctx, int64_t c0, int64_t c1) {
  const bn_pass *k = vctx;
  double *mean = k->out0, *var = k->out1;
  const float *x = k->x;
  int64_t N = k->N, C = k->C, S = k->S;
  double M = (double)N * (double)S;
  for (int64_t c = c0; c < c1; c++) {
    if (S >= CHAN_MIN_S) { /* Note [batch norm moments by slices] */
      double cnt = 0, m = 0, m2 = 0, Sd = (double)S;
      for (int64_t n = 0; n < N; n++) {
        const float *p = x + (n * C + c) * S;
        double sm = slice_sum_f32(p, S) / Sd, q = slice_sqdev_f32(p, S, sm);
        if (n == 0) {
          m = sm;
          m2 = q;
        } else {
          double delta = sm - m, tot = cnt + Sd;
          m += delta * (Sd / tot);
          m2 += q + delta * delta * (cnt * Sd / tot);
        }
        cnt += Sd;
      }
      mean[c] = m;
      var[c] = m2 / M;
    } else { /* two passes over the channel */
      double acc = 0;
      for (int64_t n = 0; n < N; n++) acc += slice_sum_f32(x + (n * C + c) * S, S);
      double m = acc / M, sq = 0;
      for (int64_t n = 0; n < N; n++) sq += slice_sqdev_f32(x + (n * C + c) * S, S, m);
      mean[c] = m;
      var[c] = sq / M;
    }
  }
}

static void bn_sums_range_f32(void *vctx, int64_t c0, int64_t c1) {
  const bn_pass *k = vctx;
  double *sum = k->out0, *sumsq = k->out1;
  const float *x = k->x;
  int64_t N = k->N, C = k->C, S = k->S;
  for (int64_t c = c0; c < c1; c++) {
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    double t1 = 0, t2 = 0;
    for (int64_t n = 0; n < N; n++) {
      const float *p = x + (n * C + c) * S;
      int64_t s = 0;
      for (; s + 8 <= S; s += 8) {
        __m256d lo = load4_pd(p + s), hi = load4_pd(p + s + 4);
        s0 = _mm256_add_pd(s0, lo);
        s1 = _mm256_add_pd(s1, hi);
        q0 = _mm256_fmadd_pd(lo, lo, q0);
        q1 = _mm256_fmadd_pd(hi, hi, q1);
      }
      for (; s < S; s++) {
        double v = p[s];
        t1 += v;
        t2 = fma(v, v, t2);
      }
    }
    sum[c] = hsum_pd(_mm256_add_pd(s0, s1)) + t1;
    sumsq[c] = hsum_pd(_mm256_add_pd(q0, q1)) + t2;
  }
}

/* Note [fused batch norm relu mask]: the backward of relu(v) needs the mask y > 0, with
 * y = relu(v) the fused op's output. Without a residual, v = (x - mean) * scale + shift is
 * the same single FMA the forward rounded, so the mask is recomputed from x (already read
 * for the reduction) as v > 0 instead of reading y: one stream less. y > 0 exactly when
 * v > 0 (relu keeps v when v is not < 0; -0, +0 and NaN give y not > 0 as they give v not
 * > 0). With a residual, v also needs the residual: the f32 forward then writes the mask as
 * bits (one byte per 8 elements, 1/32 of y; bit j of byte i is y[8 i + j] > 0, from
 * _mm256_movemask_ps, when S is a multiple of 8 so that no byte spans two rows), and the
 * backward reads those bits instead of y; otherwise it reads y. */

/* sum_dy[c] = sum g, sum_dy_xmu[c] = sum g (x - mean[c]) with g = dy, or (relu) g = dy where
 * the ReLU's output is > 0 else 0 (Note [fused batch norm relu mask]). Written once so that
 * the fused and the plain reduction are the same arithmetic. */
ALWAYS_INLINE void bn_backward_reduce_f32_body(const bn_pass *k, int64_t c0, int64_t c1, int relu) {
  double *sum_dy = k->out0, *sum_dy_xmu = k->out1;
  const float *x = k->x, *dy = k->dy, *y = k->y, *mean = k->mean;
  const float *scale = k->scale, *shift = k->shift;
  int64_t N = k->N, C = k->C, S = k->S;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t c = c0; c < c1; c++) {
    double m = mean[c], t1 = 0, t2 = 0;
    float mf = mean[c], sc = relu == RELU_FROM_X ? scale[c] : 0, sh = relu == RELU_FROM_X ? shift[c] : 0;
    __m256 vmf = _mm256_set1_ps(mf), vsc = _mm256_set1_ps(sc), vsh = _mm256_set1_ps(sh);
    __m256d vm = _mm256_set1_pd(m), s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    for (int64_t n = 0; n < N; n++) {
      int64_t base = (n * C + c) * S, s = 0;
      const float *px = x + base, *pg = dy + base, *py = relu == RELU_FROM_Y ? y + base : NULL;
      for (; s + 8 <= S; s += 8) {
        __m256 g = _mm256_loadu_ps(pg + s), xv = _mm256_loadu_ps(px + s);
        if (relu == RELU_FROM_BITS)
          g = _mm256_and_ps(lanes_of(k->mask[(base + s) >> 3]), g);
        else if (relu == RELU_FROM_Y)
          g = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(py + s), zero, _CMP_GT_OQ), g);
        else if (relu == RELU_FROM_X)
          g = _mm256_and_ps(_mm256_cmp_ps(_mm256_fmadd_ps(_mm256_sub_ps(xv, vmf), vsc, vsh), zero,
                                          _CMP_GT_OQ), g);
        __m256d glo = _mm256_cvtps_pd(_mm256_castps256_ps128(g));
        __m256d ghi = _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1));
        __m256d xlo = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(xv)), vm);
        __m256d xhi = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1)), vm);
        s0 = _mm256_add_pd(s0, glo);
        s1 = _mm256_add_pd(s1, ghi);
        q0 = _mm256_fmadd_pd(glo, xlo, q0);
        q1 = _mm256_fmadd_pd(ghi, xhi, q1);
      }
      for (; s < S; s++) {
        int off = relu == RELU_FROM_BITS ? !bit_of(k->mask, base + s)
                  : relu == RELU_FROM_Y  ? !(py[s] > 0)
                  : relu == RELU_FROM_X  ? !(fmaf(px[s] - mf, sc, sh) > 0)
                                         : 0;
        double g = off ? 0.0 : (double)pg[s];
        t1 += g;
        t2 = fma(g, (double)px[s] - m, t2);
      }
    }
    sum_dy[c] = hsum_pd(_mm256_add_pd(s0, s1)) + t1;
    sum_dy_xmu[c] = hsum_pd(_mm256_add_pd(q0, q1)) + t2;
  }
}
static void bn_backward_reduce_range_f32(void *vctx, int64_t c0, int64_t c1) {
  bn_backward_reduce_f32_body(vctx, c0, c1, 0);
}
static void bn_backward_reduce_relu_y_range_f32(void *vctx, int64_t c0, int64_t c1) {
  bn_backward_reduce_f32_body(vctx, c0, c1, RELU_FROM_Y);
}
static void bn_backward_reduce_relu_x_range_f32(void *vctx, int64_t c0, int64_t c1) {
  bn_backward_reduce_f32_body(vctx, c0, c1, RELU_FROM_X);
}
static void bn_backward_reduce_relu_bits_range_f32(void *vctx, int64_t c0, int64_t c1) {
  bn_backward_reduce_f32_body(vctx, c0, c1, RELU_FROM_BITS);
}

/* ---- f32 element-wise passes (batch rows [n0, n1)) ----------------------------------------- */

/* y = (x - mean[c]) * scale[c] + shift[c] (one FMA), then + residual (when given), then
 * ReLU (x < 0 ? 0 : x, NaN kept, as the relu op) when relu: each step rounds to f32 as the
 * separate ops would (Note [fused batch norm relu]). */
ALWAYS_INLINE void bn_apply_f32_body(const bn_pass *k, int64_t n0, int64_t n1, int relu,
                                     int has_res) {
  float *restrict y = k->out0;
  const float *restrict x = k->x, *restrict r = k->res;
  const float *mean = k->mean, *scale = k->a, *shift = k->b;
  uint8_t *bits = relu ? k->mask_out : NULL; /* S % 8 == 0: no tail below */
  int64_t C = k->C, S = k->S;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t n = n0; n < n1; n++)
    for (int64_t c = 0; c < C; c++) {
      int64_t base = (n * C + c) * S, s = 0;
      float m = mean[c], sc = scale[c], sh = shift[c];
      __m256 vm = _mm256_set1_ps(m), vsc = _mm256_set1_ps(sc), vsh = _mm256_set1_ps(sh);
      for (; s + 8 <= S; s += 8) {
        __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_loadu_ps(x + base + s), vm), vsc, vsh);
        if (has_res) v = _mm256_add_ps(v, _mm256_loadu_ps(r + base + s));
        if (relu) v = _mm256_andnot_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ), v);
        if (bits) bits[(base + s) >> 3] = (uint8_t)_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ));
        _mm256_storeu_ps(y + base + s, v);
      }
      for (; s < S; s++) {
        float v = fmaf(x[base + s] - m, sc, sh);
        if (has_res) v = v + r[base + s];
        if (relu) v = v < 0 ? 0.0f : v;
        y[base + s] = v;
      }
    }
}
static void bn_apply_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_apply_f32_body(vctx, n0, n1, 0, 0);
}
static void bn_apply_relu_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_apply_f32_body(vctx, n0, n1, 1, 0);
}
static void bn_apply_add_relu_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_apply_f32_body(vctx, n0, n1, 1, 1);
}

/* g = dy, or (relu) dy where the ReLU's output is > 0 else +0 (Note [fused batch norm relu
 * mask]); dresidual = g (when wanted);
 * dx += a[c] g + (b[c] (x - mean[c]) + d[c]) (when wanted), as two FMAs. The fused form
 * (relu) writes dx = 0 + v instead: bitwise what accumulating into a zero-filled dx gives
 * (a -0 becomes +0), without the fill and the read. */
ALWAYS_INLINE void bn_backward_elemt_f32_body(const bn_pass *k, int64_t n0, int64_t n1, int relu) {
  float *restrict dx = k->out0, *restrict dr = k->out1;
  const float *restrict x = k->x, *restrict dy = k->dy, *restrict y = k->y;
  const float *mean = k->mean, *a = k->a, *b = k->b, *d = k->d, *scale = k->scale,
              *shift = k->shift;
  int64_t C = k->C, S = k->S;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t n = n0; n < n1; n++)
    for (int64_t c = 0; c < C; c++) {
      int64_t base = (n * C + c) * S, s = 0;
      float m = mean[c], ac = a[c], bc = b[c], dc = d[c];
      float sc = relu == RELU_FROM_X ? scale[c] : 0, sh = relu == RELU_FROM_X ? shift[c] : 0;
      __m256 vm = _mm256_set1_ps(m), va = _mm256_set1_ps(ac), vb = _mm256_set1_ps(bc),
             vd = _mm256_set1_ps(dc), vsc = _mm256_set1_ps(sc), vsh = _mm256_set1_ps(sh);
      for (; s + 8 <= S; s += 8) {
        __m256 g = _mm256_loadu_ps(dy + base + s);
        __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + base + s), vm);
        if (relu == RELU_FROM_BITS)
          g = _mm256_and_ps(lanes_of(k->mask[(base + s) >> 3]), g);
        else if (relu == RELU_FROM_Y)
          g = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(y + base + s), zero, _CMP_GT_OQ), g);
        else if (relu == RELU_FROM_X)
          g = _mm256_and_ps(_mm256_cmp_ps(_mm256_fmadd_ps(t, vsc, vsh), zero, _CMP_GT_OQ), g);
        if (dr) _mm256_storeu_ps(dr + base + s, g);
        if (dx) {
          __m256 v = _mm256_fmadd_ps(va, g, _mm256_fmadd_ps(vb, t, vd));
          __m256 prev = relu ? zero : _mm256_loadu_ps(dx + base + s);
          _mm256_storeu_ps(dx + base + s, _mm256_add_ps(prev, v));
        }
      }
      for (; s < S; s++) {
        int off = relu == RELU_FROM_BITS ? !bit_of(k->mask, base + s)
                  : relu == RELU_FROM_Y  ? !(y[base + s] > 0)
                  : relu == RELU_FROM_X  ? !(fmaf(x[base + s] - m, sc, sh) > 0)
                                         : 0;
        float g = off ? 0.0f : dy[base + s];
        if (dr) dr[base + s] = g;
        if (dx)
          dx[base + s] = (relu ? 0.0f : dx[base + s]) + fmaf(ac, g, fmaf(bc, x[base + s] - m, dc));
      }
    }
}
static void bn_backward_elemt_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_backward_elemt_f32_body(vctx, n0, n1, 0);
}
static void bn_backward_elemt_relu_y_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_backward_elemt_f32_body(vctx, n0, n1, RELU_FROM_Y);
}
static void bn_backward_elemt_relu_x_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_backward_elemt_f32_body(vctx, n0, n1, RELU_FROM_X);
}
static void bn_backward_elemt_relu_bits_range_f32(void *vctx, int64_t n0, int64_t n1) {
  bn_backward_elemt_f32_body(vctx, n0, n1, RELU_FROM_BITS);
}

/* ---- f64: plain loops, the same formulas ---------------------------------------------------- */

/* 1 when the ReLU of the fused op zeroed element i (channel c) (Note [fused batch norm relu
 * mask]). */
static int relu_off_f64(const bn_pass *k, int64_t i, int64_t c) {
  const double *x = k->x, *y = k->y, *mean = k->mean, *scale = k->scale, *shift = k->shift;
  if (k->relu == RELU_FROM_BITS) return !bit_of(k->mask, i);
  if (k->relu == RELU_FROM_Y) return !(y[i] > 0);
  if (k->relu == RELU_FROM_X) return !(fma(x[i] - mean[c], scale[c], shift[c]) > 0);
  return 0;
}

static void bn_moments_range_f64(void *vctx, int64_t c0, int64_t c1) {
  const bn_pass *k = vctx;
  double *mean = k->out0, *var = k->out1;
  const double *x = k->x;
  int64_t N = k->N, C = k->C, S = k->S;
  double M = (double)N * (double)S;
  for (int64_t c = c0; c < c1; c++) {
    double acc = 0, sq = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) acc += x[(n * C + c) * S + s];
    double m = acc / M;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        double v = x[(n * C + c) * S + s] - m;
        sq += v * v;
      }
    mean[c] = m;
    var[c] = sq / M;
  }
}

static void bn_sums_range_f64(void *vctx, int64_t c0, int64_t c1) {
  const bn_pass *k = vctx;
  double *sum = k->out0, *sumsq = k->out1;
  const double *x = k->x;
  int64_t N = k->N, C = k->C, S = k->S;
  for (int64_t c = c0; c < c1; c++) {
    double a1 = 0, a2 = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        double v = x[(n * C + c) * S + s];
        a1 += v;
        a2 += v * v;
      }
    sum[c] = a1;
    sumsq[c] = a2;
  }
}

static void bn_backward_reduce_range_f64(void *vctx, int64_t c0, int64_t c1) {
  const bn_pass *k = vctx;
  double *sum_dy = k->out0, *sum_dy_xmu = k->out1;
  const double *x = k->x, *dy = k->dy, *mean = k->mean;
  int64_t N = k->N, C = k->C, S = k->S;
  for (int64_t c = c0; c < c1; c++) {
    double m = mean[c], a1 = 0, a2 = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        double g = relu_off_f64(k, i, c) ? 0.0 : dy[i];
        a1 += g;
        a2 += g * (x[i] - m);
      }
    sum_dy[c] = a1;
    sum_dy_xmu[c] = a2;
  }
}

static void bn_apply_range_f64(void *vctx, int64_t n0, int64_t n1) {
  const bn_pass *k = vctx;
  double *y = k->out0;
  const double *x = k->x, *r = k->res, *mean = k->mean, *scale = k->a, *shift = k->b;
  int64_t C = k->C, S = k->S;
  for (int64_t n = n0; n < n1; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        double v = fma(x[i] - mean[c], scale[c], shift[c]);
        if (r) v = v + r[i];
        if (k->relu) v = v < 0 ? 0.0 : v;
        y[i] = v;
      }
}

static void bn_backward_elemt_range_f64(void *vctx, int64_t n0, int64_t n1) {
  const bn_pass *k = vctx;
  double *dx = k->out0, *dr = k->out1;
  const double *x = k->x, *dy = k->dy, *mean = k->mean, *a = k->a, *b = k->b,
               *d = k->d;
  int64_t C = k->C, S = k->S;
  for (int64_t n = n0; n < n1; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t s = 0; s < S; s++) {
        int64_t i = (n * C + c) * S + s;
        double g = relu_off_f64(k, i, c) ? 0.0 : dy[i];
        if (dr) dr[i] = g;
        if (dx) dx[i] = (k->relu != RELU_NONE ? 0.0 : dx[i]) + fma(a[c], g, fma(b[c], x[i] - mean[c], d[c]));
      }
}

/* ---- entry points: the dtype picks the range function -------------------------------------- */

/* Run the channel reduction `fn` of the dtype over channels, or the element-wise pass over
 * rows (by_rows). */
static void run_pass(bn_pass *k, int by_rows, ddp_range_fn fn) {
  if (by_rows) ddp_parallel_for(k->N, grain_for(k->C * k->S), fn, k);
  else ddp_parallel_for(k->C, grain_for(k->N * k->S), fn, k);
}

void ddp_cpu_bn_moments(int dtype, double *mean, double *var, const void *x, int64_t N, int64_t C,
                        int64_t S) {
  bn_pass k = {.out0 = mean, .out1 = var, .x = x, .N = N, .C = C, .S = S};
  run_pass(&k, 0, dtype == DDP_F64 ? bn_moments_range_f64 : bn_moments_range_f32);
}

void ddp_cpu_bn_sums(int dtype, double *sum, double *sumsq, const void *x, int64_t N, int64_t C,
                     int64_t S) {
  bn_pass k = {.out0 = sum, .out1 = sumsq, .x = x, .N = N, .C = C, .S = S};
  run_pass(&k, 0, dtype == DDP_F64 ? bn_sums_range_f64 : bn_sums_range_f32);
}

void ddp_cpu_bn_apply(int dtype, void *y, const void *x, const void *mean, const void *scale,
                      const void *shift, int64_t N, int64_t C, int64_t S) {
  bn_pass k = {.out0 = y, .x = x, .mean = mean, .a = scale, .b = shift, .N = N, .C = C, .S = S};
  run_pass(&k, 1, dtype == DDP_F64 ? bn_apply_range_f64 : bn_apply_range_f32);
}

void ddp_cpu_bn_apply_relu(int dtype, void *y, uint8_t *mask, const void *x,
                           const void *residual, const void *mean, const void *scale,
                           const void *shift, int64_t N, int64_t C, int64_t S) {
  bn_pass k = {.out0 = y, .x = x, .res = residual, .mean = mean, .a = scale, .b = shift,
               .mask_out = mask, .N = N, .C = C, .S = S, .relu = 1};
  ddp_range_fn fn = dtype == DDP_F64 ? bn_apply_range_f64
                    : residual       ? bn_apply_add_relu_range_f32
                                     : bn_apply_relu_range_f32;
  run_pass(&k, 1, fn);
}

void ddp_cpu_bn_backward_reduce(int dtype, double *sum_dy, double *sum_dy_xmu, const void *dy,
                                const void *x, const void *mean, int64_t N, int64_t C, int64_t S) {
  bn_pass k = {.out0 = sum_dy, .out1 = sum_dy_xmu, .x = x, .dy = dy, .mean = mean, .N = N,
               .C = C, .S = S};
  run_pass(&k, 0, dtype == DDP_F64 ? bn_backward_reduce_range_f64 : bn_backward_reduce_range_f32);
}

/* The backward's mask source: the bits, else y, else x (Note [fused batch norm relu mask]). */
static int relu_source(const uint8_t *mask, const void *y) {
  return mask ? RELU_FROM_BITS : y ? RELU_FROM_Y : RELU_FROM_X;
}

void ddp_cpu_bn_backward_reduce_relu(int dtype, double *sum_dy, double *sum_dy_xmu,
                                     const void *dy, const uint8_t *mask, const void *y,
                                     const void *x, const void *mean, const void *scale,
                                     const void *shift, int64_t N, int64_t C, int64_t S) {
  bn_pass k = {.out0 = sum_dy, .out1 = sum_dy_xmu, .x = x, .dy = dy, .y = y, .mean = mean,
               .scale = scale, .shift = shift, .mask = mask, .N = N, .C = C, .S = S,
               .relu = relu_source(mask, y)};
  static const ddp_range_fn f32[] = {NULL, bn_backward_reduce_relu_y_range_f32,
                                     bn_backward_reduce_relu_x_range_f32,
                                     bn_backward_reduce_relu_bits_range_f32};
  run_pass(&k, 0, dtype == DDP_F64 ? bn_backward_reduce_range_f64 : f32[k.relu]);
}

void ddp_cpu_bn_backward_elemt(int dtype, void *dx, const void *dy, const void *x,
                               const void *mean, const void *a, const void *b, const void *d,
                               int64_t N, int64_t C, int64_t S) {
  bn_pass k = {.out0 = dx, .x = x, .dy = dy, .mean = mean, .a = a, .b = b, .d = d, .N = N,
               .C = C, .S = S};
  run_pass(&k, 1, dtype == DDP_F64 ? bn_backward_elemt_range_f64 : bn_backward_elemt_range_f32);
}

void ddp_cpu_bn_backward_elemt_relu(int dtype, void *dx, void *dresidual, const void *dy,
                                    const uint8_t *mask, const void *y, const void *x,
                                    const void *mean, const void *scale, const void *shift,
                                    const void *a, const void *b, const void *d, int64_t N,
                                    int64_t C, int64_t S) {
  bn_pass k = {.out0 = dx, .out1 = dresidual, .x = x, .dy = dy, .y = y, .mean = mean,
               .scale = scale, .shift = shift, .mask = mask, .a = a, .b = b, .d = d, .N = N,
               .C = C, .S = S, .relu = relu_source(mask, y)};
  static const ddp_range_fn f32[] = {NULL, bn_backward_elemt_relu_y_range_f32,
                                     bn_backward_elemt_relu_x_range_f32,
                                     bn_backward_elemt_relu_bits_range_f32};
  run_pass(&k, 1, dtype == DDP_F64 ? bn_backward_elemt_range_f64 : f32[k.relu]);
}
