/* runtime/distributed/pg_shm.c: all-reduce through a POSIX shared-memory segment for a process
 * group whose ranks all run on this host (see pg_shm.h). Loopback TCP costs two kernel
 * copies per byte and a round of wake-ups per message; here each byte is copied in once,
 * read once by the rank that reduces it, and copied out once.
 *
 * Segment layout (created by rank 0, name published through the store, unlinked once every
 * rank mapped it):
 *   header: one LINE-sized record per rank (sequence counter, pid, closed flag), so ranks
 *           publishing at once never share a cache line; then two DDP_SHM_FP_BYTES
 *           fingerprint records per rank (Note [shm arrival]);
 *   slots:  one SLOT_BYTES input slot per rank;
 *   result: SLOT_BYTES, each rank writes its 1/world share of the reduced chunk there.
 *
 * Note [shm arrival]: every collective of the group starts with one arrival step
 * (ddp_shm_arrive): write this rank's fingerprint (Note [collective fingerprints] in
 * pg_fingerprint.h) -- and, for an all-reduce, copy its first chunk into its slot --,
 * and its digest next to its sequence counter, publish seq+1, wait until every rank did,
 * compare the digests (in the cache lines the wait reads anyway); only when they differ
 * are the full records read. So the fingerprint exchange costs next to nothing for an
 * all-reduce (it rides on step 1 below) and one wait of the segment for the collectives
 * that then go through Gloo. Fingerprint records
 * alternate between two buffers per rank (by the parity of the arrival count): a rank
 * writes arrival k+2's record only after every rank published arrival k+1, which each
 * does after it read arrival k's records.
 *
 * Per chunk of at most SLOT_BYTES (every rank runs the same steps; `seq` counts steps):
 *   1. copy this rank's chunk into its slot; publish seq+1; wait until every rank did
 *      (for the first chunk this is the arrival step);
 *   2. reduce this rank's share [lo, hi) over slots 0 .. world-1 in rank order into the
 *      result area; publish seq+2; wait until every rank did;
 *   3. copy the whole result out.
 * No third wait is needed: a rank overwrites its slot (next step 1) only after every rank
 * passed this chunk's step 2 wait, so nobody reads the slot any more; and the result area is
 * rewritten (next step 2) only after every rank published the next step 1, which each rank
 * does after its step 3 copy. Bitwise identical results: each element is reduced exactly
 * once, by one rank, in rank order.
 *
 * Waiting spins briefly, then yields, then sleeps with a growing period (ranks share few
 * cores), and every few milliseconds checks that the missing ranks' processes still live. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "distributed/gloo_shim.h"
#include "distributed/pg_shm.h"

enum {
  SLOT_BYTES = 4 << 20,
  LINE = 128,          /* two cache lines: adjacent-line prefetch must not couple ranks */
  SPINS = 200,         /* busy checks before yielding */
  YIELD_NS = 30000,    /* then sched_yield for this long */
  SLEEP_MIN_NS = 10000,
  SLEEP_MAX_NS = 250000,
  CHECK_NS = 3000000   /* peer liveness check period */
};

typedef struct {
  _Atomic uint64_t seq;
  _Atomic int32_t pid;
  _Atomic int32_t closed;
  uint64_t digest;      /* of the last arrival's fingerprint, published with seq */
} rank_record;

struct ddp_shm {
  int rank, size;
  int *global;          /* group rank -> global rank, for messages */
  unsigned char *base;
  size_t len;
  size_t header_bytes;
  uint64_t seq;         /* this rank's last published step */
  uint64_t arrivals;    /* arrival steps so far (Note [shm arrival]) */
};

static rank_record *record(ddp_shm *s, int r) {
  return (rank_record *)(s->base + (size_t)r * LINE);
}

static unsigned char *slot(ddp_shm *s, int r) {
  return s->base + s->header_bytes + (size_t)r * SLOT_BYTES;
}

static unsigned char *result_area(ddp_shm *s) { return slot(s, s->size); }

/* Rank r's fingerprint record of parity `which` (Note [shm arrival]). */
static unsigned char *fp_record(ddp_shm *s, int r, int which) {
  return s->base + (size_t)s->size * LINE + ((size_t)r * 2 + (size_t)which) * DDP_SHM_FP_BYTES;
}

