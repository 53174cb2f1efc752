/* runtime/dist/pg.c: process groups (see ddplua/pg.h): argument checks, the work queue and
 * communication thread of each group, tensor staging (contiguous copies, f16/bf16 through
 * f32, AVG as SUM then divide), and error messages naming ranks. The transport is the Gloo
 * shim (gloo_shim.h, pg_gloo.cc); all-reduce of f32/f64 goes through shared memory instead
 * when every rank is on this host (pg_shm.h; $DDPLUA_SHM=0 turns that off).
 *
 * Backend "nccl" (ddp_pg_new_nccl): no thread and no Gloo; each collective is enqueued from
 * the calling thread on the communicator's stream through the plug-in's NCCL table
 * (backend/cuda/nccl_api.h) and its work handle is the event recorded after it (Note [nccl work]).
 *
 * Note [gloo staging]: the gloo backend given CUDA tensors runs the collective on host
 * copies, as PyTorch's ProcessGroupGloo does for CUDA tensors: inputs are copied to the host
 * at submission (synchronously, on the caller's current stream, so the copy sees the
 * kernels that produced them), outputs are copied back to their device by the communication
 * thread once the collective succeeded, before the work completes. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "dist/gloo_shim.h"
#include "backend/cuda/nccl_api.h"
#include "dist/pg_shm.h"

enum { MSG_CAP = 2048 };
enum { POSTED = -1 }; /* run_transport: a point-to-point message was posted, not finished */
static const double DEFAULT_TIMEOUT_S = 300.0;

typedef enum {
  OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_ALLGATHER_LIST, OP_REDUCE_SCATTER, OP_REDUCE,
  OP_GATHER, OP_SCATTER, OP_ALLTOALL, OP_SEND, OP_RECV, OP_BARRIER
} op_kind;

/* PyTorch's names, used in every message. */
static const char *const op_names[] = {
  "all_reduce", "broadcast", "all_gather", "all_gather", "reduce_scatter", "reduce",
  "gather", "scatter", "all_to_all", "send", "recv", "barrier"};

struct ddp_work {
  int refs;                 /* the user's handle + the queue's; guarded by mu */
  ddp_work *next;           /* queue link, guarded by the group's lock */
  ddp_pg *pg;               /* valid while queued (ddp_pg_free drains the queue first) */
  op_kind kind;
  int op, root, peer, tag;
  ddp_tensor *t;            /* the main tensor (in place / input), owned reference */
  ddp_tensor *out;          /* output tensor where the op has one, owned */
  ddp_tensor **outs;        /* all_gather list outputs, owned references */
  int nouts;
  double timeout_s;         /* default wait of ddp_work_wait */
  ddp_tensor *staged;       /* send/recv: the contiguous buffer in flight, owned */
  ddp_gloo_p2p *p2p;        /* send/recv: the posted message */
  /* Note [gloo staging]: the device tensors t, out and outs stand for (owned; NULL where
   * the tensor is on the CPU), written back from the host copies after the collective. */
  ddp_tensor *dev_t, *dev_out, **dev_outs;
  /* Note [nccl work]: the event after the collective on the communication stream, and the
   * table that frees it (the plug-in's, static: valid after the group is gone). */
  int nccl;
  void *event;
  const struct ddp_nccl_api *napi;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, status;
  char msg[MSG_CAP];
};

struct ddp_pg {
  ddp_gloo *gloo;           /* NULL for the nccl backend */
  const struct ddp_nccl_api *nccl; /* backend nccl: the plug-in's table, else NULL */
  ddp_nccl_comm *comm;      /* backend nccl: this group's communicator */
  int device;               /* backend nccl: the CUDA device of the communicator, else -1 */
  ddp_shm *shm;             /* NULL: all-reduce goes through Gloo too */
  int rank, size;
  int *global;              /* (size) group rank -> global rank */
  ddp_store *store;         /* not owned: the rendezvous of this group and its subgroups */
  ddp_gloo_store store_ops;
  char *prefix;
  int n_subgroups;          /* new_group calls made on this group: names their prefixes */
  double timeout_s;         /* guarded by lock */
  double applied_timeout_s; /* the Gloo context's, touched by the communication thread only */
  pthread_t thread;
  pthread_mutex_t lock;     /* queue, stop, failure */
  pthread_cond_t cv;
  ddp_work *head, *tail;
  int stop;
  /* Point-to-point messages posted by the communication thread, waited for here so the
   * queue never blocks on a peer that has not posted its side (irecv then send). */
  pthread_t p2p_thread;
  pthread_cond_t p2p_cv;    /* with lock */
  ddp_work *p2p_head, *p2p_tail;
  int p2p_stop;
  int failed;               /* status of the first failure, 0 while healthy */
  char failure[MSG_CAP];
};

/* ---- time ----------------------------------------------------------------------------- */

