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
 *   sends it to every rank (or one: %rank K) -> 'L' <code>: run as at their own prompt
 *   waits for every answer            <------- 'O' <what the input printed, stdout+stderr>
 *   prints them: identical ones once as "[all ranks] ...", the others "[rank K] ..."
 *
 * Each rank's output is caught by pointing its fds 1 and 2 at a temporary file while the
 * input runs, so the launcher's own prefixing never sees it, and outputs can be compared.
 * An error is output like any other: it shows, and the session goes on. Ctrl-C at the
 * prompt drops the line; while ranks run, this process sends an 'I' frame to every rank
 * involved (the launcher sits in its own process group, so the terminal's Ctrl-C reaches only
 * this process); a thread of each rank raises SIGINT in its main thread, its REPL turns it
 * into "interrupted!", and the answers come back as usual. A rank that dies ends the session (the launcher reports it). Ctrl-D closes the
 * connections: the ranks' REPLs end, then the launcher.
 *
 * Frames on the socket: one type byte, the payload length as 10 decimal digits, the payload.
 * One node: the socket is bound to 127.0.0.1 on a free port. With --nnodes=M, node 0 (the
 * one that gets the prompt) listens on master_port + 1 on every interface, and the other
 * nodes, started with the same flags and -i, only run their launcher, whose ranks connect
 * to master_addr:master_port + 1.
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
 * connection that fails, or that sends nothing within HANDSHAKE_TIMEOUT_S, or a frame
 * longer than HANDSHAKE_FRAME_MAX before it has proved it.
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
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <lua.h>

#include "cli.h"
#include "ddplua.h"

#define MAX_RANKS 256
#define PATH_BUF 4096
#define CONNECT_TIMEOUT_S 120 /* ranks start, load ddplua and join the group in this time */
#define HANDSHAKE_TIMEOUT_S 10 /* a connection proves the secret within this time */
#define HANDSHAKE_FRAME_MAX 256 /* bytes of a handshake frame's payload */

/* ---------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------- */

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, char *p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int send_frame(int fd, char type, const char *data, size_t len) {
  char head[12];
  snprintf(head, sizeof head, "%c%010zu", type, len);
  return write_all(fd, head, 11) || write_all(fd, data, len) ? -1 : 0;
}

/* Receive a frame of at most `max` payload bytes: *data is malloc'd and NUL-terminated. -1
 * at end of stream, on error, or for a longer frame. */
static int recv_frame_max(int fd, char *type, char **data, size_t *len, size_t max) {
  char head[12] = {0};
  *data = NULL;
  if (read_all(fd, head, 11) != 0) return -1;
  *type = head[0];
  *len = (size_t)strtoull(head + 1, NULL, 10);
  if (*len > max) return -1;
  *data = malloc(*len + 1);
  if (!*data || read_all(fd, *data, *len) != 0) {
    free(*data);
    return -1;
  }
  (*data)[*len] = '\0';
  return 0;
}

/* A frame from a peer that has proved the secret (any length). */
static int recv_frame(int fd, char *type, char **data, size_t *len) {
  return recv_frame_max(fd, type, data, len, (size_t)-1 - 1);
}

/* ---- the handshake (Note [REPL handshake]) ---- */

/* The job's secret: $DDPLUA_STORE_SECRET, or "" when unset (then both sides prove the empty
 * secret, as the store does). */
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

