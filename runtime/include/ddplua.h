/* ddplua.h: the public C API of the ddplua runtime (build/libddplua.so).
 *
 * This is the one header a C program includes to use the runtime, and the one header the
 * Lua front end sees: `make` turns it (with the area headers it includes from
 * runtime/include/ddplua/) into the ffi.cdef text of build/lua/ddplua/cdef.lua. Keep it plain
 * C that LuaJIT's FFI parser takes: no macros in declarations, no inline functions, enums
 * for constants.
 *
 * Conventions (see DESIGN.md):
 *  - Fallible calls return an int status: 0 on success, non-zero on failure; the message
 *    (naming the op, the argument and the shapes at fault, with file and line) is then in
 *    ddp_last_error() of the calling thread.
 *  - Results come back through out parameters that come first (`ddp_tensor **out`); a new
 *    tensor returned that way holds one reference, which the caller owns and drops with
 *    ddp_tensor_release().
 *  - Dimensions and element indices passed to C count from 0 (the Lua front end converts
 *    from Lua's 1-based positions). Shapes are written (N, C, H, W) in comments.
 *  - Tensors are opaque handles; read their metadata through the accessors below.
 */
#ifndef DDPLUA_H
#define DDPLUA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
 * Errors and version
 * ------------------------------------------------------------------------------------- */

/* Status codes. Every fallible call returns DDP_OK (0) or one of the others. */
enum ddp_status {
  DDP_OK = 0,
  DDP_ERR_ARG = 1,     /* bad argument: shape, dtype, index, option */
  DDP_ERR_MEMORY = 2,  /* allocation failed */
  DDP_ERR_IO = 3,      /* file or socket failure, malformed file */
  DDP_ERR_STATE = 4,   /* call not valid now (freed tensor, second backward, ...) */
  DDP_ERR_TIMEOUT = 5, /* a wait ran past its timeout */
  DDP_ERR_PEER = 6,    /* a remote rank failed or disconnected */
  DDP_ERR_UNAVAILABLE = 7 /* feature not built or not present (CUDA, a library) */
};

/* The message of the last failed call on this thread ("" when none). The text names the op,
 * the argument and the shapes at fault and ends with "(file.c:line)". Valid until the next
 * failing call on this thread. */
const char *ddp_last_error(void);

/* The status code of the last failed call on this thread (DDP_OK when none). */
int ddp_last_status(void);

/* Forget the last error of this thread. */
void ddp_clear_error(void);

/* Version string of the runtime, e.g. "0.1.0". */
const char *ddp_version(void);

/* ---------------------------------------------------------------------------------------
 * dtypes and devices
 * ------------------------------------------------------------------------------------- */

enum ddp_dtype {
  DDP_F32 = 0, /* float (the default) */
  DDP_F64 = 1, /* double */
  DDP_F16 = 2, /* IEEE half, computed through f32 on the CPU */
  DDP_BF16 = 3, /* bfloat16, computed through f32 on the CPU */
  DDP_I64 = 4, /* int64_t: labels, indices */
  DDP_I32 = 5, /* int32_t */
  DDP_U8 = 6,  /* uint8_t: raw images */
  DDP_BOOL = 7, /* one byte, 0 or 1: comparison results, masks */
  DDP_DTYPE_COUNT = 8
};

enum { DDP_MAX_DIMS = 8 };      /* most dimensions a tensor may have */
enum { DDP_DEVICE_CPU = -1 };   /* device numbers: -1 is the CPU, k >= 0 is cuda:k */

/* Short name of a dtype: "f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool";
 * "?" for an unknown value. */
const char *ddp_dtype_name(int dtype);

/* The dtype called `name` (the short names above, also "float32", "float", "double",
 * "float64", "half", "float16", "bfloat16", "int64", "long", "int32", "int", "uint8",
 * "byte"); -1 when unknown. */
int ddp_dtype_from_name(const char *name);

/* Size of one element in bytes (0 for an unknown dtype). */
size_t ddp_dtype_size(int dtype);

/* 1 when the dtype is a floating-point type (f32, f64, f16, bf16), else 0. */
int ddp_dtype_is_floating(int dtype);

/* 1 when the CUDA plug-in loaded and found at least one device (probed once per process;
 * never fails). */