/* ---- host identity and setup ------------------------------------------------------- */

static int read_line(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int ok = fgets(out, (int)cap, f) != NULL;
  fclose(f);
  if (ok) out[strcspn(out, "\n")] = 0;
  return ok && out[0];
}

/* Host name, boot id and the namespaces that make shm names and pids mean the same thing
 * in two processes; 0 when part of it cannot be read (then shared memory is not used). */
static int host_identity(char *out, size_t cap) {
  char host[256] = "", boot[128] = "", ns[3][128];
  static const char *const ns_paths[3] = {"/proc/self/ns/ipc", "/proc/self/ns/pid",
                                          "/proc/self/ns/mnt"};
  if (gethostname(host, sizeof host - 1) != 0) return 0;
  if (!read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot)) return 0;
  for (int i = 0; i < 3; i++) {
    ssize_t n = readlink(ns_paths[i], ns[i], sizeof ns[i] - 1);
    if (n <= 0) return 0;
    ns[i][n] = 0;
  }
  snprintf(out, cap, "%s|%s|%s|%s|%s", host, boot, ns[0], ns[1], ns[2]);
  return 1;
}

static int store_get_str(ddp_store *store, const char *key, char **out) {
  void *v = NULL;
  size_t n = 0;
  int st = ddp_store_get(store, key, &v, &n);
  *out = st ? NULL : (char *)v; /* NUL-terminated by the store */
  return st;
}

/* Note [shm segment names]: a segment's name carries 128 bits from the kernel's random
 * source, so nobody can plant a file under it beforehand; rank 0 creates it exclusively
 * (O_EXCL) with mode 0600, so a planted name fails creation instead of being shared; the
 * other ranks map a published name only when it has our form and, once opened, the object
 * is a regular file owned by this user, open to no one else, of the expected size. A name
 * that fails any check is not used (the group falls back to Gloo's path).
 * Returns 0, or -1 when the kernel gives no random bytes (then shared memory is not used). */
static int segment_name(char *out, size_t cap, const char *prefix) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = prefix; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  uint64_t token[2];
  size_t got = 0;
  while (got < sizeof token) {
    ssize_t n = getrandom((char *)token + got, sizeof token - got, 0);
    if (n > 0) got += (size_t)n;
    else if (!(n < 0 && errno == EINTR)) return -1;
  }
  snprintf(out, cap, "/ddplua.%d.%016llx.%016llx%016llx", (int)getpid(), (unsigned long long)h,
           (unsigned long long)token[0], (unsigned long long)token[1]);
  return 0;
}

/* Has `name` the form segment_name gives (Note [shm segment names])? */
static int name_has_our_form(const char *name) {
  if (strncmp(name, "/ddplua.", 8) != 0 || strlen(name) > 200) return 0;
  for (const char *p = name + 1; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == '.' ||
          (p < name + 7 && *p >= 'a' && *p <= 'z')))
      return 0;
  return 1;
}

/* Map the segment `name` of `len` bytes (create: rank 0 makes and sizes it). Note [shm
 * segment names]. */
static unsigned char *map_segment(const char *name, size_t len, int create) {
  if (!create && !name_has_our_form(name)) return NULL;
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return NULL;
  int ok = 1;
  if (create) {
    /* Reserve the pages now: a full /dev/shm must fail here, not SIGBUS later. */
    ok = fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)len) == 0 &&
         posix_fallocate(fd, 0, (off_t)len) == 0;
  } else {
    struct stat st;
    ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
         (st.st_mode & 077) == 0 && (size_t)st.st_size == len;
  }
  void *p = ok ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
               : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name);
    return NULL;
  }
  return p;
}

static int setup_failed(const char *prefix, int me, const char *what) {
  ddp_error_prefix("init_process_group: rank %d, shared-memory setup of group '%s' (%s)", me,
                   prefix, what);
  return ddp_last_status();
}

