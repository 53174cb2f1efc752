/* runtime/ops/autocast.c: autocast's state (ddplua/amp.h) and the casts the front doors make
 * (runtime/ops/autocast.h).
 *
 * Note [autocast policy]: PyTorch's autocast decides per op, at its dispatcher, whether the
 * op runs in the lower precision dtype, in f32, or in the widest of its inputs, from one list
 * per device type (PyTorch 1.13, aten/src/ATen/autocast_mode.cpp: TORCH_LIBRARY_IMPL(aten,
 * Autocast, ...) for CUDA, TORCH_LIBRARY_IMPL(aten, AutocastCPU, ...) for the CPU, each with
 * its lower_precision_fp, fp32, fp32_set_opt_dtype and promote lists). ddplua has one
 * dispatch path per op (its front door in runtime/ops/), so the decision is made there, by
 * one line at the top of the front doors of the ops below (DDP_AUTOCAST_REENTER), from the
 * table `policies`, one column per device type:
 *
 *   op             cpu (AutocastCPU)     cuda (Autocast)
 *   matmul, bmm,   lower precision       lower precision     (lower_precision_fp on both)
 *   linear, conv2d
 *   softmax,       as without autocast   f32                 (CUDA: fp32_set_opt_dtype;
 *   log_softmax,                                              the CPU lists omit them)
 *   sum
 *   exp, log,      as without autocast   f32                 (CUDA: fp32)
 *   layer_norm
 *   mean           as without autocast   as without autocast (in neither list)
 *   cross_entropy  f32                   f32                 (CPU: cross_entropy_loss in
 *                                                             fp32; CUDA: its log_softmax
 *                                                             and nll_loss parts are f32)
 *   nll_loss,      f32                   f32                 (fp32 on both)
 *   mse_loss
 *   batch_norm     as without autocast   as without autocast (in neither list: a half
 *                                                             input with f32 affine
 *                                                             parameters runs natively and
 *                                                             gives the input's dtype)
 *
 * "As without autocast" runs the op in its input's dtype (a bf16 tensor gives a bf16
 * softmax, computed in f32 and rounded once: Note [half softmax backward] in
 * runtime/ops/reduce.c). The CPU column was checked against PyTorch 1.13.1 (Debian's
 * python3-torch) by running each op under torch.autocast("cpu", dtype=torch.bfloat16) on
 * bf16 and on f32 inputs (spec/amp/autocast_lists_spec.lua has the resulting table); the
 * CUDA column follows the 1.13 source lists. Where 1.13 raises, ddplua does not:
 * layer_norm of a bf16 input with f32 weight and bias (1.13's CPU kernel: "expected scalar
 * type BFloat16 but found Float") runs in f32 and gives bf16, as batch_norm does. Every
 * other op runs as without autocast on both device types (binary ops already promote to the
 * widest input; unary, pooling, activation and shape ops keep their input's dtype). f64
 * tensors and non-floating tensors are never cast (PyTorch's eligibility rule). A cast is
 * the op ddp_to_dtype, so gradients flow back to the f32 tensor in its dtype. Before issue
 * 23 both device types used the CUDA column (with mean in f32 and batch_norm promoting).
 *
 * Note [autocast cast cache]: a parameter used by several ops in one region (or by every
 * step of an unrolled loop in one region) is cast once: a cast of a leaf tensor that
 * requires grad, made while grad mode is on, is kept with the parameter's storage version
 * until the outermost region ends (ddp_autocast_nesting_add back to 0), as PyTorch's
 * autocast cache. A parameter changed in place since (its version moved) is cast again.
 * Casts made under no_grad are not kept: they carry no autograd history, and a later use
 * with grad mode on must record one. */
#include "ops/autocast.h"

#include <stdlib.h>

#include "ddplua.h"

typedef struct {
  int enabled;
  int dtype;
} autocast_state;

static __thread autocast_state states[2] = {{0, DDP_BF16}, {0, DDP_F16}};
static __thread int nesting;

typedef struct {
  ddp_tensor *src;  /* the parameter (a reference) */
  int64_t version;  /* its storage version when cast */
  int dtype;
  ddp_tensor *cast; /* a reference */
} cache_entry;

static __thread cache_entry *cache;
static __thread int cache_len, cache_cap;

