/* runtime/backend/sim/plugin.c: a simulated CUDA device for the specs (built as
 * build/libddplua_cuda_sim.so; selected with DDPLUA_CUDA_PLUGIN).
 *
 * It is a test double, not a backend: "device" memory is host memory, the kernels are the
 * CPU kernels, streams and events complete at once. What it lets a machine without a GPU
 * exercise is the core's side of devices: tensors tagged cuda:k, moving them between
 * devices, device dispatch in the ops layer and its "same device" checks, autograd across
 * devices, the memory counters, DataParallel over several devices, train.lua --device
 * cuda. It cannot say whether a CUDA kernel is right; the cuda-tagged specs on a real GPU
 * do that.
 *
 * DDPLUA_SIM_DEVICES sets how many devices it reports (default 2). DDPLUA_SIM_NCCL=1 adds a
 * simulated NCCL table (runtime/backend/cuda/nccl_api.h) whose ranks are processes of this host
 * meeting in shared memory, so the nccl paths of the process groups, the DDP reducer and
 * the front end run without a GPU (no point-to-point messages). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/plugin.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "backend/cuda/nccl_api.h"

enum { MAX_DEVICES = 16, HEADER = 64 };

static int devices = 2;
static __thread int current_device;
static __thread void *current_stream[MAX_DEVICES];
static int64_t stats[MAX_DEVICES][6]; /* allocated, max, reserved, max, calls, device calls */
static int allow_tf32;

static int probe(int *count, char *reason, size_t reason_len) {
  const char *env = getenv("DDPLUA_SIM_DEVICES");
  if (env && *env) devices = atoi(env);
  if (devices < 1 || devices > MAX_DEVICES) {
    snprintf(reason, reason_len, "DDPLUA_SIM_DEVICES=%s is not in 1..%d", env, MAX_DEVICES);
    *count = 0;
    return 1;
  }
  *count = devices;
  return 0;
}

static void versions(int *cudart, int *cublas, int *cudnn, int *nccl) {
  *cudart = *cublas = *cudnn = *nccl = 0;
}

static int check_device(int device, const char *op) {
  if (device < 0 || device >= devices)
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid simulated device %d", op, device);
  return DDP_OK;
}

static int device_name(int device, char *out, size_t len) {
  DDP_TRY(check_device(device, "get_device_name"));
  snprintf(out, len, "simulated device %d (host memory)", device);
  return DDP_OK;
}

static int set_device(int device) {
  DDP_TRY(check_device(device, "set_device"));
  current_device = device;
  return DDP_OK;
}

static int get_device(int *device) {
  *device = current_device;
  return DDP_OK;
}

static int synchronize(int device) { return check_device(device, "synchronize"); }

/* Each block carries its device and size in a header, for the counters. */
typedef struct { int64_t size; int device; } block_header;

static int sim_malloc(void **out, int device, size_t nbytes) {
  *out = NULL;
  DDP_TRY(check_device(device, "cuda malloc"));
  char *p = aligned_alloc(HEADER, HEADER + (nbytes + HEADER - 1) / HEADER * HEADER);
  if (!p) DDP_FAIL(DDP_ERR_MEMORY, "simulated device %d: out of memory (%zu bytes)", device, nbytes);
  block_header *h = (block_header *)p;
  h->size = (int64_t)nbytes;
  h->device = device;
  int64_t *s = stats[device];
  __atomic_add_fetch(&s[0], h->size, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s[2], h->size, __ATOMIC_RELAXED);
  if (s[0] > s[1]) s[1] = s[0];
  if (s[2] > s[3]) s[3] = s[2];
  __atomic_add_fetch(&s[4], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s[5], 1, __ATOMIC_RELAXED);
  *out = p + HEADER;
  return DDP_OK;
}

static void sim_free(void *p) {
  if (!p) return;
  block_header *h = (block_header *)((char *)p - HEADER);
  __atomic_sub_fetch(&stats[h->device][0], h->size, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&stats[h->device][2], h->size, __ATOMIC_RELAXED);
  free(h);
}

