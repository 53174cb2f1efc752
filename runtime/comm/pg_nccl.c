/* runtime/comm/pg_nccl.c: backend "nccl" of the process groups (Note [pg backend] in
 * pg_internal.h), the host side of the CUDA plug-in's NCCL table (backend/cuda/nccl_api.h): no thread and
 * no Gloo; each collective is enqueued from the calling thread on the communicator's
 * stream and its work handle is the event recorded after it (Note [nccl work] in
 * ddplua/pg.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/pg_fingerprint.h"
#include "comm/pg_internal.h"
#include "comm/pg_recorder.h"
#include "comm/pg_shm.h"
#include "comm/gloo_shim.h"
#include "backend/cuda/nccl_api.h"

/* The state of an nccl group (ddp_pg.impl). */
typedef struct nccl_state {
  const struct ddp_nccl_api *api; /* the plug-in's table (static) */
  ddp_nccl_comm *comm;            /* this group's communicator */
  ddp_shm *shm;                   /* the fingerprint exchange when every rank is on this
                                   * host (Note [collective fingerprints]), else NULL */
} nccl_state;

static nccl_state *state(const ddp_pg *pg) { return (nccl_state *)pg->impl; }

/* Copies on the current stream after the collective (all_gather's list rows, Note
 * [sharding collectives]'s unpacking): the current stream waits for the collective's event,
 * `copy(w)` runs there, and the work's event becomes one recorded after it. */
