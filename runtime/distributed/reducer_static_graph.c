/* runtime/distributed/reducer_static_graph.c: the reducer's static_graph mode (Note [static
 * graph] in ddplua/reducer_static_graph.h) and the statistics behind
 * ddp_reducer_get_logging_data, after PyTorch's torch/csrc/distributed/c10d/reducer.cpp
 * (autograd_hook, delay_all_reduce, reset_bucket_counting) and logger.cpp
 * (set_runtime_stats_and_log). static_graph is a reducer feature (Note [reducer features]
 * in reducer_internal.h), reached through static_graph_feature; reducer.c calls the
 * statistics (reducer_stats_*) itself, with or without it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "distributed/reducer_internal.h"

/* PyTorch's text (reducer.cpp, autograd_hook's REDUCER_CHECK). */
#define GRAPH_CHANGED                                                                           \
  "Your training graph has changed in this iteration, e.g., one parameter is unused in first " \
  "iteration, but then got used in the second iteration. this is not compatible with "         \
  "static_graph set to True."

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t param_bytes(const ddp_reducer *r, int i) {
  return r->params[i]->numel * (int64_t)ddp_dtype_size(r->params[i]->dtype);
}

/* ---- static graph ------------------------------------------------------------------------ */

static const ddp_reducer_feature static_graph_feature;

/* The static graph feature's state (r->static_graph; NULL while static_graph is off). */
struct reducer_static_graph {
  int find_unused_asked;     /* find_unused_parameters as given (static_graph changes find_unused) */
  int first_done;            /* the first iteration's hook counts are final */
  int unused_marked;         /* this iteration marked the recorded unused parameters */
  int32_t *hook_counts;      /* per parameter: hooks fired in the first iteration
                              * (PyTorch's numGradHooksTriggeredMap_) */
  int32_t *hook_left;        /* per parameter: hooks still expected in this iteration
                              * (numGradHooksTriggeredMapPerIteration_) */
  int32_t *global_used;      /* per parameter: the first iteration's all-reduced used flags */
};

static void static_graph_state_free(struct reducer_static_graph *g) {
  if (!g) return;
  free(g->hook_counts);
  free(g->hook_left);
  free(g->global_used);
  free(g);
}

/* The static graph feature's free. */
static void static_graph_free(ddp_reducer *r) {
  static_graph_state_free(r->static_graph);
  r->static_graph = NULL;
}

int ddp_reducer_set_static_graph(ddp_reducer *r) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (r->static_graph) return DDP_OK;
  if (r->iterations > 0 || (r->armed && r->hooks_fired) || r->unfinished)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: static_graph must be set before the first "
             "backward is reduced (rank %d has reduced %lld iterations)", r->rank,
             (long long)r->iterations);
  size_t m = (size_t)(r->n ? r->n : 1);
  struct reducer_static_graph *g = calloc(1, sizeof *g);
  if (g) {
    g->hook_counts = calloc(m, sizeof(int32_t));
    g->hook_left = calloc(m, sizeof(int32_t));
    g->global_used = calloc(m, sizeof(int32_t));
  }
  if (!g || !g->hook_counts || !g->hook_left || !g->global_used) {
    static_graph_state_free(g);
    DDP_FAIL(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory");
  }
  if (!r->local_used) {
    int64_t shape[1] = {r->n};
    int status = ddp_tensor_zeros(&r->local_used, 1, shape, DDP_I32, DDP_DEVICE_CPU);
    if (status) {
      static_graph_state_free(g);
      return status;
    }
  }
  int status = reducer_add_feature(r, &static_graph_feature); /* Note [reducer features] */
  if (status) {
    static_graph_state_free(g);
    return status;
  }
  r->static_graph = g;
  g->find_unused_asked = r->find_unused;
  r->find_unused = 1; /* the first iteration finds the unused parameters */
  r->recording = 0;   /* the second iteration records the rebuild order */
  return DDP_OK;
}

int ddp_reducer_static_graph(const ddp_reducer *r) { return r && r->static_graph; }

int ddp_reducer_static_hook_count(const ddp_reducer *r, int i) {
  if (!r || !r->static_graph || !r->static_graph->first_done || i < 0 || i >= r->n) return -1;
  return r->static_graph->hook_counts[i];
}

/* The static graph feature's on_grad_ready: parameter i's post-accumulate hook fired; the
 * feature takes it (instead of reducer_mark_variable_ready). */
