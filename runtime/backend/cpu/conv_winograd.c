/* runtime/backend/cpu/conv_winograd.c: f32 conv2d by Winograd F(2x2, 3x3), forward and both
 * backward passes, on the NCHW tensors as they are.
 *
 * Lavin, Gray: "Fast algorithms for convolutional neural networks" (CVPR 2016). For a 3x3
 * kernel, stride 1, dilation 1, each 2x2 output tile is
 *   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A
 * for the 4x4 input tile d around it: 16 products per 4 outputs and channel pair instead of
 * 36 (2.25x fewer). Backward differentiates the same formula: Z = A dY Aᵀ, dU = Z · Vᵀ (then
 * dg = Gᵀ dU G) and dV = Uᵀ · Z (then dd = B dV Bᵀ, added onto the input's gradient).
 *
 * Note [Winograd layout]: the transforms are vectorised across 8 neighbouring tiles of one
 * tile row (AVX2 lanes), straight from and to the NCHW planes: a tile row of one channel is
 * read as rows of the plane, split into even and odd columns in registers (the tiles
 * overlap by 2 columns), and written as 8 consecutive tiles of
 *   V (16, C, T) and M, Z (16, O, T)   (ξ = 4 r + s of the 4x4 tile, channel, tile)
 * so the 16 products per chunk are plain row-major GEMMs with the tiles as the long
 * dimension: M[ξ] (O, T) = U[ξ] (O, C) · V[ξ] (C, T), U (16, O, C) (the forward keeps U
 * as (16, C, O): Note [Winograd forward layout]). No channels-last copies; only the
 * weight gradient of 32 channels and more transposes V, one ξ at a time (Note [Winograd
 * weight gradient layout]). A tile row of tw tiles takes ceil(tw / 8) vectors; when tw is not a
 * multiple of 8 the last vector's extra lanes are written past the row's tiles and
 * overwritten by the next tile row (or land in 8 spare columns after the chunk's last
 * tile), so the GEMMs see the tiles packed. Rows of exactly 4 tiles (8 x 8 planes, as in
 * ResNet-20's last stage) would leave half of each vector idle: there one vector holds two
 * tile rows (`paired`: lanes 0-3 tile row ty, lanes 4-7 tile row ty + 1, which are
 * consecutive tiles too). Borders (padding, odd sizes) are masked loads and stores:
 * columns outside the plane read as 0 and are never written.
 *
 * Note [Winograd chunks and determinism]: the samples are cut into at most WG_UNITS units
 * (contiguous sample ranges fixed by the batch size alone); the thread pool takes whole
 * units, so a sample's input gradient (whose tiles overlap) is written by one thread. A
 * unit runs its tile rows in chunks of about WG_CHUNK_BYTES of V, M, Z and dV, which stay
 * in L2 between the transforms and the GEMMs. Each unit sums its own weight gradient dU
 * (GEMM with beta 1, chunk after chunk), and the units' sums are added in unit order at the
 * end: every result is independent of the thread count, bitwise. Scratch is kept per thread
 * between calls (no allocation, zeroing or page faults per call).
 *
 * Numerics: the transforms only add, subtract and halve, so the f32 error stays within a
 * few ulps of the products' sums; sums run in another order than im2col's (by tile element
 * ξ and channel, then transforms, and the input gradient tile by tile), so f32 results
 * differ from the im2col path by rounding only. spec/ops/conv_winograd_spec.lua compares
 * with the f64 convolution: the largest error seen is below 5e-7 of the largest value
 * (output and all three gradients), the bound checked 1e-5. F(4x4, 3x3) would cut the
 * products further (4x instead of 2.25x) but its transforms carry factors up to 8 and
 * lose about two more digits in f32; it is not used. */
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/conv_winograd.h"
#include "backend/cpu/matmul.h"
#include "core/core.h"

enum {
  WG_UNITS = 12,                  /* most work units a batch is cut into (divides 2, 3, 4, 6) */
  WG_CHUNK_BYTES = 1 << 20, /* transformed tiles per chunk: a quarter of this core's L2
                             * (~10% faster than 2 MiB or 512 KiB at ResNet-20's 16- and
                             * 32-channel layers; 4 MiB and 256 KiB slower) */
};

/* ---- per-thread scratch, kept between calls ------------------------------------------- */

typedef struct {
  char *p;
  size_t n;
} wg_scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_release(void *v) {
  wg_scratch *s = v;
  free(s->p);
  free(s);
}
static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_release); }

/* This thread's scratch of at least n bytes (64-byte aligned), NULL when out of memory. It
 * is freed when the thread exits. */
static char *scratch_get(size_t n) {
  pthread_once(&scratch_once, scratch_init);
  wg_scratch *s = pthread_getspecific(scratch_key);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s || pthread_setspecific(scratch_key, s)) {
      free(s);
      return NULL;
    }
  }
  if (s->n < n) {
    free(s->p);
    s->n = 0;
    if (posix_memalign((void **)&s->p, 64, n)) s->p = NULL;
    if (!s->p) return NULL;
    s->n = n;
  }
  return s->p;
}

/* ---- geometry of one call --------------------------------------------------------------- */

typedef struct {
  const ddp_conv2d_geom *g;
  int64_t th, tw, ng;   /* tile rows and columns of a sample; 8-tile vectors per tile row */
  int paired;           /* tw == 4: one vector holds 2 tile rows (Note [Winograd layout]) */
  int vt;               /* dU from a transposed V (Note [Winograd weight gradient layout]) */
  int64_t rows_chunk;   /* tile rows per chunk */
  int64_t ld;           /* row stride of V, M, Z, dV: tiles of a chunk + 8 spare */
  int64_t units;        /* work units (sample ranges) */
  /* operands */
  float *out, *d_in, *d_w, *d_b;
  const float *in, *w, *bias, *grad_out;
  const float *U;       /* (16, O, C); the forward's (16, C, O) */
  float *dU_units;      /* (units, 16, O, C) */
  pthread_mutex_t lock;
  int status;
} wg_job;

