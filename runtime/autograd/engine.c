/* runtime/autograd/engine.c: ddp_backward, the reverse walk over the tape.
 *
 * Note [backward order]: the engine first finds every node reachable from the root and
 * counts, per node, the edges that will deliver a gradient to it (deps) and, per leaf, the
 * edges into it (backward_pending). A node runs once all its deps arrived; among ready
 * nodes the most recently created runs first (a max-heap on seq), as PyTorch's engine does,
 * so gradients become ready in roughly reverse order of the forward. A leaf's gradient is
 * final when its last edge delivered: then its post-accumulate hooks run (the moment the
 * DDP reducer marks the parameter ready).
 *
 * Note [reentrant backward]: a hook or a Function's backward may run a backward of its own
 * (PyTorch's reentrant backward: a checkpointed segment recomputes its forward with grad on
 * and walks that fresh graph). Nodes keep the walk's scratch (mark, deps, grad_sum), so the
 * inner walk may not reach a node an open outer walk holds: discover refuses it, naming the
 * node. Leaves are shared: the inner walk counts its own edges into a leaf from 0 (the
 * outer walk's count is put aside and restored when the inner walk ends), so the leaf's
 * gradient is delivered and its post-accumulate hooks fire within the inner walk, and again
 * in the outer walk for the outer edges, as PyTorch's AccumulateGrad runs once per graph
 * task. The backward-end callbacks (the DDP reducer's finalize) run when the OUTERMOST walk
 * ends, as PyTorch's queue_callback runs at the end of the outer graph task. At most
 * MAX_NESTED_WALKS walks are open on one thread. */
#include <pthread.h>
#include <stdlib.h>

#include "core/profiler.h"
#include "tape/tape.h"
#include "ops/autocast.h"
#include "ops/copy.h"

typedef struct {
  ddp_node **items;
  size_t n, cap;
} node_vec;

static int vec_push(node_vec *v, ddp_node *n) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 64;
    ddp_node **items = realloc(v->items, cap * sizeof *items);
    if (!items) DDP_FAIL(DDP_ERR_MEMORY, "backward: out of memory");
    v->items = items;
    v->cap = cap;
  }
  v->items[v->n++] = n;
  return DDP_OK;
}

/* max-heap on seq */
static void heap_push(node_vec *h, ddp_node *n) {
  size_t i = h->n - 1;
  h->items[i] = n;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h->items[p]->seq >= h->items[i]->seq) break;
    ddp_node *t = h->items[p];
    h->items[p] = h->items[i];
    h->items[i] = t;
    i = p;
  }
}

static ddp_node *heap_pop(node_vec *h) {
  ddp_node *top = h->items[0];
  h->items[0] = h->items[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && h->items[l]->seq > h->items[m]->seq) m = l;
    if (r < h->n && h->items[r]->seq > h->items[m]->seq) m = r;
    if (m == i) break;
    ddp_node *t = h->items[m];
    h->items[m] = h->items[i];
    h->items[i] = t;
    i = m;
  }
  return top;
}

/* Gradient accumulation into a slot that owns its tensor. The first contribution is kept
 * as it is when we may (a fresh contiguous tensor nobody else holds), else copied, so a
 * later in-place += never writes into someone else's storage. */
static int accumulate(ddp_tensor **slot, ddp_tensor *g, int dtype, int ndim, const int64_t *shape,
                      const char *what) {
  if (g->ndim != ndim || memcmp(g->shape, shape, sizeof(int64_t) * ndim))
    DDP_FAIL(DDP_ERR_STATE, "backward: %s produced a gradient of shape %s for an input of shape "
             "%s", what, DDP_SHAPE(g), ddp_shape_str(ndim, shape));
  if (*slot) return ddp_accumulate_(*slot, g);
  int exclusive = g->refcount == 1 && g->storage->refcount == 1 && ddp_tensor_is_contiguous(g) &&
                  g->dtype == dtype && g->offset == 0;
  if (exclusive) {
    ddp_tensor_retain(g);
    *slot = g;
    return DDP_OK;
  }
  ddp_tensor *copy;
  DDP_TRY(ddp_tensor_zeros(&copy, ndim, shape, dtype, g->device));
  int status = ddp_accumulate_(copy, g);
  if (status) {
    ddp_tensor_release(copy);
    return status;
  }
  *slot = copy;
  return DDP_OK;
}

enum { MAX_NESTED_WALKS = 8 };

/* Walks begun and not ended on this thread and their marks, outermost first (Note
 * [reentrant backward]). */