static int record_stream(void *p, void *stream) { return DDP_OK; }
static int empty_cache(void) { return DDP_OK; }

static int memory_stats(int device, ddp_cuda_memory_stats *out) {
  DDP_TRY(check_device(device, "memory_stats"));
  int64_t *s = stats[device];
  *out = (ddp_cuda_memory_stats){s[0], s[1], s[2], s[3], s[4], s[5]};
  return DDP_OK;
}

static int reset_peak(int device) {
  DDP_TRY(check_device(device, "reset_peak_memory_stats"));
  stats[device][1] = stats[device][0];
  stats[device][3] = stats[device][2];
  return DDP_OK;
}

static int host_alloc(void **out, size_t nbytes) {
  *out = malloc(nbytes ? nbytes : 1);
  if (!*out) DDP_FAIL(DDP_ERR_MEMORY, "pin_memory: out of memory (%zu bytes)", nbytes);
  return DDP_OK;
}

static void host_free(void *p) { free(p); }

static int sim_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t nbytes,
                      int async) {
  if (nbytes) memcpy(dst, src, nbytes);
  return DDP_OK;
}

static int sim_memset(void *dst, int device, int byte, size_t nbytes) {
  if (nbytes) memset(dst, byte, nbytes);
  return DDP_OK;
}

/* Streams and events are tokens: all work is done by the time a call returns. */
typedef struct { int device; double time_ms; } sim_event;

static int stream_create(void **out, int device, int priority) {
  DDP_TRY(check_device(device, "Stream"));
  *out = malloc(1);
  if (!*out) DDP_FAIL(DDP_ERR_MEMORY, "Stream: out of memory");
  return DDP_OK;
}

static int stream_destroy(void *s) {
  free(s);
  return DDP_OK;
}

static int current_stream_get(void **out, int device) {
  DDP_TRY(check_device(device, "current_stream"));
  *out = current_stream[device];
  return DDP_OK;
}

static int current_stream_set(int device, void *s) {
  DDP_TRY(check_device(device, "set_stream"));
  current_stream[device] = s;
  return DDP_OK;
}

static int stream_synchronize(void *s) { return DDP_OK; }
static int stream_wait_event(void *s, void *e) { return DDP_OK; }

static int event_create(void **out, int device, int timing) {
  DDP_TRY(check_device(device, "Event"));
  sim_event *e = calloc(1, sizeof *e);
  if (!e) DDP_FAIL(DDP_ERR_MEMORY, "Event: out of memory");
  e->device = device;
  *out = e;
  return DDP_OK;
}

static int event_destroy(void *e) {
  free(e);
  return DDP_OK;
}

static int event_record(void *ev, void *s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ((sim_event *)ev)->time_ms = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  return DDP_OK;
}

static int event_synchronize(void *e) { return DDP_OK; }

static int event_query(void *e, int *done) {
  *done = 1;
  return DDP_OK;
}

static int event_elapsed_ms(void *a, void *b, float *ms) {
  *ms = (float)(((sim_event *)b)->time_ms - ((sim_event *)a)->time_ms);
  return DDP_OK;
}

static int check(const char *op) { return DDP_OK; }
static void set_allow_tf32(int on) { allow_tf32 = on != 0; }
static int get_allow_tf32(void) { return allow_tf32; }

/* ---- simulated NCCL (DDPLUA_SIM_NCCL=1) ---------------------------------------------
 * The ranks of a communicator are processes on this host; they meet in a POSIX
 * shared-memory segment named after the unique id (which pg_nccl.c hands round through the
 * store). Every collective is: each rank writes what it contributes into its slot, a
 * barrier, each rank computes its result from the slots, a barrier. Reductions go through
 * double (ddp_load_f64), in rank order, so every rank gets the same bits. Waits are bounded
 * by the communicator's timeout. It checks the process-group and DDP bookkeeping of the
 * nccl backend, not NCCL. */

