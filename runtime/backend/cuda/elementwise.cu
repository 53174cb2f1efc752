// runtime/backend/cuda/elementwise.cu: the CUDA kernels of the element-wise table entries
// copy, fill, binary, binary_backward, unary, unary_backward and where. Semantics are the
// CPU kernels' (runtime/backend/cpu/elementwise.c, runtime/backend/cpu/copy.c; the ops,
// their NaN rules and the parameters are documented in runtime/backend/cpu/elementwise.h):
//
//  - Operands are ddp_tensor headers over device memory with any strides (0 = broadcast)
//    and any dtypes, all of the output's shape. An input may also be a host scalar: a
//    stride-0 one-element view of host memory whose device is DDP_DEVICE_CPU (the ops
//    layer's scalar operands, Note [header-only views] in runtime/ops/elementwise.c). Its
//    value is read on the host here and passed to the kernel by value, so `t + 2` needs
//    no device tensor for the 2.
//  - Geometry: dimensions are coalesced on the host as ddp_foreach does (size-1 dims
//    dropped, neighbours whose strides chain for every operand merged). One dimension
//    left (contiguous, or one operand a scalar) runs a linear kernel: offset = i * stride;
//    more run an N-d offset calculator (shape and byte strides per operand, innermost
//    first) with 32-bit index arithmetic when the element count allows, 64-bit otherwise.
//    Every kernel is a grid-stride loop over int64 element counts, launched on
//    ddp_cuda_stream(). The entries do not touch the current device: every caller reaches
//    them through ddp_kernels_for(device), which has made the tensors' device current
//    (Note [current device], runtime/core/device.c), so the current stream is that
//    device's. That saves a cudaGetDevice (and a cudaSetDevice pair) per op.
//  - Same-dtype operands take typed paths: f32 and f64 compute in their own type, f16 and
//    bf16 load to f32, compute there and round once when stored; i64/i32 compute natively
//    with wrap-around (unsigned) arithmetic as the CPU does. Contiguous f32 binary and
//    unary ops load and store float4 when the pointers are 16-byte aligned.
//  - Mixed dtypes (and u8, bool, integer division) take the general path, as the CPU's
//    does: each operand is loaded as double and converted to the compute type (f32 when
//    every operand is f32, f16 or bf16; f64 otherwise, and for comparisons), and stored
//    with ddp_store_f64's rules (floating to integer truncates toward zero, NaN gives 0,
//    out-of-range i64 saturates, i32 saturates, u8 wraps modulo 256, bool is v != 0).
//
// Math: the CUDA math library (expf, erff, tanhf, powf, ...; each within a few ulp), where
// the CPU uses its own vectorisable exp/erf for f32: results agree to f32 rounding error,
// not bit for bit. Integer results and comparisons agree exactly.
#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

// Element code is __host__ __device__: the kernels' bodies are plain loops (below). Launches
// go through DDP_CUDA_LAUNCH (cuda_internal.h), so the file also runs unchanged on the host
// in the emulated device (runtime/backend/sim/cuda_emulation.h).
#define HD __host__ __device__ __forceinline__

