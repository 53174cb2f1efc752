/* runtime/io/safetensors.c: safetensors checkpoint files
 * (https://github.com/huggingface/safetensors, "Format"): u64 little-endian header size N,
 * N bytes of JSON header, then the tensors' bytes. The writer is atomic (temporary file,
 * fsync, rename, directory fsync); the reader checks every field against the file before
 * reading any data. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/core.h"
#include "io/io_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes the host's bytes: little-endian hosts only"
#endif

/* Headers above this are refused (the safetensors library's own limit). */
#define MAX_HEADER ((uint64_t)100 * 1000 * 1000)

static const char *const st_names[DDP_DTYPE_COUNT] = {
    [DDP_F32] = "F32", [DDP_F64] = "F64", [DDP_F16] = "F16", [DDP_BF16] = "BF16",
    [DDP_I64] = "I64", [DDP_I32] = "I32", [DDP_U8] = "U8",   [DDP_BOOL] = "BOOL",
};

static int st_dtype(const char *name) {
  for (int d = 0; d < DDP_DTYPE_COUNT; d++)
    if (st_names[d] && strcmp(st_names[d], name) == 0) return d;
  return -1;
}

/* ---- a growable text buffer for the header ------------------------------------------ */

typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, long long v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, fmt, v);
  sb_put(b, tmp, (size_t)n);
}

/* s as a JSON string literal (RFC 8259: quote, backslash and control characters escaped). */
static void sb_json_string(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"') sb_put(b, "\\\"", 2);
    else if (*c == '\\') sb_put(b, "\\\\", 2);
    else if (*c < 0x20) {
      char tmp[8];
      snprintf(tmp, sizeof tmp, "\\u%04x", *c);
      sb_put(b, tmp, 6);
    } else sb_put(b, (const char *)c, 1);
  }
  sb_put(b, "\"", 1);
}

/* ---- writer ------------------------------------------------------------------------- */

/* Write all n bytes or fail with errno set. */
static int write_all(int fd, const void *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p = (const char *)p + w;
    n -= (size_t)w;
  }
  return 0;
}

/* fsync the directory holding `path`, so the rename itself is durable. */
static int fsync_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  int saved = errno;
  close(fd);
  errno = saved;
  return rc;
}

/* Note [checkpoint temp files]: the writer's temporary file is "<path>.tmp.<host>.<pid>".
 * An error removes it; a writer killed midway (kill -9, the machine's OOM killer, a
 * launcher's SIGKILL after its grace period) cannot, and each such kill used to leave a
 * whole checkpoint's worth of bytes behind. So every save (and ddp_io_sweep_temp_files at
 * the start of a run) first removes the temporary files of the same path whose writer is
 * gone: written on this host (the host name is in the file name, so a writer on another
 * node of a shared file system is never judged by our pids) by a pid that no longer
 * exists. The "<path>.tmp.<pid>" files of earlier versions are swept the same way. */

/* This host's name for temporary files: no '/' or '.', at most 63 bytes. */
static void host_tag(char *out, size_t cap) {
  char host[256];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "host");
  host[sizeof host - 1] = '\0';
  size_t k = 0;
  for (const char *c = host; *c && k + 1 < cap && k < 63; c++) out[k++] = (*c == '/' || *c == '.') ? '_' : *c;
  out[k] = '\0';
  if (!k) snprintf(out, cap, "host");
}

/* 1 when `digits` is a decimal pid that no process has now. */
static int dead_pid(const char *digits) {
  if (!*digits) return 0;
  char *end = NULL;
  long pid = strtol(digits, &end, 10);
  if (*end || pid <= 0 || pid > 0x7fffffffL) return 0;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int ddp_io_sweep_temp_files(const char *path, int *removed) {
  if (removed) *removed = 0;
  if (!path || !*path) DDP_FAIL(DDP_ERR_ARG, "sweep_temp_files: empty path");
  char dir[4096], prefix[1024], host[64];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  snprintf(prefix, sizeof prefix, "%s.tmp.", slash ? slash + 1 : path);
  host_tag(host, sizeof host);
  size_t plen = strlen(prefix), hlen = strlen(host);
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return DDP_OK; /* nothing written there yet */
    DDP_FAIL(DDP_ERR_IO, "sweep_temp_files: cannot list %s: %s", dir, strerror(errno));
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, plen) != 0) continue;
    const char *rest = e->d_name + plen; /* "<host>.<pid>" or (earlier versions) "<pid>" */
    const char *pid = rest;
    if (strncmp(rest, host, hlen) == 0 && rest[hlen] == '.') pid = rest + hlen + 1;
    else if (strchr(rest, '.')) continue; /* another host's writer: not ours to judge */
    if (!dead_pid(pid)) continue;
    char full[4096 + 1024];
    snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
    if (unlink(full) == 0 && removed) (*removed)++;
  }
  closedir(d);
  return DDP_OK;
}

