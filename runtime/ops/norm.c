/* runtime/ops/norm.c: front doors of batch norm, layer norm, dropout and embedding (see
 * ddplua/ops_norm.h for the contracts): argument checks, dtype and device dispatch to the
 * norm kernels of the input's device (runtime/backend/kernels.h: backend/cpu/norm.c or
 * backend/cuda/norm.cu), autograd recording and the backward functions. Every tensor
 * argument must be on one device; outputs, statistics and scratch are made there.
 *
 * Half types (f16, bf16) run through f32: the front door converts with the differentiable
 * ddp_to_dtype, calls itself in f32 and converts back, so the graph gets ToCopy nodes
 * around the f32 node. Per-channel and per-row statistics are computed in double. */
#include <math.h>
#include <stdlib.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/copy.h"
#include "ops/autocast.h"

/* ---- helpers --------------------------------------------------------------------------- */

/* Element address of t as void * (kernels take typed pointers). */
static void *dptr(const ddp_tensor *t) { return ddp_data(t); }

static int is_half(int dtype) { return dtype == DDP_F16 || dtype == DDP_BF16; }

/* 1 when backward must produce a gradient for input i of node n. */
static int wanted(const ddp_node *n, int i) { return n->edges[i].fn || n->edges[i].leaf; }

/* Release up to 8 tensors (NULLs allowed). */
static void release_all(ddp_tensor **ts, int n) {
  for (int i = 0; i < n; i++) ddp_tensor_release(ts[i]);
}

/* out = t converted to dtype with autograd (NULL stays NULL). */
static int to_dtype_opt(ddp_tensor **out, ddp_tensor *t, int dtype) {
  *out = NULL;
  if (!t) return DDP_OK;
  return ddp_to_dtype(out, t, dtype);
}

/* Run a computation made for f32 on a half tensor: *out = back_to_half(fn(f32 output)).
 * Shared tail of the half paths: converts result32 to dtype and drops result32. */
static int back_to(ddp_tensor **out, ddp_tensor *result32, int dtype) {
  int status = ddp_to_dtype(out, result32, dtype);
  ddp_tensor_release(result32);
  return status;
}

/* The dtype a weight or bias t of a normalisation must have for `input`: input's, or f32
 * for a half input with f32 parameters, which the half paths below compute in f32 anyway
 * (PyTorch's CPU kernels take that mix too; autocast leaves these ops' inputs as they are
 * on the CPU: Note [autocast policy] in runtime/ops/autocast.c). */
static int param_dtype_for(const ddp_tensor *input, const ddp_tensor *t) {
  return t && is_half(input->dtype) && t->dtype == DDP_F32 ? DDP_F32 : input->dtype;
}

/* ---- batch norm -------------------------------------------------------------------------- */

/* Check a per-channel tensor of op: NULL, or 1-d of size C (and dtype `dtype` unless -1). */
static int check_channel_arg_of(const char *op, const ddp_tensor *t, const char *arg, int64_t C,
                                int dtype, const ddp_tensor *input) {
  if (!t) return DDP_OK;
  DDP_TRY(ddp_check_alive(t, op, arg));
  if (t->ndim != 1 || t->shape[0] != C)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s of shape %s does not match the %lld channels (dim 2) of input %s",
             op, arg, DDP_SHAPE(t), (long long)C, DDP_SHAPE(input));
  if (dtype >= 0 && t->dtype != dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s but input has dtype %s", op, arg,
             ddp_dtype_name(t->dtype), ddp_dtype_name(dtype));
  if (!ddp_dtype_is_floating(t->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s must be floating, got %s", op, arg, ddp_dtype_name(t->dtype));
  return DDP_OK;
}

/* 1 when a and b have the same shape. */
static int same_shape_as(const ddp_tensor *a, const ddp_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* Check input (N, C, *): rank >= 2 and floating; returns C, and N and S (spatial size). */
static int check_bn_input(const ddp_tensor *input, const char *op, int64_t *N, int64_t *C,
                          int64_t *S) {
  DDP_TRY(ddp_check_alive(input, op, "input"));
  if (input->ndim < 2)
    DDP_FAIL(DDP_ERR_ARG, "%s: input must be (N, C) or (N, C, *) with at least 2 dimensions, got %s",
             op, DDP_SHAPE(input));
  if (!ddp_dtype_is_floating(input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: input must be floating, got %s", op, ddp_dtype_name(input->dtype));
  *N = input->shape[0];
  *C = input->shape[1];
  *S = 1;
  for (int d = 2; d < input->ndim; d++) *S *= input->shape[d];
  return DDP_OK;
}

/* A new 1-d tensor of C elements of dtype on device (uninitialised). */
static int channel_empty(ddp_tensor **out, int64_t C, int dtype, int device) {
  return ddp_tensor_empty(out, 1, &C, dtype, device);
}

/* The kernel table of device with every batch-norm entry the op uses, or an error naming op. */
static int bn_kernels(const ddp_kernels **out, int device, const char *op) {
  const ddp_kernels *k = ddp_kernels_for(device);
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_moments, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_sums, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_apply, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_finalize, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_running_update, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_backward_reduce, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_backward_elemt, op));
  DDP_TRY(DDP_KERNEL_CHECK(k, bn_backward_coef, op));
  *out = k;
  return DDP_OK;
}

/* Per-channel mean and biased variance of a contiguous f32/f64 input x into mean, var:
 * new (C) f64 tensors on x's device. */
static int bn_moments(ddp_tensor **mean, ddp_tensor **var, const ddp_kernels *k,
                      const ddp_tensor *x, int64_t N, int64_t C, int64_t S) {
  *mean = *var = NULL;
  int status = channel_empty(mean, C, DDP_F64, x->device);
  if (!status) status = channel_empty(var, C, DDP_F64, x->device);
  if (status) {
    ddp_tensor_release(*mean);
    *mean = NULL;
    return status;
  }
  k->bn_moments(x->dtype, dptr(*mean), dptr(*var), dptr(x), N, C, S);
  status = ddp_device_check(x->device, "batch_norm");
  if (status) {
    ddp_tensor_release(*mean);
    ddp_tensor_release(*var);
    *mean = *var = NULL;
  }
  return status;
}

/* Saved slots of BatchNormBackward and BatchNormReluBackward; for the ReLU's mask the fused
 * node also saves, with a residual, the mask's bits (f32, spatial size a multiple of 8) or
 * else its output, and without one the per-channel scale and shift (the mask is recomputed
 * from x). iattr[0] training, iattr[1] has weight, iattr[2] fused ReLU, iattr[3] with a
 * residual, iattr[4] mask bits saved (Note [fused batch norm relu]). */
enum { BN_INPUT, BN_WEIGHT, BN_MEAN, BN_INVSTD, BN_OUTPUT, BN_SCALE, BN_SHIFT, BN_MASK, BN_SAVED };

/* Every per-channel value (statistics, coefficients) lives in a small tensor on the
 * input's device and is computed there by the bn_* kernels, so the batch norm of a device
 * tensor never waits for the device (Note [device batch norm]). */
static int batch_norm_backward(ddp_node *n, ddp_tensor *grad, ddp_tensor **gi) {
  ddp_tensor *x0 = ddp_node_saved(n, BN_INPUT);
  ddp_tensor *w0 = n->iattr[1] ? ddp_node_saved(n, BN_WEIGHT) : NULL;
  ddp_tensor *mean = ddp_node_saved(n, BN_MEAN), *invstd = ddp_node_saved(n, BN_INVSTD);
  int relu = (int)n->iattr[2], has_res = relu && n->iattr[3], has_bits = has_res && n->iattr[4];
  ddp_tensor *y = has_res && !has_bits ? ddp_node_saved(n, BN_OUTPUT) : NULL;
  ddp_tensor *bits = has_bits ? ddp_node_saved(n, BN_MASK) : NULL;
  ddp_tensor *scale = relu && !has_res ? ddp_node_saved(n, BN_SCALE) : NULL;
  ddp_tensor *shift = relu && !has_res ? ddp_node_saved(n, BN_SHIFT) : NULL;
  if (!x0 || (n->iattr[1] && !w0) || !mean || !invstd || (has_res && !y && !bits) ||
      (relu && !has_res && (!scale || !shift)))
    return ddp_last_status();
  int dt = n->inputs[0].dtype, training = (int)n->iattr[0], dev = x0->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "BatchNormBackward"));
  /* x, g, w, sum_dy, sum_dy_xmu, a, b, d */
  ddp_tensor *tmp[8] = {0};
  int status;
  if ((status = ddp_detached_as(&tmp[0], x0, dt)) || (status = ddp_detached_as(&tmp[1], grad, dt)) ||
      (w0 && (status = ddp_detached_as(&tmp[2], w0, dt))))
    goto done;
  ddp_tensor *x = tmp[0], *g = tmp[1];
  int64_t N = x->shape[0], C = x->shape[1], S = 1;
  for (int d = 2; d < x->ndim; d++) S *= x->shape[d];
  double M = (double)N * (double)S;
  if ((status = channel_empty(&tmp[3], C, DDP_F64, dev)) ||
      (status = channel_empty(&tmp[4], C, DDP_F64, dev)))
    goto done;
  /* the fused backward writes dx (no zero fill first), the plain one accumulates into it */
  int want_dr = relu && n->n_inputs > 3 && wanted(n, 3);
  if ((wanted(n, 0) || want_dr) && ((status = channel_empty(&tmp[5], C, dt, dev)) ||
                                    (status = channel_empty(&tmp[6], C, dt, dev)) ||
                                    (status = channel_empty(&tmp[7], C, dt, dev))))
    goto done;
  if (wanted(n, 0) && (status = relu ? ddp_tensor_empty(&gi[0], x->ndim, x->shape, dt, dev)
                                     : ddp_tensor_zeros(&gi[0], x->ndim, x->shape, dt, dev)))
    goto done;
  if (want_dr && (status = ddp_tensor_empty(&gi[3], x->ndim, x->shape, dt, dev))) goto done;
  /* dweight and dbias in dt: check_channel_arg gives weight and bias the input's dtype */
  if (wanted(n, 1) && (status = channel_empty(&gi[1], C, dt, dev))) goto done;
  if (wanted(n, 2) && (status = channel_empty(&gi[2], C, dt, dev))) goto done;
  void *w = tmp[2] ? dptr(tmp[2]) : NULL;
  void *a = tmp[5] ? dptr(tmp[5]) : NULL, *b = tmp[6] ? dptr(tmp[6]) : NULL;
  void *d = tmp[7] ? dptr(tmp[7]) : NULL;
  void *dw = gi[1] ? dptr(gi[1]) : NULL, *db = gi[2] ? dptr(gi[2]) : NULL;
  /* dx = a dy + b (x - mean) + d, from the closed form of d(BN)/dx (training):
   * dx = k (M dy - sum dy - xhat sum(dy xhat)), k = w invstd / M, xhat = (x - mean) invstd;
   * dweight = sum(dy * xhat), dbias = sum(dy) */
  if (relu) /* the same with g = (y > 0 ? dy : 0), the gradient through the ReLU */
    k->bn_backward_reduce_relu(dt, dptr(tmp[3]), dptr(tmp[4]), dptr(g),
                               bits ? dptr(bits) : NULL, y ? dptr(y) : NULL,
                               dptr(x), dptr(mean), scale ? dptr(scale) : NULL,
                               shift ? dptr(shift) : NULL, N, C, S);
  else
    k->bn_backward_reduce(dt, dptr(tmp[3]), dptr(tmp[4]), dptr(g), dptr(x), dptr(mean), N, C, S);
  k->bn_backward_coef(dt, a, b, d, dw, db, dptr(tmp[3]), dptr(tmp[4]), dptr(invstd), w, C, M,
                      training);
  if (relu && (gi[0] || gi[3]))
    k->bn_backward_elemt_relu(dt, gi[0] ? dptr(gi[0]) : NULL, gi[3] ? dptr(gi[3]) : NULL,
                              dptr(g), bits ? dptr(bits) : NULL, y ? dptr(y) : NULL, dptr(x),
                              dptr(mean),
                              scale ? dptr(scale) : NULL, shift ? dptr(shift) : NULL, a, b, d,
                              N, C, S);
  else if (!relu && gi[0])
    k->bn_backward_elemt(dt, dptr(gi[0]), dptr(g), dptr(x), dptr(mean), a, b, d, N, C, S);
  status = ddp_device_check(dev, "BatchNormBackward");
done:
  release_all(tmp, 8);
  return status;
}

