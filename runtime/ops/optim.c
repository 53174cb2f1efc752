/* runtime/ops/optim.c: front doors of the fused optimizer updates and of gradient clipping
 * (contracts in ddplua/optim.h): argument checks, operands made contiguous in the compute
 * dtype, the kernels run (on the CPU: backend/cpu/optim.c over the thread pool; on a device:
 * that device's kernel table, one call over the whole buffer), results written back.
 *
 * Note [optimizer devices]: a parameter, its gradient and its state live on one device
 * (checked; the error names both devices); the state is created by the front end on the
 * parameter's device (Optimizer.zeros_like) and work copies are made there too. Clipping
 * takes gradients on any mix of devices, as torch.nn.utils.clip_grad_norm_ does: each
 * gradient's |g|^p sum (or max) is computed on its own device and returned to the host,
 * where the total is formed, and the scaling runs on each gradient's device.
 *
 * Note [optimizer operands]: a kernel wants contiguous buffers of one dtype (f32 or f64).
 * Each tensor argument becomes an `operand`: the tensor itself when it already is such a
 * buffer (updated truly in place), else a contiguous copy in the compute dtype (f32 for
 * f16/bf16) that is copied back into the tensor after the kernel ran. The whole call runs
 * with grad mode off, as PyTorch's optimizers run under torch.no_grad(): nothing is
 * recorded and the parameter (a leaf that requires grad) may be written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/optim.h"
#include "backend/kernels.h"
#include "core/core.h"

enum {
  SGD_GRAIN = 1 << 15,   /* cheap element-wise work: ~32K elements per thread chunk */
  ADAM_GRAIN = 1 << 14,  /* a sqrt and a division per element */
  CLIP_BLOCK = 1 << 14,  /* elements per partial sum of the clipping norm */
};

/* ---- operands (Note [optimizer operands]) -------------------------------------------- */

typedef struct {
  ddp_tensor *orig; /* the caller's tensor (NULL: absent optional state) */
  ddp_tensor *work; /* contiguous, compute dtype; orig itself or a copy; owns a reference */
} operand;

/* The dtype kernels compute in for tensors of `dtype`, or -1 when there is none. */
static int compute_dtype(int dtype) {
  switch (dtype) {
  case DDP_F32: case DDP_F64: return dtype;
  case DDP_F16: case DDP_BF16: return DDP_F32;
  default: return -1;
  }
}

static int operand_open(operand *o, ddp_tensor *t, int dtype) {
  o->orig = t;
  o->work = NULL;
  if (!t) return DDP_OK;
  if (t->dtype == dtype && ddp_tensor_is_contiguous(t)) {
    ddp_tensor_retain(t);
    o->work = t;
    return DDP_OK;
  }
  DDP_TRY(ddp_tensor_empty(&o->work, t->ndim, t->shape, dtype, t->device));
  return ddp_copy_(o->work, t);
}

/* Write the result back when `written` (bumping the caller's tensor's version) and drop
 * the work reference. Safe on an operand that never opened. */
static int operand_close(operand *o, int written) {
  int status = DDP_OK;
  if (o->work && written) {
    if (o->work == o->orig) ddp_tensor_bump_version(o->orig);
    else status = ddp_copy_(o->orig, o->work);
  }
  ddp_tensor_release(o->work);
  o->work = NULL;
  return status;
}

static void *wptr(const operand *o) { return o->work ? ddp_data(o->work) : NULL; }

/* ---- checks ------------------------------------------------------------------------------ */

static int check_param(ddp_tensor *param, const char *op) {
  DDP_TRY(ddp_check_alive(param, op, "param"));
  if (compute_dtype(param->dtype) < 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: param has dtype %s; optimizers update floating tensors (f32, f64, "
             "f16, bf16)", op, ddp_dtype_name(param->dtype));
  return DDP_OK;
}

/* t (named `arg`) must be live with param's shape and dtype; NULL allowed unless `required`. */
static int check_like(ddp_tensor *t, ddp_tensor *param, const char *op, const char *arg,
                      int required) {
  if (!t) {
    if (required) DDP_FAIL(DDP_ERR_ARG, "%s: %s is required here but was not given", op, arg);
    return DDP_OK;
  }
  DDP_TRY(ddp_check_alive(t, op, arg));
  if (t->ndim != param->ndim || memcmp(t->shape, param->shape, sizeof(int64_t) * (size_t)t->ndim))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has shape %s but param has shape %s", op, arg, DDP_SHAPE(t),
             DDP_SHAPE(param));
  if (t->dtype != param->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s but param has dtype %s", op, arg,
             ddp_dtype_name(t->dtype), ddp_dtype_name(param->dtype));
  if (t->device != param->device)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s is on %s but param is on %s (a parameter, its gradient and "
             "its optimizer state must live on one device)", op, arg, ddp_device_str(t->device),
             ddp_device_str(param->device));
  if (ddp_tensor_shares_storage(t, param))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s shares its storage with param", op, arg);
  return DDP_OK;
}

