// runtime/backend/cuda/pool.cu: the pooling entries of the CUDA kernel table: max, average
// and adaptive average pooling over (P, H, W) planes, forward and backward, with the
// semantics of runtime/backend/cpu/pool.c (PyTorch's window formulas: see there).
//
// Dtypes DDP_F32 and DDP_F64 (the ops layer computes f16/bf16 through f32); contiguous
// device buffers; one thread per output element (forward) or per input element (average
// backward), grid-stride loops, int64 indexing, on the current stream.
//
// Launches go through DDP_CUDA_LAUNCH (cuda_internal.h), so the file also
// runs unchanged on the host in the emulated device (runtime/backend/sim/cuda_emulation.h).
//
// Backward kernels write all of d_in (uninitialised on entry), as the CPU's do:
//  - max: d_in zeroed on the stream, then one thread per output cell adds its gradient at
//    the saved index with atomicAdd.
//    Indices repeat whenever windows overlap (stride below the dilated kernel), and the
//    backward geometry does not carry the dilation, so the adds are always atomic; with
//    distinct indices there is no contention and the sums are exact.
//  - average and adaptive average: a gather, no atomics. Each input element starts from 0
//    and visits the output windows that contain it, in increasing (oh, ow) order, adding
//    each share one at a time: the same additions in the same order as the CPU's scatter
//    (results may still differ in the last bit where the compilers fuse a multiply-add).
//    The forward kernels sum in the CPU's order and match it exactly.
#include <math.h>

#include "backend/cuda/cuda_internal.h"

namespace {

// Kernel taps [*k0, *k1) of a window starting at `start` (step dil, k taps) inside
// [0, size) (window_range of the CPU kernels).
__device__ __forceinline__ void window_range(int64_t start, int64_t dil, int64_t k, int64_t size,
                                             int64_t *k0, int64_t *k1) {
  int64_t lo = start >= 0 ? 0 : (-start + dil - 1) / dil;
  int64_t hi = size - start <= 0 ? 0 : (size - start + dil - 1) / dil;
  if (hi > k) hi = k;
  if (lo > hi) lo = hi;
  *k0 = lo, *k1 = hi;
}

template <typename T>
__global__ void max_fwd(T *__restrict__ out, int64_t *__restrict__ indices,
                        const T *__restrict__ in, ddp_pool2d_geom g) {
  const int64_t L = g.oh * g.ow, total = g.planes * L;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = e / L, l = e % L, oh = l / g.ow, ow = l % g.ow;
    const T *plane = in + p * g.h * g.w;
    const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    int64_t ki0, ki1, kj0, kj1;
    window_range(h0, g.dh, g.kh, g.h, &ki0, &ki1);
    window_range(w0, g.dw, g.kw, g.w, &kj0, &kj1);
    const bool any = ki0 < ki1 && kj0 < kj1;
    const int64_t first = (h0 + ki0 * g.dh) * g.w + w0 + kj0 * g.dw;
    T best = any ? plane[first] : (T)-INFINITY;
    int64_t best_i = any ? first : 0;
    for (int64_t ki = ki0; ki < ki1; ki++) {
      const int64_t row = (h0 + ki * g.dh) * g.w;
      for (int64_t kj = kj0; kj < kj1; kj++) {
        const int64_t at = row + w0 + kj * g.dw;
        const T v = plane[at];
        if (v > best || v != v) { // a NaN wins and stays, as on the CPU
          best = v;
          best_i = at;
        }
      }
    }
    out[e] = best;
    indices[e] = best_i;
  }
}

template <typename T>
__global__ void max_bwd(T *__restrict__ d_in, const T *__restrict__ grad_out,
                        const int64_t *__restrict__ indices, ddp_pool2d_geom g) {
  const int64_t L = g.oh * g.ow, total = g.planes * L, HW = g.h * g.w;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = e / L;
    atomicAdd(d_in + p * HW + indices[e], grad_out[e]);
  }
}

// avg_pool2d's clipped window of output cell (oh, ow) and its share 1 / divisor (the CPU's
// avg_window).
template <typename T>
__device__ __forceinline__ T avg_window(const ddp_pool2d_geom &g, int64_t oh, int64_t ow,
                                        int64_t *hs, int64_t *he, int64_t *ws, int64_t *we) {
  const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  int64_t h1 = h0 + g.kh, w1 = w0 + g.kw;
  if (h1 > g.h + g.ph) h1 = g.h + g.ph;
  if (w1 > g.w + g.pw) w1 = g.w + g.pw;
  const int64_t padded = (h1 - h0) * (w1 - w0);
  *hs = h0 < 0 ? 0 : h0, *ws = w0 < 0 ? 0 : w0;
  *he = h1 > g.h ? g.h : h1, *we = w1 > g.w ? g.w : w1;
  const int64_t count = g.count_include_pad ? padded : (*he - *hs) * (*we - *ws);
  return count > 0 ? (T)1 / (T)count : (T)0;
}

