/* runtime/backend/cpu/attention.c: scaled_dot_product_attention on the CPU (see attention.h).
 *
 * Note [flash attention]
 * The (L, S) score matrix of a head is never held whole. Forward takes a block of BR query
 * rows and walks the keys in blocks of BC columns: the tile's scores s = scale q k^T (+ mask,
 * causal -inf) come from one GEMM, then an online softmax (Milakov & Gimelshein 2018,
 * "Online normalizer calculation for softmax"; Dao et al. 2022, "FlashAttention") keeps for
 * each row the running maximum m and the running sum l of exp(s - m): a new tile with
 * maximum m' rescales the row's partial output and l by exp(m - m'), adds its exp(s - m')
 * (dropped by Note [attention dropout] for the output only) times v with a second GEMM.
 * At the end out = acc / l and lse = m + log(l) is saved. Backward (FlashAttention-2's
 * order, Dao 2023) takes one head per task, walks key blocks j and inside them query
 * blocks i, recomputes p = exp(s - lse) for the tile, dp = dout v^T, and with
 * D_i = sum(dout_i * out_i) the score gradient ds = p (dp z / (1 - p_drop) - D); then
 * dv_j += (p z / (1 - p_drop))^T dout_i, dq_i += scale ds k_j, dk_j += scale ds^T q_i.
 * With is_causal, tiles wholly above the diagonal are skipped (forward stops a row block
 * at its last row's key; backward starts a key block at its first key's row block).
 * Memory: two BR x BC tiles and O(L) per task besides the inputs, outputs and lse: linear
 * in L and S. A row every score of which is -inf (all masked) gives NaN, as the explicit
 * softmax does; with no keys at all (S = 0) the output is zeros, as the explicit product's.
 * Tile sizes (measured on the nanoGPT shape, 12 x 4 heads x T 64 x 32, and a GPT-2-small
 * one, 4 x 12 x 256 x 64, causal, f32, one thread): 32-row blocks let the causal triangle
 * skip more work than 64-row ones (fwd+bwd 2.14 -> 1.92 ms on the first); forward key
 * blocks of 128 and backward ones of 32 were the best of 16 .. 256. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/vexp.h"
#include "core/core.h"

enum { BR = 32, BC = 128 }; /* query rows and key columns of a forward tile */
enum { BCB = 32 };          /* key columns of a backward tile (<= BC) */

static void gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                     float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
              c, (blasint)ldc);
}

static void gemm_f64(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                     const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                     double *c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
              c, (blasint)ldc);
}

/* Element offset of head bh in a view with batch strides sb (ddp_attention_geom). */
static int64_t batch_offset(const ddp_attention_geom *g, const int64_t *sb, int64_t bh) {
  int64_t off = 0;
  for (int d = g->nb - 1; d >= 0; d--) {
    int64_t size = g->batch_shape[d];
    off += (bh % size) * sb[d];
    bh /= size;
  }
  return off;
}

/* keep[0 .. n) = the dropout decisions of elements e0 .. e0 + n (Note [attention dropout]). */
static void keep_row(uint8_t *keep, int64_t e0, int64_t n, const ddp_attention_geom *g,
                     uint64_t threshold) {
  uint32_t key[2] = {(uint32_t)g->seed, (uint32_t)(g->seed >> 32)};
  uint32_t w[4];
  int64_t e = e0, end = e0 + n;
  while (e < end) {
    uint64_t b = g->offset + (uint64_t)e / 4;
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
    ddp_philox4x32_10(w, ctr, key);
    for (int word = (int)(e % 4); word < 4 && e < end; word++, e++)
      keep[e - e0] = (uint64_t)w[word] < threshold;
  }
}

/* Row reductions in LANES independent accumulators, so the compiler vectorises them
 * (one in-order accumulator would be a chain of scalar adds: float addition is not
 * associative). The order of a row's sum depends only on its length, never on threads. */
enum { LANES = 8 };

