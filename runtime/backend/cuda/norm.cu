// runtime/backend/cuda/norm.cu: CUDA kernels of batch norm, layer norm, dropout and
// embedding, with the semantics and layouts of the CPU kernels in runtime/backend/cpu/norm.h
// (batch-norm buffers are (N, C, S), layer-norm buffers (M, D); statistics accumulate in
// double; backward kernels add into their d* buffers). Templates over T (float, double);
// every entry point has the CPU kernel's signature and is registered in the kernel table
// by ddp_cuda_register_norm. Everything runs asynchronously on the current stream.
//
// Work split:
// - per-channel reductions of batch norm (bn_moments, bn_sums, bn_backward_reduce): one
//   block per channel (grid-stride over channels), the block's threads striding over the
//   channel's N*S elements, a fixed-shape tree at the end: deterministic. Few channels
//   leave SMs idle; good enough for the convolution nets this serves.
// - per-row reductions of layer norm (forward, dx): one block per row, the same way.
// - dweight/dbias of layer norm: column tiles of 32 by row chunks of 256; each block adds
//   its chunk's partial sums with atomicAdd (the order of the chunk additions, and so the
//   last bits, may change between runs).
// - embedding backward: one thread per element of dy, atomicAdd into dweight (duplicate
//   indices add up in an unspecified order, as in PyTorch's CUDA embedding backward).
// - element-wise kernels (bn_apply, bn_backward_elemt, masked_scale, embedding forward,
//   per-channel coefficient kernels): grid-stride loops over int64 indices.
#include <math.h>

#include "backend/cuda/cuda_internal.h"

namespace {

enum { RED_THREADS = 256, TILE_COLS = 32, TILE_ROWS = 8, ROW_CHUNK = 256 };

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024), the same in every
// thread. Every thread of the block must call it.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads(); // an earlier call's readers are done with warp_sums
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double s = lane < nwarps ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) warp_sums[0] = s;
  }
  __syncthreads();
  return warp_sums[0];
}

// Blocks for a loop over `n` independent slices (channels or rows), one block each.
unsigned slice_blocks(int64_t n) {
  if (n < 1) return 1;
  return n > 65535LL * 8 ? 65535u * 8 : (unsigned)n;
}

// ---- batch norm ---------------------------------------------------------------------------

// f(offset) for the offset of every element of channel c of an (N, C, S) buffer, the
// block's threads taking them in turn: along each (n, c) slice when a slice fills the
// block (contiguous, no division), else over the flattened N*S elements.
template <typename F>
__device__ __forceinline__ void for_channel(int64_t N, int64_t C, int64_t S, int64_t c, F f) {
  if (S >= (int64_t)blockDim.x) {
    for (int64_t n = 0; n < N; n++) {
      const int64_t base = (n * C + c) * S;
      for (int64_t s = threadIdx.x; s < S; s += blockDim.x) f(base + s);
    }
  } else {
    const int64_t NS = N * S;
    for (int64_t j = threadIdx.x; j < NS; j += blockDim.x) {
      const int64_t n = j / S, s = j - n * S;
      f((n * C + c) * S + s);
    }
  }
}

template <typename T>
__global__ void bn_moments_kernel(double *mean, double *var, const T *x, int64_t N, int64_t C,
                                  int64_t S) {
  const double M = (double)N * (double)S;
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double acc = 0;
    for_channel(N, C, S, c, [&](int64_t o) { acc += (double)x[o]; });
    const double m = block_sum(acc) / M;
    double sq = 0;
    for_channel(N, C, S, c, [&](int64_t o) {
      const double e = (double)x[o] - m;
      sq += e * e;
    });
    sq = block_sum(sq);
    if (threadIdx.x == 0) {
      mean[c] = m;
      var[c] = sq / M;
    }
  }
}

template <typename T>
__global__ void bn_sums_kernel(double *sum, double *sumsq, const T *x, int64_t N, int64_t C,
                               int64_t S) {
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double a1 = 0, a2 = 0;
    for_channel(N, C, S, c, [&](int64_t o) {
      const double v = (double)x[o];
      a1 += v;
      a2 += v * v;
    });
    a1 = block_sum(a1);
    a2 = block_sum(a2);
    if (threadIdx.x == 0) {
      sum[c] = a1;
      sumsq[c] = a2;
    }
  }
}