static __thread int walks_open;
static __thread int64_t open_marks[MAX_NESTED_WALKS];

/* A leaf an inner walk reaches: the outer walks' pending count, put aside (Note [reentrant
 * backward]); the walk holds a reference to the leaf meanwhile. */
typedef struct {
  ddp_tensor *leaf;
  int64_t outer_pending;
} saved_pending;

typedef struct {
  saved_pending *items;
  int n, cap;
} pending_vec;

/* In an inner walk, the first time leaf is seen: put its outer count aside, start from 0. */
static int set_aside(pending_vec *v, ddp_tensor *leaf) {
  for (int k = 0; k < v->n; k++)
    if (v->items[k].leaf == leaf) return DDP_OK;
  if (v->n == v->cap) {
    int cap = v->cap ? 2 * v->cap : 16;
    saved_pending *items = realloc(v->items, (size_t)cap * sizeof *items);
    if (!items) DDP_FAIL(DDP_ERR_MEMORY, "backward: out of memory");
    v->items = items;
    v->cap = cap;
  }
  ddp_tensor_retain(leaf);
  v->items[v->n++] = (saved_pending){leaf, leaf->backward_pending};
  leaf->backward_pending = 0;
  return DDP_OK;
}

/* Give the outer walks their counts back and drop the references. */
static void restore_pending(pending_vec *v) {
  for (int k = 0; k < v->n; k++) {
    v->items[k].leaf->backward_pending = v->items[k].outer_pending;
    ddp_tensor_release(v->items[k].leaf);
  }
  free(v->items);
  memset(v, 0, sizeof *v);
}

/* A node an open outer walk holds (its mark is one of theirs). */
static int held_by_outer_walk(const ddp_node *n, int depth) {
  for (int k = 0; k < depth; k++)
    if (n->mark == open_marks[k]) return 1;
  return 0;
}

/* Find the reachable nodes (iterative DFS), count deps and leaf edges. depth > 0: an inner
 * walk (Note [reentrant backward]): outer walks' nodes are refused, leaf counts set aside
 * into `aside`. */
static int discover(ddp_node *root, int64_t mark, node_vec *all, int depth, pending_vec *aside) {
  node_vec stack = {0};
  int status = vec_push(&stack, root);
  root->mark = mark;
  root->deps = 0;
  if (!status) status = vec_push(all, root);
  while (!status && stack.n) {
    ddp_node *n = stack.items[--stack.n];
    for (int i = 0; i < n->n_inputs && !status; i++) {
      ddp_edge *e = &n->edges[i];
      if (e->leaf && depth > 0 && (status = set_aside(aside, e->leaf))) break;
      if (e->leaf) e->leaf->backward_pending++;
      if (!e->fn) continue;
      if (e->fn->mark != mark && depth > 0 && held_by_outer_walk(e->fn, depth)) {
        status = DDP_ERROR(DDP_ERR_STATE, "backward: a backward run inside another backward "
                           "(reentrant, from a hook or a Function's backward) reaches %s, a node "
                           "of the graph the outer backward is walking; a reentrant backward "
                           "must walk a graph of its own (e.g. a recomputed checkpoint segment)",
                           e->fn->name);
        break;
      }
      if (e->fn->mark != mark) {
        e->fn->mark = mark;
        e->fn->deps = 0;
        status = vec_push(all, e->fn);
        if (!status) status = vec_push(&stack, e->fn);
      }
      e->fn->deps++;
    }
  }
  free(stack.items);
  return status;
}

/* Leaves reachable only through nodes that failed: forget their pending counts. */
static void reset_pending(node_vec *all) {
  for (size_t k = 0; k < all->n; k++) {
    ddp_node *n = all->items[k];
    ddp_tensor_release(n->grad_sum);
    n->grad_sum = NULL;
    for (int i = 0; i < n->n_inputs; i++)
      if (n->edges[i].leaf) n->edges[i].leaf->backward_pending = 0;
  }
}

/* ---- backward-end callbacks ---------------------------------------------------------- */

typedef struct {
  ddp_backward_end_fn fn;
  void *ctx;
  int64_t id;
} end_callback;

static pthread_mutex_t end_lock = PTHREAD_MUTEX_INITIALIZER;
static end_callback *end_callbacks;
static int n_end_callbacks, cap_end_callbacks;
static int64_t next_end_id;