static void job_fail(wg_job *j, int status) {
  pthread_mutex_lock(&j->lock);
  if (!j->status) j->status = status;
  pthread_mutex_unlock(&j->lock);
}

static void plan(wg_job *j, const ddp_conv2d_geom *g, int backward) {
  j->g = g;
  j->th = (g->oh + 1) / 2, j->tw = (g->ow + 1) / 2;
  j->ng = (j->tw + 7) / 8;
  j->paired = j->tw == 4;
  int64_t per_tile = 16 * 4 * (backward ? g->o + 2 * g->c : g->o + g->c);
  int64_t tiles = WG_CHUNK_BYTES / per_tile;
  j->rows_chunk = tiles / j->tw < 1 ? 1 : tiles / j->tw;
  if (j->rows_chunk > g->n * j->th) j->rows_chunk = g->n * j->th;
  j->ld = j->rows_chunk * j->tw + 8;
  j->units = g->n < WG_UNITS ? g->n : WG_UNITS;
  j->vt = backward && g->c >= 32;
}

/* ---- weight transforms (once per call: O C filters) -------------------------------------- */

/* U (16, O, C) = G g Gᵀ for every 3x3 filter g of w (O, C, 3, 3), or its transpose
 * U (16, C, O) when transposed (Note [Winograd forward layout]),
 * G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]. */
static void weights_transform(float *U, const float *w, int64_t O, int64_t C, int transposed) {
  for (int64_t o = 0; o < O; o++)
    for (int64_t c = 0; c < C; c++) {
      const float *g = w + (o * C + c) * 9;
      float u[4][3];
      for (int j = 0; j < 3; j++) {
        u[0][j] = g[j];
        u[1][j] = (g[j] + g[3 + j] + g[6 + j]) * 0.5f;
        u[2][j] = (g[j] - g[3 + j] + g[6 + j]) * 0.5f;
        u[3][j] = g[6 + j];
      }
      for (int i = 0; i < 4; i++) {
        float v[4] = {u[i][0], (u[i][0] + u[i][1] + u[i][2]) * 0.5f,
                      (u[i][0] - u[i][1] + u[i][2]) * 0.5f, u[i][2]};
        for (int k = 0; k < 4; k++)
          U[transposed ? ((i * 4 + k) * C + c) * O + o : ((i * 4 + k) * O + o) * C + c] = v[k];
      }
    }
}

/* dw (O, C, 3, 3) += Gᵀ dU G for dU (16, O, C). */
static void weights_grad_transform(float *dw, const float *dU, int64_t O, int64_t C) {
  for (int64_t o = 0; o < O; o++)
    for (int64_t c = 0; c < C; c++) {
      float d[4][4], r[3][4];
      for (int i = 0; i < 4; i++)
        for (int k = 0; k < 4; k++) d[i][k] = dU[((i * 4 + k) * O + o) * C + c];
      for (int k = 0; k < 4; k++) {
        r[0][k] = d[0][k] + (d[1][k] + d[2][k]) * 0.5f;
        r[1][k] = (d[1][k] - d[2][k]) * 0.5f;
        r[2][k] = (d[1][k] + d[2][k]) * 0.5f + d[3][k];
      }
      float *g = dw + (o * C + c) * 9;
      for (int k = 0; k < 3; k++) {
        g[k * 3 + 0] += r[k][0] + (r[k][1] + r[k][2]) * 0.5f;
        g[k * 3 + 1] += (r[k][1] - r[k][2]) * 0.5f;
        g[k * 3 + 2] += (r[k][1] + r[k][2]) * 0.5f + r[k][3];
      }
    }
}

/* ---- 8-lane helpers ---------------------------------------------------------------------- */

static const int32_t lane_mask_src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* Mask of the first k lanes (0 <= k <= 8). */
static inline __m256i first_lanes(int64_t k) {
  return _mm256_loadu_si256((const __m256i *)(lane_mask_src + 8 - k));
}

/* The even and odd elements of the 16 floats a, b (a first). */
static inline void deinterleave(__m256 a, __m256 b, __m256 *even, __m256 *odd) {
  __m256 lo = _mm256_shuffle_ps(a, b, 0x88), hi = _mm256_shuffle_ps(a, b, 0xDD);
  *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(lo), 0xD8));
  *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(hi), 0xD8));
}

