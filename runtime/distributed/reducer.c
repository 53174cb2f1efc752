/* runtime/distributed/reducer.c: the DDP gradient reducer (ddplua/reducer.h), after PyTorch's c10d
 * Reducer: Bucket, mark_variable_ready, finalize_backward. The invariants are the notes in
 * ddplua/reducer.h: [bucket order], [bucket assignment], [gradient averaging],
 * [bucket rebuild], [unused parameters], [device buckets], [shared buckets]. Its features
 * (comm hooks, join, static graph, the optimizer in backward) are reached only through the
 * callback tables they register (Note [reducer features] in reducer_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/kernels.h"
#include "core/profiler.h"
#include "distributed/reducer_internal.h"

/* ---- buckets --------------------------------------------------------------------------- */

static void bucket_clear(bucket *b) {
  if (b->work) ddp_work_free(b->work);
  for (int k = 0; k < b->n_vars && b->views; k++) ddp_tensor_release(b->views[k]);
  ddp_tensor_release(b->buffer);
  free(b->views);
  free(b->vars);
  free(b->offsets);
  memset(b, 0, sizeof *b);
}

static void buckets_free(bucket *bs, int n) {
  for (int k = 0; bs && k < n; k++) bucket_clear(&bs[k]);
  free(bs);
}

/* The flat buffer of bucket b (numel elements). Note [shared buckets]. */
static int bucket_buffer(ddp_reducer *r, bucket *b, const int64_t *shape) {
  if (r->pg && r->device == DDP_DEVICE_CPU && (b->dtype == DDP_F32 || b->dtype == DDP_F64)) {
    int placed = 0;
    if (ddp_pg_shared_zeros(&b->buffer, r->pg, 1, shape, b->dtype, &placed) == DDP_OK)
      return DDP_OK;
    if (ddp_last_status() != DDP_ERR_MEMORY) return ddp_last_status();
    /* the group's shared memory is full: an ordinary buffer, staged by the all-reduce */
  }
  return ddp_tensor_zeros(&b->buffer, 1, shape, b->dtype, r->device);
}

/* Build the buckets for the walk `order` (NULL: reverse registration order) into *out.
 * Note [bucket assignment]. */
static int buckets_build(ddp_reducer *r, const int *order, bucket **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  int n = r->n;
  int64_t *bytes = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  int *dtypes = malloc(sizeof(int) * (size_t)(n ? n : 1));
  int *bucket_of = malloc(sizeof(int) * (size_t)(n ? n : 1));
  bucket *bs = NULL;
  int nb = 0, status = DDP_OK;
  if (!bytes || !dtypes || !bucket_of) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory building buckets");
    goto done;
  }
  for (int i = 0; i < n; i++) {
    bytes[i] = r->params[i]->numel * (int64_t)ddp_dtype_size(r->params[i]->dtype);
    dtypes[i] = r->params[i]->dtype;
  }
  nb = ddp_compute_bucket_assignment(bucket_of, n, order, bytes, dtypes, r->cap, r->first_cap);
  if (nb < 0) {
    status = ddp_last_status();
    nb = 0;
    goto done;
  }
  bs = calloc((size_t)(nb ? nb : 1), sizeof *bs);
  if (!bs) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory building buckets");
    goto done;
  }
  for (int i = 0; i < n; i++) bs[bucket_of[i]].n_vars++;
  for (int k = 0; k < nb && !status; k++) {
    bs[k].vars = malloc(sizeof(int) * (size_t)bs[k].n_vars);
    bs[k].offsets = malloc(sizeof(int64_t) * (size_t)bs[k].n_vars);
    bs[k].views = calloc((size_t)bs[k].n_vars, sizeof(ddp_tensor *));
    if (!bs[k].vars || !bs[k].offsets || !bs[k].views)
      status = DDP_ERROR(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory building buckets");
    bs[k].n_vars = 0; /* refilled below in walk order */
  }
  /* Slots in walk order. */
  for (int pos = 0; pos < n && !status; pos++) {
    int i = order ? order[pos] : n - 1 - pos;
    bucket *b = &bs[bucket_of[i]];
    b->dtype = r->params[i]->dtype;
    b->vars[b->n_vars] = i;
    b->offsets[b->n_vars] = b->numel;
    b->numel += r->params[i]->numel;
    b->n_vars++;
  }
  for (int k = 0; k < nb && !status; k++) {
    bucket *b = &bs[k];
    int64_t shape[1] = {b->numel};
    status = bucket_buffer(r, b, shape);
    for (int s = 0; s < b->n_vars && !status; s++) {
      ddp_tensor *p = r->params[b->vars[s]];
      int64_t strides[DDP_MAX_DIMS];
      ddp_contiguous_strides(p->ndim, p->shape, strides);
      status = ddp_tensor_view_raw(&b->views[s], b->buffer, p->ndim, p->shape, strides,
                                   b->offsets[s]);
    }
  }
done:
  free(bytes);
  free(dtypes);
  free(bucket_of);
  if (status) {
    buckets_free(bs, nb);
    return status;
  }
  *out = bs;
  *n_out = nb;
  return DDP_OK;
}

