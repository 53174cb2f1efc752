/* ddplua/comm_hook.h: part of the public API, included by ddplua.h only.
 *
 * DDP communication hooks (runtime/distributed/reducer_comm_hook.c and comm_hook_*.c), after
 * PyTorch's Reducer::register_comm_hook / register_builtin_comm_hook and
 * torch/distributed/algorithms/ddp_comm_hooks/{default_hooks,powerSGD_hook}.py: instead of the
 * reducer's own all-reduce (Note [gradient averaging]), each launched bucket is handed to a
 * hook that reduces it however it likes and produces the bucket's reduced tensor.
 *
 * Note [comm hooks]: with a hook registered the reducer copies gradients into their bucket
 * slots WITHOUT dividing by the world size: dividing is the hook's job (PyTorch: the default
 * allreduce hook divides). A bucket is handed to its hook when it is launched (Note [bucket
 * order]: in index order on every rank, while backward goes on); the hook launches
 * asynchronous collectives and leaves behind a future; finalize_backward waits for each
 * bucket's future in index order and copies its value into the bucket before the gradients
 * are written back. Built-in hooks run in C without returning to Lua:
 *   ALLREDUCE       bucket /= world (a division, as PyTorch's allreduce_hook), all-reduce SUM.
 *                   Bitwise equal to no hook when the world size is a power of two (then
 *                   g * (1/world) == g / world exactly).
 *   FP16_COMPRESS   fp16_compress_hook: c = bucket cast to f16, c /= world, all-reduce c
 *                   (f16 on the wire: half the bytes of an f32 bucket), bucket = c cast back.
 *   BF16_COMPRESS   bf16_compress_hook: the same with bf16.
 *   POWER_SGD       powerSGD_hook (Vogels et al., "PowerSGD: Practical Low-Rank Gradient
 *                   Compression for Distributed Optimization", 2019; PyTorch's powerSGD_hook.py):
 *                   Note [PowerSGD] in runtime/distributed/comm_hook_powersgd.c.
 * and `wrap_dtype` (DDP_F16 or DDP_BF16; -1 none) is fp16_compress_wrapper /
 * bf16_compress_wrapper: the bucket is cast to that dtype, the inner hook runs on the cast
 * copy, and its result is cast back into the bucket.
 *   FRONT_END       a hook written in the front end (Lua): launching a bucket only queues it;
 *                   the front end takes queued buckets with ddp_reducer_comm_hook_next (from
 *                   a post-accumulate hook of its own, which runs after the reducer's on the
 *                   same parameter, so a bucket is handed over as soon as it is launched),
 *                   runs its hook and gives the value back with
 *                   ddp_reducer_comm_hook_set_result before the backward ends; finalize fails
 *                   naming the bucket when a value is missing.
 * The hook's collectives are launched in the same order on every rank (the bucket order, and
 * for PowerSGD the second round in finalize, again in bucket order): Note [collective order].
 */

typedef struct ddp_powersgd_state ddp_powersgd_state;

enum ddp_comm_hook_kind {
  DDP_COMM_HOOK_NONE = 0,
  DDP_COMM_HOOK_ALLREDUCE = 1,
  DDP_COMM_HOOK_FP16_COMPRESS = 2,
  DDP_COMM_HOOK_BF16_COMPRESS = 3,
  DDP_COMM_HOOK_POWER_SGD = 4,
  DDP_COMM_HOOK_FRONT_END = 5,
  DDP_COMM_HOOK_KIND_COUNT = 6 /* how many there are (not a kind) */
};

/* Register hook `kind` on reducer r (Note [comm hooks]). pg: the group the hook communicates
 * over (NULL: the reducer's; PyTorch's hook state process_group). wrap_dtype: -1, DDP_F16 or
 * DDP_BF16 (the compress wrappers; not with FRONT_END). state: the PowerSGD state for
 * POWER_SGD (the reducer keeps a reference: ddp_powersgd_state_free may follow), NULL for
 * the others. Errors: DDP_ERR_STATE "register_comm_hook or register_builtin_comm_hook can
 * only be called once." (PyTorch's text) when a hook is registered already, and when the
 * reducer has already reduced an iteration or a backward is under way (a hook must be
 * registered before the first backward); DDP_ERR_ARG for an unknown kind, a bad wrap_dtype,
 * a missing or extra state, POWER_SGD with buckets on a CUDA device (PowerSGD's matrix
 * products run on the host here) or with a bucket dtype other than f32/f64. */