#define DEFINE_ROW_OPS(SUF, T, EXP)                                                        \
  /* largest of x[0 .. n) (-inf for n = 0) */                                            \
  static inline T row_max_##SUF(const T *x, int64_t n) {                                 \
    T lane[LANES];                                                                        \
    for (int l = 0; l < LANES; l++) lane[l] = -INFINITY;                                  \
    int64_t c = 0;                                                                        \
    for (; c + LANES <= n; c += LANES)                                                    \
      for (int l = 0; l < LANES; l++) lane[l] = x[c + l] > lane[l] ? x[c + l] : lane[l];  \
    for (; c < n; c++) lane[0] = x[c] > lane[0] ? x[c] : lane[0];                         \
    T m = lane[0];                                                                        \
    for (int l = 1; l < LANES; l++) m = lane[l] > m ? lane[l] : m;                        \
    return m;                                                                             \
  }                                                                                       \
  /* x[c] = exp(x[c] - ref) in place; returns their sum */                               \
  static inline T row_exp_sum_##SUF(T *x, int64_t n, T ref) {                            \
    T lane[LANES] = {0};                                                                  \
    int64_t c = 0;                                                                        \
    for (; c + LANES <= n; c += LANES)                                                    \
      for (int l = 0; l < LANES; l++) {                                                   \
        T p = EXP(x[c + l] - ref);                                                        \
        x[c + l] = p;                                                                     \
        lane[l] += p;                                                                     \
      }                                                                                   \
    for (; c < n; c++) {                                                                  \
      T p = EXP(x[c] - ref);                                                              \
      x[c] = p;                                                                           \
      lane[0] += p;                                                                       \
    }                                                                                     \
    T sum = 0;                                                                            \
    for (int l = 0; l < LANES; l++) sum += lane[l];                                       \
    return sum;                                                                           \
  }                                                                                       \
  /* sum of a[c] * b[c] over [0, n) */                                                   \
  static inline T row_dot_##SUF(const T *a, const T *b, int64_t n) {                     \
    T lane[LANES] = {0};                                                                  \
    int64_t c = 0;                                                                        \
    for (; c + LANES <= n; c += LANES)                                                    \
      for (int l = 0; l < LANES; l++) lane[l] += a[c + l] * b[c + l];                     \
    for (; c < n; c++) lane[0] += a[c] * b[c];                                            \
    T sum = 0;                                                                            \
    for (int l = 0; l < LANES; l++) sum += lane[l];                                       \
    return sum;                                                                           \
  }
DEFINE_ROW_OPS(f32, float, exp_f32)
DEFINE_ROW_OPS(f64, double, exp)

/* The tile's scores after the mask and causality: row r of s (ld BC) is query i0 + r,
 * column c key j0 + c. */
#define DEFINE_MASK_TILE(SUF, T)                                                           \
  static void mask_tile_##SUF(T *s, int64_t rows, int64_t cols, int64_t i0, int64_t j0,    \
                              const void *mask, int64_t mbase, const ddp_attention_geom *g) { \
    for (int64_t r = 0; r < rows; r++) {                                                   \
      T *sr = s + r * BC;                                                                  \
      int64_t i = i0 + r;                                                                  \
      if (g->mask == DDP_ATTN_MASK_ADD) {                                                  \
        const T *mr = (const T *)mask + mbase + i * g->mask_sl + j0 * g->mask_ss;          \
        int64_t ss = g->mask_ss;                                                           \
        for (int64_t c = 0; c < cols; c++) sr[c] += mr[c * ss];                            \
      } else if (g->mask == DDP_ATTN_MASK_BOOL) {                                          \
        const uint8_t *mr = (const uint8_t *)mask + mbase + i * g->mask_sl + j0 * g->mask_ss; \
        int64_t ss = g->mask_ss;                                                           \
        for (int64_t c = 0; c < cols; c++)                                                 \
          if (!mr[c * ss]) sr[c] = -INFINITY;                                              \
      }                                                                                    \
      if (g->causal)                                                                       \
        for (int64_t c = i - j0 + 1 < 0 ? 0 : i - j0 + 1; c < cols; c++) sr[c] = -INFINITY; \
    }                                                                                      \
  }
