/* runtime/backend/cpu/conv.c: conv2d forward and backward.
 *
 * Two algorithms, both ending in GEMMs:
 *  - im2col (Chellapilla, Puri, Simard: "High performance convolutional neural networks for
 *    document processing", 2006), any geometry: for one sample and one group the input
 *    patches are unfolded into cols (C/g kH kW, OH OW), so that
 *      out (O/g, OH OW)     = W (O/g, C/g kH kW) · cols
 *      dW  (O/g, C/g kH kW) += grad (O/g, OH OW) · colsᵀ
 *      dcols                = Wᵀ · grad, folded back onto the input ("col2im").
 *    A 1x1 kernel with stride 1 and no padding needs no unfolding: cols is the input.
 *  - Winograd F(2x2, 3x3) for 3x3 kernels, stride 1, dilation 1, one group and at least 8
 *    channels in and out (below). 2.25x fewer multiply-adds; for the Fashion-MNIST CNN's
 *    second layer (64 x 32 x 14 x 14 -> 64 channels) forward + backward took ~15 ms of CPU
 *    against ~25 ms for im2col on this machine's cores.
 *
 * Threads: samples are split over the runtime's pool, each thread with its own scratch and
 * its own weight-gradient sum (added up under a lock at the end), while OpenBLAS is held at
 * one thread for the duration. The per-sample GEMMs are small (64 x 196 x 288 for that
 * layer), so this beat running the samples one after another with OpenBLAS threading each
 * GEMM: ~11.5 ms against ~17 ms for that layer's forward + backward on 2 cores. Holding
 * OpenBLAS at one thread is a process-wide setting: a BLAS call made meanwhile by another
 * thread runs single-threaded too. */
#include <immintrin.h>
#include <pthread.h>

#include "backend/cpu/conv.h"
#include "backend/cpu/conv_direct.h"
#include "backend/cpu/matmul.h"
#include "core/core.h"

/* Valid output columns [*lo, *hi) for which iw = ow * sw + off lies in [0, W). */
static void valid_range(int64_t off, int64_t sw, int64_t W, int64_t OW, int64_t *lo, int64_t *hi) {
  int64_t l = off >= 0 ? 0 : (-off + sw - 1) / sw;
  int64_t h = W - 1 - off < 0 ? 0 : (W - 1 - off) / sw + 1;
  if (h > OW) h = OW;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

#define IM2COL(T)                                                                                \
  /* cols (Cg kH kW, OH OW) from one sample's group of channels in (Cg, H, W) */                 \
  /* One row of cols when stride is 1 and OW == W: the plane shifted by (dy, off) is one         \
   * contiguous block; only the lo and OW - hi border columns of each line need zeros. */        \
  static void im2col_shift_##T(T *row, const T *plane, int64_t dy, int64_t off, int64_t lo,      \
                               int64_t hi, const ddp_conv2d_geom *g) {                           \
    int64_t ow_n = g->ow;                                                                        \
    int64_t oh_lo = dy < 0 ? -dy : 0, oh_hi = g->h - dy < g->oh ? g->h - dy : g->oh;             \
    if (oh_hi < oh_lo) oh_hi = oh_lo;                                                            \
    memset(row, 0, sizeof(T) * (size_t)(oh_lo * ow_n));                                          \
    memset(row + oh_hi * ow_n, 0, sizeof(T) * (size_t)((g->oh - oh_hi) * ow_n));                 \
    if (oh_hi == oh_lo || hi <= lo) {                                                            \
      memset(row + oh_lo * ow_n, 0, sizeof(T) * (size_t)((oh_hi - oh_lo) * ow_n));               \
      return;                                                                                    \
    }                                                                                            \
    int64_t first = oh_lo * ow_n + lo, last = (oh_hi - 1) * ow_n + hi; /* [first, last) */       \
    memcpy(row + first, plane + (oh_lo + dy) * g->w + off + lo,                                  \
           sizeof(T) * (size_t)(last - first));                                                  \
    for (int64_t oh = oh_lo; oh < oh_hi; oh++) {                                                 \
      T *r = row + oh * ow_n;                                                                    \
      for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                             \
      for (int64_t ow = hi; ow < ow_n; ow++) r[ow] = 0;                                          \
    }                                                                                            \
  }                                                                                              \
  static void im2col_##T(T *cols, const T *in, int64_t cg, const ddp_conv2d_geom *g) {           \
    int64_t L = g->oh * g->ow;                                                                   \
    int same_width = g->sh == 1 && g->sw == 1 && g->ow == g->w;                                  \
    for (int64_t c = 0; c < cg; c++)                                                             \
      for (int64_t ki = 0; ki < g->kh; ki++)                                                     \
        for (int64_t kj = 0; kj < g->kw; kj++) {                                                 \
          T *row = cols + ((c * g->kh + ki) * g->kw + kj) * L;                                   \
          int64_t off = kj * g->dw - g->pw, lo, hi;                                              \
          valid_range(off, g->sw, g->w, g->ow, &lo, &hi);                                        \
          if (same_width) {                                                                      \
            im2col_shift_##T(row, in + c * g->h * g->w, ki * g->dh - g->ph, off, lo, hi, g);     \
            continue;                                                                            \
          }                                                                                      \
          for (int64_t oh = 0; oh < g->oh; oh++) {                                               \
            T *r = row + oh * g->ow;                                                             \
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                        \
            if (ih < 0 || ih >= g->h) {                                                          \
              for (int64_t ow = 0; ow < g->ow; ow++) r[ow] = 0;                                  \
              continue;                                                                          \
            }                                                                                    \
            const T *src = in + (c * g->h + ih) * g->w + off;                                    \
            for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                       \
            if (g->sw == 1)                                                                      \
              for (int64_t ow = lo; ow < hi; ow++) r[ow] = src[ow];                              \
            else                                                                                 \
              for (int64_t ow = lo; ow < hi; ow++) r[ow] = src[ow * g->sw];                      \
            for (int64_t ow = hi; ow < g->ow; ow++) r[ow] = 0;                                   \
          }                                                                                      \
        }                                                                                        \
  }                                                                                              \
  /* d_in (Cg, H, W) += the patches of dcols (Cg kH kW, OH OW) put back in place */              \
  static void col2im_##T(T *d_in, const T *dcols, int64_t cg, const ddp_conv2d_geom *g) {        \
    int64_t L = g->oh * g->ow;                                                                   \
    for (int64_t c = 0; c < cg; c++)                                                             \
      for (int64_t ki = 0; ki < g->kh; ki++)                                                     \
        for (int64_t kj = 0; kj < g->kw; kj++) {                                                 \
          const T *row = dcols + ((c * g->kh + ki) * g->kw + kj) * L;                            \
          int64_t off = kj * g->dw - g->pw, lo, hi;                                              \
          valid_range(off, g->sw, g->w, g->ow, &lo, &hi);                                        \
          for (int64_t oh = 0; oh < g->oh; oh++) {                                               \
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                        \
            if (ih < 0 || ih >= g->h) continue;                                                  \
            const T *r = row + oh * g->ow;                                                       \
            T *dst = d_in + (c * g->h + ih) * g->w + off;                                        \
            if (g->sw == 1)                                                                      \
              for (int64_t ow = lo; ow < hi; ow++) dst[ow] += r[ow];                             \
            else                                                                                 \
              for (int64_t ow = lo; ow < hi; ow++) dst[ow * g->sw] += r[ow];                     \
          }                                                                                      \
        }                                                                                        \
  }
