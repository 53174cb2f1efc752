/* ddplua/profiler.h: part of the public API, included by ddplua.h only.
 *
 * The per-process event stream behind the profiler (Lua: ddplua.profiler; DESIGN.md,
 * "Observability"). While recording is on, every producer of the runtime appends events to
 * a buffer of its own thread: op kernels (category DDP_PROF_OP, from the one dispatch path,
 * Note [profiler events] in runtime/core/profiler.c), autograd backward nodes
 * (DDP_PROF_AUTOGRAD, the engine), collectives with their bytes (DDP_PROF_COLLECTIVE, the
 * process groups' flight recorder), DDP bucket launches (DDP_PROF_BUCKET, the reducer),
 * data-loader waits (DDP_PROF_LOADER) and the ranges the front end opens
 * (ddp_profiler_range_push: optimizer steps, record_function, profiler steps).
 *
 * Times are nanoseconds of CLOCK_MONOTONIC (ddp_profiler_now_ns), comparable between the
 * threads of a process; between processes (ranks) they are not: `ddplua trace merge`
 * aligns them (Note [trace clock alignment] in lua/ddplua/profiler.lua).
 *
 * Off (the default), recording costs one predictable branch on a global flag per producer
 * call. On, an event costs two clock reads and a store into the thread's preallocated
 * buffer, without locks; a full buffer drops further events and counts them
 * (ddp_profiler_dropped). */

/* What produced an event (the "cat" of a Chrome trace). Names: ddp_profiler_category_name. */
enum ddp_prof_category {
  DDP_PROF_OP,         /* an op's kernels: name = the op ("matmul", "add") */
  DDP_PROF_AUTOGRAD,   /* a backward node: name = the node ("MulBackward") */
  DDP_PROF_COLLECTIVE, /* a collective from start to end: name = "all_reduce" ..., bytes */
  DDP_PROF_BUCKET,     /* a DDP gradient bucket: "DDP bucket ready" (instant, at its launch),
                        * "DDP bucket all_reduce" (blocking on the backward's thread), "DDP
                        * bucket wait" (for one on the comm thread); arg = index, bytes */
  DDP_PROF_LOADER,     /* DataLoader.__next__: the wait for (or the making of) a batch */
  DDP_PROF_OPTIMIZER,  /* an optimizer step (range pushed by ddplua.optim) */
  DDP_PROF_USER,       /* record_function and other ranges of the front end */
  DDP_PROF_STEP,       /* ProfilerStep#N: one profiler step (range) */
  DDP_PROF_MEMORY,     /* the front end releasing tensors (a collection, Note [step
                        * lifetimes]): "ddplua: collect garbage", "ddplua: release tensors" */
  DDP_PROF_CATEGORY_COUNT
};

/* ddp_profiler_start flags. */
enum { DDP_PROF_RECORD_SHAPES = 1 };

/* One recorded event. A complete event spans [begin_ns, end_ns]; an instant event has
 * end_ns == begin_ns ("DDP bucket ready"). */
typedef struct ddp_prof_event {
  const char *name;  /* NUL-terminated; valid for the life of the process */
  int64_t begin_ns;  /* CLOCK_MONOTONIC, ns */
  int64_t end_ns;    /* CLOCK_MONOTONIC, ns, >= begin_ns */
  int64_t bytes;     /* a collective's payload (elements x dtype size), a bucket's bytes; -1 */
  int64_t arg;       /* a collective's sequence number, a bucket's index; -1 when none */
  int32_t category;  /* enum ddp_prof_category */
  int32_t tid;       /* the OS thread id (gettid) of the thread that recorded it */
  char detail[64];   /* an op's input shapes with record_shapes ("[[64, 784], [128, 784]]",
                      * differentiable ops only: Note [profiler shapes]); a collective's
                      * call site ("DistributedDataParallel gradient bucket 2"); else "" */
} ddp_prof_event;

/* Turn recording on for every thread of the process, dropping the events of an earlier
 * session. events_per_thread: capacity of each thread's buffer (0: 131072; each event is
 * sizeof(ddp_prof_event) = 112 bytes, memory taken as it fills); flags: DDP_PROF_RECORD_SHAPES
 * or 0. DDP_ERR_ARG when recording is already on or events_per_thread < 0;
 * DDP_ERR_MEMORY when a buffer cannot be made. */
int ddp_profiler_start(int64_t events_per_thread, int flags);

/* Turn recording off; the events stay readable until the next start or clear. Calling it
 * while off does nothing. */
void ddp_profiler_stop(void);

/* 1 while recording is on, else 0. */
int ddp_profiler_enabled(void);

/* Drop the events recorded so far (every thread), keeping recording on or off as it is
 * (the profiler's schedule drops its warm-up steps this way). Ranges still open on a
 * thread stay open and are recorded when they end. */
void ddp_profiler_clear(void);

/* The number of events recorded since the last start or clear, all threads together. */
int64_t ddp_profiler_event_count(void);

/* Events dropped since the last start or clear because a thread's buffer was full. */
int64_t ddp_profiler_dropped(void);

/* Copy up to `cap` recorded events into out[0 .. *n - 1], thread by thread, each thread's
 * in the order it recorded them (ends ascending). Call it with recording off (after
 * ddp_profiler_stop) to read a stable set; while on, events recorded during the copy may
 * be missing. DDP_ERR_ARG for a NULL out or n with cap > 0. */
int ddp_profiler_events(ddp_prof_event *out, int64_t cap, int64_t *n);

/* Open a range named `name` (copied: any string) of `category` on the calling thread; the
 * matching ddp_profiler_range_pop records it. Ranges nest (at most 64 open per thread;
 * deeper ones are counted as dropped). While recording is off it does nothing and returns
 * DDP_OK. DDP_ERR_ARG for a NULL name or a category out of range. */
int ddp_profiler_range_push(const char *name, int category);

/* Close the innermost open range of the calling thread and record it (nothing while
 * recording is off, or when the range was opened while off). DDP_ERR_ARG when no range
 * is open on this thread ("record_function: end without a matching begin"). */
int ddp_profiler_range_pop(void);

/* Ranges open on the calling thread (for checks: 0 after balanced push/pop pairs). */
int ddp_profiler_range_depth(void);

/* The profiler's clock: CLOCK_MONOTONIC in nanoseconds. Never fails. */
int64_t ddp_profiler_now_ns(void);

/* The name of a category ("op", "autograd", "collective", "bucket", "loader",
 * "optimizer", "user_annotation", "step", "memory"), "?" out of range. */
const char *ddp_profiler_category_name(int category);
