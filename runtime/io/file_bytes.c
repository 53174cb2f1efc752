/* runtime/io/file_bytes.c: a whole file into memory, for the readers that parse bytes
 * (images, .npy / .npz, CSV): one function so that each reads files the same way. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "io/io_internal.h"

int ddp_io_read_file(const char *path, const char *op, size_t max, uint8_t **data, size_t *size) {
  *data = NULL;
  *size = 0;
  if (!path) DDP_FAIL(DDP_ERR_ARG, "%s: path is NULL", op);
  FILE *f = fopen(path, "rb");
  if (!f) DDP_FAIL(DDP_ERR_IO, "%s: cannot open %s: %s", op, path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    DDP_FAIL(DDP_ERR_IO, "%s: %s is not a regular file", op, path);
  }
  if ((uint64_t)st.st_size > (uint64_t)max) {
    fclose(f);
    DDP_FAIL(DDP_ERR_IO, "%s: %s has %lld bytes, more than the %zu this reader takes", op, path,
             (long long)st.st_size, max);
  }
  size_t n = (size_t)st.st_size;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    fclose(f);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory for %s (%zu bytes)", op, path, n);
  }
  size_t got = fread(buf, 1, n, f);
  int rerr = ferror(f);
  fclose(f);
  if (got != n) {
    free(buf);
    DDP_FAIL(DDP_ERR_IO, "%s: %s: read failed: %s", op, path,
             rerr ? strerror(errno) : "the file shrank while being read");
  }
  *data = buf;
  *size = n;
  return DDP_OK;
}
