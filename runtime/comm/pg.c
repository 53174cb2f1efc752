/* runtime/comm/pg.c: the collective front doors of the process groups (see
 * ddplua/pg.h): argument checks, work handles, what every group has whatever its backend
 * (ranks, prefix, timeout, first failure), new_group and the getters. Each collective ends
 * in its group's backend table (Note [pg backend] in pg_internal.h): pg_gloo.c (host
 * tensors through the communication thread of pg_queue.c, Gloo and shared memory) or
 * pg_nccl.c (CUDA streams through the plug-in's NCCL table). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/pg_fingerprint.h"
#include "comm/pg_internal.h"
#include "comm/pg_recorder.h"
#include "comm/store_wire.h"

const double PG_DEFAULT_TIMEOUT_S = 300.0;

/* Note [pinned names]: each name table lists its names in enum order, without designators,
 * and is sized by its initializer, so the _Static_assert on the count fails to compile
 * when an enum value is added or removed without its name. */
const char *const pg_op_names[] = {
  "all_reduce", "broadcast", "all_gather", "all_gather" /* list form */, "reduce_scatter",
  "reduce", "gather", "scatter", "all_to_all", "send", "recv", "barrier",
  "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single",
  "reduce_scatter_tensor_coalesced", "all_gather_into_tensor_coalesced"};
_Static_assert(sizeof pg_op_names / sizeof pg_op_names[0] == PG_OP_COUNT,
               "pg_op_names: one name per pg_op, in enum order");

const char *const pg_backend_names[] = {"gloo", "nccl"};
_Static_assert(sizeof pg_backend_names / sizeof pg_backend_names[0] == PG_BACKEND_COUNT,
               "pg_backend_names: one name per pg_backend_kind, in enum order");

/* The names ddplua.distributed takes (op = "sum", ...), as torch.distributed.ReduceOp. */
static const char *const reduce_op_names[] = {"sum", "avg", "min", "max", "product"};
_Static_assert(sizeof reduce_op_names / sizeof reduce_op_names[0] == DDP_REDUCE_OP_COUNT,
               "reduce_op_names: one name per enum ddp_reduce_op, in enum order");

const char *ddp_reduce_op_name(int op) {
  return op >= 0 && op < DDP_REDUCE_OP_COUNT ? reduce_op_names[op] : NULL;
}

/* ---- call sites --------------------------------------------------------------------------- */

/* The Lua caller of the next collectives of this thread (ddp_pg_set_call_site). */
static __thread char call_site[PG_SITE_CAP];

void ddp_pg_set_call_site(const char *file, int line) {
  if (!file) call_site[0] = 0;
  else if (line > 0) snprintf(call_site, sizeof call_site, "%s:%d", file, line);
  else snprintf(call_site, sizeof call_site, "%s", file);
}

const char *pg_call_site(void) { return call_site; }

/* ---- work objects ----------------------------------------------------------------------- */

static void cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

static ddp_work *work_new(ddp_pg *pg, pg_op kind) {
  ddp_work *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->refs = 2; /* the caller's and the queue's */
  w->pg = pg;
  w->backend = pg->backend;
  w->kind = kind;
  memcpy(w->site, call_site, sizeof w->site);
  pthread_mutex_init(&w->mu, NULL);
  cond_init_monotonic(&w->cv);
  return w;
}

