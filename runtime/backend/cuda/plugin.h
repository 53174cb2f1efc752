/* runtime/backend/cuda/plugin.h: the C interface between the core and the CUDA plug-in
 * (looked up with dlsym; bump DDP_CUDA_PLUGIN_ABI when it changes). */
#ifndef DDP_CUDA_PLUGIN_H
#define DDP_CUDA_PLUGIN_H

#include <stddef.h>

#define DDP_CUDA_PLUGIN_ABI 1

#ifdef __cplusplus
extern "C" {
#endif

/* Count devices. Returns 0 with *device_count > 0 when CUDA is usable, else non-zero with
 * the reason written into reason (reason_len bytes). */
int ddp_cuda_plugin_probe(int *device_count, char *reason, size_t reason_len);
int ddp_cuda_plugin_abi_version(void);
void ddp_cuda_plugin_versions(int *cudart, int *cublas, int *nccl);

#ifdef __cplusplus
}
#endif

#endif
