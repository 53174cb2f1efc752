/* runtime/comm/store.c: the store's front doors (ddplua/store.h), the TCP client, and the
 * helpers the server (store_server.c) and the file store (store_file.c) share.
 * Wire protocol and the wait/cancel dance: Note [store wire protocol], Note [parked waits]
 * in store_wire.h. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/listen_policy.h"
#include "comm/store_auth.h"
#include "comm/store_wire.h"

/* How long a client waits for the server to acknowledge a CANCEL after its own timeout, and
 * for the rest of a reply whose first byte arrived. */
#define STORE_GRACE_S 10.0

/* ---- shared helpers ----------------------------------------------------------------- */

double store_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int store_buf_reserve(store_buf *b, size_t extra) {
  if (b->cap - b->len >= extra) return DDP_OK;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < extra) cap *= 2;
  unsigned char *p = realloc(b->data, cap);
  if (!p) return DDP_ERR_MEMORY;
  b->data = p;
  b->cap = cap;
  return DDP_OK;
}

int store_buf_append(store_buf *b, const void *p, size_t n) {
  if (store_buf_reserve(b, n)) return DDP_ERR_MEMORY;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  return DDP_OK;
}

void store_buf_free(store_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

/* FNV-1a: short keys, no adversary that matters inside one job. */
static size_t hash_key(const char *key, size_t klen) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < klen; i++) h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
  return (size_t)h;
}

store_entry *store_table_find(store_table *t, const char *key, size_t klen) {
  if (!t->nslots) return NULL;
  for (store_entry *e = t->slots[hash_key(key, klen) % t->nslots]; e; e = e->next)
    if (e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
  return NULL;
}

static int table_grow(store_table *t) {
  size_t n = t->nslots ? t->nslots * 2 : 64;
  store_entry **slots = calloc(n, sizeof *slots);
  if (!slots) return DDP_ERR_MEMORY;
  for (size_t i = 0; i < t->nslots; i++) {
    store_entry *e = t->slots[i];
    while (e) {
      store_entry *next = e->next;
      size_t j = hash_key(e->key, e->klen) % n;
      e->next = slots[j];
      slots[j] = e;
      e = next;
    }
  }
  free(t->slots);
  t->slots = slots;
  t->nslots = n;
  return DDP_OK;
}

int store_table_set(store_table *t, const char *key, size_t klen, const void *v, size_t vlen) {
  unsigned char *copy = malloc(vlen + 1);
  if (!copy) return DDP_ERR_MEMORY;
  if (vlen) memcpy(copy, v, vlen);
  copy[vlen] = 0;
  store_entry *e = store_table_find(t, key, klen);
  if (e) {
    free(e->value);
    e->value = copy;
    e->vlen = vlen;
    return DDP_OK;
  }
  if (t->count + 1 > t->nslots && table_grow(t)) {
    free(copy);
    return DDP_ERR_MEMORY;
  }
  e = calloc(1, sizeof *e);
  char *k = malloc(klen + 1);
  if (!e || !k) {
    free(e);
    free(k);
    free(copy);
    return DDP_ERR_MEMORY;
  }
  memcpy(k, key, klen);
  k[klen] = 0;
  e->key = k;
  e->klen = klen;
  e->value = copy;
  e->vlen = vlen;
  size_t j = hash_key(key, klen) % t->nslots;
  e->next = t->slots[j];
  t->slots[j] = e;
  t->count++;
  return DDP_OK;
}

static void entry_free(store_entry *e) {
  free(e->key);
  free(e->value);
  free(e);
}

int store_table_delete(store_table *t, const char *key, size_t klen) {
  if (!t->nslots) return 0;
  store_entry **link = &t->slots[hash_key(key, klen) % t->nslots];
  for (; *link; link = &(*link)->next) {
    store_entry *e = *link;
    if (e->klen == klen && memcmp(e->key, key, klen) == 0) {
      *link = e->next;
      entry_free(e);
      t->count--;
      return 1;
    }
  }
  return 0;
}

void store_table_clear(store_table *t) {
  for (size_t i = 0; i < t->nslots; i++) {
    store_entry *e = t->slots[i];
    while (e) {
      store_entry *next = e->next;
      entry_free(e);
      e = next;
    }
  }
  free(t->slots);
  t->slots = NULL;
  t->nslots = t->count = 0;
}

int store_parse_i64(const unsigned char *v, size_t len, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (i < len && (v[i] == '-' || v[i] == '+')) neg = v[i++] == '-';
  if (i == len || len - i > 19) return -1;
  uint64_t x = 0;
  for (; i < len; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    x = x * 10 + (uint64_t)(v[i] - '0');
  }
  if (x > (uint64_t)INT64_MAX + (uint64_t)neg) return -1;
  *out = neg ? (int64_t)(0 - x) : (int64_t)x;
  return 0;
}

double store_timeout(const ddp_store *s) {
  double t;
  __atomic_load(&s->timeout_s, &t, __ATOMIC_RELAXED);
  return t;
}

const char *store_who(const ddp_store *s, char *buf, size_t cap) {
  int rank = s ? __atomic_load_n(&s->rank, __ATOMIC_RELAXED) : -1;
  if (rank >= 0) snprintf(buf, cap, "store (rank %d)", rank);
  else snprintf(buf, cap, "store");
  return buf;
}

const char *store_keys_text(const char *const *keys, int n, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n; i++) {
    int w = snprintf(buf + used, cap - used, "%s'%.200s'", i ? ", " : "", keys[i]);
    if (w < 0 || (size_t)w >= cap - used || used > 400) {
      snprintf(buf + (used < cap - 32 ? used : cap - 32), 32, ", ... (%d keys)", n);
      break;
    }
    used += (size_t)w;
  }
  return buf;
}

