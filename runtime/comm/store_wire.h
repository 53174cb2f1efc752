/* runtime/comm/store_wire.h: internals of the store (store.c client, store_server.c server,
 * store_file.c file store): the wire protocol, the store struct, small shared helpers.
 *
 * Note [store wire protocol]
 * A connection starts with the handshake (Note [store handshake]); then every integer is
 * little-endian. A request is
 *     u8 opcode | u32 nargs | nargs times (u32 len | len bytes)
 * and a reply is
 *     u8 code | u32 len | len bytes.
 * Requests and their arguments (the server checks the opcode, nargs, every length against
 * the caps below, and closes the connection of a request that breaks them):
 *     SET     key value          -> OK, empty
 *     GET     key                -> OK value; parked until the key is set (Note [parked waits])
 *     ADD     key delta(8 bytes) -> OK new value (8 bytes), or ERR text (value not integer)
 *     CAS     key expected desired -> OK value now stored
 *     WAIT    key...             -> OK, empty; parked until all keys are set
 *     CHECK   key...             -> OK 1 byte (1 = all present)
 *     DELETE  key                -> OK 1 byte (1 = existed)
 *     NUMKEYS                    -> OK 8 bytes
 *     CANCEL                     -> CANCELLED, empty
 *
 * Note [parked waits]
 * GET and WAIT on missing keys are parked on the server (the loop never blocks) and answered
 * when a SET/ADD/CAS provides the last missing key. The client times out on its own: it then
 * sends CANCEL. The server answers every CANCEL with CANCELLED after dropping the parked
 * request, if still parked. Replies keep request order, so the client reads replies until
 * CANCELLED: when the real answer came first (the key arrived just in time) it is used, and
 * the connection stays in step either way. While a request is parked the server accepts only
 * CANCEL from that connection (anything else is a protocol error that closes it).
 *
 * Note [store handshake]
 * Every connection proves the job's secret K (ddp_store_tcp_options.secret, else
 * $DDPLUA_STORE_SECRET, else the empty string) before the server reads any request, without
 * sending K: a challenge-response with HMAC-SHA256 (store_auth.c).
 *     server -> client: "DDPSTOR1" | Ns (32 random bytes)                        40 bytes
 *     client -> server: Nc (32 random bytes) | HMAC(K, "client" | Ns | Nc)        64 bytes
 *     server -> client: HMAC(K, "server" | Ns | Nc)                               32 bytes
 * The server compares the proof in constant time and closes the connection (one line on
 * stderr) on a mismatch; it reads at most those 64 bytes from a connection that has not
 * proved the secret, and closes one that has not done so within the idle timeout. The
 * client checks the server's proof too, so a rank never talks to a server that does not know
 * the secret. Fresh nonces on both sides make a recorded exchange useless for a later one.
 *
 * Note [store bounds]
 * The server's memory is bounded: values and keys in the table plus every connection's
 * buffers stay under max_memory, a request counting for its whole declared size as soon as
 * its lengths arrived (so several requests declared at once cannot pass it together). A
 * request that cannot fit is answered ERR when its lengths arrive and its bytes are read and
 * dropped (the connection stays in step); a SET/ADD/CAS whose value the table cannot take
 * answers ERR; the buffers themselves never grow past the limit (that closes the
 * connection). A partial request that receives no byte for the idle
 * timeout closes its connection. At most max_connections connections are served: at the
 * cap a new connection replaces the oldest one that has not proved the secret (ranks prove
 * it within milliseconds, so silent connections cannot keep them out); when every one has,
 * or when accept() runs out of descriptors (EMFILE, ENFILE), the listener is left out of
 * poll() (new clients wait in the kernel's backlog) until a connection closes or 100 ms
 * passed, so the loop never spins. ADD refuses (ERR) a sum that would not fit in int64.
 */
#ifndef DDP_STORE_WIRE_H
#define DDP_STORE_WIRE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

enum {
  STORE_OP_SET = 1,
  STORE_OP_GET = 2,
  STORE_OP_ADD = 3,
  STORE_OP_CAS = 4,
  STORE_OP_WAIT = 5,
  STORE_OP_CHECK = 6,
  STORE_OP_DELETE = 7,
  STORE_OP_NUMKEYS = 8,
  STORE_OP_CANCEL = 9,
  STORE_OP_LAST = 9,
};

enum { STORE_REPLY_OK = 0, STORE_REPLY_ERR = 1, STORE_REPLY_CANCELLED = 2 };

#define STORE_MAX_KEY ((size_t)65535)         /* bytes of one key */
#define STORE_MAX_VALUE ((size_t)1 << 30)     /* bytes of one value: 1 GiB */
#define STORE_MAX_NARGS 65536u                /* keys of one WAIT/CHECK */
#define STORE_MAX_REQUEST (STORE_MAX_VALUE * 2 + ((size_t)1 << 24)) /* whole request (CAS) */

/* Note [store handshake] */
#define STORE_MAGIC "DDPSTOR1"
#define STORE_MAGIC_LEN 8
#define STORE_NONCE 32
#define STORE_MAX_SECRET ((size_t)4096)       /* bytes of a secret */
/* Note [store bounds]: defaults of ddp_store_tcp_options */
#define STORE_DEFAULT_IDLE_S 30.0
#define STORE_DEFAULT_MAX_MEMORY ((int64_t)2 << 30)
#define STORE_DEFAULT_MAX_CONNS 1024

/* little-endian helpers */
static inline void store_put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t store_get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline void store_put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint64_t store_get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* A growable byte buffer. */
typedef struct store_buf {
  unsigned char *data;
  size_t len, cap;
} store_buf;

