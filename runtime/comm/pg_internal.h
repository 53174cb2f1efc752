/* runtime/comm/pg_internal.h: what the process-group files share (internal).
 *
 *   pg.c          the collective front doors: argument checks, work handles, group
 *                 creation common to every backend, new_group, the getters; each call ends
 *                 in its group's backend (pg_backend below)
 *   pg_queue.c    the ordered communication thread and its FIFO queue (Note [collective
 *                 order] in ddplua/pg.h) plus the thread that finishes posted
 *                 point-to-point messages; used by backends that run collectives on the host
 *   pg_gloo.c     backend "gloo": staging, the transport switch over the Gloo shim
 *                 (gloo_shim.h, gloo_shim.cc) and the shared-memory all-reduce (pg_shm.h)
 *   pg_nccl.c     backend "nccl": the host side of the plug-in's NCCL table (backend/cuda/nccl_api.h)
 *   pg_store.c    the rendezvous: our store behind the shim's callbacks, the world-size check
 *   pg_address.c  which address a rank binds and publishes
 *
 * Note [pg backend]: a backend is one static pg_backend table. The front doors check
 * arguments, make the work item (holding its tensors), and hand it to `enqueue`; waiting,
 * polling and freeing a work item go through the table the work item points at (static:
 * valid after its group is gone). A new backend adds its file, its table, a PG_BACKEND_*
 * entry (and name) and a constructor ddp_pg_new_<name> in ddplua/pg.h. */
#ifndef DDP_PG_INTERNAL_H
#define DDP_PG_INTERNAL_H

#include <pthread.h>

#include "core/core.h"

enum { PG_MSG_CAP = 2048, PG_SITE_CAP = 80 };
extern const double PG_DEFAULT_TIMEOUT_S;

/* The collectives, as work items know them. */
typedef enum {
  PG_ALLREDUCE, PG_BROADCAST, PG_ALLGATHER, PG_ALLGATHER_LIST, PG_REDUCE_SCATTER, PG_REDUCE,
  PG_GATHER, PG_SCATTER, PG_ALLTOALL, PG_SEND, PG_RECV, PG_BARRIER,
  /* Note [sharding collectives]: PyTorch's tensor forms, each a kind of its own (fingerprints,
   * flight recorder, messages) that runs on the data path of an older one (pg_op_path). */
  PG_REDUCE_SCATTER_TENSOR,    /* = PG_REDUCE_SCATTER's path */
  PG_ALLGATHER_INTO_TENSOR,    /* = PG_ALLGATHER's path (out (world * k, ...) or (world, k, ...)) */
  PG_ALLTOALL_SINGLE,          /* uneven splits: w->in_splits / w->out_splits */
  PG_REDUCE_SCATTER_COALESCED, /* one reduce-scatter of packed buffers, then outs unpacked */
  PG_ALLGATHER_COALESCED,      /* one all-gather of packed buffers, then outs unpacked */
  PG_OP_COUNT
} pg_op;

/* Note [sharding collectives]: the kind whose data path w's kind takes in the backends:
 * reduce_scatter_tensor and the coalesced reduce-scatter run as PG_REDUCE_SCATTER on
 * (w->t, w->out), all_gather_into_tensor and the coalesced all-gather as PG_ALLGATHER on
 * (w->t, w->out) (the same bytes in rank order whatever out's shape). A coalesced kind's
 * w->t and w->out are the packed buffers pg.c made at submission (coalesced_work); the
 * backend calls pg_unpack_coalesced once the collective succeeded, before the work
 * completes. */
static inline pg_op pg_op_path(pg_op kind) {
  switch (kind) {
    case PG_REDUCE_SCATTER_TENSOR:
    case PG_REDUCE_SCATTER_COALESCED: return PG_REDUCE_SCATTER;
    case PG_ALLGATHER_INTO_TENSOR:
    case PG_ALLGATHER_COALESCED: return PG_ALLGATHER;
    default: return kind;
  }
}

/* PyTorch's name of each collective (pg.c, Note [pinned names]), used in every message. */
extern const char *const pg_op_names[];

