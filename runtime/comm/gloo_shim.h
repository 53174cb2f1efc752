/* runtime/comm/gloo_shim.h: the C face of the Gloo shim (runtime/comm/gloo_shim.cc), used by
 * runtime/comm/pg_gloo.c only. The shim works on raw contiguous buffers; pg_gloo.c owns tensors,
 * dtype conversion, the queue and the communication thread.
 *
 * Every entry point catches every C++ exception and returns a status (enum ddp_status) with
 * the message written into `err` (capacity DDP_GLOO_ERR_CAP) and, for transport failures,
 * the group rank of the peer at fault in *peer (-1 when unknown). Nothing is thrown across
 * the C boundary. A context that failed once must not be used again (Gloo's contexts are
 * unusable after an exception); pg_gloo.c enforces that. */
#ifndef DDP_GLOO_SHIM_H
#define DDP_GLOO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DDP_GLOO_ERR_CAP = 1024 };

/* The rendezvous store as callbacks (pg_store.c adapts ddp_store to it). Each returns a status;
 * on failure it writes the reason into err. get waits (up to the store's timeout) and
 * returns a malloc'd value the shim frees with free(). */
typedef struct ddp_gloo_store {
  void *ctx;
  int (*set)(void *ctx, const char *key, const void *data, size_t len, char *err);
  int (*get)(void *ctx, const char *key, void **data, size_t *len, char *err);
  int (*wait)(void *ctx, const char *const *keys, int n, double timeout_s, char *err);
} ddp_gloo_store;

typedef struct ddp_gloo ddp_gloo;

/* Connect a full mesh of `size` ranks through `store` under `prefix`, binding `hostname`
 * or interface `iface` (exactly one non-NULL). Also publishes this rank's per-peer
 * addresses and reads everyone else's so transport errors can name the peer. */
int ddp_gloo_new(ddp_gloo **out, const ddp_gloo_store *store, const char *prefix, int rank,
                 int size, const char *hostname, const char *iface, double timeout_s,
                 char *err);
void ddp_gloo_free(ddp_gloo *g);
/* Make every operation of g, blocked now or started later, fail with `why` (any thread; not
 * during ddp_gloo_free): Note [gloo abort] in gloo_shim.cc. The peers' operations on the
 * closed connections fail too. NULL is ignored. */
void ddp_gloo_abort(ddp_gloo *g, const char *why);
void ddp_gloo_set_timeout(ddp_gloo *g, double timeout_s);

/* Collectives on contiguous buffers. `dtype` (enum ddp_dtype) is one of f32, f64, i64, i32,
 * u8 where a reduction happens; data movement takes any dtype and `esize` bytes per element.
 * `op`: enum ddp_reduce_op without AVG (pg_gloo.c turns AVG into SUM + divide). */
int ddp_gloo_allreduce(ddp_gloo *g, void *buf, size_t n, int dtype, int op, char *err,
                       int *peer);
int ddp_gloo_reduce(ddp_gloo *g, void *buf, size_t n, int dtype, int op, int root, char *err,
                    int *peer);
int ddp_gloo_broadcast(ddp_gloo *g, void *buf, size_t nbytes, int root, char *err, int *peer);
/* out holds size * nbytes. */
int ddp_gloo_allgather(ddp_gloo *g, void *out, const void *in, size_t nbytes, char *err,
                       int *peer);
/* out (size * nbytes) on the root only (NULL elsewhere). */
int ddp_gloo_gather(ddp_gloo *g, void *out, const void *in, size_t nbytes, int root, char *err,
                    int *peer);
/* in (size * nbytes) on the root only (NULL elsewhere); out nbytes. */
int ddp_gloo_scatter(ddp_gloo *g, void *out, const void *in, size_t nbytes, int root,
                     char *err, int *peer);
/* in and out hold size chunks of chunk_bytes. */
int ddp_gloo_alltoall(ddp_gloo *g, void *out, const void *in, size_t chunk_bytes, char *err,
                      int *peer);
/* Note [gloo ring reduce-scatter]: in holds size chunks of n elements (rank order; not
 * written); out (n elements) receives op over every rank's chunk `rank`. A ring, as the
 * first half of the ring all-reduce (Patarasuk and Yuan 2009; NCCL's ring): in step s
 * (0 .. size-2) rank r sends its running partial of chunk (r - s - 1) mod size to rank
 * r + 1 and receives rank r - 1's partial of chunk (r - s - 2) mod size, which it combines
 * with its own input; the last step's chunk is r, combined straight into out. Each rank
 * sends (size - 1) chunks, (size-1)/size of the input: half an all-reduce's traffic. The
 * dtypes of ddp_gloo_allreduce; op without AVG. */
int ddp_gloo_reduce_scatter(ddp_gloo *g, void *out, const void *in, size_t n, int dtype, int op,
                            char *err, int *peer);
/* Uneven all-to-all (gloo::alltoallv): in_bytes[j] bytes from in (back to back, rank
 * order) go to rank j, out_bytes[i] bytes from rank i land in out (back to back). */
int ddp_gloo_alltoallv(ddp_gloo *g, void *out, const int64_t *out_bytes, const void *in,
                       const int64_t *in_bytes, char *err, int *peer);
/* Point to point in two steps, so the communication thread never blocks on a peer that
 * has not posted its side yet: post (returns at once with a handle), then wait (any
 * thread; up to the context's timeout) and free. */
typedef struct ddp_gloo_p2p ddp_gloo_p2p;
int ddp_gloo_post_send(ddp_gloo *g, const void *buf, size_t nbytes, int dst, int tag,
                       ddp_gloo_p2p **out, char *err, int *peer);
int ddp_gloo_post_recv(ddp_gloo *g, void *buf, size_t nbytes, int src, int tag,
                       ddp_gloo_p2p **out, char *err, int *peer);
int ddp_gloo_p2p_wait(ddp_gloo_p2p *p, char *err, int *peer);
void ddp_gloo_p2p_free(ddp_gloo_p2p *p);
int ddp_gloo_barrier(ddp_gloo *g, char *err, int *peer);

#ifdef __cplusplus
}
#endif

#endif /* DDP_GLOO_SHIM_H */
