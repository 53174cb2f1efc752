/* runtime/comm/pg_gloo.c: backend "gloo" of the process groups (Note [pg backend] in
 * pg_internal.h): collectives on host memory, run in order on the group's communication
 * thread (pg_queue.c), through the Gloo shim (gloo_shim.h, gloo_shim.cc), and all-reduce of
 * f32/f64, broadcast, all-gather and barrier through shared memory instead when every rank is
 * on this host (pg_shm.h; $DDPLUA_SHM=0 turns that off); a group whose ranks span hosts, with
 * several on some host, all-reduces hierarchically (Note [hierarchical all-reduce]). Blocking
 * collectives through shared memory run on the calling thread when the queue is idle (Note
 * [inline collectives] in pg_queue.c). This file owns the tensor staging (contiguous copies,
 * f16/bf16 through f32, AVG as SUM then divide) and the error messages naming ranks.
 *
 * Note [gloo staging]: the gloo backend given CUDA tensors runs the collective on host
 * copies, as PyTorch's ProcessGroupGloo does for CUDA tensors: inputs are copied to the host
 * at submission (synchronously, on the caller's current stream, so the copy sees the
 * kernels that produced them), outputs are copied back to their device by the communication
 * thread once the collective succeeded, before the work completes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernels.h"
#include "comm/gloo_shim.h"
#include "comm/pg_fingerprint.h"
#include "comm/pg_internal.h"
#include "comm/pg_recorder.h"
#include "comm/pg_shm.h"

enum { POSTED = -1 }; /* run_transport: a point-to-point message was posted, not finished */
/* The `peer` of a failure: -2 a local (staging) failure, -3 a fingerprint mismatch whose
 * message is complete in `err` (Note [collective fingerprints]). */
enum { PEER_LOCAL = -2, PEER_MISMATCH = -3 };
/* DDP_SHM_PEER_ABORTED (pg_shm.h, -4): the segment was poisoned, err holds the first failure. */

/* The state of a gloo group (ddp_pg.impl). */
typedef struct gloo_state {
  ddp_gloo *gloo;
  ddp_shm *shm;             /* NULL: all-reduce goes through Gloo too */
  /* Note [hierarchical all-reduce]: set when the ranks span hosts and some host has several */
  int hier;                 /* 1: all-reduce of f32/f64 goes node, leaders, node */
  ddp_shm *node_shm;        /* this host's ranks (NULL when this rank is alone on its host) */
  ddp_gloo *leaders;        /* the hosts' leaders (NULL on other ranks) */
  int *node_members;        /* group ranks on this host, ascending (node_shm's rank order) */
  int *leader_ranks;        /* group rank of each leader, ascending (leaders' rank order) */
  ddp_gloo_store store_ops;
  double applied_timeout_s; /* the Gloo context's, touched by the communication thread only */
} gloo_state;

static gloo_state *state(const ddp_pg *pg) { return (gloo_state *)pg->impl; }

/* ---- staging -------------------------------------------------------------------------- */

/* A contiguous buffer for t in dtype `dtype`: t itself (new reference) when it already is
 * one, else a copy (`copy_in` = 0 skips copying the values: outputs). */
static int stage(ddp_tensor **buf, ddp_tensor *t, int dtype, int copy_in) {
  if (t->dtype == dtype && ddp_tensor_is_contiguous(t)) {
    ddp_tensor_retain(t);
    *buf = t;
    return DDP_OK;
  }
  if (copy_in) return dtype == t->dtype ? ddp_clone(buf, t) : ddp_to_dtype(buf, t, dtype);
  return ddp_tensor_empty(buf, t->ndim, t->shape, dtype, DDP_DEVICE_CPU);
}

/* Write the staged buffer back into t (a no-op when it is t) and release it. */
static int unstage(ddp_tensor *t, ddp_tensor *buf, int ok) {
  int status = DDP_OK;
  if (buf != t && ok) status = ddp_copy_(t, buf);
  else if (ok) ddp_tensor_bump_version(t);
  ddp_tensor_release(buf);
  return status;
}

/* Note [gloo staging]: after a successful collective, the host results go back to the
 * device tensors they stand for. */
static int write_back(ddp_work *w) {
  int writes_t = w->kind == PG_ALLREDUCE || w->kind == PG_BROADCAST || w->kind == PG_REDUCE ||
                 w->kind == PG_RECV;
  if (w->dev_t && writes_t) DDP_TRY(ddp_copy_(w->dev_t, w->t));
  if (w->dev_out && w->out) DDP_TRY(ddp_copy_(w->dev_out, w->out));
  for (int i = 0; w->dev_outs && i < w->nouts; i++)
    if (w->dev_outs[i]) DDP_TRY(ddp_copy_(w->dev_outs[i], w->outs[i]));
  return DDP_OK;
}

static int reduce_dtype(int dtype) {
  return dtype == DDP_F16 || dtype == DDP_BF16 ? DDP_F32 : dtype;
}

/* buf /= n in place (AVG after SUM); buf is contiguous host f32 or f64 (Note [reduction
 * entries] in backend/kernels.h). */
static void divide(ddp_tensor *buf, int n) {
  ddp_cpu_kernels.scale_into(buf->dtype, ddp_data(buf), ddp_data(buf), buf->numel, (double)n, 1);
}

static size_t nbytes_of(const ddp_tensor *t) {
  return (size_t)t->numel * ddp_dtype_size(t->dtype);
}

