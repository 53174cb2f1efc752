/* runtime/ops/elementwise.c: front doors of the element-wise ops: checks, broadcasting,
 * type promotion, dispatch to the kernel table of the operands' device (the CPU's
 * runtime/backend/cpu/elementwise.c or the CUDA plug-in's elementwise.cu), autograd.
 *
 * Devices: every tensor argument must be on one device (the error names the op, both
 * arguments and both devices); outputs and gradients are made on that device, and the
 * kernels come from ddp_kernels_for(device), followed by ddp_device_check. Nothing here
 * reads tensor memory on the host.
 *
 * Note [header-only views]: broadcast operands and scalars reach the kernels as tensor
 * headers on the C stack (copies of the operand's header with broadcast strides, or a
 * one-element storage holding the scalar), never allocated and never refcounted. They
 * live for the call only. This keeps a small op down to two allocations: the output and,
 * when recording, the node. */
#include <math.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/autocast.h"

static const char *const BIN_NAMES[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                        "eq", "ne", "lt", "le", "gt", "ge"};
static const char *const BIN_NODES[] = {"AddBackward", "SubBackward", "MulBackward",
                                        "DivBackward", "PowBackward", "MaximumBackward",
                                        "MinimumBackward"};
static const char *const BIN_INPLACE_NAMES[] = {"add_", "sub_", "mul_", "div_", "pow_"};
static const char *const UN_NAMES[] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "clamp",
                                       "relu", "leaky_relu", "gelu", "gelu", "tanh", "sigmoid",
                                       "silu"};
static const char *const UN_INPLACE_NAMES[] = {"neg_", "exp_", "log_", "sqrt_", "rsqrt_",
                                               "abs_", "clamp_", "relu_", "leaky_relu_", "gelu_",
                                               "gelu_", "tanh_", "sigmoid_", "silu_"};
static const char *const UN_NODES[] = {"NegBackward", "ExpBackward", "LogBackward",
                                       "SqrtBackward", "RsqrtBackward", "AbsBackward",
                                       "ClampBackward", "ReluBackward", "LeakyReluBackward",
                                       "GeluBackward", "GeluBackward", "TanhBackward",
                                       "SigmoidBackward", "SiluBackward"};
/* Each name table covers its enum (runtime/backend/kernels.h), in enum order. */
_Static_assert(sizeof BIN_NAMES / sizeof BIN_NAMES[0] == DDP_EW_BINARY_COUNT,
               "BIN_NAMES must name every enum ddp_ew_binary op");
_Static_assert(sizeof BIN_NODES / sizeof BIN_NODES[0] == DDP_EW_DIFFERENTIABLE_COUNT,
               "BIN_NODES must name the backward of every differentiable binary op");
_Static_assert(sizeof BIN_INPLACE_NAMES / sizeof BIN_INPLACE_NAMES[0] == DDP_EW_INPLACE_COUNT,
               "BIN_INPLACE_NAMES must name every in-place binary op");
_Static_assert(sizeof UN_NAMES / sizeof UN_NAMES[0] == DDP_EW_UNARY_COUNT,
               "UN_NAMES must name every enum ddp_ew_unary op");
_Static_assert(sizeof UN_INPLACE_NAMES / sizeof UN_INPLACE_NAMES[0] == DDP_EW_UNARY_COUNT,
               "UN_INPLACE_NAMES must name every enum ddp_ew_unary op");
_Static_assert(sizeof UN_NODES / sizeof UN_NODES[0] == DDP_EW_UNARY_COUNT,
               "UN_NODES must name the backward of every enum ddp_ew_unary op");

/* ---- header-only views (Note [header-only views]) ------------------------------------ */

/* v = t broadcast to (ndim, shape); the caller has checked that t broadcasts. */
static void bcast_view(ddp_tensor *v, const ddp_tensor *t, int ndim, const int64_t *shape) {
  *v = *t;
  v->ndim = ndim;
  v->numel = 1;
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - t->ndim);
    v->shape[i] = shape[i];
    v->strides[i] = j < 0 || t->shape[j] == 1 ? 0 : t->strides[j];
    v->numel *= shape[i];
  }
}

typedef struct {
  ddp_storage storage;
  ddp_tensor t;
  double value[1];
} scalar_view;

/* s->t = the scalar v as a tensor of `dtype` broadcast to (ndim, shape). It lives in host
 * memory (device DDP_DEVICE_CPU) even when the other operands are on a device: device
 * kernels take such a stride-0 host view as a scalar and read its value on the host
 * (runtime/backend/cuda/elementwise.cu), so `t + 2` needs no device tensor for the 2. */
static ddp_tensor *make_scalar(scalar_view *s, double v, int dtype, int ndim,
                               const int64_t *shape) {
  memset(s, 0, sizeof *s);
  s->storage.data = s->value;
  s->storage.nbytes = sizeof s->value;
  s->storage.refcount = 1;
  s->storage.device = DDP_DEVICE_CPU;
  ddp_store_f64(s->value, dtype, v);
  s->t.refcount = 1;
  s->t.storage = &s->storage;
  s->t.dtype = dtype;
  s->t.device = DDP_DEVICE_CPU;
  s->t.ndim = ndim;
  s->t.numel = 1;
  for (int i = 0; i < ndim; i++) {
    s->t.shape[i] = shape[i];
    s->t.numel *= shape[i];
  }
  return &s->t;
}

