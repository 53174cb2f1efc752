/* ddplua/reducer.h: part of the public API, included by ddplua.h only.
 *
 * The DDP gradient reducer (runtime/distributed/reducer.c), as PyTorch's c10d Reducer: gradients of
 * a model's parameters are averaged over the ranks of a process group during backward, in
 * buckets whose all-reduces overlap the rest of the backward pass.
 *
 * Life of an iteration (Lua's DistributedDataParallel drives it; a C program can too):
 *   ddp_reducer_prepare_for_forward(r)   before the forward: fails when the prior iteration
 *                                        did not finish its reduction; rebuilds the buckets
 *                                        once after the first iteration
 *   ... forward ...
 *   ddp_reducer_prepare_for_backward(r)  arms the reducer for the next backward
 *   ddp_backward(loss, ...)              each parameter's post-accumulate hook marks it ready
 *                                        (mark_variable_ready) and launches complete buckets;
 *                                        the backward-end callback finalizes (finalize_backward:
 *                                        waits for every bucket and writes param.grad)
 * After ddp_backward returned DDP_OK, every parameter's .grad holds the mean over the ranks
 * of the ranks' gradients.
 *
 * Note [bucket order]: buckets are numbered in the order gradients are expected to become
 * ready: at first reverse registration order (the backward visits layers last to first),
 * after the first iteration the order observed on rank 0 (Note [bucket rebuild]). A bucket's
 * all-reduce is launched only when it is complete AND every lower-numbered bucket was
 * launched, so every rank launches buckets in index order whatever order its own gradients
 * arrive in. The process group runs collectives in launch order (pg.h, Note [collective
 * order]), hence every rank reduces bucket k against bucket k of its peers: no mismatch, no
 * deadlock, and communication overlaps the rest of the backward pass.
 *
 * Note [bucket assignment]: parameters are walked in bucket order (above) and put into the
 * open bucket of their dtype (one dtype per bucket); a bucket closes once its size reaches its
 * cap: first_bucket_cap_bytes for the first bucket of each dtype, bucket_cap_bytes for the
 * others (a parameter larger than the cap gets a bucket of its own). Buckets are then numbered
 * by the walk position of their first parameter. Each bucket owns one flat contiguous buffer;
 * its parameters sit in it in walk order. PyTorch's compute_bucket_assignment_by_size.
 *
 * Note [gradient averaging]: a gradient is copied into its bucket slot multiplied by
 * 1 / world_size, and the buckets are then all-reduced with SUM, as PyTorch's default
 * all-reduce hook (dividing before the sum keeps the partial sums in range for f16/bf16).
 *
 * Note [bucket rebuild]: during the first synchronised iteration the reducer records the order
 * in which gradients became ready. At the next prepare_for_forward (only when that iteration
 * marked every parameter ready and find_unused_parameters is off, as PyTorch), rank 0's order
 * is broadcast to every rank and the buckets are rebuilt ONCE in that order with the same caps
 * (Note [bucket assignment]); ranks may observe different orders, so only rank 0's is used.
 *
 * Note [unused parameters]: with find_unused_parameters, a parameter whose hook did not fire
 * by the end of backward is marked ready with zeros; then the per-rank "used" flags are
 * all-reduced, and a parameter unused on EVERY rank keeps its .grad as it was (nil stays
 * nil, as PyTorch), while one used on some rank gets the average. Without
 * find_unused_parameters, a backward that left parameters unready does not wait (that could
 * hang); the iteration is marked unfinished and the next prepare_for_forward fails with
 * PyTorch's message naming the parameter indices (ddp_reducer_unready_params lists them).
 *
 * Note [device buckets]: parameters on a CUDA device (all on the same one: one device per
 * process, as PyTorch's DDP) get their buckets on that device. Gradients are copied into
 * their slots and scaled by 1 / world_size with device kernels on the current stream (never
 * through host pointers), and copied back the same way. With the nccl backend a bucket's
 * all-reduce is enqueued on the group's communication stream as soon as the bucket is
 * launchable (the stream first waits for the current stream), the bucket buffer is recorded
 * on that stream for the caching allocator, and at the end of backward the current stream
 * waits for every bucket's event before the gradients are copied back: the host never
 * blocks on the communication (pg.h, Note [nccl work]). The used-parameter flags and the
 * bucket-rebuild order, which the host reads, go through a device copy and a host wait.
 * With the gloo backend device buckets are staged through the host (pg.h).
 *
 * Note [shared buckets]: CPU buckets of f32/f64 are allocated with ddp_pg_shared_zeros
 * (pg.h): with the gloo backend and every rank on this host they lie in the group's
 * shared-memory segment, so their all-reduce reads the peers' buckets in place with no
 * staging copy (Note [shm zero copy] in runtime/comm/pg_shm.c). Elsewhere they are
 * ordinary memory, as when the segment has no room left (the all-reduce then stages them:
 * slower, the same bits).
 *
 * Note [bucket overlap]: by default (overlap on, as PyTorch) a bucket's all-reduce is handed
 * to the process group's communication thread as soon as it is launchable (Note [bucket
 * order]), so it runs while the backward computes the remaining gradients. With overlap off
 * (ddp_reducer_set_overlap) nothing is launched until every bucket is complete; then the
 * buckets are all-reduced one after the other in index order on the thread running the
 * backward, blocking (the process group's inline path, Note [inline collectives] in
 * runtime/comm/pg_queue.c), with no second thread competing for a core. Either way:
 * the same collectives in the same order, the same bits. Measured on 2 cores with DDP 2 x 1
 * thread (bench/RESULTS.md), overlap on was the faster for the CNN (its fc bucket reduced
 * during the conv backward): off is for hosts whose ranks oversubscribe the cores, to be
 * measured there.
 * Note [last bucket inline]: with overlap on, the last bucket (nothing of the backward left
 * to hide it behind) is all-reduced blocking on the backward's thread too, saving the two
 * thread hand-offs (wake the communication thread, then be woken by it) per iteration.
 * Both only for the reducer's own all-reduce on a host-side group (not with a comm hook,
 * nor with CUDA parameters or an nccl group, whose buckets never block the host).
 *
 * Threads: the hooks and the finalisation run on the thread running ddp_backward; the
 * all-reduces on the process group's communication thread (gloo) or stream (nccl), or on the
 * backward's thread (Note [bucket overlap]). Use one reducer from one thread.
 */

