/* runtime/io/batch.c: batch collation (gather samples into one contiguous tensor) with
 * ToFloat, Normalize, RandomCrop and RandomHorizontalFlip fused into the one pass.
 * See io.h for the per-sample formula and Note [transform randomness]. */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"
#include "io/io_internal.h"

int ddp_io_plan(ddp_io_plan_t *p, const ddp_tensor *src, const ddp_io_transform *tf,
                const char *op) {
  memset(p, 0, sizeof *p);
  if (tf) p->tf = *tf;
  ddp_io_transform *t = &p->tf;
  if (src->ndim < 1) DDP_FAIL(DDP_ERR_ARG, "%s: the source must have a sample dimension, got a 0-d tensor", op);
  p->src_dtype = src->dtype;
  p->sample_ndim = src->ndim - 1;
  for (int d = 0; d < p->sample_ndim; d++) p->sample_shape[d] = src->shape[d + 1];
  int sn = p->sample_ndim;
  p->H = sn >= 2 ? src->shape[sn - 1] : 1;
  p->W = sn >= 1 ? src->shape[sn] : 1;
  p->C = 1;
  for (int d = 1; d < sn - 1; d++) p->C *= src->shape[d];
  if (sn == 1) p->C = 1;
  const char *sample = ddp_shape_str(sn, p->sample_shape);
  if (t->scale == 0) t->scale = 1;
  if (!isfinite(t->scale)) DDP_FAIL(DDP_ERR_ARG, "%s: ToFloat scale must be finite", op);
  if (t->normalize) {
    if (t->nchannels != 1 && t->nchannels != p->C)
      DDP_FAIL(DDP_ERR_ARG,
               "%s: Normalize has %d channels of mean/std but samples %s have %lld channels",
               op, t->nchannels, sample, (long long)p->C);
    if (t->nchannels > 16)
      DDP_FAIL(DDP_ERR_ARG, "%s: Normalize takes at most 16 channels, got %d", op, t->nchannels);
    for (int c = 0; c < t->nchannels; c++)
      if (t->std[c] == 0 || !isfinite(t->std[c]) || !isfinite(t->mean[c]))
        DDP_FAIL(DDP_ERR_ARG, "%s: Normalize: std[%d] = %g, mean[%d] = %g (std must be non-zero, both finite)",
                 op, c, t->std[c], c, t->mean[c]);
  }
  if (!(t->flip_p >= 0 && t->flip_p <= 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: RandomHorizontalFlip p must be in [0, 1], got %g", op, t->flip_p);
  if (t->padding < 0) DDP_FAIL(DDP_ERR_ARG, "%s: RandomCrop padding must be >= 0, got %d", op, t->padding);
  if (t->crop_h < 0 || t->crop_w < 0 || (t->crop_h == 0) != (t->crop_w == 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: RandomCrop size (%d, %d) must be both positive (or both 0: no crop)",
             op, t->crop_h, t->crop_w);
  if (t->padding && !t->crop_h)
    DDP_FAIL(DDP_ERR_ARG, "%s: padding %d given without a crop size", op, t->padding);
  int has_crop = t->crop_h > 0, has_flip = t->flip_p > 0;
  p->geometric = has_crop || has_flip;
  if (p->geometric && sn < 2)
    DDP_FAIL(DDP_ERR_ARG, "%s: RandomCrop / RandomHorizontalFlip need samples of at least 2 dims (H, W), got %s",
             op, sample);
  p->OH = p->H;
  p->OW = p->W;
  if (has_crop) {
    if (t->crop_h > p->H + 2 * t->padding || t->crop_w > p->W + 2 * t->padding)
      DDP_FAIL(DDP_ERR_ARG, "%s: RandomCrop size (%d, %d) is larger than the padded sample (%lld, %lld) (samples %s, padding %d)",
               op, t->crop_h, t->crop_w, (long long)(p->H + 2 * t->padding),
               (long long)(p->W + 2 * t->padding), sample, t->padding);
    p->OH = t->crop_h;
    p->OW = t->crop_w;
    p->sample_shape[sn - 2] = p->OH;
    p->sample_shape[sn - 1] = p->OW;
  }
  p->random = has_flip || (has_crop && (p->OH < p->H + 2 * t->padding || p->OW < p->W + 2 * t->padding));
  p->out_float = t->to_float || t->normalize;
  p->out_dtype = p->out_float ? DDP_F32 : src->dtype;
  p->in_numel = p->C * p->H * p->W;
  p->out_numel = p->C * p->OH * p->OW;
  return DDP_OK;
}

/* Load n elements of dtype from p (step `step` bytes) into dst as float. */
static void load_row(float *dst, const char *p, int64_t step, int64_t n, int dtype) {
  switch (dtype) {
  case DDP_U8:
  case DDP_BOOL:
    for (int64_t i = 0; i < n; i++) dst[i] = (float)*(const uint8_t *)(p + i * step);
    break;
  case DDP_F32:
    for (int64_t i = 0; i < n; i++) dst[i] = *(const float *)(p + i * step);
    break;
  case DDP_F64:
    for (int64_t i = 0; i < n; i++) dst[i] = (float)*(const double *)(p + i * step);
    break;
  case DDP_I32:
    for (int64_t i = 0; i < n; i++) dst[i] = (float)*(const int32_t *)(p + i * step);
    break;
  case DDP_I64:
    for (int64_t i = 0; i < n; i++) dst[i] = (float)*(const int64_t *)(p + i * step);
    break;
  case DDP_F16:
    for (int64_t i = 0; i < n; i++) dst[i] = ddp_f16_to_f32(*(const uint16_t *)(p + i * step));
    break;
  case DDP_BF16:
    for (int64_t i = 0; i < n; i++) dst[i] = ddp_bf16_to_f32(*(const uint16_t *)(p + i * step));
    break;
  }
}

/* Copy n elements of esize bytes from p (step `step` bytes) to dst (packed). */
static void copy_row(char *dst, const char *p, int64_t step, int64_t n, size_t esize) {
  if (step == (int64_t)esize) {
    memcpy(dst, p, (size_t)n * esize);
    return;
  }
  for (int64_t i = 0; i < n; i++) memcpy(dst + (size_t)i * esize, p + i * step, esize);
}

/* Note [u8 lookup]: a u8 image made float goes through ToFloat and Normalize, (double)u * a
 * + b rounded once to f32 (a = scale / std, b = -mean / std), 28 x 28 times a sample: in
 * double, element by element, that was ~1.5 ns a pixel on the prefetch thread (75 us of
 * CPU a batch of 64, a tenth of an MLP step taken from the training threads). A u8 has 256
 * values, so each channel's 256 results are computed once a batch, by the same expression,
 * and the pixels are looked up: the same bits (spec/data_memory_spec.lua checks them over
 * the whole training set). Up to LUT_CHANNELS channels; more take the arithmetic path. */
enum { LUT_CHANNELS = 16 };

/* Channel c's ToFloat + Normalize as x * a + b: a = scale / std, b = -mean / std (a = scale,
 * b = 0 without Normalize; one mean/std pair serves every channel when nchannels is 1). */
static void channel_affine(const ddp_io_transform *t, int64_t c, double *a, double *b) {
  *a = t->scale;
  *b = 0;
  if (t->normalize) {
    int k = t->nchannels == 1 ? 0 : (int)c;
    *a = t->scale / t->std[k];
    *b = -t->mean[k] / t->std[k];
  }
}

/* lut[c * 256 + u]: the float value of u8 level u in channel c under p's ToFloat and
 * Normalize (the expression of sample_kernel's arithmetic path). */
static void build_lut(float *lut, const ddp_io_plan_t *p) {
  const ddp_io_transform *t = &p->tf;
  for (int64_t c = 0; c < p->C; c++) {
    double a, b;
    channel_affine(t, c, &a, &b);
    for (int u = 0; u < 256; u++)
      lut[c * 256 + u] = (a != 1 || b != 0) ? (float)((double)(float)u * a + b) : (float)u;
  }
}

/* o[i] = l[r[i]] for i < n: the u8 levels' table values (Note [u8 lookup]). Eight at a time
 * with an AVX2 gather of the same table entries, so the same bits as the scalar loop: the
 * strided scalar loop cost ~1.6 ns a pixel (80 us of a batch of 64 28x28 images, 7-9% of an
 * MLP step at 1 thread, and in DDP 2 x 1 on the cores the ranks need). */
static void lut_run(float *o, const uint8_t *r, int64_t n, const float *l) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r + i)));
    _mm256_storeu_ps(o + i, _mm256_i32gather_ps(l, k, 4));
  }
