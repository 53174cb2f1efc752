/* runtime/core/rng.c: Philox 4x32-10 generators and randperm (the random fills, which are
 * ops, are in runtime/ops/random.c).
 *
 * Algorithm: Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3"
 * (SC11), the Random123 constants. A generator is (seed, offset): element i of a fill of n
 * elements uses 32-bit word (i % 4) of block philox(counter = offset + i / 4, key = seed);
 * the fill then advances offset by ceil(n / 4) blocks (normals use two words per element).
 * Every element depends only on (seed, offset, i), so fills are independent of thread
 * count and can be split across threads. */
#include <math.h>
#include <stdlib.h>

#include "core/core.h"

struct ddp_generator {
  uint64_t seed;
  uint64_t offset; /* next unused 128-bit counter block */
};

static ddp_generator default_generator = {0, 0};

enum { PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u };
enum { PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u };

void ddp_philox4x32_10(uint32_t out[4], const uint32_t counter[4], const uint32_t key[2]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The 4 words of block `b` of generator state (seed, base offset). */
static void block(uint32_t out[4], uint64_t seed, uint64_t b) {
  uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  ddp_philox4x32_10(out, ctr, key);
}

void ddp_generator_take(ddp_generator *g, uint64_t blocks, uint64_t *seed, uint64_t *base) {
  if (!g) g = &default_generator;
  *seed = g->seed;
  *base = g->offset;
  g->offset += blocks;
}

int ddp_generator_new(ddp_generator **out, uint64_t seed) {
  *out = calloc(1, sizeof **out);
  if (!*out) DDP_FAIL(DDP_ERR_MEMORY, "generator_new: out of memory");
  (*out)->seed = seed;
  return DDP_OK;
}

void ddp_generator_free(ddp_generator *g) {
  if (g != &default_generator) free(g);
}

ddp_generator *ddp_generator_default(void) { return &default_generator; }

void ddp_generator_manual_seed(ddp_generator *g, uint64_t seed) {
  if (!g) g = &default_generator;
  g->seed = seed;
  g->offset = 0;
}

void ddp_generator_get_state(const ddp_generator *g, uint64_t *seed, uint64_t *offset) {
  if (!g) g = &default_generator;
  *seed = g->seed;
  *offset = g->offset;
}

void ddp_generator_set_state(ddp_generator *g, uint64_t seed, uint64_t offset) {
  if (!g) g = &default_generator;
  g->seed = seed;
  g->offset = offset;
}

int ddp_randperm(ddp_tensor **out, int64_t n, int dtype, ddp_generator *g) {
  *out = NULL;
  if (n < 0) DDP_FAIL(DDP_ERR_ARG, "randperm: n must be >= 0, got %lld", (long long)n);
  if (dtype == DDP_BOOL || dtype == DDP_U8 || dtype < 0 || dtype >= DDP_DTYPE_COUNT)
    DDP_FAIL(DDP_ERR_ARG, "randperm: dtype %s cannot hold a permutation", ddp_dtype_name(dtype));
  if (!g) g = &default_generator;
  int64_t *perm = malloc((size_t)(n ? n : 1) * sizeof *perm);
  if (!perm) DDP_FAIL(DDP_ERR_MEMORY, "randperm: out of memory for n = %lld", (long long)n);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  /* Fisher-Yates from the top (Knuth, TAOCP vol. 2, Algorithm P): 64 bits per swap */
  for (int64_t i = n - 1; i > 0; i--) {
    uint32_t w[4];
    block(w, g->seed, g->offset + (uint64_t)i / 2);
    uint64_t x = ((uint64_t)w[(i & 1) * 2 + 1] << 32) | w[(i & 1) * 2];
    int64_t j = (int64_t)(x % (uint64_t)(i + 1));
    int64_t tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  g->offset += ((uint64_t)n + 1) / 2;
  int status = ddp_tensor_from_data(out, 1, &n, dtype, perm, DDP_I64);
  free(perm);
  return status;
}
