/* runtime/distributed/comm_hook_powersgd.c: the PowerSGD communication hook (ddplua/comm_hook.h,
 * DDP_COMM_HOOK_POWER_SGD) and its state, after PyTorch's
 * torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py (powerSGD_hook, PowerSGDState,
 * _orthogonalize, _should_compress) and Vogels, Karimireddy, Jaggi, "PowerSGD: Practical
 * Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019.
 *
 * Note [PowerSGD]: for bucket k of an iteration (state.iter counts finished iterations):
 *   iter < start_powerSGD_iter: plain allreduce_hook (bucket /= world, all-reduce SUM).
 *   else, at launch:
 *     1. error feedback: bucket += error[k] (zeros the first time); keep a copy `input`.
 *     2. each parameter slot viewed as an (n, m) matrix M (n = its first dimension, m the
 *        rest; a 0-dimensional one is (1, 1)); with r = min(n, m, rank) it is compressed
 *        when (n + m) * r * min_compression_rate < n * m, else (biases, small layers) it
 *        goes into the uncompressed memory U, all-reduced as it is.
 *     3. P and Q memories (one flat tensor each for the bucket, every matrix's P (n, r)
 *        and Q (m, r) row-major in slot order) are kept per bucket with warm_start; fresh
 *        ones (first time, or every time without warm_start) get Q ~ N(0, 1) from a seed
 *        the state's generator draws (ddp_powersgd_state_new); Q is orthogonalised either
 *        way (Gram-Schmidt, below).
 *     4. P = M Q for every compressed matrix; launch all-reduce(U), then all-reduce(P).
 *   at finalize (bucket order, so every rank launches the Q all-reduces in one order):
 *     5. U /= world, copied back into its slots.
 *     6. P orthogonalised (not divided: orthogonalisation removes the scale); Q = M^T P;
 *        all-reduce(Q), Q /= world; M = P Q^T written into the bucket.
 *     7. error[k] = input - bucket (error feedback); without warm_start P and Q are dropped.
 * Gram-Schmidt (PyTorch's _orthogonalize): for each column i: col /= (|col| + epsilon)
 * (epsilon 0: |col|), then every later column j -= <col, col_j> col.
 * The matrix products and the orthogonalisation run in double precision on the host over
 * the bucket's dtype (f32, f64; f16/bf16 under a compress wrapper), rounding once when
 * stored; what goes on the wire is the bucket's dtype.
 *
 * Note [PowerSGD sums]: each entry of P = M Q, Q = M^T P and M = P Q^T is a sum of products
 * added in index order with fma() written out: the compiler contracts `acc += a * b` into a
 * fused multiply-add only where it chooses to (a loop it vectorizes may keep the product
 * rounded), so the bits would depend on the optimizer; every rank runs the same code, and
 * a release to another compiler keeps the same results. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/kernels.h"
#include "distributed/comm_hook_internal.h"

struct ddp_powersgd_state {
  int refs;
  int rank;                      /* matrix_approximation_rank */
  int64_t start_iter;
  double min_rate;
  int error_feedback, warm_start;
  double eps;
  ddp_generator *gen;            /* draws the seeds of fresh Qs */
  int64_t iter;
  int64_t numel_before, numel_after;
  int n_mem;                     /* entries of the per-bucket memories below */
  ddp_tensor **error, **p_mem, **q_mem;
};

/* One compressed matrix of a bucket. */
typedef struct {
  int64_t off;                   /* element offset of its slot in the bucket */
  int64_t n, m, r;
  int64_t p_off, q_off;          /* in the P and Q memories */
} psgd_matrix;

struct powersgd_flight {
  int vanilla;                   /* before start_powerSGD_iter: a plain all-reduce */
  ddp_work *work_u, *work_p;
  ddp_tensor *u;                 /* (u_numel,) the uncompressed slots, concatenated */
  ddp_tensor *input;             /* error feedback: the bucket after adding the error */
  int n_mat;
  psgd_matrix *mat;
  int n_unc;
  int64_t *unc_off, *unc_numel;  /* uncompressed slots: offset in the bucket, size */
};

