/* runtime/io/workers.c: the channels between a DataLoader and its worker processes
 * (Note [dataloader worker channels], ddplua/io_workers.h).
 *
 * The loader's side never blocks without a deadline: every poll is at most SLICE_MS long
 * and is followed by a look at the workers (waitpid WNOHANG), so a worker killed by a
 * signal is reported within a slice whatever the loader's timeout. A worker's side blocks
 * in poll on its socket, looking at its parent every second (PR_SET_PDEATHSIG covers the
 * rest). Results travel in a memfd so that a worker never waits for the loader to read:
 * its socket carries only fixed-size headers. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "io/io_internal.h"

enum {
  MAX_WORKERS = 256,
  SLICE_MS = 100,          /* longest poll before the workers are looked at again */
  MAGIC = 0x6b726f77,      /* "work" */
  KIND_TASK = 1,
  KIND_BATCH = 2,
  KIND_ERROR = 3,
  MAX_TENSORS = 4096,
  PAYLOAD_ALIGN = 64,
  SLOT_HEAD = PAYLOAD_ALIGN, /* a slot's control word, before its payload (Note [lent slots]) */
  LEND_MAX = 2               /* slots of one worker that batches may hold at once */
};
#define MAX_TASK_INDICES ((int64_t)1 << 26)
#define MAX_META ((uint64_t)1 << 30)
#define EXIT_GRACE_S 1.0   /* ddp_io_workers_free: closing to SIGKILL */
#define REAP_LIMIT_S 5.0   /* ddp_io_workers_free: SIGKILL to giving up on a reap */

typedef struct {
  uint32_t magic, kind;
  int64_t tag, batch;
  int64_t count;        /* task: indices that follow */
  uint64_t size;        /* result: payload bytes (in the slot, or in the error's memfd) */
  uint32_t ntensors;    /* batch: descriptors at the payload's start */
  uint32_t slot;        /* batch: the worker's slot holding the payload */
  uint64_t meta_len;    /* batch: structure bytes after the descriptors */
  uint64_t map_size;    /* batch: when non-zero, a new memfd of this size for the slot
                           comes with the header (the slot grew) */
} msg_header;

typedef struct {
  int32_t dtype, ndim;
  int64_t shape[DDP_MAX_DIMS];
  uint64_t offset, nbytes; /* of the tensor's bytes in the payload */
} tensor_desc;

/* Note [worker slots]: each worker writes its batches into memfds (slots) that stay mapped
 * in both processes, so that a batch costs no page fault once the slots have grown to the
 * batch size (on this kind of VM a new shared page costs ~10 us: a fresh memfd per 200 KiB
 * batch cost ~0.5 ms on each side). A slot starts with a control word, `busy`: the worker
 * sets it when it writes a batch there and the loader clears it when it is done with that
 * batch; the worker writes only slots whose word is clear. So a batch's slot is never
 * reused while the loader reads it or tensors hold it (Note [lent slots]), whatever the
 * order in which batches are dropped. A worker has at most `cap` = 2 * prefetch_factor +
 * LEND_MAX slots, made as needed: prefetch_factor results of an abandoned epoch not read
 * yet, prefetch_factor - 1 sent and not taken, LEND_MAX lent, and the one being written.
 * A free slot that is too small is replaced by a larger memfd (1.25x the batch, whole
 * pages), whose descriptor travels with that batch's header; the loader maps it, and keeps
 * mapping the new slots it finds in headers it drops (the worker counts on it).
 *
 * Note [lent slots]: the loader does not copy a batch out of its slot: its tensors are made
 * over the slot's memory (ddp_tensor_from_blob), whose deleter clears `busy` when the last
 * of them is released, so the batch crosses memory once in the loader's process (it was
 * half of the loader's CPU in an ImageFolder epoch). A worker's slots lent at once are at
 * most LEND_MAX; past that (a training loop that keeps its batches) a batch is copied out
 * as before and its slot cleared at once, so the worker always finds a free slot. The
 * loader's mapping of a slot is counted (its table, and each tensor over it), so a tensor
 * stays valid after its loader and workers are gone. Only the process that mapped it
 * clears `busy`: a worker forked later inherits the tensors, and its copies' releases must
 * not free a slot the loader still reads. The Lua loader collects before it takes a batch
 * from a worker whose LEND_MAX slots are lent (ddp_io_workers_lend_full), so a loop that
 * drops its batches gets them all lent and collects about once in num_workers + 1 batches.
 * (Counting lent bytes as allocated for Note [step lifetimes] did it with a collection per
 * batch of an ImageFolder epoch, 19 MB each: ~7% of a core beside two workers.) */
typedef struct {
  char *ptr;      /* the mapping */
  uint64_t size;  /* its bytes */
  int refs;       /* loader side (atomic): 1 for the group's table while this is the slot's
                     mapping, 1 per tensor over it; unmapped at 0. Worker side: 1 */
  int lent;       /* loader side (atomic): tensors over it now */
  int poolable;   /* loader side: its group ended with every worker reaped (Note [slot pool]) */
  pid_t owner;    /* the process that mapped it: the only one that clears `busy` */
} slot_map;

static uint32_t *busy_word(slot_map *m) { return (uint32_t *)(void *)m->ptr; }

struct ddp_io_workers {
  int n;
  int nslots;       /* the loader's prefetch_factor: tasks in flight per worker */
  int cap;          /* most slots per worker (Note [worker slots]) */
  slot_map **maps;  /* loader: (n * cap) its mappings of the workers' slots (NULL: none);
                       worker: (cap) its own */
  int64_t tasks;    /* worker: tasks taken so far */
  pid_t owner;      /* the loader's process (getpid() at creation) */
  int self;         /* in a worker: its id; -1 in the loader's process */
  pid_t parent;     /* in a worker: the loader's pid */
  int *fd;          /* (n) our end of each worker's socket, -1 when none */
  pid_t *pid;       /* (n) 0 when not running */
  char *finished;   /* (n) loader: 1 once the worker has all its tasks (Note [finished
                       workers]): its exit is expected */
  int64_t *sent, *received; /* (n) loader: tasks put to each worker, results read from it */
  ddp_io_workers *next; /* the process's live groups (all_groups) */
};

/* Every live group of this process, so that a new worker closes the loader's ends of the
 * other loaders' sockets it inherited: a worker of loader B holding loader A's ends would
 * keep A's workers from seeing their sockets close (they would wait for SIGKILL). */
static ddp_io_workers *all_groups;
static pthread_mutex_t groups_mu = PTHREAD_MUTEX_INITIALIZER;

