// runtime/backend/cuda/reduce.cu: CUDA kernels of the reductions and softmax (the table
// entries sum_*, var_*, argext_*, softmax_*, softmax_backward_*), with the semantics of
// the CPU kernels in runtime/backend/cpu/reduce.c (documented in runtime/backend/cpu/reduce.h):
// the input is a contiguous (A, R, B) block reduced over R, the output a contiguous (A, B).
//
// Two launch shapes, chosen by B:
//  - B == 1 (rows): a group of TPR threads per row (a warp for rows shorter than ROW_LONG,
//    the whole 256-thread block otherwise) strides over the row, then reduces in the group
//    with warp shuffles and, for a block, shared memory. A few very long rows (the sum or
//    argmax of a whole tensor: A = 1) are split in parts reduced by separate blocks into a
//    scratch buffer of partial results, which a second launch reduces per row.
//  - B > 1 (columns): a (32, 8) block per tile of 32 consecutive columns of one slice a
//    (narrower and taller when B < 32): threadIdx.x walks the columns (coalesced loads),
//    threadIdx.y strides over R, and the partial results per column meet in a shared-memory
//    tree. Few tiles over long columns ((N, 3) summed over N) split R in parts the same way.
// The reductions are written once (reduce_rows / reduce_cols) over small functor types
// giving the accumulator, its identity, the fold of one element and the merge of two
// partial results, and a "post" functor that writes one output.
//
// Accumulation (Note [reduction accumulation], ddplua/ops_reduce.h): f32 and f64 sums
// accumulate in double as the CPU's do; i64 in int64. The variance uses Welford's update
// per thread and Chan et al.'s pairwise merge of (count, mean, M2) partials ("Updating
// formulae and a pairwise algorithm for computing sample variances", 1979), in double.
// max/min keep the first index of the extreme and let NaN win (first NaN's index), as the
// CPU does. Softmax subtracts the row maximum, sums exp in double, and log_softmax
// recomputes (x - max) - log(sum) as the CPU does. Results match the CPU to rounding (the
// order of additions differs), not bit for bit.
//
// Every kernel runs on ddp_cuda_stream() and returns without synchronising. Launches go
// through DDP_CUDA_LAUNCH (cuda_internal.h), so the file also
// runs unchanged on the host in the emulated device (runtime/backend/sim/cuda_emulation.h).
#include "backend/cuda/cuda_internal.h"

#include <math.h>

#include <type_traits>

extern "C" {
int ddp_cuda_caching_malloc(void **out, int device, size_t nbytes);
void ddp_cuda_caching_free(void *p);
}

namespace {

constexpr int THREADS = 256;          // threads per block of every kernel here
constexpr int WARP = 32;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int COL_X = 32;             // columns per tile of a column kernel
constexpr int COL_Y = THREADS / COL_X; // threads along R per column
constexpr int64_t ROW_LONG = 2048;    // rows at least this long get a whole block
constexpr int64_t SPLIT_MIN = 1 << 16;  // rows at least this long may be split in parts
constexpr int64_t SPLIT_PART = 1 << 14; // at least this many elements per part
constexpr int64_t SPLIT_UNITS = 1024;   // about this many blocks for the parts of a split
constexpr int64_t COL_PART = 1024;      // at least this many rows per part of a column split
constexpr int64_t EMPTY = INT64_MAX;    // index of an empty max/min partial result

// Blocks for `units` units of work of `per_block` each, capped (grid-stride loops do the rest).
unsigned grid_for(int64_t units, int64_t per_block) {
  int64_t b = (units + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > 65535LL * 8) b = 65535LL * 8;
  return (unsigned)b;
}

// ---- device helpers ---------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  if constexpr (std::is_floating_point<T>::value) return isnan(v);
  else return false;
}

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }

template <typename V>
__device__ __forceinline__ V shfl_xor(V v, int lane_mask) {
  if constexpr (std::is_floating_point<V>::value) return __shfl_xor_sync(FULL_MASK, v, lane_mask);
  else if constexpr (sizeof(V) == 8) return (V)__shfl_xor_sync(FULL_MASK, (long long)v, lane_mask);
  else return (V)__shfl_xor_sync(FULL_MASK, (int)v, lane_mask);
}

// Running (count, mean, M2) of Welford's algorithm; count 0 is the empty partial result.
struct Welford {
  double n, mean, m2;
};

