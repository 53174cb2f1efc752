/* fuzz/store_requests.c: the store server after authentication (Note [store wire
 * protocol], Note [parked waits], Note [store bounds]): request frames from two
 * authenticated connections, interleaved, through store_conn_space / store_conn_received
 * (the functions the server's read loop runs after recv), on a server with a 1 MiB memory
 * limit. The input is a series of pieces: one control byte (bit 0: which connection; bits
 * 1-7: the piece's length - 1), then that many bytes for it. A connection the server closes
 * (a malformed request) is replaced by a fresh authenticated one. Contract: no crash, leak
 * or undefined behaviour; a closed connection says why. */
#include "store.h"

static store_conn *authed_conn(store_server *srv, unsigned char seed) {
  unsigned char nonce[STORE_NONCE], nc[STORE_NONCE], answer[2 * STORE_NONCE];
  store_conn *c = fuzz_conn(srv, seed, nonce);
  memset(nc, seed ^ 0x5A, sizeof nc);
  fuzz_proof(answer, nonce, nc);
  char why[256] = "";
  int closed = 0;
  fuzz_feed(srv, c, answer, sizeof answer, &closed, why, sizeof why);
  FUZZ_CHECK(!closed, "the right proof was refused: %s", why);
  return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  store_server *srv = fuzz_server(1 << 20);
  store_conn *conns[2] = {authed_conn(srv, 1), authed_conn(srv, 2)};
  unsigned char seeds = 3;
  size_t at = 0;
  while (at < size) {
    int which = data[at] & 1;
    size_t n = (size_t)(data[at] >> 1) + 1;
    at++;
    if (n > size - at) n = size - at;
    char why[256] = "";
    int closed = 0;
    fuzz_feed(srv, conns[which], data + at, n, &closed, why, sizeof why);
    at += n;
    if (closed) {
      FUZZ_CHECK(why[0], "closed without a reason");
      store_server_close_conn(srv, conns[which], NULL);
      conns[which] = authed_conn(srv, seeds++);
    }
  }
  store_server_stop(srv);
  return 0;
}
