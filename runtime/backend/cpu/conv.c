/* runtime/backend/cpu/conv.c: conv2d forward and backward by im2col + GEMM.
 *
 * For one sample and one group, the input patches are unfolded into cols (C/g kH kW, OH OW)
 * ("im2col", Chellapilla, Puri, Simard: "High performance convolutional neural networks for
 * document processing", 2006), so that
 *   out (O/g, OH OW)   = W (O/g, C/g kH kW) · cols
 *   dW  (O/g, C/g kH kW) += grad (O/g, OH OW) · colsᵀ
 *   dcols              = Wᵀ · grad, folded back onto the input ("col2im").
 * A 1x1 kernel with stride 1 and no padding needs no unfolding: cols is the input itself.
 *
 * Threads: samples are split over the runtime's pool, each thread with its own scratch and
 * its own weight-gradient sum (added up at the end), while OpenBLAS runs one thread per
 * call; the per-sample GEMMs are small (for the Fashion-MNIST CNN 64 x 196 x 288), so this
 * beats one OpenBLAS-threaded GEMM after another (see bench/RESULTS.md). */
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>

#include "backend/cpu/conv.h"
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

#define IM2COL(T)                                                                          \
  /* cols (Cg kH kW, OH OW) from one sample's group of channels in (Cg, H, W) */           \
  /* One row of cols when stride is 1 and OW == W: the plane shifted by (dy, off) is one  \
   * contiguous block; only the lo and OW - hi border columns of each line need zeros. */  \
  static void im2col_shift_##T(T *row, const T *plane, int64_t dy, int64_t off, int64_t lo, \
                               int64_t hi, const ddp_conv2d_geom *g) {                     \
    int64_t ow_n = g->ow;                                                                  \
    int64_t oh_lo = dy < 0 ? -dy : 0, oh_hi = g->h - dy < g->oh ? g->h - dy : g->oh;       \
    if (oh_hi < oh_lo) oh_hi = oh_lo;                                                      \
    memset(row, 0, sizeof(T) * (size_t)(oh_lo * ow_n));                                    \
    memset(row + oh_hi * ow_n, 0, sizeof(T) * (size_t)((g->oh - oh_hi) * ow_n));           \
    if (oh_hi == oh_lo || hi <= lo) {                                                      \
      memset(row + oh_lo * ow_n, 0, sizeof(T) * (size_t)((oh_hi - oh_lo) * ow_n));         \
      return;                                                                              \
    }                                                                                      \
    int64_t first = oh_lo * ow_n + lo, last = (oh_hi - 1) * ow_n + hi; /* [first, last) */ \
    memcpy(row + first, plane + (oh_lo + dy) * g->w + off + lo,                            \
           sizeof(T) * (size_t)(last - first));                                            \
    for (int64_t oh = oh_lo; oh < oh_hi; oh++) {                                           \
      T *r = row + oh * ow_n;                                                              \
      for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                       \
      for (int64_t ow = hi; ow < ow_n; ow++) r[ow] = 0;                                    \
    }                                                                                      \
  }                                                                                        \
  static void im2col_##T(T *cols, const T *in, int64_t cg, const ddp_conv2d_geom *g) {     \
    int64_t L = g->oh * g->ow;                                                             \
    int same_width = g->sh == 1 && g->sw == 1 && g->ow == g->w;                            \
    for (int64_t c = 0; c < cg; c++)                                                       \
      for (int64_t ki = 0; ki < g->kh; ki++)                                               \
        for (int64_t kj = 0; kj < g->kw; kj++) {                                           \
          T *row = cols + ((c * g->kh + ki) * g->kw + kj) * L;                             \
          int64_t off = kj * g->dw - g->pw, lo, hi;                                        \
          valid_range(off, g->sw, g->w, g->ow, &lo, &hi);                                  \
          if (same_width) {                                                                \
            im2col_shift_##T(row, in + c * g->h * g->w, ki * g->dh - g->ph, off, lo, hi, g); \
            continue;                                                                      \
          }                                                                                \
          for (int64_t oh = 0; oh < g->oh; oh++) {                                         \
            T *r = row + oh * g->ow;                                                       \
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                  \
            if (ih < 0 || ih >= g->h) {                                                    \
              for (int64_t ow = 0; ow < g->ow; ow++) r[ow] = 0;                            \
              continue;                                                                    \
            }                                                                              \
            const T *src = in + (c * g->h + ih) * g->w + off;                              \
            for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                 \
            if (g->sw == 1)                                                                \
              for (int64_t ow = lo; ow < hi; ow++) r[ow] = src[ow];                        \
            else                                                                           \
              for (int64_t ow = lo; ow < hi; ow++) r[ow] = src[ow * g->sw];                \
            for (int64_t ow = hi; ow < g->ow; ow++) r[ow] = 0;                             \
          }                                                                                \
        }                                                                                  \
  }                                                                                        \
  /* d_in (Cg, H, W) += the patches of dcols (Cg kH kW, OH OW) put back in place */        \
  static void col2im_##T(T *d_in, const T *dcols, int64_t cg, const ddp_conv2d_geom *g) {  \
    int64_t L = g->oh * g->ow;                                                             \
    for (int64_t c = 0; c < cg; c++)                                                       \
      for (int64_t ki = 0; ki < g->kh; ki++)                                               \
        for (int64_t kj = 0; kj < g->kw; kj++) {                                           \
          const T *row = dcols + ((c * g->kh + ki) * g->kw + kj) * L;                      \
          int64_t off = kj * g->dw - g->pw, lo, hi;                                        \
          valid_range(off, g->sw, g->w, g->ow, &lo, &hi);                                  \
          for (int64_t oh = 0; oh < g->oh; oh++) {                                         \
            int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                  \
            if (ih < 0 || ih >= g->h) continue;                                            \
            const T *r = row + oh * g->ow;                                                 \
            T *dst = d_in + (c * g->h + ih) * g->w + off;                                  \
            if (g->sw == 1)                                                                \
              for (int64_t ow = lo; ow < hi; ow++) dst[ow] += r[ow];                       \
            else                                                                           \
              for (int64_t ow = lo; ow < hi; ow++) dst[ow * g->sw] += r[ow];               \
          }                                                                                \
        }                                                                                  \
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
#define ROW_SUMS(T)                                                                        \
  static void row_sums_##T(T *sums, const T *x, int64_t rows, int64_t len) {               \
    for (int64_t r = 0; r < rows; r++) {                                                   \
      const T *p = x + r * len;                                                            \
      T acc[8] = {0};                                                                      \
      int64_t l = 0;                                                                       \
      for (; l + 8 <= len; l += 8)                                                         \
        for (int q = 0; q < 8; q++) acc[q] += p[l + q];                                    \
      T s = 0;                                                                             \
      for (; l < len; l++) s += p[l];                                                      \
      for (int q = 0; q < 8; q++) s += acc[q];                                             \
      sums[r] += s;                                                                        \
    }                                                                                      \
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
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for %zu bytes of im2col scratch", cols_bytes));
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
 *   Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d Bᵀᵀ)] A
 * for the 4x4 input tile d around it, so the 9 multiply-adds per output and input channel
 * become 16 per 4 outputs (2.25x fewer). With the transforms laid out as U (16, O, C) and
 * V (16, C, tiles), the products are 16 GEMMs M = U · V. Backward differentiates the same
 * formula: Z = A dY Aᵀ, dU = Z · Vᵀ (then dg = Gᵀ dU G), dV = Uᵀ · Z (then dd = B dV Bᵀ). */

