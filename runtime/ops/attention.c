/* runtime/ops/attention.c: the front door of scaled_dot_product_attention (contract in
 * ddplua/ops_attention.h): argument checks, the mask's broadcast strides, the dropout
 * draw, one call through the device's kernel table (attention_forward /
 * attention_backward; the algorithm is Note [flash attention] in
 * runtime/backend/cpu/attention.c) and the autograd node. Half inputs (f16, bf16) run
 * through f32 (converted with the differentiable ddp_to_dtype, so the result is rounded to
 * the half type once). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tape/tape.h"
#include "backend/kernels.h"
#include "core/core.h"
#include "ops/copy.h"

static const char *const OP = "scaled_dot_product_attention";

static int is_half(int dtype) { return dtype == DDP_F16 || dtype == DDP_BF16; }

/* 1 when backward must produce a gradient for input i of node n. */
static int wanted(const ddp_node *n, int i) { return n->edges[i].fn || n->edges[i].leaf; }

/* *out = t itself (a detached alias) when the kernels can read it in place: dtype `dtype`,
 * contiguous rows (last stride 1) and a row stride of at least the row length (a BLAS
 * leading dimension): the (..., T, H, hd).transpose views of a model's q, k, v qualify.
 * Otherwise a contiguous copy. Then sb / sl get its batch and row strides (elements). */
static int readable_as(ddp_tensor **out, ddp_tensor *t, int dtype, int64_t *sb, int64_t *sl) {
  int nd = t->ndim;
  int64_t n = t->shape[nd - 1], rows = t->shape[nd - 2];
  int64_t row_stride = rows == 1 ? n : t->strides[nd - 2];
  int in_place = t->dtype == dtype && n > 0 && (n == 1 || t->strides[nd - 1] == 1) && row_stride >= n;
  for (int d = 0; d < nd - 2 && in_place; d++) in_place = t->strides[d] >= 0;
  if (in_place) {
    if (!(*out = ddp_tensor_alias(t))) return ddp_last_status();
  } else {
    DDP_TRY(ddp_detached_as(out, t, dtype));
    row_stride = n;
  }
  for (int d = 0; d < nd - 2; d++) sb[d] = (*out)->strides[d];
  *sl = row_stride;
  return DDP_OK;
}

static void release_all(ddp_tensor **ts, int n) {
  for (int i = 0; i < n; i++) ddp_tensor_release(ts[i]);
}

/* Saved slots of ScaledDotProductAttentionBackward; the geometry (with the dropout's
 * Philox state) is the node's extra block. */
enum { SA_Q, SA_K, SA_V, SA_OUT, SA_LSE, SA_MASK, SA_SAVED };