namespace {

// ---- element types --------------------------------------------------------------------

// Elem<T>: how one element of storage type T is loaded to its compute type and stored
// back. f16 and bf16 are kept as their bit patterns (uint16) in tensors.
template <typename T> struct Elem {
  using C = T;
  static HD C load(const char *p) { return *(const T *)p; }
  static HD void store(char *p, C v) { *(T *)p = v; }
};
template <> struct Elem<__half> {
  using C = float;
  static HD float load(const char *p) {
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
  }
  static HD void store(char *p, float v) {
    *(unsigned short *)p = __half_as_ushort(__float2half_rn(v));
  }
};
template <> struct Elem<__nv_bfloat16> {
  using C = float;
  static HD float load(const char *p) {
    return __bfloat162float(__ushort_as_bfloat16(*(const unsigned short *)p));
  }
  static HD void store(char *p, float v) {
    *(unsigned short *)p = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

// Any dtype as double, as ddp_load_f64 (bool: non-zero is 1).
HD double load_dyn(const char *p, int dtype) {
  switch (dtype) {
  case DDP_F32: return *(const float *)p;
  case DDP_F64: return *(const double *)p;
  case DDP_F16: return __half2float(__ushort_as_half(*(const unsigned short *)p));
  case DDP_BF16: return __bfloat162float(__ushort_as_bfloat16(*(const unsigned short *)p));
  case DDP_I64: return (double)*(const long long *)p;
  case DDP_I32: return *(const int *)p;
  case DDP_U8: return *(const unsigned char *)p;
  case DDP_BOOL: return *(const unsigned char *)p != 0;
  }
  return 0;
}

// double to i64 as the core's to_i64: toward zero, NaN 0, saturating.
HD long long to_i64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (long long)v;
}

// Store double v as `dtype`, as ddp_store_f64 (f16/bf16 round through f32 as it does).
HD void store_dyn(char *p, int dtype, double v) {
  switch (dtype) {
  case DDP_F32: *(float *)p = (float)v; break;
  case DDP_F64: *(double *)p = v; break;
  case DDP_F16: *(unsigned short *)p = __half_as_ushort(__float2half_rn((float)v)); break;
  case DDP_BF16:
    *(unsigned short *)p = __bfloat16_as_ushort(__float2bfloat16_rn((float)v));
    break;
  case DDP_I64: *(long long *)p = to_i64(v); break;
  case DDP_I32: {
    long long i = to_i64(v);
    *(int *)p = (int)(i > INT32_MAX ? INT32_MAX : i < INT32_MIN ? INT32_MIN : i);
    break;
  }
  case DDP_U8: *(unsigned char *)p = (unsigned char)to_i64(v); break;
  case DDP_BOOL: *(unsigned char *)p = v != 0; break;
  }
}

// ---- math in the compute type ----------------------------------------------------------

HD float m_exp(float x) { return expf(x); }
HD double m_exp(double x) { return exp(x); }
HD float m_log(float x) { return logf(x); }
HD double m_log(double x) { return log(x); }
HD float m_sqrt(float x) { return sqrtf(x); }
HD double m_sqrt(double x) { return sqrt(x); }
HD float m_abs(float x) { return fabsf(x); }
HD double m_abs(double x) { return fabs(x); }
HD float m_erf(float x) { return erff(x); }
HD double m_erf(double x) { return erf(x); }
HD float m_tanh(float x) { return tanhf(x); }
HD double m_tanh(double x) { return tanh(x); }
HD float m_pow(float a, float b) { return powf(a, b); }
HD double m_pow(double a, double b) { return pow(a, b); }

// Integer power as the CPU's ipow: wrap-around products; negative exponents give 0 except
// for bases 1 and -1.
HD long long ipow(long long base, long long e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e & 1 ? -1 : 1) : 0;
  unsigned long long r = 1, b = (unsigned long long)base;
  while (e) {
    if (e & 1) r *= b;
    b *= b;
    e >>= 1;
  }
  return (long long)r;
}

constexpr double SQRT1_2 = 0.70710678118654752440, SQRT2_PI = 0.79788456080286535588,
                 INV_SQRT_2PI = 0.39894228040143267794, GELU_C = 0.044715;

// a op b for the arithmetic ops (ADD .. MIN); floating C.
template <typename C>
HD C arith(int op, C a, C b, C alpha) {
  if constexpr (std::is_integral<C>::value) {
    using U = typename std::make_unsigned<C>::type;
    switch (op) {
    case DDP_EW_ADD: return (C)((U)a + (U)alpha * (U)b);
    case DDP_EW_SUB: return (C)((U)a - (U)alpha * (U)b);
    case DDP_EW_MUL: return (C)((U)a * (U)b);
    case DDP_EW_POW: return (C)ipow(a, b);
    case DDP_EW_MAX: return a > b ? a : b;
    case DDP_EW_MIN: return a < b ? a : b;
    }
    return 0; // DIV never comes here (the general path computes it in f64)
  } else {
    switch (op) {
    case DDP_EW_ADD: return a + alpha * b;
    case DDP_EW_SUB: return a - alpha * b;
    case DDP_EW_MUL: return a * b;
    case DDP_EW_DIV: return a / b;
    case DDP_EW_POW: return m_pow(a, b);
    case DDP_EW_MAX: return a != a ? a : (a > b ? a : b); // NaN propagating
    case DDP_EW_MIN: return a != a ? a : (a < b ? a : b);
    }
    return 0;
  }
}

template <typename C> HD bool compare(int op, C a, C b) {
  switch (op) {
  case DDP_EW_EQ: return a == b;
  case DDP_EW_NE: return a != b;
  case DDP_EW_LT: return a < b;
  case DDP_EW_LE: return a <= b;
  case DDP_EW_GT: return a > b;
  case DDP_EW_GE: return a >= b;
  }
  return false;
}

// d/d(a) (wrt 0) or d/d(b) (wrt 1) of a op b, times g (the CPU's bin_bwd_ref).
template <typename C>
HD C binary_grad(int op, int wrt, C g, C a, C b, C alpha) {
  switch (op) {
  case DDP_EW_ADD: return wrt ? alpha * g : g;
  case DDP_EW_SUB: return wrt ? -alpha * g : g;
  case DDP_EW_MUL: return wrt ? g * a : g * b;
  case DDP_EW_DIV: return wrt ? -g * a / (b * b) : g / b;
  case DDP_EW_POW:
    if (!wrt) return b == 0 ? (C)0 : g * b * m_pow(a, b - 1);
    return a == 0 && b >= 0 ? (C)0 : g * m_pow(a, b) * m_log(a);
  case DDP_EW_MAX:
    if (a == b) return (C)0.5 * g;
    return (wrt ? b > a : a > b) ? g : (C)0;
  case DDP_EW_MIN:
    if (a == b) return (C)0.5 * g;
    return (wrt ? b < a : a < b) ? g : (C)0;
  }
  return 0;
}

// f(x) of the unary ops (the CPU's un_ref).
template <typename C> HD C unary_fn(int op, C x, C p0, C p1) {
  switch (op) {
  case DDP_EW_NEG: return -x;
  case DDP_EW_EXP: return m_exp(x);
  case DDP_EW_LOG: return m_log(x);
  case DDP_EW_SQRT: return m_sqrt(x);
  case DDP_EW_RSQRT: return (C)1 / m_sqrt(x);
  case DDP_EW_ABS: return m_abs(x);
  case DDP_EW_CLAMP: {
    C t = x < p0 ? p0 : x;
    return t > p1 ? p1 : t;
  }
  case DDP_EW_RELU: return x < 0 ? (C)0 : x;
  case DDP_EW_LEAKY_RELU: return x > 0 ? x : x * p0;
  case DDP_EW_GELU: return (C)0.5 * x * (1 + m_erf(x * (C)SQRT1_2));
  case DDP_EW_GELU_TANH:
    return (C)0.5 * x * (1 + m_tanh((C)SQRT2_PI * (x + (C)GELU_C * x * x * x)));
  case DDP_EW_TANH: return m_tanh(x);
  case DDP_EW_SIGMOID: return (C)1 / (1 + m_exp(-x));
  case DDP_EW_SILU: return x / (1 + m_exp(-x));
  }
  return 0;
}

// g * f'(.) with s the saved input or output (ddp_ew_unary_uses_output; the CPU's
// un_bwd_ref).
template <typename C> HD C unary_grad(int op, C g, C s, C p0, C p1) {
  switch (op) {
  case DDP_EW_NEG: return -g;
  case DDP_EW_EXP: return g * s;
  case DDP_EW_LOG: return g / s;
  case DDP_EW_SQRT: return g / (2 * s);
  case DDP_EW_RSQRT: return (C)-0.5 * g * s * s * s;
  case DDP_EW_ABS: return s > 0 ? g : s < 0 ? -g : (C)0;
  case DDP_EW_CLAMP: return s >= p0 && s <= p1 ? g : (C)0;
  case DDP_EW_RELU: return s > 0 ? g : (C)0;
  case DDP_EW_LEAKY_RELU: return s > 0 ? g : g * p0;
  case DDP_EW_GELU:
    return g * ((C)0.5 * (1 + m_erf(s * (C)SQRT1_2)) +
                s * (C)INV_SQRT_2PI * m_exp((C)-0.5 * s * s));
  case DDP_EW_GELU_TANH: {
    C t = m_tanh((C)SQRT2_PI * (s + (C)GELU_C * s * s * s));
    return g * ((C)0.5 * (1 + t) +
                (C)0.5 * s * (1 - t * t) * (C)SQRT2_PI * (1 + 3 * (C)GELU_C * s * s));
  }
  case DDP_EW_TANH: return g * (1 - s * s);
  case DDP_EW_SIGMOID: return g * s * (1 - s);
  case DDP_EW_SILU: {
    C sg = (C)1 / (1 + m_exp(-s));
    return g * sg * (1 + s * (1 - sg));
  }
  }
  return 0;
}

// ---- functors: one element, given the operands' element addresses ---------------------
//
// Operand 0 is the output; inputs whose bit is set in `scalar` are host scalars whose
// value is in sv[k] (their pointer is never read).

template <int N, typename C> struct Scalars {
  unsigned scalar;
  C sv[N];
};

template <typename T> struct BinaryTyped {
  using C = typename Elem<T>::C;
  int op;
  C alpha;
  Scalars<3, C> s;
  HD C fwd(C a, C b) const { return arith<C>(op, a, b, alpha); }
  HD void operator()(char *const *p) const {
    C a = s.scalar & 2 ? s.sv[1] : Elem<T>::load(p[1]);
    C b = s.scalar & 4 ? s.sv[2] : Elem<T>::load(p[2]);
    if (op >= DDP_EW_EQ) *(unsigned char *)p[0] = compare<C>(op, a, b);
    else Elem<T>::store(p[0], fwd(a, b));
  }
};

template <typename C> struct BinaryDyn {
  int op, dt[3];
  C alpha;
  Scalars<3, C> s;
  HD void operator()(char *const *p) const {
    C a = s.scalar & 2 ? s.sv[1] : (C)load_dyn(p[1], dt[1]);
    C b = s.scalar & 4 ? s.sv[2] : (C)load_dyn(p[2], dt[2]);
    double r = op >= DDP_EW_EQ ? (double)compare<C>(op, a, b) : (double)arith<C>(op, a, b, alpha);
    store_dyn(p[0], dt[0], r);
  }
};

template <typename T> struct BinaryBwdTyped {
  using C = typename Elem<T>::C;
  int op, wrt;
  C alpha;
  Scalars<4, C> s;
  HD void operator()(char *const *p) const {
    C g = s.scalar & 2 ? s.sv[1] : Elem<T>::load(p[1]);
    C a = s.scalar & 4 ? s.sv[2] : Elem<T>::load(p[2]);
    C b = s.scalar & 8 ? s.sv[3] : Elem<T>::load(p[3]);
    Elem<T>::store(p[0], binary_grad<C>(op, wrt, g, a, b, alpha));
  }
};

template <typename C> struct BinaryBwdDyn {
  int op, wrt, dt[4];
  C alpha;
  Scalars<4, C> s;
  HD void operator()(char *const *p) const {
    C g = s.scalar & 2 ? s.sv[1] : (C)load_dyn(p[1], dt[1]);
    C a = s.scalar & 4 ? s.sv[2] : (C)load_dyn(p[2], dt[2]);
    C b = s.scalar & 8 ? s.sv[3] : (C)load_dyn(p[3], dt[3]);
    store_dyn(p[0], dt[0], (double)binary_grad<C>(op, wrt, g, a, b, alpha));
  }
};

template <typename T> struct UnaryTyped {
  using C = typename Elem<T>::C;
  int op;
  C p0, p1;
  Scalars<2, C> s;
  HD C fwd(C x) const { return unary_fn<C>(op, x, p0, p1); }
  HD void operator()(char *const *p) const {
    C x = s.scalar & 2 ? s.sv[1] : Elem<T>::load(p[1]);
    Elem<T>::store(p[0], fwd(x));
  }
};

template <typename C> struct UnaryDyn {
  int op, dt[2];
  C p0, p1;
  Scalars<2, C> s;
  HD void operator()(char *const *p) const {
    C x = s.scalar & 2 ? s.sv[1] : (C)load_dyn(p[1], dt[1]);
    store_dyn(p[0], dt[0], (double)unary_fn<C>(op, x, p0, p1));
  }
};

template <typename T> struct UnaryBwdTyped {
  using C = typename Elem<T>::C;
  int op;
  C p0, p1;
  Scalars<3, C> s;
  HD void operator()(char *const *p) const {
    C g = s.scalar & 2 ? s.sv[1] : Elem<T>::load(p[1]);
    C v = s.scalar & 4 ? s.sv[2] : Elem<T>::load(p[2]);
    Elem<T>::store(p[0], unary_grad<C>(op, g, v, p0, p1));
  }
};

template <typename C> struct UnaryBwdDyn {
  int op, dt[3];
  C p0, p1;
  Scalars<3, C> s;
  HD void operator()(char *const *p) const {
    C g = s.scalar & 2 ? s.sv[1] : (C)load_dyn(p[1], dt[1]);
    C v = s.scalar & 4 ? s.sv[2] : (C)load_dyn(p[2], dt[2]);
    store_dyn(p[0], dt[0], (double)unary_grad<C>(op, g, v, p0, p1));
  }
};

// where with one dtype everywhere: a selection of U-sized bit patterns.
template <typename U> struct WhereBits {
  Scalars<4, U> s;
  HD void operator()(char *const *p) const {
    bool c = s.scalar & 2 ? s.sv[1] != 0 : *(const unsigned char *)p[1] != 0;
    if (c) *(U *)p[0] = s.scalar & 4 ? s.sv[2] : *(const U *)p[2];
    else *(U *)p[0] = s.scalar & 8 ? s.sv[3] : *(const U *)p[3];
  }
};

struct WhereDyn {
  int dt[4];
  Scalars<4, double> s;
  HD void operator()(char *const *p) const {
    bool c = s.scalar & 2 ? s.sv[1] != 0 : *(const unsigned char *)p[1] != 0;
    double v = c ? (s.scalar & 4 ? s.sv[2] : load_dyn(p[2], dt[2]))
                 : (s.scalar & 8 ? s.sv[3] : load_dyn(p[3], dt[3]));
    store_dyn(p[0], dt[0], v);
  }
};

template <typename U> struct CopyBits {
  Scalars<2, U> s;
  HD void operator()(char *const *p) const {
    *(U *)p[0] = s.scalar & 2 ? s.sv[1] : *(const U *)p[1];
  }
};

struct CopyDyn {
  int dt[2];
  Scalars<2, double> s;
  HD void operator()(char *const *p) const {
    store_dyn(p[0], dt[0], s.scalar & 2 ? s.sv[1] : load_dyn(p[1], dt[1]));
  }
};

template <typename U> struct FillBits {
  U value;
  HD void operator()(char *const *p) const { *(U *)p[0] = value; }
};

// ---- geometry ----------------------------------------------------------------------------

// Coalesced iteration space of N operands: ndim >= 1 dims, innermost first, byte strides.
template <int N> struct Geometry {
  int ndim;
  int64_t shape[DDP_MAX_DIMS];
  int64_t stride[DDP_MAX_DIMS][N];
};

template <int N> struct Bases {
  char *p[N];
};

template <int N> struct Plan {
  int64_t numel;
  Bases<N> base;
  Geometry<N> geo;
  unsigned scalar; // bit k: operand k is a host scalar
};

// Linear loop: one dimension; operand k's element i is at base[k] + i * stride[k].
// Elements start, start + step, ... below n (a kernel passes its grid-stride position).
template <int N, typename F>
HD void linear_loop(int64_t n, const Bases<N> &base, const Geometry<N> &geo, const F &f,
                    int64_t start, int64_t step) {
  for (int64_t i = start; i < n; i += step) {
    char *p[N];
#pragma unroll
    for (int k = 0; k < N; k++) p[k] = base.p[k] + i * geo.stride[0][k];
    f(p);
  }
}

// N-d loop: the linear index is split into coordinates, innermost first (Index is
// uint32_t when numel + the grid fits in 32 bits, which makes the divisions cheap).
template <int N, typename Index, typename F>
HD void strided_loop(Index n, const Bases<N> &base, const Geometry<N> &geo, const F &f,
                     Index start, Index step) {
  for (Index i = start; i < n; i += step) {
    char *p[N];
#pragma unroll
    for (int k = 0; k < N; k++) p[k] = base.p[k];
    Index r = i;
    int last = geo.ndim - 1;
#pragma unroll
    for (int d = 0; d < DDP_MAX_DIMS; d++) {
      if (d >= last) break;
      Index size = (Index)geo.shape[d];
      Index q = r / size;
      int64_t idx = (int64_t)(r - q * size);
      r = q;
#pragma unroll
      for (int k = 0; k < N; k++) p[k] += idx * geo.stride[d][k];
    }
#pragma unroll
    for (int k = 0; k < N; k++) p[k] += (int64_t)r * geo.stride[last][k]; // outermost
    f(p);
  }
}

template <int N, typename F>
__global__ void __launch_bounds__(DDP_CUDA_THREADS)
    ew_linear(int64_t n, Bases<N> base, Geometry<N> geo, F f) {
  linear_loop(n, base, geo, f, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
              (int64_t)gridDim.x * blockDim.x);
}

template <int N, typename Index, typename F>
__global__ void __launch_bounds__(DDP_CUDA_THREADS)
    ew_strided(Index n, Bases<N> base, Geometry<N> geo, F f) {
  strided_loop<N, Index>(n, base, geo, f, (Index)blockIdx.x * blockDim.x + threadIdx.x,
                         (Index)gridDim.x * blockDim.x);
}

// A failure found on the host by an entry (they return void): deferred for the ops
// layer's ddp_device_check, which reports it as "<op>: <message>" (Note [deferred errors],
// cuda_internal.h); a DDP_FAIL here would be lost, the op returning success over an
// unwritten output.
#define EW_FAIL(status, ...)                                                               \
  do {                                                                                     \
    ddp_cuda_defer_error((status), __VA_ARGS__);                                           \
    return (status);                                                                       \
  } while (0)

// Is t a host scalar (see the header)? Then its one value is read on the host.
bool host_scalar(const ddp_tensor *t) { return t->device == DDP_DEVICE_CPU; }

// The plan of N operands of ops[0]'s shape (ops[0] is the output, never a host scalar).
// Fails (recording the error) for a host operand that is not a one-element broadcast.
template <int N> int make_plan(Plan<N> *p, ddp_tensor *const *ops, const char *op) {
  const ddp_tensor *out = ops[0];
  p->numel = 1;
  for (int d = 0; d < out->ndim; d++) p->numel *= out->shape[d];
  p->scalar = 0;
  for (int k = 0; k < N; k++) {
    if (k > 0 && host_scalar(ops[k])) {
      for (int d = 0; d < ops[k]->ndim; d++)
        if (ops[k]->strides[d] != 0 && ops[k]->shape[d] > 1)
          EW_FAIL(DDP_ERR_ARG, "%s kernel: operand %d is in host memory but the output is on "
                  "%s (only one-element scalars may be)", op, k, ddp_device_str(out->device));
      p->scalar |= 1u << k;
      p->base.p[k] = nullptr;
    } else {
      p->base.p[k] = ddp_data(ops[k]);
    }
  }
  // outermost first, as ddp_foreach: drop size-1 dims, merge chaining neighbours
  int64_t shape[DDP_MAX_DIMS], stride[DDP_MAX_DIMS][N];
  int nd = 0;
  for (int d = 0; d < out->ndim; d++) {
    if (out->shape[d] == 1) continue;
    int64_t s[N];
    for (int k = 0; k < N; k++)
      s[k] = p->scalar >> k & 1 ? 0 : ops[k]->strides[d] * (int64_t)ddp_dtype_size(ops[k]->dtype);
    if (nd > 0) {
      bool merge = true;
      for (int k = 0; k < N; k++)
        if (stride[nd - 1][k] != out->shape[d] * s[k]) merge = false;
      if (merge) {
        shape[nd - 1] *= out->shape[d];
        for (int k = 0; k < N; k++) stride[nd - 1][k] = s[k];
        continue;
      }
    }
    shape[nd] = out->shape[d];
    for (int k = 0; k < N; k++) stride[nd][k] = s[k];
    nd++;
  }
  if (nd == 0) { // one element
    shape[0] = 1;
    for (int k = 0; k < N; k++) stride[0][k] = 0;
    nd = 1;
  }
  p->geo.ndim = nd;
  for (int d = 0; d < nd; d++) { // innermost first
    p->geo.shape[d] = shape[nd - 1 - d];
    for (int k = 0; k < N; k++) p->geo.stride[d][k] = stride[nd - 1 - d][k];
  }
  return DDP_OK;
}

template <int N, typename F> void launch(const Plan<N> &p, const F &f) {
  if (p.numel == 0) return;
  unsigned blocks = ddp_cuda_blocks(p.numel);
  bool narrow = p.numel + (int64_t)blocks * DDP_CUDA_THREADS <= (int64_t)UINT32_MAX;
  cudaStream_t stream = ddp_cuda_stream();
  if (p.geo.ndim == 1) {
    DDP_CUDA_LAUNCH((ew_linear<N, F>), blocks, DDP_CUDA_THREADS, 0, stream, p.numel, p.base,
                    p.geo, f);
  } else if (narrow) {
    DDP_CUDA_LAUNCH((ew_strided<N, uint32_t, F>), blocks, DDP_CUDA_THREADS, 0, stream,
                    (uint32_t)p.numel, p.base, p.geo, f);
  } else {
    DDP_CUDA_LAUNCH((ew_strided<N, int64_t, F>), blocks, DDP_CUDA_THREADS, 0, stream, p.numel,
                    p.base, p.geo, f);
  }
}

// ---- host-side values of scalars and parameters --------------------------------------

// The host scalar t's value in compute type C (integers exactly, others through double).
template <typename C> C scalar_value(const ddp_tensor *t) {
  const char *p = ddp_data(t);
  if constexpr (std::is_integral<C>::value) {
    switch (t->dtype) {
    case DDP_I64: return (C) * (const int64_t *)p;
    case DDP_I32: return (C) * (const int32_t *)p;
    case DDP_U8: return (C) * (const uint8_t *)p;
    case DDP_BOOL: return (C)(*(const uint8_t *)p != 0);
    }
    double v = ddp_load_f64(p, t->dtype);
    return v != v ? (C)0 : (C)v;
  } else {
    return (C)ddp_load_f64(p, t->dtype);
  }
}

template <int N, typename C> Scalars<N, C> scalars(const Plan<N> &p, ddp_tensor *const *ops) {
  Scalars<N, C> s{};
  s.scalar = p.scalar;
  for (int k = 1; k < N; k++)
    if (p.scalar >> k & 1) s.sv[k] = scalar_value<C>(ops[k]);
  return s;
}

// The scalar's raw bits as U (same-dtype paths, where sizeof(U) is its dtype's size; a
// smaller scalar, as a bool condition, lands in the low bytes of a zero U).
template <int N, typename U> Scalars<N, U> scalar_bits(const Plan<N> &p, ddp_tensor *const *ops) {
  Scalars<N, U> s{};
  s.scalar = p.scalar;
  for (int k = 1; k < N; k++)
    if (p.scalar >> k & 1) {
      size_t es = ddp_dtype_size(ops[k]->dtype);
      memcpy(&s.sv[k], ddp_data(ops[k]), es < sizeof(U) ? es : sizeof(U));
    }
  return s;
}

// Do all of ops[first..N) (tensors of dtype `dt`, or host scalars compatible with it: a
// floating scalar with a floating dt, any integer scalar) share dtype dt?
template <int N> bool same_dtype(ddp_tensor *const *ops, int first, int dt, unsigned scalar) {
  for (int k = first; k < N; k++) {
    int d = ops[k]->dtype;
    if (scalar >> k & 1) {
      if (ddp_dtype_is_floating(d) && !ddp_dtype_is_floating(dt)) return false;
    } else if (d != dt) {
      return false;
    }
  }
  return true;
}

// Compute type of the general path: f32 when every operand (output included, host scalars
// not) is f32, f16 or bf16 (mixed floating types); f64 otherwise, as the CPU's general path,
// so results with integer or f64 operands agree with it exactly.
template <int N> bool general_in_f64(ddp_tensor *const *ops, unsigned scalar) {
  for (int k = 0; k < N; k++) {
    if (scalar >> k & 1) continue;
    int d = ops[k]->dtype;
    if (d != DDP_F32 && d != DDP_F16 && d != DDP_BF16) return true;
  }
  return false;
}

// ---- vectorised contiguous f32 --------------------------------------------------------

// out[i] = f.fwd(a[i], b[i]) for contiguous f32 (an input may be a host scalar, its
// pointer then unused); four elements per float4 from `start` by `step`, then the n % 4
// tail the same way.
template <typename F>
HD void binary_f32_vec4_loop(int64_t n, float *out, const float *a, const float *b, const F &f,
                             int64_t start, int64_t step) {
  int64_t n4 = n / 4;
  bool sa = f.s.scalar & 2, sb = f.s.scalar & 4;
  for (int64_t j = start; j < n4; j += step) {
    float4 x = sa ? make_float4(f.s.sv[1], f.s.sv[1], f.s.sv[1], f.s.sv[1])
                  : reinterpret_cast<const float4 *>(a)[j];
    float4 y = sb ? make_float4(f.s.sv[2], f.s.sv[2], f.s.sv[2], f.s.sv[2])
                  : reinterpret_cast<const float4 *>(b)[j];
    float4 r;
    r.x = f.fwd(x.x, y.x);
    r.y = f.fwd(x.y, y.y);
    r.z = f.fwd(x.z, y.z);
    r.w = f.fwd(x.w, y.w);
    reinterpret_cast<float4 *>(out)[j] = r;
  }
  for (int64_t i = n4 * 4 + start; i < n; i += step)
    out[i] = f.fwd(sa ? f.s.sv[1] : a[i], sb ? f.s.sv[2] : b[i]);
}

template <typename F>
HD void unary_f32_vec4_loop(int64_t n, float *out, const float *x, const F &f, int64_t start,
                            int64_t step) {
  int64_t n4 = n / 4;
  for (int64_t j = start; j < n4; j += step) {
    float4 v = reinterpret_cast<const float4 *>(x)[j];
    float4 r;
    r.x = f.fwd(v.x);
    r.y = f.fwd(v.y);
    r.z = f.fwd(v.z);
    r.w = f.fwd(v.w);
    reinterpret_cast<float4 *>(out)[j] = r;
  }
  for (int64_t i = n4 * 4 + start; i < n; i += step) out[i] = f.fwd(x[i]);
}

template <typename F>
__global__ void __launch_bounds__(DDP_CUDA_THREADS)
    binary_f32_vec4(int64_t n, float *out, const float *a, const float *b, F f) {
  binary_f32_vec4_loop(n, out, a, b, f, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
                       (int64_t)gridDim.x * blockDim.x);
}

template <typename F>
__global__ void __launch_bounds__(DDP_CUDA_THREADS)
    unary_f32_vec4(int64_t n, float *out, const float *x, F f) {
  unary_f32_vec4_loop(n, out, x, f, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
                      (int64_t)gridDim.x * blockDim.x);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Is the plan one contiguous f32 run for every operand that is not a host scalar, with
// every such pointer 16-byte aligned?
template <int N> bool f32_vec4_ok(const Plan<N> &p) {
  if (p.geo.ndim != 1) return false;
  for (int k = 0; k < N; k++) {
    if (p.scalar >> k & 1) continue;
    if (p.geo.stride[0][k] != 4 || !aligned16(p.base.p[k])) return false;
  }
  return true;
}

unsigned vec4_blocks(int64_t n) { return ddp_cuda_blocks(n / 4 > 0 ? n / 4 : 1); }

template <typename F> void launch_binary_f32_vec4(const Plan<3> &p, const F &f) {
  float *o = (float *)p.base.p[0];
  const float *a = (const float *)p.base.p[1], *b = (const float *)p.base.p[2];
  DDP_CUDA_LAUNCH((binary_f32_vec4<F>), vec4_blocks(p.numel), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), p.numel, o, a, b, f);
}

template <typename F> void launch_unary_f32_vec4(const Plan<2> &p, const F &f) {
  float *o = (float *)p.base.p[0];
  const float *x = (const float *)p.base.p[1];
  DDP_CUDA_LAUNCH((unary_f32_vec4<F>), vec4_blocks(p.numel), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), p.numel, o, x, f);
}

