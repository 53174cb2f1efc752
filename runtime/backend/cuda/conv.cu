// runtime/backend/cuda/conv.cu: the conv2d entries of the CUDA kernel table, through
// cuDNN 9's legacy convolution API (cudnnConvolutionForward, cudnnConvolutionBackwardData,
// cudnnConvolutionBackwardFilter, cudnnAddTensor, cudnnConvolutionBackwardBias).
//
// Semantics are those of runtime/backend/cpu/conv.h: contiguous NCHW buffers of dtype
// DDP_F32 or DDP_F64 (the ops layer computes f16/bf16 through f32); forward overwrites out
// and adds the bias; backward accumulates into d_in, d_w, d_b (beta = 1 in every cuDNN
// call), each of which may be NULL (not wanted).
//
// Plans: the descriptors of one geometry (input, output, filter, bias, convolution with
// groups and math type) and the algorithm of each direction are built once and cached
// under (device, dtype, geometry, TF32 setting); the algorithm is the first of cuDNN's
// heuristic ranking (cudnnGet*Algorithm_v7) that supports the geometry, and its math type
// is set on the direction's descriptor (cuDNN needs algorithm and math type to agree), as
// PyTorch's Conv_v7.cpp does. Math type asked for, as PyTorch: CUDNN_FMA_MATH for f32
// without TF32 (only algorithms reporting CUDNN_FMA_MATH are taken), CUDNN_DEFAULT_MATH for
// f32 with ddp_cuda_allow_tf32 (the mode cuDNN documents as permitting TF32 on Ampere and
// later) and for f64.
//
// The legacy convolution API is marked deprecated in cuDNN 9 (CUDNN_DEPRECATED, silent
// unless CUDNN_WARN_DEPRECATED is defined) but still shipped in libcudnn_cnn; a move to the
// graph API is the way off it.
// Workspace comes from the caching allocator (ddp_cuda_caching_malloc) and is freed right
// after the call is queued: the block is reused only by later work on the same stream.
//
// cuDNN handles: one per (device, host thread), created lazily, bound to the current
// stream before each call; a thread's handles go back to a per-device pool at its exit.
#include <cudnn.h>
#include <limits.h>

#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_internal.h"

extern "C" int ddp_cuda_caching_malloc(void **out, int device, size_t nbytes);
extern "C" void ddp_cuda_caching_free(void *p);

