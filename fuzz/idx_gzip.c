/* fuzz/idx_gzip.c: the gzip path of the IDX reader, fed valid gzip streams: the input is an
 * IDX file's bytes; it is gzipped here and read through ddp_io_read_idx_bytes both ways.
 * Contract: the gzipped file loads exactly when the raw one does, to the same tensor (the
 * same shape, dtype and bytes), and with the gzip stream cut short it fails, naming the
 * file. Exercises Note [what the header may declare]'s bound for gzip files too. */
#include <zlib.h>

#include "fuzz.h"

/* gzip (RFC 1952) of the n bytes at p into a malloc'd buffer; its size in *out_n. */
static uint8_t *gzip_bytes(const uint8_t *p, size_t n, size_t *out_n) {
  z_stream zs = {0};
  if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
  size_t cap = deflateBound(&zs, (uLong)n) + 32;
  uint8_t *out = malloc(cap);
  if (!out) {
    deflateEnd(&zs);
    return NULL;
  }
  zs.next_in = (Bytef *)p;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  int rc = deflate(&zs, Z_FINISH);
  *out_n = zs.total_out;
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    free(out);
    return NULL;
  }
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20) return 0;
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) return 0; /* raw must not look gzipped */
  size_t gz_n = 0;
  uint8_t *gz = gzip_bytes(data, size, &gz_n);
  if (!gz) return 0;
  ddp_tensor *raw = NULL, *inflated = NULL;
  int s_raw = ddp_io_read_idx_bytes(&raw, data, size, "raw-idx");
  if (s_raw) fuzz_check_error(s_raw, "raw-idx");
  int s_gz = ddp_io_read_idx_bytes(&inflated, gz, gz_n, "gz-idx");
  if (s_gz) fuzz_check_error(s_gz, "gz-idx");
  FUZZ_CHECK((s_raw == 0) == (s_gz == 0), "raw status %d, gzipped status %d (%s)", s_raw, s_gz,
             ddp_last_error());
  if (!s_raw) {
    int nd = ddp_tensor_dim(raw);
    FUZZ_CHECK(nd == ddp_tensor_dim(inflated) && ddp_tensor_dtype(raw) == ddp_tensor_dtype(inflated),
               "different tensors");
    FUZZ_CHECK(memcmp(ddp_tensor_shape(raw), ddp_tensor_shape(inflated), sizeof(int64_t) * (size_t)nd) == 0,
               "different shapes");
    size_t nbytes = (size_t)ddp_tensor_numel(raw) * ddp_dtype_size(ddp_tensor_dtype(raw));
    FUZZ_CHECK(nbytes == 0 || memcmp(ddp_tensor_data(raw), ddp_tensor_data(inflated), nbytes) == 0,
               "different data");
    /* the same stream cut short (its 8-byte trailer and more) never loads */
    size_t cut = gz_n > 9 ? gz_n - 1 - (size_t)data[size > 4 ? 4 : 0] % (gz_n - 9) : 0;
    ddp_tensor *t = NULL;
    int s_cut = ddp_io_read_idx_bytes(&t, gz, cut, "cut-idx");
    FUZZ_CHECK(s_cut != 0, "a gzip stream cut to %zu of %zu bytes loaded", cut, gz_n);
    fuzz_check_error(s_cut, "cut-idx");
  }
  ddp_tensor_release(raw);
  ddp_tensor_release(inflated);
  free(gz);
  return 0;
}