/* ---- kernels of the output's device ---------------------------------------------------- */

/* Each runs the kernel of out's device table on operands already on that device (or host
 * scalars), then collects a pending device error; `name` is the op for messages. */
static int run_binary(ddp_tensor *out, ddp_tensor *a, ddp_tensor *b, int op, double alpha,
                      const char *name) {
  const ddp_kernels *k = ddp_kernels_for(out->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, binary, name));
  k->binary(out, a, b, op, alpha);
  return ddp_device_check(out->device, name);
}

static int run_binary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b,
                               int op, int wrt, double alpha, const char *name) {
  const ddp_kernels *k = ddp_kernels_for(d->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, binary_backward, name));
  k->binary_backward(d, g, a, b, op, wrt, alpha);
  return ddp_device_check(d->device, name);
}

static int run_unary(ddp_tensor *out, ddp_tensor *x, int op, double p0, double p1,
                     const char *name) {
  const ddp_kernels *k = ddp_kernels_for(out->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, unary, name));
  k->unary(out, x, op, p0, p1);
  return ddp_device_check(out->device, name);
}

static int run_unary_backward(ddp_tensor *d, ddp_tensor *g, ddp_tensor *s, int op, double p0,
                              double p1, const char *name) {
  const ddp_kernels *k = ddp_kernels_for(d->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, unary_backward, name));
  k->unary_backward(d, g, s, op, p0, p1);
  return ddp_device_check(d->device, name);
}

static int run_where(ddp_tensor *out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b,
                     const char *name) {
  const ddp_kernels *k = ddp_kernels_for(out->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, where, name));
  k->where(out, cond, a, b);
  return ddp_device_check(out->device, name);
}

/* Release *out and clear it; returns status (for failures after *out was made). */
static int drop(ddp_tensor **out, int status) {
  ddp_tensor_release(*out);
  *out = NULL;
  return status;
}

/* ---- dtypes --------------------------------------------------------------------------- */

enum { CAT_BOOL, CAT_INT, CAT_FLOAT };
static int category(int dtype) {
  return dtype == DDP_BOOL ? CAT_BOOL : ddp_dtype_is_floating(dtype) ? CAT_FLOAT : CAT_INT;
}

/* The result dtype of two tensors (PyTorch: a 0-d tensor does not promote a dimensioned
 * one unless its category is higher). */
static int promote_tensors(const ddp_tensor *a, const ddp_tensor *b) {
  if ((a->ndim == 0) != (b->ndim == 0)) {
    const ddp_tensor *z = a->ndim == 0 ? a : b, *d = a->ndim == 0 ? b : a;
    return category(z->dtype) > category(d->dtype) ? z->dtype : d->dtype;
  }
  return ddp_promote_types(a->dtype, b->dtype);
}

/* The result dtype of a tensor with a scalar s. */
static int promote_scalar(int dtype, double s) {
  if (ddp_dtype_is_floating(dtype)) return dtype;
  if (s != floor(s)) return DDP_F32; /* also NaN and inf */
  return dtype == DDP_BOOL ? DDP_I64 : dtype;
}

/* PyTorch's can_cast: no floating into integers, nothing but bool into bool. */
static int can_cast(int from, int to) {
  return category(from) <= category(to);
}

/* The dtype `op` computes and returns for operands promoted to `dt`; -1 after setting the
 * error when the op refuses it. */
static int binary_result(int op, int dt, const char *name) {
  if (op == DDP_EW_SUB && dt == DDP_BOOL)
    return DDP_ERROR(DDP_ERR_ARG, "%s: subtraction of bool tensors is not supported (use "
                     "logical ops, or convert to an integer dtype)", name), -1;
  if (op == DDP_EW_DIV && !ddp_dtype_is_floating(dt)) return DDP_F32;
  if (op == DDP_EW_POW && dt == DDP_BOOL) return DDP_I64;
  return dt;
}

static int is_cmp_op(int op) { return op >= DDP_EW_EQ; }

/* The dtype a scalar operand is stored in for the kernels: the computation's, so the
 * same-dtype loops apply; f16/bf16 compute through double (the general path), so the scalar
 * keeps its full value there, as PyTorch's float "opmath" does. */
static int scalar_dtype(int dt) {
  return dt == DDP_F16 || dt == DDP_BF16 ? DDP_F64 : dt;
}

/* ---- gradients back to the inputs ----------------------------------------------------- */