namespace {

enum { MAX_DEVICES = 64 };

int dnn_fail(cudnnStatus_t s, const char *op, const char *what, int line) {
  int status = s == CUDNN_STATUS_ALLOC_FAILED ? DDP_ERR_MEMORY : DDP_ERR_STATE;
  // cuDNN 9 keeps a more precise message per thread (which descriptor field, which limit)
  char detail[256] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  return ddp_fail_at(__FILE__, line, status, "%s: %s failed: %s%s%s%s", op, what,
                     cudnnGetErrorString(s), detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
}

// Evaluate a cuDNN call; on failure record "<op>: <call> failed: <reason>" and return.
#define DNN_TRY(call, op)                                                                  \
  do {                                                                                     \
    cudnnStatus_t dnn_s_ = (call);                                                         \
    if (dnn_s_ != CUDNN_STATUS_SUCCESS) return dnn_fail(dnn_s_, (op), #call, __LINE__);    \
  } while (0)

// ---- handles ------------------------------------------------------------------------

std::mutex pool_lock;
// Never destroyed: it must outlive the thread_local holders, whose destructors run at
// thread (and process) exit.
std::vector<cudnnHandle_t> *handle_pool = new std::vector<cudnnHandle_t>[MAX_DEVICES];

struct ThreadHandles {
  cudnnHandle_t h[MAX_DEVICES] = {};
  ~ThreadHandles() {
    std::lock_guard<std::mutex> g(pool_lock);
    for (int d = 0; d < MAX_DEVICES; d++)
      if (h[d]) handle_pool[d].push_back(h[d]);
  }
};
thread_local ThreadHandles thread_handles;

// This thread's handle for `device` (current), bound to the current stream.
int dnn_handle(cudnnHandle_t *out, int device, const char *op) {
  if (device < 0 || device >= MAX_DEVICES)
    DDP_FAIL(DDP_ERR_STATE, "%s: cuDNN: device %d out of range", op, device);
  cudnnHandle_t &h = thread_handles.h[device];
  if (!h) {
    {
      std::lock_guard<std::mutex> g(pool_lock);
      if (!handle_pool[device].empty()) {
        h = handle_pool[device].back();
        handle_pool[device].pop_back();
      }
    }
    if (!h) {
      cudnnStatus_t s = cudnnCreate(&h);
      if (s != CUDNN_STATUS_SUCCESS) {
        h = NULL;
        return dnn_fail(s, op, "cudnnCreate", __LINE__);
      }
    }
  }
  DNN_TRY(cudnnSetStream(h, ddp_cuda_stream()), op);
  *out = h;
  return DDP_OK;
}

// ---- plans ---------------------------------------------------------------------------

struct Plan {
  cudnnDataType_t type;
  cudnnMathType_t math;
  cudnnTensorDescriptor_t x = NULL, y = NULL, b = NULL;
  cudnnFilterDescriptor_t w = NULL;
  // one convolution descriptor per direction: each takes the math type of its algorithm
  cudnnConvolutionDescriptor_t conv[3] = {NULL, NULL, NULL}; // forward, data, filter
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

using Key = std::array<int64_t, 19>;
std::mutex plan_lock; // guards plans and the lazy algorithm choice of each plan
std::map<Key, Plan *> *plans = new std::map<Key, Plan *>; // kept for the process

int fits_int(const ddp_conv2d_geom *g) {
  const int64_t v[] = {g->n, g->c, g->h, g->w, g->o, g->kh, g->kw, g->oh, g->ow,
                       g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->groups};
  for (int64_t x : v)
    if (x < 0 || x > INT_MAX) return 0;
  return 1;
}

// tf32: the setting in the plan's key (read once, so key and descriptors agree even if
// another thread flips it meanwhile).
int build_plan(Plan *p, int dtype, int tf32, const ddp_conv2d_geom *g, const char *op) {
  p->type = dtype == DDP_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  p->math = dtype == DDP_F64 || tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  DNN_TRY(cudnnCreateTensorDescriptor(&p->x), op);
  DNN_TRY(cudnnCreateTensorDescriptor(&p->y), op);
  DNN_TRY(cudnnCreateTensorDescriptor(&p->b), op);
  DNN_TRY(cudnnCreateFilterDescriptor(&p->w), op);
  DNN_TRY(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, p->type, (int)g->n, (int)g->c,
                                     (int)g->h, (int)g->w), op);
  DNN_TRY(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, p->type, (int)g->n, (int)g->o,
                                     (int)g->oh, (int)g->ow), op);
  DNN_TRY(cudnnSetTensor4dDescriptor(p->b, CUDNN_TENSOR_NCHW, p->type, 1, (int)g->o, 1, 1), op);
  DNN_TRY(cudnnSetFilter4dDescriptor(p->w, p->type, CUDNN_TENSOR_NCHW, (int)g->o,
                                     (int)(g->c / g->groups), (int)g->kh, (int)g->kw), op);
  for (cudnnConvolutionDescriptor_t &conv : p->conv) {
    DNN_TRY(cudnnCreateConvolutionDescriptor(&conv), op);
    DNN_TRY(cudnnSetConvolution2dDescriptor(conv, (int)g->ph, (int)g->pw, (int)g->sh, (int)g->sw,
                                            (int)g->dh, (int)g->dw, CUDNN_CROSS_CORRELATION,
                                            p->type), op);
    DNN_TRY(cudnnSetConvolutionGroupCount(conv, (int)g->groups), op);
    DNN_TRY(cudnnSetConvolutionMathType(conv, p->math), op);
  }
  int n, c, h, w;
  DNN_TRY(cudnnGetConvolution2dForwardOutputDim(p->conv[0], p->x, p->w, &n, &c, &h, &w), op);
  if (n != g->n || c != g->o || h != g->oh || w != g->ow)
    DDP_FAIL(DDP_ERR_STATE, "%s: cuDNN computes output (%d, %d, %d, %d), expected (%lld, %lld, "
             "%lld, %lld)", op, n, c, h, w, (long long)g->n, (long long)g->o, (long long)g->oh,
             (long long)g->ow);
  return DDP_OK;
}

// The plan for this geometry on the current device, built on first use.
int plan_for(Plan **out, int device, int dtype, const ddp_conv2d_geom *g, const char *op) {
  if (!fits_int(g))
    DDP_FAIL(DDP_ERR_ARG, "%s: input (%lld, %lld, %lld, %lld) or weight exceeds cuDNN's int "
             "sizes", op, (long long)g->n, (long long)g->c, (long long)g->h, (long long)g->w);
  const int tf32 = dtype == DDP_F32 && ddp_cuda_allow_tf32;
  Key key = {device, dtype, tf32, g->n, g->c, g->h, g->w, g->o, g->kh, g->kw,
             g->oh, g->ow, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->groups};
  std::lock_guard<std::mutex> guard(plan_lock);
  auto it = plans->find(key);
  if (it != plans->end()) {
    *out = it->second;
    return DDP_OK;
  }
  Plan *p = new Plan;
  int status = build_plan(p, dtype, tf32, g, op);
  if (status) { // descriptors of a failed plan are dropped (cuDNN accepts NULL)
    cudnnDestroyTensorDescriptor(p->x), cudnnDestroyTensorDescriptor(p->y);
    cudnnDestroyTensorDescriptor(p->b), cudnnDestroyFilterDescriptor(p->w);
    for (cudnnConvolutionDescriptor_t conv : p->conv) cudnnDestroyConvolutionDescriptor(conv);
    delete p;
    return status;
  }
  (*plans)[key] = p;
  *out = p;
  return DDP_OK;
}

// The first result of the heuristic ranking that succeeded (for f32 without TF32: the
// first whose math type is CUDNN_FMA_MATH, since CUDNN_DEFAULT_MATH may use TF32 on Ampere
// and later); its math type is then set on the direction's descriptor `conv`, as PyTorch
// does (cuDNN picks tensor-core kernels from algorithm and math type together). Taking the
// ranking's first rather than the first that matches the requested math type keeps
// cuDNN's order: a tensor-op entry ranked first is not passed over for a slower one.
// -1 with an error naming the direction when none fits.
template <typename Perf>
int pick(const Perf *perf, int count, const Plan *p, cudnnConvolutionDescriptor_t conv,
         const char *op, const char *what) {
  bool strict = p->type == CUDNN_DATA_FLOAT && p->math == CUDNN_FMA_MATH;
  int found = -1;
  for (int i = 0; i < count && found < 0; i++) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (strict && perf[i].mathType != CUDNN_FMA_MATH) continue;
    found = i;
  }
  if (found >= 0) {
    cudnnStatus_t s = cudnnSetConvolutionMathType(conv, perf[found].mathType);
    if (s == CUDNN_STATUS_SUCCESS) return found;
    dnn_fail(s, op, "cudnnSetConvolutionMathType", __LINE__);
    return -1;
  }
  ddp_fail_at(__FILE__, __LINE__, DDP_ERR_UNAVAILABLE, "%s: cuDNN has no %s algorithm for "
              "this geometry%s", op, what, strict ? " without TF32" : "");
  return -1;
}

// Choose the algorithms a call needs (under plan_lock).
int choose_fwd(Plan *p, cudnnHandle_t h, const char *op) {
  if (p->have_fwd) return DDP_OK;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int count = 0;
  DNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv[0], p->y,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
          op);
  int i = pick(perf, count, p, p->conv[0], op, "forward");
  if (i < 0) return ddp_last_status();
  DNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv[0], p->y, perf[i].algo,
                                                  &p->fwd_ws), op);
  p->fwd = perf[i].algo;
  p->have_fwd = true;
  return DDP_OK;
}