/* Make r's buckets `bs`: index maps, and with gradient_as_bucket_view the existing gradients
 * move into the new views (PyTorch's initialize_bucket_views). */
static int buckets_install(ddp_reducer *r, bucket *bs, int nb) {
  for (int k = 0; k < nb; k++)
    for (int s = 0; s < bs[k].n_vars; s++) {
      r->bucket_of[bs[k].vars[s]] = k;
      r->slot_of[bs[k].vars[s]] = s;
    }
  buckets_free(r->buckets, r->n_buckets);
  r->buckets = bs;
  r->n_buckets = nb;
  if (!r->as_view) return DDP_OK;
  for (int i = 0; i < r->n; i++) {
    ddp_tensor *p = r->params[i], *view = bs[r->bucket_of[i]].views[r->slot_of[i]];
    if (!p->grad || p->grad == view) continue;
    DDP_TRY(ddp_copy_(view, p->grad));
    DDP_TRY(ddp_tensor_set_grad(p, view));
  }
  return DDP_OK;
}

/* ---- failures ------------------------------------------------------------------------ */

/* Remember the first failure inside a hook (hooks cannot return one); finalize reports it. */
void reducer_hook_failed(ddp_reducer *r) {
  if (r->failed) return;
  r->failed = 1;
  r->failure_status = ddp_last_status() ? ddp_last_status() : DDP_ERR_STATE;
  const char *msg = ddp_last_error();
  r->failure = strdup(msg && *msg ? msg : "DistributedDataParallel: a gradient hook failed");
}

/* ---- features (Note [reducer features] in reducer_internal.h) ---------------------------- */

int reducer_add_feature(ddp_reducer *r, const ddp_reducer_feature *f) {
  for (int j = 0; j < r->n_features; j++)
    if (r->features[j] == f) return DDP_OK;
  if (r->n_features == REDUCER_MAX_FEATURES)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: cannot add the reducer feature '%s' on rank "
             "%d: %d features are registered already", f->name, r->rank, r->n_features);
  int at = r->n_features;
  while (at > 0 && r->features[at - 1]->order > f->order) {
    r->features[at] = r->features[at - 1];
    at--;
  }
  r->features[at] = f;
  r->n_features++;
  return DDP_OK;
}

/* 1 when a feature takes over the buckets' communication (a comm hook). */
static int bucket_transport_taken(const ddp_reducer *r) {
  REDUCER_FOR_FEATURES(r, f)
    if (f->bucket_launch) return 1;
  return 0;
}

/* What the gradients are divided by going into their slots (Note [gradient averaging]):
 * the first feature's answer > 0, else the world size. */
static int grad_divisor(const ddp_reducer *r) {
  REDUCER_FOR_FEATURES(r, f) {
    int d = f->grad_divisor ? f->grad_divisor(r) : 0;
    if (d > 0) return d;
  }
  return r->world;
}

/* ---- launching (Note [bucket order]) ----------------------------------------------- */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 1 when the reducer's own all-reduces may run blocking on the backward's thread (Note
 * [bucket overlap]): a host-side group, host buckets, no comm hook, and a DDP timeout no
 * shorter than the group's (a blocking collective is bounded by the group's timeout; a
 * shorter DDP timeout keeps the buckets on the communication thread, where finalize's
 * wait gives up after it). */
static int may_run_here(const ddp_reducer *r) {
  return r->pg && r->world > 1 && !bucket_transport_taken(r) && r->device == DDP_DEVICE_CPU &&
         r->comm_device == DDP_DEVICE_CPU && r->timeout_s >= ddp_pg_get_timeout(r->pg);
}

/* The error of bucket k's failed all-reduce: names the bucket, this rank and the pg's cause
 * (which names the peer when it can be known). */
static int bucket_failed(ddp_reducer *r, int k, int status) {
  bucket *b = &r->buckets[k];
  const char *cause = r->pg && ddp_pg_error(r->pg)[0] ? ddp_pg_error(r->pg) : ddp_last_error();
  return DDP_ERROR(status, "DistributedDataParallel: the all-reduce of gradient bucket %d (%d "
                   "parameters, %lld bytes) failed on rank %d: %s", k, b->n_vars,
                   (long long)(b->numel * (int64_t)ddp_dtype_size(b->dtype)), r->rank, cause);
}

