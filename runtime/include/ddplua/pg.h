/* ddplua/pg.h: part of the public API, included by ddplua.h only.
 *
 * Process groups (runtime/comm/: the front doors in pg.c, the ordered communication
 * thread in pg_queue.c, one file per backend: pg_gloo.c over the Gloo shim gloo_shim.cc and
 * the shared-memory all-reduce pg_shm.c, pg_nccl.c over the CUDA plug-in's NCCL table
 * runtime/backend/cuda/nccl.cu): collectives between the ranks of a job, as
 * torch.distributed's ProcessGroupGloo and ProcessGroupNCCL.
 *
 * Tensors (gloo): dtypes f32, f64, f16, bf16, i64, i32, u8 (f16 and bf16 are reduced in f32,
 * then rounded back). A non-contiguous tensor is copied into a contiguous buffer and the
 * result copied back into it. CUDA tensors are staged through host memory, as PyTorch's gloo
 * does (copied to the host at the call, on the current stream, and back to the device once
 * the collective finished). Tensors of one call may sit on different devices.
 * Tensors (nccl): contiguous CUDA tensors on the group's device only (DDP_ERR_ARG otherwise,
 * as PyTorch); f16 and bf16 are reduced natively by NCCL; AVG is NCCL's ncclAvg.
 * Every rank must call the same collectives in the same order with tensors of the same
 * shape and dtype: before any data moves the ranks compare fingerprints of the call
 * (Note [collective fingerprints] in runtime/comm/pg_fingerprint.h); a mismatch fails
 * on every rank of the group with DDP_ERR_ARG, naming both calls and their call sites, and
 * breaks the group.
 *
 * Work: every collective takes `ddp_work **work` first. NULL: blocking (the call returns
 * when the collective finished on this rank; nccl: Note [nccl work]). Non-NULL:
 * asynchronous: the call returns at once with a handle in *work (free it with
 * ddp_work_free); the tensors must not be touched until ddp_work_wait returned. gloo:
 * asynchronous work runs on the group's one communication thread, in submission order.
 *
 * Note [collective order]: each process group has exactly one communication thread and a
 * FIFO queue; blocking calls go through the same queue. So collectives run on every rank
 * in the order they were launched, whatever mix of blocking and asynchronous calls made
 * them. The DDP reducer relies on this: buckets are launched in index order on every rank
 * and therefore reduced in that order everywhere.
 *
 * Transport: Gloo over TCP, except all-reduce of f32/f64 (and f16/bf16, staged as f32),
 * broadcast, all-gather and barrier between ranks that all run on this host: they go
 * through a shared-memory segment (runtime/comm/pg_shm.c), in the same FIFO order,
 * each element reduced in rank order 0..world-1, so every rank holds identical bits. A
 * blocking one runs on the calling thread when nothing is queued before it (Note [inline
 * collectives] in pg_queue.c). DDPLUA_SHM=0 turns it off (every rank then votes for Gloo).
 *
 * Note [nccl work]: with the nccl backend there is no communication thread: a collective is
 * enqueued on the communicator's CUDA stream at the call, after the caller's current stream
 * (so it sees the kernels that produced its inputs), and its tensors are recorded on that
 * stream (ddp_cuda_record_stream) so their memory outlives them until the collective ran.
 * The work handle is the event after it. ddp_work_wait makes the CURRENT STREAM wait for
 * the collective and returns at once (torch's work.wait() for NCCL); a blocking call
 * (work == NULL) does the same before it returns, except barrier, which blocks the host.
 * ddp_work_synchronize blocks the host until the collective finished, polling the
 * communicator: a dead peer gives DDP_ERR_PEER, running past the timeout DDP_ERR_TIMEOUT,
 * and the communicator is then aborted (ncclCommAbort) so nothing hangs. There is no
 * watchdog thread: a peer that dies while only stream waits are pending is seen by the next
 * ddp_work_synchronize, barrier or ddp_work_is_completed. Collectives run in call order on
 * every rank (one stream per group). Send/recv tags are ignored (NCCL matches in order).
 * Wait for work handles before ddp_pg_free (freeing a handle afterwards is fine).
 *
 * Errors: misuse (shape, dtype, root out of range, a freed group) fails at the call with
 * DDP_ERR_ARG. Failures of the transport come back from the blocking call or from
 * ddp_work_wait: DDP_ERR_PEER when a peer disconnected (its process died), DDP_ERR_TIMEOUT
 * when the collective ran past the group's timeout; the message names the collective, this
 * rank and, when it can be known, the peer's rank (global ranks of the job), and the call
 * site. Such a failure aborts the group on every rank (ddp_pg_abort): pending and later calls
 * of every rank fail at once with the group's first failure.
 */