int ddp_io_write_atomic(const char *path, const char *op, int n, const void *const *bufs,
                       const size_t *lens) {
  char host[64];
  host_tag(host, sizeof host);
  size_t plen = strlen(path) + sizeof host + 32;
  char *tmp = malloc(plen);
  if (!tmp) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  ddp_io_sweep_temp_files(path, NULL); /* Note [checkpoint temp files]; best effort */
  ddp_clear_error();
  snprintf(tmp, plen, "%s.tmp.%s.%ld", path, host, (long)getpid());
  int status = DDP_OK;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    status = DDP_ERROR(DDP_ERR_IO, "%s: cannot create %s: %s", op, tmp, strerror(errno));
    free(tmp);
    return status;
  }
  int failed = 0;
  for (int i = 0; i < n && !failed; i++)
    if (lens[i]) failed = write_all(fd, bufs[i], lens[i]);
  if (failed) {
    status = DDP_ERROR(DDP_ERR_IO, "%s: writing %s failed: %s", op, tmp, strerror(errno));
    goto done;
  }
  if (fsync(fd) != 0) {
    status = DDP_ERROR(DDP_ERR_IO, "%s: fsync of %s failed: %s", op, tmp, strerror(errno));
    goto done;
  }
  int rc = close(fd);
  fd = -1;
  if (rc != 0) {
    status = DDP_ERROR(DDP_ERR_IO, "%s: closing %s failed: %s", op, tmp, strerror(errno));
    goto done;
  }
  if (rename(tmp, path) != 0) {
    status = DDP_ERROR(DDP_ERR_IO, "%s: cannot rename %s to %s: %s", op, tmp, path, strerror(errno));
    goto done;
  }
  free(tmp);
  tmp = NULL; /* renamed: nothing to remove */
  if (fsync_dir(path) != 0)
    status = DDP_ERROR(DDP_ERR_IO, "%s: %s written, but fsync of its directory failed: %s", op, path,
                       strerror(errno));
done:
  if (fd >= 0) close(fd);
  if (tmp) {
    unlink(tmp);
    free(tmp);
  }
  return status;
}

