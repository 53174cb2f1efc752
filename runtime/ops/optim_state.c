/* runtime/ops/optim_state.c: the optimizer-state store (Note [optimizer state store] in
 * ddplua/optim_state.h) and the per-parameter step over it, which runs the fused updates of
 * runtime/ops/optim.c (ddp_sgd_step_, ddp_adam_step_, ddp_adamw_step_, ddp_adadelta_step_,
 * ddp_sgd_step_foreach_) with the state the store holds.
 *
 * Layout: entries in a dense array (creation order, what iteration gives), found through an
 * open-addressing hash table of entry indices keyed by the parameter's address (linear
 * probing, at most half full, rebuilt whole when an entry is removed: removals are rare,
 * lookups are on every step). An entry's values are a small array searched by name (an
 * optimizer keeps at most four). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

typedef struct {
  char name[DDP_OPTIM_STATE_NAME_MAX + 1];
  int kind;          /* enum ddp_optim_state_kind, never NONE */
  ddp_tensor *t;     /* DDP_OPTIM_STATE_TENSOR: a held reference */
  double v;          /* NUMBER, BOOLEAN (0 / 1) */
} state_value;

typedef struct {
  ddp_tensor *param; /* a held reference (Note [optimizer state store]) */
  state_value *values;
  int n, cap;
} state_entry;

struct ddp_optim_state {
  state_entry *entries;
  int64_t n, cap;
  int64_t *slots;    /* hash table of entry indices, -1 empty; n_slots a power of two */
  int64_t n_slots;
};

/* ---- entries and the hash table ----------------------------------------------------------- */

