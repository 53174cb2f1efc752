/* dist_repl.c: the distributed REPL, `ddplua --nproc_per_node=N -i` (no script).
 *
 * Note [distributed REPL]
 * One prompt, N ranks in lockstep: the interactive counterpart of mp.spawn.
 *
 *   prompt (this process)                       ranks (launcher workers, `ddplua -i`)
 *   listens on 127.0.0.1:<port>
 *   forks the launcher (own process group) ---> DDPLUA_REPL_CONNECT=127.0.0.1:<port>
 *                                               init_process_group(); `dist` global
 *   accepts N connections             <------- 'H' "<rank>"
 *   reads a complete input (repl.c: libedit,
 *   the session checks it is complete)
 *   sends it to every rank (or one: %rank K) -> 'L' <code> ('R' for %rank K): run as at their own prompt
 *   waits for every answer            <------- 'O' <what the input printed, stdout+stderr>
 *   prints them: identical ones once as "[all ranks] ...", the others "[rank K] ..."
 *
 * Each rank's output is caught by pointing its fds 1 and 2 at a temporary file while the
 * input runs, so the launcher's own prefixing never sees it, and outputs can be compared.
 * An error is output like any other: it shows, and the session goes on. Ctrl-C at the
 * prompt drops the line; while ranks run, this process sends an 'I' frame to every rank
 * involved (the launcher sits in its own process group, so the terminal's Ctrl-C reaches only
 * this process); a thread of each rank aborts the process groups with a collective pending
 * (so a rank blocked in one gets out at once, and its peers too: Note [REPL group abort] in
 * lua/ddplua/repl/ranks.lua, which also makes the default group again before the next input)
 * and raises SIGINT in its main thread, its REPL turns it into "interrupted!", and the
 * answers come back as usual. A rank that dies ends the session:
 * the prompt names it, gives the launcher a moment to report why, and exits non-zero. The
 * prompt's death ends the job: the launcher has PR_SET_PDEATHSIG = SIGTERM and stops its
 * ranks, and a rank whose prompt connection ends while it runs an input ends itself. Ctrl-D
 * closes the connections: the ranks' REPLs end, then the launcher.
 *
 * Frames on the socket: one type byte, the payload length as 10 decimal digits, the payload
 * (repl_wire.h; Note [no partial frames]). One node: the socket is bound to 127.0.0.1 on a
 * free port. With --nnodes=M, node 0 (the one that gets the prompt) listens on
 * master_addr:master_port + 1 (Note [REPL listen address]), and the other nodes, started
 * with the same flags and -i, only run their launcher, whose ranks connect there.
 *
 * Note [REPL handshake]: the prompt sends code that every rank runs, so each side proves
 * the job's secret ($DDPLUA_STORE_SECRET: the prompt makes one for a one-node job before it
 * forks the launcher, which keeps it; a multi-node job must set it, as for the store) before
 * anything else crosses the socket, in the store's way (Note [store handshake]): the rank
 * sends 'H' "<rank> <nonce_r>", the prompt answers 'A' "<nonce_p> <mac_p>" with
 * mac_p = HMAC-SHA256(secret, "ddplua-repl prompt <rank> <nonce_r> <nonce_p>"), the rank
 * checks it and answers 'P' "<mac_r>" with mac_r = HMAC-SHA256(secret, "ddplua-repl rank
 * <rank> <nonce_p> <nonce_r>"). Nonces are 64 fresh hex digits; MACs travel as hex. A rank
 * never runs code from a prompt that failed to prove the secret, and the prompt drops a
 * connection that fails, that has not proved the secret HANDSHAKE_TIMEOUT_S after it was
 * accepted, or that announces a frame longer than DDP_REPL_HANDSHAKE_MAX before it has
 * proved it. Handshakes run side by side (Note [REPL handshakes concurrent]).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <lua.h>

#include "cli.h"
#include "ddplua.h"
#include "repl_wire.h"

#define MAX_RANKS 256
#define PATH_BUF 4096
#define CONNECT_TIMEOUT_S 120 /* ranks start, load ddplua and join the group in this time */
#define HANDSHAKE_TIMEOUT_S 10 /* a connection proves the secret within this time, in total */
#define MAX_PENDING 64         /* connections proving the secret at once (Note [REPL handshakes concurrent]) */
#define LOST_RANK_WAIT_S 2.0   /* the launcher's time to report a lost rank before it is stopped */
#define DDP_STR_(x) #x
#define DDP_STR(x) DDP_STR_(x)

/* ---------------------------------------------------------------------------------------
 * Frames (repl_wire.h), over sockets
 * ------------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* send() all of p; MSG_NOSIGNAL: a peer that died gives EPIPE here, not SIGPIPE (the prompt
 * does not ignore SIGPIPE: its terminal may close). */