#endif
  for (; i < n; i++) o[i] = l[r[i]];
}

/* One sample. src: element (0, 0, 0) of the sample; coff[c]: byte offset of channel c;
 * sh, sw: byte strides of H and W. dst: (C, OH, OW) packed of the output dtype. lut: the
 * u8 levels' values per channel (Note [u8 lookup]), or NULL. */
static void sample_kernel(char *dst, const char *src, const int64_t *coff, int64_t sh,
                          int64_t sw, const ddp_io_plan_t *p, int flip, int64_t oy, int64_t ox,
                          const float *lut) {
  const ddp_io_transform *t = &p->tf;
  int64_t pad = p->geometric ? t->padding : 0;
  size_t esize = ddp_dtype_size(p->src_dtype);
  /* the output columns x in [x0, x1) read the sample; sx = x + ox - pad, or with flip
   * sx = (OW - 1 - x) + ox - pad */
  int64_t x0, x1;
  {
    int64_t lo = pad - ox, hi = p->W + pad - ox; /* unflipped x with 0 <= sx < W */
    if (lo < 0) lo = 0;
    if (hi > p->OW) hi = p->OW;
    if (hi < lo) hi = lo;
    if (flip) { x0 = p->OW - hi; x1 = p->OW - lo; }
    else { x0 = lo; x1 = hi; }
  }
  int64_t n_in = x1 - x0;
  if (lut && !p->geometric && sw == 1 && sh == p->W) { /* each channel's plane is one run */
    for (int64_t c = 0; c < p->C; c++)
      lut_run((float *)dst + c * p->OH * p->OW, (const uint8_t *)src + coff[c], p->H * p->W, lut + c * 256);
    return;
  }
  for (int64_t c = 0; c < p->C; c++) {
    double a, b;
    channel_affine(t, c, &a, &b);
    float padv = t->pad_mode == DDP_IO_PAD_OUTPUT ? 0.0f : (float)b;
    for (int64_t y = 0; y < p->OH; y++) {
      int64_t sy = y + oy - pad;
      int inside = sy >= 0 && sy < p->H && n_in > 0;
      const char *row = src + coff[c] + (inside ? sy * sh : 0);
      /* first source column read, and the step between output columns */
      int64_t sx0 = flip ? (p->OW - 1 - x0) + ox - pad : x0 + ox - pad;
      int64_t step = flip ? -sw : sw;
      if (p->out_float) {
        float *o = (float *)dst + (c * p->OH + y) * p->OW;
        if (!inside) {
          for (int64_t x = 0; x < p->OW; x++) o[x] = padv;
          continue;
        }
        for (int64_t x = 0; x < x0; x++) o[x] = padv;
        for (int64_t x = x1; x < p->OW; x++) o[x] = padv;
        if (lut) {
          const uint8_t *r = (const uint8_t *)(row + sx0 * sw);
          const float *l = lut + c * 256;
          if (step == 1) lut_run(o + x0, r, n_in, l);
          else for (int64_t i = 0; i < n_in; i++) o[x0 + i] = l[r[i * step]];
          continue;
        }
        load_row(o + x0, row + sx0 * sw, step, n_in, p->src_dtype);
        if (a != 1 || b != 0) /* in double: u8 / 255 then normalize rounds once */
          for (int64_t x = x0; x < x1; x++) o[x] = (float)((double)o[x] * a + b);
      } else {
        char *o = dst + (size_t)((c * p->OH + y) * p->OW) * esize;
        if (!inside) {
          memset(o, 0, (size_t)p->OW * esize);
          continue;
        }
        memset(o, 0, (size_t)x0 * esize);
        memset(o + (size_t)x1 * esize, 0, (size_t)(p->OW - x1) * esize);
        copy_row(o + (size_t)x0 * esize, row + sx0 * sw, step, n_in, esize);
      }
    }
  }
}

