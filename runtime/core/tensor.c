/* runtime/core/tensor.c: tensor and storage lifetime, metadata accessors, element access. */
#include <stdlib.h>

#include "core/core.h"
#include "core/profiler.h"

/* ---- storage ------------------------------------------------------------------------ */

/* Data up to this size lives in the storage's own block: one allocation per small tensor
 * instead of two (small ops are dominated by malloc/free). Offset 64 keeps it aligned. */
enum { INLINE_MAX = 256, INLINE_OFFSET = 64 };

static ddp_storage *storage_new(size_t nbytes, int device) {
  if (DDP_PROF_ON()) ddp_prof_kernel_begin(); /* an op's output: Note [profiler events] */
  ddp_storage *s;
  if (device != DDP_DEVICE_CPU) { /* from the plug-in's caching allocator */
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (ddp_device_alloc(&s->data, device, nbytes)) {
      free(s);
      return NULL; /* error recorded by the allocator */
    }
    s->kind = DDP_STORAGE_DEVICE;
  } else if (nbytes <= INLINE_MAX) {
    _Static_assert(sizeof(ddp_storage) <= INLINE_OFFSET, "storage header outgrew its slot");
    s = ddp_alloc_block_counted(INLINE_OFFSET + nbytes); /* Note [small block cache] */
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->data = (char *)s + INLINE_OFFSET;
    s->kind = DDP_STORAGE_INLINE;
  } else {
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->data = ddp_alloc(nbytes);
    if (!s->data) {
      free(s);
      return NULL;
    }
    s->kind = DDP_STORAGE_ALLOC;
  }
  s->refcount = 1;
  s->nbytes = nbytes;
  s->device = device;
  return s;
}

static void storage_release(ddp_storage *s) {
  if (!s || !ddp_ref_drop(&s->refcount)) return;
  switch (s->kind) {
  case DDP_STORAGE_INLINE:
    ddp_free_block_counted(s, INLINE_OFFSET + s->nbytes);
    return;
  case DDP_STORAGE_ALLOC:
    if (s->data) ddp_free(s->data, s->nbytes);
    break;
  case DDP_STORAGE_DEVICE:
    ddp_device_free(s->data);
    break;
  case DDP_STORAGE_PINNED:
    ddp_pinned_free(s->data);
    break;
  default:
    if (s->deleter) s->deleter(s->data, s->deleter_ctx);
    break;
  }
  if (s->block_bytes) ddp_free_block_counted(s, s->block_bytes); /* Note [storage resize] */
  else free(s);
}

/* Note [storage resize]: ddp_tensor_storage_resize_ gives a storage new data of another size
 * in place, as PyTorch's untyped_storage().resize_(n): the storage struct stays, so every
 * tensor header over it (views, autograd's saved aliases, Note [saved tensors] in
 * runtime/tape/node.c) sees the change. FSDP frees an unsharded parameter after forward this
 * way (resize to 0) and re-allocates it before backward, so the graph's saved tensors read
 * the re-gathered values. Runtime-owned memory only (ALLOC, INLINE, DEVICE). An INLINE
 * storage's data lives in the struct's own small block: the resize moves the data out
 * (kind becomes ALLOC) and remembers the block's size in block_bytes for storage_release.
 * Once a storage was resized, ddp_check_alive compares each tensor's extent with nbytes, so
 * using a tensor whose storage is shorter than its shape is an error, never a read past the
 * data (the flag keeps that check off the path of every other tensor). */