IM2COL(float)
IM2COL(double)

static void im2col(int dtype, void *cols, const void *in, int64_t cg, const ddp_conv2d_geom *g) {
  if (dtype == DDP_F32) im2col_float(cols, in, cg, g);
  else im2col_double(cols, in, cg, g);
}

static void col2im(int dtype, void *d_in, const void *dcols, int64_t cg, const ddp_conv2d_geom *g) {
  if (dtype == DDP_F32) col2im_float(d_in, dcols, cg, g);
  else col2im_double(d_in, dcols, cg, g);
}

/* sums[r] += sum of row r of x (rows, len); eight partial sums per row so the compiler can
 * vectorise without reassociating. */
#define ROW_SUMS(T)                                                                              \
  static void row_sums_##T(T *sums, const T *x, int64_t rows, int64_t len) {                     \
    for (int64_t r = 0; r < rows; r++) {                                                         \
      const T *p = x + r * len;                                                                  \
      T acc[8] = {0};                                                                            \
      int64_t l = 0;                                                                             \
      for (; l + 8 <= len; l += 8)                                                               \
        for (int q = 0; q < 8; q++) acc[q] += p[l + q];                                          \
      T s = 0;                                                                                   \
      for (; l < len; l++) s += p[l];                                                            \
      for (int q = 0; q < 8; q++) s += acc[q];                                                   \
      sums[r] += s;                                                                              \
    }                                                                                            \
  }
ROW_SUMS(float)
ROW_SUMS(double)

static void row_sums(int dtype, void *sums, const void *x, int64_t rows, int64_t len) {
  if (dtype == DDP_F32) row_sums_float(sums, x, rows, len);
  else row_sums_double(sums, x, rows, len);
}

/* 1 when cols would equal the input: 1x1 kernel, stride 1, no padding. */
static int is_pointwise(const ddp_conv2d_geom *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* Work shared by the threads of one call. */
typedef struct {
  int dtype;
  size_t es;
  const ddp_conv2d_geom *g;
  char *out, *d_in, *d_w, *d_b;
  const char *in, *w, *bias, *grad_out;
  const char *wg_u;     /* Winograd: transformed weights (16, O, C) */
  char *wg_du;          /* Winograd: their gradient (16, O, C), summed over threads */
  pthread_mutex_t lock; /* guards d_w, d_b, wg_du and status */
  int status;
} conv_job;

static void set_status(conv_job *j, int status) {
  pthread_mutex_lock(&j->lock);
  if (!j->status) j->status = status;
  pthread_mutex_unlock(&j->lock);
}

static void fill_rows(int dtype, void *dst, const void *values, int64_t rows, int64_t len) {
  for (int64_t r = 0; r < rows; r++) {
    if (dtype == DDP_F32) {
      float v = ((const float *)values)[r], *d = (float *)dst + r * len;
      for (int64_t i = 0; i < len; i++) d[i] = v;
    } else {
      double v = ((const double *)values)[r], *d = (double *)dst + r * len;
      for (int64_t i = 0; i < len; i++) d[i] = v;
    }
  }
}

/* Forward for samples [begin, end). */
static void forward_range(void *vctx, int64_t begin, int64_t end) {
  conv_job *j = vctx;
  const ddp_conv2d_geom *g = j->g;
  int64_t cg = g->c / g->groups, og = g->o / g->groups, ck = cg * g->kh * g->kw;
  int64_t L = g->oh * g->ow, HW = g->h * g->w;
  int pointwise = is_pointwise(g);
  size_t cols_bytes = pointwise ? 0 : (size_t)(ck * L) * j->es;
  char *cols = cols_bytes ? ddp_alloc(cols_bytes) : NULL;
  if (cols_bytes && !cols) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY,
                            "conv2d: out of memory for %zu bytes of im2col scratch",
                                cols_bytes));
    return;
  }
  for (int64_t n = begin; n < end; n++)
    for (int64_t grp = 0; grp < g->groups; grp++) {
      const char *in_g = j->in + (size_t)((n * g->c + grp * cg) * HW) * j->es;
      char *out_g = j->out + (size_t)((n * g->o + grp * og) * L) * j->es;
      if (j->bias) fill_rows(j->dtype, out_g, j->bias + (size_t)(grp * og) * j->es, og, L);
      if (ck == 0) {
        if (!j->bias) memset(out_g, 0, (size_t)(og * L) * j->es);
        continue;
      }
      const char *src = in_g;
      if (!pointwise) {
        im2col(j->dtype, cols, in_g, cg, g);
        src = cols;
      }
      ddp_cpu_gemm(j->dtype, 0, 0, og, L, ck, 1.0, j->w + (size_t)(grp * og * ck) * j->es, ck,
                   src, L, j->bias ? 1.0 : 0.0, out_g, L);
    }
  if (cols) ddp_free(cols, cols_bytes);
}

