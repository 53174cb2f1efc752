/* runtime/core/threads.c: the thread count (ours and OpenBLAS's) and the fork-join pool
 * the CPU kernels split their work over (ddp_parallel_for).
 *
 * Note [fork-join pool]
 * The pool keeps (threads - 1) workers. ddp_parallel_for cuts [0, n) into `parts` equal
 * contiguous chunks (parts <= threads, each >= grain), publishes the job, runs chunk 0 on
 * the calling thread and waits until the workers it needed (ids 1 .. parts-1, worker i
 * takes chunk i) are done. The chunking depends only on (n, grain, thread count), never on
 * timing, so kernels that keep per-chunk state see the same ranges run after run.
 *   Hand-off without locks: the job is published by one atomic store of a 32-bit word,
 * (generation << 7) | parts, after the job's fields are written (release); a worker reads
 * the word (acquire) and, when its id < parts, runs its chunk and decrements `pending`.
 * parts lives in the word itself so that a worker that is not needed never reads the
 * job's fields (the caller may already be filling in the next job). The caller waits for
 * `pending` to reach 0 before it returns, so a needed worker's fields stay valid while it
 * reads them. A second caller (another thread) finding the pool busy runs its job inline
 * rather than queueing behind it: one job at a time, and never a wait on another job.
 *   Waiting: a worker spins on the word for up to SPIN_NS (a pause per try; after
 * YIELD_AFTER_NS with a sched_yield between tries, so that on a loaded machine the spinner
 * hands its core to runnable threads instead of burning its time slice) and then sleeps on
 * it with FUTEX_WAIT; the caller wakes sleepers with FUTEX_WAKE only when the
 * `sleepers` count says one may be asleep. The lost-wake-up race is closed by the futex
 * itself: a worker increments `sleepers` and then FUTEX_WAITs on the word value it last
 * saw; the caller stores the new word and then reads `sleepers` (both sequentially
 * consistent), so either the caller sees the sleeper and wakes it, or the sleeper's
 * FUTEX_WAIT finds the word changed and returns at once. The caller's wait for `pending`
 * is the mirror image (spin, then `caller_asleep` + FUTEX_WAIT on `pending`; the last
 * worker wakes it). Every FUTEX_WAIT has a timeout (WAIT_TIMEOUT_NS) after which the
 * waiter looks again, so no wait depends on a wake-up alone.
 *   Cost: a job handed to a spinning worker costs one cache-line transfer each way (well
 * under a microsecond); the condition-variable pool this replaced took a mutex, a
 * broadcast and a wake-up per job (several microseconds, more when the worker had to be
 * scheduled). Between jobs closer than SPIN_NS (the usual gap between two kernels of a
 * training step) the worker never sleeps; a worker idle for longer costs nothing.
 *   Nested calls (fn calling ddp_parallel_for, on any thread of the pool) run inline.
 *   fork: a child has none of the parent's workers; pthread_atfork resets the pool there
 * and the first parallel call starts new ones.
 *
 * Note [pool and OpenBLAS threads]
 * OpenBLAS (pthread build) is kept at ONE thread, always; our pool is the only source of
 * parallelism. Reason: after each threaded call, OpenBLAS's workers spin with sched_yield
 * for about 2^28 TSC ticks (its THREAD_TIMEOUT, ~0.1 s, fixed when the library loads)
 * before they sleep. A training step calls a threaded GEMM every few milliseconds, so an
 * OpenBLAS worker spun all the time beside our pool worker: three runnable threads on two
 * cores, and the CNN at 1 process x 2 threads lost up to a third of its speed to it.
 * Products therefore go through ddp_cpu_gemm_parallel (runtime/backend/cpu/gemm_parallel.c),
 * which splits a large GEMM into row or column blocks over this pool, each block one
 * single-threaded OpenBLAS call; kernels that run many small GEMMs (convolution per
 * sample, batched matmul) split over the pool by their own outer loop. A plain matmul thus
 * uses `threads` cores through our workers, and at no time do both pools run. */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "core/core.h"