template <typename T>
__global__ void avg_fwd(T *__restrict__ out, const T *__restrict__ in, ddp_pool2d_geom g) {
  const int64_t L = g.oh * g.ow, total = g.planes * L;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = e / L, l = e % L, oh = l / g.ow, ow = l % g.ow;
    const T *plane = in + p * g.h * g.w;
    int64_t hs, he, ws, we;
    const T scale = avg_window<T>(g, oh, ow, &hs, &he, &ws, &we);
    T s = 0;
    for (int64_t ih = hs; ih < he; ih++)
      for (int64_t iw = ws; iw < we; iw++) s += plane[ih * g.w + iw];
    out[e] = s * scale;
  }
}

// Output rows [*lo, *hi] whose windows (start o * stride - pad, kernel k taps) may hold
// input row i; the caller still checks each window (clipping, ceil_mode's last window).
__device__ __forceinline__ void covering(int64_t i, int64_t k, int64_t stride, int64_t pad,
                                         int64_t n_out, int64_t *lo, int64_t *hi) {
  const int64_t t = i + pad; // o * stride <= t < o * stride + k
  *lo = t < k ? 0 : (t - k) / stride + 1;
  *hi = t / stride;
  if (*hi > n_out - 1) *hi = n_out - 1;
}

template <typename T>
__global__ void avg_bwd(T *__restrict__ d_in, const T *__restrict__ grad_out, ddp_pool2d_geom g) {
  const int64_t HW = g.h * g.w, total = g.planes * HW;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = e / HW, ih = (e % HW) / g.w, iw = e % g.w;
    const T *go = grad_out + p * g.oh * g.ow;
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, g.kh, g.sh, g.ph, g.oh, &oh0, &oh1);
    covering(iw, g.kw, g.sw, g.pw, g.ow, &ow0, &ow1);
    T d = 0;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        int64_t hs, he, ws, we;
        const T scale = avg_window<T>(g, oh, ow, &hs, &he, &ws, &we);
        if (ih < hs || ih >= he || iw < ws || iw >= we) continue;
        d += go[oh * g.ow + ow] * scale;
      }
    d_in[e] = d;
  }
}

// PyTorch's adaptive window of output i: [floor(i in / out), ceil((i + 1) in / out)).
__device__ __forceinline__ int64_t start_index(int64_t i, int64_t out, int64_t in) {
  return (i * in) / out;
}
__device__ __forceinline__ int64_t end_index(int64_t i, int64_t out, int64_t in) {
  return ((i + 1) * in + out - 1) / out;
}

template <typename T>
__global__ void adaptive_fwd(T *__restrict__ out, const T *__restrict__ in, ddp_pool2d_geom g) {
  const int64_t L = g.oh * g.ow, total = g.planes * L;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = e / L, l = e % L, oh = l / g.ow, ow = l % g.ow;
    const T *plane = in + p * g.h * g.w;
    const int64_t hs = start_index(oh, g.oh, g.h), he = end_index(oh, g.oh, g.h);
    const int64_t ws = start_index(ow, g.ow, g.w), we = end_index(ow, g.ow, g.w);
    T s = 0;
    for (int64_t ih = hs; ih < he; ih++)
      for (int64_t iw = ws; iw < we; iw++) s += plane[ih * g.w + iw];
    out[e] = s / (T)((he - hs) * (we - ws));
  }
}

// Output rows whose adaptive windows hold input row i: start(o) <= i < end(o) gives
// floor(i out / in) <= o <= ceil((i + 1) out / in) - 1; each is checked again in the loop.
__device__ __forceinline__ void adaptive_covering(int64_t i, int64_t n_out, int64_t n_in,
                                                  int64_t *lo, int64_t *hi) {
  *lo = (i * n_out) / n_in;
  *hi = ((i + 1) * n_out + n_in - 1) / n_in - 1;
  if (*hi > n_out - 1) *hi = n_out - 1;
}

template <typename T>
__global__ void adaptive_bwd(T *__restrict__ d_in, const T *__restrict__ grad_out,
                             ddp_pool2d_geom g) {
  const int64_t HW = g.h * g.w, total = g.planes * HW;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = e / HW, ih = (e % HW) / g.w, iw = e % g.w;
    const T *go = grad_out + p * g.oh * g.ow;
    int64_t oh0, oh1, ow0, ow1;
    adaptive_covering(ih, g.oh, g.h, &oh0, &oh1);
    adaptive_covering(iw, g.ow, g.w, &ow0, &ow1);
    T d = 0;
    for (int64_t oh = oh0; oh <= oh1; oh++) {
      const int64_t hs = start_index(oh, g.oh, g.h), he = end_index(oh, g.oh, g.h);
      if (ih < hs || ih >= he) continue;
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        const int64_t ws = start_index(ow, g.ow, g.w), we = end_index(ow, g.ow, g.w);
        if (iw < ws || iw >= we) continue;
        d += go[oh * g.ow + ow] / (T)((he - hs) * (we - ws));
      }
    }
    d_in[e] = d;
  }
}