int ddp_io_save_safetensors(const char *path, int n, const char *const *names,
                            ddp_tensor **tensors, int nmeta, const char *const *keys,
                            const char *const *values) {
  if (!path || !*path) DDP_FAIL(DDP_ERR_ARG, "save_safetensors: empty path");
  if (n < 0 || nmeta < 0 || (n && (!names || !tensors)) || (nmeta && (!keys || !values)))
    DDP_FAIL(DDP_ERR_ARG, "save_safetensors: %s: bad counts (%d tensors, %d metadata pairs)", path, n, nmeta);
  for (int i = 0; i < n; i++) {
    if (!names[i] || !*names[i]) DDP_FAIL(DDP_ERR_ARG, "save_safetensors: %s: tensor %d has an empty name", path, i);
    if (strcmp(names[i], "__metadata__") == 0)
      DDP_FAIL(DDP_ERR_ARG, "save_safetensors: %s: '__metadata__' is reserved and cannot name a tensor", path);
    char arg[64];
    snprintf(arg, sizeof arg, "tensor '%.40s'", names[i]);
    DDP_TRY(ddp_check_alive(tensors[i], "save_safetensors", arg));
    if (tensors[i]->device != DDP_DEVICE_CPU)
      DDP_FAIL(DDP_ERR_ARG, "save_safetensors: %s: tensor '%s' is not on the CPU", path, names[i]);
    for (int j = 0; j < i; j++)
      if (strcmp(names[i], names[j]) == 0)
        DDP_FAIL(DDP_ERR_ARG, "save_safetensors: %s: two tensors are named '%s'", path, names[i]);
  }
  for (int i = 0; i < nmeta; i++)
    if (!keys[i] || !values[i]) DDP_FAIL(DDP_ERR_ARG, "save_safetensors: %s: metadata pair %d is NULL", path, i);

  /* Data order: larger elements first (stable), so every tensor starts aligned to its
   * element size (the header is padded to 8 bytes), as the safetensors library does. */
  int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
  ddp_tensor **data = calloc((size_t)(n ? n : 1), sizeof *data);
  sbuf h = {0};
  int status = DDP_OK;
  if (!order || !data) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "save_safetensors: out of memory");
    goto done;
  }
  int k = 0;
  for (size_t es = 8; es >= 1; es /= 2)
    for (int i = 0; i < n; i++)
      if (ddp_dtype_size(tensors[i]->dtype) == es) order[k++] = i;

  /* contiguous detached host copies (or aliases) of the data: device tensors are fetched */
  for (int i = 0; i < n && !status; i++) {
    ddp_tensor *a = ddp_tensor_alias(tensors[i]);
    if (!a) {
      status = ddp_last_status();
      break;
    }
    if (a->device != DDP_DEVICE_CPU) status = ddp_tensor_to_device(&data[i], a, DDP_DEVICE_CPU, 0);
    else status = ddp_contiguous(&data[i], a);
    ddp_tensor_release(a);
  }
  if (status) goto done;

  sb_str(&h, "{");
  if (nmeta) {
    sb_str(&h, "\"__metadata__\":{");
    for (int i = 0; i < nmeta; i++) {
      if (i) sb_str(&h, ",");
      sb_json_string(&h, keys[i]);
      sb_str(&h, ":");
      sb_json_string(&h, values[i]);
    }
    sb_str(&h, "}");
  }
  int64_t offset = 0;
  for (int j = 0; j < n; j++) {
    int i = order[j];
    const ddp_tensor *t = data[i];
    int64_t bytes = t->numel * (int64_t)ddp_dtype_size(t->dtype);
    if (nmeta || j) sb_str(&h, ",");
    sb_json_string(&h, names[i]);
    sb_str(&h, ":{\"dtype\":\"");
    sb_str(&h, st_names[t->dtype]);
    sb_str(&h, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) sb_fmt(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
    sb_fmt(&h, "],\"data_offsets\":[%lld,", (long long)offset);
    sb_fmt(&h, "%lld]}", (long long)(offset + bytes));
    offset += bytes;
  }
  sb_str(&h, "}");
  while (!h.oom && h.n % 8) sb_str(&h, " ");
  if (h.oom) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "save_safetensors: out of memory for the header");
    goto done;
  }

  {
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)h.n >> (8 * b));
    const void **bufs = malloc((size_t)(n + 2) * sizeof *bufs);
    size_t *lens = malloc((size_t)(n + 2) * sizeof *lens);
    if (!bufs || !lens) {
      free(bufs);
      free(lens);
      status = DDP_ERROR(DDP_ERR_MEMORY, "save_safetensors: out of memory");
      goto done;
    }
    bufs[0] = len8, lens[0] = 8;
    bufs[1] = h.p, lens[1] = h.n;
    for (int j = 0; j < n; j++) {
      const ddp_tensor *t = data[order[j]];
      bufs[j + 2] = ddp_data(t);
      lens[j + 2] = (size_t)t->numel * ddp_dtype_size(t->dtype);
    }
    status = ddp_io_write_atomic(path, "save_safetensors", n + 2, bufs, lens);
    free(bufs);
    free(lens);
  }

done:
  if (data)
    for (int i = 0; i < n; i++) ddp_tensor_release(data[i]);
  free(data);
  free(order);
  free(h.p);
  return status;
}

/* ---- reader ------------------------------------------------------------------------- */

struct ddp_io_safetensors {
  int n, nmeta;
  char **names;
  ddp_tensor **tensors;
  char **keys, **values;
};

void ddp_io_safetensors_free(ddp_io_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) {
    free(f->names[i]);
    ddp_tensor_release(f->tensors[i]);
  }
  for (int i = 0; i < f->nmeta; i++) {
    free(f->keys[i]);
    free(f->values[i]);
  }
  free(f->names);
  free(f->tensors);
  free(f->keys);
  free(f->values);
  free(f);
}

