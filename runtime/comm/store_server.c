/* runtime/comm/store_server.c: the TCP store server, one poll() loop on a background thread
 * serving many clients. Protocol: Note [store wire protocol]; waits never block the loop:
 * Note [parked waits] (store_wire.h).
 *
 * Every request is length-checked as its bytes arrive (known opcode, argument count, key
 * length 1 .. 64 KiB - 1, value length up to 1 GiB): a request that breaks a rule closes
 * THAT connection, with a line on stderr, and the loop goes on serving the others. Before
 * any request a connection proves the job's secret (Note [store handshake]); memory,
 * connections and idle partial requests are bounded (Note [store bounds]). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store_auth.h"
#include "comm/store_wire.h"

#define LISTEN_PAUSE_S 0.1   /* listener left out of poll() after EMFILE (Note [store bounds]) */
#define ENTRY_OVERHEAD 64    /* bytes counted per table entry besides key and value */
#define BUF_STEP ((size_t)16 << 20) /* input buffers double up to this, then grow by it */

typedef struct store_conn {
  int fd;
  char peer[64];          /* "address:port" for log lines */
  store_buf in, out;
  size_t out_off;         /* bytes of `out` already sent */
  int parked_op;          /* 0, STORE_OP_GET or STORE_OP_WAIT */
  char **parked_keys;     /* keys of the parked request */
  size_t *parked_lens;
  int nparked;
  int authed;             /* proved the secret (Note [store handshake]) */
  unsigned char nonce[STORE_NONCE];     /* the server's challenge */
  unsigned char hs[2 * STORE_NONCE];    /* the client's answer, as it arrives */
  size_t hs_len;
  double accepted_at;     /* store_now() at accept */
  double last_rx;         /* store_now() of the last byte received */
  size_t skip;            /* bytes of a refused request still to discard */
  size_t frame_size;      /* size of the request arriving, once its lengths came (else 0) */
} conn;

struct store_server {
  int listen_fd;
  int wake[2];            /* a byte on wake[1] stops the loop */
  int port;
  pthread_t thread;
  store_table table;
  conn **conns;
  int nconns, capconns;
  store_server_config cfg; /* secret copied into `secret` */
  unsigned char *secret;
  int64_t table_bytes;     /* keys, values and ENTRY_OVERHEAD of the table */
  double listen_paused_until; /* Note [store bounds] */
  int paused_logged;       /* one line per run of accept failures */
  double close_logged_at;  /* store_now() of the last "closing the connection" line */
  long close_suppressed;   /* such lines not written since (Note [store close log]) */
  _Atomic int64_t held;    /* store_server_stats, updated by the loop */
  _Atomic int open_conns;
  int started;             /* the listener and thread exist (store_server_start) */
  unsigned char junk[65536]; /* where a refused request's bytes are received and dropped */
};

/* ---- connections --------------------------------------------------------------------- */

static void unpark(conn *c) {
  for (int i = 0; i < c->nparked; i++) free(c->parked_keys[i]);
  free(c->parked_keys);
  free(c->parked_lens);
  c->parked_keys = NULL;
  c->parked_lens = NULL;
  c->nparked = 0;
  c->parked_op = 0;
}

/* Note [store close log]: a connection closed for a reason is logged. One that never proved
 * the secret (a failed handshake, a silent or idle connection) is logged at most once a
 * second: a client that fails handshakes in a loop wrote 39,953 lines in 5 s. The next such
 * line says how many were left out. A proven connection (a rank of the job) closed for a
 * malformed request is always logged. */
static void log_close(store_server *srv, const conn *c, const char *why) {
  double t = store_now();
  if (c->authed) {
    fprintf(stderr, "ddplua store server (port %d): closing the connection from %s: %s\n", srv->port,
            c->peer, why);
    return;
  }
  if (srv->close_logged_at > 0 && t - srv->close_logged_at < 1.0) {
    srv->close_suppressed++;
    return;
  }
  if (srv->close_suppressed)
    fprintf(stderr, "ddplua store server (port %d): closing the connection from %s: %s (and %ld more "
            "closed, not logged, in the last second)\n", srv->port, c->peer, why, srv->close_suppressed);
  else
    fprintf(stderr, "ddplua store server (port %d): closing the connection from %s: %s\n", srv->port,
            c->peer, why);
  srv->close_logged_at = t;
  srv->close_suppressed = 0;
}

static void conn_close(store_server *srv, int i, const char *why) {
  conn *c = srv->conns[i];
  if (why) log_close(srv, c, why);
  if (c->fd >= 0) close(c->fd);
  unpark(c);
  store_buf_free(&c->in);
  store_buf_free(&c->out);
  free(c);
  srv->conns[i] = srv->conns[--srv->nconns];
}

