/* runtime/io/sentencepiece.c: the BPE tokenizer's public calls (ddp_io_spm_*, ddplua/io.h)
 * over the SentencePiece shim (sentencepiece_shim.cc): argument checks the library would
 * abort on, ids as i64 tensors, and the shim's statuses turned into ddp_last_error
 * messages that name the call and the file.
 *
 * Note [newlines in SentencePiece]: SentencePiece trains on lines, so a model never sees
 * "\n", and its default normalization (nmt_nfkc) and whitespace folding would change the
 * text; decode(encode(s)) would then lose a play's line breaks. Models trained here use
 * the identity normalization, keep spaces as they are, and make "\n" a user-defined piece,
 * so that encode then decode gives the text back exactly for any text whose characters
 * the corpus holds (a character it never saw becomes the unknown piece, decoded " ⁇ "). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "io/sentencepiece_shim.h"

struct ddp_io_spm {
  ddp_spm_model *m;
  int64_t vocab_size;
};

int ddp_io_spm_available(void) { return ddp_spm_shim_available(); }

int ddp_io_spm_train(const char *input, const char *model_prefix, int64_t vocab_size, const char *model_type) {
  const char *op = "spm_train";
  if (!input || !*input) DDP_FAIL(DDP_ERR_ARG, "%s: empty input path", op);
  if (!model_prefix || !*model_prefix) DDP_FAIL(DDP_ERR_ARG, "%s: empty model_prefix", op);
  if (!model_type) model_type = "bpe";
  if (strcmp(model_type, "bpe") && strcmp(model_type, "unigram") && strcmp(model_type, "char") &&
      strcmp(model_type, "word"))
    DDP_FAIL(DDP_ERR_ARG, "%s: model_type must be bpe, unigram, char or word, got '%s'", op, model_type);
  if (vocab_size < 2 || vocab_size > 65536)
    DDP_FAIL(DDP_ERR_ARG, "%s: vocab_size must be in 2 .. 65536 (uint16 token files), got %lld", op,
             (long long)vocab_size);
  if (!ddp_spm_shim_available()) {
    char err[DDP_SPM_ERR_CAP] = "";
    int st = ddp_spm_shim_train(input, model_prefix, (int)vocab_size, model_type, 1, err);
    DDP_FAIL(st, "%s: %s", op, err);
  }
  struct stat st;
  if (stat(input, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
    DDP_FAIL(DDP_ERR_IO, "%s: %s is not a readable non-empty file", op, input);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  char err[DDP_SPM_ERR_CAP] = "";
  int status = ddp_spm_shim_train(input, model_prefix, (int)vocab_size, model_type, cores > 0 ? (int)cores : 1, err);
  if (status) DDP_FAIL(status, "%s: training on %s (vocab_size %lld) failed: %s", op, input, (long long)vocab_size, err);
  return DDP_OK;
}

int ddp_io_spm_load(ddp_io_spm **out, const char *model_path) {
  *out = NULL;
  if (!model_path || !*model_path) DDP_FAIL(DDP_ERR_ARG, "spm_load: empty model path");
  ddp_io_spm *p = calloc(1, sizeof *p);
  if (!p) DDP_FAIL(DDP_ERR_MEMORY, "spm_load: out of memory");
  char err[DDP_SPM_ERR_CAP] = "";
  int status = ddp_spm_shim_load(&p->m, model_path, err);
  if (status) {
    free(p);
    DDP_FAIL(status, "spm_load: cannot load %s: %s", model_path, err);
  }
  p->vocab_size = ddp_spm_shim_vocab_size(p->m);
  *out = p;
  return DDP_OK;
}

void ddp_io_spm_free(ddp_io_spm *m) {
  if (!m) return;
  ddp_spm_shim_free(m->m);
  free(m);
}

int64_t ddp_io_spm_vocab_size(const ddp_io_spm *m) { return m ? m->vocab_size : 0; }

int ddp_io_spm_encode(ddp_tensor **out, const ddp_io_spm *m, const char *text, size_t len) {
  *out = NULL;
  if (!m) DDP_FAIL(DDP_ERR_ARG, "spm_encode: no model");
  if (!text && len) DDP_FAIL(DDP_ERR_ARG, "spm_encode: NULL text");
  int *ids = NULL;
  size_t n = 0;
  char err[DDP_SPM_ERR_CAP] = "";
  int status = ddp_spm_shim_encode(m->m, text ? text : "", len, &ids, &n, err);
  if (status) DDP_FAIL(status, "spm_encode: %s", err);
  int64_t count = (int64_t)n;
  status = ddp_tensor_empty(out, 1, &count, DDP_I64, DDP_DEVICE_CPU);
  if (!status) {
    int64_t *dst = (int64_t *)ddp_data(*out);
    for (size_t i = 0; i < n; i++) dst[i] = ids[i];
  }
  free(ids);
  return status;
}

int ddp_io_spm_decode(char **out, size_t *len, const ddp_io_spm *m, ddp_tensor *ids) {
  *out = NULL;
  *len = 0;
  const char *op = "spm_decode";
  if (!m) DDP_FAIL(DDP_ERR_ARG, "%s: no model", op);
  DDP_TRY(ddp_check_alive(ids, op, "ids"));
  if (ids->ndim != 1) DDP_FAIL(DDP_ERR_ARG, "%s: ids must be 1-d, got %d dims", op, ids->ndim);
  if (ddp_dtype_is_floating(ids->dtype) || ids->dtype == DDP_BOOL)
    DDP_FAIL(DDP_ERR_ARG, "%s: ids must be an integer tensor, got %s", op, ddp_dtype_name(ids->dtype));
  int64_t n = ids->numel;
  double *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
  int *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
  int status = DDP_OK;
  if (!vals || !buf) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory for %lld ids", op, (long long)n);
    goto done;
  }
  if (n && (status = ddp_tensor_to_f64(ids, vals))) goto done;
  for (int64_t i = 0; i < n; i++) {
    if (vals[i] < 0 || vals[i] >= (double)m->vocab_size) {
      status = DDP_ERROR(DDP_ERR_ARG, "%s: id %.0f at position %lld (0-based) is outside 0 .. %lld", op, vals[i],
                         (long long)i, (long long)(m->vocab_size - 1));
      goto done;
    }
    buf[i] = (int)vals[i];
  }
  {
    char err[DDP_SPM_ERR_CAP] = "";
    status = ddp_spm_shim_decode(m->m, buf, (size_t)n, out, len, err);
    if (status) status = DDP_ERROR(status, "%s: %s", op, err);
  }
done:
  free(vals);
  free(buf);
  return status;
}

void ddp_io_string_free(char *s) { free(s); }