int ddp_shm_new(ddp_shm **out, ddp_store *store, const char *prefix, int rank, int world_size,
                const int *global) {
  *out = NULL;
  if (world_size < 2) return DDP_OK; /* every rank has the same size: no split */
  int me = global[rank];
  const char *env = getenv("DDPLUA_SHM");
  char id[1024] = "off", key[768];
  if (!(env && strcmp(env, "0") == 0) && !host_identity(id, sizeof id)) snprintf(id, sizeof id, "off");

  /* Vote: every rank publishes its identity (or "off"), then reads all of them, so every
   * rank reaches the same decision from the same values. */
  snprintf(key, sizeof key, "%s/ddp_shm/host/%d", prefix, rank);
  if (ddp_store_set(store, key, id, strlen(id))) return setup_failed(prefix, me, "host identity");
  int same = strcmp(id, "off") != 0;
  char *first = NULL;
  for (int r = 0; r < world_size; r++) {
    char *v = NULL;
    snprintf(key, sizeof key, "%s/ddp_shm/host/%d", prefix, r);
    if (store_get_str(store, key, &v)) {
      ddp_store_free_value(first);
      return setup_failed(prefix, me, "host identity");
    }
    if (r == 0) first = v;
    else {
      same = same && strcmp(v, first) == 0;
      ddp_store_free_value(v);
    }
  }
  same = same && strcmp(first, "off") != 0;
  ddp_store_free_value(first);
  if (!same) return DDP_OK;

  size_t header = ((size_t)world_size * (LINE + 2 * DDP_SHM_FP_BYTES) + 4095) & ~(size_t)4095;
  size_t len = header + (size_t)(world_size + 1) * SLOT_BYTES;
  char name[256] = "";
  unsigned char *base = NULL;
  snprintf(key, sizeof key, "%s/ddp_shm/name", prefix);
  if (rank == 0) {
    base = segment_name(name, sizeof name, prefix) == 0 ? map_segment(name, len, 1) : NULL;
    const char *pub = base ? name : ""; /* "": rank 0 could not create it */
    if (ddp_store_set(store, key, pub, strlen(pub))) {
      if (base) {
        shm_unlink(name);
        munmap(base, len);
      }
      return setup_failed(prefix, me, "segment name");
    }
  } else {
    char *v = NULL;
    if (store_get_str(store, key, &v)) return setup_failed(prefix, me, "segment name");
    snprintf(name, sizeof name, "%s", v);
    ddp_store_free_value(v);
    if (name[0]) base = map_segment(name, len, 0);
  }
  if (base) {
    rank_record *rec = (rank_record *)(base + (size_t)rank * LINE);
    atomic_store_explicit(&rec->pid, (int32_t)getpid(), memory_order_release);
  }

  /* Second vote: used only when every rank mapped it. Rank 0 unlinks the name once every
   * rank answered (mapped or not), so nothing is left in /dev/shm. */
  snprintf(key, sizeof key, "%s/ddp_shm/mapped/%d", prefix, rank);
  int status = ddp_store_set(store, key, base ? "1" : "0", 1);
  int all = base != NULL;
  for (int r = 0; r < world_size && !status; r++) {
    char *v = NULL;
    snprintf(key, sizeof key, "%s/ddp_shm/mapped/%d", prefix, r);
    status = store_get_str(store, key, &v);
    if (!status) {
      all = all && v[0] == '1';
      ddp_store_free_value(v);
    }
  }
  if (rank == 0 && base) shm_unlink(name);
  if (status || !all) {
    if (base) munmap(base, len);
    return status ? setup_failed(prefix, me, "mapping vote") : DDP_OK;
  }

  ddp_shm *s = calloc(1, sizeof *s);
  int *g = malloc(sizeof(int) * (size_t)world_size);
  if (!s || !g) {
    free(s);
    free(g);
    munmap(base, len);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  }
  memcpy(g, global, sizeof(int) * (size_t)world_size);
  s->rank = rank;
  s->size = world_size;
  s->global = g;
  s->base = base;
  s->len = len;
  s->header_bytes = header;
  *out = s;
  return DDP_OK;
}

void ddp_shm_free(ddp_shm *s) {
  if (!s) return;
  atomic_store_explicit(&record(s, s->rank)->closed, 1, memory_order_release);
  munmap(s->base, s->len);
  free(s->global);
  free(s);
}