int ddp_cuda_is_available(void);

/* Number of CUDA devices (0 when CUDA is not available). */
int ddp_cuda_device_count(void);

/* Why CUDA is not available ("" when it is): the plug-in did not load, no driver, no
 * device. */
const char *ddp_cuda_unavailable_reason(void);

/* ---------------------------------------------------------------------------------------
 * Memory and threads
 * ------------------------------------------------------------------------------------- */

/* Bytes of CPU tensor memory allocated by the runtime and not yet freed. */
int64_t ddp_memory_live_bytes(void);

/* Bytes of CPU tensor memory allocated by the runtime since start, freed or not (a counter
 * that only grows; the difference of two readings is what was allocated between them: the
 * Lua front end's Note [step lifetimes], lua/ddplua/lib.lua). */
int64_t ddp_memory_allocated_bytes(void);

/* Highest value ddp_memory_live_bytes() reached since start or the last reset, in bytes. */
int64_t ddp_memory_peak_bytes(void);

/* Set the peak to the current live count. */
void ddp_memory_reset_peak(void);

/* Bytes of freed large blocks the allocator keeps for reuse (not counted as live; see
 * Note [block cache] in runtime/core/alloc.c), and a way to return them to the system. */
int64_t ddp_memory_cached_bytes(void);
void ddp_memory_empty_cache(void);

/* Use `n` threads (n >= 1) for the runtime's own kernels, matrix products included: they
 * split over the runtime's pool, and OpenBLAS is kept at one thread (Note [pool and
 * OpenBLAS threads] in runtime/core/threads.c). The one place that sets thread counts.
 * Default: the DDP_NUM_THREADS, OMP_NUM_THREADS environment variable, else the number of
 * online cores. Fails with DDP_ERR_ARG when n < 1. */
int ddp_set_num_threads(int n);

/* Number of threads the runtime's kernels use. */
int ddp_get_num_threads(void);

/* ---------------------------------------------------------------------------------------
 * Tensors: lifetime and metadata
 *
 * A tensor is a refcounted view (dtype, device, shape, strides in elements, offset in
 * elements) on a refcounted storage. Views share the storage.
 * ------------------------------------------------------------------------------------- */

typedef struct ddp_tensor ddp_tensor;

/* Check a shape given for `op` (Note [shape arithmetic] in runtime/core/core.h): every
 * size >= 0, the product of the sizes with each 0 counted as 1 (numel and every contiguous
 * stride) fits in int64, and numel * elem_size bytes fits in int64 (elem_size 0: no byte
 * check). Every factory, view, reshape and expand runs it; the front end also runs it on a
 * shape it converts, so the message names the function called. Errors: DDP_ERR_ARG
 * "op: size -3 of dimension 2 is negative", "op: shape (0, 1099511627776, ...) has more
 * elements than fit in 64 bits ..."; DDP_ERR_MEMORY when only the byte count overflows. */
int ddp_shape_check(const char *op, int ndim, const int64_t *shape, size_t elem_size);

/* A new contiguous tensor of the given shape (ndim entries, each >= 0; ndim in 0..8) and
 * dtype on `device` (DDP_DEVICE_CPU), its contents uninitialised. Errors: DDP_ERR_ARG for a
 * bad ndim, negative size, unknown dtype or device; DDP_ERR_MEMORY. */
int ddp_tensor_empty(ddp_tensor **out, int ndim, const int64_t *shape, int dtype, int device);

/* As ddp_tensor_empty, filled with zeros. */
int ddp_tensor_zeros(ddp_tensor **out, int ndim, const int64_t *shape, int dtype, int device);

/* A new contiguous CPU tensor of the given shape and dtype holding a copy of `data`
 * (numel elements of `src_dtype`, converted to `dtype`; data may be NULL when numel is 0). */
int ddp_tensor_from_data(ddp_tensor **out, int ndim, const int64_t *shape, int dtype,
                         const void *data, int src_dtype);

/* Deleter of memory handed to ddp_tensor_from_blob. */
typedef void (*ddp_deleter_fn)(void *data, void *ctx);

/* A CPU tensor over memory the caller owns (no copy). `strides` may be NULL (contiguous).
 * `deleter(data, ctx)` runs when the last view of it is released (may be NULL). */
