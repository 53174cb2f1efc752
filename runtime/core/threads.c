/* runtime/core/threads.c: the thread count (ours and OpenBLAS's) and a small fork-join pool.
 *
 * The pool keeps (threads - 1) workers asleep on a condition variable; ddp_parallel_for
 * hands each a contiguous chunk and the caller runs the first. Kept deliberately simple:
 * one job at a time (a mutex serialises callers), nested calls run inline. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include <cblas.h>

#include "core/core.h"

enum { MAX_THREADS = 64 };

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static int num_threads;        /* 0 until first use */
static int workers_started;
static int64_t job_generation;
static int job_pending;        /* workers still running the current job */
static struct { ddp_range_fn fn; void *ctx; int64_t n, chunk; int parts; } job;
static __thread int in_parallel_region;

static int default_threads(void) {
  const char *env = getenv("DDP_NUM_THREADS");
  if (!env || !*env) env = getenv("OMP_NUM_THREADS");
  int n = env ? atoi(env) : 0;
  if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > MAX_THREADS ? MAX_THREADS : n;
}

static void *worker_main(void *arg) {
  int id = (int)(intptr_t)arg; /* 1 .. workers */
  int64_t seen = 0;
  in_parallel_region = 1;
  for (;;) {
    pthread_mutex_lock(&state_lock);
    while (job_generation == seen) pthread_cond_wait(&work_cv, &state_lock);
    seen = job_generation;
    int parts = job.parts;
    pthread_mutex_unlock(&state_lock);
    if (id < parts) {
      int64_t b = id * job.chunk, e = b + job.chunk < job.n ? b + job.chunk : job.n;
      if (b < e) job.fn(job.ctx, b, e);
    }
    pthread_mutex_lock(&state_lock);
    if (--job_pending == 0) pthread_cond_signal(&done_cv);
    pthread_mutex_unlock(&state_lock);
  }
  return NULL;
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
  openblas_set_num_threads(n);
  pthread_mutex_unlock(&pool_lock);
  return DDP_OK;
}

/* A forked child has none of the parent's workers: start from scratch there. */
static void reset_after_fork(void) {
  pthread_mutex_init(&pool_lock, NULL);
  pthread_mutex_init(&state_lock, NULL);
  pthread_cond_init(&work_cv, NULL);
  pthread_cond_init(&done_cv, NULL);
  workers_started = 0;
  job_pending = 0;
  in_parallel_region = 0;
}

/* Start workers up to n - 1 (never stops them: idle workers only sleep). */
static void ensure_workers(int n) {
  static int atfork_registered;
  if (!atfork_registered) atfork_registered = !pthread_atfork(NULL, NULL, reset_after_fork);
  while (workers_started < n - 1) {
    pthread_t th;
    pthread_mutex_lock(&state_lock);
    int id = workers_started + 1;
    pthread_mutex_unlock(&state_lock);
    if (pthread_create(&th, NULL, worker_main, (void *)(intptr_t)id) != 0) break;
    pthread_detach(th);
    pthread_mutex_lock(&state_lock);
    workers_started++;
    pthread_mutex_unlock(&state_lock);
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
  pthread_mutex_lock(&pool_lock);
  ensure_workers(threads);
  if (parts > workers_started + 1) parts = workers_started + 1;
  if (parts < 2) {
    pthread_mutex_unlock(&pool_lock);
    fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&state_lock);
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.parts = (int)parts;
  job.chunk = (n + parts - 1) / parts;
  job_pending = workers_started;
  job_generation++;
  pthread_cond_broadcast(&work_cv);
  pthread_mutex_unlock(&state_lock);
  in_parallel_region = 1;
  fn(ctx, 0, job.chunk < n ? job.chunk : n);
  in_parallel_region = 0;
  pthread_mutex_lock(&state_lock);
  while (job_pending > 0) pthread_cond_wait(&done_cv, &state_lock);
  pthread_mutex_unlock(&state_lock);
  pthread_mutex_unlock(&pool_lock);
}