int choose_bwd_data(Plan *p, cudnnHandle_t h, const char *op) {
  if (p->have_bwd_data) return DDP_OK;
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int count = 0;
  DNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, p->conv[1], p->x,
                                                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                      &count, perf), op);
  int i = pick(perf, count, p, p->conv[1], op, "backward data");
  if (i < 0) return ddp_last_status();
  DNN_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv[1], p->x,
                                                       perf[i].algo, &p->bwd_data_ws), op);
  p->bwd_data = perf[i].algo;
  p->have_bwd_data = true;
  return DDP_OK;
}

int choose_bwd_filter(Plan *p, cudnnHandle_t h, const char *op) {
  if (p->have_bwd_filter) return DDP_OK;
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int count = 0;
  DNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x, p->y, p->conv[2], p->w,
                                                        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                        &count, perf), op);
  int i = pick(perf, count, p, p->conv[2], op, "backward filter");
  if (i < 0) return ddp_last_status();
  DNN_TRY(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->conv[2], p->w,
                                                         perf[i].algo, &p->bwd_filter_ws), op);
  p->bwd_filter = perf[i].algo;
  p->have_bwd_filter = true;
  return DDP_OK;
}

// A workspace block of `bytes` on `device` (NULL for 0), freed by the destructor: the
// caching allocator reuses it only for later work on this stream, so freeing it once the
// cuDNN call is queued is safe.
struct Workspace {
  void *p = NULL;
  ~Workspace() {
    if (p) ddp_cuda_caching_free(p);
  }
  int get(int device, size_t bytes) { return bytes ? ddp_cuda_caching_malloc(&p, device, bytes) : DDP_OK; }
};

