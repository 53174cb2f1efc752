/* runtime/ops/optim.c: front doors of the fused optimizer updates and of gradient clipping
 * (contracts in ddplua/optim.h): argument checks, operands made contiguous in the compute
 * dtype, the kernel run (one call of the device's kernel table over the whole buffers; the
 * CPU's splits the work over the thread pool itself), results written back.
 *
 * Note [optimizer devices]: a parameter, its gradient and its state live on one device
 * (checked; the error names both devices); the state is created on the parameter's device
 * (by ddp_optim_step_param, runtime/ops/optim_state.c) and work copies are made there too. Clipping
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

#include "backend/kernels.h"
#include "core/core.h"

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

/* The update of ctx: one call of the device table's kernel over the whole buffers, then the
 * device's pending error, if any (Note [optimizer devices]). */
static int update_run(const update_ctx *c, const ddp_kernels *k, int device, int64_t n,
                      const char *op) {
  char *const *b = c->base;
  switch (c->kind) {
  case KIND_SGD: k->sgd(c->dtype, b[0], b[2], b[1], n, c->h); break;
  case KIND_ADAM: k->adam(c->dtype, b[0], b[2], b[3], b[4], b[1], n, c->h); break;
  case KIND_ADADELTA: k->adadelta(c->dtype, b[0], b[2], b[3], b[1], n, c->h); break;
  }
  return ddp_device_check(device, op);
}

/* Run kernel `kind` over tensors[0] = param, tensors[1] = grad, tensors[2..n-1] = state
 * (already checked, all on param's device), all but the gradient written back. */
static int run_update(int kind, const void *h, int n, ddp_tensor **tensors, const char *op) {
  ddp_tensor *param = tensors[0];
  update_ctx c = {.kind = kind, .dtype = compute_dtype(param->dtype), .h = h};
  operand ops[MAX_OPERANDS] = {{0}};
  int prev = ddp_set_grad_enabled(0);
  /* no kernel there: fail before any work copy */
  const ddp_kernels *k = ddp_kernels_for(param->device);
  int status = kind == KIND_SGD ? DDP_KERNEL_CHECK(k, sgd, op)
               : kind == KIND_ADAM ? DDP_KERNEL_CHECK(k, adam, op)
                                   : DDP_KERNEL_CHECK(k, adadelta, op);
  for (int k = 0; k < n && !status; k++) {
    status = operand_open(&ops[k], tensors[k], c.dtype);
    c.base[k] = wptr(&ops[k]);
  }
  if (!status) status = update_run(&c, k, param->device, param->numel, op);
  for (int k = 0; k < n; k++) {
    int s = operand_close(&ops[k], !status && k != 1);
    if (!status) status = s;
  }
  ddp_set_grad_enabled(prev);
  return status;
}

/* ---- SGD ------------------------------------------------------------------------------------ */

/* The hyper-parameters' checks shared by ddp_sgd_step_ and ddp_sgd_step_foreach_. */
static int check_sgd_hparams(const char *op, double lr, double momentum, double dampening,
                             double weight_decay, int nesterov) {
  DDP_TRY(check_nonneg(lr, op, "lr"));
  DDP_TRY(check_nonneg(momentum, op, "momentum"));
  DDP_TRY(check_nonneg(weight_decay, op, "weight_decay"));
  if (!isfinite(dampening)) DDP_FAIL(DDP_ERR_ARG, "%s: invalid dampening %g", op, dampening);
  if (nesterov && (momentum <= 0 || dampening != 0))
    DDP_FAIL(DDP_ERR_ARG, "%s: nesterov momentum requires a momentum > 0 and zero dampening "
             "(momentum %g, dampening %g)", op, momentum, dampening);
  return DDP_OK;
}

int ddp_sgd_step_(ddp_tensor *param, ddp_tensor *grad, ddp_tensor *momentum_buffer, double lr,
                  double momentum, double dampening, double weight_decay, int nesterov,
                  int maximize, int first_step) {
  const char *op = "sgd_step_";
  DDP_TRY(check_param(param, op));
  DDP_TRY(check_like(grad, param, op, "grad", 1));
  DDP_TRY(check_sgd_hparams(op, lr, momentum, dampening, weight_decay, nesterov));
  DDP_TRY(check_like(momentum_buffer, param, op, "momentum_buffer", momentum != 0));
  ddp_sgd_hparams h = {lr, momentum, dampening, weight_decay, nesterov != 0, maximize != 0,
                       first_step != 0};
  ddp_tensor *tensors[3] = {param, grad, momentum != 0 ? momentum_buffer : NULL};
  return run_update(KIND_SGD, &h, 3, tensors, op);
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;
  return x < y ? -1 : x > y;
}

/* 1 when no two parameters of the list share a storage (then the pieces of one job never
 * write the same element). */
