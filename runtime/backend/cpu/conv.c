/* runtime/backend/cpu/conv.c: conv2d forward and backward.
 *
 * Three algorithms; the first two end in GEMMs:
 *  - im2col (Chellapilla, Puri, Simard: "High performance convolutional neural networks for
 *    document processing", 2006), any geometry: for one sample and one group the input
 *    patches are unfolded into cols (C/g kH kW, OH OW), so that
 *      out (O/g, OH OW)     = W (O/g, C/g kH kW) · cols
 *      dW  (O/g, C/g kH kW) += grad (O/g, OH OW) · colsᵀ
 *      dcols                = Wᵀ · grad, folded back onto the input ("col2im").
 *    A 1x1 kernel with stride 1 and no padding needs no unfolding: cols is the input.
 *  - Winograd F(2x2, 3x3) in f32 for 3x3 kernels, stride 1, dilation 1, one group and at
 *    least 8 channels in and out: conv_winograd.c (Note [conv algorithm per shape]).
 *  - direct f32 kernels for 3x3 kernels with one input channel or stride 2, where they
 *    measured faster than im2col: conv_direct.c (ddp_cpu_conv_direct_applies).
 *
 * Threads: samples are split over the runtime's pool, each thread with its own scratch (the
 * backward's weight-gradient sums per fixed unit of samples: Note [im2col weight-gradient
 * units]), while OpenBLAS is held at one thread for the duration. The per-sample GEMMs are small (64 x 196 x 288 for that
 * layer), so this beat running the samples one after another with OpenBLAS threading each
 * GEMM: ~11.5 ms against ~17 ms for that layer's forward + backward on 2 cores. Holding
 * OpenBLAS at one thread is a process-wide setting: a BLAS call made meanwhile by another
 * thread runs single-threaded too. */
#include <pthread.h>

#include "backend/cpu/conv.h"
#include "backend/cpu/conv_direct.h"
#include "backend/cpu/conv_winograd.h"
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
  pthread_mutex_t lock; /* guards status */
  int status;
  int64_t units;     /* backward: Note [im2col weight-gradient units] */
  char *dw_parts, *db_parts; /* backward: one weight / bias gradient sum per unit */
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

/* Note [im2col weight-gradient units]: the backward cuts the batch into `units` fixed runs
 * of samples (UNITS at most, set by the batch size alone); each unit sums the weight and bias
 * gradients of its samples into its own partial, and the caller adds the partials to d_w and
 * d_b in unit order once every unit is done. The threads take whole units, so the sums and
 * their order, and therefore the bits, do not depend on the thread count or on which thread
 * finished first (the old per-thread partials, added under a lock as threads finished, gave
 * other bits for other thread counts). The input gradient needs no such care: each sample's
 * own slice of d_in is written by one unit. */
enum { UNITS = 12 };

/* First sample of unit u of j. */
static int64_t unit_begin(const conv_job *j, int64_t u) { return u * j->g->n / j->units; }

/* Backward for units [ubegin, uend): d_in directly (samples are disjoint), d_w and d_b into
 * the units' partial sums (Note [im2col weight-gradient units]). */
static void backward_range(void *vctx, int64_t ubegin, int64_t uend) {
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
  if ((j->d_w && cols_bytes && !cols) || (dcols_bytes && !dcols)) {
    set_status(j, DDP_ERROR(DDP_ERR_MEMORY, "conv2d backward: out of memory for scratch"));
    goto done;
  }
  for (int64_t u = ubegin; u < uend; u++) {
    char *dw = dw_bytes ? j->dw_parts + (size_t)u * dw_bytes : NULL;
    char *db = db_bytes ? j->db_parts + (size_t)u * db_bytes : NULL;
    if (dw) memset(dw, 0, dw_bytes);
    if (db) memset(db, 0, db_bytes);
    for (int64_t n = unit_begin(j, u); n < unit_begin(j, u + 1); n++)
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
  }
done:
  if (cols) ddp_free(cols, cols_bytes);
  if (dcols) ddp_free(dcols, dcols_bytes);
}

/* dst[i] += the parts' [i] in part order, for `count` elements of each of `parts` parts. */
static void add_parts(int dtype, void *dst, const char *parts, int64_t nparts, int64_t count) {
  for (int64_t p = 0; p < nparts; p++) {
    if (dtype == DDP_F32) {
      const float *src = (const float *)parts + p * count;
      for (int64_t i = 0; i < count; i++) ((float *)dst)[i] += src[i];
    } else {
      const double *src = (const double *)parts + p * count;
      for (int64_t i = 0; i < count; i++) ((double *)dst)[i] += src[i];
    }
  }
}

