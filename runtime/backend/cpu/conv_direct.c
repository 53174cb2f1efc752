/* runtime/backend/cpu/conv_direct.c: direct f32 conv2d kernels with register blocking, for
 * the shapes where im2col + GEMM is poor (ddp_cpu_conv_direct_applies): one input channel
 * (a network's first layer: the GEMM's inner dimension is only C kH kW = 9), and 3x3
 * stride 2 (ResNet downsampling: im2col copies, then small GEMMs). The kernels themselves
 * take any channel count, padding and stride (spec/ops/conv_direct_spec.lua); the choice
 * of shapes is a measured one.
 *
 * Each pass is written as loops of AVX2 FMAs on tiles of accumulators held in registers
 * (the blocking of Goto and van de Geijn's GEMM kernels applied to the convolution's own
 * loops, as in Georganas et al., "Anatomy of high-performance deep learning convolutions on
 * SIMD architectures", SC 2018), over one padded, phase-split copy of the input (Note
 * [direct panel]):
 *  - forward: a tile is FO output channels x FV vectors of 8 output pixels (4 x 3: 12
 *    accumulators); its loop runs over the C kH kW (channel, tap) pairs, each a broadcast
 *    weight times a vector loaded from the panel;
 *  - grad input: the adjoint of the forward loop. A tile is AQ (channel, tap) pairs x AV
 *    vectors (4 x 3), summed over the output channels in registers, then added into a
 *    gradient panel of the input's layout, which is folded back onto d_in;
 *  - grad weight: a tile is WO output channels x WQ (channel, tap) pairs (4 x 3), each
 *    accumulator a dot product over the samples of a chunk and their output pixels;
 *  - grad bias: sums of the output gradient.
 * All in f32 like the GEMMs they replace; the sums run in a different order than the GEMM's
 * (eight lanes, then a fixed tree), which changes the rounding, not the precision.
 *
 * Note [direct panel]: the input of one sample is copied, zero-padded, into a "panel": for
 * stride s, each channel is split into the s x s phases (py, px) of the padded input
 * (padded row ip = s r + py, column jp = s col + px), each an R x Wr plane. Output pixel
 * (oh, ow) and tap (ki, kj) read padded (s oh + ki, s ow + kj), which is phase
 * (ki mod s, kj mod s) at (oh + ki / s, ow + kj / s): with the phases split, eight
 * neighbouring outputs read eight neighbouring floats for every stride, so one unaligned
 * load serves a tap. A tap's place in the panel is a constant offset (qoff), the output
 * vector's another. Output rows are covered by OWv = OW rounded up to 8 (vectors never span
 * rows), so R = OH + (kH - 1) / s and Wr = OWv + (kW - 1) / s. Lanes past OW compute
 * garbage that the forward store masks off; the output gradient the backward kernels read
 * has zeros there (when OW is not a multiple of 8: a padded copy for the input gradient,
 * masked loads for the weight gradient), so they add nothing. Only the phases some tap
 * reads are stored (all four for 3x3 stride 2).
 *
 * Note [direct determinism]: DDP specs compare replicas bit for bit, and one process with
 * any thread count must give the same bits. The forward and the input gradient are per
 * sample, so any split is exact. The weight and bias gradients are summed per chunk of
 * samples whose size depends on the geometry only (direct_chunk), each chunk's partial
 * stored in its own slot, and the slots added in chunk order after the parallel loop. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/conv_direct.h"
#include "core/core.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

enum { VL = 8 };                      /* floats per AVX vector */
enum { FO = 4, FV = 3 };              /* forward tile: output channels x vectors */
enum { AQ = 4, AV = 3 };              /* grad-input tile: (channel, tap) pairs x vectors */
enum { WO = 4, WQ = 3 };              /* grad-weight tile: output channels x pairs */

/* The layout of one call (Note [direct panel]). */
typedef struct {
  const ddp_conv2d_geom *g;
  int64_t s;              /* stride, both directions */
  int64_t T, Q;           /* taps kH kW; (channel, tap) pairs C T */
  int64_t OWv, VR, NV;    /* output width rounded up to 8; vectors per row; per plane */
  int64_t R, Wr, plane;   /* rows, row length and size of one phase plane */
  int64_t chan, sample;   /* floats per channel (all stored phases) and per sample */
  int nslots;             /* phases stored */
  int slot[4];            /* slot of phase py s + px, or -1 */
  int64_t tail;           /* OW mod 8 */
  int64_t GW, GO, gsample;/* the gradient as the kernels read it: row, channel, sample strides */
  int64_t *qoff;          /* (Q) offset of (c, tap) in a sample's panel */
  int64_t *vx, *vo, *vg;  /* (NV) offset of output vector v in a panel, in an output plane
                             and in a gradient plane (kernels' layout) */
  char *vt;               /* (NV) 1 when vector v ends a row short of 8 (masked) */
  size_t tables_bytes;
} dplan;