typedef struct ddp_pg ddp_pg;
typedef struct ddp_work ddp_work;
struct ddp_store; /* ddplua/store.h */

/* Reduction operators. AVG is SUM followed by a division by the group size, floating
 * dtypes only (DDP_ERR_ARG for integer dtypes, as PyTorch). */
enum ddp_reduce_op {
  DDP_REDUCE_SUM = 0,
  DDP_REDUCE_AVG = 1,
  DDP_REDUCE_MIN = 2,
  DDP_REDUCE_MAX = 3,
  DDP_REDUCE_PRODUCT = 4,
  DDP_REDUCE_OP_COUNT = 5 /* how many there are (not an operator) */
};

/* The name of reduce op `op` as ddplua.distributed takes it ("sum", "avg", "min", "max",
 * "product"; PyTorch's ReduceOp in lower case), NULL when op is not one. */
const char *ddp_reduce_op_name(int op);

/* A Gloo process group of `world_size` ranks (this one is `rank`, 0 <= rank < world_size),
 * meeting through `store` (the rendezvous; it must outlive the group) under the key prefix
 * `prefix` (NULL: "pg"), so several groups can share one store. Every rank calls it; it
 * returns when all ranks connected, or fails after `timeout_s` (<= 0: 300 s), which is also
 * the group's timeout for every collective (ddp_pg_set_timeout changes it).
 * Transport: Gloo TCP. The address this rank binds and publishes: the interface named by
 * $DDPLUA_GLOO_IFNAME when set; else the host name or address in $DDPLUA_GLOO_HOSTNAME;
 * else 127.0.0.1 when $MASTER_ADDR is unset or a loopback name (127.x, localhost, ::1);
 * else this machine's host name (gethostname), as PyTorch does.
 * At init each rank checks its world size against rank 0's through the store and then runs
 * one sanity all-reduce; a mismatch fails naming the rank and both sizes.
 * Errors: DDP_ERR_ARG (rank out of range, world_size < 1, NULL store), DDP_ERR_TIMEOUT (a rank
 * never arrived; names the missing key), DDP_ERR_IO / DDP_ERR_PEER (transport). */
int ddp_pg_new_gloo(ddp_pg **out, struct ddp_store *store, int rank, int world_size,
                    const char *prefix, double timeout_s);

/* An nccl process group of `world_size` ranks on CUDA device `device` (one device per
 * process, as PyTorch's DDP), meeting through `store` under `prefix` (NULL: "pg"): rank 0
 * makes an NCCL unique id and publishes it under "<prefix>/nccl_id", every rank joins the
 * communicator (non-blocking init, bounded by timeout_s; <= 0: 300 s, also the timeout of
 * ddp_work_synchronize and barrier). Subgroups (ddp_pg_new_group) get their own communicator
 * on the same device. Errors: DDP_ERR_UNAVAILABLE "nccl backend: CUDA is not available:
 * <reason>" (no plug-in, driver or device) or "nccl backend: NCCL is not available: ..."
 * (a plug-in without NCCL, such as the simulated device); DDP_ERR_ARG (a bad device, rank or
 * world size); DDP_ERR_TIMEOUT (a rank never joined); the store's errors. */
int ddp_pg_new_nccl(ddp_pg **out, struct ddp_store *store, int rank, int world_size,
                    const char *prefix, double timeout_s, int device);

/* 1 when the nccl backend can be used here: the CUDA plug-in loaded, found a device and was
 * built with NCCL; else 0 with the reason (as ddp_pg_new_nccl's error, without its prefix)
 * written into reason (len bytes; may be NULL). */
int ddp_pg_nccl_available(char *reason, size_t len);

/* "gloo" or "nccl" ("" for NULL). */
const char *ddp_pg_backend(const ddp_pg *pg);

