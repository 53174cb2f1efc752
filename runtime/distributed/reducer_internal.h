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
  int static_graph;          /* ddp_reducer_set_static_graph ran */
  int find_unused_asked;     /* find_unused_parameters as given (static_graph changes find_unused) */
  int static_first_done;     /* the first iteration's hook counts are final */
  int static_unused_marked;  /* this iteration marked the recorded unused parameters */
  int32_t *hook_counts;      /* per parameter: hooks fired in the first iteration
                              * (PyTorch's numGradHooksTriggeredMap_) */
  int32_t *hook_left;        /* per parameter: hooks still expected in this iteration
                              * (numGradHooksTriggeredMapPerIteration_) */
  int32_t *global_used;      /* per parameter: the first iteration's all-reduced used flags */
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
};

/* The steps reducer.c implements that the files beside it call (each documented there). */
void reducer_hook_failed(ddp_reducer *r);
int reducer_bucket_launch(ddp_reducer *r, int k);
int reducer_launch_ready_buckets(ddp_reducer *r);
int reducer_mark_variable_ready(ddp_reducer *r, int i, int used);
void reducer_reset_iteration(ddp_reducer *r);
int reducer_bucket_wait(ddp_reducer *r, int k);
int reducer_copy_back(ddp_reducer *r);
int reducer_rebuild_buckets(ddp_reducer *r);

/* Note [comm hooks]: the hook's side of launching and waiting for bucket k, the end of an
 * iteration, and freeing (runtime/distributed/reducer_comm_hook.c). */
int reducer_comm_hook_launch(ddp_reducer *r, int k);
int reducer_comm_hook_wait(ddp_reducer *r, int k);
/* The same on t (bucket k's dtype and size, laid out as its slots) instead of the bucket's
 * buffer: a joined rank's shadow runs the hook on zeros (Note [join shadow iteration]). */
int reducer_comm_hook_launch_on(ddp_reducer *r, int k, ddp_tensor *t);
int reducer_comm_hook_wait_on(ddp_reducer *r, int k, ddp_tensor *t);
void reducer_comm_hook_reset(ddp_reducer *r);
void reducer_comm_hook_free(ddp_reducer *r);

/* reducer_static_graph.c: the calls reducer.c makes into it (each documented there). */
int reducer_static_graph_hook(ddp_reducer *r, int i);
int reducer_static_graph_finalize(ddp_reducer *r);
void reducer_static_graph_reset(ddp_reducer *r);
void reducer_stats_backward_start(ddp_reducer *r);
void reducer_stats_backward_end(ddp_reducer *r);
void reducer_stats_bucket_launched(ddp_reducer *r, int k);
void reducer_static_graph_done(ddp_reducer *r);
void reducer_static_graph_free(ddp_reducer *r);

/* reducer_fused_optim.c: the calls reducer.c makes into it (each documented there). */
int reducer_fused_optim_poll(ddp_reducer *r);
int reducer_fused_optim_finalize(ddp_reducer *r);
void reducer_fused_optim_reset(ddp_reducer *r);
void reducer_fused_optim_free(ddp_reducer *r);

#endif