/* Queue a reply; sending happens in flush. */
static int reply(conn *c, int code, const void *data, size_t len) {
  unsigned char hdr[5];
  hdr[0] = (unsigned char)code;
  store_put_u32(hdr + 1, (uint32_t)len);
  if (store_buf_append(&c->out, hdr, 5) || store_buf_append(&c->out, data, len)) return -1;
  return 0;
}

/* Send what the socket takes now. -1 when the connection failed. */
static int flush(conn *c) {
  while (c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  c->out.len = c->out_off = 0;
  return 0;
}

/* ---- memory (Note [store bounds]) ------------------------------------------------------ */

/* Input bytes a connection holds or has been allowed to fill: its buffer, or the whole of the
 * request arriving once its lengths came (so requests declared at once cannot together
 * pass the limit before their bytes arrive). */
static int64_t input_bytes(const conn *c) {
  return (int64_t)(c->in.cap > c->frame_size ? c->in.cap : c->frame_size);
}

/* Bytes held (or promised to arriving requests) now: the table and every connection. */
static int64_t held_bytes(const store_server *srv) {
  int64_t n = srv->table_bytes;
  for (int i = 0; i < srv->nconns; i++)
    n += input_bytes(srv->conns[i]) + (int64_t)srv->conns[i]->out.cap;
  return n;
}

/* Room for `extra` more input bytes in c, within the server's memory limit. Buffers double up
 * to BUF_STEP, then grow by BUF_STEP (a 1 GiB request does not reserve 2 GiB). */
static int reserve_input(store_server *srv, conn *c, size_t extra, char *why, size_t cap) {
  store_buf *b = &c->in;
  if (b->cap - b->len >= extra) return 0;
  size_t want = b->cap ? b->cap : 4096;
  while (want - b->len < extra) want = want < BUF_STEP ? want * 2 : want + BUF_STEP;
  /* The arriving request's size is known: no more than it (and one read) is needed. */
  size_t exact = c->frame_size > b->len + extra ? c->frame_size : b->len + extra;
  if (c->frame_size && want > exact) want = exact;
  int64_t after = held_bytes(srv) - input_bytes(c) + (int64_t)(want > c->frame_size ? want : c->frame_size);
  if (after > srv->cfg.max_memory) {
    snprintf(why, cap, "the store would hold %lld bytes, over its limit of %lld (a request of %zu bytes so far)",
             (long long)after, (long long)srv->cfg.max_memory, b->len);
    return -1;
  }
  unsigned char *p = realloc(b->data, want);
  if (!p) {
    snprintf(why, cap, "out of memory");
    return -1;
  }
  b->data = p;
  b->cap = want;
  return 0;
}

/* Drop big idle buffers so memory held follows what is in flight. */
static void trim_buffers(conn *c) {
  if (c->in.len == 0 && c->in.cap > 65536 * 2) store_buf_free(&c->in);
  if (c->out.len == 0 && c->out.cap > 65536 * 2) store_buf_free(&c->out);
}

/* Set a key in the table within the memory limit (the request's own input buffer is not
 * counted: it is released once the request is served). 1: over the limit (why filled),
 * -1: out of memory, 0: done. */
static int table_put(store_server *srv, conn *c, const char *key, size_t klen, const void *v,
                     size_t vlen, char *why, size_t cap) {
  store_entry *e = store_table_find(&srv->table, key, klen);
  int64_t old = e ? (int64_t)(e->klen + e->vlen + ENTRY_OVERHEAD) : 0;
  int64_t add = (int64_t)(klen + vlen + ENTRY_OVERHEAD);
  int64_t after = held_bytes(srv) - input_bytes(c) - old + add;
  if (after > srv->cfg.max_memory) {
    snprintf(why, cap, "the store's memory limit of %lld bytes would be passed (it holds %lld; this value is %zu bytes)",
             (long long)srv->cfg.max_memory, (long long)held_bytes(srv), vlen);
    return 1;
  }
  if (store_table_set(&srv->table, key, klen, v, vlen)) return -1;
  srv->table_bytes += add - old;
  return 0;
}

/* ---- request parsing ----------------------------------------------------------------- */

typedef struct request {
  int op;
  uint32_t nargs;
  const unsigned char **args; /* pointers into the connection's input buffer */
  size_t *lens;
  size_t size;                /* bytes of the whole request */
} request;

/* Argument count rules: exact count, or 1 .. STORE_MAX_NARGS keys for WAIT/CHECK. */
static int nargs_ok(int op, uint32_t n) {
  switch (op) {
    case STORE_OP_SET: return n == 2;
    case STORE_OP_GET: return n == 1;
    case STORE_OP_ADD: return n == 2;
    case STORE_OP_CAS: return n == 3;
    case STORE_OP_WAIT:
    case STORE_OP_CHECK: return n >= 1 && n <= STORE_MAX_NARGS;
    case STORE_OP_DELETE: return n == 1;
    case STORE_OP_NUMKEYS:
    case STORE_OP_CANCEL: return n == 0;
    default: return 0;
  }
}

/* Is argument i of op a key (1 .. MAX_KEY bytes) rather than a value? */
static int arg_is_key(int op, uint32_t i) {
  return i == 0 || op == STORE_OP_WAIT || op == STORE_OP_CHECK;
}

/* Parse one request from the start of buf. Returns 1 (complete, *r filled: args arrays
 * malloc'd), 0 (need more bytes; r->size is the request's size once every length arrived,
 * else 0) or -1 (malformed: `why` says how). Checks run on the
 * prefix that has arrived, so an oversized length is refused before its bytes come. */
static int parse(const unsigned char *buf, size_t len, request *r, char *why, size_t cap) {
  if (len < 5) return 0;
  r->op = buf[0];
  r->nargs = store_get_u32(buf + 1);
  if (r->op < 1 || r->op > STORE_OP_LAST) {
    snprintf(why, cap, "unknown opcode %d", r->op);
    return -1;
  }
  if (!nargs_ok(r->op, r->nargs)) {
    snprintf(why, cap, "opcode %d with %u arguments", r->op, r->nargs);
    return -1;
  }
  size_t off = 5, total = 5;
  for (uint32_t i = 0; i < r->nargs; i++) {
    if (len < off + 4) return 0;
    size_t n = store_get_u32(buf + off);
    if (arg_is_key(r->op, i) && (n == 0 || n > STORE_MAX_KEY)) {
      snprintf(why, cap, "key of %zu bytes (1 .. %zu allowed)", n, STORE_MAX_KEY);
      return -1;
    }
    if (n > STORE_MAX_VALUE) {
      snprintf(why, cap, "value of %zu bytes (1 GiB allowed)", n);
      return -1;
    }
    if (r->op == STORE_OP_ADD && i == 1 && n != 8) {
      snprintf(why, cap, "add with a %zu-byte delta (8 expected)", n);
      return -1;
    }
    total += 4 + n;
    if (total > STORE_MAX_REQUEST) {
      snprintf(why, cap, "request of more than %zu bytes", (size_t)STORE_MAX_REQUEST);
      return -1;
    }
    if (i + 1 == r->nargs) r->size = total; /* every length known: the whole request's size */
    if (len < off + 4 + n) return 0;
    off += 4 + n;
  }
  r->size = off;
  r->args = malloc(sizeof *r->args * (r->nargs ? r->nargs : 1));
  r->lens = malloc(sizeof *r->lens * (r->nargs ? r->nargs : 1));
  if (!r->args || !r->lens) {
    free(r->args);
    free(r->lens);
    snprintf(why, cap, "out of memory");
    return -1;
  }
  off = 5;
  for (uint32_t i = 0; i < r->nargs; i++) {
    r->lens[i] = store_get_u32(buf + off);
    r->args[i] = buf + off + 4;
    off += 4 + r->lens[i];
  }
  return 1;
}

/* ---- serving ------------------------------------------------------------------------- */

static int all_present(store_server *srv, conn *c) {
  for (int i = 0; i < c->nparked; i++)
    if (!store_table_find(&srv->table, c->parked_keys[i], c->parked_lens[i])) return 0;
  return 1;
}

/* Answer a parked request whose keys are all set now. */
static int answer_parked(store_server *srv, conn *c) {
  int rc = 0;
  if (c->parked_op == STORE_OP_GET) {
    store_entry *e = store_table_find(&srv->table, c->parked_keys[0], c->parked_lens[0]);
    rc = reply(c, STORE_REPLY_OK, e->value, e->vlen);
  } else {
    rc = reply(c, STORE_REPLY_OK, NULL, 0);
  }
  unpark(c);
  return rc;
}

/* A key was set: answer the parked requests it completes. */
static void wake_waiters(store_server *srv, const char *key, size_t klen) {
  for (int i = 0; i < srv->nconns; i++) {
    conn *c = srv->conns[i];
    if (!c->parked_op) continue;
    int mentions = 0;
    for (int k = 0; k < c->nparked && !mentions; k++)
      mentions = c->parked_lens[k] == klen && memcmp(c->parked_keys[k], key, klen) == 0;
    if (mentions && all_present(srv, c)) answer_parked(srv, c);
  }
}

static int park(conn *c, const request *r) {
  c->parked_keys = calloc(r->nargs, sizeof *c->parked_keys);
  c->parked_lens = calloc(r->nargs, sizeof *c->parked_lens);
  if (!c->parked_keys || !c->parked_lens) return -1;
  c->parked_op = r->op;
  for (uint32_t i = 0; i < r->nargs; i++) {
    c->parked_keys[i] = malloc(r->lens[i] + 1);
    if (!c->parked_keys[i]) return -1;
    memcpy(c->parked_keys[i], r->args[i], r->lens[i]);
    c->parked_keys[i][r->lens[i]] = 0;
    c->parked_lens[i] = r->lens[i];
    c->nparked = (int)i + 1;
  }
  return 0;
}

/* Run one request. Returns 0, or -1 to close the connection (why filled). */
static int serve(store_server *srv, conn *c, const request *r, char *why, size_t cap) {
  const char *key = r->nargs ? (const char *)r->args[0] : NULL;
  size_t klen = r->nargs ? r->lens[0] : 0;
  if (c->parked_op && r->op != STORE_OP_CANCEL) {
    snprintf(why, cap, "opcode %d while a wait is parked (only cancel is allowed)", r->op);
    return -1;
  }
  int rc = 0;
  switch (r->op) {
    case STORE_OP_SET: {
      char msg[300];
      int t = table_put(srv, c, key, klen, r->args[1], r->lens[1], msg, sizeof msg);
      if (t < 0) goto oom;
      if (t > 0) {
        rc = reply(c, STORE_REPLY_ERR, msg, strlen(msg));
        break;
      }
      rc = reply(c, STORE_REPLY_OK, NULL, 0);
      wake_waiters(srv, key, klen);
      break;
    }
    case STORE_OP_GET:
    case STORE_OP_WAIT: {
      if (park(c, r)) goto oom;
      if (all_present(srv, c)) rc = answer_parked(srv, c);
      break;
    }
    case STORE_OP_ADD: {
      int64_t cur = 0, delta = (int64_t)store_get_u64(r->args[1]);
      store_entry *e = store_table_find(&srv->table, key, klen);
      if (e && store_parse_i64(e->value, e->vlen, &cur)) {
        char msg[200];
        int n = snprintf(msg, sizeof msg, "the value is not a decimal integer (%zu bytes: '%.40s')",
                         e->vlen, (const char *)e->value);
        rc = reply(c, STORE_REPLY_ERR, msg, (size_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1));
        break;
      }
      int64_t now;
      if (__builtin_add_overflow(cur, delta, &now)) {  // an error, never a wrap (PyTorch wraps)
        char msg[200];
        int n = snprintf(msg, sizeof msg, "adding %lld to %lld overflows a 64-bit integer (the value is unchanged)",
                         (long long)delta, (long long)cur);
        rc = reply(c, STORE_REPLY_ERR, msg, (size_t)n);
        break;
      }
      char text[32], msg[300];
      int n = snprintf(text, sizeof text, "%lld", (long long)now);
      int t = table_put(srv, c, key, klen, text, (size_t)n, msg, sizeof msg);
      if (t < 0) goto oom;
      if (t > 0) {
        rc = reply(c, STORE_REPLY_ERR, msg, strlen(msg));
        break;
      }
      unsigned char out[8];
      store_put_u64(out, (uint64_t)now);
      rc = reply(c, STORE_REPLY_OK, out, 8);
      wake_waiters(srv, key, klen);
      break;
    }
    case STORE_OP_CAS: {
      store_entry *e = store_table_find(&srv->table, key, klen);
      const unsigned char *exp = r->args[1], *des = r->args[2];
      size_t elen = r->lens[1], dlen = r->lens[2];
      if ((!e && elen == 0) ||
          (e && e->vlen == elen && (elen == 0 || memcmp(e->value, exp, elen) == 0))) {
        char msg[300];
        int t = table_put(srv, c, key, klen, des, dlen, msg, sizeof msg);
        if (t < 0) goto oom;
        if (t > 0) {
          rc = reply(c, STORE_REPLY_ERR, msg, strlen(msg));
          break;
        }
        rc = reply(c, STORE_REPLY_OK, des, dlen);
        wake_waiters(srv, key, klen);
      } else if (e) {
        rc = reply(c, STORE_REPLY_OK, e->value, e->vlen);
      } else {
        rc = reply(c, STORE_REPLY_OK, exp, elen);  // missing key, non-empty expected: PyTorch
      }
      break;
    }
    case STORE_OP_CHECK: {
      unsigned char all = 1;
      for (uint32_t i = 0; i < r->nargs && all; i++)
        all = store_table_find(&srv->table, (const char *)r->args[i], r->lens[i]) != NULL;
      rc = reply(c, STORE_REPLY_OK, &all, 1);
      break;
    }
    case STORE_OP_DELETE: {
      store_entry *e = store_table_find(&srv->table, key, klen);
      if (e) srv->table_bytes -= (int64_t)(e->klen + e->vlen + ENTRY_OVERHEAD);
      unsigned char d = (unsigned char)store_table_delete(&srv->table, key, klen);
      rc = reply(c, STORE_REPLY_OK, &d, 1);
      break;
    }
    case STORE_OP_NUMKEYS: {
      unsigned char out[8];
      store_put_u64(out, (uint64_t)srv->table.count);
      rc = reply(c, STORE_REPLY_OK, out, 8);
      break;
    }
    case STORE_OP_CANCEL:
      unpark(c);
      rc = reply(c, STORE_REPLY_CANCELLED, NULL, 0);
      break;
  }
  if (rc) goto oom;
  return 0;
oom:
  snprintf(why, cap, "out of memory serving opcode %d", r->op);
  return -1;
}

/* Run every complete request in c's input. -1 closes the connection. */
static int process_input(store_server *srv, conn *c, char *why, size_t cap) {
  size_t off = 0;
  int rc = 0;
  for (;;) {
    request r = {0};
    int p = parse(c->in.data + off, c->in.len - off, &r, why, cap);
    if (p < 0) {
      rc = -1;
      break;
    }
    c->frame_size = p == 0 ? r.size : 0;
    if (p == 0) {
      /* A request that cannot fit is refused before its bytes come: answer ERR and discard
       * them as they arrive (Note [store bounds]); the connection stays in step. */
      int64_t after = held_bytes(srv) - input_bytes(c) + (int64_t)r.size;
      if (r.size && after > srv->cfg.max_memory) {
        char msg[300];
        int n = snprintf(msg, sizeof msg, "a request of %zu bytes would pass the store's memory limit "
                         "of %lld bytes (it holds %lld)", r.size, (long long)srv->cfg.max_memory,
                         (long long)held_bytes(srv));
        if (reply(c, STORE_REPLY_ERR, msg, (size_t)n)) {
          snprintf(why, cap, "out of memory");
          rc = -1;
          break;
        }
        size_t have = c->in.len - off;
        c->skip = r.size - have;
        c->frame_size = 0;
        off = c->in.len;
      }
      break;
    }
    rc = serve(srv, c, &r, why, cap);
    free(r.args);
    free(r.lens);
    off += r.size;
    if (rc) break;
  }
  if (off) {
    memmove(c->in.data, c->in.data + off, c->in.len - off);
    c->in.len -= off;
  }
  return rc;
}

/* The client's answer to the challenge is complete: check it, answer with the server's proof.
 * Note [store handshake]. */
static int finish_handshake(store_server *srv, conn *c, char *why, size_t cap) {
  const unsigned char *nc = c->hs, *proof = c->hs + STORE_NONCE;
  unsigned char want[STORE_SHA256_BYTES], mine[STORE_SHA256_BYTES];
  const void *parts[3] = {"client", c->nonce, nc};
  size_t lens[3] = {6, STORE_NONCE, STORE_NONCE};
  store_hmac_sha256(want, srv->secret, srv->cfg.secret_len, parts, lens, 3);
  if (!store_equal_ct(want, proof, sizeof want)) {
    snprintf(why, cap, "it did not prove the job's secret (authentication failed; check DDPLUA_STORE_SECRET)");
    return -1;
  }
  parts[0] = "server";
  store_hmac_sha256(mine, srv->secret, srv->cfg.secret_len, parts, lens, 3);
  if (store_buf_append(&c->out, mine, sizeof mine)) {
    snprintf(why, cap, "out of memory");
    return -1;
  }
  c->authed = 1;
  return 0;
}

/* Note [store server engine]: the server's protocol (handshake, request parsing, serving,
 * the memory bounds) runs on bytes, not sockets: read_input asks store_conn_space where the
 * next bytes of a connection go (the rest of the client's handshake answer, never more, on
 * a connection that has not proved the secret; the discard area for a refused request's
 * bytes; else the input buffer, within the memory limit), receives into it, and hands the
 * count to store_conn_received, which checks the proof or runs every complete request.
 * The fuzz targets (fuzz/store_handshake.c, fuzz/store_requests.c) drive the same two
 * functions with their own bytes, on a server made by store_server_new (no listener, no
 * thread), so what they exercise is what a connection runs. */
int store_conn_space(store_server *srv, store_conn *c, unsigned char **p, size_t *room, char *why,
                     size_t cap) {
  if (!c->authed) {
    *p = c->hs + c->hs_len;
    *room = sizeof c->hs - c->hs_len;
    return 0;
  }
  if (c->skip) {
    *p = srv->junk;
    *room = c->skip < sizeof srv->junk ? c->skip : sizeof srv->junk;
    return 0;
  }
  if (reserve_input(srv, c, 65536, why, cap)) return -1;
  *p = c->in.data + c->in.len;
  *room = c->in.cap - c->in.len;
  return 0;
}

int store_conn_received(store_server *srv, store_conn *c, size_t n, char *why, size_t cap) {
  if (n == 0) return 0;
  c->last_rx = store_now();
  if (!c->authed) {
    c->hs_len += n;
    return c->hs_len == sizeof c->hs ? finish_handshake(srv, c, why, cap) : 0;
  }
  if (c->skip) {
    c->skip -= n;
    if (!c->skip) c->in.len = 0; /* nothing of it was kept */
    return 0;
  }
  c->in.len += n;
  return process_input(srv, c, why, cap);
}

/* Read what is there. -1 closes (why filled, or "" for an orderly close). */
static int read_input(store_server *srv, conn *c, char *why, size_t cap) {
  for (;;) {
    unsigned char *p;
    size_t room;
    if (store_conn_space(srv, c, &p, &room, why, cap)) return -1;
    ssize_t n = recv(c->fd, p, room, 0);
    if (n > 0) {
      if (store_conn_received(srv, c, (size_t)n, why, cap)) return -1;
      continue;
    }
    if (n == 0) {
      if (!c->authed) snprintf(why, cap, "it closed the connection before proving the job's secret");
      else why[0] = 0;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    snprintf(why, cap, "recv: %s", strerror(errno));
    return -1;
  }
}

/* Leave the listener out of poll() for LISTEN_PAUSE_S (Note [store bounds]). */
static void pause_listener(store_server *srv, const char *why) {
  srv->listen_paused_until = store_now() + LISTEN_PAUSE_S;
  if (!srv->paused_logged)
    fprintf(stderr, "ddplua store server (port %d): not accepting connections for now: %s\n",
            srv->port, why);
  srv->paused_logged = 1;
}

/* The connection that has waited longest without proving the secret; -1 if none. */
static int oldest_unauthenticated(const store_server *srv) {
  int best = -1;
  for (int i = 0; i < srv->nconns; i++)
    if (!srv->conns[i]->authed && (best < 0 || srv->conns[i]->accepted_at < srv->conns[best]->accepted_at))
      best = i;
  return best;
}

/* At the connection cap, a new connection replaces the oldest one that has not proved the
 * secret (a genuine rank proves it within milliseconds), so connections that never answer
 * cannot keep the ranks out. 1 when there is room now. */
static int make_room(store_server *srv) {
  if (srv->nconns < srv->cfg.max_connections) return 1;
  int i = oldest_unauthenticated(srv);
  if (i < 0) return 0;
  conn_close(srv, i, "the connection cap is reached and it has not proved the job's secret");
  return 1;
}

static void accept_all(store_server *srv) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      pause_listener(srv, strerror(errno)); /* EMFILE, ENFILE, ENOBUFS, ENOMEM */
      return;
    }
    srv->paused_logged = 0;
    if (!make_room(srv)) {
      close(fd);
      char why[96];
      snprintf(why, sizeof why, "%d connections open (the limit)", srv->nconns);
      pause_listener(srv, why);
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char nonce[STORE_NONCE];
    if (store_random_bytes(nonce, sizeof nonce)) {
      fprintf(stderr, "ddplua store server (port %d): cannot start a handshake (no random bytes)\n", srv->port);
      close(fd);
      continue;
    }
    char host[48] = "?", serv[16] = "?", peer[64];
    getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    const char *h = strncmp(host, "::ffff:", 7) == 0 ? host + 7 : host;  // IPv4 on the v6 socket
    snprintf(peer, sizeof peer, "%s:%s", h, serv);
    conn *c = store_server_add_conn(srv, fd, nonce, peer);
    if (!c) {
      fprintf(stderr, "ddplua store server (port %d): out of memory for a connection\n", srv->port);
      close(fd);
      continue;
    }
    flush(c);
  }
}