enum { MAX_THREADS = 64, PARTS_BITS = 7 }; /* MAX_THREADS < 1 << PARTS_BITS */
#define PARTS_MASK ((1u << PARTS_BITS) - 1)

/* How long a waiter spins before it sleeps: longer than the gap between two kernels of a
 * training step (a few microseconds of Lua and autograd), short enough that an idle pool
 * gives its cores back within a fraction of a millisecond. */
#define SPIN_NS 100000
/* After this long a spinning waiter yields its core between looks (sched_yield returns at
 * once when nothing else is runnable there). */
#define YIELD_AFTER_NS 5000
/* A sleeping waiter looks again after this long even without a wake-up. */
#define WAIT_TIMEOUT_NS 200000000

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static int num_threads;     /* 0 until first use */
static int workers_started; /* under pool_lock */
static _Atomic uint32_t job_word;      /* (generation << PARTS_BITS) | parts; workers' futex */
static _Atomic uint32_t sleepers;      /* workers asleep (or about to be) on job_word */
static _Atomic uint32_t pending;       /* needed workers not done yet; the caller's futex */
static _Atomic uint32_t caller_asleep; /* the caller sleeps (or is about to) on pending */
static struct { ddp_range_fn fn; void *ctx; int64_t n, chunk; } job; /* see the Note */
static __thread int in_parallel_region;

