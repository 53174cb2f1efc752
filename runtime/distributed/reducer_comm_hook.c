/* runtime/distributed/reducer_comm_hook.c: DDP communication hooks (ddplua/comm_hook.h, Note
 * [comm hooks]): registration, the built-in allreduce / fp16_compress / bf16_compress hooks and
 * the compress wrappers, and the front end's (Lua) hooks. After PyTorch's
 * Reducer::register_comm_hook and torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py
 * (allreduce_hook, fp16_compress_hook, bf16_compress_hook, fp16_compress_wrapper,
 * bf16_compress_wrapper). PowerSGD is comm_hook_powersgd.c. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/kernels.h"
#include "distributed/comm_hook_internal.h"

/* ---- registration ------------------------------------------------------------------------ */

static const ddp_reducer_feature comm_hook_feature;

int ddp_reducer_register_comm_hook(ddp_reducer *r, int kind, int wrap_dtype, struct ddp_pg *pg,
                                   ddp_powersgd_state *state) {
  if (!r) DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: reducer is NULL");
  if (r->comm_hook)
    DDP_FAIL(DDP_ERR_STATE, "register_comm_hook or register_builtin_comm_hook can only be called once.");
  if (r->iterations > 0 || (r->armed && r->hooks_fired) || r->unfinished)
    DDP_FAIL(DDP_ERR_STATE, "register_comm_hook: a communication hook must be registered before "
             "the first backward (this DDP module has already reduced gradients on rank %d)", r->rank);
  if (kind <= DDP_COMM_HOOK_NONE || kind >= DDP_COMM_HOOK_KIND_COUNT)
    DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: unknown hook kind %d", kind);
  if (wrap_dtype != -1 && wrap_dtype != DDP_F16 && wrap_dtype != DDP_BF16)
    DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: the compress wrappers cast to f16 or bf16, got "
             "dtype %d", wrap_dtype);
  if (wrap_dtype != -1 && kind == DDP_COMM_HOOK_FRONT_END)
    DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: a compress wrapper around a hook written in Lua "
             "runs in Lua (the C wrappers wrap built-in hooks only)");
  if ((kind == DDP_COMM_HOOK_POWER_SGD) != (state != NULL))
    DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: %s", state ? "only powerSGD_hook takes a "
             "PowerSGDState" : "powerSGD_hook needs a PowerSGDState");
  if (kind == DDP_COMM_HOOK_POWER_SGD) {
    if (r->device != DDP_DEVICE_CPU)
      DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: powerSGD_hook runs its matrix products on the "
               "host here; the module's parameters are on %s (use fp16_compress_hook or the "
               "allreduce hook on CUDA)", ddp_device_str(r->device));
    for (int k = 0; k < r->n_buckets; k++)
      if (r->buckets[k].dtype != DDP_F32 && r->buckets[k].dtype != DDP_F64)
        DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: powerSGD_hook needs f32 or f64 parameters, "
                 "gradient bucket %d holds %s", k, ddp_dtype_name(r->buckets[k].dtype));
  }
  if (pg && r->pg && ddp_pg_device(pg) != r->comm_device)
    DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: the hook's process group works on %s but the "
             "DDP module's on %s", ddp_device_str(ddp_pg_device(pg)), ddp_device_str(r->comm_device));
  struct reducer_comm_hook *h = calloc(1, sizeof *h);
  if (!h) DDP_FAIL(DDP_ERR_MEMORY, "register_comm_hook: out of memory");
  h->kind = kind;
  h->wrap_dtype = wrap_dtype;
  h->pg = pg ? pg : r->pg;
  h->world = h->pg ? ddp_pg_size(h->pg) : 1;
  h->psgd = state;
  if (state) powersgd_state_retain(state);
  r->comm_hook = h;
  int status = reducer_add_feature(r, &comm_hook_feature); /* Note [reducer features] */
  if (status) {
    if (state) ddp_powersgd_state_free(state);
    free(h);
    r->comm_hook = NULL;
  }
  return status;
}

