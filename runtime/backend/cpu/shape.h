/* runtime/backend/cpu/shape.h: CPU kernels of the shape and indexing ops (internal).
 * Outputs first, then inputs, then sizes. Strides are in elements. */
#ifndef DDP_CPU_SHAPE_H
#define DDP_CPU_SHAPE_H

#include "core/core.h"

/* Copy `outer` rows of `src_row` bytes each from the contiguous src (outer, src_row) into
 * dst (outer, dst_row) at byte column `dst_col`: one memcpy per row (cat's fast path). */
void ddp_cpu_copy_rows(char *dst,       // (outer, dst_row) bytes
                       const char *src, // (outer, src_row) bytes
                       int64_t outer, int64_t dst_row, int64_t dst_col, int64_t src_row);

/* out[o][k] = in[o][index[k]] over rows of `inner` elements of esize bytes: one memcpy per
 * row. index values already checked to lie in 0 .. size-1. */
void ddp_cpu_index_select(char *out,            // (outer, n_index, inner)
                          const char *in,       // (outer, size, inner)
                          const int64_t *index, // (n_index)
                          int64_t outer, int64_t size, int64_t inner, int64_t n_index,
                          size_t esize);

/* dst[o][index[k]] += src[o][k] (the backward of index_select), serial over index
 * positions since two k may name one row. Any numeric dtype (f16/bf16 through double). */
void ddp_cpu_index_add(char *dst,            // (outer, size, inner), contiguous
                       const char *src,      // (outer, n_index, inner), contiguous
                       const int64_t *index, // (n_index)
                       int64_t outer, int64_t size, int64_t inner, int64_t n_index, int dtype);

/* gather over the index shape (ndim >= 1 dims `shape`):
 * out[p] = in[p with dimension dim replaced by index[p]]. Strides in elements; index is
 * contiguous. Element size esize (the copy does not look at the values). */
void ddp_cpu_gather(char *out, const int64_t *out_strides, // (shape)
                    const char *in, const int64_t *in_strides, // (>= shape except at dim)
                    const int64_t *index,                      // (shape), contiguous
                    int ndim, const int64_t *shape, int dim, size_t esize);

/* scatter_add over the index shape: self[p with dim replaced by index[p]] += src[p].
 * Serial (positions collide). dtype: f32, f64, i64 natively, others through double. */
void ddp_cpu_scatter_add(char *self, const int64_t *self_strides, // (>= shape except at dim)
                         const char *src, const int64_t *src_strides, // (>= shape)
                         const int64_t *index,                        // (shape), contiguous
                         int ndim, const int64_t *shape, int dim, int dtype);

#endif /* DDP_CPU_SHAPE_H */