static struct timespec deadline_after(double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double whole = (double)(long long)seconds;
  ts.tv_sec += (time_t)whole;
  ts.tv_nsec += (long)((seconds - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

static void cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

/* ---- work objects ----------------------------------------------------------------------- */

static void work_unref(ddp_work *w) {
  pthread_mutex_lock(&w->mu);
  int left = --w->refs;
  pthread_mutex_unlock(&w->mu);
  if (left) return;
  ddp_tensor_release(w->t);
  ddp_tensor_release(w->out);
  for (int i = 0; i < w->nouts; i++) ddp_tensor_release(w->outs[i]);
  free(w->outs);
  ddp_tensor_release(w->dev_t);
  ddp_tensor_release(w->dev_out);
  for (int i = 0; w->dev_outs && i < w->nouts; i++) ddp_tensor_release(w->dev_outs[i]);
  free(w->dev_outs);
  if (w->event && w->napi) w->napi->event_free(w->event);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

static void work_finish(ddp_work *w, int status, const char *msg) {
  pthread_mutex_lock(&w->mu);
  w->status = status;
  if (status) snprintf(w->msg, sizeof w->msg, "%s", msg);
  w->done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

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
  int writes_t = w->kind == OP_ALLREDUCE || w->kind == OP_BROADCAST || w->kind == OP_REDUCE ||
                 w->kind == OP_RECV;
  if (w->dev_t && writes_t) DDP_TRY(ddp_copy_(w->dev_t, w->t));
  if (w->dev_out && w->out) DDP_TRY(ddp_copy_(w->dev_out, w->out));
  for (int i = 0; w->dev_outs && i < w->nouts; i++)
    if (w->dev_outs[i]) DDP_TRY(ddp_copy_(w->dev_outs[i], w->outs[i]));
  return DDP_OK;
}

static int reduce_dtype(int dtype) {
  return dtype == DDP_F16 || dtype == DDP_BF16 ? DDP_F32 : dtype;
}

/* buf /= n in place (AVG after SUM); buf is contiguous f32 or f64. */
static void divide(ddp_tensor *buf, int n) {
  if (buf->dtype == DDP_F32) {
    float *p = (float *)ddp_data(buf);
    for (int64_t i = 0; i < buf->numel; i++) p[i] /= (float)n;
  } else {
    double *p = (double *)ddp_data(buf);
    for (int64_t i = 0; i < buf->numel; i++) p[i] /= (double)n;
  }
}

static size_t nbytes_of(const ddp_tensor *t) {
  return (size_t)t->numel * ddp_dtype_size(t->dtype);
}

/* A contiguous row view (rows `row` .. of `rows_shape`) of the contiguous buffer buf. */
static int chunk_view(ddp_tensor **out, ddp_tensor *buf, int64_t index, int ndim,
                      const int64_t *shape) {
  int64_t strides[DDP_MAX_DIMS];
  int64_t numel = ddp_contiguous_strides(ndim, shape, strides);
  return ddp_tensor_view_raw(out, buf, ndim, shape, strides, buf->offset + index * numel);
}

/* ---- running one work item (communication thread) ----------------------------------- */

/* Turn a shim failure into the message of the work: names op, this rank and the peer. */
static void describe_failure(ddp_pg *pg, ddp_work *w, int status, const char *gloo_msg,
                             int peer, char *msg) {
  const char *op = op_names[w->kind];
  int me = pg->global[pg->rank];
  char who[96] = "";
  if (peer >= 0 && peer < pg->size)
    snprintf(who, sizeof who, "peer rank %d", pg->global[peer]);
  if (status == DDP_ERR_PEER)
    snprintf(msg, MSG_CAP, "%s failed on rank %d: %s disconnected (its process died or closed "
             "the group) (Gloo: %s)", op, me, who[0] ? who : "a peer", gloo_msg);
  else if (status == DDP_ERR_TIMEOUT)
    snprintf(msg, MSG_CAP, "%s timed out on rank %d after %g s%s%s (Gloo: %s)", op, me,
             pg->applied_timeout_s, who[0] ? " waiting for " : "", who, gloo_msg);
  else
    snprintf(msg, MSG_CAP, "%s failed on rank %d: %s", op, me, gloo_msg);
}

/* The transport part of a work item on staged buffers. */
static int run_transport(ddp_pg *pg, ddp_work *w, char *err, int *peer) {
  ddp_gloo *g = pg->gloo;
  ddp_tensor *t = w->t, *buf = NULL, *obuf = NULL;
  int status = DDP_OK, ok;
  char *core_err = NULL; /* a staging failure: the core's message */
  int n = pg->size;
  *peer = -1;

#define STAGE(dst, src, dtype, copy_in)                                                    \
  do {                                                                                     \
    if ((status = stage(&(dst), (src), (dtype), (copy_in)))) goto staging_failed;         \
  } while (0)

  switch (w->kind) {
    case OP_ALLREDUCE: {
      int op = w->op == DDP_REDUCE_AVG ? DDP_REDUCE_SUM : w->op;
      STAGE(buf, t, reduce_dtype(t->dtype), 1);
      if (pg->shm && ddp_shm_supports(buf->dtype))
        status = ddp_shm_allreduce(pg->shm, ddp_data(buf), (size_t)buf->numel, buf->dtype, op,
                                   pg->applied_timeout_s, err, peer);
      else
        status = ddp_gloo_allreduce(g, ddp_data(buf), (size_t)buf->numel, buf->dtype, op, err,
                                    peer);
      if (!status && w->op == DDP_REDUCE_AVG) divide(buf, n);
      ok = status == DDP_OK;
      if (unstage(t, buf, ok) && ok) goto core_failed;
      return status;
    }
    case OP_REDUCE: {
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
    case OP_REDUCE_SCATTER: {
      int op = w->op == DDP_REDUCE_AVG ? DDP_REDUCE_SUM : w->op;
      /* All-reduce a private copy of the whole input, keep this rank's chunk. */
      if ((status = ddp_to_dtype(&buf, t, reduce_dtype(t->dtype)))) goto staging_failed;
      if (buf == t) {
        ddp_tensor_release(buf);
        if ((status = ddp_clone(&buf, t))) goto staging_failed;
      }
      status = ddp_gloo_allreduce(g, ddp_data(buf), (size_t)buf->numel, buf->dtype, op, err, peer);
      if (!status) {
        if (w->op == DDP_REDUCE_AVG) divide(buf, n);
        ddp_tensor *chunk = NULL;
        int s2 = chunk_view(&chunk, buf, pg->rank, w->out->ndim, w->out->shape);
        if (!s2) s2 = ddp_copy_(w->out, chunk);
        ddp_tensor_release(chunk);
        ddp_tensor_release(buf);
        if (s2) goto core_failed;
        return DDP_OK;
      }
      ddp_tensor_release(buf);
      return status;
    }
    case OP_BROADCAST:
      STAGE(buf, t, t->dtype, 1);
      status = ddp_gloo_broadcast(g, ddp_data(buf), nbytes_of(buf), w->root, err, peer);
      ok = status == DDP_OK && pg->rank != w->root;
      if (unstage(t, buf, ok) && ok) goto core_failed;
      return status;
    case OP_ALLGATHER:
      STAGE(buf, t, t->dtype, 1);
      if ((status = stage(&obuf, w->out, w->out->dtype, 0))) {
        ddp_tensor_release(buf);
        goto staging_failed;
      }
      status = ddp_gloo_allgather(g, ddp_data(obuf), ddp_data(buf), nbytes_of(buf), err, peer);
      ddp_tensor_release(buf);
      ok = status == DDP_OK;
      if (unstage(w->out, obuf, ok) && ok) goto core_failed;
      return status;
    case OP_ALLGATHER_LIST: {
      int64_t shape[DDP_MAX_DIMS + 1];
      shape[0] = n;
      memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
      if ((status = ddp_tensor_empty(&obuf, t->ndim + 1, shape, t->dtype, DDP_DEVICE_CPU)))
        goto staging_failed;
      STAGE(buf, t, t->dtype, 1);
      status = ddp_gloo_allgather(g, ddp_data(obuf), ddp_data(buf), nbytes_of(buf), err, peer);
      ddp_tensor_release(buf);
      for (int i = 0; i < n && status == DDP_OK; i++) {
        ddp_tensor *row = NULL;
        int s2 = chunk_view(&row, obuf, i, t->ndim, t->shape);
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
    case OP_GATHER:
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
    case OP_SCATTER: /* t: the input on the root (or NULL), out: every rank's output */
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
    case OP_ALLTOALL:
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
    case OP_SEND:
    case OP_RECV:
      STAGE(buf, t, t->dtype, w->kind == OP_SEND);
      status = w->kind == OP_SEND
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
    case OP_BARRIER:
      return ddp_gloo_barrier(g, err, peer);
  }
#undef STAGE
  snprintf(err, DDP_GLOO_ERR_CAP, "unknown work kind %d", (int)w->kind);
  return DDP_ERR_STATE;

staging_failed:
core_failed:
  core_err = (char *)ddp_last_error();
  snprintf(err, DDP_GLOO_ERR_CAP, "%s", core_err);
  *peer = -2; /* a local failure: the group stays usable */
  return ddp_last_status() ? ddp_last_status() : DDP_ERR_MEMORY;
}

/* Record the failure of w (status, the shim's message, the peer at fault) and finish it. */
static void fail_work(ddp_pg *pg, ddp_work *w, int status, const char *err, int peer) {
  char msg[MSG_CAP];
  if (peer == -2) { /* staging (memory) failure on this rank */
    snprintf(msg, sizeof msg, "%s on rank %d: %s", op_names[w->kind], pg->global[pg->rank], err);
  } else {
    /* In a pair the peer at fault can only be the other rank. */
    if (peer < 0 && pg->size == 2) peer = 1 - pg->rank;
    describe_failure(pg, w, status, err, peer, msg);
    /* Gloo's context is unusable after an exception: the group is broken for good. */
    pthread_mutex_lock(&pg->lock);
    if (!pg->failed) {
      pg->failed = status;
      snprintf(pg->failure, sizeof pg->failure, "%s", msg);
    }
    pthread_mutex_unlock(&pg->lock);
  }
  work_finish(w, status, msg);
}

/* Run one item; returns 1 when it was handed to the point-to-point thread (which then owns
 * the queue's reference). */
static int run_work(ddp_pg *pg, ddp_work *w) {
  char msg[MSG_CAP];
  pthread_mutex_lock(&pg->lock);
  int failed = pg->failed;
  double timeout_s = pg->timeout_s;
  if (failed) snprintf(msg, sizeof msg, "%s on rank %d: the process group failed earlier: %s",
                       op_names[w->kind], pg->global[pg->rank], pg->failure);
  pthread_mutex_unlock(&pg->lock);
  if (failed) {
    work_finish(w, failed, msg);
    return 0;
  }
  if (timeout_s != pg->applied_timeout_s) { /* ddp_pg_set_timeout since the last item */
    ddp_gloo_set_timeout(pg->gloo, timeout_s);
    pg->applied_timeout_s = timeout_s;
  }
  char err[DDP_GLOO_ERR_CAP];
  int peer = -1;
  int status = run_transport(pg, w, err, &peer);
  if (status == POSTED) {
    pthread_mutex_lock(&pg->lock);
    w->next = NULL;
    if (pg->p2p_tail) pg->p2p_tail->next = w;
    else pg->p2p_head = w;
    pg->p2p_tail = w;
    pthread_cond_signal(&pg->p2p_cv);
    pthread_mutex_unlock(&pg->lock);
    return 1;
  }
  if (status == DDP_OK && write_back(w)) {
    snprintf(err, sizeof err, "%s", ddp_last_error());
    status = ddp_last_status() ? ddp_last_status() : DDP_ERR_STATE;
    peer = -2;
  }
  if (status == DDP_OK) work_finish(w, DDP_OK, NULL);
  else fail_work(pg, w, status, err, peer);
  return 0;
}

/* Wait for the posted messages in posting order; finish their work items. */
static void *p2p_thread(void *arg) {
  ddp_pg *pg = arg;
  ddp_set_grad_enabled(0);
  for (;;) {
    pthread_mutex_lock(&pg->lock);
    while (!pg->p2p_head && !pg->p2p_stop) pthread_cond_wait(&pg->p2p_cv, &pg->lock);
    ddp_work *w = pg->p2p_head;
    if (!w) {
      pthread_mutex_unlock(&pg->lock);
      return NULL;
    }
    pg->p2p_head = w->next;
    if (!pg->p2p_head) pg->p2p_tail = NULL;
    pthread_mutex_unlock(&pg->lock);

    char err[DDP_GLOO_ERR_CAP];
    int peer = -1;
    int status = ddp_gloo_p2p_wait(w->p2p, err, &peer);
    ddp_gloo_p2p_free(w->p2p);
    w->p2p = NULL;
    ddp_tensor *buf = w->staged;
    w->staged = NULL;
    if (w->kind == OP_RECV && status == DDP_OK && unstage(w->t, buf, 1)) {
      snprintf(err, sizeof err, "%s", ddp_last_error());
      status = ddp_last_status() ? ddp_last_status() : DDP_ERR_MEMORY;
      peer = -2;
    } else if (!(w->kind == OP_RECV && status == DDP_OK)) {
      ddp_tensor_release(buf);
    }
    if (status == DDP_OK && write_back(w)) {
      snprintf(err, sizeof err, "%s", ddp_last_error());
      status = ddp_last_status() ? ddp_last_status() : DDP_ERR_STATE;
      peer = -2;
    }
    if (status == DDP_OK) work_finish(w, DDP_OK, NULL);
    else fail_work(pg, w, status, err, peer);
    work_unref(w);
  }
}

static void *comm_thread(void *arg) {
  ddp_pg *pg = arg;
  ddp_set_grad_enabled(0); /* collectives move data; they never record autograd */
  for (;;) {
    pthread_mutex_lock(&pg->lock);
    while (!pg->head && !pg->stop) pthread_cond_wait(&pg->cv, &pg->lock);
    ddp_work *w = pg->head;
    if (!w) { /* stop, and the queue is drained */
      pthread_mutex_unlock(&pg->lock);
      return NULL;
    }
    pg->head = w->next;
    if (!pg->head) pg->tail = NULL;
    pthread_mutex_unlock(&pg->lock);
    if (!run_work(pg, w)) work_unref(w);
  }
}

/* ---- group creation ------------------------------------------------------------------- */

/* Our store behind the shim's callbacks (pg_gloo.cc puts them behind Gloo's Store). */
static int store_set_cb(void *ctx, const char *key, const void *data, size_t len, char *err) {
  int st = ddp_store_set((ddp_store *)ctx, key, data, len);
  if (st) snprintf(err, DDP_GLOO_ERR_CAP, "%s", ddp_last_error());
  return st;
}

static int store_get_cb(void *ctx, const char *key, void **data, size_t *len, char *err) {
  void *v = NULL;
  size_t n = 0;
  int st = ddp_store_get((ddp_store *)ctx, key, &v, &n);
  if (st) {
    snprintf(err, DDP_GLOO_ERR_CAP, "%s", ddp_last_error());
    return st;
  }
  *data = malloc(n ? n : 1); /* the shim frees with free() */
  if (!*data) {
    ddp_store_free_value(v);
    snprintf(err, DDP_GLOO_ERR_CAP, "out of memory reading store key '%s'", key);
    return DDP_ERR_MEMORY;
  }
  if (n) memcpy(*data, v, n);
  *len = n;
  ddp_store_free_value(v);
  return DDP_OK;
}

static int store_wait_cb(void *ctx, const char *const *keys, int n, double timeout_s, char *err) {
  int st = ddp_store_wait((ddp_store *)ctx, keys, n, timeout_s > 0 ? timeout_s : -1);
  if (st) snprintf(err, DDP_GLOO_ERR_CAP, "%s", ddp_last_error());
  return st;
}

/* Every rank publishes its world size; ranks other than 0 compare theirs with rank 0's, so
 * a rank started with another world size fails loudly instead of waiting for ranks that
 * will never come. */
static int check_world_size(ddp_store *store, const char *prefix, int rank, int size, int me) {
  char key[600], val[32];
  snprintf(val, sizeof val, "%d", size);
  snprintf(key, sizeof key, "%s/ddp_world_size/%d", prefix, rank);
  if (ddp_store_set(store, key, val, strlen(val))) {
    ddp_error_prefix("init_process_group: rank %d", me);
    return ddp_last_status();
  }
  if (rank == 0) return DDP_OK;
  snprintf(key, sizeof key, "%s/ddp_world_size/0", prefix);
  void *v = NULL;
  size_t n = 0;
  if (ddp_store_get(store, key, &v, &n)) {
    ddp_error_prefix("init_process_group: rank %d waiting for rank 0", me);
    return ddp_last_status();
  }
  int theirs = atoi((const char *)v); /* NUL-terminated by the store */
  ddp_store_free_value(v);
  if (theirs != size)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: rank %d was started with world size %d but "
             "rank 0 with %d: every rank must get the same world size", me, size, theirs);
  return DDP_OK;
}

/* The address to bind and publish (pg.h: ddp_pg_new_gloo). */
static void pick_address(char *host, size_t cap, const char **iface) {
  *iface = NULL;
  const char *v = getenv("DDPLUA_GLOO_IFNAME");
  if (v && *v) {
    *iface = v;
    host[0] = 0;
    return;
  }
  v = getenv("DDPLUA_GLOO_HOSTNAME");
  if (v && *v) {
    snprintf(host, cap, "%s", v);
    return;
  }
  const char *m = getenv("MASTER_ADDR");
  if (!m || !*m || strncmp(m, "127.", 4) == 0 || strcmp(m, "localhost") == 0 ||
      strcmp(m, "::1") == 0) {
    snprintf(host, cap, "127.0.0.1");
    return;
  }
  if (gethostname(host, cap) != 0 || !host[0]) snprintf(host, cap, "127.0.0.1");
  host[cap - 1] = 0;
}

static void pg_destroy(ddp_pg *pg) {
  if (!pg) return;
  if (pg->comm) pg->nccl->comm_destroy(pg->comm);
  ddp_shm_free(pg->shm);
  ddp_gloo_free(pg->gloo);
  free(pg->global);
  free(pg->prefix);
  pthread_mutex_destroy(&pg->lock);
  pthread_cond_destroy(&pg->cv);
  pthread_cond_destroy(&pg->p2p_cv);
  free(pg);
}

/* Build a group: rendezvous, connect, sanity check, start the thread. `global` (size
 * entries) is taken over. */
/* A group's header before any backend is attached, or NULL with the error set (`global`
 * is taken over either way). */
static ddp_pg *pg_header_new(struct ddp_store *store, int rank, int size, const char *prefix,
                             double timeout_s, int *global, int device) {
  ddp_pg *pg = calloc(1, sizeof *pg);
  char *pfx = strdup(prefix);
  if (!pg || !pfx) {
    free(pg);
    free(pfx);
    free(global);
    DDP_ERROR(DDP_ERR_MEMORY, "init_process_group: out of memory");
    return NULL;
  }
  pg->rank = rank;
  pg->size = size;
  pg->global = global;
  pg->store = store;
  pg->prefix = pfx;
  pg->device = device;
  pg->timeout_s = pg->applied_timeout_s = timeout_s;
  pthread_mutex_init(&pg->lock, NULL);
  pthread_cond_init(&pg->cv, NULL);
  pthread_cond_init(&pg->p2p_cv, NULL);
  return pg;
}

static int pg_create(ddp_pg **out, struct ddp_store *store, int rank, int size,
                     const char *prefix, double timeout_s, int *global) {
  ddp_pg *pg = pg_header_new(store, rank, size, prefix, timeout_s, global, DDP_DEVICE_CPU);
  if (!pg) return ddp_last_status();

  pg->store_ops.ctx = store;
  pg->store_ops.set = store_set_cb;
  pg->store_ops.get = store_get_cb;
  pg->store_ops.wait = store_wait_cb;

  int status = check_world_size(store, prefix, rank, size, global[rank]);
  if (status) {
    pg_destroy(pg);
    return status;
  }

  char host[256], err[DDP_GLOO_ERR_CAP];
  const char *iface;
  pick_address(host, sizeof host, &iface);
  status = ddp_gloo_new(&pg->gloo, &pg->store_ops, prefix, rank, size, iface ? NULL : host,
                        iface, timeout_s, err);
  if (status) {
    int me = global[rank];
    pg_destroy(pg);
    DDP_FAIL(status, "init_process_group: rank %d of %d could not connect the Gloo group '%s' "
             "(%s %s): %s%s", me, size, prefix, iface ? "interface" : "address", iface ? iface : host, err,
             status == DDP_ERR_TIMEOUT ? " [each rank sets the key '<group>/<its rank>' when "
             "it reaches the rendezvous: the key named is the rank that never arrived]" : "");
  }

  /* Sanity all-reduce: every rank adds 1; the sum must be the world size. */
  int64_t one = 1;
  int peer = -1;
  status = ddp_gloo_allreduce(pg->gloo, &one, 1, DDP_I64, DDP_REDUCE_SUM, err, &peer);
  if (status || one != size) {
    int me = global[rank];
    pg_destroy(pg);
    if (status)
      DDP_FAIL(status, "init_process_group: the sanity all-reduce failed on rank %d: %s", me, err);
    DDP_FAIL(DDP_ERR_STATE, "init_process_group: rank %d counts %lld ranks in the sanity "
             "all-reduce but has world size %d: the ranks disagree on the world size", me,
             (long long)one, size);
  }

  /* After the sanity all-reduce: every rank is connected, so the vote cannot split. */
  status = ddp_shm_new(&pg->shm, store, prefix, rank, size, global);
  if (status) {
    pg_destroy(pg);
    return status;
  }

  if (pthread_create(&pg->p2p_thread, NULL, p2p_thread, pg) != 0) {
    pg_destroy(pg);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: cannot start the point-to-point thread");
  }
  if (pthread_create(&pg->thread, NULL, comm_thread, pg) != 0) {
    pthread_mutex_lock(&pg->lock);
    pg->p2p_stop = 1;
    pthread_cond_signal(&pg->p2p_cv);
    pthread_mutex_unlock(&pg->lock);
    pthread_join(pg->p2p_thread, NULL);
    pg_destroy(pg);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: cannot start the communication thread");
  }
  *out = pg;
  return DDP_OK;
}

/* Build an nccl group: the unique id goes from group rank 0 to the others through the store
 * (key "<prefix>/nccl_id"), then every rank joins the communicator on `device`. `global` is
 * taken over. */
static int pg_create_nccl(ddp_pg **out, struct ddp_store *store, int rank, int size,
                          const char *prefix, double timeout_s, int *global, int device,
                          const struct ddp_nccl_api *nccl) {
  ddp_pg *pg = pg_header_new(store, rank, size, prefix, timeout_s, global, device);
  if (!pg) return ddp_last_status();
  pg->nccl = nccl;
  int me = global[rank];
  int status = check_world_size(store, prefix, rank, size, me);
  if (status) {
    pg_destroy(pg);
    return status;
  }
  unsigned char id[DDP_NCCL_ID_BYTES];
  char key[600];
  snprintf(key, sizeof key, "%s/nccl_id", prefix);
  if (rank == 0) {
    status = nccl->get_unique_id(id);
    if (!status) status = ddp_store_set(store, key, id, sizeof id);
  } else {
    void *v = NULL;
    size_t n = 0;
    status = ddp_store_get(store, key, &v, &n);
    if (!status && n != sizeof id)
      status = DDP_ERROR(DDP_ERR_STATE, "store key '%s' holds %zu bytes, not an NCCL unique id "
                         "(%d bytes)", key, n, DDP_NCCL_ID_BYTES);
    if (!status) memcpy(id, v, sizeof id);
    ddp_store_free_value(v);
  }
  if (!status) status = nccl->comm_init(&pg->comm, id, rank, size, device, timeout_s);
  if (status) {
    pg_destroy(pg);
    ddp_error_prefix("init_process_group: rank %d of %d (nccl backend, %s, group '%s')", me, size,
                     ddp_device_str(device), prefix);
    return status;
  }
  *out = pg;
  return DDP_OK;
}

int ddp_pg_new_nccl(ddp_pg **out, struct ddp_store *store, int rank, int world_size,
                    const char *prefix, double timeout_s, int device) {
  *out = NULL;
  const char *why = NULL;
  const struct ddp_nccl_api *nccl = ddp_device_nccl(&why);
  if (!nccl) DDP_FAIL(DDP_ERR_UNAVAILABLE, "nccl backend: %s", why);
  if (nccl->abi != DDP_NCCL_API_ABI)
    DDP_FAIL(DDP_ERR_UNAVAILABLE, "nccl backend: the CUDA plug-in's NCCL table has interface %d, "
             "want %d (rebuild the plug-in)", nccl->abi, DDP_NCCL_API_ABI);
  if (device < 0)
    DDP_FAIL(DDP_ERR_ARG, "nccl backend: needs a CUDA device, got %s", ddp_device_str(device));
  DDP_TRY(ddp_check_device(device, "nccl backend"));
  if (!store) DDP_FAIL(DDP_ERR_ARG, "init_process_group: no store (the rendezvous) given");
  if (world_size < 1)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: world_size must be >= 1, got %d", world_size);
  if (rank < 0 || rank >= world_size)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: rank %d is out of range for world size %d "
             "(ranks count from 0)", rank, world_size);
  if (timeout_s <= 0) timeout_s = DEFAULT_TIMEOUT_S;
  int *global = malloc(sizeof(int) * (size_t)world_size);
  if (!global) DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  for (int i = 0; i < world_size; i++) global[i] = i;
  return pg_create_nccl(out, store, rank, world_size, prefix && *prefix ? prefix : "pg",
                        timeout_s, global, device, nccl);
}

int ddp_pg_new_gloo(ddp_pg **out, struct ddp_store *store, int rank, int world_size,
                    const char *prefix, double timeout_s) {
  *out = NULL;
  if (!store) DDP_FAIL(DDP_ERR_ARG, "init_process_group: no store (the rendezvous) given");
  if (world_size < 1)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: world_size must be >= 1, got %d", world_size);
  if (rank < 0 || rank >= world_size)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: rank %d is out of range for world size %d "
             "(ranks count from 0)", rank, world_size);
  if (timeout_s <= 0) timeout_s = DEFAULT_TIMEOUT_S;
  int *global = malloc(sizeof(int) * (size_t)world_size);
  if (!global) DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  for (int i = 0; i < world_size; i++) global[i] = i;
  return pg_create(out, store, rank, world_size, prefix && *prefix ? prefix : "pg", timeout_s,
                   global);
}

int ddp_pg_new_group(ddp_pg **out, ddp_pg *parent, const int *ranks, int n) {
  *out = NULL;
  if (!parent) DDP_FAIL(DDP_ERR_ARG, "new_group: no parent process group");
  if (n < 1 || n > parent->size)
    DDP_FAIL(DDP_ERR_ARG, "new_group: needs 1 to %d ranks, got %d", parent->size, n);
  int me = -1;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size)
      DDP_FAIL(DDP_ERR_ARG, "new_group: rank %d is out of range for a group of size %d",
               ranks[i], parent->size);
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i]) DDP_FAIL(DDP_ERR_ARG, "new_group: rank %d is listed twice", ranks[i]);
    if (ranks[i] == parent->rank) me = i;
  }
  /* Every parent rank counts the call, members or not, so prefixes agree everywhere. */
  int k = parent->n_subgroups++;
  int status = DDP_OK;
  if (me >= 0) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/group%d", parent->prefix, k);
    int *global = malloc(sizeof(int) * (size_t)n);
    if (!global) DDP_FAIL(DDP_ERR_MEMORY, "new_group: out of memory");
    for (int i = 0; i < n; i++) global[i] = parent->global[ranks[i]];
    status = parent->nccl ? pg_create_nccl(out, parent->store, me, n, prefix, parent->timeout_s,
                                           global, parent->device, parent->nccl)
                          : pg_create(out, parent->store, me, n, prefix, parent->timeout_s, global);
    if (status) {
      ddp_error_prefix("new_group");
      return status;
    }
  }
  /* As PyTorch, every parent rank leaves new_group together: a non-member that ran on and
   * exited (rank 0 closing the store it hosts) would break the members' rendezvous. */
  status = ddp_pg_barrier(NULL, parent);
  if (status) {
    ddp_pg_free(*out);
    *out = NULL;
    ddp_error_prefix("new_group");
  }
  return status;
}