int reducer_bucket_launch(ddp_reducer *r, int k) {
  bucket *b = &r->buckets[k];
  b->launched = 1;
  reducer_stats_bucket_launched(r, k);
  if (DDP_PROF_ON()) { /* Note [profiler events]: the bucket is ready and goes out */
    int64_t now = ddp_prof_now();
    ddp_prof_record_span("DDP bucket ready", DDP_PROF_BUCKET, now, now,
                         b->numel * (int64_t)ddp_dtype_size(b->dtype), k, NULL);
  }
  REDUCER_FOR_FEATURES(r, f) { /* Note [comm hooks]: the hook launches */
    int taken = 0;
    int status = f->bucket_launch ? f->bucket_launch(r, k, &taken) : DDP_OK;
    if (status || taken) return status;
  }
  if (!r->pg || r->world == 1) return DDP_OK;
  char site[64]; /* Note [collective fingerprints]: a mismatch names the bucket */
  snprintf(site, sizeof site, "DistributedDataParallel gradient bucket %d", k);
  ddp_pg_set_call_site(site, 0);
  if (may_run_here(r) && (!r->overlap || k == r->n_buckets - 1)) {
    /* Note [bucket overlap], Note [last bucket inline]: blocking, on this thread when the
     * group's queue is idle (else after the buckets queued before it) */
    int64_t t0 = now_ns();
    int status = ddp_pg_allreduce(NULL, r->pg, b->buffer, DDP_REDUCE_SUM);
    r->here_ns += now_ns() - t0;
    if (DDP_PROF_ON()) /* the backward's thread in the collective, queue wait included */
      ddp_prof_record("DDP bucket all_reduce", DDP_PROF_BUCKET, t0,
                      b->numel * (int64_t)ddp_dtype_size(b->dtype), k, NULL);
    return status ? bucket_failed(r, k, status) : DDP_OK;
  }
  int status = ddp_pg_allreduce(&b->work, r->pg, b->buffer, DDP_REDUCE_SUM);
  if (status) {
    b->work = NULL;
    return DDP_ERROR(status, "DistributedDataParallel: could not launch the all-reduce of gradient "
                     "bucket %d on rank %d: %s", k, r->rank, ddp_last_error());
  }
  return DDP_OK;
}

/* Launch every complete bucket from next_bucket on, stopping at the first incomplete one;
 * with overlap off (Note [bucket overlap]), nothing before every bucket is complete. */
int reducer_launch_ready_buckets(ddp_reducer *r) {
  if (r->overlap || r->n_complete == r->n_buckets || !may_run_here(r))
    while (r->next_bucket < r->n_buckets && r->buckets[r->next_bucket].pending == 0)
      DDP_TRY(reducer_bucket_launch(r, r->next_bucket++));
  REDUCER_FOR_FEATURES(r, f) /* Note [optimizer in backward]: step the completed buckets */
    if (f->bucket_ready) DDP_TRY(f->bucket_ready(r));
  return DDP_OK;
}

/* ---- mark_variable_ready ---------------------------------------------------------------- */

/* dst (contiguous slot) = src * scale (Note [gradient averaging]); src NULL: zeros. */
static int copy_scaled(ddp_tensor *dst, const ddp_tensor *src, double scale) {
  if (!src) return ddp_zero_(dst);
  if (dst->device != DDP_DEVICE_CPU) {
    /* Note [device buckets]: a device copy and a scale on the device, both on the current
     * stream (never a host pointer into device memory). */
    if (src != dst) DDP_TRY(ddp_copy_(dst, src));
    return scale == 1.0 ? DDP_OK : ddp_mul_scalar_(dst, scale);
  }
  /* Note [reduction entries]: the CPU table's scale_into, one pass from the gradient into
   * its slot when the two have the same layout and dtype (f16 / bf16 through f32) */
  const ddp_kernels *k = &ddp_cpu_kernels;
  if (src != dst && src->dtype == dst->dtype && ddp_tensor_is_contiguous(src)) {
    k->scale_into(dst->dtype, ddp_data(dst), ddp_data(src), dst->numel, scale, 0);
    ddp_tensor_bump_version(dst);
    return DDP_OK;
  }
  if (src != dst) DDP_TRY(ddp_copy_(dst, src));
  if (scale == 1.0) return DDP_OK;
  k->scale_into(dst->dtype, ddp_data(dst), ddp_data(dst), dst->numel, scale, 0);
  ddp_tensor_bump_version(dst);
  return DDP_OK;
}

/* Put parameter i's gradient (NULL: zeros) into its bucket slot, count the bucket down and
 * launch what became launchable. `used`: the gradient came from this rank's backward. */