enum { SIM_SLOT_BYTES = 8 << 20 }; /* per rank and collective */

typedef struct {
  int ready;            /* set by rank 0 once the header is initialised */
  int arrived;          /* ranks that attached (rank 0 unlinks the name after all did) */
  int count, sense;     /* the barrier */
} sim_shm_header;

struct ddp_nccl_comm {
  int device, rank, size, broken, local_sense;
  double timeout_s;
  char name[64];
  sim_shm_header *h;
  char *slots;          /* size * SIM_SLOT_BYTES */
  size_t map_bytes;
};

static double sim_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sim_nap(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

static int sim_nccl_id(unsigned char *id) {
  static int counter;
  memset(id, 0, DDP_NCCL_ID_BYTES);
  snprintf((char *)id, DDP_NCCL_ID_BYTES, "/ddplua-simnccl-%d-%d", (int)getpid(), ++counter);
  return DDP_OK;
}

/* Sense-reversing barrier over the shared header. */
static int sim_barrier_wait(ddp_nccl_comm *c, const char *op) {
  if (c->size == 1) return DDP_OK;
  c->local_sense = !c->local_sense;
  if (__atomic_add_fetch(&c->h->count, 1, __ATOMIC_ACQ_REL) == c->size) {
    __atomic_store_n(&c->h->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->h->sense, c->local_sense, __ATOMIC_RELEASE);
    return DDP_OK;
  }
  double until = sim_now() + c->timeout_s;
  while (__atomic_load_n(&c->h->sense, __ATOMIC_ACQUIRE) != c->local_sense) {
    if (sim_now() > until) {
      c->broken = 1;
      DDP_FAIL(DDP_ERR_TIMEOUT, "%s: the simulated NCCL timed out after %g s on rank %d (a peer "
               "is dead or stuck)", op, c->timeout_s, c->rank);
    }
    sim_nap();
  }
  return DDP_OK;
}

static void sim_nccl_destroy(ddp_nccl_comm *c) {
  if (!c) return;
  if (c->h) munmap(c->h, c->map_bytes);
  free(c);
}

static int sim_nccl_init(ddp_nccl_comm **out, const unsigned char *id, int rank, int size,
                         int device, double timeout_s) {
  const char *op = "init_process_group(nccl)";
  *out = NULL;
  DDP_TRY(check_device(device, op));
  ddp_nccl_comm *c = calloc(1, sizeof *c);
  if (!c) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  c->device = device;
  c->rank = rank;
  c->size = size;
  c->timeout_s = timeout_s > 0 ? timeout_s : 300;
  snprintf(c->name, sizeof c->name, "%s", (const char *)id);
  c->map_bytes = 4096 + (size_t)size * SIM_SLOT_BYTES;
  double until = sim_now() + c->timeout_s;
  int fd = -1;
  if (rank == 0) {
    fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, (off_t)c->map_bytes) != 0) {
      close(fd);
      fd = -1;
    }
  } else {
    while ((fd = shm_open(c->name, O_RDWR, 0600)) < 0 && sim_now() < until) sim_nap();
    /* Rank 0 creates the segment, then sizes it: one opened in between is still empty, and
     * touching a mapping past a file's end is SIGBUS. Wait until it has its size. */
    struct stat st;
    while (fd >= 0 && (fstat(fd, &st) != 0 || (size_t)st.st_size < c->map_bytes)) {
      if (sim_now() >= until) {
        close(fd);
        fd = -1;
        break;
      }
      sim_nap();
    }
  }
  if (fd < 0) {
    free(c);
    DDP_FAIL(DDP_ERR_TIMEOUT, "%s: rank %d could not open the simulated NCCL segment %s", op, rank,
             id);
  }
  void *p = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    free(c);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: mmap of the simulated NCCL segment failed", op);
  }
  c->h = p;
  c->slots = (char *)p + 4096;
  if (rank == 0) __atomic_store_n(&c->h->ready, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&c->h->ready, __ATOMIC_ACQUIRE) && sim_now() < until) sim_nap();
  /* The last rank to attach removes the name (the mappings stay). */
  if (__atomic_add_fetch(&c->h->arrived, 1, __ATOMIC_ACQ_REL) == size) shm_unlink(c->name);
  if (sim_barrier_wait(c, op)) {
    sim_nccl_destroy(c);
    return ddp_last_status();
  }
  *out = c;
  return DDP_OK;
}

