/* ddplua/process.h: part of the public API, included by ddplua.h only.
 *
 * Process supervision (runtime/distributed/process.c): one API for the two ways a job starts
 * its workers on this node, the `ddplua --nproc_per_node=N` launcher (runtime/cli/launcher.c:
 * fork + exec of the ddplua executable) and `dl.spawn` (lua/ddplua/distributed/spawn.lua:
 * fork only, the child runs a Lua function). Shaped for the FFI: an opaque handle, status
 * returns with ddp_last_error(), out parameters, no callbacks.
 *
 * Note [worker environment]: worker `i` (local rank i) of a group gets the torchrun
 * variables
 *   RANK = node_rank * nprocs + i          WORLD_SIZE = nnodes * nprocs
 *   LOCAL_RANK = i, LOCAL_WORLD_SIZE = nprocs, GROUP_RANK = node_rank, GROUP_WORLD_SIZE = nnodes
 *   ROLE_RANK = RANK, ROLE_WORLD_SIZE = WORLD_SIZE, ROLE_NAME = default
 *   MASTER_ADDR, MASTER_PORT
 *   DDPLUA_RESTART_COUNT = TORCHELASTIC_RESTART_COUNT = attempt,
 *   DDPLUA_MAX_RESTARTS = TORCHELASTIC_MAX_RESTARTS = max_restarts (these four only when
 *   max_restarts >= 0: the launcher's workers, not dl.spawn's, as torchrun and mp.spawn)
 * then the variables added with ddp_procs_add_env (they may override the above), then,
 * unless already set, DDP_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS =
 * ddp_process_threads_per_worker(nprocs), and DDPLUA_UNBUFFERED = 1 when the output is
 * captured (a pipe is not a terminal: line buffering has to be asked for); an exec'd worker
 * also gets DDPLUA_REPORT_FD (ddp_process_adopt_report_channel). Every worker has
 * PR_SET_PDEATHSIG = SIGKILL (it dies with its parent) and checks that its parent is still
 * the one that forked it.
 *
 * Note [first failure]: "the failure" (ddp_procs_failed) is the worker that failed first in
 * time, not the first one reaped: a worker that raises makes its peers fail soon after
 * (their collectives lose it), and they may well exit and be reaped before it. Each worker
 * that fails stamps the time it failed into its report pipe (ddp_procs_report,
 * ddp_process_report_failure); a worker that reports nothing (a signal, os.exit) counts from
 * the moment the parent saw its end, which the report pipe shows at once (Note [report
 * pipe] in process.c). When ddp_procs_poll reaps the first worker that exits non-zero or
 * dies by a signal, the survivors get SIGTERM, and SIGKILL once grace_s has passed (as
 * torchrun and mp.spawn); each later poll goes on reaping until every worker ended, and
 * ddp_procs_failed may then name an earlier failure that was reaped later. */

typedef struct ddp_procs ddp_procs;

/* Which of a worker's output streams (bits). */
enum ddp_procs_stream { DDP_PROCS_STDOUT = 1, DDP_PROCS_STDERR = 2 };

typedef struct ddp_procs_config {
  int nprocs;              /* workers on this node (LOCAL_WORLD_SIZE), >= 1 */
  int nnodes;              /* nodes of the job (GROUP_WORLD_SIZE), >= 1 */
  int node_rank;           /* this node (GROUP_RANK), 0 .. nnodes-1 */
  const char *master_addr; /* MASTER_ADDR (copied) */
  int master_port;         /* MASTER_PORT, 1 .. 65535 */
  int attempt;             /* DDPLUA_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT */
  int max_restarts;        /* DDPLUA_MAX_RESTARTS, TORCHELASTIC_MAX_RESTARTS; < 0: none of
                              the four variables is set */
  double grace_s;          /* SIGTERM to SIGKILL when stopping (Note [first failure]) */
  int own_group;           /* 1: each worker leads its own process group, which is what gets
                              signalled (processes it starts go with it), and reads
                              /dev/null instead of a terminal (else it would stop on SIGTTIN) */
  int capture;             /* DDP_PROCS_STDOUT | DDP_PROCS_STDERR: these streams reach the
                              parent through pipes (0: the workers inherit ours) */
  int console;             /* captured streams printed on ours, each line prefixed
                              "[rank N]: ", whole lines only, one write per batch of lines */
  int log;                 /* captured streams written raw to log_dir/rank_N/{stdout,stderr}.log */
  const char *log_dir;     /* the folder of the rank_N folders (copied; created as needed) */
  int status_pages;        /* 1: every exec'd worker gets a status page (Note [rank status
                              pages] in runtime/core/status.c), read with ddp_procs_status */
  void (*before_console)(void *ctx); /* called before worker output is printed on our
                              console (NULL: none): the launcher's live view clears its lines */
  void *console_ctx;       /* its argument */
} ddp_procs_config;