void pg_work_unref(ddp_work *w) {
  pthread_mutex_lock(&w->mu);
  int left = --w->refs;
  pthread_mutex_unlock(&w->mu);
  if (left) return;
  ddp_tensor_release(w->t);
  ddp_tensor_release(w->out);
  for (int i = 0; i < w->nouts; i++) ddp_tensor_release(w->outs[i]);
  if (w->backend->work_free) w->backend->work_free(w);
  free(w->outs);
  free(w->in_splits);
  free(w->out_splits);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

void pg_work_finish(ddp_work *w, int status, const char *msg) {
  if (w->pg) pg_rec_complete(w->pg->rec, w, status);
  pthread_mutex_lock(&w->mu);
  w->status = status;
  if (status) snprintf(w->msg, sizeof w->msg, "%s", msg);
  w->done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* ---- group abort ---------------------------------------------------------------------- */

/* Note [group abort]: a process group whose collective failed on one rank (a timeout, a
 * peer's death, a fingerprint mismatch) or that a rank aborted (ddp_pg_abort, the
 * distributed REPL's Ctrl-C) is poisoned on every rank, as NCCL's ncclCommAbort and
 * PyTorch's abort_process_group: every pending and later collective of the group on every
 * rank fails within about a second, naming the group's first failure (the rank, the
 * collective, its call site, the cause). Without it a rank that went on after a peer gave
 * up paired its next collective with the abandoned one (issue 24: through shared memory
 * rank 1 got 21 = its own 20 + rank 0's stale 1), and a rank left waiting waited out its
 * own timeout.
 *  1. The rank that fails first (pg_abort) records the failure in pg->failure (every later
 *     call of the group on this rank fails at once with it: check_group, pg_queue.c), then
 *     agrees on the group's first failure through the store: compare_set of
 *     "<prefix>/abort" from empty to its message, so the first writer of any rank wins and
 *     every rank adopts the stored message. This goes over the abort's own store connection
 *     (abort_store, short timeout): the group's connection may be held by the program's
 *     thread in a long store wait.
 *  2. Then it poisons the group with the agreed message through the backend's `abort`:
 *     gloo poisons its shared-memory segment (Note [shm abort] in pg_shm.c: every wait of
 *     every rank checks it, so the peers see it within microseconds to milliseconds) and
 *     fails its Gloo connections (Note [gloo abort] in gloo_shim.cc: the peers' operations
 *     on them fail at once); nccl poisons its fingerprint segment and aborts the
 *     communicator (ncclCommAbort) on the program's thread (Note [nccl abort]).
 *  3. The other ranks learn of it from the segment, from a failed connection (their own
 *     failure then finds the key taken in step 1 and adopts its message), or from the
 *     process's watcher thread (pg_recorder.c), which checks the key of every live group
 *     every PG_ABORT_POLL_S over the same abort connection (pg_abort_poll) and poisons the
 *     group there too (step 2: so a rank blocked on a healthy connection to a third rank
 *     gets out as well). The store is written before anything is poisoned, so a rank
 *     that sees the poison finds the key.
 * A work item that fails because of the abort says "<op> on rank N: the process group was
 * aborted: <first failure>". An aborted group stays aborted; ddp_pg_free it and make a new
 * one (under another prefix on the same store: the key stays). */

const double PG_ABORT_POLL_S = 0.25;
/* The abort connection's timeouts: a poll's (short: the watcher also prints stall reports,
 * which a store that does not answer must not hold up: Note [stall report store]), the
 * compare_set's; and how long polls pause after a failed one. */
static const double ABORT_POLL_TIMEOUT_S = 0.25, ABORT_STORE_TIMEOUT_S = 2.0,
                    ABORT_POLL_BACKOFF_S = 2.0;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The abort's store connection (Note [group abort]), opened on first use, with requests
 * timing out after timeout_s; under abort_mu. A file store is used as it is. NULL when the
 * store cannot be reached (error cleared). */
static ddp_store *abort_store(ddp_pg *pg, double timeout_s) {
  if (!pg->store) return NULL;
  if (pg->store->kind != STORE_KIND_TCP) return pg->store;
  if (!pg->abort_store && store_tcp_client_like(&pg->abort_store, pg->store, timeout_s)) {
    pg->abort_store = NULL;
    ddp_clear_error();
  }
  if (pg->abort_store) ddp_store_set_timeout(pg->abort_store, timeout_s);
  return pg->abort_store;
}

/* After a failed request: drop the connection (made anew at the next use) and pause the
 * polls. Under abort_mu. */
static void abort_store_failed(ddp_pg *pg) {
  ddp_clear_error();
  pg->abort_failed_at = mono_s();
  if (pg->abort_store) {
    ddp_store_free(pg->abort_store);
    pg->abort_store = NULL;
  }
}

static void abort_key(const ddp_pg *pg, char *key, size_t cap) {
  snprintf(key, cap, "%s/abort", pg->prefix);
}

/* Poison the group on this rank with a failure learnt from another rank (step 3). */
static void abort_remote(ddp_pg *pg, const char *msg) {
  pthread_mutex_lock(&pg->lock);
  int already = pg->aborting;
  if (!already) {
    pg->aborting = 1;
    pg->failed = DDP_ERR_PEER;
    snprintf(pg->failure, sizeof pg->failure, "%s", msg);
  }
  int live = pg->live;
  pthread_mutex_unlock(&pg->lock);
  if (!already && live && pg->backend->abort) pg->backend->abort(pg);
}

void pg_abort_learned(ddp_pg *pg, const char *msg) { abort_remote(pg, msg); }

void pg_abort(ddp_pg *pg, int status, const char *msg, char *first) {
  pthread_mutex_lock(&pg->lock);
  int already = pg->aborting;
  if (!already) {
    pg->aborting = 1;
    pg->failed = status ? status : DDP_ERR_STATE;
    snprintf(pg->failure, sizeof pg->failure, "%s", msg);
  }
  pthread_mutex_unlock(&pg->lock);
  if (!already) {
    /* step 1: the group's first failure, from any rank */
    char key[600];
    abort_key(pg, key, sizeof key);
    void *v = NULL;
    size_t n = 0;
    pthread_mutex_lock(&pg->abort_mu);
    ddp_store *st = abort_store(pg, ABORT_STORE_TIMEOUT_S);
    int rc = st ? ddp_store_compare_set(st, key, "", 0, msg, strlen(msg), &v, &n) : -1;
    if (rc > 0) {
      if (st == pg->abort_store) abort_store_failed(pg);
      else ddp_clear_error();
    }
    pthread_mutex_unlock(&pg->abort_mu);
    if (rc == 0 && v && n > 0 && (n != strlen(msg) || memcmp(v, msg, n) != 0)) {
      pthread_mutex_lock(&pg->lock); /* another rank's failure came first */
      pg->failed = DDP_ERR_PEER;
      snprintf(pg->failure, sizeof pg->failure, "%.*s", (int)(n < PG_MSG_CAP ? n : PG_MSG_CAP - 1),
               (const char *)v);
      pthread_mutex_unlock(&pg->lock);
    }
    ddp_store_free_value(v);
    /* step 2 */
    pthread_mutex_lock(&pg->lock);
    int live = pg->live;
    pthread_mutex_unlock(&pg->lock);
    if (live && pg->backend->abort) pg->backend->abort(pg);
  }
  if (first) {
    pthread_mutex_lock(&pg->lock);
    snprintf(first, PG_MSG_CAP, "%s", pg->failure);
    pthread_mutex_unlock(&pg->lock);
  }
}

void pg_abort_poll(ddp_pg *pg) {
  pthread_mutex_lock(&pg->lock);
  int skip = pg->aborting || !pg->live;
  pthread_mutex_unlock(&pg->lock);
  if (skip || !pg->store) return;
  char key[600];
  abort_key(pg, key, sizeof key);
  const char *keys[1] = {key};
  int have = 0;
  void *v = NULL;
  size_t n = 0;
  pthread_mutex_lock(&pg->abort_mu);
  double now = mono_s();
  /* at most every PG_ABORT_POLL_S (the watcher may wake sooner for a stall report), and
   * not for a while after a failed poll */
  if (now - pg->abort_polled_at < PG_ABORT_POLL_S * 0.8 ||
      (pg->abort_failed_at > 0 && now - pg->abort_failed_at < ABORT_POLL_BACKOFF_S)) {
    pthread_mutex_unlock(&pg->abort_mu);
    return;
  }
  pg->abort_polled_at = now;
  ddp_store *st = abort_store(pg, ABORT_POLL_TIMEOUT_S);
  if (!st) pg->abort_failed_at = mono_s();
  if (st && (ddp_store_check(st, keys, 1, &have) || (have && ddp_store_get(st, key, &v, &n)))) {
    have = 0;
    if (st == pg->abort_store) abort_store_failed(pg);
    else ddp_clear_error();
  }
  pthread_mutex_unlock(&pg->abort_mu);
  if (have && v) {
    char msg[PG_MSG_CAP];
    snprintf(msg, sizeof msg, "%.*s", (int)(n < PG_MSG_CAP ? n : PG_MSG_CAP - 1), (const char *)v);
    abort_remote(pg, msg);
  }
  ddp_store_free_value(v);
}

void pg_aborted_message(ddp_pg *pg, const ddp_work *w, char *msg) {
  char first[PG_MSG_CAP];
  pthread_mutex_lock(&pg->lock);
  snprintf(first, sizeof first, "%s", pg->failure);
  pthread_mutex_unlock(&pg->lock);
  snprintf(msg, PG_MSG_CAP, "%s on rank %d: the process group was aborted: %s",
           pg_op_names[w->kind], pg->global[pg->rank], first);
}

void pg_work_site(const ddp_work *w, char *out, size_t cap) {
  if (w->site[0])
    snprintf(out, cap, " (%s #%llu called at %s)", pg_op_names[w->kind],
             (unsigned long long)w->seq, w->site);
  else
    snprintf(out, cap, "%s", "");
}

void pg_mark_live(ddp_pg *pg) {
  pthread_mutex_lock(&pg->lock);
  pg->live = 1;
  pthread_mutex_unlock(&pg->lock);
}

int ddp_pg_abort(ddp_pg *pg, const char *reason) {
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "abort_process_group: no process group");
  char msg[PG_MSG_CAP];
  const char *site = pg_call_site();
  snprintf(msg, sizeof msg, "%s on rank %d%s%s", reason && *reason ? reason : "abort_process_group called",
           pg->global[pg->rank], site[0] ? " at " : "", site);
  pg_abort(pg, DDP_ERR_STATE, msg, NULL);
  if (pg->live && pg->backend->abort_owned) pg->backend->abort_owned(pg);
  return DDP_OK;
}

int ddp_pg_is_aborted(const ddp_pg *pg) {
  if (!pg) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&pg->lock);
  int a = pg->aborting;
  pthread_mutex_unlock((pthread_mutex_t *)&pg->lock);
  return a;
}