__device__ __forceinline__ Welford shfl_xor(Welford w, int lane_mask) {
  return Welford{shfl_xor(w.n, lane_mask), shfl_xor(w.mean, lane_mask), shfl_xor(w.m2, lane_mask)};
}

// Extreme value and its index along R; i == EMPTY: no element seen yet.
template <typename T>
struct Pair {
  T v;
  int64_t i;
};

template <typename T>
__device__ __forceinline__ Pair<T> shfl_xor(Pair<T> p, int lane_mask) {
  return Pair<T>{shfl_xor(p.v, lane_mask), shfl_xor(p.i, lane_mask)};
}

// The merge of v over a group of TPR threads (a warp, or the whole block when TPR is
// THREADS), returned to every thread of the group. smem: THREADS / WARP entries. With a
// commutative merge every thread gets the same value; otherwise the group's first thread
// gets the full result (the one the callers use). Must be reached by every thread of the
// block when TPR == THREADS.
template <int TPR, typename V, typename Merge>
__device__ __forceinline__ V group_reduce(V v, const Merge &merge, V *smem) {
#pragma unroll
  for (int o = WARP / 2; o > 0; o >>= 1) v = merge(v, shfl_xor(v, o));
  if constexpr (TPR == WARP) {
    return v;
  } else {
    static_assert(TPR == THREADS, "a group is a warp or the block");
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    __syncthreads(); // earlier readers of smem are done
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    V r = smem[0];
#pragma unroll
    for (int w = 1; w < THREADS / WARP; w++) r = merge(r, smem[w]);
    return r;
  }
}

// ---- reduction functors -----------------------------------------------------------------
// An Op gives: identity(); fold(acc, x, o, r): acc with element x (position r along R of
// output o) added; operator()(a, b): two partial results merged.

// Sums of x, |x| or x^2 (mode of enum ddp_sum_mode; DDP_SUM_SQRT sums squares) in ACC.
template <typename T, typename ACC>
struct SumOp {
  int mode;
  __device__ ACC identity() const { return ACC(0); }
  __device__ ACC fold(ACC acc, T x, int64_t, int64_t) const {
    ACC v = (ACC)x;
    if (mode == DDP_SUM_ABS) v = v < 0 ? -v : v;
    else if (mode == DDP_SUM_SQRT) v = v * v;
    return acc + v;
  }
  __device__ ACC operator()(ACC a, ACC b) const { return a + b; }
};

template <typename T>
struct VarOp {
  __device__ Welford identity() const { return Welford{0, 0, 0}; }
  __device__ Welford fold(Welford w, T x, int64_t, int64_t) const {
    double v = (double)x, n = w.n + 1, d = v - w.mean, mean = w.mean + d / n;
    return Welford{n, mean, w.m2 + d * (v - mean)};
  }
  __device__ Welford operator()(Welford a, Welford b) const {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    double n = a.n + b.n, d = b.mean - a.mean;
    return Welford{n, a.mean + d * (b.n / n), a.m2 + b.m2 + d * d * (a.n * b.n / n)};
  }
};

// max (is_max) or min with the first index; NaN wins, the first NaN's index is kept.
// The merge is commutative: the winner depends on values and indices only.
template <typename T>
struct ArgextOp {
  int is_max;
  __device__ Pair<T> identity() const { return Pair<T>{T(0), EMPTY}; }
  __device__ Pair<T> operator()(Pair<T> a, Pair<T> b) const {
    if (b.i == EMPTY) return a;
    if (a.i == EMPTY) return b;
    bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an || bn) {
      if (an && bn) return a.i < b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    return (is_max ? b.v > a.v : b.v < a.v) ? b : a;
  }
  __device__ Pair<T> fold(Pair<T> acc, T x, int64_t, int64_t r) const {
    return (*this)(acc, Pair<T>{x, r});
  }
};

// The second pass of a split: the elements are partial results of Op.
template <typename Op, typename ACC>
struct PartialsOp {
  Op op;
  __device__ ACC identity() const { return op.identity(); }
  __device__ ACC fold(ACC acc, ACC x, int64_t, int64_t) const { return op(acc, x); }
  __device__ ACC operator()(ACC a, ACC b) const { return op(a, b); }
};

// ---- posts: what is written for output o --------------------------------------------------

