/* runtime/comm/pg_shm.c: collectives through a POSIX shared-memory segment for a
 * process group whose ranks all run on this host (see pg_shm.h). Loopback TCP costs two
 * kernel copies per byte and a round of wake-ups per message; here a rank reads its peers'
 * bytes where they lie.
 *
 * Segment layout (created by rank 0, name published through the store, unlinked once every
 * rank mapped it):
 *   header: one LINE-sized record per rank (sequence counter, pid, closed flag, and per
 *           arrival parity the fingerprint digest and the zero-copy offset), so ranks
 *           publishing at once never share a cache line; then two DDP_SHM_FP_BYTES
 *           fingerprint records per rank and two SMALL_BYTES small-message areas per rank
 *           (Note [shm arrival], Note [shm small messages]), and the group's abort record
 *           (Note [shm abort]);
 *   slots:  one SLOT_BYTES slot per rank (two halves for the staged all-reduce: Note [shm
 *           pipelined all-reduce]);
 *   arena:  ARENA_BYTES per rank, sparse: pages exist only under live blocks
 *           (Note [shm arena]).
 * The header and slots are reserved when the segment is made; the arena's pages when a
 * block is allocated.
 *
 * Note [shm arrival]: every collective of the group starts with one arrival step
 * (ddp_shm_arrive): write this rank's fingerprint (Note [collective fingerprints] in
 * pg_fingerprint.h) -- and the collective's first data step: a small message, the first
 * chunk of a staged one, or the offset of a buffer in the arena --, and its digest next to
 * its sequence counter, publish seq+1, wait until every rank did, compare the digests (in
 * the cache lines the wait reads anyway); only when they differ are the full records read.
 * So the fingerprint exchange costs next to nothing for a collective through the segment
 * and one wait of the segment for the collectives that then go through Gloo (a barrier is
 * the arrival alone). Everything an arrival writes besides the data slots -- fingerprint
 * record, digest, zero-copy offset, small-message area -- alternates between two copies
 * per rank by the parity of the arrival count: a rank writes arrival k+2's only after
 * every rank published arrival k+1, which each does after it finished collective k. (A
 * rank that returns from arrival k at once, a barrier, may already write arrival k+1's
 * while a slower peer still reads arrival k's: hence two copies, not one.)
 *
 * Note [shm small messages]: a collective of at most SMALL_BYTES per rank travels inside
 * its arrival: each rank copies its input into its small area of this arrival's parity,
 * publishes, waits, and then every rank computes the whole result from the areas itself
 * (all-reduce: over the ranks in order 0 .. world-1, the same computation on every rank,
 * so the same bits). One wait per collective, one flag per rank, no Gloo: the
 * back-to-back latency is a cache-line round trip plus the copies. Nothing else is needed
 * before the areas are reused: see the parity rule above.
 *
 * Note [shm zero copy]: when every rank's all-reduce buffer lies in the arena (each rank
 * published its offset in the arrival), there is no staging and no gather: rank r reduces
 * its slice r of the buffer (Note [shm pipelined all-reduce]) straight from every rank's
 * buffer, in rank order, and writes the result into slice r of every rank's buffer from
 * the same registers (reduce_all: the kernel table's reduce_inputs_all), then publishes
 * and waits once: each rank's buffer holds every slice when every rank has published.
 * Per rank and byte of the tensor: one read and one write, a memcpy's traffic (the lines written were just read,
 * so no extra read for ownership). Safe without steps in between: slice r of every buffer
 * is read and written by rank r alone, between the arrival (every owner has finished
 * writing its buffer) and the final wait (nobody gets its buffer back before every peer
 * wrote into it). Measured on the 2-core Xeon, 2 ranks, back-to-back: 64 MiB ~10 GB/s
 * busbw against ~5.5 with the earlier pull design (reduce into one's own buffer, then
 * copy the peers' slices out of theirs). When only some ranks' buffers lie in the arena,
 * every rank takes the staged path (those ranks stage their first chunk after the
 * arrival, in one extra step for everyone).
 *
 * Note [shm pipelined all-reduce]: an all-reduce above SMALL_BYTES cuts its elements into
 * one slice per rank, [m r / world, m (r+1) / world) of a run of m (the whole tensor in
 * place, each chunk when staged), and rank r reduces slice r over the ranks' inputs in
 * order 0 .. world-1 (Note [reduction entries] in backend/kernels.h), so each element is computed once, by one rank,
 * the same way whichever path runs: every rank ends with the same bits, equal to the
 * small path's. `seq` counts the steps; every rank runs the same steps, so the same counts
 * mean the same point.
 *
 * Staged (ordinary tensors, outside the arena): the peers cannot read a tensor in place,
 * so it travels chunk by chunk through the slots. Each rank's slot has two halves; chunk c
 * (a slice of STAGE_SLICE_BYTES per rank, small enough that the slot halves stay in the
 * cores' caches) uses half c % 2. Rank r stages chunk c of its tensor into its slot half,
 * less its own slice r (which nobody else reads): chunk 0 in the arrival, chunk c + 1
 * while the peers finish chunk c. Per chunk c:
 *   1. reduce slice r over this rank's own tensor and the peers' slot halves (rank order)
 *      and write the result back into all of them (reduce_all: the kernel table's
 *      reduce_inputs_all): into its tensor and, in place of the staged input, into every peer's slot half; publish;
 *   2. stage chunk c + 1 into the other slot half; publish;
 *   3. wait for step 1 of every rank and copy the peers' slices of chunk c, reduced by
 *      them into this rank's slot half, into the tensor;
 *   4. wait for step 2 of every rank (they staged chunk c + 1), and go on with it.
 * (So a rank copies its results out while a slower peer still stages.)
 * So each byte of the tensor is read once and written once, plus one copy in and one out
 * for the peers' slices; no separate result area is written and read again. Reuse is
 * safe: rank r writes slice r of chunk c into rank q's half c % 2 in step 1, after waiting
 * until q staged chunk c there (the arrival or step 4 of chunk c - 1), and q reads it in
 * step 3 after waiting for r's step 1; q restages that half with chunk c + 2 in step 2 of
 * chunk c + 1, after its own step 3 of chunk c, and nobody writes it again before
 * waiting for that staging. Across collectives the arrival's wait plays that role: every
 * rank publishes it after finishing the previous collective.
 *
 * Broadcast: small messages through the root's small area; larger ones from the root's
 * buffer itself when it lies in the arena, else through the root's slot, chunk by chunk
 * (root copies in, every rank waits, the others copy out, every rank waits); a last wait
 * before the root's buffer and slot go back to their owners. All-gather: small messages
 * through the small areas, larger ones piece by piece through a ring of buffers in every
 * rank's slot (Note [shm all-gather]).
 *
 * Note [shm reduce-scatter]: rank r needs only chunk r of every rank's input, so each
 * element is reduced once, by the rank that keeps it, over the ranks in order 0 ..
 * world-1 (the bits of the all-reduce's slice of those elements), and nothing is written
 * back to the peers. Small inputs (world * n elements within SMALL_BYTES) travel in the
 * arrival's small areas; inputs in the arena on every rank are read in place (then one
 * step, so no rank reuses its input while a peer reads it); otherwise staged: chunk c
 * covers `per` elements of every rank's share; rank q copies, for every peer r, its
 * input's elements [r n + c per, +m) into piece r of its buffer c % RING_BUFS (chunk 0 in
 * the arrival), and per chunk: wait until every rank staged chunk c; reduce this rank's
 * share of chunk c from its own input and every peer's piece into `out`; publish; wait
 * until every rank reduced chunk c + 1 - RING_BUFS (whose buffers chunk c + 1 takes over);
 * stage chunk c + 1; publish. A last wait for every rank's last reduction hands the
 * buffers back (to the next collective's arrival). Unlike the all-reduce's two halves
 * used in lock step, the ring of RING_BUFS buffers lets a rank run up to RING_BUFS - 1
 * chunks ahead of a peer that lost its core (2 cores shared by both ranks and other
 * work). Per rank
 * and byte of the input: (world-1)/world copied in, then everything read once, and
 * 1/world written: against the all-reduce, no write-back into the peers' slots and no
 * copy out.
 *
 * Waiting spins for a while that adapts to what spinning bought lately (Note [shm adaptive
 * spin]), then sleeps on a futex until the peer publishes (Note [shm wake-ups]), and every
 * few milliseconds checks that the missing ranks' processes still
 * live. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>

#include "comm/gloo_shim.h"
#include "comm/pg_shm.h"
#include "backend/kernels.h"

enum {
  SLOT_BYTES = 4 << 20,
  SMALL_BYTES = 32 << 10, /* Note [shm small messages] */
  LINE = 128,          /* two cache lines: adjacent-line prefetch must not couple ranks */
  PAGE = 4096,
  SPINS = 32,          /* busy checks between clock reads */
  SPIN_MIN_NS = 1000,  /* spin budget bounds (Note [shm adaptive spin]) */
  SPIN_MAX_NS = 200000, /* above a futex wake-up's latency: Note [shm adaptive spin] */
  YIELD_AFTER_NS = 5000, /* a spinner yields its core between looks after this long */
  CHECK_NS = 3000000,  /* peer liveness check period */
  HALF_SLOT_BYTES = SLOT_BYTES / 2,
  STAGE_SLICE_BYTES = 128 << 10 /* per rank and chunk (Note [shm pipelined all-reduce]) */
};