/* Note [gather prefetch]: a batch reads B samples at random places of a source much larger
 * than the caches (Fashion-MNIST's 47 MB of u8), and each sample's first touch waited for
 * memory: collating 64 28x28 images took ~45 us, of which ~8 us is the lookup itself
 * (bench on this machine, a u8 source in cache vs at random rows). The gather therefore
 * asks for sample b + PREFETCH_AHEAD's bytes (one software prefetch per cache line, up to
 * PREFETCH_MAX_BYTES) before it converts sample b: ~20 us a batch at one thread through the
 * loader (~13 us in a bare C loop over the same kind of data). Only for a source whose
 * samples are each one contiguous run; a hint, so no value changes. */
enum { PREFETCH_AHEAD = 2, PREFETCH_MAX_BYTES = 16384, CACHE_LINE = 64 };

/* always_inline: GCC 12 finds an out-of-line prefetch_span "const" (a prefetch has no
 * effect it models) and deletes the calls, prefetches and all. */
static inline __attribute__((always_inline)) void prefetch_span(const char *p, int64_t bytes) {
  if (bytes <= 0) return;
  for (int64_t off = 0; off < bytes; off += CACHE_LINE) __builtin_prefetch(p + off, 0, 3);
  __builtin_prefetch(p + bytes - 1, 0, 3); /* the last line when p is not line-aligned */
}

