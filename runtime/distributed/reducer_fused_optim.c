/* runtime/distributed/reducer_fused_optim.c: the optimizer in backward of the reducer (Note
 * [optimizer in backward] in ddplua/reducer_fused_optim.h), after PyTorch's
 * DistributedDataParallel._register_fused_optim (its optimizer_overlap_hooks.py
 * _hook_then_optimizer: all-reduce a bucket, then step that bucket's parameters). A reducer
 * feature (Note [reducer features] in reducer_internal.h): reducer.c reaches it through
 * fused_optim_feature only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distributed/reducer_internal.h"

struct reducer_fused_optim {
  ddp_fused_optim_config cfg;
  ddp_optim_state *state;      /* keyed by r->params[i] (Note [optimizer state store]) */
  uint8_t *stepped;            /* per bucket: stepped in this iteration */
  int n_stepped_cap;
  int64_t during_backward, at_end;
};

static const ddp_reducer_feature fused_optim_feature;

/* The step function's config of the (checked) fused config c. */
static ddp_optim_config step_config(const ddp_fused_optim_config *c) {
  ddp_optim_config o = {
      .kind = c->kind == DDP_FUSED_OPTIM_SGD ? DDP_OPTIM_SGD
              : c->kind == DDP_FUSED_OPTIM_ADAM ? DDP_OPTIM_ADAM : DDP_OPTIM_ADAMW,
      .lr = c->lr, .momentum = c->momentum, .dampening = c->dampening,
      .weight_decay = c->weight_decay, .nesterov = c->nesterov, .maximize = c->maximize,
      .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps, .amsgrad = c->amsgrad};
  return o;
}

