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
 *   DDPLUA_RESTART_COUNT, DDPLUA_MAX_RESTARTS
 *   DDP_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS = max(1, cores / N) unless set
 *   DDPLUA_UNBUFFERED = 1 (line-buffered stdout in the worker, unless set)
 *
 * The launcher runs no store and no Lua: it only starts, watches and stops processes.
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
 * the rank, the exit code or signal and the worker's error message (the last "ddplua: ..."
 * line of its stderr), then restarts the whole group (up to --max_restarts times) or exits 1.
 * Each worker leads its own process group, which is what gets signalled, so processes a
 * worker started go with it; workers also have PR_SET_PDEATHSIG = SIGKILL, so they die with
 * a launcher that is killed outright. SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to
 * the workers (a second one sends SIGKILL); once they are reaped, the launcher ends by the
 * same signal.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define GRACE_S 3.0          /* SIGTERM to SIGKILL */
#define DRAIN_S 2.0          /* how long to wait for pipes held open by a worker's children */
#define TAIL_BYTES 8192      /* stderr kept per worker for the failure summary */
#define MAX_LINE 65536       /* a longer line is printed in pieces */
#define READ_CHUNK 65536
#define SUMMARY_LINES 12     /* stderr lines shown in the summary when stderr was not shown */

/* One output stream of one worker. */
typedef struct stream {
  int fd;          /* read end of the worker's pipe, -1 once closed */
  int console;     /* 1 or 2: the launcher's fd that gets prefixed lines; 0: none */
  int log;         /* fd of the log file, or -1 */
  char *line;      /* the partial line not yet printed */
  size_t len, cap;
  char tail[TAIL_BYTES]; /* the last bytes seen (for the summary) */
  size_t tail_len;
  char log_path[PATH_MAX];
} stream;

typedef struct worker {
  int local_rank, rank;
  pid_t pid;     /* 0 before start */
  int running;   /* started and not reaped */
  int status;    /* wait status once reaped */
  stream out, err;
  char prefix[32];
  size_t prefix_len;
} worker;

/* Why an attempt ended. */
enum outcome { ALL_OK, WORKER_FAILED, SIGNALLED, START_FAILED };

typedef struct launcher {
  const ddp_cli_launch *cfg;
  int nproc, world, threads;
  pid_t self;
  char exe[PATH_MAX];
  char **argv;        /* the workers' command line (NULL-terminated) */
  const char *log_dir; /* NULL: no log files */
  int to_file[3], to_console[3]; /* by stream: 1 stdout, 2 stderr */
  char master_addr[256];
  int master_port;
  int attempt;
  worker *workers;
  int failed;         /* index of the first failed worker, -1 */
  int signal;         /* the signal that stopped the launcher, 0 */
} launcher;

/* ---------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------- */

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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* write() all of buf, retrying on EINTR; gives up quietly on other errors (a closed console
 * must not stop the launcher from watching its workers). */
static void write_all(int fd, const char *buf, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, buf, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return;
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

/* A port nobody listens on now: bind port 0 on 127.0.0.1 and read what the kernel chose.
 * (Another process may take it before rank 0 does; torchrun's --standalone does the same.) */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static const char *signal_name(int sig, char *buf, size_t size) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev) snprintf(buf, size, "SIG%s", abbrev);
  else snprintf(buf, size, "signal %d", sig);
  return buf;
}

/* ---------------------------------------------------------------------------------------
 * Signals: the handlers only write the signal number into a pipe that poll() watches
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
  for (int i = 0; i < N_FORWARDED; i++) sigaction(forwarded[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* a closed console gives EPIPE, not death */
  return 0;
}

