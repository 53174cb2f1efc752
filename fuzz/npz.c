/* fuzz/npz.c: .npz archives through ddp_npz_decode, the reader ddp_npz_read runs on a
 * file's bytes (runtime/io/npy.c, libzip from memory). Contract: an error names the file;
 * an archive that loads gives a name and an array for every index below its count and
 * nothing beyond. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ddp_npz *z = NULL;
  int status = ddp_npz_decode(&z, data, size, "fuzz_arrays.npz");
  if (status) {
    fuzz_check_error(status, "fuzz_arrays.npz");
    FUZZ_CHECK(!z, "output set on failure");
    return 0;
  }
  int n = ddp_npz_count(z);
  for (int i = 0; i < n; i++) {
    ddp_tensor *t = ddp_npz_array(z, i);
    FUZZ_CHECK(t && ddp_npz_name(z, i), "array %d missing", i);
    ddp_tensor_release(t);
  }
  FUZZ_CHECK(!ddp_npz_array(z, n) && !ddp_npz_name(z, n) && !ddp_npz_name(z, -1), "index out of range answered");
  ddp_npz_free(z);
  return 0;
}
