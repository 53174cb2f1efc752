/* launcher.c: `ddplua --nproc_per_node=N [flags] script.lua args...`, torchrun's job.
 *
 * The launcher starts N workers on this node, each this same executable (/proc/self/exe)
 * run on the command line without the launcher flags, so a worker runs the script and never
 * launches again. Each worker gets the environment torchrun sets:
 *
 *   RANK = node_rank * N + LOCAL_RANK      WORLD_SIZE = nnodes * N
 *   LOCAL_RANK, LOCAL_WORLD_SIZE = N       GROUP_RANK = node_rank, GROUP_WORLD_SIZE = nnodes
 *   ROLE_RANK = RANK, ROLE_WORLD_SIZE = WORLD_SIZE, ROLE_NAME = default
 *   MASTER_ADDR, MASTER_PORT               (rank 0 hosts the store there under env://)
 *   TORCHELASTIC_RESTART_COUNT = DDPLUA_RESTART_COUNT = the restart (0 on the first attempt)
 *   TORCHELASTIC_MAX_RESTARTS = DDPLUA_MAX_RESTARTS = --max_restarts
 *   TORCHELASTIC_RUN_ID = --rdzv_id, else "none" (torchrun's default), with --standalone a
 *                         fresh random UUID per launch (as torchrun --standalone); the same
 *                         for every attempt
 *   TORCHELASTIC_USE_AGENT_STORE = False   (no launcher-hosted store: rank 0 hosts it)
 *   DDP_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS = max(1, cores / N) unless set
 *   DDPLUA_UNBUFFERED = 1 (line-buffered stdout in the worker, unless set)
 *   DDPLUA_STORE_SECRET                    (the job's store secret: Note [launcher secret])
 *
 * Of torchrun's variables these are not set: TORCHELASTIC_ERROR_FILE (a worker's error
 * reaches the launcher through its report pipe, Note [first failure]), NCCL_ASYNC_ERROR_HANDLING
 * (the nccl backend reads no such switch) and the file-timer ones (no watchdog server).
 *
 * Elastic jobs (--nnodes=MIN:MAX, or --rdzv_endpoint): instead of fixed node ranks, the
 * agent joins rounds of a rendezvous on a store hosted by the endpoint's node (rendezvous.c,
 * Note [elastic rendezvous]); each round sets GROUP_RANK (the join order), GROUP_WORLD_SIZE,
 * WORLD_SIZE, RANK, MASTER_ADDR/PORT (node rank 0's address, a free port) and
 * TORCHELASTIC_RESTART_COUNT (the round number). While the workers run, the agent asks the
 * store every WATCH_S whether the round must end (a node waits to join, another node's
 * workers failed); then, or when its own workers fail, it stops them and joins the next
 * round, until the workers succeed or --max_restarts rounds have been used.
 *
 * The launcher of a fixed job runs no store (the elastic agent hosts the rendezvous store
 * when it owns the endpoint's address) and no Lua: it only starts, watches and stops processes, all
 * through the runtime's process supervision API (ddplua/process.h, shared with dl.spawn),
 * which also owns the worker environment (Note [worker environment]) and the output
 * handling described next. What stays here is the command line, the signals, the restarts
 * and the failure summary.
 *
 * Output: every worker's stdout and stderr come through pipes. Lines go to the launcher's
 * stdout / stderr prefixed "[rank N]: ", whole lines only (a partial line waits for its end,
 * or for the end of the stream), and/or to <log_dir>[/attempt_K]/rank_N/{stdout,stderr}.log
 * raw, as --log_dir, --redirects and --tee say (torchrun's meanings: a stream in `redirects`
 * goes to its file only, a stream in `tee` to its file and the console).
 *
 * Watching: one poll() loop over the pipes and a self-pipe written by the signal handlers
 * (SIGCHLD, SIGINT, SIGTERM, SIGHUP). When a worker exits non-zero or dies by a signal, the
 * others get SIGTERM, then SIGKILL after GRACE_S seconds; the launcher prints a summary naming
 * the rank that failed first in time (Note [first failure] in ddplua/process.h: a worker's
 * Lua error is stamped when it is raised, so the peers that fail because it left are not
 * named), the exit code or signal and the worker's error message (the last "ddplua: ..."
 * line of its stderr), then restarts the whole group (up to --max_restarts times) or exits 1.
 * Each worker leads its own process group, which is what gets signalled, so processes a
 * worker started go with it; workers also have PR_SET_PDEATHSIG = SIGKILL, so they die with
 * a launcher that is killed outright. SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to
 * the workers (a second one sends SIGKILL); once they are reaped, the launcher ends by the
 * same signal. SIGUSR1 is passed on to each worker process and changes nothing else: each
 * rank dumps its flight recorder (Note [flight recorder]) and goes on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ddplua.h"
#include "live_view.h"
#include "rendezvous.h"

#define GRACE_S 3.0          /* SIGTERM to SIGKILL */
#define SUMMARY_LINES 12     /* stderr lines shown in the summary when stderr was not shown */
#define WATCH_S 0.25         /* elastic: how often a running agent looks at the rendezvous */

