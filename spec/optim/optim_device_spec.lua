-- Specs of the optimizer updates and gradient clipping on devices (runtime/ops/optim.c,
-- runtime/backend/cuda/optim.cu). The cases (optim_device_cases.lua) run every update on
-- CPU tensors and on copies on a device and compare.
--  - On the simulated device (a child luajit with DDPLUA_CUDA_PLUGIN; its kernels are the
--    CPU's): the device paths of the ops layer (dispatch, state and work copies on the
--    param's device, mixed-device errors) with results identical to the CPU's.
--  - The CUDA kernels of runtime/backend/cuda/optim.cu compiled for the host under an
--    emulation of CUDA blocks (spec/fixtures/optimshape_emulation.cc), against the CPU's.
--  - Tagged #cuda, on a real GPU (skipped otherwise): the same cases in this process, the
--    CUDA kernels against the CPU within rounding tolerances.
local sim = require "sim_cases"

sim.describe_all {
  title = "optimizers",
  cases = "spec/optim/optim_device_cases.lua",
  emul = {title = "CUDA optimizer and clipping kernels (runtime/backend/cuda/optim.cu: SGD, Adam/AdamW/amsgrad, Adadelta, abs_pow_sum, abs_max, scale, clamp)", part = "optim"},
}