int ddp_autograd_add_backward_end(ddp_backward_end_fn fn, void *ctx, int64_t *handle) {
  if (!fn) DDP_FAIL(DDP_ERR_ARG, "add_backward_end: callback is NULL");
  pthread_mutex_lock(&end_lock);
  if (n_end_callbacks == cap_end_callbacks) {
    int cap = cap_end_callbacks ? 2 * cap_end_callbacks : 4;
    end_callback *grown = realloc(end_callbacks, (size_t)cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&end_lock);
      DDP_FAIL(DDP_ERR_MEMORY, "add_backward_end: out of memory");
    }
    end_callbacks = grown;
    cap_end_callbacks = cap;
  }
  end_callbacks[n_end_callbacks].fn = fn;
  end_callbacks[n_end_callbacks].ctx = ctx;
  end_callbacks[n_end_callbacks].id = ++next_end_id;
  if (handle) *handle = next_end_id;
  n_end_callbacks++;
  pthread_mutex_unlock(&end_lock);
  return DDP_OK;
}

int ddp_autograd_remove_backward_end(int64_t handle) {
  pthread_mutex_lock(&end_lock);
  for (int i = 0; i < n_end_callbacks; i++) {
    if (end_callbacks[i].id != handle) continue;
    memmove(&end_callbacks[i], &end_callbacks[i + 1],
            (size_t)(n_end_callbacks - i - 1) * sizeof *end_callbacks);
    n_end_callbacks--;
    pthread_mutex_unlock(&end_lock);
    return DDP_OK;
  }
  pthread_mutex_unlock(&end_lock);
  DDP_FAIL(DDP_ERR_ARG, "remove_backward_end: no callback with handle %lld", (long long)handle);
}

/* Run the callbacks on a snapshot (a callback may remove itself). The first failure wins
 * over a successful walk. */
static int run_end_callbacks(int status) {
  pthread_mutex_lock(&end_lock);
  int n = n_end_callbacks;
  end_callback snapshot[16], *list = n <= 16 ? snapshot : malloc((size_t)n * sizeof *list);
  if (list && n > 0) memcpy(list, end_callbacks, (size_t)n * sizeof *list);
  pthread_mutex_unlock(&end_lock);
  if (!list) return status ? status : DDP_ERROR(DDP_ERR_MEMORY, "backward: out of memory");
  for (int i = 0; i < n; i++) {
    int s = list[i].fn(list[i].ctx, status);
    if (s && !status) status = s;
  }
  if (list != snapshot) free(list);
  return status;
}


/* ---- the walk (Note [backward order]; Note [stepwise backward] in ddplua/autograd.h) ---- */

/* Where the walk stands: a node is popped (POP), its gradient shown to the deferred hooks
 * on its output (PRE_HOOK), run (RUN; a Function node waits for the caller's answers in
 * between), then its input gradients are handed on one input at a time (INPUT), a leaf's
 * into its .grad (LEAF) or, when it has deferred grad hooks, into a buffer that the hooks
 * see once every edge delivered (LEAF_HOOK), and, once final, through its post-accumulate
 * hooks (LEAF_POST). Every phase that reports an event returns from ddp_backward_step and picks
 * up where it stopped at the next call. */
enum walk_phase { PH_POP, PH_PRE_HOOK, PH_RUN, PH_AFTER_RUN, PH_INPUT, PH_LEAF, PH_LEAF_HOOK,
                  PH_LEAF_POST, PH_INPUT_DONE };

struct ddp_backward_walk {
  node_vec all, ready;
  ddp_node *root;          /* GraphRoot: one edge per output (owned) */
  ddp_tensor **root_grads; /* the outputs' gradients (owned), handed on by the root */
  int retain_graph, prev_grad_mode, finished, failed;
  unsigned prev_autocast;  /* autocast is off while the walk is open: backward runs in the
                            * forward's dtypes (ddp_autocast_suspend) */
  int n_inputs;            /* autograd.grad: the tensors whose gradients are collected */
  ddp_tensor **inputs, **results;
  ddp_node *cur;           /* the node being run, its gradient and its inputs' gradients */
  ddp_tensor *g, **grads;
  int grads_cap, phase, hook_i, input_i;
  int answer_kind;         /* what ddp_backward_answer takes now: an event kind or 0 */
  ddp_tensor **answer_slot; /* DDP_BACKWARD_GRAD_HOOK: the gradient a hook may replace */
  ddp_tensor **buf_leaf, **buf_grad; /* leaves with grad hooks: their summed gradients */
  int n_buf, cap_buf, buf_at;
  int depth;               /* 0: the outermost walk of its thread (Note [reentrant backward]) */
  int skip_leaf_hooks;     /* leaves' grad hooks are not run (ddp_backward_skip_leaf_hooks) */
  pending_vec aside;       /* depth > 0: the outer walks' leaf counts */
};