static int attention_backward(ddp_node *n, ddp_tensor *grad, ddp_tensor **gi) {
  const ddp_attention_geom *g = n->extra;
  ddp_tensor *q = ddp_node_saved(n, SA_Q), *k = ddp_node_saved(n, SA_K);
  ddp_tensor *v = ddp_node_saved(n, SA_V), *o = ddp_node_saved(n, SA_OUT);
  ddp_tensor *lse = ddp_node_saved(n, SA_LSE);
  ddp_tensor *mask = g->mask ? ddp_node_saved(n, SA_MASK) : NULL;
  if (!q || !k || !v || !o || !lse || (g->mask && !mask)) return ddp_last_status();
  int dt = q->dtype, dev = q->device;
  const ddp_kernels *kt = ddp_kernels_for(dev);
  DDP_TRY(DDP_KERNEL_CHECK(kt, attention_backward, "ScaledDotProductAttentionBackward"));
  ddp_tensor *tmp[5] = {0}; /* dout, dq, dk, dv, dmask (full) */
  int status;
  if ((status = ddp_detached_as(&tmp[0], grad, dt)) ||
      (status = ddp_tensor_zeros(&tmp[1], q->ndim, q->shape, dt, dev)) ||
      (status = ddp_tensor_zeros(&tmp[2], k->ndim, k->shape, dt, dev)) ||
      (status = ddp_tensor_zeros(&tmp[3], v->ndim, v->shape, dt, dev)))
    goto done;
  int want_mask = g->mask == DDP_ATTN_MASK_ADD && n->n_inputs > 3 && wanted(n, 3);
  if (want_mask) {
    int64_t shape[DDP_MAX_DIMS];
    memcpy(shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    shape[q->ndim - 1] = g->s;
    if ((status = ddp_tensor_empty(&tmp[4], q->ndim, shape, dt, dev))) goto done;
  }
  if ((status = kt->attention_backward(dt, ddp_data(tmp[1]), ddp_data(tmp[2]), ddp_data(tmp[3]),
                                       tmp[4] ? ddp_data(tmp[4]) : NULL, ddp_data(tmp[0]),
                                       ddp_data(q), ddp_data(k), ddp_data(v), ddp_data(o),
                                       ddp_data(lse), mask ? ddp_data(mask) : NULL, g)) ||
      (status = ddp_device_check(dev, "ScaledDotProductAttentionBackward")))
    goto done;
  for (int i = 0; i < 3; i++)
    if (wanted(n, i)) {
      gi[i] = tmp[1 + i];
      tmp[1 + i] = NULL;
    }
  if (want_mask) {
    const ddp_input_meta *m = &n->inputs[3];
    status = ddp_sum_to_shape(&gi[3], tmp[4], m->ndim, m->shape);
  }
done:
  release_all(tmp, 5);
  return status;
}

/* The checks of PyTorch's scaled_dot_product_attention, with its words where it has them. */
static int check_args(ddp_tensor *q, ddp_tensor *k, ddp_tensor *v, ddp_tensor *mask,
                      double dropout_p, int is_causal, double scale) {
  DDP_TRY(ddp_check_alive(q, OP, "query"));
  DDP_TRY(ddp_check_alive(k, OP, "key"));
  DDP_TRY(ddp_check_alive(v, OP, "value"));
  if (mask) DDP_TRY(ddp_check_alive(mask, OP, "attn_mask"));
  {
    ddp_tensor *ts[4] = {q, k, v, mask};
    const char *names[4] = {"query", "key", "value", "attn_mask"};
    DDP_TRY(ddp_check_same_device(OP, 4, ts, names));
  }
  if (!ddp_dtype_is_floating(q->dtype))
    DDP_FAIL(DDP_ERR_ARG, "%s: query must be floating, got %s", OP, ddp_dtype_name(q->dtype));
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: Expected query, key, and value to have the same dtype, but got "
             "query.dtype: %s key.dtype: %s and value.dtype: %s instead.", OP,
             ddp_dtype_name(q->dtype), ddp_dtype_name(k->dtype), ddp_dtype_name(v->dtype));
  if (q->ndim < 2 || k->ndim != q->ndim || v->ndim != q->ndim)
    DDP_FAIL(DDP_ERR_ARG, "%s: query %s, key %s and value %s must have the same number (>= 2) "
             "of dimensions: (..., L, E), (..., S, E), (..., S, Ev)", OP, DDP_SHAPE(q),
             DDP_SHAPE(k), DDP_SHAPE(v));
  int nd = q->ndim;
  for (int d = 0; d < nd - 2; d++)
    if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d])
      DDP_FAIL(DDP_ERR_ARG, "%s: the batch dimensions of query %s, key %s and value %s differ "
               "(dim %d)", OP, DDP_SHAPE(q), DDP_SHAPE(k), DDP_SHAPE(v), d + 1);
  if (k->shape[nd - 1] != q->shape[nd - 1])
    DDP_FAIL(DDP_ERR_ARG, "%s: query %s and key %s must have the same embedding size E (last "
             "dim)", OP, DDP_SHAPE(q), DDP_SHAPE(k));
  if (v->shape[nd - 2] != k->shape[nd - 2])
    DDP_FAIL(DDP_ERR_ARG, "%s: key %s and value %s must have the same sequence length S "
             "(dim %d)", OP, DDP_SHAPE(k), DDP_SHAPE(v), nd - 1);
  if (mask) {
    if (is_causal)
      DDP_FAIL(DDP_ERR_ARG, "%s: Explicit attn_mask should not be set when is_causal=True", OP);
    if (mask->dtype != DDP_BOOL && mask->dtype != q->dtype)
      DDP_FAIL(DDP_ERR_ARG, "%s: Expected attn_mask dtype to be bool or to match query dtype, "
               "but got attn_mask.dtype: %s and query.dtype: %s instead.", OP,
               ddp_dtype_name(mask->dtype), ddp_dtype_name(q->dtype));
    int64_t target[DDP_MAX_DIMS], b[DDP_MAX_DIMS];
    memcpy(target, q->shape, sizeof(int64_t) * (size_t)nd);
    target[nd - 1] = k->shape[nd - 2];
    int nb = ddp_broadcast_shapes(mask->ndim, mask->shape, nd, target, b);
    if (nb != nd || memcmp(b, target, sizeof(int64_t) * (size_t)nd))
      DDP_FAIL(DDP_ERR_ARG, "%s: attn_mask %s does not broadcast to (..., L, S) = %s", OP,
               DDP_SHAPE(mask), ddp_shape_str(nd, target));
  }
  if (!(dropout_p >= 0 && dropout_p < 1))
    DDP_FAIL(DDP_ERR_ARG, "%s: dropout_p must be in [0, 1), got %g", OP, dropout_p);
  if (!isnan(scale) && !isfinite(scale))
    DDP_FAIL(DDP_ERR_ARG, "%s: scale must be finite, got %g", OP, scale);
  return DDP_OK;
}

