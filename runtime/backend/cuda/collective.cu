// runtime/backend/cuda/collective.cu: the CUDA kernels of the comm layer's arithmetic, the
// table entries reduce_inputs, reduce_inputs_all, scale_into and cast_scale (Note [reduction
// entries] in runtime/backend/kernels.h gives their contracts; the CPU's are in
// runtime/backend/cpu/collective.c).
//
// - reduce_inputs / reduce_inputs_all: the k input pointers (a host array of device
//   pointers, k <= DDP_REDUCE_INPUTS_MAX) are copied into a struct passed to the kernel by
//   value; each thread combines its element over in[0], in[1], ..., in[k-1] in that order,
//   as the CPU does in every lane, so the bits equal the CPU's (a sum, product, min or max
//   of the same values in the same order; no fused multiply-add can form). AVG divides the
//   sum by k.
// - scale_into and cast_scale compute f32, f16 and bf16 in f32 and f64 in f64, and round
//   once per step, as the CPU: a cast from f64 to f16 / bf16 goes through f32, as
//   ddp_store_f64 does.
// Every host entry launches on the current stream of the current device, which is the
// buffers' device: the ops layer gets these entries through ddp_kernels_for(device), which
// makes that device current (Note [current device], runtime/core/device.c); the comm layer
// calls them on its communication stream the same way. Asynchronous; nothing here
// synchronises.
//
// Launches go through DDP_CUDA_LAUNCH (cuda_internal.h), so the file also runs unchanged
// on the host in the emulated device (runtime/backend/sim/cuda_emulation.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_internal.h"

namespace {

void launched(const char *op) {
  cudaError_t err = cudaPeekAtLastError();
  if (err != cudaSuccess) ddp_cuda_fail(err, op, "kernel launch", __FILE__, __LINE__);
}

#define GRID_STRIDE(i, n)                                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
       i += (int64_t)gridDim.x * blockDim.x)

// The k buffers of a reduction, by value.
struct Inputs {
  const void *p[DDP_REDUCE_INPUTS_MAX];
};
struct Buffers {
  void *p[DDP_REDUCE_INPUTS_MAX];
};

// acc op x, x the next input: the CPU's scalar rule (S_SUM ... S_MAX in cpu/collective.c).
template <typename T> __device__ __forceinline__ T combine(int op, T x, T acc) {
  switch (op) {
  case DDP_REDUCE_PRODUCT: return acc * x;
  case DDP_REDUCE_MIN: return x < acc ? x : acc;
  case DDP_REDUCE_MAX: return x > acc ? x : acc;
  default: return acc + x; // SUM, AVG
  }
}

template <typename T, typename P>
__device__ __forceinline__ T reduce_at(const P *in, int k, int64_t j, int op) {
  T acc = ((const T *)in[0])[j];
  for (int r = 1; r < k; r++) acc = combine<T>(op, ((const T *)in[r])[j], acc);
  if (op == DDP_REDUCE_AVG) acc = acc / (T)k;
  return acc;
}

template <typename T>
__global__ void reduce_kernel(T *out, Inputs in, int k, int64_t lo, int64_t n, int op) {
  GRID_STRIDE(i, n) out[i] = reduce_at<T>(in.p, k, lo + i, op);
}

template <typename T>
__global__ void reduce_all_kernel(Buffers buf, int k, int64_t lo, int64_t n, int op) {
  GRID_STRIDE(i, n) {
    T acc = reduce_at<T>(buf.p, k, lo + i, op);
    for (int r = 0; r < k; r++) ((T *)buf.p[r])[lo + i] = acc;
  }
}

