/* runtime/ops/pool.c: front doors of max_pool2d, avg_pool2d and adaptive_avg_pool2d and
 * their backward. Shape rules follow PyTorch's Pool.h (pooling_output_shape,
 * pool2d_shape_check). Kernels come from the input's device's table (backend/cpu/pool.c,
 * backend/cuda/pool.cu). */
#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"

/* The dtype kernels run in: f16 and bf16 compute through f32. */
static int compute_dtype(int dtype) { return dtype == DDP_F64 ? DDP_F64 : DDP_F32; }

/* A contiguous detached tensor of t's values in `dtype`. */
static int prepared(ddp_tensor **out, ddp_tensor *t, int dtype) {
  *out = NULL;
  ddp_tensor *alias = ddp_tensor_alias(t), *c = NULL;
  if (!alias) return ddp_last_status();
  int status = ddp_to_dtype(&c, alias, dtype);
  ddp_tensor_release(alias);
  if (status) return status;
  status = ddp_contiguous(out, c);
  ddp_tensor_release(c);
  return status;
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* PyTorch's pooling_output_shape: with ceil_mode a last window that would start in the
 * right padding is dropped. */
static int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, int ceil_mode) {
  int64_t out = floor_div(in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) out--;
  return out;
}

/* Input checks shared by the three ops: live floating tensor (N, C, H, W) or (C, H, W) with
 * non-empty C, H, W. Fills planes, h, w. */
