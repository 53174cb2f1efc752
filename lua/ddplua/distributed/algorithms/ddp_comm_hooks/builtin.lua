--- ddplua.distributed.algorithms.ddp_comm_hooks.builtin: which Lua hook functions stand for
-- a hook the reducer runs in C (ddplua/comm_hook.h). register_comm_hook looks a hook up here:
-- a built-in goes to ddp_reducer_register_comm_hook, anything else runs as a Lua hook.
local M = {}

-- One table per Lua state (busted reloads modules per spec file; hooks made through one
-- load must be found through another), weak in its keys.
local KEY = "ddplua.distributed.algorithms.ddp_comm_hooks.builtin"
local registry = debug.getregistry()[KEY]
if not registry then
  registry = setmetatable({}, { __mode = "k" })
  debug.getregistry()[KEY] = registry
end

--- builtin.mark(fn, desc) -> fn: fn stands for the C hook desc = {kind = "ALLREDUCE" |
-- "FP16_COMPRESS" | "BF16_COMPRESS" | "POWER_SGD", wrap = nil | "f16" | "bf16"}.
function M.mark(fn, desc)
  registry[fn] = desc
  return fn
end

--- builtin.describe(fn) -> desc or nil.
function M.describe(fn) return registry[fn] end

return M