/* gi = d summed to the input's shape and cast to its dtype; consumes d's reference. */
static int to_input(ddp_tensor **gi, ddp_tensor *d, const ddp_input_meta *m) {
  ddp_tensor *summed;
  int status = ddp_sum_to_shape(&summed, d, m->ndim, m->shape);
  ddp_tensor_release(d);
  if (status) return status;
  if (summed->dtype == m->dtype) {
    *gi = summed;
    return DDP_OK;
  }
  status = ddp_to_dtype(gi, summed, m->dtype);
  ddp_tensor_release(summed);
  return status;
}

static int wants_grad(const ddp_node *n, int i) { return n->edges[i].fn || n->edges[i].leaf; }

/* Does op's gradient w.r.t. input `wrt` read the saved a (slot 0) / b (slot 1)? */
static int needs_a(int op, int wrt) {
  return op == DDP_EW_POW || op == DDP_EW_MAX || op == DDP_EW_MIN ||
         (wrt == 1 && (op == DDP_EW_MUL || op == DDP_EW_DIV));
}
static int needs_b(int op, int wrt) {
  return op == DDP_EW_POW || op == DDP_EW_MAX || op == DDP_EW_MIN || op == DDP_EW_DIV ||
         (wrt == 0 && op == DDP_EW_MUL);
}

/* Gradient of one operand of a binary op. a, b: the operands (either may be a scalar view),
 * in any shape broadcasting to g's. */
static int binary_grad(ddp_tensor **gi, ddp_tensor *g, ddp_tensor *a, ddp_tensor *b, int op,
                       int wrt, double alpha, const ddp_input_meta *m) {
  ddp_tensor *d;
  if ((op == DDP_EW_ADD || op == DDP_EW_SUB) && (wrt == 0 || (alpha == 1 && op == DDP_EW_ADD))) {
    ddp_tensor_retain(g); /* the gradient passes unchanged */
    d = g;
  } else {
    DDP_TRY(ddp_tensor_empty(&d, g->ndim, g->shape, g->dtype, g->device));
    ddp_tensor va, vb;
    bcast_view(&va, a, g->ndim, g->shape);
    bcast_view(&vb, b, g->ndim, g->shape);
    int status = run_binary_backward(d, g, &va, &vb, op, wrt, alpha, BIN_NODES[op]);
    if (status) return drop(&d, status);
  }
  return to_input(gi, d, m);
}

/* Saved: slot 0 = a, slot 1 = b (each only when some wanted gradient reads it). */
static int binary_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int op = (int)n->iattr[0];
  double alpha = n->fattr[0];
  scalar_view dummy;
  ddp_tensor *zero = make_scalar(&dummy, 0, g->dtype, 0, NULL);
  for (int w = 0; w < 2; w++) {
    if (!wants_grad(n, w)) continue;
    ddp_tensor *a = zero, *b = zero;
    if (needs_a(op, w) && !(a = ddp_node_saved(n, 0))) return ddp_last_status();
    if (needs_b(op, w) && !(b = ddp_node_saved(n, 1))) return ddp_last_status();
    DDP_TRY(binary_grad(&gi[w], g, a, b, op, w, alpha, &n->inputs[w]));
  }
  return DDP_OK;
}

/* A tensor op a scalar: iattr[0] = op, iattr[1] = 1 when the scalar is on the left;
 * fattr[0] = alpha, fattr[1] = the scalar; saved slot 0 = the tensor input (when read). */
static int scalar_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int op = (int)n->iattr[0], rev = (int)n->iattr[1];
  int wrt = rev ? 1 : 0;
  scalar_view sv;
  ddp_tensor *s = make_scalar(&sv, n->fattr[1], g->dtype, 0, NULL);
  ddp_tensor *t = s; /* placeholder where the tensor is not read */
  if ((rev ? needs_b(op, wrt) : needs_a(op, wrt)) && !(t = ddp_node_saved(n, 0)))
    return ddp_last_status();
  return binary_grad(&gi[0], g, rev ? s : t, rev ? t : s, op, wrt, n->fattr[0], &n->inputs[0]);
}

/* ---- binary front doors --------------------------------------------------------------- */

static const char *const PAIR_NAMES[2] = {"self", "other"};

/* Can t join operands on `device` as a scalar? A 0-d CPU tensor that needs no gradient
 * may, as PyTorch's wrapped numbers (dl.maximum(t, 2) passes the 2 as one): it reaches
 * the device kernels as a host scalar (Note at make_scalar). */
static int host_scalar_ok(const ddp_tensor *t, int device) {
  return device != DDP_DEVICE_CPU && t->device == DDP_DEVICE_CPU && t->ndim == 0 &&
         !t->requires_grad;
}

/* The device n operands compute on: the first one not on the CPU, else the CPU. */
static int operands_device(int n, ddp_tensor *const *ts) {
  for (int i = 0; i < n; i++)
    if (ts[i]->device != DDP_DEVICE_CPU) return ts[i]->device;
  return DDP_DEVICE_CPU;
}

/* The n live tensors ts (named names[i]) are on one device, but for host scalars
 * (host_scalar_ok) among those from index `first_scalar` on. */
