/* runtime/ops/comm_math.c: the front doors of the comm layer's arithmetic (ddplua/ops_reduce.h:
 * ddp_reduce_tensors, ddp_reduce_tensors_all, ddp_scale_into, ddp_cast_scale_into), one call
 * each through the kernel table of the tensors' device (Note [reduction entries] in
 * runtime/backend/kernels.h). The collectives call the table's entries on raw buffers (the
 * shared-memory segment, Gloo's staging buffers); these doors give the same entries to tensors,
 * which is how the backend-ops harness checks every device against the CPU. Nothing here
 * records autograd. */
#include <stdio.h>
#include <string.h>

#include "backend/kernels.h"

/* t (named arg) is live, contiguous, on `device` (device < -1: t sets it) with `numel`
 * elements (numel < 0: any). */
static int check_operand(const ddp_tensor *t, const char *op, const char *arg, int *device,
                         int64_t numel) {
  DDP_TRY(ddp_check_alive(t, op, arg));
  if (!ddp_tensor_is_contiguous(t))
    DDP_FAIL(DDP_ERR_ARG, "%s: %s must be contiguous (call :contiguous() first)", op, arg);
  if (*device < -1)
    *device = t->device;
  else if (t->device != *device)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s is on %s but the other tensors are on %s (all must be on one "
             "device)", op, arg, ddp_device_str(t->device), ddp_device_str(*device));
  if (numel >= 0 && t->numel != numel)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has %lld elements but %lld were expected (the first tensor's "
             "numel)", op, arg, (long long)t->numel, (long long)numel);
  return DDP_OK;
}

static int check_reduce_dtype(const ddp_tensor *t, int dtype, const char *op, const char *arg) {
  if (t->dtype != DDP_F32 && t->dtype != DDP_F64)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s; the reductions take f32 or f64", op, arg,
             ddp_dtype_name(t->dtype));
  if (t->dtype != dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s but the first tensor has %s (all must match)", op,
             arg, ddp_dtype_name(t->dtype), ddp_dtype_name(dtype));
  return DDP_OK;
}

static int check_scaling_dtype(const ddp_tensor *t, const char *op, const char *arg) {
  if (t->dtype != DDP_F32 && t->dtype != DDP_F64 && t->dtype != DDP_F16 && t->dtype != DDP_BF16)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s has dtype %s; expected f32, f64, f16 or bf16", op, arg,
             ddp_dtype_name(t->dtype));
  return DDP_OK;
}

static int check_k_op(int k, int op, const char *name, const char *arg) {
  if (k < 1 || k > DDP_REDUCE_INPUTS_MAX)
    DDP_FAIL(DDP_ERR_ARG, "%s: %d %s given; expected 1 to %d", name, k, arg, DDP_REDUCE_INPUTS_MAX);
  if (op < 0 || op >= DDP_REDUCE_OP_COUNT)
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown reduce op %d", name, op);
  return DDP_OK;
}

/* Checks bufs[0 .. k-1] (named `what`[i]) against the first one: live, contiguous, one
 * device, one numel, one reducible dtype; returns the device in *device. */
static int check_list(ddp_tensor *const *bufs, int k, const char *op, const char *what,
                      int *device) {
  char arg[48];
  if (!bufs) DDP_FAIL(DDP_ERR_ARG, "%s: %s is NULL", op, what);
  *device = -2;
  for (int i = 0; i < k; i++) {
    snprintf(arg, sizeof arg, "%s[%d]", what, i + 1);
    if (!bufs[i]) DDP_FAIL(DDP_ERR_ARG, "%s: %s is missing", op, arg);
    DDP_TRY(check_operand(bufs[i], op, arg, device, i ? bufs[0]->numel : -1));
    DDP_TRY(check_reduce_dtype(bufs[i], bufs[0]->dtype, op, arg));
  }
  return DDP_OK;
}