/* Bound every read of fd by `seconds` (0: no bound). */
static void set_read_timeout(int fd, int seconds) {
  struct timeval tv = {seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* The rank's half: 0 when the prompt proved the secret and the rank answered. */
static int handshake_rank(int fd, int rank) {
  char nonce_r[65], hello[96], *reply = NULL, type;
  size_t len;
  if (ddp_store_new_secret(nonce_r, sizeof nonce_r) != DDP_OK) return -1;
  snprintf(hello, sizeof hello, "%d %s", rank, nonce_r);
  if (send_frame(fd, 'H', hello, strlen(hello)) != 0) return -1;
  set_read_timeout(fd, HANDSHAKE_TIMEOUT_S);
  int ok = recv_frame_max(fd, &type, &reply, &len, HANDSHAKE_FRAME_MAX) == 0 && type == 'A';
  char nonce_p[65] = "", mac_p[65] = "", want[65], mine[65];
  ok = ok && sscanf(reply, "%64s %64s", nonce_p, mac_p) == 2;
  free(reply);
  if (!ok) return -1;
  handshake_mac(want, "prompt", rank, nonce_r, nonce_p);
  if (!same_mac(want, mac_p)) return -1;
  set_read_timeout(fd, 0);
  handshake_mac(mine, "rank", rank, nonce_p, nonce_r);
  return send_frame(fd, 'P', mine, strlen(mine));
}

/* The prompt's half for one accepted connection: the rank it proved, or -1. */
static int handshake_prompt(int fd) {
  char type, *hello = NULL, *proof = NULL;
  size_t len;
  int rank = -1;
  char nonce_r[65] = "", nonce_p[65], answer[160], mac[65], want[65];
  set_read_timeout(fd, HANDSHAKE_TIMEOUT_S);
  int ok = recv_frame_max(fd, &type, &hello, &len, HANDSHAKE_FRAME_MAX) == 0 && type == 'H';
  ok = ok && sscanf(hello, "%d %64s", &rank, nonce_r) == 2 && strlen(nonce_r) == 64;
  free(hello);
  if (!ok || ddp_store_new_secret(nonce_p, sizeof nonce_p) != DDP_OK) return -1;
  handshake_mac(mac, "prompt", rank, nonce_r, nonce_p);
  snprintf(answer, sizeof answer, "%s %s", nonce_p, mac);
  if (send_frame(fd, 'A', answer, strlen(answer)) != 0) return -1;
  ok = recv_frame_max(fd, &type, &proof, &len, HANDSHAKE_FRAME_MAX) == 0 && type == 'P';
  handshake_mac(want, "rank", rank, nonce_p, nonce_r);
  ok = ok && same_mac(want, proof);
  free(proof);
  if (!ok) return -1;
  set_read_timeout(fd, 0);
  return rank;
}

/* ---------------------------------------------------------------------------------------
 * A rank's side
 * ------------------------------------------------------------------------------------- */

static void ignore_sigint(int sig) { (void)sig; } /* a Ctrl-C that came after the input ended */

/* While an input runs, a thread watches the connection for the prompt's 'I' (Ctrl-C) frames
 * and raises SIGINT in the main thread, where the REPL's handler turns it into an error at
 * the next Lua event. The prompt sends nothing else until this rank has answered, so the
 * watcher never takes an input frame; it is stopped (through a pipe) before the answer. */
typedef struct watcher {
  int fd;
  int stop[2];
  pthread_t main, thread;
} watcher;

static void *watch(void *arg) {
  watcher *w = arg;
  for (;;) {
    struct pollfd p[2] = {{w->fd, POLLIN, 0}, {w->stop[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break;
    if (!(p[0].revents & POLLIN)) break; /* the prompt is gone */
    char head[11];
    if (read_all(w->fd, head, sizeof head) != 0 || head[0] != 'I') break;
    pthread_kill(w->main, SIGINT);
  }
  return NULL;
}

/* Run `code` with fds 1 and 2 pointed at a temporary file (and Ctrl-C frames watched); the
 * output is returned malloc'd. */
static char *run_captured(lua_State *L, int fd, const char *code, size_t len, size_t *out_len) {
  fflush(stdout);
  fflush(stderr);
  FILE *tmp = tmpfile();
  int saved1 = dup(1), saved2 = dup(2);
  if (tmp) {
    dup2(fileno(tmp), 1);
    dup2(fileno(tmp), 2);
  }
  watcher w = {fd, {-1, -1}, pthread_self(), 0};
  int watching = pipe(w.stop) == 0 && pthread_create(&w.thread, NULL, watch, &w) == 0;
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

int ddp_repl_serve(lua_State *L, const char *address) {
  char host[256], port[16];
  if (sscanf(address, "%255[^:]:%15s", host, port) != 2) {
    fprintf(stderr, DDP_CLI_NAME ": DDPLUA_REPL_CONNECT=%s: expected host:port\n", address);
    return DDP_CLI_EXIT_ERROR;
  }
  /* the rank's prompt-level names: `dist` and its default group (env://) */
  if (ddp_host_dostring(L,
        "dist = require 'ddplua.distributed'\n"
        "if not dist.is_initialized() then dist.init_process_group() end\n"
        "dist = require('ddplua.repl.ranks').prompt_dist(dist)",
        "=(distributed REPL)") != 0)
    return DDP_CLI_EXIT_ERROR;
  int fd = connect_to(host, port);
  if (fd < 0) {
    fprintf(stderr, DDP_CLI_NAME ": cannot reach the REPL prompt at %s: %s\n", address,
            strerror(errno));
    return DDP_CLI_EXIT_ERROR;
  }
  const char *rank = getenv("RANK");
  if (handshake_rank(fd, rank ? atoi(rank) : 0) != 0) {
    fprintf(stderr, DDP_CLI_NAME ": the REPL prompt at %s did not prove the job's secret "
            "(DDPLUA_STORE_SECRET): not running its code\n", address);
    close(fd);
    return DDP_CLI_EXIT_ERROR;
  }

  struct sigaction sa_int;
  memset(&sa_int, 0, sizeof sa_int);
  sa_int.sa_handler = ignore_sigint;
  sigemptyset(&sa_int.sa_mask);
  sigaction(SIGINT, &sa_int, NULL);
  ddp_host_keep_running_on_sigint(1);
  for (;;) {
    char type, *code;
    size_t len;
    if (recv_frame(fd, &type, &code, &len) != 0) break; /* the prompt closed: Ctrl-D */
    if (type != 'L') { /* a Ctrl-C frame that came after the input ended */
      free(code);
      continue;
    }
    size_t out_len = 0;
    char *out = run_captured(L, fd, code, len, &out_len);
    free(code);
    int failed = send_frame(fd, 'O', out ? out : "", out_len);
    free(out);
    if (failed) break;
  }
  ddp_host_keep_running_on_sigint(0);
  close(fd);
  return DDP_CLI_EXIT_OK;
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
 * writes an 'I' frame to each: write() is async-signal-safe, and the prompt itself writes
 * nothing while it waits for answers). */
static volatile sig_atomic_t forward_n;
static int forward_fd[MAX_RANKS];

static void forward_sigint(int sig) {
  (void)sig;
  int saved = errno;
  for (int i = 0; i < forward_n; i++) (void)!write(forward_fd[i], "I0000000000", 11);
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

/* ddp_repl_remote: run `code` on every rank (or on K for "%rank K code") and print. */
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
  char *out[MAX_RANKS] = {0};
  size_t out_len[MAX_RANKS] = {0};
  int lost = 0;
  for (int r = 0; r < rk->n; r++)
    if ((only < 0 || r == only) && send_frame(rk->fd[r], 'L', code, len) != 0) lost = 1;

  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  forward_n = 0;
  for (int r = 0; r < rk->n; r++)
    if (only < 0 || r == only) forward_fd[forward_n++] = rk->fd[r];
  sigaction(SIGINT, &sa, &old);
  for (int r = 0; r < rk->n && !lost; r++) {
    if (only >= 0 && r != only) continue;
    char type;
    if (recv_frame(rk->fd[r], &type, &out[r], &out_len[r]) != 0) lost = 1;
  }
  sigaction(SIGINT, &old, NULL);
  forward_n = 0;

  int same = only < 0 && !lost;
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
  for (int r = 0; r < rk->n; r++) free(out[r]);
  fflush(stdout);
  if (lost) {
    fprintf(stderr, DDP_CLI_NAME ": a rank of the distributed REPL is gone; ending the session\n");
    exit(DDP_CLI_EXIT_ERROR); /* the launcher (our child) reports which one and why */
  }
  return 0;
}

/* Accept one connection per rank, each proving the secret and naming its rank (Note [REPL
 * handshake]). -1 when the launcher ended
 * first or the ranks did not come in time. */
static int gather_ranks(int listener, ranks *rk) {
  time_t deadline = time(NULL) + CONNECT_TIMEOUT_S;
  int got = 0;
  for (int r = 0; r < rk->n; r++) rk->fd[r] = -1;
  while (got < rk->n) {
    int status;
    if (waitpid(rk->launcher, &status, WNOHANG) == rk->launcher) return -1;
    if (time(NULL) > deadline) {
      fprintf(stderr, DDP_CLI_NAME ": the ranks did not join the REPL in %d s\n", CONNECT_TIMEOUT_S);
      return -1;
    }
    struct pollfd p = {listener, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int fd = accept(listener, NULL, NULL);
    if (fd < 0) continue;
    int rank = handshake_prompt(fd);
    if (rank < 0 || rank >= rk->n || rk->fd[rank] >= 0) {
      close(fd);
      continue;
    }
    rk->fd[rank] = fd;
    got++;
  }
  return 0;
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
  /* One node: a loopback socket on a free port. Several: node 0 holds the prompt on
   * master_port + 1 (every interface), the other nodes' ranks connect there and those nodes
   * only run their launcher. */
  int multi = l->nnodes > 1;
  char address[320];
  /* The job's secret, made here for a one-node job so the prompt and the ranks share it (the
   * launcher keeps a secret it is given; it refuses --nnodes > 1 without one). */
  const char *given = getenv("DDPLUA_STORE_SECRET");
  if (!multi && !(given && given[0])) {
    char secret[65];
    if (ddp_store_new_secret(secret, sizeof secret) != DDP_OK ||
        setenv("DDPLUA_STORE_SECRET", secret, 1) != 0) {
      fprintf(stderr, DDP_CLI_NAME ": cannot make the job's secret: %s\n", ddp_last_error());
      return DDP_CLI_EXIT_ERROR;
    }
  }
  if (multi) {
    snprintf(address, sizeof address, "%s:%d", l->master_addr, l->master_port + 1);
    if (l->node_rank > 0) {
      setenv("DDPLUA_REPL_CONNECT", address, 1);
      return ddp_launcher_run(opts, argc, argv);
    }
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(multi ? INADDR_ANY : INADDR_LOOPBACK);
  sa.sin_port = htons(multi ? (uint16_t)(l->master_port + 1) : 0);
  int one = 1;
  if (listener >= 0) setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listener < 0 || bind(listener, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(listener, MAX_RANKS) != 0 || getsockname(listener, (struct sockaddr *)&sa, &sl) != 0) {
    fprintf(stderr, DDP_CLI_NAME ": cannot open the REPL's socket: %s\n", strerror(errno));
    return DDP_CLI_EXIT_ERROR;
  }
  if (!multi) snprintf(address, sizeof address, "127.0.0.1:%d", ntohs(sa.sin_port));
  fflush(stdout);
  fflush(stderr);
  rk.launcher = fork();
  if (rk.launcher < 0) {
    fprintf(stderr, DDP_CLI_NAME ": fork: %s\n", strerror(errno));
    return DDP_CLI_EXIT_ERROR;
  }
  if (rk.launcher == 0) { /* the launcher, out of the terminal's Ctrl-C */
    setpgid(0, 0);
    close(listener);
    setenv("DDPLUA_REPL_CONNECT", address, 1);
    int null_in = open("/dev/null", 0);
    if (null_in >= 0) dup2(null_in, 0);
    _exit(ddp_launcher_run(opts, argc, argv));
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
