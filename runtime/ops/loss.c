/* runtime/ops/loss.c: front doors of the loss functions (nll_loss, cross_entropy,
 * mse_loss): argument checks, dtype and device dispatch to the loss kernels of the input's
 * device (runtime/backend/kernels.h: backend/cpu/loss.c or backend/cuda/loss.cu), reduction
 * and autograd. Semantics follow torch.nn.functional (see ddplua/ops_loss.h for the
 * formulas).
 *
 * Note [device losses]: every tensor argument must be on one device; the per-sample
 * losses, the log-sum-exp and the gradients are made there. Two things still pass through
 * the host, each a synchronisation per call: the forward kernels return the summed loss
 * as a host double (the kernel-table signature; the reduced 0-d result is then written to
 * the device), and class-index targets (with the class weights) are copied to the host to
 * be checked against [0, C) and to give the normaliser of reduction mean, so a bad target
 * is an error naming its value and position on every device, not a device-side assert.
 *
 * f16/bf16 inputs go through f32: the input is cast with ddp_to_dtype (recorded, so the
 * gradient flows back through the cast), the f32 loss is computed and cast back. */
#include <stdio.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/autocast.h"

/* iattr / fattr slots of the loss nodes */
enum { A_REDUCTION = 0, A_IGNORE = 1, A_PROB = 2, A_HAS_WEIGHT = 3 };
enum { F_SMOOTHING = 0, F_DENOM = 1 };
/* saved slots of the class-loss nodes */
enum { S_INPUT = 0, S_TARGET = 1, S_WEIGHT = 2, S_LSE = 3 };

/* Input of a class loss seen as (N, C, D); see runtime/backend/cpu/loss.h. */
typedef struct {
  int64_t N, C, D;
} class_layout;

/* Element address of t as void * (NULL for a NULL t): kernel arguments. */
static void *data(const ddp_tensor *t) { return t ? (void *)ddp_data(t) : NULL; }

static int is_half(int dtype) { return dtype == DDP_F16 || dtype == DDP_BF16; }

static int check_reduction(const char *op, int reduction) {
  if (reduction != DDP_REDUCTION_NONE && reduction != DDP_REDUCTION_MEAN &&
      reduction != DDP_REDUCTION_SUM)
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown reduction %d (none = 0, mean = 1, sum = 2)", op, reduction);
  return DDP_OK;
}

/* A contiguous tensor holding t's values in dtype, with no graph (t's own storage when it
 * already is contiguous and of that dtype). */
static int prepare(ddp_tensor **out, const ddp_tensor *t, int dtype) {
  *out = NULL;
  ddp_tensor *alias = ddp_tensor_alias(t), *cast = NULL;
  if (!alias) return ddp_last_status();
  int status = ddp_to_dtype(&cast, alias, dtype);
  ddp_tensor_release(alias);
  if (status) return status;
  status = ddp_contiguous(out, cast);
  ddp_tensor_release(cast);
  return status;
}

/* *out = the loss computed on the f32 cast x32 of a half input (see the file comment),
 * cast back to the half dtype. Takes ownership of x32 and loss32. */
static int from_f32(ddp_tensor **out, ddp_tensor *x32, ddp_tensor *loss32, int status, int dtype) {
  ddp_tensor_release(x32);
  if (!status) status = ddp_to_dtype(out, loss32, dtype);
  ddp_tensor_release(loss32);
  return status;
}

/* Checks the input of a class loss ((C), (N, C) or (N, C, d1, ...), floating) and fills
 * its layout. */