static void sim_nccl_abort(ddp_nccl_comm *c) { if (c) c->broken = 1; }
static void sim_nccl_set_timeout(ddp_nccl_comm *c, double t) { if (c && t > 0) c->timeout_s = t; }
static void *sim_nccl_stream(ddp_nccl_comm *c) { return NULL; }
static int sim_nccl_device(ddp_nccl_comm *c) { return c ? c->device : -1; }
static const char *sim_nccl_error(ddp_nccl_comm *c) {
  return c && c->broken ? "the communicator was aborted" : "";
}

static char *slot(ddp_nccl_comm *c, int r) { return c->slots + (size_t)r * SIM_SLOT_BYTES; }

/* out[i] = op over ranks of the element i of each slot, from byte offset `at`. */
static void sim_reduce_into(ddp_nccl_comm *c, void *out, size_t at, size_t n, int dtype, int op) {
  size_t es = ddp_dtype_size(dtype);
  for (size_t i = 0; i < n; i++) {
    double acc = ddp_load_f64(slot(c, 0) + at + i * es, dtype);
    for (int r = 1; r < c->size; r++) {
      double v = ddp_load_f64(slot(c, r) + at + i * es, dtype);
      if (op == DDP_REDUCE_MIN) acc = v < acc ? v : acc;
      else if (op == DDP_REDUCE_MAX) acc = v > acc ? v : acc;
      else if (op == DDP_REDUCE_PRODUCT) acc *= v;
      else acc += v;
    }
    if (op == DDP_REDUCE_AVG) acc /= c->size;
    ddp_store_f64((char *)out + i * es, dtype, acc);
  }
}

/* Start a collective: checks, then this rank's contribution (bytes at src) into its slot. */
static int sim_begin(ddp_nccl_comm *c, const char *op, const void *src, size_t bytes) {
  if (c->broken) DDP_FAIL(DDP_ERR_STATE, "%s: the NCCL communicator was aborted", op);
  if (bytes > SIM_SLOT_BYTES)
    DDP_FAIL(DDP_ERR_ARG, "%s: the simulated NCCL moves at most %d bytes per rank, got %zu", op,
             (int)SIM_SLOT_BYTES, bytes);
  if (src && bytes) memcpy(slot(c, c->rank), src, bytes);
  return sim_barrier_wait(c, op);
}

/* Finish: everybody read the slots; hand out an event token. */
static int sim_end(ddp_nccl_comm *c, const char *op, void **event) {
  DDP_TRY(sim_barrier_wait(c, op));
  *event = malloc(sizeof(sim_event));
  if (!*event) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  return DDP_OK;
}