store_conn *store_server_add_conn(store_server *srv, int fd, const unsigned char nonce[STORE_NONCE],
                                  const char *peer) {
  if (srv->nconns == srv->capconns) {
    int cap = srv->capconns ? srv->capconns * 2 : 16;
    conn **p = realloc(srv->conns, sizeof *p * (size_t)cap);
    if (!p) return NULL;
    srv->conns = p;
    srv->capconns = cap;
  }
  conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->accepted_at = c->last_rx = store_now();
  memcpy(c->nonce, nonce, STORE_NONCE);
  if (store_buf_append(&c->out, STORE_MAGIC, STORE_MAGIC_LEN) ||
      store_buf_append(&c->out, c->nonce, sizeof c->nonce)) {
    store_buf_free(&c->out);
    free(c);
    return NULL;
  }
  snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "?");
  srv->conns[srv->nconns++] = c;
  return c;
}

void store_server_close_conn(store_server *srv, store_conn *c, const char *why) {
  for (int i = 0; i < srv->nconns; i++)
    if (srv->conns[i] == c) {
      conn_close(srv, i, why);
      return;
    }
}

/* Close connections that have not proved the secret within the idle timeout, and those
 * whose partial request got no byte for the idle timeout. Returns the ms until the next such
 * deadline (-1: none). */
