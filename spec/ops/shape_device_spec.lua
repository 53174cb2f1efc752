-- Specs of the shape and indexing ops on devices (runtime/ops/shape.c,
-- runtime/backend/cuda/shape.cu): index_select, gather, scatter_add, cat, stack (forward and
-- backward), views, index checks and mixed-device errors. The cases
-- (shape_device_cases.lua) run every op on CPU tensors and on copies on a device and compare.
--  - On the simulated device (a child luajit with DDPLUA_CUDA_PLUGIN; its kernels are the
--    CPU's): the device paths of the ops layer, with results identical to the CPU's.
--  - The CUDA kernels of runtime/backend/cuda/shape.cu compiled for the host under an
--    emulation of CUDA blocks (spec/fixtures/optimshape_emulation.cc), against the CPU's.
--  - Tagged #cuda, on a real GPU (skipped otherwise): the same cases in this process, the
--    CUDA kernels against the CPU.
local sim = require "sim_cases"

sim.describe_all {
  title = "shape and indexing ops",
  cases = "spec/ops/shape_device_cases.lua",
  emul = {title = "CUDA shape and indexing kernels (runtime/backend/cuda/shape.cu: copy_rows, index_select, index_add, gather, scatter_add, every dtype)", part = "shape"},
}
