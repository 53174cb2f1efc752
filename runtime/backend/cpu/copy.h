/* runtime/backend/cpu/copy.h: CPU kernels of copies and fills (internal). */
#ifndef DDP_CPU_COPY_H
#define DDP_CPU_COPY_H

#include "core/core.h"

/* dst = src, converting dtypes. dst: (*) any strides; src: a view of dst's shape (stride 0
 * where broadcast), any dtype. No autograd, no version bump (the caller's job). */
void ddp_cpu_copy(ddp_tensor *dst, const ddp_tensor *src);

/* Every element of t = value (converted to t's dtype as ddp_store_f64 does). */
void ddp_cpu_fill(ddp_tensor *t, double value);

#endif /* DDP_CPU_COPY_H */