int reducer_mark_variable_ready(ddp_reducer *r, int i, int used) {
  ddp_tensor *p = r->params[i];
  if (r->ready[i])
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: parameter %d was marked ready twice in one "
             "iteration on rank %d (a second backward through the same parameters before the "
             "reduction finished, or a parameter shared by two DDP modules)", i, r->rank);
  r->ready[i] = 1;
  if (used && r->local_used) ((int32_t *)ddp_data(r->local_used))[i] = 1;
  if (used && r->recording) r->order[r->n_order++] = i;
  bucket *b = &r->buckets[r->bucket_of[i]];
  ddp_tensor *view = b->views[r->slot_of[i]];
  /* Note [comm hooks]: with a hook the hook divides. Note [join shadow iteration]: under
   * join the divisor may be the non-joined ranks. */
  int divisor = grad_divisor(r);
  double scale = divisor == 1 ? 1.0 : 1.0 / divisor;
  int64_t t0 = DDP_PROF_ON() ? ddp_prof_now() : 0;
  if (r->as_view && p->grad == view) {
    DDP_TRY(copy_scaled(view, view, scale));
  } else {
    DDP_TRY(copy_scaled(view, used ? p->grad : NULL, scale));
    /* gradient_as_bucket_view: the gradient lives in the bucket from now on (a nil one is
     * re-created as the view; an unused one stays as it is, Note [unused parameters]). */
    if (r->as_view && used) DDP_TRY(ddp_tensor_set_grad(p, view));
  }
  if (t0) /* Note [profiler events]: the gradient into its bucket slot */
    ddp_prof_record("DDP copy gradient", DDP_PROF_BUCKET, t0,
                    view->numel * (int64_t)ddp_dtype_size(view->dtype), r->bucket_of[i], NULL);
  REDUCER_FOR_FEATURES(r, f) /* Note [optimizer in backward]: .grad is dropped */
    if (f->on_slot_filled) DDP_TRY(f->on_slot_filled(r, i, used));
  if (--b->pending == 0) r->n_complete++;
  return reducer_launch_ready_buckets(r);
}

static void on_grad_ready(ddp_tensor *t, void *vctx) {
  hook_ctx *c = vctx;
  ddp_reducer *r = c->r;
  (void)t;
  if (!r->armed || !r->sync || r->failed) return;
  r->hooks_fired = 1;
  int status = DDP_OK, taken = 0;
  REDUCER_FOR_FEATURES(r, f) { /* Note [static graph]: counts the hooks, marks when due */
    if (f->on_grad_ready && !taken && !status) status = f->on_grad_ready(r, c->index, &taken);
  }
  if (!status && !taken) status = reducer_mark_variable_ready(r, c->index, 1);
  if (status) reducer_hook_failed(r);
}

/* ---- finalize_backward -------------------------------------------------------------------- */

void reducer_reset_iteration(ddp_reducer *r) {
  for (int k = 0; k < r->n_buckets; k++) {
    bucket *b = &r->buckets[k];
    if (b->work) ddp_work_free(b->work);
    b->work = NULL;
    b->launched = 0;
    b->pending = b->n_vars;
  }
  if (r->used_work) ddp_work_free(r->used_work);
  r->used_work = NULL;
  ddp_tensor_release(r->used_dev);
  r->used_dev = NULL;
  memset(r->ready, 0, (size_t)r->n);
  if (r->local_used) memset(ddp_data(r->local_used), 0, sizeof(int32_t) * (size_t)r->n);
  r->next_bucket = 0;
  r->n_complete = 0;
  for (int k = 0; k < r->n_buckets; k++) r->n_complete += r->buckets[k].pending == 0; /* empty */
  r->here_ns = 0;
  r->hooks_fired = 0;
  r->armed = 0;
  r->failed = 0;
  free(r->failure);
  r->failure = NULL;
  REDUCER_FOR_FEATURES(r, f)
    if (f->prepare_backward) f->prepare_backward(r);
}

/* Wait for bucket k's all-reduce; the error names the bucket, this rank and the pg's cause
 * (which names the peer when it can be known). */
int reducer_bucket_wait(ddp_reducer *r, int k) {
  REDUCER_FOR_FEATURES(r, f) { /* Note [comm hooks]: the hook's own works */
    int taken = 0;
    int status = f->bucket_wait ? f->bucket_wait(r, k, &taken) : DDP_OK;
    if (status || taken) return status;
  }
  bucket *b = &r->buckets[k];
  if (!b->work) return DDP_OK;
  int64_t t0 = DDP_PROF_ON() ? ddp_prof_now() : 0;
  int status = ddp_work_wait(b->work, r->timeout_s);
  if (t0) /* Note [profiler events]: the wait for an all-reduce launched on the comm thread */
    ddp_prof_record("DDP bucket wait", DDP_PROF_BUCKET, t0,
                    b->numel * (int64_t)ddp_dtype_size(b->dtype), k, NULL);
  return status ? bucket_failed(r, k, status) : DDP_OK;
}

