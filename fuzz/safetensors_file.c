/* fuzz/safetensors_file.c: whole safetensors files (8-byte header length, JSON header,
 * data) through ddp_io_safetensors_load_bytes, the reader ddp_io_safetensors_load runs on
 * files (Note [one reader for files and bytes] in runtime/io/safetensors.c). Contract: an
 * error names the file; a loaded file's tensors tile the data part exactly. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ddp_io_safetensors *f = NULL;
  int status = ddp_io_safetensors_load_bytes(&f, data, size, "fuzz.safetensors");
  if (status) {
    fuzz_check_error(status, "fuzz.safetensors");
    return 0;
  }
  uint64_t hlen = 0;
  for (int b = 7; b >= 0; b--) hlen = (hlen << 8) | data[b];
  uint64_t bytes = 0;
  for (int i = 0; i < ddp_io_safetensors_count(f); i++) {
    ddp_tensor *t = NULL;
    FUZZ_CHECK(ddp_io_safetensors_tensor(&t, f, i) == 0, "tensor %d: %s", i, ddp_last_error());
    FUZZ_CHECK(ddp_io_safetensors_name(f, i) != NULL, "tensor %d has no name", i);
    bytes += (uint64_t)ddp_tensor_numel(t) * ddp_dtype_size(ddp_tensor_dtype(t));
    ddp_tensor_release(t);
  }
  FUZZ_CHECK(8 + hlen + bytes == size, "tensors of %llu bytes after a %llu-byte header in %zu bytes",
             (unsigned long long)bytes, (unsigned long long)hlen, size);
  for (int i = 0; i < ddp_io_safetensors_metadata_count(f); i++)
    FUZZ_CHECK(ddp_io_safetensors_metadata_key(f, i) && ddp_io_safetensors_metadata_value(f, i),
               "metadata pair %d", i);
  ddp_io_safetensors_free(f);
  return 0;
}