int ddp_tensor_from_blob(ddp_tensor **out, void *data, int ndim, const int64_t *shape,
                         const int64_t *strides, int dtype, ddp_deleter_fn deleter, void *ctx);

/* Add one reference. NULL is ignored. */
void ddp_tensor_retain(ddp_tensor *t);

/* Drop one reference; the tensor (and its storage, when no view is left) is freed with the
 * last one. NULL is ignored. */
void ddp_tensor_release(ddp_tensor *t);

/* Release the n tensors table[index[0]], ..., table[index[n - 1]] and set those entries to
 * NULL (NULL entries are skipped): one call for a batch of references whose owners went
 * away (the Lua front end's handle registry, Note [handle registry] in lua/ddplua/lib.lua). */
void ddp_tensor_release_indexed(ddp_tensor **table, const int32_t *index, int64_t n);

/* Free what this handle holds now (its storage reference, gradient and graph), leaving an
 * empty "freed" tensor: any later use is an error naming it as freed, never a crash.
 * Calling it twice is harmless. The handle itself still needs its ddp_tensor_release(). */
void ddp_tensor_free(ddp_tensor *t);

/* 1 unless the tensor was freed with ddp_tensor_free (or t is NULL). */
int ddp_tensor_is_alive(const ddp_tensor *t);

int ddp_tensor_dim(const ddp_tensor *t);                 /* number of dimensions */
int64_t ddp_tensor_numel(const ddp_tensor *t);           /* number of elements */
int ddp_tensor_dtype(const ddp_tensor *t);               /* enum ddp_dtype */
int ddp_tensor_device(const ddp_tensor *t);              /* DDP_DEVICE_CPU or cuda index */
const int64_t *ddp_tensor_shape(const ddp_tensor *t);    /* ndim sizes */
const int64_t *ddp_tensor_strides(const ddp_tensor *t);  /* ndim strides, in elements */
int64_t ddp_tensor_offset(const ddp_tensor *t);          /* storage offset, in elements */
void *ddp_tensor_data(const ddp_tensor *t);              /* address of element (0, ..., 0) */
int ddp_tensor_is_contiguous(const ddp_tensor *t);       /* row-major without gaps */
int ddp_tensor_shares_storage(const ddp_tensor *a, const ddp_tensor *b);
/* Bytes of the storage behind t (all views of it together). */
int64_t ddp_tensor_storage_bytes(const ddp_tensor *t);
/* Times the storage was written in place (in-place ops, copies into it). */
int64_t ddp_tensor_version(const ddp_tensor *t);

/* Give t's storage new data of `nbytes` bytes in place, as PyTorch's
 * t.untyped_storage().resize_(nbytes): the first min(old, new) bytes are kept, the rest is
 * zero; every tensor over the storage (views, autograd's saved tensors) sees the new data.
 * nbytes 0 frees the data and keeps the tensor object: any later use of a tensor whose
 * elements lie past the storage's bytes is an error (DDP_ERR_STATE, "... has no data: its
 * storage was resized to 0 bytes"), never a read of freed memory, until a resize back to
 * the bytes its shape needs (numel * element size for a contiguous tensor). FSDP frees
 * unsharded parameters this way after forward (Note [storage resize] in
 * runtime/core/tensor.c). Errors: DDP_ERR_ARG for nbytes < 0 or memory the runtime does not
 * own (from_blob, pinned); DDP_ERR_STATE for a freed tensor; DDP_ERR_MEMORY. */
int ddp_tensor_storage_resize_(ddp_tensor *t, int64_t nbytes);

/* Set the version counter of t's storage (ddp_tensor_version) back to `version`, as PyTorch's
 * torch.autograd._unsafe_preserve_version_counter: for a writer that refills a storage with
 * the very values autograd saved (FSDP's all-gather before backward), which must not read as
 * an in-place modification. Anything else makes the saved-tensor check useless. NULL or a
 * freed tensor is ignored. */
void ddp_tensor_version_restore(ddp_tensor *t, int64_t version);

/* The single element of a one-element tensor, as a double. DDP_ERR_ARG when numel != 1. */
int ddp_tensor_item(const ddp_tensor *t, double *out);