/* Note [gather on the pool]: a gather made on the caller's thread (ddp_io_collate, the
 * loader without a prefetch thread) splits its samples over the fork-join pool, each part
 * at least GATHER_GRAIN_BYTES of output; on the prefetch thread it runs alone (the pool is
 * the training threads'). Sample b's values depend only on its index and Philox block
 * (seed, base + b), never on the split. */
enum { GATHER_GRAIN_BYTES = 32768 };

/* Philox block (seed, b): the random words of one sample. */
static void sample_words(uint32_t w[4], uint64_t seed, uint64_t b) {
  uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  ddp_philox4x32_10(w, ctr, key);
}

/* What every sample of one gather shares (gather_range's context). */
typedef struct {
  const ddp_io_plan_t *p;
  const int64_t *idx, *coff;
  const char *base_ptr;
  char *dst;
  int64_t sh, sw, sample_stride, span;
  size_t out_bytes;
  int contiguous_copy;
  const float *lut;
  uint64_t seed, base;
} gather_job;

/* Samples [b0, b1) of a gather. */
static void gather_range(void *vctx, int64_t b0, int64_t b1) {
  const gather_job *j = vctx;
  const ddp_io_plan_t *p = j->p;
  for (int64_t b = b0; b < b1 && b < b0 + PREFETCH_AHEAD; b++)
    prefetch_span(j->base_ptr + j->idx[b] * j->sample_stride, j->span);
  for (int64_t b = b0; b < b1; b++) {
    const char *s = j->base_ptr + j->idx[b] * j->sample_stride;
    if (b + PREFETCH_AHEAD < b1)
      prefetch_span(j->base_ptr + j->idx[b + PREFETCH_AHEAD] * j->sample_stride, j->span);
    char *o = j->dst + (size_t)b * j->out_bytes;
    if (j->contiguous_copy) {
      memcpy(o, s, j->out_bytes);
      continue;
    }
    int flip = 0;
    int64_t oy = 0, ox = 0;
    if (p->random) {
      uint32_t w[4];
      sample_words(w, j->seed, j->base + (uint64_t)b);
      flip = (double)w[0] * (1.0 / 4294967296.0) < p->tf.flip_p;
      if (p->tf.crop_h) {
        oy = (int64_t)(w[1] % (uint64_t)(p->H + 2 * p->tf.padding - p->OH + 1));
        ox = (int64_t)(w[2] % (uint64_t)(p->W + 2 * p->tf.padding - p->OW + 1));
      }
    } else if (p->tf.crop_h) {
      oy = (p->H + 2 * p->tf.padding - p->OH) / 2; /* no room: the window is fixed */
      ox = (p->W + 2 * p->tf.padding - p->OW) / 2;
    }
    sample_kernel(o, s, j->coff, j->sh, j->sw, p, flip, oy, ox, j->lut);
  }
}