typedef enum { PG_BACKEND_GLOO, PG_BACKEND_NCCL, PG_BACKEND_COUNT } pg_backend_kind;

/* "gloo", "nccl" (pg.c, Note [pinned names]): what ddp_pg_backend returns. */
extern const char *const pg_backend_names[];

typedef struct pg_backend pg_backend;

struct ddp_work {
  int refs;                 /* the user's handle + the queue's; guarded by mu */
  ddp_work *next;           /* queue link, guarded by the group's lock */
  ddp_pg *pg;               /* valid while queued (ddp_pg_free drains the queue first) */
  const pg_backend *backend;/* static: valid after the group is gone */
  pg_op kind;
  int op, root, peer, tag;
  char site[PG_SITE_CAP];   /* the Lua call site at submission ("file:line" or "") */
  uint64_t seq;             /* fingerprinted collectives of the group submitted before it */
  uint64_t rec_id;          /* its record in the flight recorder (Note [flight recorder]) */
  ddp_tensor *t;            /* the main tensor (in place / input), owned reference */
  ddp_tensor *out;          /* output tensor where the op has one (nccl's all_gather list:
                             * its (world, ...) buffer), owned */
  ddp_tensor **outs;        /* all_gather list outputs, coalesced outputs: owned references */
  int nouts;
  int64_t *in_splits;       /* all_to_all_single: rows of in sent to / of out received from */
  int64_t *out_splits;      /* each group rank (world entries each, even ones filled in by
                             * pg.c), owned */
  double timeout_s;         /* default wait of ddp_work_wait */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, status;         /* guarded by mu (host-side backends) */
  char msg[PG_MSG_CAP];
  /* backend gloo (pg_gloo.c) */
  ddp_tensor *staged;       /* send/recv: the contiguous buffer in flight, owned */
  struct ddp_gloo_p2p *p2p; /* send/recv: the posted message */
  /* Note [gloo staging]: the device tensors t, out and outs stand for (owned; NULL where
   * the tensor is on the CPU), written back from the host copies after the collective. */
  ddp_tensor *dev_t, *dev_out, **dev_outs;
  /* backend nccl (pg_nccl.c), Note [nccl work]: the event after the collective on the
   * communication stream, and the table that frees it (the plug-in's, static). */
  void *event;
  const struct ddp_nccl_api *napi;
};

struct ddp_pg {
  const pg_backend *backend;
  void *impl;               /* the backend's own state */
  int rank, size;
  int *global;              /* (size) group rank -> global rank */
  ddp_store *store;         /* not owned: the rendezvous of this group and its subgroups */
  char *prefix;
  int n_subgroups;          /* new_group calls made on this group: names their prefixes */
  int device;               /* the device of the group's tensors (nccl), DDP_DEVICE_CPU */
  double timeout_s;         /* guarded by lock */
  pthread_mutex_t lock;     /* queue, stop, failure, timeout */
  /* pg_queue.c: the communication thread and its queue */
  int (*run)(ddp_pg *pg, ddp_work *w);       /* 1: posted, finished later by `complete` */
  void (*complete)(ddp_pg *pg, ddp_work *w); /* on the point-to-point thread */
  pthread_t thread;
  pthread_cond_t cv;        /* with lock */
  ddp_work *head, *tail;
  int stop;
  int busy;                 /* an item is running (on the communication thread or inline) */
  /* Point-to-point messages posted by the communication thread, waited for on a second
   * thread so the queue never blocks on a peer that has not posted its side (irecv then
   * send). */
  pthread_t p2p_thread;
  pthread_cond_t p2p_cv;    /* with lock */
  ddp_work *p2p_head, *p2p_tail;
  int p2p_stop;
  uint64_t fp_group;        /* pg_fp_group(prefix) */
  struct pg_recorder *rec;  /* Note [flight recorder]; NULL when out of memory */
  double stall_report_s;    /* guarded by lock */
  struct ddp_pg *watch_next;/* the watcher's list of live groups (pg_recorder.c) */
  uint64_t fp_seq;          /* fingerprinted collectives submitted so far (Note [collective
                             * fingerprints]); touched by the submitting thread */
  int failed;               /* status of the first failure, 0 while healthy */
  char failure[PG_MSG_CAP]; /* its message: the group's first failure (Note [group abort]) */
  /* Note [group abort] (pg.c): guarded by lock */
  int live;                 /* made: an abort may reach the backend (pg_mark_live) */
  int aborting;             /* this rank learned of the failure and is (was) poisoning the group */
  pthread_mutex_t abort_mu; /* abort_store */
  ddp_store *abort_store;   /* the abort's own store connection; NULL: none yet */
  double abort_failed_at;   /* CLOCK_MONOTONIC s of its last failure (polls pause a while) */
  double abort_polled_at;   /* CLOCK_MONOTONIC s of the watcher's last poll */
};