int ddp_reducer_comm_hook_kind(const ddp_reducer *r) {
  return r && r->comm_hook ? r->comm_hook->kind : DDP_COMM_HOOK_NONE;
}

int64_t ddp_reducer_comm_hook_bytes(const ddp_reducer *r) {
  return r && r->comm_hook ? r->comm_hook->bytes : 0;
}

static void hook_bucket_clear(hook_bucket *hb) {
  if (hb->work) ddp_work_free(hb->work);
  ddp_tensor_release(hb->wire);
  ddp_tensor_release(hb->compressed);
  powersgd_flight_free(hb->psgd);
  memset(hb, 0, sizeof *hb);
}

void reducer_comm_hook_reset(ddp_reducer *r) {
  struct reducer_comm_hook *h = r->comm_hook;
  for (int k = 0; k < h->cap; k++) hook_bucket_clear(&h->hb[k]);
  h->next_handed = 0;
}

/* The comm hook feature's free (Note [reducer features]). */
static void comm_hook_free(ddp_reducer *r) {
  struct reducer_comm_hook *h = r->comm_hook;
  if (!h) return;
  reducer_comm_hook_reset(r);
  free(h->hb);
  ddp_powersgd_state_free(h->psgd);
  free(h);
  r->comm_hook = NULL;
}