/* running = (1 - momentum) * running + momentum * value * correction, in double, written in
 * place (running stats carry no graph). value: (C) f64 on running's device. A contiguous
 * f32/f64 running stat is updated by one kernel; another (strided, half) goes through an
 * f64 copy. */
static int update_running(const ddp_kernels *k, ddp_tensor *running, const ddp_tensor *value,
                          int64_t C, double momentum, double correction) {
  int dev = running->device;
  if (ddp_tensor_is_contiguous(running) &&
      (running->dtype == DDP_F32 || running->dtype == DDP_F64)) {
    k->bn_running_update(running->dtype, dptr(running), dptr(value), C, momentum, correction);
    ddp_tensor_bump_version(running);
    return ddp_device_check(dev, "batch_norm");
  }
  ddp_tensor *cur = NULL, *alias = ddp_tensor_alias(running);
  if (!alias) return ddp_last_status();
  int status = channel_empty(&cur, C, DDP_F64, dev);
  if (!status) status = ddp_copy_(cur, alias);
  if (!status) {
    k->bn_running_update(DDP_F64, dptr(cur), dptr(value), C, momentum, correction);
    status = ddp_device_check(dev, "batch_norm");
  }
  if (!status) status = ddp_copy_(alias, cur);
  ddp_tensor_release(cur);
  ddp_tensor_release(alias);
  return status;
}

/* Batch norm on f32/f64 after the checks.
 *
 * Note [device batch norm]: the statistics (double) and the per-channel coefficients (in
 * the input's dtype) are small tensors on the input's device, made by the bn_moments,
 * bn_finalize, bn_running_update and bn_backward_coef kernels; nothing is read back on
 * the host, so a device batch norm queues its work without a synchronisation. The
 * arithmetic is the same on every device (double, rounded to the dtype at the end). */
