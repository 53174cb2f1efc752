/* runtime/io/npy.c: NumPy .npy files and .npz archives (ddplua/arrays.h).
 *
 * .npy (numpy.lib.format): the magic "\x93NUMPY", a major and minor version byte, the
 * header length (u16 little-endian in version 1, u32 in 2 and 3), the header (an ASCII
 * (v1, v2) or UTF-8 (v3) Python dict literal {'descr': '<f4', 'fortran_order': False,
 * 'shape': (2, 3), } padded with spaces and ending in '\n'), then the data.
 * .npz: a zip archive of .npy entries (numpy.savez, savez_compressed), read with libzip
 * from memory, so the file and the bytes readers (and the fuzz target) share one path. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <zip.h>

#include "core/core.h"
#include "io/io_internal.h"

#define NPY_MAX_BYTES ((uint64_t)1 << 33)

/* ---- the header's dict literal --------------------------------------------------------- */

/* The text after `'key':` in the header h (n bytes), spaces skipped; NULL if absent or
 * if nothing follows within the header (the value is read up to h + n, never past it). */
static const char *header_value(const char *h, size_t n, const char *key) {
  size_t k = strlen(key);
  for (size_t i = 0; i + k + 2 < n; i++) {
    if ((h[i] == '\'' || h[i] == '"') && memcmp(h + i + 1, key, k) == 0 && h[i + 1 + k] == h[i]) {
      size_t j = i + k + 2;
      while (j < n && h[j] == ' ') j++;
      if (j < n && h[j] == ':') {
        j++;
        while (j < n && h[j] == ' ') j++;
        return j < n ? h + j : NULL;
      }
    }
  }
  return NULL;
}

/* A parsed dtype: the ddplua dtype, the file's item size, kind and byte order. */
typedef struct {
  int dtype;
  int itemsize;
  char kind;     /* 'f', 'i', 'u', 'b' */
  int big;       /* big-endian data */
} npy_type;

static int parse_descr(npy_type *t, const char *v, const char *end, const char *name) {
  char q = *v;
  if (q != '\'' && q != '"')
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header's descr is not a string (structured arrays "
             "are not supported)", name);
  const char *s = v + 1, *e = s;
  while (e < end && *e != q) e++;
  if (e >= end) DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header's descr string is not closed", name);
  int len = (int)(e - s);
  char d[16] = "";
  snprintf(d, sizeof d, "%.*s", len < 15 ? len : 15, s);
  if (len < 3 || len > 4 || strchr("<>|=", d[0]) == NULL || !isdigit((unsigned char)d[2]) ||
      (len == 4 && !isdigit((unsigned char)d[3])))
    goto unsupported;
  t->big = d[0] == '>';
  t->kind = d[1];
  t->itemsize = atoi(d + 2);
  int k = t->kind, n = t->itemsize;
  if (k == 'f' && n == 2) t->dtype = DDP_F16;
  else if (k == 'f' && n == 4) t->dtype = DDP_F32;
  else if (k == 'f' && n == 8) t->dtype = DDP_F64;
  else if (k == 'i' && (n == 1 || n == 2 || n == 4)) t->dtype = DDP_I32;
  else if (k == 'i' && n == 8) t->dtype = DDP_I64;
  else if (k == 'u' && n == 1) t->dtype = DDP_U8;
  else if (k == 'u' && n == 2) t->dtype = DDP_I32;
  else if (k == 'u' && n == 4) t->dtype = DDP_I64;
  else if (k == 'b' && n == 1) t->dtype = DDP_BOOL;
  else goto unsupported;
  return DDP_OK;
unsupported:
  DDP_FAIL(DDP_ERR_IO,
           "read_npy: %s: dtype '%s' has no ddplua equivalent (supported: f2 f4 f8 i1 i2 i4 i8 u1 "
           "u2 u4 b1)",
           name, d);
}