typedef struct ddp_reducer ddp_reducer;
struct ddp_pg; /* ddplua/pg.h */

/* A reducer over the `n` parameters in `params` (leaf tensors that require grad, all on one
 * device: the CPU or a CUDA device, Note [device buckets]; floating dtypes, each listed once; registration order: index i below is params[i]),
 * averaging over the ranks of `pg`. pg may be NULL: a reducer of world size 1 that
 * communicates nothing (for tests and single-process runs). The reducer keeps a reference to
 * every parameter and registers a post-accumulate hook on each and one backward-end callback;
 * ddp_reducer_free removes them. pg must outlive the reducer.
 * bucket_cap_bytes (> 0; PyTorch's 25 MiB default) and first_bucket_cap_bytes (> 0; 1 MiB):
 * Note [bucket assignment]. find_unused_parameters: Note [unused parameters].
 * gradient_as_bucket_view: every param.grad becomes a view into its bucket (no copy back
 * after the reduction, less memory); a gradient that is nil (zero_grad(set_to_none)) is
 * re-created as the view when the parameter is next marked ready.
 * timeout_s: the longest wait for one bucket's all-reduce (<= 0: 300 s).
 * Errors: DDP_ERR_ARG (n < 0, NULL or dead parameter, a parameter listed twice, not a leaf
 * requiring grad, not floating, parameters on different devices, a device other than an nccl
 * group's, caps <= 0), DDP_ERR_MEMORY. */
int ddp_reducer_new(ddp_reducer **out, struct ddp_pg *pg, ddp_tensor **params, int n,
                    int64_t bucket_cap_bytes, int64_t first_bucket_cap_bytes,
                    int find_unused_parameters, int gradient_as_bucket_view, double timeout_s);

/* Remove the hooks and the callback, drop the buffers and references. Unfinished all-reduces
 * run to their end on the communication thread (they hold their own references). NULL is
 * ignored. */
void ddp_reducer_free(ddp_reducer *r);

/* Before each forward of a synchronised iteration. Fails with DDP_ERR_STATE and PyTorch's
 * message ("Expected to have finished reduction in the prior iteration before starting a new
 * one. ... Parameter indices which did not receive grad for rank R: 3 5", indices 0-based)
 * while the prior iteration is unfinished (Note [unused parameters]); it keeps failing, as
 * PyTorch. Once, after the first finished iteration, rebuilds the buckets (Note [bucket
 * rebuild]): a collective, so every rank must call it; errors of the broadcast come back. */
