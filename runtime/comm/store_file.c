/* runtime/comm/store_file.c: the file store (file:// init), PyTorch's FileStore in spirit.
 *
 * Note [file store log]
 * The file is an append-only log of records
 *     u8 kind ('S' set, 'D' delete) | u32 key length | key | u32 value length | value
 * (little-endian). Every process keeps the table replayed from the log and the offset it has
 * read up to. Each call takes flock() on its own open file (shared to read, exclusive to
 * append), replays the records past its offset, then for a write appends its record: the
 * exclusive lock makes add and compare_set atomic across processes. Waits poll (1 .. 20 ms).
 * A record under FILE_REFS_KEY counts the open stores; the last one to close removes the
 * file. A file that shrank (removed and made again) is read again from the start.
 *
 * Note [stale file store]: a run whose last user of the file was killed leaves the file
 * behind with its keys, and the next run on the same path rendezvoused against the old
 * run's addresses ("connect [127.0.0.1]:4996: Connection refused", the file unnamed).
 * FILE_USERS_KEY lists the open stores as "<host>/<pid>" lines. A store that opens a file
 * whose count is above zero while every listed user is a process of this host that no
 * longer runs refuses it, naming the file and those processes. (Users on other hosts
 * cannot be judged from here: such a file is used as before.)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/store_wire.h"

/* Internal keys (not counted by num_keys): number of stores open on the file, and who they
 * are (Note [stale file store]). */
#define FILE_REFS_KEY "\001ddplua/file_store_refs"
#define FILE_USERS_KEY "\001ddplua/file_store_users"

struct store_file {
  int fd;
  char *path;
  off_t offset;       /* bytes of the log replayed into table */
  store_table table;
};

static int file_lock(ddp_store *s, int how) {
  char who[48];
  while (flock(s->file->fd, how) != 0) {
    if (errno == EINTR) continue;
    DDP_FAIL(DDP_ERR_IO, "%s: cannot lock the file store %s: %s", store_who(s, who, sizeof who),
             s->file->path, strerror(errno));
  }
  return DDP_OK;
}

static void file_unlock(ddp_store *s) { flock(s->file->fd, LOCK_UN); }

/* Replay the records appended since our last look (lock held). */
static int file_sync(ddp_store *s) {
  store_file *f = s->file;
  char who[48];
  struct stat st;
  if (fstat(f->fd, &st) != 0)
    DDP_FAIL(DDP_ERR_IO, "%s: cannot stat the file store %s: %s", store_who(s, who, sizeof who),
             f->path, strerror(errno));
  if (st.st_size < f->offset) {  // the file was made again: start over
    store_table_clear(&f->table);
    f->offset = 0;
  }
  if (st.st_size == f->offset) return DDP_OK;
  size_t n = (size_t)(st.st_size - f->offset);
  unsigned char *buf = malloc(n);
  if (!buf) DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory reading %zu bytes of %s", n, f->path);
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(f->fd, buf + got, n - got, f->offset + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      free(buf);
      DDP_FAIL(DDP_ERR_IO, "%s: cannot read the file store %s: %s", store_who(s, who, sizeof who),
               f->path, r < 0 ? strerror(errno) : "file shorter than its size");
    }
    got += (size_t)r;
  }
  size_t off = 0;
  int status = DDP_OK;
  while (off < n) {
    size_t klen, vlen;
    if (n - off < 5 || (buf[off] != 'S' && buf[off] != 'D')) goto corrupt;
    klen = store_get_u32(buf + off + 1);
    if (klen == 0 || klen > STORE_MAX_KEY || n - off - 5 < klen + 4) goto corrupt;
    vlen = store_get_u32(buf + off + 5 + klen);
    if (vlen > STORE_MAX_VALUE || n - off - 9 - klen < vlen) goto corrupt;
    const char *key = (const char *)buf + off + 5;
    if (buf[off] == 'S') status = store_table_set(&f->table, key, klen, buf + off + 9 + klen, vlen);
    else store_table_delete(&f->table, key, klen);
    if (status) {
      free(buf);
      DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory replaying %s", f->path);
    }
    off += 9 + klen + vlen;
  }
  free(buf);
  f->offset = st.st_size;
  return DDP_OK;
corrupt:
  free(buf);
  DDP_FAIL(DDP_ERR_IO, "%s: the file store %s has a corrupt record at offset %lld",
           store_who(s, who, sizeof who), f->path, (long long)(f->offset + (off_t)off));
}