int ddp_cpu_conv_direct_applies(int dtype, const ddp_conv2d_geom *g, int backward) {
  if (dtype != DDP_F32 || g->groups != 1 || g->dh != 1 || g->dw != 1) return 0;
  if (g->n < 1 || g->c < 1 || g->o < 1 || g->oh < 1 || g->ow < 1) return 0;
  if (g->sh != g->sw || g->kh != 3 || g->kw != 3) return 0;
  if (g->sh == 1) return g->c == 1;
  if (g->sh == 2) return backward ? g->c <= 16 && g->o <= 32 : g->c <= 64 && g->o <= 128;
  return 0;
}

static void plan_free(dplan *p) {
  if (p->qoff) ddp_free(p->qoff, p->tables_bytes);
  p->qoff = NULL;
}

static int plan_init(dplan *p, const ddp_conv2d_geom *g) {
  memset(p, 0, sizeof *p);
  p->g = g;
  p->s = g->sh;
  p->T = g->kh * g->kw;
  p->Q = g->c * p->T;
  p->OWv = (g->ow + VL - 1) / VL * VL;
  p->VR = p->OWv / VL;
  p->NV = g->oh * p->VR;
  p->R = g->oh + (g->kh - 1) / p->s;
  p->Wr = p->OWv + (g->kw - 1) / p->s;
  p->plane = p->R * p->Wr;
  for (int i = 0; i < 4; i++) p->slot[i] = -1;
  for (int64_t ki = 0; ki < g->kh; ki++)
    for (int64_t kj = 0; kj < g->kw; kj++) {
      int ph = (int)((ki % p->s) * p->s + kj % p->s);
      if (p->slot[ph] < 0) p->slot[ph] = p->nslots++;
    }
  p->chan = p->nslots * p->plane;
  p->sample = g->c * p->chan;
  p->tail = g->ow % VL;
  p->GW = p->tail ? p->OWv : g->ow;
  p->GO = g->oh * p->GW;
  p->gsample = g->o * p->GO;
  p->tables_bytes = sizeof(int64_t) * (size_t)(p->Q + 3 * p->NV) + (size_t)p->NV;
  p->qoff = ddp_alloc(p->tables_bytes);
  if (!p->qoff) return DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for the direct plan");
  p->vx = p->qoff + p->Q, p->vo = p->vx + p->NV, p->vg = p->vo + p->NV;
  p->vt = (char *)(p->vg + p->NV);
  for (int64_t v = 0; v < p->NV; v++) {
    int64_t oh = v / p->VR, jv = v % p->VR;
    p->vx[v] = oh * p->Wr + jv * VL;
    p->vo[v] = oh * g->ow + jv * VL;
    p->vg[v] = oh * p->GW + jv * VL;
    p->vt[v] = p->tail && jv == p->VR - 1;
  }
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t ki = 0; ki < g->kh; ki++)
      for (int64_t kj = 0; kj < g->kw; kj++) {
        int ph = (int)((ki % p->s) * p->s + kj % p->s);
        p->qoff[(c * g->kh + ki) * g->kw + kj] =
            c * p->chan + p->slot[ph] * p->plane + (ki / p->s) * p->Wr + kj / p->s;
      }
  return 0;
}

/* ---- panels ---------------------------------------------------------------------------- */

/* The lanes < n of a vector. */
static __m256i lanes_below(int64_t n) {
  int k = (int)(n < 0 ? 0 : n > VL ? VL : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}


/* Columns [*lo, *hi) of a phase row whose input column j = col s + px - pw lies in [0, W). */
static void phase_cols(const dplan *p, int64_t px, int64_t *lo, int64_t *hi) {
  int64_t s = p->s, pw = p->g->pw, W = p->g->w;
  int64_t l = pw - px > 0 ? (pw - px + s - 1) / s : 0;
  int64_t h = W - 1 + pw - px >= 0 ? (W - 1 + pw - px) / s + 1 : 0;
  if (h > p->Wr) h = p->Wr;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/* dst[k] = src[2 k] for k < n; `end` bounds what may be read past src[2 (n - 1)]. */
static void gather_even(float *restrict dst, const float *restrict src, int64_t n,
                        const float *end) {
  int64_t k = 0;
  for (; k + VL <= n && src + 2 * k + 2 * VL <= end; k += VL) {
    __m256 a = _mm256_loadu_ps(src + 2 * k), b = _mm256_loadu_ps(src + 2 * k + VL);
    __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)); /* a0 a2 b0 b2 | a4 a6 b4 b6 */
    e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    _mm256_storeu_ps(dst + k, e);
  }
  for (; k < n; k++) dst[k] = src[2 * k];
}