/* 16 floats e0 o0 e1 o1 ... e7 o7 as two vectors. */
static inline void interleave(__m256 e, __m256 o, __m256 *first, __m256 *second) {
  __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
  *first = _mm256_permute2f128_ps(lo, hi, 0x20);
  *second = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* Store the first k (0..16) of the 16 floats (a, b) at p. */
static inline void store_first(float *p, __m256 a, __m256 b, int64_t k) {
  if (k >= 16) {
    _mm256_storeu_ps(p, a);
    _mm256_storeu_ps(p + 8, b);
  } else if (k >= 8) {
    _mm256_storeu_ps(p, a);
    _mm256_maskstore_ps(p + 8, first_lanes(k - 8), b);
  } else if (k > 0) {
    _mm256_maskstore_ps(p, first_lanes(k), a);
  }
}

/* Load 16 floats at p of which only the first k (any k) exist; the rest read as 0. */
static inline void load_first(const float *p, int64_t k, __m256 *a, __m256 *b) {
  if (k >= 16) {
    *a = _mm256_loadu_ps(p), *b = _mm256_loadu_ps(p + 8);
  } else if (k >= 8) {
    *a = _mm256_loadu_ps(p), *b = _mm256_maskload_ps(p + 8, first_lanes(k - 8));
  } else {
    *a = k > 0 ? _mm256_maskload_ps(p, first_lanes(k)) : _mm256_setzero_ps();
    *b = _mm256_setzero_ps();
  }
}

/* ---- input transform: V = Bᵀ d B -------------------------------------------------------- *
 * Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]. */

/* Masks of the input columns 16 q - pw + off + lane inside [0, W) for the 8-tile vector q,
 * off = 0, 8, 2, 10: the 18 columns its tiles read (and the 16 + 2 they write back). */
static inline void column_masks(int64_t q, int64_t pw, int64_t W, __m256i *m) {
  const int offs[4] = {0, 8, 2, 10};
  __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i lo = _mm256_set1_epi32(-1), hi = _mm256_set1_epi32((int32_t)W);
  for (int k = 0; k < 4; k++) {
    __m256i x = _mm256_add_epi32(lane, _mm256_set1_epi32((int32_t)(16 * q - pw + offs[k])));
    m[k] = _mm256_and_si256(_mm256_cmpgt_epi32(x, lo), _mm256_cmpgt_epi32(hi, x));
  }
}

/* The 4 row-transformed vectors h[0..3] of one input line for 8 tiles, p at the tiles'
 * first column, m its column masks (columns outside the plane read as 0):
 * h0 = d0 - d2, h1 = d1 + d2, h2 = d2 - d1, h3 = d1 - d3. */
static inline __m256 load_and(const float *p, __m256i m) {
  return _mm256_and_ps(_mm256_loadu_ps(p), _mm256_castsi256_ps(m));
}
/* The 4 row-transformed vectors h[0..3] of input lines for 8 tiles: 16 floats from f
 * (lanes 0-3 of the deinterleaved vectors) and s (lanes 4-7), s = f + 8 for one line, or
 * the 8 floats at f and at s for two lines of 4 tiles (Note [Winograd layout]); masks m for
 * f, s, f + 2 and s + 2 (columns outside the plane read as 0). plain: the columns read lie
 * inside the tensor, so plain loads masked afterwards are safe (cheaper than maskload).
 * h0 = d0 - d2, h1 = d1 + d2, h2 = d2 - d1, h3 = d1 - d3. */
static inline void input_line(const float *f, const float *s, const __m256i *m, int plain,
                              __m256 *h) {
  __m256 d0, d1, d2, d3;
  if (plain) {
    deinterleave(load_and(f, m[0]), load_and(s, m[1]), &d0, &d1);
    deinterleave(load_and(f + 2, m[2]), load_and(s + 2, m[3]), &d2, &d3);
  } else {
    deinterleave(_mm256_maskload_ps(f, m[0]), _mm256_maskload_ps(s, m[1]), &d0, &d1);
    deinterleave(_mm256_maskload_ps(f + 2, m[2]), _mm256_maskload_ps(s + 2, m[3]), &d2, &d3);
  }
  h[0] = _mm256_sub_ps(d0, d2);
  h[1] = _mm256_add_ps(d1, d2);
  h[2] = _mm256_sub_ps(d2, d1);
  h[3] = _mm256_sub_ps(d1, d3);
}

/* V[ξ] at v + ξ * vs for 8 tiles whose 4 input lines are read from f[i], s[i] with masks
 * m[i] (input_line). */
static inline void input_tiles(float *v, int64_t vs, const float *const *f,
                               const float *const *s, const __m256i (*m)[4],
                               const int *plain) {
  __m256 a[4], b[4], c[4];
  input_line(f[2], s[2], m[2], plain[2], b);
  input_line(f[0], s[0], m[0], plain[0], a);
  for (int k = 0; k < 4; k++) _mm256_storeu_ps(v + k * vs, _mm256_sub_ps(a[k], b[k]));
  input_line(f[1], s[1], m[1], plain[1], c);
  for (int k = 0; k < 4; k++) {
    _mm256_storeu_ps(v + (4 + k) * vs, _mm256_add_ps(c[k], b[k]));
    _mm256_storeu_ps(v + (8 + k) * vs, _mm256_sub_ps(b[k], c[k]));
  }
  input_line(f[3], s[3], m[3], plain[3], a);
  for (int k = 0; k < 4; k++) _mm256_storeu_ps(v + (12 + k) * vs, _mm256_sub_ps(c[k], a[k]));
}

/* The tile rows [r0, r1) of the batch as runs of one sample: *n, tile rows [*ty0, *ty1) and
 * the chunk's first tile of the run *t0; returns the next r. Transforms walk a run channel by
 * channel, so each plane is read (or written) front to back. */
static int64_t sample_run(const wg_job *j, int64_t r, int64_t r0, int64_t r1, int64_t *n,
                          int64_t *ty0, int64_t *ty1, int64_t *t0) {
  *n = r / j->th, *ty0 = r % j->th;
  *ty1 = (*n + 1) * j->th <= r1 ? j->th : r1 - *n * j->th;
  *t0 = (r - r0) * j->tw;
  return r + *ty1 - *ty0;
}

/* V (16, C, ld) for the tile rows [r0, r1) of the batch (row r = sample r / th, tile row
 * r % th), read straight from the input planes. */
static void input_transform(const wg_job *j, float *V, int64_t r0, int64_t r1) {
  const ddp_conv2d_geom *g = j->g;
  int64_t C = g->c, H = g->h, W = g->w, tw = j->tw, vs = C * j->ld;
  const float *in_end = j->in + g->n * C * H * W;
  for (int64_t r = r0, n, ty0, ty1, t0; r < r1;) {
    r = sample_run(j, r, r0, r1, &n, &ty0, &ty1, &t0);
    for (int64_t c = 0; c < C; c++) {
      const float *plane = j->in + (n * C + c) * H * W;
      if (j->paired) {
        __m256i cm[4], zero = _mm256_setzero_si256();
        column_masks(0, g->pw, W, cm);
        for (int64_t ty = ty0; ty < ty1; ty += 2) {
          const float *f[4], *s[4];
          __m256i m[4][4];
          int plain[4];
          for (int i = 0; i < 4; i++) {
            int64_t ya = 2 * ty - g->ph + i, yb = ya + 2;
            int ia = ya >= 0 && ya < H, ib = ty + 1 < ty1 && yb >= 0 && yb < H;
            f[i] = plane + (ia ? ya * W : 0) - g->pw;
            s[i] = plane + (ib ? yb * W : 0) - g->pw;
            m[i][0] = ia ? cm[0] : zero, m[i][2] = ia ? cm[2] : zero;
            m[i][1] = ib ? cm[0] : zero, m[i][3] = ib ? cm[2] : zero;
            plain[i] = f[i] >= j->in && f[i] + 10 <= in_end && s[i] >= j->in &&
                       s[i] + 10 <= in_end;
          }
          _mm_prefetch((const char *)(plane + (2 * ty + 8 - g->ph) * W), _MM_HINT_T0);
          _mm_prefetch((const char *)(plane + (2 * ty + 10 - g->ph) * W), _MM_HINT_T0);
          input_tiles(V + c * j->ld + t0 + (ty - ty0) * tw, vs, f, s,
                      (const __m256i(*)[4])m, plain);
        }
        continue;
      }
      for (int64_t ty = ty0; ty < ty1; ty++) {
        const float *p[4];
        int inside[4];
        for (int i = 0; i < 4; i++) {
          int64_t y = 2 * ty - g->ph + i;
          inside[i] = y >= 0 && y < H;
          p[i] = plane + (inside[i] ? y * W : 0) - g->pw;
        }
        float *v = V + c * j->ld + t0 + (ty - ty0) * tw;
        for (int64_t q = 0; q < j->ng; q++, v += 8) {
          __m256i cm[4], m[4][4];
          column_masks(q, g->pw, W, cm);
          for (int i = 0; i < 4; i++)
            for (int k = 0; k < 4; k++) m[i][k] = inside[i] ? cm[k] : _mm256_setzero_si256();
          const float *f[4] = {p[0] + 16 * q, p[1] + 16 * q, p[2] + 16 * q, p[3] + 16 * q};
          const float *s[4] = {f[0] + 8, f[1] + 8, f[2] + 8, f[3] + 8};
          int plain[4]; /* the 18 columns lie inside the tensor */
          for (int i = 0; i < 4; i++) plain[i] = f[i] >= j->in && f[i] + 18 <= in_end;
          /* the lines two tile rows on (the next plane's first ones at the end): the loads
           * wait on memory otherwise (prefetches never fault) */
          _mm_prefetch((const char *)(f[2] + 4 * W), _MM_HINT_T0);
          _mm_prefetch((const char *)(f[3] + 4 * W), _MM_HINT_T0);
          input_tiles(v, vs, f, s, (const __m256i(*)[4])m, plain);
        }
      }
    }
  }
}

/* ---- output transform: Y = Aᵀ m A + bias ------------------------------------------------- *
 * Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]. */

/* out (N, O, OH, OW) for the tile rows [r0, r1) from M (16, O, ld). */
/* The 4 output vectors of 8 tiles from m[ξ] at m + ξ ms: y[0], y[1] the even and odd
 * columns of the tiles' first output line, y[2], y[3] of their second. */
static inline void output_tiles(const float *m, int64_t ms, __m256 b, __m256 *y) {
  __m256 s0[4], s1[4];
  for (int k = 0; k < 4; k++) {
    __m256 m0 = _mm256_loadu_ps(m + k * ms), m1 = _mm256_loadu_ps(m + (4 + k) * ms);
    __m256 m2 = _mm256_loadu_ps(m + (8 + k) * ms), m3 = _mm256_loadu_ps(m + (12 + k) * ms);
    s0[k] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
    s1[k] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
  }
  y[0] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0[0], s0[1]), s0[2]), b);
  y[1] = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s0[1], s0[2]), s0[3]), b);
  y[2] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s1[0], s1[1]), s1[2]), b);
  y[3] = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s1[1], s1[2]), s1[3]), b);
}

