/* runtime/ops/random.c: the random fills (uniform_, normal_, bernoulli_, randint_) over
 * the core's Philox generators (runtime/core/rng.c: the counter-based scheme and the
 * element-to-word mapping are described there). Every element depends only on (seed,
 * offset, i), so fills are independent of thread count and of the device. */
#include <math.h>

#include "core/core.h"
#include "ops/copy.h"

/* The 4 words of block `b` of generator state (seed, base offset). */
static void block(uint32_t out[4], uint64_t seed, uint64_t b) {
  uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  ddp_philox4x32_10(out, ctr, key);
}

enum { KIND_UNIFORM, KIND_NORMAL, KIND_BERNOULLI, KIND_RANDINT };

typedef struct {
  int kind, dtype;
  uint64_t seed, base;   /* generator state at the start of the fill */
  int64_t numel;
  int64_t strides[DDP_MAX_DIMS], shape[DDP_MAX_DIMS];
  int ndim;
  char *data;
  size_t esize;
  double a, b;           /* uniform [a, b); normal mean a std b; bernoulli p a */
  uint64_t range;        /* randint: high - low */
  int64_t low;
} fill_job;

/* Uniform double in [0, 1) from 32 random bits (and 21 more for full double precision when
 * hi is given): (x >> 11) * 2^-53. */
static inline double u01(uint32_t lo, uint32_t hi) {
  uint64_t x = ((uint64_t)hi << 32) | lo;
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* Element i's value from the words of its block (see the header comment: uniform,
 * bernoulli and randint take 64 bits = words (2 (i % 2), 2 (i % 2) + 1) of block i / 2;
 * normal takes the whole block i). */
static double value_from(const fill_job *j, const uint32_t w[4], int64_t i) {
  int h = (int)(i & 1) * 2;
  switch (j->kind) {
  case KIND_UNIFORM:
    return j->a + (j->b - j->a) * u01(w[h], w[h + 1]);
  case KIND_NORMAL: {
    double u1 = 1.0 - u01(w[0], w[1]), u2 = u01(w[2], w[3]); /* u1 in (0, 1] */
    return j->a + j->b * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
  }
  case KIND_BERNOULLI:
    return u01(w[h], w[h + 1]) < j->a ? 1.0 : 0.0;
  default: /* randint: 64 random bits modulo the range (bias below 2^-32 for any range that
              fits in 32 bits) */
    return (double)(j->low + (int64_t)((((uint64_t)w[h + 1] << 32) | w[h]) % j->range));
  }
}

static void fill_range(void *vj, int64_t begin, int64_t end) {
  fill_job *j = vj;
  int64_t idx[DDP_MAX_DIMS] = {0}, rem = begin;
  for (int d = j->ndim - 1; d >= 0; d--) {
    idx[d] = rem % j->shape[d];
    rem /= j->shape[d];
  }
  int per_block = j->kind == KIND_NORMAL ? 1 : 2;
  uint64_t have = UINT64_MAX; /* block number held in w */
  uint32_t w[4];
  int64_t off = 0;
  for (int d = 0; d < j->ndim; d++) off += idx[d] * j->strides[d];
  for (int64_t i = begin; i < end; i++) {
    uint64_t blk = (uint64_t)i / (uint64_t)per_block;
    if (blk != have) {
      block(w, j->seed, j->base + blk);
      have = blk;
    }
    void *p = j->data + off * (int64_t)j->esize;
    if (j->kind == KIND_RANDINT && j->dtype == DDP_I64) { /* exact beyond 2^53 */
      int h = (int)(i & 1) * 2;
      *(int64_t *)p = j->low + (int64_t)((((uint64_t)w[h + 1] << 32) | w[h]) % j->range);
    } else if (j->kind == KIND_BERNOULLI) {
      int h = (int)(i & 1) * 2;
      ddp_store_f64(p, j->dtype, u01(w[h], w[h + 1]) < j->a ? 1.0 : 0.0);
    } else if (j->dtype == DDP_F32 && j->kind != KIND_RANDINT) {
      float f = (float)value_from(j, w, i);
      /* rounding to float may reach the excluded upper bound: keep [a, b) half-open */
      if (j->kind == KIND_UNIFORM && f >= (float)j->b && j->b > j->a)
        f = nextafterf((float)j->b, -INFINITY);
      *(float *)p = f;
    } else {
      ddp_store_f64(p, j->dtype, value_from(j, w, i));
    }
    /* next index in row-major order, keeping the storage offset incrementally */
    for (int d = j->ndim - 1; d >= 0; d--) {
      off += j->strides[d];
      if (++idx[d] < j->shape[d]) break;
      off -= idx[d] * j->strides[d];
      idx[d] = 0;
    }
  }
}

static int run_fill_host(ddp_tensor *t, fill_job *j, ddp_generator *g);

