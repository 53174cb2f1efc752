/* runtime/core/factory.c: arange, linspace, eye. */
#include <math.h>

#include "core/core.h"

int ddp_arange(ddp_tensor **out, double start, double end, double step, int dtype) {
  *out = NULL;
  if (step == 0 || isnan(step)) DDP_FAIL(DDP_ERR_ARG, "arange: step must be non-zero, got %g", step);
  if (!isfinite(start) || !isfinite(end))
    DDP_FAIL(DDP_ERR_ARG, "arange: start (%g) and end (%g) must be finite", start, end);
  double count = ceil((end - start) / step);
  int64_t n = count > 0 ? (int64_t)count : 0;
  DDP_TRY(ddp_tensor_empty(out, 1, &n, dtype, DDP_DEVICE_CPU));
  char *p = ddp_data(*out);
  size_t es = ddp_dtype_size(dtype);
  for (int64_t i = 0; i < n; i++) ddp_store_f64(p + i * es, dtype, start + (double)i * step);
  return DDP_OK;
}

int ddp_linspace(ddp_tensor **out, double start, double end, int64_t steps, int dtype) {
  *out = NULL;
  if (steps < 0) DDP_FAIL(DDP_ERR_ARG, "linspace: steps must be >= 0, got %lld", (long long)steps);
  DDP_TRY(ddp_tensor_empty(out, 1, &steps, dtype, DDP_DEVICE_CPU));
  char *p = ddp_data(*out);
  size_t es = ddp_dtype_size(dtype);
  double delta = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
  /* as PyTorch: the first half counts up from start, the second half down from end, so
   * both ends are exact */
  int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; i++)
    ddp_store_f64(p + i * es, dtype,
                  i < half ? start + delta * (double)i : end - delta * (double)(steps - 1 - i));
  return DDP_OK;
}

int ddp_eye(ddp_tensor **out, int64_t n, int64_t m, int dtype) {
  *out = NULL;
  if (n < 0 || m < 0)
    DDP_FAIL(DDP_ERR_ARG, "eye: sizes must be >= 0, got (%lld, %lld)", (long long)n, (long long)m);
  int64_t shape[2] = {n, m};
  DDP_TRY(ddp_tensor_zeros(out, 2, shape, dtype, DDP_DEVICE_CPU));
  char *p = ddp_data(*out);
  size_t es = ddp_dtype_size(dtype);
  for (int64_t i = 0; i < n && i < m; i++) ddp_store_f64(p + (i * m + i) * es, dtype, 1.0);
  return DDP_OK;
}
