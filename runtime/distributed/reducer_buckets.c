/* runtime/distributed/reducer_buckets.c: which parameters share a bucket (Note [bucket assignment]
 * in ddplua/reducer.h) and the tensor digests of DistributedDataParallel.verify_sync. */
#include <stdlib.h>

#include "core/core.h"

/* Per-dtype state of the walk: the open bucket and how many buckets that dtype closed (the
 * first one gets the small cap). */
typedef struct {
  int open;        /* bucket id (walk numbering) or -1 */
  int64_t size;    /* bytes in the open bucket */
  int closed;      /* buckets of this dtype closed so far */
} dtype_walk;

int ddp_compute_bucket_assignment(int *bucket_of, int n, const int *order, const int64_t *bytes,
                                  const int *dtypes, int64_t bucket_cap_bytes,
                                  int64_t first_bucket_cap_bytes) {
  if (n < 0) return DDP_ERROR(DDP_ERR_ARG, "bucket assignment: n must be >= 0, got %d", n), -1;
  if (bucket_cap_bytes <= 0 || first_bucket_cap_bytes <= 0)
    return DDP_ERROR(DDP_ERR_ARG, "bucket assignment: caps must be > 0, got %lld and %lld",
                     (long long)bucket_cap_bytes, (long long)first_bucket_cap_bytes), -1;
  dtype_walk walk[DDP_DTYPE_COUNT];
  for (int d = 0; d < DDP_DTYPE_COUNT; d++) walk[d] = (dtype_walk){-1, 0, 0};
  /* first[k]: walk position of bucket k's first tensor; buckets get ids in creation order,
   * which is already the order of their first tensor's walk position. */
  for (int i = 0; i < n; i++) bucket_of[i] = -1;
  int n_buckets = 0;
  for (int pos = 0; pos < n; pos++) {
    int i = order ? order[pos] : n - 1 - pos;
    if (i < 0 || i >= n || bucket_of[i] != -1)
      return DDP_ERROR(DDP_ERR_ARG, "bucket assignment: the order is not a permutation of 0..%d "
                       "(entry %d is %d)", n - 1, pos, i), -1;
    int d = dtypes[i];
    if (d < 0 || d >= DDP_DTYPE_COUNT)
      return DDP_ERROR(DDP_ERR_ARG, "bucket assignment: tensor %d has an unknown dtype %d", i, d), -1;
    dtype_walk *w = &walk[d];
    if (w->open < 0) {
      w->open = n_buckets++;
      w->size = 0;
    }
    bucket_of[i] = w->open;
    w->size += bytes[i];
    int64_t cap = w->closed == 0 ? first_bucket_cap_bytes : bucket_cap_bytes;
    if (w->size >= cap) {
      w->open = -1;
      w->closed++;
    }
  }
  return n_buckets;
}

/* FNV-1a, 64 bits (http://www.isthe.com/chongo/tech/comp/fnv/). */
static const uint64_t FNV_OFFSET = 14695981039346656037ULL;
static const uint64_t FNV_PRIME = 1099511628211ULL;

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= FNV_PRIME;
  }
  return h;
}

uint64_t ddp_bytes_digest(const void *data, size_t n) {
  return fnv1a(FNV_OFFSET, data, n);
}

int ddp_tensor_digest(uint64_t *out, const ddp_tensor *t) {
  *out = 0;
  DDP_TRY(ddp_check_alive(t, "tensor_digest", "self"));
  ddp_tensor *c;
  int prev = ddp_set_grad_enabled(0); /* a digest is no part of any graph */
  /* A device tensor is digested from a contiguous host copy (never through host pointers). */
  int status = t->device != DDP_DEVICE_CPU
                   ? ddp_tensor_to_device(&c, (ddp_tensor *)t, DDP_DEVICE_CPU, 0)
                   : ddp_contiguous(&c, (ddp_tensor *)t);
  ddp_set_grad_enabled(prev);
  if (status) return status;
  uint64_t h = fnv1a(FNV_OFFSET, (const unsigned char *)ddp_data(c),
                     (size_t)c->numel * ddp_dtype_size(c->dtype));
  ddp_tensor_release(c);
  int32_t meta[2] = {t->dtype, t->ndim};
  h = fnv1a(h, (const unsigned char *)meta, sizeof meta);
  h = fnv1a(h, (const unsigned char *)t->shape, sizeof(int64_t) * (size_t)t->ndim);
  *out = h;
  return DDP_OK;
}
