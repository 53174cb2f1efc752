/* runtime/distributed/sampler.c: DistributedSampler indices (Note [sampler rules], ddplua/sampler.h). */
#include <stdlib.h>

#include "core/core.h"

static int check_args(const char *op, int64_t n, int64_t world, int64_t rank, int drop_last,
                      int pad) {
  if (n < 0) DDP_FAIL(DDP_ERR_ARG, "%s: dataset size must be >= 0, got %lld", op, (long long)n);
  if (world < 1)
    DDP_FAIL(DDP_ERR_ARG, "%s: num_replicas (world size) must be >= 1, got %lld", op,
             (long long)world);
  if (rank < 0 || rank >= world)
    DDP_FAIL(DDP_ERR_ARG, "%s: rank %lld is outside [0, %lld) for num_replicas = %lld", op,
             (long long)rank, (long long)world, (long long)world);
  if (!pad && drop_last)
    DDP_FAIL(DDP_ERR_ARG,
             "%s: pad = false (evaluation mode) and drop_last = true exclude each other", op);
  return DDP_OK;
}

/* Samples per rank and the padded/truncated list length (PyTorch's num_samples and
 * total_size); in evaluation mode total_size is n and num_samples this rank's share. */
static void sizes(int64_t n, int64_t world, int64_t rank, int drop_last, int pad,
                  int64_t *num_samples, int64_t *total_size) {
  if (!pad) {
    *num_samples = n > rank ? (n - rank + world - 1) / world : 0;
    *total_size = n;
  } else if (drop_last) {
    *num_samples = n / world;
    *total_size = *num_samples * world;
  } else {
    *num_samples = (n + world - 1) / world;
    *total_size = *num_samples * world;
  }
}

int ddp_dist_sampler_len(int64_t *out, int64_t n, int64_t world, int64_t rank, int drop_last,
                         int pad) {
  *out = 0;
  DDP_TRY(check_args("DistributedSampler", n, world, rank, drop_last, pad));
  int64_t total;
  sizes(n, world, rank, drop_last, pad, out, &total);
  return DDP_OK;
}

int ddp_dist_sampler_indices(ddp_tensor **out, int64_t n, int64_t world, int64_t rank,
                             int shuffle, int64_t seed, int64_t epoch, int drop_last, int pad) {
  *out = NULL;
  DDP_TRY(check_args("DistributedSampler", n, world, rank, drop_last, pad));
  int64_t num_samples, total_size;
  sizes(n, world, rank, drop_last, pad, &num_samples, &total_size);

  ddp_tensor *base = NULL;
  if (shuffle) {
    /* A fresh generator per call: the order depends on seed + epoch only, so every rank
     * draws the same permutation without communicating. */
    ddp_generator *g = NULL;
    DDP_TRY(ddp_generator_new(&g, (uint64_t)seed + (uint64_t)epoch));
    int status = ddp_randperm(&base, n, DDP_I64, g);
    ddp_generator_free(g);
    DDP_TRY(status);
  }
  int status = ddp_tensor_empty(out, 1, &num_samples, DDP_I64, DDP_DEVICE_CPU);
  if (status) {
    if (base) ddp_tensor_release(base);
    return status;
  }
  const int64_t *perm = base ? (const int64_t *)ddp_tensor_data(base) : NULL;
  int64_t *dst = (int64_t *)ddp_tensor_data(*out);
  /* Element k of this rank is list[rank + k * world]; padding repeats the list from the
   * front, so list[i] = base[i % n] (i < total_size, which is < n when nothing is padded). */
  for (int64_t k = 0; k < num_samples; k++) {
    int64_t i = (rank + k * world) % n;
    dst[k] = perm ? perm[i] : i;
  }
  if (base) ddp_tensor_release(base);
  return DDP_OK;
}