/* 1 when the leaf has a deferred DDP_HOOK_GRAD hook. */
static int has_grad_hooks(const ddp_tensor *leaf) {
  const ddp_tensor_hooks *h = leaf->hooks;
  for (int k = 0; h && k < h->n; k++)
    if (!h->items[k].fn && h->items[k].kind == DDP_HOOK_GRAD) return 1;
  return 0;
}

/* The buffer slot of a leaf with grad hooks (found or added; weak: the walk's graph holds
 * the leaf); -1 with the error set on memory exhaustion. */
static int buffer_slot(ddp_backward_walk *w, ddp_tensor *leaf) {
  for (int k = 0; k < w->n_buf; k++)
    if (w->buf_leaf[k] == leaf) return k;
  if (w->n_buf == w->cap_buf) {
    int cap = w->cap_buf ? 2 * w->cap_buf : 8;
    ddp_tensor **l = realloc(w->buf_leaf, (size_t)cap * sizeof *l);
    if (l) w->buf_leaf = l;
    ddp_tensor **g = l ? realloc(w->buf_grad, (size_t)cap * sizeof *g) : NULL;
    if (g) w->buf_grad = g;
    if (!l || !g) {
      DDP_ERROR(DDP_ERR_MEMORY, "backward: out of memory");
      return -1;
    }
    w->cap_buf = cap;
  }
  w->buf_leaf[w->n_buf] = leaf;
  w->buf_grad[w->n_buf] = NULL;
  return w->n_buf++;
}

/* The input k of autograd.grad that t is, or -1. */
static int input_index(const ddp_backward_walk *w, const ddp_tensor *t) {
  for (int k = 0; k < w->n_inputs; k++)
    if (w->inputs[k] == t) return k;
  return -1;
}

/* A leaf's gradient g (NULL: none) into its .grad, or into the result when the leaf is an
 * input of autograd.grad (other leaves get nothing then). */
static int deliver(ddp_backward_walk *w, ddp_tensor *leaf, ddp_tensor *g, const char *from) {
  if (!g) return DDP_OK;
  int k = input_index(w, leaf);
  if (k >= 0) return accumulate(&w->results[k], g, leaf->dtype, leaf->ndim, leaf->shape, from);
  if (w->n_inputs) return DDP_OK;
  return accumulate(&leaf->grad, g, leaf->dtype, leaf->ndim, leaf->shape, from);
}

static int walk_fail(ddp_backward_walk *w, int status) {
  w->failed = 1;
  return status;
}

static void emit(ddp_backward_walk *w, ddp_backward_event *ev, int kind, int64_t id,
                 ddp_tensor *t) {
  ev->kind = kind;
  ev->id = id;
  ddp_tensor_retain(t);
  ev->tensor = t;
  w->answer_kind = kind;
}