int ddp_pg_rank(const ddp_pg *pg) { return pg ? pg->rank : -1; }
int ddp_pg_size(const ddp_pg *pg) { return pg ? pg->size : -1; }

int ddp_pg_global_rank(const ddp_pg *pg, int group_rank) {
  if (!pg || group_rank < 0 || group_rank >= pg->size) return -1;
  return pg->global[group_rank];
}

int ddp_pg_set_timeout(ddp_pg *pg, double timeout_s) {
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "set_timeout: no process group");
  if (!(timeout_s > 0)) DDP_FAIL(DDP_ERR_ARG, "set_timeout: timeout must be > 0 s, got %g", timeout_s);
    /* The communication thread applies it to Gloo before its next work item. */
  pthread_mutex_lock(&pg->lock);
  pg->timeout_s = timeout_s;
  pthread_mutex_unlock(&pg->lock);
  if (pg->comm) pg->nccl->set_timeout(pg->comm, timeout_s);
  return DDP_OK;
}

double ddp_pg_get_timeout(const ddp_pg *pg) { return pg ? pg->timeout_s : 0; }

const char *ddp_pg_error(const ddp_pg *pg) {
  if (pg && pg->comm) return pg->nccl->comm_error(pg->comm);
  return pg && pg->failed ? pg->failure : "";
}

