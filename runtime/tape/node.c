/* runtime/tape/node.c: nodes of the tape, saved tensors, grad mode, tensor-level
 * autograd accessors (set_data's leaf rules included) and post-accumulate hooks. The tape
 * layer: it uses the core only (see tools/check_layers.lua). */
#include <pthread.h>
#include <stdlib.h>

#include "core/profiler.h"
#include "tape/tape.h"

static __thread int grad_mode_off; /* 0: enabled (the default for every thread) */

int ddp_grad_enabled(void) { return !grad_mode_off; }
int ddp_set_grad_enabled(int enabled) {
  int prev = !grad_mode_off;
  grad_mode_off = !enabled;
  return prev;
}

int ddp_autograd_needed(int n, ddp_tensor *const *inputs) {
  if (grad_mode_off) return 0;
  for (int i = 0; i < n; i++) {
    const ddp_tensor *t = inputs[i];
    if (t && (t->requires_grad || (ddp_autograd_view_is_stale(t) && t->view_base->requires_grad)))
      return 1;
  }
  return 0;
}

static int64_t next_seq; /* the last seq given to a node (Note [backward order]) */

int64_t ddp_autograd_seq_now(void) { return __atomic_load_n(&next_seq, __ATOMIC_RELAXED); }

ddp_node *ddp_node_new(const char *name, ddp_backward_fn backward, int n_inputs,
                       ddp_tensor *const *inputs, int n_saved) {
  if (DDP_PROF_ON()) ddp_prof_note_inputs(n_inputs, inputs); /* Note [profiler shapes] */
  /* one block: the node, then its edges, input metadata and saved slots */
  size_t edges_at = sizeof(ddp_node);
  size_t meta_at = edges_at + (size_t)n_inputs * sizeof(ddp_edge);
  size_t saved_at = meta_at + (size_t)n_inputs * sizeof(ddp_input_meta);
  size_t total = saved_at + (size_t)n_saved * sizeof(ddp_saved);
  char *block = ddp_block_alloc(total); /* Note [small block cache] */
  if (block) memset(block, 0, total);
  if (!block) {
    DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory recording the graph", name);
    return NULL;
  }
  ddp_node *n = (ddp_node *)block;
  ddp_edge *edges = (ddp_edge *)(block + edges_at);
  ddp_input_meta *meta = (ddp_input_meta *)(block + meta_at);
  ddp_saved *saved = (ddp_saved *)(block + saved_at);
  n->refcount = 1;
  n->seq = __atomic_add_fetch(&next_seq, 1, __ATOMIC_RELAXED);
  n->name = name;
  n->backward = backward;
  n->n_inputs = n_inputs;
  n->n_saved = n_saved;
  n->edges = edges;
  n->inputs = meta;
  n->saved = saved;
  for (int i = 0; i < n_inputs; i++) {
    ddp_tensor *t = inputs[i];
    if (!t) continue;
    if (ddp_autograd_refresh_view(t)) {
      ddp_node_release(n);
      return NULL;
    }
    meta[i].dtype = t->dtype;
    meta[i].device = t->device;
    meta[i].ndim = t->ndim;
    memcpy(meta[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    if (!t->requires_grad) continue;
    if (t->grad_fn) {
      edges[i].fn = t->grad_fn;
      ddp_node_retain(t->grad_fn);
    } else {
      edges[i].leaf = t;
      ddp_tensor_retain(t);
    }
  }
  return n;
}

int ddp_node_save(ddp_node *node, int slot, const ddp_tensor *t) {
  if (!t) return DDP_OK;
  ddp_tensor *a = ddp_tensor_alias(t);
  if (!a) return ddp_last_status();
  node->saved[slot].tensor = a;
  node->saved[slot].version = t->storage->version;
  return DDP_OK;
}

ddp_tensor *ddp_node_saved(ddp_node *node, int slot) {
  ddp_saved *s = &node->saved[slot];
  if (node->released) {
    DDP_ERROR(DDP_ERR_STATE,
              "%s: trying to backward through the graph a second time (the saved tensors were "
              "freed by the first backward; pass retain_graph = true to the first one)",
              node->name);
    return NULL;
  }
  if (s->tensor && !ddp_tensor_storage_fits(s->tensor)) { /* Note [storage resize] */
    DDP_ERROR(DDP_ERR_STATE,
              "%s: a tensor of shape %s saved for the gradient has no data: its storage was "
              "resized to %zu bytes after the forward and not re-allocated before backward "
              "(FSDP re-gathers a resharded parameter in its pre-backward hook: was the "
              "module's output used outside the graph?)",
              node->name, DDP_SHAPE(s->tensor), s->tensor->storage->nbytes);
    return NULL;
  }
  if (s->tensor && s->tensor->storage->version != s->version) {
    DDP_ERROR(DDP_ERR_STATE,
              "%s: a tensor of shape %s saved for the gradient was modified by an in-place "
              "operation (version %lld, saved at %lld)",
              node->name, DDP_SHAPE(s->tensor), (long long)s->tensor->storage->version,
              (long long)s->version);
    return NULL;
  }
  return s->tensor;
}

void ddp_autograd_set_output(ddp_tensor *out, ddp_node *node) {
  out->grad_fn = node;
  out->requires_grad = 1;
}

int ddp_autograd_record_unary(ddp_tensor **out, ddp_tensor *input, const char *name,
                              ddp_backward_fn backward, const int64_t *iattr, int n_iattr) {
  ddp_node *n = ddp_node_new(name, backward, 1, &input, 0);
  if (!n) {
    ddp_tensor_release(*out);
    *out = NULL;
    return ddp_last_status();
  }
  for (int i = 0; i < n_iattr && i < 8; i++) n->iattr[i] = iattr[i];
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}

void ddp_node_retain(ddp_node *node) {
  if (node) __atomic_add_fetch(&node->refcount, 1, __ATOMIC_RELAXED);
}

/* Free the saved tensors of a node (after backward without retain_graph, or on release). */
void ddp_node_release_saved(ddp_node *n) {
  for (int i = 0; i < n->n_saved; i++) {
    ddp_tensor_release(n->saved[i].tensor);
    n->saved[i].tensor = NULL;
  }
  if (n->wrapped) { /* a CopySlices replays its in-place op: that op's saved go too */
    ddp_node_release_saved(n->wrapped);
    n->wrapped->released = n->released;
  }
}

/* Iterative release: a long chain of nodes (an unrolled loop of 10^5 steps) must not
 * recurse once per node. Nodes reaching refcount 0 go on an explicit stack. */
void ddp_node_release(ddp_node *node) {
  if (!node || !ddp_ref_drop(&node->refcount)) return;
  /* the stack starts on the C stack: most releases free one node, or a short chain */
  ddp_node *local[32];
  size_t cap = sizeof local / sizeof local[0], top = 0;
  ddp_node **stack = local;
  ddp_node *cur = node;
  for (;;) {
    for (int i = 0; i < cur->n_inputs + 1; i++) {
      ddp_node *next;
      if (i < cur->n_inputs) {
        ddp_tensor_release(cur->edges[i].leaf);
        next = cur->edges[i].fn;
      } else {
        next = cur->wrapped; /* released like one more edge */
      }
      if (!next || !ddp_ref_drop(&next->refcount)) continue;
      if (top == cap) {
        ddp_node **bigger = stack == local ? malloc(2 * cap * sizeof *stack)
                                           : realloc(stack, 2 * cap * sizeof *stack);
        if (bigger) {
          if (stack == local) memcpy(bigger, local, sizeof local);
          stack = bigger;
          cap *= 2;
        }
      }
      if (top < cap) stack[top++] = next;
      else { next->refcount = 1; ddp_node_release(next); } /* no memory: recurse */
    }
    cur->wrapped = NULL;
    for (int i = 0; i < cur->n_pre_hooks; i++) ddp_autograd_drop_id(cur->pre_hooks[i]);
    free(cur->pre_hooks);
    if (cur->function_id) ddp_autograd_drop_id(cur->function_id);
    ddp_node_release_saved(cur);
    if (cur->extra_free) cur->extra_free(cur->extra);
    ddp_tensor_release(cur->grad_sum);
    ddp_block_free(cur); /* edges, inputs and saved live in the same block */
    if (top == 0) break;
    cur = stack[--top];
  }
  if (stack != local) free(stack);
}

/* What a cleared tensor held of autograd's (Note [autograd release hook] in core.h): the
 * retain_grad link from its node, its node reference and its hook list. */
static void release_tensor_autograd(ddp_tensor *t, ddp_node *fn, ddp_tensor_hooks *hooks) {
  if (fn && fn->retain_target == t) fn->retain_target = NULL;
  ddp_hooks_free(hooks);
  ddp_node_release(fn);
}

/* At load: before any node or hook exists, so no tensor can hold one the core cannot free. */
__attribute__((constructor)) static void register_release_hook(void) {
  ddp_autograd_release_hook_set(release_tensor_autograd);
}

/* ---- tensor-level accessors --------------------------------------------------------- */

int ddp_tensor_requires_grad(const ddp_tensor *t) {
  if (t && t->storage && ddp_autograd_view_is_stale(t)) ddp_autograd_refresh_view((ddp_tensor *)t);
  return t && t->requires_grad;
}

int ddp_tensor_set_requires_grad(ddp_tensor *t, int requires_grad) {
  DDP_TRY(ddp_check_alive(t, "requires_grad_", "self"));
  if (t->grad_fn && !requires_grad)
    DDP_FAIL(DDP_ERR_ARG, "requires_grad_: cannot clear requires_grad of a non-leaf tensor "
             "(produced by %s); use detach()", t->grad_fn->name);
  if (requires_grad && !ddp_dtype_is_floating(t->dtype))
    DDP_FAIL(DDP_ERR_ARG, "requires_grad_: only floating tensors can require gradients, got %s",
             ddp_dtype_name(t->dtype));
  t->requires_grad = requires_grad != 0;
  return DDP_OK;
}

int ddp_tensor_is_leaf(const ddp_tensor *t) {
  if (t && t->storage && ddp_autograd_view_is_stale(t)) ddp_autograd_refresh_view((ddp_tensor *)t);
  return !t || t->grad_fn == NULL;
}

const char *ddp_tensor_grad_fn_name(const ddp_tensor *t) {
  if (t && t->storage && ddp_autograd_view_is_stale(t)) ddp_autograd_refresh_view((ddp_tensor *)t);
  return t && t->grad_fn ? t->grad_fn->name : NULL;
}

ddp_tensor *ddp_tensor_grad(const ddp_tensor *t) {
  if (!t || !t->grad) return NULL;
  ddp_tensor_retain(t->grad);
  return t->grad;
}

int ddp_tensor_set_grad(ddp_tensor *t, ddp_tensor *g) {
  DDP_TRY(ddp_check_alive(t, "set_grad", "self"));
  if (g) {
    DDP_TRY(ddp_check_alive(g, "set_grad", "grad"));
    if (g->ndim != t->ndim || memcmp(g->shape, t->shape, sizeof(int64_t) * t->ndim))
      DDP_FAIL(DDP_ERR_ARG, "set_grad: gradient shape %s does not match the tensor's %s",
               DDP_SHAPE(g), DDP_SHAPE(t));
    if (g->dtype != t->dtype)
      DDP_FAIL(DDP_ERR_ARG, "set_grad: gradient dtype %s does not match the tensor's %s",
               ddp_dtype_name(g->dtype), ddp_dtype_name(t->dtype));
    ddp_tensor_retain(g);
  }
  ddp_tensor *old = t->grad;
  t->grad = g;
  ddp_tensor_release(old);
  return DDP_OK;
}

int ddp_tensor_retain_grad(ddp_tensor *t) {
  DDP_TRY(ddp_check_alive(t, "retain_grad", "self"));
  if (!t->requires_grad)
    DDP_FAIL(DDP_ERR_ARG, "retain_grad: the tensor does not require grad");
  if (t->grad_fn) {
    t->retains_grad = 1;
    t->grad_fn->retain_target = t;
  }
  return DDP_OK;
}

int ddp_tensor_set_data(ddp_tensor *t, const ddp_tensor *src) {
  DDP_TRY(ddp_check_alive(t, "set_data", "self"));
  DDP_TRY(ddp_check_alive(src, "set_data", "src"));
  if (t->grad_fn)
    DDP_FAIL(DDP_ERR_ARG, "set_data: self is not a leaf (it was computed by %s); only leaves "
             "(parameters, buffers) can take other data", t->grad_fn->name);
  if (t->requires_grad && !ddp_dtype_is_floating(src->dtype))
    DDP_FAIL(DDP_ERR_ARG, "set_data: self requires grad and src has dtype %s; only floating "
             "tensors can require gradients", ddp_dtype_name(src->dtype));
  ddp_tensor_set_data_raw(t, src);
  return DDP_OK;
}

int ddp_tensor_detach(ddp_tensor **out, const ddp_tensor *t) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "detach", "self"));
  *out = ddp_tensor_alias(t);
  return *out ? DDP_OK : ddp_last_status();
}