/* ---- the state ------------------------------------------------------------------------------ */

int ddp_powersgd_state_new(ddp_powersgd_state **out, int matrix_approximation_rank,
                           int64_t start_powerSGD_iter, double min_compression_rate,
                           int use_error_feedback, int warm_start,
                           double orthogonalization_epsilon, uint64_t random_seed) {
  *out = NULL;
  if (matrix_approximation_rank < 1)
    DDP_FAIL(DDP_ERR_ARG, "PowerSGDState: matrix_approximation_rank must be >= 1, got %d",
             matrix_approximation_rank);
  if (start_powerSGD_iter < 0)
    DDP_FAIL(DDP_ERR_ARG, "PowerSGDState: start_powerSGD_iter must be >= 0, got %lld",
             (long long)start_powerSGD_iter);
  if ((use_error_feedback || warm_start) && start_powerSGD_iter <= 1)
    DDP_FAIL(DDP_ERR_ARG, "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or "
             "`warm_start` is enabled, because PowerSGD can only be applied after the first two "
             "iterations in DDP.");
  if (!(min_compression_rate >= 0))
    DDP_FAIL(DDP_ERR_ARG, "PowerSGDState: min_compression_rate must be >= 0, got %g",
             min_compression_rate);
  if (!(orthogonalization_epsilon >= 0))
    DDP_FAIL(DDP_ERR_ARG, "PowerSGDState: orthogonalization_epsilon must be >= 0, got %g",
             orthogonalization_epsilon);
  ddp_powersgd_state *s = calloc(1, sizeof *s);
  if (!s) DDP_FAIL(DDP_ERR_MEMORY, "PowerSGDState: out of memory");
  int status = ddp_generator_new(&s->gen, random_seed);
  if (status) {
    free(s);
    return status;
  }
  s->refs = 1;
  s->rank = matrix_approximation_rank;
  s->start_iter = start_powerSGD_iter;
  s->min_rate = min_compression_rate;
  s->error_feedback = use_error_feedback != 0;
  s->warm_start = warm_start != 0;
  s->eps = orthogonalization_epsilon;
  *out = s;
  return DDP_OK;
}

void powersgd_state_retain(ddp_powersgd_state *s) {
  if (s) s->refs++;
}

void ddp_powersgd_state_free(ddp_powersgd_state *s) {
  if (!s || --s->refs > 0) return;
  for (int k = 0; k < s->n_mem; k++) {
    ddp_tensor_release(s->error[k]);
    ddp_tensor_release(s->p_mem[k]);
    ddp_tensor_release(s->q_mem[k]);
  }
  free(s->error);
  free(s->p_mem);
  free(s->q_mem);
  ddp_generator_free(s->gen);
  free(s);
}

int64_t ddp_powersgd_state_iter(const ddp_powersgd_state *s) { return s ? s->iter : 0; }

void powersgd_state_next_iter(ddp_powersgd_state *s) { s->iter++; }

void ddp_powersgd_state_stats(const ddp_powersgd_state *s, int64_t *numel_before,
                              int64_t *numel_after) {
  *numel_before = s ? s->numel_before : 0;
  *numel_after = s ? s->numel_after : 0;
}

int ddp_powersgd_state_error(const ddp_powersgd_state *s, int k, ddp_tensor **out) {
  *out = NULL;
  if (!s || k < 0 || k >= s->n_mem || !s->error[k]) return DDP_OK;
  return ddp_clone(out, s->error[k]);
}

static int ensure_mem(ddp_powersgd_state *s, int n) {
  if (n <= s->n_mem) return DDP_OK;
  ddp_tensor **e = realloc(s->error, sizeof *e * (size_t)n);
  if (e) s->error = e;
  ddp_tensor **p = e ? realloc(s->p_mem, sizeof *p * (size_t)n) : NULL;
  if (p) s->p_mem = p;
  ddp_tensor **q = p ? realloc(s->q_mem, sizeof *q * (size_t)n) : NULL;
  if (q) s->q_mem = q;
  if (!e || !p || !q) DDP_FAIL(DDP_ERR_MEMORY, "powerSGD_hook: out of memory");
  for (int k = s->n_mem; k < n; k++) s->error[k] = s->p_mem[k] = s->q_mem[k] = NULL;
  s->n_mem = n;
  return DDP_OK;
}