enum { WG_TILES_PER_CHUNK = 256 }; /* tiles per GEMM batch: V and M stay in cache */

#define WINOGRAD(T)                                                                        \
  /* U (16, O, C) = G g Gᵀ for every 3x3 filter g of w (O, C, 3, 3) */                     \
  static void wg_weights_##T(T *U, const T *w, int64_t O, int64_t C) {                     \
    for (int64_t o = 0; o < O; o++)                                                        \
      for (int64_t c = 0; c < C; c++) {                                                    \
        const T *g = w + (o * C + c) * 9;                                                  \
        T u[4][3];                                                                         \
        for (int j = 0; j < 3; j++) {                                                      \
          u[0][j] = g[j];                                                                  \
          u[1][j] = (g[j] + g[3 + j] + g[6 + j]) * (T)0.5;                                 \
          u[2][j] = (g[j] - g[3 + j] + g[6 + j]) * (T)0.5;                                 \
          u[3][j] = g[6 + j];                                                              \
        }                                                                                  \
        for (int i = 0; i < 4; i++) {                                                      \
          T v[4] = {u[i][0], (u[i][0] + u[i][1] + u[i][2]) * (T)0.5,                       \
                    (u[i][0] - u[i][1] + u[i][2]) * (T)0.5, u[i][2]};                      \
          for (int j = 0; j < 4; j++) U[((i * 4 + j) * O + o) * C + c] = v[j];             \
        }                                                                                  \
      }                                                                                    \
  }                                                                                        \
  /* dw (O, C, 3, 3) += Gᵀ dU G for dU (16, O, C) */                                       \
  static void wg_weights_grad_##T(T *dw, const T *dU, int64_t O, int64_t C) {              \
    for (int64_t o = 0; o < O; o++)                                                        \
      for (int64_t c = 0; c < C; c++) {                                                    \
        T d[4][4], r[3][4];                                                                \
        for (int i = 0; i < 4; i++)                                                        \
          for (int j = 0; j < 4; j++) d[i][j] = dU[((i * 4 + j) * O + o) * C + c];         \
        for (int j = 0; j < 4; j++) {                                                      \
          r[0][j] = d[0][j] + (d[1][j] + d[2][j]) * (T)0.5;                                \
          r[1][j] = (d[1][j] - d[2][j]) * (T)0.5;                                          \
          r[2][j] = (d[1][j] + d[2][j]) * (T)0.5 + d[3][j];                                \
        }                                                                                  \
        T *g = dw + (o * C + c) * 9;                                                       \
        for (int k = 0; k < 3; k++) {                                                      \
          g[k * 3 + 0] += r[k][0] + (r[k][1] + r[k][2]) * (T)0.5;                          \
          g[k * 3 + 1] += (r[k][1] - r[k][2]) * (T)0.5;                                    \
          g[k * 3 + 2] += (r[k][1] + r[k][2]) * (T)0.5 + r[k][3];                          \
        }                                                                                  \
      }                                                                                    \
  }
