/* runtime/io/idx.c: IDX files (MNIST, Fashion-MNIST), gzipped or raw.
 *
 * Format (LeCun, Cortes, Burges, "THE MNIST DATABASE", http://yann.lecun.com/exdb/mnist/):
 * bytes 0-1 zero, byte 2 the type code, byte 3 the number of dimensions, then one
 * big-endian u32 per dimension, then the data, big-endian, row-major. zlib's gzread passes
 * files that are not gzipped through unchanged, so one path reads both. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#include "core/core.h"
#include "io/io_internal.h"

/* Largest data part we accept: 2^33 bytes (8 GiB), far above any IDX data set. */
#define IDX_MAX_BYTES ((uint64_t)1 << 33)

/* Note [what the header may declare]: the data tensor is allocated from the header's sizes
 * before the data is read, so a header must not be able to make us allocate more than the
 * file can hold: a 522 KB gzipped file whose header announced 2.6 GB took 2.6 GB of memory
 * before failing as truncated. The file's size bounds what it holds: a raw file holds
 * exactly its size, and deflate (gzip's only method) expands at most 1032:1 (a 258-byte
 * match costs at least 2 bits: RFC 1951, zlib's FAQ), so a gzip file of C bytes holds at most
 * 1032 * C bytes. A header that declares more fails before any allocation. */
#define DEFLATE_MAX_RATIO 1032

typedef struct {
  int code;
  const char *name;
  int elem_size; /* bytes per element in the file */
  int dtype;     /* dtype of the result */
} idx_type;

static const idx_type idx_types[] = {
    {0x08, "u8", 1, DDP_U8},   {0x09, "i8", 1, DDP_I32},  {0x0B, "i16", 2, DDP_I32},
    {0x0C, "i32", 4, DDP_I32}, {0x0D, "f32", 4, DDP_F32}, {0x0E, "f64", 8, DDP_F64},
};

/* Note [one IDX reader for files and bytes]: read_idx parses a source, either a file
 * through zlib's gzFile (gzread inflates gzipped files and passes raw ones through) or a
 * buffer in memory (ddp_io_read_idx_bytes: inflated with zlib's inflate when it starts with
 * the gzip magic 1f 8b, else read as is). Every check is in read_idx, which both use, so the
 * fuzz targets (fuzz/idx.c, fuzz/idx_gzip.c) exercise the code that reads files; only
 * source_read differs. Like gzread, the memory source inflates concatenated gzip members in
 * turn and ignores bytes after the last member that do not start another. */
typedef struct {
  gzFile gz;                 /* the file, or NULL: the bytes are mem */
  const unsigned char *mem;
  size_t size, pos;          /* bytes in mem; next one to read (raw) */
  int gzip;                  /* mem is gzipped (inflated through zs) */
  int ended;                 /* the last gzip member ended */
  z_stream zs;
} idx_source;

/* Up to n bytes from a gzipped buffer; the count, or -1 with the error set. */
static int64_t inflate_some(idx_source *s, const char *path, unsigned char *buf, uint64_t n) {
  uint64_t got = 0;
  while (got < n && !s->ended) {
    uint64_t want = n - got;
    if (want > (1u << 30)) want = 1u << 30;
    s->zs.next_out = buf + got;
    s->zs.avail_out = (uInt)want;
    int rc = inflate(&s->zs, Z_NO_FLUSH);
    got += want - s->zs.avail_out;
    if (rc == Z_STREAM_END) {
      /* another member follows only when its magic does */
      if (s->zs.avail_in >= 2 && s->zs.next_in[0] == 0x1f && s->zs.next_in[1] == 0x8b) {
        if (inflateReset(&s->zs) != Z_OK) s->ended = 1;
      } else {
        s->ended = 1;
      }
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && s->zs.avail_in == 0) {
      DDP_ERROR(DDP_ERR_IO, "read_idx: %s: corrupt gzip data: unexpected end of file", path);
      return -1;
    }
    if (rc == Z_MEM_ERROR) {
      DDP_ERROR(DDP_ERR_MEMORY, "read_idx: %s: out of memory inflating", path);
      return -1;
    }
    DDP_ERROR(DDP_ERR_IO, "read_idx: %s: corrupt gzip data: %s", path,
              s->zs.msg ? s->zs.msg : "invalid stream");
    return -1;
  }
  return (int64_t)got;
}

/* Read up to n bytes; returns the count read (< n at the end of the file), or -1 with the
 * error set for a read failure or corrupt gzip stream. */
static int64_t read_full(idx_source *s, const char *path, void *buf, uint64_t n) {
  if (!s->gz) {
    if (s->gzip) return inflate_some(s, path, buf, n);
    uint64_t left = s->size - s->pos, take = n < left ? n : left;
    if (take) memcpy(buf, s->mem + s->pos, take);
    s->pos += take;
    return (int64_t)take;
  }
  uint64_t got = 0;
  while (got < n) {
    uint64_t want = n - got;
    if (want > (1u << 30)) want = 1u << 30;
    int r = gzread(s->gz, (char *)buf + got, (unsigned)want);
    if (r < 0) {
      int zerr = 0;
      const char *msg = gzerror(s->gz, &zerr);
      if (zerr == Z_ERRNO)
        DDP_ERROR(DDP_ERR_IO, "read_idx: %s: read failed: %s", path, strerror(errno));
      else
        DDP_ERROR(DDP_ERR_IO, "read_idx: %s: corrupt gzip data: %s", path, msg);
      return -1;
    }
    if (r == 0) break;
    got += (uint64_t)r;
  }
  return (int64_t)got;
}