/* Element at `index` (ndim entries, 0-based, each in range) as a double / set it from a
 * double (converted to the dtype). Errors name the dimension and the size. ddp_tensor_set
 * is a raw write that autograd does not see: t[{i, j}] = v goes through ddp_set_element_. */
int ddp_tensor_get(const ddp_tensor *t, const int64_t *index, double *out);
int ddp_tensor_set(ddp_tensor *t, const int64_t *index, double value);

/* Every element in row-major order, converted to double, into dst (numel entries). */
int ddp_tensor_to_f64(const ddp_tensor *t, double *dst);

/* ---------------------------------------------------------------------------------------
 * Random numbers
 *
 * Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
 * SC11), the counter-based generator cuRAND and PyTorch's CUDA generator use. A generator
 * is (seed, offset): element i of a fill draws from counter (offset + i / 4) under key seed,
 * then the offset moves past what was used, so results do not depend on thread count.
 * ------------------------------------------------------------------------------------- */

typedef struct ddp_generator ddp_generator;

/* One Philox 4x32-10 block: out = philox(counter, key). For checks against the published
 * known-answer vectors. */
void ddp_philox4x32_10(uint32_t out[4], const uint32_t counter[4], const uint32_t key[2]);

/* A new generator seeded with `seed` (offset 0). Free it with ddp_generator_free. */
int ddp_generator_new(ddp_generator **out, uint64_t seed);
void ddp_generator_free(ddp_generator *g);

/* The process-wide default generator (seed 0 at start) used when a call gets NULL. */
ddp_generator *ddp_generator_default(void);

/* Reset g (NULL: the default) to seed `seed`, offset 0. */
void ddp_generator_manual_seed(ddp_generator *g, uint64_t seed);

/* Read / restore the whole state of g (NULL: the default), for checkpoints. */
void ddp_generator_get_state(const ddp_generator *g, uint64_t *seed, uint64_t *offset);
void ddp_generator_set_state(ddp_generator *g, uint64_t seed, uint64_t offset);

/* Fill t in place (any strides; floating dtypes) with uniform values in [lo, hi). */
int ddp_uniform_(ddp_tensor *t, double lo, double hi, ddp_generator *g);
/* Fill t in place (floating dtypes) with normal values (Box-Muller), mean and std >= 0. */
int ddp_normal_(ddp_tensor *t, double mean, double std, ddp_generator *g);
/* Fill t in place with 1 with probability p (0 <= p <= 1), else 0; any dtype. */
int ddp_bernoulli_(ddp_tensor *t, double p, ddp_generator *g);
/* Fill t in place with integers uniform in [low, high) (low < high); any dtype. */
int ddp_randint_(ddp_tensor *t, int64_t low, int64_t high, ddp_generator *g);
/* A random permutation of 0 .. n-1 (n >= 0) as a 1-d tensor of `dtype` (i64 or i32 or a
 * floating type); Fisher-Yates shuffle driven by g. */
int ddp_randperm(ddp_tensor **out, int64_t n, int dtype, ddp_generator *g);

/* ---------------------------------------------------------------------------------------
 * Autograd
 *
 * Reverse mode on a tape kept in C. Each differentiable op records a node holding its
 * backward function and the tensors it saved; ddp_backward walks the nodes in reverse
 * topological order. A leaf is a tensor made by the user (not by a recorded op); leaves
 * with requires_grad accumulate into their .grad.
 * ------------------------------------------------------------------------------------- */

/* Grad mode of this thread (1 at start). Ops record nothing while it is 0 (no_grad).
 * ddp_set_grad_enabled returns the previous mode. */
int ddp_grad_enabled(void);
int ddp_set_grad_enabled(int enabled);

/* requires_grad flag. Setting it on a non-leaf, or on a tensor that is not floating, fails
 * with DDP_ERR_ARG (as PyTorch). */
int ddp_tensor_requires_grad(const ddp_tensor *t);
int ddp_tensor_set_requires_grad(ddp_tensor *t, int requires_grad);

/* 1 when t was not produced by a recorded op. */
int ddp_tensor_is_leaf(const ddp_tensor *t);

/* Name of the node that produced t ("AddBackward", ...), or NULL for a leaf. */
const char *ddp_tensor_grad_fn_name(const ddp_tensor *t);