#define WINOGRAD_TRANSFORMS(T)                                                                                                                  \
  /* V planes (stride xs) of one tile = Bᵀ d B */                                                                                               \
  static inline void wg_in_tile_##T(T *v, int64_t xs, T d[4][4]) {                                                                              \
    T t[4][4];                                                                                                                                  \
    for (int s = 0; s < 4; s++) {                                                                                                               \
      t[0][s] = d[0][s] - d[2][s];                                                                                                              \
      t[1][s] = d[1][s] + d[2][s];                                                                                                              \
      t[2][s] = d[2][s] - d[1][s];                                                                                                              \
      t[3][s] = d[1][s] - d[3][s];                                                                                                              \
    }                                                                                                                                           \
    for (int r = 0; r < 4; r++) {                                                                                                               \
      v[(r * 4 + 0) * xs] = t[r][0] - t[r][2];                                                                                                  \
      v[(r * 4 + 1) * xs] = t[r][1] + t[r][2];                                                                                                  \
      v[(r * 4 + 2) * xs] = t[r][2] - t[r][1];                                                                                                  \
      v[(r * 4 + 3) * xs] = t[r][1] - t[r][3];                                                                                                  \
    }                                                                                                                                           \
  }                                                                                                                                             \
  /* V (16, C, tiles) = Bᵀ d B for the 4x4 tiles d of ns samples of in (ns, C, H, W) */                                                         \
  static void wg_input_##T(T *V, const T *in, int64_t ns, int64_t tiles, const ddp_conv2d_geom *g, int64_t th, int64_t tw) {                    \
    int64_t C = g->c, H = g->h, W = g->w, xs = C * tiles;                                                                                       \
    /* tiles [ta, tb) of a row read 4 columns inside the input: 0 <= 2 tx - pw <= W - 4 */                                                      \
    int64_t ta = (g->pw + 1) / 2, tb = W - 4 + g->pw >= 0 ? (W - 4 + g->pw) / 2 + 1 : 0;                                                        \
    if (tb > tw) tb = tw;                                                                                                                       \
    if (ta > tb) ta = tb;                                                                                                                       \
    for (int64_t ln = 0; ln < ns; ln++)                                                                                                         \
      for (int64_t c = 0; c < C; c++) {                                                                                                         \
        const T *plane = in + (ln * C + c) * H * W;                                                                                             \
        T *vc = V + c * tiles + ln * th * tw;                                                                                                   \
        for (int64_t ty = 0; ty < th; ty++) {                                                                                                   \
          int64_t y0 = 2 * ty - g->ph;                                                                                                          \
          int inner = y0 >= 0 && y0 + 4 <= H;                                                                                                   \
          int64_t a = inner ? ta : tw, b = inner ? tb : tw;                                                                                     \
          T *vrow = vc + ty * tw;                                                                                                               \
          for (int64_t tx = 0; tx < tw; tx++) {                                                                                                 \
            if (tx == a && a < b) {                                                                                                             \
              const T *p0 = plane + y0 * W - g->pw, *p1 = p0 + W, *p2 = p1 + W, *p3 = p2 + W;                                                   \
              _Pragma("GCC ivdep")                                                                                                              \
              for (int64_t u = a; u < b; u++) {                                                                                                 \
                int64_t x = 2 * u;                                                                                                              \
                T t0[4], t1[4], t2[4], t3[4];                                                                                                   \
                for (int s = 0; s < 4; s++) {                                                                                                   \
                  t0[s] = p0[x + s] - p2[x + s];                                                                                                \
                  t1[s] = p1[x + s] + p2[x + s];                                                                                                \
                  t2[s] = p2[x + s] - p1[x + s];                                                                                                \
                  t3[s] = p1[x + s] - p3[x + s];                                                                                                \
                }                                                                                                                               \
                T *v = vrow + u;                                                                                                                \
                v[0 * xs] = t0[0] - t0[2]; v[1 * xs] = t0[1] + t0[2]; v[2 * xs] = t0[2] - t0[1]; v[3 * xs] = t0[1] - t0[3];                     \
                v[4 * xs] = t1[0] - t1[2]; v[5 * xs] = t1[1] + t1[2]; v[6 * xs] = t1[2] - t1[1]; v[7 * xs] = t1[1] - t1[3];                     \
                v[8 * xs] = t2[0] - t2[2]; v[9 * xs] = t2[1] + t2[2]; v[10 * xs] = t2[2] - t2[1]; v[11 * xs] = t2[1] - t2[3];                   \
                v[12 * xs] = t3[0] - t3[2]; v[13 * xs] = t3[1] + t3[2]; v[14 * xs] = t3[2] - t3[1]; v[15 * xs] = t3[1] - t3[3];                 \
              }                                                                                                                                 \
              tx = b - 1;                                                                                                                       \
              continue;                                                                                                                         \
            }                                                                                                                                   \
            int64_t x0 = 2 * tx - g->pw;                                                                                                        \
            T d[4][4];                                                                                                                          \
            for (int r = 0; r < 4; r++)                                                                                                         \
              for (int s = 0; s < 4; s++) {                                                                                                     \
                int64_t y = y0 + r, x = x0 + s;                                                                                                 \
                d[r][s] = (y >= 0 && y < H && x >= 0 && x < W) ? plane[y * W + x] : 0;                                                          \
              }                                                                                                                                 \
            wg_in_tile_##T(vrow + tx, xs, d);                                                                                                   \
          }                                                                                                                                     \
        }                                                                                                                                       \
      }                                                                                                                                         \
  }                                                                                                                                             \
  /* d_in (ns, C, H, W) += B dV Bᵀ, each 4x4 tile added back in place (padding dropped).                                                        \
   * The transforms of one tile row go to e (16, tw) first; the overlapping adds follow. */                                                     \
  static void wg_input_grad_##T(T *d_in, const T *dV, int64_t ns, int64_t tiles, const ddp_conv2d_geom *g, int64_t th, int64_t tw, T *e) {      \
    int64_t C = g->c, H = g->h, W = g->w, xs = C * tiles;                                                                                       \
    for (int64_t ln = 0; ln < ns; ln++)                                                                                                         \
      for (int64_t c = 0; c < C; c++) {                                                                                                         \
        T *plane = d_in + (ln * C + c) * H * W;                                                                                                 \
        const T *vc = dV + c * tiles + ln * th * tw;                                                                                            \
        for (int64_t ty = 0; ty < th; ty++) {                                                                                                   \
          const T *v = vc + ty * tw;                                                                                                            \
          _Pragma("GCC ivdep")                                                                                                                  \
          for (int64_t u = 0; u < tw; u++) {                                                                                                    \
            T p[4][4];                                                                                                                          \
            for (int s = 0; s < 4; s++) {                                                                                                       \
              T v0 = v[(0 * 4 + s) * xs + u], v1 = v[(1 * 4 + s) * xs + u];                                                                     \
              T v2 = v[(2 * 4 + s) * xs + u], v3 = v[(3 * 4 + s) * xs + u];                                                                     \
              p[0][s] = v0;                                                                                                                     \
              p[1][s] = v1 - v2 + v3;                                                                                                           \
              p[2][s] = v1 + v2 - v0;                                                                                                           \
              p[3][s] = -v3;                                                                                                                    \
            }                                                                                                                                   \
            for (int r = 0; r < 4; r++) {                                                                                                       \
              e[(r * 4 + 0) * tw + u] = p[r][0];                                                                                                \
              e[(r * 4 + 1) * tw + u] = p[r][1] - p[r][2] + p[r][3];                                                                            \
              e[(r * 4 + 2) * tw + u] = p[r][1] + p[r][2] - p[r][0];                                                                            \
              e[(r * 4 + 3) * tw + u] = -p[r][3];                                                                                               \
            }                                                                                                                                   \
          }                                                                                                                                     \
          int64_t y0 = 2 * ty - g->ph;                                                                                                          \
          for (int r = 0; r < 4; r++) {                                                                                                         \
            int64_t y = y0 + r;                                                                                                                 \
            if (y < 0 || y >= H) continue;                                                                                                      \
            T *row = plane + y * W;                                                                                                             \
            for (int64_t u = 0; u < tw; u++) {                                                                                                  \
              int64_t x0 = 2 * u - g->pw;                                                                                                       \
              if (x0 >= 0 && x0 + 4 <= W) {                                                                                                     \
                for (int s = 0; s < 4; s++) row[x0 + s] += e[(r * 4 + s) * tw + u];                                                             \
              } else {                                                                                                                          \
                for (int s = 0; s < 4; s++)                                                                                                     \
                  if (x0 + s >= 0 && x0 + s < W) row[x0 + s] += e[(r * 4 + s) * tw + u];                                                        \
              }                                                                                                                                 \
            }                                                                                                                                   \
          }                                                                                                                                     \
        }                                                                                                                                       \
      }                                                                                                                                         \
  }                                                                                                                                             \
  /* out (ns, O, OH, OW) = Aᵀ M A (+ bias) for M (16, O, tiles) */                                                                              \
  static void wg_output_##T(T *out, const T *M, const T *bias, int64_t ns, int64_t tiles, const ddp_conv2d_geom *g, int64_t th, int64_t tw) {   \
    int64_t O = g->o, OH = g->oh, OW = g->ow, xs = O * tiles;                                                                                   \
    int64_t full = OW / 2; /* tiles with both columns inside the output */                                                                      \
    for (int64_t ln = 0; ln < ns; ln++)                                                                                                         \
      for (int64_t o = 0; o < O; o++) {                                                                                                         \
        T *plane = out + (ln * O + o) * OH * OW, b = bias ? bias[o] : 0;                                                                        \
        const T *mo = M + o * tiles + ln * th * tw;                                                                                             \
        for (int64_t ty = 0; ty < th; ty++) {                                                                                                   \
          const T *m = mo + ty * tw;                                                                                                            \
          int64_t y = 2 * ty;                                                                                                                   \
          T *row0 = plane + y * OW, *row1 = y + 1 < OH ? row0 + OW : NULL;                                                                      \
          if (row1) {                                                                                                                           \
            _Pragma("GCC ivdep")                                                                                                                \
            for (int64_t u = 0; u < full; u++) {                                                                                                \
              T s0[4], s1[4];                                                                                                                   \
              for (int j = 0; j < 4; j++) {                                                                                                     \
                T m0 = m[(0 * 4 + j) * xs + u], m1 = m[(1 * 4 + j) * xs + u];                                                                   \
                T m2 = m[(2 * 4 + j) * xs + u], m3 = m[(3 * 4 + j) * xs + u];                                                                   \
                s0[j] = m0 + m1 + m2;                                                                                                           \
                s1[j] = m1 - m2 - m3;                                                                                                           \
              }                                                                                                                                 \
              row0[2 * u] = s0[0] + s0[1] + s0[2] + b;                                                                                          \
              row0[2 * u + 1] = s0[1] - s0[2] - s0[3] + b;                                                                                      \
              row1[2 * u] = s1[0] + s1[1] + s1[2] + b;                                                                                          \
              row1[2 * u + 1] = s1[1] - s1[2] - s1[3] + b;                                                                                      \
            }                                                                                                                                   \
          }                                                                                                                                     \
          for (int64_t u = row1 ? full : 0; u < tw; u++) {                                                                                      \
            T s[2][4];                                                                                                                          \
            for (int j = 0; j < 4; j++) {                                                                                                       \
              T m0 = m[(0 * 4 + j) * xs + u], m1 = m[(1 * 4 + j) * xs + u];                                                                     \
              T m2 = m[(2 * 4 + j) * xs + u], m3 = m[(3 * 4 + j) * xs + u];                                                                     \
              s[0][j] = m0 + m1 + m2;                                                                                                           \
              s[1][j] = m1 - m2 - m3;                                                                                                           \
            }                                                                                                                                   \
            int64_t x = 2 * u;                                                                                                                  \
            for (int i = 0; i < 2 && y + i < OH; i++) {                                                                                         \
              T *row = plane + (y + i) * OW + x;                                                                                                \
              row[0] = s[i][0] + s[i][1] + s[i][2] + b;                                                                                         \
              if (x + 1 < OW) row[1] = s[i][1] - s[i][2] - s[i][3] + b;                                                                         \
            }                                                                                                                                   \
          }                                                                                                                                     \
        }                                                                                                                                       \
      }                                                                                                                                         \
  }                                                                                                                                             \
  /* Z (16, O, tiles) = A dY Aᵀ for the 2x2 tiles of grad_out (ns, O, OH, OW) */                                                                \
  static void wg_grad_##T(T *Z, const T *gout, int64_t ns, int64_t tiles, const ddp_conv2d_geom *g, int64_t th, int64_t tw) {                   \
    int64_t O = g->o, OH = g->oh, OW = g->ow, xs = O * tiles;                                                                                   \
    int64_t full = OW / 2;                                                                                                                      \
    for (int64_t ln = 0; ln < ns; ln++)                                                                                                         \
      for (int64_t o = 0; o < O; o++) {                                                                                                         \
        const T *plane = gout + (ln * O + o) * OH * OW;                                                                                         \
        T *zo = Z + o * tiles + ln * th * tw;                                                                                                   \
        for (int64_t ty = 0; ty < th; ty++) {                                                                                                   \
          int64_t y = 2 * ty;                                                                                                                   \
          T *zr = zo + ty * tw;                                                                                                                 \
          int64_t start = 0;                                                                                                                    \
          if (y + 1 < OH) {                                                                                                                     \
            const T *r0 = plane + y * OW, *r1 = r0 + OW;                                                                                        \
            _Pragma("GCC ivdep")                                                                                                                \
            for (int64_t u = 0; u < full; u++) {                                                                                                \
              T a0 = r0[2 * u], a1 = r0[2 * u + 1], b0 = r1[2 * u], b1 = r1[2 * u + 1];                                                         \
              T q0[2] = {a0, a1}, q1[2] = {a0 + b0, a1 + b1}, q2[2] = {a0 - b0, a1 - b1}, q3[2] = {-b0, -b1};                                   \
              T *z = zr + u;                                                                                                                    \
              z[0 * xs] = q0[0]; z[1 * xs] = q0[0] + q0[1]; z[2 * xs] = q0[0] - q0[1]; z[3 * xs] = -q0[1];                                      \
              z[4 * xs] = q1[0]; z[5 * xs] = q1[0] + q1[1]; z[6 * xs] = q1[0] - q1[1]; z[7 * xs] = -q1[1];                                      \
              z[8 * xs] = q2[0]; z[9 * xs] = q2[0] + q2[1]; z[10 * xs] = q2[0] - q2[1]; z[11 * xs] = -q2[1];                                    \
              z[12 * xs] = q3[0]; z[13 * xs] = q3[0] + q3[1]; z[14 * xs] = q3[0] - q3[1]; z[15 * xs] = -q3[1];                                  \
            }                                                                                                                                   \
            start = full;                                                                                                                       \
          }                                                                                                                                     \
          for (int64_t u = start; u < tw; u++) {                                                                                                \
            int64_t x = 2 * u;                                                                                                                  \
            T dy[2][2];                                                                                                                         \
            for (int i = 0; i < 2; i++)                                                                                                         \
              for (int j = 0; j < 2; j++)                                                                                                       \
                dy[i][j] = (y + i < OH && x + j < OW) ? plane[(y + i) * OW + x + j] : 0;                                                        \
            T q[4][2];                                                                                                                          \
            for (int j = 0; j < 2; j++) {                                                                                                       \
              q[0][j] = dy[0][j];                                                                                                               \
              q[1][j] = dy[0][j] + dy[1][j];                                                                                                    \
              q[2][j] = dy[0][j] - dy[1][j];                                                                                                    \
              q[3][j] = -dy[1][j];                                                                                                              \
            }                                                                                                                                   \
            T *z = zr + u;                                                                                                                      \
            for (int i = 0; i < 4; i++) {                                                                                                       \
              z[(i * 4 + 0) * xs] = q[i][0];                                                                                                    \
              z[(i * 4 + 1) * xs] = q[i][0] + q[i][1];                                                                                          \
              z[(i * 4 + 2) * xs] = q[i][0] - q[i][1];                                                                                          \
              z[(i * 4 + 3) * xs] = -q[i][1];                                                                                                   \
            }                                                                                                                                   \
          }                                                                                                                                     \
        }                                                                                                                                       \
      }                                                                                                                                         \
  }
