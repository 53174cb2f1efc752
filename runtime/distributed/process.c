/* runtime/distributed/process.c: process supervision (see ddplua/process.h), shared by the
 * launcher (runtime/cli/launcher.c) and dl.spawn (lua/ddplua/distributed/spawn.lua).
 *
 * One parent watches nprocs workers through one poll() loop: their captured stdout and
 * stderr (printed prefixed, logged raw, the end of stderr kept for a failure summary), one
 * report pipe each (a forked worker's error message), and an optional wake-up descriptor
 * of the caller (the launcher's signal self-pipe). Workers are reaped with waitpid(WNOHANG)
 * on every round, so no SIGCHLD handler is needed (the caller may have one). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

enum {
  TAIL_BYTES = 8192,     /* stderr kept per worker for the failure summary */
  MAX_LINE = 65536,      /* a longer line is printed in pieces */
  READ_CHUNK = 65536,
  MAX_REPORT = 60000     /* a worker's report fits the pipe (64 KiB) in one write */
};
static const double DRAIN_S = 2.0; /* how long output pipes held by a worker's children count */

/* One captured output stream of one worker. */
typedef struct stream {
  int fd;          /* read end of the worker's pipe, -1 once closed */
  int console;     /* 1 or 2: our fd that gets prefixed lines; 0: none */
  int log;         /* fd of the log file, or -1 */
  char *line;      /* the partial line not yet printed */
  size_t len, cap;
  char tail[TAIL_BYTES + 1]; /* the last bytes seen (stderr), NUL-terminated */
  size_t tail_len;
  char log_path[PATH_MAX];
} stream;

/* Note [report pipe]: every worker holds the write end of a pipe of its own to the parent.
 * A worker that fails writes one report into it, a report_head (when it failed, on the
 * CLOCK_MONOTONIC clock, which all processes of the host share) and then its message, just
 * before it exits: forked workers through ddp_procs_report, exec'd ones (the launcher's)
 * through ddp_process_report_failure, which finds the descriptor in DDPLUA_REPORT_FD. The
 * parent polls the read ends, so it also sees a worker's end (end of file: the kernel
 * closes the pipe when the process dies, before anyone reaps it) at once, whatever order
 * the workers are reaped in. Together these give each failed worker a time of failure (its
 * own stamp, else the moment its end was seen), which is what Note [first failure] orders
 * by. */
typedef struct report_head {
  uint32_t magic;  /* REPORT_MAGIC */
  uint32_t unused;
  double at_s;     /* CLOCK_MONOTONIC seconds when the worker failed */
} report_head;
#define REPORT_MAGIC 0x70646464u /* "dddp" */

typedef struct worker {
  int rank;
  pid_t pid;       /* 0 before start */
  int running;     /* started and not reaped */
  int status;      /* wait status once reaped */
  int report_fd;   /* parent: read end of the report pipe; worker: its write end; -1 */
  char *report;    /* what the worker reported (report_head, then the message), NUL-terminated */
  size_t report_len;
  double failed_at; /* the worker's own stamp of its failure (Note [report pipe]), 0: none */
  double ended_at;  /* when the parent saw it end (report pipe closed, or reaped), 0: not yet */
  unsigned long seen_poll; /* the ddp_procs_poll call that first saw its report or end, 0 */
  int signalled;    /* the parent signalled it to stop while it ran (Note [first failure]) */
  stream out, err;
  const struct ddp_procs *owner; /* the group (its console hook) */
  int status_fd;            /* the status page's memfd until the worker has it; -1 */
  ddp_rank_status *page;    /* the status page (Note [rank status pages]), mapped; NULL */
  char prefix[32];
  size_t prefix_len;
} worker;

struct ddp_procs {
  ddp_procs_config cfg;     /* strings point at the copies below */
  char *master_addr, *log_dir;
  char **env;               /* ddp_procs_add_env: "NAME=value", n_env of them */
  int n_env;
  pid_t parent;
  int world, threads;
  worker *workers;
  int stopping;             /* a worker failed: the survivors were told to stop */
  double kill_at;           /* when the survivors get SIGKILL; 0: not stopping */
  int killed;
  double drain_until;       /* 0 until every worker ended */
  unsigned long polls;      /* ddp_procs_poll calls so far (Note [first failure]) */
};

/* ---- small helpers ------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* write() all of buf, retrying on EINTR (and briefly on EAGAIN); gives up quietly on other
 * errors: a closed console must not stop the parent from watching its workers. */
static void write_all(int fd, const char *buf, size_t n) {
  for (int again = 0; n > 0 && again < 100;) {
    ssize_t k = write(fd, buf, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return;
      usleep(1000);
      again++;
      continue;
    }
    buf += k;
    n -= (size_t)k;
  }
}