/* The CUDA device of an nccl group; DDP_DEVICE_CPU (-1) for gloo. */
int ddp_pg_device(const ddp_pg *pg);

/* A subgroup of `parent` made of the `n` parent ranks in `ranks` (distinct, in range, in
 * any order: rank i of the subgroup is ranks[i]). Every rank of the parent must call it,
 * with the same list, in the same order relative to other new_group calls (as PyTorch's
 * new_group); members get the new group in *out, the other ranks get *out = NULL (and
 * DDP_OK). It rendezvouses through the parent's store with the parent's timeout, then runs
 * a barrier on the parent, so every parent rank returns once the subgroup is connected (as
 * PyTorch: a non-member that exits early must not take the store away). Ranks
 * passed to later calls on the subgroup are subgroup ranks, error messages name global
 * ranks. Errors: DDP_ERR_ARG (empty list, duplicate or out-of-range rank), and those of
 * ddp_pg_new_gloo. */
int ddp_pg_new_group(ddp_pg **out, ddp_pg *parent, const int *ranks, int n);

/* This process's rank in the group (0-based) and the group's size. */
int ddp_pg_rank(const ddp_pg *pg);
int ddp_pg_size(const ddp_pg *pg);

/* The global rank (rank in the job's first group) of group rank `group_rank`; -1 when out of
 * range. */
int ddp_pg_global_rank(const ddp_pg *pg, int group_rank);

/* Timeout in seconds of collectives started from now on (> 0; default: the one given at
 * creation, 300 s when none). Errors: DDP_ERR_ARG for timeout_s <= 0. */
int ddp_pg_set_timeout(ddp_pg *pg, double timeout_s);
double ddp_pg_get_timeout(const ddp_pg *pg);

/* Seconds a collective may wait for its peers before this rank prints a stall report
 * (Note [flight recorder] in runtime/comm/pg_recorder.h; default
 * $DDPLUA_STALL_REPORT_S, else 30). The report changes nothing: the group's timeout still
 * ends the wait. Host-side backends (gloo) only. Errors: DDP_ERR_ARG for seconds <= 0. */
int ddp_pg_set_stall_report(ddp_pg *pg, double seconds);

/* Write the group's flight recorder (its last 2000 collectives: sequence, collective,
 * dtype and element count, Lua call site, seconds since enqueued / started / completed)
 * as text to file descriptor fd. kill -USR1 on a rank writes every live group's to stderr
 * (where the program left SIGUSR1 at its default action). Errors: DDP_ERR_ARG for NULL. */
int ddp_pg_dump_flight_recorder(const ddp_pg *pg, int fd);

/* The first failure of the group ("" while it is healthy). */
const char *ddp_pg_error(const ddp_pg *pg);

/* Abort the group on every rank (torch.distributed's abort_process_group; NCCL's
 * ncclCommAbort has the same meaning): the group's collectives pending on any rank, and
 * every later one, fail within about a second (DDP_ERR_STATE here, DDP_ERR_PEER elsewhere)
 * with "<collective> on rank N: the process group was aborted: <first failure>", where the
 * first failure is "<reason> on rank <this rank> at <call site>" (reason NULL or "":
 * "abort_process_group called"; the call site is the one ddp_pg_set_call_site set) unless
 * another rank's failure came first (Note [group abort] in runtime/comm/pg.c). Every
 * failed or timed-out collective aborts its group the same way. The group cannot be used
 * again: ddp_pg_free it (work handles may be waited for and freed first or after), and make
 * a new group (with another prefix when it meets through the same store). Any thread;
 * idempotent. Errors: DDP_ERR_ARG for NULL. */
int ddp_pg_abort(ddp_pg *pg, const char *reason);

/* 1 when the group was aborted (ddp_pg_abort on any rank, or a failed collective), else 0
 * (also for NULL). The reason is ddp_pg_error's. */
int ddp_pg_is_aborted(const ddp_pg *pg);

/* Abort (as ddp_pg_abort) every live group of this process that has a collective queued or
 * running, with the first failure "<reason> on rank N while <collective> #<seq> (called at
 * <call site>) was pending". For an interrupt (the distributed REPL's Ctrl-C): any thread,
 * while the program's thread is blocked in the collective. Returns how many groups it
 * aborted. */
