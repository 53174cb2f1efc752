/* runtime/io/image_ops.c: the image kernels of the vision transforms (ddplua/image.h):
 * crop + bilinear resize, horizontal flip, brightness / contrast, HWC u8 -> CHW f32.
 * They follow torchvision 0.14's tensor functions (torchvision/transforms/functional_tensor.py)
 * and PyTorch's upsample_bilinear2d (aten/src/ATen/native/UpSample.h), computing in f32 as
 * they do; they record no autograd (images are data) and run on the caller's thread or the
 * fork-join pool. */
#include <math.h>
#include <stdlib.h>

#include "core/core.h"
#include "io/io_internal.h"

/* Check img for a kernel: u8 or f32, >= 2 dims, CPU; gives a contiguous reference (the
 * caller releases it) and its planes (product of the leading dims), H and W. */
static int image_in(const char *op, ddp_tensor *img, ddp_tensor **c, int64_t *planes, int64_t *h,
                    int64_t *w) {
  *c = NULL;
  if (!img) DDP_FAIL(DDP_ERR_ARG, "%s: image is NULL", op);
  if ((img->dtype != DDP_U8 && img->dtype != DDP_F32) || img->ndim < 2 ||
      img->device != DDP_DEVICE_CPU)
    DDP_FAIL(DDP_ERR_ARG, "%s: expected a u8 or f32 CPU image (C, H, W), got a %dd %s tensor%s", op,
             img->ndim, ddp_dtype_name(img->dtype),
             img->device != DDP_DEVICE_CPU ? " on a CUDA device" : "");
  DDP_TRY(ddp_contiguous(c, img));
  *h = img->shape[img->ndim - 2];
  *w = img->shape[img->ndim - 1];
  *planes = 1;
  for (int d = 0; d < img->ndim - 2; d++) *planes *= img->shape[d];
  return DDP_OK;
}

/* A new tensor like img with the last two sizes (oh, ow) and dtype `dtype`. */
static int image_out(ddp_tensor **out, const ddp_tensor *img, int64_t oh, int64_t ow, int dtype) {
  int64_t shape[DDP_MAX_DIMS];
  for (int d = 0; d < img->ndim; d++) shape[d] = img->shape[d];
  shape[img->ndim - 2] = oh;
  shape[img->ndim - 1] = ow;
  return ddp_tensor_empty(out, img->ndim, shape, dtype, DDP_DEVICE_CPU);
}

/* ---- crop + bilinear resize ------------------------------------------------------------ */

/* One output coordinate's two source taps and weights (PyTorch's
 * area_pixel_compute_source_index with align_corners = False, in f32). */
typedef struct {
  int64_t i0, i1;
  float l0, l1;
} tap;

static void taps(tap *t, int64_t in, int64_t out) {
  float scale = (float)in / (float)out;
  for (int64_t o = 0; o < out; o++) {
    float src = scale * ((float)o + 0.5f) - 0.5f;
    if (src < 0) src = 0;
    int64_t i0 = (int64_t)src;
    if (i0 > in - 1) i0 = in - 1;
    t[o].i0 = i0;
    t[o].i1 = i0 + (i0 < in - 1 ? 1 : 0);
    t[o].l1 = src - (float)i0;
    t[o].l0 = 1.0f - t[o].l1;
  }
}

typedef struct {
  const ddp_tensor *src, *dst;
  int64_t H, W, top, left, oh, ow;
  const tap *ty, *tx;
} resize_ctx;

/* Pixel (y, x) of the window (0 outside the image), as f32. */
static inline float window_px(const resize_ctx *c, const void *plane, int64_t y, int64_t x) {
  y += c->top;
  x += c->left;
  if (y < 0 || y >= c->H || x < 0 || x >= c->W) return 0.0f;
  if (c->src->dtype == DDP_U8) return (float)((const uint8_t *)plane)[y * c->W + x];
  return ((const float *)plane)[y * c->W + x];
}