/* dst[k] = src[k] for k < n, without a call (rows are short). */
static void copy_row(float *restrict dst, const float *restrict src, int64_t n) {
  int64_t k = 0;
  for (; k + VL <= n; k += VL) _mm256_storeu_ps(dst + k, _mm256_loadu_ps(src + k));
  for (; k < n; k++) dst[k] = src[k];
}

/* The panel X (Note [direct panel]) of one sample's input x (C, H, W); `end` is the end of
 * the whole input, which bounds vector reads. */
static void panel_fill(float *restrict X, const float *restrict x, const dplan *p,
                       const float *end) {
  const ddp_conv2d_geom *g = p->g;
  int64_t s = p->s;
  memset(X, 0, sizeof(float) * (size_t)p->sample); /* padding, and rows no input reaches */
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t py = 0; py < s; py++)
      for (int64_t px = 0; px < s; px++) {
        int sl = p->slot[py * s + px];
        if (sl < 0) continue;
        int64_t lo, hi;
        phase_cols(p, px, &lo, &hi);
        if (hi <= lo) continue;
        for (int64_t r = 0; r < p->R; r++) {
          int64_t i = r * s + py - g->ph;
          if (i < 0 || i >= g->h) continue;
          float *d = X + c * p->chan + sl * p->plane + r * p->Wr + lo;
          const float *src = x + (c * g->h + i) * g->w + lo * s + px - g->pw;
          if (s == 1) copy_row(d, src, hi - lo);
          else if (s == 2) gather_even(d, src, hi - lo, end);
          else for (int64_t k = 0; k < hi - lo; k++) d[k] = src[k * s];
        }
      }
}

/* dst[2 k] += a[k], dst[2 k + 1] += b[k] for k < n (b NULL: zeros), except that dst[2 n - 1]
 * is left alone when `odd_end` (the row ends on an even column). Eight pairs a step; the
 * last step masked, so that nothing outside the pairs is read or written. */
static void interleave_add(float *restrict dst, const float *restrict a, const float *restrict b,
                           int64_t n, int odd_end) {
  int64_t m = 2 * n - (odd_end ? 1 : 0); /* floats of dst to update */
  __m256 zero = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += VL) {
    __m256 va, vb;
    if (n - k >= VL) {
      va = _mm256_loadu_ps(a + k), vb = b ? _mm256_loadu_ps(b + k) : zero;
    } else {
      __m256i mr = lanes_below(n - k);
      va = _mm256_maskload_ps(a + k, mr), vb = b ? _mm256_maskload_ps(b + k, mr) : zero;
    }
    __m256 lo = _mm256_unpacklo_ps(va, vb), hi = _mm256_unpackhi_ps(va, vb);
    __m256 o0 = _mm256_permute2f128_ps(lo, hi, 0x20), o1 = _mm256_permute2f128_ps(lo, hi, 0x31);
    float *d = dst + 2 * k;
    if (m - 2 * k >= 2 * VL) {
      _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), o0));
      _mm256_storeu_ps(d + VL, _mm256_add_ps(_mm256_loadu_ps(d + VL), o1));
    } else {
      __m256i m0 = lanes_below(m - 2 * k), m1 = lanes_below(m - 2 * k - VL);
      _mm256_maskstore_ps(d, m0, _mm256_add_ps(_mm256_maskload_ps(d, m0), o0));
      _mm256_maskstore_ps(d + VL, m1, _mm256_add_ps(_mm256_maskload_ps(d + VL, m1), o1));
    }
  }
}

/* d_in (C, H, W) of one sample += the gradient panel dX folded back (Note [direct panel]):
 * every input pixel some tap reads takes the value of its slot; padding is dropped. For
 * stride 2 a row of d_in interleaves the rows of two phases. */