static uint64_t hash_ptr(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

/* The index of param's entry, or -1. */
static int64_t find(const ddp_optim_state *s, const ddp_tensor *param) {
  if (!s->n_slots) return -1;
  uint64_t mask = (uint64_t)s->n_slots - 1;
  for (uint64_t h = hash_ptr(param) & mask;; h = (h + 1) & mask) {
    int64_t e = s->slots[h];
    if (e < 0) return -1;
    if (s->entries[e].param == param) return e;
  }
}

static void slot_insert(ddp_optim_state *s, int64_t e) {
  uint64_t mask = (uint64_t)s->n_slots - 1;
  uint64_t h = hash_ptr(s->entries[e].param) & mask;
  while (s->slots[h] >= 0) h = (h + 1) & mask;
  s->slots[h] = e;
}

/* A hash table of n_slots slots (a power of two > 2 * n) holding every entry. */
static int rehash(ddp_optim_state *s, int64_t n_slots) {
  int64_t *slots = malloc(sizeof(int64_t) * (size_t)n_slots);
  if (!slots) DDP_FAIL(DDP_ERR_MEMORY, "optim_state: out of memory");
  free(s->slots);
  s->slots = slots;
  s->n_slots = n_slots;
  for (int64_t i = 0; i < n_slots; i++) slots[i] = -1;
  for (int64_t e = 0; e < s->n; e++) slot_insert(s, e);
  return DDP_OK;
}

static void entry_release(state_entry *en) {
  for (int j = 0; j < en->n; j++) ddp_tensor_release(en->values[j].t);
  free(en->values);
  ddp_tensor_release(en->param);
  memset(en, 0, sizeof *en);
}

/* The index of param's entry, created (empty) when missing, or -1 with the error set. */
static int64_t find_or_add(ddp_optim_state *s, ddp_tensor *param, const char *op) {
  int64_t e = find(s, param);
  if (e >= 0) return e;
  if (ddp_check_alive(param, op, "param")) return -1;
  if (s->n == s->cap) {
    int64_t cap = s->cap ? 2 * s->cap : 16;
    state_entry *grown = realloc(s->entries, sizeof *grown * (size_t)cap);
    if (!grown) {
      DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory for %lld entries", op, (long long)cap);
      return -1;
    }
    s->entries = grown;
    s->cap = cap;
  }
  if (2 * (s->n + 1) > s->n_slots && rehash(s, s->n_slots ? 2 * s->n_slots : 32)) return -1;
  e = s->n++;
  memset(&s->entries[e], 0, sizeof s->entries[e]);
  ddp_tensor_retain(param);
  s->entries[e].param = param;
  slot_insert(s, e);
  return e;
}

static state_value *value_find(const state_entry *en, const char *name) {
  for (int j = 0; j < en->n; j++)
    if (strcmp(en->values[j].name, name) == 0) return &en->values[j];
  return NULL;
}

/* The value `name` of param's entry (both created when missing), or NULL with the error set. */
static state_value *value_for_write(ddp_optim_state *s, ddp_tensor *param, const char *name,
                                    const char *op) {
  if (!s || !param || !name) {
    DDP_ERROR(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : !param ? "param" : "name");
    return NULL;
  }
  size_t len = strlen(name);
  if (len == 0 || len > DDP_OPTIM_STATE_NAME_MAX) {
    DDP_ERROR(DDP_ERR_ARG, "%s: a state name has 1 to %d bytes, got %zu ('%.40s%s')", op,
              DDP_OPTIM_STATE_NAME_MAX, len, name, len > 40 ? "..." : "");
    return NULL;
  }
  int64_t e = find_or_add(s, param, op);
  if (e < 0) return NULL;
  state_entry *en = &s->entries[e];
  state_value *v = value_find(en, name);
  if (v) return v;
  if (en->n == en->cap) {
    int cap = en->cap ? 2 * en->cap : 4;
    state_value *grown = realloc(en->values, sizeof *grown * (size_t)cap);
    if (!grown) {
      DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory", op);
      return NULL;
    }
    en->values = grown;
    en->cap = cap;
  }
  v = &en->values[en->n++];
  memset(v, 0, sizeof *v);
  memcpy(v->name, name, len + 1);
  v->kind = DDP_OPTIM_STATE_NUMBER;
  return v;
}

/* ---- the store's API ------------------------------------------------------------------------- */

int ddp_optim_state_new(ddp_optim_state **out) {
  if (!out) DDP_FAIL(DDP_ERR_ARG, "optim_state_new: out is NULL");
  *out = calloc(1, sizeof **out);
  if (!*out) DDP_FAIL(DDP_ERR_MEMORY, "optim_state_new: out of memory");
  return DDP_OK;
}

void ddp_optim_state_clear(ddp_optim_state *s) {
  if (!s) return;
  for (int64_t e = 0; e < s->n; e++) entry_release(&s->entries[e]);
  s->n = 0;
  for (int64_t i = 0; i < s->n_slots; i++) s->slots[i] = -1;
}

void ddp_optim_state_free(ddp_optim_state *s) {
  if (!s) return;
  ddp_optim_state_clear(s);
  free(s->entries);
  free(s->slots);
  free(s);
}

int64_t ddp_optim_state_count(const ddp_optim_state *s) { return s ? s->n : 0; }

int ddp_optim_state_has(const ddp_optim_state *s, const ddp_tensor *param) {
  return s && param && find(s, param) >= 0;
}

int ddp_optim_state_add(ddp_optim_state *s, ddp_tensor *param) {
  if (!s || !param) DDP_FAIL(DDP_ERR_ARG, "optim_state_add: NULL %s", !s ? "store" : "param");
  return find_or_add(s, param, "optim_state_add") < 0 ? ddp_last_status() : DDP_OK;
}

int ddp_optim_state_param_at(const ddp_optim_state *s, int64_t i, ddp_tensor **out) {
  const char *op = "optim_state_param_at";
  if (!s || !out) DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : "out");
  *out = NULL;
  if (i < 0 || i >= s->n)
    DDP_FAIL(DDP_ERR_ARG, "%s: entry %lld out of range (the store has %lld entries)", op,
             (long long)i, (long long)s->n);
  ddp_tensor_retain(s->entries[i].param);
  *out = s->entries[i].param;
  return DDP_OK;
}

int ddp_optim_state_name_count(const ddp_optim_state *s, const ddp_tensor *param, int *n) {
  if (!s || !param || !n)
    DDP_FAIL(DDP_ERR_ARG, "optim_state_name_count: NULL %s", !s ? "store" : !param ? "param" : "n");
  int64_t e = find(s, param);
  *n = e < 0 ? 0 : s->entries[e].n;
  return DDP_OK;
}