/* ---- argument checks ------------------------------------------------------------------ */

static int check_store(const ddp_store *s, const char *op) {
  if (!s) DDP_FAIL(DDP_ERR_ARG, "store %s: the store is NULL (freed or never created)", op);
  return DDP_OK;
}

static int check_key(const ddp_store *s, const char *op, const char *key) {
  char who[48];
  if (!key || !key[0])
    DDP_FAIL(DDP_ERR_ARG, "%s %s: the key is empty", store_who(s, who, sizeof who), op);
  if (strlen(key) > STORE_MAX_KEY)
    DDP_FAIL(DDP_ERR_ARG, "%s %s: key of %zu bytes, more than the %zu allowed",
             store_who(s, who, sizeof who), op, strlen(key), STORE_MAX_KEY);
  return DDP_OK;
}

static int check_value(const ddp_store *s, const char *op, const char *key, const void *v,
                       size_t len, const char *arg) {
  char who[48];
  if (len > STORE_MAX_VALUE)
    DDP_FAIL(DDP_ERR_ARG, "%s %s '%.200s': %s of %zu bytes, more than the 1 GiB allowed",
             store_who(s, who, sizeof who), op, key, arg, len);
  if (len && !v)
    DDP_FAIL(DDP_ERR_ARG, "%s %s '%.200s': %s is NULL with length %zu",
             store_who(s, who, sizeof who), op, key, arg, len);
  return DDP_OK;
}

static int check_keys(const ddp_store *s, const char *op, const char *const *keys, int n) {
  char who[48];
  if (n < 0 || (unsigned)n > STORE_MAX_NARGS || (n > 0 && !keys))
    DDP_FAIL(DDP_ERR_ARG, "%s %s: %d keys (0 .. %u, and a key array)",
             store_who(s, who, sizeof who), op, n, STORE_MAX_NARGS);
  for (int i = 0; i < n; i++) DDP_TRY(check_key(s, op, keys[i]));
  return DDP_OK;
}

/* ---- TCP client ---------------------------------------------------------------------- */

/* Mark the connection unusable; later calls fail with this text. */
static void tcp_break(ddp_store *s, const char *why) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  if (!s->broken[0]) snprintf(s->broken, sizeof s->broken, "%s", why);
}

static int tcp_fail_peer(ddp_store *s, const char *what, const char *during) {
  char who[48], why[200];
  snprintf(why, sizeof why, "%s", what);
  tcp_break(s, why);
  DDP_FAIL(DDP_ERR_PEER, "%s: lost the connection to the store server at %s:%d (%s) during %s",
           store_who(s, who, sizeof who), s->host, s->port, s->broken, during);
}

static int set_socket_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int fl = fcntl(fd, F_GETFL, 0);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* One connection attempt to any address of host:port, bounded by `deadline`. Returns the fd
 * or -1 with errno-style text in err. */