/* Note [slot pool]: the slots of a finished worker group (its workers reaped) are kept by
 * the loader's process for the next group once no batch is made over them (at the group's
 * end, or when the last such tensor is released), up to POOL_MAX slots and POOL_BYTES,
 * instead of being unmapped: a worker forked later inherits their mappings at
 * the same addresses, so they are handed to it in its table before the fork (no
 * descriptor travels) and their pages, already in memory, cost no fault filling them with
 * zeros again. A DataLoader without persistent_workers starts a group per epoch; with 2
 * workers and ImageFolder batches of 19 MB that was ~24,000 new shared pages per epoch,
 * most of the workers' system time. ddp_io_workers_empty_pool (dl.empty_cache) unmaps
 * them. Guarded by groups_mu. */
enum { POOL_MAX = 64 };
#define POOL_BYTES ((uint64_t)512 << 20)
static slot_map *pool[POOL_MAX];
static int pool_count;
static uint64_t pool_bytes;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* Reap the ended processes among pids[0 .. n-1] (0: none), setting them to 0 (also those
 * that are not this process's children any more); with `block`, wait up to EXIT_GRACE_S for
 * the rest, SIGKILL those left and wait up to REAP_LIMIT_S more (a process stuck in the
 * kernel: init reaps it when we exit). 1 when none is left. */
static int reap_pids(pid_t *pids, int n, int block) {
  double until = now_s() + EXIT_GRACE_S;
  int killed = 0;
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++) {
      if (pids[i] <= 0) continue;
      pid_t r;
      do r = waitpid(pids[i], NULL, WNOHANG);
      while (r < 0 && errno == EINTR);
      if (r == 0) left++;
      else pids[i] = 0;
    }
    if (!left) return 1;
    if (!block) return 0;
    double t = now_s();
    if (!killed && t > until) {
      for (int i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGKILL);
      killed = 1;
      until = t + REAP_LIMIT_S;
    } else if (killed && t > until) {
      return 0;
    }
    usleep(1000);
  }
}

/* Note [retired workers]: the workers of a group retired at the end of a complete epoch
 * (ddp_io_workers_retire; Note [finished workers]) have sent every result and are exiting;
 * their pids wait here to be reaped, without waiting for it: with WNOHANG when a group is
 * made, for good (waiting, then SIGKILL as ddp_io_workers_free does) when any group is
 * freed (loader:close, a failure, the collector), in ddp_io_workers_empty_pool
 * (dl.empty_cache) and when the process exits (atexit: a container's PID 1 may never reap
 * what it inherits), so that none is left as a zombie after those. Guarded by groups_mu. */
enum { RETIRED_MAX = 256 };
static pid_t retired[RETIRED_MAX];
static int retired_count;

static void reap_retired(int block) {
  pid_t mine[RETIRED_MAX];
  pthread_mutex_lock(&groups_mu);
  int n = retired_count;
  memcpy(mine, retired, sizeof(pid_t) * (size_t)n);
  retired_count = 0;
  pthread_mutex_unlock(&groups_mu);
  if (!n || reap_pids(mine, n, block)) return;
  pthread_mutex_lock(&groups_mu); /* the ones still running: for the next look */
  for (int i = 0; i < n; i++)
    if (mine[i] > 0 && retired_count < RETIRED_MAX) retired[retired_count++] = mine[i];
  pthread_mutex_unlock(&groups_mu);
}

static void reap_retired_at_exit(void) { reap_retired(1); }

static pthread_once_t retired_once = PTHREAD_ONCE_INIT;
static void register_reap_at_exit(void) { atexit(reap_retired_at_exit); }

int ddp_io_workers_new(ddp_io_workers **out, int num_workers, int slots) {
  if (!out) DDP_FAIL(DDP_ERR_ARG, "DataLoader workers: out is NULL");
  *out = NULL;
  reap_retired(0);
  if (num_workers < 1 || num_workers > MAX_WORKERS)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: num_workers must be in 1..%d here, got %d", MAX_WORKERS,
             num_workers);
  if (slots < 1 || slots > 64)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: prefetch_factor must be in 1..64 here, got %d", slots);
  ddp_io_workers *p = calloc(1, sizeof *p);
  if (p) {
    p->fd = malloc(sizeof(int) * (size_t)num_workers);
    p->pid = calloc((size_t)num_workers, sizeof(pid_t));
    p->finished = calloc((size_t)num_workers, 1);
    p->sent = calloc((size_t)num_workers, sizeof(int64_t));
    p->received = calloc((size_t)num_workers, sizeof(int64_t));
    p->maps = calloc((size_t)num_workers * (size_t)(2 * slots + LEND_MAX), sizeof(slot_map *));
  }
  if (!p || !p->fd || !p->pid || !p->maps || !p->finished || !p->sent || !p->received) {
    if (p) { free(p->fd); free(p->pid); free(p->maps); free(p->finished); free(p->sent); free(p->received); }
    free(p);
    DDP_FAIL(DDP_ERR_MEMORY, "DataLoader workers: out of memory");
  }
  p->n = num_workers;
  p->nslots = slots;
  p->cap = 2 * slots + LEND_MAX;
  p->owner = getpid();
  p->self = -1;
  for (int i = 0; i < num_workers; i++) p->fd[i] = -1;
  pthread_mutex_lock(&groups_mu);
  p->next = all_groups;
  all_groups = p;
  pthread_mutex_unlock(&groups_mu);
  *out = p;
  return DDP_OK;
}

/* Signal name for messages: "SIGKILL". */
static void signal_name(int sig, char *buf, size_t cap) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev) snprintf(buf, cap, "SIG%s", abbrev);
  else snprintf(buf, cap, "signal %d", sig);
}

/* Reap worker w if it ended (block: wait for it). Returns 1 and fills why with how it
 * ended, 0 while it runs. */