/* ---- blocks of the bucket's dtype in double scratch ---------------------------------------- */

/* w (count doubles) = the elements [off, off + count) of t (contiguous, on the host), exact;
 * and back, rounding once to t's dtype: the CPU table's cast_scale (Note [reduction
 * entries]), so this file has no loop over typed elements. */
static void load_block(double *w, const ddp_tensor *t, int64_t off, int64_t count) {
  ddp_cpu_kernels.cast_scale(DDP_F64, w, t->dtype, ddp_data(t) + off * (int64_t)ddp_dtype_size(t->dtype),
                             count, 1.0, 0);
}

static void store_block(ddp_tensor *t, int64_t off, const double *w, int64_t count) {
  ddp_cpu_kernels.cast_scale(t->dtype, ddp_data(t) + off * (int64_t)ddp_dtype_size(t->dtype), DDP_F64,
                             w, count, 1.0, 0);
}

/* Gram-Schmidt on the (rows, cols) row-major block of t at element offset off (Note
 * [PowerSGD]), through the double scratch w (rows * cols). */
static void orthogonalize(ddp_tensor *t, int64_t off, int64_t rows, int64_t cols, double eps,
                          double *w) {
  load_block(w, t, off, rows * cols);
  for (int64_t c = 0; c < cols; c++) {
    double norm = 0;
    for (int64_t i = 0; i < rows; i++) norm += w[i * cols + c] * w[i * cols + c];
    norm = sqrt(norm) + eps;
    for (int64_t i = 0; i < rows; i++) w[i * cols + c] /= norm;
    for (int64_t j = c + 1; j < cols; j++) {
      double dot = 0;
      for (int64_t i = 0; i < rows; i++) dot += w[i * cols + c] * w[i * cols + j];
      for (int64_t i = 0; i < rows; i++) w[i * cols + j] -= dot * w[i * cols + c];
    }
  }
  store_block(t, off, w, rows * cols);
}

/* ---- the hook -------------------------------------------------------------------------------- */

void powersgd_flight_free(powersgd_flight *f) {
  if (!f) return;
  if (f->work_u) ddp_work_free(f->work_u);
  if (f->work_p) ddp_work_free(f->work_p);
  ddp_tensor_release(f->u);
  ddp_tensor_release(f->input);
  free(f->mat);
  free(f->unc_off);
  free(f->unc_numel);
  free(f);
}

static int launch_allreduce(ddp_reducer *r, ddp_pg *pg, int k, ddp_tensor *t, ddp_work **w,
                            int64_t *bytes, const char *what) {
  *w = NULL;
  if (!pg || t->numel == 0) return DDP_OK; /* the layout is the same on every rank */
  char site[80];
  snprintf(site, sizeof site, "DistributedDataParallel powerSGD_hook %s, bucket %d", what, k);
  ddp_pg_set_call_site(site, 0);
  int status = ddp_pg_allreduce(w, pg, t, DDP_REDUCE_SUM);
  if (status) {
    *w = NULL;
    return DDP_ERROR(status, "DistributedDataParallel: could not launch powerSGD_hook's all-reduce "
                     "of %s for gradient bucket %d on rank %d: %s", what, k, r->rank,
                     ddp_last_error());
  }
  *bytes += t->numel * (int64_t)ddp_dtype_size(t->dtype);
  return DDP_OK;
}

static int flat_tensor(ddp_tensor **out, int64_t numel, int dtype) {
  int64_t shape[1] = {numel};
  return ddp_tensor_zeros(out, 1, shape, dtype, DDP_DEVICE_CPU);
}

/* Fresh Qs for bucket k: one seed drawn from the state's generator, then N(0, 1) per matrix
 * in slot order (ddp_powersgd_state_new). */