/* Why an attempt ended. ROUND_ENDED and STORE_LOST only in an elastic job: the rendezvous
 * said the round must end (membership changed), or its store was lost. */
enum outcome { ALL_OK, WORKER_FAILED, SIGNALLED, START_FAILED, ROUND_ENDED, STORE_LOST };

typedef struct launcher {
  const ddp_cli_launch *cfg;
  int nproc;
  char exe[PATH_MAX];
  char **argv;        /* the workers' command line (NULL-terminated) */
  const char *log_dir; /* NULL: no log files */
  int to_file, to_console; /* DDP_PROCS_STDOUT / DDP_PROCS_STDERR bits */
  char master_addr[256];
  int master_port;
  int attempt;
  int nnodes, node_rank; /* of this attempt: the flags', or the elastic round's */
  int signal;         /* the signal that stopped the launcher, 0 */
  char run_id[160];   /* TORCHELASTIC_RUN_ID: --rdzv_id, "none", or a UUID (--standalone) */
} launcher;

static void say(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  fprintf(stderr, DDP_CLI_NAME ": ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

/* ---------------------------------------------------------------------------------------
 * Signals: the handlers only write the signal number into a pipe that the supervision
 * loop watches (ddp_procs_poll's wake_fd)
 * ------------------------------------------------------------------------------------- */

static int sig_pipe[2] = {-1, -1};
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
#define N_FORWARDED ((int)(sizeof forwarded / sizeof forwarded[0]))

static void on_signal(int sig) {
  int saved = errno;
  unsigned char c = (unsigned char)sig;
  if (write(sig_pipe[1], &c, 1) < 0) { /* full: the loop wakes up anyway */
  }
  errno = saved;
}

static int install_signals(void) {
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
  for (int i = 0; i < N_FORWARDED; i++) sigaction(forwarded[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* a closed console gives EPIPE, not death */
  return 0;
}

static void restore_signals(void) {
  signal(SIGCHLD, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
  for (int i = 0; i < N_FORWARDED; i++) signal(forwarded[i], SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The signals that arrived: the first is forwarded to the workers (they then get SIGKILL
 * after the grace period), a second one sends SIGKILL at once. SIGCHLD only wakes us. */
static void take_signals(launcher *L, ddp_procs *p) {
  unsigned char sigs[64];
  ssize_t k;
  while ((k = read(sig_pipe[0], sigs, sizeof sigs)) > 0) {
    for (ssize_t j = 0; j < k; j++) {
      int sig = sigs[j];
      if (sig == SIGCHLD) continue;
      if (sig == SIGUSR1) { /* a dump request, not a stop */
        ddp_procs_notify(p, SIGUSR1);
        continue;
      }
      if (L->signal) { /* a second one: no more grace */
        ddp_procs_terminate(p, SIGKILL);
        continue;
      }
      L->signal = sig;
      ddp_procs_terminate(p, sig);
    }
  }
}

/* ---------------------------------------------------------------------------------------
 * The failure summary
 * ------------------------------------------------------------------------------------- */

/* The worker's error message: the lines from the last one that starts with "ddplua: " (how
 * the host reports a Lua error) up to "stack traceback:", else the last non-empty line. */
static void error_message(const char *tail, size_t tail_len, char *out, size_t size) {
  char text[8192 + 1];
  if (tail_len > sizeof text - 1) tail_len = sizeof text - 1;
  memcpy(text, tail, tail_len);
  text[tail_len] = '\0';
  const char *start = NULL;
  const char prefix[] = DDP_CLI_NAME ": ";
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (strncmp(p, prefix, sizeof prefix - 1) == 0) start = p + sizeof prefix - 1;
  size_t len;
  if (start) {
    const char *stop = strstr(start, "\nstack traceback:");
    len = stop ? (size_t)(stop - start) : strlen(start);
  } else { /* the last non-empty line */
    len = strlen(text);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    const char *nl = len ? memrchr(text, '\n', len) : NULL;
    start = nl ? nl + 1 : text;
    len -= (size_t)(start - text);
  }
  while (len > 0 && (start[len - 1] == '\n' || start[len - 1] == '\r')) len--;
  snprintf(out, size, "%.*s", (int)len, start);
}

/* The last `max` lines of the stderr tail, each indented, on stderr. */
static void print_tail(const char *tail, size_t tail_len, int max) {
  size_t end = tail_len;
  while (end > 0 && tail[end - 1] == '\n') end--;
  size_t start = end;
  for (int lines = 0; start > 0; start--)
    if (tail[start - 1] == '\n' && ++lines == max) break;
  for (size_t i = start; i < end;) {
    const char *nl = memchr(tail + i, '\n', end - i);
    size_t stop = nl ? (size_t)(nl - tail) : end;
    fprintf(stderr, "  %.*s\n", (int)(stop - i), tail + i);
    i = stop + 1;
  }
}

static void report_failure(const launcher *L, const ddp_procs *p) {
  int i = ddp_procs_failed(p), code = 0, sig = 0;
  ddp_procs_exit_status(p, i, &code, &sig);
  size_t tail_len = 0;
  const char *tail = ddp_procs_stderr_tail(p, i, &tail_len);
  char msg[8192 + 1], how[96], name[32];
  error_message(tail, tail_len, msg, sizeof msg);
  size_t report_len = 0;
  ddp_procs_message(p, i, &report_len);
  if (sig && report_len && (sig == SIGTERM || sig == SIGKILL)) {
    /* it raised first, and was still exiting when the others' end stopped it */
    ddp_process_signal_name(sig, name, sizeof name);
    snprintf(how, sizeof how, "failed (stopped by %s while it was exiting)", name);
  } else if (sig) {
    ddp_process_signal_name(sig, name, sizeof name);
    snprintf(how, sizeof how, "was killed by signal %d (%s)", sig, name);
  } else {
    snprintf(how, sizeof how, "failed with exit code %d", code);
  }
  fflush(stdout);
  fprintf(stderr, DDP_CLI_NAME ": worker rank %d (local rank %d, pid %d) %s%s%s\n",
          L->node_rank * L->nproc + i, i, ddp_procs_pid(p, i), how, *msg ? ": " : "", msg);
  if (!ddp_procs_on_console(p, DDP_PROCS_STDERR) && tail_len) {
    const char *log = ddp_procs_log_path(p, i, DDP_PROCS_STDERR);
    fprintf(stderr, DDP_CLI_NAME ": last lines of its stderr%s%s%s:\n", log[0] ? " (" : "", log,
            log[0] ? ")" : "");
    print_tail(tail, tail_len, SUMMARY_LINES);
  }
  fflush(stderr);
}

/* ---------------------------------------------------------------------------------------
 * One attempt
 * ------------------------------------------------------------------------------------- */

/* Start the workers, pass their output on, stop them all at the first failure or signal,
 * reap them (ddp_procs_poll does the watching). In an elastic job (z and r not NULL) the
 * round gives the node count, this node's rank and the master, and every WATCH_S the agent
 * asks the rendezvous whether the round must end (Note [elastic rendezvous] in
 * rendezvous.c): then the workers are stopped (SIGTERM, SIGKILL after the grace period) and
 * the attempt ends with ROUND_ENDED, or STORE_LOST when the store cannot be reached. */
static enum outcome run_attempt(launcher *L, ddp_rdzv *z, const ddp_rdzv_round *r) {
  char dir[PATH_MAX];
  if (L->log_dir && L->cfg->max_restarts > 0)
    snprintf(dir, sizeof dir, "%s/attempt_%d", L->log_dir, L->attempt);
  else if (L->log_dir)
    snprintf(dir, sizeof dir, "%s", L->log_dir);
  L->nnodes = r ? r->nnodes : L->cfg->nnodes;
  L->node_rank = r ? r->node_rank : L->cfg->node_rank;
  ddp_procs_config cfg = {
      .nprocs = L->nproc, .nnodes = L->nnodes, .node_rank = L->node_rank,
      .master_addr = r ? r->master_addr : L->master_addr,
      .master_port = r ? r->master_port : L->master_port, .attempt = L->attempt,
      .max_restarts = L->cfg->max_restarts, .grace_s = GRACE_S, .own_group = 1,
      .capture = DDP_PROCS_STDOUT | DDP_PROCS_STDERR, .console = L->to_console,
      .log = L->to_file, .log_dir = L->log_dir ? dir : NULL, .status_pages = 1};
  /* Note [live view] (live_view.c): on our terminal, or plain lines every status_interval s */
  live_view *view = L->cfg->status_interval > 0
                        ? live_view_new(L->nproc, L->node_rank * L->nproc, isatty(STDOUT_FILENO),
                                        L->cfg->status_interval)
                        : NULL;
  if (view) {
    cfg.before_console = live_view_clear;
    cfg.console_ctx = view;
  }
  ddp_procs *p = NULL;
  if (ddp_procs_new(&p, &cfg) != DDP_OK ||
      ddp_procs_add_env(p, "TORCHELASTIC_RUN_ID", L->run_id) != DDP_OK ||
      ddp_procs_add_env(p, "TORCHELASTIC_USE_AGENT_STORE", "False") != DDP_OK) {
    say("%s", ddp_last_error());
    ddp_procs_free(p);
    live_view_free(view);
    return START_FAILED;
  }
  enum outcome start = ALL_OK;
  for (int i = 0; i < L->nproc && start == ALL_OK; i++) {
    if (ddp_procs_exec(p, i, L->exe, L->argv) != DDP_OK) {
      say("%s", ddp_last_error());
      start = START_FAILED;
      ddp_procs_terminate(p, SIGTERM);
    }
  }
  enum outcome stopped = ALL_OK; /* ROUND_ENDED / STORE_LOST once the rendezvous said so */
  double next_watch = ddp_os_monotonic_seconds() + WATCH_S;
  for (;;) {
    int woken = 0;
    int more = ddp_procs_poll(p, view ? 0.5 : z ? WATCH_S : 1.0, sig_pipe[0], &woken);
    if (woken) take_signals(L, p);
    if (!more) break;
    live_view_tick(view, p);
    if (z && stopped == ALL_OK && !L->signal && ddp_procs_failed(p) < 0 &&
        ddp_os_monotonic_seconds() >= next_watch) {
      int s = ddp_rdzv_should_stop(z, r);
      if (s != 0) {
        stopped = s > 0 ? ROUND_ENDED : STORE_LOST;
        say("round %d: stopping the workers: %s", r->round, ddp_rdzv_error(z));
        if (s > 0) ddp_rdzv_join(z); /* a place in the next round first (rendezvous.h) */
        ddp_procs_terminate(p, SIGTERM);
      }
      next_watch = ddp_os_monotonic_seconds() + WATCH_S;
    }
  }
  live_view_clear(view); /* before the summary: the lines go, the messages stay */
  enum outcome o = L->signal ? SIGNALLED
                 : start != ALL_OK ? START_FAILED
                 : stopped != ALL_OK ? stopped
                 : ddp_procs_failed(p) >= 0 ? WORKER_FAILED : ALL_OK;
  if (o == WORKER_FAILED && z && ddp_rdzv_should_stop(z, r) > 0) {
    /* another node left for the next round first: its workers' going made ours fail */
    say("round %d: the workers stopped after the membership changed (%s)", r->round, ddp_rdzv_error(z));
    ddp_rdzv_join(z);
    o = ROUND_ENDED;
  }
  if (o == WORKER_FAILED) {
    report_failure(L, p);
    if (z) { /* the other nodes learn it now, not at their next collective's timeout */
      char why[128];
      snprintf(why, sizeof why, "worker rank %d failed", L->node_rank * L->nproc + ddp_procs_failed(p));
      ddp_rdzv_mark_changed(z, r, why);
      if (r->round < L->cfg->max_restarts) ddp_rdzv_join(z);
    }
  }
  ddp_procs_free(p);
  live_view_free(view); /* after the group: its last output may still call the hook */
  return o;
}

/* ---------------------------------------------------------------------------------------
 * Entry
 * ------------------------------------------------------------------------------------- */

/* The workers' argv: ours without the launcher flags (argv[0] kept, so `arg` looks as
 * when the script is run by hand). */
static char **worker_argv(const ddp_cli_options *opts, int argc, char **argv) {
  char **out = calloc((size_t)argc + 1, sizeof *out);
  if (!out) return NULL;
  int n = 0, script = opts->script ? opts->script : argc; /* flags come before the script */
  for (int i = 0; i < argc; i++)
    if (i == 0 || i >= script || !opts->launcher_arg[i]) out[n++] = argv[i];
  return out;
}

/* Where logs go: --log_dir, or a new temporary folder when only --redirects/--tee ask for
 * files (as torchrun). Returns 0, or -1 after a message. */
static int choose_logs(launcher *L, char *tmp, size_t size) {
  const ddp_cli_launch *c = L->cfg;
  int file_bits = c->redirects | c->tee;
  if (c->log_dir && !c->redirects_set) file_bits = 3; /* --log_dir alone: tee both */
  L->to_file = L->to_console = 0;
  for (int k = DDP_PROCS_STDOUT; k <= DDP_PROCS_STDERR; k++) {
    if (file_bits & k) L->to_file |= k;
    if (!(c->redirects & k) || (c->tee & k)) L->to_console |= k;
  }
  L->log_dir = c->log_dir;
  if (file_bits && !L->log_dir) {
    snprintf(tmp, size, "/tmp/" DDP_CLI_NAME "_logs_XXXXXX");
    if (!mkdtemp(tmp)) {
      say("cannot create a folder for the worker logs: %s", strerror(errno));
      return -1;
    }
    L->log_dir = tmp;
    say("writing the worker logs to %s", tmp);
  }
  return 0;
}

/* Note [launcher secret]: every store connection proves the job's secret (README,
 * "Security"). A one-node job gets a fresh secret from the kernel's random source, in the
 * environment the workers inherit (readable only by this user and root, as the workers'
 * memory is); a secret already in the environment is kept. A multi-node job needs the same
 * secret on every node, which only the user can arrange: without one the launcher refuses. */
/* TORCHELASTIC_RUN_ID: torchrun's default rendezvous id "none", or under --standalone a
 * random version-4 UUID (torchrun --standalone draws one with uuid.uuid4()). */
static int choose_run_id(launcher *L) {
  if (!L->cfg->standalone) {
    snprintf(L->run_id, sizeof L->run_id, "%s", L->cfg->rdzv_id ? L->cfg->rdzv_id : "none");
    return 0;
  }
  char hex[65];
  if (ddp_store_new_secret(hex, sizeof hex) != DDP_OK) { /* 64 random hex digits */
    say("--standalone: cannot draw a run id: %s", ddp_last_error());
    return -1;
  }
  hex[12] = '4';                           /* the version */
  hex[16] = "89ab"[(hex[16] - '0') & 3];   /* the variant (10xx); any hex digit works */
  snprintf(L->run_id, sizeof L->run_id, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12,
           hex + 16, hex + 20);
  return 0;
}

static int choose_secret(const ddp_cli_launch *c) {
  const char *given = getenv("DDPLUA_STORE_SECRET");
  if (given && given[0]) return 0;
  if (c->nnodes_max > 1) {
    say("--nnodes=%d: set DDPLUA_STORE_SECRET to the same secret on every node (for example "
        "the output of `od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`), so that only "
        "this job's ranks can use its store", c->nnodes_max);
    return -1;
  }
  char secret[65];
  if (ddp_store_new_secret(secret, sizeof secret) != DDP_OK || setenv("DDPLUA_STORE_SECRET", secret, 1) != 0) {
    say("cannot make the job's store secret: %s", ddp_last_error());
    return -1;
  }
  return 0;
}

/* The fixed job (--nnodes=M --node_rank=K): run the group, restart it after a failure up to
 * --max_restarts times. Returns the exit status. */
static int static_job(launcher *L) {
  const ddp_cli_launch *c = L->cfg;
  int status = DDP_CLI_EXIT_ERROR;
  for (L->attempt = 0;; L->attempt++) {
    if (c->standalone && ddp_process_free_port(&L->master_port) != DDP_OK) {
      say("--standalone: %s", ddp_last_error());
      break;
    }
    enum outcome o = run_attempt(L, NULL, NULL);
    if (o == ALL_OK) {
      status = DDP_CLI_EXIT_OK;
      break;
    }
    if (o == SIGNALLED) {
      char name[32];
      ddp_process_signal_name(L->signal, name, sizeof name);
      say("stopped the workers on %s", name);
      status = 128 + L->signal;
      break;
    }
    if (o == START_FAILED) break;
    if (L->attempt >= c->max_restarts) break;
    say("restarting all %d workers (restart %d of %d)", L->nproc, L->attempt + 1, c->max_restarts);
  }

  return status;
}

/* The elastic job (--nnodes=MIN:MAX, Note [elastic rendezvous] in rendezvous.c): join a
 * round, run the workers with the round's world, and when the round ends (a node left or
 * waits to join, workers failed here or elsewhere) join the next one, until the workers all
 * succeed, the job runs out of restarts or a round cannot gather MIN nodes in time.
 * Returns the exit status. */
static int elastic_job(launcher *L) {
  const ddp_cli_launch *c = L->cfg;
  char host[256];
  int port = c->master_port;
  snprintf(host, sizeof host, "%s", c->rdzv_endpoint ? c->rdzv_endpoint : c->master_addr);
  char *colon = c->rdzv_endpoint ? strrchr(host, ':') : NULL;
  if (colon) {
    *colon = '\0';
    port = atoi(colon + 1);
  } else if (c->rdzv_endpoint) {
    port = 29400; /* torchrun's default rendezvous port */
  }
  ddp_rdzv_config rc = {.host = host, .port = port, .run_id = L->run_id,
                        .min_nodes = c->nnodes, .max_nodes = c->nnodes_max,
                        .max_restarts = c->max_restarts, .last_call_s = c->last_call_s,
                        .join_timeout_s = c->join_timeout_s};
  ddp_rdzv *z = NULL;
  const char *err = NULL;
  if (ddp_rdzv_open(&z, &rc, &err) != 0) {
    say("%s", err);
    return DDP_CLI_EXIT_ERROR;
  }
  say("elastic job '%s': %d to %d nodes of %d workers, rendezvous at %s:%d%s", L->run_id,
      c->nnodes, c->nnodes_max, L->nproc, host, port, ddp_rdzv_is_host(z) ? " (hosted here)" : "");
  int status = DDP_CLI_EXIT_ERROR, rounds = 0;
  for (;;) {
    ddp_rdzv_round r;
    int s = ddp_rdzv_next_round(z, &r);
    if (s != 0) {
      say("%s", ddp_rdzv_error(z));
      /* a node that took part tells the others; a newcomer that may not join stays quiet */
      if (s < 0 && rounds > 0) ddp_rdzv_end_job(z, ddp_rdzv_error(z));
      break;
    }
    rounds++;
    L->attempt = r.round;
    say("round %d: node rank %d of %d nodes, world size %d (nodes: %s; master %s:%d)%s%s", r.round,
        r.node_rank, r.nnodes, r.nnodes * L->nproc, r.nodes, r.master_addr, r.master_port,
        r.gone[0] ? "; gone since the last round: " : "", r.gone);
    enum outcome o = run_attempt(L, z, &r);
    if (o == ALL_OK) {
      if (ddp_rdzv_finish(z, &r) != 0) say("%s", ddp_rdzv_error(z));
      status = DDP_CLI_EXIT_OK;
      break;
    }
    if (o == SIGNALLED) {
      char name[32];
      ddp_process_signal_name(L->signal, name, sizeof name);
      say("stopped the workers on %s", name);
      char why[64];
      snprintf(why, sizeof why, "its agent was stopped by %s", name);
      ddp_rdzv_mark_changed(z, &r, why);
      status = 128 + L->signal;
      break;
    }
    if (o == STORE_LOST) break; /* said in run_attempt */
    if (o == START_FAILED) {
      ddp_rdzv_end_job(z, "its workers could not be started");
      break;
    }
    if (r.round >= c->max_restarts) {
      char why[160];
      snprintf(why, sizeof why, "round %d ended and no restarts are left (--max_restarts=%d; "
               "membership changes and failures both count)", r.round, c->max_restarts);
      say("%s", why);
      ddp_rdzv_end_job(z, why);
      break;
    }
    say("round %d ended; joining round %d (restart %d of %d)", r.round, r.round + 1, r.round + 1,
        c->max_restarts);
  }
  /* The other agents learn that the job ended through the store: the host gives them a
   * moment (they look every WATCH_S) before its store goes */
  if (status != DDP_CLI_EXIT_OK && ddp_rdzv_is_host(z)) ddp_os_sleep(4 * WATCH_S);
  ddp_rdzv_free(z);
  return status;
}

int ddp_launcher_run(const ddp_cli_options *opts, int argc, char **argv) {
  const ddp_cli_launch *c = &opts->launch;
  launcher L;
  memset(&L, 0, sizeof L);
  L.cfg = c;
  L.nproc = c->nproc_per_node;
  snprintf(L.master_addr, sizeof L.master_addr, "%s", c->standalone ? "127.0.0.1" : c->master_addr);
  L.master_port = c->master_port;

  ssize_t n = readlink("/proc/self/exe", L.exe, sizeof L.exe - 1);
  if (n <= 0 || n >= (ssize_t)sizeof L.exe - 1) {
    say("cannot find this executable (/proc/self/exe): %s", strerror(errno));
    return DDP_CLI_EXIT_ERROR;
  }
  L.exe[n] = '\0';

  char tmp_logs[64];
  if (choose_secret(c) != 0 || choose_run_id(&L) != 0) return DDP_CLI_EXIT_ERROR;
  if (choose_logs(&L, tmp_logs, sizeof tmp_logs) != 0) return DDP_CLI_EXIT_ERROR;
  L.argv = worker_argv(opts, argc, argv);
  if (!L.argv || install_signals() != 0) {
    say("cannot start the launcher: %s", strerror(errno ? errno : ENOMEM));
    free(L.argv);
    return DDP_CLI_EXIT_ERROR;
  }

  int status = L.cfg->elastic ? elastic_job(&L) : static_job(&L);

  free(L.argv);
  fflush(stdout);
  restore_signals();
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  if (L.signal) raise(L.signal); /* end as the signal would have ended us */
  return status;
}