static int reap(ddp_io_workers *p, int w, int block, char *why, size_t cap) {
  if (p->pid[w] <= 0) {
    snprintf(why, cap, "not running");
    return 1;
  }
  int status = 0;
  pid_t r;
  do r = waitpid(p->pid[w], &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return 0;
  if (r < 0) snprintf(why, cap, "lost (waitpid: %s)", strerror(errno));
  else if (WIFSIGNALED(status)) {
    char name[32];
    signal_name(WTERMSIG(status), name, sizeof name);
    snprintf(why, cap, "killed by signal %s (%d)", name, WTERMSIG(status));
  } else snprintf(why, cap, "exited with code %d", WEXITSTATUS(status));
  p->pid[w] = 0;
  return 1;
}

/* The error for worker w that ended (pid: its pid before the reap). */
static int worker_gone(int w, pid_t pid, const char *why, int64_t batch) {
  DDP_FAIL(DDP_ERR_PEER,
           "DataLoader worker %d (pid %d) exited unexpectedly: %s; batch %lld is lost "
           "(workers count from 0)",
           w, (int)pid, why, (long long)batch);
}

/* Look at every worker but the finished ones (Note [finished workers]): DDP_ERR_PEER naming
 * the first one that ended. */
static int check_workers(ddp_io_workers *p, int64_t batch) {
  for (int w = 0; w < p->n; w++) {
    pid_t pid = p->pid[w];
    char why[128];
    if (pid > 0 && !p->finished[w] && reap(p, w, 0, why, sizeof why))
      return worker_gone(w, pid, why, batch);
  }
  return DDP_OK;
}

/* Worker w's socket closed: it ended or is about to; reap it (waiting up to 1 s). */
static int worker_closed(ddp_io_workers *p, int w, int64_t batch) {
  pid_t pid = p->pid[w];
  char why[128];
  double until = now_s() + 1.0;
  while (!reap(p, w, 0, why, sizeof why)) {
    if (now_s() > until) {
      snprintf(why, sizeof why, "closed its channel while running");
      break;
    }
    usleep(1000);
  }
  return worker_gone(w, pid, why, batch);
}

static int pool_put(slot_map *m);

/* Drop one reference to slot mapping m (NULL ignored); with the last, it goes to the slot
 * pool when its workers are gone (Note [slot pool]), else it is unmapped. */
static void slot_unref(slot_map *m) {
  if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (m->poolable && getpid() == m->owner && pool_put(m)) return;
  munmap(m->ptr, m->size);
  free(m);
}

/* Drop the table's reference in *slot and empty it. */
static void drop_slot(slot_map **slot) {
  slot_unref(*slot);
  *slot = NULL;
}

/* A new slot_map over ptr (size bytes), held once (by the table). NULL: out of memory. */
static slot_map *new_slot_map(char *ptr, uint64_t size) {
  slot_map *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->ptr = ptr;
  m->size = size;
  m->refs = 1;
  m->owner = getpid();
  return m;
}

/* Map every page of slot m writable now, in one call (Linux 5.14): a worker writes all of
 * a slot, and a page fault per 4 KiB page cost it ~10% of its CPU in an ImageFolder epoch
 * (Note [slot pool]). `pages_exist`: the slot's pages are in memory (a pooled slot, in a
 * new worker): MADV_POPULATE_READ then maps them 16 at a time (the kernel's fault-around
 * for file pages, which maps a shared writable memfd page writable), ~3 ms for 24 MB
 * against ~8 ms for MADV_POPULATE_WRITE's one fault per page, and no write after it
 * faults. A new slot's pages do not exist yet: MADV_POPULATE_WRITE makes them. An older
 * kernel refuses both (EINVAL): the pages then fault in as they are written. */
static void populate(slot_map *m, int pages_exist) {
#if defined(MADV_POPULATE_WRITE) && defined(MADV_POPULATE_READ)
  (void)madvise(m->ptr, m->size, pages_exist ? MADV_POPULATE_READ : MADV_POPULATE_WRITE);
#else
  (void)m;
  (void)pages_exist;
#endif
}

/* Deleter of a tensor over a lent slot (Note [lent slots]). */
static void slot_return(void *data, void *ctx) {
  (void)data;
  slot_map *m = ctx;
  if (__atomic_sub_fetch(&m->lent, 1, __ATOMIC_ACQ_REL) == 0 && getpid() == m->owner)
    __atomic_store_n(busy_word(m), 0, __ATOMIC_RELEASE);
  slot_unref(m);
}

/* Take p out of all_groups and close its channels. */
static void unlink_group(ddp_io_workers *p) {
  pthread_mutex_lock(&groups_mu);
  for (ddp_io_workers **q = &all_groups; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      break;
    }
  pthread_mutex_unlock(&groups_mu);
  for (int w = 0; w < p->n; w++) close_fd(&p->fd[w]);
}

/* Drop p's slot mappings (to the slot pool when `poolable`: no worker can write them now,
 * Note [slot pool]; those batches hold go when released) and free it. */
static void release_group(ddp_io_workers *p, int poolable) {
  int nmaps = p->self >= 0 ? p->cap : p->n * p->cap;
  for (int i = 0; i < nmaps && poolable; i++)
    if (p->maps[i]) p->maps[i]->poolable = 1;
  for (int i = 0; i < nmaps; i++) drop_slot(&p->maps[i]);
  free(p->maps);
  free(p->fd);
  free(p->pid);
  free(p->finished);
  free(p->sent);
  free(p->received);
  free(p);
}

void ddp_io_workers_free(ddp_io_workers *p) {
  if (!p) return;
  unlink_group(p);
  int reaped = 0;
  if (getpid() == p->owner) {
    /* the workers see their sockets close and exit; SIGKILL the ones that do not */
    reaped = reap_pids(p->pid, p->n, 1);
    reap_retired(1);
  }
  release_group(p, reaped);
}

void ddp_io_workers_retire(ddp_io_workers *p) {
  if (!p) return;
  /* Note [retired workers]: only when no worker can write a slot any more */
  int done = p->self < 0 && getpid() == p->owner;
  for (int w = 0; done && w < p->n; w++)
    done = p->pid[w] <= 0 || (p->finished[w] && p->received[w] == p->sent[w]);
  if (done) pthread_once(&retired_once, register_reap_at_exit);
  pthread_mutex_lock(&groups_mu);
  done = done && retired_count + p->n <= RETIRED_MAX;
  for (int w = 0; done && w < p->n; w++)
    if (p->pid[w] > 0) retired[retired_count++] = p->pid[w];
  pthread_mutex_unlock(&groups_mu);
  if (!done) {
    ddp_io_workers_free(p);
    return;
  }
  unlink_group(p);
  release_group(p, 1);
}

/* Put slot m (no reference left, its workers gone) in the pool: 1, or 0 when it is full. */
static int pool_put(slot_map *m) {
  pthread_mutex_lock(&groups_mu);
  int room = pool_count < POOL_MAX && pool_bytes + m->size <= POOL_BYTES;
  if (room) {
    __atomic_store_n(busy_word(m), 0, __ATOMIC_RELEASE); /* a batch nobody read */
    m->refs = 1; /* the pool's */
    m->poolable = 0;
    pool[pool_count++] = m;
    pool_bytes += m->size;
  }
  pthread_mutex_unlock(&groups_mu);
  return room;
}

/* Unmap a pooled slot (the pool's reference is its last). */
static void unmap_pooled(slot_map *m) {
  munmap(m->ptr, m->size);
  free(m);
}

uint64_t ddp_io_workers_empty_pool(void) {
  reap_retired(1); /* Note [retired workers] */
  pthread_mutex_lock(&groups_mu);
  uint64_t bytes = pool_bytes;
  for (int i = 0; i < pool_count; i++) {
    unmap_pooled(pool[i]);
    pool[i] = NULL;
  }
  pool_count = 0;
  pool_bytes = 0;
  pthread_mutex_unlock(&groups_mu);
  return bytes;
}

uint64_t ddp_io_workers_pool_bytes(void) {
  pthread_mutex_lock(&groups_mu);
  uint64_t bytes = pool_bytes;
  pthread_mutex_unlock(&groups_mu);
  return bytes;
}

/* Hand pooled slots to worker w's table before it is forked (Note [slot pool]): its share
 * of what the pool holds (the workers not yet forked share the rest), at most the
 * prefetch_factor + LEND_MAX slots a worker uses in a steady epoch (each one handed over
 * costs the worker its page tables, populate()). */
static void take_pooled(ddp_io_workers *p, int w) {
  pthread_mutex_lock(&groups_mu);
  int share = (pool_count + (p->n - w) - 1) / (p->n - w);
  if (share > p->nslots + LEND_MAX) share = p->nslots + LEND_MAX;
  for (int s = 0; s < p->cap && share > 0; s++) {
    slot_map **at = &p->maps[w * p->cap + s];
    if (*at) continue;
    slot_map *m = pool[--pool_count];
    pool[pool_count] = NULL;
    pool_bytes -= m->size;
    *at = m;
    share--;
  }
  pthread_mutex_unlock(&groups_mu);
}

int ddp_io_workers_count(const ddp_io_workers *p) { return p ? p->n : 0; }

int ddp_io_workers_pid(const ddp_io_workers *p, int worker_id) {
  if (!p || worker_id < 0 || worker_id >= p->n) return 0;
  return (int)p->pid[worker_id];
}

int ddp_io_workers_fork(ddp_io_workers *p, int worker_id, int *is_child) {
  if (!p || !is_child) DDP_FAIL(DDP_ERR_ARG, "DataLoader workers: NULL argument");
  *is_child = 0;
  if (p->self >= 0 || getpid() != p->owner)
    DDP_FAIL(DDP_ERR_STATE, "DataLoader: a worker cannot start workers of its own loader");
  if (worker_id < 0 || worker_id >= p->n)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: worker id %d outside 0..%d", worker_id, p->n - 1);
  if (p->pid[worker_id] > 0)
    DDP_FAIL(DDP_ERR_STATE, "DataLoader: worker %d is already running (pid %d)", worker_id,
             (int)p->pid[worker_id]);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    DDP_FAIL(DDP_ERR_IO, "DataLoader: socketpair for worker %d: %s", worker_id, strerror(errno));
  pid_t parent = getpid();
  take_pooled(p, worker_id);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(sv[0]);
    close(sv[1]);
    DDP_FAIL(DDP_ERR_IO, "DataLoader: fork of worker %d: %s", worker_id, strerror(e));
  }
  if (pid == 0) {
    /* the worker: its own channel only, and it dies with the loader's process */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    /* Ctrl-C reaches the whole foreground group: the training process handles it (and
     * its workers die with it), a worker does not end on its own (as PyTorch's workers) */
    signal(SIGINT, SIG_IGN);
    close(sv[0]);
    for (int w = 0; w < p->n; w++) {
      close_fd(&p->fd[w]);
      p->pid[w] = 0;
    }
    /* its slots: those the loader's table has for it (pooled ones, Note [slot pool]), at
     * the same addresses here; the others' and the pool's are not its own */
    for (int i = 0; i < p->n * p->cap; i++)
      if (i / p->cap != worker_id) drop_slot(&p->maps[i]);
    for (int s = 0; worker_id > 0 && s < p->cap; s++) {
      p->maps[s] = p->maps[worker_id * p->cap + s];
      p->maps[worker_id * p->cap + s] = NULL;
    }
    for (int s = 0; s < p->cap; s++) /* a pooled slot is not in this process's page tables */
      if (p->maps[s]) populate(p->maps[s], 1);
    for (int i = 0; i < pool_count; i++) { /* no lock: one thread after fork */
      unmap_pooled(pool[i]);
      pool[i] = NULL;
    }
    pool_count = 0;
    pool_bytes = 0;
    retired_count = 0; /* not this process's children (Note [retired workers]) */
    for (ddp_io_workers *q = all_groups; q; q = q->next) /* no lock: one thread after fork */
      if (q != p) {
        for (int w = 0; w < q->n; w++) {
          close_fd(&q->fd[w]);
          q->pid[w] = 0;
        }
      }
    p->fd[worker_id] = sv[1];
    p->self = worker_id;
    p->parent = parent;
    *is_child = 1;
    return DDP_OK;
  }
  close(sv[1]);
  p->fd[worker_id] = sv[0];
  p->pid[worker_id] = pid;
  return DDP_OK;
}