int ddp_backward_step(ddp_backward_walk *w, ddp_backward_event *ev) {
  memset(ev, 0, sizeof *ev);
  ev->kind = DDP_BACKWARD_DONE;
  if (!w) DDP_FAIL(DDP_ERR_ARG, "backward: no walk");
  if (w->failed) DDP_FAIL(DDP_ERR_STATE, "backward: the walk failed earlier; end it");
  if (w->finished) return DDP_OK;
  w->answer_kind = 0;
  w->answer_slot = NULL;
  int status = DDP_OK;
  for (;;) {
    ddp_node *n = w->cur;
    int i = w->input_i;
    ddp_edge *e = n && i < n->n_inputs ? &n->edges[i] : NULL;
    ddp_tensor_hooks *h = e && e->leaf ? e->leaf->hooks : NULL;
    switch (w->phase) {
    case PH_POP:
      if (!w->ready.n) {
        w->finished = 1;
        w->cur = NULL;
        status = w->depth == 0 ? run_end_callbacks(DDP_OK) : DDP_OK;
        return status ? walk_fail(w, status) : DDP_OK;
      }
      w->cur = heap_pop(&w->ready);
      w->g = w->cur->grad_sum;
      w->cur->grad_sum = NULL;
      w->hook_i = 0;
      w->phase = PH_PRE_HOOK;
      break;
    case PH_PRE_HOOK:
      if (w->g && w->hook_i < n->n_pre_hooks) {
        emit(w, ev, DDP_BACKWARD_GRAD_HOOK, n->pre_hooks[w->hook_i++], w->g);
        w->answer_slot = &w->g;
        return DDP_OK;
      }
      w->phase = PH_RUN;
      break;
    case PH_RUN:
      if (w->g) {
        for (int k = 0; k < w->n_inputs && !status; k++) /* a non-leaf input of autograd.grad */
          if (w->inputs[k]->grad_fn == n)
            status = accumulate(&w->results[k], w->g, w->inputs[k]->dtype, w->inputs[k]->ndim,
                                w->inputs[k]->shape, n->name);
        if (!status && !w->n_inputs && n->retain_target && n->retain_target->retains_grad) {
          ddp_tensor *t = n->retain_target;
          status = accumulate(&t->grad, w->g, t->dtype, t->ndim, t->shape, n->name);
        }
        if (status) return walk_fail(w, status);
      }
      if (n->n_inputs > w->grads_cap) {
        ddp_tensor **grown = realloc(w->grads, (size_t)n->n_inputs * sizeof *grown);
        if (!grown) return walk_fail(w, DDP_ERROR(DDP_ERR_MEMORY, "backward: out of memory"));
        w->grads = grown;
        w->grads_cap = n->n_inputs;
      }
      for (int k = 0; k < n->n_inputs; k++) w->grads[k] = NULL;
      w->phase = PH_AFTER_RUN;
      if (n == w->root) {
        for (int k = 0; k < n->n_inputs; k++) {
          w->grads[k] = w->root_grads[k];
          w->root_grads[k] = NULL;
        }
      } else if (n->function_id) {
        if (w->g) {
          emit(w, ev, DDP_BACKWARD_FUNCTION, n->function_id, w->g);
          ev->n_inputs = n->n_inputs;
          return DDP_OK;
        }
      } else if ((w->g || n->collective) && n->backward) {
        /* a collective runs without a gradient too (Note [collectives on the tape]) */
        int64_t t0 = 0;
        if (DDP_PROF_ON()) { /* Note [profiler events] */
          ddp_prof_kernel_cancel();
          t0 = ddp_prof_now();
        }
        status = n->backward(n, w->g, w->grads);
        if (t0) {
          ddp_prof_kernel_cancel();
          ddp_prof_record(n->name, DDP_PROF_AUTOGRAD, t0, -1, -1, NULL);
        }
        if (status) return walk_fail(w, status);
      }
      break;
    case PH_AFTER_RUN:
      ddp_tensor_release(w->g);
      w->g = NULL;
      if (!w->retain_graph) {
        n->released = 1; /* before: a CopySlices passes it on to the op it wraps */
        ddp_node_release_saved(n);
      }
      w->input_i = 0;
      w->phase = PH_INPUT;
      break;
    case PH_INPUT:
      if (i == n->n_inputs) {
        w->phase = PH_POP;
        break;
      }
      if (w->grads[i] && e->fn) {
        status = accumulate(&e->fn->grad_sum, w->grads[i], n->inputs[i].dtype, n->inputs[i].ndim,
                            n->inputs[i].shape, n->name);
        if (status) return walk_fail(w, status);
      }
      w->phase = e->leaf ? PH_LEAF : PH_INPUT_DONE;
      break;
    case PH_LEAF: {
      ddp_tensor *leaf = e->leaf;
      if (w->skip_leaf_hooks || !has_grad_hooks(leaf)) { /* straight into .grad (or the result) */
        status = deliver(w, leaf, w->grads[i], n->name);
        if (status) return walk_fail(w, status);
        w->hook_i = 0;
        w->phase = --leaf->backward_pending == 0 && !w->n_inputs ? PH_LEAF_POST : PH_INPUT_DONE;
        break;
      }
      /* hooks see the sum of every edge's contribution, once (PyTorch's AccumulateGrad) */
      int k = buffer_slot(w, leaf);
      if (k < 0) return walk_fail(w, ddp_last_status());
      if (w->grads[i]) {
        status = accumulate(&w->buf_grad[k], w->grads[i], leaf->dtype, leaf->ndim, leaf->shape,
                            n->name);
        if (status) return walk_fail(w, status);
      }
      w->hook_i = 0;
      w->buf_at = k;
      w->phase = --leaf->backward_pending == 0 ? PH_LEAF_HOOK : PH_INPUT_DONE;
      break;
    }
    case PH_LEAF_HOOK: {
      ddp_tensor **slot = &w->buf_grad[w->buf_at];
      while (*slot && h && w->hook_i < h->n) {
        ddp_hook_item *it = &h->items[w->hook_i++];
        if (it->fn || it->kind != DDP_HOOK_GRAD) continue;
        emit(w, ev, DDP_BACKWARD_GRAD_HOOK, it->id, *slot);
        w->answer_slot = slot;
        return DDP_OK;
      }
      status = deliver(w, e->leaf, *slot, n->name);
      ddp_tensor_release(*slot);
      *slot = NULL;
      if (status) return walk_fail(w, status);
      w->hook_i = 0;
      w->phase = w->n_inputs ? PH_INPUT_DONE : PH_LEAF_POST;
      break;
    }
    case PH_LEAF_POST:
      while (h && w->hook_i < h->n) {
        ddp_hook_item *it = &h->items[w->hook_i++];
        if (it->kind != DDP_HOOK_POST_ACCUMULATE) continue;
        if (it->fn) {
          it->fn(e->leaf, it->ctx);
          continue;
        }
        emit(w, ev, DDP_BACKWARD_POST_HOOK, it->id, e->leaf);
        return DDP_OK;
      }
      w->phase = PH_INPUT_DONE;
      break;
    case PH_INPUT_DONE:
      ddp_tensor_release(w->grads[i]);
      w->grads[i] = NULL;
      if (e->fn && --e->fn->deps == 0) {
        if ((status = vec_push(&w->ready, e->fn))) return walk_fail(w, status);
        heap_push(&w->ready, e->fn);
      }
      w->input_i++;
      w->phase = PH_INPUT;
      break;
    }
  }
}