static int check_devices(const char *name, int n, ddp_tensor *const *ts,
                         const char *const *names, int first_scalar) {
  ddp_tensor *check[4];
  int device = operands_device(n, ts);
  for (int i = 0; i < n; i++)
    check[i] = i >= first_scalar && host_scalar_ok(ts[i], device) ? NULL : ts[i];
  return ddp_check_same_device(name, n, check, names);
}

/* a and b live and on one device (either may be a host scalar). */
static int check_pair(ddp_tensor *a, ddp_tensor *b, const char *name) {
  DDP_TRY(ddp_check_alive(a, name, "self"));
  DDP_TRY(ddp_check_alive(b, name, "other"));
  ddp_tensor *ts[2] = {a, b};
  return check_devices(name, 2, ts, PAIR_NAMES, 0);
}

static int broadcast_pair(const ddp_tensor *a, const ddp_tensor *b, const char *name,
                          int64_t *shape, int *nd) {
  *nd = ddp_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, shape);
  if (*nd < 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: the shapes %s and %s cannot be broadcast together", name,
             DDP_SHAPE(a), DDP_SHAPE(b));
  return DDP_OK;
}

static int binary_op(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, int op, double alpha) {
  const char *name = BIN_NAMES[op];
  *out = NULL;
  DDP_TRY(check_pair(a, b, name));
  /* operands of one shape are their own broadcast views (a size-1 dimension keeps its
   * stride, which no kernel reads: the iterators drop such dimensions) */
  int same = a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
  const int64_t *shape = a->shape;
  int64_t bshape[DDP_MAX_DIMS];
  int nd = a->ndim;
  if (!same) {
    DDP_TRY(broadcast_pair(a, b, name, bshape, &nd));
    shape = bshape;
  }
  int dt = binary_result(op, promote_tensors(a, b), name);
  if (dt < 0) return ddp_last_status();
  ddp_tensor *pair[2] = {a, b};
  DDP_TRY(ddp_tensor_empty(out, nd, shape, dt, operands_device(2, pair)));
  ddp_tensor va, vb, *pa = a, *pb = b;
  if (!same) {
    bcast_view(&va, a, nd, shape);
    bcast_view(&vb, b, nd, shape);
    pa = &va;
    pb = &vb;
  }
  int status = run_binary(*out, pa, pb, op, alpha, name);
  if (status) return drop(out, status);
  ddp_tensor *inputs[2] = {a, b};
  if (!ddp_autograd_needed(2, inputs) || !ddp_dtype_is_floating(dt)) return DDP_OK;
  ddp_node *n = ddp_node_new(BIN_NODES[op], binary_backward, 2, inputs, 2);
  if (!n) goto fail;
  n->iattr[0] = op;
  n->fattr[0] = alpha;
  int ra = a->requires_grad, rb = b->requires_grad;
  if (((ra && needs_a(op, 0)) || (rb && needs_a(op, 1))) && ddp_node_save(n, 0, a)) goto fail_node;
  if (((ra && needs_b(op, 0)) || (rb && needs_b(op, 1))) && ddp_node_save(n, 1, b)) goto fail_node;
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
fail_node:
  ddp_node_release(n);
fail:
  ddp_tensor_release(*out);
  *out = NULL;
  return ddp_last_status();
}

int ddp_add(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_ADD, 1); }
int ddp_add_alpha(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, double alpha) {
  return binary_op(out, a, b, DDP_EW_ADD, alpha);
}
int ddp_sub(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_SUB, 1); }
int ddp_mul(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_MUL, 1); }
int ddp_div(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_DIV, 1); }
int ddp_pow(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_POW, 1); }
int ddp_maximum(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_MAX, 1); }
int ddp_minimum(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return binary_op(out, a, b, DDP_EW_MIN, 1); }

/* A plain copy of self's current values (no graph), for a backward that needs them after
 * an in-place op overwrites self. */
static int snapshot(ddp_tensor **out, ddp_tensor *self) {
  int prev = ddp_set_grad_enabled(0);
  int status = ddp_clone(out, self);
  ddp_set_grad_enabled(prev);
  return status;
}