// Scalars 1 and 0 in the plan's type (cuDNN reads them from the host).
struct Scalars {
  float f1 = 1, f0 = 0;
  double d1 = 1, d0 = 0;
  const void *one(int dtype) const { return dtype == DDP_F64 ? (const void *)&d1 : &f1; }
  const void *zero(int dtype) const { return dtype == DDP_F64 ? (const void *)&d0 : &f0; }
};

// No input channels (C = 0, which cuDNN's descriptors refuse): out (N, O, L) = bias or 0.
template <typename T>
__global__ void bias_only(T *__restrict__ out, const T *__restrict__ bias, int64_t O, int64_t L,
                          int64_t total) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x)
    out[e] = bias ? bias[(e / L) % O] : (T)0;
}

// d_b (O) += the sums of grad (N, O, L) over N and L: one block per channel (striding),
// a shared-memory tree over DDP_CUDA_THREADS partial sums.
template <typename T>
__global__ void bias_grad(T *__restrict__ d_b, const T *__restrict__ go, int64_t N, int64_t O,
                          int64_t L) {
  __shared__ T part[DDP_CUDA_THREADS];
  for (int64_t o = blockIdx.x; o < O; o += gridDim.x) { // block-uniform trips
    T acc = 0;
    for (int64_t i = threadIdx.x; i < N * L; i += blockDim.x)
      acc += go[((i / L) * O + o) * L + i % L];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) d_b[o] += part[0];
    __syncthreads();
  }
}

// conv2d with C = 0, forward (d_b NULL) or the bias gradient of backward.
template <typename T>
void no_channels(void *out, const void *bias, void *d_b, const void *grad_out,
                 const ddp_conv2d_geom *g) {
  int64_t L = g->oh * g->ow;
  if (out) {
    int64_t total = g->n * g->o * L;
    DDP_CUDA_LAUNCH((bias_only<T>), ddp_cuda_blocks(total), DDP_CUDA_THREADS, 0,
                    ddp_cuda_stream(), (T *)out, (const T *)bias, g->o, L, total);
  } else {
    unsigned blocks = (unsigned)(g->o < 65535 ? g->o : 65535);
    DDP_CUDA_LAUNCH((bias_grad<T>), blocks, DDP_CUDA_THREADS, 0, ddp_cuda_stream(), (T *)d_b,
                    (const T *)grad_out, g->n, g->o, L);
  }
}

} // namespace

// The table's conv2d_forward: out (N, O, OH, OW) = conv2d(in (N, C, H, W), w (O, C/groups,
// kH, kW)) + bias (O) when bias is not NULL, as ddp_cpu_conv2d_forward. Device pointers,
// dtype DDP_F32 or DDP_F64, on the current stream of the current device. Returns a status:
// cuDNN failures, a geometry beyond int sizes, workspace memory.
static int cuda_conv2d_forward(int dtype, void *out, const void *in, const void *w,
                               const void *bias, const ddp_conv2d_geom *g) {
  const char *op = "conv2d";
  if (g->n <= 0 || g->o <= 0 || g->oh <= 0 || g->ow <= 0) return DDP_OK;
  if (g->c == 0) { // no input channels: the output is the bias alone
    if (dtype == DDP_F64) no_channels<double>(out, bias, NULL, NULL, g);
    else no_channels<float>(out, bias, NULL, NULL, g);
    return DDP_OK;
  }
  int device = ddp_cuda_device();
  Scalars s;
  cudnnHandle_t h;
  DDP_TRY(dnn_handle(&h, device, op));
  Plan *p;
  DDP_TRY(plan_for(&p, device, dtype, g, op));
  {
    std::lock_guard<std::mutex> guard(plan_lock);
    DDP_TRY(choose_fwd(p, h, op));
  }
  {
    Workspace ws;
    DDP_TRY(ws.get(device, p->fwd_ws));
    DNN_TRY(cudnnConvolutionForward(h, s.one(dtype), p->x, in, p->w, w, p->conv[0], p->fwd, ws.p,
                                    p->fwd_ws, s.zero(dtype), p->y, out), op);
  }
  if (bias) DNN_TRY(cudnnAddTensor(h, s.one(dtype), p->b, bias, s.one(dtype), p->y, out), op);
  return DDP_OK;
}