/* mkdir -p. Returns 0, or -1 with errno. */
static int make_dirs(const char *path) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
  return 0;
}

static char *dup_or_null(const char *s, int *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = 1;
  return d;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

int ddp_process_free_port(int *port) {
  *port = -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) DDP_FAIL(DDP_ERR_IO, "cannot find a free port: socket: %s", strerror(errno));
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const char *failed = NULL;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) failed = "bind";
  else if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) failed = "getsockname";
  int saved = errno;
  close(fd);
  if (failed)
    DDP_FAIL(DDP_ERR_IO, "cannot find a free port on 127.0.0.1: %s: %s", failed, strerror(saved));
  *port = ntohs(a.sin_port);
  return DDP_OK;
}

int ddp_process_threads_per_worker(int nprocs) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (nprocs < 1) nprocs = 1;
  return cores / nprocs > 1 ? (int)(cores / nprocs) : 1;
}

void ddp_process_signal_name(int sig, char *buf, size_t cap) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev) snprintf(buf, cap, "SIG%s", abbrev);
  else snprintf(buf, cap, "signal %d", sig);
}

void ddp_process_exit(int code) { _exit(code); }

/* Note [flush on SIGTERM]: a worker that a group stops because another failed gets SIGTERM,
 * whose default action ends it with whatever stdio still buffers unwritten: a survivor's
 * last output was lost. This handler writes stdout and stderr out, then lets SIGTERM end
 * the process as it would have. fflush is not async-signal-safe: when the signal lands
 * inside a stdio call of the same stream, the flush may repeat or drop a few bytes; that is
 * the output of a process that is being stopped anyway, and the SIGKILL at the end of the
 * grace period bounds any wait. */
static void flush_and_die(int sig) {
  fflush(stdout);
  fflush(stderr);
  signal(sig, SIG_DFL);
  raise(sig);
}

void ddp_process_flush_on_sigterm(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = flush_and_die;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
}

/* ---- the group -------------------------------------------------------------------------- */

int ddp_procs_new(ddp_procs **out, const ddp_procs_config *cfg) {
  *out = NULL;
  if (!cfg) DDP_FAIL(DDP_ERR_ARG, "process group: no configuration");
  if (cfg->nprocs < 1) DDP_FAIL(DDP_ERR_ARG, "process group: nprocs must be >= 1, got %d", cfg->nprocs);
  if (cfg->nnodes < 1 || cfg->node_rank < 0 || cfg->node_rank >= cfg->nnodes)
    DDP_FAIL(DDP_ERR_ARG, "process group: node rank %d is out of range for %d nodes",
             cfg->node_rank, cfg->nnodes);
  if (cfg->master_port < 1 || cfg->master_port > 65535)
    DDP_FAIL(DDP_ERR_ARG, "process group: master port must be in 1 .. 65535, got %d",
             cfg->master_port);
  if (!(cfg->grace_s >= 0))
    DDP_FAIL(DDP_ERR_ARG, "process group: grace must be >= 0 s, got %g", cfg->grace_s);
  if ((cfg->log & cfg->capture) && !(cfg->log_dir && *cfg->log_dir))
    DDP_FAIL(DDP_ERR_ARG, "process group: log files asked for without a log folder");
  ddp_procs *p = calloc(1, sizeof *p);
  if (!p) DDP_FAIL(DDP_ERR_MEMORY, "process group: out of memory");
  int oom = 0;
  p->cfg = *cfg;
  p->master_addr = dup_or_null(cfg->master_addr ? cfg->master_addr : "127.0.0.1", &oom);
  p->log_dir = dup_or_null(cfg->log_dir, &oom);
  p->workers = calloc((size_t)cfg->nprocs, sizeof *p->workers);
  if (oom || !p->workers) {
    ddp_procs_free(p);
    DDP_FAIL(DDP_ERR_MEMORY, "process group: out of memory");
  }
  p->cfg.master_addr = p->master_addr;
  p->cfg.log_dir = p->log_dir;
  p->cfg.console &= p->cfg.capture;
  p->cfg.log &= p->cfg.capture;
  p->parent = getpid();
  p->world = cfg->nnodes * cfg->nprocs;
  p->threads = ddp_process_threads_per_worker(cfg->nprocs);
  for (int i = 0; i < cfg->nprocs; i++) {
    worker *w = &p->workers[i];
    w->rank = cfg->node_rank * cfg->nprocs + i;
    w->out.fd = w->err.fd = w->out.log = w->err.log = w->report_fd = w->status_fd = -1;
    w->owner = p;
    w->prefix_len = (size_t)snprintf(w->prefix, sizeof w->prefix, "[rank %d]: ", w->rank);
  }
  *out = p;
  return DDP_OK;
}