static int check_input(ddp_pool2d_geom *g, ddp_tensor *input, const char *op) {
  DDP_TRY(ddp_check_alive(input, op, "input"));
  if (!ddp_dtype_is_floating(input->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: expected a floating input, got %s", op, ddp_dtype_name(input->dtype));
  int nd = input->ndim;
  if ((nd != 3 && nd != 4) || input->shape[nd - 1] == 0 || input->shape[nd - 2] == 0 ||
      input->shape[nd - 3] == 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: expected input (N, C, H, W) or (C, H, W) with non-zero C, H, W, got %s",
             op, DDP_SHAPE(input));
  g->h = input->shape[nd - 2], g->w = input->shape[nd - 1];
  g->planes = input->numel / (g->h * g->w);
  return DDP_OK;
}

/* Window checks of max and avg pooling (pool2d_shape_check); fills oh, ow. */
static int check_window(ddp_pool2d_geom *g, ddp_tensor *input, int ceil_mode, const char *op) {
  if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1)
    DDP_FAIL(DDP_ERR_ARG, "%s: kernel (%lld, %lld), stride (%lld, %lld) and dilation (%lld, %lld) "
             "must be >= 1", op, (long long)g->kh, (long long)g->kw, (long long)g->sh,
             (long long)g->sw, (long long)g->dh, (long long)g->dw);
  if (g->ph < 0 || g->pw < 0 || g->ph > g->kh / 2 || g->pw > g->kw / 2)
    DDP_FAIL(DDP_ERR_ARG, "%s: padding (%lld, %lld) must be >= 0 and at most half the kernel "
             "(%lld, %lld)", op, (long long)g->ph, (long long)g->pw, (long long)g->kh,
             (long long)g->kw);
  g->oh = pooled_size(g->h, g->kh, g->ph, g->sh, g->dh, ceil_mode);
  g->ow = pooled_size(g->w, g->kw, g->pw, g->sw, g->dw, ceil_mode);
  if (g->oh < 1 || g->ow < 1)
    DDP_FAIL(DDP_ERR_ARG, "%s: input %s with kernel (%lld, %lld), padding (%lld, %lld), dilation "
             "(%lld, %lld) gives output size (%lld, %lld): too small", op, DDP_SHAPE(input),
             (long long)g->kh, (long long)g->kw, (long long)g->ph, (long long)g->pw,
             (long long)g->dh, (long long)g->dw, (long long)g->oh, (long long)g->ow);
  return DDP_OK;
}

/* A new tensor of input's rank with (oh, ow) last, in dtype. */
static int pooled_empty(ddp_tensor **out, const ddp_tensor *input, const ddp_pool2d_geom *g, int dtype) {
  int64_t shape[4];
  memcpy(shape, input->shape, sizeof(int64_t) * input->ndim);
  shape[input->ndim - 2] = g->oh, shape[input->ndim - 1] = g->ow;
  return ddp_tensor_empty(out, input->ndim, shape, dtype, input->device);
}

/* POOL_RELU_MAX: max pooling of relu(input) fused (Note [fused relu max pooling] in
 * runtime/backend/cpu/pool.c), with the device's relu_max_pool2d_* kernels; its indices are
 * u8 taps where the device's relu_max_pool2d_taps says so, else i64. */
enum { POOL_MAX, POOL_AVG, POOL_ADAPTIVE, POOL_RELU_MAX, POOL_KIND_COUNT };

/* Forward through the compute dtype: *out (input's dtype) from the kernel `kind`. */
static int pool_forward(ddp_tensor **out, ddp_tensor **indices, ddp_tensor *input,
                        const ddp_pool2d_geom *g, int kind) {
  static const char *const ops[] = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                                    "relu_max_pool2d"};
  _Static_assert(sizeof ops / sizeof ops[0] == POOL_KIND_COUNT, "one name per pooling kind");
  const ddp_kernels *k = ddp_kernels_for(input->device);
  if (kind == POOL_MAX) DDP_TRY(DDP_KERNEL_CHECK(k, max_pool2d_forward, ops[kind]));
  else if (kind == POOL_RELU_MAX) DDP_TRY(DDP_KERNEL_CHECK(k, relu_max_pool2d_forward, ops[kind]));
  else if (kind == POOL_AVG) DDP_TRY(DDP_KERNEL_CHECK(k, avg_pool2d_forward, ops[kind]));
  else DDP_TRY(DDP_KERNEL_CHECK(k, adaptive_avg_pool2d_forward, ops[kind]));
  int dtype = input->dtype, cd = compute_dtype(dtype);
  ddp_tensor *x = NULL, *o = NULL;
  int status = prepared(&x, input, cd);
  if (!status) status = pooled_empty(&o, input, g, cd);
  if (!status && kind == POOL_MAX) status = pooled_empty(indices, input, g, DDP_I64);
  if (!status && kind == POOL_RELU_MAX)
    status = pooled_empty(indices, input, g, k->relu_max_pool2d_taps(cd, g) ? DDP_U8 : DDP_I64);
  if (!status && g->planes > 0) {
    if (kind == POOL_MAX) k->max_pool2d_forward(cd, ddp_data(o), (int64_t *)ddp_data(*indices), ddp_data(x), g);
    else if (kind == POOL_RELU_MAX)
      k->relu_max_pool2d_forward(cd, ddp_data(o), ddp_data(*indices), ddp_data(x), g);
    else if (kind == POOL_AVG) k->avg_pool2d_forward(cd, ddp_data(o), ddp_data(x), g);
    else k->adaptive_avg_pool2d_forward(cd, ddp_data(o), ddp_data(x), g);
    status = ddp_device_check(input->device, ops[kind]);
  }
  if (!status && cd != dtype) status = ddp_to_dtype(out, o, dtype);
  else if (!status) ddp_tensor_retain(*out = o);
  ddp_tensor_release(x);
  ddp_tensor_release(o);
  return status;
}

