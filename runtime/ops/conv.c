/* runtime/ops/conv.c: the conv2d front door and its backward. Checks follow PyTorch's
 * (ConvUtils.h); the kernels are those of the tensors' device (conv2d_forward and
 * conv2d_backward of its kernel table: backend/cpu/conv.c, backend/cuda/conv.cu). */
#include <limits.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/autocast.h"

static int needs_grad(const ddp_node *n, int i) { return n->edges[i].fn || n->edges[i].leaf; }

/* A contiguous detached tensor of t's values in `dtype` (t itself when it already is). */
static int prepared(ddp_tensor **out, ddp_tensor *t, int dtype) {
  *out = NULL;
  if (!t) return DDP_OK;
  ddp_tensor *alias = ddp_tensor_alias(t), *c = NULL;
  if (!alias) return ddp_last_status();
  int status = ddp_to_dtype(&c, alias, dtype); /* no grad on the alias: nothing recorded */
  ddp_tensor_release(alias);
  if (status) return status;
  status = ddp_contiguous(out, c);
  ddp_tensor_release(c);
  return status;
}

/* The dtype kernels run in: f16 and bf16 compute through f32. */
static int compute_dtype(int dtype) { return dtype == DDP_F64 ? DDP_F64 : DDP_F32; }

static int conv_backward(ddp_node *node, ddp_tensor *grad, ddp_tensor **gi) {
  ddp_tensor *input = ddp_node_saved(node, 0), *weight = ddp_node_saved(node, 1);
  if (!input || !weight) return ddp_last_status(); /* borrowed from the node */
  int dtype = input->dtype, cd = compute_dtype(dtype);
  int unbatched = input->ndim == 3;
  ddp_conv2d_geom g = {
      .n = unbatched ? 1 : input->shape[0], .c = input->shape[input->ndim - 3],
      .h = input->shape[input->ndim - 2], .w = input->shape[input->ndim - 1],
      .o = weight->shape[0], .kh = weight->shape[2], .kw = weight->shape[3],
      .oh = grad->shape[grad->ndim - 2], .ow = grad->shape[grad->ndim - 1],
      .sh = node->iattr[0], .sw = node->iattr[1], .ph = node->iattr[2], .pw = node->iattr[3],
      .dh = node->iattr[4], .dw = node->iattr[5], .groups = node->iattr[6]};
  int want[3] = {needs_grad(node, 0), needs_grad(node, 1), node->iattr[7] && needs_grad(node, 2)};
  int (*backward)(int, void *, void *, void *, const void *, const void *, const void *,
                  const ddp_conv2d_geom *);
  DDP_KERNEL(backward, input->device, conv2d_backward, "conv2d backward");
  ddp_tensor *x = NULL, *w = NULL, *go = NULL, *d[3] = {NULL, NULL, NULL};
  int status = prepared(&x, input, cd);
  if (!status) status = prepared(&w, weight, cd);
  if (!status) status = prepared(&go, grad, cd);
  const ddp_tensor *like[3] = {input, weight, NULL};
  int64_t bshape[1] = {g.o};
  for (int i = 0; i < 3 && !status; i++) {
    if (!want[i]) continue;
    status = i < 2 ? ddp_tensor_zeros(&d[i], like[i]->ndim, like[i]->shape, cd, input->device)
                   : ddp_tensor_zeros(&d[i], 1, bshape, cd, input->device);
  }
  if (!status && g.n > 0) {
    status = backward(cd, d[0] ? ddp_data(d[0]) : NULL, d[1] ? ddp_data(d[1]) : NULL,
                      d[2] ? ddp_data(d[2]) : NULL, ddp_data(go), ddp_data(x), ddp_data(w), &g);
    if (!status) status = ddp_device_check(input->device, "conv2d backward");
  }
  for (int i = 0; i < 3; i++) {
    if (!d[i]) continue;
    if (!status && cd != dtype) status = ddp_to_dtype(&gi[i], d[i], dtype);
    else if (!status) ddp_tensor_retain(gi[i] = d[i]);
    ddp_tensor_release(d[i]);
  }
  ddp_tensor_release(x), ddp_tensor_release(w), ddp_tensor_release(go);
  return status;
}