template <typename T>
__global__ void bn_apply_kernel(T *y, const T *x, const T *mean, const T *scale, const T *shift,
                                int64_t N, int64_t C, int64_t S) {
  const int64_t total = N * C * S;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = (i / S) % C;
    y[i] = (x[i] - mean[c]) * scale[c] + shift[c];
  }
}

template <typename T>
__global__ void bn_backward_reduce_kernel(double *sum_dy, double *sum_dy_xmu, const T *dy,
                                          const T *x, const T *mean, int64_t N, int64_t C,
                                          int64_t S) {
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    const double m = (double)mean[c];
    double a1 = 0, a2 = 0;
    for_channel(N, C, S, c, [&](int64_t o) {
      const double g = (double)dy[o];
      a1 += g;
      a2 += g * ((double)x[o] - m);
    });
    a1 = block_sum(a1);
    a2 = block_sum(a2);
    if (threadIdx.x == 0) {
      sum_dy[c] = a1;
      sum_dy_xmu[c] = a2;
    }
  }
}

template <typename T>
__global__ void bn_backward_elemt_kernel(T *dx, const T *dy, const T *x, const T *mean,
                                         const T *a, const T *b, const T *d, int64_t N, int64_t C,
                                         int64_t S) {
  const int64_t total = N * C * S;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = (i / S) % C;
    dx[i] += a[c] * dy[i] + b[c] * (x[i] - mean[c]) + d[c];
  }
}

template <typename T>
__global__ void bn_finalize_kernel(T *mean_out, T *scale, T *shift, T *invstd, const double *mean,
                                   const double *var, const T *w, const T *b, int64_t C,
                                   double eps) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    const double is = 1.0 / sqrt(var[c] + eps);
    if (mean_out) mean_out[c] = (T)mean[c];
    if (scale) scale[c] = (T)((w ? (double)w[c] : 1.0) * is);
    if (shift) shift[c] = b ? b[c] : (T)0;
    if (invstd) invstd[c] = (T)is;
  }
}

template <typename T>
__global__ void bn_running_update_kernel(T *running, const double *value, int64_t C,
                                         double momentum, double correction) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    const double v = value[c] * correction;
    running[c] = (T)((1 - momentum) * (double)running[c] + momentum * v);
  }
}

template <typename T>
__global__ void bn_backward_coef_kernel(T *a, T *b, T *d, T *dweight, T *dbias,
                                        const double *sum_dy, const double *sum_dy_xmu,
                                        const T *invstd, const T *w, int64_t C, double M,
                                        int training) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
       c += (int64_t)gridDim.x * blockDim.x) {
    const double is = (double)invstd[c], wc = w ? (double)w[c] : 1.0, k = wc * is / M;
    if (a) a[c] = (T)(wc * is);
    if (b) b[c] = training ? (T)(-k * is * is * sum_dy_xmu[c]) : (T)0;
    if (d) d[c] = training ? (T)(-k * sum_dy[c]) : (T)0;
    if (dweight) dweight[c] = (T)(sum_dy_xmu[c] * is);
    if (dbias) dbias[c] = (T)sum_dy[c];
  }
}

// ---- layer norm ---------------------------------------------------------------------------

template <typename T>
__global__ void ln_forward_kernel(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                                  int64_t M, int64_t D, double eps) {
  for (int64_t r = blockIdx.x; r < M; r += gridDim.x) {
    const T *xr = x + r * D;
    T *yr = y + r * D;
    double acc = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += (double)xr[j];
    const double m = block_sum(acc) / (double)D;
    double sq = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const double e = (double)xr[j] - m;
      sq += e * e;
    }
    const double rs = 1.0 / sqrt(block_sum(sq) / (double)D + eps);
    if (threadIdx.x == 0) {
      mean[r] = (T)m;
      rstd[r] = (T)rs;
    }
    const T mt = (T)m, rt = (T)rs;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      T v = (xr[j] - mt) * rt;
      if (w) v *= w[j];
      if (b) v += b[j];
      yr[j] = v;
    }
  }
}

