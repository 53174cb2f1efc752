// runtime/backend/cuda/attention.cu: CUDA kernels of scaled_dot_product_attention, with the
// semantics, layouts and dropout rule of the CPU kernels (runtime/backend/cpu/attention.h,
// ddp_attention_geom in runtime/backend/kernels.h; Note [attention dropout]). Templates
// over T (float, double); registered by ddp_cuda_register_attention. Everything runs
// asynchronously on the current stream.
//
// A straightforward kernel, not a tuned one: one warp per row, keys one at a time with an
// online softmax (Note [flash attention] in runtime/backend/cpu/attention.c), so nothing
// of size (L, S) is ever held, and no scratch memory is needed.
// q, k and v are read in place from their views (batch and row strides of the geometry).
// - forward: a warp per query row (bh, i); lanes split E for the dot products (a warp sum)
//   and Ev for the output row, which is its accumulator.
// - backward, dq (and dmask): a warp per query row, recomputing p = exp(s - lse) per key.
// - backward, dk and dv: a warp per key row (bh, j), walking the queries. Each warp writes
//   only its own row: no atomics, deterministic. D_i = dout_i . out_i is recomputed where
//   it is needed (twice the reads of a scratch buffer, none of its memory).
#include <math.h>

#include "backend/cuda/cuda_internal.h"