int ddp_reduce_tensors(ddp_tensor *out, ddp_tensor *const *inputs, int k, int op) {
  const char *name = "reduce_tensors";
  DDP_TRY(check_k_op(k, op, name, "inputs"));
  int device;
  DDP_TRY(check_list(inputs, k, name, "inputs", &device));
  DDP_TRY(check_operand(out, name, "out", &device, inputs[0]->numel));
  DDP_TRY(check_reduce_dtype(out, inputs[0]->dtype, name, "out"));
  const void *ptrs[DDP_REDUCE_INPUTS_MAX];
  for (int i = 0; i < k; i++) {
    if (inputs[i] != out && ddp_tensor_shares_storage(inputs[i], out))
      DDP_FAIL(DDP_ERR_ARG, "%s: out shares storage with inputs[%d] without being it", name, i + 1);
    ptrs[i] = ddp_data(inputs[i]);
  }
  void (*fn)(int, void *, const void *const *, int, int64_t, int64_t, int);
  DDP_KERNEL(fn, device, reduce_inputs, name);
  fn(out->dtype, ddp_data(out), ptrs, k, 0, out->numel, op);
  ddp_tensor_bump_version(out);
  return ddp_device_check(device, name);
}

int ddp_reduce_tensors_all(ddp_tensor *const *bufs, int k, int op) {
  const char *name = "reduce_tensors_all";
  DDP_TRY(check_k_op(k, op, name, "bufs"));
  int device;
  DDP_TRY(check_list(bufs, k, name, "bufs", &device));
  void *ptrs[DDP_REDUCE_INPUTS_MAX];
  for (int i = 0; i < k; i++) {
    for (int j = 0; j < i; j++)
      if (ddp_tensor_shares_storage(bufs[i], bufs[j]))
        DDP_FAIL(DDP_ERR_ARG, "%s: bufs[%d] and bufs[%d] share storage", name, j + 1, i + 1);
    ptrs[i] = ddp_data(bufs[i]);
  }
  void (*fn)(int, void *const *, int, int64_t, int64_t, int);
  DDP_KERNEL(fn, device, reduce_inputs_all, name);
  fn(bufs[0]->dtype, ptrs, k, 0, bufs[0]->numel, op);
  for (int i = 0; i < k; i++) ddp_tensor_bump_version(bufs[i]);
  return ddp_device_check(device, name);
}

int ddp_scale_into(ddp_tensor *out, ddp_tensor *x, double s, int divide) {
  const char *name = "scale_into";
  int device = -2;
  DDP_TRY(check_operand(x, name, "x", &device, -1));
  DDP_TRY(check_operand(out, name, "out", &device, x->numel));
  DDP_TRY(check_scaling_dtype(x, name, "x"));
  if (out->dtype != x->dtype)
    DDP_FAIL(DDP_ERR_ARG, "%s: out has dtype %s but x has %s (use cast_scale_into to cast)", name,
             ddp_dtype_name(out->dtype), ddp_dtype_name(x->dtype));
  if (out != x && ddp_tensor_shares_storage(out, x))
    DDP_FAIL(DDP_ERR_ARG, "%s: out shares storage with x without being it", name);
  void (*fn)(int, void *, const void *, int64_t, double, int);
  DDP_KERNEL(fn, device, scale_into, name);
  fn(x->dtype, ddp_data(out), ddp_data(x), x->numel, s, divide != 0);
  ddp_tensor_bump_version(out);
  return ddp_device_check(device, name);
}

int ddp_cast_scale_into(ddp_tensor *out, ddp_tensor *x, double s, int divide) {
  const char *name = "cast_scale_into";
  int device = -2;
  DDP_TRY(check_operand(x, name, "x", &device, -1));
  DDP_TRY(check_operand(out, name, "out", &device, x->numel));
  DDP_TRY(check_scaling_dtype(x, name, "x"));
  DDP_TRY(check_scaling_dtype(out, name, "out"));
  if (ddp_tensor_shares_storage(out, x)) DDP_FAIL(DDP_ERR_ARG, "%s: out shares storage with x", name);
  void (*fn)(int, void *, int, const void *, int64_t, double, int);
  DDP_KERNEL(fn, device, cast_scale, name);
  fn(out->dtype, ddp_data(out), x->dtype, ddp_data(x), x->numel, s, divide != 0);
  ddp_tensor_bump_version(out);
  return ddp_device_check(device, name);
}