/* self = self op other, or self op s when other is NULL. */
static int binary_inplace(ddp_tensor *self, ddp_tensor *other, double s, int op, double alpha) {
  const char *name = BIN_INPLACE_NAMES[op];
  if (other) { /* other may be a host scalar, self not: it is the output */
    DDP_TRY(ddp_check_alive(self, name, "self"));
    DDP_TRY(ddp_check_alive(other, name, "other"));
    ddp_tensor *ts[2] = {self, other};
    DDP_TRY(check_devices(name, 2, ts, PAIR_NAMES, 1));
  } else {
    DDP_TRY(ddp_check_alive(self, name, "self"));
  }
  int dt;
  if (other) {
    int64_t shape[DDP_MAX_DIMS];
    int nd;
    DDP_TRY(broadcast_pair(self, other, name, shape, &nd));
    if (nd != self->ndim || memcmp(shape, self->shape, sizeof(int64_t) * nd))
      DDP_FAIL(DDP_ERR_ARG, "%s: the output of shape %s does not match the broadcast shape %s "
               "of self %s and other %s", name, DDP_SHAPE(self), ddp_shape_str(nd, shape),
               DDP_SHAPE(self), DDP_SHAPE(other));
    dt = binary_result(op, promote_tensors(self, other), name);
  } else {
    if (op == DDP_EW_POW && !ddp_dtype_is_floating(self->dtype) && s < 0 && s == floor(s))
      DDP_FAIL(DDP_ERR_ARG, "%s: integers to negative integer powers are not allowed", name);
    dt = binary_result(op, promote_scalar(self->dtype, s), name);
  }
  if (dt < 0) return ddp_last_status();
  if (!can_cast(dt, self->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: result type %s can't be cast to the desired output type %s", name,
             ddp_dtype_name(dt), ddp_dtype_name(self->dtype));
  ddp_tensor *inputs[2] = {self, other};
  int record = ddp_autograd_needed(other ? 2 : 1, inputs);
  DDP_TRY(ddp_autograd_check_inplace(self, name));
  ddp_node *n = NULL;
  if (record) {
    int wrt_other = other && other->requires_grad;
    int want_a = needs_a(op, 0) || (wrt_other && needs_a(op, 1));
    int want_b = needs_b(op, 0) || (wrt_other && needs_b(op, 1));
    n = other ? ddp_node_new(BIN_NODES[op], binary_backward, 2, inputs, 2)
              : ddp_node_new(BIN_NODES[op], scalar_backward, 1, inputs, 1);
    if (!n) return ddp_last_status();
    n->iattr[0] = op;
    n->fattr[0] = alpha;
    n->fattr[1] = s;
    if (want_a) { /* the old value of self: saved before it is overwritten */
      ddp_tensor *old;
      int status = snapshot(&old, self);
      if (!status) status = ddp_node_save(n, 0, old);
      ddp_tensor_release(old);
      if (status) { ddp_node_release(n); return status; }
    }
    if (other && want_b && ddp_node_save(n, 1, other)) {
      ddp_node_release(n);
      return ddp_last_status();
    }
  }
  ddp_tensor vb;
  scalar_view sv;
  if (other) bcast_view(&vb, other, self->ndim, self->shape);
  ddp_tensor *b = other ? &vb : make_scalar(&sv, s, scalar_dtype(dt), self->ndim, self->shape);
  int status = run_binary(self, self, b, op, alpha, name);
  if (status) {
    ddp_node_release(n);
    return status;
  }
  ddp_tensor_bump_version(self);
  return n ? ddp_autograd_rebase(self, n) : DDP_OK; /* Note [in-place on views] */
}

int ddp_add_(ddp_tensor *self, ddp_tensor *other) { return binary_inplace(self, other, 0, DDP_EW_ADD, 1); }
int ddp_add_alpha_(ddp_tensor *self, ddp_tensor *other, double alpha) {
  return binary_inplace(self, other, 0, DDP_EW_ADD, alpha);
}
int ddp_sub_(ddp_tensor *self, ddp_tensor *other) { return binary_inplace(self, other, 0, DDP_EW_SUB, 1); }
int ddp_mul_(ddp_tensor *self, ddp_tensor *other) { return binary_inplace(self, other, 0, DDP_EW_MUL, 1); }
int ddp_div_(ddp_tensor *self, ddp_tensor *other) { return binary_inplace(self, other, 0, DDP_EW_DIV, 1); }
int ddp_pow_(ddp_tensor *self, ddp_tensor *other) { return binary_inplace(self, other, 0, DDP_EW_POW, 1); }
int ddp_add_scalar_(ddp_tensor *self, double s) { return binary_inplace(self, NULL, s, DDP_EW_ADD, 1); }
int ddp_sub_scalar_(ddp_tensor *self, double s) { return binary_inplace(self, NULL, s, DDP_EW_SUB, 1); }
int ddp_mul_scalar_(ddp_tensor *self, double s) { return binary_inplace(self, NULL, s, DDP_EW_MUL, 1); }
int ddp_div_scalar_(ddp_tensor *self, double s) { return binary_inplace(self, NULL, s, DDP_EW_DIV, 1); }
int ddp_pow_scalar_(ddp_tensor *self, double s) { return binary_inplace(self, NULL, s, DDP_EW_POW, 1); }

/* out = a op s (rev = 0) or s op a (rev = 1). */
static int scalar_op(ddp_tensor **out, ddp_tensor *a, double s, int op, int rev) {
  const char *name = BIN_NAMES[op];
  *out = NULL;
  DDP_TRY(ddp_check_alive(a, name, "self"));
  if (op == DDP_EW_POW && !rev && !ddp_dtype_is_floating(a->dtype) && s < 0 && s == floor(s))
    DDP_FAIL(DDP_ERR_ARG, "%s: integers to negative integer powers are not allowed", name);
  int pt = promote_scalar(a->dtype, s);
  int dt = binary_result(op, pt, name);
  if (dt < 0) return ddp_last_status();
  DDP_TRY(ddp_tensor_empty(out, a->ndim, a->shape, is_cmp_op(op) ? DDP_BOOL : dt, a->device));
  scalar_view sv;
  /* the scalar in the dtype the tensor computes in, so the same-dtype loops apply */
  ddp_tensor *sc = make_scalar(&sv, s, scalar_dtype(pt), a->ndim, a->shape);
  int status = run_binary(*out, rev ? sc : a, rev ? a : sc, op, 1, name);
  if (status) return drop(out, status);
  if (is_cmp_op(op) || !ddp_autograd_needed(1, &a) || !ddp_dtype_is_floating(dt)) return DDP_OK;
  ddp_node *n = ddp_node_new(BIN_NODES[op], scalar_backward, 1, &a, 1);
  if (!n) goto fail;
  n->iattr[0] = op;
  n->iattr[1] = rev;
  n->fattr[0] = 1;
  n->fattr[1] = s;
  if ((rev ? needs_b(op, 1) : needs_a(op, 0)) && ddp_node_save(n, 0, a)) {
    ddp_node_release(n);
    goto fail;
  }
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
fail:
  ddp_tensor_release(*out);
  *out = NULL;
  return ddp_last_status();
}

int ddp_add_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_ADD, 0); }
int ddp_sub_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_SUB, 0); }
int ddp_mul_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_MUL, 0); }
int ddp_div_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_DIV, 0); }
int ddp_pow_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_POW, 0); }
int ddp_rsub_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_SUB, 1); }
int ddp_rdiv_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_DIV, 1); }
int ddp_rpow_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_POW, 1); }

