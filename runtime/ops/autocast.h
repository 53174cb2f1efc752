/* runtime/ops/autocast.h: the casts the ops' front doors make while autocast is on
 * (Note [autocast policy], runtime/ops/autocast.c; the state is ddplua/amp.h). A front door
 * asks ddp_autocast_needed with its tensor inputs; when they need casting it casts them
 * (ddp_autocast_cast) and calls itself again with the cast tensors, which then need nothing:
 * DDP_AUTOCAST_REENTER does exactly that, so each front door takes one line. */
#ifndef DDP_OPS_AUTOCAST_H
#define DDP_OPS_AUTOCAST_H

#include "core/core.h"

typedef enum {
  DDP_AUTOCAST_LOWER,   /* floating inputs (not f64) to the lower precision dtype */
  DDP_AUTOCAST_F32,     /* floating inputs (not f64) to f32 */
  DDP_AUTOCAST_PROMOTE, /* floating inputs to the widest of them */
} ddp_autocast_policy;

/* 1 when autocast is on for the inputs' device type and casting in[0..n-1] (NULL entries
 * ignored) under `policy` would change one of them, else 0. */
int ddp_autocast_needed(ddp_autocast_policy policy, int n, ddp_tensor *const *in);

/* out[i] = in[i] cast under `policy` (a new reference; a cached cast for a parameter) or
 * in[i] retained (NULL stays NULL). Casts record autograd as ddp_to_dtype does. On an error
 * nothing is left held. */
int ddp_autocast_cast(ddp_autocast_policy policy, int n, ddp_tensor *const *in, ddp_tensor **out);

/* Release out[0..n-1] (NULL entries skipped). */
void ddp_autocast_release(int n, ddp_tensor **t);

/* Autocast off on the calling thread for the autograd engine's backward pass (backward ops
 * run in the dtypes the forward recorded, as PyTorch's); returns what ddp_autocast_resume
 * restores. */
unsigned ddp_autocast_suspend(void);
void ddp_autocast_resume(unsigned saved);

/* In a front door returning a status: when the n tensors of `ins` need casting, cast them
 * into `cast` (an array the caller declares, n long), return the status of `call` (which
 * reads `cast`), releasing the casts. */
#define DDP_AUTOCAST_REENTER(policy, n, ins, cast, call)                                     \
  do {                                                                                      \
    if (ddp_autocast_needed((policy), (n), (ins))) {                                        \
      DDP_TRY(ddp_autocast_cast((policy), (n), (ins), (cast)));                             \
      int ac_status_ = (call);                                                              \
      ddp_autocast_release((n), (cast));                                                    \
      return ac_status_;                                                                    \
    }                                                                                       \
  } while (0)

#endif /* DDP_OPS_AUTOCAST_H */
