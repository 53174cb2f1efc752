/* runtime/io/image.c: PNG and JPEG files in and out (ddplua/image.h).
 *
 * PNG through libpng's simplified API (png_image_*, libpng >= 1.6.24), JPEG through
 * libjpeg-turbo's libjpeg API (jpeg_mem_src / jpeg_mem_dest).
 *
 * Note [image decode errors]
 * A file from a user's folder is outside bytes: decoding never crashes and every failure
 * names the file. libpng's simplified API reports failures in png_image.message (it
 * recovers internally). libjpeg reports them through error_exit, which must not return: the
 * one setjmp / longjmp pair of the runtime lives here, confined to decode_jpeg and
 * encode_jpeg (the jump never leaves this file, and nothing between setjmp and the jump
 * owns memory that the jump would leak: buffers are allocated before setjmp or released
 * by jpeg_destroy_*). libjpeg's warnings (a truncated stream it would pad with gray, a
 * corrupt segment) are failures too, as PIL refuses a truncated file. Sizes are bounded
 * (each side <= 65535, <= 2^28 pixels) before any pixel buffer is allocated. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "core/core.h"
#include "io/io_internal.h"

enum { IMAGE_MAX_SIDE = 65535 };
#define IMAGE_MAX_PIXELS ((int64_t)1 << 28)

/* Check the decoded size; 0 or -1 with the error set naming `name`. */
static int check_size(const char *name, const char *what, int64_t w, int64_t h) {
  if (w < 1 || h < 1 || w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE || w * h > IMAGE_MAX_PIXELS) {
    DDP_ERROR(DDP_ERR_IO,
              "read_image: %s: %s image of %lld x %lld pixels: each side must be 1 .. %d and "
              "the image at most 2^28 pixels",
              name, what, (long long)w, (long long)h, IMAGE_MAX_SIDE);
    return -1;
  }
  return 0;
}

/* PIL's convert("L") (ITU-R 601-2 luma): (19595 R + 38470 G + 7471 B + 2^15) >> 16. */
static inline uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {
  return (uint8_t)((19595u * r + 38470u * g + 7471u * b + 0x8000u) >> 16);
}

/* Convert the interleaved pixels px (h * w pixels of `in_c` channels: 1 gray, 2 gray+alpha,
 * 3 RGB, 4 RGBA) to a new u8 tensor of `mode` and `layout`. */
static int finish(ddp_tensor **out, const uint8_t *px, int64_t h, int64_t w, int in_c, int mode,
                  int layout) {
  int oc = mode == DDP_IMAGE_GRAY ? 1 : mode == DDP_IMAGE_RGB ? 3 : in_c;
  int64_t shape[3];
  if (layout == DDP_IMAGE_HWC) {
    shape[0] = h, shape[1] = w, shape[2] = oc;
  } else {
    shape[0] = oc, shape[1] = h, shape[2] = w;
  }
  ddp_tensor *t = NULL;
  DDP_TRY(ddp_tensor_empty(&t, 3, shape, DDP_U8, DDP_DEVICE_CPU));
  uint8_t *o = (uint8_t *)ddp_data(t);
  int64_t n = h * w;
  if (in_c == 3 && oc == 3 && layout != DDP_IMAGE_HWC) { /* RGB to planes: the usual case */
    uint8_t *restrict r = o, *restrict g = o + n, *restrict b = o + 2 * n;
    const uint8_t *restrict s = px;
    for (int64_t p = 0; p < n; p++) {
      r[p] = s[3 * p];
      g[p] = s[3 * p + 1];
      b[p] = s[3 * p + 2];
    }
    *out = t;
    return DDP_OK;
  }
  /* element (pixel p, channel c) of the output */
  int64_t ps = layout == DDP_IMAGE_HWC ? oc : 1, cs = layout == DDP_IMAGE_HWC ? 1 : n;
  for (int64_t p = 0; p < n; p++) {
    const uint8_t *s = px + p * in_c;
    uint8_t v[4];
    if (in_c <= 2) { /* gray (+ alpha) */
      v[0] = v[1] = v[2] = s[0];
      v[3] = in_c == 2 ? s[1] : 255;
    } else {
      v[0] = s[0], v[1] = s[1], v[2] = s[2];
      v[3] = in_c == 4 ? s[3] : 255;
    }
    uint8_t *d = o + p * ps;
    if (oc == 1) {
      d[0] = in_c <= 2 ? v[0] : luma(v[0], v[1], v[2]);
    } else if (oc == 2) {
      d[0] = v[0], d[cs] = v[3];
    } else {
      for (int c = 0; c < 3; c++) d[c * cs] = v[c];
      if (oc == 4) d[3 * cs] = v[3];
    }
  }
  *out = t;
  return DDP_OK;
}

/* ---- PNG ------------------------------------------------------------------------------ */