/* Each rank's arena: address space only until blocks are allocated (Note [shm arena]). */
static const size_t ARENA_BYTES = (size_t)1 << 30;

typedef struct {
  _Atomic uint64_t seq;
  _Atomic int32_t pid;
  _Atomic int32_t closed;
  _Atomic uint32_t sleepers; /* ranks asleep on this counter (Note [shm wake-ups]) */
  uint64_t digest[2];   /* of an arrival's fingerprint, by parity, published with seq */
  uint64_t zc_off[2];   /* an arrival's buffer in this rank's arena (from the segment's
                         * start; 0: none), by parity (Note [shm zero copy]) */
} rank_record;
_Static_assert(sizeof(rank_record) <= LINE, "rank_record fits its LINE");

/* Note [shm abort]: the poison of Note [group abort] (pg.c) in the segment, one record for
 * the group after the small-message areas. The first rank to abort moves `state` from 0 to
 * 1 (compare-and-swap: one writer), writes its message, publishes 2 and wakes every rank's
 * sleepers (Note [shm wake-ups]; the futex words are shared between the processes). Every
 * wait of every rank checks it -- at its start, before the fast path, so that a rank
 * arriving after a peer gave up cannot complete a collective on the peer's abandoned
 * contribution (issue 24: rank 1 got 21 = its 20 + rank 0's stale 1), and between sleeps
 * (at most CHECK_NS apart, sooner when woken) -- and the arrival checks it before it
 * publishes anything. A poisoned segment is never healed: the group is done (a new group
 * maps a new segment). The check is one load of a line nobody writes while the group is
 * healthy. */
enum { ABORT_MSG_BYTES = 2048 - 8 };
typedef struct {
  _Atomic int32_t state; /* 0 healthy, 1 being written, 2 aborted (msg complete) */
  int32_t rank;          /* the group rank that poisoned it */
  char msg[ABORT_MSG_BYTES];
} abort_record;
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the futex word is seq's low half");

/* Note [shm arena]: each rank owns ARENA_BYTES of the segment, past the slots, for tensors
 * it wants its peers to read in place (pg_gloo.c: ddp_pg_shared_zeros). Only the owner
 * allocates there (first fit over page-sized extents, under a mutex: tensors die on any
 * thread); the pages are reserved with fallocate when a block is made (a full /dev/shm
 * fails the allocation, never a later write) and given back with a hole punched when it is
 * released. Peers read a block only during a collective whose arrival published its offset.
 * The mapping lives until the group and every block are gone (refs). */
typedef struct {
  size_t off, len;
  int used;
} extent;

struct ddp_shm {
  int rank, size;
  int *global;          /* group rank -> global rank, for messages */
  unsigned char *base;
  size_t len;           /* the whole mapping */
  size_t header_bytes;
  size_t arena_off;     /* rank 0's arena, from base */
  int fd;               /* kept for the arena's fallocate */
  uint64_t seq;         /* this rank's last published step */
  uint64_t arrivals;    /* arrival steps so far (Note [shm arrival]) */
  int which;            /* the parity of the last arrival */
  int64_t spin_ns;      /* Note [shm adaptive spin] */
  void **ins;           /* size entries: reduction inputs (and outputs) */
  pthread_mutex_t mu;   /* refs and the extents */
  int refs;             /* the group + each live block */
  extent *ext;
  int n_ext, cap_ext;
};

