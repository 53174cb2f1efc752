/* runtime/comm/pg_fingerprint.h: collective fingerprints (internal to the process-group
 * files; see Note [collective fingerprints]).
 *
 * Note [collective fingerprints]: before any data of a collective moves, the ranks of the
 * group exchange a fixed-size record describing the call -- sequence number in the group,
 * collective, reduce op, dtype, element count and shape, root, group -- and each rank's
 * Lua call site. Every rank sees the same array of records and reaches the same verdict,
 * so on a mismatch every rank of the group fails, at the same collective, naming both
 * fingerprints, the ranks and the call sites, and nothing was reduced or overwritten.
 * Where the exchange happens (so its cost rides on a synchronisation the backend does
 * anyway):
 *   gloo with shared memory  the segment's arrival step (pg_shm.c, ddp_shm_arrive): an
 *                            all-reduce's first chunk is copied in in the same step;
 *   gloo over TCP            a fixed-size Gloo all-gather of the records before the data
 *                            (fixed size: Gloo itself can never see two sizes);
 *   nccl                     the same shared-memory arrival step when every rank is on
 *                            this host (a host barrier; the GPU is not waited for), else
 *                            an NCCL all-gather of the records waited for on the host
 *                            (which drains the current stream before each collective).
 * Point-to-point messages (send, recv) carry no fingerprint: they are not group-wide.
 * After a mismatch the group is broken, as after a transport failure. */
#ifndef DDP_PG_FINGERPRINT_H
#define DDP_PG_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "comm/pg_internal.h"

enum { PG_FP_SITE = PG_SITE_CAP, PG_FP_BYTES = 192 };

/* One rank's record of one collective. Plain data of a fixed size, identical in layout on
 * every rank of a job (same build), exchanged raw. */
typedef struct pg_fp {
  uint64_t seq;                  /* collectives this rank ran in the group before this one */
  uint64_t group;                /* FNV-1a hash of the group's prefix */
  int32_t kind;                  /* pg_op */
  int32_t op;                    /* enum ddp_reduce_op, -1 where nothing is reduced */
  int32_t dtype;                 /* enum ddp_dtype, -1 for barrier */
  int32_t root;                  /* group rank of src/dst, -1 where there is none */
  int32_t ndim;
  int32_t rank;                  /* the sender's global rank (not compared) */
  int64_t numel;
  int64_t shape[DDP_MAX_DIMS];   /* (ndim) */
  char site[PG_FP_SITE];         /* "file:line" of the Lua caller, or "" (not compared) */
} pg_fp;
_Static_assert(sizeof(pg_fp) == PG_FP_BYTES, "pg_fp is exchanged raw: keep its size fixed");

/* The group field of the fingerprints of the group meeting under `prefix` (a hash). */
uint64_t pg_fp_group(const char *prefix);

/* 1 when collectives of this kind are fingerprinted (all but send and recv). */
int pg_fp_applies(pg_op kind);

/* Fill *fp for work item w of group pg at sequence number seq (w's tensors as the caller
 * gave them: for scatter the output describes the call on every rank). */
void pg_fp_make(pg_fp *fp, const ddp_pg *pg, const ddp_work *w, uint64_t seq);

/* A 64-bit digest of the compared fields of *fp (all but rank and site): equal records
 * have equal digests, so ranks whose digests agree need not look at each other's records
 * (the shared-memory arrival compares digests in the cache line it reads anyway). */
uint64_t pg_fp_digest(const pg_fp *fp);

/* Compare the pg->size records of `all` (in group-rank order). 0 when they agree; else
 * writes into msg (cap bytes) the mismatch, naming the collective, both fingerprints, the
 * ranks and their call sites, and returns DDP_ERR_ARG. */
int pg_fp_check(const ddp_pg *pg, const pg_fp *all, char *msg, size_t cap);

#endif /* DDP_PG_FINGERPRINT_H */