int pg_chunk_view(ddp_tensor **out, ddp_tensor *buf, int64_t index, int ndim,
                  const int64_t *shape) {
  int64_t strides[DDP_MAX_DIMS];
  int64_t numel = ddp_contiguous_strides(ndim, shape, strides);
  return ddp_tensor_view_raw(out, buf, ndim, shape, strides, buf->offset + index * numel);
}

/* ---- groups ------------------------------------------------------------------------------ */

int pg_check_new(struct ddp_store *store, int rank, int world_size, double *timeout_s,
                 int **global) {
  *global = NULL;
  if (!store) DDP_FAIL(DDP_ERR_ARG, "init_process_group: no store (the rendezvous) given");
  if (world_size < 1)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: world_size must be >= 1, got %d", world_size);
  if (rank < 0 || rank >= world_size)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: rank %d is out of range for world size %d "
             "(ranks count from 0)", rank, world_size);
  if (*timeout_s <= 0) *timeout_s = PG_DEFAULT_TIMEOUT_S;
  int *g = malloc(sizeof(int) * (size_t)world_size);
  if (!g) DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  for (int i = 0; i < world_size; i++) g[i] = i;
  *global = g;
  return DDP_OK;
}

ddp_pg *pg_header_new(const pg_backend *backend, struct ddp_store *store, int rank, int size,
                      const char *prefix, double timeout_s, int *global, int device) {
  ddp_pg *pg = calloc(1, sizeof *pg);
  char *pfx = strdup(prefix);
  if (!pg || !pfx) {
    free(pg);
    free(pfx);
    free(global);
    DDP_ERROR(DDP_ERR_MEMORY, "init_process_group: out of memory");
    return NULL;
  }
  pg->backend = backend;
  pg->rank = rank;
  pg->size = size;
  pg->global = global;
  pg->store = store;
  pg->prefix = pfx;
  pg->fp_group = pg_fp_group(pfx);
  pg->device = device;
  pg->timeout_s = timeout_s;
  const char *stall = getenv("DDPLUA_STALL_REPORT_S");
  pg->stall_report_s = stall && atof(stall) > 0 ? atof(stall) : PG_DEFAULT_STALL_REPORT_S;
  pthread_mutex_init(&pg->lock, NULL);
  pthread_mutex_init(&pg->abort_mu, NULL);
  pthread_cond_init(&pg->cv, NULL);
  pthread_cond_init(&pg->p2p_cv, NULL);
  pg->rec = pg_rec_new(); /* NULL: nothing recorded, the group works the same */
  pg_rec_publish_host(pg);
  pg_watch_add(pg);
  return pg;
}