/* Note [separable resize]: inside the image (Resize, RandomResizedCrop) an output pixel is
 *   ty.l0 * (tx.l0 * r0[tx.i0] + tx.l1 * r0[tx.i1]) + ty.l1 * (tx.l0 * r1[tx.i0] + tx.l1 * r1[tx.i1])
 * (PyTorch's upsample_bilinear2d), whose two inner sums are source rows r0 and r1 resized
 * horizontally. So each source row a chunk needs is resized once into a row of ow floats,
 * kept while consecutive output rows use it (an upscale uses each source row for several
 * output rows), and an output row is one vectorizable pass over two such rows: the same
 * operations in the same order as the direct four-tap form (the same results, bit for bit,
 * as before this note: the compiler fuses the same products; 600 random windows, u8 and
 * f32, compared), in ~40% of the time: in an ImageFolder epoch (bench/image_folder.lua)
 * this kernel had taken 46% of each sample's CPU. A chunk that cannot get its two rows of
 * scratch falls back to the direct form. */

/* Source row `row` of plane `plane` (of type T) resized horizontally into h (ow floats). */
#define RESIZE_HROW(T)                                                                     \
  do {                                                                                     \
    const T *restrict src = (const T *)plane + (row + c->top) * c->W + c->left;            \
    const tap *restrict t = c->tx;                                                         \
    const int64_t ow = c->ow;                                                              \
    for (int64_t x = 0; x < ow; x++)                                                       \
      h[x] = t[x].l0 * (float)src[t[x].i0] + t[x].l1 * (float)src[t[x].i1];                \
  } while (0)

static void resize_hrow(const resize_ctx *c, const void *plane, int64_t row, float *restrict h) {
  if (c->src->dtype == DDP_U8) RESIZE_HROW(uint8_t);
  else RESIZE_HROW(float);
}

/* An output row from two horizontally resized rows (restrict: a u8 store may alias
 * anything, and without it the loop does not vectorize). */