static void panel_fold(float *restrict d, const float *restrict dX, const dplan *p) {
  const ddp_conv2d_geom *g = p->g;
  int64_t s = p->s;
  for (int64_t c = 0; c < g->c; c++)
    for (int64_t i = 0; i < g->h; i++) { /* d_in's rows in order: one pass over its memory */
      {
        int64_t ip = i + g->ph, py = ip % s, r = ip / s;
        if (r >= p->R) continue; /* read by no tap */
        float *row = d + (c * g->h + i) * g->w;
        if (s == 2) {
          /* both phases of this row at once: padded columns 2 col and 2 col + 1 */
          int s0 = p->slot[py * 2], s1 = p->slot[py * 2 + 1];
          if (s0 < 0 && s1 < 0) continue;
          const float *a = s0 >= 0 ? dX + c * p->chan + s0 * p->plane + r * p->Wr : NULL;
          const float *b = s1 >= 0 ? dX + c * p->chan + s1 * p->plane + r * p->Wr : NULL;
          /* input column j = jp - pw; the pairs start at the first even jp >= pw */
          int64_t j = 0, jp = g->pw;
          if (jp & 1) { /* a lone odd padded column first */
            if (b && jp / 2 < p->Wr) row[0] += b[jp / 2];
            j = 1, jp++;
          }
          int64_t col = jp / 2, pairs = (g->w - j + 1) / 2;
          if (col + pairs > p->Wr) pairs = p->Wr - col; /* beyond: read by no tap */
          if (pairs <= 0) continue;
          int odd_end = j + 2 * pairs > g->w;
          if (a) interleave_add(row + j, a + col, b ? b + col : NULL, pairs, odd_end);
          else {
            for (int64_t k = 0; k < pairs && j + 2 * k + 1 < g->w; k++)
              row[j + 2 * k + 1] += b[col + k];
          }
          continue;
        }
        for (int64_t px = 0; px < s; px++) {
          int sl = p->slot[py * s + px];
          if (sl < 0) continue;
          int64_t lo, hi;
          phase_cols(p, px, &lo, &hi);
          const float *src = dX + c * p->chan + sl * p->plane + r * p->Wr;
          float *dst = row + lo * s + px - g->pw;
          if (s == 1) for (int64_t k = lo; k < hi; k++) dst[k - lo] += src[k];
          else for (int64_t k = lo; k < hi; k++) dst[(k - lo) * s] += src[k];
        }
      }
    }
}

/* The output gradient of one sample (O, OH, OW) in the grad-input kernel's layout
 * (O, OH, GW): itself when OW is a multiple of 8, else a copy into G with zeros in the
 * lanes past OW. */
static const float *grad_view(float *G, const float *go, const dplan *p) {
  const ddp_conv2d_geom *g = p->g;
  if (!p->tail) return go;
  for (int64_t r = 0; r < g->o * g->oh; r++) {
    float *d = G + r * p->GW;
    copy_row(d, go + r * g->ow, g->ow);
    for (int64_t k = g->ow; k < p->GW; k++) d[k] = 0;
  }
  return G;
}

static float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

/* ---- forward tiles ------------------------------------------------------------------------ */

typedef struct {
  const dplan *p;
  const float *X;    /* panel of the sample */
  float *out;        /* (O, OH, OW) of the sample */
  const float *wf;   /* weights packed (O / FO blocks, Q, FO): a tile's FO per pair adjacent */
  const float *bias; /* (O) or NULL */
  __m256i mask;      /* the lanes < OW mod 8 */
} fwd_args;

/* Output channels o0 .. o0 + OB, vectors v0 .. v0 + VB of one sample. */
INLINE void fwd_tile(const int OB, const int VB, const fwd_args *a, int64_t o0, int64_t v0) {
  const dplan *p = a->p;
  int64_t L = p->g->oh * p->g->ow;
  const float *xp[FV];
  float *op[FV];
  int tl[FV];
  UNROLL
  for (int v = 0; v < VB; v++) {
    xp[v] = a->X + p->vx[v0 + v];
    op[v] = a->out + o0 * L + p->vo[v0 + v];
    tl[v] = p->vt[v0 + v];
  }
  __m256 acc[FO][FV];
  UNROLL
  for (int o = 0; o < OB; o++) {
    __m256 b = a->bias ? _mm256_set1_ps(a->bias[o0 + o]) : _mm256_setzero_ps();
    UNROLL
    for (int v = 0; v < VB; v++) acc[o][v] = b;
  }
  const int64_t *qoff = p->qoff, Q = p->Q;
  const float *wq = a->wf + o0 * Q;
  for (int64_t q = 0; q < Q; q++, wq += FO) {
    int64_t off = qoff[q];
    __m256 x[FV];
    UNROLL
    for (int v = 0; v < VB; v++) x[v] = _mm256_loadu_ps(xp[v] + off);
    UNROLL
    for (int o = 0; o < OB; o++) {
      __m256 wv = _mm256_broadcast_ss(wq + o);
      UNROLL
      for (int v = 0; v < VB; v++) acc[o][v] = _mm256_fmadd_ps(wv, x[v], acc[o][v]);
    }
  }
  UNROLL
  for (int o = 0; o < OB; o++)
    UNROLL
    for (int v = 0; v < VB; v++) {
      if (tl[v]) _mm256_maskstore_ps(op[v] + o * L, a->mask, acc[o][v]);
      else _mm256_storeu_ps(op[v] + o * L, acc[o][v]);
    }
}