/* The accumulated gradient of t with a new reference, or NULL when there is none. */
ddp_tensor *ddp_tensor_grad(const ddp_tensor *t);

/* Replace t's gradient by g (NULL clears it). g must match t's shape and dtype. */
int ddp_tensor_set_grad(ddp_tensor *t, ddp_tensor *g);

/* Ask that the non-leaf t keep its gradient in .grad during backward (a no-op for leaves). */
int ddp_tensor_retain_grad(ddp_tensor *t);

/* A new tensor sharing t's storage with no graph: requires_grad 0, a leaf. */
int ddp_tensor_detach(ddp_tensor **out, const ddp_tensor *t);

/* Make the leaf t hold src's data: t takes src's storage (shared), dtype, device and
 * geometry, and keeps its identity, requires_grad and hooks (PyTorch's `t.data = src`;
 * Module.to uses it so parameters stay the same objects). A gradient that no longer fits
 * (shape, dtype or device) is dropped. Do not call it while a graph that saved t is still
 * to be back-propagated. Errors (DDP_ERR_ARG): t is not a leaf; t requires grad and src is
 * not floating. */
int ddp_tensor_set_data(ddp_tensor *t, const ddp_tensor *src);

/* Back-propagate from `root`. `grad` is d(out)/d(root) of root's shape; it may be NULL only
 * when root has one element (then 1). retain_graph=0 frees the saved tensors as each node
 * is used; a second backward through the same graph then fails with DDP_ERR_STATE.
 * Errors: root does not require grad, grad shape mismatch, a saved tensor modified in place
 * since it was saved (the message names the op), DDP_ERR_STATE for a graph holding a
 * Function or hook of a front end (only its driver loop can run those: Note [stepwise
 * backward] in ddplua/autograd.h). */
int ddp_backward(ddp_tensor *root, const ddp_tensor *grad, int retain_graph);

/* A post-accumulate hook: called on the thread running backward once t's gradient is final
 * for this backward pass (every contribution accumulated), the moment the DDP reducer
 * hangs off. The hook may read and write t's gradient in place. */
typedef void (*ddp_grad_hook_fn)(ddp_tensor *t, void *ctx);

/* Register a post-accumulate hook on the leaf t (requires_grad). *handle receives an id for
 * ddp_tensor_remove_hook. Hooks run in registration order. */
int ddp_tensor_add_post_accumulate_hook(ddp_tensor *t, ddp_grad_hook_fn fn, void *ctx,
                                        int64_t *handle);
int ddp_tensor_remove_hook(ddp_tensor *t, int64_t handle);

/* A backward-end callback: called on the thread that ran ddp_backward, after the walk
 * finished (status = its result, DDP_OK on success), before ddp_backward returns. The DDP
 * reducer finalizes an iteration here (launches what is left, waits, copies back), as
 * PyTorch's reducer does from the engine's final callback. A callback may return non-zero
 * (with the error set) to make ddp_backward fail. */
typedef int (*ddp_backward_end_fn)(void *ctx, int status);

/* Register a process-wide backward-end callback; *handle receives an id for
 * ddp_autograd_remove_backward_end. Callbacks run in registration order. */
int ddp_autograd_add_backward_end(ddp_backward_end_fn fn, void *ctx, int64_t *handle);
int ddp_autograd_remove_backward_end(int64_t handle);

/* ---------------------------------------------------------------------------------------
 * Copy and conversion (runtime/ops/copy.c, runtime/ops/accumulate.c)
 * ------------------------------------------------------------------------------------- */

/* Copy src into dst element by element, converting dtype; src broadcasts to dst's shape
 * (NumPy rules). In-place on dst (bumps its version). Differentiable w.r.t. src; dst's old
 * values get a zero gradient. On a view, the view's base takes the history (Note [in-place
 * on views]). Errors: DDP_ERR_ARG when dst is a leaf that requires grad, or a view of one,
 * and grad mode is on (PyTorch's "a leaf Variable that requires grad ..." message). */
int ddp_copy_(ddp_tensor *dst, const ddp_tensor *src);

