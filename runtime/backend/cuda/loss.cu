// runtime/backend/cuda/loss.cu: CUDA kernels of the loss functions (cross-entropy with a
// fused log-softmax, NLL, MSE), with the semantics and layouts of the CPU kernels in
// runtime/backend/cpu/loss.h: a class input (N, C, d1, ...) is seen as (N, C, D), sample
// i = n * D + d has its C class values at x[n*C*D + c*D + d]; per-sample buffers are (N*D).
// Templates over the element type T (float, double); every entry point has the CPU
// kernel's signature and is registered in the kernel table by ddp_cuda_register_loss.
//
// Work split: a sample is handled by a group of G threads. When D == 1 (an (N, C) input:
// a sample's classes are contiguous) G = 32, a warp, each lane taking classes lane,
// lane + 32, ... and the maximum and sums reduced with warp shuffles; when D > 1, G = 1,
// one thread per sample, so neighbouring threads read neighbouring d (coalesced).
//
// Note [device loss totals]: the forward kernels return the summed loss to the host as a
// double (the kernel-table signature), so they end with a synchronisation of the current
// stream. The sum is deterministic: each thread adds its samples in order, blocks reduce
// in a fixed tree, the grid size depends only on the sample count, and one block adds the
// block sums in order. The block sums and the total live in a per-device __device__
// buffer guarded by a host mutex from the launch to the copy back, so no allocation (that
// could fail silently) is needed. Per-sample losses go to `loss` when it is non-NULL.
//
// Errors: a failed launch or copy stays pending for ddp_device_check (the forward then
// returns NaN).
#include <math.h>

#include <mutex>

#include "backend/cuda/cuda_internal.h"

namespace {

// MAX_PARTIALS: the most blocks of a forward (and block sums to add).
enum { LOSS_THREADS = 256, MAX_PARTIALS = 1024 };
static_assert(MAX_PARTIALS >= 1 && MAX_PARTIALS <= 1024, "the partials are added by one block");

__device__ double loss_partials[MAX_PARTIALS]; // block sums of the last forward (per device)
__device__ double loss_total;                  // their sum
std::mutex loss_total_lock;                    // one forward at a time uses the two above

__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }

// Sum / maximum over the G lanes of a group (G a power of two <= 32; all lanes of the
// warp take part: callers keep the warp's control flow uniform).
template <int G, typename V> __device__ __forceinline__ V group_sum(V v) {
#pragma unroll
  for (int off = G / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
template <int G, typename V> __device__ __forceinline__ V group_max(V v) {
#pragma unroll
  for (int off = G / 2; off > 0; off /= 2) {
    V o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024), the same in every
// thread. Every thread of the block must call it.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[32];
  v = group_sum<32>(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads(); // an earlier call's readers are done with warp_sums
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double s = lane < nwarps ? warp_sums[lane] : 0.0;
    s = group_sum<32>(s);
    if (lane == 0) warp_sums[0] = s;
  }
  __syncthreads();
  return warp_sums[0];
}

// Blocks of a forward over `items` work items at `per_block` items per block, capped at
// MAX_PARTIALS (grid-stride loops take the rest): a function of `items` only.
unsigned forward_blocks(int64_t items, int64_t per_block) {
  int64_t b = (items + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > MAX_PARTIALS) b = MAX_PARTIALS;
  return (unsigned)b;
}

// loss_total = sum of loss_partials[0 .. nparts) in a fixed order (one block of a multiple
// of 32 threads, at most 1024).
__global__ void __launch_bounds__(1024) sum_partials_kernel(int nparts) {
  double s = 0;
  for (int k = threadIdx.x; k < nparts; k += blockDim.x) s += loss_partials[k];
  s = block_sum(s);
  if (threadIdx.x == 0) loss_total = s;
}

// Add the block sums of the forward just launched and bring the total to the host (holds
// loss_total_lock, taken by the caller before the launch). NaN on a CUDA error, which
// stays pending for ddp_device_check.
double finish_total(unsigned nparts) {
  cudaStream_t stream = ddp_cuda_stream();
  // a warp per 32 partials (a function of nparts only, so the sum stays deterministic)
  const unsigned threads = (nparts + 31) / 32 * 32;
  DDP_CUDA_LAUNCH((sum_partials_kernel), 1, threads, 0, stream, (int)nparts);
  // a failed launch (of the forward or of the sum) leaves loss_total stale: NaN, not the
  // previous forward's total (the error stays pending: peek does not clear it)
  if (cudaPeekAtLastError() != cudaSuccess) return NAN;
  double total = NAN;
  if (cudaMemcpyFromSymbolAsync(&total, loss_total, sizeof total, 0, cudaMemcpyDeviceToHost,
                                stream) != cudaSuccess)
    return NAN;
  if (cudaStreamSynchronize(stream) != cudaSuccess) return NAN;
  return total;
}

// ---- cross-entropy ------------------------------------------------------------------------

template <typename T> struct CeArgs {
  T *loss, *lse, *dx;
  const T *x, *prob, *weight, *dloss;
  const int64_t *target;
  int64_t N, C, D, ignore_index;
  double eps, factor;
  int dloss_per_sample;
};

// log(sum_c exp(x[c * D])) of one sample, max subtracted first, by a group of G lanes.
template <typename T, int G>
__device__ __forceinline__ T group_log_sum_exp(const T *xs, int64_t C, int64_t D, int lane) {
  T m = -INFINITY;
  for (int64_t c = lane; c < C; c += G) m = xs[c * D] > m ? xs[c * D] : m;
  m = group_max<G>(m);
  T s = 0;
  for (int64_t c = lane; c < C; c += G) s += dexp(xs[c * D] - m);
  s = group_sum<G>(s);
  return m + dlog(s);
}

// One group per sample (grid-stride over samples); each block writes the sum of its
// samples' losses (double) to loss_partials[blockIdx.x].
template <typename T, int G> __global__ void ce_forward_kernel(CeArgs<T> k) {
  const int lane = G == 1 ? 0 : (int)(threadIdx.x % G);
  const int64_t groups = (int64_t)gridDim.x * (blockDim.x / G);
  const int64_t n_samples = k.N * k.D, C = k.C, D = k.D;
  const T a = (T)(1 - k.eps), b = C > 0 ? (T)(k.eps / (double)C) : (T)0;
  double acc = 0;
  // the loop bound is the same for the G lanes of a group, so shuffles stay uniform
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G; i < n_samples;
       i += groups) {
    const int64_t n = i / D, d = i - n * D;
    const T *xs = k.x + n * C * D + d;
    const T *w = k.weight;
    const T l = group_log_sum_exp<T, G>(xs, C, D, lane);
    double loss;
    if (k.target) {
      const int64_t y = k.target[i];
      if (y == k.ignore_index) {
        loss = 0;
      } else {
        loss = -(double)(w ? w[y] : (T)1) * (double)(xs[y * D] - l);
        if (k.eps > 0) { // (1 - eps) * nll + (eps / C) * (-sum_c w_c logp_c)
          T sw = 0;
          for (int64_t c = lane; c < C; c += G) sw += (w ? w[c] : (T)1) * (xs[c * D] - l);
          sw = group_sum<G>(sw);
          loss = (double)a * loss - (double)b * (double)sw;
        }
      }
    } else { // -sum_c w_c ((1 - eps) t_c + eps / C) logp_c
      const T *t = k.prob + n * C * D + d;
      T sw = 0;
      for (int64_t c = lane; c < C; c += G) {
        T q = a * t[c * D] + b;
        if (w) q *= w[c];
        sw += q * (xs[c * D] - l);
      }
      sw = group_sum<G>(sw);
      loss = -(double)sw;
    }
    if (lane == 0) {
      k.lse[i] = l;
      if (k.loss) k.loss[i] = (T)loss;
      acc += loss;
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) loss_partials[blockIdx.x] = acc;
}

// dx_c += scale * (p_c * Q - q_c), p = exp(x - lse), Q = sum_c q_c (see the CPU kernel).
template <typename T, int G> __global__ void ce_backward_kernel(CeArgs<T> k) {
  const int lane = G == 1 ? 0 : (int)(threadIdx.x % G);
  const int64_t groups = (int64_t)gridDim.x * (blockDim.x / G);
  const int64_t n_samples = k.N * k.D, C = k.C, D = k.D;
  const T a = (T)(1 - k.eps), b = C > 0 ? (T)(k.eps / (double)C) : (T)0;
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G; i < n_samples;
       i += groups) {
    const int64_t n = i / D, d = i - n * D;
    const T *xs = k.x + n * C * D + d;
    T *dx = k.dx + n * C * D + d;
    const T *w = k.weight;
    const T scale = (T)(k.factor * (double)k.dloss[k.dloss_per_sample ? i : 0]);
    const T l = k.lse[i];
    if (k.target) {
      const int64_t y = k.target[i];
      if (y == k.ignore_index) continue; // the whole group skips together
      const T wy = w ? w[y] : (T)1;
      if (k.eps == 0) { // q = wy * onehot(y)
        const T sc = scale * wy;
        for (int64_t c = lane; c < C; c += G) {
          T v = dx[c * D] + sc * dexp(xs[c * D] - l);
          if (c == y) v -= sc;
          dx[c * D] = v;
        }
        continue;
      }
      // q_c = (1 - eps) wy [c == y] + (eps / C) w_c; Q = (1 - eps) wy + (eps / C) sum_c w_c
      T wsum = 0;
      if (w) {
        for (int64_t c = lane; c < C; c += G) wsum += w[c];
        wsum = group_sum<G>(wsum);
      } else {
        wsum = (T)C;
      }
      const T Q = a * wy + b * wsum;
      for (int64_t c = lane; c < C; c += G) {
        T v = dx[c * D] + scale * (dexp(xs[c * D] - l) * Q - b * (w ? w[c] : (T)1));
        if (c == y) v -= scale * a * wy;
        dx[c * D] = v;
      }
    } else {
      const T *t = k.prob + n * C * D + d;
      T Q = 0;
      for (int64_t c = lane; c < C; c += G) Q += (a * t[c * D] + b) * (w ? w[c] : (T)1);
      Q = group_sum<G>(Q);
      for (int64_t c = lane; c < C; c += G)
        dx[c * D] += scale * (dexp(xs[c * D] - l) * Q - (a * t[c * D] + b) * (w ? w[c] : (T)1));
    }
  }
}

// Launch a per-sample kernel with G = 32 (D == 1) or G = 1 (D > 1); returns the grid.
template <typename T, template <typename, int> class Launch>
unsigned launch_per_sample(const CeArgs<T> &k, bool forward) {
  const int64_t n_samples = k.N * k.D;
  cudaStream_t stream = ddp_cuda_stream();
  if (k.D == 1) {
    const int64_t per_block = LOSS_THREADS / 32;
    unsigned blocks = forward ? forward_blocks(n_samples, per_block)
                              : ddp_cuda_blocks(n_samples * 32, LOSS_THREADS);
    Launch<T, 32>::run(blocks, stream, k);
    return blocks;
  }
  unsigned blocks = forward ? forward_blocks(n_samples, LOSS_THREADS)
                            : ddp_cuda_blocks(n_samples, LOSS_THREADS);
  Launch<T, 1>::run(blocks, stream, k);
  return blocks;
}

template <typename T, int G> struct CeForwardLaunch {
  static void run(unsigned blocks, cudaStream_t s, const CeArgs<T> &k) {
    DDP_CUDA_LAUNCH((ce_forward_kernel<T, G>), blocks, LOSS_THREADS, 0, s, k);
  }
};
template <typename T, int G> struct CeBackwardLaunch {
  static void run(unsigned blocks, cudaStream_t s, const CeArgs<T> &k) {
    DDP_CUDA_LAUNCH((ce_backward_kernel<T, G>), blocks, LOSS_THREADS, 0, s, k);
  }
};

// Cross-entropy forward (ddp_cpu_cross_entropy_forward_*): lse (N*D) and loss (N*D, or
// NULL) on the device; returns the summed loss (Note [device loss totals]).
template <typename T>
double ce_forward(T *loss, T *lse, const T *x, const int64_t *target, const T *prob,
                  const T *weight, int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                  double smoothing) {
  if (N * D <= 0) return 0.0;
  CeArgs<T> k = {loss, lse, nullptr, x, prob, weight, nullptr, target, N, C, D, ignore_index,
                 smoothing, 0.0, 0};
  std::lock_guard<std::mutex> guard(loss_total_lock);
  unsigned blocks = launch_per_sample<T, CeForwardLaunch>(k, true);
  return finish_total(blocks);
}

// Cross-entropy backward (ddp_cpu_cross_entropy_backward_*): dx (N, C, D) += ...
template <typename T>
void ce_backward(T *dx, const T *dloss, int dloss_per_sample, double factor, const T *x,
                 const T *lse, const int64_t *target, const T *prob, const T *weight, int64_t N,
                 int64_t C, int64_t D, int64_t ignore_index, double smoothing) {
  if (N * D <= 0) return;
  CeArgs<T> k = {nullptr, const_cast<T *>(lse), dx, x, prob, weight, dloss, target, N, C, D,
                 ignore_index, smoothing, factor, dloss_per_sample};
  launch_per_sample<T, CeBackwardLaunch>(k, false);
}

// ---- NLL ----------------------------------------------------------------------------------

// One thread per sample: loss_i = -weight[t_i] x[i, t_i]; block sums to loss_partials.
template <typename T>
__global__ void nll_forward_kernel(T *loss, const T *x, const int64_t *target, const T *weight,
                                   int64_t N, int64_t C, int64_t D, int64_t ignore_index) {
  double acc = 0;
  const int64_t n_samples = N * D;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_samples;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / D, d = i - n * D, y = target[i];
    T li = 0;
    if (y != ignore_index) li = -(weight ? weight[y] : (T)1) * x[(n * C + y) * D + d];
    if (loss) loss[i] = li;
    acc += (double)li;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) loss_partials[blockIdx.x] = acc;
}

