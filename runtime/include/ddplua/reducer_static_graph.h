/* ddplua/reducer_static_graph.h: part of the public API, included by ddplua.h only.
 *
 * DistributedDataParallel's static_graph mode and its logging data, extending the reducer of
 * ddplua/reducer.h (runtime/distributed/reducer_static_graph.c).
 *
 * Note [static graph]: after PyTorch's Reducer with static_graph_ (torch/csrc/distributed/
 * c10d/reducer.cpp: autograd_hook, delay_all_reduce, reset_bucket_counting;
 * numGradHooksTriggeredMap_ and numGradHooksTriggeredMapPerIteration_). The user promises
 * that every iteration uses the same parameters, each the same number of times:
 *  - First synchronised iteration: the hooks only count how many times each parameter's
 *    post-accumulate hook fires (hook_counts; a parameter whose hook fires twice, e.g. used
 *    inside a reentrant checkpoint and outside it, Note [reentrant backward] in
 *    runtime/autograd/engine.c, has .grad final only at its last firing). Nothing is launched
 *    during that backward. At its end (PyTorch's delay_all_reduce) every used parameter is
 *    marked ready, the ones whose hook never fired are marked ready with zeros, the buckets
 *    are launched in index order and the used flags are all-reduced as with
 *    find_unused_parameters (Note [unused parameters] in ddplua/reducer.h): a parameter
 *    unused on every rank keeps its .grad. That iteration does not overlap communication.
 *  - Later iterations: no unused-parameter search and no flag all-reduce. At the first hook
 *    the recorded unused parameters are marked ready at once (zeros); a parameter is marked
 *    ready when its hook has fired as many times as recorded, so its bucket launches as soon
 *    as its gradient is final. The first iteration's global used flags keep deciding which
 *    .grad stays untouched.
 *  - A hook firing more often than recorded (a parameter unused in the first iteration now
 *    used, or used more times) fails the backward, and so does a backward that ends with a
 *    parameter short of its recorded count, with PyTorch's message "Your training graph has
 *    changed in this iteration, e.g., one parameter is unused in first iteration, but then
 *    got used in the second iteration. this is not compatible with static_graph set to
 *    True." followed by the parameter indices and the rank. The peers cannot know: a rank
 *    whose graph changed alone leaves the others waiting for its buckets until the timeout.
 *  - Buckets are rebuilt once (Note [bucket rebuild]) in the order in which the parameters
 *    became ready in the second iteration, the first one that marks parameters during
 *    backward (rank 0's order, unused parameters first, as they are marked at the first
 *    hook), before the third forward: PyTorch records rebuilt_params_ only after the static
 *    first iteration, so it rebuilds at the same point.
 *  - Counting happens in synchronised iterations only (not inside no_sync).
 */

/* Turn static_graph on for a reducer that has run no synchronised backward yet (PyTorch's
 * Reducer::set_static_graph, called by DDP(static_graph=True)). Errors: DDP_ERR_ARG (NULL
 * reducer), DDP_ERR_STATE (a backward was already reduced or is under way),
 * DDP_ERR_MEMORY. */
int ddp_reducer_set_static_graph(ddp_reducer *r);

/* 1 when static_graph is on. */
int ddp_reducer_static_graph(const ddp_reducer *r);

/* How many times parameter i's hook fired in the first iteration (Note [static graph]);
 * -1 before that iteration finished, for a reducer without static_graph or an i out of
 * range. */
int ddp_reducer_static_hook_count(const ddp_reducer *r, int i);

/* The scalars of PyTorch's DDPLoggingData (torch/csrc/distributed/c10d/logger.cpp) that
 * the reducer knows; times in nanoseconds, as PyTorch's. */
typedef struct ddp_reducer_logging_data {
  int world_size, rank;
  int64_t bucket_cap_bytes;
  int find_unused_parameters;   /* as given to ddp_reducer_new */
  int static_graph;
  int gradient_as_bucket_view;
  int has_rebuilt_buckets;
  int64_t unused_parameter_size; /* bytes of the parameters unused on this rank in the last
                                  * finished iteration (find_unused_parameters or static_graph;
                                  * else 0) */
  int64_t iteration;             /* finished reductions */
  int can_set_static_graph;      /* 1 while no iteration's set of unused parameters differed
                                  * from the one before (checked with find_unused_parameters
                                  * and without static_graph; PyTorch's ddp_graph_static_) */
  /* Means over the finished iterations (PyTorch samples some; here every one), in ns:
   * compute: from prepare_for_backward to the end of the backward walk (all gradients
   * computed); comm: from the first bucket's launch to the end of the wait for the last
   * one; overlap: from the first launch to the end of the compute (0 when the first launch
   * came after it). 0 before the first iteration. */
  int64_t avg_backward_compute_time;
  int64_t avg_backward_comm_time;
  int64_t avg_backward_compute_comm_overlap_time;
} ddp_reducer_logging_data;

/* Fill *out. Errors: DDP_ERR_ARG for a NULL reducer or out. */
int ddp_reducer_get_logging_data(const ddp_reducer *r, ddp_reducer_logging_data *out);

/* Bytes of each bucket as first built (before the rebuild, Note [bucket rebuild]) written
 * into out (at most cap); returns the bucket count. The current buckets' bytes are
 * ddp_reducer_bucket_bytes. */
int ddp_reducer_initial_bucket_bytes(const ddp_reducer *r, int64_t *out, int cap);