/* Write len bytes to worker w's socket (loader side), waiting for room in slices. */
static int send_all(ddp_io_workers *p, int w, const void *buf, size_t len, double timeout_s,
                    int64_t batch) {
  const char *c = buf;
  double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
  while (len > 0) {
    ssize_t k = send(p->fd[w], c, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      c += k;
      len -= (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) return worker_closed(p, w, batch);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      DDP_FAIL(DDP_ERR_IO, "DataLoader: sending a task to worker %d: %s", w, strerror(errno));
    DDP_TRY(check_workers(p, batch));
    if (deadline && now_s() > deadline)
      DDP_FAIL(DDP_ERR_TIMEOUT, "DataLoader timed out after %g seconds sending batch %lld to worker %d (pid %d)",
               timeout_s, (long long)batch, w, (int)p->pid[w]);
    struct pollfd pf = { p->fd[w], POLLOUT, 0 };
    poll(&pf, 1, SLICE_MS);
  }
  return DDP_OK;
}

int ddp_io_workers_put(ddp_io_workers *p, int worker_id, int64_t tag, int64_t batch,
                       const int64_t *indices, int64_t count) {
  if (!p || (!indices && count > 0)) DDP_FAIL(DDP_ERR_ARG, "DataLoader workers: NULL argument");
  if (worker_id < 0 || worker_id >= p->n || p->fd[worker_id] < 0)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: no worker %d running", worker_id);
  if (p->finished[worker_id])
    DDP_FAIL(DDP_ERR_STATE, "DataLoader: worker %d was told it has no more tasks (batch %lld)",
             worker_id, (long long)batch);
  if (count < 0 || count > MAX_TASK_INDICES)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: a task of %lld samples", (long long)count);
  msg_header h = { .magic = MAGIC, .kind = KIND_TASK, .tag = tag, .batch = batch, .count = count };
  DDP_TRY(send_all(p, worker_id, &h, sizeof h, 0, batch));
  DDP_TRY(send_all(p, worker_id, indices, (size_t)count * sizeof(int64_t), 0, batch));
  p->sent[worker_id]++;
  return DDP_OK;
}

/* Note [finished workers]: a worker without persistent_workers ends with its epoch. It used
 * to learn it only when the loop had taken the epoch's last batch and the loader closed its
 * channel, and the loader then waited for each worker's exit: ~18 ms for two ImageFolder
 * workers (the kernel tearing down each one's pages), on the epoch's critical path while
 * both cores were otherwise idle. Once the Lua loader has sent the epoch's last task it
 * tells each worker so (ddp_io_workers_finish: shutdown of the loader's writing side); the
 * worker reads its remaining tasks, then the end of its channel, and exits after its last
 * result, while the loop is still taking the batches the workers made ahead. Its results
 * stay readable: their headers wait in the socket and their bytes are in slots the loader
 * maps. Its exit is expected, so check_workers no longer reports it; a result it never sent
 * ends in worker_closed when the loader waits for it, reporting how it ended, as before. */
int ddp_io_workers_finish(ddp_io_workers *p, int worker_id) {
  if (!p) DDP_FAIL(DDP_ERR_ARG, "DataLoader workers: NULL group");
  if (worker_id < 0 || worker_id >= p->n || p->fd[worker_id] < 0)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: no worker %d running", worker_id);
  if (p->finished[worker_id]) return DDP_OK;
  p->finished[worker_id] = 1;
  (void)shutdown(p->fd[worker_id], SHUT_WR); /* a worker that is gone: nothing to tell */
  return DDP_OK;
}

/* Read exactly len bytes (worker side: blocks, looking at the parent every second).
 * 1 on success, 0 at the end of the channel, -1 on an error (set). */
static int worker_read(ddp_io_workers *p, void *buf, size_t len) {
  char *c = buf;
  size_t got = 0;
  while (got < len) {
    struct pollfd pf = { p->fd[p->self], POLLIN, 0 };
    int r = poll(&pf, 1, 1000);
    if (r == 0) {
      if (getppid() != p->parent) return 0;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    ssize_t k = read(p->fd[p->self], c + got, len - got);
    if (k == 0) return got == 0 ? 0 : (DDP_ERROR(DDP_ERR_IO, "DataLoader worker %d: task cut short", p->self), -1);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return 0;
      DDP_ERROR(DDP_ERR_IO, "DataLoader worker %d: reading a task: %s", p->self, strerror(errno));
      return -1;
    }
    got += (size_t)k;
  }
  return 1;
}

int ddp_io_worker_take(ddp_io_workers *p, int64_t *tag, int64_t *batch, int64_t *indices,
                       int64_t cap, int64_t *count) {
  if (!p || !tag || !batch || !count) DDP_FAIL(DDP_ERR_ARG, "DataLoader worker: NULL argument");
  if (p->self < 0) DDP_FAIL(DDP_ERR_STATE, "DataLoader: ddp_io_worker_take outside a worker");
  msg_header h;
  int r = worker_read(p, &h, sizeof h);
  if (r <= 0) return r == 0 ? DDP_IO_END : ddp_last_status();
  if (h.magic != MAGIC || h.kind != KIND_TASK || h.count < 0)
    DDP_FAIL(DDP_ERR_IO, "DataLoader worker %d: malformed task", p->self);
  if (h.count > cap)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader worker %d: a task of %lld samples, room for %lld", p->self,
             (long long)h.count, (long long)cap);
  r = worker_read(p, indices, (size_t)h.count * sizeof(int64_t));
  if (r <= 0) return r == 0 ? DDP_IO_END : ddp_last_status();
  *tag = h.tag;
  *batch = h.batch;
  *count = h.count;
  p->tasks++;
  return DDP_OK;
}