static int decode_png(ddp_tensor **out, const void *data, size_t size, const char *name, int mode,
                      int layout) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, size))
    DDP_FAIL(DDP_ERR_IO, "read_image: %s: corrupt PNG: %s", name, img.message);
  if (check_size(name, "PNG", img.width, img.height)) {
    png_image_free(&img);
    return ddp_last_status();
  }
  int in_c = PNG_IMAGE_SAMPLE_CHANNELS(img.format); /* 1..4 with the alpha flag */
  img.format = (img.format & (PNG_FORMAT_FLAG_COLOR | PNG_FORMAT_FLAG_ALPHA));
  in_c = PNG_IMAGE_SAMPLE_CHANNELS(img.format);
  size_t nbytes = (size_t)img.width * img.height * (size_t)in_c;
  uint8_t *px = malloc(nbytes ? nbytes : 1);
  if (!px) {
    png_image_free(&img);
    DDP_FAIL(DDP_ERR_MEMORY, "read_image: %s: out of memory for %zu bytes", name, nbytes);
  }
  if (!png_image_finish_read(&img, NULL, px, 0, NULL)) {
    int status = DDP_ERROR(DDP_ERR_IO, "read_image: %s: corrupt PNG: %s", name, img.message);
    png_image_free(&img);
    free(px);
    return status;
  }
  int status = finish(out, px, img.height, img.width, in_c, mode, layout);
  free(px);
  return status;
}

/* ---- JPEG ----------------------------------------------------------------------------- */

/* libjpeg's error manager with the jump target and the first message. */
typedef struct {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
} jpeg_error;

static void jpeg_fail(j_common_ptr cinfo) {
  jpeg_error *e = (jpeg_error *)cinfo->err;
  cinfo->err->format_message(cinfo, e->message);
  longjmp(e->jump, 1);
}

/* Warnings (level -1) fail too (Note [image decode errors]); trace messages are ignored. */
static void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);
}

static int decode_jpeg(ddp_tensor **out, const void *data, size_t size, const char *name,
                       int mode, int layout) {
  struct jpeg_decompress_struct cinfo;
  jpeg_error err;
  uint8_t *volatile px = NULL;
  volatile int status = DDP_OK;
  memset(&cinfo, 0, sizeof cinfo);
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    status = DDP_ERROR(DDP_ERR_IO, "read_image: %s: corrupt JPEG: %s", name, err.message);
    goto done;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, (const unsigned char *)data, (unsigned long)size);
  jpeg_read_header(&cinfo, TRUE);
  if (check_size(name, "JPEG", cinfo.image_width, cinfo.image_height)) {
    status = ddp_last_status();
    goto done;
  }
  int in_c;
  if (cinfo.jpeg_color_space == JCS_GRAYSCALE) {
    cinfo.out_color_space = JCS_GRAYSCALE;
    in_c = 1;
  } else if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    status = DDP_ERROR(DDP_ERR_IO, "read_image: %s: CMYK JPEG images are not supported", name);
    goto done;
  } else {
    cinfo.out_color_space = JCS_RGB;
    in_c = 3;
  }
  jpeg_start_decompress(&cinfo);
  size_t row = (size_t)cinfo.output_width * (size_t)in_c;
  px = malloc(row * cinfo.output_height);
  if (!px) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "read_image: %s: out of memory", name);
    goto done;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW r = px + row * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_decompress(&cinfo);
  status = finish(out, px, cinfo.output_height, cinfo.output_width, in_c, mode, layout);
done:
  jpeg_destroy_decompress(&cinfo);
  free(px);
  return status;
}

/* ---- public --------------------------------------------------------------------------- */

int ddp_image_decode(ddp_tensor **out, const void *data, size_t size, const char *name, int mode,
                     int layout) {
  *out = NULL;
  if (!name) name = "<bytes>";
  if (mode != DDP_IMAGE_UNCHANGED && mode != DDP_IMAGE_GRAY && mode != DDP_IMAGE_RGB)
    DDP_FAIL(DDP_ERR_ARG, "read_image: %s: mode must be UNCHANGED (0), GRAY (1) or RGB (3), got %d",
             name, mode);
  if (layout != DDP_IMAGE_CHW && layout != DDP_IMAGE_HWC)
    DDP_FAIL(DDP_ERR_ARG, "read_image: %s: layout must be CHW (0) or HWC (1), got %d", name, layout);
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "read_image: %s: data is NULL (size %zu)", name, size);
  const uint8_t *b = data;
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && memcmp(b, png_magic, 8) == 0) return decode_png(out, data, size, name, mode, layout);
  if (size >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff)
    return decode_jpeg(out, data, size, name, mode, layout);
  char seen[64] = "";
  size_t at = 0;
  for (size_t i = 0; i < size && i < 8; i++)
    at += (size_t)snprintf(seen + at, sizeof seen - at, "%s%02x", i ? " " : "", b[i]);
  DDP_FAIL(DDP_ERR_IO,
           "read_image: %s is not a PNG or JPEG file (%zu bytes, starting %s; expected 89 50 4e "
           "47 or ff d8 ff)",
           name, size, size ? seen : "with nothing");
}