static int batch_norm_compute(ddp_tensor **out, ddp_tensor *input, ddp_tensor *rm, ddp_tensor *rv,
                              ddp_tensor *weight, ddp_tensor *bias, int training, double momentum,
                              double eps, int64_t N, int64_t C, int64_t S, int relu,
                              ddp_tensor *residual) {
  int dt = input->dtype, dev = input->device;
  double M = (double)N * (double)S;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm"));
  /* x, mean (f64), var (f64), w, b, mean, scale, shift, invstd (dt), residual (dt), the
   * ReLU's mask bits (u8, (N C S / 8): with a residual in f32 when S % 8 == 0) */
  ddp_tensor *tmp[11] = {0};
  int status;
  int64_t mask_bytes = N * C * S / 8;
  ddp_tensor *inputs[4] = {input, weight, bias, residual};
  int n_in = relu ? 4 : 3, record = ddp_autograd_needed(n_in, inputs);
  if ((status = ddp_detached_as(&tmp[0], input, dt)) ||
      (residual && (status = ddp_detached_as(&tmp[9], residual, dt))) ||
      (record && relu && residual && dt == DDP_F32 && S % 8 == 0 &&
       (status = ddp_tensor_empty(&tmp[10], 1, &mask_bytes, DDP_U8, dev))))
    goto done;
  ddp_tensor *x = tmp[0];
  if (training)
    status = bn_moments(&tmp[1], &tmp[2], k, x, N, C, S);
  else if (!(status = ddp_detached_as(&tmp[1], rm, DDP_F64)))
    status = ddp_detached_as(&tmp[2], rv, DDP_F64);
  if (status || (weight && (status = ddp_detached_as(&tmp[3], weight, dt))) ||
      (bias && (status = ddp_detached_as(&tmp[4], bias, dt))))
    goto done;
  for (int i = 5; i < 9; i++)
    if ((status = channel_empty(&tmp[i], C, dt, dev))) goto done;
  if ((status = ddp_tensor_empty(out, input->ndim, input->shape, dt, dev))) goto done;
  void *w = tmp[3] ? dptr(tmp[3]) : NULL, *b = tmp[4] ? dptr(tmp[4]) : NULL;
  k->bn_finalize(dt, dptr(tmp[5]), dptr(tmp[6]), dptr(tmp[7]), dptr(tmp[8]), dptr(tmp[1]),
                 dptr(tmp[2]), w, b, C, eps);
  if (relu)
    k->bn_apply_relu(dt, dptr(*out), tmp[10] ? dptr(tmp[10]) : NULL, dptr(x),
                     tmp[9] ? dptr(tmp[9]) : NULL, dptr(tmp[5]), dptr(tmp[6]), dptr(tmp[7]), N,
                     C, S);
  else
    k->bn_apply(dt, dptr(*out), dptr(x), dptr(tmp[5]), dptr(tmp[6]), dptr(tmp[7]), N, C, S);
  if ((status = ddp_device_check(dev, "batch_norm"))) goto done;
  if (training) { /* PyTorch: the running variance takes the unbiased batch variance */
    if (rm && (status = update_running(k, rm, tmp[1], C, momentum, 1.0))) goto done;
    if (rv && (status = update_running(k, rv, tmp[2], C, momentum, M / (M - 1)))) goto done;
  }
  if (record) {
    ddp_node *n = ddp_node_new(relu ? "BatchNormReluBackward" : "BatchNormBackward",
                               batch_norm_backward, n_in, inputs, BN_SAVED);
    if (!n) {
      status = ddp_last_status();
      goto done;
    }
    n->iattr[0] = training;
    n->iattr[1] = weight != NULL;
    n->iattr[2] = relu;
    n->iattr[3] = residual != NULL;
    n->iattr[4] = tmp[10] != NULL;
    if ((status = ddp_node_save(n, BN_INPUT, input)) ||
        (status = ddp_node_save(n, BN_WEIGHT, weight)) ||
        (status = ddp_node_save(n, BN_MEAN, tmp[5])) ||
        (status = ddp_node_save(n, BN_INVSTD, tmp[8])) ||
        (tmp[10] && (status = ddp_node_save(n, BN_MASK, tmp[10]))) ||
        (relu && residual && !tmp[10] && (status = ddp_node_save(n, BN_OUTPUT, *out))) ||
        (relu && !residual && ((status = ddp_node_save(n, BN_SCALE, tmp[6])) ||
                               (status = ddp_node_save(n, BN_SHIFT, tmp[7]))))) {
      ddp_node_release(n);
      goto done;
    }
    ddp_autograd_set_output(*out, n);
  }
done:
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  release_all(tmp, 11);
  return status;
}

/* Refuse an in-place update of a running stat that is a leaf requiring grad (grad mode on). */
static int check_running_writable(const char *op, const ddp_tensor *t, const char *arg) {
  if (t && t->requires_grad && !t->grad_fn && ddp_grad_enabled())
    DDP_FAIL(DDP_ERR_ARG, "%s: %s is a leaf tensor that requires grad and would be "
             "updated in place in training mode (wrap it in no_grad or detach it)", op, arg);
  return DDP_OK;
}

/* The checks of batch_norm and batch_norm_relu (errors name op); N, C, S of input. */
static int check_batch_norm_args(const char *op, ddp_tensor *input, ddp_tensor *running_mean,
                                 ddp_tensor *running_var, ddp_tensor *weight, ddp_tensor *bias,
                                 int training, double eps, int64_t *N, int64_t *C, int64_t *S) {
  DDP_TRY(check_bn_input(input, op, N, C, S));
  {
    ddp_tensor *ts[5] = {input, running_mean, running_var, weight, bias};
    const char *names[5] = {"input", "running_mean", "running_var", "weight", "bias"};
    DDP_TRY(ddp_check_same_device(op, 5, ts, names));
  }
  DDP_TRY(check_channel_arg_of(op, running_mean, "running_mean", *C, -1, input));
  DDP_TRY(check_channel_arg_of(op, running_var, "running_var", *C, -1, input));
  DDP_TRY(check_channel_arg_of(op, weight, "weight", *C, param_dtype_for(input, weight), input));
  DDP_TRY(check_channel_arg_of(op, bias, "bias", *C, param_dtype_for(input, bias), input));
  if (!(eps >= 0)) DDP_FAIL(DDP_ERR_ARG, "%s: eps must be >= 0, got %g", op, eps);
  if (!training && (!running_mean || !running_var))
    DDP_FAIL(DDP_ERR_ARG, "%s: running_mean and running_var are required in eval mode "
             "(training = false) for input %s", op, DDP_SHAPE(input));
  if (training && (double)*N * (double)*S <= 1)
    DDP_FAIL(DDP_ERR_ARG, "%s: expected more than 1 value per channel when training, "
             "got input %s", op, DDP_SHAPE(input));
  if (training) {
    DDP_TRY(check_running_writable(op, running_mean, "running_mean"));
    DDP_TRY(check_running_writable(op, running_var, "running_var"));
  }
  return DDP_OK;
}

int ddp_batch_norm(ddp_tensor **out, ddp_tensor *input, ddp_tensor *running_mean,
                   ddp_tensor *running_var, ddp_tensor *weight, ddp_tensor *bias, int training,
                   double momentum, double eps) {
  *out = NULL;
  /* Note [autocast policy]: the running statistics are buffers updated in place, never cast
   * (a cast would update a copy): only the input and the affine parameters follow the widest */
  ddp_tensor *ac_in[3] = {input, weight, bias}, *ac[3];
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_BATCH_NORM, 3, ac_in, ac,
                       ddp_batch_norm(out, ac[0], running_mean, running_var, ac[1], ac[2],
                                      training, momentum, eps));
  int64_t N = 0, C = 0, S = 1;
  DDP_TRY(check_batch_norm_args("batch_norm", input, running_mean, running_var, weight, bias,
                                training, eps, &N, &C, &S));
  if (is_half(input->dtype)) {
    ddp_tensor *t[4] = {0}, *r32 = NULL;
    int status;
    if (!(status = ddp_to_dtype(&t[0], input, DDP_F32)) &&
        !(status = to_dtype_opt(&t[1], weight, DDP_F32)) &&
        !(status = to_dtype_opt(&t[2], bias, DDP_F32)))
      status = ddp_batch_norm(&r32, t[0], running_mean, running_var, t[1], t[2], training,
                              momentum, eps);
    release_all(t, 4);
    return status ? status : back_to(out, r32, input->dtype);
  }
  return batch_norm_compute(out, input, running_mean, running_var, weight, bias, training,
                            momentum, eps, N, C, S, 0, NULL);
}

/* Note [fused batch norm relu]: batch_norm_relu computes relu(batch_norm(x) + residual) in
 * one pass over the data and records one node, BatchNormReluBackward, that saves x (as
 * batch norm does) and the output y (as relu does; without a residual the per-channel scale
 * and shift instead, Note [fused batch norm relu mask] in runtime/backend/cpu/batch_norm.c)
 * and nothing in between, so neither the batch norm output nor the sum is ever written to
 * memory. The forward rounds each step as
 * the separate ops do (the batch norm FMA, the f32 add, relu as x < 0 ? 0 : x), and the
 * backward takes g = (y > 0 ? dy : 0) (relu's backward), hands g to the residual (the add's
 * backward) and feeds g to the same batch norm reduction and element-wise arithmetic, so
 * values and gradients are bitwise those of the composition on the same kernels. A device
 * whose kernel table lacks the fused entries (bn_apply_relu, bn_backward_reduce_relu,
 * bn_backward_elemt_relu: CUDA today), half dtypes and autocast run the composition
 * batch_norm, add, relu instead: the same values, separate nodes. */