/* Fill every element of t with value (converted to its dtype). A non-leaf keeps a history
 * (FillBackward: zeros flow to its old history) instead of being detached. Errors as
 * ddp_copy_'s for a leaf that requires grad. */
int ddp_fill_(ddp_tensor *t, double value);

/* t[index] = value for one element (index: t's ndim entries, 0-based, each in range; the
 * value converted to t's dtype), as PyTorch's t[i, j] = v: when autograd records t (grad
 * mode on and t requires grad) it is fill_ of the element's select view, so the element's
 * old value gets a zero gradient and the rest of t keeps its history (Note [in-place on
 * views]); otherwise a plain write (ddp_tensor_set). Errors: ddp_tensor_set's for an index
 * out of range; ddp_fill_'s for a leaf that requires grad ("a view of a leaf Variable that
 * requires grad is being used in an in-place operation."). */
int ddp_set_element_(ddp_tensor *t, const int64_t *index, double value);

/* Set every element of t to zero (ddp_fill_(t, 0), with its autograd rules). */
int ddp_zero_(ddp_tensor *t);

/* A contiguous tensor with t's contents: t itself (one more reference) when already
 * contiguous, else a copy. Differentiable. */
int ddp_contiguous(ddp_tensor **out, ddp_tensor *t);

/* A contiguous copy of t (never shares storage). Differentiable. */
int ddp_clone(ddp_tensor **out, ddp_tensor *t);

/* t converted to dtype: t itself (new reference) when the dtype already matches, else a
 * contiguous copy. Differentiable between floating dtypes. */
int ddp_to_dtype(ddp_tensor **out, ddp_tensor *t, int dtype);

/* grad summed down to (ndim, shape), which must broadcast to grad's shape (PyTorch's
 * sum_to_size): the leading dimensions grad has in excess and those where shape has 1 are
 * summed. The backward of broadcasting. *out is a new tensor of grad's dtype and device,
 * or grad itself (one more reference) when the shapes already match. Not differentiable
 * (backward functions run it with grad mode off). */
int ddp_sum_to_shape(ddp_tensor **out, ddp_tensor *grad, int ndim, const int64_t *shape);

/* ---------------------------------------------------------------------------------------
 * Factories (runtime/core/factory.c)
 * ------------------------------------------------------------------------------------- */

/* 1-d tensor of the values start, start + step, ... up to but excluding end (PyTorch's
 * arange: ceil((end - start) / step) elements). step != 0 and must point from start toward
 * end (or the result is empty). */
int ddp_arange(ddp_tensor **out, double start, double end, double step, int dtype);

/* 1-d tensor of `steps` (>= 0) values evenly spaced from start to end inclusive. */
int ddp_linspace(ddp_tensor **out, double start, double end, int64_t steps, int dtype);

/* (n, m) tensor with ones on the diagonal, zeros elsewhere (n, m >= 0). */
int ddp_eye(ddp_tensor **out, int64_t n, int64_t m, int dtype);

/* Area headers, one part of the API each (see the comment at the top of each). */
#include "ddplua/autograd.h"
#include "ddplua/ops_elementwise.h"
#include "ddplua/ops_reduce.h"
#include "ddplua/ops_shape.h"
#include "ddplua/ops_nn.h"
#include "ddplua/ops_norm.h"
#include "ddplua/ops_attention.h"
#include "ddplua/ops_loss.h"
#include "ddplua/io.h"
#include "ddplua/image.h"
#include "ddplua/arrays.h"
#include "ddplua/io_workers.h"
#include "ddplua/optim.h"
#include "ddplua/optim_state.h"
#include "ddplua/amp.h"
#include "ddplua/store.h"
#include "ddplua/pg.h"
#include "ddplua/dist_functional.h"
#include "ddplua/objects.h"
#include "ddplua/sampler.h"
#include "ddplua/reducer.h"
#include "ddplua/reducer_join.h"
#include "ddplua/comm_hook.h"
#include "ddplua/reducer_static_graph.h"
#include "ddplua/reducer_fused_optim.h"
#include "ddplua/status.h"
#include "ddplua/process.h"
#include "ddplua/cuda.h"
#include "ddplua/os.h"
#include "ddplua/profiler.h"

#ifdef __cplusplus
}
#endif

#endif /* DDPLUA_H */
