/* runtime/distributed/pg_shm.h: the shared-memory all-reduce of a process group whose ranks all run
 * on this host (runtime/distributed/pg_shm.c), used by runtime/distributed/pg_gloo.c, and its
 * arrival step, which pg_nccl.c also uses to exchange fingerprints (Note [collective
 * fingerprints] in pg_fingerprint.h).
 *
 * pg_gloo.c creates it after the Gloo group is connected and calls it from the group's one
 * communication thread, in the FIFO order of Note [collective order] (ddplua/pg.h), in place
 * of ddp_gloo_allreduce for the dtypes ddp_shm_supports accepts. Everything else keeps going
 * through Gloo. Results are bitwise identical on every rank: each element is reduced by one
 * rank, over the ranks in order 0 .. world-1.
 *
 * Errors follow gloo_shim.h: a status, the reason in `err` (DDP_GLOO_ERR_CAP bytes) and the
 * group rank at fault in *peer (-1 when unknown). After a failure the segment's counters no
 * longer agree between ranks: pg_gloo.c breaks the group, as after a Gloo failure. */
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

/* 1 when ddp_shm_allreduce takes buffers of this dtype (f32, f64), else 0. */
int ddp_shm_supports(int dtype);

enum { DDP_SHM_FP_BYTES = 256 }; /* the largest fingerprint record ddp_shm_arrive takes */

/* The arrival step every collective of the group starts with (Note [shm arrival] in
 * pg_shm.c): publish this rank's fingerprint `fp` (fp_bytes <= DDP_SHM_FP_BYTES, the same
 * on every rank) and its digest, wait for every rank; *agreed = 1 when every rank's digest
 * equals `digest`, else 0 and every rank's record is copied into `all` (size * fp_bytes,
 * group-rank order). For an all-reduce through the segment pass its buffer (buf: n
 * elements of dtype, f32 or f64) so the first chunk is copied in in the same step, then
 * call ddp_shm_allreduce; else buf NULL. Errors as ddp_shm_allreduce. */
int ddp_shm_arrive(ddp_shm *s, const void *fp, size_t fp_bytes, uint64_t digest, void *all,
                   int *agreed, const void *buf, size_t n, int dtype, double timeout_s,
                   char *err, int *peer);

/* In-place all-reduce of the n contiguous elements at buf (op: enum ddp_reduce_op without
 * AVG), right after ddp_shm_arrive was given the same buf. Waits at most timeout_s for the
 * peers in each phase: DDP_ERR_TIMEOUT naming the ranks that did not arrive; DDP_ERR_PEER
 * when a peer's process died or closed the group. */
int ddp_shm_allreduce(ddp_shm *s, void *buf, size_t n, int dtype, int op, double timeout_s,
                      char *err, int *peer);

/* Tell the peers this rank left, unmap. NULL is ignored. */
void ddp_shm_free(ddp_shm *s);

#endif /* DDP_PG_SHM_H */