static int check_config(const ddp_fused_optim_config *c) {
  const char *op = "DistributedDataParallel._register_fused_optim";
  if (c->kind != DDP_FUSED_OPTIM_SGD && c->kind != DDP_FUSED_OPTIM_ADAM && c->kind != DDP_FUSED_OPTIM_ADAMW)
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown optimizer kind %d (SGD %d, Adam %d, AdamW %d)", op,
             c->kind, DDP_FUSED_OPTIM_SGD, DDP_FUSED_OPTIM_ADAM, DDP_FUSED_OPTIM_ADAMW);
  if (!(c->lr >= 0)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid lr %g (must be >= 0)", op, c->lr);
  if (!(c->weight_decay >= 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid weight_decay %g (must be >= 0)", op, c->weight_decay);
  if (c->kind == DDP_FUSED_OPTIM_SGD) {
    if (!(c->momentum >= 0)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid momentum %g (must be >= 0)", op, c->momentum);
    if (!isfinite(c->dampening)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid dampening %g", op, c->dampening);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
      DDP_FAIL(DDP_ERR_ARG, "%s: nesterov momentum requires a momentum > 0 and zero dampening "
               "(momentum %g, dampening %g)", op, c->momentum, c->dampening);
    return DDP_OK;
  }
  if (!(c->eps >= 0)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid eps %g (must be >= 0)", op, c->eps);
  if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid betas (%g, %g) (betas must be in [0, 1))", op, c->beta1, c->beta2);
  return DDP_OK;
}

int ddp_reducer_register_fused_optim(ddp_reducer *r, const ddp_fused_optim_config *cfg) {
  if (!r || !cfg) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel._register_fused_optim: NULL argument");
  if (r->fused_optim)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel._register_fused_optim: an optimizer in "
             "backward is already registered on rank %d (register one, once)", r->rank);
  if (r->iterations > 0 || (r->armed && r->hooks_fired) || r->unfinished)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel._register_fused_optim: register the "
             "optimizer before the first backward (rank %d has reduced %lld iterations)",
             r->rank, (long long)r->iterations);
  DDP_TRY(check_config(cfg));
  struct reducer_fused_optim *f = calloc(1, sizeof *f);
  if (!f || ddp_optim_state_new(&f->state)) {
    free(f);
    DDP_FAIL(DDP_ERR_MEMORY, "DistributedDataParallel._register_fused_optim: out of memory");
  }
  f->cfg = *cfg;
  int status = reducer_add_feature(r, &fused_optim_feature); /* Note [reducer features] */
  if (status) {
    ddp_optim_state_free(f->state);
    free(f);
    return status;
  }
  r->fused_optim = f;
  return DDP_OK;
}

int ddp_reducer_has_fused_optim(const ddp_reducer *r) { return r && r->fused_optim; }

int ddp_reducer_fused_optim_set_lr(ddp_reducer *r, double lr) {
  if (!r || !r->fused_optim)
    DDP_FAIL(DDP_ERR_STATE, "DistributedDataParallel: no optimizer in backward is registered");
  if (!(lr >= 0)) DDP_FAIL(DDP_ERR_ARG, "DistributedDataParallel: invalid lr %g (must be >= 0)", lr);
  r->fused_optim->cfg.lr = lr;
  return DDP_OK;
}

void ddp_reducer_fused_optim_counts(const ddp_reducer *r, int64_t *during_backward, int64_t *at_end) {
  const struct reducer_fused_optim *f = r ? r->fused_optim : NULL;
  if (during_backward) *during_backward = f ? f->during_backward : 0;
  if (at_end) *at_end = f ? f->at_end : 0;
}

/* ---- the state, read and replaced between iterations (the state_dict's C side) ---- */

/* The checks every state accessor makes: a registered optimizer, i in range, and (write)
 * no backward under way. */
static int check_access(const ddp_reducer *r, int i, const void *arg, int write, const char *op) {
  if (!r || !arg) DDP_FAIL(DDP_ERR_ARG, "%s: NULL argument", op);
  if (!r->fused_optim) DDP_FAIL(DDP_ERR_STATE, "%s: no optimizer in backward is registered", op);
  if (i < 0 || i >= r->n)
    DDP_FAIL(DDP_ERR_ARG, "%s: parameter %d out of range (the reducer has %d parameters)", op, i, r->n);
  if (write && ((r->armed && r->hooks_fired) || r->unfinished))
    DDP_FAIL(DDP_ERR_STATE, "%s: a backward is under way on rank %d (change the state between "
             "iterations)", op, r->rank);
  return DDP_OK;
}

/* "(2, 3)" for a shape, into buf. */
static const char *shape_text(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t at = (size_t)snprintf(buf, cap, "(");
  for (int d = 0; d < ndim && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (at < cap) snprintf(buf + at, cap - at, ")");
  return buf;
}

int ddp_reducer_fused_optim_configure(ddp_reducer *r, const ddp_fused_optim_config *cfg) {
  const char *op = "DistributedDataParallel.fused_optim_load_state_dict";
  DDP_TRY(check_access(r, 0, cfg, 1, op));
  if (cfg->kind != r->fused_optim->cfg.kind)
    DDP_FAIL(DDP_ERR_ARG, "%s: optimizer kind %d differs from the registered one (%d)", op,
             cfg->kind, r->fused_optim->cfg.kind);
  DDP_TRY(check_config(cfg));
  r->fused_optim->cfg = *cfg;
  return DDP_OK;
}

ddp_optim_state *ddp_reducer_fused_optim_state(ddp_reducer *r) {
  return r && r->fused_optim ? r->fused_optim->state : NULL;
}

int ddp_reducer_fused_optim_load_state(ddp_reducer *r, const ddp_optim_state *src) {
  const char *op = "DistributedDataParallel.fused_optim_load_state_dict";
  DDP_TRY(check_access(r, 0, src, 1, op));
  /* every tensor checked before anything changes */
  for (int i = 0; i < r->n; i++) {
    const ddp_tensor *p = r->params[i];
    int n = 0;
    DDP_TRY(ddp_optim_state_name_count(src, p, &n));
    for (int j = 0; j < n; j++) {
      const char *name;
      int kind;
      DDP_TRY(ddp_optim_state_name_at(src, p, j, &name, &kind));
      if (kind != DDP_OPTIM_STATE_TENSOR) continue;
      ddp_tensor *t = NULL;
      DDP_TRY(ddp_optim_state_get_tensor(src, p, name, &t));
      int same = t->ndim == p->ndim && t->dtype == p->dtype && t->device == p->device;
      for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
      if (!same) {
        char a[160], b[160];
        ddp_fail_at(__FILE__, __LINE__, DDP_ERR_ARG, "%s: state '%s' of parameter %d is %s %s "
                    "on device %d, the parameter %s %s on device %d", op, name, i,
                    shape_text(a, sizeof a, t->ndim, t->shape), ddp_dtype_name(t->dtype),
                    t->device, shape_text(b, sizeof b, p->ndim, p->shape),
                    ddp_dtype_name(p->dtype), p->device);
        ddp_tensor_release(t);
        return DDP_ERR_ARG;
      }
      ddp_tensor_release(t);
    }
  }
  for (int i = 0; i < r->n; i++)
    DDP_TRY(ddp_optim_state_copy_entry(r->fused_optim->state, src, r->params[i]));
  return DDP_OK;
}

/* One update of parameter i with gradient g (its bucket slot): the Lua optimizers' step
 * function over the reducer's store (Note [optimizer state store]). */
static int step_param(ddp_reducer *r, int i, ddp_tensor *g) {
  struct reducer_fused_optim *f = r->fused_optim;
  ddp_optim_config c = step_config(&f->cfg);
  return ddp_optim_step_param(f->state, &c, r->params[i], g);
}

/* Step every parameter of bucket k (whose all-reduce is complete), skipping the parameters
 * unused on every rank when the used flags are known (Note [unused parameters]). */
static int step_bucket(ddp_reducer *r, int k) {
  bucket *b = &r->buckets[k];
  const int32_t *used = r->local_used ? (const int32_t *)ddp_data(r->local_used) : NULL;
  for (int s = 0; s < b->n_vars; s++) {
    int i = b->vars[s];
    if (used && used[i] == 0) continue;
    int status = step_param(r, i, b->views[s]);
    if (status)
      return DDP_ERROR(status, "DistributedDataParallel: the optimizer step in backward of parameter "
                       "%d (gradient bucket %d) failed on rank %d: %s", i, k, r->rank, ddp_last_error());
  }
  r->fused_optim->stepped[k] = 1;
  return DDP_OK;
}

/* Per-bucket flags sized for the current buckets (they change once, at the rebuild). */
static int ensure_flags(ddp_reducer *r) {
  struct reducer_fused_optim *f = r->fused_optim;
  if (f->n_stepped_cap >= r->n_buckets) return DDP_OK;
  uint8_t *grown = realloc(f->stepped, (size_t)r->n_buckets);
  if (!grown) DDP_FAIL(DDP_ERR_MEMORY, "DistributedDataParallel: out of memory");
  memset(grown + f->n_stepped_cap, 0, (size_t)(r->n_buckets - f->n_stepped_cap));
  f->stepped = grown;
  f->n_stepped_cap = r->n_buckets;
  return DDP_OK;
}

/* The feature's bucket_ready, after buckets were launched (reducer_launch_ready_buckets):
 * step the launched buckets
 * whose all-reduce has completed, in index order, stopping at the first one still running
 * (never blocking). Not while the used flags are still to be all-reduced. */
static int fused_optim_poll(ddp_reducer *r) {
  if (r->find_unused) return DDP_OK; /* global usage unknown until finalize */
  /* A comm hook keeps its own works (Note [comm hooks]): b->work stays NULL, so "completed"
   * cannot be told here; its buckets are reduced by finalize's waits and stepped after them. */
  if (r->comm_hook) return DDP_OK;
  DDP_TRY(ensure_flags(r));
  struct reducer_fused_optim *f = r->fused_optim;
  for (int k = 0; k < r->next_bucket; k++) {
    if (f->stepped[k]) continue;
    bucket *b = &r->buckets[k];
    if (b->work && !ddp_work_is_completed(b->work)) break;
    if (b->work) DDP_TRY(reducer_bucket_wait(r, k)); /* completed: its status, no blocking */
    DDP_TRY(step_bucket(r, k));
    f->during_backward++;
  }
  return DDP_OK;
}

/* The feature's finalize_backward, after every bucket's wait and the used flags: step the
 * buckets not stepped yet; it takes the buckets (no reducer_copy_back into .grad). */
static int fused_optim_finalize(ddp_reducer *r, int *taken) {
  *taken = 1;
  DDP_TRY(ensure_flags(r));
  struct reducer_fused_optim *f = r->fused_optim;
  int status = DDP_OK;
  for (int k = 0; k < r->n_buckets && !status; k++) {
    if (f->stepped[k]) continue;
    status = step_bucket(r, k);
    if (!status) f->at_end++;
  }
  return status;
}

/* The feature's prepare_backward, a new iteration (reducer_reset_iteration): no bucket
 * stepped yet (also after a backward that failed half-way). */
static void fused_optim_reset(ddp_reducer *r) {
  struct reducer_fused_optim *f = r->fused_optim;
  if (f->stepped) memset(f->stepped, 0, (size_t)f->n_stepped_cap);
}

/* The feature's on_slot_filled: a used parameter's gradient is in its slot, so its .grad
 * goes (the model's .grad tensors never exist together, Note [optimizer in backward]). */
static int fused_optim_slot_filled(ddp_reducer *r, int i, int used) {
  return used ? ddp_tensor_set_grad(r->params[i], NULL) : DDP_OK;
}

/* The feature's free: the state tensors and the flags. */
static void fused_optim_free(ddp_reducer *r) {
  struct reducer_fused_optim *f = r->fused_optim;
  if (!f) return;
  ddp_optim_state_free(f->state);
  free(f->stepped);
  free(f);
  r->fused_optim = NULL;
}

/* Note [reducer features]: the optimizer in backward steps each bucket once reduced. */
static const ddp_reducer_feature fused_optim_feature = {
    .name = "optimizer_in_backward",
    .order = 40,
    .prepare_backward = fused_optim_reset,
    .on_slot_filled = fused_optim_slot_filled,
    .bucket_ready = fused_optim_poll,
    .finalize_backward = fused_optim_finalize,
    .free = fused_optim_free,
};
