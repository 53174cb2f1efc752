/* fuzz/cifar.c: CIFAR-10 binary batches through ddp_io_read_cifar_bytes, whose checks are
 * those ddp_io_read_cifar runs on files (Note [one CIFAR reader for files and bytes] in
 * runtime/io/cifar.c). Contract: an error names the file; a batch that loads has one
 * record per 3073 bytes, the labels and pixels of the bytes. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ddp_tensor *images = NULL, *labels = NULL;
  int status = ddp_io_read_cifar_bytes(&images, &labels, data, size, "fuzz_batch.bin");
  if (status) {
    fuzz_check_error(status, "fuzz_batch.bin");
    FUZZ_CHECK(!images && !labels, "outputs set on failure");
    return 0;
  }
  int64_t n = ddp_tensor_numel(labels);
  FUZZ_CHECK(n > 0 && (size_t)n * 3073 == size, "%lld records from %zu bytes", (long long)n, size);
  const int64_t *lab = ddp_tensor_data(labels);
  const uint8_t *img = ddp_tensor_data(images);
  for (int64_t r = 0; r < n; r++) {
    FUZZ_CHECK(lab[r] == data[r * 3073] && lab[r] < 10, "record %lld: label %lld", (long long)r, (long long)lab[r]);
    FUZZ_CHECK(memcmp(img + r * 3072, data + r * 3073 + 1, 3072) == 0, "record %lld: pixels", (long long)r);
  }
  ddp_tensor_release(images);
  ddp_tensor_release(labels);
  return 0;
}
