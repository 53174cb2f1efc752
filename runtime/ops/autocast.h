/* runtime/ops/autocast.h: the casts the ops' front doors make while autocast is on
 * (Note [autocast policy], runtime/ops/autocast.c; the state is ddplua/amp.h). A front door
 * asks ddp_autocast_needed with its tensor inputs; when they need casting it casts them
 * (ddp_autocast_cast) and calls itself again with the cast tensors, which then need nothing:
 * DDP_AUTOCAST_REENTER does exactly that, so each front door takes one line. */
#ifndef DDP_OPS_AUTOCAST_H
#define DDP_OPS_AUTOCAST_H

#include "core/core.h"

typedef enum {
  DDP_AUTOCAST_NONE,    /* as without autocast */
  DDP_AUTOCAST_LOWER,   /* floating inputs (not f64) to the lower precision dtype */
  DDP_AUTOCAST_F32,     /* floating inputs (not f64) to f32 */
  DDP_AUTOCAST_PROMOTE, /* floating inputs to the widest of them */
} ddp_autocast_policy;

/* The ops whose front doors ask autocast; each has a policy per device type (Note [autocast
 * policy]: the table in autocast.c, pinned to this enum). */
typedef enum {
  DDP_AUTOCAST_OP_MATMUL,
  DDP_AUTOCAST_OP_BMM,
  DDP_AUTOCAST_OP_LINEAR,
  DDP_AUTOCAST_OP_CONV2D,
  DDP_AUTOCAST_OP_SOFTMAX,
  DDP_AUTOCAST_OP_LOG_SOFTMAX,
  DDP_AUTOCAST_OP_SUM,
  DDP_AUTOCAST_OP_MEAN,
  DDP_AUTOCAST_OP_EXP,
  DDP_AUTOCAST_OP_LOG,
  DDP_AUTOCAST_OP_CROSS_ENTROPY,
  DDP_AUTOCAST_OP_NLL_LOSS,
  DDP_AUTOCAST_OP_MSE_LOSS,
  DDP_AUTOCAST_OP_LAYER_NORM,
  DDP_AUTOCAST_OP_BATCH_NORM,
  DDP_AUTOCAST_OP_COUNT
} ddp_autocast_op;

/* The policy of op for tensors on a device of type device_type (DDP_AUTOCAST_CPU or
 * DDP_AUTOCAST_CUDA); DDP_AUTOCAST_NONE for anything out of range. */
ddp_autocast_policy ddp_autocast_policy_of(ddp_autocast_op op, int device_type);

/* 1 when autocast is on for the inputs' device type and casting in[0..n-1] (NULL entries
 * ignored) under op's policy there would change one of them, else 0. */
int ddp_autocast_needed(ddp_autocast_op op, int n, ddp_tensor *const *in);

/* out[i] = in[i] cast under op's policy (a new reference; a cached cast for a parameter)
 * or in[i] retained (NULL stays NULL). Casts record autograd as ddp_to_dtype does. On an
 * error nothing is left held. */
int ddp_autocast_cast(ddp_autocast_op op, int n, ddp_tensor *const *in, ddp_tensor **out);

/* Release out[0..n-1] (NULL entries skipped). */
void ddp_autocast_release(int n, ddp_tensor **t);

/* Autocast off on the calling thread for the autograd engine's backward pass (backward ops
 * run in the dtypes the forward recorded, as PyTorch's); returns what ddp_autocast_resume
 * restores. */
unsigned ddp_autocast_suspend(void);
void ddp_autocast_resume(unsigned saved);

/* In op's front door returning a status: when the n tensors of `ins` need casting, cast
 * them into `cast` (an array the caller declares, n long), return the status of `call`
 * (which reads `cast`), releasing the casts. */
#define DDP_AUTOCAST_REENTER(op, n, ins, cast, call)                                         \
  do {                                                                                      \
    if (ddp_autocast_needed((op), (n), (ins))) {                                            \
      DDP_TRY(ddp_autocast_cast((op), (n), (ins), (cast)));                                 \
      int ac_status_ = (call);                                                              \
      ddp_autocast_release((n), (cast));                                                    \
      return ac_status_;                                                                    \
    }                                                                                       \
  } while (0)

#endif /* DDP_OPS_AUTOCAST_H */