static size_t align_up(size_t x) { return (x + PAYLOAD_ALIGN - 1) & ~(size_t)(PAYLOAD_ALIGN - 1); }

/* Worker side: a new memfd of `size` bytes, mode 0600 (Note [dataloader worker channels]). */
static int new_memfd(ddp_io_workers *p, uint64_t size, int *out) {
  int fd = memfd_create("ddplua-dataloader", MFD_CLOEXEC);
  if (fd < 0) DDP_FAIL(DDP_ERR_IO, "DataLoader worker %d: memfd_create: %s", p->self, strerror(errno));
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)size) != 0) {
    int e = errno;
    close(fd);
    DDP_FAIL(DDP_ERR_IO, "DataLoader worker %d: sizing a %llu-byte buffer: %s", p->self,
             (unsigned long long)size, strerror(e));
  }
  *out = fd;
  return DDP_OK;
}

/* Worker side: send header h, with descriptor fd (-1: none) attached. */
static int send_header(ddp_io_workers *p, msg_header *h, int fd) {
  char ctrl[CMSG_SPACE(sizeof(int))];
  memset(ctrl, 0, sizeof ctrl);
  struct iovec iov = { h, sizeof *h };
  struct msghdr m = { 0 };
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (fd >= 0) {
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  ssize_t k;
  do k = sendmsg(p->fd[p->self], &m, MSG_NOSIGNAL);
  while (k < 0 && errno == EINTR);
  if (k != (ssize_t)sizeof *h)
    DDP_FAIL(DDP_ERR_IO, "DataLoader worker %d: sending batch %lld: %s", p->self, (long long)h->batch,
             k < 0 ? strerror(errno) : "short send");
  return DDP_OK;
}

/* Worker side: a free slot (Note [worker slots]) with room for `size` bytes of payload,
 * made or grown when none has; *new_fd gets the new memfd to send when it is new (else -1).
 * Marks it busy. */
static int slot_for(ddp_io_workers *p, uint64_t size, uint32_t *slot, slot_map **map, int *new_fd) {
  *new_fd = -1;
  uint64_t need = size + SLOT_HEAD;
  int pick = -1, grow = -1;
  for (int s = 0; s < p->cap && pick < 0; s++) {
    slot_map *m = p->maps[s];
    if (m && __atomic_load_n(busy_word(m), __ATOMIC_ACQUIRE)) continue;
    if (m && m->size >= need) pick = s;
    else if (grow < 0 || (p->maps[grow] == NULL && m)) grow = s; /* a free slot before an empty one */
  }
  if (pick < 0 && grow < 0)
    DDP_FAIL(DDP_ERR_STATE, "DataLoader worker %d: all %d batch slots are in use", p->self, p->cap);
  if (pick < 0) {
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t want = need + size / 4;
    want = (want + page - 1) / page * page;
    int fd;
    DDP_TRY(new_memfd(p, want, &fd));
    char *ptr = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    slot_map *m = ptr == MAP_FAILED ? NULL : new_slot_map(ptr, want);
    if (!m) {
      int e = errno;
      if (ptr != MAP_FAILED) munmap(ptr, want);
      close(fd);
      DDP_FAIL(DDP_ERR_IO, "DataLoader worker %d: mapping a %llu-byte slot: %s", p->self,
               (unsigned long long)want, ptr == MAP_FAILED ? strerror(e) : "out of memory");
    }
    populate(m, 0);
    drop_slot(&p->maps[grow]);
    p->maps[grow] = m;
    *new_fd = fd;
    pick = grow;
  }
  __atomic_store_n(busy_word(p->maps[pick]), 1, __ATOMIC_RELAXED); /* the send orders it */
  *slot = (uint32_t)pick;
  *map = p->maps[pick];
  return DDP_OK;
}

/* Worker side: write result tensor i (part i: one tensor, or a stack, Note [stacking in the
 * slot]) at dst + desc[i].offset, contiguous; items[first[i] ...] are its tensors. */
static int fill_batch(char *dst, int n, const int32_t *counts, const int64_t *first,
                      ddp_tensor **items, const tensor_desc *desc) {
  for (int i = 0; i < n; i++) {
    ddp_tensor **its = items + first[i];
    if (!desc[i].nbytes) continue;
    if (counts && counts[i] > 0) {
      ddp_tensor *into = NULL;
      int status = ddp_tensor_from_blob(&into, dst + desc[i].offset, desc[i].ndim, desc[i].shape,
                                        NULL, desc[i].dtype, NULL, NULL);
      if (!status) status = ddp_io_stack_into(into, counts[i], its);
      ddp_tensor_release(into);
      if (status) return status;
      continue;
    }
    ddp_tensor *t = its[0];
    if (ddp_tensor_is_contiguous(t)) {
      memcpy(dst + desc[i].offset, ddp_data(t), desc[i].nbytes);
      continue;
    }
    /* strided: copy through a contiguous tensor (no autograd is recorded on aliases) */
    ddp_tensor *tmp = NULL, *src = ddp_tensor_alias(t);
    int status = src ? ddp_tensor_empty(&tmp, t->ndim, t->shape, t->dtype, DDP_DEVICE_CPU)
                     : ddp_last_status();
    if (!status) status = ddp_copy_(tmp, src);
    if (!status) memcpy(dst + desc[i].offset, ddp_data(tmp), desc[i].nbytes);
    ddp_tensor_release(tmp);
    ddp_tensor_release(src);
    if (status) return status;
  }
  return DDP_OK;
}

/* Worker side: the descriptor of result tensor i (Note [stacking in the slot]): items[0] as
 * is (count 0) or the stack of count items. */
static int describe(ddp_io_workers *p, int i, int32_t count, ddp_tensor **items, tensor_desc *d) {
  char arg[32];
  snprintf(arg, sizeof arg, "batch tensor %d", i + 1);
  if (count < 0)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader worker %d: %s: a stack of %d tensors", p->self, arg, (int)count);
  if (count > 0) {
    DDP_TRY(ddp_io_stack_check(count, items));
  } else {
    DDP_TRY(ddp_check_alive(items[0], "DataLoader worker", arg));
  }
  for (int k = 0; k < (count > 0 ? count : 1); k++)
    if (items[k]->device != DDP_DEVICE_CPU)
      DDP_FAIL(DDP_ERR_ARG, "DataLoader worker %d: %s is on a device; workers return CPU tensors (move batches in the training loop)",
               p->self, arg);
  const ddp_tensor *t = items[0];
  int lead = count > 0;
  d->dtype = t->dtype;
  d->ndim = t->ndim + lead;
  if (lead) d->shape[0] = count;
  for (int k = 0; k < t->ndim; k++) d->shape[k + lead] = t->shape[k];
  d->nbytes = (uint64_t)t->numel * (uint64_t)(lead ? count : 1) * ddp_dtype_size(t->dtype);
  return DDP_OK;
}

int ddp_io_worker_send_parts(ddp_io_workers *p, int64_t tag, int64_t batch, int ntensors,
                             const int32_t *counts, ddp_tensor **items, const void *meta,
                             size_t meta_len) {
  if (!p || (ntensors > 0 && !items) || (meta_len > 0 && !meta) || ntensors < 0)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader worker: bad argument");
  if (p->self < 0) DDP_FAIL(DDP_ERR_STATE, "DataLoader: ddp_io_worker_send outside a worker");
  if (p->tasks < 1) DDP_FAIL(DDP_ERR_STATE, "DataLoader worker %d: a result before any task", p->self);
  if (ntensors > MAX_TENSORS || meta_len > MAX_META)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader worker %d: batch %lld has %d tensors and %zu bytes of structure (at most %d and %llu)",
             p->self, (long long)batch, ntensors, meta_len, MAX_TENSORS, (unsigned long long)MAX_META);
  tensor_desc *desc = ntensors ? calloc((size_t)ntensors, sizeof *desc) : NULL;
  int64_t *first = ntensors ? calloc((size_t)ntensors, sizeof *first) : NULL;
  if (ntensors && (!desc || !first)) {
    free(desc);
    free(first);
    DDP_FAIL(DDP_ERR_MEMORY, "DataLoader worker: out of memory");
  }
  size_t at = align_up(sizeof(tensor_desc) * (size_t)ntensors);
  size_t meta_at = at;
  at = align_up(at + meta_len);
  int status = DDP_OK;
  int64_t next = 0;
  for (int i = 0; i < ntensors && !status; i++) {
    int32_t count = counts ? counts[i] : 0;
    first[i] = next;
    status = describe(p, i, count, items + next, &desc[i]);
    if (status) break;
    next += count > 0 ? count : 1;
    desc[i].offset = at;
    at = align_up(at + desc[i].nbytes);
  }
  uint32_t slot = 0;
  slot_map *m = NULL;
  int fd = -1;
  if (!status) status = slot_for(p, at, &slot, &m, &fd);
  if (!status) {
    char *payload = m->ptr + SLOT_HEAD;
    if (ntensors) memcpy(payload, desc, sizeof(tensor_desc) * (size_t)ntensors);
    if (meta_len) memcpy(payload + meta_at, meta, meta_len);
    status = fill_batch(payload, ntensors, counts, first, items, desc);
    if (status) __atomic_store_n(busy_word(m), 0, __ATOMIC_RELAXED); /* nothing sent */
  }
  if (!status) {
    msg_header h = { .magic = MAGIC, .kind = KIND_BATCH, .tag = tag, .batch = batch, .size = at,
                     .ntensors = (uint32_t)ntensors, .slot = slot, .meta_len = meta_len,
                     .map_size = fd >= 0 ? m->size : 0 };
    status = send_header(p, &h, fd);
  }
  if (fd >= 0) close(fd); /* the mapping stays; the loader has its own descriptor */
  free(desc);
  free(first);
  return status;
}