static int class_input_layout(const char *op, const ddp_tensor *input, class_layout *lay) {
  if (!ddp_dtype_is_floating(input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: input must be floating, got %s %s", op, ddp_dtype_name(input->dtype),
             DDP_SHAPE(input));
  if (input->ndim < 1)
    DDP_FAIL(DDP_ERR_ARG,
             "%s: input must have a class dimension: (C), (N, C) or (N, C, d1, ...), "
             "got shape %s",
             op, DDP_SHAPE(input));
  if (input->ndim == 1) {
    *lay = (class_layout){1, input->shape[0], 1};
    return DDP_OK;
  }
  lay->N = input->shape[0];
  lay->C = input->shape[1];
  lay->D = 1;
  for (int k = 2; k < input->ndim; k++) lay->D *= input->shape[k];
  return DDP_OK;
}

/* The shape of one loss per sample: input's shape without the class dimension. */
static int sample_shape(const ddp_tensor *input, int64_t *shape) {
  if (input->ndim == 1) return 0;
  shape[0] = input->shape[0];
  for (int k = 2; k < input->ndim; k++) shape[k - 1] = input->shape[k];
  return input->ndim - 1;
}

/* A class-index target must be integer and have the sample shape. */
static int check_index_target(const char *op, const ddp_tensor *input, const ddp_tensor *target) {
  int64_t expect[DDP_MAX_DIMS];
  int nd = sample_shape(input, expect);
  if (ddp_dtype_is_floating(target->dtype) || target->dtype == DDP_BOOL)
    DDP_FAIL(DDP_ERR_ARG,
             "%s: target of dtype %s and shape %s: class-index targets must be "
             "integer (i64) of shape %s for input %s%s",
             op, ddp_dtype_name(target->dtype), DDP_SHAPE(target), ddp_shape_str(nd, expect),
             DDP_SHAPE(input),
             ddp_dtype_is_floating(target->dtype)
                 ? " (class-probability targets must have the input's shape)"
                 : "");
  if (target->ndim != nd || memcmp(target->shape, expect, sizeof(int64_t) * (size_t)nd))
    DDP_FAIL(DDP_ERR_ARG, "%s: target %s does not match input %s: expected a target of shape %s",
             op, DDP_SHAPE(target), DDP_SHAPE(input), ddp_shape_str(nd, expect));
  return DDP_OK;
}

/* Checks weight ((C), floating) and returns it prepared in dtype (*out NULL when absent). */
static int prepare_weight(ddp_tensor **out, const char *op, ddp_tensor *weight,
                          const ddp_tensor *input, int64_t C, int dtype) {
  *out = NULL;
  if (!weight) return DDP_OK;
  DDP_TRY(ddp_check_alive(weight, op, "weight"));
  if (weight->ndim != 1 || weight->shape[0] != C)
    DDP_FAIL(DDP_ERR_ARG,
             "%s: weight %s must be a 1-d tensor of C = %lld class weights for "
             "input %s",
             op, DDP_SHAPE(weight), (long long)C, DDP_SHAPE(input));
  if (!ddp_dtype_is_floating(weight->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: weight must be floating, got %s", op, ddp_dtype_name(weight->dtype));
  return prepare(out, weight, dtype);
}

/* "(i, j, ...)": the position of flat element i of a contiguous tensor of t's shape. */
static const char *position_str(const ddp_tensor *t, int64_t i, char *buf, size_t size) {
  int64_t idx[DDP_MAX_DIMS];
  for (int k = t->ndim - 1; k >= 0; k--) {
    idx[k] = t->shape[k] ? i % t->shape[k] : 0;
    i = t->shape[k] ? i / t->shape[k] : 0;
  }
  size_t len = (size_t)snprintf(buf, size, "(");
  for (int k = 0; k < t->ndim && len < size; k++)
    len += (size_t)snprintf(buf + len, size - len, k ? ", %lld" : "%lld", (long long)idx[k]);
  if (len < size) snprintf(buf + len, size - len, ")");
  return buf;
}

/* Every target in [0, C) or ignore_index (else an error naming the value, its position
 * and C); *denom = sum of weight[t_i] over the non-ignored targets (their count when
 * weight is NULL): the normaliser of reduction mean. t and weight are host memory. */
static int check_target_values_host(const char *op, const ddp_tensor *target, const int64_t *t,
                               const ddp_tensor *weight, int64_t C, int64_t ignore_index,
                               double *denom) {
  const char *w = weight ? (const char *)data(weight) : NULL;
  size_t wsize = weight ? ddp_dtype_size(weight->dtype) : 0;
  double sum = 0;
  for (int64_t i = 0; i < target->numel; i++) {
    int64_t y = t[i];
    if (y == ignore_index) continue;
    if (y < 0 || y >= C) {
      char pos[160];
      DDP_FAIL(DDP_ERR_ARG,
               "%s: target value %lld at position %s of target %s is out of range "
               "for C = %lld classes (expected 0 .. %lld, or ignore_index = %lld)",
               op, (long long)y, position_str(target, i, pos, sizeof pos), DDP_SHAPE(target),
               (long long)C, (long long)C - 1, (long long)ignore_index);
    }
    sum += w ? ddp_load_f64(w + (size_t)y * wsize, weight->dtype) : 1.0;
  }
  *denom = sum;
  return DDP_OK;
}

/* check_target_values_host for a contiguous i64 target and weight (or NULL) on any device:
 * device tensors are copied to the host first (Note [device losses]). */
static int check_target_values(const char *op, const ddp_tensor *shape_of, ddp_tensor *target,
                               ddp_tensor *weight, int64_t C, int64_t ignore_index,
                               double *denom) {
  if (target->device == DDP_DEVICE_CPU)
    return check_target_values_host(op, shape_of, data(target), weight, C, ignore_index, denom);
  ddp_tensor *t = NULL, *w = NULL;
  int status = ddp_tensor_to_device(&t, target, DDP_DEVICE_CPU, 0);
  if (!status && weight) status = ddp_tensor_to_device(&w, weight, DDP_DEVICE_CPU, 0);
  if (!status)
    status = check_target_values_host(op, shape_of, data(t), w, C, ignore_index, denom);
  ddp_tensor_release(t);
  ddp_tensor_release(w);
  return status;
}

/* The reduced result: a 0-d tensor of dtype on device holding sum (SUM) or sum / denom
 * (MEAN; nan when both are 0, as PyTorch's mean over nothing). */
static int reduced_result(ddp_tensor **out, double sum, double denom, int reduction, int dtype,
                          int device) {
  DDP_TRY(ddp_tensor_empty(out, 0, NULL, dtype, device));
  double v = reduction == DDP_REDUCTION_MEAN ? sum / denom : sum;
  if (device == DDP_DEVICE_CPU) {
    ddp_store_f64(data(*out), dtype, v);
    return DDP_OK;
  }
  char bytes[8];
  ddp_store_f64(bytes, dtype, v);
  int status = ddp_device_memcpy(data(*out), device, bytes, DDP_DEVICE_CPU,
                                 ddp_dtype_size(dtype), "loss");
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

/* The kernel table of device when it has the loss kernel `name` that `op` needs, else the
 * "not implemented" error. */
#define LOSS_KERNELS(k, device, op, name)                                                  \
  do {                                                                                     \
    (k) = ddp_kernels_for(device);                                                         \
    DDP_TRY(DDP_KERNEL_CHECK((k), name, (op)));                                            \
  } while (0)

/* Fail unless input, target and weight (NULL skipped) are on one device. */
static int check_loss_devices(const char *op, ddp_tensor *input, ddp_tensor *target,
                              ddp_tensor *weight) {
  ddp_tensor *ts[3] = {input, target, weight};
  const char *names[3] = {"input", "target", "weight"};
  return ddp_check_same_device(op, 3, ts, names);
}

/* The factor every gradient term of a reduced loss carries. */
static double reduction_factor(int reduction, double denom) {
  return reduction == DDP_REDUCTION_MEAN ? 1.0 / denom : 1.0;
}

/* 1 when the node's input k has somewhere to send a gradient. */
static int input_needs_grad(const ddp_node *n, int k) {
  return n->edges[k].fn != NULL || n->edges[k].leaf != NULL;
}

/* ---- nll_loss and cross_entropy ------------------------------------------------------- */

/* What a class-loss forward or backward works on: contiguous, graph-free tensors. */
typedef struct {
  ddp_tensor *x, *target, *weight; /* (N, C, D), (N*D) i64 or (N, C, D), (C) or NULL */
} class_operands;

static void class_operands_release(class_operands *o) {
  ddp_tensor_release(o->x);
  ddp_tensor_release(o->target);
  ddp_tensor_release(o->weight);
  *o = (class_operands){0};
}

static int class_operands_prepare(class_operands *o, ddp_tensor *input, ddp_tensor *target,
                                  ddp_tensor *weight, int prob) {
  *o = (class_operands){0};
  int dtype = input->dtype;
  int status = prepare(&o->x, input, dtype);
  if (!status) status = prepare(&o->target, target, prob ? dtype : DDP_I64);
  if (!status && weight) status = prepare(&o->weight, weight, dtype);
  if (status) class_operands_release(o);
  return status;
}

static int cross_entropy_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int reduction = (int)n->iattr[A_REDUCTION], prob = (int)n->iattr[A_PROB];
  ddp_tensor *input = ddp_node_saved(n, S_INPUT);
  ddp_tensor *target = input ? ddp_node_saved(n, S_TARGET) : NULL;
  ddp_tensor *lse = target ? ddp_node_saved(n, S_LSE) : NULL;
  ddp_tensor *weight = NULL;
  if (!lse) return ddp_last_status();
  if (n->iattr[A_HAS_WEIGHT] && !(weight = ddp_node_saved(n, S_WEIGHT))) return ddp_last_status();
  int dtype = input->dtype, dev = input->device;
  const ddp_kernels *k;
  LOSS_KERNELS(k, dev, "CrossEntropyBackward", cross_entropy_backward);
  class_layout lay;
  DDP_TRY(class_input_layout("cross_entropy", input, &lay));
  class_operands o;
  DDP_TRY(class_operands_prepare(&o, input, target, weight, prob));
  ddp_tensor *dloss = NULL, *dx = NULL;
  int status = prepare(&dloss, g, dtype);
  if (!status) status = ddp_tensor_zeros(&dx, input->ndim, input->shape, dtype, dev);
  if (!status) {
    const int64_t *t = prob ? NULL : data(o.target);
    int per_sample = reduction == DDP_REDUCTION_NONE;
    double factor = reduction_factor(reduction, n->fattr[F_DENOM]);
    double eps = n->fattr[F_SMOOTHING];
    k->cross_entropy_backward(dtype, data(dx), data(dloss), per_sample, factor, data(o.x),
                              data(lse), t, prob ? data(o.target) : NULL, data(o.weight), lay.N,
                              lay.C, lay.D, n->iattr[A_IGNORE], eps);
    status = ddp_device_check(dev, "CrossEntropyBackward");
  }
  if (!status) {
    gi[0] = dx;
    dx = NULL;
  }
  ddp_tensor_release(dx);
  ddp_tensor_release(dloss);
  class_operands_release(&o);
  return status;
}

static int nll_loss_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int reduction = (int)n->iattr[A_REDUCTION];
  ddp_tensor *input = ddp_node_saved(n, S_INPUT);
  ddp_tensor *target = input ? ddp_node_saved(n, S_TARGET) : NULL;
  ddp_tensor *weight = NULL;
  if (!target) return ddp_last_status();
  if (n->iattr[A_HAS_WEIGHT] && !(weight = ddp_node_saved(n, S_WEIGHT))) return ddp_last_status();
  int dtype = input->dtype, dev = input->device;
  const ddp_kernels *k;
  LOSS_KERNELS(k, dev, "NllLossBackward", nll_backward);
  class_layout lay;
  DDP_TRY(class_input_layout("nll_loss", input, &lay));
  ddp_tensor *t = NULL, *w = NULL, *dloss = NULL, *dx = NULL;
  int status = prepare(&t, target, DDP_I64);
  if (!status && weight) status = prepare(&w, weight, dtype);
  if (!status) status = prepare(&dloss, g, dtype);
  if (!status) status = ddp_tensor_zeros(&dx, input->ndim, input->shape, dtype, dev);
  if (!status) {
    int per_sample = reduction == DDP_REDUCTION_NONE;
    double factor = reduction_factor(reduction, n->fattr[F_DENOM]);
    k->nll_backward(dtype, data(dx), data(dloss), per_sample, factor, data(t), data(w), lay.N,
                    lay.C, lay.D, n->iattr[A_IGNORE]);
    status = ddp_device_check(dev, "NllLossBackward");
  }
  if (!status) {
    gi[0] = dx;
    dx = NULL;
  }
  ddp_tensor_release(dx);
  ddp_tensor_release(dloss);
  ddp_tensor_release(w);
  ddp_tensor_release(t);
  return status;
}

/* Record the node of a class loss on *out (releases *out on failure). */
static int record_class_loss(ddp_tensor **out, const char *name, ddp_backward_fn backward,
                             ddp_tensor *input, ddp_tensor *target, ddp_tensor *weight,
                             ddp_tensor *lse, int reduction, int64_t ignore_index, int prob,
                             double smoothing, double denom) {
  ddp_node *n = ddp_node_new(name, backward, 1, &input, 4);
  int status = n ? DDP_OK : ddp_last_status();
  if (!status) status = ddp_node_save(n, S_INPUT, input);
  if (!status) status = ddp_node_save(n, S_TARGET, target);
  if (!status) status = ddp_node_save(n, S_WEIGHT, weight);
  if (!status) status = ddp_node_save(n, S_LSE, lse);
  if (status) {
    ddp_node_release(n);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  n->iattr[A_REDUCTION] = reduction;
  n->iattr[A_IGNORE] = ignore_index;
  n->iattr[A_PROB] = prob;
  n->iattr[A_HAS_WEIGHT] = weight != NULL;
  n->fattr[F_SMOOTHING] = smoothing;
  n->fattr[F_DENOM] = denom;
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}

int ddp_nll_loss(ddp_tensor **out, ddp_tensor *input, ddp_tensor *target, ddp_tensor *weight,
                 int reduction, int64_t ignore_index) {
  const char *op = "nll_loss";
  *out = NULL;
  ddp_tensor *ac_in[3] = {input, target, weight}, *ac[3]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_NLL_LOSS, 3, ac_in, ac,
                       ddp_nll_loss(out, ac[0], ac[1], ac[2], reduction, ignore_index));
  DDP_TRY(ddp_check_alive(input, op, "input"));
  DDP_TRY(ddp_check_alive(target, op, "target"));
  DDP_TRY(check_reduction(op, reduction));
  DDP_TRY(check_loss_devices(op, input, target, weight));
  class_layout lay;
  DDP_TRY(class_input_layout(op, input, &lay));
  DDP_TRY(check_index_target(op, input, target));
  if (is_half(input->dtype)) {
    ddp_tensor *x32 = NULL, *loss32 = NULL;
    DDP_TRY(ddp_to_dtype(&x32, input, DDP_F32));
    int status = ddp_nll_loss(&loss32, x32, target, weight, reduction, ignore_index);
    return from_f32(out, x32, loss32, status, input->dtype);
  }
  int dtype = input->dtype, dev = input->device;
  const ddp_kernels *k;
  LOSS_KERNELS(k, dev, op, nll_forward);
  class_operands o;
  DDP_TRY(class_operands_prepare(&o, input, target, NULL, 0));
  int status = prepare_weight(&o.weight, op, weight, input, lay.C, dtype);
  double denom = 0;
  if (!status)
    status = check_target_values(op, target, o.target, o.weight, lay.C, ignore_index, &denom);
  ddp_tensor *loss = NULL;
  if (!status && reduction == DDP_REDUCTION_NONE) {
    int64_t shape[DDP_MAX_DIMS];
    status = ddp_tensor_empty(&loss, sample_shape(input, shape), shape, dtype, dev);
  }
  if (!status) {
    const void *w = data(o.weight);
    void *l = data(loss);
    double sum = k->nll_forward(dtype, l, data(o.x), data(o.target), w, lay.N, lay.C, lay.D,
                                ignore_index);
    status = ddp_device_check(dev, op);
    if (!status && !loss) status = reduced_result(&loss, sum, denom, reduction, dtype, dev);
  }
  class_operands_release(&o);
  if (status) {
    ddp_tensor_release(loss);
    return status;
  }
  *out = loss;
  if (ddp_autograd_needed(1, &input))
    return record_class_loss(out, "NllLossBackward", nll_loss_backward, input, target, weight, NULL,
                             reduction, ignore_index, 0, 0, denom);
  return DDP_OK;
}

int ddp_cross_entropy(ddp_tensor **out, ddp_tensor *input, ddp_tensor *target, ddp_tensor *weight,
                      int reduction, int64_t ignore_index, double label_smoothing) {
  const char *op = "cross_entropy";
  *out = NULL;
  ddp_tensor *ac_in[3] = {input, target, weight}, *ac[3]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_CROSS_ENTROPY, 3, ac_in, ac,
                       ddp_cross_entropy(out, ac[0], ac[1], ac[2], reduction, ignore_index,
                                         label_smoothing));
  DDP_TRY(ddp_check_alive(input, op, "input"));
  DDP_TRY(ddp_check_alive(target, op, "target"));
  DDP_TRY(check_reduction(op, reduction));
  DDP_TRY(check_loss_devices(op, input, target, weight));
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: label_smoothing must be in [0, 1], got %g", op, label_smoothing);
  class_layout lay;
  DDP_TRY(class_input_layout(op, input, &lay));
  /* PyTorch's rule: a target of the input's shape holds class probabilities */
  int prob = target->ndim == input->ndim &&
             !memcmp(target->shape, input->shape, sizeof(int64_t) * (size_t)input->ndim);
  if (prob) {
    if (!ddp_dtype_is_floating(target->dtype))
      DDP_FAIL(DDP_ERR_ARG,
               "%s: target %s has the input's shape, so it holds class probabilities and "
               "must be floating, got %s",
               op, DDP_SHAPE(target), ddp_dtype_name(target->dtype));
    if (ignore_index >= 0)
      DDP_FAIL(DDP_ERR_ARG, "%s: ignore_index (%lld) is not supported for class-probability targets",
               op, (long long)ignore_index);
  } else {
    DDP_TRY(check_index_target(op, input, target));
  }
  if (is_half(input->dtype)) {
    ddp_tensor *x32 = NULL, *loss32 = NULL;
    DDP_TRY(ddp_to_dtype(&x32, input, DDP_F32));
    int status =
        ddp_cross_entropy(&loss32, x32, target, weight, reduction, ignore_index, label_smoothing);
    return from_f32(out, x32, loss32, status, input->dtype);
  }
  int dtype = input->dtype, dev = input->device;
  const ddp_kernels *k;
  LOSS_KERNELS(k, dev, op, cross_entropy_forward);
  class_operands o;
  DDP_TRY(class_operands_prepare(&o, input, target, NULL, prob));
  int status = prepare_weight(&o.weight, op, weight, input, lay.C, dtype);
  double denom = (double)(lay.N * lay.D); /* probability targets: the number of samples */
  if (!status && !prob)
    status = check_target_values(op, target, o.target, o.weight, lay.C, ignore_index, &denom);
  ddp_tensor *loss = NULL, *lse = NULL;
  int64_t nsamples = lay.N * lay.D;
  if (!status) status = ddp_tensor_empty(&lse, 1, &nsamples, dtype, dev);
  if (!status && reduction == DDP_REDUCTION_NONE) {
    int64_t shape[DDP_MAX_DIMS];
    status = ddp_tensor_empty(&loss, sample_shape(input, shape), shape, dtype, dev);
  }
  if (!status) {
    const int64_t *t = prob ? NULL : data(o.target);
    const void *p = prob ? data(o.target) : NULL;
    const void *w = data(o.weight);
    void *l = data(loss);
    double sum = k->cross_entropy_forward(dtype, l, data(lse), data(o.x), t, p, w, lay.N, lay.C,
                                          lay.D, ignore_index, label_smoothing);
    status = ddp_device_check(dev, op);
    if (!status && !loss) status = reduced_result(&loss, sum, denom, reduction, dtype, dev);
  }
  class_operands_release(&o);
  if (!status) {
    *out = loss;
    loss = NULL;
    if (ddp_autograd_needed(1, &input))
      status =
          record_class_loss(out, "CrossEntropyBackward", cross_entropy_backward, input, target,
                            weight, lse, reduction, ignore_index, prob, label_smoothing, denom);
  }
  ddp_tensor_release(loss);
  ddp_tensor_release(lse);
  return status;
}

/* ---- mse_loss --------------------------------------------------------------------------- */

/* input and target broadcast to (ndim, shape), contiguous, in dtype, graph-free. */
static int mse_operands(ddp_tensor **x, ddp_tensor **t, ddp_tensor *input, ddp_tensor *target,
                        int ndim, const int64_t *shape, int dtype) {
  *x = *t = NULL;
  ddp_tensor *xv = NULL, *tv = NULL;
  int status = ddp_broadcast_view(&xv, input, ndim, shape, "mse_loss");
  if (!status) status = ddp_broadcast_view(&tv, target, ndim, shape, "mse_loss");
  if (!status) status = prepare(x, xv, dtype);
  if (!status) status = prepare(t, tv, dtype);
  ddp_tensor_release(xv);
  ddp_tensor_release(tv);
  if (status) {
    ddp_tensor_release(*x);
    ddp_tensor_release(*t);
    *x = *t = NULL;
  }
  return status;
}

/* d(loss)/d(operand) of broadcast shape summed back to the operand's shape and dtype. */
static int to_input_grad(ddp_tensor **gi, ddp_tensor *grad, const ddp_input_meta *meta) {
  ddp_tensor *summed;
  DDP_TRY(ddp_sum_to_shape(&summed, grad, meta->ndim, meta->shape));
  int status = ddp_to_dtype(gi, summed, meta->dtype);
  ddp_tensor_release(summed);
  return status;
}

static int mse_loss_backward(ddp_node *n, ddp_tensor *g, ddp_tensor **gi) {
  int reduction = (int)n->iattr[A_REDUCTION];
  ddp_tensor *input = ddp_node_saved(n, 0);
  ddp_tensor *target = input ? ddp_node_saved(n, 1) : NULL;
  if (!target) return ddp_last_status();
  int64_t shape[DDP_MAX_DIMS];
  int ndim = ddp_broadcast_shapes(input->ndim, input->shape, target->ndim, target->shape, shape);
  int dtype = ddp_promote_types(input->dtype, target->dtype), dev = input->device;
  const ddp_kernels *k;
  LOSS_KERNELS(k, dev, "MseLossBackward", mse_backward);
  ddp_tensor *x = NULL, *t = NULL, *dloss = NULL, *dx = NULL, *dt = NULL;
  int status = mse_operands(&x, &t, input, target, ndim, shape, dtype);
  if (!status) status = prepare(&dloss, g, dtype);
  if (!status && input_needs_grad(n, 0))
    status = ddp_tensor_zeros(&dx, ndim, shape, dtype, dev);
  if (!status && input_needs_grad(n, 1))
    status = ddp_tensor_zeros(&dt, ndim, shape, dtype, dev);
  if (!status) {
    int per_element = reduction == DDP_REDUCTION_NONE;
    double factor = reduction_factor(reduction, n->fattr[F_DENOM]);
    k->mse_backward(dtype, data(dx), data(dt), data(dloss), per_element, factor, data(x), data(t),
                    x->numel);
    status = ddp_device_check(dev, "MseLossBackward");
    if (!status && dx) status = to_input_grad(&gi[0], dx, &n->inputs[0]);
    if (!status && dt) status = to_input_grad(&gi[1], dt, &n->inputs[1]);
  }
  ddp_tensor_release(x);
  ddp_tensor_release(t);
  ddp_tensor_release(dloss);
  ddp_tensor_release(dx);
  ddp_tensor_release(dt);
  return status;
}

int ddp_mse_loss(ddp_tensor **out, ddp_tensor *input, ddp_tensor *target, int reduction) {
  ddp_tensor *ac_in[2] = {input, target}, *ac[2]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_MSE_LOSS, 2, ac_in, ac, ddp_mse_loss(out, ac[0], ac[1], reduction));
  const char *op = "mse_loss";
  *out = NULL;
  DDP_TRY(ddp_check_alive(input, op, "input"));
  DDP_TRY(ddp_check_alive(target, op, "target"));
  DDP_TRY(check_reduction(op, reduction));
  DDP_TRY(check_loss_devices(op, input, target, NULL));
  if (!ddp_dtype_is_floating(input->dtype) || !ddp_dtype_is_floating(target->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: input (%s %s) and target (%s %s) must be floating", op,
             ddp_dtype_name(input->dtype), DDP_SHAPE(input), ddp_dtype_name(target->dtype),
             DDP_SHAPE(target));
  int64_t shape[DDP_MAX_DIMS];
  int ndim = ddp_broadcast_shapes(input->ndim, input->shape, target->ndim, target->shape, shape);
  if (ndim < 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: input %s and target %s do not broadcast to one shape", op,
             DDP_SHAPE(input), DDP_SHAPE(target));
  int dtype = ddp_promote_types(input->dtype, target->dtype);
  if (is_half(dtype)) { /* both halves of one kind: compute in f32, return that kind */
    ddp_tensor *x32 = NULL, *t32 = NULL, *loss32 = NULL;
    DDP_TRY(ddp_to_dtype(&x32, input, DDP_F32));
    int status = ddp_to_dtype(&t32, target, DDP_F32);
    if (!status) status = ddp_mse_loss(&loss32, x32, t32, reduction);
    ddp_tensor_release(t32);
    return from_f32(out, x32, loss32, status, dtype);
  }
  int dev = input->device;
  const ddp_kernels *k;
  LOSS_KERNELS(k, dev, op, mse_forward);
  ddp_tensor *x = NULL, *t = NULL, *loss = NULL;
  DDP_TRY(mse_operands(&x, &t, input, target, ndim, shape, dtype));
  int status = DDP_OK;
  if (reduction == DDP_REDUCTION_NONE) status = ddp_tensor_empty(&loss, ndim, shape, dtype, dev);
  double denom = (double)x->numel;
  if (!status) {
    void *l = data(loss);
    double sum = k->mse_forward(dtype, l, data(x), data(t), x->numel);
    status = ddp_device_check(dev, op);
    if (!status && !loss) status = reduced_result(&loss, sum, denom, reduction, dtype, dev);
  }
  ddp_tensor_release(x);
  ddp_tensor_release(t);
  if (status) {
    ddp_tensor_release(loss);
    return status;
  }
  *out = loss;
  ddp_tensor *inputs[2] = {input, target};
  if (ddp_autograd_needed(2, inputs)) {
    ddp_node *n = ddp_node_new("MseLossBackward", mse_loss_backward, 2, inputs, 2);
    if (!n || ddp_node_save(n, 0, input) || ddp_node_save(n, 1, target)) {
      ddp_node_release(n);
      ddp_tensor_release(*out);
      *out = NULL;
      return ddp_last_status();
    }
    n->iattr[A_REDUCTION] = reduction;
    n->fattr[F_DENOM] = denom;
    ddp_autograd_set_output(*out, n);
  }
  return DDP_OK;
}