static int randomize_qs(ddp_powersgd_state *st, ddp_tensor *q_mem, const powersgd_flight *f) {
  ddp_tensor *seed_t;
  int64_t one[1] = {1};
  DDP_TRY(ddp_tensor_empty(&seed_t, 1, one, DDP_I64, DDP_DEVICE_CPU));
  int status = ddp_randint_(seed_t, 0, 1000000000, st->gen);
  uint64_t seed = status ? 0 : (uint64_t)((int64_t *)ddp_data(seed_t))[0];
  ddp_tensor_release(seed_t);
  if (status) return status;
  ddp_generator *g;
  DDP_TRY(ddp_generator_new(&g, seed));
  for (int i = 0; i < f->n_mat && !status; i++) {
    const psgd_matrix *mt = &f->mat[i];
    int64_t shape[2] = {mt->m, mt->r}, strides[2] = {mt->r, 1};
    ddp_tensor *v = NULL;
    status = ddp_tensor_view_raw(&v, q_mem, 2, shape, strides, mt->q_off);
    if (!status) status = ddp_normal_(v, 0.0, 1.0, g);
    ddp_tensor_release(v);
  }
  ddp_generator_free(g);
  return status;
}

static int plan(ddp_powersgd_state *st, ddp_reducer *r, int k, powersgd_flight *f,
                int64_t *p_total, int64_t *q_total, int64_t *u_total) {
  bucket *b = &r->buckets[k];
  f->mat = calloc((size_t)b->n_vars, sizeof *f->mat);
  f->unc_off = calloc((size_t)b->n_vars, sizeof(int64_t));
  f->unc_numel = calloc((size_t)b->n_vars, sizeof(int64_t));
  if (!f->mat || !f->unc_off || !f->unc_numel) DDP_FAIL(DDP_ERR_MEMORY, "powerSGD_hook: out of memory");
  *p_total = *q_total = *u_total = 0;
  for (int s = 0; s < b->n_vars; s++) {
    const ddp_tensor *p = r->params[b->vars[s]];
    int64_t n = p->ndim ? p->shape[0] : 1;
    int64_t m = n ? p->numel / n : 0;
    int64_t rk = st->rank;
    if (n < rk) rk = n;
    if (m < rk) rk = m;
    /* PyTorch's _should_compress */
    int compress = (double)((n + m) * rk) * st->min_rate < (double)(n * m);
    st->numel_before += n * m;
    if (compress) {
      st->numel_after += (n + m) * rk;
      f->mat[f->n_mat++] = (psgd_matrix){b->offsets[s], n, m, rk, *p_total, *q_total};
      *p_total += n * rk;
      *q_total += m * rk;
    } else {
      st->numel_after += n * m;
      f->unc_off[f->n_unc] = b->offsets[s];
      f->unc_numel[f->n_unc++] = p->numel;
      *u_total += p->numel;
    }
  }
  return DDP_OK;
}

/* The double scratch both halves of the step use for one matrix at a time, three buffers
 * of `per` doubles each (per = the largest m * r, n * r or m of the bucket's matrices): w, a
 * copy of the matrix's Q (m * r) or P (n * r) and orthogonalise's work space; acc, the
 * sums of Q = M^T P (m * r); row, one row of M (m) and of P or the product (r <= m * r).
 * NULL when out of memory; the caller frees it (one allocation, w first). */
static double *matrix_scratch(const powersgd_flight *f, int64_t *per) {
  int64_t scratch = 1;
  for (int i = 0; i < f->n_mat; i++) {
    const psgd_matrix *mt = &f->mat[i];
    if (mt->m * mt->r > scratch) scratch = mt->m * mt->r;
    if (mt->n * mt->r > scratch) scratch = mt->n * mt->r;
    if (mt->m > scratch) scratch = mt->m;
  }
  *per = scratch;
  return malloc(sizeof(double) * 3 * (size_t)scratch);
}

