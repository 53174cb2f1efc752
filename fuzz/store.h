/* fuzz/store.h: what the store's fuzz targets share: a server engine without sockets
 * (Note [store server engine] in runtime/comm/store_server.c) and feeding bytes to
 * one of its connections the way read_input does after recv. */
#ifndef DDP_FUZZ_STORE_H
#define DDP_FUZZ_STORE_H

#include "comm/store_auth.h"
#include "comm/store_wire.h"
#include "fuzz.h"

#define FUZZ_SECRET "fuzz-job-secret"

/* A server as the launcher makes one, with a small memory limit (so requests that declare
 * large values take the refusal path, not gigabytes). */
static inline store_server *fuzz_server(int64_t max_memory) {
  store_server_config cfg = {(const unsigned char *)FUZZ_SECRET, strlen(FUZZ_SECRET), 30.0,
                             max_memory, 8};
  store_server *srv = NULL;
  FUZZ_CHECK(store_server_new(&srv, &cfg) == 0, "store_server_new: %s", ddp_last_error());
  return srv;
}

/* A connection whose server nonce is `seed` repeated. */
static inline store_conn *fuzz_conn(store_server *srv, unsigned char seed, unsigned char nonce[STORE_NONCE]) {
  memset(nonce, seed, STORE_NONCE);
  store_conn *c = store_server_add_conn(srv, -1, nonce, "fuzz");
  FUZZ_CHECK(c != NULL, "store_server_add_conn");
  return c;
}

/* The client's 64-byte answer to `nonce` that proves FUZZ_SECRET, with client nonce nc. */
static inline void fuzz_proof(unsigned char out[2 * STORE_NONCE], const unsigned char nonce[STORE_NONCE],
                              const unsigned char nc[STORE_NONCE]) {
  const void *parts[3] = {"client", nonce, nc};
  size_t lens[3] = {6, STORE_NONCE, STORE_NONCE};
  if (out != nc) memcpy(out, nc, STORE_NONCE);
  store_hmac_sha256(out + STORE_NONCE, FUZZ_SECRET, strlen(FUZZ_SECRET), parts, lens, 3);
}

/* Feed n bytes to c as recv would deliver them (in the pieces store_conn_space allows).
 * Returns how many were taken before c asked to be closed (then *closed is 1 and `why`
 * holds the reason), else n. Checks that space is never 0. */
static inline size_t fuzz_feed(store_server *srv, store_conn *c, const uint8_t *data, size_t n, int *closed,
                               char *why, size_t cap) {
  size_t at = 0;
  *closed = 0;
  while (at < n) {
    unsigned char *p;
    size_t room;
    if (store_conn_space(srv, c, &p, &room, why, cap)) {
      *closed = 1;
      return at;
    }
    FUZZ_CHECK(room > 0, "store_conn_space offered no room");
    size_t take = n - at < room ? n - at : room;
    memcpy(p, data + at, take);
    at += take;
    if (store_conn_received(srv, c, take, why, cap)) {
      *closed = 1;
      return at;
    }
  }
  return n;
}

#endif