int64_t outputs(const ddp_pool2d_geom *g) { return g->planes * g->oh * g->ow; }
int64_t inputs(const ddp_pool2d_geom *g) { return g->planes * g->h * g->w; }

} // namespace

// Launch kernel<T> over n elements on the current stream.
#define POOL_KERNEL(kernel, T, n, ...)                                                     \
  do {                                                                                     \
    int64_t n_ = (n);                                                                      \
    if (n_ > 0)                                                                            \
      DDP_CUDA_LAUNCH((kernel<T>), ddp_cuda_blocks(n_), DDP_CUDA_THREADS, 0, ddp_cuda_stream(), \
                      __VA_ARGS__);                                                        \
  } while (0)

// Each entry: as ddp_cpu_<name> (runtime/backend/cpu/pool.h); device pointers, dtype
// DDP_F32 or DDP_F64, contiguous (P, H, W) / (P, OH, OW) buffers; backward accumulates.

static void cuda_max_pool2d_forward(int dtype, void *out, int64_t *indices, const void *in,
                                    const ddp_pool2d_geom *g) {
  if (dtype == DDP_F32)
    POOL_KERNEL(max_fwd, float, outputs(g), (float *)out, indices, (const float *)in, *g);
  else
    POOL_KERNEL(max_fwd, double, outputs(g), (double *)out, indices, (const double *)in, *g);
}

static void cuda_max_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                     const int64_t *indices, const ddp_pool2d_geom *g) {
  cudaMemsetAsync(d_in, 0, (size_t)inputs(g) * (dtype == DDP_F32 ? 4 : 8), ddp_cuda_stream());
  if (dtype == DDP_F32)
    POOL_KERNEL(max_bwd, float, outputs(g), (float *)d_in, (const float *)grad_out, indices, *g);
  else
    POOL_KERNEL(max_bwd, double, outputs(g), (double *)d_in, (const double *)grad_out, indices, *g);
}

static void cuda_avg_pool2d_forward(int dtype, void *out, const void *in,
                                    const ddp_pool2d_geom *g) {
  if (dtype == DDP_F32) POOL_KERNEL(avg_fwd, float, outputs(g), (float *)out, (const float *)in, *g);
  else POOL_KERNEL(avg_fwd, double, outputs(g), (double *)out, (const double *)in, *g);
}

static void cuda_avg_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                     const ddp_pool2d_geom *g) {
  if (dtype == DDP_F32)
    POOL_KERNEL(avg_bwd, float, inputs(g), (float *)d_in, (const float *)grad_out, *g);
  else
    POOL_KERNEL(avg_bwd, double, inputs(g), (double *)d_in, (const double *)grad_out, *g);
}

static void cuda_adaptive_avg_pool2d_forward(int dtype, void *out, const void *in,
                                             const ddp_pool2d_geom *g) {
  if (dtype == DDP_F32)
    POOL_KERNEL(adaptive_fwd, float, outputs(g), (float *)out, (const float *)in, *g);
  else
    POOL_KERNEL(adaptive_fwd, double, outputs(g), (double *)out, (const double *)in, *g);
}

static void cuda_adaptive_avg_pool2d_backward(int dtype, void *d_in, const void *grad_out,
                                              const ddp_pool2d_geom *g) {
  if (dtype == DDP_F32)
    POOL_KERNEL(adaptive_bwd, float, inputs(g), (float *)d_in, (const float *)grad_out, *g);
  else
    POOL_KERNEL(adaptive_bwd, double, inputs(g), (double *)d_in, (const double *)grad_out, *g);
}

extern "C" void ddp_cuda_register_pool(ddp_kernels *k) {
  k->max_pool2d_forward = cuda_max_pool2d_forward;
  k->max_pool2d_backward = cuda_max_pool2d_backward;
  /* no fused relu pooling here: relu_max_pool2d runs relu then max_pool2d (a table copied
   * from the CPU's, as the emulated device's, must not keep the CPU's fused forward, whose
   * indices only the CPU backward reads) */
  k->relu_max_pool2d_taps = NULL;
  k->relu_max_pool2d_forward = NULL;
  k->relu_max_pool2d_backward = NULL;
  k->avg_pool2d_forward = cuda_avg_pool2d_forward;
  k->avg_pool2d_backward = cuda_avg_pool2d_backward;
  k->adaptive_avg_pool2d_forward = cuda_adaptive_avg_pool2d_forward;
  k->adaptive_avg_pool2d_backward = cuda_adaptive_avg_pool2d_backward;
}