int ddp_procs_add_env(ddp_procs *p, const char *name, const char *value) {
  if (!name || !*name || strchr(name, '='))
    DDP_FAIL(DDP_ERR_ARG, "process group: bad environment variable name '%s'", name ? name : "");
  size_t n = strlen(name) + strlen(value ? value : "") + 2;
  char *kv = malloc(n);
  char **grown = realloc(p->env, sizeof *p->env * (size_t)(p->n_env + 1));
  if (grown) p->env = grown;
  if (!kv || !grown) {
    free(kv);
    DDP_FAIL(DDP_ERR_MEMORY, "process group: out of memory");
  }
  snprintf(kv, n, "%s=%s", name, value ? value : "");
  p->env[p->n_env++] = kv;
  return DDP_OK;
}

static int valid_rank(const ddp_procs *p, int i) { return p && i >= 0 && i < p->cfg.nprocs; }

static void free_stream(stream *s) {
  close_fd(&s->fd);
  close_fd(&s->log);
  free(s->line);
  s->line = NULL;
  s->len = s->cap = 0;
}

void ddp_procs_free(ddp_procs *p) {
  if (!p) return;
  for (int i = 0; p->workers && i < p->cfg.nprocs; i++) {
    worker *w = &p->workers[i];
    if (w->running && getpid() == p->parent) {
      if (!p->cfg.own_group || kill(-w->pid, SIGKILL) != 0) kill(w->pid, SIGKILL);
      while (waitpid(w->pid, NULL, 0) < 0 && errno == EINTR) {
      }
    }
    free_stream(&w->out);
    free_stream(&w->err);
    close_fd(&w->report_fd);
    close_fd(&w->status_fd);
    if (w->page) munmap(w->page, sizeof *w->page);
    free(w->report);
  }
  for (int i = 0; i < p->n_env; i++) free(p->env[i]);
  free(p->env);
  free(p->workers);
  free(p->master_addr);
  free(p->log_dir);
  free(p);
}

/* ---- starting workers ------------------------------------------------------------------ */

/* Why ddp_process_report_failure has somewhere to write: the descriptor that
 * ddp_process_adopt_report_channel took from DDPLUA_REPORT_FD, -1. */
static int own_report_fd = -1;

/* One stamped report (Note [report pipe]) on fd, at most MAX_REPORT bytes of msg. */
static void write_report(int fd, double at_s, const char *msg, size_t len) {
  if (len > MAX_REPORT) len = MAX_REPORT;
  char *buf = malloc(sizeof(report_head) + len);
  report_head head = {.magic = REPORT_MAGIC, .at_s = at_s > 0 ? at_s : now_s()};
  if (!buf) { /* the time still matters more than the message */
    write_all(fd, (const char *)&head, sizeof head);
    return;
  }
  memcpy(buf, &head, sizeof head);
  if (len) memcpy(buf + sizeof head, msg, len);
  write_all(fd, buf, sizeof head + len); /* one write: a pipe holds 64 KiB */
  free(buf);
}

void ddp_process_adopt_report_channel(void) {
  const char *v = getenv("DDPLUA_REPORT_FD");
  if (!v) return;
  char *end = NULL;
  long fd = strtol(v, &end, 10);
  unsetenv("DDPLUA_REPORT_FD"); /* not for the programs this worker starts */
  if (!end || *end || fd < 3 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0) return;
  fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* nor the descriptor (it would hide our end) */
  own_report_fd = (int)fd;
}

void ddp_process_report_failure(double at_s, const char *msg, size_t len) {
  if (own_report_fd < 0) return;
  write_report(own_report_fd, at_s, msg ? msg : "", msg ? len : 0);
  close_fd(&own_report_fd); /* one report */
}

static void set_int_env(const char *name, long value, int overwrite) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", value);
  setenv(name, buf, overwrite);
}

