/* runtime/autograd/engine.c: ddp_backward, the reverse walk over the tape.
 *
 * Note [backward order]: the engine first finds every node reachable from the root and
 * counts, per node, the edges that will deliver a gradient to it (deps) and, per leaf, the
 * edges into it (backward_pending). A node runs once all its deps arrived; among ready
 * nodes the most recently created runs first (a max-heap on seq), as PyTorch's engine does,
 * so gradients become ready in roughly reverse order of the forward. A leaf's gradient is
 * final when its last edge delivered: then its post-accumulate hooks run (the moment the
 * DDP reducer marks the parameter ready). */
#include <pthread.h>
#include <stdlib.h>

#include "autograd/autograd.h"
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

static int deliver_to_leaf(ddp_tensor *leaf, ddp_tensor *g, const char *from) {
  if (g) DDP_TRY(accumulate(&leaf->grad, g, leaf->dtype, leaf->ndim, leaf->shape, from));
  if (--leaf->backward_pending == 0) ddp_hooks_run(leaf);
  return DDP_OK;
}

/* Find the reachable nodes (iterative DFS), count deps and leaf edges. */
static int discover(ddp_node *root, int64_t mark, node_vec *all) {
  node_vec stack = {0};
  int status = vec_push(&stack, root);
  root->mark = mark;
  root->deps = 0;
  if (!status) status = vec_push(all, root);
  while (!status && stack.n) {
    ddp_node *n = stack.items[--stack.n];
    for (int i = 0; i < n->n_inputs && !status; i++) {
      ddp_edge *e = &n->edges[i];
      if (e->leaf) e->leaf->backward_pending++;
      if (!e->fn) continue;
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

static int run(ddp_node *root_fn, ddp_tensor *root_grad, int retain_graph) {
  static int64_t next_mark;
  int64_t mark = __atomic_add_fetch(&next_mark, 1, __ATOMIC_RELAXED);
  node_vec all = {0}, ready = {0};
  ddp_tensor *grads_stack[16], **grads = grads_stack;
  int status = discover(root_fn, mark, &all);
  if (status) goto done;
  for (size_t k = 0; k < all.n; k++) all.items[k]->grad_sum = NULL;
  ddp_tensor_retain(root_grad);
  root_fn->grad_sum = root_grad;
  if ((status = vec_push(&ready, root_fn))) goto done;
  heap_push(&ready, root_fn);
  while (ready.n) {
    ddp_node *n = heap_pop(&ready);
    ddp_tensor *g = n->grad_sum;
    n->grad_sum = NULL;
    if (n->n_inputs > 16) {
      if (grads != grads_stack) free(grads);
      grads = calloc((size_t)n->n_inputs, sizeof *grads);
      if (!grads) {
        grads = grads_stack;
        ddp_tensor_release(g);
        status = DDP_ERROR(DDP_ERR_MEMORY, "backward: out of memory");
        goto done;
      }
    }
    for (int i = 0; i < n->n_inputs; i++) grads[i] = NULL;
    if (g && n->retain_target && n->retain_target->retains_grad) {
      ddp_tensor *t = n->retain_target;
      status = accumulate(&t->grad, g, t->dtype, t->ndim, t->shape, n->name);
    }
    if (!status && g && n->backward) status = n->backward(n, g, grads);
    ddp_tensor_release(g);
    if (!retain_graph) {
      ddp_node_release_saved(n);
      n->released = 1;
    }
    for (int i = 0; i < n->n_inputs; i++) {
      ddp_edge *e = &n->edges[i];
      if (!status && grads[i]) {
        if (e->fn)
          status = accumulate(&e->fn->grad_sum, grads[i], n->inputs[i].dtype, n->inputs[i].ndim,
                              n->inputs[i].shape, n->name);
      }
      if (!status && e->leaf) status = deliver_to_leaf(e->leaf, grads[i], n->name);
      ddp_tensor_release(grads[i]);
      grads[i] = NULL;
      if (!status && e->fn && --e->fn->deps == 0) {
        if ((status = vec_push(&ready, e->fn))) break;
        heap_push(&ready, e->fn);
      }
    }
    if (status) goto done;
  }
done:
  if (status) reset_pending(&all);
  if (grads != grads_stack) free(grads);
  free(all.items);
  free(ready.items);
  return status;
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

int ddp_backward(ddp_tensor *root, const ddp_tensor *grad, int retain_graph) {
  DDP_TRY(ddp_check_alive(root, "backward", "self"));
  if (!root->requires_grad)
    DDP_FAIL(DDP_ERR_ARG, "backward: the tensor %s does not require grad and has no grad_fn",
             DDP_SHAPE(root));
  ddp_tensor *g;
  if (grad) {
    DDP_TRY(ddp_check_alive(grad, "backward", "gradient"));
    if (grad->ndim != root->ndim || memcmp(grad->shape, root->shape, sizeof(int64_t) * root->ndim))
      DDP_FAIL(DDP_ERR_ARG, "backward: gradient of shape %s given for a tensor of shape %s",
               DDP_SHAPE(grad), DDP_SHAPE(root));
    g = ddp_tensor_alias(grad);
    if (!g) return ddp_last_status();
  } else {
    if (root->numel != 1)
      DDP_FAIL(DDP_ERR_ARG, "backward: grad can be implicitly created only for a tensor with one "
               "element, got %s; pass a gradient", DDP_SHAPE(root));
    DDP_TRY(ddp_tensor_empty(&g, root->ndim, root->shape, root->dtype, root->device));
    if (root->device == DDP_DEVICE_CPU) {
      ddp_store_f64(ddp_data(g), g->dtype, 1.0);
    } else {
      int status = ddp_fill_(g, 1.0);
      if (status) {
        ddp_tensor_release(g);
        return status;
      }
    }
  }
  int prev = ddp_set_grad_enabled(0);
  unsigned autocast = ddp_autocast_suspend(); /* backward runs in the forward's dtypes */
  int status;
  if (root->grad_fn) {
    status = run(root->grad_fn, g, retain_graph);
  } else { /* a leaf: its gradient is the given one */
    root->backward_pending = 1;
    status = deliver_to_leaf(root, g, "backward");
  }
  status = run_end_callbacks(status);
  ddp_autocast_resume(autocast);
  ddp_set_grad_enabled(prev);
  ddp_tensor_release(g);
  return status;
}