// Contiguous bytes: a copy and a fill on the current stream. A failure of either call
// stays pending in the runtime (cudaGetLastError) for the ops layer's ddp_device_check,
// like a failed launch.
void copy_bytes(void *dst, const void *src, size_t n) {
  cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ddp_cuda_stream());
}

void set_bytes(void *dst, int byte, size_t n) {
  cudaMemsetAsync(dst, byte, n, ddp_cuda_stream());
}

} // namespace

// ---- table entries ------------------------------------------------------------------------

// dst = src, converting dtypes (ddp_cpu_copy, runtime/backend/cpu/copy.h). dst: (*) on the
// device, any strides; src: a view of dst's shape on the same device (stride 0 where
// broadcast) or a host scalar; any dtypes. A contiguous same-dtype copy is one
// cudaMemcpyAsync; other same-dtype copies move bit patterns; conversions go through
// double with ddp_store_f64's rules.
static void cuda_copy(ddp_tensor *dst, const ddp_tensor *src) {
  ddp_tensor *ops[2] = {dst, (ddp_tensor *)src};
  Plan<2> p;
  if (make_plan(&p, ops, "copy") || p.numel == 0) return;
  if (src->dtype == dst->dtype) {
    size_t es = ddp_dtype_size(dst->dtype);
    if (!p.scalar && p.geo.ndim == 1 && p.geo.stride[0][0] == (int64_t)es &&
        p.geo.stride[0][1] == (int64_t)es) {
      // A copy onto itself (two headers over the same memory: the ops layer compares
      // tensors, not addresses) is a no-op; cudaMemcpy's areas must not overlap.
      if (p.base.p[0] != p.base.p[1]) copy_bytes(p.base.p[0], p.base.p[1], (size_t)p.numel * es);
      return;
    }
    switch (es) {
    case 8: launch(p, CopyBits<uint64_t>{scalar_bits<2, uint64_t>(p, ops)}); return;
    case 4: launch(p, CopyBits<uint32_t>{scalar_bits<2, uint32_t>(p, ops)}); return;
    case 2: launch(p, CopyBits<uint16_t>{scalar_bits<2, uint16_t>(p, ops)}); return;
    default: launch(p, CopyBits<uint8_t>{scalar_bits<2, uint8_t>(p, ops)}); return;
    }
  }
  launch(p, CopyDyn{{dst->dtype, src->dtype}, scalars<2, double>(p, ops)});
}