int ddp_reducer_prepare_for_forward(ddp_reducer *r);

/* Arm the reducer: the next backward that reaches its parameters is reduced. Call it after
 * the forward, when the gradients should be synchronised (not inside no_sync). */
int ddp_reducer_prepare_for_backward(ddp_reducer *r);

/* sync = 0: the hooks do nothing and backward accumulates locally into param.grad (no_sync);
 * sync = 1 (the default): the next armed backward reduces the accumulated gradients. */
void ddp_reducer_set_sync(ddp_reducer *r, int sync);
int ddp_reducer_get_sync(const ddp_reducer *r);

/* overlap = 1 (the default): buckets are all-reduced on the communication thread while the
 * backward goes on; 0: after the whole backward, on its thread (Note [bucket overlap]).
 * Takes effect from the next backward. Give every rank of the group the same setting: the
 * buckets' collectives are the same either way, but with other collectives during the
 * backward (SyncBatchNorm's) ranks that differ would submit them in different orders (the
 * Lua DDP makes its ranks agree).
 * Errors: DDP_ERR_ARG (r NULL), DDP_ERR_STATE (called while a backward is being reduced). */
int ddp_reducer_set_overlap(ddp_reducer *r, int overlap);
/* 1 when overlap is on (Note [bucket overlap]); 0 for NULL. */
int ddp_reducer_get_overlap(const ddp_reducer *r);

/* Number of buckets, and the parameters of bucket `bucket` (0-based, Note [bucket order])
 * written into out (at most cap entries, parameter indices in slot order); returns the
 * bucket's parameter count, -1 when bucket is out of range. */
int ddp_reducer_num_buckets(const ddp_reducer *r);
int ddp_reducer_bucket_params(const ddp_reducer *r, int bucket, int *out, int cap);

/* Bytes of bucket `bucket`'s buffer (-1 when out of range). */
int64_t ddp_reducer_bucket_bytes(const ddp_reducer *r, int bucket);

/* 1 once the buckets were rebuilt (Note [bucket rebuild]). */
int ddp_reducer_has_rebuilt_buckets(const ddp_reducer *r);

/* The order in which gradients became ready in the first iteration, as recorded on THIS rank
 * (parameter indices, at most cap written); returns the count. */
int ddp_reducer_ready_order(const ddp_reducer *r, int *out, int cap);

/* The parameters that received no gradient in the unfinished iteration (Note [unused
 * parameters]; at most cap written); returns the count (0 when the reduction finished). */
int ddp_reducer_unready_params(const ddp_reducer *r, int *out, int cap);

/* Seconds the last finished backward waited for its buckets' all-reduces at its end, plus
 * the seconds it spent in all-reduces run on its own thread (Note [bucket overlap]): the
 * communication that backward did not hide (exposed communication). */
double ddp_reducer_last_wait_seconds(const ddp_reducer *r);

/* Number of iterations whose reduction finished. */
int64_t ddp_reducer_num_iterations(const ddp_reducer *r);

/* Note [bucket assignment] on its own: `n` tensors of `bytes[i]` bytes and dtype `dtypes[i]`,
 * walked in `order` (n distinct indices 0..n-1; NULL: n-1 down to 0, the reverse registration
 * order). Writes bucket_of[i] (the bucket of tensor i) and returns the bucket count; -1 with
 * DDP_ERR_ARG for a bad order or cap. */
int ddp_compute_bucket_assignment(int *bucket_of, int n, const int *order, const int64_t *bytes,
                                  const int *dtypes, int64_t bucket_cap_bytes,
                                  int64_t first_bucket_cap_bytes);

/* 64-bit FNV-1a digest (Fowler, Noll, Vo; offset basis 14695981039346656037, prime
 * 1099511628211) of t's elements in row-major order, their raw bytes (so -0.0 and 0.0, or two
 * NaNs with different payloads, differ), followed by its dtype and shape; a non-contiguous
 * view digests like its contiguous copy; a device tensor
 * is copied to the host first. For DistributedDataParallel.verify_sync. */
int ddp_tensor_digest(uint64_t *out, const ddp_tensor *t);

/* The same digest over `n` raw bytes (names, shapes). */
uint64_t ddp_bytes_digest(const void *data, size_t n);