/* The register blocks every tile kernel is instantiated for: (rows, vectors) from (4, 3) down
 * to (1, 1); the *_block dispatchers switch over this one list. */
#define REGISTER_BLOCKS(CASE)                                                               \
  CASE(4, 3) CASE(4, 2) CASE(4, 1) CASE(3, 3) CASE(3, 2) CASE(3, 1)                        \
  CASE(2, 3) CASE(2, 2) CASE(2, 1) CASE(1, 3) CASE(1, 2) CASE(1, 1)

static void fwd_block(int OB, int VB, const fwd_args *a, int64_t o0, int64_t v0) {
#define FWD_CASE(ob, vb) case ob * 8 + vb: fwd_tile(ob, vb, a, o0, v0); break;
  switch (OB * 8 + VB) { REGISTER_BLOCKS(FWD_CASE) }
#undef FWD_CASE
}

/* ---- grad-input tiles (the adjoint of the forward) ----------------------------------------- */

typedef struct {
  const dplan *p;
  float *dX;      /* gradient panel of the sample */
  const float *G; /* output gradient of the sample, (O, OH, GW) */
  const float *wa;/* weights packed (Q / AQ blocks, O, AQ): a tile's AQ per channel adjacent */
} adj_args;

/* dX at pairs q0 .. q0 + QB and vectors v0 .. v0 + VB += sum over o of w[o, q] G[o, v]. */
INLINE void adj_tile(const int QB, const int VB, const adj_args *a, int64_t q0, int64_t v0) {
  const dplan *p = a->p;
  int64_t O = p->g->o;
  const float *gp[AV];
  int64_t xo[AV];
  UNROLL
  for (int v = 0; v < VB; v++) {
    gp[v] = a->G + p->vg[v0 + v];
    xo[v] = p->vx[v0 + v];
  }
  __m256 acc[AQ][AV];
  UNROLL
  for (int q = 0; q < QB; q++)
    UNROLL
    for (int v = 0; v < VB; v++) acc[q][v] = _mm256_setzero_ps();
  const float *wo = a->wa + q0 * O;
  const int64_t GO = p->GO;
  for (int64_t o = 0; o < O; o++, wo += AQ) {
    __m256 gv[AV];
    UNROLL
    for (int v = 0; v < VB; v++) gv[v] = _mm256_loadu_ps(gp[v] + o * GO);
    UNROLL
    for (int q = 0; q < QB; q++) {
      __m256 wv = _mm256_broadcast_ss(wo + q);
      UNROLL
      for (int v = 0; v < VB; v++) acc[q][v] = _mm256_fmadd_ps(wv, gv[v], acc[q][v]);
    }
  }
  UNROLL
  for (int q = 0; q < QB; q++) {
    float *d = a->dX + p->qoff[q0 + q];
    UNROLL
    for (int v = 0; v < VB; v++)
      _mm256_storeu_ps(d + xo[v], _mm256_add_ps(_mm256_loadu_ps(d + xo[v]), acc[q][v]));
  }
}

static void adj_block(int QB, int VB, const adj_args *a, int64_t q0, int64_t v0) {
#define ADJ_CASE(qb, vb) case qb * 8 + vb: adj_tile(qb, vb, a, q0, v0); break;
  switch (QB * 8 + VB) { REGISTER_BLOCKS(ADJ_CASE) }
#undef ADJ_CASE
}

/* ---- grad-weight tiles ----------------------------------------------------------------------- */