/* Note [autocast policy]: policies[op][device type]. */
static const ddp_autocast_policy policies[DDP_AUTOCAST_OP_COUNT][2] = {
    /*                                  cpu                 cuda */
    [DDP_AUTOCAST_OP_MATMUL] =        {DDP_AUTOCAST_LOWER, DDP_AUTOCAST_LOWER},
    [DDP_AUTOCAST_OP_BMM] =           {DDP_AUTOCAST_LOWER, DDP_AUTOCAST_LOWER},
    [DDP_AUTOCAST_OP_LINEAR] =        {DDP_AUTOCAST_LOWER, DDP_AUTOCAST_LOWER},
    [DDP_AUTOCAST_OP_CONV2D] =        {DDP_AUTOCAST_LOWER, DDP_AUTOCAST_LOWER},
    [DDP_AUTOCAST_OP_SOFTMAX] =       {DDP_AUTOCAST_NONE, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_LOG_SOFTMAX] =   {DDP_AUTOCAST_NONE, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_SUM] =           {DDP_AUTOCAST_NONE, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_MEAN] =          {DDP_AUTOCAST_NONE, DDP_AUTOCAST_NONE},
    [DDP_AUTOCAST_OP_EXP] =           {DDP_AUTOCAST_NONE, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_LOG] =           {DDP_AUTOCAST_NONE, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_CROSS_ENTROPY] = {DDP_AUTOCAST_F32, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_NLL_LOSS] =      {DDP_AUTOCAST_F32, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_MSE_LOSS] =      {DDP_AUTOCAST_F32, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_LAYER_NORM] =    {DDP_AUTOCAST_NONE, DDP_AUTOCAST_F32},
    [DDP_AUTOCAST_OP_BATCH_NORM] =    {DDP_AUTOCAST_NONE, DDP_AUTOCAST_NONE},
};
_Static_assert(sizeof policies / sizeof policies[0] == DDP_AUTOCAST_OP_COUNT,
               "policies must have one row per ddp_autocast_op");
_Static_assert(DDP_AUTOCAST_CPU == 0 && DDP_AUTOCAST_CUDA == 1,
               "policies' columns are indexed by the device type");

static int valid_type(int device_type) {
  return device_type == DDP_AUTOCAST_CPU || device_type == DDP_AUTOCAST_CUDA;
}

int ddp_autocast_set_enabled(int device_type, int enabled) {
  if (!valid_type(device_type))
    DDP_FAIL(DDP_ERR_ARG, "autocast: unknown device type %d (0: cpu, 1: cuda)", device_type);
  states[device_type].enabled = enabled != 0;
  return DDP_OK;
}

int ddp_autocast_is_enabled(int device_type) {
  return valid_type(device_type) ? states[device_type].enabled : 0;
}

int ddp_autocast_set_dtype(int device_type, int dtype) {
  if (!valid_type(device_type))
    DDP_FAIL(DDP_ERR_ARG, "autocast: unknown device type %d (0: cpu, 1: cuda)", device_type);
  if (dtype != DDP_F16 && dtype != DDP_BF16)
    DDP_FAIL(DDP_ERR_ARG, "autocast: the lower precision dtype must be f16 or bf16, got %s",
             dtype >= 0 && dtype < DDP_DTYPE_COUNT ? ddp_dtype_name(dtype) : "an unknown dtype");
  states[device_type].dtype = dtype;
  return DDP_OK;
}

int ddp_autocast_get_dtype(int device_type) {
  return valid_type(device_type) ? states[device_type].dtype : -1;
}

void ddp_autocast_clear_cache(void) {
  for (int i = 0; i < cache_len; i++) {
    ddp_tensor_release(cache[i].src);
    ddp_tensor_release(cache[i].cast);
  }
  free(cache);
  cache = NULL;
  cache_len = cache_cap = 0;
}

int ddp_autocast_nesting_add(int delta) {
  nesting += delta;
  if (nesting < 0) nesting = 0;
  if (nesting == 0) ddp_autocast_clear_cache();
  return nesting;
}

unsigned ddp_autocast_suspend(void) {
  unsigned saved = (unsigned)states[0].enabled | (unsigned)states[1].enabled << 1;
  states[0].enabled = states[1].enabled = 0;
  return saved;
}

void ddp_autocast_resume(unsigned saved) {
  states[0].enabled = saved & 1;
  states[1].enabled = (saved >> 1) & 1;
}

/* ---- the casts (Note [autocast policy]) --------------------------------------------------- */

static int eligible(const ddp_tensor *t) {
  return t && ddp_dtype_is_floating(t->dtype) && t->dtype != DDP_F64;
}