int ddp_io_worker_send(ddp_io_workers *p, int64_t tag, int64_t batch, int ntensors,
                       ddp_tensor **tensors, const void *meta, size_t meta_len) {
  return ddp_io_worker_send_parts(p, tag, batch, ntensors, NULL, tensors, meta, meta_len);
}

int ddp_io_worker_send_error(ddp_io_workers *p, int64_t tag, int64_t batch, const char *msg,
                             size_t len) {
  if (!p || (len > 0 && !msg)) DDP_FAIL(DDP_ERR_ARG, "DataLoader worker: bad argument");
  if (p->self < 0) DDP_FAIL(DDP_ERR_STATE, "DataLoader: ddp_io_worker_send_error outside a worker");
  if (len > MAX_META) len = MAX_META;
  int fd;
  DDP_TRY(new_memfd(p, len, &fd));
  int status = DDP_OK;
  size_t done = 0;
  while (done < len && !status) {
    ssize_t k = pwrite(fd, msg + done, len - done, (off_t)done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      status = DDP_ERROR(DDP_ERR_IO, "DataLoader worker %d: writing an error message: %s", p->self,
                         k < 0 ? strerror(errno) : "short write");
    else done += (size_t)k;
  }
  msg_header h = { .magic = MAGIC, .kind = KIND_ERROR, .tag = tag, .batch = batch, .size = len };
  if (!status) status = send_header(p, &h, fd);
  close(fd);
  return status;
}

/* Loader side: receive one header (and the descriptor sent with it) from worker w, waiting
 * in slices. DDP_OK with *fd (-1 when none came), or an error (death, timeout, malformed). */
static int recv_header(ddp_io_workers *p, int w, msg_header *h, int *fd, double deadline,
                       double timeout_s, int64_t batch) {
  *fd = -1;
  size_t got = 0;
  while (got < sizeof *h) {
    struct pollfd pf = { p->fd[w], POLLIN, 0 };
    int r = poll(&pf, 1, SLICE_MS);
    if (r < 0 && errno != EINTR) {
      close_fd(fd);
      DDP_FAIL(DDP_ERR_IO, "DataLoader: waiting for worker %d: %s", w, strerror(errno));
    }
    if (r <= 0) {
      int status = check_workers(p, batch);
      if (!status && deadline && now_s() > deadline)
        status = DDP_ERROR(DDP_ERR_TIMEOUT, "DataLoader timed out after %g seconds waiting for batch %lld from worker %d (pid %d)",
                           timeout_s, (long long)batch, w, (int)p->pid[w]);
      if (status) {
        close_fd(fd);
        return status;
      }
      continue;
    }
    char ctrl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = { (char *)h + got, sizeof *h - got };
    struct msghdr m = { 0 };
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    ssize_t k = recvmsg(p->fd[w], &m, MSG_CMSG_CLOEXEC);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0 && errno != ECONNRESET) {
      close_fd(fd);
      DDP_FAIL(DDP_ERR_IO, "DataLoader: reading from worker %d: %s", w, strerror(errno));
    }
    if (k <= 0) {
      close_fd(fd);
      return worker_closed(p, w, batch);
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      int nfd = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < nfd; i++) {
        int x;
        memcpy(&x, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (*fd < 0) *fd = x;
        else close(x);
      }
    }
    got += (size_t)k;
  }
  int ok = h->magic == MAGIC;
  if (ok && h->kind == KIND_ERROR) ok = *fd >= 0;
  else if (ok && h->kind == KIND_BATCH) ok = h->slot < (uint32_t)p->cap && ((h->map_size > 0) == (*fd >= 0));
  else ok = 0;
  if (!ok) {
    close_fd(fd);
    DDP_FAIL(DDP_ERR_IO, "DataLoader: malformed result from worker %d", w);
  }
  return DDP_OK;
}