// dx[i, t_i] -= weight[t_i] * factor * dloss_i: each sample owns its own element.
template <typename T>
__global__ void nll_backward_kernel(T *dx, const T *dloss, int dloss_per_sample, double factor,
                                    const int64_t *target, const T *weight, int64_t N, int64_t C,
                                    int64_t D, int64_t ignore_index) {
  const int64_t n_samples = N * D;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_samples;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / D, d = i - n * D, y = target[i];
    if (y == ignore_index) continue;
    const double g = factor * (double)dloss[dloss_per_sample ? i : 0];
    dx[(n * C + y) * D + d] -= (T)((double)(weight ? weight[y] : (T)1) * g);
  }
}

template <typename T>
double nll_forward(T *loss, const T *x, const int64_t *target, const T *weight, int64_t N,
                   int64_t C, int64_t D, int64_t ignore_index) {
  if (N * D <= 0) return 0.0;
  std::lock_guard<std::mutex> guard(loss_total_lock);
  unsigned blocks = forward_blocks(N * D, LOSS_THREADS);
  DDP_CUDA_LAUNCH((nll_forward_kernel<T>), blocks, LOSS_THREADS, 0, ddp_cuda_stream(), loss, x, target,
                  weight, N, C, D, ignore_index);
  return finish_total(blocks);
}

