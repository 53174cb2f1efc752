/* ddplua/store.h: part of the public API, included by ddplua.h only.
 *
 * Store: the key-value rendezvous everything distributed stands on (PyTorch's TCPStore and
 * FileStore). Keys are NUL-terminated strings (1 .. 65535 bytes); values are byte strings
 * (0 .. 1 GiB). Integers kept by ddp_store_add are decimal text, as in PyTorch, so
 * get("counter") after add("counter", 3) gives "3".
 *
 * Threads: every call may come from any thread; each store serialises its calls with a
 * mutex (one request on the connection at a time). A call that waits (get, wait) holds the
 * store for the wait: a second thread that needs to run concurrently with a long wait should
 * use its own store object (a second client connection is cheap), as with PyTorch's TCPStore,
 * whose calls are serialised the same way. ddp_store_set_rank / ddp_store_set_timeout never
 * wait for the mutex.
 *
 * Timeouts: every blocking call ends with DDP_ERR_TIMEOUT after the store's timeout (set at
 * creation, changed with ddp_store_set_timeout; PyTorch's default is 300 s), with a message
 * naming the key(s), the timeout and the rank ("store (rank 1): wait for key 'x' timed out
 * after 2.0 s"). A lost server connection gives DDP_ERR_PEER naming host:port; the store is
 * unusable after that (every later call fails the same way).
 *
 * Errors: DDP_ERR_ARG (NULL/empty key, value over 1 GiB, negative count), DDP_ERR_TIMEOUT,
 * DDP_ERR_PEER (server gone), DDP_ERR_IO (socket or file failure, add on a value that is not
 * an integer or whose sum would overflow int64, a set past the server's memory limit),
 * DDP_ERR_MEMORY.
 */

typedef struct ddp_store ddp_store;

/* Options of a TCP store (ddp_store_tcp_open). Zero fields take the defaults.
 *
 * Security (README, "Security"; Note [store handshake] in runtime/comm/store_wire.h):
 * every connection proves the job's secret before any request, by a challenge-response with
 * HMAC-SHA256; the secret itself never crosses the network. Server and clients must be given
 * the same secret: `secret`, else the environment variable DDPLUA_STORE_SECRET (which the
 * launcher and dl.spawn set for their workers), else none (the empty secret: any process
 * that speaks the protocol gets in; acceptable on a single-user machine only). */
typedef struct ddp_store_tcp_options {
  int is_server;          /* also run the server in this process (a background thread) */
  double timeout_s;       /* > 0: connecting, and the default timeout of later calls */
  int rank;               /* named in messages; -1: none (0 is rank 0: set it explicitly) */
  const char *secret;     /* NUL-terminated, at most 4096 bytes; NULL: $DDPLUA_STORE_SECRET */
  double idle_timeout_s;  /* server: a connection that has not proved the secret, or a
                             partial request that got no byte, this long is closed; 0: 30 s */
  int64_t max_memory;     /* server: bytes of keys, values and buffers; 0: 2 GiB */
  int max_connections;    /* server: connections served at once; 0: the smaller of 1024
                             and half the descriptor limit (RLIMIT_NOFILE) */
} ddp_store_tcp_options;

/* A TCP store client connected to host:port (a name or a numeric address; "" or NULL means
 * 127.0.0.1), after the handshake that proves the secret both ways. With opts->is_server this
 * process also runs the server, listening on `port` at the address `host` names and no other
 * ("127.0.0.1": this machine only; "0.0.0.0" or "::": every interface), with SO_REUSEADDR;
 * port 0 picks a free port (read it back with ddp_store_port). The server's bounds: Note
 * [store bounds] (store_wire.h). Clients retry connecting until timeout_s (the server may
 * start later), then fail with DDP_ERR_TIMEOUT naming host:port and the last socket error.
 * Errors: DDP_ERR_ARG (port out of 0..65535, timeout_s <= 0, port 0 on a client, a secret
 * over 4096 bytes, negative bounds), DDP_ERR_IO (cannot resolve or bind, naming host:port),
 * DDP_ERR_TIMEOUT, DDP_ERR_PEER (the server refused this client's secret, or did not prove
 * its own). */
int ddp_store_tcp_open(ddp_store **out, const char *host, int port, const ddp_store_tcp_options *opts);

/* ddp_store_tcp_open with default options (secret from $DDPLUA_STORE_SECRET), no rank. */
int ddp_store_tcp_new(ddp_store **out, const char *host, int port, int is_server, double timeout_s);

/* As ddp_store_tcp_new, naming `rank` (>= 0; -1: none) in its messages from the start, so a
 * failed connection already says which rank gave up. */
int ddp_store_tcp_new_ranked(ddp_store **out, const char *host, int port, int is_server,
                             double timeout_s, int rank);