void reduce_inputs(int dtype, void *out, const void *const *in, int k, int64_t lo, int64_t n,
                   int op) {
  if (n <= 0 || k < 1 || k > DDP_REDUCE_INPUTS_MAX) return;
  Inputs p;
  for (int r = 0; r < k; r++) p.p[r] = in[r];
  cudaStream_t s = ddp_cuda_stream();
  if (dtype == DDP_F32)
    DDP_CUDA_LAUNCH((reduce_kernel<float>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, s,
                    (float *)out, p, k, lo, n, op);
  else if (dtype == DDP_F64)
    DDP_CUDA_LAUNCH((reduce_kernel<double>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, s,
                    (double *)out, p, k, lo, n, op);
  launched("reduce_inputs");
}

void reduce_inputs_all(int dtype, void *const *buf, int k, int64_t lo, int64_t n, int op) {
  if (n <= 0 || k < 1 || k > DDP_REDUCE_INPUTS_MAX) return;
  Buffers p;
  for (int r = 0; r < k; r++) p.p[r] = buf[r];
  cudaStream_t s = ddp_cuda_stream();
  if (dtype == DDP_F32)
    DDP_CUDA_LAUNCH((reduce_all_kernel<float>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, s, p, k,
                    lo, n, op);
  else if (dtype == DDP_F64)
    DDP_CUDA_LAUNCH((reduce_all_kernel<double>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, s, p, k,
                    lo, n, op);
  launched("reduce_inputs_all");
}

// ---- scale and cast ------------------------------------------------------------------------

// A floating element type: C, its compute type, and its load / store (rounding to nearest
// even when stored).
template <typename T> struct Num;
template <> struct Num<float> {
  typedef float C;
  static __device__ __forceinline__ float load(const float *p) { return *p; }
  static __device__ __forceinline__ void store(float *p, float v) { *p = v; }
};
template <> struct Num<double> {
  typedef double C;
  static __device__ __forceinline__ double load(const double *p) { return *p; }
  static __device__ __forceinline__ void store(double *p, double v) { *p = v; }
};
template <> struct Num<__half> {
  typedef float C;
  static __device__ __forceinline__ float load(const __half *p) {
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
  }
  static __device__ __forceinline__ void store(__half *p, float v) {
    *(unsigned short *)p = __half_as_ushort(__float2half_rn(v));
  }
};
template <> struct Num<__nv_bfloat16> {
  typedef float C;
  static __device__ __forceinline__ float load(const __nv_bfloat16 *p) {
    return __bfloat162float(__ushort_as_bfloat16(*(const unsigned short *)p));
  }
  static __device__ __forceinline__ void store(__nv_bfloat16 *p, float v) {
    *(unsigned short *)p = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

template <typename T>
__global__ void scale_kernel(T *out, const T *x, int64_t n, typename Num<T>::C s, int divide) {
  GRID_STRIDE(i, n) {
    typename Num<T>::C v = Num<T>::load(x + i);
    Num<T>::store(out + i, divide ? v / s : v * s);
  }
}

// out = To(x): through double (exact for every input type), then To's compute type (f32
// for f16 / bf16, as ddp_store_f64), then scaled there when `scaled`.
template <typename To, typename Ti>
__global__ void cast_scale_kernel(To *out, const Ti *x, int64_t n, typename Num<To>::C s,
                                  int divide, int scaled) {
  typedef typename Num<To>::C C;
  GRID_STRIDE(i, n) {
    double v = (double)Num<Ti>::load(x + i);
    Num<To>::store(out + i, (C)v);
    if (scaled) {
      C r = Num<To>::load(out + i);
      Num<To>::store(out + i, divide ? r / s : r * s);
    }
  }
}

// Call f with a null pointer of dtype's element type (F32, F64, F16, BF16); 0 otherwise.
template <typename F> bool with_type(int dtype, F f) {
  switch (dtype) {
  case DDP_F32: f((float *)nullptr); return true;
  case DDP_F64: f((double *)nullptr); return true;
  case DDP_F16: f((__half *)nullptr); return true;
  case DDP_BF16: f((__nv_bfloat16 *)nullptr); return true;
  default: return false;
  }
}

void scale_into(int dtype, void *out, const void *x, int64_t n, double s, int divide) {
  if (n <= 0) return;
  cudaStream_t st = ddp_cuda_stream();
  with_type(dtype, [&](auto *tag) {
    typedef typename std::remove_pointer<decltype(tag)>::type T;
    typedef typename Num<T>::C C;
    DDP_CUDA_LAUNCH((scale_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, st, (T *)out,
                    (const T *)x, n, (C)s, divide);
  });
  launched("scale_into");
}

void cast_scale(int out_dtype, void *out, int in_dtype, const void *x, int64_t n, double s,
                int divide) {
  if (n <= 0) return;
  cudaStream_t st = ddp_cuda_stream();
  int scaled = s != 1.0;
  with_type(out_dtype, [&](auto *otag) {
    typedef typename std::remove_pointer<decltype(otag)>::type To;
    typedef typename Num<To>::C C;
    with_type(in_dtype, [&](auto *itag) {
      typedef typename std::remove_pointer<decltype(itag)>::type Ti;
      DDP_CUDA_LAUNCH((cast_scale_kernel<To, Ti>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, st,
                      (To *)out, (const Ti *)x, n, (C)s, divide, scaled);
    });
  });
  launched("cast_scale");
}

#undef GRID_STRIDE

} // namespace

/* Table entries of the collective area: signatures and contracts of
 * runtime/backend/cpu/collective.h (pointers are device pointers of one device; the
 * reductions' pointer arrays are host arrays). */
extern "C" void ddp_cuda_register_collective(ddp_kernels *k) {
  k->reduce_inputs = reduce_inputs;
  k->reduce_inputs_all = reduce_inputs_all;
  k->scale_into = scale_into;
  k->cast_scale = cast_scale;
}
