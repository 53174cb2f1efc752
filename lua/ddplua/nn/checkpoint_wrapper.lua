--- ddplua.nn.checkpoint_wrapper: nn.CheckpointWrapper(module[, opts]), a module whose forward
-- is module's forward under activation checkpointing (ddplua.nn.checkpoint, Note
-- [checkpoint node]): PyTorch's CheckpointWrapper from
-- torch.distributed.algorithms._checkpoint.checkpoint_wrapper with CheckpointImpl.NO_REENTRANT
-- (here ddplua.nn.activation_checkpointing: checkpoint_wrapper and
-- apply_activation_checkpointing).
--
--   local block = nn.CheckpointWrapper(nn.Sequential(nn.Linear(64, 64), nn.GELU()))
--   local y = block(x)              -- activations of the block recomputed in backward
--
-- The wrapped module is the child `_checkpoint_wrapped_module`, PyTorch's name, so
-- parameters(), train()/eval() and DDP see it as any child; named_parameters() and
-- state_dict() keys carry the prefix "_checkpoint_wrapped_module." (PyTorch's
-- state_dict hook strips it; ddplua has no state_dict hooks: load the unwrapped model's
-- state into wrapper._checkpoint_wrapped_module). opts: checkpoint's options
-- (preserve_rng_state, determinism_check, use_reentrant = false). forward(...) takes any
-- arguments and returns what the module returns. Errors: module not a Module; checkpoint's.
local module = require "ddplua.nn.module"
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local checkpoint = require "ddplua.nn.checkpoint"

local CheckpointWrapper = module.Module:extend("CheckpointWrapper")

local KNOWN = options.known { "use_reentrant", "preserve_rng_state", "determinism_check" }

function CheckpointWrapper:init(m, opts)
  if not module.is_module(m) then
    lib.raise("CheckpointWrapper: module must be an nn.Module, got " .. type(m))
  end
  opts = options.check("CheckpointWrapper", opts, KNOWN)
  self._checkpoint_wrapped_module = m
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  rawset(self, "_checkpoint_opts", o)
end

function CheckpointWrapper:forward(...)
  return checkpoint.checkpoint(rawget(self, "_checkpoint_opts"), self._checkpoint_wrapped_module, ...)
end

return CheckpointWrapper
