/* runtime/io/event_file.c: TensorBoard event files (what torch.utils.tensorboard's
 * SummaryWriter writes), through protobuf-c and the messages of proto/ (generated into
 * build/proto/ by make).
 *
 * Note [event record framing]: an event file is a TFRecord file (tensorflow's
 * core/lib/io/record_writer.cc), a sequence of records each
 *     uint64 length            little-endian, the byte count of data
 *     uint32 masked_crc(length bytes)
 *     data                     one serialized tensorboard.Event
 *     uint32 masked_crc(data)
 * where masked_crc(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (mod 2^32), and crc32c is
 * CRC-32C (Castagnoli). The first record of a file is an Event with file_version
 * "brain.Event:2"; the others carry one Summary each. Every record is built whole in memory
 * and handed to one write() on a file opened O_APPEND (Note [event file appends]).
 *
 * Note [event file appends]: the file is opened with O_CREAT | O_EXCL (never another
 * writer's file: the name holds the host, the pid and a process-wide counter) and
 * O_APPEND, and each record goes out in one write() (a loop only for the rare short
 * write), with no user-space buffer: a reader (TensorBoard polls the folder) sees whole
 * records as soon as the call returns, a crash loses at most the record being written, and
 * TensorBoard's reader stops at a torn last record and picks it up when it completes.
 * flush() adds fsync: what was written survives a machine crash.
 */
#define _GNU_SOURCE /* asprintf */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <protobuf-c/protobuf-c.h>

#include <event.pb-c.h>
#include <hparams_plugin_data.pb-c.h>

#include "core/core.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "event_file.c writes the record lengths in the host's bytes: little-endian hosts only"
#endif

struct ddp_event_file {
  int fd;
  char *path;
};

/* ---- CRC-32C ------------------------------------------------------------------------ */

/* CRC-32C, the Castagnoli polynomial 0x1EDC6F41 (G. Castagnoli, S. Bräuer, M. Herrmann,
 * "Optimization of cyclic redundancy-check codes with 24 and 32 parity bits", IEEE Trans.
 * Communications 41(6), 1993), in its bit-reflected form 0x82F63B78, as RFC 3720 (iSCSI)
 * section B.4 specifies it: initial value and final xor 0xFFFFFFFF, one table lookup per
 * byte (Sarwate's method). Check value: crc32c("123456789") = 0xE3069283. Debian ships
 * no C library for it (Google's crc32c is not packaged in bookworm). */
static uint32_t crc32c_table[256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc32c_table[i] = c;
  }
}

