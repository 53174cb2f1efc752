/* runtime/ops/copy.h: the copy ops' internal entry points, for other ops and the autograd
 * engine (the public front doors are in ddplua.h: ddp_copy_, ddp_clone, ddp_to_dtype, ...). */
#ifndef DDP_OPS_COPY_H
#define DDP_OPS_COPY_H

#include "core/core.h"

/* dst = src (src broadcasts to dst's shape; dtypes may differ: converted; the devices may
 * differ: moved), without autograd or liveness checks. Bumps dst's version. Errors name
 * `op`. */
int ddp_copy_raw(ddp_tensor *dst, const ddp_tensor *src, const char *op);

/* dst += src (src broadcasts to dst's shape; dtypes may differ: converted). In place on
 * dst, no autograd: the engine's gradient accumulation and reductions' building block.
 * Both on one device (else DDP_ERR_ARG). */
int ddp_accumulate_(ddp_tensor *dst, const ddp_tensor *src);

/* *out = a contiguous tensor with t's values in `dtype` and no graph (for a backward that
 * computes in another dtype than its saved tensors, or needs them contiguous). */
int ddp_detached_as(ddp_tensor **out, ddp_tensor *t, int dtype);

#endif /* DDP_OPS_COPY_H */