DEFINE_MASK_TILE(f32, float)
DEFINE_MASK_TILE(f64, double)

typedef struct {
  const ddp_attention_geom *g;
  void *out, *lse, *dq, *dk, *dv, *dmask; /* what the pass writes */
  const void *q, *k, *v, *mask, *dout, *o, *lse_in; /* what it reads */
  int oom; /* set by a task whose scratch could not be allocated */
} attn_job;

/* Forward of tasks [begin, end): task t = (head t / row_blocks, row block t % row_blocks). */
#define DEFINE_FORWARD(SUF, T, EXP, GEMM)                                                  \
  static void forward_##SUF(void *vj, int64_t begin, int64_t end) {                        \
    const attn_job *j = vj;                                                                \
    const ddp_attention_geom *g = j->g;                                                    \
    int64_t L = g->l, S = g->s, E = g->e, Ev = g->ev, nrb = (L + BR - 1) / BR;             \
    int64_t qs = g->q_sl, ks = g->k_sl, vs = g->v_sl; /* row strides of the views */      \
    T *s = malloc(sizeof(T) * BR * BC + sizeof(T) * 2 * BR + BC);                          \
    if (!s) {                                                                              \
      __atomic_store_n(&((attn_job *)vj)->oom, 1, __ATOMIC_RELAXED);                       \
      return;                                                                              \
    }                                                                                      \
    T *m = s + BR * BC, *l = m + BR;                                                       \
    uint8_t *keep = (uint8_t *)(l + BR);                                                   \
    int drop = g->dropout_p > 0;                                                           \
    uint64_t thr = ddp_attention_keep_threshold(g->dropout_p);                             \
    T inv_keep = drop ? (T)(1.0 / (1.0 - g->dropout_p)) : (T)1;                            \
    for (int64_t t = begin; t < end; t++) {                                                \
      int64_t bh = t / nrb, i0 = (t % nrb) * BR, rows = L - i0 < BR ? L - i0 : BR;         \
      const T *q = (const T *)j->q + batch_offset(g, g->q_sb, bh) + i0 * qs;               \
      const T *k = (const T *)j->k + batch_offset(g, g->k_sb, bh);                         \
      const T *v = (const T *)j->v + batch_offset(g, g->v_sb, bh);                         \
      T *o = (T *)j->out + (bh * L + i0) * Ev, *lse = (T *)j->lse + bh * L + i0;           \
      int64_t mbase = g->mask ? batch_offset(g, g->mask_sb, bh) : 0;                                      \
      memset(o, 0, sizeof(T) * (size_t)(rows * Ev));                                       \
      for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;                       \
      int64_t jend = g->causal && i0 + rows < S ? i0 + rows : S;                           \
      for (int64_t j0 = 0; j0 < jend; j0 += BC) {                                          \
        int64_t cols = jend - j0 < BC ? jend - j0 : BC;                                    \
        GEMM(0, 1, rows, cols, E, (T)g->scale, q, qs, k + j0 * ks, ks, 0, s, BC);          \
        if (g->mask || g->causal) mask_tile_##SUF(s, rows, cols, i0, j0, j->mask, mbase, g); \
        for (int64_t r = 0; r < rows; r++) {                                               \
          T *sr = s + r * BC, mx = row_max_##SUF(sr, cols);                                \
          T mnew = mx > m[r] ? mx : m[r];                                                  \
          T ref = mnew == -INFINITY ? 0 : mnew;                                            \
          T alpha = EXP(m[r] - ref);                                                       \
          l[r] = l[r] * alpha + row_exp_sum_##SUF(sr, cols, ref);                          \
          m[r] = mnew;                                                                     \
          if (alpha != 1) {                                                                \
            T *orow = o + r * Ev;                                                          \
            for (int64_t c = 0; c < Ev; c++) orow[c] *= alpha;                             \
          }                                                                                \
          if (drop) {                                                                      \
            keep_row(keep, (bh * L + i0 + r) * S + j0, cols, g, thr);                      \
            for (int64_t c = 0; c < cols; c++) sr[c] = keep[c] ? sr[c] * inv_keep : 0;     \
          }                                                                                \
        }                                                                                  \
        GEMM(0, 0, rows, Ev, cols, 1, s, BC, v + j0 * vs, vs, 1, o, Ev);                   \
      }                                                                                    \
      for (int64_t r = 0; r < rows; r++) {                                                 \
        T inv = S ? 1 / l[r] : 0, *orow = o + r * Ev; /* no keys: zeros, as q kT v */     \
        for (int64_t c = 0; c < Ev; c++) orow[c] *= inv;                                   \
        lse[r] = m[r] + log(l[r]);                                                         \
      }                                                                                    \
    }                                                                                      \
    free(s);                                                                               \
  }