int ddp_tensor_storage_resize_(ddp_tensor *t, int64_t nbytes) {
  if (!t) DDP_FAIL(DDP_ERR_ARG, "storage resize_: argument 'self' is nil (expected a tensor)");
  if (!t->storage)
    DDP_FAIL(DDP_ERR_STATE, "storage resize_: argument 'self' is a freed tensor (:free() was "
             "called on it)");
  ddp_storage *s = t->storage;
  if (nbytes < 0)
    DDP_FAIL(DDP_ERR_ARG, "storage resize_: nbytes must be >= 0, got %lld", (long long)nbytes);
  if (s->kind == DDP_STORAGE_EXTERNAL || s->kind == DDP_STORAGE_PINNED)
    DDP_FAIL(DDP_ERR_ARG,
             "storage resize_: the storage of this tensor is %s memory the allocator does not "
             "own; only tensors made by the runtime can be resized",
             s->kind == DDP_STORAGE_PINNED ? "pinned" : "external (from_blob)");
  size_t n = (size_t)nbytes, keep = n < s->nbytes ? n : s->nbytes;
  s->resized = 1;
  if (n == s->nbytes) return DDP_OK;
  void *data = NULL;
  if (n > 0) {
    if (s->device != DDP_DEVICE_CPU) {
      DDP_TRY(ddp_device_alloc(&data, s->device, n));
    } else if (!(data = ddp_alloc(n))) {
      DDP_FAIL(DDP_ERR_MEMORY, "storage resize_: out of memory allocating %zu bytes", n);
    }
    if (keep) {
      int st = ddp_device_memcpy(data, s->device, s->data, s->device, keep, "storage resize_");
      if (st) {
        if (s->device != DDP_DEVICE_CPU) ddp_device_free(data);
        else ddp_free(data, n);
        return st;
      }
    }
    if (n > keep) DDP_TRY(ddp_device_memset((char *)data + keep, s->device, 0, n - keep,
                                            "storage resize_"));
  }
  switch (s->kind) {
  case DDP_STORAGE_INLINE: /* the old data is part of the struct's block: keep the block */
    s->block_bytes = (uint32_t)(INLINE_OFFSET + s->nbytes);
    s->kind = s->device != DDP_DEVICE_CPU ? DDP_STORAGE_DEVICE : DDP_STORAGE_ALLOC;
    break;
  case DDP_STORAGE_ALLOC:
    if (s->data) ddp_free(s->data, s->nbytes);
    break;
  default: /* DDP_STORAGE_DEVICE */
    if (s->data) ddp_device_free(s->data);
    break;
  }
  s->data = data;
  s->nbytes = n;
  return DDP_OK;
}

void ddp_tensor_version_restore(ddp_tensor *t, int64_t version) {
  if (t && t->storage) t->storage->version = version;
}

/* ---- tensor headers ----------------------------------------------------------------- */

int64_t ddp_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t n = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = n;
    n *= shape[i];
  }
  return n;
}

int64_t ddp_shape_span(int ndim, const int64_t *shape) {
  int64_t span = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (__builtin_mul_overflow(span, shape[i] ? shape[i] : 1, &span)) return -1;
  }
  return span;
}

int ddp_shape_check(const char *op, int ndim, const int64_t *shape, size_t elem_size) {
  int has_zero = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      DDP_FAIL(DDP_ERR_ARG, "%s: size %lld of dimension %d is negative", op,
               (long long)shape[i], i + 1);
    has_zero |= shape[i] == 0;
  }
  if (ddp_shape_span(ndim, shape) < 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: shape %s has more elements than fit in 64 bits%s", op,
             ddp_shape_str(ndim, shape),
             has_zero ? " (counting each size 0 as 1, as its strides do)" : "");
  int64_t numel = has_zero ? 0 : ddp_shape_span(ndim, shape), bytes;
  if (__builtin_mul_overflow(numel, (int64_t)elem_size, &bytes))
    DDP_FAIL(DDP_ERR_MEMORY, "%s: shape %s needs more bytes than fit in 64 bits", op,
             ddp_shape_str(ndim, shape));
  return DDP_OK;
}

static ddp_tensor *header_new(ddp_storage *s, int dtype, int ndim, const int64_t *shape,
                              const int64_t *strides, int64_t offset) {
  ddp_tensor *t = ddp_block_alloc(sizeof *t); /* Note [small block cache] */
  if (!t) return NULL;
  memset(t, 0, sizeof *t);
  t->refcount = 1;
  t->storage = s;
  t->dtype = dtype;
  t->ndim = ndim;
  t->device = s->device;
  t->offset = offset;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->strides[i] = strides[i];
    t->numel *= shape[i];
  }
  return t;
}

ddp_tensor *ddp_tensor_over_storage(ddp_storage *s, int dtype, int ndim, const int64_t *shape) {
  int64_t strides[DDP_MAX_DIMS];
  ddp_contiguous_strides(ndim, shape, strides);
  return header_new(s, dtype, ndim, shape, strides, 0);
}