/* Backward for samples [begin, end): d_in directly (samples are disjoint), d_w and d_b into
 * private sums added under the lock at the end. */
static void backward_range(void *vctx, int64_t begin, int64_t end) {
  conv_job *j = vctx;
  const ddp_conv2d_geom *g = j->g;
  int64_t cg = g->c / g->groups, og = g->o / g->groups, ck = cg * g->kh * g->kw;
  int64_t L = g->oh * g->ow, HW = g->h * g->w;
  int pointwise = is_pointwise(g);
  size_t cols_bytes = (pointwise || ck == 0) ? 0 : (size_t)(ck * L) * j->es;
  size_t dcols_bytes = j->d_in ? cols_bytes : 0;
  size_t dw_bytes = j->d_w ? (size_t)(g->o * ck) * j->es : 0;
  size_t db_bytes = j->d_b ? (size_t)g->o * j->es : 0;
  char *cols = (j->d_w && cols_bytes) ? ddp_alloc(cols_bytes) : NULL;
  char *dcols = dcols_bytes ? ddp_alloc(dcols_bytes) : NULL;
  char *dw = dw_bytes ? ddp_alloc(dw_bytes) : NULL;
  char *db = db_bytes ? ddp_alloc(db_bytes) : NULL;
  if ((j->d_w && cols_bytes && !cols) || (dcols_bytes && !dcols) || (dw_bytes && !dw) ||
      (db_bytes && !db)) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for scratch"));
    goto done;
  }
  if (dw) memset(dw, 0, dw_bytes);
  if (db) memset(db, 0, db_bytes);
  for (int64_t n = begin; n < end; n++)
    for (int64_t grp = 0; grp < g->groups; grp++) {
      const char *in_g = j->in + (size_t)((n * g->c + grp * cg) * HW) * j->es;
      const char *go = j->grad_out + (size_t)((n * g->o + grp * og) * L) * j->es;
      if (db) row_sums(j->dtype, db + (size_t)(grp * og) * j->es, go, og, L);
      if (ck == 0 || L == 0) continue;
      if (dw) {
        const char *src = in_g;
        if (!pointwise) {
          im2col(j->dtype, cols, in_g, cg, g);
          src = cols;
        }
        ddp_cpu_gemm(j->dtype, 0, 1, og, ck, L, 1.0, go, L, src, L, 1.0,
                     dw + (size_t)(grp * og * ck) * j->es, ck);
      }
      if (j->d_in) {
        const char *wg = j->w + (size_t)(grp * og * ck) * j->es;
        char *d_in_g = j->d_in + (size_t)((n * g->c + grp * cg) * HW) * j->es;
        if (pointwise) {
          ddp_cpu_gemm(j->dtype, 1, 0, ck, L, og, 1.0, wg, ck, go, L, 1.0, d_in_g, L);
        } else {
          ddp_cpu_gemm(j->dtype, 1, 0, ck, L, og, 1.0, wg, ck, go, L, 0.0, dcols, L);
          col2im(j->dtype, d_in_g, dcols, cg, g);
        }
      }
    }
  pthread_mutex_lock(&j->lock);
  if (dw) {
    if (j->dtype == DDP_F32)
      for (int64_t i = 0; i < g->o * ck; i++) ((float *)j->d_w)[i] += ((float *)dw)[i];
    else
      for (int64_t i = 0; i < g->o * ck; i++) ((double *)j->d_w)[i] += ((double *)dw)[i];
  }
  if (db) {
    if (j->dtype == DDP_F32)
      for (int64_t i = 0; i < g->o; i++) ((float *)j->d_b)[i] += ((float *)db)[i];
    else
      for (int64_t i = 0; i < g->o; i++) ((double *)j->d_b)[i] += ((double *)db)[i];
  }
  pthread_mutex_unlock(&j->lock);
done:
  if (cols) ddp_free(cols, cols_bytes);
  if (dcols) ddp_free(dcols, dcols_bytes);
  if (dw) ddp_free(dw, dw_bytes);
  if (db) ddp_free(db, db_bytes);
}

/* ---- Winograd F(2x2, 3x3) ------------------------------------------------------------------
 *
 * Lavin, Gray: "Fast algorithms for convolutional neural networks" (CVPR 2016). For 3x3
 * kernels with stride 1 and dilation 1, each 2x2 output tile is
 *   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A
 * for the 4x4 input tile d around it, so the 9 multiply-adds per output and input channel
 * become 16 per 4 outputs (2.25x fewer). The transforms work on channels-last copies
 * (vectors of C or O values per position, so they vectorise), laid out as U (16, O, C),
 * V (16, tiles, C) and M (16, tiles, O): the products are 16 GEMMs M = V · Uᵀ. Backward
 * differentiates the same formula: Z = A dY Aᵀ, dU = Zᵀ · V (then dg = Gᵀ dU G),
 * dV = Z · U (then dd = B dV Bᵀ). Exact in exact arithmetic; in f32 the error stays within
 * a few ulps of the sums (the transforms only add and halve). */

enum { WG_TILES_PER_CHUNK = 256 }; /* tiles per GEMM batch: V and M stay in cache */