/* Write the reduced buckets into param.grad (Note [unused parameters] for globally unused
 * parameters). */
int reducer_copy_back(ddp_reducer *r) {
  const int32_t *used = r->local_used ? (const int32_t *)ddp_data(r->local_used) : NULL;
  for (int i = 0; i < r->n; i++) {
    if (used && used[i] == 0) continue; /* unused on every rank: .grad as it was */
    ddp_tensor *p = r->params[i];
    ddp_tensor *view = r->buckets[r->bucket_of[i]].views[r->slot_of[i]];
    if (r->as_view) {
      if (p->grad != view) DDP_TRY(ddp_tensor_set_grad(p, view));
    } else if (p->grad) {
      DDP_TRY(ddp_copy_(p->grad, view));
    } else {
      ddp_tensor *g;
      DDP_TRY(ddp_clone(&g, view));
      int status = ddp_tensor_set_grad(p, g);
      ddp_tensor_release(g);
      if (status) return status;
    }
  }
  return DDP_OK;
}

static int finalize_backward(ddp_reducer *r) {
  if (r->failed) {
    int status = r->failure_status;
    /* r->failure is NULL when strdup ran out of memory keeping the hook's message. */
    ddp_fail_at(__FILE__, __LINE__, status, "%s",
                r->failure ? r->failure : "DistributedDataParallel: a gradient hook failed");
    return status;
  }
  reducer_stats_backward_end(r);
  REDUCER_FOR_FEATURES(r, f) /* Note [static graph]: marks the first iteration's used ones */
    if (f->finalize_begin) DDP_TRY(f->finalize_begin(r));
  int n_unready = 0;
  for (int i = 0; i < r->n; i++) n_unready += !r->ready[i];
  if (n_unready && !r->find_unused) {
    /* Not waiting: the peers may never launch the buckets we wait for. */
    r->unfinished = 1;
    r->n_unready = 0;
    for (int i = 0; i < r->n; i++)
      if (!r->ready[i]) r->unready[r->n_unready++] = i;
    return DDP_OK;
  }
  for (int i = 0; i < r->n; i++)
    if (!r->ready[i]) DDP_TRY(reducer_mark_variable_ready(r, i, 0));
  if (r->find_unused && r->pg && r->world > 1) {
    /* After every bucket, so in the same collective order on every rank. nccl reduces
     * device memory only: the flags go through a device copy. */
    ddp_tensor *flags = r->local_used;
    if (r->comm_device != DDP_DEVICE_CPU) {
      DDP_TRY(ddp_tensor_to_device(&r->used_dev, r->local_used, r->comm_device, 0));
      flags = r->used_dev;
    }
    ddp_pg_set_call_site("DistributedDataParallel unused-parameter flags", 0);
    int status = ddp_pg_allreduce(&r->used_work, r->pg, flags, DDP_REDUCE_SUM);
    if (status) {
      r->used_work = NULL;
      return status;
    }
  }
  int64_t t0 = now_ns();
  int wait_status = DDP_OK;
  for (int k = 0; k < r->n_buckets && !wait_status; k++) wait_status = reducer_bucket_wait(r, k);
  /* with the all-reduces run on this thread (Note [bucket overlap]) */
  r->last_wait_s = 1e-9 * (double)(now_ns() - t0 + r->here_ns);
  if (wait_status) return wait_status;
  /* The host reads the flags: with nccl, wait on the host for them and copy them back. */
  if (r->used_work && (r->used_dev ? ddp_work_synchronize(r->used_work, r->timeout_s)
                                   : ddp_work_wait(r->used_work, r->timeout_s)))
    DDP_FAIL(ddp_last_status(), "DistributedDataParallel: the all-reduce of the used-parameter "
             "flags failed on rank %d: %s", r->rank,
             ddp_pg_error(r->pg)[0] ? ddp_pg_error(r->pg) : ddp_last_error());
  if (r->used_dev) DDP_TRY(ddp_copy_(r->local_used, r->used_dev));
  int consumed = 0; /* Note [optimizer in backward]: the buckets are stepped, not copied back */
  REDUCER_FOR_FEATURES(r, f) {
    int taken = 0;
    if (f->finalize_backward && !consumed) DDP_TRY(f->finalize_backward(r, &taken));
    consumed |= taken;
  }
  if (!consumed) DDP_TRY(reducer_copy_back(r));
  if (r->recording) {
    r->recording = 0;
    r->rebuild_pending = r->n_order == r->n && !r->find_unused;
  }
  reducer_stats_done(r);
  REDUCER_FOR_FEATURES(r, f)
    if (f->finalize_end) f->finalize_end(r);
  r->iterations++;
  return DDP_OK;
}