void pg_header_free(ddp_pg *pg) {
  if (!pg) return;
  pg_watch_remove(pg);
  pg_rec_free(pg->rec);
  ddp_store_free(pg->abort_store);
  free(pg->global);
  free(pg->prefix);
  pthread_mutex_destroy(&pg->lock);
  pthread_mutex_destroy(&pg->abort_mu);
  pthread_cond_destroy(&pg->cv);
  pthread_cond_destroy(&pg->p2p_cv);
  free(pg);
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
    status = parent->backend->new_group(out, parent, me, n, prefix, global);
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

void ddp_pg_free(ddp_pg *pg) {
  if (!pg) return;
  /* First out of the watcher's list: once this returns the watcher no longer touches the
   * group (no abort reaches a backend being freed: Note [group abort]). */
  pg_watch_remove(pg);
  pg->backend->free(pg);
  pg_header_free(pg);
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
  pthread_mutex_lock(&pg->lock);
  pg->timeout_s = timeout_s;
  pthread_mutex_unlock(&pg->lock);
  if (pg->backend->set_timeout) pg->backend->set_timeout(pg, timeout_s);
  return DDP_OK;
}

double ddp_pg_get_timeout(const ddp_pg *pg) { return pg ? pg->timeout_s : 0; }

int ddp_pg_set_stall_report(ddp_pg *pg, double seconds) {
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "stall_report_s: no process group");
  if (!(seconds > 0))
    DDP_FAIL(DDP_ERR_ARG, "stall_report_s must be > 0 s, got %g", seconds);
  pthread_mutex_lock(&pg->lock);
  pg->stall_report_s = seconds;
  pthread_mutex_unlock(&pg->lock);
  return DDP_OK;
}

const char *ddp_pg_error(const ddp_pg *pg) {
  if (ddp_pg_is_aborted(pg)) return pg->failure; /* the group's first failure, of any rank */
  if (pg && pg->backend->error) return pg->backend->error(pg);
  return pg && pg->failed ? pg->failure : "";
}

const char *ddp_pg_backend(const ddp_pg *pg) { return pg ? pg_backend_names[pg->backend->kind] : ""; }

int ddp_pg_device(const ddp_pg *pg) { return pg ? pg->device : DDP_DEVICE_CPU; }

/* ---- argument checks --------------------------------------------------------------------- */

/* A group, not aborted (Note [group abort]: every later call fails at once, naming the
 * first failure). */
static int check_group(ddp_pg *pg, const char *op) {
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "%s: no process group (call init_process_group first)", op);
  pthread_mutex_lock(&pg->lock);
  int failed = pg->aborting ? pg->failed : 0;
  char first[PG_MSG_CAP];
  if (failed) snprintf(first, sizeof first, "%s", pg->failure);
  pthread_mutex_unlock(&pg->lock);
  if (failed)
    DDP_FAIL(failed, "%s on rank %d: the process group was aborted: %s", op,
             pg->global[pg->rank], first);
  return DDP_OK;
}

/* A live tensor, acceptable to the backend (nccl: on its device, contiguous), and not bool
 * where it is reduced. */