static int send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int send_frame(int fd, char type, const char *data, size_t len) {
  char head[DDP_REPL_HEAD_BYTES];
  ddp_repl_frame_head(head, type, len);
  return send_all(fd, head, sizeof head) || send_all(fd, data, len) ? -1 : 0;
}

/* What reading a frame came to. */
enum frame_status { FRAME_OK = 0, FRAME_CLOSED = -1, FRAME_TIMEOUT = -2, FRAME_BAD = -3 };

/* Read once from fd (which poll found readable) into the reader, no more than the current
 * frame still needs. FRAME_OK with *done = 1 when a frame is complete, FRAME_OK with
 * *done = 0 when more is needed, FRAME_CLOSED at end of stream or on an error, FRAME_BAD for
 * a malformed stream. */
static int read_some(int fd, ddp_repl_reader *r, int *done) {
  char buf[65536];
  size_t want = ddp_repl_reader_want(r);
  ssize_t got = read(fd, buf, want < sizeof buf ? want : sizeof buf);
  *done = 0;
  if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return FRAME_OK;
  if (got <= 0) return FRAME_CLOSED;
  size_t used;
  int st = ddp_repl_reader_feed(r, buf, (size_t)got, &used);
  if (st < 0) return FRAME_BAD;
  *done = st == 1;
  return FRAME_OK;
}

/* Read one whole frame from fd by `deadline` (now_s() seconds; < 0: none). On FRAME_OK the
 * frame's *type, *data (malloc'd, the caller frees it) and *len are set; on any other result
 * *data is NULL (Note [no partial frames]). */
