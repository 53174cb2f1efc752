/* runtime/backend/cuda/nccl_api.h: the NCCL half of the process groups, as a C table the
 * CUDA plug-in exports (runtime/backend/cuda/nccl.cu: ddp_cuda_nccl_table, stored in
 * ddp_cuda_api.nccl) and the process groups call (runtime/comm/pg_nccl.c, backend "nccl"). It is
 * part of the plug-in's interface, so it lives with the backend (the distributed layer above
 * includes it; the backend never includes a distributed header). C-compatible: it is
 * included by C (pg_nccl.c, the simulated device) and by C++ (nccl.cu).
 *
 * Conventions for every entry:
 *  - int results are DDP_OK or a DDP_ERR_* status with the error recorded by ddp_fail_at; the
 *    message names the NCCL call and ncclGetErrorString's text (and ncclGetLastError's).
 *  - `dtype` is a ddplua dtype (DDP_F32 ...; bool travels as bytes and is never reduced);
 *    `op` a ddp_reduce_op (AVG is NCCL's ncclAvg: divided on the device, floating dtypes).
 *  - Buffers are device pointers on the communicator's device, contiguous, `count` elements.
 *  - Ordering (as PyTorch's ProcessGroupNCCL): each communicator owns one communication
 *    stream. A collective first makes that stream wait for an event recorded on the calling
 *    thread's CURRENT stream of the communicator's device (so it sees every kernel that
 *    produced its inputs), enqueues the NCCL call on the communication stream, records a new
 *    event there and returns it in *event (the work handle; free it with event_free). The
 *    host does not wait. Keep the buffers alive until the event completed, or record them on
 *    comm_stream() with the caching allocator (ddp_cuda_record_stream).
 *  - wait_stream(c, e): the current stream waits for e (torch's work.wait(): the host goes
 *    on). wait_host(c, e, timeout_s): the host blocks until e completed, polling
 *    ncclCommGetAsyncError; a communicator error (a peer died: ncclRemoteError/SystemError)
 *    gives DDP_ERR_PEER, running past timeout_s gives DDP_ERR_TIMEOUT; in both cases the
 *    communicator is aborted (ncclCommAbort), so nothing hangs, and every later call on it
 *    fails with DDP_ERR_STATE.
 *  - Communicators are created non-blocking (ncclConfig_t.blocking = 0): every call that
 *    returns ncclInProgress is polled with ncclCommGetAsyncError until it settles, bounded by
 *    the communicator's timeout (init: the timeout given; later calls: the same value), with
 *    ncclCommAbort and DDP_ERR_TIMEOUT when it runs out.
 *
 * Bump DDP_NCCL_API_ABI whenever this struct changes. */
#ifndef DDP_PG_NCCL_H
#define DDP_PG_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_NCCL_API_ABI 2 /* 2: all_to_allv */
#define DDP_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct ddp_nccl_comm ddp_nccl_comm; /* one ncclComm_t, its device, stream, timeout */

struct ddp_nccl_api {
  int abi; /* DDP_NCCL_API_ABI */
  int version; /* NCCL_VERSION_CODE the plug-in was built with */

  /* ---- communicators ---- */
  /* A fresh unique id (ncclGetUniqueId) into id (DDP_NCCL_ID_BYTES bytes): rank 0 makes it
   * and hands it to the others (through the store). */
  int (*get_unique_id)(unsigned char *id);
  /* Join communicator `id` as `rank` of `size` on CUDA device `device`, waiting at most
   * timeout_s (> 0) for every rank to join (ncclCommInitRankConfig, non-blocking). On
   * failure nothing is left behind (the half-made communicator is aborted). */
  int (*comm_init)(ddp_nccl_comm **out, const unsigned char *id, int rank, int size, int device,
                   double timeout_s);
  /* Finish the communicator's queued work (ncclCommFinalize, bounded by its timeout), then
   * destroy it; aborts it when finalizing fails or runs out. NULL is ignored. */
  void (*comm_destroy)(ddp_nccl_comm *c);
  /* Abort now (ncclCommAbort): pending work is dropped, peers see this rank vanish. The
   * handle stays valid for comm_destroy, every other call then fails. */
  void (*comm_abort)(ddp_nccl_comm *c);
  /* Timeout of later waits and settles (> 0). */
  void (*set_timeout)(ddp_nccl_comm *c, double timeout_s);
  /* The communication stream (cudaStream_t) and the device. */
  void *(*comm_stream)(ddp_nccl_comm *c);
  int (*comm_device)(ddp_nccl_comm *c);
  /* "" while healthy, else the first failure's message. */
  const char *(*comm_error)(ddp_nccl_comm *c);

  /* ---- collectives (see the ordering rules above); *event receives the work handle ---- */
  /* In place: buf = op over every rank's buf. */
  int (*all_reduce)(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int op, void **event);
  /* buf of rank root copied to every rank. */
  int (*broadcast)(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int root,
                   void **event);
  /* out (size * count) = every rank's in (count), in rank order. */
  int (*all_gather)(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype,
                    void **event);
  /* in (size * count): out (count) = op over every rank's chunk [rank * count, +count). */
  int (*reduce_scatter)(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype,
                        int op, void **event);
  /* buf of rank root = op over every rank's buf; other ranks' buf unchanged. */
  int (*reduce)(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int op, int root,
                void **event);
  /* out (size * count, root only; NULL elsewhere) = every rank's in (count), rank order.
   * ncclSend/ncclRecv in one group. */
  int (*gather)(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype, int root,
                void **event);
  /* in (size * count, root only; NULL elsewhere): every rank's out (count) = chunk rank. */
  int (*scatter)(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype, int root,
                 void **event);
  /* in, out (size * count): chunk j of rank i's in goes to chunk i of rank j's out. */
  int (*all_to_all)(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype,
                    void **event);
  /* Uneven all-to-all: in_counts[j] elements of in (back to back, rank order) go to rank j;
   * out_counts[i] elements from rank i land in out (back to back). ncclSend/ncclRecv in one
   * group (this rank's own part copied on the stream). */
  int (*all_to_allv)(ddp_nccl_comm *c, void *out, const size_t *out_counts, const void *in,
                     const size_t *in_counts, int dtype, void **event);
  /* Point to point with group rank peer (no tags in NCCL: messages between a pair match in
   * issue order). */
  int (*send)(ddp_nccl_comm *c, const void *buf, size_t count, int dtype, int peer,
              void **event);
  int (*recv)(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int peer, void **event);
  /* A one-element all-reduce on a scratch buffer of the communicator. */
  int (*barrier)(ddp_nccl_comm *c, void **event);

  /* ---- work handles ---- */
  int (*wait_stream)(ddp_nccl_comm *c, void *event);
  int (*wait_host)(ddp_nccl_comm *c, void *event, double timeout_s);
  /* *done = 1 once the event completed; a communicator error fails (DDP_ERR_PEER). */
  int (*query)(ddp_nccl_comm *c, void *event, int *done);
  void (*event_free)(void *event);
};

#ifdef __cplusplus
}
#endif

#endif
