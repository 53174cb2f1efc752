/* runtime/include/ddplua/amp.h: autocast state (runtime/ops/autocast.c), as PyTorch's
 * torch.set_autocast_enabled / torch.set_autocast_{cpu,gpu}_dtype / autocast nesting.
 *
 * The state is per thread and per device type (DDP_AUTOCAST_CPU for CPU tensors,
 * DDP_AUTOCAST_CUDA for tensors on any cuda:k): enabled (default off) and the lower
 * precision dtype (default DDP_BF16 on the CPU and DDP_F16 on CUDA, as PyTorch). While it
 * is enabled, the front doors of the ops cast their floating inputs as Note [autocast
 * policy] (runtime/ops/autocast.c) says: matmul, bmm, linear and conv2d to the lower
 * precision dtype; softmax, log_softmax, the losses, layer_norm, sum, mean, exp and log to
 * f32; batch_norm to its widest input; every other op promotes as it always does. f64
 * tensors are never cast. Casts of leaf tensors that require grad (parameters) are cached
 * until the nesting count returns to 0. The Lua front end (dl.autocast) drives these. */

enum { DDP_AUTOCAST_CPU = 0, DDP_AUTOCAST_CUDA = 1 };

/* Enable (enabled != 0) or disable autocast for device_type on the calling thread.
 * Errors: an unknown device_type. */
int ddp_autocast_set_enabled(int device_type, int enabled);
/* 1 when autocast is enabled for device_type on the calling thread, else 0 (also for an
 * unknown device_type). */
int ddp_autocast_is_enabled(int device_type);
/* Set the lower precision dtype of device_type (DDP_F16 or DDP_BF16). Errors: an unknown
 * device_type, any other dtype. */
int ddp_autocast_set_dtype(int device_type, int dtype);
/* The lower precision dtype of device_type (-1 for an unknown device_type). */
int ddp_autocast_get_dtype(int device_type);
/* Enter (+1) or leave (-1) an autocast region; returns the new nesting depth. Leaving the
 * outermost region (depth back to 0) clears the cast cache. */
int ddp_autocast_nesting_add(int delta);
/* Drop every cached cast (their references) now. */
void ddp_autocast_clear_cache(void);