static int check_tensor(const ddp_pg *pg, const ddp_tensor *t, const char *op, const char *arg,
                        int reducing) {
  DDP_TRY(ddp_check_alive(t, op, arg));
  if (pg->backend->check_tensor) DDP_TRY(pg->backend->check_tensor(pg, t, op, arg));
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
  if (op < 0 || op >= DDP_REDUCE_OP_COUNT)
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

/* Gather/scatter: the root rank alone passes the stacked (world, ...t's shape) tensor; every
 * other rank passes NULL. role names the root ("destination"/"source"). */
static int check_root_stacked(const ddp_pg *pg, int root, const ddp_tensor *stacked,
                              const ddp_tensor *t, const char *op, const char *role,
                              const char *stacked_name, const char *t_name) {
  if (pg->rank != root) {
    if (stacked)
      DDP_FAIL(DDP_ERR_ARG, "%s: only the %s rank %d takes an %s tensor (this is rank %d)", op,
               role, root, stacked_name, pg->rank);
    return DDP_OK;
  }
  if (!stacked)
    DDP_FAIL(DDP_ERR_ARG, "%s: the %s rank %d needs an %s tensor", op, role, root, stacked_name);
  DDP_TRY(check_tensor(pg, stacked, op, stacked_name, 0));
  return check_stacked(pg, stacked, t, op, stacked_name, t_name);
}

static int check_p2p(const ddp_pg *pg, int other, int tag, const char *op, const char *what) {
  DDP_TRY(check_root(pg, other, op, what));
  if (other == pg->rank)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s rank %d is this rank", op, what, other);
  if (tag < 0 || tag >= (1 << 24))
    DDP_FAIL(DDP_ERR_ARG, "%s: tag must be in 0 .. 2^24-1, got %d", op, tag);
  return DDP_OK;
}

static ddp_tensor *keep(ddp_tensor *t) {
  ddp_tensor_retain(t);
  return t;
}

/* ---- the collectives ---------------------------------------------------------------------- */

#define NEW_WORK(w, pg, kind)                                                              \
  ddp_work *w = work_new((pg), (kind));                                                    \
  if (!w) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", pg_op_names[kind])

/* Hand w (which holds its references) to the group's backend, numbered (Note [collective
 * fingerprints]: submission order is the order every backend runs them in) and recorded
 * (Note [flight recorder]). */
static int dispatch(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  w->seq = pg_fp_applies(w->kind) ? pg->fp_seq++ : pg->fp_seq;
  pg_rec_enqueue(pg->rec, w);
  return pg->backend->enqueue(handle, pg, w);
}

int ddp_pg_allreduce(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int op) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "all_reduce"));
  DDP_TRY(check_tensor(pg, t, "all_reduce", "tensor", 1));
  DDP_TRY(check_op(op, t, "all_reduce"));
  NEW_WORK(w, pg, PG_ALLREDUCE);
  w->t = keep(t);
  w->op = op;
  return dispatch(work, pg, w);
}

int ddp_pg_shared_zeros(ddp_tensor **out, ddp_pg *pg, int ndim, const int64_t *shape,
                        int dtype, int *placed) {
  *out = NULL;
  *placed = 0;
  DDP_TRY(check_group(pg, "shared_buffer"));
  if (ndim < 0 || ndim > DDP_MAX_DIMS || (ndim > 0 && !shape))
    DDP_FAIL(DDP_ERR_ARG, "shared_buffer: bad number of dimensions %d", ndim);
  if (strcmp(ddp_dtype_name(dtype), "?") == 0) DDP_FAIL(DDP_ERR_ARG, "shared_buffer: bad dtype %d", dtype);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      DDP_FAIL(DDP_ERR_ARG, "shared_buffer: bad size %lld in dimension %d", (long long)shape[i],
               i + 1);
  if (!pg->backend->shared_zeros)
    return ddp_tensor_zeros(out, ndim, shape, dtype, DDP_DEVICE_CPU);
  return pg->backend->shared_zeros(out, pg, ndim, shape, dtype, placed);
}

int ddp_pg_broadcast(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int root) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "broadcast"));
  DDP_TRY(check_tensor(pg, t, "broadcast", "tensor", 0));
  DDP_TRY(check_root(pg, root, "broadcast", "src"));
  NEW_WORK(w, pg, PG_BROADCAST);
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
  NEW_WORK(w, pg, PG_ALLGATHER);
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
  NEW_WORK(w, pg, PG_ALLGATHER_LIST);
  w->outs = calloc((size_t)n, sizeof *w->outs);
  if (!w->outs) {
    w->refs = 1;
    pg_work_unref(w);
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
  NEW_WORK(w, pg, PG_REDUCE_SCATTER);
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
  NEW_WORK(w, pg, PG_REDUCE);
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
  DDP_TRY(check_root_stacked(pg, root, out, t, "gather", "destination", "output", "tensor"));
  NEW_WORK(w, pg, PG_GATHER);
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
  DDP_TRY(check_root_stacked(pg, root, in, out, "scatter", "source", "input", "output"));
  NEW_WORK(w, pg, PG_SCATTER);
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
  NEW_WORK(w, pg, PG_ALLTOALL);
  w->t = keep(in);
  w->out = keep(out);
  return dispatch(work, pg, w);
}

/* ---- collectives for sharding (Note [sharding collectives] in pg_internal.h) -------------- */