WINOGRAD(float)
WINOGRAD(double)
WINOGRAD_TRANSFORMS(float)
WINOGRAD_TRANSFORMS(double)

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

static void wg_forward_range(void *vctx, int64_t begin, int64_t end) {
  conv_job *j = vctx;
  const ddp_conv2d_geom *g = j->g;
  int f32 = j->dtype == DDP_F32;
  int64_t th, tw, cs = wg_chunk(g, &th, &tw), C = g->c, O = g->o;
  size_t v_bytes = (size_t)(16 * C * cs * th * tw) * j->es;
  size_t m_bytes = (size_t)(16 * O * cs * th * tw) * j->es;
  char *V = ddp_alloc(v_bytes), *M = ddp_alloc(m_bytes);
  if (!V || !M) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d: out of memory for Winograd scratch"));
    goto done;
  }
  for (int64_t n0 = begin; n0 < end; n0 += cs) {
    int64_t ns = end - n0 < cs ? end - n0 : cs, tiles = ns * th * tw;
    const char *in = j->in + (size_t)(n0 * C * g->h * g->w) * j->es;
    if (f32) wg_input_float((float *)V, (const float *)in, ns, tiles, g, th, tw);
    else wg_input_double((double *)V, (const double *)in, ns, tiles, g, th, tw);
    for (int x = 0; x < 16; x++)
      ddp_cpu_gemm(j->dtype, 0, 0, O, tiles, C, 1.0, j->wg_u + (size_t)(x * O * C) * j->es, C,
                   V + (size_t)(x * C * tiles) * j->es, tiles, 0.0,
                   M + (size_t)(x * O * tiles) * j->es, tiles);
    char *out = j->out + (size_t)(n0 * O * g->oh * g->ow) * j->es;
    if (f32) wg_output_float((float *)out, (const float *)M, (const float *)j->bias, ns, tiles, g, th, tw);
    else wg_output_double((double *)out, (const double *)M, (const double *)j->bias, ns, tiles, g, th, tw);
  }
