/* ddplua/reducer_fused_optim.h: part of the public API, included by ddplua.h only.
 *
 * The optimizer in backward of DistributedDataParallel (PyTorch's
 * DistributedDataParallel._register_fused_optim, which chains the optimizer after each
 * bucket's all-reduce: torch/distributed/algorithms/ddp_comm_hooks/optimizer_overlap_hooks.py
 * _hook_then_optimizer, and the reducer's optim_in_backward_), extending the reducer of
 * ddplua/reducer.h (runtime/distributed/reducer_fused_optim.c).
 *
 * Note [optimizer in backward]: once registered, the optimizer step of a bucket's parameters
 * runs as soon as that bucket's all-reduce has completed, with the bucket's slots (the
 * averaged gradients, Note [gradient averaging]) as the gradients, through the fused kernels
 * of ddplua/optim.h (ddp_sgd_step_, ddp_adam_step_, ddp_adamw_step_):
 *  - Each time a bucket is launched, the buckets launched before it whose all-reduce has
 *    completed (ddp_work_is_completed, never blocking) are stepped, so the updates of the
 *    first buckets overlap the rest of backward; at the end of backward the reducer waits
 *    for the others and steps them, in bucket order.
 *  - param.grad stays nil: the reducer copies each gradient into its bucket slot when the
 *    parameter is marked ready and drops the .grad tensor at once, so the model's full set
 *    of .grad tensors never exists outside the buckets, and nothing is copied back
 *    (gradient_as_bucket_view changes nothing then). A gradient accumulated under no_sync is
 *    taken into the bucket at the next synchronised backward, as usual. Call no
 *    optimizer.step() yourself: the parameters are already updated when backward returns.
 *  - The optimizer state (momentum buffers; Adam's exp_avg, exp_avg_sq, max_exp_avg_sq and
 *    per-parameter step count) belongs to the reducer, on the parameters' device, in an
 *    optimizer-state store (Note [optimizer state store] in ddplua/optim_state.h) updated by
 *    ddp_optim_step_param: the store and the step function of the Lua optimizers, so the
 *    state is the Lua optimizer's, entry for entry (ddp_reducer_fused_optim_state).
 *  - With find_unused_parameters, or in static_graph's first iteration, buckets are stepped
 *    only at the end of backward, after the used flags are all-reduced: a parameter unused on
 *    every rank is not stepped (it had no gradient, as a plain optimizer skips a nil .grad).
 *  - The result equals the plain path (backward, then the optimizer's step over .grad)
 *    bit for bit: the same kernels read the same averaged values, whatever the order.
 *  - The state can be read between iterations through the store itself
 *    (ddp_reducer_fused_optim_state) and replaced by ddp_reducer_fused_optim_load_state and
 *    _configure, which is what the Lua side's ddp:fused_optim_state_dict() /
 *    ddp:fused_optim_load_state_dict(sd) build on: a run
 *    checkpointed after N steps and resumed in a fresh reducer continues bit for bit as the
 *    uninterrupted one (the state is the whole of what a step reads besides the gradient).
 */

enum ddp_fused_optim_kind {
  DDP_FUSED_OPTIM_SGD = 1,   /* ddp_sgd_step_: lr, momentum, dampening, weight_decay, nesterov, maximize */
  DDP_FUSED_OPTIM_ADAM = 2,  /* ddp_adam_step_: lr, beta1, beta2, eps, weight_decay, amsgrad, maximize */
  DDP_FUSED_OPTIM_ADAMW = 3  /* ddp_adamw_step_: the same, weight decay decoupled */
};

/* Hyper-parameters (those a kind does not use are ignored), with ddplua/optim.h's meaning. */
typedef struct ddp_fused_optim_config {
  int kind;                  /* enum ddp_fused_optim_kind */
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
  double beta1, beta2, eps;
  int amsgrad;
} ddp_fused_optim_config;

/* Register the optimizer in backward (Note [optimizer in backward]) for every parameter of
 * the reducer. Errors: DDP_ERR_ARG (NULL arguments, an unknown kind, a hyper-parameter the
 * kernel would refuse: lr, momentum, weight_decay or eps < 0, a beta outside [0, 1), nesterov
 * without momentum or with dampening), DDP_ERR_STATE (one is already registered; a backward
 * was already reduced or is under way), DDP_ERR_MEMORY. */
int ddp_reducer_register_fused_optim(ddp_reducer *r, const ddp_fused_optim_config *cfg);

/* 1 when an optimizer in backward is registered. */
int ddp_reducer_has_fused_optim(const ddp_reducer *r);

/* Change the learning rate of the registered optimizer (for a schedule). Errors:
 * DDP_ERR_ARG (lr < 0 or NaN), DDP_ERR_STATE (none registered). */
int ddp_reducer_fused_optim_set_lr(ddp_reducer *r, double lr);

/* Bucket steps since registration: *during_backward ran while backward was going on (found
 * completed when a later bucket launched), *at_end after the end-of-backward wait. Either
 * pointer may be NULL. */
void ddp_reducer_fused_optim_counts(const ddp_reducer *r, int64_t *during_backward,
                                    int64_t *at_end);

/* Replace the hyper-parameters of the registered optimizer (a loaded state dict's options)
 * from the next step on; cfg->kind must be the registered kind. Errors: DDP_ERR_ARG (as
 * ddp_reducer_register_fused_optim; another kind, naming both), DDP_ERR_STATE (none
 * registered; a backward is under way). */
int ddp_reducer_fused_optim_configure(ddp_reducer *r, const ddp_fused_optim_config *cfg);

/* The store holding the state of the optimizer in backward (Note [optimizer state store]),
 * owned by the reducer, valid while it lives; NULL when none is registered (or r is NULL).
 * Its entries are keyed by the reducer's parameters and named as the Lua optimizers' state:
 * "momentum_buffer" (SGD with momentum != 0); "step", "exp_avg", "exp_avg_sq" and, with
 * amsgrad, "max_exp_avg_sq" (Adam / AdamW); none before a parameter's first step.
 * Read it between iterations (what ddp:fused_optim_state_dict does, through the Lua
 * optimizers' state view); change it through ddp_reducer_fused_optim_load_state. */
ddp_optim_state *ddp_reducer_fused_optim_state(ddp_reducer *r);

/* Replace the whole state of the optimizer in backward by src's entries for the reducer's
 * parameters (tensors shared with src, not copied; a parameter without an entry in src has
 * none afterwards), after checking every tensor of src's entries has its parameter's
 * shape, dtype and device (naming the parameter and the name). Not while a backward is
 * under way. Errors: DDP_ERR_ARG (NULL arguments; a tensor that does not match),
 * DDP_ERR_STATE (none registered; a backward is under way), DDP_ERR_MEMORY. */
int ddp_reducer_fused_optim_load_state(ddp_reducer *r, const ddp_optim_state *src);