template <typename T, typename ACC>
struct SumPost {
  T *out;
  int mode;
  double scale;
  __device__ void operator()(int64_t o, ACC acc) const {
    if (mode == DDP_SUM_SQRT) out[o] = (T)sqrt((double)acc);
    else out[o] = scale == 1.0 ? (T)acc : (T)((double)acc * scale);
  }
};

template <typename T>
struct VarPost {
  T *out;
  double denom;
  int take_sqrt;
  __device__ void operator()(int64_t o, Welford w) const {
    double v = w.m2 / denom;
    out[o] = (T)(take_sqrt ? sqrt(v) : v);
  }
};

template <typename T>
struct ArgextPost {
  T *values;
  int64_t *indices;
  __device__ void operator()(int64_t o, Pair<T> p) const {
    values[o] = p.v;
    indices[o] = p.i;
  }
};

template <typename ACC>
struct PartialPost {
  ACC *out;
  __device__ void operator()(int64_t o, ACC acc) const { out[o] = acc; }
};

// ---- the two reduction kernels ------------------------------------------------------------

// Rows of `in` ((rows, len), contiguous), each cut in `parts` parts of plen elements: unit
// u = row * parts + p folds elements [p plen, min(len, (p + 1) plen)) of its row and
// post(u, result) writes it. TPR threads per unit (see group_reduce).
template <int TPR, typename TIn, typename ACC, typename Op, typename Post>
__global__ void __launch_bounds__(THREADS)
    reduce_rows_kernel(const TIn *__restrict__ in, int64_t units, int64_t parts, int64_t len,
                       int64_t plen, Op op, Post post) {
  __shared__ ACC smem[THREADS / WARP];
  constexpr int GROUPS = THREADS / TPR;
  const int g = threadIdx.x / TPR, t = threadIdx.x % TPR;
  // u0 is the same for the whole block: every thread reaches group_reduce equally often
  for (int64_t u0 = (int64_t)blockIdx.x * GROUPS; u0 < units; u0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t u = u0 + g;
    ACC acc = op.identity();
    if (u < units) {
      const int64_t row = u / parts, p = u % parts;
      const int64_t begin = p * plen, end = begin + plen < len ? begin + plen : len;
      const TIn *x = in + row * len;
      for (int64_t r = begin + t; r < end; r += TPR) acc = op.fold(acc, x[r], row, r);
    }
    acc = group_reduce<TPR>(acc, op, smem);
    if (u < units && t == 0) post(u, acc);
  }
}

// Columns: (A, R, B) reduced over R, R cut in `parts` parts of plen rows. Block (bx, by),
// bx * by = THREADS, both powers of two: a tile is bx consecutive columns b of one part p
// of one slice a; threadIdx.x walks the columns (with B < 32, bx = B rounded up to a power
// of two and a warp reads 32 / bx consecutive rows: still one contiguous segment),
// threadIdx.y strides over the part's rows, then a shared-memory tree merges the by partial
// results of each column and post((a parts + p) B + b, result) writes it.
template <typename T, typename ACC, typename Op, typename Post>
__global__ void __launch_bounds__(THREADS)
    reduce_cols_kernel(const T *__restrict__ in, int64_t A, int64_t R, int64_t B, int64_t parts,
                       int64_t plen, Op op, Post post) {
  __shared__ ACC smem[THREADS];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int64_t chunks = (B + bx - 1) / bx;
  for (int64_t tile = blockIdx.x; tile < A * parts * chunks; tile += gridDim.x) {
    const int64_t ap = tile / chunks, a = ap / parts, p = ap % parts;
    const int64_t b = (tile % chunks) * bx + tx;
    const int64_t begin = p * plen, end = begin + plen < R ? begin + plen : R;
    ACC acc = op.identity();
    if (b < B) {
      const T *x = in + a * R * B + b;
      for (int64_t r = begin + ty; r < end; r += by) acc = op.fold(acc, x[r * B], a * B + b, r);
    }
    smem[ty * bx + tx] = acc;
    __syncthreads();
    for (int h = by / 2; h > 0; h >>= 1) {
      if (ty < h) smem[ty * bx + tx] = op(smem[ty * bx + tx], smem[(ty + h) * bx + tx]);
      __syncthreads();
    }
    if (ty == 0 && b < B) post(ap * B + b, smem[tx]);
    __syncthreads(); // smem is rewritten by the next tile
  }
}

