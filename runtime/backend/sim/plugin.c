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
 * one-rank NCCL table (runtime/dist/pg_nccl.h): communicators of world size 1 whose
 * collectives are local copies, so the nccl process-group paths (checks, work handles,
 * record_stream, the front end) run without a GPU; larger communicators are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/plugin.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "dist/pg_nccl.h"

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

/* ---- one-rank NCCL (DDPLUA_SIM_NCCL=1) --------------------------------------------- */

struct ddp_nccl_comm {
  int device, broken;
};

static int sim_nccl_id(unsigned char *id) {
  static int counter;
  memset(id, 0, DDP_NCCL_ID_BYTES);
  snprintf((char *)id, DDP_NCCL_ID_BYTES, "sim-nccl-%d", ++counter);
  return DDP_OK;
}

static int sim_nccl_init(ddp_nccl_comm **out, const unsigned char *id, int rank, int size,
                         int device, double timeout_s) {
  *out = NULL;
  DDP_TRY(check_device(device, "init_process_group(nccl)"));
  if (size != 1)
    DDP_FAIL(DDP_ERR_UNAVAILABLE, "init_process_group(nccl): the simulated NCCL has one rank "
             "per communicator, asked for %d", size);
  ddp_nccl_comm *c = calloc(1, sizeof *c);
  if (!c) DDP_FAIL(DDP_ERR_MEMORY, "init_process_group(nccl): out of memory");
  c->device = device;
  *out = c;
  return DDP_OK;
}

static void sim_nccl_destroy(ddp_nccl_comm *c) { free(c); }
static void sim_nccl_abort(ddp_nccl_comm *c) { if (c) c->broken = 1; }
static void sim_nccl_set_timeout(ddp_nccl_comm *c, double t) {}
static void *sim_nccl_stream(ddp_nccl_comm *c) { return NULL; }
static int sim_nccl_device(ddp_nccl_comm *c) { return c ? c->device : -1; }
static const char *sim_nccl_error(ddp_nccl_comm *c) {
  return c && c->broken ? "the communicator was aborted" : "";
}

/* Every collective of one rank: check, copy what moves, hand out an event token. */
static int sim_done(ddp_nccl_comm *c, const char *op, void **event) {
  if (c->broken) DDP_FAIL(DDP_ERR_STATE, "%s: the NCCL communicator was aborted", op);
  *event = malloc(sizeof(sim_event));
  if (!*event) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  return DDP_OK;
}

static void sim_copy(void *out, const void *in, size_t count, int dtype) {
  if (out != in && count) memmove(out, in, count * ddp_dtype_size(dtype));
}

static int sim_all_reduce(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int op, void **e) {
  return sim_done(c, "all_reduce", e); /* op over one rank: the values themselves */
}
static int sim_broadcast(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int root, void **e) {
  return sim_done(c, "broadcast", e);
}
static int sim_all_gather(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype,
                          void **e) {
  sim_copy(out, in, n, dtype);
  return sim_done(c, "all_gather", e);
}
static int sim_reduce_scatter(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype,
                              int op, void **e) {
  sim_copy(out, in, n, dtype);
  return sim_done(c, "reduce_scatter", e);
}
static int sim_reduce(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int op, int root,
                      void **e) {
  return sim_done(c, "reduce", e);
}
static int sim_gather(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype, int root,
                      void **e) {
  sim_copy(out, in, n, dtype);
  return sim_done(c, "gather", e);
}
static int sim_scatter(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype, int root,
                       void **e) {
  sim_copy(out, in, n, dtype);
  return sim_done(c, "scatter", e);
}
static int sim_all_to_all(ddp_nccl_comm *c, void *out, const void *in, size_t n, int dtype,
                          void **e) {
  sim_copy(out, in, n, dtype);
  return sim_done(c, "all_to_all", e);
}
static int sim_send(ddp_nccl_comm *c, const void *buf, size_t n, int dtype, int peer, void **e) {
  DDP_FAIL(DDP_ERR_ARG, "send: a one-rank communicator has no peer");
}
static int sim_recv(ddp_nccl_comm *c, void *buf, size_t n, int dtype, int peer, void **e) {
  DDP_FAIL(DDP_ERR_ARG, "recv: a one-rank communicator has no peer");
}
static int sim_barrier(ddp_nccl_comm *c, void **e) { return sim_done(c, "barrier", e); }
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
  /* The CPU kernels, under the device's name (for "not implemented" messages). */
  kernels = ddp_cpu_kernels;
  kernels.name = "cuda";
  const char *nccl = getenv("DDPLUA_SIM_NCCL");
  if (nccl && atoi(nccl) == 1) api.nccl = &sim_nccl;
  return &api;
}