int ddp_shm_supports(int dtype) { return dtype == DDP_F32 || dtype == DDP_F64; }

/* ---- waiting ------------------------------------------------------------------------- */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* 1 when process pid is gone: no such process, or a zombie waiting to be reaped. */
static int process_gone(int pid) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *paren = strrchr(buf, ')'); /* the state follows the command name */
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The first group rank whose counter is below target; -1 when all reached it. */
static int first_missing(ddp_shm *s, uint64_t target) {
  for (int r = 0; r < s->size; r++)
    if (atomic_load_explicit(&record(s, r)->seq, memory_order_acquire) < target) return r;
  return -1;
}

/* A missing rank that closed the group or whose process died: fail naming it. */
static int check_peers(ddp_shm *s, uint64_t target, const char *phase, char *err, int *peer) {
  for (int r = 0; r < s->size; r++) {
    rank_record *rec = record(s, r);
    if (r == s->rank || atomic_load_explicit(&rec->seq, memory_order_acquire) >= target) continue;
    int pid = atomic_load_explicit(&rec->pid, memory_order_acquire);
    int closed = atomic_load_explicit(&rec->closed, memory_order_acquire);
    if (closed || process_gone(pid)) {
      *peer = r;
      snprintf(err, DDP_GLOO_ERR_CAP, "shared memory: rank %d (pid %d) %s while rank %d waited "
               "for it (%s)", s->global[r], pid, closed ? "closed the group" : "exited",
               s->global[s->rank], phase);
      return DDP_ERR_PEER;
    }
  }
  return DDP_OK;
}

static int wait_all(ddp_shm *s, uint64_t target, double timeout_s, const char *phase,
                    char *err, int *peer) {
  for (int i = 0; i < SPINS; i++) {
    if (first_missing(s, target) < 0) return DDP_OK;
    cpu_relax();
  }
  int64_t start = now_ns(), last_check = start, sleep_ns = SLEEP_MIN_NS;
  int64_t limit = (int64_t)((timeout_s < 1e9 ? timeout_s : 1e9) * 1e9); /* no overflow */
  for (;;) {
    if (first_missing(s, target) < 0) return DDP_OK;
    int64_t t = now_ns();
    if (t - last_check >= CHECK_NS) {
      last_check = t;
      int st = check_peers(s, target, phase, err, peer);
      if (st) return st;
    }
    if (t - start >= limit) {
      char who[256] = "";
      size_t used = 0;
      for (int r = 0; r < s->size && used < sizeof who - 16; r++)
        if (atomic_load_explicit(&record(s, r)->seq, memory_order_acquire) < target)
          used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", used ? ", " : "",
                                   s->global[r]);
      *peer = first_missing(s, target);
      snprintf(err, DDP_GLOO_ERR_CAP, "shared memory: rank %d waited %g s (%s) for rank(s) %s, "
               "which did not arrive", s->global[s->rank], timeout_s, phase, who);
      return DDP_ERR_TIMEOUT;
    }
    if (t - start < YIELD_NS) {
      sched_yield();
    } else {
      struct timespec ts = {0, (long)sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < SLEEP_MAX_NS) sleep_ns *= 2;
    }
  }
}

static void publish(ddp_shm *s) {
  atomic_store_explicit(&record(s, s->rank)->seq, ++s->seq, memory_order_release);
}

/* ---- reduction ----------------------------------------------------------------------- */

/* out[0 .. n) = op over ranks 0 .. size-1 (in order) of slot r's elements lo .. lo+n. */
#define DEFINE_REDUCE(name, T)                                                             \
  static void name(ddp_shm *s, T *restrict out, size_t lo, size_t n, int op) {             \
    memcpy(out, (const T *)slot(s, 0) + lo, n * sizeof(T));                                \
    for (int r = 1; r < s->size; r++) {                                                    \
      const T *restrict in = (const T *)slot(s, r) + lo;                                   \
      switch (op) {                                                                        \
        case DDP_REDUCE_SUM:                                                               \
          for (size_t i = 0; i < n; i++) out[i] += in[i];                                  \
          break;                                                                           \
        case DDP_REDUCE_PRODUCT:                                                           \
          for (size_t i = 0; i < n; i++) out[i] *= in[i];                                  \
          break;                                                                           \
        case DDP_REDUCE_MIN:                                                               \
          for (size_t i = 0; i < n; i++) out[i] = in[i] < out[i] ? in[i] : out[i];         \
          break;                                                                           \
        default: /* MAX */                                                                 \
          for (size_t i = 0; i < n; i++) out[i] = in[i] > out[i] ? in[i] : out[i];         \
          break;                                                                           \
      }                                                                                    \
    }                                                                                      \
  }