typedef struct {
  const dplan *p;
  const float *X;       /* panels of the chunk's samples, p->sample floats apart */
  const float *G;       /* output gradient of the chunk's first sample, (O, OH, OW) */
  int64_t ns;           /* samples in the chunk */
  float *part;          /* (O, Q): this chunk's weight gradient */
  __m256i mask;         /* the lanes < OW mod 8 */
} dw_args;

/* One output vector of a grad-weight tile: G loaded by LOADG(pointer). */
#define DW_STEP(LOADG)                                                                      \
  do {                                                                                      \
    __m256 x[WQ];                                                                           \
    UNROLL                                                                                  \
    for (int q = 0; q < QB; q++) x[q] = _mm256_loadu_ps(xr + qo[q]);                        \
    UNROLL                                                                                  \
    for (int o = 0; o < OB; o++) {                                                          \
      __m256 gv = LOADG(gr + o * L);                                                        \
      UNROLL                                                                                \
      for (int q = 0; q < QB; q++) acc[o][q] = _mm256_fmadd_ps(gv, x[q], acc[o][q]);        \
    }                                                                                       \
  } while (0)
#define LOAD_FULL(ptr) _mm256_loadu_ps(ptr)
#define LOAD_TAIL(ptr) _mm256_maskload_ps(ptr, mask)

/* part[o, q] = sum over the chunk's samples and output pixels of G[o, pix] X[q, pix] for
 * o0 .. o0 + OB, q0 .. q0 + QB. The last vector of a row is loaded masked when OW is not a
 * multiple of 8 (the panel's lanes past OW are then multiplied by zeros). */
INLINE void dw_tile(const int OB, const int QB, const dw_args *a, int64_t o0, int64_t q0) {
  const dplan *p = a->p;
  __m256 acc[WO][WQ];
  UNROLL
  for (int o = 0; o < OB; o++)
    UNROLL
    for (int q = 0; q < QB; q++) acc[o][q] = _mm256_setzero_ps();
  int64_t qo[WQ];
  UNROLL
  for (int q = 0; q < QB; q++) qo[q] = p->qoff[q0 + q];
  const int64_t OH = p->g->oh, OW = p->g->ow, L = OH * OW, NV = p->NV, ns = a->ns;
  const int64_t Wr = p->Wr, full = OW / VL, *vx = p->vx;
  const __m256i mask = a->mask;
  for (int64_t n = 0; n < ns; n++) {
    const float *Gn = a->G + (n * p->g->o + o0) * L, *Xn = a->X + n * p->sample;
    if (!p->tail) { /* one flat loop: rows of 8 would pay a loop exit per vector */
      for (int64_t v = 0; v < NV; v++) {
        const float *gr = Gn + v * VL, *xr = Xn + vx[v];
        DW_STEP(LOAD_FULL);
      }
    } else { /* rows: full vectors, then the masked one */
      for (int64_t oh = 0; oh < OH; oh++) {
        const float *gr = Gn + oh * OW, *xr = Xn + oh * Wr;
        for (int64_t jv = 0; jv < full; jv++, gr += VL, xr += VL) DW_STEP(LOAD_FULL);
        DW_STEP(LOAD_TAIL);
      }
    }
  }
  UNROLL
  for (int o = 0; o < OB; o++)
    UNROLL
    for (int q = 0; q < QB; q++) a->part[(o0 + o) * p->Q + q0 + q] = hsum8(acc[o][q]);
}
#undef DW_STEP
#undef LOAD_FULL
#undef LOAD_TAIL

static void dw_block(int OB, int QB, const dw_args *a, int64_t o0, int64_t q0) {
#define DW_CASE(ob, qb) case ob * 8 + qb: dw_tile(ob, qb, a, o0, q0); break;
  switch (OB * 8 + QB) { REGISTER_BLOCKS(DW_CASE) }
#undef DW_CASE
}

/* ---- passes ------------------------------------------------------------------------------- */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Work shared by the threads of one call. */
typedef struct {
  dplan p;
  const float *in, *bias, *grad_out, *in_end;
  float *out, *d_in;
  float *wf, *wa;         /* packed weights (fwd_args, adj_args) */
  int want_dw, want_db;
  int64_t chunk, nchunks; /* Note [direct determinism] */
  float *parts;           /* (nchunks, O Q + O): each chunk's weight and bias gradient */
  int oom;                /* set by a thread whose scratch could not be allocated */
} djob;