/* The computation for contiguous-able q, k, v of one floating dtype (f32 or f64). */
static int attention_compute(ddp_tensor **out, ddp_tensor *query, ddp_tensor *key,
                             ddp_tensor *value, ddp_tensor *attn_mask, double dropout_p,
                             int is_causal, double scale, ddp_generator *gen) {
  int dt = query->dtype, dev = query->device, nd = query->ndim;
  const ddp_kernels *kt = ddp_kernels_for(dev);
  DDP_TRY(DDP_KERNEL_CHECK(kt, attention_forward, OP));
  ddp_attention_geom *g = calloc(1, sizeof *g);
  if (!g) DDP_FAIL(DDP_ERR_MEMORY, "%s: out of memory", OP);
  g->nb = nd - 2;
  g->bh = 1;
  for (int d = 0; d < nd - 2; d++) g->bh *= (g->batch_shape[d] = query->shape[d]);
  g->l = query->shape[nd - 2];
  g->e = query->shape[nd - 1];
  g->s = key->shape[nd - 2];
  g->ev = value->shape[nd - 1];
  g->scale = isnan(scale) ? 1.0 / sqrt((double)g->e) : scale;
  g->causal = is_causal != 0;
  g->dropout_p = dropout_p;
  ddp_tensor *tmp[5] = {0}; /* q, k, v, mask, lse */
  int status;
  if ((status = readable_as(&tmp[0], query, dt, g->q_sb, &g->q_sl)) ||
      (status = readable_as(&tmp[1], key, dt, g->k_sb, &g->k_sl)) ||
      (status = readable_as(&tmp[2], value, dt, g->v_sb, &g->v_sl)) ||
      (attn_mask && (status = ddp_detached_as(&tmp[3], attn_mask, attn_mask->dtype))))
    goto done;
  if (attn_mask) {
    /* strides of the contiguous mask, right-aligned against (batch..., L, S), 0 where it
     * broadcasts */
    g->mask = attn_mask->dtype == DDP_BOOL ? DDP_ATTN_MASK_BOOL : DDP_ATTN_MASK_ADD;
    int64_t st[DDP_MAX_DIMS] = {0}, stride = 1;
    int lead = nd - attn_mask->ndim;
    for (int d = attn_mask->ndim - 1; d >= 0; d--) {
      st[lead + d] = attn_mask->shape[d] == 1 ? 0 : stride;
      stride *= attn_mask->shape[d];
    }
    for (int d = 0; d < nd - 2; d++) g->mask_sb[d] = st[d];
    g->mask_sl = st[nd - 2];
    g->mask_ss = st[nd - 1];
  }
  if (dropout_p > 0) {
    uint64_t elems = (uint64_t)g->bh * (uint64_t)g->l * (uint64_t)g->s;
    ddp_generator_take(gen, (elems + 3) / 4, &g->seed, &g->offset);
  }
  int64_t oshape[DDP_MAX_DIMS];
  memcpy(oshape, query->shape, sizeof(int64_t) * (size_t)nd);
  oshape[nd - 1] = g->ev;
  if ((status = ddp_tensor_empty(out, nd, oshape, dt, dev)) ||
      (status = ddp_tensor_empty(&tmp[4], nd - 1, query->shape, dt, dev)))
    goto done;
  if ((status = kt->attention_forward(dt, ddp_data(*out), ddp_data(tmp[4]), ddp_data(tmp[0]),
                                      ddp_data(tmp[1]), ddp_data(tmp[2]),
                                      tmp[3] ? ddp_data(tmp[3]) : NULL, g)) ||
      (status = ddp_device_check(dev, OP)))
    goto done;
  ddp_tensor *inputs[4] = {query, key, value, g->mask == DDP_ATTN_MASK_ADD ? attn_mask : NULL};
  if (ddp_autograd_needed(4, inputs)) {
    ddp_node *n = ddp_node_new("ScaledDotProductAttentionBackward", attention_backward, 4,
                               inputs, SA_SAVED);
    if (!n) {
      status = ddp_last_status();
      goto done;
    }
    n->extra = g;
    n->extra_free = free;
    g = NULL;
    ddp_autograd_set_output(*out, n);
    if ((status = ddp_node_save(n, SA_Q, tmp[0])) || (status = ddp_node_save(n, SA_K, tmp[1])) ||
        (status = ddp_node_save(n, SA_V, tmp[2])) || (status = ddp_node_save(n, SA_OUT, *out)) ||
        (status = ddp_node_save(n, SA_LSE, tmp[4])) ||
        (status = ddp_node_save(n, SA_MASK, tmp[3])))
      goto done;
  }
done:
  if (status) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  free(g);
  release_all(tmp, 5);
  return status;
}