int ddp_optim_state_name_at(const ddp_optim_state *s, const ddp_tensor *param, int j,
                            const char **name, int *kind) {
  const char *op = "optim_state_name_at";
  if (!s || !param || !name)
    DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : !param ? "param" : "name");
  *name = NULL;
  int64_t e = find(s, param);
  if (e < 0) DDP_FAIL(DDP_ERR_ARG, "%s: the parameter has no state entry", op);
  const state_entry *en = &s->entries[e];
  if (j < 0 || j >= en->n)
    DDP_FAIL(DDP_ERR_ARG, "%s: name %d out of range (the entry has %d names)", op, j, en->n);
  *name = en->values[j].name;
  if (kind) *kind = en->values[j].kind;
  return DDP_OK;
}

int ddp_optim_state_kind(const ddp_optim_state *s, const ddp_tensor *param, const char *name) {
  if (!s || !param || !name) return DDP_OPTIM_STATE_NONE;
  int64_t e = find(s, param);
  const state_value *v = e < 0 ? NULL : value_find(&s->entries[e], name);
  return v ? v->kind : DDP_OPTIM_STATE_NONE;
}

static const char *kind_name(int kind) {
  return kind == DDP_OPTIM_STATE_TENSOR ? "a tensor" : kind == DDP_OPTIM_STATE_NUMBER ? "a number"
         : kind == DDP_OPTIM_STATE_BOOLEAN ? "a boolean" : "nothing";
}

int ddp_optim_state_get_tensor(const ddp_optim_state *s, const ddp_tensor *param,
                               const char *name, ddp_tensor **out) {
  const char *op = "optim_state_get_tensor";
  if (!s || !param || !name || !out)
    DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : !param ? "param" : !name ? "name" : "out");
  *out = NULL;
  int64_t e = find(s, param);
  const state_value *v = e < 0 ? NULL : value_find(&s->entries[e], name);
  if (!v) return DDP_OK;
  if (v->kind != DDP_OPTIM_STATE_TENSOR)
    DDP_FAIL(DDP_ERR_ARG, "%s: state '%s' is %s, not a tensor", op, name, kind_name(v->kind));
  ddp_tensor_retain(v->t);
  *out = v->t;
  return DDP_OK;
}

int ddp_optim_state_set_tensor(ddp_optim_state *s, ddp_tensor *param, const char *name,
                               ddp_tensor *t) {
  const char *op = "optim_state_set_tensor";
  if (!t) return ddp_optim_state_remove(s, param, name);
  if (!s || !param || !name)
    DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : !param ? "param" : "name");
  DDP_TRY(ddp_check_alive(t, op, name));
  DDP_TRY(ddp_check_alive(param, op, "param"));
  if (ddp_tensor_shares_storage(t, param))
    DDP_FAIL(DDP_ERR_ARG, "%s: state '%s' shares its storage with its parameter", op, name);
  state_value *v = value_for_write(s, param, name, op);
  if (!v) return ddp_last_status();
  ddp_tensor_retain(t); /* before the release: t may be the tensor it replaces */
  ddp_tensor_release(v->t);
  v->t = t;
  v->kind = DDP_OPTIM_STATE_TENSOR;
  return DDP_OK;
}

int ddp_optim_state_get_number(const ddp_optim_state *s, const ddp_tensor *param,
                               const char *name, double *out) {
  const char *op = "optim_state_get_number";
  if (!s || !param || !name || !out)
    DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : !param ? "param" : !name ? "name" : "out");
  int64_t e = find(s, param);
  if (e < 0) DDP_FAIL(DDP_ERR_ARG, "%s: the parameter has no state entry (asked for '%s')", op, name);
  const state_value *v = value_find(&s->entries[e], name);
  if (!v) DDP_FAIL(DDP_ERR_ARG, "%s: the parameter's state has no '%s'", op, name);
  if (v->kind == DDP_OPTIM_STATE_TENSOR)
    DDP_FAIL(DDP_ERR_ARG, "%s: state '%s' is a tensor, not a number", op, name);
  *out = v->v;
  return DDP_OK;
}