template <typename TIn, typename ACC, typename Op, typename Post>
void launch_rows(const TIn *in, int64_t units, int64_t parts, int64_t len, int64_t plen,
                 const Op &op, const Post &post) {
  cudaStream_t s = ddp_cuda_stream();
  if (plen < ROW_LONG)
    DDP_CUDA_LAUNCH((reduce_rows_kernel<WARP, TIn, ACC>), grid_for(units, THREADS / WARP),
                      THREADS, 0, s, in, units, parts, len, plen, op, post);
  else
    DDP_CUDA_LAUNCH((reduce_rows_kernel<THREADS, TIn, ACC>), grid_for(units, 1), THREADS, 0, s, in,
                      units, parts, len, plen, op, post);
}

template <typename TIn, typename ACC, typename Op, typename Post>
void launch_cols(const TIn *in, int64_t A, int64_t R, int64_t B, int64_t parts, int64_t plen,
                 const Op &op, const Post &post) {
  int bx = COL_X;
  if (B < COL_X) { // the smallest power of two >= B
    bx = 1;
    while (bx < B) bx *= 2;
  }
  const int64_t tiles = A * parts * ((B + bx - 1) / bx);
  DDP_CUDA_LAUNCH((reduce_cols_kernel<TIn, ACC>), grid_for(tiles, 1), dim3(bx, THREADS / bx), 0,
                    ddp_cuda_stream(), in, A, R, B, parts, plen, op, post);
}

// Reduce (A, R, B) over R: post(o, result) for every output o < A B.
template <typename T, typename Op, typename Post>
void reduce(const T *x, int64_t A, int64_t R, int64_t B, const Op &op, const Post &post) {
  using ACC = decltype(op.identity());
  if (A == 0 || B == 0) return;
  if (B > 1) {
    // Few tiles over long columns: parts of at least COL_PART rows, about SPLIT_UNITS
    // tiles in all, then the parts' partial results ((A, parts, B)) reduced the same way.
    const int64_t tiles = A * ((B + COL_X - 1) / COL_X);
    if (R >= 2 * COL_PART && tiles < SPLIT_UNITS / 2) {
      int64_t parts = R / COL_PART < SPLIT_UNITS / tiles ? R / COL_PART : SPLIT_UNITS / tiles;
      int64_t plen = (R + parts - 1) / parts;
      parts = (R + plen - 1) / plen;
      void *scratch = NULL;
      if (parts >= 2 && ddp_cuda_caching_malloc(&scratch, ddp_cuda_device(),
                                                (size_t)(A * parts * B) * sizeof(ACC)) == DDP_OK) {
        ACC *partial = (ACC *)scratch;
        launch_cols<T, ACC>(x, A, R, B, parts, plen, op, PartialPost<ACC>{partial});
        launch_cols<ACC, ACC>(partial, A, parts, B, 1, parts, PartialsOp<Op, ACC>{op}, post);
        ddp_cuda_caching_free(scratch); // stream-ordered, as below
        return;
      }
    }
    launch_cols<T, ACC>(x, A, R, B, 1, R, op, post);
    return;
  }
  // Few long rows: parts of at least SPLIT_PART elements, about SPLIT_UNITS in all.
  if (R >= SPLIT_MIN && A < SPLIT_UNITS / 2) {
    int64_t parts = R / SPLIT_PART < SPLIT_UNITS / A ? R / SPLIT_PART : SPLIT_UNITS / A;
    int64_t plen = (R + parts - 1) / parts;
    parts = (R + plen - 1) / plen;
    void *scratch = NULL;
    if (parts >= 2 &&
        ddp_cuda_caching_malloc(&scratch, ddp_cuda_device(), (size_t)(A * parts) * sizeof(ACC)) ==
            DDP_OK) {
      ACC *partial = (ACC *)scratch;
      launch_rows<T, ACC>(x, A * parts, parts, R, plen, op, PartialPost<ACC>{partial});
      launch_rows<ACC, ACC>(partial, A, 1, parts, parts, PartialsOp<Op, ACC>{op}, post);
      // Stream-ordered: a later user of this block runs on the same stream, after these.
      ddp_cuda_caching_free(scratch);
      return;
    }
    // No scratch memory: one group per row below (slower, same result).
  }
  launch_rows<T, ACC>(x, A, 1, R, R, op, post);
}

// ---- softmax --------------------------------------------------------------------------------

