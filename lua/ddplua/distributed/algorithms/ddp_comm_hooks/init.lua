--- ddplua.distributed.algorithms.ddp_comm_hooks: DDP communication hooks, as
-- torch.distributed.algorithms.ddp_comm_hooks. Submodules load on first use:
--   default_hooks   allreduce_hook, fp16_compress_hook, bf16_compress_hook,
--                   fp16_compress_wrapper, bf16_compress_wrapper
--   powerSGD_hook   PowerSGDState, powerSGD_hook
--   GradBucket      what a hook receives (ddplua.distributed.algorithms.ddp_comm_hooks.grad_bucket)
-- Register one with ddp:register_comm_hook(state, hook) (ddplua/comm_hook.h, Note [comm hooks]).
local M = {}

local SUBMODULES = { default_hooks = "default_hooks", powerSGD_hook = "powerSGD_hook",
                     GradBucket = "grad_bucket" }

setmetatable(M, { __index = function(t, k)
  local name = SUBMODULES[k]
  if not name then return nil end
  local mod = require("ddplua.distributed.algorithms.ddp_comm_hooks." .. name)
  rawset(t, k, mod)
  return mod
end })

return M