int ddp_io_safetensors_count(const ddp_io_safetensors *f) { return f ? f->n : 0; }
int ddp_io_safetensors_metadata_count(const ddp_io_safetensors *f) { return f ? f->nmeta : 0; }
const char *ddp_io_safetensors_name(const ddp_io_safetensors *f, int i) {
  return f && i >= 0 && i < f->n ? f->names[i] : NULL;
}
const char *ddp_io_safetensors_metadata_key(const ddp_io_safetensors *f, int i) {
  return f && i >= 0 && i < f->nmeta ? f->keys[i] : NULL;
}
const char *ddp_io_safetensors_metadata_value(const ddp_io_safetensors *f, int i) {
  return f && i >= 0 && i < f->nmeta ? f->values[i] : NULL;
}
int ddp_io_safetensors_tensor(ddp_tensor **out, const ddp_io_safetensors *f, int i) {
  *out = NULL;
  if (!f || i < 0 || i >= f->n)
    DDP_FAIL(DDP_ERR_ARG, "safetensors_tensor: index %d out of range (%d tensors)", i, f ? f->n : 0);
  ddp_tensor_retain(f->tensors[i]);
  *out = f->tensors[i];
  return DDP_OK;
}

/* A JSON number that is an integer in [0, 2^53], or -1. */
static int64_t json_uint(const cJSON *v) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0) || d > 9007199254740992.0 || d != floor(d)) return -1;
  return (int64_t)d;
}

typedef struct {
  const char *name;
  int dtype, ndim;
  int64_t shape[DDP_MAX_DIMS];
  int64_t begin, end;
} entry;

static int cmp_entry(const void *a, const void *b) {
  const entry *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* Parse one tensor entry; the error names the file and the tensor. */
static int parse_entry(entry *e, const cJSON *item, const char *path, int64_t data_size) {
  e->name = item->string;
  if (!cJSON_IsObject(item))
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': entry is not a JSON object", path, e->name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': needs a string \"dtype\", an array \"shape\" and an array \"data_offsets\"",
             path, e->name);
  e->dtype = st_dtype(dt->valuestring);
  if (e->dtype < 0)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': unsupported dtype \"%s\" (F32 F64 F16 BF16 I64 I32 U8 BOOL)",
             path, e->name, dt->valuestring);
  int nd = cJSON_GetArraySize(sh);
  if (nd > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': %d dims (at most %d)", path, e->name, nd, DDP_MAX_DIMS);
  e->ndim = nd;
  /* span: the product of the sizes with each 0 counted as 1, which bounds numel and every
   * stride (Note [shape arithmetic]); at most 2^62, so the byte count below fits too */
  uint64_t numel = 1, span = 1;
  int d = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, sh) {
    int64_t s = json_uint(v);
    if (s < 0)
      DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': shape entry %d is not a non-negative integer",
               path, e->name, d);
    e->shape[d++] = s;
    uint64_t factor = s ? (uint64_t)s : 1;
    if (span > ((uint64_t)1 << 62) / factor)
      DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': shape %s is absurdly large (its "
               "sizes, each 0 counted as 1, multiply to more than 2^62)", path, e->name,
               ddp_shape_str(d, e->shape));
    span *= factor;
    numel *= (uint64_t)s;
  }
  /* bytes, not only elements: 2^62 F64 elements would wrap want below to 0 and pass for
   * data_offsets [0, 0] */
  if (numel > ((uint64_t)1 << 62) / ddp_dtype_size(e->dtype))
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': shape %s of %s is absurdly large (more than 2^62 bytes)",
             path, e->name, ddp_shape_str(nd, e->shape), dt->valuestring);
  if (cJSON_GetArraySize(off) != 2)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': data_offsets must be [begin, end]", path, e->name);
  e->begin = json_uint(cJSON_GetArrayItem(off, 0));
  e->end = json_uint(cJSON_GetArrayItem(off, 1));
  if (e->begin < 0 || e->end < 0 || e->begin > e->end || e->end > data_size)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': data_offsets [%lld, %lld] out of range: the data part has %lld bytes",
             path, e->name, (long long)e->begin, (long long)e->end, (long long)data_size);
  uint64_t want = numel * ddp_dtype_size(e->dtype);
  if ((uint64_t)(e->end - e->begin) != want)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but %s %s needs %llu",
             path, e->name, (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin),
             dt->valuestring, ddp_shape_str(nd, e->shape), (unsigned long long)want);
  return DDP_OK;
}