int ddp_pg_nccl_available(char *reason, size_t len) {
  const char *why = NULL;
  const struct ddp_nccl_api *nccl = ddp_device_nccl(&why);
  if (nccl && nccl->abi != DDP_NCCL_API_ABI) {
    nccl = NULL;
    why = "the CUDA plug-in's NCCL table has another interface version";
  }
  if (reason && len) snprintf(reason, len, "%s", nccl ? "" : why);
  return nccl != NULL;
}

const char *ddp_pg_backend(const ddp_pg *pg) { return !pg ? "" : pg->nccl ? "nccl" : "gloo"; }

int ddp_pg_device(const ddp_pg *pg) { return pg && pg->nccl ? pg->device : DDP_DEVICE_CPU; }

/* ---- submission ----------------------------------------------------------------------- */

static int check_group(ddp_pg *pg, const char *op) {
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "%s: no process group (call init_process_group first)", op);
  return DDP_OK;
}

/* gloo takes tensors on any device (Note [gloo staging]); nccl takes contiguous tensors on
 * the communicator's device (as PyTorch's ProcessGroupNCCL). */
static int check_tensor(const ddp_pg *pg, const ddp_tensor *t, const char *op, const char *arg,
                        int reducing) {
  DDP_TRY(ddp_check_alive(t, op, arg));
  if (pg->nccl && t->device != pg->device)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s is on %s but the nccl backend of this rank takes CUDA tensors "
             "on %s (use the gloo backend for CPU tensors)", op, arg, ddp_device_str(t->device),
             ddp_device_str(pg->device));
  if (pg->nccl && !ddp_tensor_is_contiguous(t))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s must be contiguous for the nccl backend (call contiguous() "
             "first)", op, arg);
  if (reducing && t->dtype == DDP_BOOL)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype bool, which cannot be reduced", op, arg);
  return DDP_OK;
}

