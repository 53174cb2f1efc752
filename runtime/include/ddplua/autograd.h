/* ddplua/autograd.h: part of the public API, included by ddplua.h only.
 *
 * The backward walk as a sequence of steps, for front ends whose own code takes part in
 * backward (Lua-defined autograd Functions and tensor hooks) without the engine calling
 * into that code: the runtime never calls back into Lua (FFI design: no callbacks).
 *
 * Note [stepwise backward]: ddp_backward_begin prepares a walk from one or more outputs.
 * Each ddp_backward_step runs the walk in C as far as it can and returns at the first
 * point that needs the caller, describing it in a ddp_backward_event:
 *   GRAD_HOOK  a hook registered with ddp_tensor_add_deferred_hook(DDP_HOOK_GRAD) must see
 *              a gradient (event.tensor); the caller may replace it with
 *              ddp_backward_answer(w, 0, new_grad) before the next step.
 *   POST_HOOK  a leaf's gradient is final (event.tensor is the leaf): run the caller's
 *              DDP_HOOK_POST_ACCUMULATE hook event.id.
 *   FUNCTION   a node recorded by ddp_autograd_record_function must run its backward:
 *              event.tensor is the gradient of its output; the caller gives one gradient
 *              per input with ddp_backward_answer(w, i, grad) (none: no gradient), reading
 *              the tensors it saved with ddp_backward_saved.
 *   DONE       the walk finished (the backward-end callbacks ran).
 * The caller's code runs between steps with grad mode off, as backward functions do;
 * ddp_backward_end restores it and frees the walk (after DONE, after an error, or to
 * abandon the walk when the caller's code failed). C hooks (post-accumulate hooks with a
 * function pointer, the DDP reducer's) still run inside the step. ddp_backward is
 * begin + steps + end and fails on an event it cannot handle (a graph with a Function
 * node or deferred hooks needs its front end's driver loop).
 */
#ifndef DDPLUA_AUTOGRAD_H
#define DDPLUA_AUTOGRAD_H

typedef struct ddp_backward_walk ddp_backward_walk;

enum ddp_backward_event_kind {
  DDP_BACKWARD_DONE = 0,
  DDP_BACKWARD_GRAD_HOOK = 1,
  DDP_BACKWARD_POST_HOOK = 2,
  DDP_BACKWARD_FUNCTION = 3
};

typedef struct ddp_backward_event {
  int kind;           /* enum ddp_backward_event_kind */
  int n_inputs;       /* FUNCTION: gradients to answer (inputs of the node) */
  int64_t id;         /* the hook's handle or the function's id */
  ddp_tensor *tensor; /* new reference (the caller releases it): see Note [stepwise backward] */
} ddp_backward_event;

/* Start a backward walk from n outputs (each requiring grad) with their gradients
 * (grads[i] of outputs[i]'s shape; NULL only for a one-element output: then 1).
 * inputs (n_inputs of them, may be 0/NULL): when given, the walk computes the gradients
 * of the outputs w.r.t. these tensors only, collected for ddp_backward_result, and no
 * leaf's .grad is touched and no post-accumulate hook runs (autograd.grad); else leaves
 * accumulate into .grad (backward). retain_graph as ddp_backward. Sets grad mode off until
 * ddp_backward_end. Errors (DDP_ERR_ARG): an output does not require grad, a gradient of
 * the wrong shape, a missing gradient for a non-scalar output, an input not requiring grad;
 * DDP_ERR_STATE while another walk is open on this thread (no reentrant backward). */
int ddp_backward_begin(ddp_backward_walk **out, int n, ddp_tensor *const *outputs,
                       ddp_tensor *const *grads, int n_inputs, ddp_tensor *const *inputs,
                       int retain_graph);

/* Call between ddp_backward_begin and the first step: the walk runs no DDP_HOOK_GRAD hook
 * of a leaf (the hooks registered on leaf tensors, register_hook's); the gradients are
 * delivered as without them. For a walk that computes a part of a gradient the outer
 * walk delivers again in full (a checkpointed segment's recomputation, Note [checkpoint
 * node] in lua/ddplua/utils/checkpoint.lua), so a hook sees the whole gradient once.
 * Errors: DDP_ERR_STATE after the first step or on a failed walk. */
int ddp_backward_skip_leaf_hooks(ddp_backward_walk *w);