/* The per-bucket entries cover every bucket (the count changes when buckets are rebuilt). */
static int ensure_cap(struct reducer_comm_hook *h, int n) {
  if (n <= h->cap) return DDP_OK;
  hook_bucket *hb = realloc(h->hb, sizeof *hb * (size_t)n);
  if (!hb) DDP_FAIL(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory (comm hook)");
  memset(hb + h->cap, 0, sizeof *hb * (size_t)(n - h->cap));
  h->hb = hb;
  h->cap = n;
  return DDP_OK;
}

/* ---- launching ----------------------------------------------------------------------------- */

/* The divisor of the built-in hooks: the hook group's size (PyTorch's), or the divisor set
 * with ddp_reducer_set_divide_factor when the hook communicates over the DDP module's group;
 * the front end sets one with a hook only under join with comm_hook_divide_by_non_joined
 * (Note [join divisor with a comm hook], lua/ddplua/distributed/ddp_join_hook.lua). */
static int hook_divisor(const ddp_reducer *r) {
  const struct reducer_comm_hook *h = r->comm_hook;
  return r->div_factor > 0 && h->pg == r->pg ? r->div_factor : h->world;
}

/* Start an asynchronous all-reduce (SUM) of t for bucket k; no group: nothing to do. */
static int hook_allreduce(ddp_reducer *r, int k, ddp_tensor *t, ddp_work **work) {
  struct reducer_comm_hook *h = r->comm_hook;
  *work = NULL;
  if (!h->pg) return DDP_OK;
  char site[80]; /* Note [collective fingerprints]: a mismatch names the bucket */
  snprintf(site, sizeof site, "DistributedDataParallel comm hook, gradient bucket %d", k);
  ddp_pg_set_call_site(site, 0);
  int status = ddp_pg_allreduce(work, h->pg, t, DDP_REDUCE_SUM);
  if (status) {
    *work = NULL;
    return DDP_ERROR(status, "DistributedDataParallel: could not launch the comm hook's all-reduce "
                     "of gradient bucket %d on rank %d: %s", k, r->rank, ddp_last_error());
  }
  h->bytes += t->numel * (int64_t)ddp_dtype_size(t->dtype);
  return DDP_OK;
}

/* fp16/bf16_compress_hook's compression of a host f32 tensor in one pass: *out (numel,) of
 * `dtype` = round(round(t) / world), the same two roundings as the ops path (t cast to the
 * narrow dtype, then divided through f32 as the CPU kernels do) without its generic loops.
 * Returns 0 (nothing done) for other devices or dtypes. */
static int compress_fast(ddp_tensor **out, const ddp_tensor *t, int dtype, int world, int *done) {
  *done = 0;
  if (t->device != DDP_DEVICE_CPU || t->dtype != DDP_F32 || !ddp_tensor_is_contiguous(t)) return DDP_OK;
  int64_t shape[1] = {t->numel};
  DDP_TRY(ddp_tensor_empty(out, 1, shape, dtype, DDP_DEVICE_CPU));
  /* Note [reduction entries]: x.to(dtype).div_(world) in one pass (f16: Note [f16 bulk
   * conversion]) */
  ddp_cpu_kernels.cast_scale(dtype, ddp_data(*out), DDP_F32, ddp_data(t), t->numel, (double)world, 1);
  *done = 1;
  return DDP_OK;
}

/* The decompression: t (f32, host) = c cast back; 0 (nothing done) where it does not apply. */
static int decompress_fast(ddp_tensor *t, const ddp_tensor *c) {
  if (t->device != DDP_DEVICE_CPU || c->device != DDP_DEVICE_CPU || t->dtype != DDP_F32 ||
      !ddp_tensor_is_contiguous(t) || (c->dtype != DDP_F16 && c->dtype != DDP_BF16))
    return 0;
  ddp_cpu_kernels.cast_scale(DDP_F32, ddp_data(t), c->dtype, ddp_data(c), t->numel, 1.0, 0);
  ddp_tensor_bump_version(t);
  return 1;
}

/* The inner (unwrapped) built-in hook on t, bucket k's buffer or its wrapper copy. */
static int launch_inner(ddp_reducer *r, int k, ddp_tensor *t) {
  struct reducer_comm_hook *h = r->comm_hook;
  hook_bucket *hb = &h->hb[k];
  switch (h->kind) {
  case DDP_COMM_HOOK_ALLREDUCE: /* default_hooks.allreduce_hook: divide, then sum */
    DDP_TRY(ddp_div_scalar_(t, (double)hook_divisor(r)));
    return hook_allreduce(r, k, t, &hb->work);
  case DDP_COMM_HOOK_FP16_COMPRESS:
  case DDP_COMM_HOOK_BF16_COMPRESS: { /* cast, divide in the narrow dtype, sum; cast back at wait */
    int dtype = h->kind == DDP_COMM_HOOK_FP16_COMPRESS ? DDP_F16 : DDP_BF16, done;
    DDP_TRY(compress_fast(&hb->compressed, t, dtype, hook_divisor(r), &done));
    if (done) return hook_allreduce(r, k, hb->compressed, &hb->work);
    DDP_TRY(ddp_to_dtype(&hb->compressed, t, dtype));
    if (hb->compressed == t) { /* already that dtype: to_dtype gave t itself */
      ddp_tensor_release(hb->compressed);
      DDP_TRY(ddp_clone(&hb->compressed, t));
    }
    DDP_TRY(ddp_div_scalar_(hb->compressed, (double)hook_divisor(r)));
    return hook_allreduce(r, k, hb->compressed, &hb->work);
  }
  case DDP_COMM_HOOK_POWER_SGD:
    return powersgd_launch(h->psgd, r, k, t, h->pg, hook_divisor(r), &hb->psgd, &h->bytes);
  default:
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: comm hook kind %d has no launch", h->kind);
  }
}

int reducer_comm_hook_launch_on(ddp_reducer *r, int k, ddp_tensor *t) {
  struct reducer_comm_hook *h = r->comm_hook;
  DDP_TRY(ensure_cap(h, r->n_buckets));
  if (h->kind == DDP_COMM_HOOK_FRONT_END) return DDP_OK; /* queued: ddp_reducer_comm_hook_next */
  if (h->wrap_dtype >= 0) { /* fp16/bf16_compress_wrapper: the inner hook sees the cast copy */
    hook_bucket *hb = &h->hb[k];
    ddp_tensor *src = t;
    DDP_TRY(ddp_to_dtype(&hb->wire, src, h->wrap_dtype));
    if (hb->wire == src) {
      ddp_tensor_release(hb->wire);
      DDP_TRY(ddp_clone(&hb->wire, src));
    }
    t = hb->wire;
  }
  return launch_inner(r, k, t);
}

/* The comm hook feature's bucket_launch: the hook launches bucket k (Note [comm hooks]). */
static int comm_hook_launch(ddp_reducer *r, int k, int *taken) {
  *taken = 1;
  return reducer_comm_hook_launch_on(r, k, r->buckets[k].buffer);
}

/* ---- waiting (finalize_backward) ----------------------------------------------------------- */

int comm_hook_wait_work(ddp_reducer *r, ddp_pg *pg, int k, ddp_work *w, const char *what) {
  if (!w) return DDP_OK;
  int status = ddp_work_wait(w, r->timeout_s);
  if (status) {
    const char *cause = pg && ddp_pg_error(pg)[0] ? ddp_pg_error(pg) : ddp_last_error();
    bucket *b = &r->buckets[k];
    return DDP_ERROR(status, "DistributedDataParallel: the comm hook's %s of gradient bucket %d "
                     "(%d parameters, %lld bytes) failed on rank %d: %s", what, k, b->n_vars,
                     (long long)(b->numel * (int64_t)ddp_dtype_size(b->dtype)), r->rank, cause);
  }
  return DDP_OK;
}

static int wait_inner(ddp_reducer *r, int k, ddp_tensor *t) {
  struct reducer_comm_hook *h = r->comm_hook;
  hook_bucket *hb = &h->hb[k];
  switch (h->kind) {
  case DDP_COMM_HOOK_ALLREDUCE:
    return comm_hook_wait_work(r, h->pg, k, hb->work, "all-reduce");
  case DDP_COMM_HOOK_FP16_COMPRESS:
  case DDP_COMM_HOOK_BF16_COMPRESS:
    DDP_TRY(comm_hook_wait_work(r, h->pg, k, hb->work, "all-reduce"));
    if (decompress_fast(t, hb->compressed)) return DDP_OK;
    return ddp_copy_(t, hb->compressed); /* decompress: cast back into the bucket */
  case DDP_COMM_HOOK_POWER_SGD:
    return powersgd_finish(h->psgd, r, k, t, h->pg, hook_divisor(r), hb->psgd, &h->bytes);
  default:
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: comm hook kind %d has no wait", h->kind);
  }
}

int reducer_comm_hook_wait_on(ddp_reducer *r, int k, ddp_tensor *t) {
  struct reducer_comm_hook *h = r->comm_hook;
  DDP_TRY(ensure_cap(h, r->n_buckets));
  hook_bucket *hb = &h->hb[k];
  if (h->kind == DDP_COMM_HOOK_FRONT_END) {
    if (!hb->has_result)
      DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: the communication hook gave no value for "
               "gradient bucket %d on rank %d before the end of backward (a hook written in Lua "
               "runs when its bucket is launched, and its future is waited for after the last "
               "bucket; with find_unused_parameters some buckets complete only at the end of "
               "backward, where Lua cannot run: use a built-in hook there)", k, r->rank);
  } else {
    DDP_TRY(wait_inner(r, k, h->wrap_dtype >= 0 ? hb->wire : t));
    if (h->wrap_dtype >= 0 && !decompress_fast(t, hb->wire))
      DDP_TRY(ddp_copy_(t, hb->wire)); /* the wrapper's decompress */
  }
  if (k == r->n_buckets - 1 && h->psgd) powersgd_state_next_iter(h->psgd);
  return DDP_OK;
}