template <typename T>
void nll_backward(T *dx, const T *dloss, int dloss_per_sample, double factor,
                  const int64_t *target, const T *weight, int64_t N, int64_t C, int64_t D,
                  int64_t ignore_index) {
  if (N * D <= 0) return;
  DDP_CUDA_LAUNCH((nll_backward_kernel<T>), ddp_cuda_blocks(N * D), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), dx, dloss, dloss_per_sample, factor, target, weight, N, C, D,
                  ignore_index);
}

// ---- MSE ----------------------------------------------------------------------------------

template <typename T>
__global__ void mse_forward_kernel(T *loss, const T *x, const T *t, int64_t n) {
  double acc = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const T e = x[i] - t[i];
    if (loss) loss[i] = e * e;
    acc += (double)(e * e);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) loss_partials[blockIdx.x] = acc;
}

template <typename T>
__global__ void mse_backward_kernel(T *dx, T *dt, const T *dloss, int dloss_per_element,
                                    double factor, const T *x, const T *t, int64_t n) {
  const T two_f = (T)(2 * factor);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const T v = two_f * (dloss_per_element ? dloss[i] : dloss[0]) * (x[i] - t[i]);
    if (dx) dx[i] += v;
    if (dt) dt[i] -= v;
  }
}

template <typename T> double mse_forward(T *loss, const T *x, const T *t, int64_t n) {
  if (n <= 0) return 0.0;
  std::lock_guard<std::mutex> guard(loss_total_lock);
  // 4 elements per thread at least before another block is added
  unsigned blocks = forward_blocks(n, LOSS_THREADS * 4);
  DDP_CUDA_LAUNCH((mse_forward_kernel<T>), blocks, LOSS_THREADS, 0, ddp_cuda_stream(), loss, x, t, n);
  return finish_total(blocks);
}

