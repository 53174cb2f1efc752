// runtime/backend/cuda/nccl.cu: the NCCL table of the plug-in (struct ddp_nccl_api, declared
// and documented in runtime/backend/cuda/nccl_api.h): communicators, collectives on a communication
// stream per communicator, and the work handles (events) the process groups wait on.
//
// Ordering, as PyTorch's ProcessGroupNCCL: before each collective the communicator's stream
// waits for an event recorded on the caller's current stream, the NCCL call goes to the
// communication stream, and an event recorded after it is the work handle. Communicators are
// non-blocking (ncclConfig_t.blocking = 0) so no call can hang the host: every ncclInProgress
// is polled through ncclCommGetAsyncError against the communicator's timeout, and on a
// timeout or a remote error the communicator is aborted (ncclCommAbort).
#include "backend/cuda/cuda_internal.h"

#include <nccl.h>
#include <new>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/nccl_api.h"

struct ddp_nccl_comm {
  ncclComm_t comm;      // NULL once aborted
  int device, rank, size;
  cudaStream_t stream;  // the communication stream
  cudaEvent_t ready;    // recorded on the caller's stream before each collective
  float *scratch;       // (1,) device buffer of the barrier
  double timeout_s;
  int broken;           // aborted after a failure: every later call fails
  char error[1024];     // the first failure
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ncclDataType_t nccl_dtype(int dtype) {
  switch (dtype) {
    case DDP_F32: return ncclFloat32;
    case DDP_F64: return ncclFloat64;
    case DDP_F16: return ncclFloat16;
    case DDP_BF16: return ncclBfloat16;
    case DDP_I64: return ncclInt64;
    case DDP_I32: return ncclInt32;
    default: return ncclUint8; // u8 and bool: bytes
  }
}

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
    case DDP_REDUCE_AVG: return ncclAvg;
    case DDP_REDUCE_MIN: return ncclMin;
    case DDP_REDUCE_MAX: return ncclMax;
    case DDP_REDUCE_PRODUCT: return ncclProd;
    default: return ncclSum;
  }
}

// Abort the communicator (idempotent): queued work is dropped, the peers see this rank leave.
static void abort_comm(ddp_nccl_comm *c) {
  if (c->comm) ncclCommAbort(c->comm);
  c->comm = NULL;
  c->broken = 1;
}

// Record a failure of `what` (an NCCL result) on c: remembers the first message, aborts the
// communicator unless the failure was a misuse caught before anything was enqueued.
static int fail(ddp_nccl_comm *c, ncclResult_t r, const char *op, const char *what,
                int line) {
  int status;
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError: status = DDP_ERR_PEER; break;
    case ncclInvalidArgument:
    case ncclInvalidUsage: status = DDP_ERR_ARG; break;
    default: status = DDP_ERR_STATE; break;
  }
  const char *last = c && c->comm ? ncclGetLastError(c->comm) : ncclGetLastError(NULL);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s: %s failed: %s%s%s%s", op, what, ncclGetErrorString(r),
           last && *last ? " (" : "", last && *last ? last : "", last && *last ? ")" : "");
  if (status == DDP_ERR_PEER) {
    size_t len = strlen(msg);
    snprintf(msg + len, sizeof msg - len, "; a peer rank failed or disconnected");
  }
  if (c && status != DDP_ERR_ARG) {
    if (!c->broken) snprintf(c->error, sizeof c->error, "%s", msg);
    abort_comm(c);
  }
  return ddp_fail_at(__FILE__, line, status, "%s", msg);
}

static int fail_timeout(ddp_nccl_comm *c, const char *op, const char *what, double seconds,
                        int line) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s: %s did not finish within %g s on rank %d (a peer is dead or "
           "stuck); the NCCL communicator was aborted", op, what, seconds, c->rank);
  if (!c->broken) snprintf(c->error, sizeof c->error, "%s", msg);
  abort_comm(c);
  return ddp_fail_at(__FILE__, line, DDP_ERR_TIMEOUT, "%s", msg);
}

// Poll the communicator's state until it leaves ncclInProgress (non-blocking mode), at most
// `seconds`.
static int settle(ddp_nccl_comm *c, const char *op, const char *what, double seconds,
                  int line) {
  double until = now_s() + seconds;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
    if (r != ncclSuccess) return fail(c, r, op, "ncclCommGetAsyncError", line);
    if (state == ncclSuccess) return DDP_OK;
    if (state != ncclInProgress) return fail(c, state, op, what, line);
    if (now_s() > until) return fail_timeout(c, op, what, seconds, line);
    usleep(20);
  }
}