// Every element of t = value, converted to t's dtype on the host by ddp_store_f64 (so the
// bits are the CPU's; ddp_cpu_fill). A contiguous fill whose bytes are all equal (zero,
// most often) is one cudaMemsetAsync.
static void cuda_fill(ddp_tensor *t, double value) {
  Plan<1> p;
  if (make_plan(&p, &t, "fill") || p.numel == 0) return;
  size_t es = ddp_dtype_size(t->dtype);
  unsigned char bits[8] = {0};
  ddp_store_f64(bits, t->dtype, value);
  bool uniform = true;
  for (size_t i = 1; i < es; i++) uniform = uniform && bits[i] == bits[0];
  if (uniform && p.geo.ndim == 1 && p.geo.stride[0][0] == (int64_t)es) {
    set_bytes(p.base.p[0], bits[0], (size_t)p.numel * es);
    return;
  }
  switch (es) {
  case 8: { uint64_t v; memcpy(&v, bits, 8); launch(p, FillBits<uint64_t>{v}); return; }
  case 4: { uint32_t v; memcpy(&v, bits, 4); launch(p, FillBits<uint32_t>{v}); return; }
  case 2: { uint16_t v; memcpy(&v, bits, 2); launch(p, FillBits<uint16_t>{v}); return; }
  default: launch(p, FillBits<uint8_t>{bits[0]}); return;
  }
}