int powersgd_launch(ddp_powersgd_state *st, ddp_reducer *r, int k, ddp_tensor *t, ddp_pg *pg,
                    int world, powersgd_flight **out, int64_t *bytes) {
  powersgd_flight *f = calloc(1, sizeof *f);
  if (!f) DDP_FAIL(DDP_ERR_MEMORY, "powerSGD_hook: out of memory");
  *out = f;
  if (st->iter < st->start_iter) { /* Note [PowerSGD]: plain all-reduce first */
    f->vanilla = 1;
    DDP_TRY(ddp_div_scalar_(t, (double)world));
    return launch_allreduce(r, pg, k, t, &f->work_u, bytes, "the bucket");
  }
  DDP_TRY(ensure_mem(st, r->n_buckets));
  int64_t numel = t->numel;
  if (st->error_feedback) { /* 1. */
    if (st->error[k] && st->error[k]->numel == numel && st->error[k]->dtype == t->dtype) {
      DDP_TRY(ddp_add_(t, st->error[k]));
    } else {
      ddp_tensor_release(st->error[k]);
      st->error[k] = NULL;
      DDP_TRY(flat_tensor(&st->error[k], numel, t->dtype));
    }
    DDP_TRY(ddp_clone(&f->input, t));
  }
  int64_t p_total = 0, q_total = 0, u_total = 0; /* 2. */
  DDP_TRY(plan(st, r, k, f, &p_total, &q_total, &u_total));
  DDP_TRY(flat_tensor(&f->u, u_total, t->dtype));
  for (int i = 0, at = 0; i < f->n_unc; at += (int)f->unc_numel[i], i++)
    memcpy(ddp_data(f->u) + at * (int64_t)ddp_dtype_size(t->dtype),
           ddp_data(t) + f->unc_off[i] * (int64_t)ddp_dtype_size(t->dtype),
           (size_t)(f->unc_numel[i] * (int64_t)ddp_dtype_size(t->dtype)));
  int fresh = !st->warm_start || !st->p_mem[k] || st->p_mem[k]->numel != p_total ||
              st->q_mem[k]->numel != q_total || st->p_mem[k]->dtype != t->dtype; /* 3. */
  if (fresh) {
    ddp_tensor_release(st->p_mem[k]);
    ddp_tensor_release(st->q_mem[k]);
    st->p_mem[k] = st->q_mem[k] = NULL;
    DDP_TRY(flat_tensor(&st->p_mem[k], p_total, t->dtype));
    DDP_TRY(flat_tensor(&st->q_mem[k], q_total, t->dtype));
    DDP_TRY(randomize_qs(st, st->q_mem[k], f));
  }
  ddp_tensor *P = st->p_mem[k], *Q = st->q_mem[k];
  int64_t per;
  double *w = matrix_scratch(f, &per);
  if (!w) DDP_FAIL(DDP_ERR_MEMORY, "powerSGD_hook: out of memory");
  double *mrow = w + 2 * per, *prow = w + per; /* a row of M; a row of P */
  for (int i = 0; i < f->n_mat; i++) { /* 3., 4.: P = M Q */
    const psgd_matrix *mt = &f->mat[i];
    orthogonalize(Q, mt->q_off, mt->m, mt->r, st->eps, w);
    load_block(w, Q, mt->q_off, mt->m * mt->r);
    for (int64_t row = 0; row < mt->n; row++) {
      load_block(mrow, t, mt->off + row * mt->m, mt->m);
      for (int64_t c = 0; c < mt->r; c++) {
        double acc = 0; /* Note [PowerSGD sums] */
        for (int64_t j = 0; j < mt->m; j++) acc = fma(mrow[j], w[j * mt->r + c], acc);
        prow[c] = acc;
      }
      store_block(P, mt->p_off + row * mt->r, prow, mt->r);
    }
  }
  free(w);
  DDP_TRY(launch_allreduce(r, pg, k, f->u, &f->work_u, bytes, "the uncompressed tensors"));
  return launch_allreduce(r, pg, k, P, &f->work_p, bytes, "P");
}