int ddp_backward_skip_leaf_hooks(ddp_backward_walk *w) {
  if (!w || w->failed || w->phase != PH_POP || w->cur)
    DDP_FAIL(DDP_ERR_STATE, "backward: leaf hooks can be skipped only before the first step");
  w->skip_leaf_hooks = 1;
  return DDP_OK;
}

int ddp_backward_answer(ddp_backward_walk *w, int i, ddp_tensor *grad) {
  if (!w || w->failed || w->finished || !w->answer_kind)
    DDP_FAIL(DDP_ERR_STATE, "backward: nothing to answer now");
  if (grad) DDP_TRY(ddp_check_alive(grad, "backward", "gradient"));
  if (w->answer_kind == DDP_BACKWARD_GRAD_HOOK) {
    ddp_tensor *old = *w->answer_slot;
    if (i != 0) DDP_FAIL(DDP_ERR_ARG, "backward: a hook answers one gradient");
    if (!grad) return DDP_OK; /* nil from a hook: keep the gradient */
    if (grad->ndim != old->ndim || memcmp(grad->shape, old->shape, sizeof(int64_t) * old->ndim))
      DDP_FAIL(DDP_ERR_ARG, "hook: the hook returned a gradient of shape %s for a gradient of "
               "shape %s", DDP_SHAPE(grad), DDP_SHAPE(old));
    ddp_tensor_retain(grad);
    *w->answer_slot = grad;
    ddp_tensor_release(old);
    return DDP_OK;
  }
  ddp_node *n = w->cur; /* DDP_BACKWARD_FUNCTION */
  if (i < 0 || i >= n->n_inputs)
    DDP_FAIL(DDP_ERR_ARG, "%s: backward answered input %d of %d", n->name, i + 1, n->n_inputs);
  if (!n->edges[i].fn && !n->edges[i].leaf) return DDP_OK; /* needs no gradient */
  const ddp_input_meta *m = &n->inputs[i];
  if (grad && (grad->ndim != m->ndim || memcmp(grad->shape, m->shape, sizeof(int64_t) * m->ndim))) {
    /* a gradient of a shape the input broadcasts to is summed back to it, as PyTorch's
     * validate_outputs does */
    int ok = m->ndim <= grad->ndim;
    for (int d = 0; ok && d < m->ndim; d++) {
      int64_t a = m->shape[m->ndim - 1 - d], b = grad->shape[grad->ndim - 1 - d];
      ok = a == b || a == 1;
    }
    if (!ok)
      DDP_FAIL(DDP_ERR_ARG, "%s: backward returned a gradient of shape %s for input %d of shape "
               "%s", n->name, DDP_SHAPE(grad), i + 1, ddp_shape_str(m->ndim, m->shape));
    ddp_tensor *summed;
    DDP_TRY(ddp_sum_to_shape(&summed, grad, m->ndim, m->shape));
    ddp_tensor_release(w->grads[i]);
    w->grads[i] = summed;
    return DDP_OK;
  }
  ddp_tensor_retain(grad);
  ddp_tensor_release(w->grads[i]);
  w->grads[i] = grad;
  return DDP_OK;
}