/* A group of cfg->nprocs workers, none started yet. Errors: DDP_ERR_ARG for a bad count,
 * node rank, port or grace, or log bits without log_dir; DDP_ERR_MEMORY. */
int ddp_procs_new(ddp_procs **out, const ddp_procs_config *cfg);

/* Kill (SIGKILL) and reap the workers still running, close every pipe, free. NULL is
 * ignored. */
void ddp_procs_free(ddp_procs *p);

/* One more variable for every worker started afterwards (Note [worker environment]: applied
 * after the torchrun variables, before the thread counts). DDP_ERR_ARG for an empty name or
 * one holding '='; DDP_ERR_MEMORY. */
int ddp_procs_add_env(ddp_procs *p, const char *name, const char *value);

/* Fork worker `local_rank` (0 .. nprocs-1), which runs THIS program on: like fork(), it
 * returns twice. In the parent: DDP_OK with *is_child = 0 (or an error: pipes, log files,
 * fork; nothing started). In the worker: DDP_OK with *is_child = 1, its environment set
 * (Note [worker environment]), the parent's descriptors of the other workers closed, its
 * output redirected when captured; the worker ends with ddp_process_exit after telling the
 * parent why it failed, if it did, with ddp_procs_report. When the parent died before the
 * worker could arm its death signal, the worker exits 1 at once. */
int ddp_procs_fork(ddp_procs *p, int local_rank, int *is_child);

/* Fork worker `local_rank` and exec `exe` with `argv` (NULL-terminated) in it. Signal
 * handlers and the signal mask go back to the defaults first. DDP_OK in the parent; errors
 * as ddp_procs_fork. A worker whose exec fails prints "ddplua: cannot run EXE: reason" on
 * its stderr and exits 127. */
int ddp_procs_exec(ddp_procs *p, int local_rank, const char *exe, char *const *argv);

/* In a worker forked by ddp_procs_fork: send `len` bytes of `msg` (why the worker fails,
 * e.g. a Lua traceback; at most 60000 bytes arrive, more is cut) to the parent, which shows
 * them as ddp_procs_message. Write once, just before ddp_process_exit. */
void ddp_procs_report(ddp_procs *p, const char *msg, size_t len);

/* In a worker started by ddp_procs_exec (the ddplua executable calls it first thing): take
 * the report descriptor the parent passed in DDPLUA_REPORT_FD, drop the variable and mark
 * the descriptor close-on-exec, so that programs this worker starts hold neither. Does
 * nothing in a process no group started. */
void ddp_process_adopt_report_channel(void);

/* In a worker started by ddp_procs_exec, after ddp_process_adopt_report_channel: tell the
 * parent that this worker fails, when (at_s: ddp_os_monotonic_seconds() at the moment of
 * the failure, e.g. when the Lua error was raised; <= 0: now) and why (len bytes of msg, at
 * most 60000 arrive). Once, just before exiting non-zero; later calls and calls in a process
 * no group started do nothing. The parent orders failures by this time (Note [first
 * failure]) and shows msg as ddp_procs_message. */
void ddp_process_report_failure(double at_s, const char *msg, size_t len);