/* ---- hooks -------------------------------------------------------------------------- */

static int64_t next_hook_id; /* process-wide, so a front end can key its hooks by id */

static int64_t new_hook_id(void) { return __atomic_add_fetch(&next_hook_id, 1, __ATOMIC_RELAXED); }

static int hooks_push(ddp_tensor *t, ddp_grad_hook_fn fn, void *ctx, int kind, int64_t *handle,
                      const char *op) {
  ddp_tensor_hooks *h = t->hooks;
  if (!h && !(h = t->hooks = calloc(1, sizeof *h)))
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  if (h->n == h->cap) {
    int cap = h->cap ? 2 * h->cap : 4;
    void *items = realloc(h->items, (size_t)cap * sizeof *h->items);
    if (!items) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
    h->items = items;
    h->cap = cap;
  }
  ddp_hook_item *it = &h->items[h->n++];
  it->fn = fn;
  it->ctx = ctx;
  it->kind = kind;
  it->id = new_hook_id();
  if (handle) *handle = it->id;
  return DDP_OK;
}

int ddp_tensor_add_post_accumulate_hook(ddp_tensor *t, ddp_grad_hook_fn fn, void *ctx,
                                        int64_t *handle) {
  DDP_TRY(ddp_check_alive(t, "register_post_accumulate_grad_hook", "self"));
  if (!t->requires_grad || t->grad_fn)
    DDP_FAIL(DDP_ERR_ARG, "register_post_accumulate_grad_hook: only leaf tensors that require "
             "grad have post-accumulate hooks");
  if (!fn) DDP_FAIL(DDP_ERR_ARG, "register_post_accumulate_grad_hook: hook is NULL");
  return hooks_push(t, fn, ctx, DDP_HOOK_POST_ACCUMULATE, handle,
                    "register_post_accumulate_grad_hook");
}