/* Append one record (exclusive lock held, table in sync) and apply it. */
static int file_append(ddp_store *s, int kind, const char *key, const void *v, size_t vlen) {
  store_file *f = s->file;
  char who[48];
  size_t klen = strlen(key);
  store_buf b = {0};
  unsigned char hdr[5], l[4];
  hdr[0] = (unsigned char)kind;
  store_put_u32(hdr + 1, (uint32_t)klen);
  store_put_u32(l, (uint32_t)vlen);
  if (store_buf_append(&b, hdr, 5) || store_buf_append(&b, key, klen) || store_buf_append(&b, l, 4) ||
      store_buf_append(&b, v, vlen)) {
    store_buf_free(&b);
    DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory for a record of %zu bytes", vlen);
  }
  size_t done = 0;
  while (done < b.len) {
    ssize_t w = pwrite(f->fd, b.data + done, b.len - done, f->offset + (off_t)done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      store_buf_free(&b);
      DDP_FAIL(DDP_ERR_IO, "%s: cannot write the file store %s: %s", store_who(s, who, sizeof who),
               f->path, strerror(e));
    }
    done += (size_t)w;
  }
  store_buf_free(&b);
  f->offset += (off_t)done;
  if (kind == 'D') store_table_delete(&f->table, key, klen);
  else if (store_table_set(&f->table, key, klen, v, vlen))
    DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory for a value of %zu bytes", vlen);
  return DDP_OK;
}

/* Lock, sync and, for writes, run `body` under the exclusive lock. */
#define WITH_LOCK(s, how, body)          \
  do {                                   \
    DDP_TRY(file_lock((s), (how)));      \
    int st_ = file_sync(s);              \
    if (!st_) st_ = (body);              \
    file_unlock(s);                      \
    return st_;                          \
  } while (0)

static int add_locked(ddp_store *s, const char *key, int64_t delta, int64_t *result) {
  char who[48];
  int64_t cur = 0;
  store_entry *e = store_table_find(&s->file->table, key, strlen(key));
  if (e && store_parse_i64(e->value, e->vlen, &cur))
    DDP_FAIL(DDP_ERR_IO, "%s: add to key '%.200s': the value is not a decimal integer",
             store_who(s, who, sizeof who), key);
  int64_t now;
  if (__builtin_add_overflow(cur, delta, &now))  // an error, never a wrap (as the TCP server)
    DDP_FAIL(DDP_ERR_IO, "%s: add to key '%.200s': adding %lld to %lld overflows a 64-bit integer (the value is unchanged)",
             store_who(s, who, sizeof who), key, (long long)delta, (long long)cur);
  char text[32];
  int n = snprintf(text, sizeof text, "%lld", (long long)now);
  DDP_TRY(file_append(s, 'S', key, text, (size_t)n));
  *result = now;
  return DDP_OK;
}

/* "<host>/<pid>" of this process (Note [stale file store]). */
static void user_tag(char *out, size_t cap) {
  char host[256];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  snprintf(out, cap, "%.200s/%ld", host, (long)getpid());
}

/* The users list with `tag` added (add) or removed (!add), into a malloc'd string. */
static char *users_edit(const store_entry *e, const char *tag, int add) {
  size_t have = e ? e->vlen : 0, tlen = strlen(tag);
  char *out = malloc(have + tlen + 2);
  if (!out) return NULL;
  size_t n = 0;
  const char *v = e ? (const char *)e->value : "";
  for (size_t i = 0; i < have;) {
    const char *nl = memchr(v + i, '\n', have - i);
    size_t len = nl ? (size_t)(nl - (v + i)) : have - i;
    if (len && !(len == tlen && memcmp(v + i, tag, tlen) == 0)) {
      memcpy(out + n, v + i, len);
      n += len;
      out[n++] = '\n';
    }
    i += len + 1;
  }
  if (add) {
    memcpy(out + n, tag, tlen);
    n += tlen;
    out[n++] = '\n';
  }
  out[n] = '\0';
  return out;
}