static int storages_distinct(int64_t n, ddp_tensor *const *param) {
  enum { ON_STACK = 64 };
  void *stack[ON_STACK], **st = n <= ON_STACK ? stack : malloc(sizeof(void *) * (size_t)n);
  if (!st) return 0;
  for (int64_t i = 0; i < n; i++) st[i] = param[i]->storage;
  qsort(st, (size_t)n, sizeof(void *), cmp_ptr);
  int distinct = 1;
  for (int64_t i = 1; i < n && distinct; i++) distinct = st[i] != st[i - 1];
  if (st != stack) free(st);
  return distinct;
}

/* The one-call path of ddp_sgd_step_foreach_ applies: every tensor on the CPU (whose
 * table has sgd_multi), contiguous, of param[0]'s dtype, f32 or f64, and the parameters'
 * storages distinct (a parameter listed twice is stepped twice, one step after the other,
 * by the per-parameter path). */
static int foreach_direct(int64_t n, ddp_tensor *const *param, ddp_tensor *const *grad,
                          ddp_tensor *const *buf, const ddp_kernels **k) {
  *k = ddp_kernels_for(param[0]->device);
  if (!(*k)->sgd_multi) return 0;
  int dtype = param[0]->dtype;
  if (dtype != DDP_F32 && dtype != DDP_F64) return 0;
  for (int64_t i = 0; i < n; i++) {
    ddp_tensor *ts[3] = {param[i], grad[i], buf ? buf[i] : NULL};
    for (int j = 0; j < 3; j++)
      if (ts[j] && (ts[j]->device != param[0]->device || ts[j]->dtype != dtype ||
                    !ddp_tensor_is_contiguous(ts[j])))
        return 0;
  }
  return storages_distinct(n, param);
}