namespace {
template <typename T> void binary_typed(const Plan<3> &p, ddp_tensor *const *ops, int op,
                                        double alpha) {
  using C = typename Elem<T>::C;
  BinaryTyped<T> f{op, (C)alpha, scalars<3, C>(p, ops)};
  launch(p, f);
}
} // namespace

// out = a op b (ddp_cpu_binary, runtime/backend/cpu/elementwise.h): op in enum
// ddp_ew_binary; comparisons write 0/1 into out (bool); add/sub scale b by alpha. out: (*)
// on the device, any dtype; a, b: views of out's shape on its device, or host scalars;
// out may be a (in place). Same-dtype f32/f64/f16/bf16/i64/i32 operands take typed kernels
// (contiguous f32 vectorised), integer division and everything else the general path.
static void cuda_binary(ddp_tensor *out, ddp_tensor *a, ddp_tensor *b, int op, double alpha) {
  ddp_tensor *ops[3] = {out, a, b};
  Plan<3> p;
  if (make_plan(&p, ops, "binary") || p.numel == 0) return;
  bool cmp = op >= DDP_EW_EQ;
  int dt = p.scalar & 2 ? b->dtype : a->dtype;
  bool same = same_dtype<3>(ops, 1, dt, p.scalar) && (cmp ? out->dtype == DDP_BOOL : out->dtype == dt);
  if (same && (p.scalar & 6) == 6) same = false; // two scalars: the general path
  if (same) {
    switch (dt) {
    case DDP_F32: {
      BinaryTyped<float> f{op, (float)alpha, scalars<3, float>(p, ops)};
      if (!cmp && f32_vec4_ok(p)) launch_binary_f32_vec4(p, f);
      else launch(p, f);
      return;
    }
    case DDP_F64: binary_typed<double>(p, ops, op, alpha); return;
    case DDP_F16: binary_typed<__half>(p, ops, op, alpha); return;
    case DDP_BF16: binary_typed<__nv_bfloat16>(p, ops, op, alpha); return;
    case DDP_I64:
      if (op != DDP_EW_DIV) {
        BinaryTyped<long long> f{op, (long long)alpha, scalars<3, long long>(p, ops)};
        launch(p, f);
        return;
      }
      break;
    case DDP_I32:
      if (op != DDP_EW_DIV) {
        BinaryTyped<int> f{op, (int)alpha, scalars<3, int>(p, ops)};
        launch(p, f);
        return;
      }
      break;
    }
  }
  if (cmp || general_in_f64<3>(ops, p.scalar)) {
    launch(p, BinaryDyn<double>{op, {out->dtype, a->dtype, b->dtype}, alpha,
                                scalars<3, double>(p, ops)});
  } else {
    launch(p, BinaryDyn<float>{op, {out->dtype, a->dtype, b->dtype}, (float)alpha,
                               scalars<3, float>(p, ops)});
  }
}