// max with NaN winning, commutative (every thread of a group gets the same value).
template <typename T>
struct MaxNan {
  __device__ T operator()(T a, T b) const { return (a > b || is_nan(a)) ? a : b; }
};

struct AddD {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// y = softmax(x) (log = 0) or log_softmax(x) along rows of length R: TPR threads per row.
template <int TPR, typename T>
__global__ void __launch_bounds__(THREADS)
    softmax_rows_kernel(T *__restrict__ y, const T *__restrict__ x, int64_t A, int64_t R,
                        int log) {
  __shared__ T smt[THREADS / WARP];
  __shared__ double smd[THREADS / WARP];
  constexpr int GROUPS = THREADS / TPR;
  const int g = threadIdx.x / TPR, t = threadIdx.x % TPR;
  for (int64_t a0 = (int64_t)blockIdx.x * GROUPS; a0 < A; a0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t a = a0 + g;
    const bool valid = a < A;
    const T *xr = x + (valid ? a : 0) * R;
    T *yr = y + (valid ? a : 0) * R;
    T mx = -INFINITY;
    if (valid)
      for (int64_t r = t; r < R; r += TPR) mx = MaxNan<T>()(mx, xr[r]);
    mx = group_reduce<TPR>(mx, MaxNan<T>(), smt);
    double s = 0;
    if (valid)
      for (int64_t r = t; r < R; r += TPR) s += (double)exp_t(xr[r] - mx);
    s = group_reduce<TPR>(s, AddD(), smd);
    if (valid) {
      if (log) {
        const T l = (T)::log(s);
        for (int64_t r = t; r < R; r += TPR) yr[r] = (xr[r] - mx) - l;
      } else {
        const T inv = (T)(1.0 / s);
        for (int64_t r = t; r < R; r += TPR) yr[r] = exp_t(xr[r] - mx) * inv;
      }
    }
  }
}

// The same over R of (A, R, B) with B > 1: tiles of COL_X columns, COL_Y threads along R.
template <typename T>
__global__ void __launch_bounds__(THREADS)
    softmax_cols_kernel(T *__restrict__ y, const T *__restrict__ x, int64_t A, int64_t R,
                        int64_t B, int log) {
  __shared__ T smt[COL_Y][COL_X];
  __shared__ double smd[COL_Y][COL_X];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t chunks = (B + COL_X - 1) / COL_X;
  for (int64_t tile = blockIdx.x; tile < A * chunks; tile += gridDim.x) {
    const int64_t a = tile / chunks, b = (tile % chunks) * COL_X + tx;
    const bool valid = b < B;
    const T *xc = x + a * R * B + (valid ? b : 0);
    T *yc = y + a * R * B + (valid ? b : 0);
    T mx = -INFINITY;
    if (valid)
      for (int64_t r = ty; r < R; r += COL_Y) mx = MaxNan<T>()(mx, xc[r * B]);
    smt[ty][tx] = mx;
    __syncthreads();
    mx = smt[0][tx];
#pragma unroll
    for (int k = 1; k < COL_Y; k++) mx = MaxNan<T>()(mx, smt[k][tx]);
    double s = 0;
    if (valid)
      for (int64_t r = ty; r < R; r += COL_Y) s += (double)exp_t(xc[r * B] - mx);
    smd[ty][tx] = s;
    __syncthreads();
    s = smd[0][tx];
#pragma unroll
    for (int k = 1; k < COL_Y; k++) s += smd[k][tx];
    if (valid) {
      if (log) {
        const T l = (T)::log(s);
        for (int64_t r = ty; r < R; r += COL_Y) yc[r * B] = (xc[r * B] - mx) - l;
      } else {
        const T inv = (T)(1.0 / s);
        for (int64_t r = ty; r < R; r += COL_Y) yc[r * B] = exp_t(xc[r * B] - mx) * inv;
      }
    }
    __syncthreads(); // smem is rewritten by the next tile
  }
}

// dx += y (dy - sum(dy y)) (softmax) or dx += dy - exp(y) sum(dy) (log_softmax), rows.
template <int TPR, typename T>
__global__ void __launch_bounds__(THREADS)
    softmax_backward_rows_kernel(T *__restrict__ dx, const T *__restrict__ y,
                                 const T *__restrict__ dy, int64_t A, int64_t R, int log) {
  __shared__ double smd[THREADS / WARP];
  constexpr int GROUPS = THREADS / TPR;
  const int g = threadIdx.x / TPR, t = threadIdx.x % TPR;
  for (int64_t a0 = (int64_t)blockIdx.x * GROUPS; a0 < A; a0 += (int64_t)gridDim.x * GROUPS) {
    const int64_t a = a0 + g;
    const bool valid = a < A;
    const int64_t base = (valid ? a : 0) * R;
    double s = 0;
    if (valid)
      for (int64_t r = t; r < R; r += TPR)
        s += log ? (double)dy[base + r] : (double)(dy[base + r] * y[base + r]);
    s = group_reduce<TPR>(s, AddD(), smd);
    if (valid) {
      const T st = (T)s;
      if (log)
        for (int64_t r = t; r < R; r += TPR)
          dx[base + r] += dy[base + r] - exp_t(y[base + r]) * st;
      else
        for (int64_t r = t; r < R; r += TPR) dx[base + r] += y[base + r] * (dy[base + r] - st);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(THREADS)
    softmax_backward_cols_kernel(T *__restrict__ dx, const T *__restrict__ y,
                                 const T *__restrict__ dy, int64_t A, int64_t R, int64_t B,
                                 int log) {
  __shared__ double smd[COL_Y][COL_X];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t chunks = (B + COL_X - 1) / COL_X;
  for (int64_t tile = blockIdx.x; tile < A * chunks; tile += gridDim.x) {
    const int64_t a = tile / chunks, b = (tile % chunks) * COL_X + tx;
    const bool valid = b < B;
    const int64_t base = a * R * B + (valid ? b : 0);
    double s = 0;
    if (valid)
      for (int64_t r = ty; r < R; r += COL_Y) {
        const int64_t i = base + r * B;
        s += log ? (double)dy[i] : (double)(dy[i] * y[i]);
      }
    smd[ty][tx] = s;
    __syncthreads();
    s = smd[0][tx];
#pragma unroll
    for (int k = 1; k < COL_Y; k++) s += smd[k][tx];
    if (valid) {
      const T st = (T)s;
      for (int64_t r = ty; r < R; r += COL_Y) {
        const int64_t i = base + r * B;
        if (log) dx[i] += dy[i] - exp_t(y[i]) * st;
        else dx[i] += y[i] * (dy[i] - st);
      }
    }
    __syncthreads(); // smem is rewritten by the next tile
  }
}

// ---- table entries (signatures and semantics of runtime/backend/cpu/reduce.h) -------------

// out = scale * sum x (or |x|), or sqrt(sum x^2), over R of (A, R, B); R == 0 gives 0.
template <typename T>
void sum_float(T *out, const T *x, int64_t A, int64_t R, int64_t B, int mode, double scale) {
  reduce(x, A, R, B, SumOp<T, double>{mode}, SumPost<T, double>{out, mode, scale});
}

void sum_i64(int64_t *out, const int64_t *x, int64_t A, int64_t R, int64_t B) {
  reduce(x, A, R, B, SumOp<int64_t, int64_t>{DDP_SUM_PLAIN},
         SumPost<int64_t, int64_t>{out, DDP_SUM_PLAIN, 1.0});
}

// out = M2 / (R - correction), its square root when take_sqrt (Welford / Chan, see top).
template <typename T>
void var_float(T *out, const T *x, int64_t A, int64_t R, int64_t B, double correction,
               int take_sqrt) {
  reduce(x, A, R, B, VarOp<T>{}, VarPost<T>{out, (double)R - correction, take_sqrt});
}

// values and first indices of the max (is_max) or min over R >= 1; NaN wins.
template <typename T>
void argext(T *values, int64_t *indices, const T *x, int64_t A, int64_t R, int64_t B,
            int is_max) {
  if (R == 0) return; // the ops layer refuses empty reductions; nothing to write
  reduce(x, A, R, B, ArgextOp<T>{is_max}, ArgextPost<T>{values, indices});
}

// Softmax (log 0) or log_softmax (log 1) over R of (A, R, B).
template <typename T>
void softmax(T *y, const T *x, int64_t A, int64_t R, int64_t B, int log) {
  if (A == 0 || B == 0 || R == 0) return;
  cudaStream_t s = ddp_cuda_stream();
  const unsigned tiles = grid_for(A * ((B + COL_X - 1) / COL_X), 1);
  if (B > 1)
    DDP_CUDA_LAUNCH((softmax_cols_kernel<T>), tiles, dim3(COL_X, COL_Y), 0, s, y, x, A, R, B, log);
  else if (R < ROW_LONG)
    DDP_CUDA_LAUNCH((softmax_rows_kernel<WARP, T>), grid_for(A, THREADS / WARP), THREADS, 0, s, y,
                      x, A, R, log);
  else
    DDP_CUDA_LAUNCH((softmax_rows_kernel<THREADS, T>), grid_for(A, 1), THREADS, 0, s, y, x, A, R,
                      log);
}

// Backward of softmax / log_softmax from its output y, accumulated into dx.
template <typename T>
void softmax_backward(T *dx, const T *y, const T *dy, int64_t A, int64_t R, int64_t B, int log) {
  if (A == 0 || B == 0 || R == 0) return;
  cudaStream_t s = ddp_cuda_stream();
  const unsigned tiles = grid_for(A * ((B + COL_X - 1) / COL_X), 1);
  if (B > 1)
    DDP_CUDA_LAUNCH((softmax_backward_cols_kernel<T>), tiles, dim3(COL_X, COL_Y), 0, s, dx, y, dy,
                      A, R, B, log);
  else if (R < ROW_LONG)
    DDP_CUDA_LAUNCH((softmax_backward_rows_kernel<WARP, T>), grid_for(A, THREADS / WARP),
                      THREADS, 0, s, dx, y, dy, A, R, log);
  else
    DDP_CUDA_LAUNCH((softmax_backward_rows_kernel<THREADS, T>), grid_for(A, 1), THREADS, 0, s, dx,
                      y, dy, A, R, log);
}

} // namespace

// Fill the reduce entries of the CUDA kernel table (called by kernels.cu).
extern "C" void ddp_cuda_register_reduce(ddp_kernels *k) {
  // Each entry picks the typed function from the dtype (Note [one dispatch path] in
  // runtime/backend/kernels.h); the ops layer has checked the dtype.
  k->sum = [](int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B, int mode,
              double scale) {
    if (dtype == DDP_F32)
      sum_float<float>((float *)out, (const float *)x, A, R, B, mode, scale);
    else if (dtype == DDP_F64)
      sum_float<double>((double *)out, (const double *)x, A, R, B, mode, scale);
    else // i64: a plain sum (mode and scale unused)
      sum_i64((int64_t *)out, (const int64_t *)x, A, R, B);
  };
  k->var = [](int dtype, void *out, const void *x, int64_t A, int64_t R, int64_t B,
              double correction, int take_sqrt) {
    if (dtype == DDP_F64)
      var_float<double>((double *)out, (const double *)x, A, R, B, correction, take_sqrt);
    else
      var_float<float>((float *)out, (const float *)x, A, R, B, correction, take_sqrt);
  };
  k->argext = [](int dtype, void *values, int64_t *indices, const void *x, int64_t A, int64_t R,
                 int64_t B, int is_max) {
    switch (dtype) {
    case DDP_F32:
      argext<float>((float *)values, indices, (const float *)x, A, R, B, is_max);
      break;
    case DDP_F64:
      argext<double>((double *)values, indices, (const double *)x, A, R, B, is_max);
      break;
    case DDP_I64:
      argext<int64_t>((int64_t *)values, indices, (const int64_t *)x, A, R, B, is_max);
      break;
    case DDP_I32:
      argext<int32_t>((int32_t *)values, indices, (const int32_t *)x, A, R, B, is_max);
      break;
    default: // u8, bool
      argext<uint8_t>((uint8_t *)values, indices, (const uint8_t *)x, A, R, B, is_max);
      break;
    }
  };
  k->softmax = [](int dtype, void *y, const void *x, int64_t A, int64_t R, int64_t B, int log) {
    if (dtype == DDP_F64)
      softmax<double>((double *)y, (const double *)x, A, R, B, log);
    else
      softmax<float>((float *)y, (const float *)x, A, R, B, log);
  };
  k->softmax_backward = [](int dtype, void *dx, const void *y, const void *dy, int64_t A, int64_t R,
                           int64_t B, int log) {
    if (dtype == DDP_F64)
      softmax_backward<double>((double *)dx, (const double *)y, (const double *)dy, A, R, B, log);
    else
      softmax_backward<float>((float *)dx, (const float *)y, (const float *)dy, A, R, B, log);
  };
}
