// runtime/backend/cuda/optim.cu: the CUDA kernels of the fused optimizer updates (SGD,
// Adam/AdamW with amsgrad, Adadelta) and of gradient clipping (sum of |x|^p, max |x|, scale,
// clamp) and GradScaler's fused inf check and unscale: the entries sgd ..
// non_finite_check_and_unscale of the kernel table.
//
// Semantics are those of runtime/backend/cpu/optim.c line by line (Note [optimizer update
// order] there; the formulas are PyTorch's torch.optim algorithm boxes): each thread takes
// elements i, i + stride, ... of a grid-stride loop and does exactly the CPU's per-element
// work in the buffer's own precision (T = float or double). The hyper-parameter struct is a
// host pointer (the CPU signature): it is read on the host and its values, converted to T
// once as the CPU does, are passed to the kernel by value.
//
// The two reductions (abs_pow_sum, abs_max) return a host double: a first kernel leaves one
// partial per block (each thread accumulates in double, then a shared-memory tree), a second
// kernel of one block combines the partials in a fixed order, and the result is copied back
// and waited for (synchronous, like the CPU's return value). The order of the additions is
// fixed by the launch shape, so a result is reproducible run to run on one GPU; it differs
// from the CPU's sequential sum by rounding only. On a failure (scratch allocation, launch)
// the error is recorded as a DDP error and NaN is returned; callers on devices clear the
// error before the call and look at ddp_last_status() when they see NaN.
//
// The per-element work is the CPU's, but nvcc contracts a * b + c into fused multiply-adds
// (its default, as in PyTorch's kernels), so a GPU's results may differ from the CPU's by
// a rounding.
//
// Every host entry launches on the current stream of the current device, which is the
// buffers' device: the ops layer gets these entries through ddp_kernels_for(device), which
// makes that device current (Note [current device], runtime/core/device.c).
//
// Launches go through DDP_CUDA_LAUNCH (cuda_internal.h), so the file also
// runs unchanged on the host in the emulated device (runtime/backend/sim/cuda_emulation.h).
#include <math.h>

#include "backend/cuda/cuda_internal.h"

extern "C" int ddp_cuda_caching_malloc(void **out, int device, size_t nbytes);
extern "C" void ddp_cuda_caching_free(void *p);

namespace {

// After a launch: turn a launch error into a DDP error (a later ddp_device_check would also
// see it; reporting it here names the kernel).
int launched(const char *op) {
  cudaError_t err = cudaPeekAtLastError();
  if (err != cudaSuccess) return ddp_cuda_fail(err, op, "kernel launch", __FILE__, __LINE__);
  return DDP_OK;
}

__device__ __forceinline__ float dsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double dsqrt(double x) { return sqrt(x); }

#define GRID_STRIDE(i, n)                                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
       i += (int64_t)gridDim.x * blockDim.x)

// ---- SGD ----------------------------------------------------------------------------------

template <typename T> struct SgdArgs {
  T lr, mu, damp, wd, sign;
  int use_wd, use_mom, first, nesterov;
};

template <typename T>
__global__ void sgd_kernel(T *__restrict__ param, T *__restrict__ buf, const T *__restrict__ grad,
                           int64_t n, SgdArgs<T> a) {
  GRID_STRIDE(i, n) {
    T g = a.sign * grad[i];
    if (a.use_wd) g += a.wd * param[i];
    if (a.use_mom) {
      T b = a.first ? g : a.mu * buf[i] + a.damp * g;
      buf[i] = b;
      g = a.nesterov ? g + a.mu * b : b;
    }
    param[i] -= a.lr * g;
  }
}