// d = g * d(a op b)/d(a) (wrt 0) or d/d(b) (wrt 1) for op ADD .. MIN
// (ddp_cpu_binary_backward): d: (*) on the device, written; g, a, b: views of d's shape or
// host scalars. Gradients of pow and maximum/minimum as the CPU (PyTorch's
// derivatives.yaml). Same floating dtype everywhere: typed; otherwise the general path.
static void cuda_binary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b,
                                 int op, int wrt, double alpha) {
  ddp_tensor *ops[4] = {d, g, a, b};
  Plan<4> p;
  if (make_plan(&p, ops, "binary_backward") || p.numel == 0) return;
  int dt = d->dtype;
  if (ddp_dtype_is_floating(dt) && same_dtype<4>(ops, 1, dt, p.scalar)) {
    switch (dt) {
    case DDP_F32: launch(p, BinaryBwdTyped<float>{op, wrt, (float)alpha, scalars<4, float>(p, ops)}); return;
    case DDP_F64: launch(p, BinaryBwdTyped<double>{op, wrt, alpha, scalars<4, double>(p, ops)}); return;
    case DDP_F16: launch(p, BinaryBwdTyped<__half>{op, wrt, (float)alpha, scalars<4, float>(p, ops)}); return;
    case DDP_BF16:
      launch(p, BinaryBwdTyped<__nv_bfloat16>{op, wrt, (float)alpha, scalars<4, float>(p, ops)});
      return;
    }
  }
  int dts[4] = {d->dtype, g->dtype, a->dtype, b->dtype};
  if (general_in_f64<4>(ops, p.scalar))
    launch(p, BinaryBwdDyn<double>{op, wrt, {dts[0], dts[1], dts[2], dts[3]}, alpha,
                                   scalars<4, double>(p, ops)});
  else
    launch(p, BinaryBwdDyn<float>{op, wrt, {dts[0], dts[1], dts[2], dts[3]}, (float)alpha,
                                  scalars<4, float>(p, ops)});
}