static int parse_shape(int64_t *shape, int *ndim, const char *v, const char *end, const char *name) {
  if (*v != '(') DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header's shape is not a tuple", name);
  const char *p = v + 1;
  *ndim = 0;
  for (;;) {
    while (p < end && *p == ' ') p++;
    if (p < end && *p == ')') break;
    if (p >= end || !isdigit((unsigned char)*p))
      DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header's shape holds something other than sizes", name);
    if (*ndim == DDP_MAX_DIMS)
      DDP_FAIL(DDP_ERR_IO, "read_npy: %s: more than %d dimensions", name, DDP_MAX_DIMS);
    uint64_t x = 0;
    while (p < end && isdigit((unsigned char)*p)) {
      x = x * 10 + (uint64_t)(*p - '0');
      if (x > NPY_MAX_BYTES) DDP_FAIL(DDP_ERR_IO, "read_npy: %s: a size of the shape is too large", name);
      p++;
    }
    shape[(*ndim)++] = (int64_t)x;
    while (p < end && *p == ' ') p++;
    if (p < end && *p == ',') {
      p++;
      continue;
    }
    if (p < end && *p == ')') break;
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header's shape tuple is malformed", name);
  }
  return DDP_OK;
}

/* ---- data ------------------------------------------------------------------------------ */

/* Element i of the file's data as a value of t's ddplua dtype, stored at dst. */
static void convert(void *dst, const uint8_t *src, const npy_type *t) {
  uint8_t b[8];
  int n = t->itemsize;
  for (int k = 0; k < n; k++) b[k] = t->big ? src[n - 1 - k] : src[k]; /* little-endian now */
  uint64_t u = 0;
  for (int k = n - 1; k >= 0; k--) u = (u << 8) | b[k];
  switch (t->dtype) {
  case DDP_F16: {
    uint16_t h = (uint16_t)u;
    memcpy(dst, &h, 2);
    break;
  }
  case DDP_F32: {
    uint32_t w = (uint32_t)u;
    memcpy(dst, &w, 4);
    break;
  }
  case DDP_F64:
    memcpy(dst, &u, 8);
    break;
  case DDP_U8:
    *(uint8_t *)dst = (uint8_t)u;
    break;
  case DDP_BOOL:
    *(uint8_t *)dst = u != 0;
    break;
  case DDP_I32: {
    int32_t v;
    if (t->kind == 'u') v = (int32_t)(uint16_t)u; /* u2 */
    else if (n == 1) v = (int8_t)u;
    else if (n == 2) v = (int16_t)u;
    else v = (int32_t)(uint32_t)u;
    *(int32_t *)dst = v;
    break;
  }
  case DDP_I64:
    *(int64_t *)dst = t->kind == 'u' ? (int64_t)(uint32_t)u : (int64_t)u;
    break;
  }
}

