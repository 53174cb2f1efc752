// runtime/backend/cuda/shape.cu: the CUDA kernels of the shape and indexing ops: copy_rows
// (cat's fast path), index_select, index_add (its backward), gather and scatter_add (the
// table entries of runtime/backend/cpu/shape.h, same signatures and semantics).
//
// - Copies move raw elements: copy_rows picks the widest unit (16, 8, 4, 2 or 1 bytes) that
//   divides every pointer, row length and offset; index_select and gather move elements of
//   esize bytes as unsigned integers of that size (values are never looked at).
// - index_add and scatter_add may hit one destination from several threads (repeated index
//   values), so they add with atomics: atomicAdd for f32, f64, i64 (as unsigned, which
//   wraps like the CPU's two's complement), i32, f16 (__half, sm_70+) and bf16
//   (__nv_bfloat16, sm_80+); u8 through a compare-and-swap on its aligned 32-bit word
//   (wrapping modulo 256 like the CPU); bool stores 1 wherever a non-zero value is added
//   (every writer writes the same byte). The order of the additions is not fixed, so float
//   results may differ from the CPU's serial order by rounding, as PyTorch's do.
// - The stride and shape arrays of gather/scatter_add are host arrays (the CPU signature):
//   they are copied into a struct passed to the kernel by value.
// - Index values are not checked here: the ops layer (runtime/ops/shape.c) checks them on
//   the host before calling, as it does for the CPU.
// Every host entry launches on the current stream of the current device, which is the
// tensors' device: the ops layer gets these entries through ddp_kernels_for(device), which
// makes that device current (Note [current device], runtime/core/device.c). Asynchronous;
// nothing here synchronises.
//
// Launches go through DDP_CUDA_LAUNCH (cuda_internal.h), so the file also
// runs unchanged on the host in the emulated device (runtime/backend/sim/cuda_emulation.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_internal.h"

namespace {

void launched(const char *op) {
  cudaError_t err = cudaPeekAtLastError();
  if (err != cudaSuccess) ddp_cuda_fail(err, op, "kernel launch", __FILE__, __LINE__);
}

#define GRID_STRIDE(i, n)                                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
       i += (int64_t)gridDim.x * blockDim.x)

// An unsigned integer type of `bytes` bytes for moving elements; 16 bytes as uint4.
template <int bytes> struct Unit;
template <> struct Unit<1> { typedef uint8_t type; };
template <> struct Unit<2> { typedef uint16_t type; };
template <> struct Unit<4> { typedef uint32_t type; };
template <> struct Unit<8> { typedef unsigned long long type; };
template <> struct Unit<16> { typedef uint4 type; };

// ---- copy_rows ------------------------------------------------------------------------------

// dst[o * dst_row + dst_col + j] = src[o * src_row + j] for j < src_row, in units U (the
// lengths are in units here).
template <typename U>
__global__ void copy_rows_kernel(U *__restrict__ dst, const U *__restrict__ src, int64_t outer,
                                 int64_t dst_row, int64_t dst_col, int64_t src_row) {
  GRID_STRIDE(e, outer * src_row) {
    int64_t o = e / src_row, j = e - o * src_row;
    dst[o * dst_row + dst_col + j] = src[e];
  }
}

template <typename U>
void copy_rows_as(char *dst, const char *src, int64_t outer, int64_t dst_row, int64_t dst_col,
                  int64_t src_row) {
  const int64_t u = (int64_t)sizeof(U);
  DDP_CUDA_LAUNCH((copy_rows_kernel<U>), ddp_cuda_blocks(outer * (src_row / u)), DDP_CUDA_THREADS, 0,
                   ddp_cuda_stream(), (U *)dst, (const U *)src, outer, dst_row / u, dst_col / u,
                   src_row / u);
}

