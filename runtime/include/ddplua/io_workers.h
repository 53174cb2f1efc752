/* ddplua/io_workers.h: part of the public API, included by ddplua.h only.
 *
 * DataLoader worker processes (runtime/io/workers.c): the channels between a DataLoader
 * and the processes it forks to run a Lua dataset's ds:get (PyTorch's num_workers with the
 * fork start method). The Lua side (lua/ddplua/data/dataloader_workers.lua) decides what
 * runs in a worker; this API moves tasks and batches and watches the processes. Shaped for
 * the FFI: an opaque handle, status returns with ddp_last_error(), out parameters.
 *
 * Note [dataloader worker channels]:
 *  - One AF_UNIX socketpair per worker, made when it is forked (no name in the file
 *    system, close-on-exec): only the loader's process and that worker hold its ends.
 *  - Tasks (loader -> worker): a header {tag, batch, count} and `count` int64 sample
 *    indices. The loader sends worker w the batches b with b % num_workers == w, in
 *    increasing b, at most prefetch_factor ahead; a worker does its tasks in order.
 *  - Results (worker -> loader): a header {tag, batch, kind, sizes, slot} on the socket;
 *    a batch's payload lies in one of the worker's slots, memfds mapped in both processes
 *    and reused batch after batch (Note [worker slots] in workers.c): after the slot's
 *    control word, tensor descriptors, the batch's structure (opaque bytes from Lua:
 *    `meta`), then each tensor's bytes, 64-byte aligned. A slot that grows comes as a new
 *    memfd with the header (SCM_RIGHTS). The loader checks every descriptor against the
 *    payload's size and makes each tensor over the slot's bytes (Note [lent slots]), or
 *    copies them when the loop already holds the worker's LEND_MAX slots. An
 *    error's text comes in a memfd of its own. A memfd is mode 0600, has no name in any
 *    file system (nothing under /dev/shm, nothing to unlink, nothing left behind by a
 *    crash) and is reachable only through the descriptors the two processes hold.
 *  - `tag` (the loader's epoch count) lets a persistent worker's results of an abandoned
 *    epoch be told apart and dropped.
 *  - Every wait is sliced (at most 100 ms) and checks the workers: a worker that ended is
 *    reaped at once and reported with its pid and its exit code or signal; a loader's
 *    `timeout` bounds the wait for one batch. A worker has PR_SET_PDEATHSIG = SIGKILL and
 *    leaves when its socket closes: it never outlives the loader's process.
 */

typedef struct ddp_io_workers ddp_io_workers;

/* The channels of `num_workers` (1 .. 256) workers, none started, each with `slots`
 * (1 .. 64: the loader's prefetch_factor, the most tasks a worker is sent ahead of the
 * batches taken from it) batch slots. Errors: DDP_ERR_ARG for a bad count; DDP_ERR_MEMORY.
 * Free with ddp_io_workers_free. */
int ddp_io_workers_new(ddp_io_workers **out, int num_workers, int slots);

/* In the process that made them: close every channel (a worker sees the end of its tasks
 * and exits), wait up to 1 s for the workers to exit, SIGKILL those left and reap them all:
 * no process remains; the batch slots go to the process's slot pool for the next group
 * (Note [slot pool] in runtime/io/workers.c), or stay with the batches made over them
 * (Note [lent slots]). In a worker (which inherited a copy): only close its own channel and
 * free. NULL is ignored. */
void ddp_io_workers_free(ddp_io_workers *p);

/* In the process that made them, at the end of an epoch whose every task's result was read
 * from workers told ddp_io_workers_finish: free the group without waiting for the workers'
 * exit (Note [retired workers] in runtime/io/workers.c): their slots go to the slot pool
 * (no worker writes them any more) and their pids are reaped later, when a group is made
 * (without waiting) or freed and by ddp_io_workers_empty_pool (waiting, SIGKILL after 1 s,
 * as ddp_io_workers_free). Otherwise (a worker not finished, or a result not read) it is
 * ddp_io_workers_free. NULL is ignored. */
void ddp_io_workers_retire(ddp_io_workers *p);

/* Unmap the batch slots that finished worker groups left to the process's next ones (Note
 * [slot pool] in runtime/io/workers.c: at most 64 slots and 512 MiB); returns their bytes.
 * dl.empty_cache() calls it. Thread-safe. */
uint64_t ddp_io_workers_empty_pool(void);

/* Bytes of batch slots the slot pool keeps now (Note [slot pool]). Thread-safe. */
uint64_t ddp_io_workers_pool_bytes(void);

/* Fork worker `worker_id` (0 .. num_workers-1), which runs THIS program on: like fork(), it
 * returns twice. In the loader's process: DDP_OK with *is_child = 0. In the worker: DDP_OK
 * with *is_child = 1, its channel open, the other workers' channels closed, PR_SET_PDEATHSIG
 * = SIGKILL (it exits at once when the loader's process is already gone); the worker then
 * loops on ddp_io_worker_take / ddp_io_worker_send and leaves with ddp_process_exit.
 * C stdio buffers are flushed before the fork (nothing printed twice). Errors: DDP_ERR_ARG
 * for a bad id, DDP_ERR_STATE for a worker already running or a call from a worker,
 * DDP_ERR_IO when socketpair or fork fail (strerror). */
int ddp_io_workers_fork(ddp_io_workers *p, int worker_id, int *is_child);