// out = f(x) (ddp_cpu_unary): op in enum ddp_ew_unary with parameters p0, p1 (clamp's
// bounds, leaky_relu's slope). out: (*) on the device; x: (*) (out may be x). Same
// floating dtype: typed (contiguous f32 vectorised); integers and mixed dtypes: the
// general path.
static void cuda_unary(ddp_tensor *out, ddp_tensor *x, int op, double p0, double p1) {
  ddp_tensor *ops[2] = {out, x};
  Plan<2> p;
  if (make_plan(&p, ops, "unary") || p.numel == 0) return;
  if (out->dtype == x->dtype && !p.scalar) {
    switch (out->dtype) {
    case DDP_F32: {
      UnaryTyped<float> f{op, (float)p0, (float)p1, scalars<2, float>(p, ops)};
      if (f32_vec4_ok(p)) launch_unary_f32_vec4(p, f);
      else launch(p, f);
      return;
    }
    case DDP_F64: launch(p, UnaryTyped<double>{op, p0, p1, scalars<2, double>(p, ops)}); return;
    case DDP_F16: launch(p, UnaryTyped<__half>{op, (float)p0, (float)p1, scalars<2, float>(p, ops)}); return;
    case DDP_BF16:
      launch(p, UnaryTyped<__nv_bfloat16>{op, (float)p0, (float)p1, scalars<2, float>(p, ops)});
      return;
    }
  }
  if (general_in_f64<2>(ops, p.scalar))
    launch(p, UnaryDyn<double>{op, {out->dtype, x->dtype}, p0, p1, scalars<2, double>(p, ops)});
  else
    launch(p, UnaryDyn<float>{op, {out->dtype, x->dtype}, (float)p0, (float)p1,
                              scalars<2, float>(p, ops)});
}