/* A fill of a device tensor: the numbers are drawn on the host into a contiguous CPU
 * tensor of t's shape, with the same generator and element order, then copied over, so a
 * seeded fill gives the same values on every device and advances the generator the same.
 * This costs a host-to-device transfer of t: fine for initialisation; per-step draws
 * (dropout masks) would be faster from a device Philox kernel, which the counter-based
 * scheme allows without changing the numbers. */
static int run_fill_device(ddp_tensor *t, fill_job *j, ddp_generator *g, const char *op) {
  ddp_tensor *host = NULL, *staged = NULL;
  DDP_TRY(ddp_tensor_empty(&host, t->ndim, t->shape, t->dtype, DDP_DEVICE_CPU));
  int status = run_fill_host(host, j, g);
  size_t nbytes = (size_t)t->numel * ddp_dtype_size(t->dtype);
  if (!status && ddp_tensor_is_contiguous(t)) {
    status = ddp_device_memcpy(ddp_data(t), t->device, ddp_data(host), DDP_DEVICE_CPU, nbytes, op);
    if (!status) ddp_tensor_bump_version(t);
  } else if (!status) { /* strided: stage contiguously on the device, then scatter there */
    status = ddp_tensor_empty(&staged, t->ndim, t->shape, t->dtype, t->device);
    if (!status)
      status = ddp_device_memcpy(ddp_data(staged), t->device, ddp_data(host), DDP_DEVICE_CPU,
                                 nbytes, op);
    if (!status) status = ddp_copy_raw(t, staged, op); /* bumps t's version */
  }
  ddp_tensor_release(host);
  ddp_tensor_release(staged);
  return status;
}

static int run_fill(ddp_tensor *t, fill_job *j, ddp_generator *g, const char *op) {
  if (t->device != DDP_DEVICE_CPU) return run_fill_device(t, j, g, op);
  DDP_TRY(run_fill_host(t, j, g));
  ddp_tensor_bump_version(t);
  return DDP_OK;
}

/* Draw into CPU tensor t (any strides) and advance the generator. */
static int run_fill_host(ddp_tensor *t, fill_job *j, ddp_generator *g) {
  uint64_t blocks = j->kind == KIND_NORMAL ? (uint64_t)t->numel : ((uint64_t)t->numel + 1) / 2;
  ddp_generator_take(g, blocks, &j->seed, &j->base);
  j->dtype = t->dtype;
  j->numel = t->numel;
  j->ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) {
    j->shape[d] = t->shape[d];
    j->strides[d] = t->strides[d];
  }
  j->data = ddp_data(t);
  j->esize = ddp_dtype_size(t->dtype);
  ddp_parallel_for(t->numel, 16384, fill_range, j);
  return DDP_OK;
}

int ddp_uniform_(ddp_tensor *t, double lo, double hi, ddp_generator *g) {
  DDP_TRY(ddp_check_alive(t, "uniform_", "self"));
  if (!ddp_dtype_is_floating(t->dtype))
    DDP_FAIL(DDP_ERR_ARG, "uniform_: needs a floating tensor, got %s", ddp_dtype_name(t->dtype));
  if (!(lo <= hi)) DDP_FAIL(DDP_ERR_ARG, "uniform_: from (%g) must be <= to (%g)", lo, hi);
  fill_job j = {.kind = KIND_UNIFORM, .a = lo, .b = hi};
  return run_fill(t, &j, g, "uniform_");
}

int ddp_normal_(ddp_tensor *t, double mean, double std, ddp_generator *g) {
  DDP_TRY(ddp_check_alive(t, "normal_", "self"));
  if (!ddp_dtype_is_floating(t->dtype))
    DDP_FAIL(DDP_ERR_ARG, "normal_: needs a floating tensor, got %s", ddp_dtype_name(t->dtype));
  if (!(std >= 0)) DDP_FAIL(DDP_ERR_ARG, "normal_: std must be >= 0, got %g", std);
  fill_job j = {.kind = KIND_NORMAL, .a = mean, .b = std};
  return run_fill(t, &j, g, "normal_");
}

int ddp_bernoulli_(ddp_tensor *t, double p, ddp_generator *g) {
  DDP_TRY(ddp_check_alive(t, "bernoulli_", "self"));
  if (!(p >= 0 && p <= 1)) DDP_FAIL(DDP_ERR_ARG, "bernoulli_: p must be in [0, 1], got %g", p);
  fill_job j = {.kind = KIND_BERNOULLI, .a = p};
  return run_fill(t, &j, g, "bernoulli_");
}

int ddp_randint_(ddp_tensor *t, int64_t low, int64_t high, ddp_generator *g) {
  DDP_TRY(ddp_check_alive(t, "randint_", "self"));
  if (low >= high)
    DDP_FAIL(DDP_ERR_ARG, "randint_: low (%lld) must be < high (%lld)", (long long)low,
             (long long)high);
  fill_job j = {.kind = KIND_RANDINT, .low = low, .range = (uint64_t)(high - low)};
  return run_fill(t, &j, g, "randint_");
}