// dx += rstd / D (D g - sum g - xhat sum(g xhat)), g = dy * w, one block per row.
template <typename T>
__global__ void ln_backward_dx_kernel(T *dx, const T *dy, const T *x, const T *mean,
                                      const T *rstd, const T *w, int64_t M, int64_t D) {
  for (int64_t r = blockIdx.x; r < M; r += gridDim.x) {
    const T *xr = x + r * D, *dyr = dy + r * D;
    T *dxr = dx + r * D;
    const T m = mean[r], rs = rstd[r];
    double sum_g = 0, sum_g_xhat = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const T g = w ? dyr[j] * w[j] : dyr[j];
      sum_g += (double)g;
      sum_g_xhat += (double)(g * (xr[j] - m) * rs);
    }
    sum_g = block_sum(sum_g);
    sum_g_xhat = block_sum(sum_g_xhat);
    const T c1 = (T)((double)rs / (double)D), mg = (T)sum_g, mgx = (T)sum_g_xhat, Dt = (T)D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const T g = w ? dyr[j] * w[j] : dyr[j];
      dxr[j] += c1 * (Dt * g - mg - (xr[j] - m) * rs * mgx);
    }
  }
}

// dw[j] += sum_r dy (x - mean) rstd, db[j] += sum_r dy: block (TILE_COLS, TILE_ROWS) takes
// columns [bx * 32, +32) of rows [by * ROW_CHUNK, +ROW_CHUNK), then one atomicAdd per column.
template <typename T>
__global__ void ln_backward_dwdb_kernel(T *dw, T *db, const T *dy, const T *x, const T *mean,
                                        const T *rstd, int64_t M, int64_t D) {
  __shared__ double part_w[TILE_ROWS][TILE_COLS];
  __shared__ double part_b[TILE_ROWS][TILE_COLS];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col_tiles = (D + TILE_COLS - 1) / TILE_COLS;
  const int64_t chunks = (M + ROW_CHUNK - 1) / ROW_CHUNK;
  for (int64_t tile = blockIdx.x; tile < col_tiles; tile += gridDim.x) {
    const int64_t j = tile * TILE_COLS + tx;
    for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
      const int64_t r0 = chunk * ROW_CHUNK;
      const int64_t r1 = r0 + ROW_CHUNK < M ? r0 + ROW_CHUNK : M;
      double aw = 0, ab = 0;
      if (j < D)
        for (int64_t r = r0 + ty; r < r1; r += TILE_ROWS) {
          const T g = dy[r * D + j];
          aw += (double)(g * (x[r * D + j] - mean[r]) * rstd[r]);
          ab += (double)g;
        }
      part_w[ty][tx] = aw;
      part_b[ty][tx] = ab;
      __syncthreads();
      if (ty == 0 && j < D) {
        for (int k = 1; k < TILE_ROWS; k++) {
          aw += part_w[k][tx];
          ab += part_b[k][tx];
        }
        if (dw) atomicAdd(dw + j, (T)aw);
        if (db) atomicAdd(db + j, (T)ab);
      }
      __syncthreads();
    }
  }
}

// ---- dropout and embedding ----------------------------------------------------------------

template <typename T>
__global__ void masked_scale_kernel(T *y, const T *x, const uint8_t *mask, T scale, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i] * (T)mask[i] * scale;
}

// out row i = weight row idx[i], copied in words of type W (row_words W's per row).
template <typename W>
__global__ void embedding_forward_kernel(W *out, const W *weight, const int64_t *idx, int64_t n,
                                         int64_t row_words) {
  const int64_t total = n * row_words;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = t / row_words, k = t - i * row_words;
    out[t] = weight[idx[i] * row_words + k];
  }
}

template <typename T>
__global__ void embedding_backward_kernel(T *dweight, const T *dy, const int64_t *idx, int64_t n,
                                          int64_t D, int64_t padding_idx) {
  const int64_t total = n * D;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = t / D, j = t - i * D, v = idx[i];
    if (v == padding_idx) continue;
    atomicAdd(dweight + v * D + j, dy[t]);
  }
}

// ---- host entry points (the kernel-table signatures) ----------------------------------------

template <typename T>
void bn_moments(double *mean, double *var, const T *x, int64_t N, int64_t C, int64_t S) {
  if (C <= 0) return;
  DDP_CUDA_LAUNCH((bn_moments_kernel<T>), slice_blocks(C), RED_THREADS, 0, ddp_cuda_stream(), mean,
                  var, x, N, C, S);
}