int ddp_batch_norm_relu(ddp_tensor **out, ddp_tensor *input, ddp_tensor *residual,
                        ddp_tensor *running_mean, ddp_tensor *running_var, ddp_tensor *weight,
                        ddp_tensor *bias, int training, double momentum, double eps) {
  *out = NULL;
  const char *op = "batch_norm_relu";
  int64_t N = 0, C = 0, S = 1;
  DDP_TRY(check_batch_norm_args(op, input, running_mean, running_var, weight, bias, training,
                                eps, &N, &C, &S));
  if (residual) {
    DDP_TRY(ddp_check_alive(residual, op, "residual"));
    if (!same_shape_as(residual, input))
      DDP_FAIL(DDP_ERR_ARG, "%s: residual of shape %s must have the shape of input %s", op,
               DDP_SHAPE(residual), DDP_SHAPE(input));
    if (residual->dtype != input->dtype)
      DDP_FAIL(DDP_ERR_ARG, "%s: residual has dtype %s but input has dtype %s", op,
               ddp_dtype_name(residual->dtype), ddp_dtype_name(input->dtype));
    ddp_tensor *ts[2] = {input, residual};
    const char *names[2] = {"input", "residual"};
    DDP_TRY(ddp_check_same_device(op, 2, ts, names));
  }
  const ddp_kernels *k = ddp_kernels_for(input->device);
  ddp_tensor *ac_in[4] = {input, weight, bias, residual};
  int fused = k && k->bn_apply_relu && k->bn_backward_reduce_relu && k->bn_backward_elemt_relu &&
              !is_half(input->dtype) && !ddp_autocast_needed(DDP_AUTOCAST_OP_BATCH_NORM, 4, ac_in);
  if (fused)
    return batch_norm_compute(out, input, running_mean, running_var, weight, bias, training,
                              momentum, eps, N, C, S, 1, residual);
  ddp_tensor *t[2] = {0};
  int status = ddp_batch_norm(&t[0], input, running_mean, running_var, weight, bias, training,
                              momentum, eps);
  if (!status && residual) status = ddp_add(&t[1], t[0], residual);
  if (!status) status = ddp_relu(out, residual ? t[1] : t[0]);
  release_all(t, 2);
  return status;
}

int ddp_batch_norm_stats(ddp_tensor **out_mean, ddp_tensor **out_invstd, ddp_tensor *input,
                         double eps) {
  *out_mean = *out_invstd = NULL;
  int64_t N = 0, C = 0, S = 1;
  DDP_TRY(check_bn_input(input, "batch_norm_stats", &N, &C, &S));
  if (!(eps >= 0)) DDP_FAIL(DDP_ERR_ARG, "batch_norm_stats: eps must be >= 0, got %g", eps);
  if (N * S == 0)
    DDP_FAIL(DDP_ERR_ARG, "batch_norm_stats: no values per channel in input %s", DDP_SHAPE(input));
  int dt = input->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = input->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm_stats"));
  ddp_tensor *tmp[3] = {0}; /* x, mean, var (f64) */
  int status = ddp_detached_as(&tmp[0], input, dt);
  if (!status) status = bn_moments(&tmp[1], &tmp[2], k, tmp[0], N, C, S);
  if (!status) status = channel_empty(out_mean, C, dt, dev);
  if (!status) status = channel_empty(out_invstd, C, dt, dev);
  if (!status) {
    k->bn_finalize(dt, dptr(*out_mean), NULL, NULL, dptr(*out_invstd), dptr(tmp[1]),
                   dptr(tmp[2]), NULL, NULL, C, eps);
    status = ddp_device_check(dev, "batch_norm_stats");
  }
  if (status) {
    ddp_tensor_release(*out_mean);
    ddp_tensor_release(*out_invstd);
    *out_mean = *out_invstd = NULL;
  }
  release_all(tmp, 3);
  return status;
}

int ddp_batch_norm_sums(ddp_tensor **out_sum, ddp_tensor **out_sumsq, ddp_tensor *input) {
  *out_sum = *out_sumsq = NULL;
  int64_t N = 0, C = 0, S = 1;
  DDP_TRY(check_bn_input(input, "batch_norm_sums", &N, &C, &S));
  int dt = input->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = input->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm_sums"));
  ddp_tensor *x;
  DDP_TRY(ddp_detached_as(&x, input, dt));
  int status = channel_empty(out_sum, C, DDP_F64, dev);
  if (!status) status = channel_empty(out_sumsq, C, DDP_F64, dev);
  if (!status) {
    k->bn_sums(dt, dptr(*out_sum), dptr(*out_sumsq), dptr(x), N, C, S);
    status = ddp_device_check(dev, "batch_norm_sums");
  }
  if (status) {
    ddp_tensor_release(*out_sum);
    ddp_tensor_release(*out_sumsq);
    *out_sum = *out_sumsq = NULL;
  }
  ddp_tensor_release(x);
  return status;
}

/* ---- the elementwise steps of a synchronised batch norm ------------------------------------ */

/* Note [differentiable sync batch norm steps]: nn.SyncBatchNorm is written with ordinary ops
 * and the differentiable collectives (lua/ddplua/nn/sync_batch_norm_function.lua), and two
 * of its steps are passes over the data that must stay single kernels: the per-channel
 * moments of the local batch (ddp_batch_norm_moments) and the normalisation with the global
 * statistics (ddp_batch_norm_elemt). Both record a node, so the tape derives the layer's
 * backward: the gradients of the (C)-sized statistics come back through the statistics'
 * all-gather, and these nodes turn them into the input's gradient with the same reduction
 * and element-wise kernels as batch norm's own backward (bn_backward_reduce,
 * bn_backward_elemt). With x (N, C, *), M = N * spatial values per channel, dy the output
 * gradient, invstd = 1 / sqrt(var + eps):
 *   elemt:   dx = dy * invstd * w, dw = sum(dy (x - mean)) * invstd, db = sum(dy),
 *            dmean = -sum(dy) * invstd * w, dvar = -sum(dy (x - mean)) * w * invstd^3 / 2
 *   moments: dx = dmean / M + 2 dvar (x - mean) / M
 * (the per-channel sums over N and the spatial dims). Gradients come back in each input's
 * dtype. */

/* Saved slots of BatchNormElemtBackward (fattr[0]: eps). */
enum { BE_INPUT, BE_WEIGHT, BE_MEAN, BE_VAR, BE_SAVED };
/* Saved slots of BatchNormMomentsBackward (its output (2, C) saved: row 1 is the mean). */
enum { BM_INPUT, BM_MOMENTS, BM_SAVED };

/* 1 when input i of n gets a gradient (a node or a leaf behind its edge). */
static int edge_needed(const ddp_node *n, int i) { return n->edges[i].fn || n->edges[i].leaf; }

/* t converted to the dtype of input i of n, into grads[i] (t's reference is taken). */
static int grad_as_input(ddp_tensor **grads, ddp_node *n, int i, ddp_tensor *t) {
  if (t->dtype == n->inputs[i].dtype) {
    grads[i] = t;
    return DDP_OK;
  }
  int status = ddp_to_dtype(&grads[i], t, n->inputs[i].dtype);
  ddp_tensor_release(t);
  return status;
}

