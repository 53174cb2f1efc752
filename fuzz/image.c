/* fuzz/image.c: PNG and JPEG files through ddp_image_decode, the decoder ddp_image_read
 * runs on a file's bytes (runtime/io/image.c, Note [image decode errors]). Contract: an
 * error names the file; an image that decodes is u8 (C, H, W) with C in 1..4 and sides in
 * 1..65535, and the gray, RGB and HWC readings of the same bytes agree on H and W. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ddp_tensor *img = NULL;
  int status = ddp_image_decode(&img, data, size, "fuzz_image.png", DDP_IMAGE_UNCHANGED, DDP_IMAGE_CHW);
  if (status) {
    fuzz_check_error(status, "fuzz_image.png");
    FUZZ_CHECK(!img, "output set on failure");
    return 0;
  }
  const int64_t *s = ddp_tensor_shape(img);
  FUZZ_CHECK(ddp_tensor_dim(img) == 3 && ddp_tensor_dtype(img) == DDP_U8, "not a u8 (C, H, W) image");
  FUZZ_CHECK(s[0] >= 1 && s[0] <= 4 && s[1] >= 1 && s[1] <= 65535 && s[2] >= 1 && s[2] <= 65535,
             "shape (%lld, %lld, %lld)", (long long)s[0], (long long)s[1], (long long)s[2]);
  int64_t h = s[1], w = s[2];
  ddp_tensor *gray = NULL, *hwc = NULL;
  FUZZ_CHECK(ddp_image_decode(&gray, data, size, "g", DDP_IMAGE_GRAY, DDP_IMAGE_CHW) == 0, "gray failed: %s",
             ddp_last_error());
  FUZZ_CHECK(ddp_image_decode(&hwc, data, size, "c", DDP_IMAGE_RGB, DDP_IMAGE_HWC) == 0, "rgb failed: %s",
             ddp_last_error());
  const int64_t *g = ddp_tensor_shape(gray), *c = ddp_tensor_shape(hwc);
  FUZZ_CHECK(g[0] == 1 && g[1] == h && g[2] == w, "gray shape differs");
  FUZZ_CHECK(c[0] == h && c[1] == w && c[2] == 3, "HWC shape differs");
  ddp_tensor_release(gray);
  ddp_tensor_release(hwc);
  ddp_tensor_release(img);
  return 0;
}
