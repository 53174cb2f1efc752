/* ddplua/reducer_join.h: part of the public API, included by ddplua.h only (after
 * ddplua/reducer.h, whose ddp_reducer it extends).
 *
 * Uneven inputs for the DDP reducer (runtime/distributed/reducer_join.c), after PyTorch's
 * DistributedDataParallel.join (torch/nn/parallel/distributed.py: _DDPJoinHook,
 * _match_all_reduce_for_bwd_pass, _match_unused_params_allreduce) and the c10d Reducer's
 * set_forward_pass_work_handle / push_rebuilt_params_for_all_indices. The generic protocol
 * (a joined rank runs its joinables' main hooks once per iteration of the ranks that still
 * have data) is lua/ddplua/distributed/algorithms/join.lua; the Lua DistributedDataParallel
 * drives the calls below.
 *
 * Note [join shadow iteration]: a rank that ran out of inputs ("joined") must take part in
 * every collective the non-joined ranks run in each of their iterations, in the same order,
 * or they would hang or fail (Note [collective fingerprints]). Per iteration of the
 * non-joined ranks, with T = the join state all-reduce (one f32 SUM over the ranks of
 * {backward will be synchronised, grad enabled, one-hot row of the rank offering itself as
 * the authoritative copy}: the count of syncing ranks, of ranks with grad, and the highest
 * offering rank; f32 SUM takes the shared-memory path, an i64 MAX would not):
 *
 *   non-joined rank (DDP forward, backward)   joined rank (DDP's join hook)
 *   presence all-reduce of 1                  presence all-reduce of 0 (the Join loop)
 *   T                                         T
 *   bucket rebuild broadcast, once            ddp_reducer_join_rebuild_buckets when T says
 *                                             grad was enabled (the same broadcast)
 *   buffer broadcasts from T's rank           the same broadcasts
 *   backward: bucket all-reduces in bucket    ddp_reducer_join_shadow_backward when T says
 *   order, then (find_unused_parameters)      the backward is synchronised: the same
 *   the used-parameter flags all-reduce       all-reduces over zeros, labelled as the real ones
 *
 * The joined rank contributes zero gradients, so each non-joined rank gets the sum of the
 * non-joined ranks' gradients divided by the divisor: the initial world size
 * (divide_by_initial_world_size, the default) or, set per iteration with
 * ddp_reducer_set_divide_factor, the number of non-joined ranks (the presence count).
 * Bucket rebuild (Note [bucket rebuild]): a joined rank that never finished an iteration
 * has no recorded order; after shadowing the first synchronised backward it takes the
 * registration order 0..n-1 as its record, as PyTorch's push_rebuilt_params_for_all_indices,
 * so it rebuilds (and, as rank 0, broadcasts that order) in the same iteration as the
 * others. The authoritative rank for buffers is the highest non-joined rank (rank 0 may
 * have joined with stale buffers), as PyTorch's _sync_buffers under join.
 *
 * Note [join shadow with a comm hook]: with a communication hook (Note [comm hooks]) the
 * non-joined ranks' backward runs the hook's collectives, not the plain all-reduces, so the
 * joined rank runs the same hook on a zero tensor per bucket (dtype, size and slot layout of
 * the bucket), launched in bucket order with the same second rounds (PowerSGD's Q
 * all-reduces) in bucket order after the flags, as PyTorch's _match_all_reduce_for_bwd_pass
 * runs _run_comm_hook on _get_zeros_like_grad_buckets. The buckets themselves (and so the
 * gradients, gradient_as_bucket_view included) are not touched. Hook state advances as on
 * the others, as in PyTorch: PowerSGD's iteration count (once per shadowed backward), its
 * error feedback for a zero gradient (error = (0 + error) - the decompressed average) and
 * its warm-start P and Q. The built-in hooks divide by their group's size, as PyTorch's,
 * unless a divisor was set with ddp_reducer_set_divide_factor and the hook communicates over
 * the DDP module's group: then by that divisor. The front end sets one with a hook only when
 * asked to (comm_hook_divide_by_non_joined, Note [join divisor with a comm hook] in
 * lua/ddplua/distributed/ddp_join_hook.lua). A hook written in the front end (Lua) is called
 * by the front end on zero buckets before ddp_reducer_join_shadow_backward, which then
 * launches no bucket collectives; it divides as it chooses.
 */

/* Divide the gradients of the next synchronised backwards by `div_factor` (> 0) instead of
 * the group's size; 0 restores the default (the world size, Note [gradient averaging], bit
 * for bit). With a built-in comm hook over the module's group the hook divides by it too
 * (Note [join shadow with a comm hook]). Used under join with divide_by_initial_world_size =
 * false (Note [join shadow iteration]). Errors: DDP_ERR_ARG (r NULL, div_factor < 0 or >
 * the world size). */
int ddp_reducer_set_divide_factor(ddp_reducer *r, int div_factor);

/* The divisor set by ddp_reducer_set_divide_factor (0: the world size). */
int ddp_reducer_get_divide_factor(const ddp_reducer *r);

/* On a joined rank: the bucket rebuild the non-joined ranks run at this iteration's forward
 * (Note [bucket rebuild]), when one is pending here; *rebuilt (may be NULL) says whether it
 * ran. A collective when it runs. Errors: those of the rebuild's broadcast. */
int ddp_reducer_join_rebuild_buckets(ddp_reducer *r, int *rebuilt);

/* On a joined rank: shadow one synchronised backward of the non-joined ranks (Note [join
 * shadow iteration]): one SUM all-reduce per bucket over a zero tensor of the bucket's
 * dtype, size and device, launched in bucket order with the bucket's call-site label (with
 * a built-in comm hook: the hook on those zeros, Note [join shadow with a comm hook]; with a
 * hook written in the front end: nothing, the front end ran it), then
 * (find_unused_parameters) the used-parameter flags all-reduce over zeros; waits for them
 * (each at most the reducer's timeout) and leaves every param.grad as it was. Errors:
 * DDP_ERR_ARG (r NULL), DDP_ERR_STATE (a backward of this reducer is under way),
 * DDP_ERR_MEMORY, and the all-reduces' (or the hook's) failures naming the bucket and this
 * rank. A reducer
 * without a group (world size 1) communicates nothing. */
int ddp_reducer_join_shadow_backward(ddp_reducer *r);
