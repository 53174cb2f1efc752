/* runtime/io/tokens.c: token files as nanoGPT's data/<name>/prepare.py writes them
 * (train.bin / val.bin: the token ids as raw little-endian uint16, no header), memory-mapped
 * for reading, written atomically, and the (B, T) windows a language model trains on. The same
 * checks run on bytes in memory (ddp_io_tokens_from_bytes: what fuzz/tokens.c feeds).
 *
 * Note [token windows]: a window starting at token i of a file of n tokens is
 *   x[t] = tokens[i + t], y[t] = tokens[i + t + 1]   for t in 0 .. T-1,
 * so i runs over 0 .. n - T - 1 (n - T starts, nanoGPT's torch.randint(len(data) - block_size)).
 * Random windows draw their starts from Philox: window b of a draw uses block (seed, base + b)
 * of the generator (taken with ddp_generator_take, so g moves on by B blocks), start =
 * (w0 + 2^32 w1) mod (n - T). The modulo bias is below (n - T) / 2^64: nil for any file.
 * Every window depends only on (seed, base + b): the same generator state gives the same
 * batch on any thread count.
 *
 * Note [mapped token files]: the file stays mapped while its ddp_io_tokens lives. Writers
 * replace token files by rename (ddp_io_tokens_write), which leaves an open mapping on the
 * old file intact; a file truncated in place under a mapping would make reads past its new
 * end fault (SIGBUS), as with any mmap, so nothing here writes a token file in place. A
 * file rewritten in place with other tokens is caught by the range check of each window. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "io/io_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.c reads the file's little-endian uint16 as host words: little-endian hosts only"
#endif

struct ddp_io_tokens {
  char *path;             /* the file's path, or the name given to ddp_io_tokens_from_bytes */
  const uint16_t *tokens; /* (n) mapped read-only, or an owned copy; NULL when n is 0 */
  int64_t n;
  size_t map_bytes;       /* bytes mapped; 0 when tokens is an owned copy (malloc) */
  int64_t vocab_size;
};

/* Check tokens[0 .. count) < vocab_size; the error names the file and the first position. */
static int check_range(const ddp_io_tokens *f, const char *op, int64_t from, int64_t count) {
  for (int64_t i = from; i < from + count; i++)
    if (f->tokens[i] >= f->vocab_size)
      DDP_FAIL(DDP_ERR_IO, "%s: %s: token %lld (0-based) is %u, not below vocab_size %lld", op, f->path,
               (long long)i, (unsigned)f->tokens[i], (long long)f->vocab_size);
  return DDP_OK;
}

/* The checks every token source shares, before any byte is read: vocab_size in range. */
static int check_vocab(const char *op, const char *name, int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > 65536)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s: vocab_size must be in 1 .. 65536 (uint16 tokens), got %lld", op, name,
             (long long)vocab_size);
  return DDP_OK;
}

/* A size in bytes a token file may have: even. */
static int check_size(const char *op, const char *name, int64_t bytes) {
  if (bytes % 2)
    DDP_FAIL(DDP_ERR_IO, "%s: %s: size %lld bytes is odd: not a file of uint16 tokens", op, name, (long long)bytes);
  return DDP_OK;
}

/* A new ddp_io_tokens named `name` with no tokens yet. */
static int tokens_new(ddp_io_tokens **out, const char *op, const char *name, int64_t vocab_size) {
  ddp_io_tokens *f = calloc(1, sizeof *f);
  char *copy = strdup(name);
  if (!f || !copy) {
    free(f);
    free(copy);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: %s: out of memory", op, name);
  }
  f->path = copy;
  f->vocab_size = vocab_size;
  *out = f;
  return DDP_OK;
}

/* The last step of every source: all tokens below vocab_size, or f is freed. */
static int finish_open(ddp_io_tokens **out, ddp_io_tokens *f, const char *op) {
  int status = check_range(f, op, 0, f->n);
  if (status) {
    ddp_io_tokens_free(f);
    return status;
  }
  *out = f;
  return DDP_OK;
}