/* `big` is `small` gathered over the world: (world * k, ...small's shape past dim 0) or
 * (world, ...small's shape), of small's dtype. op, big_name and small_name name the call and
 * the tensors (PyTorch's parameter names) in the message. */
static int check_world_times(const ddp_pg *pg, const ddp_tensor *big, const ddp_tensor *small,
                             const char *op, const char *big_name, const char *small_name) {
  if (big->dtype != small->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s but %s has %s", op, big_name,
             ddp_dtype_name(big->dtype), small_name, ddp_dtype_name(small->dtype));
  int concat = small->ndim >= 1 && big->ndim == small->ndim &&
               big->shape[0] == small->shape[0] * pg->size &&
               same_shape(big->ndim - 1, big->shape + 1, small->ndim - 1, small->shape + 1);
  int stacked = big->ndim == small->ndim + 1 && big->shape[0] == pg->size &&
                same_shape(big->ndim - 1, big->shape + 1, small->ndim, small->shape);
  if (concat || stacked) return DDP_OK;
  int64_t cat[DDP_MAX_DIMS + 1], stack[DDP_MAX_DIMS + 1];
  memcpy(cat, small->shape, sizeof(int64_t) * (size_t)small->ndim);
  if (small->ndim >= 1) cat[0] *= pg->size;
  stack[0] = pg->size;
  memcpy(stack + 1, small->shape, sizeof(int64_t) * (size_t)small->ndim);
  if (small->ndim >= 1)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s must have shape %s (world size %d times %s's first "
             "dimension) or %s (world size %d, then %s's shape) for %s of shape %s, got %s", op,
             big_name, ddp_shape_str(small->ndim, cat), pg->size, small_name,
             ddp_shape_str(small->ndim + 1, stack), pg->size, small_name, small_name,
             DDP_SHAPE(small), DDP_SHAPE(big));
  DDP_FAIL(DDP_ERR_ARG, "%s: %s must have shape %s (world size %d) for the 0-dimensional %s, "
           "got %s", op, big_name, ddp_shape_str(1, stack), pg->size, small_name, DDP_SHAPE(big));
}

int ddp_pg_reduce_scatter_tensor(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in,
                                 int op) {
  const char *name = "reduce_scatter_tensor";
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, name));
  DDP_TRY(check_tensor(pg, out, name, "output", 1));
  DDP_TRY(check_tensor(pg, in, name, "input", 1));
  DDP_TRY(check_op(op, in, name));
  DDP_TRY(check_world_times(pg, in, out, name, "input", "output"));
  NEW_WORK(w, pg, PG_REDUCE_SCATTER_TENSOR);
  w->t = keep(in);
  w->out = keep(out);
  w->op = op;
  return dispatch(work, pg, w);
}

int ddp_pg_allgather_into_tensor(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in) {
  const char *name = "all_gather_into_tensor";
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, name));
  DDP_TRY(check_tensor(pg, out, name, "output_tensor", 0));
  DDP_TRY(check_tensor(pg, in, name, "input_tensor", 0));
  DDP_TRY(check_world_times(pg, out, in, name, "output_tensor", "input_tensor"));
  NEW_WORK(w, pg, PG_ALLGATHER_INTO_TENSOR);
  w->t = keep(in);
  w->out = keep(out);
  return dispatch(work, pg, w);
}


/* Rows per group rank of t's dim 0 into out (world entries): `splits` (NULL: even, then
 * dim 0 must divide by the world size). arg names the tensor, what the splits. */
static int take_splits(const ddp_pg *pg, int64_t *out, const int64_t *splits, int nsplits,
                       const ddp_tensor *t, const char *arg, const char *what) {
  const char *op = "all_to_all_single";
  int64_t rows = t->shape[0], sum = 0;
  if (!splits) {
    if (rows % pg->size)
      DDP_FAIL(DDP_ERR_ARG, "%s: %s's first dimension must divide by the world size %d when "
               "%s is not given, got shape %s", op, arg, pg->size, what, DDP_SHAPE(t));
    for (int r = 0; r < pg->size; r++) out[r] = rows / pg->size;
    return DDP_OK;
  }
  if (nsplits != pg->size)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has %d entries but the group has %d ranks", op, what, nsplits,
             pg->size);
  for (int r = 0; r < pg->size; r++) {
    if (splits[r] < 0)
      DDP_FAIL(DDP_ERR_ARG, "%s: %s entry %d is negative (%lld)", op, what, r + 1,
               (long long)splits[r]);
    out[r] = splits[r];
    sum += splits[r];
  }
  if (sum != rows)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s sum to %lld rows but %s has %lld (shape %s)", op, what,
             (long long)sum, arg, (long long)rows, DDP_SHAPE(t));
  return DDP_OK;
}