static int expire_idle(store_server *srv, double now) {
  double next = -1, idle = srv->cfg.idle_timeout_s;
  for (int i = srv->nconns - 1; i >= 0; i--) {
    conn *c = srv->conns[i];
    double due;
    const char *why;
    if (!c->authed) {
      due = c->accepted_at + idle;
      why = "it did not prove the job's secret within the idle timeout";
    } else if (c->in.len > 0 || c->skip > 0) {
      due = c->last_rx + idle;
      why = "a partial request got no byte for the idle timeout";
    } else {
      continue;
    }
    if (now >= due) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s (%.1f s)", why, idle);
      conn_close(srv, i, msg);
    } else if (next < 0 || due < next) {
      next = due;
    }
  }
  return next < 0 ? -1 : (int)((next - now) * 1000) + 1;
}

static void *server_main(void *arg) {
  store_server *srv = arg;
  struct pollfd *pfds = NULL;
  int cap = 0;
  for (;;) {
    int n = srv->nconns + 2;
    if (n > cap) {
      struct pollfd *p = realloc(pfds, sizeof *p * (size_t)n * 2);
      if (!p) {
        fprintf(stderr, "ddplua store server (port %d): out of memory; stopping\n", srv->port);
        break;
      }
      pfds = p;
      cap = n * 2;
    }
    double now = store_now();
    int ms = expire_idle(srv, now);
    int full = srv->nconns >= srv->cfg.max_connections && oldest_unauthenticated(srv) < 0;
    int listening = !full && now >= srv->listen_paused_until;
    if (!listening && !full) {
      int pause_ms = (int)((srv->listen_paused_until - now) * 1000) + 1;
      if (ms < 0 || pause_ms < ms) ms = pause_ms;
    }
    atomic_store_explicit(&srv->held, held_bytes(srv), memory_order_relaxed);
    atomic_store_explicit(&srv->open_conns, srv->nconns, memory_order_relaxed);
    pfds[0] = (struct pollfd){srv->wake[0], POLLIN, 0};
    pfds[1] = (struct pollfd){listening ? srv->listen_fd : -1, POLLIN, 0};
    int nc = srv->nconns;
    for (int i = 0; i < nc; i++) {
      conn *c = srv->conns[i];
      pfds[i + 2] = (struct pollfd){c->fd, (short)(POLLIN | (c->out.len > c->out_off ? POLLOUT : 0)), 0};
    }
    if (poll(pfds, (nfds_t)(nc + 2), ms) < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "ddplua store server (port %d): poll: %s; stopping\n", srv->port, strerror(errno));
      break;
    }
    if (pfds[0].revents) break;
    /* Connections first (indices stay valid: closing moves the last one into the hole, so walk
     * backwards), then new ones. */
    for (int i = nc - 1; i >= 0; i--) {
      conn *c = srv->conns[i];
      char why[200] = "";
      int bad = 0;
      if (pfds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) bad = read_input(srv, c, why, sizeof why);
      if (!bad && flush(c)) snprintf(why, sizeof why, "send: %s", strerror(errno)), bad = -1;
      if (bad) conn_close(srv, i, why[0] ? why : NULL);
      else trim_buffers(c);
    }
    /* Replies queued for other connections (wake_waiters) go out now. */
    for (int i = srv->nconns - 1; i >= 0; i--)
      if (srv->conns[i]->out.len > srv->conns[i]->out_off && flush(srv->conns[i]))
        conn_close(srv, i, "send failed");
    if (listening && (pfds[1].revents & POLLIN)) accept_all(srv);
  }
  free(pfds);
  return NULL;
}

