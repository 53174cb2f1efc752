/* ddplua/dist_functional.h: part of the public API, included by ddplua.h only.
 *
 * Differentiable collectives (runtime/comm/functional.c), the C body of
 * ddplua.distributed.nn.functional (PyTorch's torch.distributed.nn.functional, plus the
 * tensor forms all_gather_tensor / reduce_scatter_tensor of its functional collectives).
 * Each call runs one collective of group `pg` through its front door (ddplua/pg.h, blocking)
 * on a copy of its input, returns a NEW tensor, and, when grad mode is on, the input
 * requires grad and its dtype is floating, records a node on the autograd tape whose
 * backward function runs the adjoint collective on the same group:
 *
 *   forward                        backward (gradient of the input)
 *   all_reduce (sum)               all_reduce (sum) of the output's gradient
 *   broadcast from src             reduce (sum) to src; zeros on the other ranks
 *   reduce (sum) to dst            broadcast from dst; plus the rank's own output gradient
 *                                  on ranks other than dst (their output is their input)
 *   all_gather_tensor along d      reduce_scatter_tensor (sum) along d
 *   reduce_scatter_tensor along d  all_gather_tensor along d
 *   all_to_all_single              all_to_all_single with the split sizes swapped
 *   gather to dst                  scatter from dst (non-dst outputs are zeros: constants)
 *   scatter from src               gather to src; zeros on the other ranks
 *
 * Only a sum is differentiable (as PyTorch's functional collectives): the backward of an
 * all_reduce, reduce or reduce_scatter_tensor made with another op fails with DDP_ERR_ARG
 * "all_reduce backward only supports 'sum' reduction, got 'max'" (reduce, reduce_scatter_tensor
 * likewise), on every rank alike.
 *
 * Note [collectives on the tape]: a backward collective is a collective like any other, so
 * every rank of the group must run it, in the same order. The backward walk
 * (runtime/autograd/engine.c) runs nodes in a fixed order for a given graph (latest recorded
 * first among the ready ones), the same on every rank that recorded the same graph, so the
 * adjoint collectives meet. For the same reason a collective node runs its backward even
 * when no gradient reached its output (it then takes zeros of the output's shape): the
 * engine runs nodes marked `collective` (runtime/tape/tape.h) whatever arrived, so a rank
 * whose loss does not use an output still joins its peers. The backward collectives of a
 * group share its one FIFO queue (Note [collective order] in ddplua/pg.h) with DDP's bucket
 * all-reduces, which the same walk launches, so the interleaving is the same everywhere.
 * The group must outlive the graph (ddp_pg_free before backward is a use after free, as a
 * destroyed group in PyTorch); ddplua.distributed.nn.functional keeps its groups alive.
 * Backward collectives name "backward of <forward's call site>" as their call site (Note
 * [collective fingerprints]).
 *
 * Every function: out receives a new tensor (the caller owns the reference); in is not
 * modified. Ranks (src, dst) are GROUP ranks; dims count from 0 (negative from the end).
 * Errors: DDP_ERR_ARG for a NULL or freed tensor or group, an unknown op, a bad root, dim or
 * split list (naming the function and the argument), then the collective's own
 * (ddplua/pg.h: shapes that differ between ranks, DDP_ERR_PEER, DDP_ERR_TIMEOUT, an aborted
 * group). Any dtype the backend takes; only floating inputs record a node.
 */

/* out = op over every rank's in (enum ddp_reduce_op), of in's shape and dtype, on every
 * rank. As torch.distributed.nn.functional.all_reduce. Backward: sum only. */
int ddp_dist_fn_all_reduce(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int op);

/* out = in of group rank src, of in's shape, on every rank. Backward: the gradient summed
 * over the ranks on src, zeros elsewhere (PyTorch's _Broadcast). */
int ddp_dist_fn_broadcast(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int src);

/* out = op over every rank's in on group rank dst; a copy of in on the other ranks.
 * Backward (sum only): dst's output gradient broadcast to every rank, plus, on ranks other
 * than dst, their own output gradient (the exact adjoint of this forward; PyTorch's _Reduce
 * leaves that term out, as it leaves non-dst outputs unspecified). */
int ddp_dist_fn_reduce(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int dst, int op);

/* in (s0, .., sd, .., sn) -> out (s0, .., world * sd, .., sn): the inputs of ranks
 * 0 .. world-1 concatenated along dim `gather_dim`, on every rank (PyTorch's
 * _functional_collectives.all_gather_tensor). in needs at least one dim. Backward: the
 * output gradient's reduce_scatter_tensor (sum) along gather_dim. */
int ddp_dist_fn_all_gather_tensor(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int gather_dim);

/* in (s0, .., world * k, .., sn) -> out (s0, .., k, .., sn): op over the ranks of chunk
 * `rank` of in along dim `scatter_dim` (PyTorch's reduce_scatter_tensor with a scatter dim).
 * Errors: "reduce_scatter_tensor: input dimension D (size S) must be a multiple of the group
 * size W" (DDP_ERR_ARG). Backward (sum only): all_gather_tensor along scatter_dim. */
int ddp_dist_fn_reduce_scatter_tensor(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in,
                                      int scatter_dim, int op);

/* ddp_pg_alltoall_single into a new out (rows_out, ...): rows_out is the sum of
 * output_split_sizes (world entries >= 0), or in's rows when that is NULL (even splits).
 * Backward: all_to_all_single of the output gradient with input and output split sizes
 * swapped (PyTorch's _AlltoAllSingle). */
int ddp_dist_fn_all_to_all_single(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in,
                                  const int64_t *output_split_sizes, int n_output_splits,
                                  const int64_t *input_split_sizes, int n_input_splits);

/* in (...) -> out (world, ...) on every rank: row r is group rank r's in on rank dst, zeros
 * on the other ranks (PyTorch's _Gather, stacked). Backward: scatter of the output
 * gradient from dst (the non-dst rows are constants). */
int ddp_dist_fn_gather(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int dst);

/* in (world, ...) on every rank (only src's is read) -> out (...) = row `rank` of src's in
 * (PyTorch's _Scatter, stacked). Backward: the output gradients gathered on src as a
 * (world, ...) gradient, zeros on the other ranks. */
int ddp_dist_fn_scatter(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int src);
