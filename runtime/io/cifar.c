/* runtime/io/cifar.c: CIFAR-10 binary batches (Krizhevsky, "Learning Multiple Layers of
 * Features from Tiny Images", 2009; https://www.cs.toronto.edu/~kriz/cifar.html, "binary
 * version"): records of 1 label byte and 3072 image bytes (3 x 32 x 32, channel-major). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "io/io_internal.h"

enum { CIFAR_IMAGE = 3 * 32 * 32, CIFAR_RECORD = 1 + CIFAR_IMAGE, CIFAR_CLASSES = 10 };

/* Note [one CIFAR reader for files and bytes]: the checks on a batch's bytes are
 * check_size (the size is a positive multiple of the record) and take_records (each label
 * in 0..9), used by the file reader (ddp_io_read_cifar, record by record) and the reader of
 * bytes in memory (ddp_io_read_cifar_bytes, which the fuzz target fuzz/cifar.c calls). */

/* 0 when `size` bytes hold whole records, else -1 with the error set naming `name`. */
static int check_size(int64_t size, const char *name) {
  if (size > 0 && size % CIFAR_RECORD == 0) return 0;
  DDP_ERROR(DDP_ERR_IO,
            "read_cifar: %s has %lld bytes, not a positive multiple of the %d-byte record "
            "(1 label byte + 3072 image bytes): not a CIFAR-10 binary batch, or truncated",
            name, (long long)size, CIFAR_RECORD);
  return -1;
}

/* Check and copy n records at rec (record `first` onwards of file `name`) into images ip
 * (n, 3, 32, 32) and labels lp (n). DDP_OK, or the error naming the record. */
static int take_records(uint8_t *ip, int64_t *lp, const unsigned char *rec, int64_t n,
                        int64_t first, const char *name) {
  for (int64_t r = 0; r < n; r++, rec += CIFAR_RECORD) {
    if (rec[0] >= CIFAR_CLASSES)
      DDP_FAIL(DDP_ERR_IO, "read_cifar: %s: record %lld (0-based) has label %d, expected 0..9",
               name, (long long)(first + r), rec[0]);
    lp[r] = rec[0];
    memcpy(ip + r * CIFAR_IMAGE, rec + 1, CIFAR_IMAGE);
  }
  return DDP_OK;
}

/* Size of the file in bytes, or -1 with the error set. */
static int64_t file_records(const char *path, FILE **fp) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    DDP_ERROR(DDP_ERR_IO, "read_cifar: cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    DDP_ERROR(DDP_ERR_IO, "read_cifar: %s is not a regular file", path);
    fclose(f);
    return -1;
  }
  int64_t size = (int64_t)st.st_size;
  if (check_size(size, path)) {
    fclose(f);
    return -1;
  }
  *fp = f;
  return size / CIFAR_RECORD;
}

int ddp_io_read_cifar(ddp_tensor **images, ddp_tensor **labels, int npaths,
                      const char *const *paths) {
  *images = NULL;
  *labels = NULL;
  if (npaths < 1 || !paths) DDP_FAIL(DDP_ERR_ARG, "read_cifar: expected at least one file, got %d", npaths);
  /* sizes first, so the tensors are allocated once */
  int64_t total = 0;
  for (int i = 0; i < npaths; i++) {
    if (!paths[i]) DDP_FAIL(DDP_ERR_ARG, "read_cifar: paths[%d] is NULL", i);
    FILE *f = NULL;
    int64_t n = file_records(paths[i], &f);
    if (n < 0) return ddp_last_status();
    fclose(f);
    total += n;
  }
  int64_t ishape[4] = {total, 3, 32, 32};
  ddp_tensor *img = NULL, *lab = NULL;
  DDP_TRY(ddp_tensor_empty(&img, 4, ishape, DDP_U8, DDP_DEVICE_CPU));
  int status = ddp_tensor_empty(&lab, 1, &total, DDP_I64, DDP_DEVICE_CPU);
  unsigned char *rec = malloc(CIFAR_RECORD);
  if (!status && !rec) status = DDP_ERROR(DDP_ERR_MEMORY, "read_cifar: out of memory");
  uint8_t *ip = status ? NULL : (uint8_t *)ddp_data(img);
  int64_t *lp = status ? NULL : (int64_t *)ddp_data(lab);
  int64_t at = 0;
  for (int i = 0; i < npaths && !status; i++) {
    FILE *f = NULL;
    int64_t n = file_records(paths[i], &f); /* again: the file may have changed */
    if (n < 0) {
      status = ddp_last_status();
      break;
    }
    if (at + n > total) {
      status = DDP_ERROR(DDP_ERR_IO, "read_cifar: %s grew while being read", paths[i]);
      fclose(f);
      break;
    }
    for (int64_t r = 0; r < n; r++) {
      if (fread(rec, 1, CIFAR_RECORD, f) != CIFAR_RECORD) {
        status = DDP_ERROR(DDP_ERR_IO, "read_cifar: %s: read failed at record %lld: %s", paths[i],
                           (long long)r, ferror(f) ? strerror(errno) : "unexpected end of file");
        break;
      }
      status = take_records(ip + at * CIFAR_IMAGE, lp + at, rec, 1, r, paths[i]);
      if (status) break;
      at++;
    }
    fclose(f);
  }
  free(rec);
  if (!status && at != total)
    status = DDP_ERROR(DDP_ERR_IO, "read_cifar: the files shrank while being read");
  if (status) {
    ddp_tensor_release(img);
    ddp_tensor_release(lab);
    return status;
  }
  *images = img;
  *labels = lab;
  return DDP_OK;
}

int ddp_io_read_cifar_bytes(ddp_tensor **images, ddp_tensor **labels, const void *data,
                            size_t size, const char *name) {
  *images = NULL;
  *labels = NULL;
  if (!name) name = "<bytes>";
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "read_cifar: %s: data is NULL (size %zu)", name, size);
  if (size > (size_t)INT64_MAX || check_size((int64_t)size, name)) return ddp_last_status();
  int64_t n = (int64_t)size / CIFAR_RECORD;
  int64_t ishape[4] = {n, 3, 32, 32};
  ddp_tensor *img = NULL, *lab = NULL;
  DDP_TRY(ddp_tensor_empty(&img, 4, ishape, DDP_U8, DDP_DEVICE_CPU));
  int status = ddp_tensor_empty(&lab, 1, &n, DDP_I64, DDP_DEVICE_CPU);
  if (!status)
    status = take_records((uint8_t *)ddp_data(img), (int64_t *)ddp_data(lab), data, n, 0, name);
  if (status) {
    ddp_tensor_release(img);
    ddp_tensor_release(lab);
    return status;
  }
  *images = img;
  *labels = lab;
  return DDP_OK;
}