#define WINOGRAD(T)                                                                              \
  /* U (16, O, C) = G g Gᵀ for every 3x3 filter g of w (O, C, 3, 3) */                           \
  static void wg_weights_##T(T *U, const T *w, int64_t O, int64_t C) {                           \
    for (int64_t o = 0; o < O; o++)                                                              \
      for (int64_t c = 0; c < C; c++) {                                                          \
        const T *g = w + (o * C + c) * 9;                                                        \
        T u[4][3];                                                                               \
        for (int j = 0; j < 3; j++) {                                                            \
          u[0][j] = g[j];                                                                        \
          u[1][j] = (g[j] + g[3 + j] + g[6 + j]) * (T)0.5;                                       \
          u[2][j] = (g[j] - g[3 + j] + g[6 + j]) * (T)0.5;                                       \
          u[3][j] = g[6 + j];                                                                    \
        }                                                                                        \
        for (int i = 0; i < 4; i++) {                                                            \
          T v[4] = {u[i][0], (u[i][0] + u[i][1] + u[i][2]) * (T)0.5,                             \
                    (u[i][0] - u[i][1] + u[i][2]) * (T)0.5, u[i][2]};                            \
          for (int j = 0; j < 4; j++) U[((i * 4 + j) * O + o) * C + c] = v[j];                   \
        }                                                                                        \
      }                                                                                          \
  }                                                                                              \
  /* dw (O, C, 3, 3) += Gᵀ dU G for dU (16, O, C) */                                             \
  static void wg_weights_grad_##T(T *dw, const T *dU, int64_t O, int64_t C) {                    \
    for (int64_t o = 0; o < O; o++)                                                              \
      for (int64_t c = 0; c < C; c++) {                                                          \
        T d[4][4], r[3][4];                                                                      \
        for (int i = 0; i < 4; i++)                                                              \
          for (int j = 0; j < 4; j++) d[i][j] = dU[((i * 4 + j) * O + o) * C + c];               \
        for (int j = 0; j < 4; j++) {                                                            \
          r[0][j] = d[0][j] + (d[1][j] + d[2][j]) * (T)0.5;                                      \
          r[1][j] = (d[1][j] - d[2][j]) * (T)0.5;                                                \
          r[2][j] = (d[1][j] + d[2][j]) * (T)0.5 + d[3][j];                                      \
        }                                                                                        \
        T *g = dw + (o * C + c) * 9;                                                             \
        for (int k = 0; k < 3; k++) {                                                            \
          g[k * 3 + 0] += r[k][0] + (r[k][1] + r[k][2]) * (T)0.5;                                \
          g[k * 3 + 1] += (r[k][1] - r[k][2]) * (T)0.5;                                          \
          g[k * 3 + 2] += (r[k][1] + r[k][2]) * (T)0.5 + r[k][3];                                \
        }                                                                                        \
      }                                                                                          \
  }