static int static_graph_hook(ddp_reducer *r, int i, int *taken) {
  *taken = 1;
  if (!r->static_graph->first_done) { /* count only; delay_all_reduce at the end */
    r->static_graph->hook_counts[i]++;
    ((int32_t *)ddp_data(r->local_used))[i] = 1;
    return DDP_OK;
  }
  if (!r->static_graph->unused_marked) {
    r->static_graph->unused_marked = 1;
    for (int j = 0; j < r->n; j++) {
      if (r->static_graph->hook_counts[j] != 0) continue;
      if (r->recording) r->order[r->n_order++] = j;
      DDP_TRY(reducer_mark_variable_ready(r, j, 0));
    }
  }
  if (r->static_graph->hook_left[i] <= 0)
    DDP_FAIL(DDP_ERR_STATE, GRAPH_CHANGED " Parameter %d's gradient hook fired more often than "
             "the %d time(s) of the first iteration on rank %d.", i, r->static_graph->hook_counts[i], r->rank);
  if (--r->static_graph->hook_left[i] == 0) return reducer_mark_variable_ready(r, i, 1);
  return DDP_OK;
}

/* The static graph feature's finalize_begin (the start of finalize_backward): in the first iteration, mark the used parameters ready
 * (their .grad is final now) so their buckets launch, and leave the unused ones to
 * finalize's find_unused path (zeros, then the flag all-reduce); later, fail when a
 * parameter fell short of its recorded count. */
static int static_graph_finalize(ddp_reducer *r) {
  if (!r->static_graph->first_done) {
    for (int i = 0; i < r->n; i++)
      if (r->static_graph->hook_counts[i] > 0) DDP_TRY(reducer_mark_variable_ready(r, i, 1));
    return DDP_OK;
  }
  char list[512];
  size_t len = 0;
  int short_of = 0;
  list[0] = 0;
  for (int i = 0; i < r->n; i++) {
    if (r->static_graph->hook_left[i] <= 0) continue;
    short_of++;
    if (len + 24 < sizeof list)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d (%d of %d)", short_of > 1 ? ", " : "",
                              i, r->static_graph->hook_counts[i] - r->static_graph->hook_left[i], r->static_graph->hook_counts[i]);
  }
  if (short_of)
    DDP_FAIL(DDP_ERR_STATE, GRAPH_CHANGED " Parameter indices whose gradient hooks fired fewer "
             "times than in the first iteration on rank %d (fired of expected): %s", r->rank, list);
  return DDP_OK;
}

/* The static graph feature's prepare_backward (a new iteration): the per-iteration countdown from the recorded
 * counts, and the first iteration's global used flags for the copy back. */
static void static_graph_reset(ddp_reducer *r) {
  r->static_graph->unused_marked = 0;
  if (!r->static_graph->first_done) return;
  memcpy(r->static_graph->hook_left, r->static_graph->hook_counts, sizeof(int32_t) * (size_t)r->n);
  memcpy(ddp_data(r->local_used), r->static_graph->global_used, sizeof(int32_t) * (size_t)r->n);
}

/* ---- statistics (PyTorch's logger.cpp runtime stats) ------------------------------------- */

void reducer_stats_backward_start(ddp_reducer *r) {
  if (!r->n_initial_buckets && !r->has_rebuilt && r->n_buckets > 0) {
    r->initial_bucket_bytes = malloc(sizeof(int64_t) * (size_t)r->n_buckets);
    if (r->initial_bucket_bytes) {
      for (int k = 0; k < r->n_buckets; k++) r->initial_bucket_bytes[k] = ddp_reducer_bucket_bytes(r, k);
      r->n_initial_buckets = r->n_buckets;
    }
  }
  r->stat_backward_start_ns = now_ns();
  r->stat_comm_start_ns = 0;
  r->stat_compute_end_ns = 0;
}

/* The backward walk ended (finalize_backward begins): the gradients are computed (the
 * all-reduces run on the backward's thread meanwhile, Note [bucket overlap] in
 * ddplua/reducer.h, are communication, not compute: their time is taken off). With
 * find_unused_parameters (and no static_graph), whether this iteration's locally unused set
 * differs from the last one's (PyTorch's search_unused_parameters: ddp_graph_static_, logged
 * as can_set_static_graph). */