static int default_threads(void) {
  const char *env = getenv("DDP_NUM_THREADS");
  if (!env || !*env) env = getenv("OMP_NUM_THREADS");
  int n = env ? atoi(env) : 0;
  if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > MAX_THREADS ? MAX_THREADS : n;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleep while *word == expected (or until the timeout, or a wake-up). */
static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  struct timespec timeout = {0, WAIT_TIMEOUT_NS};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, &timeout, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Spin until *word differs from `seen` or SPIN_NS pass; the value last read. */
static uint32_t spin_while_equal(_Atomic uint32_t *word, uint32_t seen) {
  int64_t start = 0;
  for (unsigned i = 1;; i++) {
    uint32_t w = atomic_load_explicit(word, memory_order_acquire);
    if (w != seen) return w;
    cpu_relax();
    if ((i & 15) == 0) { /* the clock every 16 pauses (a pause is 10-150 cycles) */
      int64_t t = now_ns();
      if (!start) start = t;
      else if (t - start > SPIN_NS) return w;
      else if (t - start > YIELD_AFTER_NS) sched_yield(); /* a loaded machine: let others run */
    }
  }
}

/* The next job word after `seen`: spin, then sleep on the futex (Note [fork-join pool]). */
static uint32_t wait_for_job(uint32_t seen) {
  uint32_t w = spin_while_equal(&job_word, seen);
  while (w == seen) {
    atomic_fetch_add(&sleepers, 1);
    if (atomic_load(&job_word) == seen) futex_wait(&job_word, seen);
    atomic_fetch_sub(&sleepers, 1);
    w = atomic_load_explicit(&job_word, memory_order_acquire);
  }
  return w;
}

/* arg: (job word when the worker was made << 8) | id, id in 1 .. MAX_THREADS - 1. */
static void *worker_main(void *arg) {
  uintptr_t a = (uintptr_t)arg;
  int id = (int)(a & 0xff);
  uint32_t seen = (uint32_t)(a >> 8);
  in_parallel_region = 1;
  for (;;) {
    seen = wait_for_job(seen);
    if (id >= (int)(seen & PARTS_MASK)) continue; /* not needed: job fields not read */
    int64_t b = id * job.chunk, e = b + job.chunk < job.n ? b + job.chunk : job.n;
    if (b < e) job.fn(job.ctx, b, e);
    if (atomic_fetch_sub(&pending, 1) == 1 && atomic_load(&caller_asleep))
      futex_wake_all(&pending);
  }
  return NULL;
}

/* The caller's wait for the workers of its job: spin, then sleep on `pending`. */
static void wait_for_workers(void) {
  uint32_t p = atomic_load_explicit(&pending, memory_order_acquire);
  while (p != 0) {
    uint32_t q = spin_while_equal(&pending, p);
    if (q != p) { /* progress (a worker done): spin again */
      p = q;
      continue;
    }
    atomic_store(&caller_asleep, 1);
    if (atomic_load(&pending) == p) futex_wait(&pending, p);
    atomic_store(&caller_asleep, 0);
    p = atomic_load_explicit(&pending, memory_order_acquire);
  }
}

int ddp_get_num_threads(void) {
  if (!num_threads) ddp_set_num_threads(default_threads());
  return num_threads;
}

int ddp_set_num_threads(int n) {
  if (n < 1) DDP_FAIL(DDP_ERR_ARG, "set_num_threads: thread count must be >= 1, got %d", n);
  if (n > MAX_THREADS) n = MAX_THREADS;
  pthread_mutex_lock(&pool_lock);
  num_threads = n;
  /* Note [pool and OpenBLAS threads]. Only when it is not at 1 already: in a forked child
   * (a DataLoader worker) OpenBLAS's set_num_threads first restarts the thread pool its
   * fork handler stopped, whatever the count, and that new thread spun ~0.1 s on a core
   * (THREAD_TIMEOUT) in every worker of every epoch; its count (1) is inherited. */
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  pthread_mutex_unlock(&pool_lock);
  return DDP_OK;
}

/* A forked child has none of the parent's workers: start from scratch there. */
static void reset_after_fork(void) {
  pthread_mutex_init(&pool_lock, NULL);
  workers_started = 0;
  atomic_store(&sleepers, 0);
  atomic_store(&pending, 0);
  atomic_store(&caller_asleep, 0);
  in_parallel_region = 0;
}

/* Start workers up to n - 1, under pool_lock (never stops them: idle workers sleep). */
static void ensure_workers(int n) {
  static int atfork_registered;
  if (!atfork_registered) atfork_registered = !pthread_atfork(NULL, NULL, reset_after_fork);
  uint32_t word = atomic_load(&job_word); /* stable: only changed under pool_lock */
  while (workers_started < n - 1) {
    pthread_t th;
    uintptr_t arg = ((uintptr_t)word << 8) | (uintptr_t)(workers_started + 1);
    if (pthread_create(&th, NULL, worker_main, (void *)arg) != 0) break;
    pthread_detach(th);
    workers_started++;
  }
}

void ddp_parallel_for(int64_t n, int64_t grain, ddp_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int threads = ddp_get_num_threads();
  if (threads < 2 || n < 2 * grain || in_parallel_region) {
    fn(ctx, 0, n);
    return;
  }
  int64_t parts = n / grain;
  if (parts > threads) parts = threads;
  if (pthread_mutex_trylock(&pool_lock) != 0) { /* another thread's job is running */
    fn(ctx, 0, n);
    return;
  }
  ensure_workers(threads);
  if (parts > workers_started + 1) parts = workers_started + 1;
  if (parts < 2) {
    pthread_mutex_unlock(&pool_lock);
    fn(ctx, 0, n);
    return;
  }
  int64_t chunk = (n + parts - 1) / parts;
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.chunk = chunk;
  atomic_store_explicit(&pending, (uint32_t)(parts - 1), memory_order_relaxed);
  uint32_t word = atomic_load_explicit(&job_word, memory_order_relaxed);
  word = (((word >> PARTS_BITS) + 1) << PARTS_BITS) | (uint32_t)parts;
  atomic_store(&job_word, word); /* publishes job and pending (seq_cst, so also release) */
  if (atomic_load(&sleepers)) futex_wake_all(&job_word);
  in_parallel_region = 1;
  fn(ctx, 0, chunk);
  in_parallel_region = 0;
  wait_for_workers();
  pthread_mutex_unlock(&pool_lock);
}
