// runtime/backend/cuda/matmul.cu: the matrix-product entries of the CUDA kernel table.
//
//  - gemm: floating GEMM through cuBLAS (cublasGemmEx), with the row-major conventions of
//    ddp_cpu_gemm (runtime/backend/cpu/matmul.h).
//  - matmul_int: integer products, a shared-memory tiled kernel with wrapping sums.
//
// cuBLAS handles: one per (device, host thread), created lazily on first use, bound to the
// current stream (ddp_cuda_stream) before every call. A thread's handles go back to a
// per-device pool when the thread exits and are reused by later threads (cuBLAS handles
// are costly to create and hold workspace), as PyTorch's CuBLASHandlePool does.
//
// Errors: gemm returns void (the table keeps the CPU signature), so a failed cuBLAS call
// is recorded with ddp_cuda_defer_error and reported by the ops layer's next
// ddp_device_check(device, op) (Note [deferred errors] in cuda_internal.h).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>

#include <mutex>
#include <vector>

#include "backend/cuda/cuda_internal.h"

namespace {

enum { MAX_DEVICES = 64 };

// Freed handles per device, reused by later threads. Never destroyed: it must outlive the
// thread_local holders below, whose destructors run at thread (and process) exit.
std::mutex pool_lock;
std::vector<cublasHandle_t> *handle_pool = new std::vector<cublasHandle_t>[MAX_DEVICES];

struct ThreadHandles {
  cublasHandle_t h[MAX_DEVICES] = {};
  ~ThreadHandles() {
    std::lock_guard<std::mutex> g(pool_lock);
    for (int d = 0; d < MAX_DEVICES; d++)
      if (h[d]) handle_pool[d].push_back(h[d]);
  }
};
thread_local ThreadHandles thread_handles;

void defer_blas(cublasStatus_t s, const char *what) {
  ddp_cuda_defer_error(s == CUBLAS_STATUS_ALLOC_FAILED ? DDP_ERR_MEMORY : DDP_ERR_STATE,
                       "%s failed: %s (%s)", what, cublasGetStatusString(s),
                       cublasGetStatusName(s));
}

// The handle of this thread for the current device, bound to the current stream; NULL with
// a deferred error on failure.
cublasHandle_t blas_handle() {
  int dev = ddp_cuda_device();
  if (dev < 0 || dev >= MAX_DEVICES) {
    ddp_cuda_defer_error(DDP_ERR_STATE, "cuBLAS: device %d out of range", dev);
    return NULL;
  }
  cublasHandle_t &h = thread_handles.h[dev];
  if (!h) {
    {
      std::lock_guard<std::mutex> g(pool_lock);
      if (!handle_pool[dev].empty()) {
        h = handle_pool[dev].back();
        handle_pool[dev].pop_back();
      }
    }
    if (!h) {
      cublasStatus_t s = cublasCreate(&h);
      if (s != CUBLAS_STATUS_SUCCESS) {
        h = NULL;
        defer_blas(s, "cublasCreate");
        return NULL;
      }
      // Reductions (split-K) stay in the compute type: f16/bf16 products accumulate in f32
      // throughout, never in the output type.
      s = cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
      if (s != CUBLAS_STATUS_SUCCESS) {
        // not kept: a later call would otherwise find the handle and skip the math mode
        cublasDestroy(h);
        h = NULL;
        defer_blas(s, "cublasSetMathMode");
        return NULL;
      }
    }
  }
  // cublasSetStream also puts the handle back on cuBLAS's default workspace pool
  // (cublasSetWorkspace is never called here), which is what a handle used on several
  // streams in turn needs. First GPU run: check with compute-sanitizer (racecheck) that
  // GEMMs alternating between two streams of one thread do not share workspace.
  cublasStatus_t s = cublasSetStream(h, ddp_cuda_stream());
  if (s != CUBLAS_STATUS_SUCCESS) {
    defer_blas(s, "cublasSetStream");
    return NULL;
  }
  return h;
}

// c (m, n) contiguous = a (m, k) · b (k, n), element strides (sa0, sa1) and (sb0, sb1).
// One TILE x TILE block of c per thread block, k walked in TILE-wide slices staged in
// shared memory; blocks stride over the tile grid (gridDim is capped). Sums in uint64_t,
// wrapping as the CPU kernel's do, then cast to T.
constexpr int TILE = 16;

template <typename T>
__global__ void matmul_int_kernel(T *__restrict__ c, const T *__restrict__ a, int64_t sa0,
                                  int64_t sa1, const T *__restrict__ b, int64_t sb0, int64_t sb1,
                                  int64_t m, int64_t n, int64_t k) {
  __shared__ uint64_t as[TILE][TILE];
  __shared__ uint64_t bs[TILE][TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles_m = (m + TILE - 1) / TILE, tiles_n = (n + TILE - 1) / TILE;
  // every thread of a block takes the same trips through these loops (block-uniform
  // bounds), so the __syncthreads below are reached by all of them
  for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)
    for (int64_t tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {
      const int64_t i = tm * TILE + ty, j = tn * TILE + tx;
      uint64_t acc = 0;
      for (int64_t p0 = 0; p0 < k; p0 += TILE) {
        const int64_t pa = p0 + tx, pb = p0 + ty;
        as[ty][tx] = (i < m && pa < k) ? (uint64_t)(int64_t)a[i * sa0 + pa * sa1] : 0;
        bs[ty][tx] = (pb < k && j < n) ? (uint64_t)(int64_t)b[pb * sb0 + j * sb1] : 0;
        __syncthreads();
#pragma unroll
        for (int q = 0; q < TILE; q++) acc += as[ty][q] * bs[q][tx];
        __syncthreads();
      }
      if (i < m && j < n) c[i * n + j] = (T)acc;
    }
}

template <typename T>
void launch_matmul_int(void *c, const void *a, int64_t sa0, int64_t sa1, const void *b,
                       int64_t sb0, int64_t sb1, int64_t m, int64_t n, int64_t k) {
  int64_t tiles_m = (m + TILE - 1) / TILE, tiles_n = (n + TILE - 1) / TILE;
  dim3 block(TILE, TILE);
  dim3 grid((unsigned)(tiles_n < 65535 ? tiles_n : 65535),
            (unsigned)(tiles_m < 65535 ? tiles_m : 65535));
  DDP_CUDA_LAUNCH((matmul_int_kernel<T>), grid, block, 0, ddp_cuda_stream(), (T *)c,
                  (const T *)a, sa0, sa1, (const T *)b, sb0, sb1, m, n, k);
}

} // namespace

// The table's gemm: c (m, n) row-major, leading dimension ldc, = alpha op(a) op(b) + beta c
// as ddp_cpu_gemm documents (runtime/backend/cpu/matmul.h); device pointers, on the current
// stream of the current device.
//  - dtypes: DDP_F32 (compute 32F, or 32F_FAST_TF32 when ddp_cuda_allow_tf32 is set: TF32
//    tensor cores, 10-bit mantissa products, as torch.backends.cuda.matmul.allow_tf32),
//    DDP_F64 (compute 64F), DDP_F16 and DDP_BF16 (inputs and output in that type, products
//    and sums in f32, alpha and beta as f32; reductions never in the output type).
//  - Row-major to column-major: a row-major (r, c) matrix with leading dimension ld is the
//    column-major (c, r) one with the same ld, so c^T = op(b)^T op(a)^T is one column-major
//    GEMM with the operands swapped: gemm(op_b, op_a, n, m, k, b, ldb, a, lda, c, ldc), each
//    operand's transpose flag kept as given.
//  - alpha and beta are host pointers (the default CUBLAS_POINTER_MODE_HOST) of the type the
//    compute type wants: float for CUBLAS_COMPUTE_32F and 32F_FAST_TF32 (f32, f16, bf16),
//    double for CUBLAS_COMPUTE_64F. With beta = 0 cuBLAS does not read c.
//  - k >= 1 as ddp_cpu_gemm requires (runtime/ops/matmul.c answers k = 0 with zeros and
//    never calls here); m or n = 0 returns at once.
//  - Errors (sizes beyond int, a cuBLAS failure) are deferred to the next device check.
static void cuda_gemm(int dtype, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      double beta, void *c, int64_t ldc) {
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
      ldc > INT_MAX) {
    ddp_cuda_defer_error(DDP_ERR_ARG, "cuBLAS GEMM: sizes (%lld, %lld, %lld) or leading "
                         "dimensions exceed %d", (long long)m, (long long)n, (long long)k,
                         INT_MAX);
    return;
  }
  if (m <= 0 || n <= 0) return;
  cublasHandle_t h = blas_handle();
  if (!h) return;
  cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cudaDataType_t type;
  cublasComputeType_t compute;
  float alpha32 = (float)alpha, beta32 = (float)beta;
  const void *palpha = &alpha32, *pbeta = &beta32;
  switch (dtype) {
  case DDP_F32:
    type = CUDA_R_32F;
    compute = ddp_cuda_allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    break;
  case DDP_F64:
    type = CUDA_R_64F;
    compute = CUBLAS_COMPUTE_64F;
    palpha = &alpha, pbeta = &beta;
    break;
  case DDP_F16:
    type = CUDA_R_16F;
    compute = CUBLAS_COMPUTE_32F;
    break;
  case DDP_BF16:
    type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
    break;
  default:
    ddp_cuda_defer_error(DDP_ERR_ARG, "cuBLAS GEMM: unsupported dtype %s",
                         ddp_dtype_name(dtype));
    return;
  }
  cublasStatus_t s = cublasGemmEx(h, opb, opa, (int)n, (int)m, (int)k, palpha, b, type, (int)ldb,
                                  a, type, (int)lda, pbeta, c, type, (int)ldc, compute,
                                  CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) defer_blas(s, "cublasGemmEx");
}

// The table's matmul_int: as ddp_cpu_matmul_int (DDP_I64, DDP_I32, DDP_U8; c contiguous;
// sums wrap as the dtype does), by the tiled kernel above.
static void cuda_matmul_int(int dtype, void *c, const void *a, int64_t sa0, int64_t sa1,
                            const void *b, int64_t sb0, int64_t sb1, int64_t m, int64_t n,
                            int64_t k) {
  if (m <= 0 || n <= 0) return;
  switch (dtype) {
  case DDP_I64: launch_matmul_int<int64_t>(c, a, sa0, sa1, b, sb0, sb1, m, n, k); break;
  case DDP_I32: launch_matmul_int<int32_t>(c, a, sa0, sa1, b, sb0, sb1, m, n, k); break;
  default: launch_matmul_int<uint8_t>(c, a, sa0, sa1, b, sb0, sb1, m, n, k); break;
  }
}

extern "C" void ddp_cuda_register_matmul(ddp_kernels *k) {
  k->gemm = cuda_gemm;
  k->matmul_int = cuda_matmul_int;
}