/* Let the launched all-reduces finish with their buffers (bounded by the timeout) before the
 * buffers are reused, keeping this thread's error message (the backward's). */
static void drain_works(ddp_reducer *r) {
  ddp_saved_error saved;
  ddp_error_save(&saved);
  for (int k = 0; k < r->n_buckets; k++)
    if (r->buckets[k].work) ddp_work_wait(r->buckets[k].work, r->timeout_s);
  ddp_error_restore(&saved);
}

static int on_backward_end(void *vctx, int status) {
  ddp_reducer *r = vctx;
  if (!r->armed || !r->sync || !r->hooks_fired) return status;
  if (status) {
    /* The backward failed: the peers' reductions cannot be matched; forget the iteration. */
    drain_works(r);
    reducer_reset_iteration(r);
    return status;
  }
  /* On a failure of the reduction itself the group is broken (pg.h): no more waiting. */
  int s = finalize_backward(r);
  if (r->unfinished) {
    r->armed = 0;
    return s;
  }
  reducer_reset_iteration(r);
  return s;
}

/* ---- public ------------------------------------------------------------------------------ */

static int check_params(ddp_tensor **params, int n, const ddp_pg *pg) {
  for (int i = 0; i < n; i++) {
    ddp_tensor *p = params[i];
    if (!p) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: parameter %d is NULL", i);
    DDP_TRY(ddp_check_alive(p, "DistributedDataParallel", "parameter"));
    if (!p->requires_grad || p->grad_fn)
      DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: parameter %d %s is not a leaf that requires "
               "grad", i, DDP_SHAPE(p));
    if (!ddp_dtype_is_floating(p->dtype))
      DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: parameter %d has dtype %s (floating dtypes "
               "only)", i, ddp_dtype_name(p->dtype));
    if (p->device != params[0]->device)
      DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: parameter %d is on %s but parameter 0 is on "
               "%s: parameters on several devices are not supported (one device per process, "
               "as PyTorch's DDP)", i, ddp_device_str(p->device),
               ddp_device_str(params[0]->device));
    if (pg && ddp_pg_device(pg) != DDP_DEVICE_CPU && p->device != ddp_pg_device(pg))
      DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: parameter %d is on %s but the %s process "
               "group of this rank works on %s (move the module there first)", i,
               ddp_device_str(p->device), ddp_pg_backend(pg), ddp_device_str(ddp_pg_device(pg)));
    for (int j = 0; j < i; j++)
      if (params[j] == p)
        DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: parameters %d and %d are the same tensor", j, i);
  }
  return DDP_OK;
}

int ddp_reducer_new(ddp_reducer **out, struct ddp_pg *pg, ddp_tensor **params, int n,
                    int64_t bucket_cap_bytes, int64_t first_bucket_cap_bytes,
                    int find_unused_parameters, int gradient_as_bucket_view, double timeout_s) {
  *out = NULL;
  if (n < 0) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: n must be >= 0, got %d", n);
  if (n > 0 && !params) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: params is NULL");
  if (bucket_cap_bytes <= 0 || first_bucket_cap_bytes <= 0)
    DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: bucket caps must be > 0 bytes, got %lld and "
             "%lld", (long long)bucket_cap_bytes, (long long)first_bucket_cap_bytes);
  DDP_TRY(check_params(params, n, pg));
  ddp_reducer *r = calloc(1, sizeof *r);
  if (!r) DDP_FAIL(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory");
  size_t m = (size_t)(n ? n : 1);
  r->pg = pg;
  r->rank = pg ? ddp_pg_rank(pg) : 0;
  r->world = pg ? ddp_pg_size(pg) : 1;
  r->device = n ? params[0]->device : DDP_DEVICE_CPU;
  r->comm_device = pg ? ddp_pg_device(pg) : DDP_DEVICE_CPU;
  r->n = n;
  r->cap = bucket_cap_bytes;
  r->first_cap = first_bucket_cap_bytes;
  r->find_unused = find_unused_parameters != 0;
  r->as_view = gradient_as_bucket_view != 0;
  r->timeout_s = timeout_s > 0 ? timeout_s : DEFAULT_TIMEOUT_S;
  r->sync = 1;
  r->overlap = 1;
  r->params = calloc(m, sizeof *r->params);
  r->hook_ctx = calloc(m, sizeof *r->hook_ctx);
  r->hook_handles = calloc(m, sizeof *r->hook_handles);
  r->bucket_of = calloc(m, sizeof(int));
  r->slot_of = calloc(m, sizeof(int));
  r->ready = calloc(m, 1);
  r->order = calloc(m, sizeof(int));
  r->unready = calloc(m, sizeof(int));
  int status = DDP_OK;
  if (!r->params || !r->hook_ctx || !r->hook_handles || !r->bucket_of || !r->slot_of ||
      !r->ready || !r->order || !r->unready) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory");
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    ddp_tensor_retain(params[i]);
    r->params[i] = params[i];
  }
  if (r->find_unused) {
    int64_t shape[1] = {n};
    if ((status = ddp_tensor_zeros(&r->local_used, 1, shape, DDP_I32, DDP_DEVICE_CPU))) goto fail;
  }
  bucket *bs;
  int nb;
  if ((status = buckets_build(r, NULL, &bs, &nb))) goto fail;
  if ((status = buckets_install(r, bs, nb))) goto fail;
  for (int i = 0; i < n; i++) {
    r->hook_ctx[i] = (hook_ctx){r, i};
    status = ddp_tensor_add_post_accumulate_hook(params[i], on_grad_ready, &r->hook_ctx[i],
                                                 &r->hook_handles[i]);
    if (status) {
      for (int j = 0; j < i; j++) ddp_tensor_remove_hook(params[j], r->hook_handles[j]);
      goto fail;
    }
  }
  if ((status = ddp_autograd_add_backward_end(on_backward_end, r, &r->end_handle))) {
    for (int j = 0; j < n; j++) ddp_tensor_remove_hook(params[j], r->hook_handles[j]);
    goto fail;
  }
  r->end_registered = 1;
  r->recording = !r->find_unused;
  reducer_reset_iteration(r);
  *out = r;
  return DDP_OK;