void copy_rows(char *dst, const char *src, int64_t outer, int64_t dst_row, int64_t dst_col,
               int64_t src_row) {
  if (outer <= 0 || src_row <= 0) return;
  // the widest unit dividing both addresses and every length
  uint64_t bits = (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src | (uint64_t)dst_row |
                  (uint64_t)dst_col | (uint64_t)src_row;
  if (bits % 16 == 0) copy_rows_as<uint4>(dst, src, outer, dst_row, dst_col, src_row);
  else if (bits % 8 == 0) copy_rows_as<unsigned long long>(dst, src, outer, dst_row, dst_col, src_row);
  else if (bits % 4 == 0) copy_rows_as<uint32_t>(dst, src, outer, dst_row, dst_col, src_row);
  else if (bits % 2 == 0) copy_rows_as<uint16_t>(dst, src, outer, dst_row, dst_col, src_row);
  else copy_rows_as<uint8_t>(dst, src, outer, dst_row, dst_col, src_row);
  launched("cat");
}

// ---- index_select -----------------------------------------------------------------------------

// out (outer, n_index, inner) <- in (outer, size, inner) rows index[k].
template <typename U>
__global__ void index_select_kernel(U *__restrict__ out, const U *__restrict__ in,
                                    const int64_t *__restrict__ index, int64_t outer, int64_t size,
                                    int64_t inner, int64_t n_index) {
  GRID_STRIDE(e, outer * n_index * inner) {
    int64_t j = e % inner, r = e / inner; // r = o * n_index + k
    int64_t k = r % n_index, o = r / n_index;
    out[e] = in[(o * size + index[k]) * inner + j];
  }
}

void index_select(char *out, const char *in, const int64_t *index, int64_t outer, int64_t size,
                  int64_t inner, int64_t n_index, size_t esize) {
  if (outer <= 0 || n_index <= 0 || inner <= 0) return;
  unsigned blocks = ddp_cuda_blocks(outer * n_index * inner);
  cudaStream_t s = ddp_cuda_stream();
#define LAUNCH(B)                                                                           \
  DDP_CUDA_LAUNCH((index_select_kernel<Unit<B>::type>), blocks, DDP_CUDA_THREADS, 0, s,          \
                   (Unit<B>::type *)out, (const Unit<B>::type *)in, index, outer, size, inner,  \
                   n_index)
  switch (esize) {
  case 8: LAUNCH(8); break;
  case 4: LAUNCH(4); break;
  case 2: LAUNCH(2); break;
  default: LAUNCH(1); break;
  }
#undef LAUNCH
  launched("index_select");
}

// ---- atomic adds --------------------------------------------------------------------------------

__device__ __forceinline__ void add_to(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void add_to(double *p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void add_to(int32_t *p, int32_t v) { atomicAdd((int *)p, (int)v); }
__device__ __forceinline__ void add_to(int64_t *p, int64_t v) {
  atomicAdd((unsigned long long *)p, (unsigned long long)v); // wraps as two's complement
}
__device__ __forceinline__ void add_to(__half *p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void add_to(__nv_bfloat16 *p, __nv_bfloat16 v) { atomicAdd(p, v); }
// u8: add into the byte's lane of its aligned 32-bit word, wrapping modulo 256. The word may
// reach up to 3 bytes past the tensor's last byte: still inside its allocation (device
// allocations are 512-byte granular, runtime/backend/cuda/allocator.cu), and the CAS writes
// the other bytes back unchanged (a concurrent store to them makes it retry).
__device__ __forceinline__ void add_to(uint8_t *p, uint8_t v) {
  unsigned int *word = (unsigned int *)((uintptr_t)p & ~(uintptr_t)3);
  unsigned int shift = (unsigned int)((uintptr_t)p & 3) * 8;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    unsigned int byte = ((assumed >> shift) + v) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (old != assumed);
}

// bool: a + b != 0 is 1 wherever b is non-zero, else a unchanged.
struct Bool { uint8_t v; };
__device__ __forceinline__ void add_to(Bool *p, Bool v) {
  if (v.v) *(volatile uint8_t *)&p->v = 1;
}

// Run F<T> for the storage type T of dtype (f32, f64, i64, i32, f16, bf16, u8, bool).
#define DISPATCH_ADD(dtype, F, ...)                                                         \
  switch (dtype) {                                                                          \
  case DDP_F32: F<float>(__VA_ARGS__); break;                                               \
  case DDP_F64: F<double>(__VA_ARGS__); break;                                              \
  case DDP_I64: F<int64_t>(__VA_ARGS__); break;                                             \
  case DDP_I32: F<int32_t>(__VA_ARGS__); break;                                             \
  case DDP_F16: F<__half>(__VA_ARGS__); break;                                              \
  case DDP_BF16: F<__nv_bfloat16>(__VA_ARGS__); break;                                      \
  case DDP_U8: F<uint8_t>(__VA_ARGS__); break;                                              \
  case DDP_BOOL: F<Bool>(__VA_ARGS__); break;                                               \
  default: break;                                                                           \
  }

// ---- index_add ------------------------------------------------------------------------------------

// dst (outer, size, inner)[o, index[k], j] += src (outer, n_index, inner)[o, k, j].
template <typename T>
__global__ void index_add_kernel(T *__restrict__ dst, const T *__restrict__ src,
                                 const int64_t *__restrict__ index, int64_t outer, int64_t size,
                                 int64_t inner, int64_t n_index) {
  GRID_STRIDE(e, outer * n_index * inner) {
    int64_t j = e % inner, r = e / inner;
    int64_t k = r % n_index, o = r / n_index;
    add_to(dst + (o * size + index[k]) * inner + j, src[e]);
  }
}

template <typename T>
void index_add_as(char *dst, const char *src, const int64_t *index, int64_t outer, int64_t size,
                  int64_t inner, int64_t n_index) {
  DDP_CUDA_LAUNCH((index_add_kernel<T>), ddp_cuda_blocks(outer * n_index * inner),
                   DDP_CUDA_THREADS, 0, ddp_cuda_stream(), (T *)dst, (const T *)src, index, outer,
                   size, inner, n_index);
}

void index_add(char *dst, const char *src, const int64_t *index, int64_t outer, int64_t size,
               int64_t inner, int64_t n_index, int dtype) {
  if (outer <= 0 || n_index <= 0 || inner <= 0) return;
  DISPATCH_ADD(dtype, index_add_as, dst, src, index, outer, size, inner, n_index)
  launched("index_add");
}

// ---- gather / scatter_add ------------------------------------------------------------------------

// The geometry of a gather or scatter, by value: the index shape and the strides (elements)
// of the indexed operand A (gather's input, scatter's self) and the plain operand B.
struct Walk {
  int ndim, dim;
  int64_t shape[DDP_MAX_DIMS];
  int64_t a_strides[DDP_MAX_DIMS], b_strides[DDP_MAX_DIMS];
};

Walk make_walk(int ndim, const int64_t *shape, int dim, const int64_t *a_strides,
               const int64_t *b_strides) {
  Walk w;
  w.ndim = ndim;
  w.dim = dim;
  for (int d = 0; d < DDP_MAX_DIMS; d++) {
    w.shape[d] = d < ndim ? shape[d] : 1;
    w.a_strides[d] = d < ndim ? a_strides[d] : 0;
    w.b_strides[d] = d < ndim ? b_strides[d] : 0;
  }
  return w;
}

// Element offsets in A and B of position e (row-major over the index shape) whose index
// value is idx: A uses idx instead of the coordinate along dim.
__device__ __forceinline__ void walk_offsets(const Walk &w, int64_t e, int64_t idx, int64_t *a,
                                             int64_t *b) {
  int64_t ao = 0, bo = 0;
  for (int d = w.ndim - 1; d >= 0; d--) {
    int64_t i = e % w.shape[d];
    e /= w.shape[d];
    ao += (d == w.dim ? idx : i) * w.a_strides[d];
    bo += i * w.b_strides[d];
  }
  *a = ao;
  *b = bo;
}

template <typename U>
__global__ void gather_kernel(U *__restrict__ out, const U *__restrict__ in,
                              const int64_t *__restrict__ index, int64_t numel, Walk w) {
  GRID_STRIDE(e, numel) {
    int64_t a, b;
    walk_offsets(w, e, index[e], &a, &b);
    out[b] = in[a];
  }
}

void gather(char *out, const int64_t *out_strides, const char *in, const int64_t *in_strides,
            const int64_t *index, int ndim, const int64_t *shape, int dim, size_t esize) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel <= 0 || ndim > DDP_MAX_DIMS) return;
  Walk w = make_walk(ndim, shape, dim, in_strides, out_strides);
  unsigned blocks = ddp_cuda_blocks(numel);
  cudaStream_t s = ddp_cuda_stream();
#define LAUNCH(B)                                                                           \
  DDP_CUDA_LAUNCH((gather_kernel<Unit<B>::type>), blocks, DDP_CUDA_THREADS, 0, s,                \
                   (Unit<B>::type *)out, (const Unit<B>::type *)in, index, numel, w)
  switch (esize) {
  case 8: LAUNCH(8); break;
  case 4: LAUNCH(4); break;
  case 2: LAUNCH(2); break;
  default: LAUNCH(1); break;
  }
#undef LAUNCH
  launched("gather");
}

template <typename T>
__global__ void scatter_add_kernel(T *__restrict__ self, const T *__restrict__ src,
                                   const int64_t *__restrict__ index, int64_t numel, Walk w) {
  GRID_STRIDE(e, numel) {
    int64_t a, b;
    walk_offsets(w, e, index[e], &a, &b);
    add_to(self + a, src[b]);
  }
}

template <typename T>
void scatter_add_as(char *self, const char *src, const int64_t *index, int64_t numel,
                    const Walk &w) {
  DDP_CUDA_LAUNCH((scatter_add_kernel<T>), ddp_cuda_blocks(numel), DDP_CUDA_THREADS, 0,
                   ddp_cuda_stream(), (T *)self, (const T *)src, index, numel, w);
}

void scatter_add(char *self, const int64_t *self_strides, const char *src,
                 const int64_t *src_strides, const int64_t *index, int ndim, const int64_t *shape,
                 int dim, int dtype) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel <= 0 || ndim > DDP_MAX_DIMS) return;
  Walk w = make_walk(ndim, shape, dim, self_strides, src_strides);
  DISPATCH_ADD(dtype, scatter_add_as, self, src, index, numel, w)
  launched("scatter_add");
}

#undef DISPATCH_ADD
#undef GRID_STRIDE

} // namespace

/* Table entries of the shape area: signatures and contracts of runtime/backend/cpu/shape.h
 * (pointers are device pointers of one device; stride and shape arrays are host arrays;
 * index values already checked by the caller). */
extern "C" void ddp_cuda_register_shape(ddp_kernels *k) {
  k->copy_rows = copy_rows;
  k->index_select = index_select;
  k->index_add = index_add;
  k->gather = gather;
  k->scatter_add = scatter_add;
}