/* out (N, O, OH, OW) for the tile rows [r0, r1) from M (16, O, ld). */
static void output_transform(const wg_job *j, const float *M, int64_t r0, int64_t r1) {
  const ddp_conv2d_geom *g = j->g;
  int64_t O = g->o, OH = g->oh, OW = g->ow, tw = j->tw;
  int64_t ms = O * j->ld, step = j->paired ? 2 : 1;
  __m256 zero = _mm256_setzero_ps();
  for (int64_t r = r0, n, ty0, ty1, t0; r < r1;) {
    r = sample_run(j, r, r0, r1, &n, &ty0, &ty1, &t0);
    for (int64_t o = 0; o < O; o++) {
      __m256 b = _mm256_set1_ps(j->bias ? j->bias[o] : 0.0f);
      float *plane = j->out + (n * O + o) * OH * OW;
      for (int64_t ty = ty0; ty < ty1; ty += step) {
        float *y0 = plane + 2 * ty * OW;
        const float *m = M + o * j->ld + t0 + (ty - ty0) * tw;
        __m256 y[4], f, s;
        if (j->paired) { /* lanes 0-3: tile row ty, lanes 4-7: ty + 1 */
          int has_b = ty + 1 < ty1;
          output_tiles(m, ms, b, y);
          interleave(y[0], y[1], &f, &s);
          store_first(y0, f, zero, OW);
          if (has_b) store_first(y0 + 2 * OW, s, zero, OW);
          interleave(y[2], y[3], &f, &s);
          if (2 * ty + 1 < OH) store_first(y0 + OW, f, zero, OW);
          if (has_b && 2 * ty + 3 < OH) store_first(y0 + 3 * OW, s, zero, OW);
          continue;
        }
        for (int64_t q = 0; q < j->ng; q++, m += 8) {
          int64_t k = OW - 16 * q;
          output_tiles(m, ms, b, y);
          interleave(y[0], y[1], &f, &s);
          store_first(y0 + 16 * q, f, s, k);
          if (2 * ty + 1 < OH) {
            interleave(y[2], y[3], &f, &s);
            store_first(y0 + OW + 16 * q, f, s, k);
          }
        }
      }
    }
  }
}