int ddp_tensor_add_deferred_hook(ddp_tensor *t, int kind, int64_t *handle) {
  if (kind == DDP_HOOK_POST_ACCUMULATE) {
    DDP_TRY(ddp_check_alive(t, "register_post_accumulate_grad_hook", "self"));
    if (!t->requires_grad || t->grad_fn)
      DDP_FAIL(DDP_ERR_ARG, "register_post_accumulate_grad_hook: only leaf tensors that "
               "require grad have post-accumulate hooks");
    return hooks_push(t, NULL, NULL, kind, handle, "register_post_accumulate_grad_hook");
  }
  if (kind != DDP_HOOK_GRAD) DDP_FAIL(DDP_ERR_ARG, "register_hook: unknown hook kind %d", kind);
  DDP_TRY(ddp_check_alive(t, "register_hook", "self"));
  DDP_TRY(ddp_autograd_refresh_view(t));
  if (!t->requires_grad)
    DDP_FAIL(DDP_ERR_ARG, "register_hook: cannot register a hook on a tensor that doesn't "
             "require gradient");
  if (!t->grad_fn) return hooks_push(t, NULL, NULL, kind, handle, "register_hook");
  ddp_node *n = t->grad_fn; /* a non-leaf: the hook sees the gradient its node receives */
  int64_t *ids = realloc(n->pre_hooks, (size_t)(n->n_pre_hooks + 1) * sizeof *ids);
  if (!ids) DDP_FAIL(DDP_ERR_MEMORY, "register_hook: out of memory");
  n->pre_hooks = ids;
  ids[n->n_pre_hooks++] = new_hook_id();
  if (handle) *handle = ids[n->n_pre_hooks - 1];
  return DDP_OK;
}