/* The comm hook feature's bucket_wait: the hook's works of bucket k, then its result in the
 * bucket (Note [comm hooks]). */
static int comm_hook_wait(ddp_reducer *r, int k, int *taken) {
  *taken = 1;
  if (!r->buckets[k].launched) return DDP_OK;
  return reducer_comm_hook_wait_on(r, k, r->buckets[k].buffer);
}

/* The comm hook feature's grad_divisor: the hook divides itself, so the slots take the
 * gradients as they are (Note [gradient averaging]). */
static int comm_hook_divisor(const ddp_reducer *r) { return 1; }

/* Note [reducer features]: a comm hook owns the buckets' communication. */
static const ddp_reducer_feature comm_hook_feature = {
    .name = "comm_hook",
    .order = 10,
    .prepare_backward = reducer_comm_hook_reset,
    .grad_divisor = comm_hook_divisor,
    .bucket_launch = comm_hook_launch,
    .bucket_wait = comm_hook_wait,
    .free = comm_hook_free,
};

/* ---- the front end's hooks ----------------------------------------------------------------- */

int ddp_reducer_comm_hook_next(ddp_reducer *r) {
  if (!r || !r->comm_hook || r->comm_hook->kind != DDP_COMM_HOOK_FRONT_END) return -1;
  if (!r->armed || !r->sync) return -1;
  struct reducer_comm_hook *h = r->comm_hook;
  if (h->next_handed >= r->next_bucket) return -1;
  return h->next_handed++;
}