/* ---- start / stop -------------------------------------------------------------------- */

/* Listen on host:port and nothing else: the first address host resolves to here (IPv4
 * first), so "127.0.0.1" or "localhost" is reachable from this machine only; "0.0.0.0" (or
 * "::", dual-stack) asks for every interface. A multi-node job gives an address of this
 * machine that the other nodes reach (README, "Security"). */
static int open_listener(const char *host, int port, int *out_fd, char *err, size_t cap) {
  struct addrinfo hints = {0}, *res = NULL;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int rc = getaddrinfo(host, portstr, &hints, &res);
  if (rc) {
    snprintf(err, cap, "cannot resolve the address: %s", gai_strerror(rc));
    return -1;
  }
  snprintf(err, cap, "no address");
  int done = -1;
  for (int pass = 0; pass < 2 && done < 0; pass++) {
    for (struct addrinfo *ai = res; ai && done < 0; ai = ai->ai_next) {
      if ((ai->ai_family == AF_INET) != (pass == 0)) continue;
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        snprintf(err, cap, "socket: %s", strerror(errno));
        continue;
      }
      int one = 1, zero = 0;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (ai->ai_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ai->ai_addr;
        int any = memcmp(&a6->sin6_addr, &in6addr_any, sizeof in6addr_any) == 0;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, any ? &zero : &one, sizeof one);
      }
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 512) == 0) {
        *out_fd = fd;
        done = 0;
        break;
      }
      int e = errno;
      snprintf(err, cap, "%s", strerror(e));
      close(fd);
      if (e == EADDRINUSE) {
        freeaddrinfo(res);
        return -1;
      }
    }
  }
  freeaddrinfo(res);
  return done;
}

