/* runtime/io/csv.c: CSV files of numbers into f64 tensors (ddplua/arrays.h), parsed by
 * libcsv (RFC 4180 quoting, strict mode: a malformed quoted field is an error). The
 * parser hands over one field at a time (on_field) and the end of each record (on_record);
 * the values go to a growing array, the header's names to a growing text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <csv.h>

#include "core/core.h"
#include "io/io_internal.h"

#define CSV_MAX_FIELDS ((int64_t)1 << 28)

typedef struct {
  const char *name;
  int header;           /* the first record is the header */
  int64_t record;       /* records finished so far (the header included) */
  int64_t field;        /* fields of the current record so far */
  int64_t cols;         /* fields per record (the first record's), -1 before it */
  double *values;
  int64_t nvalues, cap;
  char *names;          /* the header's names, NUL-terminated one after the other */
  size_t names_len, names_cap;
  int status;           /* the first failure */
} csv_state;

static void on_field(void *s, size_t len, void *data) {
  csv_state *st = data;
  if (st->status) return;
  const char *text = s ? s : "";
  int in_header = st->header && st->record == 0;
  st->field++;
  if (in_header) {
    if (memchr(text, 0, len)) { /* the names are NUL-separated: a NUL inside would split one */
      st->status = DDP_ERROR(DDP_ERR_IO, "read_csv: %s: record 1, column %lld: the column name holds a NUL byte",
                             st->name, (long long)st->field);
      return;
    }
    if (st->names_len + len + 1 > st->names_cap) {
      size_t nc = (st->names_len + len + 1) * 2;
      char *nb = realloc(st->names, nc);
      if (!nb) {
        st->status = DDP_ERROR(DDP_ERR_MEMORY, "read_csv: %s: out of memory", st->name);
        return;
      }
      st->names = nb;
      st->names_cap = nc;
    }
    memcpy(st->names + st->names_len, text, len);
    st->names[st->names_len + len] = 0;
    st->names_len += len + 1;
    return;
  }
  if (st->nvalues >= CSV_MAX_FIELDS) {
    st->status = DDP_ERROR(DDP_ERR_IO, "read_csv: %s: more than 2^28 fields", st->name);
    return;
  }
  if (st->nvalues == st->cap) {
    int64_t nc = st->cap ? st->cap * 2 : 1024;
    double *nv = realloc(st->values, (size_t)nc * sizeof *nv);
    if (!nv) {
      st->status = DDP_ERROR(DDP_ERR_MEMORY, "read_csv: %s: out of memory", st->name);
      return;
    }
    st->values = nv;
    st->cap = nc;
  }
  double v;
  size_t b = 0, e = len;
  while (b < e && (text[b] == ' ' || text[b] == '\t')) b++;
  while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\r')) e--;
  if (b == e) {
    v = NAN; /* an empty field: a missing value, as pandas reads it */
  } else {
    char buf[256]; /* a number field is at most 255 bytes (ddplua/arrays.h) */
    char *end = NULL;
    if (e - b < sizeof buf && memchr(text + b, 0, e - b) == NULL) {
      memcpy(buf, text + b, e - b);
      buf[e - b] = 0;
      v = strtod(buf, &end);
    }
    if (!end || *end != 0) {
      st->status = DDP_ERROR(DDP_ERR_IO,
                             "read_csv: %s: record %lld, column %lld: '%.*s' is not a number",
                             st->name, (long long)st->record + 1, (long long)st->field,
                             (int)(len < 40 ? len : 40), text);
      return;
    }
  }
  st->values[st->nvalues++] = v;
}

static void on_record(int c, void *data) {
  csv_state *st = data;
  if (st->status) return;
  if (st->cols < 0) {
    st->cols = st->field;
  } else if (st->field != st->cols) {
    st->status = DDP_ERROR(DDP_ERR_IO, "read_csv: %s: record %lld has %lld fields, record 1 has %lld",
                           st->name, (long long)st->record + 1, (long long)st->field,
                           (long long)st->cols);
    return;
  }
  st->record++;
  st->field = 0;
}

int ddp_csv_decode(ddp_tensor **out, const void *data, size_t size, const char *name, int delimiter,
                   int header, char *names, size_t cap, size_t *needed) {
  *out = NULL;
  if (needed) *needed = 0;
  if (!name) name = "<bytes>";
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "read_csv: %s: data is NULL (size %zu)", name, size);
  if (delimiter < 1 || delimiter > 255 || delimiter == '"' || delimiter == '\n' || delimiter == '\r')
    DDP_FAIL(DDP_ERR_ARG, "read_csv: %s: delimiter must be a byte other than a quote or a line end, got %d",
             name, delimiter);
  if (header && !needed) DDP_FAIL(DDP_ERR_ARG, "read_csv: %s: needed must not be NULL with a header", name);
  struct csv_parser p;
  if (csv_init(&p, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) != 0)
    DDP_FAIL(DDP_ERR_MEMORY, "read_csv: %s: cannot start the parser", name);
  csv_set_delim(&p, (unsigned char)delimiter);
  csv_state st = {.name = name, .header = header != 0, .cols = -1};
  int status = DDP_OK;
  if (csv_parse(&p, data, size, on_field, on_record, &st) != size && !st.status)
    status = DDP_ERROR(DDP_ERR_IO, "read_csv: %s: record %lld: %s", name, (long long)st.record + 1,
                       csv_strerror(csv_error(&p)));
  if (!status && !st.status && csv_fini(&p, on_field, on_record, &st) != 0 && !st.status)
    status = DDP_ERROR(DDP_ERR_IO, "read_csv: %s: record %lld: %s", name, (long long)st.record + 1,
                       csv_strerror(csv_error(&p)));
  csv_free(&p);
  if (!status) status = st.status;
  int64_t rows = st.record - (st.header ? 1 : 0);
  if (!status && rows < 1)
    status = DDP_ERROR(DDP_ERR_IO, "read_csv: %s has no data rows%s", name, st.header ? " after the header" : "");
  if (!status && header) {
    *needed = st.names_len;
    if (cap < st.names_len)
      status = DDP_ERROR(DDP_ERR_ARG, "read_csv: %s: the names need %zu bytes, got %zu", name,
                         st.names_len, cap);
    else if (st.names_len)
      memcpy(names, st.names, st.names_len);
  }
  if (!status) {
    int64_t shape[2] = {rows, st.cols};
    status = ddp_tensor_empty(out, 2, shape, DDP_F64, DDP_DEVICE_CPU);
    if (!status && st.nvalues) memcpy(ddp_data(*out), st.values, (size_t)st.nvalues * sizeof(double));
  }
  free(st.values);
  free(st.names);
  return status;
}

int ddp_csv_read(ddp_tensor **out, const char *path, int delimiter, int header, char *names,
                 size_t cap, size_t *needed) {
  *out = NULL;
  if (needed) *needed = 0;
  uint8_t *buf;
  size_t size;
  DDP_TRY(ddp_io_read_file(path, "read_csv", (size_t)1 << 34, &buf, &size));
  int status = ddp_csv_decode(out, buf, size, path, delimiter, header, names, cap, needed);
  free(buf);
  return status;
}
