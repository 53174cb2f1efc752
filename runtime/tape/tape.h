/* runtime/tape/tape.h: the tape as ops see it. This header, node.c and
 * view_history.c (in-place writes through views) are the tape layer, below the ops (which record nodes) and above the core and backend; the backward
 * engine (runtime/autograd/engine.c) sits above the ops, whose front doors it calls to sum gradients. The
 * tape includes only the core (tools/check_layers.lua checks it).
 *
 * How an op records itself (the pattern every front door in runtime/ops follows):
 *
 *   ddp_tensor *inputs[2] = {a, b};
 *   ... compute *out without autograd ...
 *   if (ddp_autograd_needed(2, inputs)) {
 *     ddp_node *n = ddp_node_new("MulBackward", mul_backward, 2, inputs, 2);
 *     if (!n) { ddp_tensor_release(*out); *out = NULL; return ddp_last_status(); }
 *     ddp_node_save(n, 0, a);          // detached aliases; the version is remembered
 *     ddp_node_save(n, 1, b);
 *     ddp_autograd_set_output(*out, n); // out takes the node (owned reference)
 *   }
 *
 * A backward function receives the gradient of the node's single output (shape of the
 * output, contiguous or not) and writes one new tensor (or NULL: no gradient) per input
 * into grad_inputs[i], each of that input's shape (input_meta[i]) and dtype. Backward runs
 * with grad mode off, so it may call the ops' front doors freely. Nodes have one output:
 * multi-output ops (split, chunk) are made of single-output views.
 *
 * Note [saved tensors]: a node never saves a tensor with its graph attached (the saved
 * copy is a detached alias), so saving the op's own output makes no reference cycle. The
 * storage version at save time is kept; ddp_node_saved() fails if an in-place op wrote the
 * storage since, as PyTorch's "modified by an inplace operation" check.
 */
#ifndef DDP_AUTOGRAD_H
#define DDP_AUTOGRAD_H

#include "core/core.h"

typedef int (*ddp_backward_fn)(ddp_node *node, ddp_tensor *grad_output, ddp_tensor **grad_inputs);

/* Where an input's gradient goes: the node that produced it, or the leaf to accumulate
 * into (then fn is NULL), or nowhere (both NULL: input needs no gradient). */
typedef struct {
  ddp_node *fn;     /* owned reference */
  ddp_tensor *leaf; /* owned reference */
} ddp_edge;

/* What backward needs to know about an input without keeping it alive. */
typedef struct {
  int32_t dtype, ndim;
  int32_t device; /* DDP_DEVICE_CPU or a cuda index */
  int64_t shape[DDP_MAX_DIMS];
} ddp_input_meta;

typedef struct {
  ddp_tensor *tensor; /* detached alias, owned; NULL once released */
  int64_t version;
} ddp_saved;

struct ddp_node {
  int64_t refcount;
  const char *name;          /* "AddBackward": static string */
  ddp_backward_fn backward;
  int n_inputs, n_saved;
  ddp_edge *edges;           /* n_inputs */
  ddp_input_meta *inputs;    /* n_inputs */
  ddp_saved *saved;          /* n_saved */
  int released;              /* saved tensors freed by a backward without retain_graph */
  /* op attributes for backward (dims, flags, scalars); free for the op to use */
  int64_t iattr[8];
  double fattr[4];
  void *extra;               /* op-owned block, freed with extra_free (may be NULL) */
  ddp_node *wrapped;         /* owned: the in-place op a CopySlices node replays, else NULL */
  int64_t function_id;       /* a front end's Function node (backward NULL): its id, else 0 */
  int64_t *pre_hooks;        /* ids of deferred DDP_HOOK_GRAD hooks on the output, malloc'd */
  int n_pre_hooks;
  void (*extra_free)(void *);
  ddp_tensor *retain_target; /* weak: the output that asked for retain_grad */
  int64_t seq;               /* creation order: the engine runs later nodes first */
  uint8_t collective;        /* a differentiable collective's node: the engine runs its
                              * backward even without a gradient (grad_output NULL), so every
                              * rank joins the adjoint collective (Note [collectives on the
                              * tape] in ddplua/dist_functional.h) */
  /* engine scratch, valid during one backward */
  int64_t deps;
  ddp_tensor *grad_sum;
  int64_t mark;
};