int ddp_pg_abort_pending(const char *reason);

/* The caller's source location ("file", line; line <= 0: `file` is the whole text; NULL
 * clears it) recorded with the collectives this thread submits from now on, for the
 * messages of Note [collective fingerprints] (a mismatch names each rank's call site).
 * The Lua front end sets it once per collective from debug.getinfo; the DDP reducer names
 * its buckets. Truncated to 79 bytes. Never fails. */
void ddp_pg_set_call_site(const char *file, int line);

/* In-place all-reduce: every rank's t becomes op over all ranks' t. Any shape. */
int ddp_pg_allreduce(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int op);

/* A zero-filled CPU tensor of `shape` (ndim dims) and `dtype` whose memory lies in the
 * shared-memory segment of group `pg` when it has one (all ranks on this host, gloo
 * backend): all-reduces whose tensors lie there on every rank run without staging copies
 * (Note [shm zero copy] in runtime/comm/pg_shm.c), and a broadcast reads the root's
 * tensor in place. *placed = 1 then; else (no segment: ranks on several hosts,
 * DDPLUA_SHM=0, nccl) an ordinary tensor and *placed = 0. Each rank may place up to 1 GiB;
 * the tensor may outlive the group. Any rank may call it any time (no collective).
 * Errors: DDP_ERR_ARG (no group, bad shape or dtype), DDP_ERR_MEMORY "shared_buffer: no room
 * ..." when the segment's part of this rank is full or /dev/shm has no pages left. */
int ddp_pg_shared_zeros(ddp_tensor **out, ddp_pg *pg, int ndim, const int64_t *shape,
                        int dtype, int *placed);

/* t of rank `root` copied into t of every rank. */
int ddp_pg_broadcast(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int root);

/* out (world, ...t's shape) receives every rank's t, stacked in rank order. out's dtype is
 * t's. */
int ddp_pg_allgather(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *t);

/* List form: outs[i] (n == world size tensors, each of t's shape and dtype) receives rank
 * i's t. */
int ddp_pg_allgather_list(ddp_work **work, ddp_pg *pg, ddp_tensor **outs, int n,
                          ddp_tensor *t);

/* in (world * m, ...) is split along dim 0 into world chunks of m rows; out (m, ...)
 * receives op over all ranks of the chunk at this rank's index. Moves its data as
 * ddp_pg_reduce_scatter_tensor (below) does; its name in messages is "reduce_scatter". */
int ddp_pg_reduce_scatter(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in,
                          int op);

/* t of rank `root` becomes op over all ranks' t; other ranks' t is left unchanged (PyTorch
 * leaves it unspecified). */
int ddp_pg_reduce(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int root, int op);

/* out (world, ...t's shape) of rank `root` receives every rank's t in rank order; `out`
 * must be NULL on the other ranks (and non-NULL on the root). */
int ddp_pg_gather(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *t, int root);

/* in (world, ...out's shape) on rank `root` (NULL elsewhere): every rank's out receives
 * in[rank]. */
int ddp_pg_scatter(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in, int root);

/* in and out (world * m, ...), same shape and dtype: chunk j of rank i's in (rows j*m ..
 * j*m+m-1) goes to chunk i of rank j's out. */
int ddp_pg_alltoall(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in);

/* ---- collectives for sharding (PyTorch's names and semantics) ----
 * Each is one collective (its own name in fingerprints, the flight recorder and messages).
 * Through shared memory (gloo backend, every rank on this host) a reduce-scatter of f32/f64
 * (f16/bf16 through f32) reduces each rank's 1/world share in the segment, over the ranks
 * in order 0 .. world-1 (the bits of the all-reduce's slice); across hosts it is a Gloo
 * ring in which each rank sends (world-1)/world of the input; nccl calls
 * ncclReduceScatter / ncclAllGather. Errors: DDP_ERR_ARG naming the tensor, the expected and
 * the given shape or dtype; then as every collective (DDP_ERR_PEER, DDP_ERR_TIMEOUT, ...). */

/* input (world * k, ...) or (world, k, ...), out (k, ...) of input's dtype: out receives op
 * (DDP_REDUCE_*; avg for floating dtypes) over every rank of chunk `rank` of input (rows
 * rank*k .. rank*k+k-1). input is not modified. As torch.distributed.reduce_scatter_tensor. */
