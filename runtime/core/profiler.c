/* runtime/core/profiler.c: the per-process event stream of the profiler (public API:
 * ddplua/profiler.h; producers: core/profiler.h).
 *
 * Note [profiler events]: one stream per process, cut into one buffer per thread so that
 * recording takes no lock. Who records what:
 *  - ops: the one dispatch path (Note [one dispatch path], backend/kernels.h). Every op
 *    front door fetches its kernels with ddp_kernels_for and, after calling them, calls
 *    ddp_device_check(device, op); the first opens a bracket on the thread
 *    (ddp_prof_kernel_begin: the time, unless one is open), the second closes it into an
 *    event named op (ddp_prof_kernel_end). An op's output storage, made before its kernels
 *    run, opens the bracket too, and the op's autograd node, recorded right after them,
 *    extends the event (ddp_prof_note_inputs). So every op of every device is covered
 *    without touching the ops, from its output's allocation to its node (its argument
 *    checks before that are not); a bracket that no op closes (a storage made outside an
 *    op, as a data-loader batch or a collective's staging buffer) is dropped when the
 *    thread records any other kind of event or opens or closes a range, and when a node's
 *    backward or a batch begins (ddp_prof_kernel_cancel);
 *  - autograd: the engine around each node's backward function (runtime/autograd/engine.c);
 *    the ops the backward calls nest inside as op events;
 *  - collectives: the flight recorder of the process groups (Note [flight recorder]),
 *    which sees every collective of every backend start and end: one event from start to
 *    end on the thread that ran it (the communication thread for Gloo), with its bytes,
 *    sequence and call site (DDP's bucket all-reduces say "DistributedDataParallel
 *    gradient bucket k");
 *  - DDP buckets (the reducer, runtime/distributed/reducer.c), each with the bucket's index
 *    and bytes: "DDP bucket ready", an instant event when the reducer launches a bucket (all
 *    its gradients ready); "DDP bucket all_reduce", a bucket all-reduced blocking on the
 *    backward's thread (Note [last bucket inline]), from the call to its return (the wait
 *    for the queue included); "DDP bucket wait", the end of the backward waiting for a
 *    bucket all-reduced on the communication thread;
 *  - the data loader: DataLoader.__next__ around ddp_io_loader_next (a wait on the prefetch
 *    thread, or the making of the batch when there is none);
 *  - the front end: ranges (ddp_profiler_range_push/pop): optimizer steps,
 *    record_function, the profiler's steps, and the collections that release tensors
 *    (ddplua/lib.lua: Note [step lifetimes], Note [collector pacing]; category memory,
 *    work of the step as an op's deallocations are in PyTorch).
 *
 * Buffers: a thread gets its buffer on its first event (under the list's lock, once per
 * thread and session) and from then on appends without a lock: the event is written, then
 * the count is published with a release store, so a reader (ddp_profiler_events, after
 * ddp_profiler_stop) never sees a half-written event. Sessions are numbered: start and
 * clear bump the number, and a thread whose buffer holds an older session's events empties
 * it on its next event (readers skip such buffers). Buffers outlive their threads (a
 * communication or loader thread that ended still has events to export); a new thread
 * reuses the buffer of an ended one once that buffer's events belong to an old session.
 * A full buffer counts the events it drops (ddp_profiler_dropped, in the trace's metadata).
 *
 * Note [profiler shapes]: with DDP_PROF_RECORD_SHAPES an op event carries its inputs'
 * shapes. The dispatch bracket sees no tensors, so the shapes come from the tape: an op
 * that records its autograd node right after its kernels (every differentiable op does,
 * Note [one dispatch path]) hands the node's inputs to ddp_prof_note_inputs, which writes
 * their shapes into the last op event of the thread when it has none yet. Ops that record
 * no node (no_grad, integer outputs) keep "" (PyTorch's record_shapes shows them; this is
 * the documented difference). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/profiler.h"

enum { DEFAULT_EVENTS = 131072, RANGE_DEPTH = 64 };

volatile int ddp_prof_active = 0;

typedef struct prof_buf {
  ddp_prof_event *ev;
  int64_t cap;
  _Atomic int64_t n;       /* events published */
  _Atomic int64_t dropped; /* events that did not fit */
  _Atomic uint64_t session;
  int32_t tid;
  _Atomic int alive;       /* its thread is running */
  struct prof_buf *next;
} prof_buf;