template <typename T>
void bn_sums(double *sum, double *sumsq, const T *x, int64_t N, int64_t C, int64_t S) {
  if (C <= 0) return;
  DDP_CUDA_LAUNCH((bn_sums_kernel<T>), slice_blocks(C), RED_THREADS, 0, ddp_cuda_stream(), sum, sumsq,
                  x, N, C, S);
}

template <typename T>
void bn_apply(T *y, const T *x, const T *mean, const T *scale, const T *shift, int64_t N, int64_t C,
              int64_t S) {
  const int64_t total = N * C * S;
  if (total <= 0) return;
  DDP_CUDA_LAUNCH((bn_apply_kernel<T>), ddp_cuda_blocks(total), DDP_CUDA_THREADS, 0, ddp_cuda_stream(),
                  y, x, mean, scale, shift, N, C, S);
}

template <typename T>
void bn_backward_reduce(double *sum_dy, double *sum_dy_xmu, const T *dy, const T *x, const T *mean,
                        int64_t N, int64_t C, int64_t S) {
  if (C <= 0) return;
  DDP_CUDA_LAUNCH((bn_backward_reduce_kernel<T>), slice_blocks(C), RED_THREADS, 0, ddp_cuda_stream(),
                  sum_dy, sum_dy_xmu, dy, x, mean, N, C, S);
}

template <typename T>
void bn_backward_elemt(T *dx, const T *dy, const T *x, const T *mean, const T *a, const T *b,
                       const T *d, int64_t N, int64_t C, int64_t S) {
  const int64_t total = N * C * S;
  if (total <= 0) return;
  DDP_CUDA_LAUNCH((bn_backward_elemt_kernel<T>), ddp_cuda_blocks(total), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), dx, dy, x, mean, a, b, d, N, C, S);
}

template <typename T>
void bn_finalize(T *mean_out, T *scale, T *shift, T *invstd, const double *mean, const double *var,
                 const T *w, const T *b, int64_t C, double eps) {
  if (C <= 0) return;
  DDP_CUDA_LAUNCH((bn_finalize_kernel<T>), ddp_cuda_blocks(C), DDP_CUDA_THREADS, 0, ddp_cuda_stream(),
                  mean_out, scale, shift, invstd, mean, var, w, b, C, eps);
}

template <typename T>
void bn_running_update(T *running, const double *value, int64_t C, double momentum,
                       double correction) {
  if (C <= 0) return;
  DDP_CUDA_LAUNCH((bn_running_update_kernel<T>), ddp_cuda_blocks(C), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), running, value, C, momentum, correction);
}

template <typename T>
void bn_backward_coef(T *a, T *b, T *d, T *dweight, T *dbias, const double *sum_dy,
                      const double *sum_dy_xmu, const T *invstd, const T *w, int64_t C, double M,
                      int training) {
  if (C <= 0) return;
  DDP_CUDA_LAUNCH((bn_backward_coef_kernel<T>), ddp_cuda_blocks(C), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), a, b, d, dweight, dbias, sum_dy, sum_dy_xmu, invstd, w, C, M,
                  training);
}

template <typename T>
void ln_forward(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b, int64_t M, int64_t D,
                double eps) {
  if (M <= 0) return;
  DDP_CUDA_LAUNCH((ln_forward_kernel<T>), slice_blocks(M), RED_THREADS, 0, ddp_cuda_stream(), y, mean,
                  rstd, x, w, b, M, D, eps);
}

template <typename T>
void ln_backward(T *dx, T *dw, T *db, const T *dy, const T *x, const T *mean, const T *rstd,
                 const T *w, int64_t M, int64_t D) {
  if (M <= 0 || D <= 0) return;
  cudaStream_t stream = ddp_cuda_stream();
  if (dx)
    DDP_CUDA_LAUNCH((ln_backward_dx_kernel<T>), slice_blocks(M), RED_THREADS, 0, stream, dx, dy, x,
                    mean, rstd, w, M, D);
  if (dw || db) {
    int64_t tiles = (D + TILE_COLS - 1) / TILE_COLS, chunks = (M + ROW_CHUNK - 1) / ROW_CHUNK;
    dim3 grid((unsigned)(tiles < 65535 * 8 ? tiles : 65535 * 8),
              (unsigned)(chunks < 65535 ? chunks : 65535));
    DDP_CUDA_LAUNCH((ln_backward_dwdb_kernel<T>), grid, dim3(TILE_COLS, TILE_ROWS), 0, stream, dw, db,
                    dy, x, mean, rstd, M, D);
  }
}

