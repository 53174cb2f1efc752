/* runtime/io/io_internal.h: what the io files share (not public). */
#ifndef DDP_IO_INTERNAL_H
#define DDP_IO_INTERNAL_H

#include "core/core.h"

/* How one source's samples are gathered and transformed: the sample seen as (C, H, W)
 * (see io.h), the output geometry and what the transform needs. Made by ddp_io_plan. */
typedef struct {
  ddp_io_transform tf;  /* the transform with defaults filled in (scale 1, ...) */
  int sample_ndim;      /* dims of one sample (src->ndim - 1) */
  int64_t sample_shape[DDP_MAX_DIMS];   /* output sample shape (crop applied) */
  int64_t C, H, W;      /* input sample as (C, H, W) */
  int64_t OH, OW;       /* output height and width (crop window, or H and W) */
  int64_t in_numel, out_numel; /* elements per input / output sample */
  int src_dtype, out_dtype;
  int out_float;        /* the output is f32 computed from scale / normalize */
  int geometric;        /* crop or flip present */
  int random;           /* the transform draws from the generator */
} ddp_io_plan_t;

/* Check tf (NULL: identity) against the source src (N, ...) and fill the plan. Errors name
 * `op` and the fault (DDP_ERR_ARG). */
int ddp_io_plan(ddp_io_plan_t *plan, const ddp_tensor *src, const ddp_io_transform *tf,
                const char *op);

/* Gather B samples of the contiguous source src (N, ...) at the (already range-checked)
 * indices idx into a new tensor (B, ...) (or the sample alone when batch_dim is 0, B 1);
 * sample p uses Philox block (seed, base + p) when the plan is random. Runs on any thread
 * and records no autograd; use_pool 1 splits the samples over the fork-join pool (the
 * caller's thread), 0 runs them on this thread alone (the prefetch thread). */
int ddp_io_gather(ddp_tensor **out, const ddp_tensor *src, const int64_t *idx, int64_t B,
                  int batch_dim, const ddp_io_plan_t *plan, uint64_t seed, uint64_t base,
                  int use_pool);

/* Write the n buffers (bufs[i], lens[i] bytes) one after the other to `path`, atomically
 * (runtime/io/safetensors.c, Note [checkpoint temp files]): into "<path>.tmp.<host>.<pid>",
 * fsync'ed, renamed over path, the directory fsync'ed; the temporary file is removed on an
 * error and the dead writers' ones are swept first. Errors (DDP_ERR_IO with strerror,
 * DDP_ERR_MEMORY) start with `op` and name the file. */
int ddp_io_write_atomic(const char *path, const char *op, int n, const void *const *bufs,
                        const size_t *lens);

/* Read the whole regular file at `path` into a new malloc'd buffer (*data, *size bytes; a
 * 1-byte block for an empty file; the caller frees it). Files above `max` bytes are
 * refused. Errors (DDP_ERR_IO) start with `op` and name the file: cannot open (strerror),
 * not a regular file, too large, a short read (runtime/io/file_bytes.c). */
int ddp_io_read_file(const char *path, const char *op, size_t max, uint8_t **data, size_t *size);

/* Copy the n items (checked by ddp_io_stack_check) one after the other into t, a
 * contiguous CPU tensor of shape (n, item shape...) and the items' dtype (ddp_io_stack's
 * copy; records no autograd). Errors: those of copying a strided item. */
int ddp_io_stack_into(ddp_tensor *t, int n, ddp_tensor **items);

#endif /* DDP_IO_INTERNAL_H */