/* ---- fingerprints (Note [collective fingerprints]) ------------------------------------ */

static int reduce_dtype(int dtype);

/* 1 when w goes through the shared-memory segment (pg_shm.h): all-reduce and
 * reduce-scatter of f32/f64 (and f16/bf16, staged as f32), broadcast, all-gather, barrier;
 * its fingerprint then rides on the segment's arrival step. */
static int via_shm(ddp_pg *pg, const ddp_work *w) {
  if (!state(pg)->shm) return 0;
  switch (pg_op_path(w->kind)) { /* Note [sharding collectives] */
    case PG_ALLREDUCE:
    case PG_REDUCE_SCATTER: /* Note [shm reduce-scatter] in pg_shm.c */
      return ddp_shm_supports(reduce_dtype(w->t->dtype));
    case PG_BROADCAST:
    case PG_ALLGATHER:
    case PG_ALLGATHER_LIST:
    case PG_BARRIER:
      return 1;
    default:
      return 0;
  }
}

/* 1 when w goes the hierarchical way (Note [hierarchical all-reduce]). */
static int via_hier(ddp_pg *pg, const ddp_work *w) {
  return state(pg)->hier && w->kind == PG_ALLREDUCE && ddp_shm_supports(reduce_dtype(w->t->dtype));
}

/* Exchange w's fingerprint with the group and compare: through the segment's arrival step
 * when the group has one (op: the collective through the segment, whose first step rides
 * on the arrival; NULL for one that goes through Gloo or a barrier), else a fixed-size Gloo
 * all-gather. A mismatch gives DDP_ERR_ARG, the whole message in err and *peer =
 * PEER_MISMATCH. */
static int agree(ddp_pg *pg, ddp_work *w, const ddp_shm_op *op, char *err, int *peer) {
  gloo_state *s = state(pg);
  pg_fp mine, stack[8];
  pg_fp *all = pg->size <= 8 ? stack : malloc(sizeof(pg_fp) * (size_t)pg->size);
  if (!all) {
    snprintf(err, DDP_GLOO_ERR_CAP, "out of memory for the fingerprints");
    *peer = PEER_LOCAL;
    return DDP_ERR_MEMORY;
  }
  pg_fp_make(&mine, pg, w, w->seq);
  int status, agreed = 0;
  if (s->shm)
    status = ddp_shm_arrive(s->shm, &mine, sizeof mine, pg_fp_digest(&mine), all, &agreed,
                            op, s->applied_timeout_s, err, peer);
  else
    status = ddp_gloo_allgather(s->gloo, all, &mine, sizeof mine, err, peer);
  if (!status && !agreed && pg_fp_check(pg, all, err, DDP_GLOO_ERR_CAP)) {
    status = DDP_ERR_ARG;
    *peer = PEER_MISMATCH;
  }
  if (all != stack) free(all);
  return status;
}

/* ---- running one work item (communication thread) ----------------------------------- */

/* Turn a shim failure into the message of the work: names op, this rank and the peer. */
static void describe_failure(ddp_pg *pg, ddp_work *w, int status, const char *gloo_msg,
                             int peer, char *msg) {
  const char *op = pg_op_names[w->kind];
  int me = pg->global[pg->rank];
  char who[96] = "";
  if (peer >= 0 && peer < pg->size)
    snprintf(who, sizeof who, "peer rank %d", pg->global[peer]);
  if (status == DDP_ERR_PEER)
    snprintf(msg, PG_MSG_CAP, "%s failed on rank %d: %s disconnected (its process died or closed "
             "the group) (Gloo: %s)", op, me, who[0] ? who : "a peer", gloo_msg);
  else if (status == DDP_ERR_TIMEOUT)
    snprintf(msg, PG_MSG_CAP, "%s timed out on rank %d after %g s%s%s (Gloo: %s)", op, me,
             state(pg)->applied_timeout_s, who[0] ? " waiting for " : "", who, gloo_msg);
  else
    snprintf(msg, PG_MSG_CAP, "%s failed on rank %d: %s", op, me, gloo_msg);
}

/* Agree on w's fingerprint and run op through the segment (op->kind DDP_SHM_ARRIVE: a
 * barrier). */
static int run_shm(ddp_pg *pg, ddp_work *w, const ddp_shm_op *op, char *err, int *peer) {
  int status = agree(pg, w, op, err, peer);
  if (!status) status = ddp_shm_run(state(pg)->shm, op, state(pg)->applied_timeout_s, err, peer);
  return status;
}

/* Note [hierarchical all-reduce]: a gloo group whose ranks span several hosts, some host
 * holding more than one of them, all-reduces f32/f64 in three steps, after the two-level scheme
 * of Horovod's hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE,
 * NCCLHierarchicalAllreduce: within the node, between one rank per node, back within it): (1)
 * the ranks of each host all-reduce through that host's shared-memory segment; (2) the lowest
 * group rank on each host (its leader) all-reduces the host sums with the other leaders through
 * a Gloo context of the leaders alone; (3) each host's segment broadcasts its leader's result.
 * Each element then crosses the network once per host instead of once per rank (a 4-rank ring
 * over 2 hosts sends 1.5 tensor sizes across each host boundary, the leaders' ring of 2 one).
 * Bits: the leaders' Gloo ring computes each chunk once and copies it, so the leaders agree
 * bitwise, and the broadcast copies their bits, so every rank ends with the same bits (though
 * summed in another order than the flat ring: results may differ from $DDPLUA_HIERARCHICAL=0 in
 * the last bits). Chosen at group creation from the host identities ddp_shm_new published
 * (pg_create): only when every rank's identity is known, there are >= 2 hosts and one holds >=
 * 2 ranks, every host of >= 2 ranks got its segment, and $DDPLUA_HIERARCHICAL is not "0" on any
 * rank (a user's switch for comparing with the flat ring; the ranks vote, so none splits off).
 * Everything else (other collectives, other dtypes, single-host groups) is as before; the
 * fingerprint check stays the group's (a Gloo all-gather before the data), the work item and
 * its flight-recorder entry are the group's one all_reduce, every step waits at most the
 * group's timeout, and a failure names the group rank at fault and breaks the group. */

