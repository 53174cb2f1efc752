// runtime/backend/cuda/kernels.cu: the CUDA kernel table. Each area file (elementwise.cu,
// reduce.cu, ...) fills its own entries through ddp_cuda_register_<area>; an area that is
// not linked in leaves its entries NULL, and the ops layer then reports "not implemented
// for cuda tensors" (runtime/backend/kernels.h).
#include "backend/cuda/cuda_internal.h"

extern "C" const ddp_kernels *ddp_cuda_kernel_table(void) {
  static ddp_kernels table;
  static bool ready;
  if (!ready) { // first call is under the core's pthread_once
    table.name = "cuda";
    void (*areas[])(ddp_kernels *) = {
        ddp_cuda_register_elementwise, ddp_cuda_register_reduce, ddp_cuda_register_matmul,
        ddp_cuda_register_conv,        ddp_cuda_register_pool,   ddp_cuda_register_loss,
        ddp_cuda_register_norm,        ddp_cuda_register_optim,  ddp_cuda_register_shape,
        ddp_cuda_register_attention,   ddp_cuda_register_collective,
    };
    for (auto reg : areas)
      if (reg) reg(&table);
    ready = true;
  }
  return &table;
}