int ddp_tensor_remove_hook(ddp_tensor *t, int64_t handle) {
  ddp_tensor_hooks *h = t ? t->hooks : NULL;
  for (int i = 0; h && i < h->n; i++) {
    if (h->items[i].id != handle) continue;
    if (!h->items[i].fn) ddp_autograd_drop_id(handle);
    memmove(&h->items[i], &h->items[i + 1], (size_t)(h->n - i - 1) * sizeof *h->items);
    h->n--;
    return DDP_OK;
  }
  ddp_node *n = t ? t->grad_fn : NULL;
  for (int i = 0; n && i < n->n_pre_hooks; i++) {
    if (n->pre_hooks[i] != handle) continue;
    ddp_autograd_drop_id(handle);
    memmove(&n->pre_hooks[i], &n->pre_hooks[i + 1], (size_t)(n->n_pre_hooks - i - 1) * sizeof(int64_t));
    n->n_pre_hooks--;
    return DDP_OK;
  }
  DDP_FAIL(DDP_ERR_ARG, "remove_hook: no hook with handle %lld on this tensor", (long long)handle);
}

void ddp_hooks_free(ddp_tensor_hooks *hooks) {
  if (!hooks) return;
  for (int i = 0; i < hooks->n; i++)
    if (!hooks->items[i].fn) ddp_autograd_drop_id(hooks->items[i].id);
  free(hooks->items);
  free(hooks);
}