/* ---- comparisons ---------------------------------------------------------------------- */

static int compare(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b, int op) {
  const char *name = BIN_NAMES[op];
  *out = NULL;
  DDP_TRY(check_pair(a, b, name));
  int64_t shape[DDP_MAX_DIMS];
  int nd;
  DDP_TRY(broadcast_pair(a, b, name, shape, &nd));
  ddp_tensor *pair[2] = {a, b};
  DDP_TRY(ddp_tensor_empty(out, nd, shape, DDP_BOOL, operands_device(2, pair)));
  ddp_tensor va, vb;
  bcast_view(&va, a, nd, shape);
  bcast_view(&vb, b, nd, shape);
  /* compare in the promoted dtype: the general path converts each side through double,
   * which is exact for every dtype but i64 beyond 2^53 */
  int status = run_binary(*out, &va, &vb, op, 1, name);
  return status ? drop(out, status) : DDP_OK;
}

int ddp_eq(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return compare(out, a, b, DDP_EW_EQ); }
int ddp_ne(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return compare(out, a, b, DDP_EW_NE); }
int ddp_lt(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return compare(out, a, b, DDP_EW_LT); }
int ddp_le(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return compare(out, a, b, DDP_EW_LE); }
int ddp_gt(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return compare(out, a, b, DDP_EW_GT); }
int ddp_ge(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return compare(out, a, b, DDP_EW_GE); }
int ddp_eq_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_EQ, 0); }
int ddp_ne_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_NE, 0); }
int ddp_lt_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_LT, 0); }
int ddp_le_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_LE, 0); }
int ddp_gt_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_GT, 0); }
int ddp_ge_scalar(ddp_tensor **out, ddp_tensor *a, double s) { return scalar_op(out, a, s, DDP_EW_GE, 0); }

/* ---- unary ops ------------------------------------------------------------------------ */

/* The result dtype of unary op on `dt` (p0/p1: clamp's bounds); -1 with the error set. */
static int unary_result(int op, int dt, double p0, double p1, const char *name) {
  if (ddp_dtype_is_floating(dt)) return dt;
  switch (op) {
  case DDP_EW_EXP: case DDP_EW_LOG: case DDP_EW_SQRT: case DDP_EW_RSQRT: case DDP_EW_TANH:
  case DDP_EW_SIGMOID:
    return DDP_F32;
  case DDP_EW_NEG: case DDP_EW_ABS: case DDP_EW_RELU:
    if (dt != DDP_BOOL) return dt;
    break;
  case DDP_EW_CLAMP:
    if (dt == DDP_BOOL) break;
    if ((isfinite(p0) && p0 != floor(p0)) || (isfinite(p1) && p1 != floor(p1))) return DDP_F32;
    return dt;
  }
  return DDP_ERROR(DDP_ERR_ARG, "%s: not supported for %s tensors", name, ddp_dtype_name(dt)), -1;
}

/* iattr[0] = op, fattr[0..1] = p0, p1; saved slot 0 = the input or the output, as
 * ddp_ew_unary_uses_output says (nothing for neg). */
static int unary_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int op = (int)n->iattr[0];
  ddp_tensor *s = g;
  if (ddp_ew_unary_uses_output(op) >= 0 && !(s = ddp_node_saved(n, 0))) return ddp_last_status();
  DDP_TRY(ddp_tensor_empty(&gi[0], g->ndim, g->shape, g->dtype, g->device));
  int status = run_unary_backward(gi[0], g, s, op, n->fattr[0], n->fattr[1], UN_NODES[op]);
  return status ? drop(&gi[0], status) : DDP_OK;
}