namespace {

enum { ATT_WARPS = 4, ATT_THREADS = 32 * ATT_WARPS };

__device__ inline float att_exp(float x) { return expf(x); }
__device__ inline double att_exp(double x) { return exp(x); }

template <typename T>
__device__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Philox 4x32-10 (runtime/core/rng.c: the same constants and rounds).
__device__ void philox(uint32_t out[4], uint64_t counter, uint64_t seed) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// Note [attention dropout]: element e of the probabilities is kept when word e % 4 of block
// offset + e / 4 is below (1 - p) 2^32.
__device__ bool att_keep(const ddp_attention_geom &g, int64_t e, uint64_t threshold) {
  uint32_t w[4];
  philox(w, g.offset + (uint64_t)e / 4, g.seed);
  return (uint64_t)w[e % 4] < threshold;
}

// Element offset of head bh in a view with batch strides sb (ddp_attention_geom).
__device__ int64_t att_batch_offset(const ddp_attention_geom &g, const int64_t *sb, int64_t bh) {
  int64_t off = 0;
  for (int d = g.nb - 1; d >= 0; d--) {
    int64_t size = g.batch_shape[d];
    off += (bh % size) * sb[d];
    bh /= size;
  }
  return off;
}

// Score (bh, i, j) after scale, mask and causality; every lane gets it.
template <typename T>
__device__ T att_score(const ddp_attention_geom &g, const T *qi, const T *kj, const void *mask,
                       int64_t mbase, int64_t i, int64_t j, int lane) {
  T acc = 0;
  for (int64_t c = lane; c < g.e; c += 32) acc += qi[c] * kj[c];
  T s = warp_sum(acc) * (T)g.scale;
  if (g.mask == DDP_ATTN_MASK_ADD)
    s += ((const T *)mask)[mbase + i * g.mask_sl + j * g.mask_ss];
  else if (g.mask == DDP_ATTN_MASK_BOOL && !((const uint8_t *)mask)[mbase + i * g.mask_sl + j * g.mask_ss])
    s = -INFINITY;
  if (g.causal && j > i) s = -INFINITY;
  return s;
}

template <typename T>
__device__ T att_dot(const T *a, const T *b, int64_t n, int lane) {
  T acc = 0;
  for (int64_t c = lane; c < n; c += 32) acc += a[c] * b[c];
  return warp_sum(acc);
}

template <typename T>
__global__ void attention_forward_kernel(T *out, T *lse, const T *q, const T *k, const T *v,
                                         const void *mask, ddp_attention_geom g, uint64_t thr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rows = g.bh * g.l;
  const T inv_keep = g.dropout_p > 0 ? (T)(1.0 / (1.0 - g.dropout_p)) : (T)1;
  for (int64_t row = (int64_t)blockIdx.x * ATT_WARPS + warp; row < rows;
       row += (int64_t)gridDim.x * ATT_WARPS) {
    const int64_t bh = row / g.l, i = row - bh * g.l;
    const T *qi = q + att_batch_offset(g, g.q_sb, bh) + i * g.q_sl;
    const T *kb = k + att_batch_offset(g, g.k_sb, bh), *vb = v + att_batch_offset(g, g.v_sb, bh);
    T *o = out + row * g.ev;
    const int64_t mbase = g.mask ? att_batch_offset(g, g.mask_sb, bh) : 0;
    for (int64_t c = lane; c < g.ev; c += 32) o[c] = 0;
    T m = -INFINITY, l = 0;
    const int64_t jend = g.causal && i + 1 < g.s ? i + 1 : g.s;
    for (int64_t j = 0; j < jend; j++) {
      const T s = att_score(g, qi, kb + j * g.k_sl, mask, mbase, i, j, lane);
      const T mnew = s > m ? s : m;
      const T ref = mnew == -INFINITY ? (T)0 : mnew;
      const T alpha = att_exp(m - ref), p = att_exp(s - ref);
      l = l * alpha + p;
      m = mnew;
      T pd = p;
      if (g.dropout_p > 0) pd = att_keep(g, row * g.s + j, thr) ? p * inv_keep : (T)0;
      const T *vj = vb + j * g.v_sl;
      for (int64_t c = lane; c < g.ev; c += 32) o[c] = o[c] * alpha + pd * vj[c];
    }
    const T inv = g.s ? 1 / l : (T)0; // no keys: zeros, as q kT v
    for (int64_t c = lane; c < g.ev; c += 32) o[c] *= inv;
    if (lane == 0) lse[row] = m + log(l);
  }
}

// p, and ds = p (dp z - D), of pair (bh, i, j) in every lane; pd = p z.
template <typename T>
__device__ void att_pair_grad(const ddp_attention_geom &g, const T *q, const T *k, const T *v,
                              const T *out, const T *dout, const T *lse, const void *mask,
                              int64_t mbase, int64_t bh, int64_t i, int64_t j, uint64_t thr,
                              T inv_keep, int lane, T *pd, T *ds) {
  const int64_t qrow = bh * g.l + i;
  const T *qi = q + att_batch_offset(g, g.q_sb, bh) + i * g.q_sl;
  const T *kj = k + att_batch_offset(g, g.k_sb, bh) + j * g.k_sl;
  const T *vj = v + att_batch_offset(g, g.v_sb, bh) + j * g.v_sl;
  const T s = att_score(g, qi, kj, mask, mbase, i, j, lane);
  const T p = att_exp(s - lse[qrow]);
  const T dp = att_dot(dout + qrow * g.ev, vj, g.ev, lane);
  const T D = att_dot(dout + qrow * g.ev, out + qrow * g.ev, g.ev, lane);
  T z = 1;
  if (g.dropout_p > 0) z = att_keep(g, qrow * g.s + j, thr) ? inv_keep : (T)0;
  *pd = p * z;
  *ds = p * (dp * z - D);
}

template <typename T>
__global__ void attention_dq_kernel(T *dq, T *dmask, const T *dout, const T *q, const T *k,
                                    const T *v, const T *out, const T *lse, const void *mask,
                                    ddp_attention_geom g, uint64_t thr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rows = g.bh * g.l;
  const T inv_keep = g.dropout_p > 0 ? (T)(1.0 / (1.0 - g.dropout_p)) : (T)1;
  for (int64_t row = (int64_t)blockIdx.x * ATT_WARPS + warp; row < rows;
       row += (int64_t)gridDim.x * ATT_WARPS) {
    const int64_t bh = row / g.l, i = row - bh * g.l;
    const int64_t mbase = g.mask ? att_batch_offset(g, g.mask_sb, bh) : 0;
    T *dqi = dq + row * g.e;
    for (int64_t j = 0; j < g.s; j++) {
      T pd = 0, ds = 0;
      if (!(g.causal && j > i))
        att_pair_grad(g, q, k, v, out, dout, lse, mask, mbase, bh, i, j, thr, inv_keep, lane, &pd, &ds);
      if (dmask && lane == 0) dmask[row * g.s + j] = ds;
      if (ds == 0) continue;
      const T *kj = k + att_batch_offset(g, g.k_sb, bh) + j * g.k_sl;
      for (int64_t c = lane; c < g.e; c += 32) dqi[c] += (T)g.scale * ds * kj[c];
    }
  }
}

template <typename T>
__global__ void attention_dkv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k,
                                     const T *v, const T *out, const T *lse, const void *mask,
                                     ddp_attention_geom g, uint64_t thr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rows = g.bh * g.s;
  const T inv_keep = g.dropout_p > 0 ? (T)(1.0 / (1.0 - g.dropout_p)) : (T)1;
  for (int64_t row = (int64_t)blockIdx.x * ATT_WARPS + warp; row < rows;
       row += (int64_t)gridDim.x * ATT_WARPS) {
    const int64_t bh = row / g.s, j = row - bh * g.s;
    const int64_t mbase = g.mask ? att_batch_offset(g, g.mask_sb, bh) : 0;
    T *dkj = dk + row * g.e, *dvj = dv + row * g.ev;
    for (int64_t i = g.causal ? j : 0; i < g.l; i++) {
      T pd, ds;
      att_pair_grad(g, q, k, v, out, dout, lse, mask, mbase, bh, i, j, thr, inv_keep, lane, &pd, &ds);
      const int64_t qrow = bh * g.l + i;
      const T *qi = q + att_batch_offset(g, g.q_sb, bh) + i * g.q_sl, *di = dout + qrow * g.ev;
      for (int64_t c = lane; c < g.ev; c += 32) dvj[c] += pd * di[c];
      for (int64_t c = lane; c < g.e; c += 32) dkj[c] += (T)g.scale * ds * qi[c];
    }
  }
}

