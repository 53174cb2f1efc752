/* fuzz/npy.c: .npy files through ddp_npy_decode, the parser ddp_npy_read runs on a file's
 * bytes (runtime/io/npy.c). Contract: an error names the file; an array that loads has at
 * most 8 dimensions whose product is its element count, and a dtype of the format's table. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ddp_tensor *t = NULL;
  int status = ddp_npy_decode(&t, data, size, "fuzz_array.npy");
  if (status) {
    fuzz_check_error(status, "fuzz_array.npy");
    FUZZ_CHECK(!t, "output set on failure");
    return 0;
  }
  int nd = ddp_tensor_dim(t);
  FUZZ_CHECK(nd >= 0 && nd <= 8, "%d dims", nd);
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= ddp_tensor_shape(t)[d];
  FUZZ_CHECK(n == ddp_tensor_numel(t), "numel %lld, shape product %lld", (long long)ddp_tensor_numel(t), (long long)n);
  FUZZ_CHECK(ddp_tensor_dtype(t) != DDP_BF16, "bf16 is no .npy dtype");
  ddp_tensor_release(t);
  return 0;
}