static void forward_range(void *vctx, int64_t begin, int64_t end) {
  djob *j = vctx;
  const dplan *p = &j->p;
  const ddp_conv2d_geom *g = p->g;
  size_t bytes = sizeof(float) * (size_t)p->sample;
  float *X = ddp_alloc(bytes);
  if (!X) {
    __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
    return;
  }
  fwd_args a = {.p = p, .X = X, .wf = j->wf, .bias = j->bias, .mask = lanes_below(p->tail)};
  /* Keep in L1 whichever is smaller: all the weights (vectors outer) or the panel */
  int vectors_outer = p->Q * g->o <= p->sample;
  for (int64_t n = begin; n < end; n++) {
    panel_fill(X, j->in + n * g->c * g->h * g->w, p, j->in_end);
    a.out = j->out + n * g->o * g->oh * g->ow;
    if (vectors_outer) {
      for (int64_t v0 = 0; v0 < p->NV; v0 += FV)
        for (int64_t o0 = 0; o0 < g->o; o0 += FO)
          fwd_block((int)min64(FO, g->o - o0), (int)min64(FV, p->NV - v0), &a, o0, v0);
    } else {
      for (int64_t o0 = 0; o0 < g->o; o0 += FO)
        for (int64_t v0 = 0; v0 < p->NV; v0 += FV)
          fwd_block((int)min64(FO, g->o - o0), (int)min64(FV, p->NV - v0), &a, o0, v0);
    }
  }
  ddp_free(X, bytes);
}

/* Chunks [begin, end) of samples: input gradient per sample, weight and bias gradient per
 * chunk into its slot of j->parts. */
static void backward_range(void *vctx, int64_t begin, int64_t end) {
  djob *j = vctx;
  const dplan *p = &j->p;
  const ddp_conv2d_geom *g = p->g;
  int64_t cs = j->chunk, O = g->o, L = g->oh * g->ow;
  size_t x_bytes = sizeof(float) * (size_t)(j->want_dw ? cs * p->sample : 0);
  size_t g_bytes = sizeof(float) * (size_t)(j->d_in && p->tail ? p->gsample : 0);
  size_t dx_bytes = sizeof(float) * (size_t)(j->d_in ? p->sample : 0);
  size_t total = x_bytes + g_bytes + dx_bytes;
  char *base = ddp_alloc(total);
  if (!base) {
    __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
    return;
  }
  float *X = (float *)base, *Gbuf = (float *)(base + x_bytes);
  float *dX = (float *)(base + x_bytes + g_bytes);
  for (int64_t ch = begin; ch < end; ch++) {
    int64_t n0 = ch * cs, ns = min64(cs, g->n - n0);
    float *part = j->parts + ch * (O * p->Q + O);
    for (int64_t k = 0; k < ns; k++) {
      if (j->want_dw)
        panel_fill(X + k * p->sample, j->in + (n0 + k) * g->c * g->h * g->w, p, j->in_end);
      if (j->d_in) {
        memset(dX, 0, dx_bytes);
        adj_args a = {.p = p, .dX = dX, .wa = j->wa,
                      .G = grad_view(Gbuf, j->grad_out + (n0 + k) * O * L, p)};
        for (int64_t q0 = 0; q0 < p->Q; q0 += AQ)
          for (int64_t v0 = 0; v0 < p->NV; v0 += AV)
            adj_block((int)min64(AQ, p->Q - q0), (int)min64(AV, p->NV - v0), &a, q0, v0);
        panel_fold(j->d_in + (n0 + k) * g->c * g->h * g->w, dX, p);
      }
    }
    if (j->want_dw) {
      dw_args a = {.p = p, .X = X, .G = j->grad_out + n0 * O * L, .ns = ns, .part = part,
                   .mask = lanes_below(p->tail)};
      for (int64_t o0 = 0; o0 < O; o0 += WO)
        for (int64_t q0 = 0; q0 < p->Q; q0 += WQ)
          dw_block((int)min64(WO, O - o0), (int)min64(WQ, p->Q - q0), &a, o0, q0);
    }
    if (j->want_db) {
      float *db = part + O * p->Q;
      for (int64_t o = 0; o < O; o++) { /* four independent sums hide the add latency */
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        float rest = 0;
        for (int64_t k = 0; k < ns; k++) {
          const float *x = j->grad_out + ((n0 + k) * O + o) * L;
          int64_t i = 0;
          for (; i + 4 * VL <= L; i += 4 * VL)
            for (int u = 0; u < 4; u++)
              acc[u] = _mm256_add_ps(acc[u], _mm256_loadu_ps(x + i + u * VL));
          for (; i + VL <= L; i += VL) acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(x + i));
          for (; i < L; i++) rest += x[i];
        }
        db[o] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]),
                                    _mm256_add_ps(acc[2], acc[3]))) + rest;
      }
    }
  }
  ddp_free(base, total);
}