void reducer_stats_backward_end(ddp_reducer *r) {
  r->stat_compute_end_ns = now_ns() - r->here_ns;
  int64_t unused = 0;
  const int32_t *used = r->local_used ? (const int32_t *)ddp_data(r->local_used) : NULL;
  int track = !r->static_graph && used;
  if (track && !r->prev_unused && !(r->prev_unused = malloc((size_t)(r->n ? r->n : 1))))
    track = 0; /* out of memory: the statistic is not kept */
  for (int i = 0; i < r->n; i++) {
    int is_unused = r->static_graph ? r->static_graph->hook_counts[i] == 0 : (used && used[i] == 0);
    if (is_unused) unused += param_bytes(r, i);
    if (track && r->iterations > 0 && r->prev_unused[i] != is_unused) r->graph_changed = 1;
    if (track) r->prev_unused[i] = (uint8_t)is_unused;
  }
  r->stat_unused_bytes = unused;
}

void reducer_stats_bucket_launched(ddp_reducer *r, int k) {
  (void)k;
  if (!r->stat_comm_start_ns) r->stat_comm_start_ns = now_ns();
}

/* The reduction finished (finalize_backward, before iterations++): the iteration's times. */
void reducer_stats_done(ddp_reducer *r) {
  int64_t end = now_ns();
  if (r->stat_backward_start_ns && r->stat_compute_end_ns) {
    double compute = (double)(r->stat_compute_end_ns - r->stat_backward_start_ns);
    double comm = 0, overlap = 0;
    if (r->stat_comm_start_ns) {
      comm = (double)(end - r->stat_comm_start_ns);
      overlap = (double)(r->stat_compute_end_ns - r->stat_comm_start_ns);
      if (overlap < 0) overlap = 0;
    }
    r->stat_compute_ns += compute;
    r->stat_comm_ns += comm;
    r->stat_overlap_ns += overlap;
    r->stat_samples++;
  }
}

/* The static graph feature's finalize_end: the end of static_graph's first iteration (the
 * all-reduced used flags are in local_used now). */
static void static_graph_done(ddp_reducer *r) {
  if (r->static_graph->first_done) return;
  memcpy(r->static_graph->global_used, ddp_data(r->local_used), sizeof(int32_t) * (size_t)r->n);
  r->static_graph->first_done = 1;
  r->find_unused = 0;               /* no search after the first iteration */
  r->recording = !r->has_rebuilt;   /* the next iteration records the rebuild order */
}

/* Note [reducer features]: static_graph counts the hooks of the first iteration and marks
 * the parameters ready by those counts afterwards. */
static const ddp_reducer_feature static_graph_feature = {
    .name = "static_graph",
    .order = 30,
    .prepare_backward = static_graph_reset,
    .on_grad_ready = static_graph_hook,
    .finalize_begin = static_graph_finalize,
    .finalize_end = static_graph_done,
    .free = static_graph_free,
};

/* The statistics' memory (ddp_reducer_free). */
void reducer_stats_free(ddp_reducer *r) {
  free(r->initial_bucket_bytes);
  free(r->prev_unused);
  r->prev_unused = NULL;
  r->initial_bucket_bytes = NULL;
  r->n_initial_buckets = 0;
}

int ddp_reducer_get_logging_data(const ddp_reducer *r, ddp_reducer_logging_data *out) {
  if (!r || !out) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: logging data: NULL argument");
  memset(out, 0, sizeof *out);
  out->world_size = r->world;
  out->rank = r->rank;
  out->bucket_cap_bytes = r->cap;
  out->find_unused_parameters = r->static_graph ? r->static_graph->find_unused_asked : r->find_unused;
  out->static_graph = r->static_graph != NULL;
  out->gradient_as_bucket_view = r->as_view;
  out->has_rebuilt_buckets = r->has_rebuilt;
  out->unused_parameter_size = r->stat_unused_bytes;
  out->iteration = r->iterations;
  out->can_set_static_graph = !r->graph_changed;
  if (r->stat_samples > 0) {
    double n = (double)r->stat_samples;
    out->avg_backward_compute_time = (int64_t)(r->stat_compute_ns / n);
    out->avg_backward_comm_time = (int64_t)(r->stat_comm_ns / n);
    out->avg_backward_compute_comm_overlap_time = (int64_t)(r->stat_overlap_ns / n);
  }
  return DDP_OK;
}

int ddp_reducer_initial_bucket_bytes(const ddp_reducer *r, int64_t *out, int cap) {
  if (!r) return 0;
  if (!r->n_initial_buckets) { /* not saved yet: the buckets are still the first ones */
    for (int k = 0; k < r->n_buckets && k < cap; k++) out[k] = ddp_reducer_bucket_bytes(r, k);
    return r->n_buckets;
  }
  for (int k = 0; k < r->n_initial_buckets && k < cap; k++) out[k] = r->initial_bucket_bytes[k];
  return r->n_initial_buckets;
}