/* Rank of a floating dtype for "widest": f16 and bf16 both below f32 (mixed: f32). */
static int width(int dtype) { return dtype == DDP_F64 ? 3 : dtype == DDP_F32 ? 2 : 1; }

ddp_autocast_policy ddp_autocast_policy_of(ddp_autocast_op op, int device_type) {
  if ((int)op < 0 || op >= DDP_AUTOCAST_OP_COUNT || !valid_type(device_type))
    return DDP_AUTOCAST_NONE;
  return policies[op][device_type];
}

/* The dtype op's inputs go to, or -1 when autocast is off for their device type or op's
 * policy there is DDP_AUTOCAST_NONE. */
static int target_dtype(ddp_autocast_op op, int n, ddp_tensor *const *in) {
  const ddp_tensor *first = NULL;
  for (int i = 0; i < n && !first; i++) first = in[i];
  if (!first || !first->storage) return -1;
  int type = first->device == DDP_DEVICE_CPU ? DDP_AUTOCAST_CPU : DDP_AUTOCAST_CUDA;
  const autocast_state *s = &states[type];
  if (!s->enabled) return -1;
  switch (ddp_autocast_policy_of(op, type)) {
  case DDP_AUTOCAST_NONE: return -1;
  case DDP_AUTOCAST_LOWER: return s->dtype;
  case DDP_AUTOCAST_F32: return DDP_F32;
  case DDP_AUTOCAST_PROMOTE: {
    int best = -1, mixed_half = 0;
    for (int i = 0; i < n; i++) {
      if (!in[i] || !in[i]->storage || !ddp_dtype_is_floating(in[i]->dtype)) continue;
      if (best >= 0 && width(in[i]->dtype) == 1 && width(best) == 1 && in[i]->dtype != best)
        mixed_half = 1;
      if (best < 0 || width(in[i]->dtype) > width(best)) best = in[i]->dtype;
    }
    return mixed_half && width(best) == 1 ? DDP_F32 : best;
  }
  }
  return -1;
}

int ddp_autocast_needed(ddp_autocast_op op, int n, ddp_tensor *const *in) {
  if (!states[0].enabled && !states[1].enabled) return 0; /* the common case, cheaply */
  int to = target_dtype(op, n, in);
  if (to < 0) return 0;
  for (int i = 0; i < n; i++)
    if (eligible(in[i]) && in[i]->storage && in[i]->dtype != to) return 1;
  return 0;
}

/* The cast of t to dtype, from the cache or made (and kept when Note [autocast cast cache]
 * allows). */
static int cast_one(ddp_tensor **out, ddp_tensor *t, int dtype) {
  int cacheable = t->requires_grad && !t->grad_fn && ddp_grad_enabled();
  int64_t version = t->storage->version;
  if (cacheable) {
    for (int i = 0; i < cache_len; i++) {
      cache_entry *e = &cache[i];
      if (e->src == t && e->dtype == dtype && e->version == version) {
        ddp_tensor_retain(e->cast);
        *out = e->cast;
        return DDP_OK;
      }
    }
  }
  DDP_TRY(ddp_to_dtype(out, t, dtype));
  if (!cacheable) return DDP_OK;
  if (cache_len == cache_cap) {
    int cap = cache_cap ? 2 * cache_cap : 16;
    cache_entry *grown = realloc(cache, sizeof *cache * (size_t)cap);
    if (!grown) return DDP_OK; /* not kept: the next use casts again */
    cache = grown;
    cache_cap = cap;
  }
  ddp_tensor_retain(t);
  ddp_tensor_retain(*out);
  cache[cache_len++] = (cache_entry){t, version, dtype, *out};
  return DDP_OK;
}

int ddp_autocast_cast(ddp_autocast_op op, int n, ddp_tensor *const *in, ddp_tensor **out) {
  int to = target_dtype(op, n, in);
  for (int i = 0; i < n; i++) out[i] = NULL;
  for (int i = 0; i < n; i++) {
    if (!in[i]) continue;
    int status;
    if (to >= 0 && eligible(in[i]) && in[i]->storage && in[i]->dtype != to) {
      status = cast_one(&out[i], in[i], to);
    } else {
      ddp_tensor_retain(in[i]);
      out[i] = in[i];
      status = DDP_OK;
    }
    if (status) {
      ddp_autocast_release(n, out);
      return status;
    }
  }
  return DDP_OK;
}

void ddp_autocast_release(int n, ddp_tensor **t) {
  for (int i = 0; i < n; i++) {
    ddp_tensor_release(t[i]);
    t[i] = NULL;
  }
}