int ddp_pg_reduce_scatter_tensor(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in,
                                 int op);

/* in (k, ...), out (world * k, ...) or (world, k, ...) of in's dtype: chunk r of out
 * receives group rank r's in. As torch.distributed.all_gather_into_tensor. */
int ddp_pg_allgather_into_tensor(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in);

/* in (rows_in, ...), out (rows_out, ...), same dtype and shape past dim 0. Rank i sends
 * input_split_sizes[j] rows (in rank order along dim 0) to rank j, which stores them in
 * its out at its output_split_sizes[i] rows' place. NULL split sizes (count ignored): even
 * splits, dim 0 divisible by the world size. Given ones have world entries >= 0 summing to
 * the tensor's dim 0. The ranks' sizes must agree (rank i's input_split_sizes[j] = rank
 * j's output_split_sizes[i]); that is not checked. As torch.distributed.all_to_all_single. */
int ddp_pg_alltoall_single(ddp_work **work, ddp_pg *pg, ddp_tensor *out, ddp_tensor *in,
                           const int64_t *output_split_sizes, int n_output_splits,
                           const int64_t *input_split_sizes, int n_input_splits);

/* n pairs: outs[i] (k_i, ...) receives reduce_scatter_tensor of ins[i] (world * k_i, ...
 * or world, k_i, ...), in ONE collective over packed buffers (the inputs are copied into
 * one (world, sum k_i*...) buffer at submission, the outputs out of the result when it
 * finishes). Same dtype and device for every tensor; outputs contiguous. As PyTorch's
 * reduce_scatter_tensor_coalesced. */
int ddp_pg_reduce_scatter_tensor_coalesced(ddp_work **work, ddp_pg *pg, ddp_tensor **outs,
                                           ddp_tensor **ins, int n, int op);

/* n pairs: outs[i] (world * k_i, ... or world, k_i, ...) receives all_gather_into_tensor of
 * ins[i] (k_i, ...), in ONE collective over packed buffers. Rules as above. */
int ddp_pg_allgather_into_tensor_coalesced(ddp_work **work, ddp_pg *pg, ddp_tensor **outs,
                                           ddp_tensor **ins, int n);

/* Point to point: send t to group rank `dst` / receive into t from group rank `src`, with a
 * user tag (>= 0, < 2^24) that must match on both sides. dst/src != this rank. */
int ddp_pg_send(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int dst, int tag);
int ddp_pg_recv(ddp_work **work, ddp_pg *pg, ddp_tensor *t, int src, int tag);

/* Returns on every rank once all ranks reached it (and every earlier collective of this
 * group finished on this rank). */
int ddp_pg_barrier(ddp_work **work, ddp_pg *pg);

/* gloo: wait for the work to finish, at most timeout_s seconds (<= 0: the group's timeout). Its
 * status: DDP_OK, the collective's failure (DDP_ERR_PEER, DDP_ERR_TIMEOUT, ...), or
 * DDP_ERR_TIMEOUT when the wait ran out first (the work goes on). May be called again. */
int ddp_work_wait(ddp_work *w, double timeout_s);

/* Block the host until the work finished, at most timeout_s (<= 0: the group's timeout).
 * gloo: the same as ddp_work_wait. nccl: polls the event and the communicator (Note [nccl
 * work]); DDP_ERR_PEER / DDP_ERR_TIMEOUT abort the communicator. */
int ddp_work_synchronize(ddp_work *w, double timeout_s);

/* 1 when the work finished (successfully or not), else 0. Never blocks. */
int ddp_work_is_completed(ddp_work *w);

/* nccl: the current stream waits for the work (the host does not; Note [nccl work]); fails
 * at once when the communicator already failed. */
/* Release the handle. Unfinished work still runs to its end (its tensors stay referenced
 * until then). NULL is ignored. */
void ddp_work_free(ddp_work *w);

/* Finish the queued work, stop the communication thread and close the connections. Peers
 * still in a collective with this rank then see it disconnect. NULL is ignored. A group's
 * subgroups should be freed first (they share its store). */
void ddp_pg_free(ddp_pg *pg);