typedef struct {
  const char *name; /* interned */
  int category;
  int64_t begin; /* 0: opened while off, recorded as nothing */
} prof_range;

static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
static prof_buf *buffers;                 /* every buffer ever made, under list_mu */
static _Atomic uint64_t session = 1;      /* bumped by start and clear */
static int64_t capacity = DEFAULT_EVENTS; /* of buffers made or refilled from now on */
static int record_shapes;
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static __thread prof_buf *my_buf;
static __thread int64_t kernel_begin; /* the open op bracket, 0 when none */
static __thread prof_range ranges[RANGE_DEPTH];
static __thread int range_depth;

static const char *const CATEGORY_NAMES[] = {"op",        "autograd",        "collective",
                                             "bucket",    "loader",          "optimizer",
                                             "user_annotation", "step",      "memory"};
_Static_assert(sizeof CATEGORY_NAMES / sizeof CATEGORY_NAMES[0] == DDP_PROF_CATEGORY_COUNT,
               "CATEGORY_NAMES: one name per enum ddp_prof_category, in enum order");

const char *ddp_profiler_category_name(int category) {
  return category >= 0 && category < DDP_PROF_CATEGORY_COUNT ? CATEGORY_NAMES[category] : "?";
}

int64_t ddp_prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ddp_profiler_now_ns(void) { return ddp_prof_now(); }

/* ---- buffers ----------------------------------------------------------------------------- */

static void on_thread_exit(void *b) { atomic_store(&((prof_buf *)b)->alive, 0); }
static void make_key(void) { pthread_key_create(&exit_key, on_thread_exit); }

/* The calling thread's buffer, made or adopted on its first event; NULL when out of memory
 * (the event is then lost, nothing else). */
static prof_buf *attach(void) {
  pthread_once(&key_once, make_key);
  uint64_t now_session = atomic_load(&session);
  pthread_mutex_lock(&list_mu);
  prof_buf *b = buffers;
  while (b && (atomic_load(&b->alive) || atomic_load(&b->session) == now_session)) b = b->next;
  if (!b) {
    b = calloc(1, sizeof *b);
    if (b) {
      b->next = buffers;
      buffers = b;
    }
  }
  if (b) {
    atomic_store(&b->alive, 1);
    atomic_store(&b->n, 0);
    atomic_store(&b->session, 0); /* emptied (and sized) on its first event below */
    b->tid = (int32_t)syscall(SYS_gettid);
  }
  pthread_mutex_unlock(&list_mu);
  if (b) pthread_setspecific(exit_key, b);
  return my_buf = b;
}

/* The slot for the next event of this thread, or NULL (buffer full: counted as dropped). */
static ddp_prof_event *next_slot(prof_buf **out) {
  prof_buf *b = my_buf ? my_buf : attach();
  if (!b) return NULL;
  uint64_t s = atomic_load_explicit(&session, memory_order_acquire);
  if (atomic_load_explicit(&b->session, memory_order_relaxed) != s) { /* a new session */
    if (!b->ev || b->cap != capacity) {
      free(b->ev);
      b->cap = capacity;
      b->ev = malloc((size_t)b->cap * sizeof *b->ev); /* pages taken as the events fill them */
      if (!b->ev) b->cap = 0;
    }
    atomic_store_explicit(&b->n, 0, memory_order_relaxed);
    atomic_store_explicit(&b->dropped, 0, memory_order_relaxed);
    atomic_store_explicit(&b->session, s, memory_order_release);
  }
  int64_t n = atomic_load_explicit(&b->n, memory_order_relaxed);
  if (n >= b->cap) {
    atomic_fetch_add_explicit(&b->dropped, 1, memory_order_relaxed);
    return NULL;
  }
  *out = b;
  return &b->ev[n];
}

static void publish(prof_buf *b) {
  atomic_store_explicit(&b->n, atomic_load_explicit(&b->n, memory_order_relaxed) + 1,
                        memory_order_release);
}