/* One step of run_hier through this host's segment: arrival (with the group's fingerprint,
 * already agreed by the whole group) then op; a failing peer as a group rank. */
static int node_step(gloo_state *s, const pg_fp *mine, const ddp_shm_op *so, char *err,
                     int *peer) {
  int nn = 0, agreed = 0, status;
  while (s->node_members[nn] >= 0) nn++;
  pg_fp *all = malloc(sizeof(pg_fp) * (size_t)nn);
  if (!all) {
    snprintf(err, DDP_GLOO_ERR_CAP, "out of memory for the fingerprints");
    *peer = PEER_LOCAL;
    return DDP_ERR_MEMORY;
  }
  status = ddp_shm_arrive(s->node_shm, mine, sizeof *mine, pg_fp_digest(mine), all, &agreed, so,
                          s->applied_timeout_s, err, peer);
  free(all);
  if (!status && !agreed) { /* cannot happen: the group's fingerprints agreed just before */
    snprintf(err, DDP_GLOO_ERR_CAP, "the ranks of this host disagree on the all_reduce");
    *peer = -1;
    return DDP_ERR_STATE;
  }
  if (!status) status = ddp_shm_run(s->node_shm, so, s->applied_timeout_s, err, peer);
  if (status && *peer >= 0) *peer = s->node_members[*peer];
  return status;
}

/* Note [hierarchical all-reduce] on the staged buffer buf (op without AVG). */
static int run_hier(ddp_pg *pg, ddp_work *w, ddp_tensor *buf, int op, char *err, int *peer) {
  gloo_state *s = state(pg);
  int status = DDP_OK;
  pg_fp mine;
  pg_fp_make(&mine, pg, w, w->seq);
  if (s->node_shm) {
    ddp_shm_op so = {DDP_SHM_ALLREDUCE, ddp_data(buf), NULL, (size_t)buf->numel, buf->dtype, op, 0};
    if ((status = node_step(s, &mine, &so, err, peer))) return status;
  }
  if (s->leaders) {
    status = ddp_gloo_allreduce(s->leaders, ddp_data(buf), (size_t)buf->numel, buf->dtype, op,
                                err, peer);
    if (status) {
      if (*peer >= 0) *peer = s->leader_ranks[*peer];
      return status;
    }
  }
  if (s->node_shm) {
    ddp_shm_op so = {DDP_SHM_BROADCAST, ddp_data(buf), NULL, nbytes_of(buf), buf->dtype, 0, 0};
    status = node_step(s, &mine, &so, err, peer);
  }
  return status;
}

/* All-gather the staged bytes of buf into obuf (rank-major): through the segment when the
 * work goes that way, else Gloo. */
static int allgather_bytes(ddp_pg *pg, ddp_work *w, ddp_gloo *g, ddp_tensor *obuf,
                           ddp_tensor *buf, char *err, int *peer) {
  if (via_shm(pg, w)) {
    ddp_shm_op so = {DDP_SHM_ALLGATHER, ddp_data(buf), ddp_data(obuf), nbytes_of(buf),
                     buf->dtype, 0, 0};
    return run_shm(pg, w, &so, err, peer);
  }
  return ddp_gloo_allgather(g, ddp_data(obuf), ddp_data(buf), nbytes_of(buf), err, peer);
}