static int read_at(int fd, void *p, size_t n, int64_t at) {
  while (n > 0) {
    ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p = (char *)p + r;
    n -= (size_t)r;
    at += r;
  }
  return 0;
}

/* Note [one reader for files and bytes]: the reader parses a source, either a file (read
 * with pread, never whole into memory) or a buffer already in memory
 * (ddp_io_safetensors_load_bytes: bytes received from elsewhere, and the fuzz target
 * fuzz/safetensors_file.c). Both go through load() below, so every check the file path
 * makes is the one the fuzzer exercises; only src_read differs. */
typedef struct {
  int fd;                   /* the file, or -1: the bytes are `mem` */
  const unsigned char *mem;
  int64_t size;             /* bytes in the file or buffer */
} st_source;

/* n bytes at offset `at` of the source into p: 0, or -1 (errno set for a file; 0 for a
 * range past the end of a buffer, which load() never asks for). */
static int src_read(const st_source *src, void *p, size_t n, int64_t at) {
  if (src->fd >= 0) return read_at(src->fd, p, n, at);
  if (at < 0 || at > src->size || (uint64_t)n > (uint64_t)(src->size - at)) {
    errno = 0;
    return -1;
  }
  if (n) memcpy(p, src->mem + at, n);
  return 0;
}

static int load(ddp_io_safetensors *f, const st_source *src, const char *path) {
  int64_t size = src->size;
  if (size < 8)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: truncated: %lld bytes, shorter than the 8-byte header length",
             path, (long long)size);
  unsigned char len8[8];
  if (src_read(src, len8, 8, 0)) DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: read failed: %s", path, strerror(errno));
  uint64_t hlen = 0;
  for (int b = 7; b >= 0; b--) hlen = (hlen << 8) | len8[b];
  if (hlen > (uint64_t)(size - 8))
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: bad header length %llu: the file has only %lld bytes after it (truncated, or not a safetensors file)",
             path, (unsigned long long)hlen, (long long)(size - 8));
  if (hlen > MAX_HEADER)
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: header length %llu is above the 100 MB limit", path,
             (unsigned long long)hlen);
  char *text = malloc(hlen + 1);
  if (!text) DDP_FAIL(DDP_ERR_MEMORY, "load_safetensors: %s: out of memory for the header", path);
  if (src_read(src, text, hlen, 8)) {
    free(text);
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: read failed: %s", path, strerror(errno));
  }
  text[hlen] = 0;
  cJSON *root = cJSON_ParseWithLength(text, hlen);
  free(text);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s: the %llu-byte header is not a JSON object (corrupt, or not a safetensors file)",
             path, (unsigned long long)hlen);
  }
  int64_t data_start = 8 + (int64_t)hlen, data_size = size - data_start;
  int count = cJSON_GetArraySize(root);
  entry *es = calloc((size_t)(count ? count : 1), sizeof *es);
  int status = es ? DDP_OK : DDP_ERROR(DDP_ERR_MEMORY, "load_safetensors: out of memory");
  int n = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    if (status) break;
    if (strcmp(item->string, "__metadata__") == 0) {
      if (!cJSON_IsObject(item)) {
        status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: __metadata__ is not a JSON object", path);
        break;
      }
      /* a second one would be counted into the first one's arrays (a heap overflow that
       * fuzz/safetensors_json.c found) */
      if (f->keys) {
        status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: __metadata__ appears twice in the header", path);
        break;
      }
      int m = cJSON_GetArraySize(item);
      f->keys = calloc((size_t)(m ? m : 1), sizeof *f->keys);
      f->values = calloc((size_t)(m ? m : 1), sizeof *f->values);
      if (!f->keys || !f->values) {
        status = DDP_ERROR(DDP_ERR_MEMORY, "load_safetensors: out of memory");
        break;
      }
      const cJSON *kv;
      cJSON_ArrayForEach(kv, item) {
        if (!cJSON_IsString(kv)) {
          status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: metadata '%s' is not a string", path, kv->string);
          break;
        }
        f->keys[f->nmeta] = dupstr(kv->string);
        f->values[f->nmeta] = dupstr(kv->valuestring);
        f->nmeta++;
        if (!f->keys[f->nmeta - 1] || !f->values[f->nmeta - 1]) {
          status = DDP_ERROR(DDP_ERR_MEMORY, "load_safetensors: out of memory");
          break;
        }
      }
      continue;
    }
    for (int j = 0; j < n && !status; j++)
      if (strcmp(es[j].name, item->string) == 0)
        status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: tensor '%s' appears twice in the header", path, item->string);
    if (!status) status = parse_entry(&es[n++], item, path, data_size);
  }
  /* the tensors must tile the data part exactly: no gap, no overlap, nothing after */
  if (!status) {
    qsort(es, (size_t)n, sizeof *es, cmp_entry);
    int64_t at = 0;
    for (int j = 0; j < n && !status; j++) {
      if (es[j].begin != at)
        status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: tensor '%s' starts at data offset %lld but the previous tensor ends at %lld (%s)",
                           path, es[j].name, (long long)es[j].begin, (long long)at,
                           es[j].begin < at ? "overlap" : "gap");
      at = es[j].end;
    }
    if (!status && at != data_size)
      status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: the tensors' data ends at offset %lld but the file has %lld data bytes (truncated or trailing bytes)",
                         path, (long long)at, (long long)data_size);
  }
  if (!status) {
    f->names = calloc((size_t)(n ? n : 1), sizeof *f->names);
    f->tensors = calloc((size_t)(n ? n : 1), sizeof *f->tensors);
    if (!f->names || !f->tensors) status = DDP_ERROR(DDP_ERR_MEMORY, "load_safetensors: out of memory");
  }
  for (int j = 0; j < n && !status; j++) {
    entry *e = &es[j];
    ddp_tensor *t = NULL;
    status = ddp_tensor_empty(&t, e->ndim, e->shape, e->dtype, DDP_DEVICE_CPU);
    if (status) break;
    char *name = dupstr(e->name);
    f->names[f->n] = name;
    f->tensors[f->n] = t;
    f->n++;
    if (!name) {
      status = DDP_ERROR(DDP_ERR_MEMORY, "load_safetensors: out of memory");
      break;
    }
    if (e->end > e->begin && src_read(src, ddp_data(t), (size_t)(e->end - e->begin), data_start + e->begin))
      status = DDP_ERROR(DDP_ERR_IO, "load_safetensors: %s: tensor '%s': read failed: %s", path, e->name,
                         errno ? strerror(errno) : "unexpected end of file");
  }
  free(es);
  cJSON_Delete(root);
  return status;
}