static rank_record *record(ddp_shm *s, int r) {
  return (rank_record *)(s->base + (size_t)r * LINE);
}

static unsigned char *slot(ddp_shm *s, int r) {
  return s->base + s->header_bytes + (size_t)r * SLOT_BYTES;
}

/* Rank r's fingerprint record of parity `which` (Note [shm arrival]). */
static unsigned char *fp_record(ddp_shm *s, int r, int which) {
  return s->base + (size_t)s->size * LINE + ((size_t)r * 2 + (size_t)which) * DDP_SHM_FP_BYTES;
}

/* Rank r's small-message area of parity `which` (Note [shm small messages]). */
static unsigned char *small_area(ddp_shm *s, int r, int which) {
  return s->base + (size_t)s->size * (LINE + 2 * DDP_SHM_FP_BYTES) +
         ((size_t)r * 2 + (size_t)which) * SMALL_BYTES;
}

/* The group's abort record (Note [shm abort]), after the small-message areas. */
static abort_record *abort_rec(ddp_shm *s) {
  return (abort_record *)(s->base + (size_t)s->size * (LINE + 2 * DDP_SHM_FP_BYTES + 2 * SMALL_BYTES));
}

static size_t header_size(int world_size) {
  size_t h = (size_t)world_size * (LINE + 2 * DDP_SHM_FP_BYTES + 2 * SMALL_BYTES) +
             sizeof(abort_record);
  return (h + PAGE - 1) & ~(size_t)(PAGE - 1);
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

/* Map the segment `name` of `len` bytes, of which the first `reserved` are given pages now
 * (create: rank 0 makes and sizes it) and the first `touched` (the header) are faulted into
 * this process; *fd_out keeps the descriptor. Note [shm segment names]. */
static unsigned char *map_segment(const char *name, size_t len, size_t reserved, size_t touched,
                                  int create, int *fd_out) {
  *fd_out = -1;
  if (!create && !name_has_our_form(name)) return NULL;
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return NULL;
  int ok = 1;
  if (create) {
    /* Reserve the header's and slots' pages now: a full /dev/shm must fail here, not
     * SIGBUS later. The arena stays sparse (Note [shm arena]). */
    ok = fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)len) == 0 &&
         posix_fallocate(fd, 0, (off_t)reserved) == 0;
  } else {
    struct stat st;
    ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
         (st.st_mode & 077) == 0 && (size_t)st.st_size == len;
  }
  void *p = ok ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (p == MAP_FAILED) {
    close(fd);
    if (create) shm_unlink(name);
    return NULL;
  }
  /* Fault the header in now rather than in the first collectives. The slots are left to
   * fault in where a collective first uses them: only the staged all-reduce and the larger
   * broadcasts and all-gathers do, and a page of the segment counts in the resident set of
   * every process that touched it (DDP's buckets take the zero-copy path and never touch
   * the slots: faulting all of them in cost each rank ~8 MiB of peak RSS). */
  for (size_t off = 0; off < touched; off += PAGE) (void)((volatile unsigned char *)p)[off];
  *fd_out = fd;
  return p;
}

static int setup_failed(const char *prefix, int me, const char *what) {
  ddp_error_prefix("init_process_group: rank %d, shared-memory setup of group '%s' (%s)", me,
                   prefix, what);
  return ddp_last_status();
}