int ddp_npy_decode(ddp_tensor **out, const void *data, size_t size, const char *name) {
  *out = NULL;
  if (!name) name = "<bytes>";
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "read_npy: %s: data is NULL (size %zu)", name, size);
  const uint8_t *b = data;
  if (size < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s is not a .npy file (%zu bytes; expected the magic \\x93NUMPY)",
             name, size);
  int major = b[6];
  size_t hlen, at;
  if (major == 1) {
    hlen = (size_t)b[8] | (size_t)b[9] << 8;
    at = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) DDP_FAIL(DDP_ERR_IO, "read_npy: %s: truncated header", name);
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    at = 12;
  } else {
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: format version %d.%d is not supported (1.0, 2.0, 3.0)", name,
             major, b[7]);
  }
  if (hlen > size - at)
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header says %zu bytes but the file has %zu after it", name,
             hlen, size - at);
  const char *h = (const char *)b + at, *hend = h + hlen;
  if (hlen == 0 || h[0] != '{') DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header is not a dict literal", name);
  const char *dv = header_value(h, hlen, "descr"), *fv = header_value(h, hlen, "fortran_order"),
             *sv = header_value(h, hlen, "shape");
  if (!dv || !fv || !sv)
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header lacks '%s'", name, !dv ? "descr" : !fv ? "fortran_order" : "shape");
  npy_type t;
  DDP_TRY(parse_descr(&t, dv, hend, name));
  int fortran;
  if (hend - fv >= 4 && memcmp(fv, "True", 4) == 0) fortran = 1;
  else if (hend - fv >= 5 && memcmp(fv, "False", 5) == 0) fortran = 0;
  else DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the header's fortran_order is not True or False", name);
  int64_t shape[DDP_MAX_DIMS];
  int ndim = 0;
  DDP_TRY(parse_shape(shape, &ndim, sv, hend, name));
  /* the product with each size 0 counted as 1 bounds the element count and the strides a
   * tensor of this shape has (ddp_shape_check refuses one past 64 bits): checked here so
   * that the error names the file (a size 0 once hid the sizes after it, fuzz/npy.c) */
  uint64_t numel = 1, span = 1;
  for (int d = 0; d < ndim; d++) {
    uint64_t s = shape[d] ? (uint64_t)shape[d] : 1;
    if (span > NPY_MAX_BYTES / s)
      DDP_FAIL(DDP_ERR_IO, "read_npy: %s: the shape's product is too large%s", name,
               numel == 0 || shape[d] == 0 ? " (counting each size 0 as 1)" : "");
    span *= s;
    numel *= (uint64_t)shape[d];
  }
  if (numel * (uint64_t)t.itemsize > NPY_MAX_BYTES)
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: %llu elements of %d bytes pass the 2^33-byte limit", name,
             (unsigned long long)numel, t.itemsize);
  size_t body = size - at - hlen, want = (size_t)numel * (size_t)t.itemsize;
  if (body != want)
    DDP_FAIL(DDP_ERR_IO, "read_npy: %s: expected %zu bytes of data for the shape, found %zu%s", name, want,
             body, body < want ? " (truncated)" : " (trailing bytes)");
  ddp_tensor *x = NULL;
  DDP_TRY(ddp_tensor_empty(&x, ndim, shape, t.dtype, DDP_DEVICE_CPU));
  char *dst = ddp_data(x);
  size_t osz = ddp_dtype_size(t.dtype);
  const uint8_t *src = b + at + hlen;
  if (!fortran || ndim < 2) {
    for (uint64_t i = 0; i < numel; i++) convert(dst + i * osz, src + i * (size_t)t.itemsize, &t);
  } else {
    /* column-major: file element i has index (i0, i1, ...) with i0 fastest */
    int64_t idx[DDP_MAX_DIMS] = {0};
    for (uint64_t i = 0; i < numel; i++) {
      int64_t off = 0;
      for (int d = 0; d < ndim; d++) off = off * shape[d] + idx[d];
      convert(dst + (size_t)off * osz, src + i * (size_t)t.itemsize, &t);
      for (int d = 0; d < ndim; d++) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  *out = x;
  return DDP_OK;
}

int ddp_npy_read(ddp_tensor **out, const char *path) {
  *out = NULL;
  uint8_t *buf;
  size_t size;
  DDP_TRY(ddp_io_read_file(path, "read_npy", (size_t)NPY_MAX_BYTES + 65536 + 12, &buf, &size));
  int status = ddp_npy_decode(out, buf, size, path);
  free(buf);
  return status;
}

/* ---- .npz ------------------------------------------------------------------------------ */

struct ddp_npz {
  int n;
  char **names;
  ddp_tensor **arrays;
};

void ddp_npz_free(ddp_npz *z) {
  if (!z) return;
  for (int i = 0; i < z->n; i++) {
    free(z->names[i]);
    ddp_tensor_release(z->arrays[i]);
  }
  free(z->names);
  free(z->arrays);
  free(z);
}

int ddp_npz_count(const ddp_npz *z) { return z ? z->n : 0; }

const char *ddp_npz_name(const ddp_npz *z, int i) {
  return (z && i >= 0 && i < z->n) ? z->names[i] : NULL;
}

ddp_tensor *ddp_npz_array(const ddp_npz *z, int i) {
  if (!z || i < 0 || i >= z->n) return NULL;
  ddp_tensor_retain(z->arrays[i]);
  return z->arrays[i];
}

/* Inflate entry i of archive a into a new buffer (grown as bytes arrive, so a lying size
 * costs nothing); *total counts the bytes of the whole archive against the limit. */
static int read_entry(zip_t *a, zip_uint64_t i, const char *name, const char *entry, uint8_t **out,
                      size_t *len, uint64_t *total) {
  *out = NULL;
  *len = 0;
  zip_file_t *f = zip_fopen_index(a, i, 0);
  if (!f)
    DDP_FAIL(DDP_ERR_IO, "read_npz: %s: cannot open entry %s: %s", name, entry, zip_strerror(a));
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  int status = buf ? DDP_OK : DDP_ERROR(DDP_ERR_MEMORY, "read_npz: %s: out of memory", name);
  while (!status) {
    if (n == cap) {
      uint8_t *nb = realloc(buf, cap * 2);
      if (!nb) {
        status = DDP_ERROR(DDP_ERR_MEMORY, "read_npz: %s: out of memory", name);
        break;
      }
      buf = nb;
      cap *= 2;
    }
    zip_int64_t got = zip_fread(f, buf + n, cap - n);
    if (got < 0) {
      status = DDP_ERROR(DDP_ERR_IO, "read_npz: %s: entry %s: %s", name, entry, zip_file_strerror(f));
      break;
    }
    if (got == 0) break;
    n += (size_t)got;
    *total += (uint64_t)got;
    if (*total > NPY_MAX_BYTES)
      status = DDP_ERROR(DDP_ERR_IO, "read_npz: %s: more than 2^33 bytes inflated", name);
  }
  zip_fclose(f);
  if (status) {
    free(buf);
    return status;
  }
  *out = buf;
  *len = n;
  return DDP_OK;
}

int ddp_npz_decode(ddp_npz **out, const void *data, size_t size, const char *name) {
  *out = NULL;
  if (!name) name = "<bytes>";
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "read_npz: %s: data is NULL (size %zu)", name, size);
  zip_error_t err;
  zip_error_init(&err);
  zip_source_t *src = zip_source_buffer_create(size ? data : "", size, 0, &err);
  zip_t *a = src ? zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err) : NULL;
  if (!a) {
    int status = DDP_ERROR(DDP_ERR_IO, "read_npz: %s is not a readable zip archive: %s", name,
                           zip_error_strerror(&err));
    if (src) zip_source_free(src);
    zip_error_fini(&err);
    return status;
  }
  zip_error_fini(&err);
  ddp_npz *z = calloc(1, sizeof *z);
  zip_int64_t count = zip_get_num_entries(a, 0);
  int status = z ? DDP_OK : DDP_ERROR(DDP_ERR_MEMORY, "read_npz: out of memory");
  if (!status && (count < 0 || count > 1000000))
    status = DDP_ERROR(DDP_ERR_IO, "read_npz: %s: %lld entries", name, (long long)count);
  if (!status) {
    z->names = calloc((size_t)count + 1, sizeof *z->names);
    z->arrays = calloc((size_t)count + 1, sizeof *z->arrays);
    if (!z->names || !z->arrays) status = DDP_ERROR(DDP_ERR_MEMORY, "read_npz: out of memory");
  }
  uint64_t total = 0;
  for (zip_int64_t i = 0; i < count && !status; i++) {
    const char *entry = zip_get_name(a, (zip_uint64_t)i, ZIP_FL_ENC_RAW);
    if (!entry) {
      status = DDP_ERROR(DDP_ERR_IO, "read_npz: %s: entry %lld has no name: %s", name, (long long)i,
                         zip_strerror(a));
      break;
    }
    size_t el = strlen(entry);
    if (el < 4 || strcmp(entry + el - 4, ".npy") != 0) continue;
    uint8_t *bytes;
    size_t len;
    status = read_entry(a, (zip_uint64_t)i, name, entry, &bytes, &len, &total);
    if (status) break;
    size_t full_len = strlen(name) + el + 2;
    char *full = malloc(full_len);
    char *key = malloc(el - 3);
    if (!full || !key) {
      free(full);
      free(key);
      free(bytes);
      status = DDP_ERROR(DDP_ERR_MEMORY, "read_npz: out of memory");
      break;
    }
    snprintf(full, full_len, "%s:%s", name, entry);
    memcpy(key, entry, el - 4);
    key[el - 4] = 0;
    ddp_tensor *t = NULL;
    status = ddp_npy_decode(&t, bytes, len, full);
    free(full);
    free(bytes);
    if (status) {
      free(key);
      break;
    }
    z->names[z->n] = key;
    z->arrays[z->n] = t;
    z->n++;
  }
  zip_discard(a); /* frees the source too */
  if (status) {
    ddp_npz_free(z);
    return status;
  }
  *out = z;
  return DDP_OK;
}

int ddp_npz_read(ddp_npz **out, const char *path) {
  *out = NULL;
  uint8_t *buf;
  size_t size;
  DDP_TRY(ddp_io_read_file(path, "read_npz", (size_t)NPY_MAX_BYTES, &buf, &size));
  int status = ddp_npz_decode(out, buf, size, path);
  free(buf);
  return status;
}
