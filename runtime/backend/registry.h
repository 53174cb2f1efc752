/* runtime/backend/registry.h: the loaded CUDA plug-in, for the backend's own files (the
 * public CUDA calls in backend/cuda_api.c). Ops reach devices through ddp_kernels_for
 * (backend/kernels.h) and the core through its device table, never through this. */
#ifndef DDP_BACKEND_REGISTRY_H
#define DDP_BACKEND_REGISTRY_H

#include "backend/cuda/plugin.h"

/* The plug-in's table once it loaded and found a device (the first call probes), else
 * NULL: ddp_cuda_unavailable_reason() says why. */
const ddp_cuda_api *ddp_cuda_plugin(void);

#endif /* DDP_BACKEND_REGISTRY_H */