/* ---- gradient transform: Z = A dY Aᵀ ----------------------------------------------------- */

/* Z (16, O, ld) for the tile rows [r0, r1) from grad_out (N, O, OH, OW). */
/* Z[ξ] at z + ξ zs for 8 tiles from the even (a0, b0) and odd (a1, b1) columns of their
 * first (a) and second (b) gradient lines. */
static inline void grad_tiles(float *z, int64_t zs, __m256 a0, __m256 a1, __m256 b0, __m256 b1) {
  /* rows of A dY: (a), (a + b), (a - b), (-b); then the same over columns */
  __m256 zero = _mm256_setzero_ps();
  __m256 q0[4] = {a0, _mm256_add_ps(a0, b0), _mm256_sub_ps(a0, b0), _mm256_sub_ps(zero, b0)};
  __m256 q1[4] = {a1, _mm256_add_ps(a1, b1), _mm256_sub_ps(a1, b1), _mm256_sub_ps(zero, b1)};
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(z + (4 * i + 0) * zs, q0[i]);
    _mm256_storeu_ps(z + (4 * i + 1) * zs, _mm256_add_ps(q0[i], q1[i]));
    _mm256_storeu_ps(z + (4 * i + 2) * zs, _mm256_sub_ps(q0[i], q1[i]));
    _mm256_storeu_ps(z + (4 * i + 3) * zs, _mm256_sub_ps(zero, q1[i]));
  }
}

/* The first k (<= 8) floats at p, the rest 0; all 0 when p is NULL. */
static inline __m256 load8(const float *p, int64_t k) {
  if (!p) return _mm256_setzero_ps();
  return k >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(k));
}

/* Z (16, O, ld) for the tile rows [r0, r1) from grad_out (N, O, OH, OW). */
static void grad_transform(const wg_job *j, float *Z, int64_t r0, int64_t r1) {
  const ddp_conv2d_geom *g = j->g;
  int64_t O = g->o, OH = g->oh, OW = g->ow, tw = j->tw;
  int64_t zs = O * j->ld, step = j->paired ? 2 : 1;
  for (int64_t r = r0, n, ty0, ty1, t0; r < r1;) {
    r = sample_run(j, r, r0, r1, &n, &ty0, &ty1, &t0);
    for (int64_t o = 0; o < O; o++) {
      const float *plane = j->grad_out + (n * O + o) * OH * OW;
      for (int64_t ty = ty0; ty < ty1; ty += step) {
        const float *g0 = plane + 2 * ty * OW, *g1 = 2 * ty + 1 < OH ? g0 + OW : NULL;
        float *z = Z + o * j->ld + t0 + (ty - ty0) * tw;
        __m256 a0, a1, b0, b1;
        if (j->paired) { /* lanes 0-3: tile row ty, lanes 4-7: ty + 1 */
          int has_b = ty + 1 < ty1;
          const float *g2 = has_b ? g0 + 2 * OW : NULL;
          const float *g3 = has_b && 2 * ty + 3 < OH ? g0 + 3 * OW : NULL;
          deinterleave(load8(g0, OW), load8(g2, OW), &a0, &a1);
          deinterleave(load8(g1, OW), load8(g3, OW), &b0, &b1);
          grad_tiles(z, zs, a0, a1, b0, b1);
          continue;
        }
        _mm_prefetch((const char *)(g0 + 4 * OW), _MM_HINT_T0);
        _mm_prefetch((const char *)(g0 + 5 * OW), _MM_HINT_T0);
        for (int64_t q = 0; q < j->ng; q++, z += 8) {
          __m256 a, b;
          int64_t k = OW - 16 * q;
          load_first(g0 + 16 * q, k, &a, &b);
          deinterleave(a, b, &a0, &a1);
          b0 = b1 = _mm256_setzero_ps();
          if (g1) {
            load_first(g1 + 16 * q, k, &a, &b);
            deinterleave(a, b, &b0, &b1);
          }
          grad_tiles(z, zs, a0, a1, b0, b1);
        }
      }
    }
  }
}

/* ---- input-gradient transform: dd = B dV Bᵀ, added onto d_in ---------------------------- */

/* p[i][s] = (B dV)[i][s], the first half of the input-gradient transform, for 8 tiles from
 * dV[xi] at v + xi * vs. */
static inline __attribute__((always_inline)) void input_grad_rows(__m256 p[4][4], const float *v,
                                                                  int64_t vs) {
  for (int s = 0; s < 4; s++) {
    __m256 v0 = _mm256_loadu_ps(v + s * vs), v1 = _mm256_loadu_ps(v + (4 + s) * vs);
    __m256 v2 = _mm256_loadu_ps(v + (8 + s) * vs), v3 = _mm256_loadu_ps(v + (12 + s) * vs);
    p[0][s] = v0;
    p[1][s] = _mm256_add_ps(_mm256_sub_ps(v1, v2), v3);
    p[2][s] = _mm256_sub_ps(_mm256_add_ps(v1, v2), v0);
    p[3][s] = _mm256_sub_ps(_mm256_setzero_ps(), v3);
  }
}

/* d_in lines += the 4 lines of dd = B dV Bᵀ for one tile row of one channel, from dV[ξ] at
 * v + ξ * vs (8 tiles a vector). line[i]: input line 2 ty - ph + i at column -pw, or NULL
 * outside the plane. Tiles overlap by 2 columns: column 2k (from -pw) gets e0 of tile k and
 * e2 of tile k - 1, column 2k + 1 e1 of tile k and e3 of tile k - 1. Lanes at and past
 * `valid` tiles of the last vector are not tiles of this row: their e0, e1 are zeroed, and
 * their e2, e3 land past the plane (W <= 2 tw + 2 - pw), where the masks drop them. */