/* Note [worker environment], in the worker. */
static void set_worker_env(const ddp_procs *p, const worker *w, int local_rank) {
  const ddp_procs_config *c = &p->cfg;
  set_int_env("RANK", w->rank, 1);
  set_int_env("LOCAL_RANK", local_rank, 1);
  set_int_env("WORLD_SIZE", p->world, 1);
  set_int_env("LOCAL_WORLD_SIZE", c->nprocs, 1);
  set_int_env("GROUP_RANK", c->node_rank, 1);
  set_int_env("GROUP_WORLD_SIZE", c->nnodes, 1);
  set_int_env("ROLE_RANK", w->rank, 1);
  set_int_env("ROLE_WORLD_SIZE", p->world, 1);
  setenv("ROLE_NAME", "default", 1);
  setenv("MASTER_ADDR", c->master_addr, 1);
  set_int_env("MASTER_PORT", c->master_port, 1);
  if (c->max_restarts >= 0) {
    set_int_env("DDPLUA_RESTART_COUNT", c->attempt, 1);
    set_int_env("DDPLUA_MAX_RESTARTS", c->max_restarts, 1);
    set_int_env("TORCHELASTIC_RESTART_COUNT", c->attempt, 1); /* torchrun's names */
    set_int_env("TORCHELASTIC_MAX_RESTARTS", c->max_restarts, 1);
  }
  for (int i = 0; i < p->n_env; i++) {
    char *eq = strchr(p->env[i], '=');
    *eq = '\0'; /* the worker's own copy of the parent's memory */
    setenv(p->env[i], eq + 1, 1);
    *eq = '=';
  }
  set_int_env("DDP_NUM_THREADS", p->threads, 0);
  set_int_env("OMP_NUM_THREADS", p->threads, 0);
  set_int_env("OPENBLAS_NUM_THREADS", p->threads, 0);
  if (c->capture) setenv("DDPLUA_UNBUFFERED", "1", 0);
}