void ddp_prof_record_span(const char *name, int category, int64_t begin_ns, int64_t end_ns,
                          int64_t bytes, int64_t arg, const char *detail) {
  if (!ddp_prof_active) return;
  if (category != DDP_PROF_OP) kernel_begin = 0; /* an open op bracket is no op's (below) */
  prof_buf *b;
  ddp_prof_event *e = next_slot(&b);
  if (!e) return;
  e->name = name;
  e->begin_ns = begin_ns;
  e->end_ns = end_ns < begin_ns ? begin_ns : end_ns;
  e->bytes = bytes;
  e->arg = arg;
  e->category = category;
  e->tid = b->tid;
  if (detail) {
    size_t k = strlen(detail);
    if (k >= sizeof e->detail) k = sizeof e->detail - 1;
    memcpy(e->detail, detail, k);
    e->detail[k] = 0;
  } else {
    e->detail[0] = 0;
  }
  publish(b);
}

void ddp_prof_record(const char *name, int category, int64_t begin_ns, int64_t bytes,
                     int64_t arg, const char *detail) {
  ddp_prof_record_span(name, category, begin_ns, ddp_prof_now(), bytes, arg, detail);
}

/* ---- the op bracket (Note [profiler events]) ---------------------------------------------- */

void ddp_prof_kernel_cancel(void) { kernel_begin = 0; }

void ddp_prof_kernel_begin(void) {
  if (!kernel_begin) kernel_begin = ddp_prof_now();
}

/* The end of the op event this thread recorded last, when nothing was recorded after it
 * (and the session is current); else 0. */
static int64_t last_op_end(void) {
  prof_buf *b = my_buf;
  if (!b || atomic_load_explicit(&b->session, memory_order_relaxed) != atomic_load(&session))
    return 0;
  int64_t k = atomic_load_explicit(&b->n, memory_order_relaxed);
  return k > 0 && b->ev[k - 1].category == DDP_PROF_OP ? b->ev[k - 1].end_ns : 0;
}

void ddp_prof_kernel_end(const char *op) {
  int64_t t0 = kernel_begin;
  kernel_begin = 0;
  if (!op) return;
  /* Note [profiler events]: an op whose bracket an inner op closed (linear copies the bias
   * with copy_ and then runs its GEMM) or that checks several kernels after one lookup
   * (the losses) continues from where the op before it on this thread ended. */
  if (!t0) t0 = last_op_end();
  if (t0) ddp_prof_record(op, DDP_PROF_OP, t0, -1, -1, NULL);
}

/* ---- shapes (Note [profiler shapes]) ------------------------------------------------------ */

void ddp_prof_note_inputs(int n, ddp_tensor *const *inputs) {
  if (!last_op_end()) return;
  prof_buf *b = my_buf;
  ddp_prof_event *e = &b->ev[atomic_load_explicit(&b->n, memory_order_relaxed) - 1];
  e->end_ns = ddp_prof_now(); /* recording the node is part of the op */
  if (!record_shapes || e->detail[0]) return;
  char buf[sizeof e->detail];
  size_t at = 0;
  buf[at++] = '[';
  for (int i = 0; i < n && at < sizeof buf; i++) {
    const ddp_tensor *t = inputs[i];
    at += (size_t)snprintf(buf + at, sizeof buf - at, "%s[", i ? ", " : "");
    for (int d = 0; t && d < t->ndim && at < sizeof buf; d++)
      at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%lld", d ? ", " : "",
                             (long long)t->shape[d]);
    if (at < sizeof buf) at += (size_t)snprintf(buf + at, sizeof buf - at, "]");
  }
  if (at < sizeof buf) at += (size_t)snprintf(buf + at, sizeof buf - at, "]");
  if (at >= sizeof buf) { /* too long: cut with an ellipsis */
    memcpy(buf + sizeof buf - 5, "...]", 5);
  }
  memcpy(e->detail, buf, sizeof buf);
}

/* ---- names of ranges ---------------------------------------------------------------------- */

/* Range names come from the front end (any string, freed by Lua later): events keep an
 * interned copy, one per distinct name for the process's life. Only ranges pay the lock. */
static const char **interned;
static size_t n_interned, cap_interned;

static const char *intern(const char *name) {
  pthread_mutex_lock(&list_mu);
  const char *found = NULL;
  for (size_t i = n_interned; i-- > 0 && !found;)
    if (strcmp(interned[i], name) == 0) found = interned[i];
  if (!found) {
    if (n_interned == cap_interned) {
      size_t cap = cap_interned ? 2 * cap_interned : 64;
      const char **grown = realloc(interned, cap * sizeof *grown);
      if (grown) {
        interned = grown;
        cap_interned = cap;
      }
    }
    char *copy = n_interned < cap_interned ? strdup(name) : NULL;
    if (copy) interned[n_interned++] = copy;
    found = copy;
  }
  pthread_mutex_unlock(&list_mu);
  return found;
}