/* Lock held, log replayed: fail naming the file when it is stale (Note [stale file store]). */
static int check_stale(ddp_store *s, int64_t refs) {
  store_file *f = s->file;
  store_entry *e = store_table_find(&f->table, FILE_USERS_KEY, strlen(FILE_USERS_KEY));
  if (refs <= 0 || !e || !e->vlen) return DDP_OK;
  char host[256], dead[512] = "";
  if (gethostname(host, sizeof host) != 0) return DDP_OK;
  host[sizeof host - 1] = '\0';
  size_t hlen = strlen(host), dn = 0;
  const char *v = (const char *)e->value;
  for (size_t i = 0; i < e->vlen;) {
    const char *nl = memchr(v + i, '\n', e->vlen - i);
    size_t len = nl ? (size_t)(nl - (v + i)) : e->vlen - i;
    if (len) {
      if (len <= hlen + 1 || memcmp(v + i, host, hlen) != 0 || v[i + hlen] != '/') return DDP_OK;
      char num[24];
      size_t nlen = len - hlen - 1 < sizeof num - 1 ? len - hlen - 1 : sizeof num - 1;
      memcpy(num, v + i + hlen + 1, nlen);
      num[nlen] = '\0';
      long pid = strtol(num, NULL, 10);
      if (pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH) return DDP_OK; /* alive */
      if (dn < sizeof dead - 24) dn += (size_t)snprintf(dead + dn, sizeof dead - dn, "%s%ld", dn ? ", " : "", pid);
    }
    i += len + 1;
  }
  DDP_FAIL(DDP_ERR_STATE,
           "store: the file store %s is left over from an earlier run: its processes on this "
           "host (pid %s) ended without closing it; remove the file or use a path no run has "
           "used",
           f->path, dead);
}

int store_file_open(store_file **out, const char *path) {
  *out = NULL;
  store_file *f = calloc(1, sizeof *f);
  char *p = strdup(path);
  if (!f || !p) {
    free(f);
    free(p);
    DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory");
  }
  f->path = p;
  /* 0600: the file is the job's rendezvous; only its owner may read or forge records (the
   * file store's only protection: it has no secret). */
  f->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (f->fd < 0) {
    int e = errno;
    free(p);
    free(f);
    DDP_FAIL(DDP_ERR_IO, "store: cannot open the file store %s: %s", path, strerror(e));
  }
  /* Count this store among the file's users (a temporary ddp_store to reuse the helpers). */
  ddp_store tmp = {0};
  tmp.rank = -1;
  tmp.file = f;
  int64_t refs;
  int st = file_lock(&tmp, LOCK_EX);
  if (!st) {
    st = file_sync(&tmp);
    store_entry *r = st ? NULL : store_table_find(&f->table, FILE_REFS_KEY, strlen(FILE_REFS_KEY));
    refs = 0;
    if (r) store_parse_i64(r->value, r->vlen, &refs);
    if (!st) st = check_stale(&tmp, refs);
    if (!st) st = add_locked(&tmp, FILE_REFS_KEY, 1, &refs);
    if (!st) {
      char tag[256];
      user_tag(tag, sizeof tag);
      char *users = users_edit(store_table_find(&f->table, FILE_USERS_KEY, strlen(FILE_USERS_KEY)), tag, 1);
      st = users ? file_append(&tmp, 'S', FILE_USERS_KEY, users, strlen(users))
                 : DDP_ERROR(DDP_ERR_MEMORY, "store: out of memory");
      free(users);
    }
    file_unlock(&tmp);
  }
  if (st) {
    close(f->fd);
    store_table_clear(&f->table);
    free(p);
    free(f);
    return st;
  }
  *out = f;
  return DDP_OK;
}

void store_file_close(store_file *f) {
  if (!f) return;
  ddp_store tmp = {0};
  tmp.rank = -1;
  tmp.file = f;
  int64_t refs = 1;
  if (file_lock(&tmp, LOCK_EX) == DDP_OK) {
    if (file_sync(&tmp) == DDP_OK && add_locked(&tmp, FILE_REFS_KEY, -1, &refs) == DDP_OK) {
      if (refs <= 0) {
        unlink(f->path);  // last user: remove, as PyTorch's FileStore does
      } else {             // no longer a user (Note [stale file store])
        char tag[256];
        user_tag(tag, sizeof tag);
        char *users = users_edit(store_table_find(&f->table, FILE_USERS_KEY, strlen(FILE_USERS_KEY)), tag, 0);
        if (users) file_append(&tmp, 'S', FILE_USERS_KEY, users, strlen(users));
        free(users);
      }
    }
    file_unlock(&tmp);
  }
  ddp_clear_error();
  close(f->fd);
  store_table_clear(&f->table);
  free(f->path);
  free(f);
}

int store_file_set(ddp_store *s, const char *key, const void *v, size_t len) {
  WITH_LOCK(s, LOCK_EX, file_append(s, 'S', key, v ? v : "", len));
}

int store_file_add(ddp_store *s, const char *key, int64_t delta, int64_t *result) {
  WITH_LOCK(s, LOCK_EX, add_locked(s, key, delta, result));
}

static int copy_value(const void *v, size_t len, void **out, size_t *olen) {
  unsigned char *c = malloc(len + 1);
  if (!c) DDP_FAIL(DDP_ERR_MEMORY, "store: out of memory for a value of %zu bytes", len);
  if (len) memcpy(c, v, len);
  c[len] = 0;
  *out = c;
  if (olen) *olen = len;
  return DDP_OK;
}