// d = g * f'(s) (ddp_cpu_unary_backward), s the saved input or output as
// ddp_ew_unary_uses_output says. d: (*) on the device, written; g, s: (*).
static void cuda_unary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *s, int op, double p0,
                                double p1) {
  ddp_tensor *ops[3] = {d, g, s};
  Plan<3> p;
  if (make_plan(&p, ops, "unary_backward") || p.numel == 0) return;
  int dt = d->dtype;
  if (ddp_dtype_is_floating(dt) && same_dtype<3>(ops, 1, dt, p.scalar)) {
    switch (dt) {
    case DDP_F32: launch(p, UnaryBwdTyped<float>{op, (float)p0, (float)p1, scalars<3, float>(p, ops)}); return;
    case DDP_F64: launch(p, UnaryBwdTyped<double>{op, p0, p1, scalars<3, double>(p, ops)}); return;
    case DDP_F16: launch(p, UnaryBwdTyped<__half>{op, (float)p0, (float)p1, scalars<3, float>(p, ops)}); return;
    case DDP_BF16:
      launch(p, UnaryBwdTyped<__nv_bfloat16>{op, (float)p0, (float)p1, scalars<3, float>(p, ops)});
      return;
    }
  }
  if (general_in_f64<3>(ops, p.scalar))
    launch(p, UnaryBwdDyn<double>{op, {d->dtype, g->dtype, s->dtype}, p0, p1,
                                  scalars<3, double>(p, ops)});
  else
    launch(p, UnaryBwdDyn<float>{op, {d->dtype, g->dtype, s->dtype}, (float)p0, (float)p1,
                                 scalars<3, float>(p, ops)});
}

// out = cond ? a : b (ddp_cpu_where). out: (*) on the device; cond: (*) bool/u8 view
// (non-zero bytes are true); a, b: views or host scalars, any dtypes. One dtype
// everywhere: a selection of bit patterns; otherwise through double (ddp_store_f64 rules).
static void cuda_where(ddp_tensor *out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b) {
  ddp_tensor *ops[4] = {out, cond, a, b};
  Plan<4> p;
  if (make_plan(&p, ops, "where") || p.numel == 0) return;
  if (a->dtype == out->dtype && b->dtype == out->dtype) {
    switch (ddp_dtype_size(out->dtype)) {
    case 8: launch(p, WhereBits<uint64_t>{scalar_bits<4, uint64_t>(p, ops)}); return;
    case 4: launch(p, WhereBits<uint32_t>{scalar_bits<4, uint32_t>(p, ops)}); return;
    case 2: launch(p, WhereBits<uint16_t>{scalar_bits<4, uint16_t>(p, ops)}); return;
    default: launch(p, WhereBits<uint8_t>{scalar_bits<4, uint8_t>(p, ops)}); return;
    }
  }
  launch(p, WhereDyn{{out->dtype, cond->dtype, a->dtype, b->dtype}, scalars<4, double>(p, ops)});
}

// Registers the element-wise entries in the CUDA kernel table (runtime/backend/cuda/kernels.cu).
extern "C" void ddp_cuda_register_elementwise(ddp_kernels *k) {
  k->copy = cuda_copy;
  k->fill = cuda_fill;
  k->binary = cuda_binary;
  k->binary_backward = cuda_binary_backward;
  k->unary = cuda_unary;
  k->unary_backward = cuda_unary_backward;
  k->where = cuda_where;
}