template <typename T>
void masked_scale(T *y, const T *x, const uint8_t *mask, T scale, int64_t n) {
  if (n <= 0) return;
  DDP_CUDA_LAUNCH((masked_scale_kernel<T>), ddp_cuda_blocks(n), DDP_CUDA_THREADS, 0, ddp_cuda_stream(),
                  y, x, mask, scale, n);
}

void embedding_forward(char *out, const char *weight, const int64_t *idx, int64_t n,
                       int64_t row_bytes) {
  if (n <= 0 || row_bytes <= 0) return;
  cudaStream_t stream = ddp_cuda_stream();
  // 4-byte words when every row start is 4-byte aligned (a view may start anywhere)
  if (row_bytes % 4 == 0 && ((uintptr_t)out | (uintptr_t)weight) % 4 == 0) {
    const int64_t words = row_bytes / 4;
    DDP_CUDA_LAUNCH((embedding_forward_kernel<uint32_t>), ddp_cuda_blocks(n * words),
                    DDP_CUDA_THREADS, 0, stream, (uint32_t *)out, (const uint32_t *)weight, idx, n,
                    words);
  } else {
    DDP_CUDA_LAUNCH((embedding_forward_kernel<uint8_t>), ddp_cuda_blocks(n * row_bytes),
                    DDP_CUDA_THREADS, 0, stream, (uint8_t *)out, (const uint8_t *)weight, idx, n,
                    row_bytes);
  }
}

template <typename T>
void embedding_backward(T *dweight, const T *dy, const int64_t *idx, int64_t n, int64_t D,
                        int64_t padding_idx) {
  if (n <= 0 || D <= 0) return;
  DDP_CUDA_LAUNCH((embedding_backward_kernel<T>), ddp_cuda_blocks(n * D), DDP_CUDA_THREADS, 0,
                  ddp_cuda_stream(), dweight, dy, idx, n, D, padding_idx);
}

}  // namespace