/* Samples per weight-gradient chunk: enough output vectors that each tile's horizontal sums
 * are a small share of its work, few enough that a chunk's panels stay in cache and the
 * chunks spread over threads. A function of the geometry only (Note [direct determinism]). */
static int64_t direct_chunk(const dplan *p) {
  int64_t cs = (256 + p->NV - 1) / p->NV;
  return cs < 1 ? 1 : cs > 16 ? 16 : cs;
}

int ddp_cpu_conv_direct_forward(float *out, const float *in, const float *w, const float *bias,
                                const ddp_conv2d_geom *g) {
  djob j = {.in = in, .bias = bias, .out = out, .in_end = in + g->n * g->c * g->h * g->w};
  DDP_TRY(plan_init(&j.p, g));
  int64_t Q = j.p.Q, Op = (g->o + FO - 1) / FO * FO;
  size_t wf_bytes = sizeof(float) * (size_t)(Op * Q);
  j.wf = ddp_alloc(wf_bytes);
  if (!j.wf) {
    plan_free(&j.p);
    DDP_FAIL(DDP_ERR_MEMORY, "conv2d: out of memory for %zu bytes of direct weights", wf_bytes);
  }
  for (int64_t o = 0; o < Op; o++) /* (O, Q) -> (O / FO, Q, FO) */
    for (int64_t q = 0; q < Q; q++)
      j.wf[(o / FO * Q + q) * FO + o % FO] = o < g->o ? w[o * Q + q] : 0;
  ddp_parallel_for(g->n, 1, forward_range, &j);
  ddp_free(j.wf, wf_bytes);
  plan_free(&j.p);
  if (j.oom) DDP_FAIL(DDP_ERR_MEMORY, "conv2d: out of memory for the direct kernels' scratch");
  return 0;
}

int ddp_cpu_conv_direct_backward(float *d_in, float *d_w, float *d_b, const float *grad_out,
                                 const float *in, const float *w, const ddp_conv2d_geom *g) {
  if (!d_in && !d_w && !d_b) return 0;
  djob j = {.in = in, .grad_out = grad_out, .d_in = d_in, .want_dw = d_w != NULL,
            .want_db = d_b != NULL, .in_end = in + g->n * g->c * g->h * g->w};
  DDP_TRY(plan_init(&j.p, g));
  int64_t O = g->o, Q = j.p.Q, Qp = d_in ? (Q + AQ - 1) / AQ * AQ : 0;
  j.chunk = direct_chunk(&j.p);
  j.nchunks = (g->n + j.chunk - 1) / j.chunk;
  size_t parts_bytes = sizeof(float) * (size_t)(j.nchunks * (O * Q + O));
  size_t wa_bytes = sizeof(float) * (size_t)(Qp * O);
  j.parts = ddp_alloc(parts_bytes + wa_bytes);
  if (!j.parts) {
    plan_free(&j.p);
    DDP_FAIL(DDP_ERR_MEMORY, "conv2d backward: out of memory for %zu bytes of direct scratch",
             parts_bytes + wa_bytes);
  }
  j.wa = j.parts + j.nchunks * (O * Q + O);
  for (int64_t q = 0; q < Qp; q++) /* (O, Q) -> (Q / AQ, O, AQ) */
    for (int64_t o = 0; o < O; o++)
      j.wa[(q / AQ * O + o) * AQ + q % AQ] = q < Q ? w[o * Q + q] : 0;
  ddp_parallel_for(j.nchunks, 1, backward_range, &j);
  if (!j.oom) { /* Note [direct determinism]: the chunks' partials in chunk order */
    for (int64_t ch = 0; ch < j.nchunks; ch++) {
      const float *part = j.parts + ch * (O * Q + O);
      if (d_w) for (int64_t i = 0; i < O * Q; i++) d_w[i] += part[i];
      if (d_b) for (int64_t i = 0; i < O; i++) d_b[i] += part[O * Q + i];
    }
  }
  ddp_free(j.parts, parts_bytes + wa_bytes);
  plan_free(&j.p);
  if (j.oom)
    DDP_FAIL(DDP_ERR_MEMORY, "conv2d backward: out of memory for the direct kernels' scratch");
  return 0;
}