/* 1 when grad mode is on and any of the n inputs (NULLs allowed) requires grad. */
int ddp_autograd_needed(int n, ddp_tensor *const *inputs);

/* A node with one edge per input (NULL inputs and inputs without requires_grad get empty
 * edges) and room for n_saved saved tensors. NULL with the error set on failure. */
ddp_node *ddp_node_new(const char *name, ddp_backward_fn backward, int n_inputs,
                       ddp_tensor *const *inputs, int n_saved);

/* Save a detached alias of t in slot (see Note [saved tensors]). t may be NULL. Returns a
 * status (memory). */
int ddp_node_save(ddp_node *node, int slot, const ddp_tensor *t);

/* The tensor saved in slot (a borrowed reference: do not release it), or NULL with the
 * error set when it was freed by an earlier
 * backward (second backward without retain_graph) or modified in place since. */
ddp_tensor *ddp_node_saved(ddp_node *node, int slot);

/* out becomes the node's output: requires_grad 1, grad_fn = node (out takes the caller's
 * reference). */
void ddp_autograd_set_output(ddp_tensor *out, ddp_node *node);

/* Record a single-input node whose backward needs no saved tensors, after the forward ran:
 * the helper for views and casts. Releases *out and returns the status on failure. */
int ddp_autograd_record_unary(ddp_tensor **out, ddp_tensor *input, const char *name,
                              ddp_backward_fn backward, const int64_t *iattr, int n_iattr);

/* ---- in-place writes (runtime/tape/view_history.c; Note [in-place on views]) ---- */

/* The check every in-place op runs before writing self while grad mode is on, PyTorch's:
 * "<op>: a leaf Variable that requires grad is being used in an in-place operation." and,
 * for a view of such a leaf, "<op>: a view of a leaf Variable that requires grad is being
 * used in an in-place operation." (DDP_ERR_ARG). Off grad mode every write is allowed. */
int ddp_autograd_check_inplace(const ddp_tensor *self, const char *op);

/* After an in-place op wrote self, node n (its inputs: self's old value first, then the
 * op's other operands) becomes self's history. When self is a view, n is wrapped in a
 * CopySlices node that becomes the base's history and self's history is regenerated from
 * the base. Takes n's reference (released on failure). Returns a status (memory). */
int ddp_autograd_rebase(ddp_tensor *self, ddp_node *n);

/* Bring a view's grad_fn up to date when its base's history was rewritten since it was
 * recorded (an in-place write through the base or another view): the view's history
 * becomes an AsStridedBackward of the base's. No-op for other tensors. Returns a status. */
int ddp_autograd_refresh_view(ddp_tensor *t);

/* 1 when t is a view whose base's history changed since t's grad_fn was made. */
static inline int ddp_autograd_view_is_stale(const ddp_tensor *t) {
  return t->view_base && t->view_base->grad_fn != t->view_base_fn;
}

void ddp_node_retain(ddp_node *node);
void ddp_node_release(ddp_node *node);

/* A leaf's hooks: C post-accumulate hooks (fn set) and deferred hooks (fn NULL, kind
 * DDP_HOOK_GRAD or DDP_HOOK_POST_ACCUMULATE) reported by the backward walk, in
 * registration order. */
typedef struct {
  ddp_grad_hook_fn fn;
  void *ctx;
  int64_t id;
  int kind;
} ddp_hook_item;

struct ddp_tensor_hooks {
  int n, cap;
  ddp_hook_item *items;
};

/* Queue the id of a deferred hook or Function node that was freed (for
 * ddp_autograd_dropped_ids). */
void ddp_autograd_drop_id(int64_t id);

/* Free the saved tensors of a node. */
void ddp_node_release_saved(ddp_node *n);

/* Free a hook list (NULL ok). */
void ddp_hooks_free(ddp_tensor_hooks *hooks);

#endif /* DDP_AUTOGRAD_H */