static int read_frame(int fd, ddp_repl_reader *r, double deadline, char *type, char **data,
                      size_t *len) {
  *data = NULL;
  for (;;) {
    int wait_ms = -1;
    if (deadline >= 0) {
      double left = deadline - now_s();
      if (left <= 0) return FRAME_TIMEOUT;
      wait_ms = (int)(left * 1000) + 1;
    }
    struct pollfd p = {fd, POLLIN, 0};
    int n = poll(&p, 1, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FRAME_CLOSED;
    if (n == 0) continue;
    int done, st = read_some(fd, r, &done);
    if (st != FRAME_OK) return st;
    if (done) {
      ddp_repl_reader_take(r, type, data, len);
      return FRAME_OK;
    }
  }
}

/* Note [no partial frames]: a frame's bytes belong to the reader that is filling them until
 * the frame is whole; only then does the caller own them (ddp_repl_reader_take). A read
 * that fails leaves the caller with NULL, never with a freed or half-filled buffer, so no
 * error path can free or print one (the eleven-byte pre-authentication frame that announced
 * ten bytes and closed used to be freed twice here). */

/* ---- the handshake (Note [REPL handshake]) ---- */

/* The job's secret: $DDPLUA_STORE_SECRET, or "" when unset (Note [REPL secret]). */
static const char *job_secret(void) {
  const char *s = getenv("DDPLUA_STORE_SECRET");
  return s ? s : "";
}

/* hex of HMAC-SHA256(secret, "ddplua-repl <who> <rank> <a> <b>") into out (65 bytes). */
static void handshake_mac(char *out, const char *who, int rank, const char *a, const char *b) {
  char msg[320];
  unsigned char mac[32];
  int n = snprintf(msg, sizeof msg, "ddplua-repl %s %d %s %s", who, rank, a, b);
  const char *secret = job_secret();
  ddp_hmac_sha256(mac, secret, strlen(secret), msg, (size_t)n);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* 1 when the NUL-terminated a and b are equal, in time that depends only on their lengths. */
static int same_mac(const char *a, const char *b) {
  size_t n = strlen(a);
  if (n != strlen(b)) return 0;
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

/* ---------------------------------------------------------------------------------------
 * A rank's side
 * ------------------------------------------------------------------------------------- */

static void ignore_sigint(int sig) { (void)sig; } /* a Ctrl-C that came after the input ended */

/* While an input runs, a thread watches the connection for the prompt's 'I' (Ctrl-C) frames
 * and raises SIGINT in the main thread, where the REPL's handler turns it into an error at
 * the next Lua event. The prompt sends nothing else until this rank has answered, so the
 * watcher never takes an input frame (it reads no more than the current frame needs:
 * ddp_repl_reader_want); it is stopped (through a pipe) before the answer. When the prompt
 * is gone (the connection ends) nobody can read this rank's answer: the watcher says so on
 * the rank's real stderr and ends the rank with SIGTERM (Note [flush on SIGTERM]), so a rank
 * blocked in a collective does not wait out the collective's timeout. */
typedef struct watcher {
  int fd;
  int stop[2];
  int err_fd; /* the rank's stderr while fds 1 and 2 point at the capture file */
  pthread_t main, thread;
} watcher;

static void *watch(void *arg) {
  watcher *w = arg;
  ddp_repl_reader r;
  ddp_repl_reader_init(&r, 0); /* 'I' frames are empty */
  for (;;) {
    struct pollfd p[2] = {{w->fd, POLLIN, 0}, {w->stop[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break;
    int done, st = read_some(w->fd, &r, &done);
    if (st != FRAME_OK) {
      dprintf(w->err_fd, DDP_CLI_NAME ": rank %s: %s; ending this rank\n", getenv("RANK") ? getenv("RANK") : "0",
              st == FRAME_CLOSED ? "the REPL prompt is gone" : "the REPL prompt sent a malformed frame");
      kill(getpid(), SIGTERM);
      break;
    }
    if (!done) continue;
    char type, *data;
    size_t len;
    ddp_repl_reader_take(&r, &type, &data, &len);
    free(data);
    if (type == 'I') {
      /* Note [REPL group abort] (ranks.lua): a collective the program's thread is blocked in
       * returns with the abort (on every rank) instead of waiting out its timeout */
      ddp_pg_abort_pending("interrupted (Ctrl-C in the distributed REPL)");
      pthread_kill(w->main, SIGINT);
    }
  }
  ddp_repl_reader_free(&r);
  return NULL;
}

/* Run `code` with fds 1 and 2 pointed at a temporary file (and Ctrl-C frames watched); the
 * output is returned malloc'd. every_rank: every rank runs this input (an 'L' frame, not
 * 'R'), so an aborted default group is made again first (Note [REPL group abort]). */
static char *run_captured(lua_State *L, int fd, const char *code, size_t len, int every_rank,
                          size_t *out_len) {
  fflush(stdout);
  fflush(stderr);
  FILE *tmp = tmpfile();
  int saved1 = dup(1), saved2 = dup(2);
  if (tmp) {
    dup2(fileno(tmp), 1);
    dup2(fileno(tmp), 2);
  }
  watcher w = {fd, {-1, -1}, saved2, pthread_self(), 0};
  int watching = pipe(w.stop) == 0 && pthread_create(&w.thread, NULL, watch, &w) == 0;
  if (every_rank) (void)ddp_host_dostring(L, "require('ddplua.repl.ranks').heal()", "=(distributed REPL)");
  ddp_repl_eval(L, code, len);
  if (watching) {
    (void)!write(w.stop[1], "", 1);
    pthread_join(w.thread, NULL);
  }
  if (w.stop[0] >= 0) {
    close(w.stop[0]);
    close(w.stop[1]);
  }
  fflush(stdout);
  fflush(stderr);
  dup2(saved1, 1);
  dup2(saved2, 2);
  close(saved1);
  close(saved2);
  char *out = NULL;
  *out_len = 0;
  if (tmp) {
    off_t n = lseek(fileno(tmp), 0, SEEK_END);
    if (n > (off_t)DDP_REPL_FRAME_MAX) n = (off_t)DDP_REPL_FRAME_MAX; /* the frame's limit */
    out = malloc((size_t)(n > 0 ? n : 0) + 1);
    if (out && n > 0 && pread(fileno(tmp), out, (size_t)n, 0) == n) *out_len = (size_t)n;
    fclose(tmp);
  }
  return out;
}

/* Connect to host:port (a name or an address). Returns the socket or -1. */
static int connect_to(const char *host, const char *port) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

/* What one handshake attempt of a rank came to. */
enum { HS_OK = 0, HS_RETRY = 1, HS_REFUSED = 2 };

/* The rank's half on a connected fd: HS_OK when the prompt proved the secret and the rank
 * answered; HS_RETRY when the connection ended or timed out before the prompt's answer (the
 * prompt drops the oldest unproved connection when it has too many: try again); HS_REFUSED
 * when the prompt's answer was malformed or did not prove the secret. */
static int handshake_rank(int fd, int rank, double deadline) {
  char nonce_r[65], hello[96], type, *reply;
  size_t len;
  if (ddp_store_new_secret(nonce_r, sizeof nonce_r) != DDP_OK) return HS_REFUSED;
  snprintf(hello, sizeof hello, "%d %s", rank, nonce_r);
  if (send_frame(fd, 'H', hello, strlen(hello)) != 0) return HS_RETRY;
  ddp_repl_reader r;
  ddp_repl_reader_init(&r, DDP_REPL_HANDSHAKE_MAX);
  double answer_by = now_s() + HANDSHAKE_TIMEOUT_S;
  int st = read_frame(fd, &r, answer_by < deadline ? answer_by : deadline, &type, &reply, &len);
  ddp_repl_reader_free(&r);
  if (st == FRAME_CLOSED || st == FRAME_TIMEOUT) return HS_RETRY;
  char nonce_p[65], mac_p[65], want[65], mine[65];
  int ok = st == FRAME_OK && type == 'A' && ddp_repl_parse_answer(reply, len, nonce_p, mac_p) == 0;
  free(reply);
  if (!ok) return HS_REFUSED;
  handshake_mac(want, "prompt", rank, nonce_r, nonce_p);
  if (!same_mac(want, mac_p)) return HS_REFUSED;
  handshake_mac(mine, "rank", rank, nonce_p, nonce_r);
  return send_frame(fd, 'P', mine, strlen(mine)) == 0 ? HS_OK : HS_RETRY;
}

int ddp_repl_serve(lua_State *L, const char *address) {
  char host[256], port[16];
  if (sscanf(address, "%255[^:]:%15s", host, port) != 2) {
    fprintf(stderr, DDP_CLI_NAME ": DDPLUA_REPL_CONNECT=%s: expected host:port\n", address);
    return DDP_CLI_EXIT_ERROR;
  }
  /* the rank's prompt-level names: `dist` and its default group (env://) */
  if (ddp_host_dostring(L,
        "dist = require 'ddplua.distributed'\n"
        "require('ddplua.repl.ranks').init()\n" /* Note [REPL group abort] */
        "dist = require('ddplua.repl.ranks').prompt_dist(dist)",
        "=(distributed REPL)") != 0)
    return DDP_CLI_EXIT_ERROR;
  const char *rank_env = getenv("RANK");
  int rank = rank_env ? atoi(rank_env) : 0;
  double deadline = now_s() + CONNECT_TIMEOUT_S;
  int fd = -1, hs = HS_RETRY;
  while (hs == HS_RETRY && now_s() < deadline) {
    if (fd >= 0) {
      close(fd);
      usleep(100 * 1000);
    }
    fd = connect_to(host, port);
    if (fd < 0) break; /* nobody listens: the prompt is gone (it listens before the ranks start) */
    hs = handshake_rank(fd, rank, deadline);
  }
  if (hs != HS_OK) {
    if (hs == HS_REFUSED)
      fprintf(stderr, DDP_CLI_NAME ": rank %d: the REPL prompt at %s did not prove the job's secret "
              "(DDPLUA_STORE_SECRET): not running its code\n", rank, address);
    else
      fprintf(stderr, DDP_CLI_NAME ": rank %d: cannot join the REPL prompt at %s: %s\n", rank, address,
              fd < 0 ? strerror(errno) : "the connection ended or timed out before the prompt answered");
    if (fd >= 0) close(fd);
    return DDP_CLI_EXIT_ERROR;
  }

  struct sigaction sa_int;
  memset(&sa_int, 0, sizeof sa_int);
  sa_int.sa_handler = ignore_sigint;
  sigemptyset(&sa_int.sa_mask);
  sigaction(SIGINT, &sa_int, NULL);
  ddp_host_keep_running_on_sigint(1);
  int status = DDP_CLI_EXIT_OK;
  ddp_repl_reader r;
  ddp_repl_reader_init(&r, DDP_REPL_FRAME_MAX);
  for (;;) {
    char type, *code;
    size_t len;
    int st = read_frame(fd, &r, -1, &type, &code, &len);
    if (st == FRAME_CLOSED) break; /* the prompt closed: Ctrl-D */
    if (st != FRAME_OK) {
      fprintf(stderr, DDP_CLI_NAME ": rank %d: the REPL prompt sent a malformed frame (%s); ending\n",
              rank, r.error ? r.error : "unreadable");
      status = DDP_CLI_EXIT_ERROR;
      break;
    }
    if (type != 'L' && type != 'R') { /* a Ctrl-C frame that came after the input ended */
      free(code);
      continue;
    }
    size_t out_len = 0;
    char *out = run_captured(L, fd, code, len, type == 'L', &out_len);
    free(code);
    int failed = send_frame(fd, 'O', out ? out : "", out_len);
    free(out);
    if (failed) break;
  }
  ddp_repl_reader_free(&r);
  ddp_host_keep_running_on_sigint(0);
  close(fd);
  return status;
}

/* ---------------------------------------------------------------------------------------
 * The prompt's side
 * ------------------------------------------------------------------------------------- */

typedef struct ranks {
  int n;
  int fd[MAX_RANKS]; /* by global rank */
  pid_t launcher;
} ranks;

/* The connections Ctrl-C is forwarded to while ranks run (read by the signal handler, which
 * sends an 'I' frame to each: send() is async-signal-safe, and the prompt itself writes
 * nothing while it waits for answers). */
static volatile sig_atomic_t forward_n;
static int forward_fd[MAX_RANKS];

static void forward_sigint(int sig) {
  (void)sig;
  int saved = errno;
  for (int i = 0; i < forward_n; i++) (void)!send(forward_fd[i], "I0000000000", 11, MSG_NOSIGNAL);
  errno = saved;
}

/* Print `text` (what one rank or all printed) with `label` before each line. */
static void print_labelled(const char *label, const char *text, size_t len) {
  size_t start = 0;
  while (start < len) {
    const char *nl = memchr(text + start, '\n', len - start);
    size_t end = nl ? (size_t)(nl - text) : len;
    printf("%s %.*s\n", label, (int)(end - start), text + start);
    start = end + 1;
  }
}

/* A rank's connection ended (or broke the protocol) while the prompt waited on it: say which,
 * give the launcher (which sees the rank's exit) up to LOST_RANK_WAIT_S to report why, stop
 * it, and end the prompt. */
static void end_with_lost_rank(ranks *rk, int rank, const char *what) {
  fflush(stdout);
  fprintf(stderr, DDP_CLI_NAME ": rank %d of the distributed REPL is gone (%s); ending the session\n",
          rank, what);
  double until = now_s() + LOST_RANK_WAIT_S;
  int status;
  while (now_s() < until && waitpid(rk->launcher, &status, WNOHANG) == 0) usleep(20 * 1000);
  kill(rk->launcher, SIGTERM); /* a no-op once it has ended */
  while (waitpid(rk->launcher, &status, 0) < 0 && errno == EINTR) {}
  exit(DDP_CLI_EXIT_ERROR);
}

/* ddp_repl_remote: run `code` on every rank (or on K for "%rank K code") and print. The
 * answers are read from every involved connection at once (poll), so a rank that dies is
 * seen at once, even while another rank waits for it inside a collective. */
static int run_on_ranks(void *ctx, const char *code, size_t len) {
  ranks *rk = ctx;
  int only = -1;
  if (strncmp(code, "%rank", 5) == 0) {
    char *end;
    only = (int)strtol(code + 5, &end, 10);
    while (*end == ' ') end++;
    len -= (size_t)(end - code);
    code = end;
    if (only < 0 || only >= rk->n) {
      printf("%%rank: no rank %d (ranks 0..%d)\n", only, rk->n - 1);
      return 0;
    }
  }
  static char *out[MAX_RANKS];
  static size_t out_len[MAX_RANKS];
  static ddp_repl_reader rd[MAX_RANKS];
  int waiting = 0;
  for (int r = 0; r < rk->n; r++) {
    out[r] = NULL;
    out_len[r] = 0;
    if (only >= 0 && r != only) continue;
    /* 'R': this rank alone (%rank K), which must not make the group again (Note [REPL
     * group abort] in lua/ddplua/repl/ranks.lua) */
    if (send_frame(rk->fd[r], only >= 0 ? 'R' : 'L', code, len) != 0)
      end_with_lost_rank(rk, r, "its connection is closed");
    ddp_repl_reader_init(&rd[r], DDP_REPL_FRAME_MAX);
    waiting++;
  }

  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  forward_n = 0;
  for (int r = 0; r < rk->n; r++)
    if (only < 0 || r == only) forward_fd[forward_n++] = rk->fd[r];
  sigaction(SIGINT, &sa, &old);
  while (waiting > 0) {
    struct pollfd p[MAX_RANKS];
    int who[MAX_RANKS], np = 0;
    for (int r = 0; r < rk->n; r++) {
      if ((only >= 0 && r != only) || out[r]) continue;
      p[np] = (struct pollfd){rk->fd[r], POLLIN, 0};
      who[np++] = r;
    }
    if (poll(p, (nfds_t)np, -1) < 0) {
      if (errno == EINTR) continue;
      end_with_lost_rank(rk, who[0], strerror(errno));
    }
    for (int i = 0; i < np; i++) {
      if (!p[i].revents) continue;
      int r = who[i], done, st = read_some(rk->fd[r], &rd[r], &done);
      if (st != FRAME_OK)
        end_with_lost_rank(rk, r, st == FRAME_BAD ? rd[r].error
                                  : "its connection closed before its answer was whole");
      if (!done) continue;
      char type;
      ddp_repl_reader_take(&rd[r], &type, &out[r], &out_len[r]);
      if (type != 'O') end_with_lost_rank(rk, r, "it sent a frame that is not an answer");
      waiting--;
    }
  }
  sigaction(SIGINT, &old, NULL);
  forward_n = 0;

  int same = only < 0;
  for (int r = 1; same && r < rk->n; r++)
    same = out_len[r] == out_len[0] && memcmp(out[r], out[0], out_len[0]) == 0;
  if (same) {
    print_labelled("[all ranks]", out[0], out_len[0]);
  } else {
    for (int r = 0; r < rk->n; r++) {
      if (!out[r]) continue;
      char label[32];
      snprintf(label, sizeof label, "[rank %d]", r);
      print_labelled(label, out[r], out_len[r]);
    }
  }
  for (int r = 0; r < rk->n; r++) {
    free(out[r]);
    out[r] = NULL;
    if (only < 0 || r == only) ddp_repl_reader_free(&rd[r]);
  }
  fflush(stdout);
  return 0;
}

/* ---- gathering the ranks: concurrent handshakes (Note [REPL handshakes concurrent]) ---- */

/* Note [REPL handshakes concurrent]: every accepted connection is a small state machine
 * (waiting for its hello, then for its proof) driven by one poll loop, so a connection that
 * sends a byte every few seconds delays nobody: each has HANDSHAKE_TIMEOUT_S in total (not
 * per read) to prove the secret, at most MAX_PENDING wait at once, and when more come the
 * one that has waited longest is dropped (a genuine rank proves the secret within
 * milliseconds, and a rank whose connection is dropped before the prompt's answer connects
 * again: handshake_rank's HS_RETRY). Dropped connections are logged at most once a second,
 * with the count of those not logged (Note [REPL drop log]). */
typedef struct pending {
  int fd;
  int stage;        /* 0: waiting for 'H', 1: waiting for 'P' */
  int rank;         /* claimed in the hello */
  double deadline;  /* now_s() by which the secret must be proved */
  char peer[64];    /* "address:port" for the log */
  char nonce_r[65], nonce_p[65];
  ddp_repl_reader rd;
} pending;

/* Note [REPL drop log]: one line a second at most, so a client that fails handshakes in a
 * loop cannot fill the terminal or the launcher's log; the next line (or the end of the
 * gathering) says how many were not logged. */
typedef struct drop_log {
  double last;      /* now_s() of the last line */
  long suppressed;  /* drops since then not logged */
} drop_log;

static void log_drop(drop_log *lg, const char *peer, const char *why) {
  double t = now_s();
  if (lg->last > 0 && t - lg->last < 1.0) {
    lg->suppressed++;
    return;
  }
  if (lg->suppressed)
    fprintf(stderr, DDP_CLI_NAME ": REPL prompt: dropped the connection from %s: %s (and %ld "
            "more dropped, not logged, in the last second)\n", peer, why, lg->suppressed);
  else
    fprintf(stderr, DDP_CLI_NAME ": REPL prompt: dropped the connection from %s: %s\n", peer, why);
  lg->last = t;
  lg->suppressed = 0;
}

static void describe_peer(int fd, char *out, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
      port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
      port = ntohs(a->sin6_port);
    }
  }
  snprintf(out, cap, "%s:%d", host, port);
}

static void drop_pending(pending *pd, int *np, int i, drop_log *lg, const char *why) {
  log_drop(lg, pd[i].peer, why);
  close(pd[i].fd);
  ddp_repl_reader_free(&pd[i].rd);
  pd[i] = pd[--*np];
}

/* A whole frame arrived on pending connection i: advance its handshake. Returns 1 when the
 * connection proved the secret (it is then the rank's), 0 when it goes on, -1 when it was
 * dropped (why filled). */
static int advance_handshake(pending *c, ranks *rk, char type, const char *data, size_t len,
                             const char **why) {
  if (c->stage == 0) {
    if (type != 'H' || ddp_repl_parse_hello(data, len, rk->n, &c->rank, c->nonce_r) != 0) {
      *why = "its first frame is not a hello naming a rank of this job";
      return -1;
    }
    char mac[65], answer[160];
    if (ddp_store_new_secret(c->nonce_p, sizeof c->nonce_p) != DDP_OK) {
      *why = "no random bytes for a nonce";
      return -1;
    }
    handshake_mac(mac, "prompt", c->rank, c->nonce_r, c->nonce_p);
    snprintf(answer, sizeof answer, "%s %s", c->nonce_p, mac);
    /* ~140 bytes into a fresh socket's buffer: a non-blocking send that cannot take them
     * all means the peer is not reading; drop it */
    char head[DDP_REPL_HEAD_BYTES], frame[DDP_REPL_HEAD_BYTES + 160];
    size_t alen = strlen(answer);
    ddp_repl_frame_head(head, 'A', alen);
    memcpy(frame, head, sizeof head);
    memcpy(frame + sizeof head, answer, alen);
    if (send(c->fd, frame, sizeof head + alen, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(sizeof head + alen)) {
      *why = "it does not read the prompt's answer";
      return -1;
    }
    c->stage = 1;
    return 0;
  }
  char mac_r[65], want[65];
  if (type != 'P' || ddp_repl_parse_proof(data, len, mac_r) != 0) {
    *why = "its second frame is not a proof";
    return -1;
  }
  handshake_mac(want, "rank", c->rank, c->nonce_p, c->nonce_r);
  if (!same_mac(want, mac_r)) {
    *why = "it did not prove the job's secret (check DDPLUA_STORE_SECRET)";
    return -1;
  }
  if (rk->fd[c->rank] >= 0) {
    *why = "its rank has already joined";
    return -1;
  }
  return 1;
}

/* Accept one connection per rank, each proving the secret and naming its rank (Note [REPL
 * handshake], Note [REPL handshakes concurrent]). -1 when the launcher ended first or the
 * ranks did not come within CONNECT_TIMEOUT_S. */
static int gather_ranks(int listener, ranks *rk) {
  static pending pd[MAX_PENDING];
  int np = 0, got = 0, result = 0;
  drop_log lg = {0, 0};
  double deadline = now_s() + CONNECT_TIMEOUT_S;
  for (int r = 0; r < rk->n; r++) rk->fd[r] = -1;
  fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
  while (got < rk->n) {
    int status;
    if (waitpid(rk->launcher, &status, WNOHANG) == rk->launcher) {
      result = -1;
      break;
    }
    double t = now_s();
    if (t > deadline) {
      fprintf(stderr, DDP_CLI_NAME ": the ranks did not join the REPL in %d s (%d of %d joined)\n",
              CONNECT_TIMEOUT_S, got, rk->n);
      result = -1;
      break;
    }
    for (int i = 0; i < np;) { /* total handshake deadlines */
      if (t > pd[i].deadline)
        drop_pending(pd, &np, i, &lg, "it did not prove the job's secret within "
                     DDP_STR(HANDSHAKE_TIMEOUT_S) " s");
      else
        i++;
    }
    struct pollfd p[MAX_PENDING + 1];
    p[0] = (struct pollfd){listener, POLLIN, 0};
    for (int i = 0; i < np; i++) p[i + 1] = (struct pollfd){pd[i].fd, POLLIN, 0};
    if (poll(p, (nfds_t)np + 1, 200) <= 0) continue;
    /* the pending connections first: the entries move when one is dropped, so walk the
     * poll results by fd */
    for (int k = 1; k <= np; k++) {
      if (!p[k].revents) continue;
      int i = 0;
      while (i < np && pd[i].fd != p[k].fd) i++;
      if (i == np) continue;
      int done, st = read_some(pd[i].fd, &pd[i].rd, &done);
      if (st != FRAME_OK) {
        drop_pending(pd, &np, i, &lg, st == FRAME_BAD ? pd[i].rd.error
                     : "it closed the connection before proving the job's secret");
        continue;
      }
      if (!done) continue;
      char type, *data;
      size_t len;
      const char *why = NULL;
      ddp_repl_reader_take(&pd[i].rd, &type, &data, &len);
      int adv = advance_handshake(&pd[i], rk, type, data, len, &why);
      free(data);
      if (adv < 0) {
        drop_pending(pd, &np, i, &lg, why);
      } else if (adv == 1) {
        int fd = pd[i].fd;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        rk->fd[pd[i].rank] = fd;
        got++;
        ddp_repl_reader_free(&pd[i].rd);
        pd[i] = pd[--np];
      }
    }
    if (p[0].revents & POLLIN) {
      for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) break;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (np == MAX_PENDING) { /* the one that has waited longest goes */
          int oldest = 0;
          for (int i = 1; i < np; i++)
            if (pd[i].deadline < pd[oldest].deadline) oldest = i;
          drop_pending(pd, &np, oldest, &lg, "too many connections are proving the secret at once");
        }
        pending *c = &pd[np++];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->deadline = now_s() + HANDSHAKE_TIMEOUT_S;
        describe_peer(fd, c->peer, sizeof c->peer);
        ddp_repl_reader_init(&c->rd, DDP_REPL_HANDSHAKE_MAX);
      }
    }
  }
  while (np > 0) {
    close(pd[np - 1].fd);
    ddp_repl_reader_free(&pd[np - 1].rd);
    np--;
  }
  if (lg.suppressed)
    fprintf(stderr, DDP_CLI_NAME ": REPL prompt: %ld more connections dropped, not logged\n", lg.suppressed);
  return result;
}

/* ---- where the prompt listens (Note [REPL listen address]) ---- */

/* Note [REPL listen address]: the prompt listens only where its ranks connect: on one node
 * 127.0.0.1 on a free port; with --nnodes=M on master_addr:master_port + 1, the address every
 * node's ranks are given (so --master_addr=127.0.0.1 stays on loopback, and a host's one
 * cluster address never becomes every interface). master_addr must be an address of node 0,
 * as for the store. Returns the listening socket or -1 with the reason printed. */
static int open_listener(int multi, const char *master_addr, int port, char *address, size_t cap) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", multi ? port : 0);
  const char *host = multi ? master_addr : "127.0.0.1";
  int rc = getaddrinfo(host, portstr, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, DDP_CLI_NAME ": cannot open the REPL's socket: --master_addr=%s: %s\n", host,
            gai_strerror(rc));
    return -1;
  }
  int fd = -1, err = 0;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, MAX_RANKS) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
      err = errno;
      close(fd);
      fd = -1;
      continue;
    }
    int bound = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    snprintf(address, cap, "%s:%d", host, bound);
  }
  freeaddrinfo(res);
  if (fd < 0)
    fprintf(stderr, DDP_CLI_NAME ": cannot open the REPL's socket on %s port %d: %s%s\n", host,
            multi ? port : 0, strerror(err),
            multi && err == EADDRNOTAVAIL ? " (--master_addr must be an address of node 0, which "
                                            "holds the prompt)" : "");
  return fd;
}