static int then_on_current_stream(ddp_pg *pg, ddp_work *w, int (*copy)(ddp_work *w)) {
  const struct ddp_nccl_api *N = state(pg)->api;
  int status = N->wait_stream(state(pg)->comm, w->event);
  if (!status) status = copy(w);
  if (status) return status;
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

/* The rows of the (world, ...) buffer w->out into the list w->outs. */
static int copy_rows_to_list(ddp_work *w) {
  for (int i = 0; i < w->nouts; i++) {
    ddp_tensor *row = NULL;
    int status = pg_chunk_view(&row, w->out, i, w->t->ndim, w->t->shape);
    if (!status) status = ddp_copy_(w->outs[i], row);
    ddp_tensor_release(row);
    if (status) return status;
  }
  return DDP_OK;
}

/* Note [nccl work]: the collective is enqueued at once from this thread (backend/cuda/nccl_api.h: the
 * communication stream waits for the current stream first); every device tensor it uses is
 * recorded on the communication stream so the caching allocator keeps its memory until the
 * collective is done, even if the tensor is freed before. ddp_work_wait then makes the
 * current stream wait for the work's event (torch's work.wait(): the host goes on); a
 * blocking call does that before it returns, except barrier, which blocks the host (as
 * PyTorch's). ddp_work_synchronize blocks the host, polling the communicator for errors. */
static int nccl_enqueue(ddp_pg *pg, ddp_work *w) {
  const struct ddp_nccl_api *N = state(pg)->api;
  ddp_nccl_comm *c = state(pg)->comm;
  ddp_tensor *t = w->t, *o = w->out;
  void **ev = &w->event;
  int status;
  switch (pg_op_path(w->kind)) { /* Note [sharding collectives] */
    case PG_ALLREDUCE:
      return N->all_reduce(c, ddp_data(t), (size_t)t->numel, t->dtype, w->op, ev);
    case PG_BROADCAST:
      return N->broadcast(c, ddp_data(t), (size_t)t->numel, t->dtype, w->root, ev);
    case PG_ALLGATHER:
      status = N->all_gather(c, ddp_data(o), ddp_data(t), (size_t)t->numel, t->dtype, ev);
      if (!status && w->kind == PG_ALLGATHER_COALESCED)
        status = then_on_current_stream(pg, w, pg_unpack_coalesced);
      return status;
    case PG_ALLGATHER_LIST: {
      /* Into one (world, ...) buffer (kept as w->out, so it lives as long as the work), then
       * the rows into the list on the current stream. */
      int64_t shape[DDP_MAX_DIMS + 1];
      shape[0] = pg->size;
      memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
      DDP_TRY(ddp_tensor_empty(&w->out, t->ndim + 1, shape, t->dtype, pg->device));
      status = N->all_gather(c, ddp_data(w->out), ddp_data(t), (size_t)t->numel, t->dtype, ev);
      if (!status) status = then_on_current_stream(pg, w, copy_rows_to_list);
      return status;
    }
    case PG_REDUCE_SCATTER:
      status = N->reduce_scatter(c, ddp_data(o), ddp_data(t), (size_t)o->numel, t->dtype, w->op,
                                 ev);
      if (!status && w->kind == PG_REDUCE_SCATTER_COALESCED)
        status = then_on_current_stream(pg, w, pg_unpack_coalesced);
      return status;
    case PG_REDUCE:
      return N->reduce(c, ddp_data(t), (size_t)t->numel, t->dtype, w->op, w->root, ev);
    case PG_GATHER:
      return N->gather(c, o ? ddp_data(o) : NULL, ddp_data(t), (size_t)t->numel, t->dtype,
                       w->root, ev);
    case PG_SCATTER:
      return N->scatter(c, ddp_data(o), t ? ddp_data(t) : NULL, (size_t)o->numel, o->dtype,
                        w->root, ev);
    case PG_ALLTOALL:
      return N->all_to_all(c, ddp_data(o), ddp_data(t), (size_t)(t->numel / pg->size), t->dtype,
                           ev);
    case PG_ALLTOALL_SINGLE: { /* rows -> elements per rank */
      size_t row = 1, *counts = malloc(sizeof(size_t) * 2 * (size_t)pg->size);
      if (!counts) DDP_FAIL(DDP_ERR_MEMORY, "all_to_all_single: out of memory");
      for (int d = 1; d < t->ndim; d++) row *= (size_t)t->shape[d];
      for (int r = 0; r < pg->size; r++) {
        counts[r] = (size_t)w->in_splits[r] * row;
        counts[pg->size + r] = (size_t)w->out_splits[r] * row;
      }
      status = N->all_to_allv(c, ddp_data(o), counts + pg->size, ddp_data(t), counts, t->dtype,
                              ev);
      free(counts);
      return status;
    }
    case PG_SEND:
      return N->send(c, ddp_data(t), (size_t)t->numel, t->dtype, w->peer, ev);
    case PG_RECV:
      return N->recv(c, ddp_data(t), (size_t)t->numel, t->dtype, w->peer, ev);
    case PG_BARRIER:
      return N->barrier(c, ev);
    case PG_REDUCE_SCATTER_TENSOR: /* pg_op_path maps these to the cases above */
    case PG_ALLGATHER_INTO_TENSOR:
    case PG_REDUCE_SCATTER_COALESCED:
    case PG_ALLGATHER_COALESCED:
    case PG_OP_COUNT:
      break;
  }
  DDP_FAIL(DDP_ERR_STATE, "nccl: unknown work kind %d", (int)w->kind);
}

/* Note [collective fingerprints] for nccl: NCCL has no host-side step to ride on. When
 * every rank of the group runs on this host, the records go through the shared-memory
 * segment's arrival step (pg_shm.h), a host barrier of a few microseconds that never
 * waits on the GPU. Otherwise they go round in an NCCL all-gather of their own (after the
 * current stream, like every collective) that the host waits for: that drains the
 * current stream before each collective. */
static int agree_on_device(ddp_pg *pg, const pg_fp *mine, pg_fp *all_out) {
  const struct ddp_nccl_api *N = state(pg)->api;
  ddp_nccl_comm *c = state(pg)->comm;
  int64_t one = PG_FP_BYTES, all = (int64_t)PG_FP_BYTES * pg->size;
  ddp_tensor *h_in = NULL, *d_in = NULL, *d_all = NULL, *h_all = NULL;
  void *ev = NULL;
  int status = ddp_tensor_empty(&h_in, 1, &one, DDP_U8, DDP_DEVICE_CPU);
  if (!status) {
    memcpy(ddp_data(h_in), mine, sizeof *mine);
    status = ddp_tensor_empty(&d_in, 1, &one, DDP_U8, pg->device);
  }
  if (!status) status = ddp_copy_(d_in, h_in);
  if (!status) status = ddp_tensor_empty(&d_all, 1, &all, DDP_U8, pg->device);
  if (!status) status = N->all_gather(c, ddp_data(d_all), ddp_data(d_in), PG_FP_BYTES, DDP_U8, &ev);
  if (!status) status = N->wait_host(c, ev, pg->timeout_s);
  if (!status) status = N->wait_stream(c, ev);
  if (!status) status = ddp_tensor_empty(&h_all, 1, &all, DDP_U8, DDP_DEVICE_CPU);
  if (!status) status = ddp_copy_(h_all, d_all);
  if (!status) memcpy(all_out, ddp_data(h_all), (size_t)all);
  if (ev) N->event_free(ev);
  ddp_tensor_release(h_in);
  ddp_tensor_release(d_in);
  ddp_tensor_release(d_all);
  ddp_tensor_release(h_all);
  return status;
}

/* Exchange and compare w's fingerprint. Any failure (a mismatch, or the exchange itself)
 * aborts the communicator: every rank sees the same records, so on a mismatch every rank
 * does; after a failed exchange the ranks no longer agree on where they are. */
static int nccl_agree(ddp_pg *pg, ddp_work *w) {
  nccl_state *s = state(pg);
  pg_fp mine, stack[8];
  pg_fp *all = pg->size <= 8 ? stack : malloc(sizeof(pg_fp) * (size_t)pg->size);
  if (!all) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory for the fingerprints", pg_op_names[w->kind]);
  pg_fp_make(&mine, pg, w, w->seq);
  int status, agreed = 0;
  if (s->shm) {
    char err[DDP_GLOO_ERR_CAP];
    int peer = -1;
    status = ddp_shm_arrive(s->shm, &mine, sizeof mine, pg_fp_digest(&mine), all, &agreed,
                            NULL, pg->timeout_s, err, &peer);
    if (status) DDP_ERROR(status, "%s", err);
  } else {
    status = agree_on_device(pg, &mine, all);
  }
  char msg[PG_MSG_CAP];
  if (!status && !agreed && pg_fp_check(pg, all, msg, sizeof msg)) {
    s->api->comm_abort(s->comm);
    status = DDP_ERROR(DDP_ERR_ARG, "%s", msg);
  } else if (status) {
    s->api->comm_abort(s->comm);
    ddp_error_prefix("%s on rank %d (nccl backend, exchanging fingerprints)",
                     pg_op_names[w->kind], pg->global[pg->rank]);
  }
  if (all != stack) free(all);
  return status;
}

static void nccl_abort_group(ddp_pg *pg, ddp_work *w);

/* The backend's `enqueue`: no queue, the collective goes on the stream now. */
static int nccl_submit(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  w->refs = 1; /* no queue: the caller's reference only */
  w->napi = state(pg)->api;
  w->timeout_s = pg->timeout_s;
  /* A failed communicator refuses the collective itself (with its reason): no exchange. */
  const char *broken = state(pg)->api->comm_error(state(pg)->comm);
  if (pg_fp_applies(w->kind) && !(broken && *broken)) {
    int st = nccl_agree(pg, w);
    if (st) {
      nccl_abort_group(pg, w);
      pg_work_unref(w);
      return st;
    }
  }
  int status = nccl_enqueue(pg, w);
  ddp_stream *comm_stream = (ddp_stream *)state(pg)->api->comm_stream(state(pg)->comm);
  if (!status && w->t) status = ddp_cuda_record_stream(w->t, comm_stream);
  if (!status && w->out) status = ddp_cuda_record_stream(w->out, comm_stream);
  if (status) {
    ddp_error_prefix("%s on rank %d (nccl backend)", pg_op_names[w->kind], pg->global[pg->rank]);
    pg_work_unref(w);
    return status;
  }
  if (handle) {
    *handle = w;
    return DDP_OK;
  }
  status = w->kind == PG_BARRIER ? ddp_work_synchronize(w, 0) : ddp_work_wait(w, 0);
  pg_work_unref(w);
  return status;
}


/* ---- work handles ------------------------------------------------------------------------ */

/* Note [group abort] (pg.c): a collective that failed in the communicator (its exchange of
 * fingerprints, a wait, a poll) aborts the group on every rank; the peers learn it from the
 * store. The caller's error stays as it was. */
static void nccl_abort_group(ddp_pg *pg, ddp_work *w) {
  ddp_saved_error e;
  ddp_error_save(&e);
  char msg[PG_MSG_CAP], site[PG_SITE_CAP + 64];
  pg_work_site(w, site, sizeof site);
  snprintf(msg, sizeof msg, "%s%s", e.text, site);
  pg_abort(pg, e.status ? e.status : DDP_ERR_STATE, msg, NULL);
  ddp_error_restore(&e);
}

/* Name the collective, the rank and the backend in a failure's message (and abort the
 * group: a wait or a poll failed). */
static int nccl_prefix(ddp_work *w, int status) {
  if (status) {
    ddp_error_prefix("%s on rank %d (nccl backend)", pg_op_names[w->kind], w->pg->global[w->pg->rank]);
    nccl_abort_group(w->pg, w);
  }
  return status;
}

/* Note [flight recorder]: an nccl record completes when the host learns it did (a
 * synchronize, or a wait or poll that found it done); nccl records are never "started",
 * so they take no part in stall reports (the host does not wait on the stream). */
static int nccl_synchronize(ddp_work *w, double timeout_s) {
  if (timeout_s <= 0) timeout_s = w->timeout_s;
  int status = w->napi->wait_host(state(w->pg)->comm, w->event, timeout_s);
  pg_rec_complete(w->pg->rec, w, status);
  return nccl_prefix(w, status);
}

/* Note [nccl work]: a known communicator failure first, then the stream. */
static int nccl_wait(ddp_work *w, double timeout_s) {
  int done = 0;
  int status = w->napi->query(state(w->pg)->comm, w->event, &done);
  if (done || status) pg_rec_complete(w->pg->rec, w, status);
  if (!status && !done) status = w->napi->wait_stream(state(w->pg)->comm, w->event);
  return nccl_prefix(w, status);
}

static int nccl_is_completed(ddp_work *w) {
  int done = 0;
  if (w->napi->query(state(w->pg)->comm, w->event, &done)) return 1; /* failed: finished */
  return done;
}

static void nccl_work_free(ddp_work *w) {
  if (w->event && w->napi) w->napi->event_free(w->event);
}

/* Contiguous tensors on the communicator's device (as PyTorch's ProcessGroupNCCL). */
static int nccl_check_tensor(const ddp_pg *pg, const ddp_tensor *t, const char *op,
                             const char *arg) {
  if (t->device != pg->device)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s is on %s but the nccl backend of this rank takes CUDA tensors "
             "on %s (use the gloo backend for CPU tensors)", op, arg, ddp_device_str(t->device),
             ddp_device_str(pg->device));
  if (!ddp_tensor_is_contiguous(t))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s must be contiguous for the nccl backend (call contiguous() "
             "first)", op, arg);
  return DDP_OK;
}