static int check_geometry(const char *op, int ndim, const int64_t *shape, int dtype, int device) {
  if (ndim < 0 || ndim > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "%s: %d dimensions requested, at most %d are supported", op, ndim,
             DDP_MAX_DIMS);
  if (ndim > 0 && !shape) DDP_FAIL(DDP_ERR_ARG, "%s: shape is NULL", op);
  if (dtype < 0 || dtype >= DDP_DTYPE_COUNT)
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown dtype %d", op, dtype);
  DDP_TRY(ddp_shape_check(op, ndim, shape, ddp_dtype_size(dtype))); /* Note [shape arithmetic] */
  return ddp_check_device(device, op);
}

/* ddp_tensor_empty, its errors naming `op`. */
static int tensor_empty(ddp_tensor **out, int ndim, const int64_t *shape, int dtype, int device,
                        const char *op) {
  *out = NULL;
  DDP_TRY(check_geometry(op, ndim, shape, dtype, device));
  int64_t strides[DDP_MAX_DIMS];
  int64_t numel = ddp_contiguous_strides(ndim, shape, strides);
  size_t nbytes = (size_t)numel * ddp_dtype_size(dtype);
  ddp_storage *s = storage_new(nbytes, device);
  if (!s && device != DDP_DEVICE_CPU) return ddp_last_status(); /* the allocator's message */
  if (!s)
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory allocating %zu bytes for shape %s", op, nbytes,
             ddp_shape_str(ndim, shape));
  *out = header_new(s, dtype, ndim, shape, strides, 0);
  if (!*out) {
    storage_release(s);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  }
  return DDP_OK;
}

int ddp_tensor_empty(ddp_tensor **out, int ndim, const int64_t *shape, int dtype, int device) {
  return tensor_empty(out, ndim, shape, dtype, device, "empty");
}

int ddp_tensor_empty_pinned(ddp_tensor **out, int ndim, const int64_t *shape, int dtype,
                            const char *op) {
  *out = NULL;
  DDP_TRY(check_geometry(op, ndim, shape, dtype, DDP_DEVICE_CPU));
  ddp_storage *s = calloc(1, sizeof *s);
  if (!s) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  int64_t strides[DDP_MAX_DIMS];
  size_t nbytes = (size_t)ddp_contiguous_strides(ndim, shape, strides) * ddp_dtype_size(dtype);
  int status = ddp_pinned_alloc(&s->data, nbytes, op);
  if (status) {
    free(s);
    return status;
  }
  s->refcount = 1;
  s->nbytes = nbytes;
  s->device = DDP_DEVICE_CPU;
  s->kind = DDP_STORAGE_PINNED;
  *out = header_new(s, dtype, ndim, shape, strides, 0);
  if (!*out) {
    storage_release(s);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", op);
  }
  return DDP_OK;
}