static void restore_signals(void) {
  signal(SIGCHLD, SIG_DFL);
  for (int i = 0; i < N_FORWARDED; i++) signal(forwarded[i], SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

/* ---------------------------------------------------------------------------------------
 * Output streams
 * ------------------------------------------------------------------------------------- */

static void keep_tail(stream *s, const char *data, size_t n) {
  if (n >= TAIL_BYTES) {
    memcpy(s->tail, data + n - TAIL_BYTES, TAIL_BYTES);
    s->tail_len = TAIL_BYTES;
    return;
  }
  if (s->tail_len + n > TAIL_BYTES) {
    size_t drop = s->tail_len + n - TAIL_BYTES;
    memmove(s->tail, s->tail + drop, s->tail_len - drop);
    s->tail_len -= drop;
  }
  memcpy(s->tail + s->tail_len, data, n);
  s->tail_len += n;
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
    if (s->console == 1) fflush(stdout);
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
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  if (s->console && s->len) print_lines(w, s, 1);
  if (s->log >= 0) close(s->log);
  s->log = -1;
}

/* Read what is there; at end of file (or on an error) close the stream. */
static void read_stream(worker *w, stream *s, char *chunk) {
  ssize_t n = read(s->fd, chunk, READ_CHUNK);
  if (n > 0) take_output(w, s, chunk, (size_t)n);
  else if (n == 0 || (errno != EINTR && errno != EAGAIN)) close_stream(w, s);
}

static void free_stream(stream *s) {
  free(s->line);
  s->line = NULL;
  s->len = s->cap = 0;
}

/* ---------------------------------------------------------------------------------------
 * Starting workers
 * ------------------------------------------------------------------------------------- */

static void set_int_env(const char *name, long value, int overwrite) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", value);
  setenv(name, buf, overwrite);
}

/* In the child, between fork and exec (the launcher is single-threaded, so setenv is safe
 * here). Never returns. */
static void exec_worker(const launcher *L, const worker *w, int out_fd, int err_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != L->self) _exit(127); /* the launcher died before prctl */
  restore_signals();

  int targets[2] = {STDOUT_FILENO, STDERR_FILENO}, fds[2] = {out_fd, err_fd};
  for (int i = 0; i < 2; i++) {
    if (fds[i] == targets[i]) fcntl(fds[i], F_SETFD, 0);
    else dup2(fds[i], targets[i]);
  }
  /* A worker in its own process group that reads the terminal would be stopped (SIGTTIN). */
  if (isatty(STDIN_FILENO)) {
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0 && null != STDIN_FILENO) {
      dup2(null, STDIN_FILENO);
      close(null);
    }
  }

  set_int_env("RANK", w->rank, 1);
  set_int_env("LOCAL_RANK", w->local_rank, 1);
  set_int_env("WORLD_SIZE", L->world, 1);
  set_int_env("LOCAL_WORLD_SIZE", L->nproc, 1);
  set_int_env("GROUP_RANK", L->cfg->node_rank, 1);
  set_int_env("GROUP_WORLD_SIZE", L->cfg->nnodes, 1);
  set_int_env("ROLE_RANK", w->rank, 1);
  set_int_env("ROLE_WORLD_SIZE", L->world, 1);
  setenv("ROLE_NAME", "default", 1);
  setenv("MASTER_ADDR", L->master_addr, 1);
  set_int_env("MASTER_PORT", L->master_port, 1);
  set_int_env("DDPLUA_RESTART_COUNT", L->attempt, 1);
  set_int_env("DDPLUA_MAX_RESTARTS", L->cfg->max_restarts, 1);
  set_int_env("DDP_NUM_THREADS", L->threads, 0);
  set_int_env("OMP_NUM_THREADS", L->threads, 0);
  set_int_env("OPENBLAS_NUM_THREADS", L->threads, 0);
  setenv("DDPLUA_UNBUFFERED", "1", 0);

  execv(L->exe, L->argv);
  dprintf(STDERR_FILENO, DDP_CLI_NAME ": cannot run %s: %s\n", L->exe, strerror(errno));
  _exit(127);
}