/* Run load() on src into a new file object. */
static int load_source(ddp_io_safetensors **out, const st_source *src, const char *path) {
  ddp_io_safetensors *f = calloc(1, sizeof *f);
  if (!f) DDP_FAIL(DDP_ERR_MEMORY, "load_safetensors: out of memory");
  int status = load(f, src, path);
  if (status) {
    ddp_io_safetensors_free(f);
    return status;
  }
  *out = f;
  return DDP_OK;
}

int ddp_io_safetensors_load(ddp_io_safetensors **out, const char *path) {
  *out = NULL;
  if (!path) DDP_FAIL(DDP_ERR_ARG, "load_safetensors: path is NULL");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) DDP_FAIL(DDP_ERR_IO, "load_safetensors: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    DDP_FAIL(DDP_ERR_IO, "load_safetensors: %s is not a regular file", path);
  }
  st_source src = {fd, NULL, (int64_t)st.st_size};
  int status = load_source(out, &src, path);
  close(fd);
  return status;
}

int ddp_io_safetensors_load_bytes(ddp_io_safetensors **out, const void *data, size_t size,
                                  const char *name) {
  *out = NULL;
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "load_safetensors: data is NULL (size %zu)", size);
  if (size > (size_t)INT64_MAX) DDP_FAIL(DDP_ERR_ARG, "load_safetensors: %zu bytes is too many", size);
  st_source src = {-1, data, (int64_t)size};
  return load_source(out, &src, name ? name : "<bytes>");
}