int ddp_pg_alltoall_single(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in,
                           const int64_t *output_split_sizes, int n_output_splits,
                           const int64_t *input_split_sizes, int n_input_splits) {
  const char *name = "all_to_all_single";
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, name));
  DDP_TRY(check_tensor(pg, out, name, "output", 0));
  DDP_TRY(check_tensor(pg, in, name, "input", 0));
  if (out->dtype != in->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: output has dtype %s but input has %s", name,
             ddp_dtype_name(out->dtype), ddp_dtype_name(in->dtype));
  if (in->ndim < 1 || out->ndim != in->ndim ||
      !same_shape(in->ndim - 1, in->shape + 1, out->ndim - 1, out->shape + 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: input and output must have at least one dimension and the same "
             "shape past the first, got input %s and output %s", name, DDP_SHAPE(in),
             DDP_SHAPE(out));
  int64_t *ins = malloc(sizeof(int64_t) * (size_t)pg->size);
  int64_t *outs = malloc(sizeof(int64_t) * (size_t)pg->size);
  int status = ins && outs ? DDP_OK : DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory", name);
  if (!status)
    status = take_splits(pg, ins, input_split_sizes, n_input_splits, in, "input",
                         "input_split_sizes");
  if (!status)
    status = take_splits(pg, outs, output_split_sizes, n_output_splits, out, "output",
                         "output_split_sizes");
  ddp_work *w = status ? NULL : work_new(pg, PG_ALLTOALL_SINGLE);
  if (!status && !w) status = DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory", name);
  if (status) {
    free(ins);
    free(outs);
    return status;
  }
  w->t = keep(in);
  w->out = keep(out);
  w->in_splits = ins;
  w->out_splits = outs;
  return dispatch(work, pg, w);
}

/* A view of the contiguous buffer buf: shape (rows, cols) with row stride `stride`, from
 * element `at`. */
static int strided_rows(ddp_tensor **out, ddp_tensor *buf, int64_t rows, int64_t cols,
                        int64_t stride, int64_t at) {
  int64_t shape[2] = {rows, cols}, strides[2] = {stride, 1};
  return ddp_tensor_view_raw(out, buf, 2, shape, strides, buf->offset + at);
}

/* dst (a view) = src seen as (rows, cols), detached (a collective records no graph). */
static int copy_rows(ddp_tensor *dst, ddp_tensor *src, int64_t rows, int64_t cols) {
  ddp_tensor *alias = ddp_tensor_alias(src), *c = NULL, *v = NULL;
  int status = alias ? ddp_contiguous(&c, alias) : ddp_last_status();
  if (!status) status = strided_rows(&v, c, rows, cols, cols, 0);
  if (!status) status = ddp_copy_(dst, v);
  ddp_tensor_release(v);
  ddp_tensor_release(c);
  ddp_tensor_release(alias);
  return status;
}

/* Check the pairs of a coalesced call and make its work item: w->outs the caller's outputs,
 * w->t the packed input, w->out the packed output (Note [sharding collectives]). Packing:
 * reduce-scatter: input i (world * e_i elements) goes to rows (world, B) at column offset
 * o_i = e_0 + .. + e_{i-1}, B = sum e_i: row r holds every input's chunk r, so one
 * reduce-scatter leaves this rank's chunks, back to back, in the packed output (B). All-
 * gather: input i (e_i) at offset o_i of the packed input (B); the packed output (world, B)
 * holds rank r's packed input in row r, and output i is column block o_i of it. */
static int coalesced_work(ddp_work **out_w, ddp_pg *pg, pg_op kind, ddp_tensor **outs,
                          ddp_tensor **ins, int n, int op) {
  const char *name = pg_op_names[kind];
  int rs = kind == PG_REDUCE_SCATTER_COALESCED;
  char bn[48], sn[48];
  *out_w = NULL;
  DDP_TRY(check_group(pg, name));
  if (n < 1 || !outs || !ins)
    DDP_FAIL(DDP_ERR_ARG, "%s: needs at least one pair of tensors, got %d", name, n);
  int64_t B = 0;
  for (int i = 0; i < n; i++) {
    snprintf(bn, sizeof bn, "%s %d", rs ? "input" : "output", i + 1);
    snprintf(sn, sizeof sn, "%s %d", rs ? "output" : "input", i + 1);
    DDP_TRY(check_tensor(pg, outs[i], name, rs ? sn : bn, rs));
    DDP_TRY(check_tensor(pg, ins[i], name, rs ? bn : sn, rs));
    if (rs && i == 0) DDP_TRY(check_op(op, ins[0], name));
    DDP_TRY(check_world_times(pg, rs ? ins[i] : outs[i], rs ? outs[i] : ins[i], name, bn, sn));
    if (ins[i]->dtype != ins[0]->dtype || ins[i]->device != ins[0]->device ||
        outs[i]->device != ins[0]->device)
      DDP_FAIL(DDP_ERR_ARG, "%s: every tensor must have the dtype and device of input 1 (%s on "
               "%s), but %s %d is %s on %s", name, ddp_dtype_name(ins[0]->dtype),
               ddp_device_str(ins[0]->device), outs[i]->device != ins[0]->device ? "output" : "input",
               i + 1, ddp_dtype_name(ins[i]->dtype),
               ddp_device_str(outs[i]->device != ins[0]->device ? outs[i]->device : ins[i]->device));
    if (!ddp_tensor_is_contiguous(outs[i]))
      DDP_FAIL(DDP_ERR_ARG, "%s: output %d must be contiguous (shape %s)", name, i + 1,
               DDP_SHAPE(outs[i]));
    B += rs ? outs[i]->numel : ins[i]->numel;
  }
  int64_t world = pg->size, flat[2] = {world, B};
  ddp_tensor *pin = NULL, *pout = NULL;
  int dtype = ins[0]->dtype, device = ins[0]->device;
  int status = ddp_tensor_empty(&pin, rs ? 2 : 1, rs ? flat : flat + 1, dtype, device);
  if (!status) status = ddp_tensor_empty(&pout, rs ? 1 : 2, rs ? flat + 1 : flat, dtype, device);
  int64_t at = 0;
  for (int i = 0; i < n && !status; i++) {
    int64_t e = rs ? outs[i]->numel : ins[i]->numel;
    ddp_tensor *dst = NULL;
    status = strided_rows(&dst, pin, rs ? world : 1, e, B, at);
    if (!status) status = copy_rows(dst, ins[i], rs ? world : 1, e);
    ddp_tensor_release(dst);
    at += e;
  }
  ddp_work *w = status ? NULL : work_new(pg, kind);
  if (!status && w) w->outs = calloc((size_t)n, sizeof *w->outs);
  if (!status && (!w || !w->outs)) status = DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory", name);
  if (status) {
    ddp_error_prefix("%s (packing the tensors)", name);
    if (w) {
      w->refs = 1;
      pg_work_unref(w);
    }
    ddp_tensor_release(pin);
    ddp_tensor_release(pout);
    return status;
  }
  w->nouts = n;
  for (int i = 0; i < n; i++) w->outs[i] = keep(outs[i]);
  w->t = pin;
  w->out = pout;
  w->op = op;
  *out_w = w;
  return DDP_OK;
}