/* Shared backward: d_input from grad through the kernel node->iattr[7] (a POOL_ kind). */
static int pool_backward(ddp_node *node, ddp_tensor *grad, ddp_tensor **gi) {
  const ddp_input_meta *im = &node->inputs[0];
  int kind = (int)node->iattr[7], dtype = im->dtype, cd = compute_dtype(dtype);
  static const char *const ops[] = {"max_pool2d backward", "avg_pool2d backward",
                                    "adaptive_avg_pool2d backward", "relu_max_pool2d backward"};
  _Static_assert(sizeof ops / sizeof ops[0] == POOL_KIND_COUNT, "one name per pooling kind");
  const ddp_kernels *k = ddp_kernels_for(grad->device);
  if (kind == POOL_MAX) DDP_TRY(DDP_KERNEL_CHECK(k, max_pool2d_backward, ops[kind]));
  else if (kind == POOL_RELU_MAX) DDP_TRY(DDP_KERNEL_CHECK(k, relu_max_pool2d_backward, ops[kind]));
  else if (kind == POOL_AVG) DDP_TRY(DDP_KERNEL_CHECK(k, avg_pool2d_backward, ops[kind]));
  else DDP_TRY(DDP_KERNEL_CHECK(k, adaptive_avg_pool2d_backward, ops[kind]));
  ddp_tensor *idx = NULL;
  int max = kind == POOL_MAX || kind == POOL_RELU_MAX;
  if (max && !(idx = ddp_node_saved(node, 0))) return ddp_last_status();
  ddp_pool2d_geom g = {.h = im->shape[im->ndim - 2], .w = im->shape[im->ndim - 1],
                       .oh = grad->shape[grad->ndim - 2], .ow = grad->shape[grad->ndim - 1],
                       .kh = node->iattr[0], .kw = node->iattr[1], .sh = node->iattr[2],
                       .sw = node->iattr[3], .ph = node->iattr[4], .pw = node->iattr[5],
                       .dh = 1, .dw = 1, .count_include_pad = (int)node->iattr[6]};
  if (max) /* dilation not kept: 1 when undilated, else 0 (see pool_record) */
    g.dh = g.dw = node->iattr[6] ? 1 : 0, g.count_include_pad = 0;
  ddp_tensor *go = NULL, *d = NULL, *idxc = NULL;
  int status = prepared(&go, grad, cd);
  if (!status && idx) status = ddp_contiguous(&idxc, idx);
  if (!status && kind == POOL_RELU_MAX &&
      (idx->dtype == DDP_U8) != (k->relu_max_pool2d_taps && k->relu_max_pool2d_taps(cd, &g)))
    status = DDP_ERROR(DDP_ERR_STATE, "relu_max_pool2d backward: the saved indices (%s) are not "
                       "those the %s kernels take", ddp_dtype_name(idx->dtype), k->name);
  /* the kernels write every element of d (runtime/backend/cpu/pool.h) */
  if (!status) status = ddp_tensor_empty(&d, im->ndim, im->shape, cd, grad->device);
  if (!status) {
    g.planes = d->numel / (g.h * g.w);
    if (g.planes > 0) {
      if (kind == POOL_MAX) k->max_pool2d_backward(cd, ddp_data(d), ddp_data(go), (const int64_t *)ddp_data(idxc), &g);
      else if (kind == POOL_RELU_MAX) k->relu_max_pool2d_backward(cd, ddp_data(d), ddp_data(go), ddp_data(idxc), &g);
      else if (kind == POOL_AVG) k->avg_pool2d_backward(cd, ddp_data(d), ddp_data(go), &g);
      else k->adaptive_avg_pool2d_backward(cd, ddp_data(d), ddp_data(go), &g);
      status = ddp_device_check(grad->device, ops[kind]);
    }
  }
  if (!status && cd != dtype) status = ddp_to_dtype(&gi[0], d, dtype);
  else if (!status) ddp_tensor_retain(gi[0] = d);
  ddp_tensor_release(d), ddp_tensor_release(go), ddp_tensor_release(idxc); /* idx is borrowed from the node */
  return status;
}