static int check_root(const ddp_pg *pg, int root, const char *op, const char *what) {
  if (root < 0 || root >= pg->size)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s rank %d is out of range for a group of size %d", op, what, root,
             pg->size);
  return DDP_OK;
}

static int check_op(int op, const ddp_tensor *t, const char *name) {
  if (op < DDP_REDUCE_SUM || op > DDP_REDUCE_PRODUCT)
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown reduce op %d", name, op);
  if (op == DDP_REDUCE_AVG && !ddp_dtype_is_floating(t->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: op avg needs a floating dtype, got %s (use sum and divide)", name,
             ddp_dtype_name(t->dtype));
  return DDP_OK;
}

static int same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

/* out must be (world, ...t's shape) of t's dtype. */
static int check_stacked(const ddp_pg *pg, const ddp_tensor *out, const ddp_tensor *t,
                         const char *op, const char *out_name, const char *t_name) {
  if (out->dtype != t->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s but %s has %s", op, out_name,
             ddp_dtype_name(out->dtype), t_name, ddp_dtype_name(t->dtype));
  if (out->ndim != t->ndim + 1 || out->shape[0] != pg->size ||
      !same_shape(t->ndim, t->shape, out->ndim - 1, out->shape + 1)) {
    int64_t want[DDP_MAX_DIMS + 1];
    want[0] = pg->size;
    memcpy(want + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    DDP_FAIL(DDP_ERR_ARG, "%s: %s must have shape %s (world size %d, then %s's shape), got %s",
             op, out_name, ddp_shape_str(t->ndim + 1, want), pg->size, t_name, DDP_SHAPE(out));
  }
  return DDP_OK;
}

static ddp_work *work_new(ddp_pg *pg, op_kind kind) {
  ddp_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->refs = 2; /* the caller's and the queue's */
  w->pg = pg;
  w->kind = kind;
  pthread_mutex_init(&w->mu, NULL);
  cond_init_monotonic(&w->cv);
  return w;
}

static ddp_tensor *keep(ddp_tensor *t) {
  ddp_tensor_retain(t);
  return t;
}

/* Queue w (which holds its references) and, for a blocking call, wait for it. */
static int submit(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  pthread_mutex_lock(&pg->lock);
  int failed = pg->failed, stopped = pg->stop;
  char first[MSG_CAP];
  if (failed) snprintf(first, sizeof first, "%s", pg->failure);
  int ahead = 0;
  if (!failed && !stopped) {
    for (ddp_work *q = pg->head; q; q = q->next) ahead++;
    w->timeout_s = pg->timeout_s * (ahead + 1) + 10.0;
    if (pg->tail) pg->tail->next = w;
    else pg->head = w;
    pg->tail = w;
    pthread_cond_signal(&pg->cv);
  }
  pthread_mutex_unlock(&pg->lock);
  if (failed || stopped) {
    const char *op = op_names[w->kind];
    int me = pg->global[pg->rank];
    w->refs = 1;
    work_unref(w);
    if (failed)
      DDP_FAIL(failed, "%s on rank %d: the process group failed earlier: %s", op, me, first);
    DDP_FAIL(DDP_ERR_STATE, "%s on rank %d: the process group is being destroyed", op, me);
  }
  if (handle) {
    *handle = w;
    return DDP_OK;
  }
  int status = ddp_work_wait(w, 0);
  ddp_work_free(w);
  return status;
}

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
  const char *op = op_names[w->kind];
  int status = to_host(&w->t, &w->dev_t, w->kind != OP_RECV);
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

/* Note [nccl work]: the collective is enqueued at once from this thread (backend/cuda/nccl_api.h: the
 * communication stream waits for the current stream first); every device tensor it uses is
 * recorded on the communication stream so the caching allocator keeps its memory until the
 * collective is done, even if the tensor is freed before. ddp_work_wait then makes the
 * current stream wait for the work's event (torch's work.wait(): the host goes on); a
 * blocking call does that before it returns, except barrier, which blocks the host (as
 * PyTorch's). ddp_work_synchronize blocks the host, polling the communicator for errors. */
static int nccl_enqueue(ddp_pg *pg, ddp_work *w) {
  const struct ddp_nccl_api *N = pg->nccl;
  ddp_nccl_comm *c = pg->comm;
  ddp_tensor *t = w->t, *o = w->out;
  void **ev = &w->event;
  switch (w->kind) {
    case OP_ALLREDUCE:
      return N->all_reduce(c, ddp_data(t), (size_t)t->numel, t->dtype, w->op, ev);
    case OP_BROADCAST:
      return N->broadcast(c, ddp_data(t), (size_t)t->numel, t->dtype, w->root, ev);
    case OP_ALLGATHER:
      return N->all_gather(c, ddp_data(o), ddp_data(t), (size_t)t->numel, t->dtype, ev);
    case OP_ALLGATHER_LIST: {
      /* Into one (world, ...) buffer, then the rows into the list on the current stream. */
      int64_t shape[DDP_MAX_DIMS + 1];
      shape[0] = pg->size;
      memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
      ddp_tensor *all = NULL;
      DDP_TRY(ddp_tensor_empty(&all, t->ndim + 1, shape, t->dtype, pg->device));
      int status = N->all_gather(c, ddp_data(all), ddp_data(t), (size_t)t->numel, t->dtype, ev);
      if (!status) status = ddp_cuda_record_stream(all, (ddp_stream *)N->comm_stream(c));
      if (!status) status = N->wait_stream(c, w->event);
      for (int i = 0; i < pg->size && !status; i++) {
        ddp_tensor *row = NULL;
        status = chunk_view(&row, all, i, t->ndim, t->shape);
        if (!status) status = ddp_copy_(w->outs[i], row);
        ddp_tensor_release(row);
      }
      ddp_tensor_release(all);
      if (status) return status;
      /* The handle now stands for the copies too: an event on the current stream. */
      ddp_stream *cur = NULL;
      ddp_event *e = NULL;
      status = ddp_cuda_current_stream(&cur, pg->device);
      if (!status) status = ddp_cuda_event_new(&e, pg->device, 0);
      if (!status) status = ddp_cuda_event_record(e, cur);
      if (status) {
        ddp_cuda_event_free(e);
        return status;
      }
      N->event_free(w->event);
      w->event = e;
      return DDP_OK;
    }
    case OP_REDUCE_SCATTER:
      return N->reduce_scatter(c, ddp_data(o), ddp_data(t), (size_t)o->numel, t->dtype, w->op,
                               ev);
    case OP_REDUCE:
      return N->reduce(c, ddp_data(t), (size_t)t->numel, t->dtype, w->op, w->root, ev);
    case OP_GATHER:
      return N->gather(c, o ? ddp_data(o) : NULL, ddp_data(t), (size_t)t->numel, t->dtype,
                       w->root, ev);
    case OP_SCATTER:
      return N->scatter(c, ddp_data(o), t ? ddp_data(t) : NULL, (size_t)o->numel, o->dtype,
                        w->root, ev);
    case OP_ALLTOALL:
      return N->all_to_all(c, ddp_data(o), ddp_data(t), (size_t)(t->numel / pg->size), t->dtype,
                           ev);
    case OP_SEND:
      return N->send(c, ddp_data(t), (size_t)t->numel, t->dtype, w->peer, ev);
    case OP_RECV:
      return N->recv(c, ddp_data(t), (size_t)t->numel, t->dtype, w->peer, ev);
    case OP_BARRIER:
      return N->barrier(c, ev);
  }
  DDP_FAIL(DDP_ERR_STATE, "nccl: unknown work kind %d", (int)w->kind);
}

static int nccl_submit(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  w->refs = 1; /* no queue: the caller's reference only */
  w->nccl = 1;
  w->napi = pg->nccl;
  w->timeout_s = pg->timeout_s;
  int status = nccl_enqueue(pg, w);
  ddp_stream *comm_stream = (ddp_stream *)pg->nccl->comm_stream(pg->comm);
  if (!status && w->t) status = ddp_cuda_record_stream(w->t, comm_stream);
  if (!status && w->out) status = ddp_cuda_record_stream(w->out, comm_stream);
  if (status) {
    ddp_error_prefix("%s on rank %d (nccl backend)", op_names[w->kind], pg->global[pg->rank]);
    work_unref(w);
    return status;
  }
  if (handle) {
    *handle = w;
    return DDP_OK;
  }
  status = w->kind == OP_BARRIER ? ddp_work_synchronize(w, 0) : ddp_work_wait(w, 0);
  work_unref(w);
  return status;
}

/* Hand w (which holds its references) to the group's backend. */
static int dispatch(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  if (pg->nccl) return nccl_submit(handle, pg, w);
  int status = stage_to_host(w);
  if (status) {
    w->refs = 1;
    work_unref(w);
    return status;
  }
  return submit(handle, pg, w);
}

#define NEW_WORK(w, pg, kind)                                                              \
  ddp_work *w = work_new((pg), (kind));                                                    \
  if (!w) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op_names[kind])

int ddp_pg_allreduce(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int op) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "all_reduce"));
  DDP_TRY(check_tensor(pg, t, "all_reduce", "tensor", 1));
  DDP_TRY(check_op(op, t, "all_reduce"));
  NEW_WORK(w, pg, OP_ALLREDUCE);
  w->t = keep(t);
  w->op = op;
  return dispatch(work, pg, w);
}