/* 1 when the source's bytes are the IDX bytes themselves (not gzipped). */
static int source_direct(idx_source *s) { return s->gz ? gzdirect(s->gz) : !s->gzip; }

/* Convert n big-endian elements of the file type in buf into the result tensor's data. */
static void convert(void *dst, const unsigned char *src, const idx_type *t, int64_t n) {
  switch (t->code) {
  case 0x08: memcpy(dst, src, (size_t)n); break;
  case 0x09:
    for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] = (int8_t)src[i];
    break;
  case 0x0B:
    for (int64_t i = 0; i < n; i++)
      ((int32_t *)dst)[i] = (int16_t)(uint16_t)((src[2 * i] << 8) | src[2 * i + 1]);
    break;
  case 0x0C:
  case 0x0D:
    for (int64_t i = 0; i < n; i++) {
      const unsigned char *p = src + 4 * i;
      uint32_t v = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
      memcpy((char *)dst + 4 * i, &v, 4);
    }
    break;
  case 0x0E:
    for (int64_t i = 0; i < n; i++) {
      const unsigned char *p = src + 8 * i;
      uint64_t v = 0;
      for (int k = 0; k < 8; k++) v = (v << 8) | p[k];
      memcpy((char *)dst + 8 * i, &v, 8);
    }
    break;
  }
}

static int read_idx(ddp_tensor **out, idx_source *f, const char *path, uint64_t file_bytes) {
  unsigned char head[4];
  int64_t got = read_full(f, path, head, 4);
  if (got < 0) return ddp_last_status();
  if (got < 4)
    DDP_FAIL(DDP_ERR_IO, "read_idx: %s: truncated header: expected 4 bytes of magic, found %lld",
             path, (long long)got);
  const idx_type *type = NULL;
  for (size_t i = 0; i < sizeof idx_types / sizeof idx_types[0]; i++)
    if (idx_types[i].code == head[2]) type = &idx_types[i];
  if (head[0] != 0 || head[1] != 0 || !type)
    DDP_FAIL(DDP_ERR_IO,
             "read_idx: %s: wrong magic: found bytes %02x %02x %02x %02x, expected 00 00 "
             "followed by a type code (08 u8, 09 i8, 0b i16, 0c i32, 0d f32, 0e f64) and the "
             "number of dimensions (not an IDX file?)",
             path, head[0], head[1], head[2], head[3]);
  int ndim = head[3];
  if (ndim < 1 || ndim > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_IO, "read_idx: %s: %d dimensions in the header (expected 1 to %d)", path,
             ndim, DDP_MAX_DIMS);
  unsigned char dims[4 * DDP_MAX_DIMS];
  got = read_full(f, path, dims, 4 * (uint64_t)ndim);
  if (got < 0) return ddp_last_status();
  if (got < 4 * ndim)
    DDP_FAIL(DDP_ERR_IO, "read_idx: %s: truncated header: expected %d bytes of sizes, found %lld",
             path, 4 * ndim, (long long)got);
  int64_t shape[DDP_MAX_DIMS];
  /* span: the product of the sizes with each 0 counted as 1, which bounds numel and every
   * stride (Note [shape arithmetic]); capped at IDX_MAX_BYTES + 1 as it grows. Each size
   * is < 2^32, so the check before multiplying cannot overflow. */
  uint64_t numel = 1, span = 1;
  for (int d = 0; d < ndim; d++) {
    const unsigned char *p = dims + 4 * d;
    shape[d] = (int64_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
    uint64_t s = shape[d] ? (uint64_t)shape[d] : 1;
    if (span > IDX_MAX_BYTES / s) span = IDX_MAX_BYTES + 1;
    else span *= s;
    numel = shape[d] ? numel : 0;
  }
  if (numel) numel = span; /* no size 0: numel is the span */
  if (span > IDX_MAX_BYTES || span * (uint64_t)type->elem_size > IDX_MAX_BYTES)
    DDP_FAIL(DDP_ERR_IO, "read_idx: %s: absurd sizes %s of %s: more than 2^33 bytes of data%s",
             path, ddp_shape_str(ndim, shape), type->name,
             numel ? "" : " (counting each size 0 as 1, as the strides do)");
  uint64_t nbytes = numel * (uint64_t)type->elem_size;
  uint64_t header = 4 + 4 * (uint64_t)ndim; /* Note [what the header may declare] */
  if (source_direct(f)) {
    uint64_t held = file_bytes > header ? file_bytes - header : 0;
    if (nbytes > held)
      DDP_FAIL(DDP_ERR_IO,
               "read_idx: %s: truncated: header says %s of %s, expected %llu bytes of data, "
               "found %llu",
               path, ddp_shape_str(ndim, shape), type->name, (unsigned long long)nbytes,
               (unsigned long long)held);
  } else if (header + nbytes > (uint64_t)DEFLATE_MAX_RATIO * file_bytes + 1024) {
    DDP_FAIL(DDP_ERR_IO,
             "read_idx: %s: header says %s of %s, %llu bytes of data, more than a gzip file of "
             "%llu bytes can hold (deflate expands at most %d:1): truncated or forged file",
             path, ddp_shape_str(ndim, shape), type->name, (unsigned long long)nbytes,
             (unsigned long long)file_bytes, DEFLATE_MAX_RATIO);
  }
  ddp_tensor *t = NULL;
  DDP_TRY(ddp_tensor_empty(&t, ndim, shape, type->dtype, DDP_DEVICE_CPU));
  /* u8 reads straight into the tensor; the others through a staging buffer */
  unsigned char *buf = type->code == 0x08 ? (unsigned char *)ddp_data(t) : malloc(nbytes ? nbytes : 1);
  if (!buf) {
    ddp_tensor_release(t);
    DDP_FAIL(DDP_ERR_MEMORY, "read_idx: %s: out of memory for %llu bytes", path,
             (unsigned long long)nbytes);
  }
  int status = DDP_OK;
  got = read_full(f, path, buf, nbytes);
  if (got < 0) {
    status = ddp_last_status();
  } else if ((uint64_t)got < nbytes) {
    status = DDP_ERROR(DDP_ERR_IO,
                       "read_idx: %s: truncated: header says %s of %s, expected %llu bytes of "
                       "data, found %lld",
                       path, ddp_shape_str(ndim, shape), type->name, (unsigned long long)nbytes,
                       (long long)got);
  } else {
    unsigned char extra[256];
    int64_t more = read_full(f, path, extra, sizeof extra);
    if (more < 0) status = ddp_last_status();
    else if (more > 0)
      status = DDP_ERROR(DDP_ERR_IO,
                         "read_idx: %s: trailing bytes after the %llu bytes of data the header "
                         "%s of %s announces (mis-sized file?)",
                         path, (unsigned long long)nbytes, ddp_shape_str(ndim, shape), type->name);
    else if (type->code != 0x08)
      convert(ddp_data(t), buf, type, (int64_t)numel);
  }
  if (buf != (unsigned char *)ddp_data(t)) free(buf);
  if (status) {
    ddp_tensor_release(t);
    return status;
  }
  *out = t;
  return DDP_OK;
}

int ddp_io_read_idx(ddp_tensor **out, const char *path) {
  *out = NULL;
  if (!path) DDP_FAIL(DDP_ERR_ARG, "read_idx: path is NULL");
  struct stat st;
  uint64_t file_bytes = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : UINT64_MAX / 2048;
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f)
    DDP_FAIL(DDP_ERR_IO, "read_idx: cannot open %s: %s", path,
             errno ? strerror(errno) : "out of memory");
  gzbuffer(f, 1 << 17);
  idx_source src = {.gz = f};
  int status = read_idx(out, &src, path, file_bytes);
  gzclose(f);
  return status;
}