uint32_t ddp_crc32c(uint32_t crc, const void *data, size_t n) {
  pthread_once(&crc32c_once, crc32c_init);
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = crc32c_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

/* TFRecord's mask (tensorflow core/lib/hash/crc32c.h, Mask): a CRC stored next to the
 * data it covers is rotated and offset, so a CRC of bytes holding CRCs stays useful. */
static uint32_t masked_crc(const void *data, size_t n) {
  uint32_t c = ddp_crc32c(0, data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- records ------------------------------------------------------------------------ */

/* Write all n bytes at p to f (Note [event file appends]). */
static int write_all(ddp_event_file *f, const unsigned char *p, size_t n, const char *op) {
  while (n > 0) {
    ssize_t w = write(f->fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      DDP_FAIL(DDP_ERR_IO, "%s: cannot write to event file '%s': %s", op, f->path, strerror(errno));
    }
    p += w;
    n -= (size_t)w;
  }
  return DDP_OK;
}

/* Serialize ev and append it as one record (Note [event record framing]). */
static int write_event(ddp_event_file *f, const Tensorboard__Event *ev, const char *op) {
  if (!f || f->fd < 0) DDP_FAIL(DDP_ERR_STATE, "%s: the event file is closed", op);
  size_t n = tensorboard__event__get_packed_size(ev);
  unsigned char *buf = malloc(n + 16);
  if (!buf) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory for a %zu-byte event ('%s')", op, n, f->path);
  uint64_t len = n;
  memcpy(buf, &len, 8);
  uint32_t c = masked_crc(buf, 8);
  memcpy(buf + 8, &c, 4);
  size_t packed = tensorboard__event__pack(ev, buf + 12);
  c = masked_crc(buf + 12, packed);
  memcpy(buf + 12 + packed, &c, 4);
  int status = packed == n ? write_all(f, buf, n + 16, op)
                           : DDP_ERROR(DDP_ERR_STATE, "%s: protobuf-c packed %zu bytes, expected %zu",
                                       op, packed, n);
  free(buf);
  return status;
}

/* An Event of one summary holding the n values vals. */
static int write_summary(ddp_event_file *f, Tensorboard__Summary__Value **vals, size_t n,
                         int64_t step, double walltime, const char *op) {
  Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
  summary.n_value = n;
  summary.value = vals;
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = isnan(walltime) ? ddp_os_wall_seconds() : walltime;
  ev.step = step;
  ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
  ev.summary = &summary;
  return write_event(f, &ev, op);
}

static int check_tag(const ddp_event_file *f, const char *tag, const char *op) {
  if (!f) DDP_FAIL(DDP_ERR_ARG, "%s: the event file is NULL", op);
  if (!tag || !tag[0]) DDP_FAIL(DDP_ERR_ARG, "%s: the tag is empty ('%s')", op, f->path);
  return DDP_OK;
}

/* ---- open / close ------------------------------------------------------------------- */

static atomic_int global_uid;

int ddp_event_file_open(ddp_event_file **out, const char *log_dir, const char *filename_suffix) {
  const char *op = "SummaryWriter";
  if (!out) DDP_FAIL(DDP_ERR_ARG, "%s: out is NULL", op);
  *out = NULL;
  if (!log_dir || !log_dir[0]) DDP_FAIL(DDP_ERR_ARG, "%s: log_dir is empty", op);
  DDP_TRY(ddp_os_mkdir_p(log_dir));
  char host[256] = "localhost";
  if (gethostname(host, sizeof host) != 0) strcpy(host, "localhost");
  host[sizeof host - 1] = 0;
  const char *suffix = filename_suffix ? filename_suffix : "";
  /* torch.utils.tensorboard's (tensorboard's EventFileWriter) name: seconds as 10 digits,
   * the host, the pid, a process-wide counter, then the caller's suffix. */
  char *path = NULL;
  if (asprintf(&path, "%s/events.out.tfevents.%010lld.%s.%d.%d%s", log_dir, (long long)time(NULL), host,
               (int)getpid(), atomic_fetch_add(&global_uid, 1), suffix) < 0)
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
  if (fd < 0) {
    int status = DDP_ERROR(DDP_ERR_IO, "%s: cannot create event file '%s': %s", op, path, strerror(errno));
    free(path);
    return status;
  }
  ddp_event_file *f = calloc(1, sizeof *f);
  if (!f) {
    close(fd);
    unlink(path);
    free(path);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  }
  f->fd = fd;
  f->path = path;
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = ddp_os_wall_seconds();
  ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  ev.file_version = "brain.Event:2";
  int status = write_event(f, &ev, op);
  if (status) {
    ddp_event_file_close(f);
    return status;
  }
  *out = f;
  return DDP_OK;
}

const char *ddp_event_file_path(const ddp_event_file *f) { return f ? f->path : ""; }

int ddp_event_file_flush(ddp_event_file *f) {
  if (!f || f->fd < 0) DDP_FAIL(DDP_ERR_STATE, "SummaryWriter.flush: the event file is closed");
  if (fsync(f->fd) != 0 && errno != EINVAL)
    DDP_FAIL(DDP_ERR_IO, "SummaryWriter.flush: cannot sync event file '%s': %s", f->path, strerror(errno));
  return DDP_OK;
}

int ddp_event_file_close(ddp_event_file *f) {
  if (!f) return DDP_OK;
  int status = DDP_OK;
  if (f->fd >= 0) {
    if (fsync(f->fd) != 0 && errno != EINVAL)
      status = DDP_ERROR(DDP_ERR_IO, "SummaryWriter.close: cannot sync event file '%s': %s", f->path,
                         strerror(errno));
    if (close(f->fd) != 0 && !status)
      status = DDP_ERROR(DDP_ERR_IO, "SummaryWriter.close: cannot close event file '%s': %s", f->path,
                         strerror(errno));
  }
  free(f->path);
  free(f);
  return status;
}

/* ---- summaries ---------------------------------------------------------------------- */

int ddp_event_file_add_scalar(ddp_event_file *f, const char *tag, double value, int64_t step, double walltime) {
  DDP_TRY(check_tag(f, tag, "SummaryWriter.add_scalar"));
  Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value;
  Tensorboard__Summary__Value *vals[1] = { &v };
  return write_summary(f, vals, 1, step, walltime, "SummaryWriter.add_scalar");
}

int ddp_event_file_add_text(ddp_event_file *f, const char *tag, const char *text, int64_t step, double walltime) {
  const char *op = "SummaryWriter.add_text";
  DDP_TRY(check_tag(f, tag, op));
  if (!text) DDP_FAIL(DDP_ERR_ARG, "%s: text is NULL ('%s')", op, tag);
  /* torch.utils.tensorboard.summary.text: the tag gets "/text_summary"; the value is a
   * DT_STRING tensor of shape (1) holding the UTF-8 bytes, with the "text" plugin's
   * metadata, whose content is TextPluginData{version = 0} serialized: no bytes. */
  char *full = NULL;
  if (asprintf(&full, "%s/text_summary", tag) < 0) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  Tensorboard__SummaryMetadata__PluginData pd = TENSORBOARD__SUMMARY_METADATA__PLUGIN_DATA__INIT;
  pd.plugin_name = "text";
  Tensorboard__SummaryMetadata md = TENSORBOARD__SUMMARY_METADATA__INIT;
  md.plugin_data = &pd;
  Tensorboard__TensorShapeProto__Dim dim = TENSORBOARD__TENSOR_SHAPE_PROTO__DIM__INIT;
  dim.size = 1;
  Tensorboard__TensorShapeProto__Dim *dims[1] = { &dim };
  Tensorboard__TensorShapeProto shape = TENSORBOARD__TENSOR_SHAPE_PROTO__INIT;
  shape.n_dim = 1;
  shape.dim = dims;
  ProtobufCBinaryData s = { strlen(text), (uint8_t *)text };
  Tensorboard__TensorProto t = TENSORBOARD__TENSOR_PROTO__INIT;
  t.dtype = TENSORBOARD__DATA_TYPE__DT_STRING;
  t.tensor_shape = &shape;
  t.n_string_val = 1;
  t.string_val = &s;
  Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
  v.tag = full;
  v.metadata = &md;
  v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR;
  v.tensor = &t;
  Tensorboard__Summary__Value *vals[1] = { &v };
  int status = write_summary(f, vals, 1, step, walltime, op);
  free(full);
  return status;
}

/* Note [histogram buckets]: what torch.utils.tensorboard.summary.make_histogram computes
 * (PyTorch 1.13 and later), so a histogram reads the same as PyTorch's:
 *  - edges: given; or `nbins` equal bins from min to max (numpy.histogram: the range
 *    widened by 0.5 each side when min == max; edge i = min + i * (max - min) / nbins, the
 *    last one max exactly, as numpy.linspace: a product and a sum each rounded, which is
 *    why the Makefile compiles this file with -ffp-contract=off, no FMA); or, by default, SummaryWriter's
 *    "tensorflow" bins: -v ... , 0, ... v for v = 1e-12, 1e-12 * 1.1, ... while v < 1e20.
 *  - counts: numpy.histogram's, bin i holding the values in [edge i, edge i+1), the last
 *    bin [edge n-1, edge n] closed; values outside the edges are counted nowhere.
 *  - max_bins > 0 and fewer than the bins: bins merged by runs of bins / max_bins.
 *  - the support: the bins from the first to the last with a non-zero count are kept, plus
 *    an empty bin to their left (the one before, or a zero count before the first bin),
 *    because TensorBoard shows a bucket up to its right limit only; bucket_limit is the
 *    right edges of the kept bins.
 *  - min, max, num, sum and sum_squares over all the values (as doubles).
 */
static int64_t bin_of(const double *edges, int64_t nedges, double x) {
  /* the count of edges <= x (upper bound) */
  int64_t lo = 0, hi = nedges;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (edges[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return -1;
  if (lo == nedges) return x == edges[nedges - 1] ? nedges - 2 : -1;
  return lo - 1;
}

int ddp_event_file_add_histogram(ddp_event_file *f, const char *tag, const double *values, int64_t n,
                                 int64_t nbins, const double *edges_in, int64_t nedges_in, int64_t max_bins,
                                 int64_t step, double walltime) {
  const char *op = "SummaryWriter.add_histogram";
  DDP_TRY(check_tag(f, tag, op));
  if (n <= 0 || !values) DDP_FAIL(DDP_ERR_ARG, "%s: The input has no element (tag '%s')", op, tag);
  double mn = values[0], mx = values[0], sum = 0, sumsq = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = values[i];
    if (!isfinite(x))
      DDP_FAIL(DDP_ERR_ARG, "%s: the values of '%s' hold %s (element %lld)", op, tag,
               isnan(x) ? "NaN" : "an infinity", (long long)i);
    mn = x < mn ? x : mn;
    mx = x > mx ? x : mx;
    sum += x;
    sumsq += x * x;
  }
  double *edges = NULL;
  int64_t nedges;
  if (edges_in) {
    if (nedges_in < 2) DDP_FAIL(DDP_ERR_ARG, "%s: bins needs at least 2 edges, got %lld ('%s')", op,
                                (long long)nedges_in, tag);
    for (int64_t i = 1; i < nedges_in; i++)
      if (!(edges_in[i] > edges_in[i - 1]))
        DDP_FAIL(DDP_ERR_ARG, "%s: bins must increase monotonically (edge %lld is %g after %g; '%s')", op,
                 (long long)i, edges_in[i], edges_in[i - 1], tag);
    nedges = nedges_in;
    edges = malloc((size_t)nedges * sizeof *edges);
    if (!edges) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
    memcpy(edges, edges_in, (size_t)nedges * sizeof *edges);
  } else if (nbins > 0) {
    if (nbins > 100000000) DDP_FAIL(DDP_ERR_ARG, "%s: bins = %lld is too many ('%s')", op, (long long)nbins, tag);
    double first = mn, last = mx;
    if (first == last) first -= 0.5, last += 0.5;
    nedges = nbins + 1;
    edges = malloc((size_t)nedges * sizeof *edges);
    if (!edges) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
    double stepw = (last - first) / (double)nbins;
    for (int64_t i = 0; i < nedges; i++) edges[i] = (double)i * stepw + first;
    edges[nedges - 1] = last;
  } else if (nbins == 0) {
    int64_t half = 0;
    for (double v = 1e-12; v < 1e20; v *= 1.1) half++;
    nedges = 2 * half + 1;
    edges = malloc((size_t)nedges * sizeof *edges);
    if (!edges) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
    int64_t k = 0;
    for (double v = 1e-12; v < 1e20; v *= 1.1, k++) {
      edges[half + 1 + k] = v;
      edges[half - 1 - k] = -v;
    }
    edges[half] = 0;
  } else {
    DDP_FAIL(DDP_ERR_ARG, "%s: bins must be positive, got %lld ('%s')", op, (long long)nbins, tag);
  }
  int64_t nb = nedges - 1;
  double *counts = calloc((size_t)nb + 1, sizeof *counts); /* + 1: room for the padding zero */
  if (!counts) {
    free(edges);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t b = bin_of(edges, nedges, values[i]);
    if (b >= 0) counts[b] += 1;
  }
  if (max_bins > 0 && nb > max_bins) { /* merge runs of `sub` bins, the last run padded */
    int64_t sub = nb / max_bins, m = (nb + sub - 1) / sub;
    for (int64_t j = 0; j < m; j++) {
      double c = 0;
      for (int64_t i = j * sub; i < (j + 1) * sub && i < nb; i++) c += counts[i];
      counts[j] = c;
      edges[j] = edges[j * sub];
    }
    edges[m] = edges[nedges - 1];
    nb = m;
    nedges = m + 1;
  }
  int64_t first = -1, lastnz = -1;
  for (int64_t i = 0; i < nb; i++)
    if (counts[i] > 0) {
      if (first < 0) first = i;
      lastnz = i;
    }
  if (first < 0) {
    free(edges);
    free(counts);
    DDP_FAIL(DDP_ERR_ARG, "%s: no value of '%s' falls inside the bins (values from %g to %g)", op, tag, mn, mx);
  }
  /* the kept counts: [first - 1, lastnz] (a leading zero when first is 0); their right
   * edges: edges[first .. lastnz + 1] */
  int64_t k = lastnz - first + 2;
  double *bucket = malloc((size_t)k * sizeof *bucket);
  if (!bucket) {
    free(edges);
    free(counts);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  }
  for (int64_t j = 0; j < k; j++) {
    int64_t i = first - 1 + j;
    bucket[j] = i < 0 ? 0 : counts[i];
  }
  Tensorboard__HistogramProto h = TENSORBOARD__HISTOGRAM_PROTO__INIT;
  h.min = mn;
  h.max = mx;
  h.num = (double)n;
  h.sum = sum;
  h.sum_squares = sumsq;
  h.n_bucket_limit = (size_t)k;
  h.bucket_limit = edges + first;
  h.n_bucket = (size_t)k;
  h.bucket = bucket;
  Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_HISTO;
  v.histo = &h;
  Tensorboard__Summary__Value *vals[1] = { &v };
  int status = write_summary(f, vals, 1, step, walltime, op);
  free(bucket);
  free(counts);
  free(edges);
  return status;
}

/* ---- hparams ------------------------------------------------------------------------ */

/* One hparams-plugin summary: a value with tag `tag`, no data, and the plugin's metadata
 * holding pd serialized. */
static int write_hparams_part(ddp_event_file *f, const char *tag, const Tensorboard__Hparams__HParamsPluginData *pd,
                              int64_t step, double walltime, const char *op) {
  size_t n = tensorboard__hparams__hparams_plugin_data__get_packed_size(pd);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  tensorboard__hparams__hparams_plugin_data__pack(pd, buf);
  Tensorboard__SummaryMetadata__PluginData plugin = TENSORBOARD__SUMMARY_METADATA__PLUGIN_DATA__INIT;
  plugin.plugin_name = "hparams";
  plugin.content.len = n;
  plugin.content.data = buf;
  Tensorboard__SummaryMetadata md = TENSORBOARD__SUMMARY_METADATA__INIT;
  md.plugin_data = &plugin;
  Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.metadata = &md;
  Tensorboard__Summary__Value *vals[1] = { &v };
  int status = write_summary(f, vals, 1, step, walltime, op);
  free(buf);
  return status;
}

int ddp_event_file_add_hparams(ddp_event_file *f, int n, const char *const *names, const int *kinds,
                               const double *numbers, const char *const *strings, int nmetrics,
                               const char *const *metric_tags, int64_t step, double walltime) {
  const char *op = "SummaryWriter.add_hparams";
  if (!f) DDP_FAIL(DDP_ERR_ARG, "%s: the event file is NULL", op);
  if (n < 0 || nmetrics < 0 || (n > 0 && (!names || !kinds || !numbers || !strings)) ||
      (nmetrics > 0 && !metric_tags))
    DDP_FAIL(DDP_ERR_ARG, "%s: bad arrays (n %d, nmetrics %d)", op, n, nmetrics);
  for (int i = 0; i < n; i++) {
    if (!names[i] || !names[i][0]) DDP_FAIL(DDP_ERR_ARG, "%s: hyperparameter %d has an empty name", op, i + 1);
    if (kinds[i] < DDP_HPARAM_NUMBER || kinds[i] > DDP_HPARAM_BOOL)
      DDP_FAIL(DDP_ERR_ARG, "%s: hyperparameter '%s' has the unknown kind %d", op, names[i], kinds[i]);
    if (kinds[i] == DDP_HPARAM_STRING && !strings[i])
      DDP_FAIL(DDP_ERR_ARG, "%s: hyperparameter '%s' is a string but its text is NULL", op, names[i]);
  }
  for (int i = 0; i < nmetrics; i++)
    if (!metric_tags[i] || !metric_tags[i][0]) DDP_FAIL(DDP_ERR_ARG, "%s: metric %d has an empty tag", op, i + 1);
  size_t cells = (size_t)(n > 0 ? n : 1), mcells = (size_t)(nmetrics > 0 ? nmetrics : 1);
  Tensorboard__Hparams__HParamInfo *infos = calloc(cells, sizeof *infos);
  Tensorboard__Hparams__HParamInfo **info_ptrs = calloc(cells, sizeof *info_ptrs);
  Google__Protobuf__Value *gvals = calloc(cells, sizeof *gvals);
  Tensorboard__Hparams__SessionStartInfo__HparamsEntry *entries = calloc(cells, sizeof *entries);
  Tensorboard__Hparams__SessionStartInfo__HparamsEntry **entry_ptrs = calloc(cells, sizeof *entry_ptrs);
  Tensorboard__Hparams__MetricName *mnames = calloc(mcells, sizeof *mnames);
  Tensorboard__Hparams__MetricInfo *minfos = calloc(mcells, sizeof *minfos);
  Tensorboard__Hparams__MetricInfo **minfo_ptrs = calloc(mcells, sizeof *minfo_ptrs);
  int status = DDP_OK;
  if (!infos || !info_ptrs || !gvals || !entries || !entry_ptrs || !mnames || !minfos || !minfo_ptrs) {
    status = DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory", op);
    goto done;
  }
  /* torch.utils.tensorboard.summary.hparams: one HParamInfo and one session-start entry
   * per hyperparameter (numbers: number_value, DATA_TYPE_FLOAT64; strings: string_value,
   * DATA_TYPE_STRING; booleans: bool_value, DATA_TYPE_BOOL), a MetricInfo per metric tag. */
  for (int i = 0; i < n; i++) {
    tensorboard__hparams__hparam_info__init(&infos[i]);
    google__protobuf__value__init(&gvals[i]);
    tensorboard__hparams__session_start_info__hparams_entry__init(&entries[i]);
    infos[i].name = (char *)names[i];
    if (kinds[i] == DDP_HPARAM_NUMBER) {
      infos[i].type = TENSORBOARD__HPARAMS__DATA_TYPE__DATA_TYPE_FLOAT64;
      gvals[i].kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE;
      gvals[i].number_value = numbers[i];
    } else if (kinds[i] == DDP_HPARAM_STRING) {
      infos[i].type = TENSORBOARD__HPARAMS__DATA_TYPE__DATA_TYPE_STRING;
      gvals[i].kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE;
      gvals[i].string_value = (char *)strings[i];
    } else {
      infos[i].type = TENSORBOARD__HPARAMS__DATA_TYPE__DATA_TYPE_BOOL;
      gvals[i].kind_case = GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE;
      gvals[i].bool_value = numbers[i] != 0;
    }
    info_ptrs[i] = &infos[i];
    entries[i].key = (char *)names[i];
    entries[i].value = &gvals[i];
    entry_ptrs[i] = &entries[i];
  }
  for (int i = 0; i < nmetrics; i++) {
    tensorboard__hparams__metric_name__init(&mnames[i]);
    tensorboard__hparams__metric_info__init(&minfos[i]);
    mnames[i].tag = (char *)metric_tags[i];
    minfos[i].name = &mnames[i];
    minfo_ptrs[i] = &minfos[i];
  }
  Tensorboard__Hparams__Experiment exp = TENSORBOARD__HPARAMS__EXPERIMENT__INIT;
  exp.n_hparam_infos = (size_t)n;
  exp.hparam_infos = info_ptrs;
  exp.n_metric_infos = (size_t)nmetrics;
  exp.metric_infos = minfo_ptrs;
  Tensorboard__Hparams__SessionStartInfo ssi = TENSORBOARD__HPARAMS__SESSION_START_INFO__INIT;
  ssi.n_hparams = (size_t)n;
  ssi.hparams = entry_ptrs;
  Tensorboard__Hparams__SessionEndInfo sei = TENSORBOARD__HPARAMS__SESSION_END_INFO__INIT;
  sei.status = TENSORBOARD__HPARAMS__STATUS__STATUS_SUCCESS;
  /* PyTorch's order: experiment, session start, session end (tensorboard's
   * plugins/hparams/metadata.py tags; PLUGIN_DATA_VERSION 0). */
  Tensorboard__Hparams__HParamsPluginData pd = TENSORBOARD__HPARAMS__HPARAMS_PLUGIN_DATA__INIT;
  pd.data_case = TENSORBOARD__HPARAMS__HPARAMS_PLUGIN_DATA__DATA_EXPERIMENT;
  pd.experiment = &exp;
  status = write_hparams_part(f, "_hparams_/experiment", &pd, step, walltime, op);
  if (status) goto done;
  pd.data_case = TENSORBOARD__HPARAMS__HPARAMS_PLUGIN_DATA__DATA_SESSION_START_INFO;
  pd.session_start_info = &ssi;
  status = write_hparams_part(f, "_hparams_/session_start_info", &pd, step, walltime, op);
  if (status) goto done;
  pd.data_case = TENSORBOARD__HPARAMS__HPARAMS_PLUGIN_DATA__DATA_SESSION_END_INFO;
  pd.session_end_info = &sei;
  status = write_hparams_part(f, "_hparams_/session_end_info", &pd, step, walltime, op);
done:
  free(infos);
  free(info_ptrs);
  free(gvals);
  free(entries);
  free(entry_ptrs);
  free(mnames);
  free(minfos);
  free(minfo_ptrs);
  return status;
}