// Check an NCCL call's result: ncclInProgress settles, an error fails.
static int check(ddp_nccl_comm *c, ncclResult_t r, const char *op, const char *what, int line) {
  if (r == ncclSuccess) return DDP_OK;
  if (r == ncclInProgress) return settle(c, op, what, c->timeout_s, line);
  return fail(c, r, op, what, line);
}

#define NCCL_CHECK(c, call, op) DDP_TRY(check((c), (call), (op), #call, __LINE__))

static int usable(ddp_nccl_comm *c, const char *op) {
  if (!c) DDP_FAIL(DDP_ERR_ARG, "%s: no NCCL communicator", op);
  if (c->broken || !c->comm)
    DDP_FAIL(DDP_ERR_STATE, "%s: the NCCL communicator was aborted after an earlier failure: %s",
             op, c->error[0] ? c->error : "aborted");
  return DDP_OK;
}

// Make the communication stream wait for the caller's current stream (the inputs' producer).
static int begin(ddp_nccl_comm *c, const char *op) {
  DDP_TRY(usable(c, op));
  DDP_TRY(ddp_cuda_use_device(c->device, op));
  DDP_CUDA_TRY(cudaEventRecord(c->ready, ddp_cuda_stream()), op);
  DDP_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->ready, 0), op);
  return DDP_OK;
}

// The work handle: an event recorded on the communication stream after the collective.
static int finish(ddp_nccl_comm *c, const char *op, void **event) {
  cudaEvent_t e;
  DDP_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), op);
  cudaError_t err = cudaEventRecord(e, c->stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(e);
    return ddp_cuda_fail(err, op, "cudaEventRecord", __FILE__, __LINE__);
  }
  *event = e;
  return DDP_OK;
}

// ---- communicators --------------------------------------------------------------------

static int get_unique_id(unsigned char *id) {
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) return fail(NULL, r, "init_process_group", "ncclGetUniqueId", __LINE__);
  static_assert(sizeof uid == DDP_NCCL_ID_BYTES, "ncclUniqueId size");
  memcpy(id, &uid, sizeof uid);
  return DDP_OK;
}

static void comm_free_resources(ddp_nccl_comm *c) {
  if (c->scratch) cudaFree(c->scratch);
  if (c->ready) cudaEventDestroy(c->ready);
  if (c->stream) cudaStreamDestroy(c->stream);
  delete c;
}

static int comm_init(ddp_nccl_comm **out, const unsigned char *id, int rank, int size, int device,
                     double timeout_s) {
  const char *op = "init_process_group(nccl)";
  *out = NULL;
  if (!(timeout_s > 0)) timeout_s = 300;
  DDP_TRY(ddp_cuda_use_device(device, op));
  ddp_nccl_comm *c = new (std::nothrow) ddp_nccl_comm();
  if (!c) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  c->device = device;
  c->rank = rank;
  c->size = size;
  c->timeout_s = timeout_s;
  cudaError_t err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaMalloc((void **)&c->scratch, sizeof(float));
  // the barrier sums it: start from 0 rather than whatever the allocation held
  if (err == cudaSuccess) err = cudaMemsetAsync(c->scratch, 0, sizeof(float), c->stream);
  if (err != cudaSuccess) {
    comm_free_resources(c);
    return ddp_cuda_fail(err, op, "creating the communication stream", __FILE__, __LINE__);
  }
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0; // every wait below is bounded by timeout_s
  ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, uid, rank, &config);
  int status = DDP_OK;
  if ((r == ncclInProgress || r == ncclSuccess) && c->comm)
    status = settle(c, op, "ncclCommInitRankConfig (waiting for every rank to join)", timeout_s,
                    __LINE__);
  else
    status = fail(c, r == ncclSuccess ? ncclInternalError : r, op, "ncclCommInitRankConfig",
                  __LINE__);
  if (status) {
    abort_comm(c);
    comm_free_resources(c);
    return status;
  }
  *out = c;
  return DDP_OK;
}