int ddp_backward_saved(ddp_backward_walk *w, int slot, ddp_tensor **out) {
  *out = NULL;
  if (!w || w->answer_kind != DDP_BACKWARD_FUNCTION)
    DDP_FAIL(DDP_ERR_STATE, "saved_tensors: only inside a Function's backward");
  if (slot < 0 || slot >= w->cur->n_saved)
    DDP_FAIL(DDP_ERR_ARG, "saved_tensors: %s saved %d tensors, asked for %d", w->cur->name,
             w->cur->n_saved, slot + 1);
  if (!w->cur->saved[slot].tensor && !w->cur->released) return DDP_OK; /* saved nil */
  ddp_tensor *t = ddp_node_saved(w->cur, slot);
  if (!t) return ddp_last_status();
  ddp_tensor_retain(t);
  *out = t;
  return DDP_OK;
}

ddp_tensor *ddp_backward_result(ddp_backward_walk *w, int i) {
  if (!w || !w->finished || i < 0 || i >= w->n_inputs || !w->results[i]) return NULL;
  ddp_tensor_retain(w->results[i]);
  return w->results[i];
}

/* A gradient of 1 for a one-element output. */
static int ones_like(ddp_tensor **out, const ddp_tensor *t) {
  DDP_TRY(ddp_tensor_empty(out, t->ndim, t->shape, t->dtype, t->device));
  if (t->device == DDP_DEVICE_CPU) {
    ddp_store_f64(ddp_data(*out), (*out)->dtype, 1.0);
    return DDP_OK;
  }
  int status = ddp_fill_(*out, 1.0);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

static int check_outputs(int n, ddp_tensor *const *outputs, ddp_tensor *const *grads,
                         int n_inputs, ddp_tensor *const *inputs) {
  if (n < 1 || !outputs) DDP_FAIL(DDP_ERR_ARG, "backward: no outputs to differentiate");
  for (int i = 0; i < n; i++) {
    ddp_tensor *root = outputs[i];
    DDP_TRY(ddp_check_alive(root, "backward", "self"));
    DDP_TRY(ddp_autograd_refresh_view(root));
    if (!root->requires_grad)
      DDP_FAIL(DDP_ERR_ARG, "backward: the tensor %s does not require grad and has no grad_fn",
               DDP_SHAPE(root));
    const ddp_tensor *grad = grads ? grads[i] : NULL;
    if (grad) {
      DDP_TRY(ddp_check_alive(grad, "backward", "gradient"));
      if (grad->ndim != root->ndim || memcmp(grad->shape, root->shape, sizeof(int64_t) * root->ndim))
        DDP_FAIL(DDP_ERR_ARG, "backward: gradient of shape %s given for a tensor of shape %s",
                 DDP_SHAPE(grad), DDP_SHAPE(root));
    } else if (root->numel != 1) {
      DDP_FAIL(DDP_ERR_ARG, "backward: grad can be implicitly created only for a tensor with one "
               "element, got %s; pass a gradient", DDP_SHAPE(root));
    }
  }
  for (int k = 0; k < n_inputs; k++) {
    DDP_TRY(ddp_check_alive(inputs[k], "autograd.grad", "inputs"));
    DDP_TRY(ddp_autograd_refresh_view(inputs[k]));
    if (!inputs[k]->requires_grad)
      DDP_FAIL(DDP_ERR_ARG, "autograd.grad: input %d (%s) does not require grad", k + 1,
               DDP_SHAPE(inputs[k]));
  }
  return DDP_OK;
}

void ddp_backward_end(ddp_backward_walk *w) {
  if (!w) return;
  if (!w->finished) {
    reset_pending(&w->all);
    int status = w->failed ? ddp_last_status() : DDP_ERR_STATE;
    if (w->depth == 0) run_end_callbacks(status ? status : DDP_ERR_STATE);
  }
  restore_pending(&w->aside);
  ddp_tensor_release(w->g);
  for (int k = 0; k < w->grads_cap; k++) ddp_tensor_release(w->grads[k]); /* NULL or owned */
  for (int k = 0; k < w->n_buf; k++) ddp_tensor_release(w->buf_grad[k]);
  free(w->buf_leaf);
  free(w->buf_grad);
  for (int k = 0; w->root && k < w->root->n_inputs; k++) ddp_tensor_release(w->root_grads[k]);
  for (int k = 0; k < w->n_inputs; k++) {
    ddp_tensor_release(w->inputs[k]);
    ddp_tensor_release(w->results[k]);
  }
  ddp_node_release(w->root);
  free(w->root_grads);
  free(w->inputs);
  free(w->results);
  free(w->grads);
  free(w->all.items);
  free(w->ready.items);
  ddp_autocast_resume(w->prev_autocast);
  ddp_set_grad_enabled(w->prev_grad_mode);
  free(w);
  walks_open--;
}

int ddp_backward_begin(ddp_backward_walk **out, int n, ddp_tensor *const *outputs,
                       ddp_tensor *const *grads, int n_inputs, ddp_tensor *const *inputs,
                       int retain_graph) {
  *out = NULL;
  if (walks_open >= MAX_NESTED_WALKS)
    DDP_FAIL(DDP_ERR_STATE, "backward: %d backward walks are open on this thread (reentrant "
             "backward from hooks or Functions' backward nests at most %d deep)", walks_open,
             MAX_NESTED_WALKS);
  DDP_TRY(check_outputs(n, outputs, grads, n_inputs, inputs));
  ddp_backward_walk *w = calloc(1, sizeof *w);
  if (!w) DDP_FAIL(DDP_ERR_MEMORY, "backward: out of memory");
  w->depth = walks_open++;
  open_marks[w->depth] = 0;
  w->prev_grad_mode = ddp_set_grad_enabled(0);
  w->prev_autocast = ddp_autocast_suspend();
  w->retain_graph = retain_graph;
  w->finished = 1; /* until set up: ending it then runs no callbacks */
  w->phase = PH_POP;
  int status = DDP_OK;
  w->root_grads = calloc((size_t)n, sizeof *w->root_grads);
  if (n_inputs > 0) {
    w->inputs = calloc((size_t)n_inputs, sizeof *w->inputs);
    w->results = calloc((size_t)n_inputs, sizeof *w->results);
  }
  if (!w->root_grads || (n_inputs > 0 && (!w->inputs || !w->results)))
    status = DDP_ERROR(DDP_ERR_MEMORY, "backward: out of memory");
  for (int k = 0; !status && k < n_inputs; k++) {
    ddp_tensor_retain(inputs[k]);
    w->inputs[w->n_inputs++] = inputs[k];
  }
  if (!status) {
    w->root = ddp_node_new("GraphRoot", NULL, n, outputs, 0);
    if (!w->root) status = ddp_last_status();
  }
  for (int i = 0; !status && i < n; i++) {
    if (grads && grads[i]) {
      if (!(w->root_grads[i] = ddp_tensor_alias(grads[i]))) status = ddp_last_status();
    } else {
      status = ones_like(&w->root_grads[i], outputs[i]);
    }
  }
  if (status) {
    ddp_backward_end(w);
    return status;
  }
  static int64_t next_mark;
  int64_t mark = __atomic_add_fetch(&next_mark, 1, __ATOMIC_RELAXED);
  w->finished = 0;
  open_marks[w->depth] = mark;
  status = discover(w->root, mark, &w->all, w->depth, &w->aside);
  for (size_t k = 0; !status && k < w->all.n; k++) w->all.items[k]->grad_sum = NULL;
  if (!status) status = vec_push(&w->ready, w->root);
  if (status) {
    w->failed = 1;
    ddp_backward_end(w);
    return status;
  }
  heap_push(&w->ready, w->root);
  *out = w;
  return DDP_OK;
}

int ddp_backward(ddp_tensor *root, const ddp_tensor *grad, int retain_graph) {
  ddp_backward_walk *w;
  ddp_tensor *g = (ddp_tensor *)grad;
  DDP_TRY(ddp_backward_begin(&w, 1, &root, &g, 0, NULL, retain_graph));
  ddp_backward_event ev;
  int status;
  while (!(status = ddp_backward_step(w, &ev)) && ev.kind != DDP_BACKWARD_DONE) {
    ddp_tensor_release(ev.tensor);
    status = DDP_ERROR(DDP_ERR_STATE, "backward: the graph holds a %s defined by the front end "
                       "(id %lld), which only its driver loop can run (ddp_backward_step)",
                       ev.kind == DDP_BACKWARD_FUNCTION ? "Function" : "hook",
                       (long long)ev.id);
    w->failed = 1;
    break;
  }
  ddp_backward_end(w);
  return status;
}