/* A (C) f64 tensor filled with v on device dev. */
static int channel_full(ddp_tensor **out, int64_t C, double v, int dev) {
  DDP_TRY(ddp_tensor_empty(out, 1, &C, DDP_F64, dev));
  int status = ddp_fill_(*out, v);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

/* BatchNormElemtBackward: the five gradients of Note [differentiable sync batch norm steps],
 * each computed only when its input needs one. */
static int elemt_backward(ddp_node *n, ddp_tensor *dy, ddp_tensor **grads) {
  ddp_tensor *x = ddp_node_saved(n, BE_INPUT), *mean = ddp_node_saved(n, BE_MEAN);
  ddp_tensor *var = ddp_node_saved(n, BE_VAR);
  if (!x || !mean || !var) return ddp_last_status();
  ddp_tensor *w = n->inputs[1].ndim ? ddp_node_saved(n, BE_WEIGHT) : NULL;
  int64_t C = x->shape[1];
  /* v64, invstd, sum_dy, sum_dy_xmu, zeros, w64, scratch... */
  ddp_tensor *t[12] = {0};
  ddp_tensor *g = NULL;
  int status = ddp_detached_as(&t[0], var, DDP_F64);
  if (!status) status = ddp_add_scalar(&t[1], t[0], n->fattr[0]);
  if (!status) status = ddp_rsqrt(&t[2], t[1]); /* invstd (C) f64 */
  if (!status && w) status = ddp_detached_as(&t[3], w, DDP_F64);
  int need_sums = edge_needed(n, 1) || edge_needed(n, 2) || edge_needed(n, 3) || edge_needed(n, 4);
  if (!status && need_sums) status = ddp_batch_norm_backward_reduce(&t[4], &t[5], dy, x, mean);
  if (!status && edge_needed(n, 0)) {
    status = channel_full(&t[6], C, 0.0, x->device);
    if (!status) status = ddp_batch_norm_backward_elemt(&g, dy, x, mean, t[2], w, t[6], t[6]);
    if (!status) status = grad_as_input(grads, n, 0, g);
  }
  if (!status && w && edge_needed(n, 1)) { /* dw = sum_dy_xmu * invstd */
    status = ddp_mul(&g, t[5], t[2]);
    if (!status) status = grad_as_input(grads, n, 1, g);
  }
  if (!status && edge_needed(n, 2)) { /* db = sum_dy */
    ddp_tensor_retain(t[4]);
    status = grad_as_input(grads, n, 2, t[4]);
  }
  if (!status && edge_needed(n, 3)) { /* dmean = -sum_dy * invstd * w */
    status = ddp_mul_scalar(&t[7], t[4], -1.0);
    if (!status) status = ddp_mul(&t[8], t[7], t[2]);
    if (!status && w) status = ddp_mul(&g, t[8], t[3]);
    else if (!status) {
      g = t[8];
      t[8] = NULL;
    }
    if (!status) status = grad_as_input(grads, n, 3, g);
  }
  if (!status && edge_needed(n, 4)) { /* dvar = -sum_dy_xmu * w * invstd^3 / 2 */
    status = ddp_mul(&t[9], t[2], t[2]);
    if (!status) status = ddp_mul(&t[10], t[9], t[2]);
    if (!status) status = ddp_mul_scalar(&t[11], t[5], -0.5);
    ddp_tensor *h = NULL;
    if (!status) status = ddp_mul(&h, t[11], t[10]);
    if (!status && w) {
      status = ddp_mul(&g, h, t[3]);
      ddp_tensor_release(h);
    } else if (!status) {
      g = h;
    }
    if (!status) status = grad_as_input(grads, n, 4, g);
  }
  release_all(t, 12);
  return status;
}

/* BatchNormMomentsBackward: dx = dmean / M + 2 dvar (x - mean) / M through
 * bn_backward_elemt (Note [differentiable sync batch norm steps]); zeros for an empty batch. */
static int moments_backward(ddp_node *n, ddp_tensor *gout, ddp_tensor **grads) {
  ddp_tensor *x = ddp_node_saved(n, BM_INPUT), *mom = ddp_node_saved(n, BM_MOMENTS);
  if (!x || !mom) return ddp_last_status();
  int64_t N = 0, C = 0, S = 1;
  DDP_TRY(check_bn_input(x, "batch_norm_moments backward", &N, &C, &S));
  if (N * S == 0) return ddp_tensor_zeros(&grads[0], x->ndim, x->shape, n->inputs[0].dtype, x->device);
  double M = (double)(N * S);
  /* g_mean, g_var, mean (views), mean_dy, mean_dy_xmu, ones, minus ones, zeros (x-shaped) */
  ddp_tensor *t[8] = {0};
  ddp_tensor *g = NULL;
  int status = ddp_select(&t[0], gout, 0, 0);
  if (!status) status = ddp_select(&t[1], gout, 0, 1);
  if (!status) status = ddp_select(&t[2], mom, 0, 0);
  if (!status) status = ddp_mul_scalar(&t[3], t[0], 1.0 / M);
  if (!status) status = ddp_mul_scalar(&t[4], t[1], 2.0 / M);
  if (!status) status = channel_full(&t[5], C, 1.0, x->device);
  if (!status) status = channel_full(&t[6], C, -1.0, x->device);
  if (!status)
    status = ddp_tensor_zeros(&t[7], x->ndim, x->shape, x->dtype == DDP_F64 ? DDP_F64 : DDP_F32,
                              x->device);
  /* backward_elemt's w invstd (dy - mean_dy - (x - mean) invstd^2 mean_dy_xmu) with dy = 0,
   * invstd = 1, w = -1: mean_dy + (x - mean) mean_dy_xmu */
  if (!status) status = ddp_batch_norm_backward_elemt(&g, t[7], x, t[2], t[5], t[6], t[3], t[4]);
  if (!status) status = grad_as_input(grads, n, 0, g);
  release_all(t, 8);
  return status;
}

int ddp_batch_norm_moments(ddp_tensor **out, ddp_tensor *input) {
  *out = NULL;
  int64_t N = 0, C = 0, S = 1;
  DDP_TRY(check_bn_input(input, "batch_norm_moments", &N, &C, &S));
  int dt = input->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = input->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm_moments"));
  int64_t shape[2] = {2, C};
  DDP_TRY(ddp_tensor_zeros(out, 2, shape, DDP_F64, dev));
  ddp_tensor *tmp[3] = {0}; /* x, mean, var (f64) */
  int status = DDP_OK;
  if (N * S > 0) {
    status = ddp_detached_as(&tmp[0], input, dt);
    if (!status) status = bn_moments(&tmp[1], &tmp[2], k, tmp[0], N, C, S);
    ddp_tensor *row = NULL;
    for (int r = 0; r < 2 && !status; r++) {
      status = ddp_select(&row, *out, 0, r);
      if (!status) status = ddp_copy_(row, tmp[1 + r]);
      ddp_tensor_release(row);
      row = NULL;
    }
  }
  if (!status && ddp_autograd_needed(1, &input)) {
    ddp_node *n = ddp_node_new("BatchNormMomentsBackward", moments_backward, 1, &input, BM_SAVED);
    if (!n) status = ddp_last_status();
    if (!status) status = ddp_node_save(n, BM_INPUT, input);
    if (!status) status = ddp_node_save(n, BM_MOMENTS, *out);
    if (!status) ddp_autograd_set_output(*out, n);
    else if (n) ddp_node_release(n);
  }
  release_all(tmp, 3);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}



/* Checks shared by the three ops below: input (N, C, *) floating, the per-channel tensors
 * (C) floating, all on one device (names[0] is the input). */
static int check_sync_bn_args(const char *op, int n, ddp_tensor *const *ts, const char *const *names,
                              int64_t *N, int64_t *C, int64_t *S) {
  DDP_TRY(check_bn_input(ts[0], op, N, C, S));
  DDP_TRY(ddp_check_same_device(op, n, ts, names));
  for (int i = 1; i < n; i++) DDP_TRY(check_channel_arg_of(op, ts[i], names[i], *C, -1, ts[0]));
  return DDP_OK;
}

int ddp_batch_norm_elemt(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias,
                         ddp_tensor *mean, ddp_tensor *var, double eps) {
  *out = NULL;
  int64_t N = 0, C = 0, S = 1;
  ddp_tensor *ts[5] = {input, weight, bias, mean, var};
  const char *names[5] = {"input", "weight", "bias", "mean", "var"};
  DDP_TRY(check_sync_bn_args("batch_norm_elemt", 5, ts, names, &N, &C, &S));
  if (!mean || !var) DDP_FAIL(DDP_ERR_ARG, "batch_norm_elemt: mean and var are required");
  if (!(eps >= 0)) DDP_FAIL(DDP_ERR_ARG, "batch_norm_elemt: eps must be >= 0, got %g", eps);
  int dt = input->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = input->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm_elemt"));
  /* x, w, b (dt), mean, var (f64), mean, scale, shift (dt) */
  ddp_tensor *tmp[8] = {0};
  int status;
  if ((status = ddp_detached_as(&tmp[0], input, dt)) ||
      (weight && (status = ddp_detached_as(&tmp[1], weight, dt))) ||
      (bias && (status = ddp_detached_as(&tmp[2], bias, dt))) ||
      (status = ddp_detached_as(&tmp[3], mean, DDP_F64)) || (status = ddp_detached_as(&tmp[4], var, DDP_F64)))
    goto done;
  for (int i = 5; i < 8; i++)
    if ((status = channel_empty(&tmp[i], C, dt, dev))) goto done;
  if ((status = ddp_tensor_empty(out, input->ndim, input->shape, dt, dev))) goto done;
  /* the same two kernels as batch_norm's training forward: its output, bit for bit, when
   * mean and var are the batch's */
  k->bn_finalize(dt, dptr(tmp[5]), dptr(tmp[6]), dptr(tmp[7]), NULL, dptr(tmp[3]), dptr(tmp[4]),
                 tmp[1] ? dptr(tmp[1]) : NULL, tmp[2] ? dptr(tmp[2]) : NULL, C, eps);
  if (N * S > 0)
    k->bn_apply(dt, dptr(*out), dptr(tmp[0]), dptr(tmp[5]), dptr(tmp[6]), dptr(tmp[7]), N, C, S);
  status = ddp_device_check(dev, "batch_norm_elemt");
  if (!status && ddp_autograd_needed(5, ts)) {
    ddp_node *n = ddp_node_new("BatchNormElemtBackward", elemt_backward, 5, ts, BE_SAVED);
    if (!n) {
      status = ddp_last_status();
      goto done;
    }
    ddp_tensor *saved[BE_SAVED] = {input, weight, mean, var};
    for (int i = 0; i < BE_SAVED && !status; i++) status = ddp_node_save(n, i, saved[i]);
    n->fattr[0] = eps;
    if (status) {
      ddp_node_release(n);
      goto done;
    }
    ddp_autograd_set_output(*out, n);
  }
done:
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  release_all(tmp, 8);
  return status;
}

int ddp_batch_norm_backward_reduce(ddp_tensor **out_sum_dy, ddp_tensor **out_sum_dy_xmu,
                                   ddp_tensor *grad_out, ddp_tensor *input, ddp_tensor *mean) {
  *out_sum_dy = *out_sum_dy_xmu = NULL;
  int64_t N = 0, C = 0, S = 1;
  ddp_tensor *ts[2] = {input, mean};
  const char *names[2] = {"input", "mean"};
  DDP_TRY(check_sync_bn_args("batch_norm_backward_reduce", 2, ts, names, &N, &C, &S));
  if (!mean) DDP_FAIL(DDP_ERR_ARG, "batch_norm_backward_reduce: mean is required");
  DDP_TRY(ddp_check_alive(grad_out, "batch_norm_backward_reduce", "grad_out"));
  if (!same_shape_as(grad_out, input))
    DDP_FAIL(DDP_ERR_ARG, "batch_norm_backward_reduce: grad_out of shape %s does not match input %s",
             DDP_SHAPE(grad_out), DDP_SHAPE(input));
  if (grad_out->device != input->device)
    DDP_FAIL(DDP_ERR_ARG, "batch_norm_backward_reduce: grad_out and input are on different devices");
  int dt = input->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = input->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm_backward_reduce"));
  ddp_tensor *tmp[3] = {0}; /* dy, x, mean (dt) */
  int status;
  if ((status = ddp_detached_as(&tmp[0], grad_out, dt)) || (status = ddp_detached_as(&tmp[1], input, dt)) ||
      (status = ddp_detached_as(&tmp[2], mean, dt)) ||
      (status = channel_empty(out_sum_dy, C, DDP_F64, dev)) ||
      (status = channel_empty(out_sum_dy_xmu, C, DDP_F64, dev)))
    goto done;
  k->bn_backward_reduce(dt, dptr(*out_sum_dy), dptr(*out_sum_dy_xmu), dptr(tmp[0]), dptr(tmp[1]),
                        dptr(tmp[2]), N, C, S);
  status = ddp_device_check(dev, "batch_norm_backward_reduce");
done:
  if (status) {
    ddp_tensor_release(*out_sum_dy);
    ddp_tensor_release(*out_sum_dy_xmu);
    *out_sum_dy = *out_sum_dy_xmu = NULL;
  }
  release_all(tmp, 3);
  return status;
}

int ddp_batch_norm_backward_elemt(ddp_tensor **grad_in, ddp_tensor *grad_out, ddp_tensor *input,
                                  ddp_tensor *mean, ddp_tensor *invstd, ddp_tensor *weight,
                                  ddp_tensor *mean_dy, ddp_tensor *mean_dy_xmu) {
  *grad_in = NULL;
  int64_t N = 0, C = 0, S = 1;
  ddp_tensor *ts[6] = {input, mean, invstd, weight, mean_dy, mean_dy_xmu};
  const char *names[6] = {"input", "mean", "invstd", "weight", "mean_dy", "mean_dy_xmu"};
  DDP_TRY(check_sync_bn_args("batch_norm_backward_elemt", 6, ts, names, &N, &C, &S));
  if (!mean || !invstd || !mean_dy || !mean_dy_xmu)
    DDP_FAIL(DDP_ERR_ARG, "batch_norm_backward_elemt: mean, invstd, mean_dy and mean_dy_xmu are required");
  DDP_TRY(ddp_check_alive(grad_out, "batch_norm_backward_elemt", "grad_out"));
  if (!same_shape_as(grad_out, input))
    DDP_FAIL(DDP_ERR_ARG, "batch_norm_backward_elemt: grad_out of shape %s does not match input %s",
             DDP_SHAPE(grad_out), DDP_SHAPE(input));
  if (grad_out->device != input->device)
    DDP_FAIL(DDP_ERR_ARG, "batch_norm_backward_elemt: grad_out and input are on different devices");
  int dt = input->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = input->device;
  const ddp_kernels *k;
  DDP_TRY(bn_kernels(&k, dev, "batch_norm_backward_elemt"));
  /* dy, x, mean, invstd, w (dt), mean_dy, mean_dy_xmu (f64), a, b, d (dt) */
  ddp_tensor *tmp[10] = {0};
  int status;
  if ((status = ddp_detached_as(&tmp[0], grad_out, dt)) || (status = ddp_detached_as(&tmp[1], input, dt)) ||
      (status = ddp_detached_as(&tmp[2], mean, dt)) || (status = ddp_detached_as(&tmp[3], invstd, dt)) ||
      (weight && (status = ddp_detached_as(&tmp[4], weight, dt))) ||
      (status = ddp_detached_as(&tmp[5], mean_dy, DDP_F64)) ||
      (status = ddp_detached_as(&tmp[6], mean_dy_xmu, DDP_F64)))
    goto done;
  for (int i = 7; i < 10; i++)
    if ((status = channel_empty(&tmp[i], C, dt, dev))) goto done;
  if ((status = ddp_tensor_zeros(grad_in, input->ndim, input->shape, dt, dev))) goto done;
  /* batch_norm's closed form with M = 1 and the sums already divided by the global count:
   * dx = w invstd (dy - mean_dy - (x - mean) invstd^2 mean_dy_xmu) */
  k->bn_backward_coef(dt, dptr(tmp[7]), dptr(tmp[8]), dptr(tmp[9]), NULL, NULL, dptr(tmp[5]),
                      dptr(tmp[6]), dptr(tmp[3]), tmp[4] ? dptr(tmp[4]) : NULL, C, 1.0, 1);
  if (N * S > 0)
    k->bn_backward_elemt(dt, dptr(*grad_in), dptr(tmp[0]), dptr(tmp[1]), dptr(tmp[2]), dptr(tmp[7]),
                         dptr(tmp[8]), dptr(tmp[9]), N, C, S);
  status = ddp_device_check(dev, "batch_norm_backward_elemt");
done:
  if (status) {
    ddp_tensor_release(*grad_in);
    *grad_in = NULL;
  }
  release_all(tmp, 10);
  return status;
}

/* ---- layer norm -------------------------------------------------------------------------- */

/* Saved slots of LayerNormBackward; iattr[0] has weight, iattr[1] rows M, iattr[2] row D. */
enum { LN_INPUT, LN_WEIGHT, LN_MEAN, LN_RSTD, LN_SAVED };

static int layer_norm_backward(ddp_node *n, ddp_tensor *grad, ddp_tensor **gi) {
  ddp_tensor *x0 = ddp_node_saved(n, LN_INPUT);
  ddp_tensor *w0 = n->iattr[0] ? ddp_node_saved(n, LN_WEIGHT) : NULL;
  ddp_tensor *mean = ddp_node_saved(n, LN_MEAN), *rstd = ddp_node_saved(n, LN_RSTD);
  if (!x0 || (n->iattr[0] && !w0) || !mean || !rstd) return ddp_last_status();
  int dt = n->inputs[0].dtype;
  int64_t M = n->iattr[1], D = n->iattr[2];
  int dev = x0->device;
  const ddp_kernels *k = ddp_kernels_for(dev);
  DDP_TRY(DDP_KERNEL_CHECK(k, ln_backward, "LayerNormBackward"));
  ddp_tensor *tmp[3] = {0}; /* x, g, w */
  int status;
  if ((status = ddp_detached_as(&tmp[0], x0, dt)) || (status = ddp_detached_as(&tmp[1], grad, dt)) ||
      (w0 && (status = ddp_detached_as(&tmp[2], w0, dt))))
    goto done;
  for (int i = 0; i < 3; i++) {
    if (!wanted(n, i)) continue;
    const ddp_input_meta *m = &n->inputs[i];
    if ((status = ddp_tensor_zeros(&gi[i], m->ndim, m->shape, dt, dev))) goto done;
  }
  void *dx = gi[0] ? dptr(gi[0]) : NULL, *dw = gi[1] ? dptr(gi[1]) : NULL;
  void *db = gi[2] ? dptr(gi[2]) : NULL, *w = tmp[2] ? dptr(tmp[2]) : NULL;
  k->ln_backward(dt, dx, dw, db, dptr(tmp[1]), dptr(tmp[0]), dptr(mean), dptr(rstd), w, M, D);
  status = ddp_device_check(dev, "LayerNormBackward");
done:
  release_all(tmp, 3);
  return status;
}

/* Check weight or bias of layer_norm: NULL, or normalized_shape with input's dtype. */
static int check_ln_param(const ddp_tensor *t, const char *arg, int nn, const int64_t *ns,
                          const ddp_tensor *input) {
  if (!t) return DDP_OK;
  DDP_TRY(ddp_check_alive(t, "layer_norm", arg));
  if (t->ndim != nn || memcmp(t->shape, ns, sizeof(int64_t) * (size_t)nn))
    DDP_FAIL(DDP_ERR_ARG, "layer_norm: %s of shape %s does not match normalized_shape %s", arg,
             DDP_SHAPE(t), ddp_shape_str(nn, ns));
  if (t->dtype != param_dtype_for(input, t))
    DDP_FAIL(DDP_ERR_ARG, "layer_norm: %s has dtype %s but input has dtype %s", arg,
             ddp_dtype_name(t->dtype), ddp_dtype_name(input->dtype));
  return DDP_OK;
}

static int layer_norm_compute(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight,
                              ddp_tensor *bias, double eps, int64_t M, int64_t D) {
  int dt = input->dtype, dev = input->device;
  const ddp_kernels *k = ddp_kernels_for(dev);
  DDP_TRY(DDP_KERNEL_CHECK(k, ln_forward, "layer_norm"));
  ddp_tensor *tmp[5] = {0}; /* x, w, b, mean, rstd */
  int status;
  if ((status = ddp_detached_as(&tmp[0], input, dt)) ||
      (weight && (status = ddp_detached_as(&tmp[1], weight, dt))) ||
      (bias && (status = ddp_detached_as(&tmp[2], bias, dt))) ||
      (status = ddp_tensor_empty(&tmp[3], 1, &M, dt, dev)) ||
      (status = ddp_tensor_empty(&tmp[4], 1, &M, dt, dev)) ||
      (status = ddp_tensor_empty(out, input->ndim, input->shape, dt, dev)))
    goto done;
  void *w = tmp[1] ? dptr(tmp[1]) : NULL, *b = tmp[2] ? dptr(tmp[2]) : NULL;
  k->ln_forward(dt, dptr(*out), dptr(tmp[3]), dptr(tmp[4]), dptr(tmp[0]), w, b, M, D, eps);
  if ((status = ddp_device_check(dev, "layer_norm"))) goto done;
  ddp_tensor *inputs[3] = {input, weight, bias};
  if (ddp_autograd_needed(3, inputs)) {
    ddp_node *n = ddp_node_new("LayerNormBackward", layer_norm_backward, 3, inputs, LN_SAVED);
    if (!n) {
      status = ddp_last_status();
      goto done;
    }
    n->iattr[0] = weight != NULL;
    n->iattr[1] = M;
    n->iattr[2] = D;
    ddp_autograd_set_output(*out, n);
    if ((status = ddp_node_save(n, LN_INPUT, input)) ||
        (status = ddp_node_save(n, LN_WEIGHT, weight)) ||
        (status = ddp_node_save(n, LN_MEAN, tmp[3])) || (status = ddp_node_save(n, LN_RSTD, tmp[4])))
      goto done;
  }
done:
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  release_all(tmp, 5);
  return status;
}

int ddp_layer_norm(ddp_tensor **out, ddp_tensor *input, int n_normalized,
                   const int64_t *normalized_shape, ddp_tensor *weight, ddp_tensor *bias,
                   double eps) {
  *out = NULL;
  ddp_tensor *ac_in[3] = {input, weight, bias}, *ac[3]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_LAYER_NORM, 3, ac_in, ac,
                       ddp_layer_norm(out, ac[0], n_normalized, normalized_shape, ac[1], ac[2], eps));
  DDP_TRY(ddp_check_alive(input, "layer_norm", "input"));
  if (!ddp_dtype_is_floating(input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "layer_norm: input must be floating, got %s", ddp_dtype_name(input->dtype));
  if (n_normalized < 1 || n_normalized > input->ndim || !normalized_shape)
    DDP_FAIL(DDP_ERR_ARG, "layer_norm: normalized_shape must have 1 to %d dimensions (the last "
             "dims of input %s), got %d", input->ndim, DDP_SHAPE(input), n_normalized);
  int lead = input->ndim - n_normalized;
  if (memcmp(input->shape + lead, normalized_shape, sizeof(int64_t) * (size_t)n_normalized))
    DDP_FAIL(DDP_ERR_ARG, "layer_norm: normalized_shape %s does not match the last %d dims of "
             "input %s", ddp_shape_str(n_normalized, normalized_shape), n_normalized,
             DDP_SHAPE(input));
  {
    ddp_tensor *ts[3] = {input, weight, bias};
    const char *names[3] = {"input", "weight", "bias"};
    DDP_TRY(ddp_check_same_device("layer_norm", 3, ts, names));
  }
  DDP_TRY(check_ln_param(weight, "weight", n_normalized, normalized_shape, input));
  DDP_TRY(check_ln_param(bias, "bias", n_normalized, normalized_shape, input));
  if (!(eps >= 0)) DDP_FAIL(DDP_ERR_ARG, "layer_norm: eps must be >= 0, got %g", eps);
  int64_t M = 1, D = 1;
  for (int d = 0; d < lead; d++) M *= input->shape[d];
  for (int d = lead; d < input->ndim; d++) D *= input->shape[d];
  if (is_half(input->dtype)) {
    ddp_tensor *t[3] = {0}, *r32 = NULL;
    int status;
    if (!(status = ddp_to_dtype(&t[0], input, DDP_F32)) &&
        !(status = to_dtype_opt(&t[1], weight, DDP_F32)) &&
        !(status = to_dtype_opt(&t[2], bias, DDP_F32)))
      status = ddp_layer_norm(&r32, t[0], n_normalized, normalized_shape, t[1], t[2], eps);
    release_all(t, 3);
    return status ? status : back_to(out, r32, input->dtype);
  }
  return layer_norm_compute(out, input, weight, bias, eps, M, D);
}

/* ---- dropout ----------------------------------------------------------------------------- */

/* out = x * mask * scale for contiguous f32/f64 out, x and a u8 mask, all on one device. */
static int masked_scale(ddp_tensor *out, const ddp_tensor *x, const ddp_tensor *mask, double scale,
                        const char *op) {
  const ddp_kernels *k = ddp_kernels_for(out->device);
  DDP_TRY(DDP_KERNEL_CHECK(k, masked_scale, op));
  k->masked_scale(out->dtype, dptr(out), dptr(x), dptr(mask), scale, out->numel);
  return ddp_device_check(out->device, op);
}

/* d(dropout)/dx: dy * mask * scale (saved slot 0: the u8 mask, fattr[0]: the scale). */
static int dropout_backward(ddp_node *n, ddp_tensor *grad, ddp_tensor **gi) {
  ddp_tensor *mask = ddp_node_saved(n, 0);
  if (!mask) return ddp_last_status();
  ddp_tensor *g;
  int dt = n->inputs[0].dtype;
  DDP_TRY(ddp_detached_as(&g, grad, dt));
  int status = ddp_tensor_empty(&gi[0], g->ndim, g->shape, dt, g->device);
  if (!status) status = masked_scale(gi[0], g, mask, n->fattr[0], "DropoutBackward");
  ddp_tensor_release(g);
  return status;
}

int ddp_dropout(ddp_tensor **out, ddp_tensor *input, double p, int training, ddp_generator *g) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(input, "dropout", "input"));
  if (!(p >= 0 && p <= 1))
    DDP_FAIL(DDP_ERR_ARG, "dropout: probability p must be in [0, 1], got %g", p);
  if (!ddp_dtype_is_floating(input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "dropout: input must be floating, got %s for input %s",
             ddp_dtype_name(input->dtype), DDP_SHAPE(input));
  if (!training || p == 0) {
    ddp_tensor_retain(input);
    *out = input;
    return DDP_OK;
  }
  if (is_half(input->dtype)) {
    ddp_tensor *x32 = NULL, *r32 = NULL;
    int status = ddp_to_dtype(&x32, input, DDP_F32);
    if (!status) status = ddp_dropout(&r32, x32, p, training, g);
    ddp_tensor_release(x32);
    return status ? status : back_to(out, r32, input->dtype);
  }
  /* The mask is drawn on the CPU from the (Philox) generator and moved to the input's
   * device: the same seed gives the same mask on every device (one host-to-device copy of
   * one byte per element). */
  ddp_tensor *mask = NULL, *x = NULL;
  double scale = p == 1 ? 0 : 1 / (1 - p);
  int status = ddp_tensor_empty(&mask, input->ndim, input->shape, DDP_U8, DDP_DEVICE_CPU);
  if (!status) status = p == 1 ? ddp_zero_(mask) : ddp_bernoulli_(mask, 1 - p, g);
  if (!status && input->device != DDP_DEVICE_CPU) {
    ddp_tensor *moved = NULL;
    status = ddp_tensor_to_device(&moved, mask, input->device, 0);
    ddp_tensor_release(mask);
    mask = moved;
  }
  if (!status) status = ddp_detached_as(&x, input, input->dtype);
  if (!status) status = ddp_tensor_empty(out, input->ndim, input->shape, input->dtype, input->device);
  if (!status) status = masked_scale(*out, x, mask, scale, "dropout");
  if (!status) {
    if (ddp_autograd_needed(1, &input)) {
      ddp_node *n = ddp_node_new("DropoutBackward", dropout_backward, 1, &input, 1);
      if (!n) {
        status = ddp_last_status();
      } else {
        n->fattr[0] = scale;
        ddp_autograd_set_output(*out, n);
        status = ddp_node_save(n, 0, mask);
      }
    }
  }
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  ddp_tensor_release(mask);
  ddp_tensor_release(x);
  return status;
}

