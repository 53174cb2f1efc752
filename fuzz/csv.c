/* fuzz/csv.c: CSV tables through ddp_csv_decode, the parser ddp_csv_read runs on a file's
 * bytes (runtime/io/csv.c, libcsv). Byte 0 picks the header flag (bit 0) and the delimiter
 * (bit 1: ';' else ','); the rest is the file. Contract: an error names the file; a table
 * that loads is f64 (rows >= 1, cols >= 1), and with a header it has one name per column
 * (the names' bytes as *needed says, every name ending in a NUL). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int header = data[0] & 1, delim = (data[0] & 2) ? ';' : ',';
  static char names[1 << 16];
  size_t needed = 0;
  ddp_tensor *t = NULL;
  int status = ddp_csv_decode(&t, data + 1, size - 1, "fuzz_table.csv", delim, header, names,
                              sizeof names, &needed);
  if (status) {
    fuzz_check_error(status, "fuzz_table.csv");
    FUZZ_CHECK(!t, "output set on failure");
    return 0;
  }
  FUZZ_CHECK(ddp_tensor_dim(t) == 2 && ddp_tensor_dtype(t) == DDP_F64, "not an f64 table");
  const int64_t *s = ddp_tensor_shape(t);
  FUZZ_CHECK(s[0] >= 1 && s[1] >= 1, "shape (%lld, %lld)", (long long)s[0], (long long)s[1]);
  if (header) {
    int64_t count = 0;
    for (size_t i = 0; i < needed; i++) count += names[i] == 0;
    FUZZ_CHECK(needed == 0 || names[needed - 1] == 0, "names not NUL-terminated");
    FUZZ_CHECK(count == s[1], "%lld names for %lld columns", (long long)count, (long long)s[1]);
  } else {
    FUZZ_CHECK(needed == 0, "names without a header");
  }
  ddp_tensor_release(t);
  return 0;
}