static int cas_locked(ddp_store *s, const char *key, const void *e, size_t elen, const void *d,
                      size_t dlen, void **r, size_t *rlen) {
  store_entry *cur = store_table_find(&s->file->table, key, strlen(key));
  if ((!cur && elen == 0) ||
      (cur && cur->vlen == elen && (elen == 0 || memcmp(cur->value, e, elen) == 0))) {
    DDP_TRY(file_append(s, 'S', key, d ? d : "", dlen));
    return copy_value(d, dlen, r, rlen);
  }
  if (cur) return copy_value(cur->value, cur->vlen, r, rlen);
  return copy_value(e, elen, r, rlen);
}

int store_file_cas(ddp_store *s, const char *key, const void *e, size_t elen, const void *d,
                   size_t dlen, void **r, size_t *rlen) {
  WITH_LOCK(s, LOCK_EX, cas_locked(s, key, e, elen, d, dlen, r, rlen));
}

static int delete_locked(ddp_store *s, const char *key, int *deleted) {
  *deleted = store_table_find(&s->file->table, key, strlen(key)) != NULL;
  if (*deleted) DDP_TRY(file_append(s, 'D', key, "", 0));
  return DDP_OK;
}

int store_file_delete(ddp_store *s, const char *key, int *deleted) {
  WITH_LOCK(s, LOCK_EX, delete_locked(s, key, deleted));
}

static int present_locked(ddp_store *s, const char *const *keys, int n, int *all) {
  *all = 1;
  for (int i = 0; i < n && *all; i++)
    *all = store_table_find(&s->file->table, keys[i], strlen(keys[i])) != NULL;
  return DDP_OK;
}

int store_file_check(ddp_store *s, const char *const *keys, int n, int *all) {
  WITH_LOCK(s, LOCK_SH, present_locked(s, keys, n, all));
}

static int count_locked(ddp_store *s, int64_t *n) {
  int64_t c = (int64_t)s->file->table.count;
  if (store_table_find(&s->file->table, FILE_REFS_KEY, strlen(FILE_REFS_KEY))) c--;
  if (store_table_find(&s->file->table, FILE_USERS_KEY, strlen(FILE_USERS_KEY))) c--;
  *n = c;
  return DDP_OK;
}

int store_file_num_keys(ddp_store *s, int64_t *n) { WITH_LOCK(s, LOCK_SH, count_locked(s, n)); }

/* Poll until the keys are all present or the timeout passes. */
static int poll_keys(ddp_store *s, const char *const *keys, int n, double timeout_s,
                     const char *during) {
  char who[48];
  double deadline = store_now() + timeout_s, pause = 0.001;
  for (;;) {
    int all = 0;
    DDP_TRY(store_file_check(s, keys, n, &all));
    if (all) return DDP_OK;
    double left = deadline - store_now();
    if (left <= 0)
      DDP_FAIL(DDP_ERR_TIMEOUT, "%s: %s timed out after %.1f s (file store %s)",
               store_who(s, who, sizeof who), during, timeout_s, s->file->path);
    usleep((useconds_t)(1e6 * (pause < left ? pause : left)));
    if (pause < 0.02) pause *= 2;
  }
}

int store_file_wait(ddp_store *s, const char *const *keys, int n, double timeout_s) {
  char during[600], list[520];
  snprintf(during, sizeof during, "wait for key%s %s", n > 1 ? "s" : "",
           store_keys_text(keys, n, list, sizeof list));
  return poll_keys(s, keys, n, timeout_s, during);
}

static int get_locked(ddp_store *s, const char *key, void **v, size_t *len) {
  store_entry *e = store_table_find(&s->file->table, key, strlen(key));
  if (!e) DDP_FAIL(DDP_ERR_STATE, "store: key '%.200s' vanished", key);
  return copy_value(e->value, e->vlen, v, len);
}

int store_file_get(ddp_store *s, const char *key, void **v, size_t *len) {
  char during[256];
  snprintf(during, sizeof during, "get: wait for key '%.200s'", key);
  for (;;) {
    DDP_TRY(poll_keys(s, &key, 1, store_timeout(s), during));
    DDP_TRY(file_lock(s, LOCK_SH));
    int st = file_sync(s);
    int present = !st && store_table_find(&s->file->table, key, strlen(key)) != NULL;
    if (present) st = get_locked(s, key, v, len);
    file_unlock(s);
    if (st || present) return st;  // else deleted between the two looks: wait again
  }
}