/* Note [pg backend]. Entries marked optional may be NULL. */
struct pg_backend {
  pg_backend_kind kind;
  /* Take over w (which holds its references and one reference for the caller). handle
   * non-NULL: start it and store it in *handle; NULL: finish it (as a blocking call) and
   * drop the reference. On failure w is released and the error set. */
  int (*enqueue)(ddp_work **handle, ddp_pg *pg, ddp_work *w);
  /* ddp_work_wait, ddp_work_synchronize, ddp_work_is_completed of its work items. */
  int (*wait)(ddp_work *w, double timeout_s);
  int (*synchronize)(ddp_work *w, double timeout_s);
  int (*is_completed)(ddp_work *w);
  /* Optional: release what the backend added to w (its last reference is going). */
  void (*work_free)(ddp_work *w);
  /* Optional: the backend's own rules for a tensor argument (device, layout). */
  int (*check_tensor)(const ddp_pg *pg, const ddp_tensor *t, const char *op, const char *arg);
  /* A group of this backend over `global` (size entries, taken over either way) of which
   * this rank is `rank`, meeting under `prefix` (new_group's subgroups). */
  int (*new_group)(ddp_pg **out, ddp_pg *parent, int rank, int size, const char *prefix,
                   int *global);
  /* Optional: pg->timeout_s just changed. */
  void (*set_timeout)(ddp_pg *pg, double timeout_s);
  /* Optional (pg_queue.c): 1 when blocking work w may run on the calling thread when the
   * queue is idle (Note [inline collectives] in pg_queue.c). */
  int (*can_inline)(ddp_pg *pg, const ddp_work *w);
  /* Optional: ddp_pg_shared_zeros (without it: ordinary memory, *placed = 0). */
  int (*shared_zeros)(ddp_tensor **out, ddp_pg *pg, int ndim, const int64_t *shape, int dtype,
                      int *placed);
  /* Optional (Note [group abort]): make every blocked operation of the group return with
   * an error, now and from now on; may be called from any thread, more than once, while the
   * group's threads run (never after `free` began). pg->failure holds the first failure. */
  void (*abort)(ddp_pg *pg);
  /* Optional: ddp_pg_abort on the program's thread, after `abort`: what only that thread
   * may do (nccl: ncclCommAbort, which must not race the program's own calls). */
  void (*abort_owned)(ddp_pg *pg);
  /* Optional: the first failure's message ("" while healthy); default: pg->failure. */
  const char *(*error)(const ddp_pg *pg);
  /* Stop and release the backend's state (impl); pg_header_free follows. */
  void (*free)(ddp_pg *pg);
};

extern const pg_backend pg_gloo_backend;
extern const pg_backend pg_nccl_backend;

/* ---- pg.c: shared by the backends ---- */

/* Check the arguments of a new top-level group (store, world size, rank), default the
 * timeout, and make the identity map of global ranks. */
int pg_check_new(struct ddp_store *store, int rank, int world_size, double *timeout_s,
                 int **global);
/* A group's header before any backend state is attached, or NULL with the error set
 * (`global` is taken over either way). */
ddp_pg *pg_header_new(const pg_backend *backend, struct ddp_store *store, int rank, int size,
                      const char *prefix, double timeout_s, int *global, int device);