static int sim_all_reduce(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int op, void **e) {
  DDP_TRY(sim_begin(c, "all_reduce", buf, n * ddp_dtype_size(dtype)));
  sim_reduce_into(c, buf, 0, n, dtype, op);
  return sim_end(c, "all_reduce", e);
}
static int sim_broadcast(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int root, void **e) {
  size_t bytes = n * ddp_dtype_size(dtype);
  DDP_TRY(sim_begin(c, "broadcast", c->rank == root ? buf : NULL, bytes));
  if (c->rank != root && bytes) memcpy(buf, slot(c, root), bytes);
  return sim_end(c, "broadcast", e);
}
static int sim_all_gather(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype,
                          void **e) {
  size_t bytes = n * ddp_dtype_size(dtype);
  DDP_TRY(sim_begin(c, "all_gather", in, bytes));
  for (int r = 0; r < c->size && bytes; r++) memcpy((char *)out + r * bytes, slot(c, r), bytes);
  return sim_end(c, "all_gather", e);
}
static int sim_reduce_scatter(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype,
                              int op, void **e) {
  size_t bytes = n * ddp_dtype_size(dtype);
  DDP_TRY(sim_begin(c, "reduce_scatter", in, bytes * (size_t)c->size));
  sim_reduce_into(c, out, (size_t)c->rank * bytes, n, dtype, op);
  return sim_end(c, "reduce_scatter", e);
}
static int sim_reduce(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int op, int root,
                      void **e) {
  DDP_TRY(sim_begin(c, "reduce", buf, n * ddp_dtype_size(dtype)));
  if (c->rank == root) sim_reduce_into(c, buf, 0, n, dtype, op);
  return sim_end(c, "reduce", e);
}
static int sim_gather(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype, int root,
                      void **e) {
  size_t bytes = n * ddp_dtype_size(dtype);
  DDP_TRY(sim_begin(c, "gather", in, bytes));
  for (int r = 0; c->rank == root && r < c->size && bytes; r++)
    memcpy((char *)out + r * bytes, slot(c, r), bytes);
  return sim_end(c, "gather", e);
}
static int sim_scatter(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype, int root,
                       void **e) {
  size_t bytes = n * ddp_dtype_size(dtype);
  DDP_TRY(sim_begin(c, "scatter", c->rank == root ? in : NULL, bytes * (size_t)c->size));
  if (bytes) memcpy(out, slot(c, root) + (size_t)c->rank * bytes, bytes);
  return sim_end(c, "scatter", e);
}
static int sim_all_to_all(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype,
                          void **e) {
  size_t bytes = n * ddp_dtype_size(dtype);
  DDP_TRY(sim_begin(c, "all_to_all", in, bytes * (size_t)c->size));
  for (int r = 0; r < c->size && bytes; r++)
    memcpy((char *)out + r * bytes, slot(c, r) + (size_t)c->rank * bytes, bytes);
  return sim_end(c, "all_to_all", e);
}
static int sim_all_to_allv(ddp_nccl_comm *c, void *out, const size_t *out_counts,
                           const void *in, const size_t *in_counts, int dtype, void **e) {
  size_t es = ddp_dtype_size(dtype), total = 0, before = 0, at = 0;
  for (int r = 0; r < c->size; r++) total += in_counts[r];
  /* every rank publishes its input and its counts (first, as size_t); then rank i reads
   * its part of every rank's input */
  size_t head = sizeof(size_t) * (size_t)c->size;
  if (head + total * es > SIM_SLOT_BYTES)
    DDP_FAIL(DDP_ERR_ARG, "all_to_all_single: the simulated NCCL moves at most %d bytes per "
             "rank", (int)SIM_SLOT_BYTES);
  memcpy(slot(c, c->rank), in_counts, head);
  if (total) memcpy(slot(c, c->rank) + head, in, total * es);
  DDP_TRY(sim_begin(c, "all_to_all_single", NULL, 0));
  for (int r = 0; r < c->size; r++) {
    const size_t *counts = (const size_t *)slot(c, r);
    before = 0;
    for (int j = 0; j < c->rank; j++) before += counts[j];
    if (counts[c->rank] != out_counts[r])
      DDP_FAIL(DDP_ERR_ARG, "all_to_all_single: rank %d sends %zu elements to rank %d, which "
               "expects %zu", r, counts[c->rank], c->rank, out_counts[r]);
    memcpy((char *)out + at * es, slot(c, r) + head + before * es, out_counts[r] * es);
    at += out_counts[r];
  }
  return sim_end(c, "all_to_all_single", e);
}
static int sim_send(ddp_nccl_comm *c, const void *buf, size_t n, int dtype, int peer, void **e) {
  DDP_FAIL(DDP_ERR_UNAVAILABLE, "send: the simulated NCCL has no point-to-point messages");
}
static int sim_recv(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int peer, void **e) {
  DDP_FAIL(DDP_ERR_UNAVAILABLE, "recv: the simulated NCCL has no point-to-point messages");
}
static int sim_barrier(ddp_nccl_comm *c, void **e) {
  DDP_TRY(sim_begin(c, "barrier", NULL, 0));
  return sim_end(c, "barrier", e);
}
static int sim_wait_stream(ddp_nccl_comm *c, void *e) {
  if (c->broken) DDP_FAIL(DDP_ERR_STATE, "wait: the NCCL communicator was aborted");
  return DDP_OK;
}
static int sim_wait_host(ddp_nccl_comm *c, void *e, double t) { return sim_wait_stream(c, e); }
static int sim_query(ddp_nccl_comm *c, void *e, int *done) {
  *done = 1;
  return sim_wait_stream(c, e);
}
static void sim_event_free(void *e) { free(e); }