/* Backward of heads [begin, end) (one head per task: its dk, dv rows and dq are its own). */
#define DEFINE_BACKWARD(SUF, T, EXP, GEMM)                                                 \
  static void backward_##SUF(void *vj, int64_t begin, int64_t end) {                       \
    const attn_job *j = vj;                                                                \
    const ddp_attention_geom *g = j->g;                                                    \
    int64_t L = g->l, S = g->s, E = g->e, Ev = g->ev;                                      \
    int64_t qs = g->q_sl, ks = g->k_sl, vs = g->v_sl; /* row strides of the views */      \
    T *p = malloc(sizeof(T) * (2 * BR * BC + L) + BC);                                     \
    if (!p) {                                                                              \
      __atomic_store_n(&((attn_job *)vj)->oom, 1, __ATOMIC_RELAXED);                       \
      return;                                                                              \
    }                                                                                      \
    T *dp = p + BR * BC, *D = dp + BR * BC;                                                \
    uint8_t *keep = (uint8_t *)(D + L);                                                    \
    int drop = g->dropout_p > 0;                                                           \
    uint64_t thr = ddp_attention_keep_threshold(g->dropout_p);                             \
    T inv_keep = drop ? (T)(1.0 / (1.0 - g->dropout_p)) : (T)1, scale = (T)g->scale;       \
    for (int64_t bh = begin; bh < end; bh++) {                                             \
      const T *q = (const T *)j->q + batch_offset(g, g->q_sb, bh);                         \
      const T *k = (const T *)j->k + batch_offset(g, g->k_sb, bh);                         \
      const T *v = (const T *)j->v + batch_offset(g, g->v_sb, bh);                         \
      const T *o = (const T *)j->o + bh * L * Ev;                                          \
      const T *dout = (const T *)j->dout + bh * L * Ev, *lse = (const T *)j->lse_in + bh * L; \
      T *dq = (T *)j->dq + bh * L * E, *dk = (T *)j->dk + bh * S * E;                      \
      T *dv = (T *)j->dv + bh * S * Ev;                                                    \
      T *dmask = j->dmask ? (T *)j->dmask + bh * L * S : NULL;                             \
      int64_t mbase = g->mask ? batch_offset(g, g->mask_sb, bh) : 0;                                      \
      if (dmask) memset(dmask, 0, sizeof(T) * (size_t)(L * S));                            \
      for (int64_t i = 0; i < L; i++) D[i] = row_dot_##SUF(dout + i * Ev, o + i * Ev, Ev);  \
      for (int64_t j0 = 0; j0 < S; j0 += BCB) {                                            \
        int64_t cols = S - j0 < BCB ? S - j0 : BCB;                                        \
        for (int64_t i0 = g->causal ? j0 / BR * BR : 0; i0 < L; i0 += BR) {                \
          int64_t rows = L - i0 < BR ? L - i0 : BR;                                        \
          if (g->causal && j0 > i0 + rows - 1) continue;                                   \
          GEMM(0, 1, rows, cols, E, scale, q + i0 * qs, qs, k + j0 * ks, ks, 0, p, BC);    \
          if (g->mask || g->causal) mask_tile_##SUF(p, rows, cols, i0, j0, j->mask, mbase, g); \
          GEMM(0, 1, rows, cols, Ev, 1, dout + i0 * Ev, Ev, v + j0 * vs, vs, 0, dp, BC);   \
          for (int64_t r = 0; r < rows; r++) {                                             \
            T *pr = p + r * BC, *dpr = dp + r * BC, li = lse[i0 + r], Di = D[i0 + r];      \
            for (int64_t c = 0; c < cols; c++) pr[c] = EXP(pr[c] - li);                    \
            if (drop) {                                                                    \
              keep_row(keep, (bh * L + i0 + r) * S + j0, cols, g, thr);                    \
              for (int64_t c = 0; c < cols; c++) {                                         \
                T z = keep[c] ? inv_keep : 0, pc = pr[c];                                  \
                dpr[c] = pc * (dpr[c] * z - Di);                                           \
                pr[c] = pc * z;                                                            \
              }                                                                            \
            } else {                                                                       \
              for (int64_t c = 0; c < cols; c++) dpr[c] = pr[c] * (dpr[c] - Di);           \
            }                                                                              \
            if (dmask) memcpy(dmask + (i0 + r) * S + j0, dpr, sizeof(T) * (size_t)cols);   \
          }                                                                                \
          /* p now holds the dropped probabilities, dp the score gradient ds */           \
          GEMM(1, 0, cols, Ev, rows, 1, p, BC, dout + i0 * Ev, Ev, 1, dv + j0 * Ev, Ev);   \
          GEMM(0, 0, rows, E, cols, scale, dp, BC, k + j0 * ks, ks, 1, dq + i0 * E, E);    \
          GEMM(1, 0, cols, E, rows, scale, dp, BC, q + i0 * qs, qs, 1, dk + j0 * E, E);    \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
    free(p);                                                                               \
  }

DEFINE_FORWARD(f32, float, exp_f32, gemm_f32)
DEFINE_FORWARD(f64, double, exp, gemm_f64)
DEFINE_BACKWARD(f32, float, exp_f32, gemm_f32)
DEFINE_BACKWARD(f64, double, exp, gemm_f64)

int ddp_cpu_attention_forward(int dtype, void *out, void *lse, const void *q, const void *k,
                              const void *v, const void *mask, const ddp_attention_geom *g) {
  attn_job j = {.g = g, .out = out, .lse = lse, .q = q, .k = k, .v = v, .mask = mask};
  int64_t tasks = g->bh * ((g->l + BR - 1) / BR);
  ddp_parallel_for(tasks, 1, dtype == DDP_F32 ? forward_f32 : forward_f64, &j);
  if (j.oom)
    DDP_FAIL(DDP_ERR_MEMORY, "scaled_dot_product_attention: out of memory for the kernel's tiles");
  return DDP_OK;
}

int ddp_cpu_attention_backward(int dtype, void *dq, void *dk, void *dv, void *dmask,
                               const void *dout, const void *q, const void *k, const void *v,
                               const void *out, const void *lse, const void *mask,
                               const ddp_attention_geom *g) {
  attn_job j = {.g = g, .dq = dq, .dk = dk, .dv = dv, .dmask = dmask, .dout = dout, .q = q,
                .k = k, .v = v, .o = out, .lse_in = lse, .mask = mask};
  ddp_parallel_for(g->bh, 1, dtype == DDP_F32 ? backward_f32 : backward_f64, &j);
  if (j.oom)
    DDP_FAIL(DDP_ERR_MEMORY,
             "ScaledDotProductAttentionBackward: out of memory for the kernel's tiles");
  return DDP_OK;
}