int ddp_reducer_bucket_is_last(const ddp_reducer *r, int k) {
  return r && k == r->n_buckets - 1;
}

int ddp_reducer_bucket_buffer(const ddp_reducer *r, int k, ddp_tensor **out) {
  *out = NULL;
  if (!r || k < 0 || k >= r->n_buckets)
    DDP_FAIL(DDP_ERR_ARG, "GradBucket: bucket %d out of range (%d buckets)", k, r ? r->n_buckets : 0);
  ddp_tensor_retain(r->buckets[k].buffer);
  *out = r->buckets[k].buffer;
  return DDP_OK;
}

int ddp_reducer_bucket_view(const ddp_reducer *r, int k, int s, ddp_tensor **out) {
  *out = NULL;
  if (!r || k < 0 || k >= r->n_buckets || s < 0 || s >= r->buckets[k].n_vars)
    DDP_FAIL(DDP_ERR_ARG, "GradBucket: bucket %d slot %d out of range", k, s);
  ddp_tensor_retain(r->buckets[k].views[s]);
  *out = r->buckets[k].views[s];
  return DDP_OK;
}

int ddp_reducer_comm_hook_set_result(ddp_reducer *r, int k, ddp_tensor *value) {
  if (!r || !r->comm_hook || r->comm_hook->kind != DDP_COMM_HOOK_FRONT_END)
    DDP_FAIL(DDP_ERR_STATE, "register_comm_hook: no hook written in Lua is registered");
  struct reducer_comm_hook *h = r->comm_hook;
  if (k < 0 || k >= h->next_handed || k >= r->n_buckets)
    DDP_FAIL(DDP_ERR_STATE, "register_comm_hook: gradient bucket %d was not handed to the hook in "
             "this backward", k);
  DDP_TRY(ensure_cap(h, r->n_buckets));
  if (h->hb[k].has_result)
    DDP_FAIL(DDP_ERR_STATE, "register_comm_hook: gradient bucket %d already has its value", k);
  if (!value) DDP_FAIL(DDP_ERR_ARG, "expected the hook result is either a Tensor or a TensorList found nil");
  DDP_TRY(ddp_check_alive(value, "register_comm_hook", "the future's value"));
  bucket *b = &r->buckets[k];
  if (value->ndim != 1 || value->shape[0] != b->numel)
    DDP_FAIL(DDP_ERR_ARG, "register_comm_hook: the hook's future for gradient bucket %d has a value "
             "of shape %s, but the bucket's buffer has shape (%lld,) (a hook must return a future "
             "of the reduced bucket buffer)", k, DDP_SHAPE(value), (long long)b->numel);
  if (value != b->buffer) DDP_TRY(ddp_copy_(b->buffer, value));
  h->hb[k].has_result = 1;
  return DDP_OK;
}