static int set_scalar(ddp_optim_state *s, ddp_tensor *param, const char *name, double x,
                      int kind, const char *op) {
  state_value *v = value_for_write(s, param, name, op);
  if (!v) return ddp_last_status();
  ddp_tensor_release(v->t);
  v->t = NULL;
  v->v = x;
  v->kind = kind;
  return DDP_OK;
}

int ddp_optim_state_set_number(ddp_optim_state *s, ddp_tensor *param, const char *name,
                               double v) {
  return set_scalar(s, param, name, v, DDP_OPTIM_STATE_NUMBER, "optim_state_set_number");
}

int ddp_optim_state_set_boolean(ddp_optim_state *s, ddp_tensor *param, const char *name,
                                int v) {
  return set_scalar(s, param, name, v != 0, DDP_OPTIM_STATE_BOOLEAN, "optim_state_set_boolean");
}

int ddp_optim_state_remove(ddp_optim_state *s, const ddp_tensor *param, const char *name) {
  if (!s || !param || !name)
    DDP_FAIL(DDP_ERR_ARG, "optim_state_remove: NULL %s", !s ? "store" : !param ? "param" : "name");
  int64_t e = find(s, param);
  if (e < 0) return DDP_OK;
  state_entry *en = &s->entries[e];
  state_value *v = value_find(en, name);
  if (!v) return DDP_OK;
  ddp_tensor_release(v->t);
  int j = (int)(v - en->values);
  memmove(v, v + 1, sizeof *v * (size_t)(en->n - j - 1)); /* keep the names' order */
  en->n--;
  return DDP_OK;
}

int ddp_optim_state_clear_entry(ddp_optim_state *s, const ddp_tensor *param) {
  if (!s || !param) DDP_FAIL(DDP_ERR_ARG, "optim_state_clear_entry: NULL %s", !s ? "store" : "param");
  int64_t e = find(s, param);
  if (e < 0) return DDP_OK;
  entry_release(&s->entries[e]);
  s->entries[e] = s->entries[s->n - 1];
  s->n--;
  return rehash(s, s->n_slots); /* same size: the memory is there, only the indices move */
}

int ddp_optim_state_copy_entry(ddp_optim_state *dst, const ddp_optim_state *src,
                               ddp_tensor *param) {
  const char *op = "optim_state_copy_entry";
  if (!dst || !src || !param)
    DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !dst ? "dst" : !src ? "src" : "param");
  if (dst == src) return DDP_OK;
  DDP_TRY(ddp_optim_state_clear_entry(dst, param));
  int64_t e = find(src, param);
  if (e < 0) return DDP_OK;
  int status = ddp_optim_state_add(dst, param);
  const state_entry *en = &src->entries[e];
  for (int j = 0; j < en->n && !status; j++) {
    const state_value *v = &en->values[j];
    status = v->kind == DDP_OPTIM_STATE_TENSOR ? ddp_optim_state_set_tensor(dst, param, v->name, v->t)
                                               : set_scalar(dst, param, v->name, v->v, v->kind, op);
  }
  if (status) ddp_optim_state_clear_entry(dst, param);
  return status;
}

/* ---- the step --------------------------------------------------------------------------------- */

static int zeros_like(ddp_tensor **out, const ddp_tensor *p) {
  return ddp_tensor_zeros(out, p->ndim, p->shape, p->dtype, p->device);
}

/* A borrowed pointer to tensor `name` of entry e (NULL when absent or not a tensor). */
static ddp_tensor *tensor_at(const ddp_optim_state *s, int64_t e, const char *name) {
  const state_value *v = value_find(&s->entries[e], name);
  return v && v->kind == DDP_OPTIM_STATE_TENSOR ? v->t : NULL;
}