int ddp_io_read_idx_bytes(ddp_tensor **out, const void *data, size_t size, const char *name) {
  *out = NULL;
  if (!name) name = "<bytes>";
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "read_idx: %s: data is NULL (size %zu)", name, size);
  idx_source src = {.mem = data, .size = size};
  src.gzip = size >= 2 && src.mem[0] == 0x1f && src.mem[1] == 0x8b;
  if (src.gzip) {
    if (size > UINT_MAX)
      DDP_FAIL(DDP_ERR_ARG, "read_idx: %s: %zu gzipped bytes is too many (at most 4 GiB)", name, size);
    src.zs.next_in = (Bytef *)src.mem;
    src.zs.avail_in = (uInt)size;
    if (inflateInit2(&src.zs, 16 + MAX_WBITS) != Z_OK)
      DDP_FAIL(DDP_ERR_MEMORY, "read_idx: %s: out of memory for zlib", name);
  }
  int status = read_idx(out, &src, name, size);
  if (src.gzip) inflateEnd(&src.zs);
  return status;
}

int ddp_io_reshape(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(t, "reshape", "self"));
  if (ndim < 0 || ndim > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "reshape: %d dimensions (expected 0 to %d)", ndim, DDP_MAX_DIMS);
  DDP_TRY(ddp_shape_check("reshape", ndim, shape, 0)); /* Note [shape arithmetic] */
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel != t->numel)
    DDP_FAIL(DDP_ERR_ARG, "reshape: cannot view %s (%lld elements) as %s", DDP_SHAPE(t),
             (long long)t->numel, ddp_shape_str(ndim, shape));
  if (!ddp_tensor_is_contiguous(t))
    DDP_FAIL(DDP_ERR_ARG, "reshape: tensor %s is not contiguous", DDP_SHAPE(t));
  int64_t strides[DDP_MAX_DIMS];
  ddp_contiguous_strides(ndim, shape, strides);
  return ddp_tensor_view_raw(out, t, ndim, shape, strides, t->offset);
}