static int check_nonneg(double v, const char *op, const char *name) {
  if (!(v >= 0)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid %s %g (must be >= 0)", op, name, v);
  return DDP_OK;
}

/* ---- the generic driver -------------------------------------------------------------------- */

enum { MAX_OPERANDS = 5 };

typedef struct {
  int kind;       /* which kernel */
  int dtype;      /* compute dtype */
  const void *h;  /* hyper-parameters */
  char *base[MAX_OPERANDS]; /* operand buffers in argument order (NULL: absent) */
} update_ctx;

enum { KIND_SGD, KIND_ADAM, KIND_ADADELTA };

/* Buffer k of ctx advanced to element `begin`. */
static void *at(const update_ctx *c, int k, int64_t begin) {
  if (!c->base[k]) return NULL;
  return c->base[k] + (size_t)begin * ddp_dtype_size(c->dtype);
}

static void update_range(void *vctx, int64_t begin, int64_t end) {
  const update_ctx *c = vctx;
  int64_t n = end - begin;
  int f64 = c->dtype == DDP_F64;
  switch (c->kind) {
  case KIND_SGD:
    if (f64) ddp_cpu_sgd_f64(at(c, 0, begin), at(c, 2, begin), at(c, 1, begin), n, c->h);
    else ddp_cpu_sgd_f32(at(c, 0, begin), at(c, 2, begin), at(c, 1, begin), n, c->h);
    break;
  case KIND_ADAM:
    if (f64) ddp_cpu_adam_f64(at(c, 0, begin), at(c, 2, begin), at(c, 3, begin), at(c, 4, begin),
                              at(c, 1, begin), n, c->h);
    else ddp_cpu_adam_f32(at(c, 0, begin), at(c, 2, begin), at(c, 3, begin), at(c, 4, begin),
                          at(c, 1, begin), n, c->h);
    break;
  case KIND_ADADELTA:
    if (f64) ddp_cpu_adadelta_f64(at(c, 0, begin), at(c, 2, begin), at(c, 3, begin),
                                  at(c, 1, begin), n, c->h);
    else ddp_cpu_adadelta_f32(at(c, 0, begin), at(c, 2, begin), at(c, 3, begin), at(c, 1, begin),
                              n, c->h);
    break;
  }
}

/* The update of ctx on a device: one call of the device table's kernel over the whole
 * buffers, then the device's pending error, if any (Note [optimizer devices]). */
static int update_device(const update_ctx *c, int device, int64_t n, const char *op) {
  const ddp_kernels *k = ddp_kernels_for(device);
  int f64 = c->dtype == DDP_F64;
  char *const *b = c->base;
  switch (c->kind) {
  case KIND_SGD:
    if (f64) {
      DDP_TRY(DDP_KERNEL_CHECK(k, sgd_f64, op));
      k->sgd_f64((double *)b[0], (double *)b[2], (const double *)b[1], n, c->h);
    } else {
      DDP_TRY(DDP_KERNEL_CHECK(k, sgd_f32, op));
      k->sgd_f32((float *)b[0], (float *)b[2], (const float *)b[1], n, c->h);
    }
    break;
  case KIND_ADAM:
    if (f64) {
      DDP_TRY(DDP_KERNEL_CHECK(k, adam_f64, op));
      k->adam_f64((double *)b[0], (double *)b[2], (double *)b[3], (double *)b[4],
                  (const double *)b[1], n, c->h);
    } else {
      DDP_TRY(DDP_KERNEL_CHECK(k, adam_f32, op));
      k->adam_f32((float *)b[0], (float *)b[2], (float *)b[3], (float *)b[4], (const float *)b[1],
                  n, c->h);
    }
    break;
  case KIND_ADADELTA:
    if (f64) {
      DDP_TRY(DDP_KERNEL_CHECK(k, adadelta_f64, op));
      k->adadelta_f64((double *)b[0], (double *)b[2], (double *)b[3], (const double *)b[1], n,
                      c->h);
    } else {
      DDP_TRY(DDP_KERNEL_CHECK(k, adadelta_f32, op));
      k->adadelta_f32((float *)b[0], (float *)b[2], (float *)b[3], (const float *)b[1], n, c->h);
    }
    break;
  }
  return ddp_device_check(device, op);
}

/* Run kernel `kind` over tensors[0] = param, tensors[1] = grad, tensors[2..n-1] = state
 * (already checked, all on param's device), all but the gradient written back. */
static int run_update(int kind, const void *h, int n, ddp_tensor **tensors, int64_t grain,
                      const char *op) {
  ddp_tensor *param = tensors[0];
  update_ctx c = {.kind = kind, .dtype = compute_dtype(param->dtype), .h = h};
  operand ops[MAX_OPERANDS] = {{0}};
  int prev = ddp_set_grad_enabled(0);
  int status = DDP_OK;
  if (param->device != DDP_DEVICE_CPU) { /* no kernel there: fail before any work copy */
    const ddp_kernels *k = ddp_kernels_for(param->device);
    status = kind == KIND_SGD ? DDP_KERNEL_CHECK(k, sgd_f32, op)
             : kind == KIND_ADAM ? DDP_KERNEL_CHECK(k, adam_f32, op)
                                 : DDP_KERNEL_CHECK(k, adadelta_f32, op);
  }
  for (int k = 0; k < n && !status; k++) {
    status = operand_open(&ops[k], tensors[k], c.dtype);
    c.base[k] = wptr(&ops[k]);
  }
  if (!status) {
    if (param->device == DDP_DEVICE_CPU) ddp_parallel_for(param->numel, grain, update_range, &c);
    else status = update_device(&c, param->device, param->numel, op);
  }
  for (int k = 0; k < n; k++) {
    int s = operand_close(&ops[k], !status && k != 1);
    if (!status) status = s;
  }
  ddp_set_grad_enabled(prev);
  return status;
}

/* ---- SGD ------------------------------------------------------------------------------------ */

int ddp_sgd_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *momentum_buffer, double lr,
                  double momentum, double dampening, double weight_decay, int nesterov,
                  int maximize, int first_step) {
  const char *op = "sgd_step_";
  DDP_TRY(check_param(param, op));
  DDP_TRY(check_like(grad, param, op, "grad", 1));
  DDP_TRY(check_nonneg(lr, op, "lr"));
  DDP_TRY(check_nonneg(momentum, op, "momentum"));
  DDP_TRY(check_nonneg(weight_decay, op, "weight_decay"));
  if (!isfinite(dampening)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid dampening %g", op, dampening);
  if (nesterov && (momentum <= 0 || dampening != 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: nesterov momentum requires a momentum > 0 and zero dampening "
             "(momentum %g, dampening %g)", op, momentum, dampening);
  DDP_TRY(check_like(momentum_buffer, param, op, "momentum_buffer", momentum != 0));
  ddp_sgd_hparams h = {lr, momentum, dampening, weight_decay, nesterov != 0, maximize != 0,
                       first_step != 0};
  ddp_tensor *tensors[3] = {param, grad, momentum != 0 ? momentum_buffer : NULL};
  return run_update(KIND_SGD, &h, 3, tensors, SGD_GRAIN, op);
}

/* ---- Adam and AdamW -------------------------------------------------------------------------- */

static int adam_common(const char *op, int decoupled, ddp_tensor *param, ddp_tensor *grad,
                       ddp_tensor *exp_avg, ddp_tensor *exp_avg_sq, ddp_tensor *max_exp_avg_sq,
                       int64_t step, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int amsgrad, int maximize) {
  DDP_TRY(check_param(param, op));
  DDP_TRY(check_like(grad, param, op, "grad", 1));
  DDP_TRY(check_like(exp_avg, param, op, "exp_avg", 1));
  DDP_TRY(check_like(exp_avg_sq, param, op, "exp_avg_sq", 1));
  DDP_TRY(check_like(max_exp_avg_sq, param, op, "max_exp_avg_sq", amsgrad));
  if (step < 1) DDP_FAIL(DDP_ERR_ARG, "%s: step must be >= 1 (it counts this update), got %lld",
                         op, (long long)step);
  DDP_TRY(check_nonneg(lr, op, "lr"));
  DDP_TRY(check_nonneg(eps, op, "eps"));
  DDP_TRY(check_nonneg(weight_decay, op, "weight_decay"));
  if (!(beta1 >= 0 && beta1 < 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid beta parameter at index 0: %g (betas must be in [0, 1))",
             op, beta1);
  if (!(beta2 >= 0 && beta2 < 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid beta parameter at index 1: %g (betas must be in [0, 1))",
             op, beta2);
  double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  ddp_adam_hparams h = {
      .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay,
      .step_size = lr / bc1, .bc2_sqrt = sqrt(bc2), .decoupled = decoupled,
      .amsgrad = amsgrad != 0, .maximize = maximize != 0};
  ddp_tensor *tensors[5] = {param, grad, exp_avg, exp_avg_sq, amsgrad ? max_exp_avg_sq : NULL};
  return run_update(KIND_ADAM, &h, 5, tensors, ADAM_GRAIN, op);
}

int ddp_adam_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *exp_avg,
                   ddp_tensor *exp_avg_sq, ddp_tensor *max_exp_avg_sq, int64_t step, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int amsgrad,
                   int maximize) {
  return adam_common("adam_step_", 0, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr,
                     beta1, beta2, eps, weight_decay, amsgrad, maximize);
}

int ddp_adamw_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *exp_avg,
                    ddp_tensor *exp_avg_sq, ddp_tensor *max_exp_avg_sq, int64_t step, double lr,
                    double beta1, double beta2, double eps, double weight_decay, int amsgrad,
                    int maximize) {
  return adam_common("adamw_step_", 1, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step,
                     lr, beta1, beta2, eps, weight_decay, amsgrad, maximize);
}

/* ---- Adadelta -------------------------------------------------------------------------------- */

int ddp_adadelta_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *square_avg,
                       ddp_tensor *acc_delta, double lr, double rho, double eps,
                       double weight_decay, int maximize) {
  const char *op = "adadelta_step_";
  DDP_TRY(check_param(param, op));
  DDP_TRY(check_like(grad, param, op, "grad", 1));
  DDP_TRY(check_like(square_avg, param, op, "square_avg", 1));
  DDP_TRY(check_like(acc_delta, param, op, "acc_delta", 1));
  DDP_TRY(check_nonneg(lr, op, "lr"));
  DDP_TRY(check_nonneg(eps, op, "eps"));
  DDP_TRY(check_nonneg(weight_decay, op, "weight_decay"));
  if (!(rho >= 0 && rho <= 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid rho %g (must be in [0, 1])", op, rho);
  ddp_adadelta_hparams h = {lr, rho, eps, weight_decay, maximize != 0};
  ddp_tensor *tensors[4] = {param, grad, square_avg, acc_delta};
  return run_update(KIND_ADADELTA, &h, 4, tensors, ADAM_GRAIN, op);
}

/* ---- clipping -------------------------------------------------------------------------------- */

static int check_grads(ddp_tensor **grads, int n, const char *op) {
  if (n < 0) DDP_FAIL(DDP_ERR_ARG, "%s: negative gradient count %d", op, n);
  if (n > 0 && !grads) DDP_FAIL(DDP_ERR_ARG, "%s: grads is NULL", op);
  for (int i = 0; i < n; i++) {
    char arg[32];
    snprintf(arg, sizeof arg, "grads[%d]", i);
    if (!grads[i]) DDP_FAIL(DDP_ERR_ARG, "%s: %s is NULL", op, arg);
    DDP_TRY(ddp_check_alive(grads[i], op, arg));
    if (compute_dtype(grads[i]->dtype) < 0)
      DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s; gradients are floating (f32, f64, f16, bf16)",
               op, arg, ddp_dtype_name(grads[i]->dtype));
  }
  return DDP_OK;
}

typedef struct {
  const char *data;
  int dtype;
  int64_t n;
  double p;     /* norm order; INFINITY: max |x| */
  double *partial; /* one per block */
} norm_ctx;

static void norm_blocks(void *vctx, int64_t begin, int64_t end) {
  const norm_ctx *c = vctx;
  size_t es = ddp_dtype_size(c->dtype);
  for (int64_t b = begin; b < end; b++) {
    int64_t lo = b * CLIP_BLOCK, len = c->n - lo < CLIP_BLOCK ? c->n - lo : CLIP_BLOCK;
    const void *x = c->data + (size_t)lo * es;
    if (isinf(c->p))
      c->partial[b] = c->dtype == DDP_F64 ? ddp_cpu_abs_max_f64(x, len) : ddp_cpu_abs_max_f32(x, len);
    else
      c->partial[b] = c->dtype == DDP_F64 ? ddp_cpu_abs_pow_sum_f64(x, len, c->p)
                                          : ddp_cpu_abs_pow_sum_f32(x, len, c->p);
  }
}

/* norm_reduce on a device: one call of the device's reduction, which returns the host
 * double (synchronously). Such a kernel cannot return a status: on a failure it records the
 * error and returns NaN, so the error is cleared first and looked at when NaN comes back. */
static int norm_reduce_device(double *out, const ddp_tensor *t, double p) {
  const char *op = "clip_grad_norm_";
  const ddp_kernels *k = ddp_kernels_for(t->device);
  int f64 = t->dtype == DDP_F64, inf = isinf(p);
  if (inf) DDP_TRY(f64 ? DDP_KERNEL_CHECK(k, abs_max_f64, op) : DDP_KERNEL_CHECK(k, abs_max_f32, op));
  else DDP_TRY(f64 ? DDP_KERNEL_CHECK(k, abs_pow_sum_f64, op)
                   : DDP_KERNEL_CHECK(k, abs_pow_sum_f32, op));
  ddp_clear_error();
  const void *x = ddp_data(t);
  double r = inf ? (f64 ? k->abs_max_f64(x, t->numel) : k->abs_max_f32(x, t->numel))
                 : (f64 ? k->abs_pow_sum_f64(x, t->numel, p) : k->abs_pow_sum_f32(x, t->numel, p));
  DDP_TRY(ddp_device_check(t->device, op));
  if (r != r && ddp_last_status() != DDP_OK) return ddp_last_status();
  *out = r;
  return DDP_OK;
}

/* Sum of |x|^p (or max |x| for p = inf) over a contiguous buffer, from fixed-size blocks so
 * the result does not depend on the thread count. */
static int norm_reduce(double *out, const ddp_tensor *t, double p) {
  if (t->device != DDP_DEVICE_CPU) return norm_reduce_device(out, t, p);
  int64_t nblocks = (t->numel + CLIP_BLOCK - 1) / CLIP_BLOCK;
  double *partial = malloc(sizeof(double) * (size_t)(nblocks > 0 ? nblocks : 1));
  if (!partial) DDP_FAIL(DDP_ERR_MEMORY, "clip_grad_norm_: out of memory");
  norm_ctx c = {ddp_data(t), t->dtype, t->numel, p, partial};
  ddp_parallel_for(nblocks, 2, norm_blocks, &c);
  double acc = 0;
  for (int64_t b = 0; b < nblocks; b++) {
    if (isinf(p)) acc = (partial[b] > acc || partial[b] != partial[b]) ? partial[b] : acc;
    else acc += partial[b];
  }
  free(partial);
  *out = acc;
  return DDP_OK;
}

typedef struct { char *data; int dtype; double s, lo, hi; int clamp; } elemt_ctx;

static void elemt_range(void *vctx, int64_t begin, int64_t end) {
  const elemt_ctx *c = vctx;
  void *x = c->data + (size_t)begin * ddp_dtype_size(c->dtype);
  int64_t n = end - begin;
  if (c->clamp) {
    if (c->dtype == DDP_F64) ddp_cpu_clamp_f64(x, n, c->lo, c->hi);
    else ddp_cpu_clamp_f32(x, n, c->lo, c->hi);
  } else {
    if (c->dtype == DDP_F64) ddp_cpu_scale_f64(x, n, c->s);
    else ddp_cpu_scale_f32(x, n, c->s);
  }
}

/* elemt_range on a device tensor x (contiguous, f32 or f64): one call of its table. */
static int elemt_device(ddp_tensor *x, int clamp, double s, double lo, double hi) {
  const char *op = clamp ? "clip_grad_value_" : "clip_grad_norm_";
  const ddp_kernels *k = ddp_kernels_for(x->device);
  int f64 = x->dtype == DDP_F64;
  void *d = ddp_data(x);
  if (clamp) {
    DDP_TRY(f64 ? DDP_KERNEL_CHECK(k, clamp_f64, op) : DDP_KERNEL_CHECK(k, clamp_f32, op));
    if (f64) k->clamp_f64(d, x->numel, lo, hi);
    else k->clamp_f32(d, x->numel, lo, hi);
  } else {
    DDP_TRY(f64 ? DDP_KERNEL_CHECK(k, scale_f64, op) : DDP_KERNEL_CHECK(k, scale_f32, op));
    if (f64) k->scale_f64(d, x->numel, s);
    else k->scale_f32(d, x->numel, s);
  }
  return ddp_device_check(x->device, op);
}

/* Scale (clamp == 0) or clamp every gradient in place through its operand. */
static int elemt_all(ddp_tensor **grads, int n, int clamp, double s, double lo, double hi) {
  int prev = ddp_set_grad_enabled(0);
  int status = DDP_OK;
  for (int i = 0; i < n && !status; i++) {
    operand o;
    status = operand_open(&o, grads[i], compute_dtype(grads[i]->dtype));
    if (!status && o.work->device != DDP_DEVICE_CPU)
      status = elemt_device(o.work, clamp, s, lo, hi);
    else if (!status) {
      elemt_ctx c = {ddp_data(o.work), o.work->dtype, s, lo, hi, clamp};
      ddp_parallel_for(o.work->numel, SGD_GRAIN, elemt_range, &c);
    }
    int s2 = operand_close(&o, !status);
    if (!status) status = s2;
  }
  ddp_set_grad_enabled(prev);
  return status;
}

int ddp_clip_grad_norm_(double *total_norm, ddp_tensor **grads, int n, double max_norm,
                        double norm_type, int error_if_nonfinite) {
  const char *op = "clip_grad_norm_";
  if (!total_norm) DDP_FAIL(DDP_ERR_ARG, "%s: total_norm is NULL", op);
  *total_norm = 0;
  if (!(norm_type > 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid norm_type %g (must be > 0 or inf)", op, norm_type);
  DDP_TRY(check_grads(grads, n, op));
  int inf = isinf(norm_type);
  double acc = 0;
  int prev = ddp_set_grad_enabled(0);
  int status = DDP_OK;
  for (int i = 0; i < n && !status; i++) {
    operand o;
    double part = 0;
    status = operand_open(&o, grads[i], compute_dtype(grads[i]->dtype));
    if (!status) status = norm_reduce(&part, o.work, norm_type);
    operand_close(&o, 0);
    if (inf) acc = (part > acc || part != part) ? part : acc;
    else acc += part;
  }
  ddp_set_grad_enabled(prev);
  DDP_TRY(status);
  double total = inf ? acc : (norm_type == 2 ? sqrt(acc) : pow(acc, 1.0 / norm_type));
  *total_norm = total;
  if (error_if_nonfinite && !isfinite(total))
    DDP_FAIL(DDP_ERR_ARG, "%s: the total norm of order %g for gradients is non-finite (%g), so "
             "it cannot be clipped", op, norm_type, total);
  /* PyTorch: clip_coef = max_norm / (total + 1e-6), clamped to at most 1, multiplied in. */
  double coef = max_norm / (total + 1e-6);
  if (coef >= 1.0) return DDP_OK; /* scaling by 1 would change nothing */
  return elemt_all(grads, n, 0, coef, 0, 0);
}

int ddp_clip_grad_value_(ddp_tensor **grads, int n, double clip_value) {
  const char *op = "clip_grad_value_";
  if (!(clip_value >= 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: invalid clip_value %g (must be >= 0)", op, clip_value);
  DDP_TRY(check_grads(grads, n, op));
  return elemt_all(grads, n, 1, 0, -clip_value, clip_value);
}