int ddp_tensor_zeros(ddp_tensor **out, int ndim, const int64_t *shape, int dtype, int device) {
  DDP_TRY(tensor_empty(out, ndim, shape, dtype, device, "zeros"));
  int status = ddp_device_memset((*out)->storage->data, device, 0, (*out)->storage->nbytes,
                                 "zeros");
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

int ddp_tensor_from_data(ddp_tensor **out, int ndim, const int64_t *shape, int dtype,
                         const void *data, int src_dtype) {
  DDP_TRY(ddp_tensor_empty(out, ndim, shape, dtype, DDP_DEVICE_CPU));
  ddp_tensor *t = *out;
  if (t->numel == 0) return DDP_OK;
  if (!data) {
    ddp_tensor_release(t);
    *out = NULL;
    DDP_FAIL(DDP_ERR_ARG, "from_data: data is NULL for shape %s", ddp_shape_str(ndim, shape));
  }
  if (src_dtype < 0 || src_dtype >= DDP_DTYPE_COUNT) {
    ddp_tensor_release(t);
    *out = NULL;
    DDP_FAIL(DDP_ERR_ARG, "from_data: unknown source dtype %d", src_dtype);
  }
  if (src_dtype == dtype) {
    memcpy(t->storage->data, data, t->storage->nbytes);
  } else {
    size_t ssz = ddp_dtype_size(src_dtype), dsz = ddp_dtype_size(dtype);
    for (int64_t i = 0; i < t->numel; i++)
      ddp_store_f64((char *)t->storage->data + i * dsz, dtype,
                    ddp_load_f64((const char *)data + i * ssz, src_dtype));
  }
  return DDP_OK;
}

int ddp_tensor_from_blob(ddp_tensor **out, void *data, int ndim, const int64_t *shape,
                         const int64_t *strides, int dtype, ddp_deleter_fn deleter, void *ctx) {
  *out = NULL;
  DDP_TRY(check_geometry("from_blob", ndim, shape, dtype, DDP_DEVICE_CPU));
  int64_t cstrides[DDP_MAX_DIMS];
  int64_t numel = ddp_contiguous_strides(ndim, shape, cstrides);
  if (!strides) strides = cstrides;
  int64_t span = 1; /* elements from the first to one past the last */
  for (int i = 0; i < ndim; i++) {
    if (strides[i] < 0) DDP_FAIL(DDP_ERR_ARG, "from_blob: stride %d is negative", i + 1);
    int64_t reach;
    if (shape[i] > 0 && (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) ||
                         __builtin_add_overflow(span, reach, &span)))
      DDP_FAIL(DDP_ERR_ARG, "from_blob: shape %s with strides %s reaches past 2^63 elements",
               ddp_shape_str(ndim, shape), ddp_shape_str(ndim, strides));
  }
  if (numel == 0) span = 0;
  int64_t span_bytes;
  if (__builtin_mul_overflow(span, (int64_t)ddp_dtype_size(dtype), &span_bytes))
    DDP_FAIL(DDP_ERR_ARG, "from_blob: shape %s with strides %s spans more bytes than fit in 64 "
             "bits", ddp_shape_str(ndim, shape), ddp_shape_str(ndim, strides));
  if (numel > 0 && !data) DDP_FAIL(DDP_ERR_ARG, "from_blob: data is NULL");
  ddp_storage *s = calloc(1, sizeof *s);
  if (!s) DDP_FAIL(DDP_ERR_MEMORY, "from_blob: out of memory");
  s->refcount = 1;
  s->data = data;
  s->nbytes = (size_t)span_bytes;
  s->device = DDP_DEVICE_CPU;
  s->kind = DDP_STORAGE_EXTERNAL;
  s->deleter = deleter;
  s->deleter_ctx = ctx;
  *out = header_new(s, dtype, ndim, shape, strides, 0);
  if (!*out) {
    s->deleter = NULL; /* the caller keeps its memory when we fail */
    storage_release(s);
    DDP_FAIL(DDP_ERR_MEMORY, "from_blob: out of memory");
  }
  return DDP_OK;
}

int ddp_tensor_view_raw(ddp_tensor **out, const ddp_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset) {
  *out = header_new(base->storage, base->dtype, ndim, shape, strides, offset);
  if (!*out) DDP_FAIL(DDP_ERR_MEMORY, "view: out of memory");
  __atomic_add_fetch(&base->storage->refcount, 1, __ATOMIC_RELAXED);
  return DDP_OK;
}

ddp_tensor *ddp_tensor_alias(const ddp_tensor *t) {
  ddp_tensor *a = NULL;
  if (ddp_tensor_view_raw(&a, t, t->ndim, t->shape, t->strides, t->offset)) return NULL;
  return a;
}

void ddp_tensor_set_view_base(ddp_tensor *view, ddp_tensor *of) {
  ddp_tensor *base = of->view_base ? of->view_base : of;
  ddp_tensor_retain(base);
  ddp_tensor_release(view->view_base);
  view->view_base = base;
  view->view_base_fn = base->grad_fn;
}