int ddp_image_read(ddp_tensor **out, const char *path, int mode, int layout) {
  *out = NULL;
  uint8_t *buf;
  size_t size;
  DDP_TRY(ddp_io_read_file(path, "read_image", (size_t)1 << 32, &buf, &size));
  int status = ddp_image_decode(out, buf, size, path, mode, layout);
  free(buf);
  return status;
}

/* Check an image to write: u8 (C, H, W), C 1 or 3, CPU; gives the interleaved pixels. */
static int writable(const char *op, const char *path, ddp_tensor *img, uint8_t **px, int *c,
                    int *h, int *w) {
  *px = NULL;
  if (!path) DDP_FAIL(DDP_ERR_ARG, "%s: path is NULL", op);
  if (!img) DDP_FAIL(DDP_ERR_ARG, "%s: %s: image is NULL", op, path);
  if (img->dtype != DDP_U8 || img->ndim != 3 || (img->shape[0] != 1 && img->shape[0] != 3) ||
      img->device != DDP_DEVICE_CPU)
    DDP_FAIL(DDP_ERR_ARG,
             "%s: %s: expected a u8 CPU image (C, H, W) with C = 1 or 3, got a %dd %s tensor "
             "with %lld channels",
             op, path, img->ndim, ddp_dtype_name(img->dtype), img->ndim ? (long long)img->shape[0] : 0LL);
  if (check_size(path, "an", img->shape[2], img->shape[1])) return ddp_last_status();
  *c = (int)img->shape[0], *h = (int)img->shape[1], *w = (int)img->shape[2];
  *px = malloc((size_t)*c * *h * *w);
  if (!*px) DDP_FAIL(DDP_ERR_MEMORY, "%s: %s: out of memory", op, path);
  const uint8_t *s = (const uint8_t *)ddp_data(img);
  for (int y = 0; y < *h; y++)
    for (int x = 0; x < *w; x++)
      for (int k = 0; k < *c; k++)
        (*px)[((size_t)y * *w + x) * *c + k] =
            s[k * img->strides[0] + y * img->strides[1] + x * img->strides[2]];
  return DDP_OK;
}

int ddp_image_write_png(const char *path, ddp_tensor *img) {
  uint8_t *px;
  int c, h, w;
  DDP_TRY(writable("write_png", path, img, &px, &c, &h, &w));
  png_image pi;
  memset(&pi, 0, sizeof pi);
  pi.version = PNG_IMAGE_VERSION;
  pi.width = (png_uint_32)w;
  pi.height = (png_uint_32)h;
  pi.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t n = 0;
  int status = DDP_OK;
  void *mem = NULL;
  if (!png_image_write_get_memory_size(pi, n, 0, px, 0, NULL)) {
    status = DDP_ERROR(DDP_ERR_IO, "write_png: %s: %s", path, pi.message);
  } else if (!(mem = malloc(n))) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "write_png: %s: out of memory", path);
  } else if (!png_image_write_to_memory(&pi, mem, &n, 0, px, 0, NULL)) {
    status = DDP_ERROR(DDP_ERR_IO, "write_png: %s: %s", path, pi.message);
  } else {
    const void *bufs[1] = {mem};
    size_t lens[1] = {n};
    status = ddp_io_write_atomic(path, "write_png", 1, bufs, lens);
  }
  png_image_free(&pi);
  free(mem);
  free(px);
  return status;
}

int ddp_image_write_jpeg(const char *path, ddp_tensor *img, int quality) {
  if (quality < 1 || quality > 100)
    DDP_FAIL(DDP_ERR_ARG, "write_jpeg: %s: quality must be 1 .. 100, got %d", path ? path : "(null)",
             quality);
  uint8_t *pxs;
  int c, h, w;
  DDP_TRY(writable("write_jpeg", path, img, &pxs, &c, &h, &w));
  uint8_t *volatile px = pxs;
  /* libjpeg's output buffer: written through its address by libjpeg only, read after a
   * jump (so never cached in a register across setjmp) */
  struct {
    unsigned char *mem;
    unsigned long n;
  } dest = {NULL, 0};
  volatile int status = DDP_OK;
  struct jpeg_compress_struct cinfo;
  jpeg_error err;
  memset(&cinfo, 0, sizeof cinfo);
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    status = DDP_ERROR(DDP_ERR_IO, "write_jpeg: %s: %s", path, err.message);
    goto done;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &dest.mem, &dest.n);
  cinfo.image_width = (JDIMENSION)w;
  cinfo.image_height = (JDIMENSION)h;
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW r = px + (size_t)cinfo.next_scanline * w * c;
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  {
    const void *bufs[1] = {dest.mem};
    size_t lens[1] = {(size_t)dest.n};
    status = ddp_io_write_atomic(path, "write_jpeg", 1, bufs, lens);
  }
done:
  jpeg_destroy_compress(&cinfo); /* leaves jpeg_mem_dest's buffer to us */
  free(*(unsigned char *volatile *)&dest.mem);
  free(px);
  return status;
}