/* Loader side: map the new slot that came with a batch header (Note [worker slots]). */
static int map_slot(ddp_io_workers *p, int w, const msg_header *h, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < h->map_size)
    DDP_FAIL(DDP_ERR_IO, "DataLoader: worker %d's slot %u is smaller than announced", w, h->slot);
  if (h->map_size < SLOT_HEAD)
    DDP_FAIL(DDP_ERR_IO, "DataLoader: worker %d's slot %u is too small", w, h->slot);
  /* writable: the batch's tensors are made over it (Note [lent slots]) */
  char *ptr = mmap(NULL, h->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (ptr == MAP_FAILED)
    DDP_FAIL(DDP_ERR_IO, "DataLoader: mapping worker %d's slot %u (%llu bytes): %s", w, h->slot,
             (unsigned long long)h->map_size, strerror(errno));
  slot_map *m = new_slot_map(ptr, h->map_size);
  if (!m) {
    munmap(ptr, h->map_size);
    DDP_FAIL(DDP_ERR_MEMORY, "DataLoader: out of memory");
  }
  slot_map **at = &p->maps[w * p->cap + (int)h->slot];
  drop_slot(at);
  *at = m;
  return DDP_OK;
}

/* Loader side: how many of worker w's slots batches hold now (Note [lent slots]). */
static int lent_slots(const ddp_io_workers *p, int w) {
  int k = 0;
  for (int s = 0; s < p->cap; s++) {
    slot_map *m = p->maps[w * p->cap + s];
    if (m && __atomic_load_n(&m->lent, __ATOMIC_ACQUIRE) > 0) k++;
  }
  return k;
}

int ddp_io_workers_lend_full(const ddp_io_workers *p, int worker_id) {
  if (!p || p->self >= 0 || worker_id < 0 || worker_id >= p->n) return 0;
  return lent_slots(p, worker_id) >= LEND_MAX;
}

/* Loader side: the tensors and structure of the batch in slot m (h->size bytes of payload):
 * tensors over the slot when `lend` (Note [lent slots]), else copies. Clears the slot's
 * `busy` unless a tensor holds it. */