/* Set tensor `name` of param's entry to new zeros of param's shape; *out borrows it. */
static int new_zeros(ddp_optim_state *s, ddp_tensor *param, const char *name, ddp_tensor **out) {
  ddp_tensor *z = NULL;
  DDP_TRY(zeros_like(&z, param));
  int status = ddp_optim_state_set_tensor(s, param, name, z);
  ddp_tensor_release(z); /* the store holds it now */
  *out = status ? NULL : z;
  return status;
}

/* The count held in "step" of entry e into *step (-1 when there is none). */
static int read_step(const ddp_optim_state *s, int64_t e, int64_t *step, const char *op) {
  const state_value *v = value_find(&s->entries[e], "step");
  *step = -1;
  if (!v) return DDP_OK;
  if (v->kind != DDP_OPTIM_STATE_NUMBER || !(v->v >= 0) || v->v != floor(v->v) || v->v > 9e15)
    DDP_FAIL(DDP_ERR_ARG, "%s: state 'step' must be a count >= 0, got %s%g", op,
             v->kind == DDP_OPTIM_STATE_NUMBER ? "" : "a non-number ", v->v);
  *step = (int64_t)v->v;
  return DDP_OK;
}

static const char *kind_op(int kind) {
  switch (kind) {
  case DDP_OPTIM_SGD: return "sgd_step_";
  case DDP_OPTIM_ADAM: return "adam_step_";
  case DDP_OPTIM_ADAMW: return "adamw_step_";
  case DDP_OPTIM_ADADELTA: return "adadelta_step_";
  default: return NULL;
  }
}

static int check_step_args(ddp_optim_state *s, const ddp_optim_config *c, const char *op) {
  if (!s || !c) DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !s ? "store" : "cfg");
  if (!kind_op(c->kind))
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown optimizer kind %d (SGD %d, Adam %d, AdamW %d, Adadelta %d)",
             op, c->kind, DDP_OPTIM_SGD, DDP_OPTIM_ADAM, DDP_OPTIM_ADAMW, DDP_OPTIM_ADADELTA);
  return DDP_OK;
}

int ddp_optim_step_param(ddp_optim_state *s, const ddp_optim_config *c, ddp_tensor *p,
                         ddp_tensor *g) {
  const char *op = "optim_step_param";
  DDP_TRY(check_step_args(s, c, op));
  if (!p || !g) DDP_FAIL(DDP_ERR_ARG, "%s: NULL %s", op, !p ? "param" : "grad");
  op = kind_op(c->kind);
  int64_t e = find_or_add(s, p, op);
  if (e < 0) return ddp_last_status();
  if (c->kind == DDP_OPTIM_SGD) {
    ddp_tensor *buf = NULL;
    int first = 0;
    if (c->momentum != 0) {
      buf = tensor_at(s, e, "momentum_buffer");
      if (!buf) {
        DDP_TRY(new_zeros(s, p, "momentum_buffer", &buf));
        first = 1;
      }
    }
    return ddp_sgd_step_(p, g, buf, c->lr, c->momentum, c->dampening, c->weight_decay,
                         c->nesterov, c->maximize, first);
  }
  int64_t step;
  DDP_TRY(read_step(s, e, &step, op));
  int adadelta = c->kind == DDP_OPTIM_ADADELTA;
  const char *a = adadelta ? "square_avg" : "exp_avg", *b = adadelta ? "acc_delta" : "exp_avg_sq";
  ddp_tensor *ta, *tb, *tm = NULL;
  if (step < 0) { /* the first step: PyTorch's lazy state */
    DDP_TRY(new_zeros(s, p, a, &ta));
    DDP_TRY(new_zeros(s, p, b, &tb));
    DDP_TRY(ddp_optim_state_set_number(s, p, "step", 0));
    step = 0;
  }
  ta = tensor_at(s, e, a);
  tb = tensor_at(s, e, b);
  if (adadelta) {
    DDP_TRY(ddp_adadelta_step_(p, g, ta, tb, c->lr, c->rho, c->eps, c->weight_decay, c->maximize));
  } else {
    if (c->amsgrad) {
      tm = tensor_at(s, e, "max_exp_avg_sq");
      if (!tm) DDP_TRY(new_zeros(s, p, "max_exp_avg_sq", &tm));
    }
    int (*kernel)(ddp_tensor *, ddp_tensor *, ddp_tensor *, ddp_tensor *, ddp_tensor *, int64_t,
                  double, double, double, double, double, int, int) =
        c->kind == DDP_OPTIM_ADAM ? ddp_adam_step_ : ddp_adamw_step_;
    DDP_TRY(kernel(p, g, ta, tb, tm, step + 1, c->lr, c->beta1, c->beta2, c->eps,
                   c->weight_decay, c->amsgrad, c->maximize));
  }
  return ddp_optim_state_set_number(s, p, "step", (double)(step + 1));
}