template <typename T>
void mse_backward(T *dx, T *dt, const T *dloss, int dloss_per_element, double factor, const T *x,
                  const T *t, int64_t n) {
  if (n <= 0 || (!dx && !dt)) return;
  DDP_CUDA_LAUNCH((mse_backward_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(),
                  dx, dt, dloss, dloss_per_element, factor, x, t, n);
}

} // namespace

// Fill the loss entries of the CUDA kernel table (runtime/backend/kernels.h), for f32 and f64:
// cross_entropy_forward/backward, nll_forward/backward, mse_forward/backward. Pointers
// are device pointers on the current device; the forwards return their total to the host.
extern "C" void ddp_cuda_register_loss(ddp_kernels *k) {
  // Each entry picks the typed function from the dtype (Note [one dispatch path] in
  // runtime/backend/kernels.h); the ops layer has checked the dtype.
  k->cross_entropy_forward = [](int dtype, void *loss, void *lse, const void *x,
                                const int64_t *target, const void *prob, const void *weight,
                                int64_t N, int64_t C, int64_t D, int64_t ignore_index,
                                double smoothing) {
    return dtype == DDP_F64
               ? ce_forward<double>((double *)loss, (double *)lse, (const double *)x, target,
                                    (const double *)prob, (const double *)weight, N, C, D,
                                    ignore_index, smoothing)
               : ce_forward<float>((float *)loss, (float *)lse, (const float *)x, target,
                                   (const float *)prob, (const float *)weight, N, C, D,
                                   ignore_index, smoothing);
  };
  k->cross_entropy_backward =
      [](int dtype, void *dx, const void *dloss, int dloss_per_sample, double factor, const void *x,
         const void *lse, const int64_t *target, const void *prob, const void *weight, int64_t N,
         int64_t C, int64_t D, int64_t ignore_index, double smoothing) {
        if (dtype == DDP_F64)
          ce_backward<double>((double *)dx, (const double *)dloss, dloss_per_sample, factor,
                              (const double *)x, (const double *)lse, target, (const double *)prob,
                              (const double *)weight, N, C, D, ignore_index, smoothing);
        else
          ce_backward<float>((float *)dx, (const float *)dloss, dloss_per_sample, factor,
                             (const float *)x, (const float *)lse, target, (const float *)prob,
                             (const float *)weight, N, C, D, ignore_index, smoothing);
      };
  k->nll_forward = [](int dtype, void *loss, const void *x, const int64_t *target,
                      const void *weight, int64_t N, int64_t C, int64_t D, int64_t ignore_index) {
    return dtype == DDP_F64 ? nll_forward<double>((double *)loss, (const double *)x, target,
                                                  (const double *)weight, N, C, D, ignore_index)
                            : nll_forward<float>((float *)loss, (const float *)x, target,
                                                 (const float *)weight, N, C, D, ignore_index);
  };
  k->nll_backward = [](int dtype, void *dx, const void *dloss, int dloss_per_sample, double factor,
                       const int64_t *target, const void *weight, int64_t N, int64_t C, int64_t D,
                       int64_t ignore_index) {
    if (dtype == DDP_F64)
      nll_backward<double>((double *)dx, (const double *)dloss, dloss_per_sample, factor, target,
                           (const double *)weight, N, C, D, ignore_index);
    else
      nll_backward<float>((float *)dx, (const float *)dloss, dloss_per_sample, factor, target,
                          (const float *)weight, N, C, D, ignore_index);
  };
  k->mse_forward = [](int dtype, void *loss, const void *x, const void *t, int64_t n) {
    return dtype == DDP_F64
               ? mse_forward<double>((double *)loss, (const double *)x, (const double *)t, n)
               : mse_forward<float>((float *)loss, (const float *)x, (const float *)t, n);
  };
  k->mse_backward = [](int dtype, void *dx, void *dt, const void *dloss, int dloss_per_element,
                       double factor, const void *x, const void *t, int64_t n) {
    if (dtype == DDP_F64)
      mse_backward<double>((double *)dx, (double *)dt, (const double *)dloss, dloss_per_element,
                           factor, (const double *)x, (const double *)t, n);
    else
      mse_backward<float>((float *)dx, (float *)dt, (const float *)dloss, dloss_per_element, factor,
                          (const float *)x, (const float *)t, n);
  };
}
