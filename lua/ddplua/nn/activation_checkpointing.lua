--- ddplua.nn.activation_checkpointing: what PyTorch's
-- torch.distributed.algorithms._checkpoint.checkpoint_wrapper offers for activation
-- checkpointing of submodules (Note [checkpoint node] in ddplua.nn.checkpoint). It lives
-- with nn, not under ddplua.distributed: it wraps modules and needs no process group, and
-- the distributed layer sits below nn (Note [lua layers] in tools/check_layers.lua).
--
--   local cw = require "ddplua.nn.activation_checkpointing"
--   local block = cw.checkpoint_wrapper(nn.Linear(8, 8))        -- an nn.CheckpointWrapper
--   cw.apply_activation_checkpointing(model, {check_fn = function(m)
--     return getmetatable(m) == nn.Linear end})                 -- wrap children in place
--
-- Only CheckpointImpl.NO_REENTRANT (the default, and what PyTorch recommends) exists.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local module = require "ddplua.nn.module"
local CheckpointWrapper = require "ddplua.nn.checkpoint_wrapper"

local M = {}

M.CheckpointWrapper = CheckpointWrapper
M.CheckpointImpl = { NO_REENTRANT = "no_reentrant", REENTRANT = "reentrant" }

local WRAP_KNOWN = options.known { "checkpoint_impl", "preserve_rng_state", "determinism_check" }

--- checkpoint_wrapper(module, opts) -> nn.CheckpointWrapper(module). opts.checkpoint_impl
-- (CheckpointImpl.NO_REENTRANT only; REENTRANT raises), and checkpoint's
-- preserve_rng_state, determinism_check. Errors: module not a Module, REENTRANT.
function M.checkpoint_wrapper(m, opts)
  opts = options.check("checkpoint_wrapper", opts, WRAP_KNOWN)
  local impl = opts.checkpoint_impl
  if impl ~= nil and impl ~= M.CheckpointImpl.NO_REENTRANT then
    lib.raise("checkpoint_wrapper: checkpoint_impl must be CheckpointImpl.NO_REENTRANT (ddplua "
      .. "implements the non-reentrant checkpoint only), got " .. tostring(impl))
  end
  return CheckpointWrapper(m, { preserve_rng_state = opts.preserve_rng_state,
    determinism_check = opts.determinism_check })
end

local APPLY_KNOWN = options.known { "checkpoint_wrapper_fn", "check_fn" }

--- apply_activation_checkpointing(model, opts) -> model: replace, in place, every submodule
-- m (not model itself) for which opts.check_fn(m) is true (default: every one) by
-- opts.checkpoint_wrapper_fn(m) (default checkpoint_wrapper), outermost first (a wrapped
-- module's own children are not visited). Errors: model not a Module, an unknown option.
function M.apply_activation_checkpointing(model, opts)
  if not module.is_module(model) then
    lib.raise("apply_activation_checkpointing: model must be an nn.Module, got " .. type(model))
  end
  opts = options.check("apply_activation_checkpointing", opts, APPLY_KNOWN)
  local wrap = opts.checkpoint_wrapper_fn or M.checkpoint_wrapper
  local check = opts.check_fn or function() return true end
  local function visit(parent)
    for name, child in parent:named_children() do
      if getmetatable(child) ~= CheckpointWrapper and check(child) then
        parent:add_module(name, wrap(child))
      else
        visit(child)
      end
    end
  end
  visit(model)
  return model
end

return M
