/* runtime/comm/store_auth.c: SHA-256 (FIPS 180-4 section 6.2), HMAC-SHA256 (RFC 2104)
 * and random bytes for the store's handshake (Note [store handshake], store_wire.h). Written
 * here because the runtime links no crypto library; checked against the FIPS 180-4 example
 * vectors and RFC 4231's HMAC test cases (spec/distributed/store_security_spec.lua). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm/store_auth.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

typedef struct sha256 {
  uint32_t h[8];
  unsigned char block[64];
  size_t fill;    /* bytes in block */
  uint64_t total; /* bytes hashed so far */
} sha256;

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(sha256 *s, const unsigned char *b) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)b[4 * t] << 24 | (uint32_t)b[4 * t + 1] << 16 | (uint32_t)b[4 * t + 2] << 8 |
           (uint32_t)b[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = s->h[0], bb = s->h[1], c = s->h[2], d = s->h[3];
  uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = bb;
    bb = a;
    a = t1 + t2;
  }
  s->h[0] += a;
  s->h[1] += bb;
  s->h[2] += c;
  s->h[3] += d;
  s->h[4] += e;
  s->h[5] += f;
  s->h[6] += g;
  s->h[7] += h;
}

static void sha_init(sha256 *s) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof H0);
  s->fill = 0;
  s->total = 0;
}

static void sha_update(sha256 *s, const void *p, size_t n) {
  const unsigned char *b = p;
  s->total += n;
  while (n) {
    size_t take = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->block + s->fill, b, take);
    s->fill += take;
    b += take;
    n -= take;
    if (s->fill == 64) {
      compress(s, s->block);
      s->fill = 0;
    }
  }
}

/* Padding (FIPS 180-4 5.1.1): a 1 bit, zeros, then the message length in bits, big-endian. */
static void sha_final(sha256 *s, unsigned char out[STORE_SHA256_BYTES]) {
  uint64_t bits = s->total * 8;
  unsigned char pad = 0x80;
  sha_update(s, &pad, 1);
  unsigned char zero = 0;
  while (s->fill != 56) sha_update(s, &zero, 1);
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
  sha_update(s, len, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (unsigned char)(s->h[i] >> 24);
    out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
    out[4 * i + 3] = (unsigned char)s->h[i];
  }
}

void store_sha256(unsigned char out[STORE_SHA256_BYTES], const void *p, size_t n) {
  sha256 s;
  sha_init(&s);
  sha_update(&s, p, n);
  sha_final(&s, out);
}

/* RFC 2104: H((K0 ^ opad) || H((K0 ^ ipad) || text)), K0 the key padded to the 64-byte block
 * (hashed first when longer than a block). */
void store_hmac_sha256(unsigned char out[STORE_SHA256_BYTES], const void *key, size_t klen,
                       const void *const *parts, const size_t *lens, int nparts) {
  unsigned char k0[64] = {0}, pad[64], inner[STORE_SHA256_BYTES];
  if (klen > 64) store_sha256(k0, key, klen);
  else if (klen) memcpy(k0, key, klen);
  sha256 s;
  for (int i = 0; i < 64; i++) pad[i] = k0[i] ^ 0x36;
  sha_init(&s);
  sha_update(&s, pad, 64);
  for (int i = 0; i < nparts; i++) sha_update(&s, parts[i], lens[i]);
  sha_final(&s, inner);
  for (int i = 0; i < 64; i++) pad[i] = k0[i] ^ 0x5c;
  sha_init(&s);
  sha_update(&s, pad, 64);
  sha_update(&s, inner, sizeof inner);
  sha_final(&s, out);
}

int store_equal_ct(const unsigned char *a, const unsigned char *b, size_t n) {
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

int store_random_bytes(void *p, size_t n) {
  unsigned char *b = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(b + got, n - got, 0);
    if (r > 0) got += (size_t)r;
    else if (r < 0 && errno == EINTR) continue;
    else break;
  }
  if (got == n) return 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r > 0) got += (size_t)r;
    else if (r < 0 && errno == EINTR) continue;
    else break;
  }
  close(fd);
  return got == n ? 0 : -1;
}