/* Open the log file of one stream when it goes to a file. Returns 0, or -1 after a message. */
static int open_log(const launcher *L, worker *w, stream *s, int which) {
  s->log = -1;
  if (!L->to_file[which]) return 0;
  char dir[PATH_MAX];
  if (L->cfg->max_restarts > 0)
    snprintf(dir, sizeof dir, "%s/attempt_%d/rank_%d", L->log_dir, L->attempt, w->rank);
  else
    snprintf(dir, sizeof dir, "%s/rank_%d", L->log_dir, w->rank);
  snprintf(s->log_path, sizeof s->log_path, "%s/%s.log", dir, which == 1 ? "stdout" : "stderr");
  if (make_dirs(dir) != 0 ||
      (s->log = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0) {
    say("cannot write the log file %s: %s", s->log_path, strerror(errno));
    return -1;
  }
  return 0;
}

static int start_worker(launcher *L, worker *w) {
  int out[2], err[2];
  w->out.fd = w->err.fd = -1;
  if (open_log(L, w, &w->out, 1) != 0 || open_log(L, w, &w->err, 2) != 0) return -1;
  w->out.console = L->to_console[1] ? STDOUT_FILENO : 0;
  w->err.console = L->to_console[2] ? STDERR_FILENO : 0;
  if (pipe2(out, O_CLOEXEC) != 0) {
    say("cannot create a pipe for worker rank %d: %s", w->rank, strerror(errno));
    return -1;
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    say("cannot create a pipe for worker rank %d: %s", w->rank, strerror(errno));
    close(out[0]);
    close(out[1]);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) exec_worker(L, w, out[1], err[1]);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    say("cannot start worker rank %d: %s", w->rank, strerror(errno));
    close(out[0]);
    close(err[0]);
    return -1;
  }
  setpgid(pid, pid); /* also here, so a signal sent right away reaches the group */
  w->pid = pid;
  w->running = 1;
  w->out.fd = out[0];
  w->err.fd = err[0];
  return 0;
}

/* ---------------------------------------------------------------------------------------
 * Watching
 * ------------------------------------------------------------------------------------- */

static void signal_workers(launcher *L, int sig) {
  for (int i = 0; i < L->nproc; i++) {
    worker *w = &L->workers[i];
    if (!w->running) continue;
    if (kill(-w->pid, sig) != 0) kill(w->pid, sig);
  }
}

static int failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Reap the workers that ended. Returns how many are still running. */
static int reap(launcher *L, int *stopping) {
  int running = 0;
  for (int i = 0; i < L->nproc; i++) {
    worker *w = &L->workers[i];
    if (!w->running) continue;
    int status;
    pid_t r = waitpid(w->pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) {
      running++;
      continue;
    }
    w->running = 0;
    w->status = r < 0 ? (1 << 8) : status; /* lost (ECHILD): call it exit code 1 */
    if (failed(w->status) && !*stopping) {
      L->failed = i;
      *stopping = 1;
      signal_workers(L, SIGTERM);
    }
  }
  return running;
}

/* Run one attempt: start the workers, pass their output on, stop them all at the first
 * failure or signal, reap them. */
static enum outcome run_attempt(launcher *L) {
  L->failed = -1;
  int stopping = 0, killed = 0;
  double kill_at = 0, drain_until = 0;

  for (int i = 0; i < L->nproc; i++) {
    worker *w = &L->workers[i];
    memset(w, 0, sizeof *w);
    w->local_rank = i;
    w->rank = L->cfg->node_rank * L->nproc + i;
    w->out.fd = w->err.fd = w->out.log = w->err.log = -1;
    w->prefix_len = (size_t)snprintf(w->prefix, sizeof w->prefix, "[rank %d]: ", w->rank);
  }
  enum outcome start = ALL_OK;
  for (int i = 0; i < L->nproc && start == ALL_OK; i++)
    if (start_worker(L, &L->workers[i]) != 0) start = START_FAILED;
  if (start != ALL_OK) {
    stopping = 1;
    signal_workers(L, SIGTERM);
  }

  struct pollfd *fds = calloc((size_t)(2 * L->nproc + 1), sizeof *fds);
  stream **owners = calloc((size_t)(2 * L->nproc + 1), sizeof *owners);
  worker **owner_w = calloc((size_t)(2 * L->nproc + 1), sizeof *owner_w);
  char *chunk = malloc(READ_CHUNK);
  if (!fds || !owners || !owner_w || !chunk) {
    say("out of memory");
    stopping = 1;
    start = START_FAILED;
    signal_workers(L, SIGKILL);
  }