// The table's conv2d_backward: accumulate (beta = 1) the gradients of conv2d into d_in
// (N, C, H, W), d_w (O, C/groups, kH, kW) and d_b (O), each NULL when not wanted, from
// grad_out (N, O, OH, OW), in and w, as ddp_cpu_conv2d_backward. Device pointers, dtype
// DDP_F32 or DDP_F64, on the current stream. Returns a status as the forward does.
// Accumulation: cuDNN documents alpha/beta blending (y = alpha * result + beta * y) for
// cudnnConvolutionBackwardData/Filter and cudnnConvolutionBackwardBias, so beta = 1 adds
// into the existing gradient without a scratch buffer. First GPU run: compare against the
// CPU kernel with non-zero d_in/d_w/d_b on entry, for several geometries (groups > 1,
// dilation, stride > 1) and each algorithm the heuristics choose, as some algorithms
// (FFT, Winograd) have had beta bugs in older cuDNN releases.
static int cuda_conv2d_backward(int dtype, void *d_in, void *d_w, void *d_b, const void *grad_out,
                                const void *in, const void *w, const ddp_conv2d_geom *g) {
  const char *op = "conv2d backward";
  if (g->n <= 0 || g->o <= 0 || g->oh <= 0 || g->ow <= 0) return DDP_OK;
  if (g->c == 0) { // d_in and d_w are empty: only the bias gradient
    if (d_b && dtype == DDP_F64) no_channels<double>(NULL, NULL, d_b, grad_out, g);
    else if (d_b) no_channels<float>(NULL, NULL, d_b, grad_out, g);
    return DDP_OK;
  }
  if (!d_in && !d_w && !d_b) return DDP_OK;
  int device = ddp_cuda_device();
  Scalars s;
  cudnnHandle_t h;
  DDP_TRY(dnn_handle(&h, device, op));
  Plan *p;
  DDP_TRY(plan_for(&p, device, dtype, g, op));
  {
    std::lock_guard<std::mutex> guard(plan_lock);
    if (d_in) DDP_TRY(choose_bwd_data(p, h, op));
    if (d_w) DDP_TRY(choose_bwd_filter(p, h, op));
  }
  if (d_b)
    DNN_TRY(cudnnConvolutionBackwardBias(h, s.one(dtype), p->y, grad_out, s.one(dtype), p->b, d_b),
            op);
  if (d_w) {
    Workspace ws;
    DDP_TRY(ws.get(device, p->bwd_filter_ws));
    DNN_TRY(cudnnConvolutionBackwardFilter(h, s.one(dtype), p->x, in, p->y, grad_out, p->conv[2],
                                           p->bwd_filter, ws.p, p->bwd_filter_ws, s.one(dtype),
                                           p->w, d_w), op);
  }
  if (d_in) {
    Workspace ws;
    DDP_TRY(ws.get(device, p->bwd_data_ws));
    DNN_TRY(cudnnConvolutionBackwardData(h, s.one(dtype), p->w, w, p->y, grad_out, p->conv[1],
                                         p->bwd_data, ws.p, p->bwd_data_ws, s.one(dtype), p->x,
                                         d_in), op);
  }
  return DDP_OK;
}

extern "C" void ddp_cuda_register_conv(ddp_kernels *k) {
  k->conv2d_forward = cuda_conv2d_forward;
  k->conv2d_backward = cuda_conv2d_backward;
}