int ddp_dist_repl_run(const ddp_cli_options *opts, int argc, char **argv) {
  const ddp_cli_launch *l = &opts->launch;
  ranks rk;
  memset(&rk, 0, sizeof rk);
  rk.n = l->nproc_per_node * l->nnodes;
  if (rk.n < 1 || rk.n > MAX_RANKS) {
    fprintf(stderr, DDP_CLI_NAME ": the distributed REPL runs 1..%d ranks\n", MAX_RANKS);
    return DDP_CLI_EXIT_USAGE;
  }
  int multi = l->nnodes > 1;
  char address[320];
  /* Note [REPL secret]: the job's secret, made here for a one-node job so the prompt and
   * the ranks share it (the launcher keeps a secret it is given; it refuses --nnodes > 1
   * without one, so the prompt never runs with an empty secret). */
  const char *given = getenv("DDPLUA_STORE_SECRET");
  if (!multi && !(given && given[0])) {
    char secret[65];
    if (ddp_store_new_secret(secret, sizeof secret) != DDP_OK ||
        setenv("DDPLUA_STORE_SECRET", secret, 1) != 0) {
      fprintf(stderr, DDP_CLI_NAME ": cannot make the job's secret: %s\n", ddp_last_error());
      return DDP_CLI_EXIT_ERROR;
    }
  }
  if (multi && !(given && given[0])) {
    fprintf(stderr, DDP_CLI_NAME ": --nnodes=%d: set DDPLUA_STORE_SECRET to the same secret on every "
            "node (for example the output of `od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`); the "
            "REPL's prompt and the store accept only connections that prove it\n", l->nnodes);
    return DDP_CLI_EXIT_USAGE;
  }
  if (multi && l->node_rank > 0) { /* only the ranks: they connect to node 0's prompt */
    snprintf(address, sizeof address, "%s:%d", l->master_addr, l->master_port + 1);
    setenv("DDPLUA_REPL_CONNECT", address, 1);
    return ddp_launcher_run(opts, argc, argv);
  }
  int listener = open_listener(multi, l->master_addr, l->master_port + 1, address, sizeof address);
  if (listener < 0) return DDP_CLI_EXIT_ERROR;
  fflush(stdout);
  fflush(stderr);
  pid_t prompt = getpid();
  rk.launcher = fork();
  if (rk.launcher < 0) {
    fprintf(stderr, DDP_CLI_NAME ": fork: %s\n", strerror(errno));
    return DDP_CLI_EXIT_ERROR;
  }
  if (rk.launcher == 0) { /* the launcher, out of the terminal's Ctrl-C */
    setpgid(0, 0);
    /* the prompt's death ends the job: SIGTERM makes the launcher stop its ranks (they get
     * SIGTERM, then SIGKILL after its grace period) */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != prompt) _exit(DDP_CLI_EXIT_ERROR); /* it died before prctl */
    close(listener);
    setenv("DDPLUA_REPL_CONNECT", address, 1);
    int null_in = open("/dev/null", 0);
    if (null_in >= 0) dup2(null_in, 0);
    /* The prompt owns the terminal: the launcher's live view (Note [live view]), drawn in
     * place on the same terminal, erased the prompt and the ranks' answers around it ("[all
     * ranks] 2" came out as "ranks] 2" once a collective took long enough to be shown). */
    ddp_cli_options quiet = *opts;
    quiet.launch.status_interval = 0;
    _exit(ddp_launcher_run(&quiet, argc, argv));
  }
  setpgid(rk.launcher, rk.launcher);
  int status = gather_ranks(listener, &rk);
  close(listener);
  if (status != 0) {
    kill(rk.launcher, SIGTERM);
    waitpid(rk.launcher, NULL, 0);
    return DDP_CLI_EXIT_ERROR;
  }

  char root[PATH_BUF];
  ddp_cli_root(root, sizeof root);
  lua_State *L = ddp_host_new(root, argc, argv, 0);
  if (!L) return DDP_CLI_EXIT_ERROR;
  /* for Tab completion of dist.* here (the ranks hold the real group) */
  ddp_host_dostring(L, "dist = require 'ddplua.distributed'", "=(distributed REPL)");
  if (isatty(STDIN_FILENO))
    printf(DDP_CLI_NAME " distributed REPL: every line runs on all %d ranks (`dist` is their "
           "default group); %%rank K code runs on rank K only; Ctrl-C interrupts; Ctrl-D exits.\n",
           rk.n);
  ddp_repl_set_remote(run_on_ranks, &rk);
  ddp_repl_run(L, isatty(STDIN_FILENO));
  ddp_repl_set_remote(NULL, NULL);
  lua_close(L);

  for (int r = 0; r < rk.n; r++) close(rk.fd[r]); /* the ranks' REPLs end */
  int wstatus = 0;
  while (waitpid(rk.launcher, &wstatus, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : DDP_CLI_EXIT_ERROR;
}