  for (;;) {
    if (stopping && kill_at == 0) kill_at = now_s() + GRACE_S;

    int running = reap(L, &stopping);
    if (stopping && kill_at == 0) kill_at = now_s() + GRACE_S;
    if (running && stopping && !killed && now_s() >= kill_at) {
      signal_workers(L, SIGKILL);
      killed = 1;
    }
    int nfds = 0;
    if (fds) {
      fds[nfds++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
      for (int i = 0; i < L->nproc; i++) {
        worker *w = &L->workers[i];
        stream *ss[2] = {&w->out, &w->err};
        for (int k = 0; k < 2; k++) {
          if (ss[k]->fd < 0) continue;
          owners[nfds] = ss[k];
          owner_w[nfds] = w;
          fds[nfds++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
        }
      }
    }
    if (!running) {
      if (nfds <= 1) break;
      if (drain_until == 0) drain_until = now_s() + DRAIN_S;
      if (now_s() >= drain_until) break; /* pipes held open by the workers' children */
    }

    int timeout = 1000;
    if (stopping && !killed && running) {
      double left = kill_at - now_s();
      timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
    }
    if (!running) timeout = 100;
    if (!fds) {
      usleep(10000);
      continue;
    }
    int n = poll(fds, (nfds_t)nfds, timeout);
    if (n < 0 && errno != EINTR) {
      say("poll failed: %s", strerror(errno));
      usleep(10000);
    }
    if (n <= 0) continue;

    if (fds[0].revents) {
      unsigned char sigs[64];
      ssize_t k;
      while ((k = read(sig_pipe[0], sigs, sizeof sigs)) > 0) {
        for (ssize_t j = 0; j < k; j++) {
          int sig = sigs[j];
          if (sig == SIGCHLD) continue;
          if (L->signal) { /* a second one: no more grace */
            signal_workers(L, SIGKILL);
            killed = 1;
            continue;
          }
          L->signal = sig;
          stopping = 1;
          signal_workers(L, sig);
        }
      }
    }
    for (int i = 1; i < nfds; i++)
      if (fds[i].revents) read_stream(owner_w[i], owners[i], chunk);
  }

  for (int i = 0; i < L->nproc; i++) {
    worker *w = &L->workers[i];
    close_stream(w, &w->out);
    close_stream(w, &w->err);
  }
  free(fds);
  free(owners);
  free(owner_w);
  free(chunk);
  if (L->signal) return SIGNALLED;
  if (start != ALL_OK) return START_FAILED;
  return L->failed >= 0 ? WORKER_FAILED : ALL_OK;
}

/* ---------------------------------------------------------------------------------------
 * The failure summary
 * ------------------------------------------------------------------------------------- */

/* The worker's error message: the lines from the last one that starts with "ddplua: " (how
 * the host reports a Lua error) up to "stack traceback:", else the last non-empty line. */
static void error_message(const stream *s, char *out, size_t size) {
  char text[TAIL_BYTES + 1];
  memcpy(text, s->tail, s->tail_len);
  text[s->tail_len] = '\0';
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

/* The last `max` lines of the stream's tail, each indented, on stderr. */
static void print_tail(const stream *s, int max) {
  size_t end = s->tail_len;
  while (end > 0 && s->tail[end - 1] == '\n') end--;
  size_t start = end;
  for (int lines = 0; start > 0; start--)
    if (s->tail[start - 1] == '\n' && ++lines == max) break;
  for (size_t i = start; i < end;) {
    const char *nl = memchr(s->tail + i, '\n', end - i);
    size_t stop = nl ? (size_t)(nl - s->tail) : end;
    fprintf(stderr, "  %.*s\n", (int)(stop - i), s->tail + i);
    i = stop + 1;
  }
}

static void report_failure(const launcher *L) {
  const worker *w = &L->workers[L->failed];
  char msg[TAIL_BYTES + 1], how[96], name[32];
  error_message(&w->err, msg, sizeof msg);
  if (WIFSIGNALED(w->status))
    snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(w->status),
             signal_name(WTERMSIG(w->status), name, sizeof name));
  else
    snprintf(how, sizeof how, "failed with exit code %d", WEXITSTATUS(w->status));
  fflush(stdout);
  fprintf(stderr, DDP_CLI_NAME ": worker rank %d (local rank %d, pid %d) %s%s%s\n", w->rank,
          w->local_rank, (int)w->pid, how, *msg ? ": " : "", msg);
  if (!w->err.console && w->err.tail_len) {
    fprintf(stderr, DDP_CLI_NAME ": last lines of its stderr%s%s%s:\n",
            w->err.log_path[0] ? " (" : "", w->err.log_path, w->err.log_path[0] ? ")" : "");
    print_tail(&w->err, SUMMARY_LINES);
  }
  fflush(stderr);
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
  for (int k = 1; k <= 2; k++) {
    L->to_file[k] = (file_bits & k) != 0;
    L->to_console[k] = !(c->redirects & k) || (c->tee & k);
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

int ddp_launcher_run(const ddp_cli_options *opts, int argc, char **argv) {
  const ddp_cli_launch *c = &opts->launch;
  launcher L;
  memset(&L, 0, sizeof L);
  L.cfg = c;
  L.nproc = c->nproc_per_node;
  L.world = c->nnodes * c->nproc_per_node;
  L.self = getpid();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  L.threads = cores / L.nproc > 1 ? (int)(cores / L.nproc) : 1;
  snprintf(L.master_addr, sizeof L.master_addr, "%s", c->standalone ? "127.0.0.1" : c->master_addr);
  L.master_port = c->master_port;

  ssize_t n = readlink("/proc/self/exe", L.exe, sizeof L.exe - 1);
  if (n <= 0 || n >= (ssize_t)sizeof L.exe - 1) {
    say("cannot find this executable (/proc/self/exe): %s", strerror(errno));
    return DDP_CLI_EXIT_ERROR;
  }
  L.exe[n] = '\0';

  char tmp_logs[64];
  if (choose_logs(&L, tmp_logs, sizeof tmp_logs) != 0) return DDP_CLI_EXIT_ERROR;
  L.argv = worker_argv(opts, argc, argv);
  L.workers = calloc((size_t)L.nproc, sizeof *L.workers);
  if (!L.argv || !L.workers || install_signals() != 0) {
    say("cannot start the launcher: %s", strerror(errno ? errno : ENOMEM));
    free(L.argv);
    free(L.workers);
    return DDP_CLI_EXIT_ERROR;
  }

  int status = DDP_CLI_EXIT_ERROR;
  for (L.attempt = 0;; L.attempt++) {
    if (c->standalone) {
      L.master_port = free_port();
      if (L.master_port < 0) {
        say("--standalone: cannot find a free port on 127.0.0.1: %s", strerror(errno));
        break;
      }
    }
    enum outcome o = run_attempt(&L);
    for (int i = 0; i < L.nproc; i++) {
      free_stream(&L.workers[i].out);
      free_stream(&L.workers[i].err);
    }
    if (o == ALL_OK) {
      status = DDP_CLI_EXIT_OK;
      break;
    }
    if (o == SIGNALLED) {
      char name[32];
      say("stopped the workers on %s", signal_name(L.signal, name, sizeof name));
      status = 128 + L.signal;
      break;
    }
    if (o == START_FAILED) break;
    report_failure(&L);
    if (L.attempt >= c->max_restarts) break;
    say("restarting all %d workers (restart %d of %d)", L.nproc, L.attempt + 1, c->max_restarts);
  }

  free(L.argv);
  free(L.workers);
  fflush(stdout);
  restore_signals();
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  if (L.signal) raise(L.signal); /* end as the signal would have ended us */
  return status;
}