int ddp_io_tokens_open(ddp_io_tokens **out, const char *path, int64_t vocab_size) {
  const char *op = "tokens_open";
  *out = NULL;
  if (!path || !*path) DDP_FAIL(DDP_ERR_ARG, "%s: empty path", op);
  DDP_TRY(check_vocab(op, path, vocab_size));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) DDP_FAIL(DDP_ERR_IO, "%s: cannot open %s: %s", op, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    DDP_FAIL(DDP_ERR_IO, "%s: cannot stat %s: %s", op, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    DDP_FAIL(DDP_ERR_IO, "%s: %s is not a regular file", op, path);
  }
  ddp_io_tokens *f = NULL;
  int status = check_size(op, path, (int64_t)st.st_size);
  if (!status) status = tokens_new(&f, op, path, vocab_size);
  if (status) {
    close(fd);
    return status;
  }
  f->n = (int64_t)st.st_size / 2;
  if (f->n > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      ddp_io_tokens_free(f);
      DDP_FAIL(DDP_ERR_IO, "%s: cannot map %s: %s", op, path, strerror(e));
    }
    f->tokens = p;
    f->map_bytes = (size_t)st.st_size;
  }
  close(fd); /* the mapping keeps the file */
  return finish_open(out, f, op);
}

int ddp_io_tokens_from_bytes(ddp_io_tokens **out, const void *data, size_t size, const char *name,
                             int64_t vocab_size) {
  const char *op = "tokens_from_bytes";
  *out = NULL;
  if (!name || !*name) DDP_FAIL(DDP_ERR_ARG, "%s: empty name", op);
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "%s: %s: no data for %zu bytes", op, name, size);
  if (size > (size_t)INT64_MAX) DDP_FAIL(DDP_ERR_ARG, "%s: %s: %zu bytes is too large", op, name, size);
  DDP_TRY(check_vocab(op, name, vocab_size));
  DDP_TRY(check_size(op, name, (int64_t)size));
  ddp_io_tokens *f = NULL;
  DDP_TRY(tokens_new(&f, op, name, vocab_size));
  if (size) {
    uint16_t *copy = malloc(size);
    if (!copy) {
      ddp_io_tokens_free(f);
      DDP_FAIL(DDP_ERR_MEMORY, "%s: %s: out of memory for %zu bytes", op, name, size);
    }
    memcpy(copy, data, size); /* the caller's buffer may be unaligned or go away */
    f->tokens = copy;
    f->n = (int64_t)(size / 2);
  }
  return finish_open(out, f, op);
}

int64_t ddp_io_tokens_count(const ddp_io_tokens *f) { return f ? f->n : 0; }

const char *ddp_io_tokens_path(const ddp_io_tokens *f) { return f ? f->path : ""; }

void ddp_io_tokens_free(ddp_io_tokens *f) {
  if (!f) return;
  if (f->map_bytes)
    munmap((void *)f->tokens, f->map_bytes);
  else
    free((void *)f->tokens);
  free(f->path);
  free(f);
}

int ddp_io_tokens_read(ddp_tensor **out, const ddp_io_tokens *f, int64_t start, int64_t count) {
  *out = NULL;
  if (!f) DDP_FAIL(DDP_ERR_ARG, "tokens_read: no token file");
  if (start < 0 || count < 0 || start > f->n || count > f->n - start)
    DDP_FAIL(DDP_ERR_ARG, "tokens_read: %s: tokens [%lld, %lld) are outside the file's %lld", f->path,
             (long long)start, (long long)(start + count), (long long)f->n);
  DDP_TRY(ddp_tensor_empty(out, 1, &count, DDP_I64, DDP_DEVICE_CPU));
  int64_t *dst = (int64_t *)ddp_data(*out);
  for (int64_t i = 0; i < count; i++) dst[i] = f->tokens[start + i];
  return DDP_OK;
}

/* Fill x, y (B, T) i64 from the windows at starts[0 .. B) (checked by the caller). */
static void gather(int64_t *x, int64_t *y, const ddp_io_tokens *f, const int64_t *starts, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; b++) {
    const uint16_t *src = f->tokens + starts[b];
    int64_t *xr = x + b * T, *yr = y + b * T;
    for (int64_t t = 0; t < T; t++) {
      xr[t] = src[t];
      yr[t] = src[t + 1];
    }
  }
}

/* New (B, T) i64 tensors x and y holding the windows at starts (each in 0 .. n-T-1), with
 * the tokens checked against vocab_size again (the mapping shows the file as it is now). */
static int make_windows(ddp_tensor **x, ddp_tensor **y, const ddp_io_tokens *f, const int64_t *starts, int64_t B,
                        int64_t T, const char *op) {
  for (int64_t b = 0; b < B; b++) DDP_TRY(check_range(f, op, starts[b], T + 1));
  int64_t shape[2] = {B, T};
  DDP_TRY(ddp_tensor_empty(x, 2, shape, DDP_I64, DDP_DEVICE_CPU));
  int status = ddp_tensor_empty(y, 2, shape, DDP_I64, DDP_DEVICE_CPU);
  if (status) {
    ddp_tensor_release(*x);
    *x = NULL;
    return status;
  }
  gather((int64_t *)ddp_data(*x), (int64_t *)ddp_data(*y), f, starts, B, T);
  return DDP_OK;
}