int store_server_new(store_server **out, const store_server_config *cfg) {
  *out = NULL;
  store_server *srv = calloc(1, sizeof *srv);
  if (!srv) DDP_FAIL(DDP_ERR_MEMORY, "store server: out of memory");
  srv->listen_fd = srv->wake[0] = srv->wake[1] = -1;
  srv->cfg = *cfg;
  srv->secret = malloc(cfg->secret_len ? cfg->secret_len : 1);
  if (!srv->secret) {
    free(srv);
    DDP_FAIL(DDP_ERR_MEMORY, "store server: out of memory");
  }
  if (cfg->secret_len) memcpy(srv->secret, cfg->secret, cfg->secret_len);
  srv->cfg.secret = srv->secret;
  *out = srv;
  return DDP_OK;
}

int store_server_start(store_server **out, const char *host, int port, const store_server_config *cfg) {
  *out = NULL;
  store_server *srv = NULL;
  DDP_TRY(store_server_new(&srv, cfg));
  char err[160] = "";
  if (open_listener(host, port, &srv->listen_fd, err, sizeof err)) {
    store_server_stop(srv);
    DDP_FAIL(DDP_ERR_IO, "store server: cannot listen on %s:%d (%s)", host, port, err);
  }
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  getsockname(srv->listen_fd, (struct sockaddr *)&sa, &sl);
  srv->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                             : ((struct sockaddr_in *)&sa)->sin_port);
  if (pipe2(srv->wake, O_CLOEXEC) != 0) {
    int e = errno;
    srv->wake[0] = srv->wake[1] = -1;
    store_server_stop(srv);
    DDP_FAIL(DDP_ERR_IO, "store server: pipe: %s", strerror(e));
  }
  int rc = pthread_create(&srv->thread, NULL, server_main, srv);
  if (rc) {
    store_server_stop(srv);
    DDP_FAIL(DDP_ERR_IO, "store server: cannot start its thread: %s", strerror(rc));
  }
  srv->started = 1;
  *out = srv;
  return DDP_OK;
}

void store_server_stats(const store_server *srv, int64_t *bytes, int *connections) {
  if (bytes) *bytes = atomic_load_explicit(&srv->held, memory_order_relaxed);
  if (connections) *connections = atomic_load_explicit(&srv->open_conns, memory_order_relaxed);
}

int store_server_port(const store_server *srv) { return srv->port; }

void store_server_stop(store_server *srv) {
  if (!srv) return;
  if (srv->started) {
    ssize_t w;
    do w = write(srv->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(srv->thread, NULL);
  }
  while (srv->nconns) conn_close(srv, srv->nconns - 1, NULL);
  free(srv->conns);
  store_table_clear(&srv->table);
  if (srv->listen_fd >= 0) close(srv->listen_fd);
  if (srv->wake[0] >= 0) close(srv->wake[0]);
  if (srv->wake[1] >= 0) close(srv->wake[1]);
  if (srv->secret) memset(srv->secret, 0, srv->cfg.secret_len);
  free(srv->secret);
  free(srv);
}