int powersgd_finish(ddp_powersgd_state *st, ddp_reducer *r, int k, ddp_tensor *t, ddp_pg *pg,
                    int world, powersgd_flight *f, int64_t *bytes) {
  if (!f) DDP_FAIL(DDP_ERR_STATE, "powerSGD_hook: gradient bucket %d was never launched", k);
  DDP_TRY(comm_hook_wait_work(r, pg, k, f->work_u, "all-reduce"));
  if (f->vanilla) return DDP_OK;
  size_t es = ddp_dtype_size(t->dtype);
  DDP_TRY(ddp_div_scalar_(f->u, (double)world)); /* 5. */
  for (int i = 0, at = 0; i < f->n_unc; at += (int)f->unc_numel[i], i++)
    memcpy(ddp_data(t) + f->unc_off[i] * (int64_t)es, ddp_data(f->u) + at * (int64_t)es,
           (size_t)f->unc_numel[i] * es);
  ddp_tensor_bump_version(t);
  DDP_TRY(comm_hook_wait_work(r, pg, k, f->work_p, "all-reduce of P"));
  ddp_tensor *P = st->p_mem[k], *Q = st->q_mem[k];
  int64_t per;
  double *w = matrix_scratch(f, &per);
  if (!w) DDP_FAIL(DDP_ERR_MEMORY, "powerSGD_hook: out of memory");
  double *acc = w + per, *row_buf = w + 2 * per;
  for (int i = 0; i < f->n_mat; i++) { /* 6.: orthogonalise P, Q = M^T P */
    const psgd_matrix *mt = &f->mat[i];
    orthogonalize(P, mt->p_off, mt->n, mt->r, st->eps, w);
    load_block(w, P, mt->p_off, mt->n * mt->r);
    /* acc[j r + c] = sum over rows, in row order, of M[row, j] P[row, c]: row by row, so
     * M is read along its rows, each sum still adding its terms in the same order */
    for (int64_t a = 0; a < mt->m * mt->r; a++) acc[a] = 0;
    for (int64_t row = 0; row < mt->n; row++) {
      load_block(row_buf, t, mt->off + row * mt->m, mt->m);
      for (int64_t j = 0; j < mt->m; j++)
        for (int64_t c = 0; c < mt->r; c++)
          acc[j * mt->r + c] = fma(row_buf[j], w[row * mt->r + c], acc[j * mt->r + c]);
    }
    store_block(Q, mt->q_off, acc, mt->m * mt->r);
  }
  ddp_work *wq = NULL;
  int status = launch_allreduce(r, pg, k, Q, &wq, bytes, "Q");
  if (!status) status = comm_hook_wait_work(r, pg, k, wq, "all-reduce of Q");
  if (wq) ddp_work_free(wq);
  if (!status) status = ddp_div_scalar_(Q, (double)world);
  for (int i = 0; i < f->n_mat && !status; i++) { /* M = P Q^T */
    const psgd_matrix *mt = &f->mat[i];
    load_block(w, Q, mt->q_off, mt->m * mt->r);
    for (int64_t row = 0; row < mt->n; row++) {
      load_block(acc, P, mt->p_off + row * mt->r, mt->r); /* P's row */
      for (int64_t j = 0; j < mt->m; j++) {
        double sum = 0;
        for (int64_t c = 0; c < mt->r; c++) sum = fma(acc[c], w[j * mt->r + c], sum);
        row_buf[j] = sum;
      }
      store_block(t, mt->off + row * mt->m, row_buf, mt->m);
    }
  }
  free(w);
  if (status) return status;
  ddp_tensor_bump_version(t);
  if (st->error_feedback) { /* 7. error = input - decompressed */
    DDP_TRY(ddp_copy_(st->error[k], f->input));
    DDP_TRY(ddp_sub_(st->error[k], t));
  }
  if (!st->warm_start) {
    ddp_tensor_release(st->p_mem[k]);
    ddp_tensor_release(st->q_mem[k]);
    st->p_mem[k] = st->q_mem[k] = NULL;
  }
  return DDP_OK;
}