/* Open the log file of one stream when it goes to a file. */
static int open_log(ddp_procs *p, worker *w, stream *s, int which) {
  s->log = -1;
  s->log_path[0] = '\0';
  if (!(p->cfg.log & which)) return DDP_OK;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/rank_%d", p->log_dir, w->rank);
  snprintf(s->log_path, sizeof s->log_path, "%s/%s.log", dir,
           which == DDP_PROCS_STDOUT ? "stdout" : "stderr");
  if (make_dirs(dir) != 0 ||
      (s->log = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0)
    DDP_FAIL(DDP_ERR_IO, "cannot write the log file %s: %s", s->log_path, strerror(errno));
  return DDP_OK;
}

/* In the worker right after fork: never returns on failure. */
static void become_worker(ddp_procs *p, int local_rank, int out_fd, int err_fd, int exec) {
  worker *w = &p->workers[local_rank];
  if (p->cfg.own_group) setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != p->parent) { /* the parent died before prctl */
    if (!exec) {
      static const char msg[] = "the parent ended before the worker started";
      write_all(w->report_fd, msg, sizeof msg - 1);
    }
    _exit(exec ? 127 : 1);
  }
  if (exec) { /* no handler of the parent may run here before exec resets them */
    static const int sigs[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
  }
  /* The parent's ends of the other workers' pipes are not ours to hold. */
  for (int i = 0; i < p->cfg.nprocs; i++) {
    if (i == local_rank) continue;
    worker *o = &p->workers[i];
    close_fd(&o->out.fd);
    close_fd(&o->err.fd);
    close_fd(&o->out.log);
    close_fd(&o->err.log);
    close_fd(&o->report_fd);
  }
  close_fd(&w->out.log);
  close_fd(&w->err.log);
  if (exec && w->report_fd >= 0) { /* Note [report pipe]: it survives exec, named in the env */
    if (w->report_fd <= STDERR_FILENO) { /* or dup2 of the output below would replace it */
      int moved = fcntl(w->report_fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
      close_fd(&w->report_fd);
      w->report_fd = moved;
    }
    if (w->report_fd >= 0) {
      fcntl(w->report_fd, F_SETFD, 0);
      set_int_env("DDPLUA_REPORT_FD", w->report_fd, 1);
    }
  }
  if (exec && w->status_fd >= 0) { /* Note [rank status pages]: the page's descriptor */
    if (w->status_fd <= STDERR_FILENO) {
      int moved = fcntl(w->status_fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
      close_fd(&w->status_fd);
      w->status_fd = moved;
    }
    if (w->status_fd >= 0) {
      fcntl(w->status_fd, F_SETFD, 0);
      set_int_env("DDPLUA_STATUS_FD", w->status_fd, 1);
    }
  } else {
    close_fd(&w->status_fd);
  }
  int targets[2] = {STDOUT_FILENO, STDERR_FILENO}, fds[2] = {out_fd, err_fd};
  for (int i = 0; i < 2; i++) {
    if (fds[i] < 0) continue;
    if (fds[i] == targets[i]) fcntl(fds[i], F_SETFD, 0);
    else dup2(fds[i], targets[i]);
  }
  if (p->cfg.own_group && isatty(STDIN_FILENO)) { /* else SIGTTIN stops the worker */
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0 && null != STDIN_FILENO) {
      dup2(null, STDIN_FILENO);
      close(null);
    }
  }
  set_worker_env(p, w, local_rank);
}

/* Worker w's status page (Note [rank status pages]): a memfd of one ddp_rank_status, mapped
 * here; its descriptor goes to the worker at exec (close-on-exec until then). */
static int make_status_page(worker *w) {
  int fd = memfd_create("ddplua-status", MFD_CLOEXEC);
  if (fd < 0) DDP_FAIL(DDP_ERR_IO, "cannot create the status page of worker rank %d: %s", w->rank, strerror(errno));
  if (ftruncate(fd, (off_t)sizeof(ddp_rank_status)) != 0) {
    int e = errno;
    close(fd);
    DDP_FAIL(DDP_ERR_IO, "cannot size the status page of worker rank %d: %s", w->rank, strerror(e));
  }
  void *m = mmap(NULL, sizeof(ddp_rank_status), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    close(fd);
    DDP_FAIL(DDP_ERR_IO, "cannot map the status page of worker rank %d: %s", w->rank, strerror(e));
  }
  w->page = m;
  w->page->step = -1;
  w->status_fd = fd;
  return DDP_OK;
}

static int make_pipe(int fds[2], int flags, int rank) {
  if (pipe2(fds, O_CLOEXEC | flags) != 0)
    DDP_FAIL(DDP_ERR_IO, "cannot create a pipe for worker rank %d: %s", rank, strerror(errno));
  return DDP_OK;
}

/* Fork worker local_rank; in the worker, exec when exe is given. */
static int start(ddp_procs *p, int local_rank, const char *exe, char *const *argv,
                 int *is_child) {
  if (is_child) *is_child = 0;
  if (!p || !valid_rank(p, local_rank))
    DDP_FAIL(DDP_ERR_ARG, "process group: local rank %d is out of range", local_rank);
  worker *w = &p->workers[local_rank];
  if (w->pid) DDP_FAIL(DDP_ERR_STATE, "process group: worker rank %d was started already", w->rank);
  int out[2] = {-1, -1}, err[2] = {-1, -1}, rep[2] = {-1, -1};
  int status = open_log(p, w, &w->out, DDP_PROCS_STDOUT);
  if (!status) status = open_log(p, w, &w->err, DDP_PROCS_STDERR);
  if (!status && (p->cfg.capture & DDP_PROCS_STDOUT)) status = make_pipe(out, 0, w->rank);
  if (!status && (p->cfg.capture & DDP_PROCS_STDERR)) status = make_pipe(err, 0, w->rank);
  if (!status) status = make_pipe(rep, 0, w->rank); /* Note [report pipe] */
  if (!status && exe && p->cfg.status_pages) status = make_status_page(w);
  if (!status) fcntl(rep[0], F_SETFL, O_NONBLOCK); /* the parent's end only */
  if (status) goto failed;
  w->out.console = (p->cfg.console & DDP_PROCS_STDOUT) ? STDOUT_FILENO : 0;
  w->err.console = (p->cfg.console & DDP_PROCS_STDERR) ? STDERR_FILENO : 0;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close_fd(&out[0]);
    close_fd(&err[0]);
    close_fd(&rep[0]);
    w->report_fd = rep[1];
    become_worker(p, local_rank, out[1], err[1], exe != NULL);
    if (!exe) {
      if (out[1] >= 0 && out[1] != STDOUT_FILENO) close(out[1]);
      if (err[1] >= 0 && err[1] != STDERR_FILENO) close(err[1]);
      *is_child = 1;
      return DDP_OK;
    }
    execv(exe, argv);
    dprintf(STDERR_FILENO, "ddplua: cannot run %s: %s\n", exe, strerror(errno));
    _exit(127);
  }
  int saved = errno;
  close_fd(&out[1]);
  close_fd(&err[1]);
  close_fd(&rep[1]);
  close_fd(&w->status_fd); /* the worker has its own now; the mapping stays */
  if (pid < 0) {
    status = DDP_ERROR(DDP_ERR_IO, "cannot start worker rank %d: %s", w->rank, strerror(saved));
    goto failed;
  }
  if (p->cfg.own_group) setpgid(pid, pid); /* also here: a signal sent at once reaches it */
  w->pid = pid;
  w->running = 1;
  w->out.fd = out[0];
  w->err.fd = err[0];
  w->report_fd = rep[0];
  w->failed_at = w->ended_at = 0;
  w->seen_poll = 0;
  p->drain_until = 0;
  return DDP_OK;

failed:
  for (int i = 0; i < 2; i++) {
    close_fd(&out[i]);
    close_fd(&err[i]);
    close_fd(&rep[i]);
  }
  close_fd(&w->out.log);
  close_fd(&w->err.log);
  return status;
}

int ddp_procs_fork(ddp_procs *p, int local_rank, int *is_child) {
  if (!is_child) DDP_FAIL(DDP_ERR_ARG, "process group: fork needs is_child");
  return start(p, local_rank, NULL, NULL, is_child);
}

int ddp_procs_exec(ddp_procs *p, int local_rank, const char *exe, char *const *argv) {
  if (!exe || !argv) DDP_FAIL(DDP_ERR_ARG, "process group: exec needs a program and its argv");
  return start(p, local_rank, exe, argv, NULL);
}

void ddp_procs_report(ddp_procs *p, const char *msg, size_t len) {
  if (!p) return;
  for (int i = 0; i < p->cfg.nprocs; i++) {
    worker *w = &p->workers[i];
    if (w->report_fd < 0) continue; /* in a worker, only its own write end is left */
    write_report(w->report_fd, now_s(), msg, len);
    close_fd(&w->report_fd);
    return;
  }
}

/* ---- output ------------------------------------------------------------------------------ */

static void keep_tail(stream *s, const char *data, size_t n) {
  if (n >= TAIL_BYTES) {
    memcpy(s->tail, data + n - TAIL_BYTES, TAIL_BYTES);
    s->tail_len = TAIL_BYTES;
  } else {
    if (s->tail_len + n > TAIL_BYTES) {
      size_t drop = s->tail_len + n - TAIL_BYTES;
      memmove(s->tail, s->tail + drop, s->tail_len - drop);
      s->tail_len -= drop;
    }
    memcpy(s->tail + s->tail_len, data, n);
    s->tail_len += n;
  }
  s->tail[s->tail_len] = '\0';
}

/* Print the complete lines of s->line (all of it when `flush`, ending it with a newline),
 * each prefixed, in one write so that lines of different ranks never mix. */
static void print_lines(worker *w, stream *s, int flush) {
  size_t end = s->len;
  if (!flush) {
    while (end > 0 && s->line[end - 1] != '\n') end--;
    if (end == 0 && s->len >= MAX_LINE) end = s->len; /* too long: print a piece */
  }
  if (end == 0) return;
  size_t lines = 1;
  for (size_t i = 0; i < end; i++) lines += s->line[i] == '\n';
  char *buf = malloc(end + lines * (w->prefix_len + 1) + 1);
  if (buf) {
    size_t n = 0, start = 0;
    while (start < end) {
      const char *nl = memchr(s->line + start, '\n', end - start);
      size_t stop = nl ? (size_t)(nl - s->line) : end;
      memcpy(buf + n, w->prefix, w->prefix_len);
      n += w->prefix_len;
      memcpy(buf + n, s->line + start, stop - start);
      n += stop - start;
      buf[n++] = '\n';
      start = stop + 1;
    }
    if (s->console == STDOUT_FILENO) fflush(stdout);
    if (w->owner && w->owner->cfg.before_console) w->owner->cfg.before_console(w->owner->cfg.console_ctx);
    write_all(s->console, buf, n);
    free(buf);
  }
  memmove(s->line, s->line + end, s->len - end);
  s->len -= end;
}

static void take_output(worker *w, stream *s, const char *data, size_t n) {
  if (s == &w->err) keep_tail(s, data, n);
  if (s->log >= 0) write_all(s->log, data, n);
  if (!s->console) return;
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n) cap *= 2;
    char *grown = realloc(s->line, cap);
    if (!grown) { /* no memory for the line: print what there is */
      print_lines(w, s, 1);
      write_all(s->console, data, n);
      return;
    }
    s->line = grown;
    s->cap = cap;
  }
  memcpy(s->line + s->len, data, n);
  s->len += n;
  print_lines(w, s, 0);
}