// Fill the norm entries of the CUDA kernel table (runtime/backend/kernels.h): batch norm
// (bn_moments, bn_sums, bn_apply, bn_finalize, bn_running_update, bn_backward_reduce,
// bn_backward_coef, bn_backward_elemt), layer norm (ln_forward, ln_backward), dropout's
// masked_scale and embedding_forward/backward, in f32 and f64. Pointers are device pointers
// on the current device (the double statistics too).
extern "C" void ddp_cuda_register_norm(ddp_kernels *k) {
  // Each entry picks the typed function from the dtype (Note [one dispatch path] in
  // runtime/backend/kernels.h); the ops layer has checked the dtype.
  k->bn_moments = [](int dtype, double *mean, double *var, const void *x, int64_t N, int64_t C,
                     int64_t S) {
    if (dtype == DDP_F64)
      bn_moments<double>(mean, var, (const double *)x, N, C, S);
    else
      bn_moments<float>(mean, var, (const float *)x, N, C, S);
  };
  k->bn_sums = [](int dtype, double *sum, double *sumsq, const void *x, int64_t N, int64_t C,
                  int64_t S) {
    if (dtype == DDP_F64)
      bn_sums<double>(sum, sumsq, (const double *)x, N, C, S);
    else
      bn_sums<float>(sum, sumsq, (const float *)x, N, C, S);
  };
  k->bn_apply = [](int dtype, void *y, const void *x, const void *mean, const void *scale,
                   const void *shift, int64_t N, int64_t C, int64_t S) {
    if (dtype == DDP_F64)
      bn_apply<double>((double *)y, (const double *)x, (const double *)mean, (const double *)scale,
                       (const double *)shift, N, C, S);
    else
      bn_apply<float>((float *)y, (const float *)x, (const float *)mean, (const float *)scale,
                      (const float *)shift, N, C, S);
  };
  k->bn_backward_reduce = [](int dtype, double *sum_dy, double *sum_dy_xmu, const void *dy,
                             const void *x, const void *mean, int64_t N, int64_t C, int64_t S) {
    if (dtype == DDP_F64)
      bn_backward_reduce<double>(sum_dy, sum_dy_xmu, (const double *)dy, (const double *)x,
                                 (const double *)mean, N, C, S);
    else
      bn_backward_reduce<float>(sum_dy, sum_dy_xmu, (const float *)dy, (const float *)x,
                                (const float *)mean, N, C, S);
  };
  k->bn_backward_elemt = [](int dtype, void *dx, const void *dy, const void *x, const void *mean,
                            const void *a, const void *b, const void *d, int64_t N, int64_t C,
                            int64_t S) {
    if (dtype == DDP_F64)
      bn_backward_elemt<double>((double *)dx, (const double *)dy, (const double *)x,
                                (const double *)mean, (const double *)a, (const double *)b,
                                (const double *)d, N, C, S);
    else
      bn_backward_elemt<float>((float *)dx, (const float *)dy, (const float *)x,
                               (const float *)mean, (const float *)a, (const float *)b,
                               (const float *)d, N, C, S);
  };
  k->bn_finalize = [](int dtype, void *mean_out, void *scale, void *shift, void *invstd,
                      const double *mean, const double *var, const void *w, const void *b,
                      int64_t C, double eps) {
    if (dtype == DDP_F64)
      bn_finalize<double>((double *)mean_out, (double *)scale, (double *)shift, (double *)invstd,
                          mean, var, (const double *)w, (const double *)b, C, eps);
    else
      bn_finalize<float>((float *)mean_out, (float *)scale, (float *)shift, (float *)invstd, mean,
                         var, (const float *)w, (const float *)b, C, eps);
  };
  k->bn_running_update = [](int dtype, void *running, const double *value, int64_t C,
                            double momentum, double correction) {
    if (dtype == DDP_F64)
      bn_running_update<double>((double *)running, value, C, momentum, correction);
    else
      bn_running_update<float>((float *)running, value, C, momentum, correction);
  };
  k->bn_backward_coef = [](int dtype, void *a, void *b, void *d, void *dweight, void *dbias,
                           const double *sum_dy, const double *sum_dy_xmu, const void *invstd,
                           const void *w, int64_t C, double M, int training) {
    if (dtype == DDP_F64)
      bn_backward_coef<double>((double *)a, (double *)b, (double *)d, (double *)dweight,
                               (double *)dbias, sum_dy, sum_dy_xmu, (const double *)invstd,
                               (const double *)w, C, M, training);
    else
      bn_backward_coef<float>((float *)a, (float *)b, (float *)d, (float *)dweight, (float *)dbias,
                              sum_dy, sum_dy_xmu, (const float *)invstd, (const float *)w, C, M,
                              training);
  };
  k->ln_forward = [](int dtype, void *y, void *mean, void *rstd, const void *x, const void *w,
                     const void *b, int64_t M, int64_t D, double eps) {
    if (dtype == DDP_F64)
      ln_forward<double>((double *)y, (double *)mean, (double *)rstd, (const double *)x,
                         (const double *)w, (const double *)b, M, D, eps);
    else
      ln_forward<float>((float *)y, (float *)mean, (float *)rstd, (const float *)x,
                        (const float *)w, (const float *)b, M, D, eps);
  };
  k->ln_backward = [](int dtype, void *dx, void *dw, void *db, const void *dy, const void *x,
                      const void *mean, const void *rstd, const void *w, int64_t M, int64_t D) {
    if (dtype == DDP_F64)
      ln_backward<double>((double *)dx, (double *)dw, (double *)db, (const double *)dy,
                          (const double *)x, (const double *)mean, (const double *)rstd,
                          (const double *)w, M, D);
    else
      ln_backward<float>((float *)dx, (float *)dw, (float *)db, (const float *)dy, (const float *)x,
                         (const float *)mean, (const float *)rstd, (const float *)w, M, D);
  };
  k->masked_scale = [](int dtype, void *y, const void *x, const uint8_t *mask, double scale,
                       int64_t n) {
    if (dtype == DDP_F64)
      masked_scale<double>((double *)y, (const double *)x, mask, (double)scale, n);
    else
      masked_scale<float>((float *)y, (const float *)x, mask, (float)scale, n);
  };
  k->embedding_forward = embedding_forward;
  k->embedding_backward = [](int dtype, void *dweight, const void *dy, const int64_t *idx,
                             int64_t n, int64_t D, int64_t padding_idx) {
    if (dtype == DDP_F64)
      embedding_backward<double>((double *)dweight, (const double *)dy, idx, n, D, padding_idx);
    else
      embedding_backward<float>((float *)dweight, (const float *)dy, idx, n, D, padding_idx);
  };
}