/* ---- public API --------------------------------------------------------------------------- */

int ddp_profiler_start(int64_t events_per_thread, int flags) {
  if (events_per_thread < 0)
    DDP_FAIL(DDP_ERR_ARG, "profiler: events_per_thread must be >= 0, got %lld",
             (long long)events_per_thread);
  if (ddp_prof_active)
    DDP_FAIL(DDP_ERR_ARG, "profiler: already recording (one profiler at a time per process; "
             "stop the other first)");
  pthread_mutex_lock(&list_mu);
  capacity = events_per_thread ? events_per_thread : DEFAULT_EVENTS;
  record_shapes = (flags & DDP_PROF_RECORD_SHAPES) != 0;
  pthread_mutex_unlock(&list_mu);
  kernel_begin = 0;
  atomic_fetch_add(&session, 1);
  ddp_prof_active = 1;
  return DDP_OK;
}

void ddp_profiler_stop(void) { ddp_prof_active = 0; }

int ddp_profiler_enabled(void) { return ddp_prof_active != 0; }

void ddp_profiler_clear(void) {
  kernel_begin = 0;
  atomic_fetch_add(&session, 1);
}

/* Sum of n (what = 0) or dropped (what = 1) over the buffers of this session. */
static int64_t sum_over(int what) {
  uint64_t s = atomic_load(&session);
  int64_t total = 0;
  pthread_mutex_lock(&list_mu);
  for (prof_buf *b = buffers; b; b = b->next)
    if (atomic_load(&b->session) == s) total += what ? atomic_load(&b->dropped) : atomic_load(&b->n);
  pthread_mutex_unlock(&list_mu);
  return total;
}

int64_t ddp_profiler_event_count(void) { return sum_over(0); }
int64_t ddp_profiler_dropped(void) { return sum_over(1); }

int ddp_profiler_events(ddp_prof_event *out, int64_t cap, int64_t *n) {
  if (!n || (cap > 0 && !out)) DDP_FAIL(DDP_ERR_ARG, "profiler events: NULL output");
  uint64_t s = atomic_load(&session);
  int64_t at = 0;
  pthread_mutex_lock(&list_mu);
  for (prof_buf *b = buffers; b && at < cap; b = b->next) {
    if (atomic_load_explicit(&b->session, memory_order_acquire) != s) continue;
    int64_t k = atomic_load_explicit(&b->n, memory_order_acquire);
    if (k > cap - at) k = cap - at;
    memcpy(out + at, b->ev, (size_t)k * sizeof *out);
    at += k;
  }
  pthread_mutex_unlock(&list_mu);
  *n = at;
  return DDP_OK;
}

int ddp_profiler_range_push(const char *name, int category) {
  if (!name) DDP_FAIL(DDP_ERR_ARG, "record_function: name is NULL");
  if (category < 0 || category >= DDP_PROF_CATEGORY_COUNT)
    DDP_FAIL(DDP_ERR_ARG, "record_function: category %d is out of range 0 .. %d", category,
             DDP_PROF_CATEGORY_COUNT - 1);
  if (range_depth >= RANGE_DEPTH) {
    range_depth++; /* counted, popped, never recorded */
    if (my_buf) atomic_fetch_add(&my_buf->dropped, 1);
    return DDP_OK;
  }
  kernel_begin = 0;
  prof_range *r = &ranges[range_depth++];
  r->begin = 0;
  r->name = NULL;
  r->category = category;
  if (ddp_prof_active) {
    r->name = intern(name);
    r->begin = ddp_prof_now();
  }
  return DDP_OK;
}

int ddp_profiler_range_pop(void) {
  if (range_depth == 0)
    DDP_FAIL(DDP_ERR_ARG, "record_function: end without a matching begin on this thread");
  kernel_begin = 0;
  if (--range_depth >= RANGE_DEPTH) return DDP_OK;
  prof_range *r = &ranges[range_depth];
  if (r->begin && r->name) ddp_prof_record(r->name, r->category, r->begin, -1, -1, NULL);
  return DDP_OK;
}

int ddp_profiler_range_depth(void) { return range_depth; }
