/* runtime/core/error.c: the thread-local error message and status (see ddplua.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"

enum { DDP_ERROR_CAP = 2048 };
static __thread char error_text[DDP_ERROR_CAP];
static __thread int error_status;

const char *ddp_last_error(void) { return error_text; }
int ddp_last_status(void) { return error_status; }
void ddp_clear_error(void) {
  error_text[0] = 0;
  error_status = DDP_OK;
}
const char *ddp_version(void) { return "0.1.0"; }

/* Note [error text is an argument]: a caller often wraps the error of the call that failed,
 * `DDP_FAIL(st, "bucket %d failed: %s", k, ddp_last_error())`, so the text being formatted
 * may be one of the arguments. Formatting straight into error_text would overwrite that
 * argument while it is read (vsnprintf's buffers must not overlap): the cause came out
 * empty or garbled. So the message is built in a buffer of its own and copied at the end;
 * every call site may pass ddp_last_error() (or ddp_error_prefix's old text) freely. */
int ddp_fail_at(const char *file, int line, int status, const char *fmt, ...) {
  char text[DDP_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if (n < DDP_ERROR_CAP) snprintf(text + n, sizeof text - (size_t)n, " (%s:%d)", file, line);
  memcpy(error_text, text, sizeof text);
  error_status = status ? status : DDP_ERR_ARG;
  return error_status;
}

void ddp_error_save(ddp_saved_error *s) {
  _Static_assert(sizeof s->text == DDP_ERROR_CAP, "ddp_saved_error holds a whole message");
  memcpy(s->text, error_text, sizeof s->text);
  s->status = error_status;
}

void ddp_error_restore(const ddp_saved_error *s) {
  memcpy(error_text, s->text, sizeof s->text);
  error_status = s->status;
}

void ddp_error_prefix(const char *fmt, ...) {
  char prefix[512], old[DDP_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, error_text, sizeof old);
  snprintf(error_text, DDP_ERROR_CAP, "%s: %s", prefix, old);
}

const char *ddp_shape_str(int ndim, const int64_t *shape) {
  static __thread char slots[8][160];
  static __thread int next;
  char *s = slots[next++ & 7];
  size_t n = 0, cap = sizeof slots[0];
  n += snprintf(s + n, cap - n, "(");
  for (int i = 0; i < ndim && n < cap; i++)
    n += snprintf(s + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (n < cap) n += snprintf(s + n, cap - n, ndim == 1 ? ",)" : ")");
  return s;
}