/* SGD over the n parameters with gradients: buffers made where missing, then one
 * ddp_sgd_step_foreach_ (the lists are the caller's scratch arrays of n entries). */
static int sgd_foreach(ddp_optim_state *s, const ddp_optim_config *c, int64_t n,
                       ddp_tensor **ps, ddp_tensor **gs, ddp_tensor **bs, int *first) {
  const char *op = "sgd_step_";
  for (int64_t i = 0; i < n; i++) {
    int64_t e = find_or_add(s, ps[i], op);
    if (e < 0) return ddp_last_status();
    first[i] = 0;
    bs[i] = NULL;
    if (c->momentum != 0) {
      bs[i] = tensor_at(s, e, "momentum_buffer");
      if (!bs[i]) {
        DDP_TRY(new_zeros(s, ps[i], "momentum_buffer", &bs[i]));
        first[i] = 1;
      }
    }
  }
  return ddp_sgd_step_foreach_(n, ps, gs, bs, first, c->lr, c->momentum, c->dampening,
                               c->weight_decay, c->nesterov, c->maximize);
}

int ddp_optim_step_params(ddp_optim_state *s, const ddp_optim_config *c, int64_t n,
                          ddp_tensor *const *params) {
  const char *op = "optim_step_params";
  DDP_TRY(check_step_args(s, c, op));
  if (n < 0) DDP_FAIL(DDP_ERR_ARG, "%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && !params) DDP_FAIL(DDP_ERR_ARG, "%s: params is NULL", op);
  for (int64_t i = 0; i < n; i++)
    if (!params[i]) DDP_FAIL(DDP_ERR_ARG, "%s: params[%lld] is NULL", op, (long long)i);
  if (!(c->kind == DDP_OPTIM_SGD && c->foreach)) {
    for (int64_t i = 0; i < n; i++) {
      ddp_tensor *g = ddp_tensor_grad(params[i]);
      if (!g) continue;
      int status = ddp_optim_step_param(s, c, params[i], g);
      ddp_tensor_release(g);
      if (status)
        return DDP_ERROR(status, "%s (parameter %lld)", ddp_last_error(), (long long)i);
    }
    return DDP_OK;
  }
  /* the gradients as references held for the call, released when it returns (Note [step
   * releases its grads] in lua/ddplua/optim/optimizer.lua) */
  enum { ON_STACK = 64 };
  ddp_tensor *stack[3 * ON_STACK];
  int stack_first[ON_STACK];
  ddp_tensor **ps = stack, **gs, **bs;
  int *first = stack_first;
  if (n > ON_STACK) {
    ps = malloc(sizeof(ddp_tensor *) * 3 * (size_t)n);
    first = malloc(sizeof(int) * (size_t)n);
    if (!ps || !first) {
      free(ps == stack ? NULL : ps);
      free(first == stack_first ? NULL : first);
      DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory for %lld parameters", op, (long long)n);
    }
  }
  int64_t m = n > ON_STACK ? n : ON_STACK;
  gs = ps + m;
  bs = ps + 2 * m;
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    ddp_tensor *g = ddp_tensor_grad(params[i]);
    if (!g) continue;
    ps[k] = params[i];
    gs[k++] = g;
  }
  int status = sgd_foreach(s, c, k, ps, gs, bs, first);
  for (int64_t i = 0; i < k; i++) ddp_tensor_release(gs[i]);
  if (ps != stack) free(ps);
  if (first != stack_first) free(first);
  return status;
}