/* Common argument checks of the window calls. */
static int check_window_args(const ddp_io_tokens *f, int64_t B, int64_t T, const char *op) {
  if (!f) DDP_FAIL(DDP_ERR_ARG, "%s: no token file", op);
  if (B < 1) DDP_FAIL(DDP_ERR_ARG, "%s: batch size must be >= 1, got %lld", op, (long long)B);
  if (T < 1) DDP_FAIL(DDP_ERR_ARG, "%s: block_size must be >= 1, got %lld", op, (long long)T);
  if (f->n < T + 1)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s holds %lld tokens, fewer than block_size + 1 = %lld", op, f->path,
             (long long)f->n, (long long)(T + 1));
  return DDP_OK;
}

int ddp_io_tokens_windows(ddp_tensor **x, ddp_tensor **y, const ddp_io_tokens *f, int64_t batch,
                          const int64_t *starts, int64_t block_size) {
  *x = *y = NULL;
  const char *op = "tokens_windows";
  DDP_TRY(check_window_args(f, batch, block_size, op));
  for (int64_t b = 0; b < batch; b++)
    if (starts[b] < 0 || starts[b] > f->n - block_size - 1)
      DDP_FAIL(DDP_ERR_ARG, "%s: %s: start %lld of window %lld is outside 0 .. %lld (%lld tokens, block_size %lld)",
               op, f->path, (long long)starts[b], (long long)b, (long long)(f->n - block_size - 1), (long long)f->n,
               (long long)block_size);
  return make_windows(x, y, f, starts, batch, block_size, op);
}

int ddp_io_tokens_random_windows(ddp_tensor **x, ddp_tensor **y, int64_t *starts, const ddp_io_tokens *f,
                                 int64_t batch, int64_t block_size, ddp_generator *g) {
  *x = *y = NULL;
  const char *op = "tokens_random_windows";
  DDP_TRY(check_window_args(f, batch, block_size, op));
  int64_t *own = starts ? starts : malloc((size_t)batch * sizeof *own);
  if (!own) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  uint64_t seed, base;
  ddp_generator_take(g, (uint64_t)batch, &seed, &base);
  uint64_t range = (uint64_t)(f->n - block_size);
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  for (int64_t b = 0; b < batch; b++) { /* Note [token windows] */
    uint64_t c = base + (uint64_t)b;
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0}, w[4];
    ddp_philox4x32_10(w, ctr, key);
    own[b] = (int64_t)((((uint64_t)w[1] << 32) | w[0]) % range);
  }
  int status = make_windows(x, y, f, own, batch, block_size, op);
  if (!starts) free(own);
  return status;
}

int ddp_io_tokens_write(const char *path, ddp_tensor *tokens, int64_t vocab_size) {
  const char *op = "tokens_write";
  if (!path || !*path) DDP_FAIL(DDP_ERR_ARG, "%s: empty path", op);
  DDP_TRY(ddp_check_alive(tokens, op, "tokens"));
  DDP_TRY(check_vocab(op, path, vocab_size));
  if (tokens->ndim != 1) DDP_FAIL(DDP_ERR_ARG, "%s: %s: tokens must be 1-d, got %d dims", op, path, tokens->ndim);
  if (ddp_dtype_is_floating(tokens->dtype) || tokens->dtype == DDP_BOOL)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s: tokens must be an integer tensor (i64, i32 or u8), got %s", op, path,
             ddp_dtype_name(tokens->dtype));
  int64_t n = tokens->numel;
  double *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
  uint16_t *words = malloc((size_t)(n ? n : 1) * sizeof *words);
  int status = DDP_OK;
  if (!vals || !words) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory for %lld tokens", op, (long long)n);
    goto done;
  }
  if (n) {
    status = ddp_tensor_to_f64(tokens, vals);
    if (status) goto done;
  }
  for (int64_t i = 0; i < n; i++) {
    if (vals[i] < 0 || vals[i] >= (double)vocab_size) {
      status = DDP_ERROR(DDP_ERR_ARG, "%s: %s: token %lld (0-based) is %.0f, outside 0 .. %lld (vocab_size %lld)", op,
                         path, (long long)i, vals[i], (long long)(vocab_size - 1), (long long)vocab_size);
      goto done;
    }
    words[i] = (uint16_t)vals[i];
  }
  {
    const void *bufs[1] = {words};
    size_t lens[1] = {(size_t)n * 2};
    status = ddp_io_write_atomic(path, op, 1, bufs, lens);
  }
done:
  free(vals);
  free(words);
  return status;
}
