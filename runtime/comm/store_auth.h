/* runtime/comm/store_auth.h: the store's authentication primitives (store_auth.c):
 * SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), a constant-time comparison and random bytes.
 * Used by the TCP store's handshake (Note [store handshake], store_wire.h). */
#ifndef DDP_STORE_AUTH_H
#define DDP_STORE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define STORE_SHA256_BYTES 32

/* out = SHA-256 of the n bytes at p. */
void store_sha256(unsigned char out[STORE_SHA256_BYTES], const void *p, size_t n);

/* out = HMAC-SHA256(key, the concatenation of the nparts parts). */
void store_hmac_sha256(unsigned char out[STORE_SHA256_BYTES], const void *key, size_t klen,
                       const void *const *parts, const size_t *lens, int nparts);

/* 1 when the n bytes at a and b are equal; the time taken does not depend on where they
 * differ. */
int store_equal_ct(const unsigned char *a, const unsigned char *b, size_t n);

/* Fill p with n bytes from the kernel's random source (getrandom, else /dev/urandom).
 * Returns 0, or -1 when neither works. */
int store_random_bytes(void *p, size_t n);

#endif
