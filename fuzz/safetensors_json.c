/* fuzz/safetensors_json.c: the JSON header of a safetensors file and its __metadata__,
 * through the same reader as safetensors_file.c, with the framing done here so every input
 * is a well-framed file: the input is the header's JSON text, placed after its correct
 * 8-byte length and followed by a data part of 0 bytes, then of 64 bytes (so a header
 * whose tensors tile 64 bytes loads). Contract: an error names the file; metadata pairs
 * are strings; the tensors' bytes add up to the data part. */
#include "fuzz.h"

static void try_data(const uint8_t *text, size_t n, size_t data_bytes) {
  size_t size = 8 + n + data_bytes;
  uint8_t *file = calloc(size ? size : 1, 1);
  if (!file) return;
  for (int b = 0; b < 8; b++) file[b] = (uint8_t)((uint64_t)n >> (8 * b));
  if (n) memcpy(file + 8, text, n);
  ddp_io_safetensors *f = NULL;
  int status = ddp_io_safetensors_load_bytes(&f, file, size, "header.safetensors");
  if (status) {
    fuzz_check_error(status, "header.safetensors");
  } else {
    uint64_t bytes = 0;
    for (int i = 0; i < ddp_io_safetensors_count(f); i++) {
      ddp_tensor *t = NULL;
      FUZZ_CHECK(ddp_io_safetensors_tensor(&t, f, i) == 0, "tensor %d", i);
      bytes += (uint64_t)ddp_tensor_numel(t) * ddp_dtype_size(ddp_tensor_dtype(t));
      ddp_tensor_release(t);
    }
    FUZZ_CHECK(bytes == data_bytes, "tensors of %llu bytes in a data part of %zu",
               (unsigned long long)bytes, data_bytes);
    for (int i = 0; i < ddp_io_safetensors_metadata_count(f); i++) {
      const char *k = ddp_io_safetensors_metadata_key(f, i), *v = ddp_io_safetensors_metadata_value(f, i);
      FUZZ_CHECK(k && v, "metadata pair %d", i);
    }
    ddp_io_safetensors_free(f);
  }
  free(file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try_data(data, size, 0);
  try_data(data, size, 64);
  return 0;
}