#define WINOGRAD_NHWC(T)                                                                           \
  /* v[k][0..n) = (Bᵀ d B)[k] for the 16 channel vectors d[k] of one tile */                       \
  static void wg_in_vec_##T(T *const *v, const T *const *d, int64_t n) {                           \
    _Pragma("GCC ivdep")                                                                           \
    for (int64_t c = 0; c < n; c++) {                                                              \
      T t[4][4];                                                                                   \
      for (int s = 0; s < 4; s++) {                                                                \
        t[0][s] = d[0 + s][c] - d[8 + s][c];                                                       \
        t[1][s] = d[4 + s][c] + d[8 + s][c];                                                       \
        t[2][s] = d[8 + s][c] - d[4 + s][c];                                                       \
        t[3][s] = d[4 + s][c] - d[12 + s][c];                                                      \
      }                                                                                            \
      for (int r = 0; r < 4; r++) {                                                                \
        v[r * 4 + 0][c] = t[r][0] - t[r][2];                                                       \
        v[r * 4 + 1][c] = t[r][1] + t[r][2];                                                       \
        v[r * 4 + 2][c] = t[r][2] - t[r][1];                                                       \
        v[r * 4 + 3][c] = t[r][1] - t[r][3];                                                       \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* e[k][0..n) += (B dv Bᵀ)[k] for the 16 channel vectors dv[k] of one tile */                    \
  static void wg_in_grad_vec_##T(T *const *e, const T *const *dv, int64_t n) {                     \
    _Pragma("GCC ivdep")                                                                           \
    for (int64_t c = 0; c < n; c++) {                                                              \
      T p[4][4];                                                                                   \
      for (int s = 0; s < 4; s++) {                                                                \
        T v0 = dv[0 + s][c], v1 = dv[4 + s][c], v2 = dv[8 + s][c], v3 = dv[12 + s][c];             \
        p[0][s] = v0;                                                                              \
        p[1][s] = v1 - v2 + v3;                                                                    \
        p[2][s] = v1 + v2 - v0;                                                                    \
        p[3][s] = -v3;                                                                             \
      }                                                                                            \
      for (int r = 0; r < 4; r++) {                                                                \
        e[r * 4 + 0][c] += p[r][0];                                                                \
        e[r * 4 + 1][c] += p[r][1] - p[r][2] + p[r][3];                                            \
        e[r * 4 + 2][c] += p[r][1] + p[r][2] - p[r][0];                                            \
        e[r * 4 + 3][c] -= p[r][3];                                                                \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* y[k][0..n) = (Aᵀ m A)[k] + bias for the 16 vectors m[k] of one tile (y: 4 outputs) */         \
  static void wg_out_vec_##T(T *const *y, const T *const *m, const T *bias, int64_t n) {           \
    _Pragma("GCC ivdep")                                                                           \
    for (int64_t c = 0; c < n; c++) {                                                              \
      T s[2][4], b = bias ? bias[c] : 0;                                                           \
      for (int j = 0; j < 4; j++) {                                                                \
        s[0][j] = m[0 + j][c] + m[4 + j][c] + m[8 + j][c];                                         \
        s[1][j] = m[4 + j][c] - m[8 + j][c] - m[12 + j][c];                                        \
      }                                                                                            \
      for (int i = 0; i < 2; i++) {                                                                \
        y[i * 2 + 0][c] = s[i][0] + s[i][1] + s[i][2] + b;                                         \
        y[i * 2 + 1][c] = s[i][1] - s[i][2] - s[i][3] + b;                                         \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* z[k][0..n) = (A dy Aᵀ)[k] for the 4 vectors dy of one output tile */                          \
  static void wg_grad_vec_##T(T *const *z, const T *const *dy, int64_t n) {                        \
    _Pragma("GCC ivdep")                                                                           \
    for (int64_t c = 0; c < n; c++) {                                                              \
      T a0 = dy[0][c], a1 = dy[1][c], b0 = dy[2][c], b1 = dy[3][c];                                \
      T q[4][2] = {{a0, a1}, {a0 + b0, a1 + b1}, {a0 - b0, a1 - b1}, {-b0, -b1}};                  \
      for (int i = 0; i < 4; i++) {                                                                \
        z[i * 4 + 0][c] = q[i][0];                                                                 \
        z[i * 4 + 1][c] = q[i][0] + q[i][1];                                                       \
        z[i * 4 + 2][c] = q[i][0] - q[i][1];                                                       \
        z[i * 4 + 3][c] = -q[i][1];                                                                \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* V (16, tiles, C) from xh (ns, H, W, C): positions outside the input read `zero` */            \
  static void wg_input_nhwc_##T(T *V, const T *xh, const T *zero, int64_t ns, int64_t tiles,       \
                                const ddp_conv2d_geom *g, int64_t th, int64_t tw) {                \
    int64_t C = g->c, H = g->h, W = g->w, t = 0;                                                   \
    const T *d[16];                                                                                \
    T *v[16];                                                                                      \
    for (int64_t ln = 0; ln < ns; ln++)                                                            \
      for (int64_t ty = 0; ty < th; ty++)                                                          \
        for (int64_t tx = 0; tx < tw; tx++, t++) {                                                 \
          int64_t y0 = 2 * ty - g->ph, x0 = 2 * tx - g->pw;                                        \
          for (int r = 0; r < 4; r++)                                                              \
            for (int s = 0; s < 4; s++) {                                                          \
              int64_t y = y0 + r, x = x0 + s;                                                      \
              int inside = y >= 0 && y < H && x >= 0 && x < W;                                     \
              d[r * 4 + s] = inside ? xh + ((ln * H + y) * W + x) * C : zero;                      \
            }                                                                                      \
          for (int k = 0; k < 16; k++) v[k] = V + (k * tiles + t) * C;                             \
          wg_in_vec_##T(v, d, C);                                                                  \
        }                                                                                          \
  }                                                                                                \
  /* dxh (ns, H, W, C) += B dV Bᵀ over the tiles; positions outside the input go to `sink` */      \
  static void wg_input_grad_nhwc_##T(T *dxh, const T *dV, T *sink, int64_t ns, int64_t tiles,      \
                                     const ddp_conv2d_geom *g, int64_t th, int64_t tw) {           \
    int64_t C = g->c, H = g->h, W = g->w, t = 0;                                                   \
    const T *dv[16];                                                                               \
    T *e[16];                                                                                      \
    for (int64_t ln = 0; ln < ns; ln++)                                                            \
      for (int64_t ty = 0; ty < th; ty++)                                                          \
        for (int64_t tx = 0; tx < tw; tx++, t++) {                                                 \
          int64_t y0 = 2 * ty - g->ph, x0 = 2 * tx - g->pw;                                        \
          for (int r = 0; r < 4; r++)                                                              \
            for (int s = 0; s < 4; s++) {                                                          \
              int64_t y = y0 + r, x = x0 + s;                                                      \
              int inside = y >= 0 && y < H && x >= 0 && x < W;                                     \
              e[r * 4 + s] = inside ? dxh + ((ln * H + y) * W + x) * C                             \
                                    : sink + (r * 4 + s) * C;                                      \
            }                                                                                      \
          for (int k = 0; k < 16; k++) dv[k] = dV + (k * tiles + t) * C;                           \
          wg_in_grad_vec_##T(e, dv, C);                                                            \
        }                                                                                          \
  }                                                                                                \
  /* yh (ns, OH, OW, O) = Aᵀ M A + bias from M (16, tiles, O); cells past the                      \
   * output go to `sink` */                                                                        \
  static void wg_output_nhwc_##T(T *yh, const T *M, const T *bias, T *sink, int64_t ns,            \
                                 int64_t tiles, const ddp_conv2d_geom *g, int64_t th,              \
                                     int64_t tw) {                                                 \
    int64_t O = g->o, OH = g->oh, OW = g->ow, t = 0;                                               \
    const T *m[16];                                                                                \
    T *y[4];                                                                                       \
    for (int64_t ln = 0; ln < ns; ln++)                                                            \
      for (int64_t ty = 0; ty < th; ty++)                                                          \
        for (int64_t tx = 0; tx < tw; tx++, t++) {                                                 \
          for (int i = 0; i < 2; i++)                                                              \
            for (int j = 0; j < 2; j++) {                                                          \
              int64_t oy = 2 * ty + i, ox = 2 * tx + j;                                            \
              y[i * 2 + j] = (oy < OH && ox < OW) ? yh + ((ln * OH + oy) * OW + ox) * O            \
                                                  : sink + (i * 2 + j) * O;                        \
            }                                                                                      \
          for (int k = 0; k < 16; k++) m[k] = M + (k * tiles + t) * O;                             \
          wg_out_vec_##T(y, m, bias, O);                                                           \
        }                                                                                          \
  }                                                                                                \
  /* Z (16, tiles, O) = A dY Aᵀ from gh (ns, OH, OW, O); cells past the output read `zero` */      \
  static void wg_grad_nhwc_##T(T *Z, const T *gh, const T *zero, int64_t ns, int64_t tiles,        \
                               const ddp_conv2d_geom *g, int64_t th, int64_t tw) {                 \
    int64_t O = g->o, OH = g->oh, OW = g->ow, t = 0;                                               \
    const T *dy[4];                                                                                \
    T *z[16];                                                                                      \
    for (int64_t ln = 0; ln < ns; ln++)                                                            \
      for (int64_t ty = 0; ty < th; ty++)                                                          \
        for (int64_t tx = 0; tx < tw; tx++, t++) {                                                 \
          for (int i = 0; i < 2; i++)                                                              \
            for (int j = 0; j < 2; j++) {                                                          \
              int64_t oy = 2 * ty + i, ox = 2 * tx + j;                                            \
              dy[i * 2 + j] = (oy < OH && ox < OW) ? gh + ((ln * OH + oy) * OW + ox) * O : zero;   \
            }                                                                                      \
          for (int k = 0; k < 16; k++) z[k] = Z + (k * tiles + t) * O;                             \
          wg_grad_vec_##T(z, dy, O);                                                               \
        }                                                                                          \
  }
WINOGRAD(float)
WINOGRAD(double)
WINOGRAD_NHWC(float)
WINOGRAD_NHWC(double)

/* dst (n, rows) = (or +=, when add) the transpose of src (rows, n) for f32: 8x8 blocks in
 * AVX registers (unpack, shuffle, permute: the classic in-register transpose), scalar
 * edges. The layout changes around the Winograd transforms are a large share of their
 * cost otherwise. */
static void transpose_f32(float *restrict dst, const float *restrict src, int64_t rows,
                          int64_t n, int add) {
  int64_t r8 = rows / 8 * 8, c8 = n / 8 * 8;
  for (int64_t r = 0; r < r8; r += 8)
    for (int64_t c = 0; c < c8; c += 8) {
      const float *s = src + r * n + c;
      __m256 a0 = _mm256_loadu_ps(s), a1 = _mm256_loadu_ps(s + n), a2 = _mm256_loadu_ps(s + 2 * n);
      __m256 a3 = _mm256_loadu_ps(s + 3 * n), a4 = _mm256_loadu_ps(s + 4 * n);
      __m256 a5 = _mm256_loadu_ps(s + 5 * n), a6 = _mm256_loadu_ps(s + 6 * n);
      __m256 a7 = _mm256_loadu_ps(s + 7 * n);
      __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
      __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
      __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
      __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
      __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
      __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
      __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
      __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
      __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
      __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
      __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
      __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
      __m256 col[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                       _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                       _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                       _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      for (int k = 0; k < 8; k++) {
        float *d = dst + (c + k) * rows + r;
        _mm256_storeu_ps(d, add ? _mm256_add_ps(_mm256_loadu_ps(d), col[k]) : col[k]);
      }
    }
  for (int64_t r = 0; r < rows; r++) /* the edges: last rows, last columns */
    for (int64_t c = r < r8 ? c8 : 0; c < n; c++) {
      if (add) dst[c * rows + r] += src[r * n + c];
      else dst[c * rows + r] = src[r * n + c];
    }
}
static void wg_transpose_float(float *dst, const float *src, int64_t rows,
                               int64_t n) { transpose_f32(dst, src, rows, n, 0); }
static void wg_transpose_add_float(float *dst, const float *src, int64_t rows,
                                   int64_t n) { transpose_f32(dst, src, rows, n, 1); }
/* The same for f64, plainly (f64 convolutions are for checks, not speed). */
static void transpose_f64(double *restrict dst, const double *restrict src, int64_t rows,
                          int64_t n, int add) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < n; c++) {
      if (add) dst[c * rows + r] += src[r * n + c];
      else dst[c * rows + r] = src[r * n + c];
    }
}
static void wg_transpose_double(double *dst, const double *src, int64_t rows,
                                int64_t n) { transpose_f64(dst, src, rows, n, 0); }
static void wg_transpose_add_double(double *dst, const double *src, int64_t rows,
                                    int64_t n) { transpose_f64(dst, src, rows, n, 1); }

static int use_winograd(const ddp_conv2d_geom *g) {
  return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
         g->groups == 1 && g->c >= 8 && g->o >= 8;
}

/* Samples per GEMM batch and the tile counts of one sample. */
static int64_t wg_chunk(const ddp_conv2d_geom *g, int64_t *th, int64_t *tw) {
  *th = (g->oh + 1) / 2, *tw = (g->ow + 1) / 2;
  int64_t per = *th * *tw, cs = WG_TILES_PER_CHUNK / (per > 0 ? per : 1);
  return cs < 1 ? 1 : cs;
}

/* Carve `n` blocks of sizes[i] bytes (64-byte aligned) out of one allocation. */
static char *carve(size_t *total, char **blocks, const size_t *sizes, int n) {
  size_t off[8], t = 0;
  for (int i = 0; i < n; i++) {
    off[i] = t;
    t += (sizes[i] + 63) / 64 * 64;
  }
  char *base = ddp_alloc(t ? t : 64);
  *total = t ? t : 64;
  for (int i = 0; i < n; i++) blocks[i] = base && sizes[i] ? base + off[i] : NULL;
  return base;
}

static void wg_forward_range(void *vctx, int64_t begin, int64_t end) {
  conv_job *j = vctx;
  const ddp_conv2d_geom *g = j->g;
  int f32 = j->dtype == DDP_F32;
  size_t es = j->es;
  int64_t th, tw, cs = wg_chunk(g, &th, &tw), C = g->c, O = g->o, HW = g->h * g->w,
      L = g->oh * g->ow;
  int64_t tmax = cs * th * tw;
  size_t sizes[6] = {(size_t)(cs * HW * C) * es, (size_t)(16 * tmax * C) * es,
                     (size_t)(16 * tmax * O) * es, (size_t)(cs * L * O) * es,
                     (size_t)(C > O ? C : O) * es, (size_t)(4 * O) * es};
  char *b[6], *xh, *V, *M, *yh, *zero, *sink;
  size_t total;
  char *base = carve(&total, b, sizes, 6);
  if (!base) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for Winograd scratch"));
    return;
  }
  xh = b[0], V = b[1], M = b[2], yh = b[3], zero = b[4], sink = b[5];
  memset(zero, 0, sizes[4]);
  for (int64_t n0 = begin; n0 < end; n0 += cs) {
    int64_t ns = end - n0 < cs ? end - n0 : cs, tiles = ns * th * tw;
    for (int64_t ln = 0; ln < ns; ln++) {
      const char *x = j->in + (size_t)((n0 + ln) * C * HW) * es;
      char *dst = xh + (size_t)(ln * HW * C) * es;
      if (f32) wg_transpose_float((float *)dst, (const float *)x, C, HW);
      else wg_transpose_double((double *)dst, (const double *)x, C, HW);
    }
    if (f32) wg_input_nhwc_float((float *)V, (const float *)xh, (const float *)zero, ns,
                                 tiles, g, th, tw);
    else wg_input_nhwc_double((double *)V, (const double *)xh, (const double *)zero, ns,
                              tiles, g, th, tw);
    for (int x = 0; x < 16; x++)
      ddp_cpu_gemm(j->dtype, 0, 1, tiles, O, C, 1.0, V + (size_t)(x * tiles * C) * es, C,
                   j->wg_u + (size_t)(x * O * C) * es, C, 0.0, M + (size_t)(x * tiles * O) * es, O);
    if (f32) wg_output_nhwc_float((float *)yh, (const float *)M, (const float *)j->bias,
                                  (float *)sink, ns, tiles, g, th, tw);
    else wg_output_nhwc_double((double *)yh, (const double *)M, (const double *)j->bias,
                               (double *)sink, ns, tiles, g, th, tw);
    for (int64_t ln = 0; ln < ns; ln++) {
      char *out = j->out + (size_t)((n0 + ln) * O * L) * es;
      const char *src = yh + (size_t)(ln * L * O) * es;
      if (f32) wg_transpose_float((float *)out, (const float *)src, L, O);
      else wg_transpose_double((double *)out, (const double *)src, L, O);
    }
  }
  ddp_free(base, total);
}

static void wg_backward_range(void *vctx, int64_t begin, int64_t end) {
  conv_job *j = vctx;
  const ddp_conv2d_geom *g = j->g;
  int f32 = j->dtype == DDP_F32;
  size_t es = j->es;
  int64_t th, tw, cs = wg_chunk(g, &th, &tw), C = g->c, O = g->o, HW = g->h * g->w,
      L = g->oh * g->ow;
  int64_t tmax = cs * th * tw;
  int dw = j->d_w != NULL, din = j->d_in != NULL;
  size_t sizes[8] = {(size_t)(cs * L * O) * es,                 /* gh */
                     (size_t)(16 * tmax * O) * es,               /* Z */
                     dw ? (size_t)(cs * HW * C) * es : 0,        /* xh */
                     dw ? (size_t)(16 * tmax * C) * es : 0,      /* V */
                     din ? (size_t)(16 * tmax * C) * es : 0,     /* dV */
                     din ? (size_t)(cs * HW * C) * es : 0,       /* dxh */
                     (size_t)(16 * (C > O ? C : O)) * es,        /* zero, then sink */
                     (size_t)(16 * O * C + O) * es};             /* private dU and db */
  char *b[8];
  size_t total;
  char *base = carve(&total, b, sizes, 8);
  if (!base) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for Winograd scratch"));
    return;
  }
  char *gh = b[0], *Z = b[1], *xh = b[2], *V = b[3], *dV = b[4], *dxh = b[5], *zero = b[6];
  char *dU = b[7], *db = b[7] + (size_t)(16 * O * C) * es;
  char *sink = zero; /* wg_grad_nhwc reads zeros first; the sink is only written after */
  memset(b[7], 0, sizes[7]);
  for (int64_t n0 = begin; n0 < end; n0 += cs) {
    int64_t ns = end - n0 < cs ? end - n0 : cs, tiles = ns * th * tw;
    const char *go = j->grad_out + (size_t)(n0 * O * L) * es;
    if (j->d_b)
      for (int64_t ln = 0; ln < ns; ln++) row_sums(j->dtype, db,
                                                   go + (size_t)(ln * O * L) * es, O, L);
    for (int64_t ln = 0; ln < ns; ln++) {
      const char *src = go + (size_t)(ln * O * L) * es;
      char *dst = gh + (size_t)(ln * L * O) * es;
      if (f32) wg_transpose_float((float *)dst, (const float *)src, O, L);
      else wg_transpose_double((double *)dst, (const double *)src, O, L);
    }
    memset(zero, 0, sizes[6]);
    if (f32) wg_grad_nhwc_float((float *)Z, (const float *)gh, (const float *)zero, ns,
                                tiles, g, th, tw);
    else wg_grad_nhwc_double((double *)Z, (const double *)gh, (const double *)zero, ns,
                             tiles, g, th, tw);
    if (dw) {
      for (int64_t ln = 0; ln < ns; ln++) {
        const char *x = j->in + (size_t)((n0 + ln) * C * HW) * es;
        char *dst = xh + (size_t)(ln * HW * C) * es;
        if (f32) wg_transpose_float((float *)dst, (const float *)x, C, HW);
        else wg_transpose_double((double *)dst, (const double *)x, C, HW);
      }
      if (f32) wg_input_nhwc_float((float *)V, (const float *)xh, (const float *)zero, ns,
                                   tiles, g, th, tw);
      else wg_input_nhwc_double((double *)V, (const double *)xh, (const double *)zero, ns,
                                tiles, g, th, tw);
      for (int x = 0; x < 16; x++)
        ddp_cpu_gemm(j->dtype, 1, 0, O, C, tiles, 1.0, Z + (size_t)(x * tiles * O) * es, O,
                     V + (size_t)(x * tiles * C) * es, C, 1.0, dU + (size_t)(x * O * C) * es, C);
    }
    if (din) {
      for (int x = 0; x < 16; x++)
        ddp_cpu_gemm(j->dtype, 0, 0, tiles, C, O, 1.0, Z + (size_t)(x * tiles * O) * es, O,
                     j->wg_u + (size_t)(x * O * C) * es, C, 0.0,
                         dV + (size_t)(x * tiles * C) * es, C);
      memset(dxh, 0, (size_t)(ns * HW * C) * es);
      if (f32) wg_input_grad_nhwc_float((float *)dxh, (const float *)dV, (float *)sink, ns,
                                        tiles, g, th, tw);
      else wg_input_grad_nhwc_double((double *)dxh, (const double *)dV, (double *)sink, ns,
                                     tiles, g, th, tw);
      for (int64_t ln = 0; ln < ns; ln++) {
        char *d = j->d_in + (size_t)((n0 + ln) * C * HW) * es;
        const char *src = dxh + (size_t)(ln * HW * C) * es;
        if (f32) wg_transpose_add_float((float *)d, (const float *)src, HW, C);
        else wg_transpose_add_double((double *)d, (const double *)src, HW, C);
      }
    }
  }
  pthread_mutex_lock(&j->lock);
  if (dw) {
    if (f32) for (int64_t i = 0; i < 16 * O * C; i++) ((float *)j->wg_du)[i] += ((float *)dU)[i];
    else for (int64_t i = 0; i < 16 * O * C; i++) ((double *)j->wg_du)[i] += ((double *)dU)[i];
  }
  if (j->d_b) {
    if (f32) for (int64_t i = 0; i < O; i++) ((float *)j->d_b)[i] += ((float *)db)[i];
    else for (int64_t i = 0; i < O; i++) ((double *)j->d_b)[i] += ((double *)db)[i];
  }
  pthread_mutex_unlock(&j->lock);
  ddp_free(base, total);
}

/* The transformed weights U (16, O, C) for j, in a new block of *bytes. */
static char *wg_transform_weights(conv_job *j, size_t *bytes) {
  const ddp_conv2d_geom *g = j->g;
  *bytes = (size_t)(16 * g->o * g->c) * j->es;
  char *U = ddp_alloc(*bytes);
  if (!U) return NULL;
  if (j->dtype == DDP_F32) wg_weights_float((float *)U, (const float *)j->w, g->o, g->c);
  else wg_weights_double((double *)U, (const double *)j->w, g->o, g->c);
  return U;
}

/* Run fn over the samples: split over the pool with OpenBLAS held at one thread meanwhile
 * (one sample's GEMMs are too small to gain from its threads), or on this thread alone. */
static void run_samples(conv_job *j, ddp_range_fn fn) {
  int64_t n = j->g->n;
  if (ddp_get_num_threads() > 1 && n > 1) {
    int blas_threads = ddp_cpu_blas_hold_single();
    ddp_parallel_for(n, 1, fn, j);
    ddp_cpu_blas_restore(blas_threads);
  } else {
    fn(j, 0, n);
  }
}

int ddp_cpu_conv2d_forward(int dtype, void *out, const void *in, const void *w,
                           const void *bias, const ddp_conv2d_geom *g) {
  if (ddp_cpu_conv_direct_applies(dtype, g, 0)) /* one channel, stride 2: conv_direct.c */
    return ddp_cpu_conv_direct_forward(out, in, w, bias, g);
  conv_job j = {.dtype = dtype, .es = ddp_dtype_size(dtype), .g = g, .out = out, .in = in,
                .w = w, .bias = bias};
  pthread_mutex_init(&j.lock, NULL);
  if (use_winograd(g)) {
    size_t u_bytes;
    char *U = wg_transform_weights(&j, &u_bytes);
    if (!U) {
      j.status = DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for Winograd weights");
    } else {
      j.wg_u = U;
      run_samples(&j, wg_forward_range);
      ddp_free(U, u_bytes);
    }
  } else {
    run_samples(&j, forward_range);
  }
  pthread_mutex_destroy(&j.lock);
  return j.status;
}

int ddp_cpu_conv2d_backward(int dtype, void *d_in, void *d_w, void *d_b, const void *grad_out,
                            const void *in, const void *w, const ddp_conv2d_geom *g) {
  if (ddp_cpu_conv_direct_applies(dtype, g, 1))
    return ddp_cpu_conv_direct_backward(d_in, d_w, d_b, grad_out, in, w, g);
  conv_job j = {.dtype = dtype, .es = ddp_dtype_size(dtype), .g = g, .d_in = d_in, .d_w = d_w,
                .d_b = d_b, .grad_out = grad_out, .in = in, .w = w};
  pthread_mutex_init(&j.lock, NULL);
  if (use_winograd(g)) {
    size_t u_bytes = 0, du_bytes = d_w ? (size_t)(16 * g->o * g->c) * j.es : 0;
    char *U = d_in ? wg_transform_weights(&j, &u_bytes) : NULL;
    char *dU = du_bytes ? ddp_alloc(du_bytes) : NULL;
    if ((d_in && !U) || (du_bytes && !dU)) {
      j.status = DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for Winograd weights");
    } else {
      if (dU) memset(dU, 0, du_bytes);
      j.wg_u = U, j.wg_du = dU;
      run_samples(&j, wg_backward_range);
      if (dU && !j.status) {
        if (dtype == DDP_F32) wg_weights_grad_float(d_w, (const float *)dU, g->o, g->c);
        else wg_weights_grad_double(d_w, (const double *)dU, g->o, g->c);
      }
    }
    if (U) ddp_free(U, u_bytes);
    if (dU) ddp_free(dU, du_bytes);
  } else {
    run_samples(&j, backward_range);
  }
  pthread_mutex_destroy(&j.lock);
  return j.status;
}