int ddp_sgd_step_foreach_(int64_t n, ddp_tensor *const *param, ddp_tensor *const *grad,
                          ddp_tensor *const *momentum_buffer, const int *first_step, double lr,
                          double momentum, double dampening, double weight_decay, int nesterov,
                          int maximize) {
  const char *op = "sgd_step_foreach_";
  if (n < 0) DDP_FAIL(DDP_ERR_ARG, "%s: n must be >= 0, got %lld", op, (long long)n);
  if (n > 0 && (!param || !grad || !first_step))
    DDP_FAIL(DDP_ERR_ARG, "%s: the %s list is NULL", op, !param ? "param" : !grad ? "grad" : "first_step");
  if (n > 0 && momentum != 0 && !momentum_buffer)
    DDP_FAIL(DDP_ERR_ARG, "%s: the momentum_buffer list is NULL but momentum is %g", op, momentum);
  DDP_TRY(check_sgd_hparams(op, lr, momentum, dampening, weight_decay, nesterov));
  if (n == 0) return DDP_OK;
  /* every argument checked before any parameter changes */
  for (int64_t i = 0; i < n; i++) {
    char what[48];
    if (!param[i]) DDP_FAIL(DDP_ERR_ARG, "%s: param[%lld] is NULL", op, (long long)i);
    DDP_TRY(check_param(param[i], op));
    snprintf(what, sizeof what, "grad[%lld]", (long long)i);
    DDP_TRY(check_like(grad[i], param[i], op, what, 1));
    snprintf(what, sizeof what, "momentum_buffer[%lld]", (long long)i);
    DDP_TRY(check_like(momentum != 0 ? momentum_buffer[i] : NULL, param[i], op, what,
                       momentum != 0));
  }
  ddp_tensor *const *buf = momentum != 0 ? momentum_buffer : NULL; /* NULL: none */
  const ddp_kernels *k = NULL;
  if (!foreach_direct(n, param, grad, buf, &k)) { /* another device, dtype or layout: the per-parameter step, same results */
    for (int64_t i = 0; i < n; i++)
      DDP_TRY(ddp_sgd_step_(param[i], grad[i], momentum != 0 ? momentum_buffer[i] : NULL, lr,
                            momentum, dampening, weight_decay, nesterov, maximize, first_step[i]));
    return DDP_OK;
  }
  enum { ON_STACK = 64 };
  void *stack_ptrs[3 * ON_STACK], **ptrs = stack_ptrs;
  int64_t stack_numel[ON_STACK], *numel = stack_numel;
  if (n > ON_STACK) {
    ptrs = malloc(sizeof(void *) * 3 * (size_t)n);
    numel = malloc(sizeof(int64_t) * (size_t)n);
    if (!ptrs || !numel) {
      if (ptrs != stack_ptrs) free(ptrs);
      if (numel != stack_numel) free(numel);
      DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory for %lld parameters", op, (long long)n);
    }
  }
  void **pp = ptrs, **pb = ptrs + n, **pg = ptrs + 2 * n;
  for (int64_t i = 0; i < n; i++) {
    pp[i] = ddp_data(param[i]);
    pb[i] = buf ? ddp_data(buf[i]) : NULL;
    pg[i] = ddp_data(grad[i]);
    numel[i] = param[i]->numel;
  }
  ddp_sgd_hparams h = {lr, momentum, dampening, weight_decay, nesterov != 0, maximize != 0, 0};
  k->sgd_multi(param[0]->dtype, n, pp, pb, (const void *const *)pg, numel, first_step, &h);
  for (int64_t i = 0; i < n; i++) {
    ddp_tensor_bump_version(param[i]);
    if (buf) ddp_tensor_bump_version(buf[i]);
  }
  if (ptrs != stack_ptrs) free(ptrs);
  if (numel != stack_numel) free(numel);
  return ddp_device_check(param[0]->device, op);
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
  return run_update(KIND_ADAM, &h, 5, tensors, op);
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
  return run_update(KIND_ADADELTA, &h, 4, tensors, op);
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

/* Sum of |x|^p (or max |x| for p = inf) over a contiguous tensor, by one call of its device's
 * table, which returns the host double (synchronously; the CPU's adds fixed-size blocks so
 * the result does not depend on the thread count). Such a kernel cannot return a status: on
 * a failure it records the error and returns NaN, so the error is cleared first and looked
 * at when NaN comes back. */
static int norm_reduce(double *out, const ddp_tensor *t, double p) {
  const char *op = "clip_grad_norm_";
  const ddp_kernels *k = ddp_kernels_for(t->device);
  int inf = isinf(p);
  DDP_TRY(inf ? DDP_KERNEL_CHECK(k, abs_max, op) : DDP_KERNEL_CHECK(k, abs_pow_sum, op));
  ddp_clear_error();
  const void *x = ddp_data(t);
  double r = inf ? k->abs_max(t->dtype, x, t->numel) : k->abs_pow_sum(t->dtype, x, t->numel, p);
  DDP_TRY(ddp_device_check(t->device, op));
  if (r != r && ddp_last_status() != DDP_OK) return ddp_last_status();
  *out = r;
  return DDP_OK;
}

/* Scale (clamp == 0) or clamp contiguous x (f32 or f64) in place: one call of its table. */
static int elemt_run(ddp_tensor *x, int clamp, double s, double lo, double hi) {
  const char *op = clamp ? "clip_grad_value_" : "clip_grad_norm_";
  const ddp_kernels *k = ddp_kernels_for(x->device);
  void *d = ddp_data(x);
  if (clamp) {
    DDP_TRY(DDP_KERNEL_CHECK(k, clamp, op));
    k->clamp(x->dtype, d, x->numel, lo, hi);
  } else {
    DDP_TRY(DDP_KERNEL_CHECK(k, scale, op));
    k->scale(x->dtype, d, x->numel, s);
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
    if (!status) status = elemt_run(o.work, clamp, s, lo, hi);
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

/* ---- GradScaler ------------------------------------------------------------------------------ */

/* One gradient (contiguous, f32 or f64) unscaled by one call of its device's table. Like the
 * norms, the kernel returns a host double and reports a failure as NaN with the error set. */
static int unscale_run(int *found, ddp_tensor *x, double inv_scale) {
  const char *op = "unscale_";
  const ddp_kernels *k = ddp_kernels_for(x->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, non_finite_check_and_unscale, op));
  ddp_clear_error();
  double r = k->non_finite_check_and_unscale(x->dtype, ddp_data(x), x->numel, inv_scale);
  DDP_TRY(ddp_device_check(x->device, op));
  if (r != r) {
    if (ddp_last_status() != DDP_OK) return ddp_last_status();
    DDP_FAIL(DDP_ERR_STATE, "%s: the kernel failed without a message", op);
  }
  *found = r != 0;
  return DDP_OK;
}

int ddp_amp_unscale_(int *found_inf, ddp_tensor **grads, int n, double inv_scale) {
  const char *op = "unscale_";
  if (!found_inf) DDP_FAIL(DDP_ERR_ARG, "%s: found_inf is NULL", op);
  *found_inf = 0;
  if (!isfinite(inv_scale))
    DDP_FAIL(DDP_ERR_ARG, "%s: inv_scale must be finite, got %g", op, inv_scale);
  DDP_TRY(check_grads(grads, n, op));
  int prev = ddp_set_grad_enabled(0);
  int status = DDP_OK;
  for (int i = 0; i < n && !status; i++) {
    operand o;
    int found = 0;
    status = operand_open(&o, grads[i], compute_dtype(grads[i]->dtype));
    if (!status) status = unscale_run(&found, o.work, inv_scale);
    int s2 = operand_close(&o, !status);
    if (!status) status = s2;
    *found_inf |= found;
  }
  ddp_set_grad_enabled(prev);
  return status;
}