done:
  if (V) ddp_free(V, v_bytes);
  if (M) ddp_free(M, m_bytes);
}

static void wg_backward_range(void *vctx, int64_t begin, int64_t end) {
  conv_job *j = vctx;
  const ddp_conv2d_geom *g = j->g;
  int f32 = j->dtype == DDP_F32;
  int64_t th, tw, cs = wg_chunk(g, &th, &tw), C = g->c, O = g->o, L = g->oh * g->ow;
  size_t v_bytes = (size_t)(16 * C * cs * th * tw) * j->es;
  size_t z_bytes = (size_t)(16 * O * cs * th * tw) * j->es;
  size_t du_bytes = j->d_w ? (size_t)(16 * O * C) * j->es : 0;
  size_t db_bytes = j->d_b ? (size_t)O * j->es : 0;
  size_t e_bytes = (size_t)(16 * tw) * j->es;
  char *E = j->d_in ? ddp_alloc(e_bytes) : NULL;
  char *Z = ddp_alloc(z_bytes);
  char *V = (j->d_w || j->d_in) ? ddp_alloc(v_bytes) : NULL; /* V, or dV for d_in */
  char *dV = (j->d_w && j->d_in) ? ddp_alloc(v_bytes) : V;
  char *dU = du_bytes ? ddp_alloc(du_bytes) : NULL, *db = db_bytes ? ddp_alloc(db_bytes) : NULL;
  if (!Z || ((j->d_w || j->d_in) && (!V || !dV)) || (du_bytes && !dU) || (db_bytes && !db) ||
      (j->d_in && !E)) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for Winograd scratch"));
    goto done;
  }
  if (dU) memset(dU, 0, du_bytes);
  if (db) memset(db, 0, db_bytes);
  for (int64_t n0 = begin; n0 < end; n0 += cs) {
    int64_t ns = end - n0 < cs ? end - n0 : cs, tiles = ns * th * tw;
    const char *go = j->grad_out + (size_t)(n0 * O * L) * j->es;
    if (db)
      for (int64_t ln = 0; ln < ns; ln++) row_sums(j->dtype, db, go + (size_t)(ln * O * L) * j->es, O, L);
    if (f32) wg_grad_float((float *)Z, (const float *)go, ns, tiles, g, th, tw);
    else wg_grad_double((double *)Z, (const double *)go, ns, tiles, g, th, tw);
    if (dU) {
      const char *in = j->in + (size_t)(n0 * C * g->h * g->w) * j->es;
      if (f32) wg_input_float((float *)V, (const float *)in, ns, tiles, g, th, tw);
      else wg_input_double((double *)V, (const double *)in, ns, tiles, g, th, tw);
      for (int x = 0; x < 16; x++)
        ddp_cpu_gemm(j->dtype, 0, 1, O, C, tiles, 1.0, Z + (size_t)(x * O * tiles) * j->es, tiles,
                     V + (size_t)(x * C * tiles) * j->es, tiles, 1.0,
                     dU + (size_t)(x * O * C) * j->es, C);
    }
    if (j->d_in) {
      for (int x = 0; x < 16; x++)
        ddp_cpu_gemm(j->dtype, 1, 0, C, tiles, O, 1.0, j->wg_u + (size_t)(x * O * C) * j->es, C,
                     Z + (size_t)(x * O * tiles) * j->es, tiles, 0.0,
                     dV + (size_t)(x * C * tiles) * j->es, tiles);
      char *d_in = j->d_in + (size_t)(n0 * C * g->h * g->w) * j->es;
      if (f32) wg_input_grad_float((float *)d_in, (const float *)dV, ns, tiles, g, th, tw, (float *)E);
      else wg_input_grad_double((double *)d_in, (const double *)dV, ns, tiles, g, th, tw, (double *)E);
    }
  }
  pthread_mutex_lock(&j->lock);
  if (dU) {
    if (f32) for (int64_t i = 0; i < 16 * O * C; i++) ((float *)j->wg_du)[i] += ((float *)dU)[i];
    else for (int64_t i = 0; i < 16 * O * C; i++) ((double *)j->wg_du)[i] += ((double *)dU)[i];
  }
  if (db) {
    if (f32) for (int64_t i = 0; i < O; i++) ((float *)j->d_b)[i] += ((float *)db)[i];
    else for (int64_t i = 0; i < O; i++) ((double *)j->d_b)[i] += ((double *)db)[i];
  }
  pthread_mutex_unlock(&j->lock);
done:
  if (E) ddp_free(E, e_bytes);
  if (Z) ddp_free(Z, z_bytes);
  if (dV && dV != V) ddp_free(dV, v_bytes);
  if (V) ddp_free(V, v_bytes);
  if (dU) ddp_free(dU, du_bytes);
  if (db) ddp_free(db, db_bytes);
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
  static int mode = -1; /* TEMP benchmark switch */
  if (mode < 0) mode = getenv("DDP_CONV_MODE") ? atoi(getenv("DDP_CONV_MODE")) : 0;
  if (mode == 0 && ddp_get_num_threads() > 1 && n > 1) {
    int blas_threads = openblas_get_num_threads();
    if (blas_threads > 1) openblas_set_num_threads(1);
    ddp_parallel_for(n, 1, fn, j);
    if (blas_threads > 1) openblas_set_num_threads(blas_threads);
  } else {
    fn(j, 0, n);
  }
}

int ddp_cpu_conv2d_forward(int dtype, void *out, const void *in, const void *w,
                           const void *bias, const ddp_conv2d_geom *g) {
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