DEFINE_REDUCE(reduce_f32, float)
DEFINE_REDUCE(reduce_f64, double)
#undef DEFINE_REDUCE

int ddp_shm_arrive(ddp_shm *s, const void *fp, size_t fp_bytes, uint64_t digest, void *all,
                   int *agreed, const void *buf, size_t n, int dtype, double timeout_s,
                   char *err, int *peer) {
  *peer = -1;
  *agreed = 0;
  if (fp_bytes > DDP_SHM_FP_BYTES || (buf && !ddp_shm_supports(dtype))) {
    snprintf(err, DDP_GLOO_ERR_CAP, "shared memory: bad arrival (%zu fingerprint bytes, dtype %s)",
             fp_bytes, ddp_dtype_name(dtype));
    return DDP_ERR_STATE;
  }
  int which = (int)(s->arrivals & 1);
  memcpy(fp_record(s, s->rank, which), fp, fp_bytes);
  record(s, s->rank)->digest = digest; /* made visible by publish's release */
  if (buf && n) { /* the all-reduce's first chunk (its step 1) */
    size_t esize = dtype == DDP_F32 ? sizeof(float) : sizeof(double);
    size_t m = n < SLOT_BYTES / esize ? n : SLOT_BYTES / esize;
    memcpy(slot(s, s->rank), buf, m * esize);
  }
  publish(s);
  int st = wait_all(s, s->seq, timeout_s, buf ? "copying in" : "arriving", err, peer);
  if (st) return st;
  s->arrivals++;
  int same = 1;
  for (int r = 0; r < s->size && same; r++) same = record(s, r)->digest == digest;
  if (same) {
    *agreed = 1;
    return DDP_OK;
  }
  for (int r = 0; r < s->size; r++)
    memcpy((unsigned char *)all + (size_t)r * fp_bytes, fp_record(s, r, which), fp_bytes);
  return DDP_OK;
}

int ddp_shm_allreduce(ddp_shm *s, void *buf, size_t n, int dtype, int op, double timeout_s,
                      char *err, int *peer) {
  *peer = -1;
  if (!ddp_shm_supports(dtype)) {
    snprintf(err, DDP_GLOO_ERR_CAP, "shared memory: dtype %s is not supported", ddp_dtype_name(dtype));
    return DDP_ERR_STATE;
  }
  size_t esize = dtype == DDP_F32 ? sizeof(float) : sizeof(double);
  size_t per_chunk = SLOT_BYTES / esize;
  unsigned char *data = buf;
  for (size_t off = 0; off < n; off += per_chunk) {
    size_t m = n - off < per_chunk ? n - off : per_chunk;
    if (off > 0) { /* the first chunk's step 1 was the arrival (Note [shm arrival]) */
      memcpy(slot(s, s->rank), data + off * esize, m * esize);
      publish(s);
      int st = wait_all(s, s->seq, timeout_s, "copying in", err, peer);
      if (st) return st;
    }
    size_t lo = m * (size_t)s->rank / (size_t)s->size;
    size_t hi = m * (size_t)(s->rank + 1) / (size_t)s->size;
    if (dtype == DDP_F32) reduce_f32(s, (float *)result_area(s) + lo, lo, hi - lo, op);
    else reduce_f64(s, (double *)result_area(s) + lo, lo, hi - lo, op);
    publish(s);
    int st = wait_all(s, s->seq, timeout_s, "reducing", err, peer);
    if (st) return st;
    memcpy(data + off * esize, result_area(s), m * esize);
  }
  return DDP_OK;
}