/* ---- embedding --------------------------------------------------------------------------- */

/* d(embedding)/d(weight): rows of dy added at their indices (saved slot 0: the indices,
 * iattr[0]: padding_idx or -1). Accumulated in f32 (f64 for f64 weights). */
static int embedding_backward(ddp_node *n, ddp_tensor *grad, ddp_tensor **gi) {
  ddp_tensor *idx0 = ddp_node_saved(n, 0);
  if (!idx0) return ddp_last_status();
  const ddp_input_meta *wm = &n->inputs[0];
  int acc = wm->dtype == DDP_F64 ? DDP_F64 : DDP_F32, dev = idx0->device;
  int64_t D = wm->shape[1];
  const ddp_kernels *k = ddp_kernels_for(dev);
  DDP_TRY(DDP_KERNEL_CHECK(k, embedding_backward, "EmbeddingBackward"));
  ddp_tensor *idx = NULL, *g = NULL, *dw = NULL;
  int status;
  if ((status = ddp_detached_as(&idx, idx0, DDP_I64)) || (status = ddp_detached_as(&g, grad, acc)) ||
      (status = ddp_tensor_zeros(&dw, 2, wm->shape, acc, dev)))
    goto done;
  k->embedding_backward(acc, dptr(dw), dptr(g), dptr(idx), idx->numel, D, n->iattr[0]);
  if (!(status = ddp_device_check(dev, "EmbeddingBackward")))
    status = ddp_to_dtype(&gi[0], dw, wm->dtype);
done:
  ddp_tensor_release(idx);
  ddp_tensor_release(g);
  ddp_tensor_release(dw);
  return status;
}

