/* runtime/io/loader.c: the batch loader and its prefetch thread.
 *
 * One producer (the thread) and one consumer (ddp_io_loader_next) share a ring of
 * `prefetch` slots under one mutex. The thread makes batch b outside the lock, then waits
 * for a free slot; the consumer waits for a filled one. Both waits are timed (so a missed
 * wake-up costs at most WAIT_MS) and end when the loader stops: ddp_io_loader_free sets
 * `stop`, wakes both sides and joins. An error on the thread is stored and handed to the
 * consumer after the batches made before it. Randomness follows Note [transform
 * randomness] (io.h): epoch position p uses block base + p, whichever thread makes it. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/profiler.h"
#include "io/io_internal.h"

enum { MAX_SOURCES = 8, WAIT_MS = 100, ERR_CAP = 2048 };

struct ddp_io_loader {
  int nsrc;
  ddp_tensor *src[MAX_SOURCES];     /* (N, ...) each, retained */
  ddp_io_plan_t plan[MAX_SOURCES];
  int64_t *order;                   /* (len) 0-based sample indices */
  int64_t len, batch_size, nbatches;
  uint64_t seed, base;              /* generator blocks reserved for this epoch */
  int prefetch;
  int pin_memory;                   /* batches go to pinned host memory (Note [pinned batches]) */
  int pin_device;                   /* the creating thread's current CUDA device */
  /* shared state, under mu */
  pthread_mutex_t mu;
  pthread_cond_t filled, freed;
  ddp_tensor **ring;                /* prefetch * nsrc batch tensors */
  int64_t produced, consumed;       /* batches put in / taken out of the ring */
  int stop;                         /* set by free: the thread exits */
  int thread_done;                  /* the thread finished (all batches, or error) */
  int err_status;                   /* the thread's error, reported after batch err_batch-1 */
  int64_t err_batch;
  char err_msg[ERR_CAP];
  int thread_started;
  pthread_t thread;
  pid_t owner;                      /* the process whose thread it is (Note [loader after fork]) */
};

/* Note [loader after fork]: a forked process (a DataLoader worker, Note [dataloader
 * workers]; dl.spawn's children) inherits the loader's memory but not its thread, nor a
 * consistent mutex if the thread held it at the fork. Its collector may still finalize its
 * copy: joining a thread of another process hung the worker for ever. In any process but
 * the one that made it, ddp_io_loader_free therefore touches nothing (the copy's memory
 * goes with the process) and ddp_io_loader_next refuses. */

/* Note [pinned batches]: with pin_memory the batch is gathered as usual and then copied
 * into page-locked host memory (ddp_tensor_pin_memory) by whoever makes it: the prefetch
 * thread when there is one, so the consumer receives batches that a device can copy from
 * asynchronously (to(device, non_blocking)) at no cost on its own thread. The extra host
 * copy is a memcpy of the batch; the gather itself writes pageable memory. The thread first
 * makes the creating thread's current device its own (as PyTorch's pin-memory thread), so
 * that a process using cuda:k never opens a context on cuda:0 from the loader. */

/* Make batch b into outs[0 .. nsrc-1]; use_pool: on the consumer's thread (Note [gather
 * on the pool], batch.c). */
static int make_batch(ddp_io_loader *l, int64_t b, ddp_tensor **outs, int use_pool) {
  if (DDP_PROF_ON()) ddp_prof_kernel_cancel(); /* Note [profiler events]: no op yet */
  int64_t start = b * l->batch_size;
  int64_t n = l->len - start < l->batch_size ? l->len - start : l->batch_size;
  for (int k = 0; k < l->nsrc; k++) {
    int status = ddp_io_gather(&outs[k], l->src[k], l->order + start, n, 1, &l->plan[k], l->seed,
                               l->base + (uint64_t)start, use_pool);
    if (!status && l->pin_memory) {
      ddp_tensor *pinned = NULL;
      status = ddp_tensor_pin_memory(&pinned, outs[k]);
      ddp_tensor_release(outs[k]);
      outs[k] = pinned;
    }
    if (status) {
      for (int j = 0; j < k; j++) {
        ddp_tensor_release(outs[j]);
        outs[j] = NULL;
      }
      return status;
    }
  }
  return DDP_OK;
}