static ddp_node *unary_node(ddp_tensor *x, int op, double p0, double p1) {
  ddp_node *n = ddp_node_new(UN_NODES[op], unary_backward, 1, &x, 1);
  if (!n) return NULL;
  n->iattr[0] = op;
  n->fattr[0] = p0;
  n->fattr[1] = p1;
  return n;
}

static int unary_op(ddp_tensor **out, ddp_tensor *x, int op, double p0, double p1) {
  const char *name = UN_NAMES[op];
  *out = NULL;
  DDP_TRY(ddp_check_alive(x, name, "self"));
  int dt = unary_result(op, x->dtype, p0, p1, name);
  if (dt < 0) return ddp_last_status();
  DDP_TRY(ddp_tensor_empty(out, x->ndim, x->shape, dt, x->device));
  int status = run_unary(*out, x, op, p0, p1, name);
  if (status) return drop(out, status);
  if (!ddp_autograd_needed(1, &x) || !ddp_dtype_is_floating(dt)) return DDP_OK;
  ddp_node *n = unary_node(x, op, p0, p1);
  if (!n) goto fail;
  int uses = ddp_ew_unary_uses_output(op);
  if (uses >= 0 && ddp_node_save(n, 0, uses ? *out : x)) {
    ddp_node_release(n);
    goto fail;
  }
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
fail:
  ddp_tensor_release(*out);
  *out = NULL;
  return ddp_last_status();
}

static int unary_inplace(ddp_tensor *self, int op, double p0, double p1) {
  const char *name = UN_INPLACE_NAMES[op];
  DDP_TRY(ddp_check_alive(self, name, "self"));
  int dt = unary_result(op, self->dtype, p0, p1, name);
  if (dt < 0) return ddp_last_status();
  if (dt != self->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: result type %s can't be cast to the desired output type %s", name,
             ddp_dtype_name(dt), ddp_dtype_name(self->dtype));
  int record = ddp_autograd_needed(1, &self);
  DDP_TRY(ddp_autograd_check_inplace(self, name));
  ddp_node *n = NULL;
  int uses = ddp_ew_unary_uses_output(op);
  if (record) {
    if (!(n = unary_node(self, op, p0, p1))) return ddp_last_status();
    if (uses == 0) { /* the backward reads the input: keep the old values */
      ddp_tensor *old;
      int status = snapshot(&old, self);
      if (!status) status = ddp_node_save(n, 0, old);
      ddp_tensor_release(old);
      if (status) { ddp_node_release(n); return status; }
    }
  }
  int status = run_unary(self, self, op, p0, p1, name);
  if (status) {
    ddp_node_release(n);
    return status;
  }
  ddp_tensor_bump_version(self);
  if (n) {
    if (uses == 1 && ddp_node_save(n, 0, self)) { /* the output, saved once written */
      ddp_node_release(n);
      return ddp_last_status();
    }
    return ddp_autograd_rebase(self, n); /* Note [in-place on views] */
  }
  return DDP_OK;
}

/* clamp's bounds: an absent (or NaN) bound becomes an infinity. */
static void clamp_bounds(int has_lo, double *lo, int has_hi, double *hi) {
  if (!has_lo || *lo != *lo) *lo = -INFINITY;
  if (!has_hi || *hi != *hi) *hi = INFINITY;
}

int ddp_neg(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_NEG, 0, 0); }
int ddp_exp(ddp_tensor **out, ddp_tensor *x) {
  ddp_tensor *ac_in[1] = {x}, *ac[1]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_EXP, 1, ac_in, ac, ddp_exp(out, ac[0]));
  return unary_op(out, x, DDP_EW_EXP, 0, 0);
}
int ddp_log(ddp_tensor **out, ddp_tensor *x) {
  ddp_tensor *ac_in[1] = {x}, *ac[1]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_LOG, 1, ac_in, ac, ddp_log(out, ac[0]));
  return unary_op(out, x, DDP_EW_LOG, 0, 0);
}
int ddp_sqrt(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_SQRT, 0, 0); }
int ddp_rsqrt(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_RSQRT, 0, 0); }
int ddp_abs(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_ABS, 0, 0); }
int ddp_clamp(ddp_tensor **out, ddp_tensor *x, int has_lo, double lo, int has_hi, double hi) {
  clamp_bounds(has_lo, &lo, has_hi, &hi);
  return unary_op(out, x, DDP_EW_CLAMP, lo, hi);
}
int ddp_relu(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_RELU, 0, 0); }
int ddp_leaky_relu(ddp_tensor **out, ddp_tensor *x, double negative_slope) {
  return unary_op(out, x, DDP_EW_LEAKY_RELU, negative_slope, 0);
}
int ddp_gelu(ddp_tensor **out, ddp_tensor *x, int approximate_tanh) {
  return unary_op(out, x, approximate_tanh ? DDP_EW_GELU_TANH : DDP_EW_GELU, 0, 0);
}
int ddp_tanh(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_TANH, 0, 0); }
int ddp_sigmoid(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_SIGMOID, 0, 0); }
int ddp_silu(ddp_tensor **out, ddp_tensor *x) { return unary_op(out, x, DDP_EW_SILU, 0, 0); }