/* PyTorch's conv2d argument checks; fills *g. */
static int conv_check(ddp_conv2d_geom *g, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias) {
  DDP_TRY(ddp_check_affine_args("conv2d", input, weight, bias));
  if (input->ndim != 3 && input->ndim != 4)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: expected input (N, C, H, W) or (C, H, W), got %s", DDP_SHAPE(input));
  if (weight->ndim != 4)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: expected weight (O, C / groups, kH, kW), got %s", DDP_SHAPE(weight));
  if (g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->ph < 0 || g->pw < 0 || g->groups < 1)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1, "
             "padding (%lld, %lld) >= 0 and groups (%lld) >= 1",
             (long long)g->sh, (long long)g->sw, (long long)g->dh, (long long)g->dw,
             (long long)g->ph, (long long)g->pw, (long long)g->groups);
  int nd = input->ndim;
  g->n = nd == 3 ? 1 : input->shape[0];
  g->c = input->shape[nd - 3], g->h = input->shape[nd - 2], g->w = input->shape[nd - 1];
  g->o = weight->shape[0], g->kh = weight->shape[2], g->kw = weight->shape[3];
  if (g->c % g->groups || g->o % g->groups)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: input channels %lld and output channels %lld (weight %s) "
             "must both be divisible by groups %lld", (long long)g->c, (long long)g->o,
             DDP_SHAPE(weight), (long long)g->groups);
  if (weight->shape[1] * g->groups != g->c)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: input %s has %lld channels but weight %s with groups %lld "
             "expects %lld", DDP_SHAPE(input), (long long)g->c, DDP_SHAPE(weight),
             (long long)g->groups, (long long)(weight->shape[1] * g->groups));
  if (bias && (bias->ndim != 1 || bias->shape[0] != g->o))
    DDP_FAIL(DDP_ERR_ARG, "conv2d: bias must be (%lld,) for weight %s, got %s", (long long)g->o,
             DDP_SHAPE(weight), DDP_SHAPE(bias));
  int64_t ekh = g->dh * (g->kh - 1) + 1, ekw = g->dw * (g->kw - 1) + 1;
  int64_t hp = g->h + 2 * g->ph, wp = g->w + 2 * g->pw;
  if (g->kh < 1 || g->kw < 1 || ekh > hp || ekw > wp)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: kernel size (%lld, %lld) (dilated: (%lld, %lld)) is larger than "
             "the padded input (%lld, %lld) of input %s", (long long)g->kh, (long long)g->kw,
             (long long)ekh, (long long)ekw, (long long)hp, (long long)wp, DDP_SHAPE(input));
  g->oh = (hp - ekh) / g->sh + 1;
  g->ow = (wp - ekw) / g->sw + 1;
  if (g->oh * g->ow > INT_MAX || weight->shape[1] * g->kh * g->kw > INT_MAX || g->o > INT_MAX)
    DDP_FAIL(DDP_ERR_ARG, "conv2d: input %s with weight %s exceeds the BLAS size limit (%d)",
             DDP_SHAPE(input), DDP_SHAPE(weight), INT_MAX);
  return DDP_OK;
}

int ddp_conv2d(ddp_tensor **out, ddp_tensor *input, ddp_tensor *weight, ddp_tensor *bias,
               int64_t stride_h, int64_t stride_w, int64_t padding_h, int64_t padding_w,
               int64_t dilation_h, int64_t dilation_w, int64_t groups) {
  *out = NULL;
  ddp_tensor *ac_in[3] = {input, weight, bias}, *ac[3]; /* Note [autocast policy] */
  DDP_AUTOCAST_REENTER(DDP_AUTOCAST_OP_CONV2D, 3, ac_in, ac,
                       ddp_conv2d(out, ac[0], ac[1], ac[2], stride_h, stride_w, padding_h,
                                  padding_w, dilation_h, dilation_w, groups));
  ddp_conv2d_geom g = {.sh = stride_h, .sw = stride_w, .ph = padding_h, .pw = padding_w,
                       .dh = dilation_h, .dw = dilation_w, .groups = groups};
  DDP_TRY(conv_check(&g, input, weight, bias));
  int (*forward)(int, void *, const void *, const void *, const void *, const ddp_conv2d_geom *);
  DDP_KERNEL(forward, input->device, conv2d_forward, "conv2d");
  int dtype = input->dtype, cd = compute_dtype(dtype);
  ddp_tensor *x = NULL, *w = NULL, *b = NULL, *o = NULL;
  int64_t shape[4] = {g.n, g.o, g.oh, g.ow};
  int unbatched = input->ndim == 3;
  int status = prepared(&x, input, cd);
  if (!status) status = prepared(&w, weight, cd);
  if (!status) status = prepared(&b, bias, cd);
  if (!status) status = ddp_tensor_empty(&o, 4 - unbatched, shape + unbatched, cd, input->device);
  if (!status && g.n > 0) {
    status = forward(cd, ddp_data(o), ddp_data(x), ddp_data(w), b ? ddp_data(b) : NULL, &g);
    if (!status) status = ddp_device_check(input->device, "conv2d");
  }
  if (!status && cd != dtype) status = ddp_to_dtype(out, o, dtype);
  else if (!status) ddp_tensor_retain(*out = o);
  ddp_tensor_release(x), ddp_tensor_release(w), ddp_tensor_release(b), ddp_tensor_release(o);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  ddp_tensor *inputs[3] = {input, weight, bias};
  if (!ddp_autograd_needed(3, inputs)) return DDP_OK;
  ddp_node *n = ddp_node_new("ConvolutionBackward", conv_backward, 3, inputs, 2);
  status = n ? ddp_node_save(n, 0, input) : ddp_last_status();
  if (!status) status = ddp_node_save(n, 1, weight);
  if (status) {
    if (n) ddp_node_release(n);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  int64_t attrs[8] = {g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups, bias != NULL};
  memcpy(n->iattr, attrs, sizeof attrs);
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}