/* Note [conv algorithm per shape]: Winograd F(2x2, 3x3) (conv_winograd.c) for the f32 3x3
 * stride-1 convolutions it fits with at least 8 channels in and out; im2col + GEMM
 * otherwise, and for f64 (f64 convolutions are for checks, where the plain algorithm is the
 * better reference). Measured forward + both backward passes, f32, 1 thread, CPU ms
 * (medians of 7 runs, alternating builds; 2-core Xeon, 2026-11-25):
 *
 *   shape (N x C x H x W -> O)     im2col   Winograd
 *   128 x 16 x 32 x 32 -> 16        40.2      21.0
 *   128 x 32 x 16 x 16 -> 32        30.0      14.0
 *   128 x 64 x 8 x 8 -> 64          25.9      12.5
 *   64 x 32 x 14 x 14 -> 64         18.5      10.6
 *
 * Winograd wins at every shape of ResNet-20 and the CNN, the 8 x 8 planes included, so no
 * table is consulted: below 8 channels the GEMMs over the channels are too short to pay for
 * the transforms, which is the one cut-off kept from the earlier measurements. */
static int use_winograd(int dtype, const ddp_conv2d_geom *g) {
  return ddp_cpu_winograd_fits(dtype, g) && g->c >= 8 && g->o >= 8;
}

/* Run fn over [0, n) (samples, or the backward's units): split over the pool with OpenBLAS held at one thread meanwhile
 * (one sample's GEMMs are too small to gain from its threads), or on this thread alone. */
static void run_samples(conv_job *j, ddp_range_fn fn, int64_t n) {
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
  if (use_winograd(dtype, g)) return ddp_cpu_winograd_forward(out, in, w, bias, g);
  if (ddp_cpu_conv_direct_applies(dtype, g, 0)) /* one channel, stride 2: conv_direct.c */
    return ddp_cpu_conv_direct_forward(out, in, w, bias, g);
  conv_job j = {.dtype = dtype, .es = ddp_dtype_size(dtype), .g = g, .out = out, .in = in,
                .w = w, .bias = bias};
  pthread_mutex_init(&j.lock, NULL);
  run_samples(&j, forward_range, g->n);
  pthread_mutex_destroy(&j.lock);
  return j.status;
}

int ddp_cpu_conv2d_backward(int dtype, void *d_in, void *d_w, void *d_b, const void *grad_out,
                            const void *in, const void *w, const ddp_conv2d_geom *g) {
  if (use_winograd(dtype, g))
    return ddp_cpu_winograd_backward(d_in, d_w, d_b, grad_out, in, w, g);
  if (ddp_cpu_conv_direct_applies(dtype, g, 1))
    return ddp_cpu_conv_direct_backward(d_in, d_w, d_b, grad_out, in, w, g);
  conv_job j = {.dtype = dtype, .es = ddp_dtype_size(dtype), .g = g, .d_in = d_in, .d_w = d_w,
                .d_b = d_b, .grad_out = grad_out, .in = in, .w = w};
  int64_t ck = g->c / g->groups * g->kh * g->kw;
  j.units = g->n < UNITS ? g->n : UNITS; /* Note [im2col weight-gradient units] */
  size_t dw_all = d_w ? (size_t)(j.units * g->o * ck) * j.es : 0;
  size_t db_all = d_b ? (size_t)(j.units * g->o) * j.es : 0;
  j.dw_parts = dw_all ? ddp_alloc(dw_all) : NULL;
  j.db_parts = db_all ? ddp_alloc(db_all) : NULL;
  if ((dw_all && !j.dw_parts) || (db_all && !j.db_parts)) {
    if (j.dw_parts) ddp_free(j.dw_parts, dw_all);
    if (j.db_parts) ddp_free(j.db_parts, db_all);
    DDP_FAIL(DDP_ERR_MEMORY, "conv2d backward: out of memory for %zu bytes of "
             "weight-gradient partial sums", dw_all + db_all);
  }
  pthread_mutex_init(&j.lock, NULL);
  run_samples(&j, backward_range, j.units);
  pthread_mutex_destroy(&j.lock);
  if (!j.status && d_w) add_parts(dtype, d_w, j.dw_parts, j.units, g->o * ck);
  if (!j.status && d_b) add_parts(dtype, d_b, j.db_parts, j.units, g->o);
  if (j.dw_parts) ddp_free(j.dw_parts, dw_all);
  if (j.db_parts) ddp_free(j.db_parts, db_all);
  return j.status;
}