static void input_grad_tiles(float *const *line, const float *v, int64_t vs, int64_t ng,
                             int64_t valid, int64_t pw, int64_t W) {
  const __m256i rot = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
  __m256 carry2[4], carry3[4];
  for (int i = 0; i < 4; i++) carry2[i] = carry3[i] = _mm256_setzero_ps();
  for (int64_t q = 0; q < ng; q++, v += 8) {
    __m256 p[4][4]; /* p[i][s]: (B dV)[i][s] */
    input_grad_rows(p, v, vs);
    __m256 keep = _mm256_castsi256_ps(first_lanes(valid - 8 * q < 8 ? valid - 8 * q : 8));
    __m256i cm[4];
    column_masks(q, pw, W, cm);
    for (int i = 0; i < 4; i++) {
      __m256 e0 = p[i][0];
      __m256 e1 = _mm256_add_ps(_mm256_sub_ps(p[i][1], p[i][2]), p[i][3]);
      __m256 e2 = _mm256_sub_ps(_mm256_add_ps(p[i][1], p[i][2]), p[i][0]);
      __m256 e3 = _mm256_sub_ps(_mm256_setzero_ps(), p[i][3]);
      e0 = _mm256_and_ps(e0, keep), e1 = _mm256_and_ps(e1, keep);
      /* tile k - 1's e2, e3 in lane k; lane 0 from the previous vector's lane 7 */
      __m256 r2 = _mm256_permutevar8x32_ps(e2, rot), r3 = _mm256_permutevar8x32_ps(e3, rot);
      __m256 ev = _mm256_add_ps(e0, _mm256_blend_ps(r2, carry2[i], 0x01));
      __m256 od = _mm256_add_ps(e1, _mm256_blend_ps(r3, carry3[i], 0x01));
      carry2[i] = r2, carry3[i] = r3;
      if (!line[i]) continue;
      __m256 f, s;
      interleave(ev, od, &f, &s);
      float *d = line[i] + 16 * q;
      _mm256_maskstore_ps(d, cm[0], _mm256_add_ps(_mm256_maskload_ps(d, cm[0]), f));
      _mm256_maskstore_ps(d + 8, cm[1], _mm256_add_ps(_mm256_maskload_ps(d + 8, cm[1]), s));
    }
  }
  /* the last vector's lane 7: e2, e3 of its last tile, at columns 16 ng - pw and + 1 */
  int64_t x = 16 * ng - pw;
  for (int i = 0; i < 4; i++) {
    if (!line[i]) continue;
    if (x >= 0 && x < W) line[i][16 * ng] += _mm256_cvtss_f32(carry2[i]);
    if (x + 1 >= 0 && x + 1 < W) line[i][16 * ng + 1] += _mm256_cvtss_f32(carry3[i]);
  }
}

/* input_grad_tiles for two tile rows of 4 tiles in one vector (Note [Winograd layout]):
 * lanes 0-3 go to the lines la (tile row ty), lanes 4-7 to lb (ty + 1; NULL entries: no
 * such line or no such tile row). Each row's tiles k = 0..3 cover columns 2k .. 2k + 3
 * (from -pw); columns 8 and 9 get the last tile's e2, e3. */
static void input_grad_pair(float *const *la, float *const *lb, const float *v, int64_t vs,
                            int64_t pw, int64_t W) {
  const __m256i rot = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
  __m256 p[4][4];
  input_grad_rows(p, v, vs);
  __m256i cm[4];
  column_masks(0, pw, W, cm);
  int64_t x = 8 - pw; /* the column of the carries */
  for (int i = 0; i < 4; i++) {
    __m256 e0 = p[i][0];
    __m256 e1 = _mm256_add_ps(_mm256_sub_ps(p[i][1], p[i][2]), p[i][3]);
    __m256 e2 = _mm256_sub_ps(_mm256_add_ps(p[i][1], p[i][2]), p[i][0]);
    __m256 e3 = _mm256_sub_ps(_mm256_setzero_ps(), p[i][3]);
    /* tile k - 1's e2, e3 in lane k of each half; lanes 0 and 4 start a row */
    __m256 r2 = _mm256_blend_ps(_mm256_permutevar8x32_ps(e2, rot), _mm256_setzero_ps(), 0x11);
    __m256 r3 = _mm256_blend_ps(_mm256_permutevar8x32_ps(e3, rot), _mm256_setzero_ps(), 0x11);
    __m256 f, s;
    interleave(_mm256_add_ps(e0, r2), _mm256_add_ps(e1, r3), &f, &s);
    float c2[8], c3[8];
    _mm256_storeu_ps(c2, e2);
    _mm256_storeu_ps(c3, e3);
    float *lines[2] = {la[i], lb[i]};
    __m256 vals[2] = {f, s};
    for (int h = 0; h < 2; h++) {
      float *d = lines[h];
      if (!d) continue;
      _mm256_maskstore_ps(d, cm[0], _mm256_add_ps(_mm256_maskload_ps(d, cm[0]), vals[h]));
      if (x >= 0 && x < W) d[8] += c2[4 * h + 3];
      if (x + 1 >= 0 && x + 1 < W) d[9] += c3[4 * h + 3];
    }
  }
}

/* d_in (N, C, H, W) += B dV Bᵀ over the tile rows [r0, r1), from dV (16, C, ld). */
static void input_grad_transform(const wg_job *j, const float *dV, int64_t r0, int64_t r1) {
  const ddp_conv2d_geom *g = j->g;
  int64_t C = g->c, H = g->h, W = g->w, tw = j->tw;
  int64_t vs = C * j->ld, step = j->paired ? 2 : 1;
  for (int64_t r = r0, n, ty0, ty1, t0; r < r1;) {
    r = sample_run(j, r, r0, r1, &n, &ty0, &ty1, &t0);
    for (int64_t c = 0; c < C; c++) {
      float *plane = j->d_in + (n * C + c) * H * W;
      for (int64_t ty = ty0; ty < ty1; ty += step) {
        const float *v = dV + c * j->ld + t0 + (ty - ty0) * tw;
        float *line[4], *next[4];
        for (int i = 0; i < 4; i++) {
          int64_t y = 2 * ty - g->ph + i;
          line[i] = y >= 0 && y < H ? plane + y * W - g->pw : NULL;
          next[i] = ty + 1 < ty1 && y + 2 >= 0 && y + 2 < H ? plane + (y + 2) * W - g->pw : NULL;
        }
        if (j->paired) input_grad_pair(line, next, v, vs, g->pw, W);
        else input_grad_tiles(line, v, vs, j->ng, tw, g->pw, W);
      }
    }
  }
}