static void comm_destroy(ddp_nccl_comm *c) {
  if (!c) return;
  // NCCL switches to the communicator's device itself; the streams and the event below
  // belong to it, so make it current for their destruction too.
  (void)cudaSetDevice(c->device);
  if (c->comm && !c->broken) {
    // Flush the queued work first (bounded); abort when that fails.
    int saved = ddp_last_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ddp_last_error());
    ncclResult_t r = ncclCommFinalize(c->comm);
    // nccl.h: ncclCommFinalize marks the communicator ncclInProgress until it is globally
    // quiescent, whatever it returned: poll ncclCommGetAsyncError until ncclSuccess before
    // ncclCommDestroy (which would otherwise block, unbounded). ncclCommDestroy and
    // ncclCommAbort are blocking even on a non-blocking communicator (NCCL forces a
    // destroying communicator's group to blocking), so they need no polling.
    int status = r == ncclInProgress || r == ncclSuccess
                     ? settle(c, "destroy_process_group", "ncclCommFinalize", c->timeout_s,
                              __LINE__)
                     : DDP_ERR_STATE;
    if (status == DDP_OK && c->comm) {
      ncclCommDestroy(c->comm);
      c->comm = NULL;
    }
    if (saved) ddp_fail_at(__FILE__, __LINE__, saved, "%s", msg); // keep the caller's error
    else ddp_clear_error();
  }
  abort_comm(c); // no-op when destroyed above
  comm_free_resources(c);
}

static void comm_abort(ddp_nccl_comm *c) {
  if (!c) return;
  if (!c->broken) snprintf(c->error, sizeof c->error, "the communicator was aborted");
  abort_comm(c);
}

static void set_timeout(ddp_nccl_comm *c, double timeout_s) {
  if (c && timeout_s > 0) c->timeout_s = timeout_s;
}

static void *comm_stream(ddp_nccl_comm *c) { return c ? (void *)c->stream : NULL; }
static int comm_device(ddp_nccl_comm *c) { return c ? c->device : -1; }
static const char *comm_error(ddp_nccl_comm *c) { return c && c->broken ? c->error : ""; }

// ---- collectives ----------------------------------------------------------------------

static int all_reduce(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int op,
                      void **event) {
  DDP_TRY(begin(c, "all_reduce"));
  NCCL_CHECK(c, ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), c->comm, c->stream),
             "all_reduce");
  return finish(c, "all_reduce", event);
}

static int broadcast(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int root,
                     void **event) {
  DDP_TRY(begin(c, "broadcast"));
  NCCL_CHECK(c, ncclBroadcast(buf, buf, count, nccl_dtype(dtype), root, c->comm, c->stream),
             "broadcast");
  return finish(c, "broadcast", event);
}

static int all_gather(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype,
                      void **event) {
  DDP_TRY(begin(c, "all_gather"));
  NCCL_CHECK(c, ncclAllGather(in, out, count, nccl_dtype(dtype), c->comm, c->stream),
             "all_gather");
  return finish(c, "all_gather", event);
}

static int reduce_scatter(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype,
                          int op, void **event) {
  DDP_TRY(begin(c, "reduce_scatter"));
  NCCL_CHECK(c, ncclReduceScatter(in, out, count, nccl_dtype(dtype), nccl_op(op), c->comm,
                                  c->stream),
             "reduce_scatter");
  return finish(c, "reduce_scatter", event);
}

static int reduce(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int op, int root,
                  void **event) {
  DDP_TRY(begin(c, "reduce"));
  NCCL_CHECK(c, ncclReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), root, c->comm,
                           c->stream),
             "reduce");
  return finish(c, "reduce", event);
}

// Point-to-point calls inside ncclGroupStart/End: the first failure is kept, the group is
// always closed.
typedef struct {
  ncclResult_t r;
  const char *what;
} group_status;

static void keep_first(group_status *g, ncclResult_t r, const char *what) {
  if (g->r == ncclSuccess && r != ncclSuccess) {
    g->r = r;
    g->what = what;
  }
}

static int group_end(ddp_nccl_comm *c, group_status *g, const char *op) {
  ncclResult_t r = ncclGroupEnd();
  if (g->r != ncclSuccess && g->r != ncclInProgress) return fail(c, g->r, op, g->what, __LINE__);
  return check(c, r, op, "ncclGroupEnd", __LINE__);
}