int ddp_neg_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_NEG, 0, 0); }
int ddp_exp_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_EXP, 0, 0); }
int ddp_log_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_LOG, 0, 0); }
int ddp_sqrt_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_SQRT, 0, 0); }
int ddp_rsqrt_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_RSQRT, 0, 0); }
int ddp_abs_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_ABS, 0, 0); }
int ddp_clamp_(ddp_tensor *self, int has_lo, double lo, int has_hi, double hi) {
  clamp_bounds(has_lo, &lo, has_hi, &hi);
  return unary_inplace(self, DDP_EW_CLAMP, lo, hi);
}
int ddp_relu_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_RELU, 0, 0); }
int ddp_leaky_relu_(ddp_tensor *self, double negative_slope) {
  return unary_inplace(self, DDP_EW_LEAKY_RELU, negative_slope, 0);
}
int ddp_gelu_(ddp_tensor *self, int approximate_tanh) {
  return unary_inplace(self, approximate_tanh ? DDP_EW_GELU_TANH : DDP_EW_GELU, 0, 0);
}
int ddp_tanh_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_TANH, 0, 0); }
int ddp_sigmoid_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_SIGMOID, 0, 0); }
int ddp_silu_(ddp_tensor *self) { return unary_inplace(self, DDP_EW_SILU, 0, 0); }

/* ---- where ---------------------------------------------------------------------------- */

/* Saved slot 0 = cond. d(a) = cond ? g : 0, d(b) = cond ? 0 : g, summed to each shape. */
static int where_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  ddp_tensor *cond = ddp_node_saved(n, 0);
  if (!cond) return ddp_last_status();
  ddp_tensor vc;
  bcast_view(&vc, cond, g->ndim, g->shape);
  scalar_view sv;
  ddp_tensor *zero = make_scalar(&sv, 0, g->dtype, g->ndim, g->shape);
  for (int w = 0; w < 2; w++) {
    if (!wants_grad(n, w)) continue;
    ddp_tensor *d;
    DDP_TRY(ddp_tensor_empty(&d, g->ndim, g->shape, g->dtype, g->device));
    int status = run_where(d, &vc, w == 0 ? g : zero, w == 0 ? zero : g, "WhereBackward");
    if (status) return drop(&d, status);
    DDP_TRY(to_input(&gi[w], d, &n->inputs[w]));
  }
  return DDP_OK;
}

int ddp_where(ddp_tensor **out, ddp_tensor *cond, ddp_tensor *a, ddp_tensor *b) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(cond, "where", "condition"));
  DDP_TRY(ddp_check_alive(a, "where", "self"));
  DDP_TRY(ddp_check_alive(b, "where", "other"));
  ddp_tensor *ts[3] = {cond, a, b};
  static const char *const names[3] = {"condition", "self", "other"};
  DDP_TRY(check_devices("where", 3, ts, names, 0));
  if (cond->dtype != DDP_BOOL && cond->dtype != DDP_U8)
    DDP_FAIL(DDP_ERR_ARG, "where: the condition must be a bool tensor, got %s of shape %s",
             ddp_dtype_name(cond->dtype), DDP_SHAPE(cond));
  int64_t ab[DDP_MAX_DIMS], shape[DDP_MAX_DIMS];
  int nab = ddp_broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, ab);
  int nd = nab < 0 ? -1 : ddp_broadcast_shapes(cond->ndim, cond->shape, nab, ab, shape);
  if (nd < 0)
    DDP_FAIL(DDP_ERR_ARG, "where: the shapes %s (condition), %s and %s cannot be broadcast "
             "together", DDP_SHAPE(cond), DDP_SHAPE(a), DDP_SHAPE(b));
  int dt = promote_tensors(a, b);
  DDP_TRY(ddp_tensor_empty(out, nd, shape, dt, operands_device(3, ts)));
  ddp_tensor vc, va, vb;
  bcast_view(&vc, cond, nd, shape);
  bcast_view(&va, a, nd, shape);
  bcast_view(&vb, b, nd, shape);
  int status = run_where(*out, &vc, &va, &vb, "where");
  if (status) return drop(out, status);
  ddp_tensor *inputs[2] = {a, b};
  if (!ddp_autograd_needed(2, inputs) || !ddp_dtype_is_floating(dt)) return DDP_OK;
  ddp_node *n = ddp_node_new("WhereBackward", where_backward, 2, inputs, 1);
  if (!n) goto fail;
  if (ddp_node_save(n, 0, cond)) {
    ddp_node_release(n);
    goto fail;
  }
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
fail:
  ddp_tensor_release(*out);
  *out = NULL;
  return ddp_last_status();
}