/* A fresh job secret: 64 hex digits (256 bits from the kernel's random source) and a NUL
 * into out (cap >= 65). Errors: DDP_ERR_ARG (cap too small), DDP_ERR_IO (no random source). */
int ddp_store_new_secret(char *out, size_t cap);

/* HMAC-SHA256 (RFC 2104, FIPS 180-4) of the mlen bytes at msg under the klen-byte key into
 * out (32 bytes): the keyed hash of the store's handshake, for tools that speak the
 * protocol. */
void ddp_hmac_sha256(unsigned char *out, const void *key, size_t klen, const void *msg, size_t mlen);

/* What the server run by s holds now: *bytes of keys, values and connection buffers, and
 * *connections open (either may be NULL). Errors: DDP_ERR_ARG when s runs no server. */
int ddp_store_server_stats(const ddp_store *s, int64_t *bytes, int *connections);

/* A store kept in the file at `path` (file:// init), shared by every process (and every
 * store object) that opens the same path on a shared file system with working flock().
 * The file is an append-only log of set/delete records; each call takes flock() on it
 * (shared to read, exclusive to write), replays the records added since its last look, and
 * appends its own. Waits poll the file (every 1 .. 20 ms). The file counts its users (a
 * record under an internal key, not counted by num_keys): the last ddp_store_free of the job
 * removes the file, as PyTorch's FileStore does. Errors: DDP_ERR_ARG, DDP_ERR_IO (cannot
 * open or lock, naming the path; a corrupt record, naming path and offset). */
int ddp_store_file_new(ddp_store **out, const char *path, double timeout_s);

/* As ddp_store_file_new, naming `rank` (-1: none) in its messages from the start. */
int ddp_store_file_new_ranked(ddp_store **out, const char *path, double timeout_s, int rank);

/* The TCP port the store is connected to (the server's real port when created with port 0);
 * -1 for a file store or NULL. */
int ddp_store_port(const ddp_store *s);

/* The rank named in error messages ("store (rank 1): ..."); -1 (the default) names none. */
void ddp_store_set_rank(ddp_store *s, int rank);

/* The timeout of later blocking calls, in seconds (> 0). Errors: DDP_ERR_ARG. */
int ddp_store_set_timeout(ddp_store *s, double timeout_s);

/* The store's timeout in seconds. */
double ddp_store_get_timeout(const ddp_store *s);

/* Set key to the `len` bytes at value (value may be NULL when len is 0); wakes waiters. */
int ddp_store_set(ddp_store *s, const char *key, const void *value, size_t len);

/* The value of key, waiting up to the store's timeout for it to be set. On success *value
 * is a malloc'd copy with a NUL byte after the *len bytes (free it with
 * ddp_store_free_value). Errors: DDP_ERR_TIMEOUT naming key, timeout and rank. */
int ddp_store_get(ddp_store *s, const char *key, void **value, size_t *len);

/* Free a value returned by ddp_store_get or ddp_store_compare_set (NULL is ignored). */
void ddp_store_free_value(void *value);

/* Atomically add delta to the integer stored at key (a missing key counts as 0) and return
 * the new value in *result (may be NULL). The value is kept as decimal text. Errors:
 * DDP_ERR_IO when the stored value is not a decimal integer, or when the sum does not fit
 * in int64 (the value stays as it was; PyTorch wraps). */
int ddp_store_add(ddp_store *s, const char *key, int64_t delta, int64_t *result);

/* Atomic compare-and-set, PyTorch's semantics: when the key holds exactly `expected`
 * (elen bytes), or the key is missing and elen == 0, store `desired`; in every case return
 * the value stored afterwards in *result / *rlen (malloc'd, NUL after the bytes, free with
 * ddp_store_free_value; for a missing key that stays missing: `expected` itself). */
int ddp_store_compare_set(ddp_store *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **result, size_t *rlen);

/* Wait until every one of the n keys is set (n >= 0), up to timeout_s seconds (timeout_s < 0:
 * the store's timeout). Errors: DDP_ERR_TIMEOUT naming the keys, the timeout and the rank. */
int ddp_store_wait(ddp_store *s, const char *const *keys, int n, double timeout_s);

/* *all_present = 1 when every one of the n keys is set now, else 0 (never waits). */
int ddp_store_check(ddp_store *s, const char *const *keys, int n, int *all_present);

/* Delete key; *deleted (may be NULL) = 1 when it existed, else 0. */
int ddp_store_delete_key(ddp_store *s, const char *key, int *deleted);

/* Number of keys set now (keys of the store's own bookkeeping excluded). */
int ddp_store_num_keys(ddp_store *s, int64_t *n);

/* Close the connection (or file) and free the store; NULL is ignored. A store that runs the
 * server stops it AT ONCE: clients still connected then fail with DDP_ERR_PEER at their next
 * call, so the job should agree (a barrier, or wait for a "done" key every rank sets) before
 * rank 0 frees its store. */
void ddp_store_free(ddp_store *s);