int pg_unpack_coalesced(ddp_work *w) {
  int rs = w->kind == PG_REDUCE_SCATTER_COALESCED;
  if (!rs && w->kind != PG_ALLGATHER_COALESCED) return DDP_OK;
  int64_t world = w->pg->size; /* valid while the work runs */
  int64_t B = rs ? w->out->numel : w->t->numel, at = 0;
  for (int i = 0; i < w->nouts; i++) {
    ddp_tensor *o = w->outs[i], *src = NULL, *dst = NULL;
    int64_t e = rs ? o->numel : o->numel / world;
    int status = strided_rows(&src, w->out, rs ? 1 : world, e, B, at);
    if (!status) status = strided_rows(&dst, o, rs ? 1 : world, e, e, 0);
    if (!status) status = ddp_copy_(dst, src);
    ddp_tensor_release(src);
    ddp_tensor_release(dst);
    if (status) return status;
    ddp_tensor_bump_version(o);
    at += e;
  }
  return DDP_OK;
}

int ddp_pg_reduce_scatter_tensor_coalesced(ddp_work **work, ddp_pg *pg, ddp_tensor **outs,
                                           ddp_tensor **ins, int n, int op) {
  if (work) *work = NULL;
  ddp_work *w = NULL;
  DDP_TRY(coalesced_work(&w, pg, PG_REDUCE_SCATTER_COALESCED, outs, ins, n, op));
  return dispatch(work, pg, w);
}

int ddp_pg_allgather_into_tensor_coalesced(ddp_work **work, ddp_pg *pg, ddp_tensor **outs,
                                           ddp_tensor **ins, int n) {
  if (work) *work = NULL;
  ddp_work *w = NULL;
  DDP_TRY(coalesced_work(&w, pg, PG_ALLGATHER_COALESCED, outs, ins, n, 0));
  return dispatch(work, pg, w);
}

int ddp_pg_send(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int dst, int tag) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "send"));
  DDP_TRY(check_tensor(pg, t, "send", "tensor", 0));
  DDP_TRY(check_p2p(pg, dst, tag, "send", "dst"));
  NEW_WORK(w, pg, PG_SEND);
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
  NEW_WORK(w, pg, PG_RECV);
  w->t = keep(t);
  w->peer = src;
  w->tag = tag;
  return dispatch(work, pg, w);
}

int ddp_pg_barrier(ddp_work **work, ddp_pg *pg) {
  if (work) *work = NULL;
  DDP_TRY(check_group(pg, "barrier"));
  NEW_WORK(w, pg, PG_BARRIER);
  return dispatch(work, pg, w);
}

/* ---- work handles ----------------------------------------------------------------------- */

int ddp_work_wait(ddp_work *w, double timeout_s) {
  if (!w) DDP_FAIL(DDP_ERR_ARG, "wait: no work handle");
  return w->backend->wait(w, timeout_s);
}

int ddp_work_synchronize(ddp_work *w, double timeout_s) {
  if (!w) DDP_FAIL(DDP_ERR_ARG, "synchronize: no work handle");
  return w->backend->synchronize(w, timeout_s);
}

int ddp_work_is_completed(ddp_work *w) {
  if (!w) return 1;
  return w->backend->is_completed(w);
}

void ddp_work_free(ddp_work *w) {
  if (w) pg_work_unref(w);
}