/* Supervise for up to timeout_s seconds (>= 0): pass the captured output on (console, log
 * files), take reports, reap ended workers, stop the survivors at the first failure (Note
 * [first failure]) and SIGKILL them when their grace ends. Returns early when `wake_fd`
 * (>= 0; -1: none) becomes readable, with *woken = 1 (else 0; woken may be NULL), without
 * reading it: the launcher's signal self-pipe. Returns 1 while something is left (a worker
 * running, or its captured output still open, for at most 2 s after the last one ended:
 * pipes held by a worker's own children), 0 when everything is over. */
int ddp_procs_poll(ddp_procs *p, double timeout_s, int wake_fd, int *woken);

/* Send `sig` to every running worker (its process group when own_group) and start the
 * grace period after which the survivors get SIGKILL (unless it started before). SIGKILL
 * itself needs no grace. */
void ddp_procs_terminate(ddp_procs *p, int sig);

/* Send `sig` to every running worker process itself (not its process group, whose other
 * members may not handle it) without starting a grace period: a request, not a stop (the
 * launcher forwards SIGUSR1 this way, asking each worker to dump its flight recorder). */
void ddp_procs_notify(ddp_procs *p, int sig);

/* SIGTERM to every running worker, then ddp_procs_poll until everything is over (SIGKILL
 * after the grace period): nothing is left running when it returns. */
void ddp_procs_stop(ddp_procs *p);

/* The local rank of the worker that failed first in time among those that ended (Note
 * [first failure]), or -1 while none did. */
int ddp_procs_failed(const ddp_procs *p);

/* Worker `local_rank`: its pid (0 before it started), and whether it ended: 1 with *code =
 * its exit code (-1 when a signal ended it) and *signal = that signal (0 when it exited),
 * else 0. Out of range: -1 (pid) / 0. */
int ddp_procs_pid(const ddp_procs *p, int local_rank);
int ddp_procs_exit_status(const ddp_procs *p, int local_rank, int *code, int *signal);

/* What worker `local_rank` sent with ddp_procs_report ("" when nothing), and the last 8 KiB
 * of its captured stderr ("" when not captured); *len (may be NULL) gets the byte count.
 * Valid until the group is freed. */
const char *ddp_procs_message(const ddp_procs *p, int local_rank, size_t *len);
const char *ddp_procs_stderr_tail(const ddp_procs *p, int local_rank, size_t *len);

/* The log file of stream `which` (DDP_PROCS_STDOUT or DDP_PROCS_STDERR) of worker
 * `local_rank`, "" when it has none. */
const char *ddp_procs_log_path(const ddp_procs *p, int local_rank, int which);

/* A consistent copy of worker `local_rank`'s status page into *out: 0, or -1 when it has
 * none (status_pages off, not started by exec, out of range). */
int ddp_procs_status(const ddp_procs *p, int local_rank, ddp_rank_status *out);

/* 1 when stream `which` of the workers is printed on the parent's console. */
int ddp_procs_on_console(const ddp_procs *p, int which);

/* A TCP port nobody listens on now (bind port 0 on 127.0.0.1 and read what the kernel
 * chose; another process may take it before rank 0 does, as with torchrun --standalone):
 * DDP_OK with *port, or DDP_ERR_IO naming the failing call. */
int ddp_process_free_port(int *port);

/* Threads per worker when `nprocs` workers share this host: max(1, online cores / nprocs). */
int ddp_process_threads_per_worker(int nprocs);

/* The name of signal `sig` ("SIGKILL"; "signal N" when it has none) into buf (cap bytes). */
void ddp_process_signal_name(int sig, char *buf, size_t cap);

/* In a worker: on SIGTERM (how a group stops its survivors when a worker fails), flush
 * stdout and stderr before ending by that signal, so that nothing the worker printed is lost
 * (Note [flush on SIGTERM] in process.c). dl.spawn's children call it. */
void ddp_process_flush_on_sigterm(void);

/* End this process now with `code`, running no atexit handlers and no finalizers (_exit):
 * how a forked worker leaves, so it never runs its parent's code after the fork. */
void ddp_process_exit(int code);
