/* fuzz/store_handshake.c: the store server before authentication (Note [store handshake]):
 * the bytes a connection sends first, through store_conn_space / store_conn_received, the
 * functions the server's read loop runs after recv. Byte 0 chooses the piece size (bits
 * 0-5) and whether the harness writes the correct proof over bytes 33..64 of the input
 * (bit 6: the client nonce is input bytes 1..32, so the bytes after the proof reach the
 * request parser in the same piece as the proof, as from a client that pipelines). Contract:
 * a connection that has not proved the secret is offered at most the 64 bytes of the
 * answer, is closed exactly when a wrong answer is complete, and never earlier. */
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t piece = (data[0] & 63) + 1;
  int prove = (data[0] >> 6) & 1;
  data++;
  size--;
  uint8_t *bytes = malloc(size ? size : 1);
  if (!bytes) return 0;
  if (size) memcpy(bytes, data, size);
  store_server *srv = fuzz_server(1 << 20);
  unsigned char nonce[STORE_NONCE];
  store_conn *c = fuzz_conn(srv, 0xA5, nonce);
  if (prove && size >= 2 * STORE_NONCE) fuzz_proof(bytes, nonce, bytes);
  int right = 0;
  if (size >= 2 * STORE_NONCE) {
    unsigned char want[2 * STORE_NONCE];
    fuzz_proof(want, nonce, bytes); /* the right answer for these first 32 bytes */
    right = memcmp(want, bytes, sizeof want) == 0;
  }
  size_t at = 0;
  char why[256] = "";
  int closed = 0;
  while (at < size && !closed) {
    size_t n = size - at < piece ? size - at : piece;
    size_t took = fuzz_feed(srv, c, bytes + at, n, &closed, why, sizeof why);
    at += took;
    if (!right) {
      FUZZ_CHECK(at <= 2 * STORE_NONCE, "took %zu bytes without the secret", at);
      FUZZ_CHECK(closed == (at == 2 * STORE_NONCE), "closed %d after %zu bytes of a wrong answer", closed, at);
      if (closed) FUZZ_CHECK(strstr(why, "did not prove the job's secret"), "closed for: %s", why);
    }
  }
  if (closed) store_server_close_conn(srv, c, NULL);
  store_server_stop(srv);
  free(bytes);
  return 0;
}