/* Absolute deadline WAIT_MS from now, for pthread_cond_timedwait (CLOCK_REALTIME). */
static struct timespec deadline(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)WAIT_MS * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

static void *loader_main(void *arg) {
  ddp_io_loader *l = arg;
  ddp_tensor *outs[MAX_SOURCES];
  if (l->pin_memory) ddp_cuda_set_device(l->pin_device); /* a failure shows at the first pin */
  for (int64_t b = 0; b < l->nbatches; b++) {
    pthread_mutex_lock(&l->mu);
    int stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    if (stop) break;
    int status = make_batch(l, b, outs, 0);
    pthread_mutex_lock(&l->mu);
    if (status) {
      l->err_status = status;
      l->err_batch = b;
      snprintf(l->err_msg, sizeof l->err_msg, "%s", ddp_last_error());
      pthread_mutex_unlock(&l->mu);
      break;
    }
    while (!l->stop && l->produced - l->consumed >= l->prefetch) {
      struct timespec ts = deadline();
      pthread_cond_timedwait(&l->freed, &l->mu, &ts);
    }
    if (l->stop) {
      pthread_mutex_unlock(&l->mu);
      for (int k = 0; k < l->nsrc; k++) ddp_tensor_release(outs[k]);
      break;
    }
    ddp_tensor **slot = l->ring + (l->produced % l->prefetch) * l->nsrc;
    for (int k = 0; k < l->nsrc; k++) slot[k] = outs[k];
    l->produced++;
    pthread_cond_signal(&l->filled);
    pthread_mutex_unlock(&l->mu);
  }
  pthread_mutex_lock(&l->mu);
  l->thread_done = 1;
  pthread_cond_broadcast(&l->filled);
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int ddp_io_loader_new(ddp_io_loader **out, int nsources, ddp_tensor **sources,
                      const ddp_io_transform *transforms, ddp_tensor *order,
                      int64_t batch_size, int drop_last, int prefetch, int pin_memory,
                      ddp_generator *g) {
  *out = NULL;
  if (nsources < 1 || nsources > MAX_SOURCES || !sources)
    DDP_FAIL(DDP_ERR_ARG, "loader: expected 1 to %d sources, got %d", MAX_SOURCES, nsources);
  if (batch_size < 1) DDP_FAIL(DDP_ERR_ARG, "loader: batch_size must be >= 1, got %lld", (long long)batch_size);
  if (prefetch < 0 || prefetch > 1024)
    DDP_FAIL(DDP_ERR_ARG, "loader: prefetch must be in 0..1024, got %d", prefetch);
  if (pin_memory && !ddp_cuda_is_available())
    DDP_FAIL(DDP_ERR_UNAVAILABLE, "loader: pin_memory needs CUDA, which is not available: %s",
             ddp_cuda_unavailable_reason());
  int pin_device = 0;
  if (pin_memory) DDP_TRY(ddp_cuda_current_device(&pin_device));
  DDP_TRY(ddp_check_alive(order, "loader", "order"));
  if (order->ndim != 1 || (order->dtype != DDP_I64 && order->dtype != DDP_I32))
    DDP_FAIL(DDP_ERR_ARG, "loader: order must be a 1-d i64 or i32 tensor, got %s %s",
             ddp_dtype_name(order->dtype), DDP_SHAPE(order));
  ddp_io_plan_t plans[MAX_SOURCES];
  for (int k = 0; k < nsources; k++) {
    char arg[32];
    snprintf(arg, sizeof arg, "sources[%d]", k);
    DDP_TRY(ddp_check_alive(sources[k], "loader", arg));
    if (sources[k]->ndim < 1)
      DDP_FAIL(DDP_ERR_ARG, "loader: sources[%d] is 0-d (a source is (N, ...))", k);
    if (sources[k]->shape[0] != sources[0]->shape[0])
      DDP_FAIL(DDP_ERR_ARG, "loader: sources[%d] %s and sources[0] %s differ in size (N)", k,
               DDP_SHAPE(sources[k]), DDP_SHAPE(sources[0]));
    if (sources[k]->device != DDP_DEVICE_CPU)
      DDP_FAIL(DDP_ERR_ARG, "loader: sources[%d] is not a CPU tensor", k);
    DDP_TRY(ddp_io_plan(&plans[k], sources[k], transforms ? &transforms[k] : NULL, "loader"));
  }
  int64_t N = sources[0]->shape[0], len = order->numel;
  ddp_io_loader *l = calloc(1, sizeof *l);
  if (!l) DDP_FAIL(DDP_ERR_MEMORY, "loader: out of memory");
  l->owner = getpid();
  l->order = malloc((size_t)(len ? len : 1) * sizeof *l->order);
  l->ring = calloc((size_t)(prefetch ? prefetch : 1) * (size_t)nsources, sizeof *l->ring);
  if (!l->order || !l->ring) {
    free(l->order);
    free(l->ring);
    free(l);
    DDP_FAIL(DDP_ERR_MEMORY, "loader: out of memory for an order of %lld", (long long)len);
  }
  const char *op = ddp_data(order);
  for (int64_t i = 0; i < len; i++) {
    int64_t v = order->dtype == DDP_I64 ? ((const int64_t *)op)[i * order->strides[0]]
                                        : ((const int32_t *)op)[i * order->strides[0]];
    if (v < 0 || v >= N) {
      free(l->order);
      free(l->ring);
      free(l);
      DDP_FAIL(DDP_ERR_ARG, "loader: order[%lld] = %lld is out of range for %lld samples (indices count from 0)",
               (long long)i, (long long)v, (long long)N);
    }
    l->order[i] = v;
  }
  l->nsrc = nsources;
  for (int k = 0; k < nsources; k++) {
    l->src[k] = sources[k];
    ddp_tensor_retain(sources[k]);
    l->plan[k] = plans[k];
  }
  l->len = len;
  l->batch_size = batch_size;
  l->nbatches = drop_last ? len / batch_size : (len + batch_size - 1) / batch_size;
  l->prefetch = prefetch;
  l->pin_memory = pin_memory ? 1 : 0;
  l->pin_device = pin_device;
  int random = 0;
  for (int k = 0; k < nsources; k++) random |= plans[k].random;
  if (random) {
    if (!g) g = ddp_generator_default();
    ddp_generator_get_state(g, &l->seed, &l->base);
    ddp_generator_set_state(g, l->seed, l->base + (uint64_t)len);
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->filled, NULL);
  pthread_cond_init(&l->freed, NULL);
  if (prefetch > 0 && l->nbatches > 0) {
    int rc = pthread_create(&l->thread, NULL, loader_main, l);
    if (rc) {
      ddp_io_loader_free(l);
      DDP_FAIL(DDP_ERR_STATE, "loader: cannot start the prefetch thread: %s", strerror(rc));
    }
    l->thread_started = 1;
  } else {
    l->thread_done = 1;
  }
  *out = l;
  return DDP_OK;
}

static int loader_next(ddp_io_loader *l, ddp_tensor **outs);

/* The profiler sees the consumer's wait (or the making of the batch without a prefetch
 * thread) as DataLoader.__next__, PyTorch's name for it (Note [profiler events]). */
int ddp_io_loader_next(ddp_io_loader *l, ddp_tensor **outs) {
  int64_t t0 = DDP_PROF_ON() ? ddp_prof_now() : 0;
  int status = loader_next(l, outs);
  if (t0) {
    ddp_prof_kernel_cancel(); /* the batch's storage is no op's output */
    ddp_prof_record("DataLoader.__next__", DDP_PROF_LOADER, t0, -1, -1, NULL);
  }
  return status;
}

static int loader_next(ddp_io_loader *l, ddp_tensor **outs) {
  if (!l) DDP_FAIL(DDP_ERR_ARG, "loader_next: loader is NULL");
  for (int k = 0; k < l->nsrc; k++) outs[k] = NULL;
  if (l->thread_started && l->owner != getpid())
    DDP_FAIL(DDP_ERR_STATE, "loader_next: this loader's prefetch thread belongs to process %d, "
             "not to this forked one (start a new iter() here)", (int)l->owner);
  if (!l->thread_started) {
    if (l->consumed >= l->nbatches) return DDP_IO_END;
    int status = make_batch(l, l->consumed, outs, 1);
    if (status) {
      ddp_error_prefix("loader: batch %lld", (long long)l->consumed);
      return status;
    }
    l->consumed++;
    return DDP_OK;
  }
  pthread_mutex_lock(&l->mu);
  while (l->produced == l->consumed && !l->thread_done) {
    struct timespec ts = deadline();
    pthread_cond_timedwait(&l->filled, &l->mu, &ts);
  }
  if (l->produced > l->consumed) {
    ddp_tensor **slot = l->ring + (l->consumed % l->prefetch) * l->nsrc;
    for (int k = 0; k < l->nsrc; k++) {
      outs[k] = slot[k];
      slot[k] = NULL;
    }
    l->consumed++;
    pthread_cond_signal(&l->freed);
    pthread_mutex_unlock(&l->mu);
    return DDP_OK;
  }
  int status = l->err_status;
  int64_t err_batch = l->err_batch;
  char msg[ERR_CAP];
  snprintf(msg, sizeof msg, "%s", l->err_msg);
  pthread_mutex_unlock(&l->mu);
  if (status) {
    return ddp_fail_at(__FILE__, __LINE__, status, "loader: batch %lld (made on the prefetch thread): %s",
                       (long long)err_batch, msg);
  }
  return DDP_IO_END;
}

/* Note [default prefetch]: a prefetch thread hides a batch's making only where a core
 * would otherwise idle. When the training threads already fill every core (1 process x 2
 * threads, or DDP 2 x 1 on 2 cores), the thread takes its ~20 us a batch from a core the
 * step needs, at a moment the scheduler picks: it preempts a pool worker in the middle of
 * a GEMM part and the fork-join waits for it, and the MLP on this 2-core machine ran at
 * ~121k samples/s with the thread against ~136k with the batch made inline and split over
 * the pool (median of 6 alternating runs each, bench/train.lua --model mlp --threads 2).
 * pin_memory keeps the thread: device training leaves the host cores mostly idle, and the
 * pinning copy is the thread's job (Note [pinned batches]). */
int ddp_io_loader_default_prefetch(int pin_memory) {
  if (pin_memory) return 2;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const char *env = getenv("LOCAL_WORLD_SIZE");
  long local = env && *env ? atol(env) : 1;
  if (local < 1) local = 1;
  return (long)ddp_get_num_threads() * local < cores ? 2 : 0;
}

int64_t ddp_io_loader_num_batches(const ddp_io_loader *l) { return l ? l->nbatches : 0; }

void ddp_io_loader_free(ddp_io_loader *l) {
  if (!l) return;
  if (l->owner != getpid()) return; /* Note [loader after fork] */
  if (l->thread_started) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->freed);
    pthread_cond_broadcast(&l->filled);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
  }
  if (l->ring) {
    for (int64_t i = 0; i < (int64_t)(l->prefetch ? l->prefetch : 1) * l->nsrc; i++)
      ddp_tensor_release(l->ring[i]);
  }
  for (int k = 0; k < l->nsrc; k++) ddp_tensor_release(l->src[k]);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->filled);
  pthread_cond_destroy(&l->freed);
  free(l->order);
  free(l->ring);
  free(l);
}