/* ---- ids a front end may forget ------------------------------------------------------ */

static pthread_mutex_t dropped_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t *dropped;
static int n_dropped, cap_dropped;

void ddp_autograd_drop_id(int64_t id) {
  pthread_mutex_lock(&dropped_lock);
  if (n_dropped == cap_dropped) {
    int cap = cap_dropped ? 2 * cap_dropped : 64;
    int64_t *grown = realloc(dropped, (size_t)cap * sizeof *grown);
    if (grown) {
      dropped = grown;
      cap_dropped = cap;
    }
  }
  if (n_dropped < cap_dropped) dropped[n_dropped++] = id; /* else lost: the front end leaks a little */
  pthread_mutex_unlock(&dropped_lock);
}

int ddp_autograd_dropped_ids(int64_t *ids, int cap) {
  pthread_mutex_lock(&dropped_lock);
  int n = n_dropped < cap ? n_dropped : cap;
  if (n > 0) {
    memcpy(ids, dropped + (n_dropped - n), (size_t)n * sizeof *ids);
    n_dropped -= n;
  }
  pthread_mutex_unlock(&dropped_lock);
  return n;
}

/* ---- Functions of a front end --------------------------------------------------------- */

static int64_t next_function_id;

int ddp_autograd_record_function(ddp_tensor *output, const char *name, int64_t id,
                                 int n_inputs, ddp_tensor *const *inputs, int n_saved,
                                 ddp_tensor *const *saved) {
  DDP_TRY(ddp_check_alive(output, "autograd.Function", "output"));
  if (output->grad_fn || output->view_base)
    DDP_FAIL(DDP_ERR_ARG, "autograd.Function %s: the output already has a history (forward "
             "must return a new tensor, not a view of an input or an input itself)",
             name ? name : "?");
  for (int i = 0; i < n_saved; i++)
    if (saved[i]) DDP_TRY(ddp_check_alive(saved[i], "save_for_backward", "tensor"));
  size_t len = strlen(name ? name : "Function") + 1;
  char *copy = malloc(len);
  if (!copy) DDP_FAIL(DDP_ERR_MEMORY, "autograd.Function: out of memory");
  memcpy(copy, name ? name : "Function", len);
  ddp_node *n = ddp_node_new(copy, NULL, n_inputs, inputs, n_saved);
  if (!n) {
    free(copy);
    return ddp_last_status();
  }
  n->extra = copy;
  n->extra_free = free;
  n->function_id = id ? id : __atomic_add_fetch(&next_function_id, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < n_saved; i++) {
    if (ddp_node_save(n, i, saved[i])) {
      n->function_id = 0;
      ddp_node_release(n);
      return ddp_last_status();
    }
  }
  ddp_autograd_set_output(output, n);
  return DDP_OK;
}

/* ---- a checkpointed segment's leaves (Note [checkpoint segment]) ---------------------- */

/* Note [checkpoint segment]: activation checkpointing (ddplua.utils.checkpoint) runs a
 * function once with grad mode on and keeps only its outputs, detached; one node then
 * stands for the whole segment, its inputs being the function's tensor arguments (passed in
 * as fresh leaves) and every leaf that requires grad the segment reached (the parameters it
 * used). ddp_autograd_segment_leaves finds those leaves: it walks back from the outputs
 * through the nodes recorded since the segment started (seq > since: nodes get increasing
 * seqs) and stops at leaves. A node recorded before is a tensor from outside that the
 * function captured instead of taking it as an argument: its gradient would have no way
 * out of the segment, so that is an error naming the node. */

/* A stack of nodes. */
typedef struct {
  ddp_node **items;
  size_t n, cap;
} node_vec_t;

/* A set of node pointers: open addressing, grown at half full. */
typedef struct {
  ddp_node **slots;
  size_t cap, n;
} node_set;