static const struct ddp_nccl_api sim_nccl = {
    .abi = DDP_NCCL_API_ABI,
    .version = 0,
    .get_unique_id = sim_nccl_id,
    .comm_init = sim_nccl_init,
    .comm_destroy = sim_nccl_destroy,
    .comm_abort = sim_nccl_abort,
    .set_timeout = sim_nccl_set_timeout,
    .comm_stream = sim_nccl_stream,
    .comm_device = sim_nccl_device,
    .comm_error = sim_nccl_error,
    .all_reduce = sim_all_reduce,
    .broadcast = sim_broadcast,
    .all_gather = sim_all_gather,
    .reduce_scatter = sim_reduce_scatter,
    .reduce = sim_reduce,
    .gather = sim_gather,
    .scatter = sim_scatter,
    .all_to_all = sim_all_to_all,
    .all_to_allv = sim_all_to_allv,
    .send = sim_send,
    .recv = sim_recv,
    .barrier = sim_barrier,
    .wait_stream = sim_wait_stream,
    .wait_host = sim_wait_host,
    .query = sim_query,
    .event_free = sim_event_free,
};

static ddp_kernels kernels;

const ddp_cuda_api *ddp_cuda_plugin_api(void) {
  static ddp_cuda_api api = {
      .abi = DDP_CUDA_PLUGIN_ABI,
      .name = "cuda-sim",
      .probe = probe,
      .versions = versions,
      .device_name = device_name,
      .set_device = set_device,
      .get_device = get_device,
      .synchronize = synchronize,
      .malloc = sim_malloc,
      .free = sim_free,
      .record_stream = record_stream,
      .empty_cache = empty_cache,
      .memory_stats = memory_stats,
      .reset_peak = reset_peak,
      .host_alloc = host_alloc,
      .host_free = host_free,
      .memcpy = sim_memcpy,
      .memset = sim_memset,
      .stream_create = stream_create,
      .stream_destroy = stream_destroy,
      .current_stream = current_stream_get,
      .set_current_stream = current_stream_set,
      .stream_synchronize = stream_synchronize,
      .stream_wait_event = stream_wait_event,
      .event_create = event_create,
      .event_destroy = event_destroy,
      .event_record = event_record,
      .event_synchronize = event_synchronize,
      .event_query = event_query,
      .event_elapsed_ms = event_elapsed_ms,
      .check = check,
      .set_allow_tf32 = set_allow_tf32,
      .get_allow_tf32 = get_allow_tf32,
      .kernels = &kernels,
      .nccl = NULL,
  };
  /* The CPU kernels, under the device's name (for "not implemented" messages): each entry
   * does its own dtype dispatch (Note [one dispatch path] in runtime/backend/kernels.h). A
   * device has no BLAS thread pool to hold. */
  kernels = ddp_cpu_kernels;
  kernels.name = "cuda";
  kernels.gemm_threads_hold = NULL;
  kernels.gemm_threads_restore = NULL;
  const char *nccl = getenv("DDPLUA_SIM_NCCL");
  if (nccl && atoi(nccl) == 1) api.nccl = &sim_nccl;
  return &api;
}