static void close_stream(worker *w, stream *s) {
  close_fd(&s->fd);
  if (s->console && s->len) print_lines(w, s, 1);
  close_fd(&s->log);
}

/* Read what is there; at end of file (or on an error) close the stream. */
static void read_stream(worker *w, stream *s, char *chunk) {
  ssize_t n = read(s->fd, chunk, READ_CHUNK);
  if (n > 0) take_output(w, s, chunk, (size_t)n);
  else if (n == 0 || (errno != EINTR && errno != EAGAIN)) close_stream(w, s);
}

/* Everything the report pipe holds now (non-blocking); closed at its end, which is when
 * the worker's end is seen (Note [report pipe]). */
static void read_report(worker *w, unsigned long poll_no) {
  char buf[4096];
  while (w->report_fd >= 0) {
    ssize_t n = read(w->report_fd, buf, sizeof buf);
    if (n >= 0 && !w->seen_poll) w->seen_poll = poll_no;
    if (n > 0) {
      char *grown = realloc(w->report, w->report_len + (size_t)n + 1);
      if (!grown) return;
      memcpy(grown + w->report_len, buf, (size_t)n);
      w->report = grown;
      w->report_len += (size_t)n;
      w->report[w->report_len] = '\0';
      report_head head;
      if (!w->failed_at && w->report_len >= sizeof head) {
        memcpy(&head, w->report, sizeof head);
        if (head.magic == REPORT_MAGIC && head.at_s > 0) w->failed_at = head.at_s;
      }
    } else if (n == 0 || errno != EINTR) {
      if (n == 0) {
        close_fd(&w->report_fd);
        if (!w->ended_at) w->ended_at = now_s();
      }
      return;
    }
  }
}