static size_t node_hash(const ddp_node *n, size_t cap) {
  uintptr_t h = (uintptr_t)n;
  h ^= h >> 17;
  h *= (uintptr_t)0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 7) & (cap - 1);
}

/* 1 when added, 0 when already there, -1 without memory. */
static int node_set_add(node_set *s, ddp_node *n) {
  if (2 * (s->n + 1) > s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    ddp_node **slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t k = 0; k < s->cap; k++) {
      if (!s->slots[k]) continue;
      size_t j = node_hash(s->slots[k], cap);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = s->slots[k];
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
  }
  size_t j = node_hash(n, s->cap);
  while (s->slots[j]) {
    if (s->slots[j] == n) return 0;
    j = (j + 1) & (s->cap - 1);
  }
  s->slots[j] = n;
  s->n++;
  return 1;
}

/* A growable list of leaves (owned references), each once. */
typedef struct {
  ddp_tensor **items;
  int n, cap;
} leaf_list;

static int leaf_list_add(leaf_list *l, ddp_tensor *t) {
  for (int k = 0; k < l->n; k++)
    if (l->items[k] == t) return DDP_OK;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    ddp_tensor **items = realloc(l->items, (size_t)cap * sizeof *items);
    if (!items) DDP_FAIL(DDP_ERR_MEMORY, "checkpoint: out of memory");
    l->items = items;
    l->cap = cap;
  }
  ddp_tensor_retain(t);
  l->items[l->n++] = t;
  return DDP_OK;
}

/* Push node on the walk's stack unless seen already. */
static int segment_push(node_set *seen, node_vec_t *stack, ddp_node *node) {
  int added = node_set_add(seen, node);
  if (added < 0) DDP_FAIL(DDP_ERR_MEMORY, "checkpoint: out of memory");
  if (!added) return DDP_OK;
  if (stack->n == stack->cap) {
    size_t cap = stack->cap ? 2 * stack->cap : 64;
    ddp_node **items = realloc(stack->items, cap * sizeof *items);
    if (!items) DDP_FAIL(DDP_ERR_MEMORY, "checkpoint: out of memory");
    stack->items = items;
    stack->cap = cap;
  }
  stack->items[stack->n++] = node;
  return DDP_OK;
}

int ddp_autograd_segment_leaves(int n, ddp_tensor *const *outputs, int64_t since, int cap,
                                ddp_tensor **leaves, int *n_leaves) {
  *n_leaves = 0;
  node_set seen = {0};
  node_vec_t stack = {0};
  leaf_list found = {0};
  int status = DDP_OK;
  for (int i = 0; i < n && !status; i++) {
    ddp_tensor *t = outputs[i];
    if (!t) continue;
    if ((status = ddp_check_alive(t, "checkpoint", "output"))) break;
    if ((status = ddp_autograd_refresh_view(t))) break;
    if (!t->requires_grad) continue;
    if (!t->grad_fn) { /* a leaf returned as it is (an argument passed through) */
      status = leaf_list_add(&found, t);
    } else if (t->grad_fn->seq <= since) {
      status = DDP_ERROR(DDP_ERR_ARG, "checkpoint: output %d was computed by %s before the "
                         "checkpointed function ran (it must compute its outputs itself)", i + 1,
                         t->grad_fn->name);
    } else {
      status = segment_push(&seen, &stack, t->grad_fn);
    }
  }
  while (!status && stack.n) {
    ddp_node *node = stack.items[--stack.n];
    for (int i = 0; i < node->n_inputs && !status; i++) {
      ddp_edge *e = &node->edges[i];
      if (e->leaf) {
        status = leaf_list_add(&found, e->leaf);
      } else if (e->fn && e->fn->seq <= since) {
        status = DDP_ERROR(DDP_ERR_ARG, "checkpoint: the checkpointed function uses a tensor "
                           "that requires grad, computed outside it by %s, without taking it as "
                           "an argument (pass that tensor to checkpoint as an argument of the "
                           "function)", e->fn->name);
      } else if (e->fn) {
        status = segment_push(&seen, &stack, e->fn);
      }
    }
  }
  free(stack.items);
  free(seen.slots);
  if (!status) {
    for (int k = 0; k < found.n && k < cap; k++) {
      ddp_tensor_retain(found.items[k]);
      leaves[k] = found.items[k];
    }
    *n_leaves = found.n;
  }
  for (int k = 0; k < found.n; k++) ddp_tensor_release(found.items[k]);
  free(found.items);
  return status;
}