/* Worker `worker_id`'s pid (0 before it was forked; also after it was reaped). */
int ddp_io_workers_pid(const ddp_io_workers *p, int worker_id);

/* Number of workers of the group. */
int ddp_io_workers_count(const ddp_io_workers *p);

/* In the loader's process: 1 when batches hold as many of worker `worker_id`'s slots as may
 * be lent at once (Note [lent slots]): its next batch is copied out of its slot unless a
 * collection releases one of them first; 0 otherwise, and for a bad id or a NULL group. */
int ddp_io_workers_lend_full(const ddp_io_workers *p, int worker_id);

/* In the loader's process: send worker `worker_id` the task (tag, batch, the `count`
 * 0-based sample indices); at most `slots` tasks ahead of the batches taken from that
 * worker with ddp_io_workers_get (Note [worker slots]). Waits as long as the worker lives
 * for room on the socket. Errors: DDP_ERR_PEER for a worker that ended (pid, exit code or
 * signal), DDP_ERR_TIMEOUT, DDP_ERR_ARG, DDP_ERR_IO. */
int ddp_io_workers_put(ddp_io_workers *p, int worker_id, int64_t tag, int64_t batch,
                       const int64_t *indices, int64_t count);

/* In the loader's process: worker `worker_id` gets no more tasks (Note [finished workers] in
 * runtime/io/workers.c): its channel is closed for writing, so the worker exits once it has
 * sent the results of the tasks it has, and its exit is no longer reported while the loader
 * waits on the others; a result of its still missing when the loader waits for it reports
 * how it ended, as before. A later ddp_io_workers_put to it fails (DDP_ERR_STATE). Safe to
 * call twice. Errors: DDP_ERR_ARG (NULL group, a bad id, or no such worker running). */
int ddp_io_workers_finish(ddp_io_workers *p, int worker_id);

/* In the loader's process: wait for worker `worker_id`'s result for (tag, batch), dropping
 * its results of older tags. timeout_s > 0 bounds the wait (DDP_ERR_TIMEOUT: "DataLoader
 * timed out after N seconds waiting for batch B from worker W (pid P)"); <= 0 waits as long
 * as the workers live. A batch: DDP_OK, tensors[0 .. *ntensors-1] new CPU tensors (cap
 * entries at most; made over the worker's slot, which they keep until released, or copies:
 * Note [lent slots] in runtime/io/workers.c), *meta (may be empty) a new NUL-terminated copy of the worker's
 * structure bytes, *meta_len its length; free *meta with ddp_io_string_free. A worker's
 * error: DDP_OK with *ntensors = -1 and *meta its message (the Lua side raises it).
 * Errors: DDP_ERR_PEER when any worker ended ("DataLoader worker 1 (pid 1234) exited
 * unexpectedly: killed by signal SIGKILL (9) ..."), DDP_ERR_IO for a malformed result or
 * more tensors than cap, DDP_ERR_TIMEOUT, DDP_ERR_MEMORY. */
int ddp_io_workers_get(ddp_io_workers *p, int worker_id, int64_t tag, int64_t batch,
                       double timeout_s, ddp_tensor **tensors, int cap, int *ntensors,
                       char **meta, size_t *meta_len);

/* In a worker: wait for the next task. DDP_OK with *tag, *batch, the sample indices in
 * indices[0 .. *count-1] (cap entries; a longer task is DDP_ERR_ARG); DDP_IO_END when the
 * loader closed the channel or its process is gone (the worker then exits 0); DDP_ERR_IO
 * on a malformed task; DDP_ERR_STATE outside a worker. */
int ddp_io_worker_take(ddp_io_workers *p, int64_t *tag, int64_t *batch, int64_t *indices,
                       int64_t cap, int64_t *count);

/* In a worker: send the result of the task taken last, (tag, batch): `ntensors` tensors
 * (CPU, live, any strides; copied contiguous into the task's slot) and `meta_len` bytes of
 * structure. Errors: DDP_ERR_ARG for a tensor
 * not on the CPU or freed (naming its position), DDP_ERR_IO (memfd, mmap, send, with
 * strerror), DDP_ERR_STATE outside a worker. */
int ddp_io_worker_send(ddp_io_workers *p, int64_t tag, int64_t batch, int ntensors,
                       ddp_tensor **tensors, const void *meta, size_t meta_len);

/* In a worker: as ddp_io_worker_send, where result tensor i is either the next item as is
 * (counts[i] == 0) or the stack (ddp_io_stack) of the next counts[i] > 0 items, written
 * straight into the slot (Note [stacking in the slot], runtime/io/workers.c). `items` holds
 * the sum over i of max(counts[i], 1) tensors; counts NULL: every count 0. Errors: those of
 * ddp_io_worker_send, and ddp_io_stack_check's for a stack (DDP_ERR_ARG). */
int ddp_io_worker_send_parts(ddp_io_workers *p, int64_t tag, int64_t batch, int ntensors,
                             const int32_t *counts, ddp_tensor **items, const void *meta,
                             size_t meta_len);

/* In a worker: send an error for (tag, batch): `len` bytes of msg (the worker's message and
 * traceback), which the loader hands back from ddp_io_workers_get. Errors as
 * ddp_io_worker_send. */
int ddp_io_worker_send_error(ddp_io_workers *p, int64_t tag, int64_t batch, const char *msg,
                             size_t len);
