/* runtime/ops/accumulate.c: the in-place accumulation the autograd engine sums gradients
 * with (ddp_accumulate_: the add kernel of the device's table) and sum_to_shape, the
 * backward of broadcasting (on devices the sum op; on the CPU one serial pass of the core's
 * element iterator adding into a stride-0 view of the result, which keeps the summation
 * order of every CPU gradient as it was). */
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/copy.h"

typedef struct { int dst_dtype, src_dtype; } convert_ctx;

/* dst += src element-wise over one inner run (serial: sum_to_shape's destination repeats). */
static void acc_loop(void *vctx, char **p, const int64_t *s, int64_t n) {
  const convert_ctx *c = vctx;
  char *d = p[0], *src = p[1];
  if (c->dst_dtype == DDP_F32 && c->src_dtype == DDP_F32) {
    if (s[0] == 4 && s[1] == 4) {
      float *restrict df = (float *)d;
      const float *restrict sf = (const float *)src;
      for (int64_t i = 0; i < n; i++) df[i] += sf[i];
    } else {
      for (int64_t i = 0; i < n; i++) *(float *)(d + i * s[0]) += *(const float *)(src + i * s[1]);
    }
    return;
  }
  if (c->dst_dtype == DDP_F64 && c->src_dtype == DDP_F64) {
    for (int64_t i = 0; i < n; i++) *(double *)(d + i * s[0]) += *(const double *)(src + i * s[1]);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    ddp_store_f64(d + i * s[0], c->dst_dtype,
                  ddp_load_f64(d + i * s[0], c->dst_dtype) + ddp_load_f64(src + i * s[1], c->src_dtype));
}

int ddp_accumulate_(ddp_tensor *dst, const ddp_tensor *src) {
  if (dst->device != src->device)
    DDP_FAIL(DDP_ERR_ARG, "accumulate: the gradient is on %s but the tensor it accumulates "
             "into is on %s", ddp_device_str(src->device), ddp_device_str(dst->device));
  ddp_tensor *view;
  DDP_TRY(ddp_broadcast_view(&view, src, dst->ndim, dst->shape, "accumulate"));
  /* dst = dst + 1 * src, element-wise (the kernel converts dtypes) */
  const ddp_kernels *k = ddp_kernels_for(dst->device);
  int status = DDP_KERNEL_CHECK(k, binary, "accumulate");
  if (!status) {
    k->binary(dst, dst, view, DDP_EW_ADD, 1.0);
    status = ddp_device_check(dst->device, "accumulate");
  }
  ddp_tensor_release(view);
  if (!status) ddp_tensor_bump_version(dst);
  return status;
}

/* sum_to_shape through the reduction ops (the device path): sum the leading dimensions
 * grad has in excess, then, keeping dims, those where shape has 1 and grad does not. */
static int sum_to_shape_reduce(ddp_tensor **out, ddp_tensor *grad, int ndim,
                               const int64_t *shape) {
  int lead = grad->ndim - ndim, dims[DDP_MAX_DIMS], nd = 0;
  if (lead < 0) DDP_FAIL(DDP_ERR_ARG, "sum_to_shape: %s does not reduce to %s", DDP_SHAPE(grad),
                         ddp_shape_str(ndim, shape));
  for (int i = 0; i < lead; i++) dims[nd++] = i;
  ddp_tensor *summed = grad;
  ddp_tensor_retain(grad);
  if (nd) {
    ddp_tensor *r;
    int status = ddp_sum(&r, summed, dims, nd, 0, -1);
    ddp_tensor_release(summed);
    DDP_TRY(status);
    summed = r;
  }
  nd = 0;
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 1 && summed->shape[i] != 1) dims[nd++] = i;
  if (nd) {
    ddp_tensor *r;
    int status = ddp_sum(&r, summed, dims, nd, 1, -1);
    ddp_tensor_release(summed);
    DDP_TRY(status);
    summed = r;
  }
  *out = summed;
  return DDP_OK;
}

int ddp_sum_to_shape(ddp_tensor **out, ddp_tensor *grad, int ndim, const int64_t *shape) {
  *out = NULL;
  if (grad->ndim == ndim && !memcmp(grad->shape, shape, sizeof(int64_t) * ndim)) {
    ddp_tensor_retain(grad);
    *out = grad;
    return DDP_OK;
  }
  if (grad->device != DDP_DEVICE_CPU) return sum_to_shape_reduce(out, grad, ndim, shape);
  ddp_tensor *acc, *view;
  DDP_TRY(ddp_tensor_zeros(&acc, ndim, shape, grad->dtype, grad->device));
  /* acc viewed at grad's shape (stride 0 over summed dims) += grad, serially: many grad
   * elements land on one acc element */
  int status = ddp_broadcast_view(&view, acc, grad->ndim, grad->shape, "sum_to_shape");
  if (status) {
    ddp_tensor_release(acc);
    return status;
  }
  convert_ctx c = {acc->dtype, grad->dtype};
  ddp_tensor *ops[2] = {view, grad};
  ddp_foreach(2, ops, grad->ndim, grad->shape, acc_loop, &c, 0);
  ddp_tensor_release(view);
  *out = acc;
  return DDP_OK;
}
