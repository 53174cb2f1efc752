/* runtime/core/core.h: the runtime's internal view of tensors, storages, errors, dtypes,
 * the element iterator and the thread pool. Included by runtime code only; never by users
 * (they see the opaque handles of ddplua.h). */
#ifndef DDP_CORE_H
#define DDP_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ddplua.h"

typedef struct ddp_node ddp_node;           /* autograd node: opaque to the core */
typedef struct ddp_tensor_hooks ddp_tensor_hooks; /* autograd's hook list: opaque too */

/* ---- errors ------------------------------------------------------------------------- */

/* Record a failure on this thread: status and a printf-style message, with " (file:line)"
 * appended. Returns `status` so callers can `return ddp_fail(...)`. */
int ddp_fail_at(const char *file, int line, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The thread's error (message and status), saved so that code running where the caller
 * has not read its error yet (a finalizer: ffi.gc may run ddp_reducer_free between a failing
 * call and the caller's ddp_last_error(); a drain after a failure) can put it back. */
typedef struct {
  int status;
  char text[2048];
} ddp_saved_error;
void ddp_error_save(ddp_saved_error *s);
void ddp_error_restore(const ddp_saved_error *s);

/* Prefix the current error message with "<prefix>: " (for context added by callers). */
void ddp_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define DDP_FAIL(status, ...) return ddp_fail_at(__FILE__, __LINE__, (status), __VA_ARGS__)
#define DDP_ERROR(status, ...) ddp_fail_at(__FILE__, __LINE__, (status), __VA_ARGS__)
/* Evaluate a status expression and return it from the enclosing function when non-zero. */
#define DDP_TRY(expr)                                                                      \
  do {                                                                                     \
    int ddp_try_status_ = (expr);                                                          \
    if (ddp_try_status_) return ddp_try_status_;                                           \
  } while (0)

/* ---- allocator (aligned, counts live and peak bytes) -------------------------------- */

enum { DDP_ALIGNMENT = 64 };
/* NULL on failure (no error set); nbytes 0 gives a valid block. Blocks above 1 KiB are
 * 64-byte aligned, smaller ones 16-byte aligned. */
void *ddp_alloc(size_t nbytes);
void ddp_free(void *p, size_t nbytes);

/* Note [small block cache]: a small op makes a tensor header, a small storage and a graph
 * node, and the Lua front end releases them in batches of thousands after a collection
 * (Note [handle registry] in lua/ddplua/lib.lua). Served by glibc, whose per-thread cache
 * holds 7 blocks of a size, such a batch went into its bins and the next ops' mallocs
 * sorted them out again: half the time of a small op. Blocks of up to 1 KiB are therefore
 * kept on per-thread free lists, one per 64-byte size class, up to 8 MiB a class, and
 * handed out last-in first-out (the block freed last is the one in cache). A freed block
 * joins the class that malloc_usable_size says it can serve, so any malloc'd block may be
 * given to ddp_block_free; it may be freed on another thread than the one that made it
 * (it joins that thread's lists), and a thread's lists go back to malloc when it exits;
 * what a list keeps unused for a while goes back earlier (Note [block list trim], alloc.c).
 * In AddressSanitizer builds (or with -DDDP_NO_BLOCK_CACHE) every block is plain
 * malloc/free, so the sanitizer sees each one.
 *
 * ddp_block_alloc: an uninitialised block of at least nbytes (NULL when out of memory),
 * 16-byte aligned, to be freed with ddp_block_free (or free). The _counted pair also counts
 * nbytes as live (ddp_memory_live_bytes): free with the same nbytes. */
void *ddp_block_alloc(size_t nbytes);
void ddp_block_free(void *p);
void *ddp_alloc_block_counted(size_t nbytes);
void ddp_free_block_counted(void *p, size_t nbytes);

/* ---- storage and tensor ------------------------------------------------------------- */

/* Who owns a storage's memory. */
enum ddp_storage_kind {
  DDP_STORAGE_ALLOC = 0,   /* data from ddp_alloc, freed with ddp_free */
  DDP_STORAGE_INLINE = 1,  /* small data in the same block as the storage struct */
  DDP_STORAGE_EXTERNAL = 2, /* the caller's memory (from_blob): deleter(data, ctx) if set */
  DDP_STORAGE_DEVICE = 3,   /* device memory from the plug-in's caching allocator */
  DDP_STORAGE_PINNED = 4    /* page-locked host memory from the plug-in (pin_memory) */
};

typedef struct ddp_storage {
  int64_t refcount;       /* atomic */
  void *data;
  size_t nbytes;
  int32_t device;         /* DDP_DEVICE_CPU or a cuda index */
  int32_t kind;           /* enum ddp_storage_kind */
  int64_t version;        /* bumped by every in-place write (saved-tensor checks) */
  ddp_deleter_fn deleter; /* DDP_STORAGE_EXTERNAL only; may be NULL */
  void *deleter_ctx;
  /* Note [storage resize] (runtime/core/tensor.c): bytes of the small block that holds this
   * struct when its data was inline before a resize moved the data out (0 otherwise), and
   * whether ddp_tensor_storage_resize_ ever ran on it (only then does ddp_check_alive
   * compare a tensor's extent with nbytes). */
  uint32_t block_bytes;
  uint8_t resized;
} ddp_storage;

struct ddp_tensor {
  int64_t refcount;            /* atomic */
  ddp_storage *storage;        /* NULL once ddp_tensor_free() ran */
  int32_t dtype;               /* enum ddp_dtype */
  int32_t ndim;
  int32_t device;
  int64_t offset;              /* elements */
  int64_t numel;
  int64_t shape[DDP_MAX_DIMS];
  int64_t strides[DDP_MAX_DIMS]; /* elements */
  /* autograd */
  uint8_t requires_grad;
  uint8_t retains_grad;
  ddp_tensor *grad;            /* accumulated gradient, owned */
  ddp_node *grad_fn;           /* producing node (owned reference), NULL for leaves */
  ddp_tensor_hooks *hooks;     /* post-accumulate hooks, owned */
  int64_t backward_pending;    /* engine scratch: edges still to deliver to this leaf */
  /* Note [views and their base] (runtime/tape/view_history.c): a view made by a view
   * op (narrow, select, view, t, ...) knows the tensor whose storage it shows, so that an
   * in-place write through the view can rewrite that tensor's history. */
  ddp_tensor *view_base;       /* owned; never itself a view; NULL for non-views */
  ddp_node *view_base_fn;      /* weak: view_base->grad_fn when this view's grad_fn was made */
};

/* Note [last reference]: drop one reference from the count *rc; 1 when it was the last.
 * A count of 1 read with acquire ordering belongs to the caller alone (no other thread
 * holds a reference through which it could add one), so the locked decrement, a good part
 * of releasing a temporary, is skipped; the count is left at 1 on an object about to go. */
static inline int ddp_ref_drop(int64_t *rc) {
  return __atomic_load_n(rc, __ATOMIC_ACQUIRE) == 1 ||
         __atomic_sub_fetch(rc, 1, __ATOMIC_ACQ_REL) == 0;
}

/* Element address of t at storage offset t->offset (no checks). */
static inline char *ddp_data(const ddp_tensor *t) {
  return (char *)t->storage->data + (size_t)t->offset * ddp_dtype_size(t->dtype);
}

/* Fail unless t is a live tensor. `op` and `arg` name the call and argument for the
 * message, e.g. ddp_check_alive(t, "add", "other"). */
int ddp_check_alive(const ddp_tensor *t, const char *op, const char *arg);

/* 1 when t's elements lie inside its storage's bytes; 0 when a storage resize (Note
 * [storage resize], runtime/core/tensor.c) left the storage shorter than t's extent. */
int ddp_tensor_storage_fits(const ddp_tensor *t);

/* A new tensor header viewing `base`'s storage with the given geometry (no autograd,
 * requires_grad 0). The caller checks the geometry stays inside the storage. */
int ddp_tensor_view_raw(ddp_tensor **out, const ddp_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset);

/* A contiguous tensor header over storage s, which it takes over (s->refcount must be 1
 * and hold enough bytes). NULL on memory exhaustion (s is then still the caller's). */
ddp_tensor *ddp_tensor_over_storage(ddp_storage *s, int dtype, int ndim, const int64_t *shape);

/* A detached alias of t: same storage and geometry, no graph. Never fails for a live t
 * except on memory exhaustion (then NULL with the error set). */
ddp_tensor *ddp_tensor_alias(const ddp_tensor *t);

/* Make `view` (fresh from ddp_tensor_view_raw over `of`'s storage) a view that knows its
 * base: of's own base when `of` is a view, else `of` (Note [views and their base]). */
void ddp_tensor_set_view_base(ddp_tensor *view, ddp_tensor *of);

/* Contiguous row-major strides for shape into strides; returns numel. The shape must have
 * passed ddp_shape_check (or ddp_shape_span) first: the products are not checked here. */
int64_t ddp_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Note [shape arithmetic]: a shape enters the runtime from a user (factories, view,
 * reshape, expand) or from a file header (IDX, safetensors), and every size derived from
 * it (numel, each contiguous stride, the byte count) is a product of its sizes. Those
 * products are checked once, where the shape enters, so the code after it may multiply
 * freely. The check multiplies the sizes with each 0 counted as 1: a zero-size dimension
 * makes numel 0, but the strides of the dimensions before it are still products of the
 * sizes after it, and a wrapped stride would be a silent wrong geometry. PyTorch 1.13
 * accepts torch.zeros(0, 2**40, 2**40, 2**40) with a wrapped stride of 0 (and rejects the
 * same sizes in another order): we reject both.
 * ddp_shape_span returns that product (each 0 counted as 1), or -1 when a size is negative
 * or the product does not fit in int64. */
int64_t ddp_shape_span(int ndim, const int64_t *shape);
/* ddp_shape_check (ddplua.h) is the same test with the error message. */

/* DDP_OK when index (t->ndim entries, 0-based) names an element of t; else the error
 * ddp_tensor_get / ddp_tensor_set give, naming `op`. */
int ddp_tensor_check_index(const ddp_tensor *t, const int64_t *index, const char *op);

/* Mark an in-place write of t's storage. */
static inline void ddp_tensor_bump_version(ddp_tensor *t) { t->storage->version++; }

/* Format a shape as "(2, 3)" into a thread-local rotating buffer (8 slots): valid for a few
 * calls, made for error messages. */
const char *ddp_shape_str(int ndim, const int64_t *shape);
#define DDP_SHAPE(t) ddp_shape_str((t)->ndim, (t)->shape)

/* DDP_OK for the CPU and for an existing CUDA device; otherwise a DDP_ERR_UNAVAILABLE
 * error "op: CUDA is not available: <reason>" or DDP_ERR_ARG for a bad device number. */
int ddp_check_device(int device, const char *op);

/* "cpu" or "cuda:<k>", in a thread-local rotating buffer (as ddp_shape_str). */
const char *ddp_device_str(int device);

/* Fail naming op and the arguments unless every tensor of ts (names[i] says which
 * argument ts[i] is; NULL entries are skipped) is on the same device. */
int ddp_check_same_device(const char *op, int n, ddp_tensor *const *ts,
                          const char *const *names);

/* The common checks of a layer's (input, weight, bias) arguments, PyTorch's for linear and
 * conv2d: all alive, on one device, input floating, weight and bias (NULL: none) of the
 * input's dtype. Errors name `op` and the argument. */
int ddp_check_affine_args(const char *op, ddp_tensor *input, ddp_tensor *weight,
                          ddp_tensor *bias);

/* ---- device memory (runtime/core/device.c) --------------------------------------------
 * Note [device interface]: the core knows devices only through this table, which the
 * backend fills in when the library loads (runtime/backend/registry.c registers it from a
 * constructor; the CUDA plug-in itself is opened lazily, on the first call that needs a
 * device). The core never includes a backend header: a device is memory that can be
 * allocated, freed, set and copied, and a count. With no table registered there is no
 * device ("no device backend is registered"). */
struct ddp_nccl_api;
typedef struct ddp_device_interface {
  /* Usable devices (loading the plug-in on the first call); 0 with *reason saying why
   * when there are none. Never records an error. */
  int (*count)(const char **reason);
  /* Each entry records a DDP error on failure; `device` is a CUDA ordinal. */
  int (*alloc)(void **out, int device, size_t nbytes);
  void (*free)(void *p);
  int (*host_alloc)(void **out, size_t nbytes); /* page-locked host memory */
  void (*host_free)(void *p);
  int (*memset)(void *dst, int device, int byte, size_t nbytes);
  /* A device of DDP_DEVICE_CPU means host memory; async as ddp_device_memcpy_async. */
  int (*memcpy)(void *dst, int dst_device, const void *src, int src_device, size_t nbytes,
                int async);
  /* The plug-in's NCCL table, or NULL with *why saying why (see ddp_device_nccl). */
  const struct ddp_nccl_api *(*nccl)(const char **why);
} ddp_device_interface;

/* Register the device table (NULL: none). Called once at load by the backend. */
void ddp_device_interface_set(const ddp_device_interface *iface);

/* Wrappers over the table that record a DDP error on failure. Host memory
 * (DDP_DEVICE_CPU) is handled too, so callers need no branch. */
int ddp_device_alloc(void **out, int device, size_t nbytes);
void ddp_device_free(void *p);
int ddp_pinned_alloc(void **out, size_t nbytes, const char *op);
void ddp_pinned_free(void *p);
int ddp_device_memset(void *dst, int device, int byte, size_t nbytes, const char *op);
/* Copy nbytes between devices (DDP_DEVICE_CPU for host memory) and wait for the copy;
 * errors name `op`. Host to host is a memcpy. */
int ddp_device_memcpy(void *dst, int dst_device, const void *src, int src_device,
                      size_t nbytes, const char *op);
/* As ddp_device_memcpy, but with async 1 the call may return before the copy finished
 * (the host side must be pinned and stay alive until the device's stream reaches it). */
int ddp_device_memcpy_async(void *dst, int dst_device, const void *src, int src_device,
                            size_t nbytes, int async, const char *op);

/* The NCCL table of the loaded CUDA plug-in (runtime/backend/cuda/nccl_api.h; for the
 * process groups). NULL when CUDA is not available (*why: "CUDA is not available:
 * <reason>") or the plug-in has no NCCL (*why says so; the simulated device has none). */
const struct ddp_nccl_api *ddp_device_nccl(const char **why);

/* A contiguous CPU tensor in page-locked memory from the device table (pin_memory's
 * storage); uninitialised. DDP_ERR_UNAVAILABLE naming `op` without a device. */
int ddp_tensor_empty_pinned(ddp_tensor **out, int ndim, const int64_t *shape, int dtype,
                            const char *op);

/* A tensor sharing src's storage and geometry, written into t (t's old storage is
 * released; its grad is dropped when it no longer fits). No autograd checks: those are
 * ddp_tensor_set_data's (runtime/tape/node.c). */
void ddp_tensor_set_data_raw(ddp_tensor *t, const ddp_tensor *src);

/* ---- autograd metadata -----------------------------------------------------------------
 * Note [autograd release hook]: a tensor's grad_fn and hooks are autograd's objects, which
 * the core cannot free (it includes nothing above it). Autograd registers one function at
 * load (runtime/tape/node.c) that the core calls when a tensor is cleared, with the
 * metadata it held; it is only ever non-NULL metadata that autograd itself attached. */
typedef void (*ddp_autograd_release_fn)(ddp_tensor *t, ddp_node *grad_fn,
                                        ddp_tensor_hooks *hooks);
void ddp_autograd_release_hook_set(ddp_autograd_release_fn fn);

/* ---- dtypes ------------------------------------------------------------------------- */

float ddp_f16_to_f32(uint16_t h);
uint16_t ddp_f32_to_f16(float f); /* round to nearest even */
float ddp_bf16_to_f32(uint16_t h);
uint16_t ddp_f32_to_bf16(float f); /* round to nearest even, NaN kept */

/* n contiguous conversions with the bits of the scalar functions above, 8 at a time with
 * F16C (runtime/core/f16_convert.c, Note [f16 bulk conversion]). _div_n: fp16_compress_hook's
 * dst[i] = f16(f32(f16(src[i])) / divisor), the division in f32. dst and src do not overlap. */
void ddp_f32_to_f16_n(uint16_t *restrict dst, const float *restrict src, int64_t n);
void ddp_f16_to_f32_n(float *restrict dst, const uint16_t *restrict src, int64_t n);
void ddp_f32_to_f16_div_n(uint16_t *restrict dst, const float *restrict src, float divisor,
                          int64_t n);

/* Read/write one element of dtype at p as double. */
double ddp_load_f64(const void *p, int dtype);
void ddp_store_f64(void *p, int dtype, double v);

/* The dtype of a binary op's result under PyTorch's promotion of two tensors:
 * bool < u8 < i32 < i64 < (f16, bf16) < f32 < f64; f16 with bf16 gives f32. */
int ddp_promote_types(int a, int b);

/* Turn a 0-based dimension that may be negative (-1: the last) into 0 .. ndim-1 in *out;
 * fails naming `op` when out of range. A 0-d tensor accepts dims 0 and -1. */
int ddp_normalize_dim(int dim, int ndim, const char *op, int *out);

/* ---- element iteration -------------------------------------------------------------- */

/* Inner loop of ddp_foreach: n elements; ptrs[k] points at operand k's first element and
 * steps by strides[k] bytes. */
typedef void (*ddp_loop_fn)(void *ctx, char **ptrs, const int64_t *strides, int64_t n);

enum { DDP_ITER_MAX_OPERANDS = 4 };

/* Run fn over every element of `nops` operands that all have shape (ndim, shape) (operands
 * with fewer elements must be given as broadcast views: stride 0). Dimensions are coalesced
 * so contiguous operands give one long inner run. When the total is at least `grain`
 * elements and more than one thread is set, the outer range is split over the thread pool
 * (then fn must only write element-wise; grain <= 0 disables threading). */
void ddp_foreach(int nops, ddp_tensor *const *ops, int ndim, const int64_t *shape, ddp_loop_fn fn,
                 void *ctx, int64_t grain);

/* Broadcast shapes a and b (NumPy rules) into out (returns ndim), or -1 when they do not
 * broadcast. */
int ddp_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int64_t *out);

/* A stride-0 view of t expanded to (ndim, shape), which t must broadcast to (checked;
 * the error names `op`). */
int ddp_broadcast_view(ddp_tensor **out, const ddp_tensor *t, int ndim, const int64_t *shape,
                       const char *op);

/* ---- random numbers (runtime/core/rng.c) --------------------------------------------- */

/* Take `blocks` consecutive Philox blocks of generator g (NULL: the default): *seed and
 * *base get the state a draw uses, and g's offset advances past them (the fills of
 * runtime/ops/random.c). */
void ddp_generator_take(ddp_generator *g, uint64_t blocks, uint64_t *seed, uint64_t *base);

/* ---- threads ------------------------------------------------------------------------ */

/* Split [0, n) into at most `threads` equal contiguous chunks of at least `grain` and run
 * fn(ctx, begin, end) once per chunk on the pool (the calling thread takes chunk 0); the
 * chunks depend only on n, grain and the thread count. Runs inline (one call, [0, n)) when
 * n < 2 * grain, one thread is set, the call is nested in another's fn, or another thread's
 * job holds the pool. Note [fork-join pool] in runtime/core/threads.c. */
typedef void (*ddp_range_fn)(void *ctx, int64_t begin, int64_t end);
void ddp_parallel_for(int64_t n, int64_t grain, ddp_range_fn fn, void *ctx);

#endif /* DDP_CORE_H */