int ddp_io_gather(ddp_tensor **out, const ddp_tensor *src, const int64_t *idx, int64_t B,
                  int batch_dim, const ddp_io_plan_t *p, uint64_t seed, uint64_t base,
                  int use_pool) {
  *out = NULL;
  int64_t shape[DDP_MAX_DIMS];
  int ndim = 0;
  if (batch_dim) shape[ndim++] = B;
  for (int d = 0; d < p->sample_ndim; d++) shape[ndim++] = p->sample_shape[d];
  ddp_tensor *t = NULL;
  DDP_TRY(ddp_tensor_empty(&t, ndim, shape, p->out_dtype, DDP_DEVICE_CPU));
  size_t esize_in = ddp_dtype_size(p->src_dtype), esize_out = ddp_dtype_size(p->out_dtype);
  int sn = p->sample_ndim;
  int64_t coff_small[64];
  int64_t *coff = p->C <= 64 ? coff_small : malloc((size_t)p->C * sizeof *coff);
  if (!coff) {
    ddp_tensor_release(t);
    DDP_FAIL(DDP_ERR_MEMORY, "collate: out of memory");
  }
  /* channel offsets unravel C over the sample's leading dims */
  for (int64_t c = 0; c < p->C; c++) {
    int64_t rem = c, off = 0;
    for (int d = sn - 2; d >= 1; d--) { /* sample dims 0 .. sn-3 are src dims 1 .. sn-2 */
      off += (rem % src->shape[d]) * src->strides[d];
      rem /= src->shape[d];
    }
    coff[c] = off * (int64_t)esize_in;
  }
  float lut_buf[LUT_CHANNELS * 256];
  int contiguous = ddp_tensor_is_contiguous(src);
  gather_job j = {
      .p = p, .idx = idx, .coff = coff, .base_ptr = ddp_data(src), .dst = ddp_data(t),
      /* byte strides of the sample seen as (C, H, W) */
      .sh = sn >= 2 ? src->strides[sn - 1] * (int64_t)esize_in : 0,
      .sw = sn >= 1 ? src->strides[sn] * (int64_t)esize_in : 0,
      .sample_stride = src->strides[0] * (int64_t)esize_in,
      /* Note [gather prefetch]: the bytes a sample reads, when they are one run */
      .span = contiguous ? p->in_numel * (int64_t)esize_in : 0,
      .out_bytes = (size_t)p->out_numel * esize_out,
      .contiguous_copy = !p->geometric && !p->out_float && contiguous,
      .seed = seed, .base = base};
  if (j.span > PREFETCH_MAX_BYTES) j.span = PREFETCH_MAX_BYTES;
  if (p->out_float && p->src_dtype == DDP_U8 && p->C <= LUT_CHANNELS) { /* Note [u8 lookup] */
    build_lut(lut_buf, p);
    j.lut = lut_buf;
  }
  if (use_pool) { /* Note [gather on the pool] */
    int64_t grain = (int64_t)(GATHER_GRAIN_BYTES / (j.out_bytes ? j.out_bytes : 1));
    ddp_parallel_for(B, grain > 0 ? grain : 1, gather_range, &j);
  } else {
    gather_range(&j, 0, B);
  }
  if (coff != coff_small) free(coff);
  *out = t;
  return DDP_OK;
}

