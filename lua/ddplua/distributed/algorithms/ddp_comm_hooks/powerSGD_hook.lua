--- ddplua.distributed.algorithms.ddp_comm_hooks.powerSGD_hook: PowerSGD gradient compression,
-- as torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py (Vogels et al., NeurIPS
-- 2019). The algorithm runs in C inside the reducer: Note [PowerSGD] in
-- runtime/distributed/comm_hook_powersgd.c.
--
--   local psgd = dl.distributed.algorithms.ddp_comm_hooks.powerSGD_hook
--   local state = psgd.PowerSGDState{process_group = nil, matrix_approximation_rank = 2,
--                                    start_powerSGD_iter = 10}
--   ddp:register_comm_hook(state, psgd.powerSGD_hook)
local builtin = require "ddplua.distributed.algorithms.ddp_comm_hooks.builtin"
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, raise = lib.check, lib.raise

local M = {}

local PowerSGDState = {}
PowerSGDState.__index = PowerSGDState
M.PowerSGDState = PowerSGDState

local KNOWN = options.known { "process_group", "matrix_approximation_rank", "start_powerSGD_iter",
  "min_compression_rate", "use_error_feedback", "warm_start", "orthogonalization_epsilon",
  "random_seed" }

local box = ffi.new("ddp_powersgd_state*[1]")
local tbox = ffi.new("ddp_tensor*[1]")
local i64 = ffi.new("int64_t[2]")

local function default(v, d) if v == nil then return d end return v end

--- PowerSGDState(opts) -> the hook's state (PyTorch's PowerSGDState, its defaults):
-- process_group (nil: the DDP module's), matrix_approximation_rank = 1, start_powerSGD_iter
-- = 1000 (plain all-reduce before; > 1 with error feedback or warm start, PyTorch's error),
-- min_compression_rate = 2, use_error_feedback = true, warm_start = true,
-- orthogonalization_epsilon = 0, random_seed = 0 (ddplua/comm_hook.h tells how the seeds of
-- the random Q matrices are drawn). Unknown keys raise.
function PowerSGDState.new(opts)
  opts = options.check("PowerSGDState", opts, KNOWN)
  local self = setmetatable({
    process_group = opts.process_group,
    matrix_approximation_rank = default(opts.matrix_approximation_rank, 1),
    start_powerSGD_iter = default(opts.start_powerSGD_iter, 1000),
    min_compression_rate = default(opts.min_compression_rate, 2),
    use_error_feedback = default(opts.use_error_feedback, true),
    warm_start = default(opts.warm_start, true),
    orthogonalization_epsilon = default(opts.orthogonalization_epsilon, 0),
    random_seed = default(opts.random_seed, 0),
  }, PowerSGDState)
  for _, k in ipairs { "matrix_approximation_rank", "start_powerSGD_iter", "random_seed" } do
    local v = self[k]
    if type(v) ~= "number" or v ~= math.floor(v) then
      raise(("PowerSGDState: %s must be an integer, got %s"):format(k, tostring(v)))
    end
  end
  check(C.ddp_powersgd_state_new(box, self.matrix_approximation_rank, self.start_powerSGD_iter,
                                 self.min_compression_rate, self.use_error_feedback and 1 or 0,
                                 self.warm_start and 1 or 0, self.orthogonalization_epsilon,
                                 self.random_seed))
  self.handle = ffi.gc(box[0], C.ddp_powersgd_state_free)
  return self
end
setmetatable(PowerSGDState, { __call = function(_, opts) return PowerSGDState.new(opts) end })

--- state:iter() -> iterations seen so far (PyTorch's state.iter).
function PowerSGDState:iter() return tonumber(C.ddp_powersgd_state_iter(self.handle)) end

--- state:compression_stats() -> compress_rate, numel_before, numel_after (PyTorch's): the
-- elements of the compressed iterations before and after compression.
function PowerSGDState:compression_stats()
  C.ddp_powersgd_state_stats(self.handle, i64, i64 + 1)
  local before, after = tonumber(i64[0]), tonumber(i64[1])
  return after > 0 and before / after or 0, before, after
end

--- state:error(k) -> a copy of bucket k's (0-based) error-feedback memory (numel,), or nil
-- before there is one (PyTorch's state.error_dict[k]).
function PowerSGDState:error(k)
  check(C.ddp_powersgd_state_error(self.handle, k, tbox))
  if tbox[0] == nil then return nil end
  return lib.wrap(tbox[0])
end

--- powerSGD_hook(state, bucket): the PowerSGD hook. It runs in C inside the reducer:
-- register it with ddp:register_comm_hook(state, powerSGD_hook) (alone or inside
-- fp16_compress_wrapper / bf16_compress_wrapper); calling it from Lua raises.
M.powerSGD_hook = builtin.mark(function()
  raise("powerSGD_hook runs inside the reducer in C: register it with " ..
        "ddp:register_comm_hook(state, powerSGD_hook)")
end, { kind = "POWER_SGD" })

return M