/* Run the walk to its next event (filled into *ev). Returns a status: an op's backward
 * failing, a saved tensor modified in place (naming the op), a gradient of the wrong
 * shape from a Function. After a failure only ddp_backward_end may follow. */
int ddp_backward_step(ddp_backward_walk *w, ddp_backward_event *ev);

/* Answer the last event: GRAD_HOOK: i = 0, the gradient to use instead; FUNCTION: the
 * gradient of input i (0-based; NULL: none). The walk takes its own reference. Errors:
 * DDP_ERR_ARG for an i out of range or a gradient whose shape does not match the input's;
 * DDP_ERR_STATE when the last event takes no answer. */
int ddp_backward_answer(ddp_backward_walk *w, int i, ddp_tensor *grad);

/* Saved tensor `slot` of the FUNCTION node of the last event (a new reference), as
 * ddp_autograd_record_function saved it. Errors (DDP_ERR_STATE): freed by an earlier
 * backward without retain_graph, modified in place since (naming the function). */
int ddp_backward_saved(ddp_backward_walk *w, int slot, ddp_tensor **out);

/* After DONE with inputs given: the gradient w.r.t. inputs[i] (a new reference), or NULL
 * when the outputs do not depend on it. */
ddp_tensor *ddp_backward_result(ddp_backward_walk *w, int i);

/* Restore grad mode and free the walk (NULL ok). A walk ended before DONE runs the
 * backward-end callbacks with a failure status and forgets its partial state. */
void ddp_backward_end(ddp_backward_walk *w);

/* Record a node whose backward its front end runs (a Lua autograd.Function): output takes
 * the node (requires_grad 1; output must be a fresh tensor with no history), with one edge
 * per input (NULL entries allowed) and the n_saved tensors saved (detached, version
 * checked). `name` is copied. The walk reports the node as a FUNCTION event with `id`.
 * When the node is freed, id is queued for ddp_autograd_dropped_ids. Errors: DDP_ERR_ARG
 * for an output with a history; DDP_ERR_MEMORY. */
int ddp_autograd_record_function(ddp_tensor *output, const char *name, int64_t id,
                                 int n_inputs, ddp_tensor *const *inputs, int n_saved,
                                 ddp_tensor *const *saved);

/* The creation number of the newest node recorded so far (process-wide; nodes recorded
 * later have larger numbers): take it before running a segment for
 * ddp_autograd_segment_leaves. */
int64_t ddp_autograd_seq_now(void);

/* The leaves that require grad on which the n outputs (NULL entries allowed) depend through
 * nodes recorded after `since` (a ddp_autograd_seq_now value), each once, in the order
 * found; an output that is itself such a leaf counts. Up to cap of them go to leaves (new
 * references); *n_leaves gets how many there are (call again with cap >= *n_leaves when it
 * is larger). Note [checkpoint segment] in runtime/autograd/node.c. Errors (DDP_ERR_ARG):
 * a node recorded at or before `since` is reached (a tensor requiring grad computed outside
 * the segment, captured by it, named by its grad_fn); DDP_ERR_MEMORY. */
int ddp_autograd_segment_leaves(int n, ddp_tensor *const *outputs, int64_t since, int cap,
                                ddp_tensor **leaves, int *n_leaves);

enum ddp_hook_kind {
  DDP_HOOK_GRAD = 1,            /* sees (and may replace) the gradient w.r.t. the tensor */
  DDP_HOOK_POST_ACCUMULATE = 2  /* a leaf's .grad is final */
};

/* Register a hook the walk reports to its caller instead of calling (Note [stepwise
 * backward]). DDP_HOOK_GRAD: on any tensor that requires grad (a non-leaf's hook sits on
 * its current grad_fn, as PyTorch's); DDP_HOOK_POST_ACCUMULATE: leaves that require grad
 * only. *handle: a process-wide unique id, for ddp_tensor_remove_hook and the event.
 * When the tensor (or node) holding it is freed, the id is queued for
 * ddp_autograd_dropped_ids. Errors: DDP_ERR_ARG. */
int ddp_tensor_add_deferred_hook(ddp_tensor *t, int kind, int64_t *handle);

/* Take up to cap ids of deferred hooks and Function nodes freed since the last call (so a
 * front end can drop what it kept for them); returns how many were written. */
int ddp_autograd_dropped_ids(int64_t *ids, int cap);

#endif /* DDPLUA_AUTOGRAD_H */