/* ---- watching ---------------------------------------------------------------------------- */

static void signal_all(ddp_procs *p, int sig) {
  for (int i = 0; i < p->cfg.nprocs; i++) {
    worker *w = &p->workers[i];
    if (!w->running) continue;
    if (!w->failed_at) w->signalled = 1; /* one that reported its failure failed first */
    if (!p->cfg.own_group || kill(-w->pid, sig) != 0) kill(w->pid, sig);
  }
}

void ddp_procs_terminate(ddp_procs *p, int sig) {
  if (!p) return;
  signal_all(p, sig);
  if (sig == SIGKILL) p->killed = 1;
  if (p->kill_at == 0) p->kill_at = now_s() + p->cfg.grace_s;
}

void ddp_procs_notify(ddp_procs *p, int sig) {
  if (!p) return;
  for (int i = 0; i < p->cfg.nprocs; i++)
    if (p->workers[i].running) kill(p->workers[i].pid, sig);
}

static int failed_status(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

/* Reap the workers that ended (Note [first failure]). Returns how many still run. */
static int reap(ddp_procs *p) {
  int running = 0, any_failed = 0;
  for (int i = 0; i < p->cfg.nprocs; i++) {
    worker *w = &p->workers[i];
    if (!w->running) continue;
    int status;
    pid_t r = waitpid(w->pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) {
      running++;
      continue;
    }
    w->running = 0;
    w->status = r < 0 ? (1 << 8) : status; /* lost (ECHILD): call it exit code 1 */
    read_report(w, p->polls);
    close_fd(&w->report_fd);
    if (!w->seen_poll) w->seen_poll = p->polls;
    if (!w->ended_at) w->ended_at = now_s();
    if (failed_status(w->status)) any_failed = 1;
  }
  /* the others are stopped only after every worker that already ended was reaped, so none
   * of those counts as signalled (Note [first failure]) */
  if (any_failed && !p->stopping) {
    p->stopping = 1;
    ddp_procs_terminate(p, SIGTERM);
  }
  return running;
}

int ddp_procs_poll(ddp_procs *p, double timeout_s, int wake_fd, int *woken) {
  if (woken) *woken = 0;
  if (!p) return 0;
  p->polls++;
  int n = p->cfg.nprocs;
  int running = reap(p);
  if (running && p->kill_at > 0 && !p->killed && now_s() >= p->kill_at) {
    signal_all(p, SIGKILL);
    p->killed = 1;
  }
  struct pollfd fds[1 + 3 * n];
  stream *owners[1 + 3 * n];
  worker *owner_w[1 + 3 * n];
  int nfds = 0, wake_at = -1;
  if (wake_fd >= 0) {
    wake_at = nfds;
    owners[nfds] = NULL;
    owner_w[nfds] = NULL;
    fds[nfds++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
  }
  int open_streams = 0;
  for (int i = 0; i < n; i++) {
    worker *w = &p->workers[i];
    stream *ss[2] = {&w->out, &w->err};
    for (int k = 0; k < 2; k++) {
      if (ss[k]->fd < 0) continue;
      owners[nfds] = ss[k];
      owner_w[nfds] = w;
      fds[nfds++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
      open_streams++;
    }
    if (w->report_fd >= 0) {
      owners[nfds] = NULL;
      owner_w[nfds] = w;
      fds[nfds++] = (struct pollfd){.fd = w->report_fd, .events = POLLIN};
    }
  }
  if (!running) {
    if (!open_streams) return 0;
    if (p->drain_until == 0) p->drain_until = now_s() + DRAIN_S;
    if (now_s() >= p->drain_until) { /* pipes held open by the workers' children */
      for (int i = 0; i < n; i++) {
        close_stream(&p->workers[i], &p->workers[i].out);
        close_stream(&p->workers[i], &p->workers[i].err);
      }
      return 0;
    }
  }
  double wait_s = timeout_s < 0 ? 0 : timeout_s;
  if (running && p->kill_at > 0 && !p->killed) {
    double left = p->kill_at - now_s();
    if (left < wait_s) wait_s = left < 0 ? 0 : left;
  }
  if (!running && wait_s > 0.1) wait_s = 0.1;
  int r = poll(fds, (nfds_t)nfds, (int)(wait_s * 1000 + 0.5));
  if (r > 0) {
    char *chunk = open_streams ? malloc(READ_CHUNK) : NULL;
    for (int i = 0; i < nfds; i++) {
      if (!fds[i].revents) continue;
      if (i == wake_at) {
        if (woken) *woken = 1;
      } else if (owners[i]) {
        if (chunk) read_stream(owner_w[i], owners[i], chunk);
      } else {
        read_report(owner_w[i], p->polls);
      }
    }
    free(chunk);
  }
  return 1;
}

void ddp_procs_stop(ddp_procs *p) {
  if (!p) return;
  ddp_procs_terminate(p, SIGTERM);
  while (ddp_procs_poll(p, 0.01, -1, NULL)) {
  }
}

/* ---- what happened ----------------------------------------------------------------------- */

/* Note [first failure]: the failed worker whose failure came first. A worker that reported
 * its failure stamped it itself (Note [report pipe]); one that died without a report (a
 * signal, os.exit) has only the moment the parent saw its end, which comes late when the
 * parent is slow to run. Its death is readable (end of its report pipe) no later than any
 * report it caused a peer to write, so:
 *   - two stamped failures compare their stamps;
 *   - otherwise the one seen in an earlier ddp_procs_poll call came first, and in the same
 *     call the unstamped death is the cause (a peer that lost it reports an error, which
 *     takes longer than dying);
 *   - two unstamped deaths compare the moments they were seen.
 * Before all that, a worker the parent did not signal comes before one it signalled while
 * it had reported no failure (one that had reported is no bystander: the launcher stops
 * the others as soon as a report arrives, before the reporter exits): a worker
 * stopped because another failed dies of the parent's SIGTERM, often in the very poll call
 * that reaped the failure (seen once in spawn_spec under load: "process 0 terminated with
 * signal SIGTERM" reported instead of rank 1's error). */
static int failed_before(const worker *a, const worker *b) {
  if (a->signalled != b->signalled) return !a->signalled;
  if (a->failed_at > 0 && b->failed_at > 0) return a->failed_at < b->failed_at;
  if (a->seen_poll != b->seen_poll) return a->seen_poll < b->seen_poll;
  if ((a->failed_at > 0) != (b->failed_at > 0)) return !(a->failed_at > 0);
  return a->ended_at < b->ended_at;
}

int ddp_procs_failed(const ddp_procs *p) {
  if (!p) return -1;
  int first = -1;
  for (int i = 0; i < p->cfg.nprocs; i++) {
    const worker *w = &p->workers[i];
    if (!w->pid || w->running || !failed_status(w->status)) continue;
    if (first < 0 || failed_before(w, &p->workers[first])) first = i;
  }
  return first;
}

int ddp_procs_pid(const ddp_procs *p, int local_rank) {
  return valid_rank(p, local_rank) ? (int)p->workers[local_rank].pid : -1;
}

int ddp_procs_exit_status(const ddp_procs *p, int local_rank, int *code, int *signal) {
  if (!valid_rank(p, local_rank)) return 0;
  const worker *w = &p->workers[local_rank];
  if (!w->pid || w->running) return 0;
  int st = w->status;
  if (code) *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (signal) *signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  return 1;
}

const char *ddp_procs_message(const ddp_procs *p, int local_rank, size_t *len) {
  const worker *w = valid_rank(p, local_rank) ? &p->workers[local_rank] : NULL;
  size_t skip = w && w->failed_at > 0 ? sizeof(report_head) : 0;
  int has = w && w->report && w->report_len > skip;
  if (len) *len = has ? w->report_len - skip : 0;
  return has ? w->report + skip : "";
}

const char *ddp_procs_stderr_tail(const ddp_procs *p, int local_rank, size_t *len) {
  const worker *w = valid_rank(p, local_rank) ? &p->workers[local_rank] : NULL;
  if (len) *len = w ? w->err.tail_len : 0;
  return w ? w->err.tail : "";
}

const char *ddp_procs_log_path(const ddp_procs *p, int local_rank, int which) {
  if (!valid_rank(p, local_rank)) return "";
  const worker *w = &p->workers[local_rank];
  return which == DDP_PROCS_STDOUT ? w->out.log_path : w->err.log_path;
}

int ddp_procs_status(const ddp_procs *p, int local_rank, ddp_rank_status *out) {
  if (!p || !valid_rank(p, local_rank) || !p->workers[local_rank].page) return -1;
  ddp_status_read(p->workers[local_rank].page, out);
  return 0;
}

int ddp_procs_on_console(const ddp_procs *p, int which) {
  return p && (p->cfg.console & which) ? 1 : 0;
}
