/* runtime/distributed/reducer_join.c: the reducer's side of uneven inputs (ddplua/reducer_join.h,
 * Note [join shadow iteration]): a settable gradient divisor, and on a joined rank the
 * collectives that shadow the non-joined ranks' backward and bucket rebuild. After PyTorch's
 * DistributedDataParallel._match_all_reduce_for_bwd_pass and _match_unused_params_allreduce
 * (torch/nn/parallel/distributed.py) and the c10d Reducer's push_rebuilt_params_for_all_indices. */
#include <stdio.h>
#include <stdlib.h>

#include "distributed/comm_hook_internal.h"

/* The join feature's grad_divisor: the divisor set (the non-joined ranks), 0 (no answer)
 * while none is. */
static int join_divisor(const ddp_reducer *r) { return r->div_factor; }

/* Note [reducer features]: uneven inputs change what the gradients are divided by; the
 * shadow iteration of a joined rank runs outside backward (ddp_reducer_join_shadow_backward). */
static const ddp_reducer_feature join_feature = {
    .name = "join",
    .order = 20,
    .grad_divisor = join_divisor,
};

int ddp_reducer_set_divide_factor(ddp_reducer *r, int div_factor) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (div_factor < 0 || div_factor > r->world)
    DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: the gradient divisor must be between 1 and "
             "the world size %d (0: the world size), got %d", r->world, div_factor);
  DDP_TRY(reducer_add_feature(r, &join_feature));
  r->div_factor = div_factor;
  return DDP_OK;
}

int ddp_reducer_get_divide_factor(const ddp_reducer *r) { return r ? r->div_factor : 0; }

int ddp_reducer_join_rebuild_buckets(ddp_reducer *r, int *rebuilt) {
  if (rebuilt) *rebuilt = 0;
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (!r->rebuild_pending) return DDP_OK;
  DDP_TRY(reducer_rebuild_buckets(r));
  if (rebuilt) *rebuilt = 1;
  return DDP_OK;
}

/* A joined rank that never finished a synchronised iteration recorded no ready order: it
 * takes the registration order, so it rebuilds with the others (and, as rank 0, gives them
 * that order). PyTorch's push_rebuilt_params_for_all_indices. */
static void push_all_rebuilt_params(ddp_reducer *r) {
  if (!r->recording || r->find_unused || r->has_rebuilt || r->rebuild_pending) return;
  for (int i = 0; i < r->n; i++) r->order[i] = i;
  r->n_order = r->n;
  r->recording = 0;
  r->rebuild_pending = 1;
}

/* Wait for the shadow all-reduce `w` of `what`, blocking the host (bounded by the timeout). */
static int shadow_wait(ddp_reducer *r, ddp_work *w, const char *what) {
  if (!w) return DDP_OK;
  int status = ddp_work_synchronize(w, r->timeout_s);
  if (status) {
    const char *cause = ddp_pg_error(r->pg)[0] ? ddp_pg_error(r->pg) : ddp_last_error();
    return DDP_ERROR(status, "DistributedDataParallel: the join shadow all-reduce of %s failed "
                     "on joined rank %d: %s", what, r->rank, cause);
  }
  return DDP_OK;
}

int ddp_reducer_join_shadow_backward(ddp_reducer *r) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: reducer is NULL");
  if (r->armed && r->hooks_fired)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: rank %d cannot shadow the other ranks' "
             "backward (join) while its own backward is under way", r->rank);
  if (!r->pg || r->world == 1) {
    push_all_rebuilt_params(r);
    return DDP_OK;
  }
  int nb = r->n_buckets;
  struct reducer_comm_hook *h = r->comm_hook;
  int front_end = h && h->kind == DDP_COMM_HOOK_FRONT_END;
  ddp_tensor **zeros = calloc((size_t)(nb + 1), sizeof *zeros);
  ddp_work **works = calloc((size_t)(nb + 1), sizeof *works);
  ddp_tensor *flags = NULL;
  ddp_work *flags_work = NULL;
  int status = DDP_OK;
  if (!zeros || !works) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory shadowing the "
                       "backward (join)");
    goto done;
  }
  /* Note [join shadow with a comm hook]: what the non-joined ranks' hook launches per
   * bucket, on zeros; a hook written in the front end ran its collectives before this call. */
  /* Note [bucket order]: launched in index order, as the non-joined ranks launch theirs. */
  for (int k = 0; k < nb && !status && !front_end; k++) {
    bucket *b = &r->buckets[k];
    int64_t shape[1] = {b->numel};
    status = ddp_tensor_zeros(&zeros[k], 1, shape, b->dtype, r->device);
    if (status) break;
    if (h) {
      status = reducer_comm_hook_launch_on(r, k, zeros[k]);
      if (status)
        status = DDP_ERROR(status, "DistributedDataParallel: joined rank %d could not run the "
                           "communication hook on zero gradient bucket %d: %s", r->rank, k,
                           ddp_last_error());
      continue;
    }
    char site[64]; /* the label of the real bucket's all-reduce (reducer_bucket_launch) */
    snprintf(site, sizeof site, "DistributedDataParallel gradient bucket %d", k);
    ddp_pg_set_call_site(site, 0);
    status = ddp_pg_allreduce(&works[k], r->pg, zeros[k], DDP_REDUCE_SUM);
    if (status) {
      works[k] = NULL;
      status = DDP_ERROR(status, "DistributedDataParallel: joined rank %d could not launch the "
                         "shadow all-reduce of gradient bucket %d: %s", r->rank, k, ddp_last_error());
    }
  }
  if (!status && r->find_unused) {
    /* finalize_backward's used-parameter flags, after every bucket; nccl reduces device
     * memory only. */
    int64_t shape[1] = {r->n};
    status = ddp_tensor_zeros(&flags, 1, shape, DDP_I32, r->comm_device);
    if (!status) {
      ddp_pg_set_call_site("DistributedDataParallel unused-parameter flags", 0);
      status = ddp_pg_allreduce(&flags_work, r->pg, flags, DDP_REDUCE_SUM);
      if (status) flags_work = NULL;
    }
  }
  /* Wait for everything launched, even after a failure: the buffers are freed below. The
   * hook's waits run its second rounds (PowerSGD's Q) in bucket order, after the flags, as
   * finalize_backward does; after a failure the reset below waits its works out. */
  for (int k = 0; k < nb; k++) {
    if (h && !front_end) {
      if (!status) status = reducer_comm_hook_wait_on(r, k, zeros[k]);
      continue;
    }
    char what[48];
    snprintf(what, sizeof what, "gradient bucket %d", k);
    int s = shadow_wait(r, works[k], what);
    if (!status) status = s;
  }
  int s = shadow_wait(r, flags_work, "the used-parameter flags");
  if (!status) status = s;
  if (!status) push_all_rebuilt_params(r);
done:
  if (h) reducer_comm_hook_reset(r);
  for (int k = 0; works && k < nb; k++) ddp_work_free(works[k]);
  for (int k = 0; zeros && k < nb; k++) ddp_tensor_release(zeros[k]);
  ddp_work_free(flags_work);
  ddp_tensor_release(flags);
  free(works);
  free(zeros);
  return status;
}