void pg_header_free(ddp_pg *pg);
/* Finish w with status (and msg when it failed), waking its waiters. */
void pg_work_finish(ddp_work *w, int status, const char *msg);
/* Drop one reference of w; the last one releases its tensors (and the backend's parts). */
void pg_work_unref(ddp_work *w);
/* Note [group abort]: the group failed on this rank (a collective timed out, a peer
 * failed, the ranks' fingerprints disagree, or the user aborted): agree with the other ranks
 * on the group's first failure (the store key "<prefix>/abort", first writer wins) and poison
 * the group everywhere (backend `abort`). msg names the rank, the collective, its call site
 * and the cause. The group's first failure is msg, or an earlier one of any rank,
 * which is copied into `first` (PG_MSG_CAP bytes; may be NULL) and stays in pg->failure.
 * Idempotent (a second call only copies the first failure); any thread. */
void pg_abort(ddp_pg *pg, int status, const char *msg, char *first);
/* Poison the group on this rank with a failure another rank recorded first (msg: its
 * message, from the segment or the store). Idempotent; any thread. */
void pg_abort_learned(ddp_pg *pg, const char *msg);
/* The group is made: from now on an abort reaches its backend (before, its state may be
 * half made or being freed). Backends call it at the end of a successful creation. */
void pg_mark_live(ddp_pg *pg);
/* How often the watcher checks the abort key of each live group (Note [group abort]). */
extern const double PG_ABORT_POLL_S;
/* The message of a work item that failed because the group was aborted: "<op> on rank N:
 * the process group was aborted: <first failure>" into msg (PG_MSG_CAP). */
void pg_aborted_message(ddp_pg *pg, const ddp_work *w, char *msg);
/* The call site of w for messages: " (<op> #<seq> called at <site>)", or "" when unknown. */
void pg_work_site(const ddp_work *w, char *out, size_t cap);
/* The watcher (pg_recorder.c): has another rank aborted the group? Reads the store key
 * (Note [group abort]); poisons the group here when it has. */
void pg_abort_poll(ddp_pg *pg);
/* Note [sharding collectives]: copy the packed output w->out of a coalesced kind into the
 * caller's outputs w->outs (on the calling thread's current stream for device tensors). */
int pg_unpack_coalesced(ddp_work *w);
/* A contiguous row view (row `index` of rows shaped `shape`) of the contiguous buffer buf. */
int pg_chunk_view(ddp_tensor **out, ddp_tensor *buf, int64_t index, int ndim,
                  const int64_t *shape);

/* The calling thread's Lua call site (ddp_pg_set_call_site), "" when none was set. */
const char *pg_call_site(void);

/* ---- pg_queue.c ---- */

/* Start the communication thread (running each item with `run`) and the point-to-point
 * thread (finishing posted items with `complete`). */
int pg_queue_start(ddp_pg *pg, int (*run)(ddp_pg *, ddp_work *),
                   void (*complete)(ddp_pg *, ddp_work *));
/* Queue w (Note [collective order]) and, for a blocking call (handle NULL), wait for it. */
int pg_queue_submit(ddp_work **handle, ddp_pg *pg, ddp_work *w);
/* Hand w (its queue reference with it) to the point-to-point thread. */
void pg_queue_post(ddp_pg *pg, ddp_work *w);
/* Wait for / poll an item of the queue. */
int pg_queue_wait(ddp_work *w, double timeout_s);
int pg_queue_is_completed(ddp_work *w);
/* Let the queue drain, then stop both threads. */
void pg_queue_stop(ddp_pg *pg);

/* ---- pg_store.c ---- */

struct ddp_gloo_store;
/* Our store behind the Gloo shim's callbacks (gloo_shim.h). */
void pg_store_callbacks(struct ddp_gloo_store *ops, ddp_store *store);
/* Every rank publishes its world size; ranks other than 0 compare theirs with rank 0's. */
int pg_check_world_size(ddp_store *store, const char *prefix, int rank, int size, int me);

/* ---- pg_address.c ---- */

/* The address to bind and publish (ddplua/pg.h: ddp_pg_new_gloo): *iface non-NULL names an
 * interface, else host (cap bytes) holds a host name or address. */
void pg_pick_address(char *host, size_t cap, const char **iface);

#endif /* DDP_PG_INTERNAL_H */