fail:
  r->n = 0; /* hooks are not registered (or were removed) */
  for (int i = 0; r->params && i < n; i++) ddp_tensor_release(r->params[i]);
  ddp_reducer_free(r);
  return status;
}

void ddp_reducer_free(ddp_reducer *r) {
  if (!r) return;
  /* Often a finalizer (ffi.gc), run wherever the collector ran: perhaps between a failing
   * call and its caller's ddp_last_error(). Removing hooks may set an error: the thread's
   * error is put back as it was at the end. */
  ddp_saved_error saved;
  ddp_error_save(&saved);
  if (r->end_registered) ddp_autograd_remove_backward_end(r->end_handle);
  for (int i = 0; i < r->n; i++) {
    if (ddp_tensor_is_alive(r->params[i]))
      ddp_tensor_remove_hook(r->params[i], r->hook_handles[i]);
    ddp_tensor_release(r->params[i]);
  }
  buckets_free(r->buckets, r->n_buckets);
  REDUCER_FOR_FEATURES(r, f)
    if (f->free) f->free(r);
  r->n_features = 0;
  if (r->used_work) ddp_work_free(r->used_work);
  ddp_tensor_release(r->used_dev);
  ddp_tensor_release(r->local_used);
  free(r->params);
  free(r->hook_ctx);
  free(r->hook_handles);
  free(r->bucket_of);
  free(r->slot_of);
  free(r->ready);
  free(r->order);
  free(r->unready);
  free(r->failure);
  reducer_stats_free(r);
  free(r);
  ddp_error_restore(&saved);
}

/* Note [bucket rebuild]. */
int reducer_rebuild_buckets(ddp_reducer *r) {
  r->rebuild_pending = 0;
  int n = r->n;
  int64_t shape[1] = {n};
  ddp_tensor *order_t;
  DDP_TRY(ddp_tensor_empty(&order_t, 1, shape, DDP_I64, DDP_DEVICE_CPU));
  int64_t *o = (int64_t *)ddp_data(order_t);
  for (int i = 0; i < n; i++) o[i] = r->order[i];
  int status = DDP_OK;
  if (r->pg && r->world > 1) ddp_pg_set_call_site("DistributedDataParallel bucket rebuild", 0);
  if (r->pg && r->world > 1 && r->comm_device != DDP_DEVICE_CPU) {
    /* nccl: through the group's device, waited for on the host (the host reads it). */
    ddp_tensor *dev = NULL;
    ddp_work *w = NULL;
    status = ddp_tensor_to_device(&dev, order_t, r->comm_device, 0);
    if (!status) status = ddp_pg_broadcast(&w, r->pg, dev, 0);
    if (!status) status = ddp_work_synchronize(w, r->timeout_s);
    if (!status) status = ddp_copy_(order_t, dev);
    ddp_work_free(w);
    ddp_tensor_release(dev);
    if (status)
      status = DDP_ERROR(status, "DistributedDataParallel: rank %d could not receive rank 0's "
                         "gradient order to rebuild the buckets: %s", r->rank, ddp_last_error());
  } else if (r->pg && r->world > 1) {
    status = ddp_pg_broadcast(NULL, r->pg, order_t, 0);
    if (status)
      status = DDP_ERROR(status, "DistributedDataParallel: rank %d could not receive rank 0's "
                         "gradient order to rebuild the buckets: %s", r->rank, ddp_last_error());
  }
  int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!status && !order) status = DDP_ERROR(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory");
  for (int i = 0; !status && i < n; i++) order[i] = (int)o[i];
  ddp_tensor_release(order_t);
  bucket *bs = NULL;
  int nb = 0;
  if (!status) status = buckets_build(r, order, &bs, &nb);
  free(order);
  if (!status) status = buckets_install(r, bs, nb);
  if (!status) {
    reducer_reset_iteration(r);
    r->has_rebuilt = 1;
  }
  return status;
}

