/* fuzz/tokens.c: token files (nanoGPT's train.bin / val.bin) through ddp_io_tokens_from_bytes,
 * whose checks are those ddp_io_tokens_open runs on a mapped file, then the windows a
 * language model reads from them (runtime/io/tokens.c, Note [token windows]).
 *
 * Input layout: byte 0 picks vocab_size (1 + byte * 257, so 1 .. 65536 is reachable),
 * byte 1 the block size (1 .. 16), bytes 2..3 a window start (little-endian); the rest is
 * the token file. Contract: an error names the file; a file that opens has (size - 4) / 2
 * tokens, every one below vocab_size; a read or a window at a start the call accepts holds
 * exactly the file's words, and a start outside 0 .. n - T - 1 is refused naming the file. */
#include "fuzz.h"

static const char *NAME = "fuzz_train.bin";

static uint16_t word_at(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  int64_t vocab = 1 + (int64_t)data[0] * 257;
  int64_t T = 1 + data[1] % 16;
  int64_t start = word_at(data + 2);
  const uint8_t *file = data + 4;
  size_t bytes = size - 4;

  ddp_io_tokens *f = NULL;
  int status = ddp_io_tokens_from_bytes(&f, file, bytes, NAME, vocab);
  if (status) {
    fuzz_check_error(status, NAME);
    FUZZ_CHECK(!f, "handle set on failure");
    return 0;
  }
  int64_t n = ddp_io_tokens_count(f);
  FUZZ_CHECK(bytes % 2 == 0 && n == (int64_t)(bytes / 2), "%lld tokens from %zu bytes", (long long)n, bytes);
  for (int64_t i = 0; i < n; i++)
    FUZZ_CHECK(word_at(file + 2 * i) < vocab, "token %lld is %u, vocab %lld", (long long)i,
               (unsigned)word_at(file + 2 * i), (long long)vocab);

  /* read: the whole file, then a range that may overrun it */
  ddp_tensor *t = NULL;
  status = ddp_io_tokens_read(&t, f, 0, n);
  FUZZ_CHECK(status == 0, "reading all %lld tokens failed: %s", (long long)n, ddp_last_error());
  const int64_t *v = ddp_tensor_data(t);
  for (int64_t i = 0; i < n; i++) FUZZ_CHECK(v[i] == word_at(file + 2 * i), "read token %lld", (long long)i);
  ddp_tensor_release(t);
  t = NULL;
  status = ddp_io_tokens_read(&t, f, start, T);
  if (start + T <= n) {
    FUZZ_CHECK(status == 0, "read [%lld, +%lld) of %lld failed", (long long)start, (long long)T, (long long)n);
    ddp_tensor_release(t);
  } else {
    fuzz_check_error(status, NAME);
    FUZZ_CHECK(!t, "read tensor set on failure");
  }

  /* one window at `start` */
  ddp_tensor *x = NULL, *y = NULL;
  status = ddp_io_tokens_windows(&x, &y, f, 1, &start, T);
  if (n >= T + 1 && start <= n - T - 1) {
    FUZZ_CHECK(status == 0, "window at %lld (T %lld, n %lld) failed: %s", (long long)start, (long long)T,
               (long long)n, ddp_last_error());
    const int64_t *xs = ddp_tensor_data(x), *ys = ddp_tensor_data(y);
    for (int64_t j = 0; j < T; j++) {
      FUZZ_CHECK(xs[j] == word_at(file + 2 * (start + j)), "x[%lld]", (long long)j);
      FUZZ_CHECK(ys[j] == word_at(file + 2 * (start + j + 1)), "y[%lld]", (long long)j);
    }
    ddp_tensor_release(x);
    ddp_tensor_release(y);
  } else {
    fuzz_check_error(status, NAME);
    FUZZ_CHECK(!x && !y, "window tensors set on failure");
  }
  ddp_io_tokens_free(f);
  return 0;
}