int ddp_io_collate(ddp_tensor **out, ddp_tensor *src, ddp_tensor *indices,
                   const ddp_io_transform *tf, ddp_generator *g) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(src, "collate", "src"));
  DDP_TRY(ddp_check_alive(indices, "collate", "indices"));
  if (indices->dtype != DDP_I64 && indices->dtype != DDP_I32)
    DDP_FAIL(DDP_ERR_ARG, "collate: indices must be i64 or i32, got %s", ddp_dtype_name(indices->dtype));
  if (indices->ndim > 1)
    DDP_FAIL(DDP_ERR_ARG, "collate: indices must be 0-d or 1-d, got %s", DDP_SHAPE(indices));
  ddp_io_plan_t plan;
  DDP_TRY(ddp_io_plan(&plan, src, tf, "collate"));
  int64_t B = indices->numel;
  int64_t *idx = malloc((size_t)(B ? B : 1) * sizeof *idx);
  if (!idx) DDP_FAIL(DDP_ERR_MEMORY, "collate: out of memory for %lld indices", (long long)B);
  const char *ip = ddp_data(indices);
  int64_t istride = indices->ndim ? indices->strides[0] : 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t v = indices->dtype == DDP_I64 ? ((const int64_t *)ip)[b * istride]
                                          : ((const int32_t *)ip)[b * istride];
    if (v < 0 || v >= src->shape[0]) {
      free(idx);
      DDP_FAIL(DDP_ERR_ARG, "collate: index %lld at position %lld is out of range for a source of %lld samples %s",
               (long long)v, (long long)b, (long long)src->shape[0], DDP_SHAPE(src));
    }
    idx[b] = v;
  }
  uint64_t seed = 0, base = 0;
  if (plan.random) {
    if (!g) g = ddp_generator_default();
    ddp_generator_get_state(g, &seed, &base);
    ddp_generator_set_state(g, seed, base + (uint64_t)B);
  }
  int status = ddp_io_gather(out, src, idx, B, indices->ndim, &plan, seed, base, 1);
  free(idx);
  return status;
}

int ddp_io_stack_check(int n, ddp_tensor **items) {
  if (n < 1 || !items) DDP_FAIL(DDP_ERR_ARG, "stack: expected at least one tensor, got %d", n);
  for (int i = 0; i < n; i++) {
    char arg[32];
    snprintf(arg, sizeof arg, "items[%d]", i);
    DDP_TRY(ddp_check_alive(items[i], "stack", arg));
    const ddp_tensor *a = items[0], *b = items[i];
    int same = a->ndim == b->ndim && a->dtype == b->dtype;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (!same)
      DDP_FAIL(DDP_ERR_ARG, "stack: item %d is %s %s but item 0 is %s %s (items count from 0)", i,
               DDP_SHAPE(b), ddp_dtype_name(b->dtype), DDP_SHAPE(a), ddp_dtype_name(a->dtype));
  }
  if (items[0]->ndim >= DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "stack: items of %d dims leave no room for the batch dim", items[0]->ndim);
  return DDP_OK;
}

int ddp_io_stack_into(ddp_tensor *t, int n, ddp_tensor **items) {
  const ddp_tensor *a = items[0];
  size_t bytes = (size_t)a->numel * ddp_dtype_size(a->dtype);
  for (int i = 0; i < n; i++) {
    ddp_tensor *it = items[i];
    if (ddp_tensor_is_contiguous(it)) {
      if (bytes) memcpy(ddp_data(t) + i * bytes, ddp_data(it), bytes);
      continue;
    }
    /* strided item: copy through detached views (no autograd is recorded) */
    int64_t strides[DDP_MAX_DIMS];
    ddp_contiguous_strides(a->ndim, a->shape, strides);
    ddp_tensor *slot = NULL, *src = ddp_tensor_alias(it);
    int status = src ? ddp_tensor_view_raw(&slot, t, a->ndim, a->shape, strides, (int64_t)i * a->numel)
                     : ddp_last_status();
    if (!status) status = ddp_copy_(slot, src);
    ddp_tensor_release(slot);
    ddp_tensor_release(src);
    if (status) return status;
  }
  return DDP_OK;
}

int ddp_io_stack(ddp_tensor **out, int n, ddp_tensor **items) {
  *out = NULL;
  DDP_TRY(ddp_io_stack_check(n, items));
  const ddp_tensor *a = items[0];
  int64_t shape[DDP_MAX_DIMS];
  shape[0] = n;
  for (int d = 0; d < a->ndim; d++) shape[d + 1] = a->shape[d];
  ddp_tensor *t = NULL;
  DDP_TRY(ddp_tensor_empty(&t, a->ndim + 1, shape, a->dtype, DDP_DEVICE_CPU));
  int status = ddp_io_stack_into(t, n, items);
  if (status) {
    ddp_tensor_release(t);
    return status;
  }
  *out = t;
  return DDP_OK;
}
