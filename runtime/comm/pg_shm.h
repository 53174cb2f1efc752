/* runtime/comm/pg_shm.h: the shared-memory collectives of a process group whose ranks
 * all run on this host (runtime/comm/pg_shm.c), used by runtime/comm/pg_gloo.c,
 * and its arrival step, which pg_nccl.c also uses to exchange fingerprints (Note [collective
 * fingerprints] in pg_fingerprint.h).
 *
 * pg_gloo.c creates it after the Gloo group is connected and calls it in the FIFO order of
 * Note [collective order] (ddplua/pg.h), one collective at a time, in place of Gloo for:
 * all-reduce and reduce-scatter of the dtypes ddp_shm_supports accepts, broadcast and
 * all-gather of any dtype, and barrier (the arrival step alone). Everything else keeps
 * going through Gloo. Results are bitwise identical on every rank: each element is reduced
 * by one computation over the ranks in order 0 .. world-1.
 *
 * Buffers may lie in the segment's arena (ddp_shm_alloc: DDP's gradient buckets,
 * dist.shared_buffer); an all-reduce whose buffers all lie there runs without staging copies
 * (Note [shm zero copy] in pg_shm.c).
 *
 * Errors follow gloo_shim.h: a status, the reason in `err` (DDP_GLOO_ERR_CAP bytes) and the
 * group rank at fault in *peer (-1 when unknown). After a failure the segment's counters no
 * longer agree between ranks: pg_gloo.c aborts the group, as after a Gloo failure (Note
 * [group abort] in pg.c), which poisons the segment (ddp_shm_abort). */
#ifndef DDP_PG_SHM_H
#define DDP_PG_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

typedef struct ddp_shm ddp_shm;

/* Decide together, through `store` under `prefix`, whether the group uses shared memory,
 * and map the segment when it does. Every rank of the group calls it once at group
 * creation. It is used when $DDPLUA_SHM is not "0" on every rank, world_size >= 2, every
 * rank reports the same host identity (host name, boot id, IPC/PID/mount namespaces), and
 * every rank mapped the segment rank 0 created; otherwise every rank gets *out = NULL and
 * DDP_OK (all fall back to Gloo: the decision is never split). Fails (with the core error
 * set) only when the store does (a rank never arrived). */
int ddp_shm_new(ddp_shm **out, ddp_store *store, const char *prefix, int rank, int world_size,
                const int *global);

/* The hosts of a group whose ranks ddp_shm_new (called first, on every rank) found on
 * different hosts: leader[r] = the lowest group rank on the same host as group rank r,
 * from the host identities ddp_shm_new published under `prefix`. *known = 0 (and leader[r]
 * = r) when some rank published no identity ($DDPLUA_SHM=0 there, or unreadable): nobody
 * may then assume shared memory with anyone. Every rank reads the same values, so every
 * rank gets the same answer. Fails (core error set) only when the store does. */
int ddp_shm_hosts(ddp_store *store, const char *prefix, int rank, int world_size,
                  const int *global, int *leader, int *known);

/* 1 when ddp_shm_run takes all-reduce buffers of this dtype (f32, f64), else 0. */
int ddp_shm_supports(int dtype);

enum { DDP_SHM_FP_BYTES = 256 }; /* the largest fingerprint record ddp_shm_arrive takes */

/* What a collective through the segment does (ddp_shm_arrive, then ddp_shm_run). */
enum ddp_shm_kind {
  DDP_SHM_ARRIVE = 0, /* only the arrival: fingerprints (barrier, collectives through Gloo) */
  DDP_SHM_ALLREDUCE,  /* buf: n elements of dtype (f32, f64), in place, op without AVG */
  DDP_SHM_BROADCAST,  /* buf: n bytes, root's copied into every rank's */
  DDP_SHM_ALLGATHER,  /* buf: n bytes per rank in; out: size * n bytes, rank order */
  DDP_SHM_REDUCE_SCATTER /* buf: size * n elements of dtype (f32, f64) in, not written; out:
                          * n elements, op (without AVG) over the ranks' chunk `rank` of buf
                          * (Note [shm reduce-scatter] in pg_shm.c) */
};

typedef struct ddp_shm_op {
  int kind;  /* enum ddp_shm_kind */
  void *buf;
  void *out;
  size_t n;  /* elements (all-reduce; reduce-scatter: per rank) or bytes (broadcast,
              * all-gather) */
  int dtype, op, root;
} ddp_shm_op;

/* The arrival step every collective of the group starts with (Note [shm arrival] in
 * pg_shm.c): publish this rank's fingerprint `fp` (fp_bytes <= DDP_SHM_FP_BYTES, the same
 * on every rank) and its digest, wait for every rank; *agreed = 1 when every rank's digest
 * equals `digest`, else 0 and every rank's record is copied into `all` (size * fp_bytes,
 * group-rank order). `op` (NULL: DDP_SHM_ARRIVE) names the collective, so that its first
 * data step rides on the arrival; when *agreed, call ddp_shm_run with the same op next.
 * Errors as ddp_shm_run. */
int ddp_shm_arrive(ddp_shm *s, const void *fp, size_t fp_bytes, uint64_t digest, void *all,
                   int *agreed, const ddp_shm_op *op, double timeout_s, char *err, int *peer);

/* The rest of collective `op` after its arrival. Waits at most timeout_s for the peers in
 * each phase: DDP_ERR_TIMEOUT naming the ranks that did not arrive; DDP_ERR_PEER when a peer's
 * process died or closed the group; DDP_ERR_STATE for an op the segment does not take. */
int ddp_shm_run(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err, int *peer);

/* *peer after a wait found the group aborted (Note [shm abort] in pg_shm.c): the status
 * is DDP_ERR_PEER and err holds the first abort's message. */
enum { DDP_SHM_PEER_ABORTED = -4 };

/* Poison the segment for every rank of the group (Note [shm abort]): every wait, now or
 * later, of every rank fails with the first poisoner's `msg`. Any thread; idempotent (the
 * first message stays). NULL s is ignored. */
void ddp_shm_abort(ddp_shm *s, const char *msg);

/* 1 when the segment is poisoned, with the first message in msg (DDP_GLOO_ERR_CAP bytes). */
int ddp_shm_aborted(ddp_shm *s, char *msg);

/* `nbytes` of zeroed memory in this rank's part of the segment's arena (Note [shm arena]),
 * page aligned, or NULL when the arena has no room left (or the kernel gives no pages: a
 * full /dev/shm). Release it with ddp_shm_dealloc(p, s); it may outlive the group (the
 * mapping stays until the last block and the group are gone). Thread-safe. */
void *ddp_shm_alloc(ddp_shm *s, size_t nbytes);

/* Return a block of ddp_shm_alloc (ctx: its ddp_shm); the signature of ddp_deleter_fn. */
void ddp_shm_dealloc(void *p, void *ctx);

/* Tell the peers this rank left; unmap once no block of the arena is alive. NULL is
 * ignored. */
void ddp_shm_free(ddp_shm *s);

#endif /* DDP_PG_SHM_H */