/* Note [Winograd forward layout]: the forward keeps the transformed weights as
 * U (16, C, O) and runs M = Uᵀ · V, which OpenBLAS (SkylakeX small-matrix kernels, single
 * thread) computes faster than the same product from U (16, O, C): 179 vs 155 GFLOP/s at
 * the CNN's O = 64, C = 32 (168 tiles), 154 vs 137 (77 tiles), 181 vs 153 at O = C = 32,
 * 144 vs 133 at O = C = 16. The weight transform writes either layout at the same cost.
 * The input gradient's dV = Uᵀ · Z already reads U (16, O, C) transposed and keeps it. */

/* ---- transposed V for the weight gradient ---------------------------------------------- */

/* The 8 x 8 floats r[0..7] (rows) transposed in place. */
static inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/* vt (T, C) row-major = v (C, T) with row stride ld, transposed.
 *
 * Note [Winograd weight gradient layout]: with C >= 32 input channels, OpenBLAS (its
 * SkylakeX small-matrix kernels, single thread) runs dU (O, C) += Z (O, T) · Vᵀ much faster
 * as the plain product Z · Vt with Vt (T, C) a transposed copy of the chunk's V than with
 * a transposed operand: 173 vs 92 GFLOP/s at the CNN's O = 64, C = 32 (T = 77..336
 * tiles), 173 vs 99 at O = C = 64, 148 vs 124 at C = 48, 152 vs 129 at O = 16, C = 32,
 * 117 vs 114 at O = C = 128; the transpose costs ~1-2% of the layer's backward. Below 32
 * channels the transposed operand is faster (C = 16: 130 vs 98; C = 24: 130 vs 117;
 * C = 8: 107 vs 70), so there dU takes V as it is. Either way each dU is one OpenBLAS GEMM
 * per chunk, whose order depends on the shapes alone (Note [Winograd chunks and
 * determinism]). */
static void transpose_tiles(float *vt, const float *v, int64_t C, int64_t T, int64_t ld) {
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    int64_t t = 0;
    for (; t + 8 <= T; t += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(v + (c + i) * ld + t);
      transpose8(r);
      for (int i = 0; i < 8; i++) _mm256_storeu_ps(vt + (t + i) * C + c, r[i]);
    }
    for (; t < T; t++)
      for (int64_t i = 0; i < 8; i++) vt[t * C + c + i] = v[(c + i) * ld + t];
  }
  for (; c < C; c++)
    for (int64_t t = 0; t < T; t++) vt[t * C + c] = v[c * ld + t];
}

/* ---- chunks and units -------------------------------------------------------------------- */

/* Tile rows [begin, end) of unit u. */
static void unit_rows(const wg_job *j, int64_t u, int64_t *begin, int64_t *end) {
  int64_t n = j->g->n;
  *begin = u * n / j->units * j->th;
  *end = (u + 1) * n / j->units * j->th;
}

static size_t chunk_floats(const wg_job *j, int64_t rows_of) { return (size_t)(16 * rows_of * j->ld); }

