/* fuzz/idx.c: IDX files as they come (raw, or gzipped when they start with 1f 8b) through
 * ddp_io_read_idx_bytes, whose checks are those ddp_io_read_idx runs on files (Note [one
 * IDX reader for files and bytes] in runtime/io/idx.c). Contract: an error names the file;
 * a raw file that loads holds exactly its header and the data the header announces. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ddp_tensor *t = NULL;
  int status = ddp_io_read_idx_bytes(&t, data, size, "fuzz-idx3-ubyte");
  if (status) {
    fuzz_check_error(status, "fuzz-idx3-ubyte");
    return 0;
  }
  static const int elem[16] = {[8] = 1, [9] = 1, [11] = 2, [12] = 4, [13] = 4, [14] = 8};
  int gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!gzip) {
    FUZZ_CHECK(size >= 4 && data[2] < 16 && elem[data[2]], "loaded a file without a valid magic");
    FUZZ_CHECK(ddp_tensor_dim(t) == data[3], "ndim %d, header says %d", ddp_tensor_dim(t), data[3]);
    uint64_t want = 4 + 4 * (uint64_t)data[3] + (uint64_t)ddp_tensor_numel(t) * elem[data[2]];
    FUZZ_CHECK(want == size, "header and data make %llu bytes, the file has %zu",
               (unsigned long long)want, size);
  }
  ddp_tensor_release(t);
  return 0;
}