/* ---- groups ------------------------------------------------------------------------------ */

/* Note [nccl abort]: Note [group abort] (pg.c) for nccl. The plug-in's communicator is used
 * by the program's thread without a lock (an enqueue, a poll), so ncclCommAbort, which frees
 * it, is called only from that thread: at ddp_pg_abort (abort_owned) and when an aborted
 * group is freed (instead of destroying it, which would wait for work that will never
 * finish). An abort learnt on another thread (the watcher, the REPL's interrupt) poisons the
 * fingerprint segment, where a host blocked in the arrival step then fails at once, and
 * every later call of the group fails before it reaches the communicator (pg.c:
 * check_group); a host blocked in ddp_work_synchronize still waits for its timeout. */
static void nccl_abort(ddp_pg *pg) {
  nccl_state *s = state(pg);
  if (!s) return;
  char msg[PG_MSG_CAP];
  pthread_mutex_lock(&pg->lock);
  snprintf(msg, sizeof msg, "%s", pg->failure);
  pthread_mutex_unlock(&pg->lock);
  ddp_shm_abort(s->shm, msg);
}

static void nccl_abort_owned(ddp_pg *pg) {
  nccl_state *s = state(pg);
  if (s && s->comm) s->api->comm_abort(s->comm);
}

static void nccl_free(ddp_pg *pg) { /* no threads: the communicator flushes its queued work */
  nccl_state *s = state(pg);
  if (s && s->comm && ddp_pg_is_aborted(pg)) s->api->comm_abort(s->comm); /* Note [nccl abort] */
  if (s && s->comm) s->api->comm_destroy(s->comm);
  if (s) ddp_shm_free(s->shm);
  free(s);
  pg->impl = NULL;
}