int ddp_shm_hosts(ddp_store *store, const char *prefix, int rank, int world_size,
                  const int *global, int *leader, int *known) {
  char **ids = calloc((size_t)world_size, sizeof *ids), key[768];
  if (!ids) return DDP_ERROR(DDP_ERR_MEMORY, "init_process_group: out of memory");
  int status = DDP_OK;
  *known = 1;
  for (int r = 0; r < world_size; r++) {
    leader[r] = r;
    snprintf(key, sizeof key, "%s/ddp_shm/host/%d", prefix, r);
    if (store_get_str(store, key, &ids[r])) {
      status = setup_failed(prefix, global[rank], "host identity");
      break;
    }
    if (strcmp(ids[r], "off") == 0) *known = 0;
  }
  for (int r = 0; !status && *known && r < world_size; r++)
    for (int l = 0; l < r; l++)
      if (strcmp(ids[l], ids[r]) == 0) {
        leader[r] = l;
        break;
      }
  if (!*known)
    for (int r = 0; r < world_size; r++) leader[r] = r;
  for (int r = 0; r < world_size; r++) ddp_store_free_value(ids[r]);
  free(ids);
  return status;
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

  size_t header = header_size(world_size);
  size_t reserved = header + (size_t)world_size * SLOT_BYTES;
  size_t len = reserved + (size_t)world_size * ARENA_BYTES;
  char name[256] = "";
  unsigned char *base = NULL;
  int fd = -1;
  snprintf(key, sizeof key, "%s/ddp_shm/name", prefix);
  if (rank == 0) {
    base = segment_name(name, sizeof name, prefix) == 0 ? map_segment(name, len, reserved, header, 1, &fd)
                                                       : NULL;
    const char *pub = base ? name : ""; /* "": rank 0 could not create it */
    if (ddp_store_set(store, key, pub, strlen(pub))) {
      if (base) {
        shm_unlink(name);
        munmap(base, len);
        close(fd);
      }
      return setup_failed(prefix, me, "segment name");
    }
  } else {
    char *v = NULL;
    if (store_get_str(store, key, &v)) return setup_failed(prefix, me, "segment name");
    snprintf(name, sizeof name, "%s", v);
    ddp_store_free_value(v);
    if (name[0]) base = map_segment(name, len, reserved, header, 0, &fd);
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
  /* Rank 0 returns only once every rank has read the votes: it may be the process that
   * hosts the store, and a rank 0 that went on and exited (a short script) while a peer was
   * still reading a vote took the store server with it ("lost the connection to the store
   * server ... wait for key '.../ddp_shm/mapped/0'"). */
  if (!status) {
    snprintf(key, sizeof key, "%s/ddp_shm/voted/%d", prefix, rank);
    status = ddp_store_set(store, key, "1", 1);
  }
  for (int r = 1; r < world_size && rank == 0 && !status; r++) {
    char *v = NULL;
    snprintf(key, sizeof key, "%s/ddp_shm/voted/%d", prefix, r);
    status = store_get_str(store, key, &v);
    if (!status) ddp_store_free_value(v);
  }
  if (status || !all) {
    if (base) {
      munmap(base, len);
      close(fd);
    }
    return status ? setup_failed(prefix, me, "mapping vote") : DDP_OK;
  }

  ddp_shm *s = calloc(1, sizeof *s);
  int *g = malloc(sizeof(int) * (size_t)world_size);
  void **ins = malloc(sizeof(void *) * (size_t)world_size);
  extent *ext = malloc(sizeof(extent) * 8);
  if (!s || !g || !ins || !ext) {
    free(s);
    free(g);
    free(ins);
    free(ext);
    munmap(base, len);
    close(fd);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: out of memory");
  }
  memcpy(g, global, sizeof(int) * (size_t)world_size);
  s->rank = rank;
  s->size = world_size;
  s->global = g;
  s->base = base;
  s->len = len;
  s->header_bytes = header;
  s->arena_off = reserved;
  s->fd = fd;
  s->ins = ins;
  s->spin_ns = 2 * SPIN_MIN_NS;
  pthread_mutex_init(&s->mu, NULL);
  s->refs = 1;
  s->ext = ext;
  s->cap_ext = 8;
  s->n_ext = 1;
  ext[0] = (extent){0, ARENA_BYTES, 0};
  *out = s;
  return DDP_OK;
}

/* Drop one reference (the group's or a block's); the last unmaps. */
static void shm_unref(ddp_shm *s) {
  pthread_mutex_lock(&s->mu);
  int left = --s->refs;
  pthread_mutex_unlock(&s->mu);
  if (left) return;
  munmap(s->base, s->len);
  close(s->fd);
  pthread_mutex_destroy(&s->mu);
  free(s->ext);
  free(s->ins);
  free(s->global);
  free(s);
}

void ddp_shm_free(ddp_shm *s) {
  if (!s) return;
  atomic_store_explicit(&record(s, s->rank)->closed, 1, memory_order_release);
  shm_unref(s);
}

int ddp_shm_supports(int dtype) { return dtype == DDP_F32 || dtype == DDP_F64; }

/* ---- the arena (Note [shm arena]) ------------------------------------------------------ */

static unsigned char *my_arena(ddp_shm *s) {
  return s->base + s->arena_off + (size_t)s->rank * ARENA_BYTES;
}

void *ddp_shm_alloc(ddp_shm *s, size_t nbytes) {
  size_t need = (nbytes + PAGE - 1) & ~(size_t)(PAGE - 1);
  if (need == 0) need = PAGE;
  void *p = NULL;
  pthread_mutex_lock(&s->mu);
  int i = 0;
  while (i < s->n_ext && (s->ext[i].used || s->ext[i].len < need)) i++;
  if (i < s->n_ext && s->ext[i].len > need && s->n_ext == s->cap_ext) { /* room to split */
    extent *grown = realloc(s->ext, sizeof(extent) * (size_t)s->cap_ext * 2);
    if (grown) {
      s->ext = grown;
      s->cap_ext *= 2;
    } else {
      i = s->n_ext;
    }
  }
  if (i < s->n_ext) {
    extent *e = &s->ext[i];
    off_t at = (off_t)(s->arena_off + (size_t)s->rank * ARENA_BYTES + e->off);
    if (posix_fallocate(s->fd, at, (off_t)need) == 0) {
      if (e->len > need) { /* split: the rest stays free */
        memmove(e + 2, e + 1, sizeof(extent) * (size_t)(s->n_ext - i - 1));
        e[1] = (extent){e->off + need, e->len - need, 0};
        e->len = need;
        s->n_ext++;
      }
      e->used = 1;
      p = my_arena(s) + e->off;
      s->refs++;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return p;
}

void ddp_shm_dealloc(void *p, void *ctx) {
  ddp_shm *s = ctx;
  size_t off = (size_t)((unsigned char *)p - my_arena(s));
  pthread_mutex_lock(&s->mu);
  int i = 0;
  while (i < s->n_ext && s->ext[i].off != off) i++;
  if (i < s->n_ext && s->ext[i].used) {
    extent *e = &s->ext[i];
    /* Give the pages back; the next block there reads zeros again. */
    fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              (off_t)(s->arena_off + (size_t)s->rank * ARENA_BYTES + e->off), (off_t)e->len);
    e->used = 0;
    if (i + 1 < s->n_ext && !e[1].used) { /* merge with the next */
      e->len += e[1].len;
      memmove(e + 1, e + 2, sizeof(extent) * (size_t)(s->n_ext - i - 2));
      s->n_ext--;
    }
    if (i > 0 && !e[-1].used) { /* and with the previous */
      e[-1].len += e->len;
      memmove(e, e + 1, sizeof(extent) * (size_t)(s->n_ext - i - 1));
      s->n_ext--;
    }
  }
  pthread_mutex_unlock(&s->mu);
  shm_unref(s);
}

/* The offset from the segment's start of rank r's buffer published at this arrival, and
 * whether `bytes` from there lie inside rank r's arena (the same answer on every rank: the
 * layout is the same everywhere). */
static int zc_buffer(ddp_shm *s, int r, size_t bytes, size_t *off) {
  uint64_t o = record(s, r)->zc_off[s->which];
  size_t lo = s->arena_off + (size_t)r * ARENA_BYTES, hi = lo + ARENA_BYTES;
  *off = (size_t)o;
  return o != 0 && o >= lo && o <= hi && bytes <= hi - o;
}

/* This rank's offset for [p, p + bytes) when it lies inside its arena, else 0. */
static uint64_t arena_offset(ddp_shm *s, const void *p, size_t bytes) {
  const unsigned char *a = my_arena(s), *q = p;
  if (!p || q < a || q >= a + ARENA_BYTES || bytes > (size_t)(a + ARENA_BYTES - q)) return 0;
  return (uint64_t)(q - s->base);
}

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
/* Note [zombie leader]: a multi-threaded process killed by a signal may show its leader
 * thread as a zombie while its other threads are still exiting; they share the file table,
 * which is closed only when the last of them exits. The launcher learns of a worker's death
 * from the end of its report pipe (Note [report pipe] in process.c) and blames the failure
 * it saw first (Note [first failure] in ddplua/process.h): a peer that called the process
 * gone at the leader's zombie state could report "rank N exited" before the dead worker's
 * pipe closed, and the launcher then named the peer instead of the killed rank (seen under
 * load). So a zombie counts as gone only once its leader is the last thread listed. */
static int only_leader_left(int pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (!d) return 1; /* reaped meanwhile */
  int threads = 0;
  struct dirent *e;
  while ((e = readdir(d)) && threads < 2)
    if (e->d_name[0] != '.') threads++;
  closedir(d);
  return threads <= 1;
}

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
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X') && only_leader_left(pid);
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

/* Note [shm adaptive spin]: how long a waiter spins before it sleeps (Note [shm wake-ups])
 * follows what spinning bought lately. When the peers arrived during the spin after w ns,
 * the budget moves a quarter of the way towards 2 w (plus SPIN_MIN_NS); when they did not,
 * it halves. On idle cores a peer a few microseconds behind is met without a system call
 * on either side (back-to-back small messages); when the ranks share their cores with
 * other work, spinning only takes the core the late peer needs, and the budget shrinks to
 * SPIN_MIN_NS. A wait that slept but ended within SPIN_MAX_NS counts as met after its whole
 * length: without that, once one side slept, the other waited a futex wake-up's latency
 * (~30 us on a virtual machine), longer than any budget that small waits had taught, slept
 * too, and the two stayed in lock step through the kernel for good (a 4 KiB back-to-back
 * all-reduce took ~36 us instead of a few). SPIN_MAX_NS is therefore above that latency;
 * past YIELD_AFTER_NS a spinner yields its core between looks, so an oversubscribed host's
 * late peer can run. Only the waiting thread touches the budget. */
static void spin_learn(ddp_shm *s, int met, int64_t waited) {
  int64_t b = s->spin_ns;
  b = met ? b + (2 * waited + SPIN_MIN_NS - b) / 4 : b / 2;
  s->spin_ns = b < SPIN_MIN_NS ? SPIN_MIN_NS : b > SPIN_MAX_NS ? SPIN_MAX_NS : b;
}

/* Note [shm abort]: 1 when the group was aborted, with the first abort's message in err
 * and *peer = DDP_SHM_PEER_ABORTED. */
static int poisoned(ddp_shm *s, char *err, int *peer) {
  abort_record *a = abort_rec(s);
  int32_t st = atomic_load_explicit(&a->state, memory_order_acquire);
  if (!st) return 0;
  /* the writer is copying its message: a few hundred bytes (bounded: it may have died) */
  for (long i = 0; st == 1 && i < 10000000; i++) {
    cpu_relax();
    st = atomic_load_explicit(&a->state, memory_order_acquire);
  }
  if (st == 2)
    snprintf(err, DDP_GLOO_ERR_CAP, "%.*s", ABORT_MSG_BYTES - 1, a->msg);
  else
    snprintf(err, DDP_GLOO_ERR_CAP, "rank %d aborted the group", s->global[a->rank]);
  *peer = DDP_SHM_PEER_ABORTED;
  return 1;
}

void ddp_shm_abort(ddp_shm *s, const char *msg) {
  if (!s) return;
  abort_record *a = abort_rec(s);
  int32_t healthy = 0;
  if (atomic_compare_exchange_strong(&a->state, &healthy, 1)) {
    a->rank = s->rank;
    snprintf(a->msg, sizeof a->msg, "%s", msg && *msg ? msg : "the process group was aborted");
    atomic_store_explicit(&a->state, 2, memory_order_release);
  }
  for (int r = 0; r < s->size; r++)
    syscall(SYS_futex, (uint32_t *)&record(s, r)->seq, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

int ddp_shm_aborted(ddp_shm *s, char *msg) {
  int peer;
  return s && poisoned(s, msg, &peer);
}

static int wait_all(ddp_shm *s, uint64_t target, double timeout_s, const char *phase,
                    char *err, int *peer) {
  if (poisoned(s, err, peer)) return DDP_ERR_PEER;
  if (first_missing(s, target) < 0) return DDP_OK;
  int64_t start = now_ns(), last_check = start;
  for (int64_t t = start; t - start < s->spin_ns; t = now_ns()) {
    for (int i = 0; i < SPINS; i++) {
      if (first_missing(s, target) < 0) {
        spin_learn(s, 1, now_ns() - start);
        return DDP_OK;
      }
      cpu_relax();
    }
    if (t - start > YIELD_AFTER_NS) sched_yield(); /* a peer waiting for this core runs */
  }
  spin_learn(s, 0, 0);
  int64_t limit = (int64_t)((timeout_s < 1e9 ? timeout_s : 1e9) * 1e9); /* no overflow */
  for (;;) {
    int64_t t = now_ns();
    if (poisoned(s, err, peer)) return DDP_ERR_PEER;
    if (first_missing(s, target) < 0) {
      /* a longer spin would have met them: learn it, or a wake-up's latency keeps both
       * sides asleep for good (Note [shm adaptive spin]) */
      if (t - start < SPIN_MAX_NS) spin_learn(s, 1, t - start);
      return DDP_OK;
    }
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
    /* Sleep until the first missing rank publishes (Note [shm wake-ups]), at most until the
     * next liveness check or the timeout. */
    int r = first_missing(s, target);
    if (r < 0) return DDP_OK;
    rank_record *rec = record(s, r);
    atomic_fetch_add(&rec->sleepers, 1);
    uint64_t v = atomic_load(&rec->seq);
    if (v < target) {
      int64_t ns = CHECK_NS - (t - last_check), left = limit - (t - start);
      if (left < ns) ns = left;
      struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
      syscall(SYS_futex, (uint32_t *)&rec->seq, FUTEX_WAIT, (uint32_t)v, &ts, NULL, 0);
    }
    atomic_fetch_sub(&rec->sleepers, 1);
  }
}

/* Note [shm wake-ups]: a rank that spun its budget (Note [shm adaptive spin]) sleeps on a
 * futex over the low 32 bits of the first missing rank's counter, after counting itself in
 * that rank's `sleepers`; a rank that publishes wakes its counter's sleepers when there are any. Both
 * sides use sequentially consistent operations (store the counter, then read sleepers;
 * count in, then read the counter), so either the sleeper sees the new counter or the
 * publisher sees the sleeper; and FUTEX_WAIT itself returns at once when the counter's
 * low word already moved. So a waiter wakes as soon as its peer arrives, without
 * burning a core the peer may need (ranks share few cores), and the fast path costs one
 * extra load. */
static void publish(ddp_shm *s) {
  rank_record *rec = record(s, s->rank);
  atomic_store(&rec->seq, ++s->seq);
  if (atomic_load(&rec->sleepers))
    syscall(SYS_futex, (uint32_t *)&rec->seq, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Publish the next step and wait until every rank did. */
static int step(ddp_shm *s, double timeout_s, const char *phase, char *err, int *peer) {
  publish(s);
  return wait_all(s, s->seq, timeout_s, phase, err, peer);
}

/* ---- reduction ----------------------------------------------------------------------- */

/* The segment is host memory: the CPU table's entries (Note [reduction entries]). */
static void reduce(ddp_shm *s, void *out, size_t lo, size_t n, int dtype, int op) {
  ddp_cpu_kernels.reduce_inputs(dtype, out, (const void *const *)s->ins, s->size, (int64_t)lo,
                                (int64_t)n, op);
}

static void reduce_all(ddp_shm *s, size_t lo, size_t n, int dtype, int op) {
  ddp_cpu_kernels.reduce_inputs_all(dtype, s->ins, s->size, (int64_t)lo, (int64_t)n, op);
}

static size_t esize_of(int dtype) { return dtype == DDP_F32 ? sizeof(float) : sizeof(double); }

/* Bytes per rank a collective moves (reduce-scatter: its whole input). */
static size_t op_bytes(const ddp_shm *s, const ddp_shm_op *op) {
  if (op->kind == DDP_SHM_REDUCE_SCATTER) return (size_t)s->size * op->n * esize_of(op->dtype);
  return op->kind == DDP_SHM_ALLREDUCE ? op->n * esize_of(op->dtype) : op->n;
}

/* Elements per chunk of a staged all-reduce (Note [shm pipelined all-reduce]): a slice of
 * STAGE_SLICE_BYTES per rank, at most half a slot. */
static size_t chunk_elems(ddp_shm *s, size_t esize) {
  size_t bytes = (size_t)s->size * STAGE_SLICE_BYTES;
  if (bytes > HALF_SLOT_BYTES) bytes = HALF_SLOT_BYTES;
  return bytes / esize;
}

/* Rank r's slice [*lo, *hi) of a chunk of m elements (Note [shm pipelined all-reduce]). */
static void slice_of(size_t m, int r, int size, size_t *lo, size_t *hi) {
  *lo = m * (size_t)r / (size_t)size;
  *hi = m * (size_t)(r + 1) / (size_t)size;
}

/* Staged (Note [shm pipelined all-reduce]): chunk c of op->buf, less this rank's own slice,
 * into this rank's slot half c % 2. */
static void stage_in(ddp_shm *s, const ddp_shm_op *op, size_t c) {
  size_t esize = esize_of(op->dtype), per = chunk_elems(s, esize), at = c * per;
  size_t m = op->n - at < per ? op->n - at : per, lo, hi;
  slice_of(m, s->rank, s->size, &lo, &hi);
  unsigned char *dst = slot(s, s->rank) + (c & 1) * HALF_SLOT_BYTES;
  const unsigned char *src = (const unsigned char *)op->buf + at * esize;
  memcpy(dst, src, lo * esize);
  memcpy(dst + hi * esize, src + hi * esize, (m - hi) * esize);
}

/* Note [shm reduce-scatter], Note [shm all-gather]: the staged chunks cycle through
 * RING_BUFS buffers of each rank's slot. A reduce-scatter chunk holds a piece of
 * STAGE_SLICE_BYTES for every peer (less when the pieces would not fit a buffer); an
 * all-gather chunk one piece of STAGE_SLICE_BYTES. */
enum { RING_BUFS = 8, RING_BUF_BYTES = SLOT_BYTES / RING_BUFS };

static size_t rs_chunk_elems(ddp_shm *s, size_t esize) {
  size_t bytes = STAGE_SLICE_BYTES;
  if (bytes * (size_t)s->size > RING_BUF_BYTES) bytes = RING_BUF_BYTES / (size_t)s->size;
  return bytes / esize;
}

/* Rank r's ring buffer of chunk c. */
static unsigned char *ring_buf(ddp_shm *s, int r, size_t c) {
  return slot(s, r) + (c % RING_BUFS) * RING_BUF_BYTES;
}

/* Note [shm reduce-scatter]: chunk c of every peer's share of op->buf into piece `peer` of
 * this rank's buffer of chunk c. */
static void rs_stage_in(ddp_shm *s, const ddp_shm_op *op, size_t c) {
  size_t esize = esize_of(op->dtype), per = rs_chunk_elems(s, esize), at = c * per;
  size_t m = op->n - at < per ? op->n - at : per;
  unsigned char *buf = ring_buf(s, s->rank, c);
  const unsigned char *in = op->buf;
  for (int r = 0; r < s->size; r++)
    if (r != s->rank)
      memcpy(buf + (size_t)r * per * esize, in + ((size_t)r * op->n + at) * esize, m * esize);
}

/* ---- arrival (Note [shm arrival]) ------------------------------------------------------ */

int ddp_shm_arrive(ddp_shm *s, const void *fp, size_t fp_bytes, uint64_t digest, void *all,
                   int *agreed, const ddp_shm_op *op, double timeout_s, char *err, int *peer) {
  *peer = -1;
  *agreed = 0;
  int kind = op ? op->kind : DDP_SHM_ARRIVE;
  if (fp_bytes > DDP_SHM_FP_BYTES || kind < DDP_SHM_ARRIVE || kind > DDP_SHM_REDUCE_SCATTER ||
      ((kind == DDP_SHM_ALLREDUCE || kind == DDP_SHM_REDUCE_SCATTER) &&
       !ddp_shm_supports(op->dtype)) ||
      (kind == DDP_SHM_BROADCAST && (op->root < 0 || op->root >= s->size))) {
    snprintf(err, DDP_GLOO_ERR_CAP, "shared memory: bad arrival (%zu fingerprint bytes, kind %d)",
             fp_bytes, kind);
    return DDP_ERR_STATE;
  }
  if (poisoned(s, err, peer)) return DDP_ERR_PEER; /* Note [shm abort]: publish nothing */
  int which = (int)(s->arrivals & 1);
  rank_record *me = record(s, s->rank);
  memcpy(fp_record(s, s->rank, which), fp, fp_bytes);
  me->digest[which] = digest; /* made visible by publish's release */
  me->zc_off[which] = 0;
  const char *phase = "arriving";
  if (kind != DDP_SHM_ARRIVE) {
    size_t bytes = op_bytes(s, op);
    int sends = kind != DDP_SHM_BROADCAST || op->root == s->rank; /* puts data in */
    if (sends && bytes <= SMALL_BYTES) {
      memcpy(small_area(s, s->rank, which), op->buf, bytes);
    } else if (sends && kind != DDP_SHM_ALLGATHER &&
               (me->zc_off[which] = arena_offset(s, op->buf, bytes)) != 0) {
      /* in place (Note [shm zero copy]) */
    } else if (sends && kind == DDP_SHM_ALLREDUCE) { /* Note [shm pipelined all-reduce] */
      stage_in(s, op, 0);
      phase = "copying in";
    } else if (sends && kind == DDP_SHM_REDUCE_SCATTER) { /* Note [shm reduce-scatter] */
      rs_stage_in(s, op, 0);
      phase = "copying in";
    } else if (sends && kind == DDP_SHM_ALLGATHER) { /* Note [shm all-gather] */
      memcpy(ring_buf(s, s->rank, 0), op->buf, bytes < STAGE_SLICE_BYTES ? bytes : STAGE_SLICE_BYTES);
      phase = "copying in";
    } else if (sends) { /* the first chunk's step 1 */
      memcpy(slot(s, s->rank), op->buf, bytes < SLOT_BYTES ? bytes : SLOT_BYTES);
      phase = "copying in";
    }
  }
  publish(s);
  int st = wait_all(s, s->seq, timeout_s, phase, err, peer);
  if (st) return st;
  s->arrivals++;
  s->which = which;
  int same = 1;
  for (int r = 0; r < s->size && same; r++) same = record(s, r)->digest[which] == digest;
  if (same) {
    *agreed = 1;
    return DDP_OK;
  }
  for (int r = 0; r < s->size; r++)
    memcpy((unsigned char *)all + (size_t)r * fp_bytes, fp_record(s, r, which), fp_bytes);
  return DDP_OK;
}

/* ---- the collectives after their arrival ----------------------------------------------- */

#define STEP(phase)                                                                        \
  do {                                                                                     \
    int st_ = step(s, timeout_s, (phase), err, peer);                                      \
    if (st_) return st_;                                                                   \
  } while (0)

#define WAIT(target, phase)                                                                \
  do {                                                                                     \
    int st_ = wait_all(s, (target), timeout_s, (phase), err, peer);                        \
    if (st_) return st_;                                                                   \
  } while (0)

/* Zero copy (Note [shm pipelined all-reduce]): s->ins[r] is rank r's buffer, ins[rank] this
 * rank's own (op->buf). */
static int allreduce_in_place(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err,
                              int *peer) {
  size_t lo, hi;
  slice_of(op->n, s->rank, s->size, &lo, &hi);
  reduce_all(s, lo, hi - lo, op->dtype, op->op);
  STEP("reducing in place"); /* every slice of every buffer holds its result */
  return DDP_OK;
}

static int allreduce_staged(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err,
                            int *peer) {
  size_t esize = esize_of(op->dtype), n = op->n, per = chunk_elems(s, esize);
  size_t chunks = (n + per - 1) / per, lo, hi;
  unsigned char *data = op->buf;
  /* Chunk 0 was staged in the arrival (Note [shm arrival]) and every rank waited for it. */
  uint64_t staged = s->seq;
  for (size_t c = 0; c < chunks; c++) {
    size_t at = c * per, m = n - at < per ? n - at : per, half = (c & 1) * HALF_SLOT_BYTES;
    unsigned char *here = data + at * esize, *mine = slot(s, s->rank) + half;
    for (int r = 0; r < s->size; r++) s->ins[r] = r == s->rank ? here : slot(s, r) + half;
    slice_of(m, s->rank, s->size, &lo, &hi);
    WAIT(staged, "copying in"); /* every rank staged chunk c */
    /* this rank's slice, from and into its tensor and the peers' slot halves */
    reduce_all(s, lo, hi - lo, op->dtype, op->op);
    publish(s);
    uint64_t reduced = s->seq;
    if (c + 1 < chunks) { /* stage the next chunk while the peers finish this one */
      stage_in(s, op, c + 1);
      publish(s);
      staged = s->seq;
    }
    WAIT(reduced, "reducing"); /* every rank reduced chunk c */
    /* the peers' slices of chunk c, reduced into this rank's slot half */
    memcpy(here, mine, lo * esize);
    memcpy(here + hi * esize, mine + hi * esize, (m - hi) * esize);
  }
  return DDP_OK;
}

static int allreduce(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err, int *peer) {
  size_t bytes = op_bytes(s, op);
  if (bytes <= SMALL_BYTES) { /* Note [shm small messages] */
    for (int r = 0; r < s->size; r++) s->ins[r] = small_area(s, r, s->which);
    reduce(s, op->buf, 0, op->n, op->dtype, op->op);
    return DDP_OK;
  }
  int every = 1, some = 0;
  size_t off;
  for (int r = 0; r < s->size; r++) {
    every = every && zc_buffer(s, r, bytes, &off);
    some = some || record(s, r)->zc_off[s->which] != 0;
    s->ins[r] = s->base + off;
  }
  if (every) return allreduce_in_place(s, op, timeout_s, err, peer);
  if (some) { /* the ranks that published an offset stage their first chunk now */
    if (record(s, s->rank)->zc_off[s->which] != 0) stage_in(s, op, 0);
    STEP("copying in");
  }
  return allreduce_staged(s, op, timeout_s, err, peer);
}

static int broadcast(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err, int *peer) {
  size_t bytes = op->n, off;
  int root = op->root, reader = s->rank != root;
  unsigned char *data = op->buf;
  if (bytes <= SMALL_BYTES) { /* Note [shm small messages] */
    if (reader) memcpy(data, small_area(s, root, s->which), bytes);
    return DDP_OK;
  }
  if (zc_buffer(s, root, bytes, &off)) { /* from the root's buffer itself */
    if (reader) memcpy(data, s->base + off, bytes);
    STEP("reading the root's buffer");
    return DDP_OK;
  }
  for (size_t at = 0; at < bytes; at += SLOT_BYTES) {
    size_t m = bytes - at < SLOT_BYTES ? bytes - at : SLOT_BYTES;
    if (at > 0) { /* the first chunk came with the arrival */
      STEP("reading the root's slot");
      if (!reader) memcpy(slot(s, root), data + at, m);
      STEP("copying in");
    }
    if (reader) memcpy(data + at, slot(s, root), m);
  }
  STEP("reading the root's slot");
  return DDP_OK;
}

/* Note [shm all-gather]: above SMALL_BYTES per rank, pieces of STAGE_SLICE_BYTES travel
 * through the ring of buffers of Note [shm reduce-scatter], with its steps: rank r stages
 * piece c of its input into its buffer c % RING_BUFS (piece 0 in the arrival) and copies it
 * straight into its own block of `out`; waits until every rank staged piece c; copies the
 * peers' pieces c into their blocks; publishes; waits until every rank read piece
 * c + 1 - RING_BUFS, stages piece c + 1 and publishes. The pieces stay in the caches
 * between the copy in and the copies out (a 4 MiB slot per step did not: 16 MiB, 2 ranks
 * took about twice the all-reduce's time). */
static int allgather(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err, int *peer) {
  size_t bytes = op->n;
  const unsigned char *in = op->buf;
  unsigned char *out = op->out;
  if (bytes <= SMALL_BYTES) { /* Note [shm small messages] */
    for (int r = 0; r < s->size; r++)
      memcpy(out + (size_t)r * bytes, small_area(s, r, s->which), bytes);
    return DDP_OK;
  }
  const size_t per = STAGE_SLICE_BYTES, chunks = (bytes + per - 1) / per;
  const uint64_t base = s->seq; /* read(c) = base + 2c + 1, staged(c + 1) = base + 2c + 2 */
  for (size_t c = 0; c < chunks; c++) {
    size_t at = c * per, m = bytes - at < per ? bytes - at : per;
    memcpy(out + (size_t)s->rank * bytes + at, in + at, m);
    WAIT(base + 2 * c, "copying in"); /* every rank staged piece c */
    for (int r = 0; r < s->size; r++)
      if (r != s->rank) memcpy(out + (size_t)r * bytes + at, ring_buf(s, r, c), m);
    publish(s); /* read(c) */
    if (c + 1 < chunks) {
      size_t next = bytes - at - m < per ? bytes - at - m : per;
      if (c + 1 >= RING_BUFS) WAIT(base + 2 * (c + 1 - RING_BUFS) + 1, "reading the slots");
      memcpy(ring_buf(s, s->rank, c + 1), in + at + m, next);
      publish(s); /* staged(c + 1) */
    }
  }
  WAIT(s->seq, "reading the slots"); /* nobody reads this rank's buffers any more */
  return DDP_OK;
}

/* Note [shm reduce-scatter], staged. The steps each rank publishes, from `base` (every rank
 * staged chunk 0): reduced(c) = base + 2c + 1, staged(c + 1) = base + 2c + 2. */
static int reduce_scatter_staged(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err,
                                 int *peer) {
  size_t esize = esize_of(op->dtype), n = op->n, per = rs_chunk_elems(s, esize);
  size_t chunks = (n + per - 1) / per;
  const unsigned char *mine = (const unsigned char *)op->buf + (size_t)s->rank * n * esize;
  unsigned char *out = op->out;
  const uint64_t base = s->seq; /* chunk 0 came with the arrival (or the step after it) */
  for (size_t c = 0; c < chunks; c++) {
    size_t at = c * per, m = n - at < per ? n - at : per;
    for (int r = 0; r < s->size; r++)
      s->ins[r] = r == s->rank ? (void *)(mine + at * esize)
                               : (void *)(ring_buf(s, r, c) + (size_t)s->rank * per * esize);
    WAIT(base + 2 * c, "copying in"); /* every rank staged chunk c */
    reduce(s, out + at * esize, 0, m, op->dtype, op->op);
    publish(s); /* reduced(c) */
    if (c + 1 < chunks) {
      /* chunk c + 1's buffers were chunk c + 1 - RING_BUFS's: every rank must be done with it */
      if (c + 1 >= RING_BUFS) WAIT(base + 2 * (c + 1 - RING_BUFS) + 1, "reducing");
      rs_stage_in(s, op, c + 1);
      publish(s); /* staged(c + 1) */
    }
  }
  WAIT(s->seq, "reducing"); /* nobody reads this rank's buffers any more */
  return DDP_OK;
}

static int reduce_scatter(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err,
                          int *peer) {
  size_t bytes = op_bytes(s, op), lo = (size_t)s->rank * op->n, off;
  if (bytes <= SMALL_BYTES) { /* Note [shm small messages] */
    for (int r = 0; r < s->size; r++) s->ins[r] = small_area(s, r, s->which);
    reduce(s, op->out, lo, op->n, op->dtype, op->op);
    return DDP_OK;
  }
  int every = 1, some = 0;
  for (int r = 0; r < s->size; r++) {
    every = every && zc_buffer(s, r, bytes, &off);
    some = some || record(s, r)->zc_off[s->which] != 0;
    s->ins[r] = s->base + off;
  }
  if (every) { /* read in place (Note [shm zero copy]); the step hands the inputs back */
    reduce(s, op->out, lo, op->n, op->dtype, op->op);
    STEP("reducing in place");
    return DDP_OK;
  }
  if (some) { /* the ranks that published an offset stage their first chunk now */
    if (record(s, s->rank)->zc_off[s->which] != 0) rs_stage_in(s, op, 0);
    STEP("copying in");
  }
  return reduce_scatter_staged(s, op, timeout_s, err, peer);
}
#undef STEP
#undef WAIT

int ddp_shm_run(ddp_shm *s, const ddp_shm_op *op, double timeout_s, char *err, int *peer) {
  *peer = -1;
  switch (op->kind) {
    case DDP_SHM_ARRIVE:
      return DDP_OK;
    case DDP_SHM_ALLREDUCE:
      if (!ddp_shm_supports(op->dtype)) break;
      return allreduce(s, op, timeout_s, err, peer);
    case DDP_SHM_BROADCAST:
      return broadcast(s, op, timeout_s, err, peer);
    case DDP_SHM_ALLGATHER:
      return allgather(s, op, timeout_s, err, peer);
    case DDP_SHM_REDUCE_SCATTER:
      if (!ddp_shm_supports(op->dtype)) break;
      return reduce_scatter(s, op, timeout_s, err, peer);
  }
  snprintf(err, DDP_GLOO_ERR_CAP, "shared memory: collective kind %d (dtype %s) is not supported",
           op->kind, ddp_dtype_name(op->dtype));
  return DDP_ERR_STATE;
}