int ddp_scaled_dot_product_attention(ddp_tensor **out, ddp_tensor *query, ddp_tensor *key,
                                     ddp_tensor *value, ddp_tensor *attn_mask, double dropout_p,
                                     int is_causal, double scale, ddp_generator *gen) {
  *out = NULL;
  DDP_TRY(check_args(query, key, value, attn_mask, dropout_p, is_causal, scale));
  if (is_half(query->dtype)) {
    ddp_tensor *t[4] = {0}, *r32 = NULL;
    int status;
    if (!(status = ddp_to_dtype(&t[0], query, DDP_F32)) &&
        !(status = ddp_to_dtype(&t[1], key, DDP_F32)) &&
        !(status = ddp_to_dtype(&t[2], value, DDP_F32))) {
      if (attn_mask && attn_mask->dtype != DDP_BOOL)
        status = ddp_to_dtype(&t[3], attn_mask, DDP_F32);
      else if (attn_mask) {
        ddp_tensor_retain(attn_mask);
        t[3] = attn_mask;
      }
    }
    if (!status)
      status = attention_compute(&r32, t[0], t[1], t[2], t[3], dropout_p, is_causal, scale, gen);
    release_all(t, 4);
    if (status) return status;
    status = ddp_to_dtype(out, r32, query->dtype);
    ddp_tensor_release(r32);
    return status;
  }
  return attention_compute(out, query, key, value, attn_mask, dropout_p, is_causal, scale, gen);
}