int ddp_pg_broadcast(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int root) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "broadcast"));
  DDP_TRY(check_tensor(pg, t, "broadcast", "tensor", 0));
  DDP_TRY(check_root(pg, root, "broadcast", "src"));
  NEW_WORK(w, pg, OP_BROADCAST);
  w->t = keep(t);
  w->root = root;
  return dispatch(work, pg, w);
}

int ddp_pg_allgather(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *t) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "all_gather"));
  DDP_TRY(check_tensor(pg, t, "all_gather", "tensor", 0));
  DDP_TRY(check_tensor(pg, out, "all_gather", "output", 0));
  DDP_TRY(check_stacked(pg, out, t, "all_gather", "output", "tensor"));
  NEW_WORK(w, pg, OP_ALLGATHER);
  w->t = keep(t);
  w->out = keep(out);
  return dispatch(work, pg, w);
}

int ddp_pg_allgather_list(ddp_work **work, ddp_pg *pg, ddp_tensor **outs, int n,
                          ddp_tensor *t) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "all_gather"));
  DDP_TRY(check_tensor(pg, t, "all_gather", "tensor", 0));
  if (n != pg->size)
    DDP_FAIL(DDP_ERR_ARG, "all_gather: the output list has %d tensors but the group has %d "
             "ranks", n, pg->size);
  for (int i = 0; i < n; i++) {
    DDP_TRY(check_tensor(pg, outs[i], "all_gather", "output list entry", 0));
    if (outs[i]->dtype != t->dtype || !same_shape(outs[i]->ndim, outs[i]->shape, t->ndim, t->shape))
      DDP_FAIL(DDP_ERR_ARG, "all_gather: output %d is %s %s but tensor is %s %s", i + 1,
               ddp_dtype_name(outs[i]->dtype), DDP_SHAPE(outs[i]), ddp_dtype_name(t->dtype),
               DDP_SHAPE(t));
  }
  NEW_WORK(w, pg, OP_ALLGATHER_LIST);
  w->outs = calloc((size_t)n, sizeof *w->outs);
  if (!w->outs) {
    w->refs = 1;
    work_unref(w);
    DDP_FAIL(DDP_ERR_MEMORY, "all_gather: out of memory");
  }
  w->nouts = n;
  for (int i = 0; i < n; i++) w->outs[i] = keep(outs[i]);
  w->t = keep(t);
  return dispatch(work, pg, w);
}