/* Record the pooling node on *out (saving `saved` when not NULL). */
static int pool_record(ddp_tensor **out, ddp_tensor *input, const char *name,
                       const ddp_pool2d_geom *g, int kind, ddp_tensor *saved) {
  if (!ddp_autograd_needed(1, &input)) return DDP_OK;
  ddp_node *n = ddp_node_new(name, pool_backward, 1, &input, saved ? 1 : 0);
  int status = n ? (saved ? ddp_node_save(n, 0, saved) : DDP_OK) : ddp_last_status();
  if (status) {
    if (n) ddp_node_release(n);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  /* attribute 6: count_include_pad for avg pooling; for max pooling whether the windows are
   * undilated (all its backward needs to know of the dilation: the indices are absolute,
   * and undilated 2x2 stride-2 windows take the CPU's one-pass kernel) */
  int max = kind == POOL_MAX || kind == POOL_RELU_MAX;
  int64_t attr6 = max ? (g->dh == 1 && g->dw == 1) : g->count_include_pad;
  int64_t attrs[8] = {g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, attr6, kind};
  memcpy(n->iattr, attrs, sizeof attrs);
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}

int ddp_max_pool2d(ddp_tensor **out, ddp_tensor **indices, ddp_tensor *input,
                   int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                   int64_t padding_h, int64_t padding_w, int64_t dilation_h, int64_t dilation_w,
                   int ceil_mode) {
  *out = NULL;
  if (indices) *indices = NULL;
  ddp_pool2d_geom g = {.kh = kernel_h, .kw = kernel_w, .sh = stride_h, .sw = stride_w,
                       .ph = padding_h, .pw = padding_w, .dh = dilation_h, .dw = dilation_w};
  DDP_TRY(check_input(&g, input, "max_pool2d"));
  DDP_TRY(check_window(&g, input, ceil_mode, "max_pool2d"));
  ddp_tensor *idx = NULL;
  int status = pool_forward(out, &idx, input, &g, POOL_MAX);
  if (!status) status = pool_record(out, input, "MaxPool2DWithIndicesBackward", &g, POOL_MAX, idx);
  if (status || !indices) ddp_tensor_release(idx);
  else *indices = idx;
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}

int ddp_avg_pool2d(ddp_tensor **out, ddp_tensor *input, int64_t kernel_h, int64_t kernel_w,
                   int64_t stride_h, int64_t stride_w, int64_t padding_h, int64_t padding_w,
                   int ceil_mode, int count_include_pad) {
  *out = NULL;
  ddp_pool2d_geom g = {.kh = kernel_h, .kw = kernel_w, .sh = stride_h, .sw = stride_w,
                       .ph = padding_h, .pw = padding_w, .dh = 1, .dw = 1,
                       .count_include_pad = count_include_pad != 0};
  DDP_TRY(check_input(&g, input, "avg_pool2d"));
  DDP_TRY(check_window(&g, input, ceil_mode, "avg_pool2d"));
  DDP_TRY(pool_forward(out, NULL, input, &g, POOL_AVG));
  return pool_record(out, input, "AvgPool2DBackward", &g, POOL_AVG, NULL);
}

int ddp_adaptive_avg_pool2d(ddp_tensor **out, ddp_tensor *input, int64_t out_h, int64_t out_w) {
  *out = NULL;
  ddp_pool2d_geom g = {.oh = out_h, .ow = out_w};
  DDP_TRY(check_input(&g, input, "adaptive_avg_pool2d"));
  if (out_h < 1 || out_w < 1)
    DDP_FAIL(DDP_ERR_ARG, "adaptive_avg_pool2d: output size (%lld, %lld) must be >= 1 for input %s",
             (long long)out_h, (long long)out_w, DDP_SHAPE(input));
  g.oh = out_h, g.ow = out_w;
  DDP_TRY(pool_forward(out, NULL, input, &g, POOL_ADAPTIVE));
  return pool_record(out, input, "AdaptiveAvgPool2DBackward", &g, POOL_ADAPTIVE, NULL);
}

int ddp_relu_max_pool2d(ddp_tensor **out, ddp_tensor *input, int64_t kernel_h, int64_t kernel_w,
                        int64_t stride_h, int64_t stride_w, int64_t padding_h, int64_t padding_w,
                        int64_t dilation_h, int64_t dilation_w, int ceil_mode) {
  *out = NULL;
  ddp_pool2d_geom g = {.kh = kernel_h, .kw = kernel_w, .sh = stride_h, .sw = stride_w,
                       .ph = padding_h, .pw = padding_w, .dh = dilation_h, .dw = dilation_w};
  DDP_TRY(check_input(&g, input, "relu_max_pool2d"));
  DDP_TRY(check_window(&g, input, ceil_mode, "relu_max_pool2d"));
  const ddp_kernels *k = ddp_kernels_for(input->device);
  if (!k || !k->relu_max_pool2d_forward || !k->relu_max_pool2d_taps || !k->relu_max_pool2d_backward) {
    /* no fused kernels: the two ops */
    ddp_tensor *r = NULL;
    DDP_TRY(ddp_relu(&r, input));
    int status = ddp_max_pool2d(out, NULL, r, kernel_h, kernel_w, stride_h, stride_w, padding_h,
                                padding_w, dilation_h, dilation_w, ceil_mode);
    ddp_tensor_release(r);
    return status;
  }
  ddp_tensor *idx = NULL;
  int status = pool_forward(out, &idx, input, &g, POOL_RELU_MAX);
  if (!status) status = pool_record(out, input, "ReluMaxPool2DWithIndicesBackward", &g, POOL_RELU_MAX, idx);
  ddp_tensor_release(idx);
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return status;
}