static int unpack_batch(int w, const msg_header *h, slot_map *m, int lend, ddp_tensor **tensors,
                        int cap, int *ntensors, char **meta, size_t *meta_len) {
  const char *src = m->ptr + SLOT_HEAD;
  uint64_t n = h->ntensors;
  if (n > (uint64_t)cap || n > MAX_TENSORS)
    DDP_FAIL(DDP_ERR_IO, "DataLoader: worker %d sent %llu tensors for batch %lld, room for %d",
             w, (unsigned long long)n, (long long)h->batch, cap);
  uint64_t desc_end = n * sizeof(tensor_desc);
  uint64_t meta_at = align_up(desc_end);
  if (h->meta_len > MAX_META || meta_at + h->meta_len > h->size || desc_end > h->size)
    DDP_FAIL(DDP_ERR_IO, "DataLoader: worker %d's batch %lld is malformed (sizes)", w,
             (long long)h->batch);
  const tensor_desc *desc = (const tensor_desc *)src;
  int made = 0, status = DDP_OK;
  for (uint64_t i = 0; i < n && !status; i++) {
    tensor_desc d;
    memcpy(&d, &desc[i], sizeof d);
    int ok = d.dtype >= 0 && d.dtype < DDP_DTYPE_COUNT && d.ndim >= 0 && d.ndim <= DDP_MAX_DIMS;
    uint64_t numel = 1;
    for (int k = 0; ok && k < d.ndim; k++) {
      if (d.shape[k] < 0 || (d.shape[k] > 0 && numel > UINT64_MAX / (uint64_t)d.shape[k])) ok = 0;
      else numel *= (uint64_t)d.shape[k];
    }
    if (ok) {
      size_t es = ddp_dtype_size(d.dtype);
      ok = numel <= UINT64_MAX / es && numel * es == d.nbytes && d.offset <= h->size &&
           d.nbytes <= h->size - d.offset && d.offset % PAYLOAD_ALIGN == 0;
    }
    if (!ok) {
      status = DDP_ERROR(DDP_ERR_IO, "DataLoader: worker %d's batch %lld: tensor %llu is malformed",
                         w, (long long)h->batch, (unsigned long long)i + 1);
      break;
    }
    ddp_tensor *t = NULL;
    if (lend) {
      __atomic_add_fetch(&m->lent, 1, __ATOMIC_ACQ_REL);
      __atomic_add_fetch(&m->refs, 1, __ATOMIC_ACQ_REL);
      status = ddp_tensor_from_blob(&t, (char *)src + d.offset, d.ndim, d.shape, NULL, d.dtype,
                                    slot_return, m);
      if (status) slot_return(NULL, m);
    } else {
      status = ddp_tensor_empty(&t, d.ndim, d.shape, d.dtype, DDP_DEVICE_CPU);
      if (!status && d.nbytes) memcpy(ddp_data(t), src + d.offset, d.nbytes);
    }
    if (status) break;
    tensors[made++] = t;
  }
  char *text = NULL;
  if (!status) {
    text = malloc(h->meta_len + 1);
    if (!text) status = DDP_ERROR(DDP_ERR_MEMORY, "DataLoader: out of memory");
    else {
      if (h->meta_len) memcpy(text, src + meta_at, h->meta_len);
      text[h->meta_len] = 0;
    }
  }
  if (!lend || made == 0) __atomic_store_n(busy_word(m), 0, __ATOMIC_RELEASE);
  if (status) {
    for (int i = 0; i < made; i++) { /* a lent slot's last one clears `busy` */
      ddp_tensor_release(tensors[i]);
      tensors[i] = NULL;
    }
    return status;
  }
  *ntensors = (int)n;
  *meta = text;
  *meta_len = h->meta_len;
  return DDP_OK;
}

/* Loader side: a worker's error message (size bytes in the memfd fd) into *meta. */
static int read_error(int w, const msg_header *h, int fd, char **meta, size_t *meta_len) {
  if (h->size > MAX_META) DDP_FAIL(DDP_ERR_IO, "DataLoader: worker %d's error message is malformed", w);
  char *m = malloc(h->size + 1);
  if (!m) DDP_FAIL(DDP_ERR_MEMORY, "DataLoader: out of memory");
  size_t done = 0;
  while (done < h->size) {
    ssize_t k = pread(fd, m + done, h->size - done, (off_t)done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      free(m);
      DDP_FAIL(DDP_ERR_IO, "DataLoader: reading worker %d's error message: %s", w,
               k < 0 ? strerror(errno) : "shorter than announced");
    }
    done += (size_t)k;
  }
  m[h->size] = 0;
  *meta = m;
  *meta_len = h->size;
  return DDP_OK;
}

int ddp_io_workers_get(ddp_io_workers *p, int worker_id, int64_t tag, int64_t batch,
                       double timeout_s, ddp_tensor **tensors, int cap, int *ntensors,
                       char **meta, size_t *meta_len) {
  if (!p || !ntensors || !meta || !meta_len || (cap > 0 && !tensors) || cap < 0)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader workers: bad argument");
  *ntensors = 0;
  *meta = NULL;
  *meta_len = 0;
  if (worker_id < 0 || worker_id >= p->n || p->fd[worker_id] < 0)
    DDP_FAIL(DDP_ERR_ARG, "DataLoader: no worker %d running", worker_id);
  double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
  for (;;) {
    msg_header h;
    int fd;
    DDP_TRY(recv_header(p, worker_id, &h, &fd, deadline, timeout_s, batch));
    p->received[worker_id]++; /* one result per task, dropped or not */
    int status = DDP_OK;
    if (h.kind == KIND_BATCH && fd >= 0) status = map_slot(p, worker_id, &h, fd); /* even when dropped */
    slot_map *m = h.kind == KIND_BATCH ? p->maps[worker_id * p->cap + (int)h.slot] : NULL;
    if (h.tag < tag && !status) { /* an abandoned epoch's result (Note [dataloader worker channels]) */
      if (m) __atomic_store_n(busy_word(m), 0, __ATOMIC_RELEASE);
      close_fd(&fd);
      continue;
    }
    if (!status && (h.tag != tag || h.batch != batch))
      status = DDP_ERROR(DDP_ERR_IO, "DataLoader: worker %d sent batch %lld of epoch %lld, expected batch %lld of epoch %lld",
                         worker_id, (long long)h.batch, (long long)h.tag, (long long)batch, (long long)tag);
    if (!status && h.kind == KIND_ERROR) {
      status = read_error(worker_id, &h, fd, meta, meta_len);
      if (!status) *ntensors = -1;
    } else if (!status) {
      if (!m || h.size > m->size - SLOT_HEAD)
        status = DDP_ERROR(DDP_ERR_IO, "DataLoader: worker %d's batch %lld does not fit its slot %u", worker_id,
                           (long long)batch, h.slot);
      else
        status = unpack_batch(worker_id, &h, m, lent_slots(p, worker_id) < LEND_MAX, tensors, cap,
                              ntensors, meta, meta_len);
    }
    close_fd(&fd);
    return status;
  }
}
