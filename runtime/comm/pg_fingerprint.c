/* runtime/comm/pg_fingerprint.c: building and comparing collective fingerprints
 * (Note [collective fingerprints] in pg_fingerprint.h). The exchange itself belongs to each
 * backend (pg_gloo.c, pg_shm.c, pg_nccl.c). */
#include <stdio.h>
#include <string.h>

#include "comm/pg_fingerprint.h"

int pg_fp_applies(pg_op kind) { return kind != PG_SEND && kind != PG_RECV; }

uint64_t pg_fp_group(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 1099511628211ull;
}

uint64_t pg_fp_digest(const pg_fp *fp) {
  uint64_t h = mix(mix(1469598103934665603ull, fp->seq), fp->group);
  h = mix(h, ((uint64_t)(uint32_t)fp->kind << 32) | (uint32_t)fp->op);
  h = mix(h, ((uint64_t)(uint32_t)fp->dtype << 32) | (uint32_t)fp->root);
  h = mix(mix(h, (uint64_t)fp->ndim), (uint64_t)fp->numel);
  for (int i = 0; i < fp->ndim && i < DDP_MAX_DIMS; i++) h = mix(h, (uint64_t)fp->shape[i]);
  return h;
}

static int reduces(pg_op kind) {
  kind = pg_op_path(kind); /* Note [sharding collectives] */
  return kind == PG_ALLREDUCE || kind == PG_REDUCE || kind == PG_REDUCE_SCATTER;
}

static int has_root(pg_op kind) {
  return kind == PG_BROADCAST || kind == PG_REDUCE || kind == PG_GATHER || kind == PG_SCATTER;
}

void pg_fp_make(pg_fp *fp, const ddp_pg *pg, const ddp_work *w, uint64_t seq) {
  memset(fp, 0, sizeof *fp);
  fp->seq = seq;
  fp->group = pg->fp_group;
  fp->kind = (int32_t)w->kind;
  fp->op = reduces(w->kind) ? w->op : -1;
  fp->root = has_root(w->kind) ? w->root : -1;
  fp->rank = pg->global[pg->rank];
  /* The tensor that describes the call on every rank: scatter's input exists on the root
   * only, its output everywhere. */
  const ddp_tensor *t = w->kind == PG_SCATTER ? w->out : w->t;
  fp->dtype = t ? t->dtype : -1;
  if (t) {
    fp->ndim = t->ndim;
    fp->numel = t->numel;
    memcpy(fp->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    /* all_to_all_single's rows differ between ranks with uneven splits: only the row's
     * shape must agree (dim 0 and the count are recorded as -1). */
    if (w->kind == PG_ALLTOALL_SINGLE && t->ndim >= 1) fp->shape[0] = fp->numel = -1;
  }
  memcpy(fp->site, w->site, sizeof fp->site); /* NUL-terminated: ddp_pg_set_call_site */
}

static int same(const pg_fp *a, const pg_fp *b) {
  if (a->seq != b->seq || a->group != b->group || a->kind != b->kind || a->op != b->op ||
      a->dtype != b->dtype || a->root != b->root || a->ndim != b->ndim || a->numel != b->numel)
    return 0;
  for (int i = 0; i < a->ndim && i < DDP_MAX_DIMS; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* "all_reduce(op sum, f32, shape (4), #3)" into out; the kind is range-checked because the
 * record came from another process. */
static void describe(const pg_fp *fp, char *out, size_t cap) {
  const char *name = fp->kind >= 0 && fp->kind < PG_OP_COUNT ? pg_op_names[fp->kind] : "?";
  size_t n = (size_t)snprintf(out, cap, "%s(", name);
  if (n < cap && fp->op >= 0) {
    const char *op = ddp_reduce_op_name(fp->op);
    n += (size_t)snprintf(out + n, cap - n, "op %s, ", op ? op : "?");
  }
  if (n < cap && fp->dtype >= 0) {
    int nd = fp->ndim >= 0 && fp->ndim <= DDP_MAX_DIMS ? fp->ndim : 0;
    const char *dt = ddp_dtype_name(fp->dtype);
    n += (size_t)snprintf(out + n, cap - n, "%s, shape %s, ", dt ? dt : "?",
                          ddp_shape_str(nd, fp->shape));
  }
  if (n < cap && fp->root >= 0) n += (size_t)snprintf(out + n, cap - n, "root %d, ", fp->root);
  if (n < cap) snprintf(out + n, cap - n, "#%llu)", (unsigned long long)fp->seq);
}

int pg_fp_check(const ddp_pg *pg, const pg_fp *all, char *msg, size_t cap) {
  int me = pg->rank, other = -1;
  /* Every rank compares the same array in the same order: the same verdict everywhere.
   * The pair named is the first rank that differs from rank 0 (and rank 0). */
  for (int r = 1; r < pg->size; r++)
    if (!same(&all[0], &all[r])) {
      other = r;
      break;
    }
  if (other < 0) return DDP_OK;
  int a = me == other ? other : 0; /* this rank's side first where it is one of the pair */
  int b = a == 0 ? other : 0;
  char da[256], db[256];
  describe(&all[a], da, sizeof da);
  describe(&all[b], db, sizeof db);
  const char *name = all[me].kind >= 0 && all[me].kind < PG_OP_COUNT ? pg_op_names[all[me].kind]
                                                                      : "collective";
  snprintf(msg, cap, "%s on rank %d: collective mismatch in process group '%s': rank %d called "
           "%s at %.*s, but rank %d called %s at %.*s (every rank must call the same collectives "
           "in the same order with the same shapes, dtypes, ops and roots)",
           name, pg->global[me], pg->prefix, pg->global[a], da, PG_FP_SITE - 1,
           all[a].site[0] ? all[a].site : "an unknown place", pg->global[b], db, PG_FP_SITE - 1,
           all[b].site[0] ? all[b].site : "an unknown place");
  return DDP_ERR_ARG;
}