/* Build an nccl group: the unique id goes from group rank 0 to the others through the store
 * (key "<prefix>/nccl_id"), then every rank joins the communicator on `device`. `global` is
 * taken over. */
static int pg_create_nccl(ddp_pg **out, struct ddp_store *store, int rank, int size,
                          const char *prefix, double timeout_s, int *global, int device,
                          const struct ddp_nccl_api *nccl) {
  ddp_pg *pg = pg_header_new(&pg_nccl_backend, store, rank, size, prefix, timeout_s, global,
                             device);
  if (!pg) return ddp_last_status();
  nccl_state *s = calloc(1, sizeof *s);
  if (!s) {
    pg_header_free(pg);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  }
  pg->impl = s;
  s->api = nccl;
  int me = global[rank];
  int status = pg_check_world_size(store, prefix, rank, size, me);
  if (status) {
    ddp_pg_free(pg);
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
  if (!status) status = nccl->comm_init(&s->comm, id, rank, size, device, timeout_s);
  if (!status) status = ddp_shm_new(&s->shm, store, prefix, rank, size, global);
  if (status) {
    ddp_pg_free(pg);
    ddp_error_prefix("init_process_group: rank %d of %d (nccl backend, %s, group '%s')", me, size,
                     ddp_device_str(device), prefix);
    return status;
  }
  pg_mark_live(pg);
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
  int *global = NULL;
  DDP_TRY(pg_check_new(store, rank, world_size, &timeout_s, &global));
  return pg_create_nccl(out, store, rank, world_size, prefix && *prefix ? prefix : "pg",
                        timeout_s, global, device, nccl);
}

static int nccl_new_group(ddp_pg **out, ddp_pg *parent, int rank, int size, const char *prefix,
                          int *global) {
  return pg_create_nccl(out, parent->store, rank, size, prefix, parent->timeout_s, global,
                        parent->device, state(parent)->api);
}

static void nccl_set_timeout(ddp_pg *pg, double timeout_s) {
  if (state(pg)->comm) state(pg)->api->set_timeout(state(pg)->comm, timeout_s);
}

static const char *nccl_error(const ddp_pg *pg) {
  return state(pg)->comm ? state(pg)->api->comm_error(state(pg)->comm) : "";
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

const pg_backend pg_nccl_backend = {
  .kind = PG_BACKEND_NCCL,
  .enqueue = nccl_submit,
  .wait = nccl_wait,
  .synchronize = nccl_synchronize,
  .is_completed = nccl_is_completed,
  .work_free = nccl_work_free,
  .check_tensor = nccl_check_tensor,
  .new_group = nccl_new_group,
  .set_timeout = nccl_set_timeout,
  .abort = nccl_abort,
  .abort_owned = nccl_abort_owned,
  .error = nccl_error,
  .free = nccl_free,
};