unsigned att_blocks(int64_t rows) {
  int64_t b = (rows + ATT_WARPS - 1) / ATT_WARPS;
  if (b < 1) b = 1;
  if (b > 65535LL * 8) b = 65535LL * 8;
  return (unsigned)b;
}

uint64_t att_threshold(double p) {
  double t = (1.0 - p) * 4294967296.0;
  return t >= 4294967296.0 ? (uint64_t)1 << 32 : (uint64_t)t;
}

template <typename T>
int forward(void *out, void *lse, const void *q, const void *k, const void *v, const void *mask,
             const ddp_attention_geom *g) {
  DDP_CUDA_LAUNCH((attention_forward_kernel<T>), att_blocks(g->bh * g->l), ATT_THREADS, 0,
                  ddp_cuda_stream(), (T *)out, (T *)lse, (const T *)q, (const T *)k, (const T *)v,
                  mask, *g, att_threshold(g->dropout_p));
  return DDP_OK; // launch errors surface through ddp_device_check
}

template <typename T>
int backward(void *dq, void *dk, void *dv, void *dmask, const void *dout, const void *q,
              const void *k, const void *v, const void *out, const void *lse, const void *mask,
              const ddp_attention_geom *g) {
  const uint64_t thr = att_threshold(g->dropout_p);
  DDP_CUDA_LAUNCH((attention_dq_kernel<T>), att_blocks(g->bh * g->l), ATT_THREADS, 0,
                  ddp_cuda_stream(), (T *)dq, (T *)dmask, (const T *)dout, (const T *)q,
                  (const T *)k, (const T *)v, (const T *)out, (const T *)lse, mask, *g, thr);
  DDP_CUDA_LAUNCH((attention_dkv_kernel<T>), att_blocks(g->bh * g->s), ATT_THREADS, 0,
                  ddp_cuda_stream(), (T *)dk, (T *)dv, (const T *)dout, (const T *)q,
                  (const T *)k, (const T *)v, (const T *)out, (const T *)lse, mask, *g, thr);
  return DDP_OK;
}

} // namespace

extern "C" void ddp_cuda_register_attention(ddp_kernels *k) {
  k->attention_forward = [](int dtype, void *out, void *lse, const void *q, const void *kk,
                            const void *v, const void *mask, const ddp_attention_geom *g) {
    return dtype == DDP_F64 ? forward<double>(out, lse, q, kk, v, mask, g)
                            : forward<float>(out, lse, q, kk, v, mask, g);
  };
  k->attention_backward = [](int dtype, void *dq, void *dk, void *dv, void *dmask,
                             const void *dout, const void *q, const void *kk, const void *v,
                             const void *out, const void *lse, const void *mask,
                             const ddp_attention_geom *g) {
    return dtype == DDP_F64 ? backward<double>(dq, dk, dv, dmask, dout, q, kk, v, out, lse, mask, g)
                            : backward<float>(dq, dk, dv, dmask, dout, q, kk, v, out, lse, mask, g);
  };
}
