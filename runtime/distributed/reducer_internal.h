/* runtime/distributed/reducer_internal.h: the reducer's private state, shared by the files
 * that implement it (reducer.c: buckets, mark_variable_ready, finalize_backward; and the
 * files beside it that extend it). Not part of the public API: ddplua/reducer.h is. The
 * invariants are the Notes in ddplua/reducer.h. */
#ifndef DDP_REDUCER_INTERNAL_H
#define DDP_REDUCER_INTERNAL_H

#include "core/core.h"

enum { DEFAULT_TIMEOUT_S = 300 };

/* A group of parameters whose gradients are all-reduced together through one flat buffer. */
typedef struct {
  int dtype;
  int n_vars;
  int *vars;            /* parameter indices, in slot order */
  int64_t *offsets;     /* element offset of each slot in buffer */
  int64_t numel;
  ddp_tensor *buffer;   /* (numel,) contiguous, dtype */
  ddp_tensor **views;   /* per slot: buffer viewed with the parameter's shape */
  int pending;          /* slots not yet ready in this iteration */
  ddp_work *work;       /* the in-flight all-reduce, NULL before launch */
  int launched;
} bucket;

/* Note [reducer features]: comm hooks, uneven inputs (join), static_graph and the optimizer
 * in backward extend the reducer without reducer.c naming them. Each is a const
 * ddp_reducer_feature (a table of callbacks, every one optional: NULL is "nothing to do") that
 * the feature's own file defines and adds to its reducer with reducer_add_feature when it
 * is registered (ddp_reducer_register_comm_hook, ddp_reducer_set_divide_factor,
 * ddp_reducer_set_static_graph, ddp_reducer_register_fused_optim). reducer.c walks
 * r->features at each point of an iteration:
 *  - prepare_backward: a new iteration (reducer_reset_iteration; also after a failed one);
 *  - on_grad_ready: parameter i's hook fired; a feature may take it (*taken = 1) and decide
 *    itself when to call reducer_mark_variable_ready (static_graph counts hooks);
 *  - grad_divisor: what the gradients are divided by going into their slots (the first
 *    feature with an answer > 0 wins; none: the world size): a comm hook divides itself (1),
 *    join divides by the non-joined ranks;
 *  - on_slot_filled: parameter i's gradient is in its bucket slot (the optimizer in
 *    backward drops .grad);
 *  - bucket_launch / bucket_wait: take over bucket k's communication (*taken = 1; comm hooks);
 *    a feature with bucket_launch keeps the all-reduces off the backward's thread;
 *  - bucket_ready: buckets were launched (the optimizer in backward steps the completed ones);
 *  - finalize_begin: the backward walk ended, before the unready parameters are handled;
 *  - finalize_backward: every bucket reduced and the used flags known; *taken = 1 when the
 *    feature consumed the buckets instead of the copy back into .grad;
 *  - finalize_end: the iteration's reduction is done (before iterations++);
 *  - free: the reducer is freed.
 * The list is kept in the features' `order` (comm hook 10, join 20, static graph 30,
 * optimizer in backward 40), whatever the order of registration, so every walk (and which
 * feature takes a step) is the same from run to run: the order the calls by name had. A
 * feature's state is one opaque pointer of struct ddp_reducer, defined in its own file
 * (r->comm_hook, r->static_graph, r->fused_optim; join's is the divisor r->div_factor),
 * NULL until registered, never a block of fields here. */
struct ddp_reducer;
typedef struct ddp_reducer_feature {
  const char *name;
  int order;
  void (*prepare_backward)(struct ddp_reducer *r);
  int (*on_grad_ready)(struct ddp_reducer *r, int i, int *taken);
  int (*grad_divisor)(const struct ddp_reducer *r);
  int (*on_slot_filled)(struct ddp_reducer *r, int i, int used);
  int (*bucket_launch)(struct ddp_reducer *r, int k, int *taken);
  int (*bucket_wait)(struct ddp_reducer *r, int k, int *taken);
  int (*bucket_ready)(struct ddp_reducer *r);
  int (*finalize_begin)(struct ddp_reducer *r);
  int (*finalize_backward)(struct ddp_reducer *r, int *taken);
  void (*finalize_end)(struct ddp_reducer *r);
  void (*free)(struct ddp_reducer *r);
} ddp_reducer_feature;

enum { REDUCER_MAX_FEATURES = 8 };

/* What a parameter's hook gets: its reducer and index. */
typedef struct {
  struct ddp_reducer *r;
  int index;
} hook_ctx;

struct ddp_reducer {
  ddp_pg *pg;                /* NULL: world size 1, nothing to communicate */
  int rank, world;
  int device;                /* the parameters' device: buckets live there */
  int comm_device;           /* the process group's device (nccl), DDP_DEVICE_CPU for gloo */
  int n;
  ddp_tensor **params;       /* owned references, registration order */
  hook_ctx *hook_ctx;        /* per parameter */
  int64_t *hook_handles;     /* per parameter */
  int64_t end_handle;
  int end_registered;
  int64_t cap, first_cap;
  int find_unused, as_view;
  double timeout_s;

  bucket *buckets;
  int n_buckets;
  int *bucket_of, *slot_of;  /* per parameter */