int ddp_embedding(ddp_tensor **out, ddp_tensor *weight, ddp_tensor *indices, int64_t padding_idx) {
  *out = NULL;
  DDP_TRY(ddp_check_alive(weight, "embedding", "weight"));
  DDP_TRY(ddp_check_alive(indices, "embedding", "indices"));
  if (weight->ndim != 2)
    DDP_FAIL(DDP_ERR_ARG, "embedding: weight must be 2-d (V, D), got %s", DDP_SHAPE(weight));
  if (indices->dtype != DDP_I64 && indices->dtype != DDP_I32)
    DDP_FAIL(DDP_ERR_ARG, "embedding: indices must be i64 or i32, got %s for indices %s",
             ddp_dtype_name(indices->dtype), DDP_SHAPE(indices));
  if (indices->ndim + 1 > DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "embedding: indices %s have too many dimensions (at most %d)",
             DDP_SHAPE(indices), DDP_MAX_DIMS - 1);
  int64_t V = weight->shape[0], D = weight->shape[1];
  if (padding_idx < -1 || padding_idx >= V)
    DDP_FAIL(DDP_ERR_ARG, "embedding: padding_idx %lld is out of range for weight %s (V = %lld)",
             (long long)padding_idx, DDP_SHAPE(weight), (long long)V);
  {
    ddp_tensor *ts[2] = {weight, indices};
    const char *names[2] = {"weight", "indices"};
    DDP_TRY(ddp_check_same_device("embedding", 2, ts, names));
  }
  int dev = weight->device;
  void (*gather)(char *, const char *, const int64_t *, int64_t, int64_t);
  DDP_KERNEL(gather, dev, embedding_forward, "embedding");
  /* Indices are checked on the host: device indices are copied back first (a
   * synchronisation, as PyTorch's device-side assert would not need; the message stays
   * the CPU's). */
  ddp_tensor *idx = NULL, *w = NULL, *host_idx = NULL;
  int status = ddp_detached_as(&idx, indices, DDP_I64);
  if (status) return status;
  if (dev != DDP_DEVICE_CPU &&
      (status = ddp_tensor_to_device(&host_idx, idx, DDP_DEVICE_CPU, 0)))
    goto done;
  const int64_t *iv = dptr(host_idx ? host_idx : idx);
  for (int64_t i = 0; i < idx->numel; i++)
    if (iv[i] < 0 || iv[i] >= V) {
      status = DDP_ERROR(DDP_ERR_ARG, "embedding: index %lld is out of range [0, %lld) for weight "
                         "%s (V = %lld)", (long long)iv[i], (long long)V, DDP_SHAPE(weight),
                         (long long)V);
      goto done;
    }
  int64_t shape[DDP_MAX_DIMS];
  memcpy(shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
  shape[indices->ndim] = D;
  if ((status = ddp_detached_as(&w, weight, weight->dtype)) ||
      (status = ddp_tensor_empty(out, indices->ndim + 1, shape, weight->dtype, weight->device)))
    goto done;
  gather(dptr(*out), dptr(w), dptr(idx), idx->numel, D * (int64_t)ddp_dtype_size(weight->dtype));
  if ((status = ddp_device_check(dev, "embedding"))) goto done;
  if (ddp_autograd_needed(1, &weight)) {
    ddp_node *n = ddp_node_new("EmbeddingBackward", embedding_backward, 1, &weight, 1);
    if (!n) {
      status = ddp_last_status();
      goto done;
    }
    n->iattr[0] = padding_idx;
    ddp_autograd_set_output(*out, n);
    status = ddp_node_save(n, 0, indices);
  }
done:
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  ddp_tensor_release(idx);
  ddp_tensor_release(host_idx);
  ddp_tensor_release(w);
  return status;
}
