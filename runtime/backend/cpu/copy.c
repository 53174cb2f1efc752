/* runtime/backend/cpu/copy.c: CPU kernels of copies (any dtypes and strides) and fills. */
#include "backend/cpu/copy.h"

#include <string.h>

enum { COPY_GRAIN = 1 << 16 }; /* elements per thread chunk: below this, one thread */

typedef struct { int dst_dtype, src_dtype; } convert_ctx;

static void copy_loop(void *vctx, char **p, const int64_t *s, int64_t n) {
  const convert_ctx *c = vctx;
  char *d = p[0], *src = p[1];
  if (c->dst_dtype == c->src_dtype) {
    size_t es = ddp_dtype_size(c->dst_dtype);
    if (s[0] == (int64_t)es && s[1] == (int64_t)es) {
      memcpy(d, src, (size_t)n * es);
      return;
    }
    switch (es) {
    case 8: for (int64_t i = 0; i < n; i++) *(uint64_t *)(d + i * s[0]) = *(const uint64_t *)(src + i * s[1]); return;
    case 4: for (int64_t i = 0; i < n; i++) *(uint32_t *)(d + i * s[0]) = *(const uint32_t *)(src + i * s[1]); return;
    case 2: for (int64_t i = 0; i < n; i++) *(uint16_t *)(d + i * s[0]) = *(const uint16_t *)(src + i * s[1]); return;
    default: for (int64_t i = 0; i < n; i++) d[i * s[0]] = src[i * s[1]]; return;
    }
  }
  if (c->dst_dtype == DDP_F32 && c->src_dtype == DDP_F64) {
    for (int64_t i = 0; i < n; i++) *(float *)(d + i * s[0]) = (float)*(const double *)(src + i * s[1]);
    return;
  }
  if (c->dst_dtype == DDP_F64 && c->src_dtype == DDP_F32) {
    for (int64_t i = 0; i < n; i++) *(double *)(d + i * s[0]) = *(const float *)(src + i * s[1]);
    return;
  }
  /* f32 <-> f16 (fp16_compress_hook, casts): Note [f16 bulk conversion] when both sides
   * are contiguous, the scalar conversions (the same bits) otherwise */
  if (c->dst_dtype == DDP_F16 && c->src_dtype == DDP_F32) {
    if (s[0] == 2 && s[1] == 4) {
      ddp_f32_to_f16_n((uint16_t *)d, (const float *)src, n);
      return;
    }
    for (int64_t i = 0; i < n; i++)
      *(uint16_t *)(d + i * s[0]) = ddp_f32_to_f16(*(const float *)(src + i * s[1]));
    return;
  }
  if (c->dst_dtype == DDP_F32 && c->src_dtype == DDP_F16) {
    if (s[0] == 4 && s[1] == 2) {
      ddp_f16_to_f32_n((float *)d, (const uint16_t *)src, n);
      return;
    }
    for (int64_t i = 0; i < n; i++)
      *(float *)(d + i * s[0]) = ddp_f16_to_f32(*(const uint16_t *)(src + i * s[1]));
    return;
  }
  /* f32 <-> bf16, autocast's casts on the CPU: the bit operations of ddp_bf16_to_f32 and
   * ddp_f32_to_bf16 (round to nearest even, NaN kept quiet) inline, so the loop vectorises
   * instead of calling them through ddp_load_f64 / ddp_store_f64 per element */
  if (c->dst_dtype == DDP_BF16 && c->src_dtype == DDP_F32) {
    for (int64_t i = 0; i < n; i++) {
      uint32_t x;
      memcpy(&x, src + i * s[1], 4);
      uint16_t h = (x & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((x >> 16) | 0x40)
                                                   : (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
      memcpy(d + i * s[0], &h, 2);
    }
    return;
  }
  if (c->dst_dtype == DDP_F32 && c->src_dtype == DDP_BF16) {
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, src + i * s[1], 2);
      uint32_t x = (uint32_t)h << 16;
      memcpy(d + i * s[0], &x, 4);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++)
    ddp_store_f64(d + i * s[0], c->dst_dtype, ddp_load_f64(src + i * s[1], c->src_dtype));
}

void ddp_cpu_copy(ddp_tensor *dst, const ddp_tensor *src) {
  convert_ctx c = {dst->dtype, src->dtype};
  ddp_tensor *ops[2] = {dst, (ddp_tensor *)src};
  ddp_foreach(2, ops, dst->ndim, dst->shape, copy_loop, &c, COPY_GRAIN);
}

typedef struct { char value[8]; size_t esize; int zero; } fill_ctx;

/* typed stores per element size (a memcpy of a run-time size per element is a call each);
 * a contiguous fill with zero bytes is one memset */
static void fill_loop(void *vctx, char **p, const int64_t *s, int64_t n) {
  const fill_ctx *c = vctx;
  char *d = p[0];
  if (s[0] == (int64_t)c->esize && c->zero) {
    memset(d, 0, (size_t)n * c->esize);
    return;
  }
  uint64_t v8;
  uint32_t v4;
  uint16_t v2;
  switch (c->esize) {
  case 8: memcpy(&v8, c->value, 8); for (int64_t i = 0; i < n; i++) *(uint64_t *)(d + i * s[0]) = v8; return;
  case 4: memcpy(&v4, c->value, 4); for (int64_t i = 0; i < n; i++) *(uint32_t *)(d + i * s[0]) = v4; return;
  case 2: memcpy(&v2, c->value, 2); for (int64_t i = 0; i < n; i++) *(uint16_t *)(d + i * s[0]) = v2; return;
  default: for (int64_t i = 0; i < n; i++) d[i * s[0]] = c->value[0]; return;
  }
}

void ddp_cpu_fill(ddp_tensor *t, double value) {
  fill_ctx c = {.esize = ddp_dtype_size(t->dtype)};
  ddp_store_f64(c.value, t->dtype, value);
  static const char zeros[8];
  c.zero = !memcmp(c.value, zeros, c.esize);
  ddp_foreach(1, &t, t->ndim, t->shape, fill_loop, &c, COPY_GRAIN);
}