  /* iteration state */
  int sync;                  /* ddp_reducer_set_sync */
  int overlap;               /* ddp_reducer_set_overlap (Note [bucket overlap]) */
  int n_complete;            /* buckets whose every slot is ready this iteration */
  int64_t here_ns;           /* this iteration's all-reduces run on the backward's thread */
  int armed;                 /* prepare_for_backward ran, finalize has not */
  int hooks_fired;           /* some hook of this reducer ran in the armed iteration */
  int next_bucket;           /* lowest bucket not yet launched (Note [bucket order]) */
  uint8_t *ready;            /* per parameter: marked ready this iteration */
  ddp_tensor *local_used;    /* (n,) i32: 1 where this rank's hook fired (find_unused) */
  ddp_work *used_work;
  ddp_tensor *used_dev;      /* nccl: local_used copied to comm_device for its all-reduce */
  int failed;                /* a hook failed: finalize reports it */
  char *failure;
  int failure_status;
  int64_t iterations;        /* finished reductions */
  double last_wait_s;        /* seconds finalize waited for the buckets (exposed comm) */

  /* Note [bucket rebuild] */
  int *order;                /* first iteration's ready order on this rank */
  int n_order;
  int recording;
  int rebuild_pending;
  int has_rebuilt;

  /* Note [unused parameters] without find_unused_parameters */
  int unfinished;
  int *unready;
  int n_unready;

  /* Uneven inputs (reducer_join.c, Note [join shadow iteration] in ddplua/reducer_join.h) */
  int div_factor;            /* > 0: gradients are divided by it instead of world */

  /* Note [comm hooks] (ddplua/comm_hook.h; runtime/distributed/reducer_comm_hook.c) */
  struct reducer_comm_hook *comm_hook; /* NULL: the reducer's own averaging all-reduce */

  /* static_graph and the logging data (runtime/distributed/reducer_static_graph.c, Note
   * [static graph] in ddplua/reducer_static_graph.h) */
  struct reducer_static_graph *static_graph; /* the static graph feature's state: NULL until
                                              * ddp_reducer_set_static_graph */
  int64_t stat_backward_start_ns, stat_compute_end_ns, stat_comm_start_ns;
  int64_t stat_samples;      /* iterations summed below */
  double stat_compute_ns, stat_comm_ns, stat_overlap_ns;
  int64_t stat_unused_bytes; /* bytes of the parameters unused on this rank, last iteration */
  uint8_t *prev_unused;      /* find_unused_parameters: last iteration's locally unused set */
  int graph_changed;         /* that set changed between iterations (PyTorch's !ddp_graph_static_) */
  int64_t *initial_bucket_bytes; /* the buckets before the rebuild */
  int n_initial_buckets;

  /* the optimizer in backward (runtime/distributed/reducer_fused_optim.c, Note [optimizer in
   * backward] in ddplua/reducer_fused_optim.h); NULL when none is registered */
  struct reducer_fused_optim *fused_optim;

  /* Note [reducer features]: the registered features, in their order */
  const ddp_reducer_feature *features[REDUCER_MAX_FEATURES];
  int n_features;
};

/* Add feature f to r's list (Note [reducer features]), in f->order; adding it again does
 * nothing. Errors: DDP_ERR_STATE when the list is full (REDUCER_MAX_FEATURES). */
int reducer_add_feature(ddp_reducer *r, const ddp_reducer_feature *f);

/* The registered features, for the walks of reducer.c. */
#define REDUCER_FOR_FEATURES(r, f)                                                             \
  for (int f##_at = 0; f##_at < (r)->n_features; f##_at++)                                    \
    for (const ddp_reducer_feature *f = (r)->features[f##_at]; f; f = NULL)

/* The steps reducer.c implements that the files beside it call (each documented there). */
void reducer_hook_failed(ddp_reducer *r);
int reducer_bucket_launch(ddp_reducer *r, int k);
int reducer_launch_ready_buckets(ddp_reducer *r);
int reducer_mark_variable_ready(ddp_reducer *r, int i, int used);
void reducer_reset_iteration(ddp_reducer *r);
int reducer_bucket_wait(ddp_reducer *r, int k);
int reducer_copy_back(ddp_reducer *r);
int reducer_rebuild_buckets(ddp_reducer *r);

/* Note [comm hooks]: the hook's side of launching and waiting for bucket k (reached through
 * its ddp_reducer_feature), on t (bucket k's dtype and size, laid out as its slots) instead of
 * the bucket's buffer: a joined rank's shadow runs the hook on zeros (Note [join shadow
 * iteration]); and the end of an iteration (runtime/distributed/reducer_comm_hook.c). */
int reducer_comm_hook_launch_on(ddp_reducer *r, int k, ddp_tensor *t);
int reducer_comm_hook_wait_on(ddp_reducer *r, int k, ddp_tensor *t);
void reducer_comm_hook_reset(ddp_reducer *r);

/* reducer_static_graph.c: the logging statistics reducer.c keeps whatever the features
 * (each documented there); static_graph itself is a ddp_reducer_feature. */
void reducer_stats_backward_start(ddp_reducer *r);
void reducer_stats_backward_end(ddp_reducer *r);
void reducer_stats_bucket_launched(ddp_reducer *r, int k);
void reducer_stats_done(ddp_reducer *r);
void reducer_stats_free(ddp_reducer *r);

#endif