/* The transport part of a work item on staged buffers. */
static int run_transport(ddp_pg *pg, ddp_work *w, char *err, int *peer) {
  ddp_gloo *g = state(pg)->gloo;
  ddp_tensor *t = w->t, *buf = NULL, *obuf = NULL;
  int status = DDP_OK, ok;
  char *core_err = NULL; /* a staging failure: the core's message */
  int n = pg->size;
  *peer = -1;

#define STAGE(dst, src, dtype, copy_in)                                                    \
  do {                                                                                     \
    if ((status = stage(&(dst), (src), (dtype), (copy_in)))) goto staging_failed;         \
  } while (0)

  switch (pg_op_path(w->kind)) { /* Note [sharding collectives] */
    case PG_ALLREDUCE: {
      int op = w->op == DDP_REDUCE_AVG ? DDP_REDUCE_SUM : w->op;
      STAGE(buf, t, reduce_dtype(t->dtype), 1);
      if (via_shm(pg, w)) {
        ddp_shm_op so = {DDP_SHM_ALLREDUCE, ddp_data(buf), NULL, (size_t)buf->numel, buf->dtype,
                         op, 0};
        status = run_shm(pg, w, &so, err, peer);
      } else if (via_hier(pg, w))
        status = run_hier(pg, w, buf, op, err, peer);
      else
        status = ddp_gloo_allreduce(g, ddp_data(buf), (size_t)buf->numel, buf->dtype, op, err,
                                    peer);
      if (!status && w->op == DDP_REDUCE_AVG) divide(buf, n);
      ok = status == DDP_OK;
      if (unstage(t, buf, ok) && ok) goto core_failed;
      return status;
    }
    case PG_REDUCE: {
      /* A scratch copy: Gloo leaves partial sums in non-root buffers. */
      int op = w->op == DDP_REDUCE_AVG ? DDP_REDUCE_SUM : w->op;
      if ((status = ddp_to_dtype(&buf, t, reduce_dtype(t->dtype)))) goto staging_failed;
      if (buf == t) {
        ddp_tensor_release(buf);
        if ((status = ddp_clone(&buf, t))) goto staging_failed;
      }
      status = ddp_gloo_reduce(g, ddp_data(buf), (size_t)buf->numel, buf->dtype, op, w->root,
                               err, peer);
      if (!status && w->op == DDP_REDUCE_AVG && pg->rank == w->root) divide(buf, n);
      ok = status == DDP_OK && pg->rank == w->root;
      if (ok && ddp_copy_(t, buf)) {
        ddp_tensor_release(buf);
        goto core_failed;
      }
      ddp_tensor_release(buf);
      return status;
    }
    case PG_REDUCE_SCATTER: {
      /* Note [sharding collectives]: also reduce_scatter_tensor and the coalesced form (on
       * its packed buffers). Through the segment (Note [shm reduce-scatter] in pg_shm.c) or
       * a Gloo ring (Note [gloo ring reduce-scatter] in gloo_shim.h): never a whole
       * all-reduce. The input is only read, so it is staged only for its dtype or layout. */
      int op = w->op == DDP_REDUCE_AVG ? DDP_REDUCE_SUM : w->op;
      int rd = reduce_dtype(t->dtype);
      STAGE(buf, t, rd, 1);
      if ((status = stage(&obuf, w->out, rd, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      if (via_shm(pg, w)) {
        ddp_shm_op so = {DDP_SHM_REDUCE_SCATTER, ddp_data(buf), ddp_data(obuf),
                         (size_t)obuf->numel, rd, op, 0};
        status = run_shm(pg, w, &so, err, peer);
      } else
        status = ddp_gloo_reduce_scatter(g, ddp_data(obuf), ddp_data(buf), (size_t)obuf->numel, rd,
                                         op, err, peer);
      ddp_tensor_release(buf);
      if (!status && w->op == DDP_REDUCE_AVG) divide(obuf, n);
      ok = status == DDP_OK;
      if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      if (ok && pg_unpack_coalesced(w)) goto core_failed;
      return status;
    }
    case PG_BROADCAST:
      STAGE(buf, t, t->dtype, 1);
      if (via_shm(pg, w)) {
        ddp_shm_op so = {DDP_SHM_BROADCAST, ddp_data(buf), NULL, nbytes_of(buf), buf->dtype, 0,
                         w->root};
        status = run_shm(pg, w, &so, err, peer);
      } else
        status = ddp_gloo_broadcast(g, ddp_data(buf), nbytes_of(buf), w->root, err, peer);
      ok = status == DDP_OK && pg->rank != w->root;
      if (unstage(t, buf, ok) && ok) goto core_failed;
      return status;
    case PG_ALLGATHER:
      STAGE(buf, t, t->dtype, 1);
      if ((status = stage(&obuf, w->out, w->out->dtype, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      status = allgather_bytes(pg, w, g, obuf, buf, err, peer);
      ddp_tensor_release(buf);
      ok = status == DDP_OK;
      if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      if (ok && pg_unpack_coalesced(w)) goto core_failed; /* Note [sharding collectives] */
      return status;
    case PG_ALLGATHER_LIST: {
      int64_t shape[DDP_MAX_DIMS + 1];
      shape[0] = n;
      memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
      if ((status = ddp_tensor_empty(&obuf, t->ndim + 1, shape, t->dtype, DDP_DEVICE_CPU)))
        goto staging_failed;
      if ((status = stage(&buf, t, t->dtype, 1))) {
        ddp_tensor_release(obuf);
        goto staging_failed;
      }
      status = allgather_bytes(pg, w, g, obuf, buf, err, peer);
      ddp_tensor_release(buf);
      for (int i = 0; i < n && status == DDP_OK; i++) {
        ddp_tensor *row = NULL;
        int s2 = pg_chunk_view(&row, obuf, i, t->ndim, t->shape);
        if (!s2) s2 = ddp_copy_(w->outs[i], row);
        ddp_tensor_release(row);
        if (s2) {
          ddp_tensor_release(obuf);
          goto core_failed;
        }
      }
      ddp_tensor_release(obuf);
      return status;
    }
    case PG_GATHER:
      STAGE(buf, t, t->dtype, 1);
      if (w->out && (status = stage(&obuf, w->out, w->out->dtype, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      status = ddp_gloo_gather(g, obuf ? ddp_data(obuf) : NULL, ddp_data(buf), nbytes_of(buf),
                               w->root, err, peer);
      ddp_tensor_release(buf);
      if (obuf) {
        ok = status == DDP_OK;
        if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      }
      return status;
    case PG_SCATTER: /* t: the input on the root (or NULL), out: every rank's output */
      if (t) STAGE(buf, t, t->dtype, 1);
      if ((status = stage(&obuf, w->out, w->out->dtype, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      status = ddp_gloo_scatter(g, ddp_data(obuf), buf ? ddp_data(buf) : NULL, nbytes_of(obuf),
                                w->root, err, peer);
      ddp_tensor_release(buf);
      ok = status == DDP_OK;
      if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      return status;
    case PG_ALLTOALL:
      STAGE(buf, t, t->dtype, 1);
      if ((status = stage(&obuf, w->out, w->out->dtype, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      status = ddp_gloo_alltoall(g, ddp_data(obuf), ddp_data(buf), nbytes_of(buf) / (size_t)n,
                                 err, peer);
      ddp_tensor_release(buf);
      ok = status == DDP_OK;
      if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      return status;
    case PG_ALLTOALL_SINGLE: { /* the split sizes in rows -> bytes per rank */
      size_t row = ddp_dtype_size(t->dtype); /* bytes of one row (dim 0) */
      for (int d = 1; d < t->ndim; d++) row *= (size_t)t->shape[d];
      STAGE(buf, t, t->dtype, 1);
      if ((status = stage(&obuf, w->out, w->out->dtype, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      int64_t *ib = malloc(sizeof(int64_t) * 2 * (size_t)n), *ob = ib ? ib + n : NULL;
      if (!ib) {
        ddp_tensor_release(buf);
        ddp_tensor_release(obuf);
        snprintf(err, DDP_GLOO_ERR_CAP, "out of memory");
        *peer = PEER_LOCAL;
        return DDP_ERR_MEMORY;
      }
      for (int r = 0; r < n; r++) {
        ib[r] = w->in_splits[r] * (int64_t)row;
        ob[r] = w->out_splits[r] * (int64_t)row;
      }
      status = ddp_gloo_alltoallv(g, ddp_data(obuf), ob, ddp_data(buf), ib, err, peer);
      free(ib);
      ddp_tensor_release(buf);
      ok = status == DDP_OK;
      if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      return status;
    }
    case PG_SEND:
    case PG_RECV:
      STAGE(buf, t, t->dtype, w->kind == PG_SEND);
      status = w->kind == PG_SEND
                   ? ddp_gloo_post_send(g, ddp_data(buf), nbytes_of(buf), w->peer, w->tag, &w->p2p,
                                        err, peer)
                   : ddp_gloo_post_recv(g, ddp_data(buf), nbytes_of(buf), w->peer, w->tag, &w->p2p,
                                        err, peer);
      if (status) {
        ddp_tensor_release(buf);
        return status;
      }
      w->staged = buf;
      return POSTED;
    case PG_BARRIER:
      if (via_shm(pg, w)) { /* the arrival is a barrier */
        ddp_shm_op so = {DDP_SHM_ARRIVE, NULL, NULL, 0, DDP_F32, 0, 0};
        return run_shm(pg, w, &so, err, peer);
      }
      return ddp_gloo_barrier(g, err, peer);
    case PG_REDUCE_SCATTER_TENSOR: /* pg_op_path maps these to the cases above */
    case PG_ALLGATHER_INTO_TENSOR:
    case PG_REDUCE_SCATTER_COALESCED:
    case PG_ALLGATHER_COALESCED:
    case PG_OP_COUNT:
      break;
  }
#undef STAGE
  snprintf(err, DDP_GLOO_ERR_CAP, "unknown work kind %d", (int)w->kind);
  return DDP_ERR_STATE;

staging_failed:
core_failed:
  core_err = (char *)ddp_last_error();
  snprintf(err, DDP_GLOO_ERR_CAP, "%s", core_err);
  *peer = PEER_LOCAL; /* the group stays usable */
  return ddp_last_status() ? ddp_last_status() : DDP_ERR_MEMORY;
}

/* Record the failure of w (status, the shim's message, the peer at fault) and finish it.
 * Every failure but a local staging one aborts the group (Note [group abort] in pg.c):
 * Gloo's context is unusable after an exception, the segment's counters no longer agree,
 * and after a fingerprint mismatch the ranks' programs went apart. */
static void fail_work(ddp_pg *pg, ddp_work *w, int status, const char *err, int peer) {
  char msg[PG_MSG_CAP];
  pthread_mutex_lock(&pg->lock);
  int aborting = pg->aborting;
  pthread_mutex_unlock(&pg->lock);
  if (peer == PEER_LOCAL) { /* staging (memory) failure on this rank */
    snprintf(msg, sizeof msg, "%s on rank %d: %s", pg_op_names[w->kind], pg->global[pg->rank], err);
  } else if (peer == DDP_SHM_PEER_ABORTED || aborting) {
    /* another rank poisoned the segment, or this rank's abort made the operation fail */
    if (peer == DDP_SHM_PEER_ABORTED) pg_abort_learned(pg, err);
    pg_aborted_message(pg, w, msg);
  } else {
    if (peer == PEER_MISMATCH) { /* the message names both calls and their call sites */
      snprintf(msg, sizeof msg, "%s", err);
    } else {
      /* In a pair the peer at fault can only be the other rank. */
      if (peer < 0 && pg->size == 2) peer = 1 - pg->rank;
      describe_failure(pg, w, status, err, peer, msg);
      char site[PG_SITE_CAP + 64];
      pg_work_site(w, site, sizeof site);
      size_t used = strlen(msg);
      snprintf(msg + used, sizeof msg - used, "%s", site);
    }
    char first[PG_MSG_CAP];
    pg_abort(pg, status, msg, first);
    if (strcmp(first, msg) != 0) pg_aborted_message(pg, w, msg); /* another rank was first */
  }
  pg_work_finish(w, status, msg);
}


/* pg_queue.c's `run`: one item on the communication thread; 1 when it was posted (the
 * point-to-point thread finishes it). */
static int gloo_run(ddp_pg *pg, ddp_work *w) {
  pthread_mutex_lock(&pg->lock);
  double timeout_s = pg->timeout_s;
  pthread_mutex_unlock(&pg->lock);
  gloo_state *s = state(pg);
  if (timeout_s != s->applied_timeout_s) { /* ddp_pg_set_timeout since the last item */
    ddp_gloo_set_timeout(s->gloo, timeout_s);
    if (s->leaders) ddp_gloo_set_timeout(s->leaders, timeout_s);
    s->applied_timeout_s = timeout_s;
  }
  char err[DDP_GLOO_ERR_CAP];
  int peer = -1;
  int status = DDP_OK;
  pg_rec_start(pg->rec, w); /* Note [flight recorder] (pg_work_finish records the end) */
  /* Note [collective fingerprints]: before the data (a collective through the segment
   * agrees inside run_transport, its first data step riding on the arrival). */
  if (pg_fp_applies(w->kind) && !via_shm(pg, w)) status = agree(pg, w, NULL, err, &peer);
  if (!status) status = run_transport(pg, w, err, &peer);
  if (status == POSTED) {
    pg_queue_post(pg, w);
    return 1;
  }
  if (status == DDP_OK && write_back(w)) {
    snprintf(err, sizeof err, "%s", ddp_last_error());
    status = ddp_last_status() ? ddp_last_status() : DDP_ERR_STATE;
    peer = PEER_LOCAL;
  }
  if (status == DDP_OK) pg_work_finish(w, DDP_OK, NULL);
  else fail_work(pg, w, status, err, peer);
  return 0;
}

/* pg_queue.c's `complete`: wait for a posted message (in posting order), finish its item. */
static void gloo_complete(ddp_pg *pg, ddp_work *w) {
  char err[DDP_GLOO_ERR_CAP];
  int peer = -1;
  int status = ddp_gloo_p2p_wait(w->p2p, err, &peer);
  ddp_gloo_p2p_free(w->p2p);
  w->p2p = NULL;
  ddp_tensor *buf = w->staged;
  w->staged = NULL;
  if (w->kind == PG_RECV && status == DDP_OK && unstage(w->t, buf, 1)) {
    snprintf(err, sizeof err, "%s", ddp_last_error());
    status = ddp_last_status() ? ddp_last_status() : DDP_ERR_MEMORY;
    peer = PEER_LOCAL;
  } else if (!(w->kind == PG_RECV && status == DDP_OK)) {
    ddp_tensor_release(buf);
  }
  if (status == DDP_OK && write_back(w)) {
    snprintf(err, sizeof err, "%s", ddp_last_error());
    status = ddp_last_status() ? ddp_last_status() : DDP_ERR_STATE;
    peer = PEER_LOCAL;
  }
  if (status == DDP_OK) pg_work_finish(w, DDP_OK, NULL);
  else fail_work(pg, w, status, err, peer);
}

/* ---- submission ----------------------------------------------------------------------- */

/* Note [gloo staging]: x (a device tensor, owned by the work) becomes a host tensor of the
 * same shape and dtype (the values copied when `values`); the device tensor moves to *dev. */
static int to_host(ddp_tensor **x, ddp_tensor **dev, int values) {
  ddp_tensor *t = *x, *h = NULL;
  if (!t || t->device == DDP_DEVICE_CPU) return DDP_OK;
  DDP_TRY(ddp_tensor_empty(&h, t->ndim, t->shape, t->dtype, DDP_DEVICE_CPU));
  if (values) {
    ddp_tensor *alias = ddp_tensor_alias(t); /* detached: the copy records no graph */
    int status = alias ? ddp_copy_(h, alias) : ddp_last_status();
    ddp_tensor_release(alias);
    if (status) {
      ddp_tensor_release(h);
      return status;
    }
  }
  *dev = t;
  *x = h;
  return DDP_OK;
}

static int stage_to_host(ddp_work *w) {
  const char *op = pg_op_names[w->kind];
  int status = to_host(&w->t, &w->dev_t, w->kind != PG_RECV);
  if (!status) status = to_host(&w->out, &w->dev_out, 0);
  for (int i = 0; !status && i < w->nouts; i++) {
    if (w->outs[i]->device == DDP_DEVICE_CPU) continue;
    if (!w->dev_outs && !(w->dev_outs = calloc((size_t)w->nouts, sizeof *w->dev_outs)))
      status = DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory", op);
    if (!status) status = to_host(&w->outs[i], &w->dev_outs[i], 0);
  }
  if (status) ddp_error_prefix("%s (gloo backend, staging CUDA tensors through the host)", op);
  return status;
}

static int gloo_enqueue(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  int status = stage_to_host(w);
  if (status) {
    w->refs = 1;
    pg_work_unref(w);
    return status;
  }
  return pg_queue_submit(handle, pg, w);
}

/* Note [inline collectives] (pg_queue.c): the collectives through shared memory. */
static int gloo_can_inline(ddp_pg *pg, const ddp_work *w) { return via_shm(pg, w); }

/* ddp_pg_shared_zeros: a block of this rank's arena (Note [shm arena] in pg_shm.c). */
static int gloo_shared_zeros(ddp_tensor **out, ddp_pg *pg, int ndim, const int64_t *shape,
                             int dtype, int *placed) {
  ddp_shm *shm = state(pg)->shm;
  if (!shm) return ddp_tensor_zeros(out, ndim, shape, dtype, DDP_DEVICE_CPU);
  size_t bytes = ddp_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] > 0 && bytes > SIZE_MAX / (size_t)shape[i]) /* sizes >= 0: pg.c */
      DDP_FAIL(DDP_ERR_ARG, "shared_buffer: bad size %lld in dimension %d", (long long)shape[i],
               i + 1);
    bytes *= (size_t)shape[i];
  }
  void *p = ddp_shm_alloc(shm, bytes);
  if (!p)
    DDP_FAIL(DDP_ERR_MEMORY, "shared_buffer: no room for %zu bytes in the shared memory of "
             "process group '%s' on rank %d (1 GiB per rank, or /dev/shm is full)", bytes,
             pg->prefix, pg->global[pg->rank]);
  int status = ddp_tensor_from_blob(out, p, ndim, shape, NULL, dtype, ddp_shm_dealloc, shm);
  if (status) {
    ddp_shm_dealloc(p, shm);
    return status;
  }
  *placed = 1;
  return DDP_OK;
}

static void gloo_work_free(ddp_work *w) {
  ddp_tensor_release(w->dev_t);
  ddp_tensor_release(w->dev_out);
  for (int i = 0; w->dev_outs && i < w->nouts; i++) ddp_tensor_release(w->dev_outs[i]);
  free(w->dev_outs);
}

/* ---- groups --------------------------------------------------------------------------- */

static void gloo_state_free(gloo_state *s) {
  if (!s) return;
  ddp_shm_free(s->shm);
  ddp_shm_free(s->node_shm);
  ddp_gloo_free(s->leaders);
  ddp_gloo_free(s->gloo);
  free(s->node_members);
  free(s->leader_ranks);
  free(s);
}

/* The group's minimum of v over Gloo (a creation-time vote: every rank gets the same). */
static int vote_min(gloo_state *s, int64_t *v, int me, const char *what) {
  char err[DDP_GLOO_ERR_CAP];
  int peer = -1;
  int status = ddp_gloo_allreduce(s->gloo, v, 1, DDP_I64, DDP_REDUCE_MIN, err, &peer);
  if (status) DDP_FAIL(status, "init_process_group: rank %d, %s: %s", me, what, err);
  return DDP_OK;
}

/* Set up Note [hierarchical all-reduce] for a connected group without a segment; leaves
 * s->hier 0 (every rank alike) when it does not apply. Errors: a failed vote, or a leader's
 * Gloo context that could not connect (on every rank: the vote tells them). */
static int hier_setup(gloo_state *s, ddp_store *store, const char *prefix, int rank, int size,
                      const int *global, const char *host, const char *iface, double timeout_s) {
  int me = global[rank], known = 0, nhosts = 0, nn = 0, node_rank = 0, li = -1;
  int *leader = malloc(sizeof(int) * (size_t)size);
  int *node_global = malloc(sizeof(int) * (size_t)size);
  s->node_members = malloc(sizeof(int) * (size_t)(size + 1));
  s->leader_ranks = malloc(sizeof(int) * (size_t)size);
  int status = DDP_OK;
  if (!leader || !node_global || !s->node_members || !s->leader_ranks) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "init_process_group: out of memory");
    goto done;
  }
  if ((status = ddp_shm_hosts(store, prefix, rank, size, global, leader, &known))) goto done;
  for (int r = 0; r < size; r++) {
    if (leader[r] == r) {
      if (r == rank) li = nhosts;
      s->leader_ranks[nhosts++] = r;
    }
    if (leader[r] == leader[rank]) {
      if (r == rank) node_rank = nn;
      node_global[nn] = global[r];
      s->node_members[nn++] = r;
    }
  }
  s->node_members[nn] = -1;
  const char *env = getenv("DDPLUA_HIERARCHICAL");
  int64_t want = known && nhosts >= 2 && nhosts < size && !(env && strcmp(env, "0") == 0);
  if ((status = vote_min(s, &want, me, "hierarchical all-reduce vote"))) goto done;
  if (!want) goto done;

  /* 2: ready; 1: this host's ranks got no segment (all go flat, as ddp_shm_new's own
   * fallback); 0: this rank failed (every rank fails the group). */
  int64_t ready = 2;
  char sub[600], err[DDP_GLOO_ERR_CAP] = "";
  if (nn >= 2) {
    snprintf(sub, sizeof sub, "%s/hier/node%d", prefix, leader[rank]);
    if ((status = ddp_shm_new(&s->node_shm, store, sub, node_rank, nn, node_global))) ready = 0;
    else if (!s->node_shm) ready = 1;
  }
  if (ready && li >= 0) {
    snprintf(sub, sizeof sub, "%s/hier/leaders", prefix);
    status = ddp_gloo_new(&s->leaders, &s->store_ops, sub, li, nhosts, iface ? NULL : host, iface,
                          timeout_s, err);
    if (status) {
      ready = 0;
      DDP_ERROR(status, "init_process_group: rank %d could not connect the Gloo context of the "
                "hosts' leaders '%s': %s", me, sub, err);
    }
  }
  int64_t all_ready = ready;
  int vote = vote_min(s, &all_ready, me, "hierarchical all-reduce setup");
  if (!status) status = vote;
  if (!status && all_ready == 0)
    status = DDP_ERROR(DDP_ERR_STATE, "init_process_group: rank %d: another rank failed to set "
                       "up the hierarchical all-reduce of group '%s' ($DDPLUA_HIERARCHICAL=0 "
                       "turns it off)", me, prefix);
  if (!status && all_ready == 2) s->hier = 1;

done:
  if (!s->hier) {
    ddp_shm_free(s->node_shm);
    ddp_gloo_free(s->leaders);
    s->node_shm = NULL;
    s->leaders = NULL;
  }
  free(leader);
  free(node_global);
  return status;
}

/* Build a group: rendezvous, connect, sanity check, start the threads. `global` (size
 * entries) is taken over. */
static int pg_create(ddp_pg **out, struct ddp_store *store, int rank, int size,
                     const char *prefix, double timeout_s, int *global) {
  ddp_pg *pg = pg_header_new(&pg_gloo_backend, store, rank, size, prefix, timeout_s, global,
                             DDP_DEVICE_CPU);
  if (!pg) return ddp_last_status();
  gloo_state *s = calloc(1, sizeof *s);
  if (!s) {
    pg_header_free(pg);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  }
  pg->impl = s;
  s->applied_timeout_s = timeout_s;
  pg_store_callbacks(&s->store_ops, store);

  int status = pg_check_world_size(store, prefix, rank, size, global[rank]);
  if (status) goto failed;

  char host[256], err[DDP_GLOO_ERR_CAP];
  const char *iface;
  pg_pick_address(host, sizeof host, &iface);
  status = ddp_gloo_new(&s->gloo, &s->store_ops, prefix, rank, size, iface ? NULL : host,
                        iface, timeout_s, err);
  if (status) {
    int me = global[rank];
    gloo_state_free(s);
    pg_header_free(pg);
    DDP_FAIL(status, "init_process_group: rank %d of %d could not connect the Gloo group '%s' "
             "(%s %s): %s%s", me, size, prefix, iface ? "interface" : "address", iface ? iface : host, err,
             status == DDP_ERR_TIMEOUT ? " [each rank sets the key '<group>/<its rank>' when "
             "it reaches the rendezvous: the key named is the rank that never arrived]" : "");
  }

  /* Sanity all-reduce: every rank adds 1; the sum must be the world size. */
  int64_t one = 1;
  int peer = -1;
  status = ddp_gloo_allreduce(s->gloo, &one, 1, DDP_I64, DDP_REDUCE_SUM, err, &peer);
  if (status || one != size) {
    int me = global[rank];
    gloo_state_free(s);
    pg_header_free(pg);
    if (status)
      DDP_FAIL(status, "init_process_group: the sanity all-reduce failed on rank %d: %s", me, err);
    DDP_FAIL(DDP_ERR_STATE, "init_process_group: rank %d counts %lld ranks in the sanity "
             "all-reduce but has world size %d: the ranks disagree on the world size", me,
             (long long)one, size);
  }

  /* After the sanity all-reduce: every rank is connected, so the vote cannot split. */
  status = ddp_shm_new(&s->shm, store, prefix, rank, size, global);
  if (!status && !s->shm && size >= 2)
    status = hier_setup(s, store, prefix, rank, size, global, host, iface, timeout_s);
  if (!status) status = pg_queue_start(pg, gloo_run, gloo_complete);
  if (status) goto failed;
  pg_mark_live(pg);
  *out = pg;
  return DDP_OK;

failed:
  gloo_state_free(s);
  pg_header_free(pg);
  return status;
}

int ddp_pg_new_gloo(ddp_pg **out, struct ddp_store *store, int rank, int world_size,
                    const char *prefix, double timeout_s) {
  *out = NULL;
  int *global = NULL;
  DDP_TRY(pg_check_new(store, rank, world_size, &timeout_s, &global));
  return pg_create(out, store, rank, world_size, prefix && *prefix ? prefix : "pg", timeout_s,
                   global);
}

static int gloo_new_group(ddp_pg **out, ddp_pg *parent, int rank, int size, const char *prefix,
                          int *global) {
  return pg_create(out, parent->store, rank, size, prefix, parent->timeout_s, global);
}

/* Note [group abort] (pg.c), step 2: the segments are poisoned and the Gloo connections
 * failed (Note [shm abort], Note [gloo abort]), each with the group's first failure. */
static void gloo_abort(ddp_pg *pg) {
  gloo_state *s = state(pg);
  if (!s) return;
  char msg[PG_MSG_CAP];
  pthread_mutex_lock(&pg->lock);
  snprintf(msg, sizeof msg, "%s", pg->failure);
  pthread_mutex_unlock(&pg->lock);
  ddp_shm_abort(s->shm, msg);
  ddp_shm_abort(s->node_shm, msg);
  ddp_gloo_abort(s->gloo, msg);
  ddp_gloo_abort(s->leaders, msg);
}

static void gloo_free(ddp_pg *pg) {
  pg_queue_stop(pg);
  gloo_state_free(state(pg));
  pg->impl = NULL;
}

const pg_backend pg_gloo_backend = {
  .kind = PG_BACKEND_GLOO,
  .enqueue = gloo_enqueue,
  .wait = pg_queue_wait,
  .synchronize = pg_queue_wait,
  .is_completed = pg_queue_is_completed,
  .work_free = gloo_work_free,
  .can_inline = gloo_can_inline,
  .shared_zeros = gloo_shared_zeros,
  .new_group = gloo_new_group,
  .abort = gloo_abort,
  .free = gloo_free,
};