static int gather(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype, int root,
                  void **event) {
  const char *op = "gather";
  DDP_TRY(begin(c, op));
  size_t bytes = count * ddp_dtype_size(dtype);
  ncclDataType_t dt = nccl_dtype(dtype);
  if (c->rank == root && bytes)
    DDP_CUDA_TRY(cudaMemcpyAsync((char *)out + (size_t)root * bytes, in, bytes,
                                 cudaMemcpyDeviceToDevice, c->stream), op);
  group_status g = {ncclSuccess, NULL};
  keep_first(&g, ncclGroupStart(), "ncclGroupStart");
  if (c->rank == root) {
    for (int r = 0; r < c->size; r++)
      if (r != root)
        keep_first(&g, ncclRecv((char *)out + (size_t)r * bytes, count, dt, r, c->comm, c->stream),
                   "ncclRecv");
  } else {
    keep_first(&g, ncclSend(in, count, dt, root, c->comm, c->stream), "ncclSend");
  }
  DDP_TRY(group_end(c, &g, op));
  return finish(c, op, event);
}

static int scatter(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype, int root,
                   void **event) {
  const char *op = "scatter";
  DDP_TRY(begin(c, op));
  size_t bytes = count * ddp_dtype_size(dtype);
  ncclDataType_t dt = nccl_dtype(dtype);
  if (c->rank == root && bytes)
    DDP_CUDA_TRY(cudaMemcpyAsync(out, (const char *)in + (size_t)root * bytes, bytes,
                                 cudaMemcpyDeviceToDevice, c->stream), op);
  group_status g = {ncclSuccess, NULL};
  keep_first(&g, ncclGroupStart(), "ncclGroupStart");
  if (c->rank == root) {
    for (int r = 0; r < c->size; r++)
      if (r != root)
        keep_first(&g, ncclSend((const char *)in + (size_t)r * bytes, count, dt, r, c->comm,
                                c->stream),
                   "ncclSend");
  } else {
    keep_first(&g, ncclRecv(out, count, dt, root, c->comm, c->stream), "ncclRecv");
  }
  DDP_TRY(group_end(c, &g, op));
  return finish(c, op, event);
}

static int all_to_all(ddp_nccl_comm *c, void *out, const void *in, size_t count, int dtype,
                      void **event) {
  const char *op = "all_to_all";
  DDP_TRY(begin(c, op));
  size_t bytes = count * ddp_dtype_size(dtype);
  ncclDataType_t dt = nccl_dtype(dtype);
  if (bytes)
    DDP_CUDA_TRY(cudaMemcpyAsync((char *)out + (size_t)c->rank * bytes,
                                 (const char *)in + (size_t)c->rank * bytes, bytes,
                                 cudaMemcpyDeviceToDevice, c->stream), op);
  group_status g = {ncclSuccess, NULL};
  keep_first(&g, ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    keep_first(&g, ncclSend((const char *)in + (size_t)r * bytes, count, dt, r, c->comm, c->stream),
               "ncclSend");
    keep_first(&g, ncclRecv((char *)out + (size_t)r * bytes, count, dt, r, c->comm, c->stream),
               "ncclRecv");
  }
  DDP_TRY(group_end(c, &g, op));
  return finish(c, op, event);
}

static int all_to_allv(ddp_nccl_comm *c, void *out, const size_t *out_counts, const void *in,
                       const size_t *in_counts, int dtype, void **event) {
  const char *op = "all_to_all_single";
  DDP_TRY(begin(c, op));
  size_t es = ddp_dtype_size(dtype), in_at = 0, out_at = 0, my_in = 0, my_out = 0;
  ncclDataType_t dt = nccl_dtype(dtype);
  for (int r = 0; r < c->rank; r++) {
    my_in += in_counts[r];
    my_out += out_counts[r];
  }
  if (in_counts[c->rank])
    DDP_CUDA_TRY(cudaMemcpyAsync((char *)out + my_out * es, (const char *)in + my_in * es,
                                 in_counts[c->rank] * es, cudaMemcpyDeviceToDevice, c->stream), op);
  group_status g = {ncclSuccess, NULL};
  keep_first(&g, ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < c->size; r++) {
    if (r != c->rank && in_counts[r])
      keep_first(&g, ncclSend((const char *)in + in_at * es, in_counts[r], dt, r, c->comm,
                              c->stream),
                 "ncclSend");
    if (r != c->rank && out_counts[r])
      keep_first(&g, ncclRecv((char *)out + out_at * es, out_counts[r], dt, r, c->comm, c->stream),
                 "ncclRecv");
    in_at += in_counts[r];
    out_at += out_counts[r];
  }
  DDP_TRY(group_end(c, &g, op));
  return finish(c, op, event);
}