static void resize_vrow_u8(uint8_t *restrict o, const float *restrict h0, const float *restrict h1,
                           float l0, float l1, int64_t n) {
  for (int64_t x = 0; x < n; x++) {
    float v = nearbyintf(l0 * h0[x] + l1 * h1[x]); /* half to even, as torch.round */
    o[x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}

static void resize_vrow_f32(float *restrict o, const float *restrict h0, const float *restrict h1,
                            float l0, float l1, int64_t n) {
  for (int64_t x = 0; x < n; x++) o[x] = l0 * h0[x] + l1 * h1[x];
}

/* Rows [begin, end) of planes x oh output rows, the window inside the image, from cached
 * horizontally resized source rows (Note [separable resize]); 0 when out of memory. */
static int resize_rows_separable(const resize_ctx *c, int64_t begin, int64_t end) {
  float *buf = malloc(sizeof(float) * 2 * (size_t)c->ow);
  if (!buf) return 0;
  float *h[2] = {buf, buf + c->ow};
  int64_t have[2] = {-1, -1}; /* source row in h[k] (-1: none), of plane have_plane */
  int64_t have_plane = -1;
  size_t esz = c->src->dtype == DDP_U8 ? 1 : 4;
  for (int64_t r = begin; r < end; r++) {
    int64_t p = r / c->oh, y = r % c->oh;
    const tap *ty = &c->ty[y];
    const char *plane = ddp_data(c->src) + (size_t)(p * c->H * c->W) * esz;
    if (p != have_plane) have[0] = have[1] = -1, have_plane = p;
    /* the rows of ty->i0 and ty->i1, reusing what the previous output row had */
    const float *h0 = NULL, *h1 = NULL;
    for (int k = 0; k < 2; k++) {
      if (have[k] == ty->i0) h0 = h[k];
      if (have[k] == ty->i1) h1 = h[k];
    }
    if (!h0) { /* i0 >= the previous row's i0: overwrite the buffer not holding i1 */
      int k = (h1 == h[0]) ? 1 : 0;
      resize_hrow(c, plane, ty->i0, h[k]);
      have[k] = ty->i0;
      h0 = h[k];
      if (ty->i1 == ty->i0) h1 = h0;
    }
    if (!h1) {
      int k = (h0 == h[0]) ? 1 : 0;
      resize_hrow(c, plane, ty->i1, h[k]);
      have[k] = ty->i1;
      h1 = h[k];
    }
    if (c->src->dtype == DDP_U8)
      resize_vrow_u8((uint8_t *)ddp_data(c->dst) + (p * c->oh + y) * c->ow, h0, h1, ty->l0, ty->l1, c->ow);
    else
      resize_vrow_f32((float *)ddp_data(c->dst) + (p * c->oh + y) * c->ow, h0, h1, ty->l0, ty->l1, c->ow);
  }
  free(buf);
  return 1;
}

/* One output row from the two source rows r0 and r1 (the window inside the image: no
 * bounds checks), the same arithmetic as the general path below. */
#define RESIZE_ROW_INSIDE(T, STORE)                                                          \
  do {                                                                                     \
    const T *r0 = (const T *)plane + (ty->i0 + c->top) * c->W + c->left;                  \
    const T *r1 = (const T *)plane + (ty->i1 + c->top) * c->W + c->left;                  \
    for (int64_t x = 0; x < c->ow; x++) {                                                  \
      const tap *tx = &c->tx[x];                                                           \
      float v = ty->l0 * (tx->l0 * (float)r0[tx->i0] + tx->l1 * (float)r0[tx->i1]) +        \
                ty->l1 * (tx->l0 * (float)r1[tx->i0] + tx->l1 * (float)r1[tx->i1]);         \
      STORE;                                                                               \
    }                                                                                      \
  } while (0)

/* Rows [begin, end) of planes x oh output rows. */
static void resize_rows(void *ctx, int64_t begin, int64_t end) {
  const resize_ctx *c = ctx;
  int inside = c->top >= 0 && c->left >= 0 && c->top + c->ty[c->oh - 1].i1 < c->H &&
               c->left + c->tx[c->ow - 1].i1 < c->W;
  if (inside && resize_rows_separable(c, begin, end)) return;
  if (inside) { /* out of memory for the separable form: the direct one */
    for (int64_t r = begin; r < end; r++) {
      int64_t p = r / c->oh, y = r % c->oh;
      const tap *ty = &c->ty[y];
      if (c->src->dtype == DDP_U8) {
        const uint8_t *plane = (const uint8_t *)ddp_data(c->src) + p * c->H * c->W;
        uint8_t *orow = (uint8_t *)ddp_data(c->dst) + (p * c->oh + y) * c->ow;
        RESIZE_ROW_INSIDE(uint8_t, {
          v = nearbyintf(v);
          orow[x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        });
      } else {
        const float *plane = (const float *)ddp_data(c->src) + p * c->H * c->W;
        float *orow = (float *)ddp_data(c->dst) + (p * c->oh + y) * c->ow;
        RESIZE_ROW_INSIDE(float, orow[x] = v);
      }
    }
    return;
  }
  int u8 = c->src->dtype == DDP_U8;
  size_t esz = u8 ? 1 : 4;
  for (int64_t r = begin; r < end; r++) {
    int64_t p = r / c->oh, y = r % c->oh;
    const char *plane = ddp_data(c->src) + (size_t)(p * c->H * c->W) * esz;
    char *orow = ddp_data(c->dst) + (size_t)((p * c->oh + y) * c->ow) * esz;
    const tap *ty = &c->ty[y];
    for (int64_t x = 0; x < c->ow; x++) {
      const tap *tx = &c->tx[x];
      float v = ty->l0 * (tx->l0 * window_px(c, plane, ty->i0, tx->i0) +
                          tx->l1 * window_px(c, plane, ty->i0, tx->i1)) +
                ty->l1 * (tx->l0 * window_px(c, plane, ty->i1, tx->i0) +
                          tx->l1 * window_px(c, plane, ty->i1, tx->i1));
      if (u8) {
        v = nearbyintf(v); /* half to even, as torch.round */
        ((uint8_t *)orow)[x] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      } else {
        ((float *)orow)[x] = v;
      }
    }
  }
}

int ddp_image_resized_crop(ddp_tensor **out, ddp_tensor *img, int64_t top, int64_t left, int64_t h,
                           int64_t w, int64_t oh, int64_t ow) {
  *out = NULL;
  if (h < 1 || w < 1 || oh < 1 || ow < 1)
    DDP_FAIL(DDP_ERR_ARG,
             "resized_crop: the window (%lld x %lld) and the output size (%lld x %lld) must be "
             "positive",
             (long long)h, (long long)w, (long long)oh, (long long)ow);
  if (oh > 65535 || ow > 65535 || h > 65535 || w > 65535)
    DDP_FAIL(DDP_ERR_ARG, "resized_crop: sizes above 65535 (window %lld x %lld, output %lld x %lld)",
             (long long)h, (long long)w, (long long)oh, (long long)ow);
  if (top < -65535 || top > 65535 || left < -65535 || left > 65535)
    DDP_FAIL(DDP_ERR_ARG, "resized_crop: the window's corner (%lld, %lld) is beyond +-65535",
             (long long)top, (long long)left);
  ddp_tensor *src;
  int64_t planes, H, W;
  DDP_TRY(image_in("resized_crop", img, &src, &planes, &H, &W));
  tap *ty = malloc(sizeof *ty * (size_t)oh), *tx = malloc(sizeof *tx * (size_t)ow);
  int status = (!ty || !tx) ? DDP_ERROR(DDP_ERR_MEMORY, "resized_crop: out of memory") : DDP_OK;
  if (!status) status = image_out(out, src, oh, ow, src->dtype);
  if (!status) {
    taps(ty, h, oh);
    taps(tx, w, ow);
    resize_ctx c = {src, *out, H, W, top, left, oh, ow, ty, tx};
    ddp_parallel_for(planes * oh, 16, resize_rows, &c);
  }
  free(ty);
  free(tx);
  ddp_tensor_release(src);
  return status;
}

/* ---- flip ----------------------------------------------------------------------------- */

int ddp_image_hflip(ddp_tensor **out, ddp_tensor *img) {
  *out = NULL;
  ddp_tensor *src;
  int64_t planes, H, W;
  DDP_TRY(image_in("hflip", img, &src, &planes, &H, &W));
  int status = image_out(out, src, H, W, src->dtype);
  if (!status) {
    int64_t rows = planes * H;
    if (src->dtype == DDP_U8) {
      const uint8_t *s = (const uint8_t *)ddp_data(src);
      uint8_t *d = (uint8_t *)ddp_data(*out);
      for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < W; x++) d[r * W + x] = s[r * W + W - 1 - x];
    } else {
      const float *s = (const float *)ddp_data(src);
      float *d = (float *)ddp_data(*out);
      for (int64_t r = 0; r < rows; r++)
        for (int64_t x = 0; x < W; x++) d[r * W + x] = s[r * W + W - 1 - x];
    }
  }
  ddp_tensor_release(src);
  return status;
}

/* ---- brightness / contrast ------------------------------------------------------------- */

/* Mean gray level of the contiguous image src (c planes of n pixels), in f32 as
 * torchvision: gray = 0.2989 R + 0.587 G + 0.114 B (made u8 by truncation for u8 images). */
static float gray_mean(const ddp_tensor *src, int64_t c, int64_t n) {
  double sum = 0;
  int u8 = src->dtype == DDP_U8;
  const uint8_t *b = (const uint8_t *)ddp_data(src);
  const float *f = (const float *)ddp_data(src);
  for (int64_t i = 0; i < n; i++) {
    float v;
    if (c == 1) {
      v = u8 ? (float)b[i] : f[i];
    } else {
      float r = u8 ? b[i] : f[i], g = u8 ? b[n + i] : f[n + i], bl = u8 ? b[2 * n + i] : f[2 * n + i];
      v = 0.2989f * r + 0.587f * g + 0.114f * bl;
      if (u8) v = (float)(uint8_t)v;
    }
    sum += v;
  }
  return (float)(sum / (double)n);
}

int ddp_image_adjust(ddp_tensor **out, ddp_tensor *img, int op, double factor) {
  *out = NULL;
  const char *name = op == DDP_IMAGE_BRIGHTNESS ? "adjust_brightness" : "adjust_contrast";
  if (op != DDP_IMAGE_BRIGHTNESS && op != DDP_IMAGE_CONTRAST)
    DDP_FAIL(DDP_ERR_ARG, "image_adjust: unknown op %d (BRIGHTNESS 0, CONTRAST 1)", op);
  if (!(factor >= 0) || !isfinite(factor))
    DDP_FAIL(DDP_ERR_ARG, "%s: the factor must be finite and >= 0, got %g", name, factor);
  ddp_tensor *src;
  int64_t planes, H, W;
  DDP_TRY(image_in(name, img, &src, &planes, &H, &W));
  int status = DDP_OK;
  float m = 0.0f;
  if (op == DDP_IMAGE_CONTRAST) {
    if (src->ndim > 3 || (planes != 1 && planes != 3))
      status = DDP_ERROR(DDP_ERR_ARG,
                         "adjust_contrast: expected an image (C, H, W) with C = 1 or 3, got %d dims "
                         "and %lld channels",
                         src->ndim, (long long)planes);
    else
      m = gray_mean(src, planes, H * W);
  }
  if (!status) status = image_out(out, src, H, W, src->dtype);
  if (!status) {
    float r = (float)factor, q = (1.0f - r) * m;
    int64_t n = planes * H * W;
    if (src->dtype == DDP_U8) {
      const uint8_t *s = (const uint8_t *)ddp_data(src);
      uint8_t *d = (uint8_t *)ddp_data(*out);
      for (int64_t i = 0; i < n; i++) {
        float v = r * (float)s[i] + q;
        d[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); /* truncation, as .to(uint8) */
      }
    } else {
      const float *s = (const float *)ddp_data(src);
      float *d = (float *)ddp_data(*out);
      for (int64_t i = 0; i < n; i++) {
        float v = r * s[i] + q;
        d[i] = v < 0 ? 0 : v > 1 ? 1 : v;
      }
    }
  }
  ddp_tensor_release(src);
  return status;
}

/* ---- to tensor ------------------------------------------------------------------------ */

int ddp_image_to_tensor(ddp_tensor **out, ddp_tensor *img) {
  *out = NULL;
  if (!img) DDP_FAIL(DDP_ERR_ARG, "to_tensor: image is NULL");
  if (img->dtype != DDP_U8 || (img->ndim != 2 && img->ndim != 3) || img->device != DDP_DEVICE_CPU)
    DDP_FAIL(DDP_ERR_ARG, "to_tensor: expected a u8 CPU image (H, W, C) or (H, W), got a %dd %s tensor",
             img->ndim, ddp_dtype_name(img->dtype));
  int64_t H = img->shape[0], W = img->shape[1], C = img->ndim == 3 ? img->shape[2] : 1;
  int64_t shape[3] = {C, H, W};
  DDP_TRY(ddp_tensor_empty(out, 3, shape, DDP_F32, DDP_DEVICE_CPU));
  const uint8_t *s = (const uint8_t *)ddp_data(img);
  int64_t sh = img->strides[0], sw = img->strides[1], sc = img->ndim == 3 ? img->strides[2] : 0;
  float *d = (float *)ddp_data(*out);
  for (int64_t c = 0; c < C; c++)
    for (int64_t y = 0; y < H; y++)
      for (int64_t x = 0; x < W; x++) d[(c * H + y) * W + x] = (float)s[y * sh + x * sw + c * sc] / 255.0f;
  return DDP_OK;
}