static int try_connect(const char *host, int port, double deadline, char *err, size_t cap) {
  struct addrinfo hints = {0}, *res = NULL;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int rc = getaddrinfo(host, portstr, &hints, &res);
  if (rc) {
    snprintf(err, cap, "cannot resolve host: %s", gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      snprintf(err, cap, "socket: %s", strerror(errno));
      continue;
    }
    if (set_socket_options(fd) < 0) {
      snprintf(err, cap, "fcntl: %s", strerror(errno));
      close(fd);
      fd = -1;
      continue;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    if (errno == EINPROGRESS) {
      struct pollfd p = {fd, POLLOUT, 0};
      double left = deadline - store_now();
      int ms = left > 0 ? (int)(left * 1000) + 1 : 0;
      if (poll(&p, 1, ms) == 1) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr == 0) break;
        snprintf(err, cap, "%s", strerror(soerr));
      } else {
        snprintf(err, cap, "connect timed out");
      }
    } else {
      snprintf(err, cap, "%s", strerror(errno));
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

static int tcp_send(ddp_store *s, const store_buf *b, double deadline, const char *during);
static int tcp_recv(ddp_store *s, void *dst, size_t n, double deadline, size_t *got,
                    const char *during);

/* The client's half of Note [store handshake], bounded by deadline. */
static int tcp_handshake(ddp_store *s, double deadline) {
  char who[48];
  const char *during = "authentication (proving the job's secret)";
  unsigned char hello[STORE_MAGIC_LEN + STORE_NONCE], answer[2 * STORE_NONCE];
  unsigned char proof[STORE_SHA256_BYTES], want[STORE_SHA256_BYTES];
  size_t got;
  int st = tcp_recv(s, hello, sizeof hello, deadline, &got, during);
  if (st == DDP_ERR_TIMEOUT) {
    tcp_break(s, "no handshake from the server");
    DDP_FAIL(DDP_ERR_TIMEOUT, "%s: the store server at %s:%d sent no handshake within %.1f s "
             "(a server that is stopped, cut off or overloaded, too many connections, or not a "
             "ddplua store)", store_who(s, who, sizeof who),
             s->host, s->port, store_timeout(s));
  }
  if (st) return st;
  if (memcmp(hello, STORE_MAGIC, STORE_MAGIC_LEN) != 0)
    return tcp_fail_peer(s, "it is not a ddplua store (wrong handshake)", during);
  const unsigned char *ns = hello + STORE_MAGIC_LEN, *nc = answer;
  if (store_random_bytes(answer, STORE_NONCE))
    DDP_FAIL(DDP_ERR_IO, "%s: no random bytes for the handshake", store_who(s, who, sizeof who));
  const void *parts[3] = {"client", ns, nc};
  size_t lens[3] = {6, STORE_NONCE, STORE_NONCE};
  store_hmac_sha256(answer + STORE_NONCE, s->secret, s->secret_len, parts, lens, 3);
  store_buf b = {answer, sizeof answer, sizeof answer};
  DDP_TRY(tcp_send(s, &b, deadline, during));
  st = tcp_recv(s, proof, sizeof proof, deadline, &got, during);
  if (st == DDP_ERR_PEER) {
    ddp_error_prefix("%s: the store server at %s:%d refused this process's secret (set the same "
                     "DDPLUA_STORE_SECRET, or store secret, on every rank)",
                     store_who(s, who, sizeof who), s->host, s->port);
    return DDP_ERR_PEER;
  }
  if (st == DDP_ERR_TIMEOUT) return tcp_fail_peer(s, "no answer to the handshake", during);
  if (st) return st;
  parts[0] = "server";
  store_hmac_sha256(want, s->secret, s->secret_len, parts, lens, 3);
  if (!store_equal_ct(want, proof, sizeof want))
    return tcp_fail_peer(s, "the server did not prove the job's secret", during);
  return DDP_OK;
}

static int tcp_connect(ddp_store *s, double timeout_s) {
  char err[160] = "no address", who[48];
  double deadline = store_now() + timeout_s;
  double pause = 0.01;
  for (;;) {
    s->fd = try_connect(s->host, s->port, deadline, err, sizeof err);
    if (s->fd >= 0) return tcp_handshake(s, deadline);
    double left = deadline - store_now();
    if (left <= 0) break;
    usleep((useconds_t)(1e6 * (pause < left ? pause : left)));
    if (pause < 0.2) pause *= 2;  // the server may take a while to start: back off a little
  }
  DDP_FAIL(DDP_ERR_TIMEOUT, "%s: could not connect to the store server at %s:%d within %.1f s (%s)",
           store_who(s, who, sizeof who), s->host, s->port, timeout_s, err);
}

/* Send all of b, bounded by deadline. */
static int tcp_send(ddp_store *s, const store_buf *b, double deadline, const char *during) {
  char who[48];
  size_t off = 0;
  while (off < b->len) {
    ssize_t n = send(s->fd, b->data + off, b->len - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {s->fd, POLLOUT, 0};
      double left = deadline - store_now();
      if (left <= 0) {
        tcp_break(s, "a send timed out");
        DDP_FAIL(DDP_ERR_TIMEOUT, "%s: sending %s to %s:%d timed out after %.1f s",
                 store_who(s, who, sizeof who), during, s->host, s->port, store_timeout(s));
      }
      poll(&p, 1, (int)(left * 1000) + 1);
      continue;
    }
    return tcp_fail_peer(s, n < 0 ? strerror(errno) : "send failed", during);
  }
  return DDP_OK;
}

/* Read exactly n bytes. Returns DDP_OK, DDP_ERR_TIMEOUT (deadline passed; *got says how many
 * bytes came) or the peer failure. */
static int tcp_recv(ddp_store *s, void *dst, size_t n, double deadline, size_t *got,
                    const char *during) {
  unsigned char *p = dst;
  *got = 0;
  while (*got < n) {
    ssize_t r = recv(s->fd, p + *got, n - *got, 0);
    if (r > 0) {
      *got += (size_t)r;
      continue;
    }
    if (r == 0) return tcp_fail_peer(s, "the server closed the connection", during);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return tcp_fail_peer(s, strerror(errno), during);
    double left = deadline - store_now();
    if (left <= 0) return DDP_ERR_TIMEOUT;
    struct pollfd pf = {s->fd, POLLIN, 0};
    poll(&pf, 1, (int)(left * 1000) + 1);
  }
  return DDP_OK;
}

typedef struct reply {
  int code;
  unsigned char *data; /* malloc'd, NUL after len bytes */
  size_t len;
} reply;

/* Read one reply. DDP_ERR_TIMEOUT only when nothing of it came before `deadline` (the stream
 * is still in step); a reply cut by the grace period breaks the connection. */
static int tcp_read_reply(ddp_store *s, reply *r, double deadline, const char *during) {
  unsigned char hdr[5];
  size_t got;
  int st = tcp_recv(s, hdr, 1, deadline, &got, during);
  if (st) return st;
  st = tcp_recv(s, hdr + 1, 4, store_now() + STORE_GRACE_S, &got, during);
  if (st == DDP_ERR_TIMEOUT) return tcp_fail_peer(s, "a reply stopped half-way", during);
  if (st) return st;
  r->code = hdr[0];
  r->len = store_get_u32(hdr + 1);
  if (r->code > STORE_REPLY_CANCELLED || r->len > STORE_MAX_VALUE)
    return tcp_fail_peer(s, "malformed reply", during);
  r->data = malloc(r->len + 1);
  if (!r->data) DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory for a reply of %zu bytes", r->len);
  r->data[r->len] = 0;
  st = tcp_recv(s, r->data, r->len, store_now() + STORE_GRACE_S, &got, during);
  if (st) {
    free(r->data);
    r->data = NULL;
    if (st == DDP_ERR_TIMEOUT) return tcp_fail_peer(s, "a reply stopped half-way", during);
    return st;
  }
  return DDP_OK;
}

/* Build a request: op, then nargs arguments (ptr, len). */
static int build_request(store_buf *b, int op, int nargs, const void *const *args,
                         const size_t *lens) {
  unsigned char hdr[5];
  hdr[0] = (unsigned char)op;
  store_put_u32(hdr + 1, (uint32_t)nargs);
  size_t total = 5;
  for (int i = 0; i < nargs; i++) total += 4 + lens[i];
  if (store_buf_reserve(b, total)) DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory for a request");
  store_buf_append(b, hdr, 5);
  for (int i = 0; i < nargs; i++) {
    unsigned char l[4];
    store_put_u32(l, (uint32_t)lens[i]);
    store_buf_append(b, l, 4);
    store_buf_append(b, args[i], lens[i]);
  }
  return DDP_OK;
}

/* One request/reply exchange. `can_wait`: GET/WAIT, whose parked request is cancelled on
 * timeout (Note [parked waits]); other requests answer at once, and their timeout breaks the
 * connection. `during` names the call for messages ("wait for key 'x'"). */
static int tcp_call(ddp_store *s, int op, int nargs, const void *const *args, const size_t *lens,
                    double timeout_s, int can_wait, const char *during, reply *r) {
  char who[48];
  r->data = NULL;
  r->len = 0;
  if (s->fd < 0)
    DDP_FAIL(DDP_ERR_PEER, "%s: the connection to the store server at %s:%d is lost (%s); cannot run %s",
             store_who(s, who, sizeof who), s->host, s->port, s->broken, during);
  store_buf b = {0};
  int st = build_request(&b, op, nargs, args, lens);
  double deadline = store_now() + timeout_s;
  if (!st) st = tcp_send(s, &b, deadline, during);
  store_buf_free(&b);
  if (st) return st;
  st = tcp_read_reply(s, r, deadline, during);
  if (st != DDP_ERR_TIMEOUT) goto done;
  if (!can_wait) {
    tcp_break(s, "an earlier request timed out");
    DDP_FAIL(DDP_ERR_TIMEOUT, "%s: %s timed out after %.1f s (no answer from the store server at %s:%d)",
             store_who(s, who, sizeof who), during, timeout_s, s->host, s->port);
  }
  /* Cancel the parked wait and read until the CANCELLED marker. */
  store_buf c = {0};
  st = build_request(&c, STORE_OP_CANCEL, 0, NULL, NULL);
  if (!st) st = tcp_send(s, &c, store_now() + STORE_GRACE_S, during);
  store_buf_free(&c);
  if (st) return st;
  reply first = {0};
  st = tcp_read_reply(s, &first, store_now() + STORE_GRACE_S, during);
  if (st == DDP_ERR_TIMEOUT) return tcp_fail_peer(s, "no answer to a cancel", during);
  if (st) return st;
  if (first.code == STORE_REPLY_CANCELLED) {
    free(first.data);
    DDP_FAIL(DDP_ERR_TIMEOUT, "%s: %s timed out after %.1f s", store_who(s, who, sizeof who),
             during, timeout_s);
  }
  /* The answer beat the cancel: use it, then consume the CANCELLED marker. */
  reply marker = {0};
  st = tcp_read_reply(s, &marker, store_now() + STORE_GRACE_S, during);
  if (st == DDP_ERR_TIMEOUT) st = tcp_fail_peer(s, "no answer to a cancel", during);
  free(marker.data);
  if (!st && marker.code != STORE_REPLY_CANCELLED) st = tcp_fail_peer(s, "replies out of step", during);
  if (st) {
    free(first.data);
    return st;
  }
  *r = first;
done:
  if (st) return st;
  if (r->code == STORE_REPLY_ERR) {
    int e = ddp_fail_at(__FILE__, __LINE__, DDP_ERR_IO, "%s: %s: %s", store_who(s, who, sizeof who),
                        during, (const char *)r->data);
    free(r->data);
    r->data = NULL;
    return e;
  }
  if (r->code != STORE_REPLY_OK) {
    free(r->data);
    r->data = NULL;
    return tcp_fail_peer(s, "unexpected reply", during);
  }
  return DDP_OK;
}

/* ---- front doors --------------------------------------------------------------------- */

static int store_alloc(ddp_store **out, int kind, double timeout_s, const char *op) {
  if (!out) DDP_FAIL(DDP_ERR_ARG, "%s: out is NULL", op);
  *out = NULL;
  if (!(timeout_s > 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: timeout must be > 0 seconds, got %g", op, timeout_s);
  ddp_store *s = calloc(1, sizeof *s);
  if (!s) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  s->kind = kind;
  s->rank = -1;
  s->timeout_s = timeout_s;
  s->fd = -1;
  s->port = -1;
  pthread_mutex_init(&s->mu, NULL);
  *out = s;
  return DDP_OK;
}

int ddp_store_tcp_new(ddp_store **out, const char *host, int port, int is_server, double timeout_s) {
  return ddp_store_tcp_new_ranked(out, host, port, is_server, timeout_s, -1);
}

int ddp_store_tcp_new_ranked(ddp_store **out, const char *host, int port, int is_server,
                             double timeout_s, int rank) {
  ddp_store_tcp_options o = {0};
  o.is_server = is_server;
  o.timeout_s = timeout_s;
  o.rank = rank;
  return ddp_store_tcp_open(out, host, port, &o);
}

/* The default connection cap: Note [store bounds]; half the descriptors stay for the rest
 * of the process (checkpoints, Gloo's sockets). */
static int default_max_connections(void) {
  struct rlimit rl;
  int n = STORE_DEFAULT_MAX_CONNS;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 2 < (rlim_t)n)
    n = (int)(rl.rlim_cur / 2);
  return n < 4 ? 4 : n;
}

int ddp_store_tcp_open(ddp_store **out, const char *host, int port, const ddp_store_tcp_options *opts) {
  if (!opts) DDP_FAIL(DDP_ERR_ARG, "store: options are NULL");
  if (!host || !host[0]) host = "127.0.0.1";
  int is_server = opts->is_server;
  if (port < 0 || port > 65535)
    DDP_FAIL(DDP_ERR_ARG, "store: port %d out of range 0 .. 65535 (host %s)", port, host);
  if (port == 0 && !is_server)
    DDP_FAIL(DDP_ERR_ARG, "store: a client needs the server's port (got 0 for host %s)", host);
  if (strlen(host) >= sizeof ((ddp_store *)0)->host)
    DDP_FAIL(DDP_ERR_ARG, "store: host name of %zu bytes is too long", strlen(host));
  const char *secret = opts->secret ? opts->secret : getenv("DDPLUA_STORE_SECRET");
  if (!secret) secret = "";
  if (strlen(secret) > STORE_MAX_SECRET)
    DDP_FAIL(DDP_ERR_ARG, "store: a secret of %zu bytes, more than the %zu allowed", strlen(secret),
             STORE_MAX_SECRET);
  if (opts->idle_timeout_s < 0 || opts->max_memory < 0 || opts->max_connections < 0)
    DDP_FAIL(DDP_ERR_ARG, "store: idle_timeout_s, max_memory and max_connections must be >= 0 "
             "(0: the default), got %g, %lld, %d", opts->idle_timeout_s, (long long)opts->max_memory,
             opts->max_connections);
  ddp_store *s;
  DDP_TRY(store_alloc(&s, STORE_KIND_TCP, opts->timeout_s, "store"));
  s->rank = opts->rank < 0 ? -1 : opts->rank;
  snprintf(s->host, sizeof s->host, "%s", host);
  s->port = port;
  s->secret_len = strlen(secret);
  s->secret = malloc(s->secret_len + 1);
  int st = s->secret ? DDP_OK : DDP_ERR_MEMORY;
  if (st) ddp_fail_at(__FILE__, __LINE__, st, "store: out of memory");
  else memcpy(s->secret, secret, s->secret_len + 1);
  if (!st && is_server) st = listen_check_secret("store server", host, port, s->secret_len);
  if (!st && !is_server) st = join_check_secret("store", host, port, s->secret_len);
  if (!st && is_server) {
    store_server_config cfg = {
        .secret = s->secret, .secret_len = s->secret_len,
        .idle_timeout_s = opts->idle_timeout_s > 0 ? opts->idle_timeout_s : STORE_DEFAULT_IDLE_S,
        .max_memory = opts->max_memory > 0 ? opts->max_memory : STORE_DEFAULT_MAX_MEMORY,
        .max_connections = opts->max_connections > 0 ? opts->max_connections : default_max_connections(),
    };
    st = store_server_start(&s->server, host, port, &cfg);
    if (!st) s->port = store_server_port(s->server);
  }
  if (!st) st = tcp_connect(s, opts->timeout_s);
  if (st) {
    ddp_store_free(s);
    return st;
  }
  *out = s;
  return DDP_OK;
}

int store_tcp_client_like(ddp_store **out, const ddp_store *s, double timeout_s) {
  *out = NULL;
  if (!s || s->kind != STORE_KIND_TCP) return DDP_OK;
  ddp_store_tcp_options o = {0};
  o.timeout_s = timeout_s;
  o.rank = __atomic_load_n(&s->rank, __ATOMIC_RELAXED);
  o.secret = (const char *)s->secret; /* NUL-terminated (ddp_store_tcp_open) */
  return ddp_store_tcp_open(out, s->host, s->port, &o);
}

int ddp_store_new_secret(char *out, size_t cap) {
  if (!out || cap < 65) DDP_FAIL(DDP_ERR_ARG, "store new_secret: the buffer needs 65 bytes, got %zu", cap);
  unsigned char raw[32];
  if (store_random_bytes(raw, sizeof raw))
    DDP_FAIL(DDP_ERR_IO, "store new_secret: cannot read random bytes (getrandom, /dev/urandom)");
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
  memset(raw, 0, sizeof raw);
  return DDP_OK;
}

void ddp_hmac_sha256(unsigned char *out, const void *key, size_t klen, const void *msg, size_t mlen) {
  const void *parts[1] = {msg};
  size_t lens[1] = {mlen};
  store_hmac_sha256(out, key, klen, parts, lens, 1);
}

int ddp_store_server_stats(const ddp_store *s, int64_t *bytes, int *connections) {
  if (!s || !s->server) DDP_FAIL(DDP_ERR_ARG, "store server_stats: this store runs no server");
  store_server_stats(s->server, bytes, connections);
  return DDP_OK;
}

int ddp_store_file_new(ddp_store **out, const char *path, double timeout_s) {
  return ddp_store_file_new_ranked(out, path, timeout_s, -1);
}

int ddp_store_file_new_ranked(ddp_store **out, const char *path, double timeout_s, int rank) {
  if (!path || !path[0]) DDP_FAIL(DDP_ERR_ARG, "store: file store path is empty");
  ddp_store *s;
  DDP_TRY(store_alloc(&s, STORE_KIND_FILE, timeout_s, "store"));
  s->rank = rank < 0 ? -1 : rank;
  int st = store_file_open(&s->file, path);
  if (st) {
    ddp_store_free(s);
    return st;
  }
  *out = s;
  return DDP_OK;
}

int ddp_store_port(const ddp_store *s) { return s && s->kind == STORE_KIND_TCP ? s->port : -1; }

/* Rank and timeout are atomics, not under the mutex: setting them must not wait for another
 * thread's long wait to end. */
void ddp_store_set_rank(ddp_store *s, int rank) {
  if (s) __atomic_store_n(&s->rank, rank < 0 ? -1 : rank, __ATOMIC_RELAXED);
}

int ddp_store_set_timeout(ddp_store *s, double timeout_s) {
  DDP_TRY(check_store(s, "set_timeout"));
  if (!(timeout_s > 0))
    DDP_FAIL(DDP_ERR_ARG, "store set_timeout: timeout must be > 0 seconds, got %g", timeout_s);
  __atomic_store(&s->timeout_s, &timeout_s, __ATOMIC_RELAXED);
  return DDP_OK;
}

double ddp_store_get_timeout(const ddp_store *s) { return s ? store_timeout(s) : 0; }

int ddp_store_set(ddp_store *s, const char *key, const void *value, size_t len) {
  DDP_TRY(check_store(s, "set"));
  DDP_TRY(check_key(s, "set", key));
  DDP_TRY(check_value(s, "set", key, value, len, "value"));
  pthread_mutex_lock(&s->mu);
  int st;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_set(s, key, value, len);
  } else {
    char during[256];
    snprintf(during, sizeof during, "set of key '%.200s'", key);
    const void *args[2] = {key, value ? value : ""};
    size_t lens[2] = {strlen(key), len};
    reply r;
    st = tcp_call(s, STORE_OP_SET, 2, args, lens, store_timeout(s), 0, during, &r);
    if (!st) free(r.data);
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

int ddp_store_get(ddp_store *s, const char *key, void **value, size_t *len) {
  DDP_TRY(check_store(s, "get"));
  DDP_TRY(check_key(s, "get", key));
  if (!value) DDP_FAIL(DDP_ERR_ARG, "store get '%.200s': value is NULL", key);
  *value = NULL;
  if (len) *len = 0;
  pthread_mutex_lock(&s->mu);
  int st;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_get(s, key, value, len);
  } else {
    char during[256];
    snprintf(during, sizeof during, "get: wait for key '%.200s'", key);
    const void *args[1] = {key};
    size_t lens[1] = {strlen(key)};
    reply r;
    st = tcp_call(s, STORE_OP_GET, 1, args, lens, store_timeout(s), 1, during, &r);
    if (!st) {
      *value = r.data;
      if (len) *len = r.len;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

void ddp_store_free_value(void *value) { free(value); }

int ddp_store_add(ddp_store *s, const char *key, int64_t delta, int64_t *result) {
  DDP_TRY(check_store(s, "add"));
  DDP_TRY(check_key(s, "add", key));
  pthread_mutex_lock(&s->mu);
  int st;
  int64_t v = 0;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_add(s, key, delta, &v);
  } else {
    char during[256];
    snprintf(during, sizeof during, "add to key '%.200s'", key);
    unsigned char d[8];
    store_put_u64(d, (uint64_t)delta);
    const void *args[2] = {key, d};
    size_t lens[2] = {strlen(key), 8};
    reply r;
    st = tcp_call(s, STORE_OP_ADD, 2, args, lens, store_timeout(s), 0, during, &r);
    if (!st) {
      if (r.len == 8) v = (int64_t)store_get_u64(r.data);
      else st = tcp_fail_peer(s, "malformed add reply", during);
      free(r.data);
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (!st && result) *result = v;
  return st;
}

int ddp_store_compare_set(ddp_store *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **result, size_t *rlen) {
  DDP_TRY(check_store(s, "compare_set"));
  DDP_TRY(check_key(s, "compare_set", key));
  DDP_TRY(check_value(s, "compare_set", key, expected, elen, "expected"));
  DDP_TRY(check_value(s, "compare_set", key, desired, dlen, "desired"));
  if (!result) DDP_FAIL(DDP_ERR_ARG, "store compare_set '%.200s': result is NULL", key);
  *result = NULL;
  if (rlen) *rlen = 0;
  pthread_mutex_lock(&s->mu);
  int st;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_cas(s, key, expected, elen, desired, dlen, result, rlen);
  } else {
    char during[256];
    snprintf(during, sizeof during, "compare_set of key '%.200s'", key);
    const void *args[3] = {key, expected ? expected : "", desired ? desired : ""};
    size_t lens[3] = {strlen(key), elen, dlen};
    reply r;
    st = tcp_call(s, STORE_OP_CAS, 3, args, lens, store_timeout(s), 0, during, &r);
    if (!st) {
      *result = r.data;
      if (rlen) *rlen = r.len;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* Arguments of a WAIT/CHECK: the keys. */
static int keys_call(ddp_store *s, int op, const char *const *keys, int n, double timeout_s,
                     const char *during, reply *r) {
  const void **args = malloc(sizeof *args * (size_t)(n ? n : 1));
  size_t *lens = malloc(sizeof *lens * (size_t)(n ? n : 1));
  if (!args || !lens) {
    free(args);
    free(lens);
    DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory for %d keys", n);
  }
  for (int i = 0; i < n; i++) {
    args[i] = keys[i];
    lens[i] = strlen(keys[i]);
  }
  int st = tcp_call(s, op, n, args, lens, timeout_s, op == STORE_OP_WAIT, during, r);
  free(args);
  free(lens);
  return st;
}

int ddp_store_wait(ddp_store *s, const char *const *keys, int n, double timeout_s) {
  DDP_TRY(check_store(s, "wait"));
  DDP_TRY(check_keys(s, "wait", keys, n));
  if (n == 0) return DDP_OK;
  pthread_mutex_lock(&s->mu);
  if (timeout_s < 0) timeout_s = store_timeout(s);
  int st;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_wait(s, keys, n, timeout_s);
  } else {
    char during[600], list[520];
    snprintf(during, sizeof during, "wait for key%s %s", n > 1 ? "s" : "",
             store_keys_text(keys, n, list, sizeof list));
    reply r;
    st = keys_call(s, STORE_OP_WAIT, keys, n, timeout_s, during, &r);
    if (!st) free(r.data);
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

int ddp_store_check(ddp_store *s, const char *const *keys, int n, int *all_present) {
  DDP_TRY(check_store(s, "check"));
  DDP_TRY(check_keys(s, "check", keys, n));
  if (!all_present) DDP_FAIL(DDP_ERR_ARG, "store check: all_present is NULL");
  *all_present = 0;
  if (n == 0) {
    *all_present = 1;
    return DDP_OK;
  }
  pthread_mutex_lock(&s->mu);
  int st;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_check(s, keys, n, all_present);
  } else {
    char during[600], list[520];
    snprintf(during, sizeof during, "check of %s", store_keys_text(keys, n, list, sizeof list));
    reply r;
    st = keys_call(s, STORE_OP_CHECK, keys, n, store_timeout(s), during, &r);
    if (!st) {
      *all_present = r.len == 1 && r.data[0] == 1;
      free(r.data);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

int ddp_store_delete_key(ddp_store *s, const char *key, int *deleted) {
  DDP_TRY(check_store(s, "delete_key"));
  DDP_TRY(check_key(s, "delete_key", key));
  pthread_mutex_lock(&s->mu);
  int st, d = 0;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_delete(s, key, &d);
  } else {
    char during[256];
    snprintf(during, sizeof during, "delete of key '%.200s'", key);
    const void *args[1] = {key};
    size_t lens[1] = {strlen(key)};
    reply r;
    st = tcp_call(s, STORE_OP_DELETE, 1, args, lens, store_timeout(s), 0, during, &r);
    if (!st) {
      d = r.len == 1 && r.data[0] == 1;
      free(r.data);
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (!st && deleted) *deleted = d;
  return st;
}

int ddp_store_num_keys(ddp_store *s, int64_t *n) {
  DDP_TRY(check_store(s, "num_keys"));
  if (!n) DDP_FAIL(DDP_ERR_ARG, "store num_keys: n is NULL");
  pthread_mutex_lock(&s->mu);
  int st;
  if (s->kind == STORE_KIND_FILE) {
    st = store_file_num_keys(s, n);
  } else {
    reply r;
    st = tcp_call(s, STORE_OP_NUMKEYS, 0, NULL, NULL, s->timeout_s, 0, "num_keys", &r);
    if (!st) {
      if (r.len == 8) *n = (int64_t)store_get_u64(r.data);
      else st = tcp_fail_peer(s, "malformed num_keys reply", "num_keys");
      free(r.data);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

void ddp_store_free(ddp_store *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  if (s->server) store_server_stop(s->server);
  if (s->file) store_file_close(s->file);
  if (s->secret) memset(s->secret, 0, s->secret_len);
  free(s->secret);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