int ddp_reducer_prepare_for_forward(ddp_reducer *r) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (r->unfinished) {
    char list[1024];
    size_t len = 0;
    list[0] = 0;
    for (int k = 0; k < r->n_unready && len + 24 < sizeof list; k++)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k ? " " : "", r->unready[k]);
    if (len + 24 >= sizeof list) snprintf(list + len, sizeof list - len, " ...");
    DDP_FAIL(DDP_ERR_STATE,
             "Expected to have finished reduction in the prior iteration before starting a new "
             "one. This error indicates that your module has parameters that were not used in "
             "producing loss. You can enable unused parameter detection by passing the keyword "
             "argument `find_unused_parameters = true` to DistributedDataParallel, and by making "
             "sure all `forward` function outputs participate in calculating loss. If you "
             "already have done the above, then the distributed data parallel module wasn't "
             "able to locate the output tensors in the return value of your module's `forward` "
             "function. Parameter indices which did not receive grad for rank %d: %s",
             r->rank, list);
  }
  if (r->rebuild_pending && ddp_grad_enabled()) DDP_TRY(reducer_rebuild_buckets(r));
  return DDP_OK;
}

int ddp_reducer_prepare_for_backward(ddp_reducer *r) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (r->unfinished) return ddp_reducer_prepare_for_forward(r);
  if (r->armed && r->hooks_fired) return DDP_OK; /* a backward is under way */
  reducer_reset_iteration(r);
  r->armed = 1;
  if (r->recording) r->n_order = 0;
  reducer_stats_backward_start(r);
  return DDP_OK;
}

void ddp_reducer_set_sync(ddp_reducer *r, int sync) {
  if (r) r->sync = sync != 0;
}

int ddp_reducer_get_sync(const ddp_reducer *r) { return r ? r->sync : 0; }

int ddp_reducer_set_overlap(ddp_reducer *r, int overlap) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (r->armed && r->hooks_fired)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: cannot change the bucket overlap while a "
             "backward is being reduced (rank %d)", r->rank);
  r->overlap = overlap != 0;
  return DDP_OK;
}

int ddp_reducer_get_overlap(const ddp_reducer *r) { return r ? r->overlap : 0; }

int ddp_reducer_num_buckets(const ddp_reducer *r) { return r ? r->n_buckets : 0; }

int ddp_reducer_bucket_params(const ddp_reducer *r, int k, int *out, int cap) {
  if (!r || k < 0 || k >= r->n_buckets) return -1;
  const bucket *b = &r->buckets[k];
  for (int s = 0; s < b->n_vars && s < cap; s++) out[s] = b->vars[s];
  return b->n_vars;
}

int64_t ddp_reducer_bucket_bytes(const ddp_reducer *r, int k) {
  if (!r || k < 0 || k >= r->n_buckets) return -1;
  return r->buckets[k].numel * (int64_t)ddp_dtype_size(r->buckets[k].dtype);
}

int ddp_reducer_has_rebuilt_buckets(const ddp_reducer *r) { return r ? r->has_rebuilt : 0; }

int ddp_reducer_ready_order(const ddp_reducer *r, int *out, int cap) {
  if (!r) return 0;
  for (int k = 0; k < r->n_order && k < cap; k++) out[k] = r->order[k];
  return r->n_order;
}

int ddp_reducer_unready_params(const ddp_reducer *r, int *out, int cap) {
  if (!r || !r->unfinished) return 0;
  for (int k = 0; k < r->n_unready && k < cap; k++) out[k] = r->unready[k];
  return r->n_unready;
}

int64_t ddp_reducer_num_iterations(const ddp_reducer *r) { return r ? r->iterations : 0; }

double ddp_reducer_last_wait_seconds(const ddp_reducer *r) { return r ? r->last_wait_s : 0.0; }