static void forward_units(void *ctx, int64_t ub, int64_t ue) {
  wg_job *j = ctx;
  const ddp_conv2d_geom *g = j->g;
  size_t vn = chunk_floats(j, g->c), mn = chunk_floats(j, g->o);
  float *V = (float *)scratch_get(sizeof(float) * (vn + mn));
  if (!V) {
    job_fail(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for Winograd scratch"));
    return;
  }
  float *M = V + vn;
  for (int64_t u = ub; u < ue; u++) {
    int64_t rb, re;
    unit_rows(j, u, &rb, &re);
    for (int64_t r0 = rb; r0 < re; r0 += j->rows_chunk) {
      int64_t r1 = r0 + j->rows_chunk < re ? r0 + j->rows_chunk : re, T = (r1 - r0) * j->tw;
      input_transform(j, V, r0, r1);
      for (int x = 0; x < 16; x++) /* U (16, C, O): Note [Winograd forward layout] */
        ddp_cpu_gemm(DDP_F32, 1, 0, g->o, T, g->c, 1.0, j->U + x * g->o * g->c, g->o,
                     V + x * g->c * j->ld, j->ld, 0.0, M + x * g->o * j->ld, j->ld);
      output_transform(j, M, r0, r1);
    }
  }
}

static void backward_units(void *ctx, int64_t ub, int64_t ue) {
  wg_job *j = ctx;
  const ddp_conv2d_geom *g = j->g;
  int64_t C = g->c, O = g->o;
  size_t zn = chunk_floats(j, O), vn = j->d_w ? chunk_floats(j, C) : 0;
  size_t dvn = j->d_in ? chunk_floats(j, C) : 0;
  size_t vtn = j->d_w && j->vt ? (size_t)(j->rows_chunk * j->tw * C) : 0;
  float *Z = (float *)scratch_get(sizeof(float) * (zn + vn + dvn + vtn));
  if (!Z) {
    job_fail(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for Winograd scratch"));
    return;
  }
  float *V = Z + zn, *dV = V + vn, *Vt = dV + dvn;
  for (int64_t u = ub; u < ue; u++) {
    int64_t rb, re;
    unit_rows(j, u, &rb, &re);
    float *dU = j->d_w ? j->dU_units + u * 16 * O * C : NULL;
    int first = 1;
    for (int64_t r0 = rb; r0 < re; r0 += j->rows_chunk) {
      int64_t r1 = r0 + j->rows_chunk < re ? r0 + j->rows_chunk : re, T = (r1 - r0) * j->tw;
      grad_transform(j, Z, r0, r1);
      if (j->d_w) {
        input_transform(j, V, r0, r1);
        for (int x = 0; x < 16; x++) { /* Note [Winograd weight gradient layout] */
          const float *Zx = Z + x * O * j->ld, *Vx = V + x * C * j->ld;
          float beta = first ? 0.0f : 1.0f, *dUx = dU + x * O * C;
          if (j->vt) {
            transpose_tiles(Vt, Vx, C, T, j->ld);
            ddp_cpu_gemm(DDP_F32, 0, 0, O, C, T, 1.0, Zx, j->ld, Vt, C, beta, dUx, C);
          } else {
            ddp_cpu_gemm(DDP_F32, 0, 1, O, C, T, 1.0, Zx, j->ld, Vx, j->ld, beta, dUx, C);
          }
        }
        first = 0;
      }
      if (j->d_in) {
        for (int x = 0; x < 16; x++)
          ddp_cpu_gemm(DDP_F32, 1, 0, C, T, O, 1.0, j->U + x * O * C, C, Z + x * O * j->ld,
                       j->ld, 0.0, dV + x * C * j->ld, j->ld);
        input_grad_transform(j, dV, r0, r1);
      }
    }
    if (dU && first) memset(dU, 0, sizeof(float) * (size_t)(16 * O * C));
  }
}

/* Run fn over the units: on the pool with OpenBLAS held at one thread meanwhile (one
 * chunk's GEMMs are too small to gain from its threads), or on this thread alone. */
static void run_units(wg_job *j, ddp_range_fn fn) {
  if (ddp_get_num_threads() > 1 && j->units > 1) {
    int blas_threads = ddp_cpu_blas_hold_single();
    ddp_parallel_for(j->units, 1, fn, j);
    ddp_cpu_blas_restore(blas_threads);
  } else {
    fn(j, 0, j->units);
  }
}

/* ---- entry points ------------------------------------------------------------------------ */

int ddp_cpu_winograd_fits(int dtype, const ddp_conv2d_geom *g) {
  return dtype == DDP_F32 && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 &&
         g->dh == 1 && g->dw == 1 && g->groups == 1 && g->c >= 1 && g->o >= 1 && g->n >= 1 &&
         g->oh >= 1 && g->ow >= 1;
}

int ddp_cpu_winograd_forward(float *out, const float *in, const float *w, const float *bias,
                             const ddp_conv2d_geom *g) {
  wg_job j = {.out = out, .in = in, .w = w, .bias = bias};
  plan(&j, g, 0);
  size_t u_bytes = sizeof(float) * (size_t)(16 * g->o * g->c);
  float *U = ddp_alloc(u_bytes);
  if (!U) return DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for Winograd weights");
  weights_transform(U, w, g->o, g->c, 1);
  j.U = U;
  pthread_mutex_init(&j.lock, NULL);
  run_units(&j, forward_units);
  pthread_mutex_destroy(&j.lock);
  ddp_free(U, u_bytes);
  return j.status;
}

/* d_b[o] += the sum of grad_out's plane o over the batch, for o in [begin, end): samples in
 * order, 8 partial sums a plane (the same for any thread count). */
static void bias_grad_range(void *ctx, int64_t begin, int64_t end) {
  wg_job *j = ctx;
  const ddp_conv2d_geom *g = j->g;
  int64_t L = g->oh * g->ow;
  for (int64_t o = begin; o < end; o++) {
    float total = 0;
    for (int64_t n = 0; n < g->n; n++) {
      const float *p = j->grad_out + (n * g->o + o) * L;
      __m256 acc = _mm256_setzero_ps();
      int64_t l = 0;
      for (; l + 8 <= L; l += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(p + l));
      float part[8], s = 0;
      _mm256_storeu_ps(part, acc);
      for (; l < L; l++) s += p[l];
      for (int q = 0; q < 8; q++) s += part[q];
      total += s;
    }
    j->d_b[o] += total;
  }
}

int ddp_cpu_winograd_backward(float *d_in, float *d_w, float *d_b, const float *grad_out,
                              const float *in, const float *w, const ddp_conv2d_geom *g) {
  wg_job j = {.d_in = d_in, .d_w = d_w, .d_b = d_b, .grad_out = grad_out, .in = in, .w = w};
  plan(&j, g, 1);
  pthread_mutex_init(&j.lock, NULL);
  if (d_b) ddp_parallel_for(g->o, 8, bias_grad_range, &j);
  size_t u_bytes = d_in ? sizeof(float) * (size_t)(16 * g->o * g->c) : 0;
  size_t du_bytes = d_w ? sizeof(float) * (size_t)(j.units * 16 * g->o * g->c) : 0;
  float *U = u_bytes ? ddp_alloc(u_bytes) : NULL;
  float *dU = du_bytes ? ddp_alloc(du_bytes) : NULL;
  if ((u_bytes && !U) || (du_bytes && !dU)) {
    j.status = DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for Winograd weights");
  } else if (d_in || d_w) {
    if (U) weights_transform(U, w, g->o, g->c, 0);
    j.U = U, j.dU_units = dU;
    run_units(&j, backward_units);
    if (dU && !j.status) {
      int64_t n = 16 * g->o * g->c;
      for (int64_t u = 1; u < j.units; u++) /* in unit order: see Note [Winograd chunks...] */
        for (int64_t i = 0; i < n; i++) dU[i] += dU[u * n + i];
      weights_grad_transform(d_w, dU, g->o, g->c);
    }
  }
  if (U) ddp_free(U, u_bytes);
  if (dU) ddp_free(dU, du_bytes);
  pthread_mutex_destroy(&j.lock);
  return j.status;
}