static int p2p_send(ddp_nccl_comm *c, const void *buf, size_t count, int dtype, int peer,
                void **event) {
  DDP_TRY(begin(c, "send"));
  NCCL_CHECK(c, ncclSend(buf, count, nccl_dtype(dtype), peer, c->comm, c->stream), "send");
  return finish(c, "send", event);
}

static int p2p_recv(ddp_nccl_comm *c, void *buf, size_t count, int dtype, int peer, void **event) {
  DDP_TRY(begin(c, "recv"));
  NCCL_CHECK(c, ncclRecv(buf, count, nccl_dtype(dtype), peer, c->comm, c->stream), "recv");
  return finish(c, "recv", event);
}

static int barrier(ddp_nccl_comm *c, void **event) {
  DDP_TRY(begin(c, "barrier"));
  NCCL_CHECK(c, ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->comm, c->stream),
             "barrier");
  return finish(c, "barrier", event);
}

// ---- work handles ---------------------------------------------------------------------

static int wait_stream(ddp_nccl_comm *c, void *event) {
  DDP_TRY(usable(c, "wait"));
  DDP_TRY(ddp_cuda_use_device(c->device, "wait"));
  DDP_CUDA_TRY(cudaStreamWaitEvent(ddp_cuda_stream(), (cudaEvent_t)event, 0), "wait");
  return DDP_OK;
}

// One poll: *done from the event; a communicator error fails (and aborts).
static int poll_once(ddp_nccl_comm *c, cudaEvent_t e, int *done, const char *op) {
  cudaError_t err = ddp_cuda_query_event(e);
  if (err == cudaSuccess) {
    *done = 1;
    return DDP_OK;
  }
  if (err != cudaErrorNotReady) return ddp_cuda_fail(err, op, "cudaEventQuery", __FILE__, __LINE__);
  *done = 0;
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
  if (r != ncclSuccess) return fail(c, r, op, "ncclCommGetAsyncError", __LINE__);
  if (state != ncclSuccess && state != ncclInProgress)
    return fail(c, state, op, "the collective", __LINE__);
  return DDP_OK;
}

static int wait_host(ddp_nccl_comm *c, void *event, double timeout_s) {
  const char *op = "wait";
  DDP_TRY(usable(c, op));
  DDP_TRY(ddp_cuda_use_device(c->device, op));
  if (!(timeout_s > 0)) timeout_s = c->timeout_s;
  double until = now_s() + timeout_s;
  for (int spins = 0;; spins++) {
    int done = 0;
    DDP_TRY(poll_once(c, (cudaEvent_t)event, &done, op));
    if (done) return DDP_OK;
    if (now_s() > until) return fail_timeout(c, op, "the collective", timeout_s, __LINE__);
    if (spins > 100) usleep(50); // short collectives finish within the first spins
  }
}

static int query(ddp_nccl_comm *c, void *event, int *done) {
  *done = 0;
  DDP_TRY(usable(c, "is_completed"));
  DDP_TRY(ddp_cuda_use_device(c->device, "is_completed"));
  return poll_once(c, (cudaEvent_t)event, done, "is_completed");
}

static void event_free(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

// ---- the table ------------------------------------------------------------------------

extern "C" const struct ddp_nccl_api *ddp_cuda_nccl_table(void) {
  static ddp_nccl_api table;
  static bool ready;
  if (!ready) { // first call is under the core's pthread_once (plugin.cu)
    table.abi = DDP_NCCL_API_ABI;
    table.version = NCCL_VERSION_CODE;
    table.get_unique_id = get_unique_id;
    table.comm_init = comm_init;
    table.comm_destroy = comm_destroy;
    table.comm_abort = comm_abort;
    table.set_timeout = set_timeout;
    table.comm_stream = comm_stream;
    table.comm_device = comm_device;
    table.comm_error = comm_error;
    table.all_reduce = all_reduce;
    table.broadcast = broadcast;
    table.all_gather = all_gather;
    table.reduce_scatter = reduce_scatter;
    table.reduce = reduce;
    table.gather = gather;
    table.scatter = scatter;
    table.all_to_all = all_to_all;
    table.all_to_allv = all_to_allv;
    table.send = p2p_send;
    table.recv = p2p_recv;
    table.barrier = barrier;
    table.wait_stream = wait_stream;
    table.wait_host = wait_host;
    table.query = query;
    table.event_free = event_free;
    ready = true;
  }
  return &table;
}