void ddp_tensor_retain(ddp_tensor *t) {
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

/* Note [autograd release hook] (core.h): set once at load by autograd. */
static ddp_autograd_release_fn autograd_release;

void ddp_autograd_release_hook_set(ddp_autograd_release_fn fn) { autograd_release = fn; }

/* Drop everything t holds but the header itself. */
static void tensor_clear(ddp_tensor *t) {
  ddp_storage *s = t->storage;
  ddp_tensor *g = t->grad;
  ddp_node *fn = t->grad_fn;
  ddp_tensor_hooks *hooks = t->hooks;
  ddp_tensor *base = t->view_base;
  t->storage = NULL;
  t->view_base = NULL;
  t->view_base_fn = NULL;
  t->grad = NULL;
  t->grad_fn = NULL;
  t->hooks = NULL;
  /* only autograd attaches a node or hooks, so the hook is set whenever one is here */
  if ((fn || hooks) && autograd_release) autograd_release(t, fn, hooks);
  ddp_tensor_release(g);
  ddp_tensor_release(base);
  storage_release(s);
}

void ddp_tensor_release(ddp_tensor *t) {
  if (!t || !ddp_ref_drop(&t->refcount)) return;
  tensor_clear(t);
  ddp_block_free(t);
}

/* Note [prefetched batch release]: the references a batch releases were made long before
 * (a collection cycle ago), so their headers, storages and graph nodes have left the cache;
 * released one after another, each waits for several memory loads in turn. Knowing the
 * whole batch, the loop asks for the header of the tensor 2 * AHEAD places on and for the
 * storage and node of the one AHEAD places on (whose header has arrived by then), so the
 * loads of many tensors overlap. */
void ddp_tensor_release_indexed(ddp_tensor **table, const int32_t *index, int64_t n) {
  enum { AHEAD = 8 };
  for (int64_t i = 0; i < n; i++) {
    if (i + 2 * AHEAD < n) {
      const char *h = (const char *)table[index[i + 2 * AHEAD]];
      if (h) {
        __builtin_prefetch(h, 1);
        __builtin_prefetch(h + offsetof(ddp_tensor, grad), 1);
      }
    }
    if (i + AHEAD < n) {
      const ddp_tensor *a = table[index[i + AHEAD]];
      if (a && __atomic_load_n(&a->refcount, __ATOMIC_RELAXED) == 1) {
        if (a->storage) __builtin_prefetch(a->storage, 1);
        if (a->grad_fn) {
          __builtin_prefetch(a->grad_fn, 1);
          __builtin_prefetch((const char *)a->grad_fn + 192, 1);
        }
      }
    }
    ddp_tensor *t = table[index[i]];
    table[index[i]] = NULL;
    ddp_tensor_release(t);
  }
}

void ddp_tensor_free(ddp_tensor *t) {
  if (t && t->storage) {
    tensor_clear(t);
    t->numel = 0;
  }
}

void ddp_tensor_set_data_raw(ddp_tensor *t, const ddp_tensor *src) {
  if (t == src) return;
  ddp_storage *old = t->storage;
  __atomic_add_fetch(&src->storage->refcount, 1, __ATOMIC_RELAXED);
  t->storage = src->storage;
  t->dtype = src->dtype;
  t->device = src->device;
  t->ndim = src->ndim;
  t->offset = src->offset;
  t->numel = src->numel;
  memcpy(t->shape, src->shape, sizeof t->shape);
  memcpy(t->strides, src->strides, sizeof t->strides);
  storage_release(old);
  ddp_tensor *base = t->view_base; /* new data: no longer a view of anything */
  t->view_base = NULL;
  t->view_base_fn = NULL;
  ddp_tensor_release(base);
  ddp_tensor *g = t->grad;
  if (g && (g->dtype != t->dtype || g->device != t->device || g->ndim != t->ndim ||
            memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)) {
    t->grad = NULL; /* it no longer fits: the caller sets a converted one */
    ddp_tensor_release(g);
  }
}

int ddp_tensor_is_alive(const ddp_tensor *t) { return t && t->storage; }

int ddp_check_alive(const ddp_tensor *t, const char *op, const char *arg) {
  if (!t) DDP_FAIL(DDP_ERR_ARG, "%s: argument '%s' is nil (expected a tensor)", op, arg);
  if (!t->storage)
    DDP_FAIL(DDP_ERR_STATE, "%s: argument '%s' is a freed tensor (:free() was called on it)",
             op, arg);
  if (__builtin_expect(t->storage->resized, 0) && !ddp_tensor_storage_fits(t))
    DDP_FAIL(DDP_ERR_STATE,
             "%s: argument '%s' of shape %s has no data: its storage was resized to %zu bytes "
             "(storage resize_, as FSDP frees an unsharded parameter after forward; "
             "Note [storage resize])",
             op, arg, DDP_SHAPE(t), t->storage->nbytes);
  return DDP_OK;
}

int ddp_tensor_storage_fits(const ddp_tensor *t) {
  if (!t || !t->storage) return 0;
  if (t->numel == 0) return 1;
  int64_t last = t->offset;
  for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->strides[i];
  return (uint64_t)(last + 1) * ddp_dtype_size(t->dtype) <= t->storage->nbytes;
}

/* ---- accessors ---------------------------------------------------------------------- */

/* The accessors never fail: a NULL handle (nil from Lua) reads as an empty 0-d tensor, so
 * a mistaken argument reaches the op's front door, which names it, instead of crashing. */
static const int64_t no_sizes[DDP_MAX_DIMS];

int ddp_tensor_dim(const ddp_tensor *t) { return t ? t->ndim : 0; }
int64_t ddp_tensor_numel(const ddp_tensor *t) { return t ? t->numel : 0; }
int ddp_tensor_dtype(const ddp_tensor *t) { return t ? t->dtype : DDP_F32; }
int ddp_tensor_device(const ddp_tensor *t) { return t ? t->device : DDP_DEVICE_CPU; }
const int64_t *ddp_tensor_shape(const ddp_tensor *t) { return t ? t->shape : no_sizes; }
const int64_t *ddp_tensor_strides(const ddp_tensor *t) { return t ? t->strides : no_sizes; }
int64_t ddp_tensor_offset(const ddp_tensor *t) { return t ? t->offset : 0; }
void *ddp_tensor_data(const ddp_tensor *t) { return t && t->storage ? ddp_data(t) : NULL; }
int64_t ddp_tensor_storage_bytes(const ddp_tensor *t) {
  return t && t->storage ? (int64_t)t->storage->nbytes : 0;
}
int64_t ddp_tensor_version(const ddp_tensor *t) { return t && t->storage ? t->storage->version : 0; }

int ddp_tensor_shares_storage(const ddp_tensor *a, const ddp_tensor *b) {
  return a && b && a->storage && a->storage == b->storage;
}

int ddp_tensor_is_contiguous(const ddp_tensor *t) {
  if (!t) return 1;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if (t->shape[i] == 0) return 1;
    if (t->strides[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

/* ---- element access ----------------------------------------------------------------- */

/* *out = the element at p of t, fetched from the device first when t lives on one. */
static int load_element(const ddp_tensor *t, const char *p, double *out) {
  char buf[8];
  if (t->device != DDP_DEVICE_CPU) {
    DDP_TRY(ddp_device_memcpy(buf, DDP_DEVICE_CPU, p, t->device, ddp_dtype_size(t->dtype),
                              "item"));
    p = buf;
  }
  *out = ddp_load_f64(p, t->dtype);
  return DDP_OK;
}

int ddp_tensor_item(const ddp_tensor *t, double *out) {
  DDP_TRY(ddp_check_alive(t, "item", "self"));
  if (t->numel != 1)
    DDP_FAIL(DDP_ERR_ARG, "item: a tensor with %lld elements %s cannot be converted to a number "
             "(item needs exactly one element)", (long long)t->numel, DDP_SHAPE(t));
  return load_element(t, ddp_data(t), out);
}

static int element_address(const ddp_tensor *t, const int64_t *index, const char *op, char **p) {
  DDP_TRY(ddp_check_alive(t, op, "self"));
  int64_t off = t->offset;
  for (int i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i])
      DDP_FAIL(DDP_ERR_ARG, "%s: index %lld is out of range for dimension %d of size %lld "
               "(tensor %s)", op, (long long)index[i], i + 1, (long long)t->shape[i],
               DDP_SHAPE(t));
    off += index[i] * t->strides[i];
  }
  *p = (char *)t->storage->data + off * (int64_t)ddp_dtype_size(t->dtype);
  return DDP_OK;
}

int ddp_tensor_get(const ddp_tensor *t, const int64_t *index, double *out) {
  char *p;
  DDP_TRY(element_address(t, index, "get", &p));
  return load_element(t, p, out);
}

int ddp_tensor_check_index(const ddp_tensor *t, const int64_t *index, const char *op) {
  char *p;
  return element_address(t, index, op, &p);
}

int ddp_tensor_set(ddp_tensor *t, const int64_t *index, double value) {
  char *p;
  DDP_TRY(element_address(t, index, "set", &p));
  if (t->device != DDP_DEVICE_CPU) {
    char buf[8];
    ddp_store_f64(buf, t->dtype, value);
    DDP_TRY(ddp_device_memcpy(p, t->device, buf, DDP_DEVICE_CPU, ddp_dtype_size(t->dtype), "set"));
  } else {
    ddp_store_f64(p, t->dtype, value);
  }
  ddp_tensor_bump_version(t);
  return DDP_OK;
}

struct to_f64_ctx { double *dst; int dtype; };
static void to_f64_loop(void *vctx, char **ptrs, const int64_t *strides, int64_t n) {
  struct to_f64_ctx *c = vctx;
  for (int64_t i = 0; i < n; i++) *c->dst++ = ddp_load_f64(ptrs[0] + i * strides[0], c->dtype);
}

/* to_f64 of a device tensor: the bytes its elements span are copied to the host as they
 * are (strides kept: no kernel needed), then read in row-major order. Strides are never
 * negative, so the span is [offset, offset + sum((shape[d] - 1) * strides[d])]. */
static int device_to_f64(const ddp_tensor *t, double *dst) {
  if (t->numel == 0) return DDP_OK;
  int64_t span = 1;
  for (int d = 0; d < t->ndim; d++) span += (t->shape[d] - 1) * t->strides[d];
  size_t es = ddp_dtype_size(t->dtype);
  char *host = malloc((size_t)span * es);
  if (!host) DDP_FAIL(DDP_ERR_MEMORY, "to_f64: out of memory for %lld elements", (long long)span);
  int status = ddp_device_memcpy(host, DDP_DEVICE_CPU, ddp_data(t), t->device, (size_t)span * es,
                                 "to_f64");
  int64_t idx[DDP_MAX_DIMS] = {0}, off = 0;
  for (int64_t i = 0; !status && i < t->numel; i++) {
    dst[i] = ddp_load_f64(host + off * (int64_t)es, t->dtype);
    for (int d = t->ndim - 1; d >= 0; d--) { /* next index, row-major */
      off += t->strides[d];
      if (++idx[d] < t->shape[d]) break;
      off -= idx[d] * t->strides[d];
      idx[d] = 0;
    }
  }
  free(host);
  return status;
}

int ddp_tensor_to_f64(const ddp_tensor *t, double *dst) {
  DDP_TRY(ddp_check_alive(t, "to_f64", "self"));
  if (t->device != DDP_DEVICE_CPU) return device_to_f64(t, dst);
  struct to_f64_ctx c = {dst, t->dtype};
  ddp_tensor *ops[1] = {(ddp_tensor *)t};
  ddp_foreach(1, ops, t->ndim, t->shape, to_f64_loop, &c, 0); /* serial: writes in order */
  return DDP_OK;
}

int ddp_check_affine_args(const char *op, ddp_tensor *input, ddp_tensor *weight,
                          ddp_tensor *bias) {
  DDP_TRY(ddp_check_alive(input, op, "input"));
  DDP_TRY(ddp_check_alive(weight, op, "weight"));
  if (bias) DDP_TRY(ddp_check_alive(bias, op, "bias"));
  ddp_tensor *ts[3] = {input, weight, bias};
  const char *names[3] = {"input", "weight", "bias"};
  DDP_TRY(ddp_check_same_device(op, 3, ts, names));
  if (!ddp_dtype_is_floating(input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: expected a floating input, got %s", op, ddp_dtype_name(input->dtype));
  if (weight->dtype != input->dtype || (bias && bias->dtype != input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: expected input, weight and bias of one dtype, got %s, %s and %s",
             op, ddp_dtype_name(input->dtype), ddp_dtype_name(weight->dtype),
             bias ? ddp_dtype_name(bias->dtype) : "none");
  return DDP_OK;
}

int ddp_tensor_is_pinned(const ddp_tensor *t) {
  return t && t->storage && t->storage->kind == DDP_STORAGE_PINNED;
}