int ddp_pg_reduce_scatter(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in, int op) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "reduce_scatter"));
  DDP_TRY(check_tensor(pg, in, "reduce_scatter", "input", 1));
  DDP_TRY(check_tensor(pg, out, "reduce_scatter", "output", 1));
  DDP_TRY(check_op(op, in, "reduce_scatter"));
  if (out->dtype != in->dtype)
    DDP_FAIL(DDP_ERR_ARG, "reduce_scatter: output has dtype %s but input has %s",
             ddp_dtype_name(out->dtype), ddp_dtype_name(in->dtype));
  if (in->ndim < 1 || out->ndim != in->ndim || in->shape[0] != out->shape[0] * pg->size ||
      !same_shape(in->ndim - 1, in->shape + 1, out->ndim - 1, out->shape + 1))
    DDP_FAIL(DDP_ERR_ARG, "reduce_scatter: input must have shape (world size %d * m, ...) and "
             "output (m, ...), got input %s and output %s", pg->size, DDP_SHAPE(in), DDP_SHAPE(out));
  NEW_WORK(w, pg, OP_REDUCE_SCATTER);
  w->t = keep(in);
  w->out = keep(out);
  w->op = op;
  return dispatch(work, pg, w);
}

int ddp_pg_reduce(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int root, int op) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "reduce"));
  DDP_TRY(check_tensor(pg, t, "reduce", "tensor", 1));
  DDP_TRY(check_root(pg, root, "reduce", "dst"));
  DDP_TRY(check_op(op, t, "reduce"));
  NEW_WORK(w, pg, OP_REDUCE);
  w->t = keep(t);
  w->root = root;
  w->op = op;
  return dispatch(work, pg, w);
}