template <typename T>
void sgd(T *param, T *buf, const T *grad, int64_t n, const ddp_sgd_hparams *h) {
  if (n <= 0) return;
  SgdArgs<T> a;
  a.lr = (T)h->lr;
  a.mu = (T)h->momentum;
  a.damp = (T)(1.0 - h->dampening);
  a.wd = (T)h->weight_decay;
  a.sign = h->maximize ? (T)-1 : (T)1;
  a.use_wd = h->weight_decay != 0;
  a.use_mom = h->momentum != 0 && buf;
  a.first = h->first_step;
  a.nesterov = h->nesterov;
  DDP_CUDA_LAUNCH((sgd_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(), param,
                   buf, grad, n, a);
  launched("sgd_step_");
}

// ---- Adam / AdamW -------------------------------------------------------------------------

template <typename T> struct AdamArgs {
  T b1, b2, eps, one_b1, one_b2, step_size, bc2_sqrt, wd, decay, sign;
  int l2, decoupled, ams;
};

// p -= step_size * m / (sqrt(v) / bc2_sqrt + eps): PyTorch's rearrangement of
// p -= lr * m_hat / (sqrt(v_hat) + eps), as on the CPU.
template <typename T>
__global__ void adam_kernel(T *__restrict__ param, T *__restrict__ m, T *__restrict__ v,
                            T *__restrict__ vmax, const T *__restrict__ grad, int64_t n,
                            AdamArgs<T> a) {
  GRID_STRIDE(i, n) {
    T p = param[i];
    T g = a.sign * grad[i];
    if (a.decoupled) p *= a.decay;
    if (a.l2) g += a.wd * p;
    T mi = a.b1 * m[i] + a.one_b1 * g;
    T vi = a.b2 * v[i] + a.one_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    if (a.ams) {
      T mx = vmax[i];
      vi = (vi > mx || vi != vi) ? vi : mx; // NaN kept, as torch.maximum
      vmax[i] = vi;
    }
    param[i] = p - a.step_size * mi / (dsqrt(vi) / a.bc2_sqrt + a.eps);
  }
}

template <typename T>
void adam(T *param, T *m, T *v, T *vmax, const T *grad, int64_t n, const ddp_adam_hparams *h) {
  if (n <= 0) return;
  AdamArgs<T> a;
  a.b1 = (T)h->beta1;
  a.b2 = (T)h->beta2;
  a.eps = (T)h->eps;
  a.one_b1 = (T)(1.0 - h->beta1);
  a.one_b2 = (T)(1.0 - h->beta2);
  a.step_size = (T)h->step_size;
  a.bc2_sqrt = (T)h->bc2_sqrt;
  a.wd = (T)h->weight_decay;
  a.decay = (T)(1.0 - h->lr * h->weight_decay);
  a.sign = h->maximize ? (T)-1 : (T)1;
  a.l2 = !h->decoupled && h->weight_decay != 0;
  a.decoupled = h->decoupled && h->weight_decay != 0;
  a.ams = h->amsgrad && vmax;
  DDP_CUDA_LAUNCH((adam_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(),
                   param, m, v, vmax, grad, n, a);
  launched("adam_step_");
}

// ---- Adadelta -----------------------------------------------------------------------------

template <typename T> struct AdadeltaArgs {
  T lr, rho, one_rho, eps, wd, sign;
  int use_wd;
};

template <typename T>
__global__ void adadelta_kernel(T *__restrict__ param, T *__restrict__ sq, T *__restrict__ acc,
                                const T *__restrict__ grad, int64_t n, AdadeltaArgs<T> a) {
  GRID_STRIDE(i, n) {
    T g = a.sign * grad[i];
    if (a.use_wd) g += a.wd * param[i];
    T v = a.rho * sq[i] + a.one_rho * g * g;
    T dx = dsqrt(acc[i] + a.eps) / dsqrt(v + a.eps) * g;
    sq[i] = v;
    acc[i] = a.rho * acc[i] + a.one_rho * dx * dx;
    param[i] -= a.lr * dx;
  }
}

template <typename T>
void adadelta(T *param, T *sq, T *acc, const T *grad, int64_t n, const ddp_adadelta_hparams *h) {
  if (n <= 0) return;
  AdadeltaArgs<T> a;
  a.lr = (T)h->lr;
  a.rho = (T)h->rho;
  a.one_rho = (T)(1.0 - h->rho);
  a.eps = (T)h->eps;
  a.wd = (T)h->weight_decay;
  a.sign = h->maximize ? (T)-1 : (T)1;
  a.use_wd = h->weight_decay != 0;
  DDP_CUDA_LAUNCH((adadelta_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(),
                   param, sq, acc, grad, n, a);
  launched("adadelta_step_");
}

// ---- reductions for clipping ----------------------------------------------------------------

// Threads per block of the reductions, and their most blocks (partials).
enum { RED_THREADS = 256, RED_MAX_BLOCKS = 1024 };
enum { MODE_P2, MODE_P1, MODE_POW, MODE_MAX };

// max that keeps NaN (torch.norm(inf) of a tensor holding NaN is NaN).
__device__ __forceinline__ double nan_max(double a, double b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

__device__ __forceinline__ double combine(int mode, double a, double b) {
  return mode == MODE_MAX ? nan_max(a, b) : a + b;
}

// Tree reduction of one value per thread of a block of RED_THREADS; thread 0 gets the total.
__device__ double block_reduce(int mode, double v) {
  __shared__ double s[RED_THREADS];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = RED_THREADS / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) s[threadIdx.x] = combine(mode, s[threadIdx.x], s[threadIdx.x + w]);
    __syncthreads();
  }
  return s[0];
}

// partial[blockIdx.x] <- the block's share of sum |x|^p (or max |x|), in double.
template <typename T>
__global__ void abs_reduce_kernel(double *__restrict__ partial, const T *__restrict__ x,
                                  int64_t n, int mode, double p) {
  double acc = 0;
  GRID_STRIDE(i, n) {
    double a = fabs((double)x[i]);
    switch (mode) {
    case MODE_P2: acc += a * a; break;
    case MODE_P1: acc += a; break;
    case MODE_POW: acc += pow(a, p); break;
    default: acc = nan_max(acc, a); break;
    }
  }
  double total = block_reduce(mode, acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// *out <- the partials (count) combined by one block.
__global__ void combine_kernel(double *__restrict__ out, const double *__restrict__ partial,
                               int count, int mode) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc = combine(mode, acc, partial[i]);
  double total = block_reduce(mode, acc);
  if (threadIdx.x == 0) *out = total;
}

// x lives on the current device (the ops layer made it current); its scratch too.
template <typename T> double abs_reduce(const T *x, int64_t n, int mode, double p, const char *op) {
  if (n <= 0) return 0;
  int64_t b = ((int64_t)n + RED_THREADS - 1) / RED_THREADS;
  int blocks = b > RED_MAX_BLOCKS ? RED_MAX_BLOCKS : (int)b;
  double *scratch = NULL; // partial[blocks], then the total
  if (ddp_cuda_caching_malloc((void **)&scratch, ddp_cuda_device(),
                              sizeof(double) * (size_t)(blocks + 1)))
    return NAN;
  cudaStream_t s = ddp_cuda_stream();
  double result = NAN;
  DDP_CUDA_LAUNCH((abs_reduce_kernel<T>), blocks, RED_THREADS, 0, s, scratch, x, n, mode, p);
  DDP_CUDA_LAUNCH((combine_kernel), 1, RED_THREADS, 0, s, scratch + blocks, scratch, blocks, mode);
  // A launch that failed to start leaves the scratch unwritten and is not reported by the
  // copy: look at it first (and clear it, as the failure is reported here).
  const char *what = "kernel launch";
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    what = "reduction";
    err = cudaMemcpyAsync(&result, scratch + blocks, sizeof result, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) cudaGetLastError();
  }
  ddp_cuda_caching_free(scratch); // stream-ordered: a later owner runs after the copy
  if (err != cudaSuccess) {
    ddp_cuda_fail(err, op, what, __FILE__, __LINE__);
    return NAN;
  }
  return result;
}

template <typename T> double abs_pow_sum(const T *x, int64_t n, double p) {
  int mode = p == 2 ? MODE_P2 : p == 1 ? MODE_P1 : MODE_POW;
  return abs_reduce<T>(x, n, mode, p, "clip_grad_norm_");
}

template <typename T> double abs_max(const T *x, int64_t n) {
  return abs_reduce<T>(x, n, MODE_MAX, 0, "clip_grad_norm_");
}

// ---- scale / clamp ------------------------------------------------------------------------

template <typename T> __global__ void scale_kernel(T *__restrict__ x, int64_t n, T c) {
  GRID_STRIDE(i, n) x[i] *= c;
}

// Comparisons as on the CPU: a NaN fails both and is kept.
template <typename T> __global__ void clamp_kernel(T *__restrict__ x, int64_t n, T lo, T hi) {
  GRID_STRIDE(i, n) {
    T v = x[i];
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    x[i] = v;
  }
}

template <typename T> void scale(T *x, int64_t n, double s) {
  if (n <= 0) return;
  DDP_CUDA_LAUNCH((scale_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(), x,
                   n, (T)s);
  launched("clip_grad_norm_");
}

template <typename T> void clamp(T *x, int64_t n, double lo, double hi) {
  if (n <= 0) return;
  DDP_CUDA_LAUNCH((clamp_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(), x,
                   n, (T)lo, (T)hi);
  launched("clip_grad_value_");
}

// ---- GradScaler's unscale (Note [unscale in one pass], cpu/optim.c) -------------------------

// Every element is multiplied; *found is set to 1 by any thread that saw an inf or NaN (all
// writers store the same value, so no atomic is needed).
template <typename T>
__global__ void unscale_kernel(T *__restrict__ x, int64_t n, T c, int *__restrict__ found) {
  GRID_STRIDE(i, n) {
    T v = x[i];
    if (!isfinite(v)) *found = 1;
    x[i] = v * c;
  }
}

// 1.0 / 0.0 to the host (synchronous, as the CPU's return value), NaN on a failure.
template <typename T> double non_finite_check_and_unscale(T *x, int64_t n, double inv_scale) {
  const char *op = "unscale_";
  if (n <= 0) return 0;
  int *flag = NULL; // device int
  if (ddp_cuda_caching_malloc((void **)&flag, ddp_cuda_device(), sizeof(int))) return NAN;
  cudaStream_t s = ddp_cuda_stream();
  int found = 0;
  const char *what = "flag reset";
  cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(int), s);
  if (err == cudaSuccess) {
    DDP_CUDA_LAUNCH((unscale_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, s, x, n,
                    (T)inv_scale, flag);
    what = "kernel launch";
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    what = "found-inf copy";
    err = cudaMemcpyAsync(&found, flag, sizeof found, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  }
  if (err != cudaSuccess) cudaGetLastError();
  ddp_cuda_caching_free(flag); // stream-ordered: a later owner runs after the copy
  if (err != cudaSuccess) {
    ddp_cuda_fail(err, op, what, __FILE__, __LINE__);
    return NAN;
  }
  return found ? 1.0 : 0.0;
}

#undef GRID_STRIDE

} // namespace

// ---- the table ------------------------------------------------------------------------------

/* Table entries of the optimizer area: signatures and contracts of runtime/backend/cpu/optim.h
 * (buffers are device pointers of one device, contiguous, n elements). */
extern "C" void ddp_cuda_register_optim(ddp_kernels *k) {
  // Each entry picks the typed function from the dtype (Note [one dispatch path] in
  // runtime/backend/kernels.h); the ops layer has checked the dtype.
  k->sgd = [](int dtype, void *param, void *momentum_buffer, const void *grad, int64_t n,
              const ddp_sgd_hparams *h) {
    if (dtype == DDP_F64)
      sgd<double>((double *)param, (double *)momentum_buffer, (const double *)grad, n, h);
    else
      sgd<float>((float *)param, (float *)momentum_buffer, (const float *)grad, n, h);
  };
  k->adam = [](int dtype, void *param, void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
               const void *grad, int64_t n, const ddp_adam_hparams *h) {
    if (dtype == DDP_F64)
      adam<double>((double *)param, (double *)exp_avg, (double *)exp_avg_sq,
                   (double *)max_exp_avg_sq, (const double *)grad, n, h);
    else
      adam<float>((float *)param, (float *)exp_avg, (float *)exp_avg_sq, (float *)max_exp_avg_sq,
                  (const float *)grad, n, h);
  };
  k->adadelta = [](int dtype, void *param, void *square_avg, void *acc_delta, const void *grad,
                   int64_t n, const ddp_adadelta_hparams *h) {
    if (dtype == DDP_F64)
      adadelta<double>((double *)param, (double *)square_avg, (double *)acc_delta,
                       (const double *)grad, n, h);
    else
      adadelta<float>((float *)param, (float *)square_avg, (float *)acc_delta, (const float *)grad,
                      n, h);
  };
  k->abs_pow_sum = [](int dtype, const void *x, int64_t n, double p) {
    return dtype == DDP_F64 ? abs_pow_sum<double>((const double *)x, n, p)
                            : abs_pow_sum<float>((const float *)x, n, p);
  };
  k->abs_max = [](int dtype, const void *x, int64_t n) {
    return dtype == DDP_F64 ? abs_max<double>((const double *)x, n)
                            : abs_max<float>((const float *)x, n);
  };
  k->scale = [](int dtype, void *x, int64_t n, double s) {
    if (dtype == DDP_F64)
      scale<double>((double *)x, n, s);
    else
      scale<float>((float *)x, n, s);
  };
  k->clamp = [](int dtype, void *x, int64_t n, double lo, double hi) {
    if (dtype == DDP_F64)
      clamp<double>((double *)x, n, lo, hi);
    else
      clamp<float>((float *)x, n, lo, hi);
  };
  k->non_finite_check_and_unscale = [](int dtype, void *x, int64_t n, double inv_scale) {
    return dtype == DDP_F64 ? non_finite_check_and_unscale<double>((double *)x, n, inv_scale)
                            : non_finite_check_and_unscale<float>((float *)x, n, inv_scale);
  };
}