int ddp_reducer_register_comm_hook(ddp_reducer *r, int kind, int wrap_dtype, struct ddp_pg *pg,
                                   ddp_powersgd_state *state);

/* The registered hook's kind (DDP_COMM_HOOK_NONE when none). */
int ddp_reducer_comm_hook_kind(const ddp_reducer *r);

/* Bytes the hook handed to collectives since registration (the payloads of its all-reduces,
 * in their wire dtype; for FRONT_END 0: the front end's collectives are not seen here). */
int64_t ddp_reducer_comm_hook_bytes(const ddp_reducer *r);

/* FRONT_END: the next launched bucket not yet handed to the front end in this backward
 * (buckets come in index order), or -1 when none is waiting. */
int ddp_reducer_comm_hook_next(ddp_reducer *r);

/* 1 when bucket k is the last bucket of an iteration (PyTorch's GradBucket.is_last). */
int ddp_reducer_bucket_is_last(const ddp_reducer *r, int k);

/* Bucket k's flat buffer (numel,) (a new reference), or parameter slot s's view of it with
 * the parameter's shape (ddp_reducer_bucket_view). During a FRONT_END hook it holds the
 * bucket's gradients, not divided by the world size. Errors: DDP_ERR_ARG out of range. */
int ddp_reducer_bucket_buffer(const ddp_reducer *r, int k, ddp_tensor **out);
int ddp_reducer_bucket_view(const ddp_reducer *r, int k, int s, ddp_tensor **out);

/* FRONT_END: the value of bucket k's future: copied (cast) into the bucket. Errors:
 * DDP_ERR_ARG when `value` has not the bucket's shape (numel,) or is dead, DDP_ERR_STATE when
 * bucket k was not handed to the front end in this backward or already has its value. */
int ddp_reducer_comm_hook_set_result(ddp_reducer *r, int k, ddp_tensor *value);

/* A PowerSGD state (PyTorch's PowerSGDState): matrix_approximation_rank >= 1;
 * start_powerSGD_iter: iterations of plain all-reduce before compression starts (> 1 when
 * use_error_feedback or warm_start, PyTorch's ValueError text, because the buckets are
 * rebuilt after the first iteration); min_compression_rate: a parameter's (n, m) matrix is
 * compressed only when (n + m) * rank * min_compression_rate < n * m; use_error_feedback,
 * warm_start: 0/1; orthogonalization_epsilon >= 0 (added to the column norms in
 * Gram-Schmidt); random_seed: the state's generator, ddp_generator_new(random_seed), draws
 * one seed per fresh random Q with ddp_randint_ into one i64 in [0, 1e9) (PyTorch draws it
 * from numpy's RandomState(random_seed)); the Q matrices of that bucket are then filled in
 * parameter-slot order by ddp_normal_(q, 0, 1, g) from g = ddp_generator_new(seed): identical
 * on every rank, and reproducible by a reference implementation. Errors: DDP_ERR_ARG. */
int ddp_powersgd_state_new(ddp_powersgd_state **out, int matrix_approximation_rank,
                           int64_t start_powerSGD_iter, double min_compression_rate,
                           int use_error_feedback, int warm_start,
                           double orthogonalization_epsilon, uint64_t random_seed);

/* Drop the caller's reference (a reducer using the state keeps its own). NULL is ignored. */
void ddp_powersgd_state_free(ddp_powersgd_state *s);

/* The state's iteration count (PyTorch's state.iter: incremented once per iteration, after
 * the last bucket). */
int64_t ddp_powersgd_state_iter(const ddp_powersgd_state *s);

/* Compression statistics since creation (PyTorch's compression_stats): elements before and
 * after compression of the iterations that compressed. */
void ddp_powersgd_state_stats(const ddp_powersgd_state *s, int64_t *numel_before,
                              int64_t *numel_after);

/* Copy of the error-feedback memory of bucket k (numel,) into *out (a new tensor), or *out =
 * NULL when there is none yet. For inspection and tests of state persistence. */
int ddp_powersgd_state_error(const ddp_powersgd_state *s, int k, ddp_tensor **out);