int ddp_pg_gather(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *t, int root) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "gather"));
  DDP_TRY(check_tensor(pg, t, "gather", "tensor", 0));
  DDP_TRY(check_root(pg, root, "gather", "dst"));
  if (pg->rank == root) {
    if (!out) DDP_FAIL(DDP_ERR_ARG, "gather: the destination rank %d needs an output tensor", root);
    DDP_TRY(check_tensor(pg, out, "gather", "output", 0));
    DDP_TRY(check_stacked(pg, out, t, "gather", "output", "tensor"));
  } else if (out) {
    DDP_FAIL(DDP_ERR_ARG, "gather: only the destination rank %d takes an output tensor (this is "
             "rank %d)", root, pg->rank);
  }
  NEW_WORK(w, pg, OP_GATHER);
  w->t = keep(t);
  w->out = out ? keep(out) : NULL;
  w->root = root;
  return dispatch(work, pg, w);
}

int ddp_pg_scatter(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in, int root) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "scatter"));
  DDP_TRY(check_tensor(pg, out, "scatter", "output", 0));
  DDP_TRY(check_root(pg, root, "scatter", "src"));
  if (pg->rank == root) {
    if (!in) DDP_FAIL(DDP_ERR_ARG, "scatter: the source rank %d needs an input tensor", root);
    DDP_TRY(check_tensor(pg, in, "scatter", "input", 0));
    DDP_TRY(check_stacked(pg, in, out, "scatter", "input", "output"));
  } else if (in) {
    DDP_FAIL(DDP_ERR_ARG, "scatter: only the source rank %d takes an input tensor (this is rank %d)",
             root, pg->rank);
  }
  NEW_WORK(w, pg, OP_SCATTER);
  w->t = in ? keep(in) : NULL;
  w->out = keep(out);
  w->root = root;
  return dispatch(work, pg, w);
}

int ddp_pg_alltoall(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "all_to_all"));
  DDP_TRY(check_tensor(pg, in, "all_to_all", "input", 0));
  DDP_TRY(check_tensor(pg, out, "all_to_all", "output", 0));
  if (out->dtype != in->dtype || !same_shape(out->ndim, out->shape, in->ndim, in->shape))
    DDP_FAIL(DDP_ERR_ARG, "all_to_all: output (%s %s) must match input (%s %s)",
             ddp_dtype_name(out->dtype), DDP_SHAPE(out), ddp_dtype_name(in->dtype), DDP_SHAPE(in));
  if (in->ndim < 1 || in->shape[0] % pg->size != 0)
    DDP_FAIL(DDP_ERR_ARG, "all_to_all: input's first dimension must be a multiple of the world "
             "size %d, got shape %s", pg->size, DDP_SHAPE(in));
  NEW_WORK(w, pg, OP_ALLTOALL);
  w->t = keep(in);
  w->out = keep(out);
  return dispatch(work, pg, w);
}

static int check_p2p(const ddp_pg *pg, int other, int tag, const char *op, const char *what) {
  DDP_TRY(check_root(pg, other, op, what));
  if (other == pg->rank)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s rank %d is this rank", op, what, other);
  if (tag < 0 || tag >= (1 << 24))
    DDP_FAIL(DDP_ERR_ARG, "%s: tag must be in 0 .. 2^24-1, got %d", op, tag);
  return DDP_OK;
}

int ddp_pg_send(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int dst, int tag) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "send"));
  DDP_TRY(check_tensor(pg, t, "send", "tensor", 0));
  DDP_TRY(check_p2p(pg, dst, tag, "send", "dst"));
  NEW_WORK(w, pg, OP_SEND);
  w->t = keep(t);
  w->peer = dst;
  w->tag = tag;
  return dispatch(work, pg, w);
}

int ddp_pg_recv(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int src, int tag) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "recv"));
  DDP_TRY(check_tensor(pg, t, "recv", "tensor", 0));
  DDP_TRY(check_p2p(pg, src, tag, "recv", "src"));
  NEW_WORK(w, pg, OP_RECV);
  w->t = keep(t);
  w->peer = src;
  w->tag = tag;
  return dispatch(work, pg, w);
}

int ddp_pg_barrier(ddp_work **work, ddp_pg *pg) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "barrier"));
  NEW_WORK(w, pg, OP_BARRIER);
  return dispatch(work, pg, w);
}

/* ---- waiting -------------------------------------------------------------------------- */

/* The nccl group of work w, or a "destroyed" error. */
static int nccl_prefix(ddp_work *w, int status) {
  if (status)
    ddp_error_prefix("%s on rank %d (nccl backend)", op_names[w->kind], w->pg->global[w->pg->rank]);
  return status;
}

int ddp_work_synchronize(ddp_work *w, double timeout_s) {
  if (!w) DDP_FAIL(DDP_ERR_ARG, "synchronize: no work handle");
  if (!w->nccl) return ddp_work_wait(w, timeout_s);
  if (timeout_s <= 0) timeout_s = w->timeout_s;
  return nccl_prefix(w, w->napi->wait_host(w->pg->comm, w->event, timeout_s));
}

int ddp_work_wait(ddp_work *w, double timeout_s) {
  if (!w) DDP_FAIL(DDP_ERR_ARG, "wait: no work handle");
  if (w->nccl) { /* Note [nccl work]: a known communicator failure first, then the stream */
    int done = 0;
    int status = w->napi->query(w->pg->comm, w->event, &done);
    if (!status && !done) status = w->napi->wait_stream(w->pg->comm, w->event);
    return nccl_prefix(w, status);
  }
  if (timeout_s <= 0) timeout_s = w->timeout_s;
  struct timespec until = deadline_after(timeout_s);
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
  int done = w->done, status = w->status;
  char msg[MSG_CAP];
  if (done && status) snprintf(msg, sizeof msg, "%s", w->msg);
  pthread_mutex_unlock(&w->mu);
  if (!done)
    DDP_FAIL(DDP_ERR_TIMEOUT, "wait: %s did not complete within %g s (the work goes on)",
             op_names[w->kind], timeout_s);
  if (status) DDP_FAIL(status, "%s", msg);
  return DDP_OK;
}

int ddp_work_is_completed(ddp_work *w) {
  if (!w) return 1;
  if (w->nccl) {
    int done = 0;
    if (w->napi->query(w->pg->comm, w->event, &done)) return 1; /* failed: finished */
    return done;
  }
  pthread_mutex_lock(&w->mu);
  int done = w->done;
  pthread_mutex_unlock(&w->mu);
  return done;
}

void ddp_work_free(ddp_work *w) {
  if (w) work_unref(w);
}

void ddp_pg_free(ddp_pg *pg) {
  if (!pg) return;
  if (pg->nccl) { /* no threads: the communicator flushes its queued work */
    pg_destroy(pg);
    return;
  }
  pthread_mutex_lock(&pg->lock);
  pg->stop = 1;
  pthread_cond_signal(&pg->cv);
  pthread_mutex_unlock(&pg->lock);
  pthread_join(pg->thread, NULL);
  /* The communication thread posted its last message: now drain the point-to-point ones. */
  pthread_mutex_lock(&pg->lock);
  pg->p2p_stop = 1;
  pthread_cond_signal(&pg->p2p_cv);
  pthread_mutex_unlock(&pg->lock);
  pthread_join(pg->p2p_thread, NULL);
  pg_destroy(pg);
}