int store_buf_reserve(store_buf *b, size_t extra);
int store_buf_append(store_buf *b, const void *p, size_t n);
void store_buf_free(store_buf *b);

/* The in-memory table (server and file store): key -> value, chained hash. */
typedef struct store_entry {
  struct store_entry *next;
  char *key;
  size_t klen;
  unsigned char *value; /* malloc'd, NUL after len bytes */
  size_t vlen;
} store_entry;

typedef struct store_table {
  store_entry **slots;
  size_t nslots, count;
} store_table;

store_entry *store_table_find(store_table *t, const char *key, size_t klen);
/* Set (copying key and value); returns DDP_OK or DDP_ERR_MEMORY. */
int store_table_set(store_table *t, const char *key, size_t klen, const void *v, size_t vlen);
/* 1 when the key existed. */
int store_table_delete(store_table *t, const char *key, size_t klen);
void store_table_clear(store_table *t);

/* Parse the decimal integer held by a value (whole value, optional sign): 0 on success. */
int store_parse_i64(const unsigned char *v, size_t len, int64_t *out);

/* The server (store_server.c). */
typedef struct store_server store_server;
/* What a server is given (Note [store handshake], Note [store bounds]). */
typedef struct store_server_config {
  const unsigned char *secret;
  size_t secret_len;
  double idle_timeout_s;
  int64_t max_memory;
  int max_connections;
} store_server_config;
/* Bind host:port only (port 0: any free port) and start the serving thread. */
int store_server_start(store_server **out, const char *host, int port, const store_server_config *cfg);
/* Bytes held (table and buffers) and connections open now (any thread). */
void store_server_stats(const store_server *srv, int64_t *bytes, int *connections);
int store_server_port(const store_server *srv);
/* Stop the thread (when started), close every connection, free. */
void store_server_stop(store_server *srv);

/* The server's engine without sockets (Note [store server engine], store_server.c). */
typedef struct store_conn store_conn;
/* A server with its table and a copy of cfg's secret, no listener and no thread (what
 * store_server_start builds on). Free it with store_server_stop. */
int store_server_new(store_server **out, const store_server_config *cfg);
/* Add a connection (fd: its socket, or -1 for none) whose handshake starts with `nonce`
 * (STORE_NONCE bytes) and the server's hello queued; peer names it in log lines. NULL when
 * out of memory. */
store_conn *store_server_add_conn(store_server *srv, int fd, const unsigned char nonce[STORE_NONCE],
                                  const char *peer);
/* Where c's next received bytes go: *p, at most *room of them (> 0). -1 (why filled) when
 * the memory limit refuses room: close c. */
int store_conn_space(store_server *srv, store_conn *c, unsigned char **p, size_t *room, char *why,
                     size_t cap);
/* n bytes were written at store_conn_space's *p: check the handshake or run the requests
 * they complete (replies queued on c). 0, or -1 (why filled) to close c. */
int store_conn_received(store_server *srv, store_conn *c, size_t n, char *why, size_t cap);
/* Close c (a line on stderr naming why, unless why is NULL) and free it. */
void store_server_close_conn(store_server *srv, store_conn *c, const char *why);

/* The file store's half (store_file.c). */
typedef struct store_file store_file;

enum { STORE_KIND_TCP = 1, STORE_KIND_FILE = 2 };

struct ddp_store {
  int kind;
  int rank;            /* named in messages; -1: none (atomic access) */
  double timeout_s;    /* default timeout of blocking calls (atomic access) */
  pthread_mutex_t mu;  /* one call at a time (Gloo calls from its own threads) */
  /* TCP */
  int fd;              /* client socket, -1 once broken */
  char host[256];
  int port;
  char broken[256];    /* why the connection is unusable ("" while fine) */
  unsigned char *secret; /* Note [store handshake] (malloc'd; may be empty) */
  size_t secret_len;
  store_server *server;
  /* file */
  store_file *file;
};

/* A second client of TCP store s: its own connection to the same server with the same
 * secret and rank, timeout_s its timeout (connecting included). For a thread whose calls
 * must not wait behind the other threads' calls on s (the stall watcher, Note [stall report
 * store] in pg_recorder.c). A file store has no connection to duplicate: *out = NULL and
 * DDP_OK (use s). Errors: those of ddp_store_tcp_open (the server unreachable within
 * timeout_s: DDP_ERR_TIMEOUT naming host:port). */
int store_tcp_client_like(ddp_store **out, const ddp_store *s, double timeout_s);

/* "store (rank 1)" or "store" into buf. */
const char *store_who(const ddp_store *s, char *buf, size_t cap);

/* The store's timeout (read atomically: ddp_store_set_timeout does not take the mutex). */
double store_timeout(const ddp_store *s);

/* Write the keys as "'a', 'b'" (shortened past a few hundred bytes) for messages. */
const char *store_keys_text(const char *const *keys, int n, char *buf, size_t cap);

/* Seconds on the monotonic clock. */
double store_now(void);

/* File store operations (store_file.c), called under s->mu. */
int store_file_open(store_file **out, const char *path);
void store_file_close(store_file *f);
int store_file_set(ddp_store *s, const char *key, const void *v, size_t len);
int store_file_get(ddp_store *s, const char *key, void **v, size_t *len);
int store_file_add(ddp_store *s, const char *key, int64_t delta, int64_t *result);
int store_file_cas(ddp_store *s, const char *key, const void *e, size_t elen, const void *d,
                   size_t dlen, void **r, size_t *rlen);
int store_file_wait(ddp_store *s, const char *const *keys, int n, double timeout_s);
int store_file_check(ddp_store *s, const char *const *keys, int n, int *all);
int store_file_delete(ddp_store *s, const char *key, int *deleted);
int store_file_num_keys(ddp_store *s, int64_t *n);

#endif
