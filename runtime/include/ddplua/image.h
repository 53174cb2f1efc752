/* ddplua/image.h: part of the public API, included by ddplua.h only.
 *
 * Image files and the image kernels of the vision transforms (runtime/io/image.c,
 * runtime/io/image_ops.c). PNG through libpng, JPEG through libjpeg-turbo (libjpeg's API).
 * Images are u8 tensors; the layout is (C, H, W) (torchvision.io.read_image's) unless
 * DDP_IMAGE_HWC is asked for ((H, W, C), as PIL and NumPy arrays). The kernels take (C, H, W)
 * images (any leading dims count as C) of dtype u8 or f32 on the CPU, and record no autograd.
 * Every reader names the file and the fault in its error (DDP_ERR_IO) and never crashes on
 * malformed input (Note [image decode errors] in runtime/io/image.c).
 */

/* Colour conversion asked of the decoders (torchvision.io.ImageReadMode's names). */
enum {
  DDP_IMAGE_UNCHANGED = 0, /* the file's channels: 1 (gray), 2 (gray + alpha), 3 or 4 (RGBA) */
  DDP_IMAGE_GRAY = 1,      /* 1 channel: L = (299 R + 587 G + 114 B) / 1000 (ITU-R 601-2 luma,
                            * PIL's convert("L"), rounded); alpha dropped */
  DDP_IMAGE_RGB = 3        /* 3 channels: gray replicated, alpha dropped */
};

/* Memory layout of a decoded image. */
enum { DDP_IMAGE_CHW = 0, DDP_IMAGE_HWC = 1 };

/* Read the PNG or JPEG file at `path` (the format is taken from the first bytes, not the
 * name) into a new u8 tensor (C, H, W) (layout DDP_IMAGE_CHW) or (H, W, C) (DDP_IMAGE_HWC),
 * converted per `mode` (DDP_IMAGE_*). PNGs are read by libpng's simplified API: 8-bit
 * sRGB samples (16-bit files reduced, palettes expanded, tRNS made an alpha channel);
 * JPEGs by libjpeg (YCbCr converted to RGB); CMYK JPEGs are refused; a JPEG that libjpeg
 * only warns about (truncated data, a corrupt segment) is refused too. Errors (DDP_ERR_IO, naming the file): cannot open, not a PNG or JPEG (the first
 * bytes found), a corrupt or truncated stream (the decoder's own message), a width or height
 * of 0 or above 65535, more than 2^28 pixels; DDP_ERR_ARG for a bad mode or layout. */
int ddp_image_read(ddp_tensor **out, const char *path, int mode, int layout);

/* The decoder of ddp_image_read over a whole file already in memory (size bytes at data):
 * the same results, checks and errors, the messages naming `name` (NULL: "<bytes>"). */
int ddp_image_decode(ddp_tensor **out, const void *data, size_t size, const char *name,
                     int mode, int layout);

/* Write img, u8 (C, H, W) with C = 1 (gray) or 3 (RGB), any strides, as an 8-bit PNG file
 * (zlib's default compression) at `path`, atomically (a temporary file renamed). Errors:
 * DDP_ERR_ARG naming the fault for another dtype, shape or device; DDP_ERR_IO naming the
 * file when it cannot be written. */
int ddp_image_write_png(const char *path, ddp_tensor *img);

/* Write img, u8 (C, H, W) with C = 1 or 3, as a baseline JPEG file (JFIF, 4:2:0 chroma
 * subsampling for RGB) of `quality` 1..100 at `path`, atomically. Errors as
 * ddp_image_write_png, and DDP_ERR_ARG for a quality outside 1..100. */
int ddp_image_write_jpeg(const char *path, ddp_tensor *img, int quality);

/* Crop then resize: the window of img (C, H, W) (u8 or f32) with rows top .. top+h-1 and
 * columns left .. left+w-1 (pixels outside the image are 0, as torchvision's center_crop
 * pads), resized to (C, oh, ow) by bilinear interpolation with align_corners = False and no
 * antialiasing: torch.nn.functional.interpolate(mode = "bilinear", align_corners = False)
 * on the window, computed in f32 (source x = (x' + 0.5) * w / ow - 0.5, clamped at 0). A u8
 * image gives u8, rounded half to even (torchvision's resize of u8 tensors); f32 gives f32.
 * When (oh, ow) = (h, w) the window is copied as is. Runs on the thread pool. Errors
 * (DDP_ERR_ARG): another dtype, fewer than 2 dims, not on the CPU, h, w, oh or ow < 1 or
 * above 65535, top or left beyond +-65535. */
int ddp_image_resized_crop(ddp_tensor **out, ddp_tensor *img, int64_t top, int64_t left,
                           int64_t h, int64_t w, int64_t oh, int64_t ow);

/* A new image (C, H, W) with the W axis of img (C, H, W) (u8 or f32, CPU) reversed
 * (torchvision's hflip). Errors (DDP_ERR_ARG): dtype, fewer than 2 dims, device. */
int ddp_image_hflip(ddp_tensor **out, ddp_tensor *img);

/* Colour adjustments of ddp_image_adjust (torchvision.transforms.functional's). */
enum {
  DDP_IMAGE_BRIGHTNESS = 0, /* out = clamp(f * x, 0, max) */
  DDP_IMAGE_CONTRAST = 1    /* out = clamp(f * x + (1 - f) * m, 0, max), m the mean of the
                             * image's gray level (C = 3: 0.2989 R + 0.587 G + 0.114 B, made u8
                             * by truncation for u8 images as torchvision's rgb_to_grayscale;
                             * C = 1: the image itself) */
};

/* torchvision's adjust_brightness / adjust_contrast of img (C, H, W) (u8 or f32; C = 1 or 3
 * for contrast) by factor >= 0: max is 255 for u8 (results truncated toward 0 as
 * torchvision's .to(uint8)), 1 for f32. Errors (DDP_ERR_ARG): unknown op, factor < 0 or not
 * finite, dtype, shape, device. */
int ddp_image_adjust(ddp_tensor **out, ddp_tensor *img, int op, double factor);

/* torchvision's ToTensor for arrays: img u8 (H, W, C) (or (H, W): C = 1) -> a new f32
 * (C, H, W) with every value divided by 255. Errors (DDP_ERR_ARG): not u8, not 2 or 3 dims,
 * not on the CPU. */
int ddp_image_to_tensor(ddp_tensor **out, ddp_tensor *img);
