--- ddplua.amp.autocast: mixed precision regions (PyTorch's torch.autocast), in C at the ops'
-- front doors (Note [autocast policy] in runtime/ops/autocast.c; state in ddplua/amp.h).
--
--   dl.autocast("cpu", {dtype = "bf16"}, function() logits = model(x) end)  -- a region
--   local region = dl.autocast("cuda")    -- begin/end form, for loops:
--   region:enter() ... region:exit()
--
-- device_type: "cpu" or "cuda" (the region affects ops whose tensors are on that device
-- type). opts.dtype: "bf16" or "f16" (default bf16 on the CPU, f16 on CUDA, as PyTorch);
-- opts.enabled (default true; false makes a region that changes nothing). Inside a region
-- the ops follow PyTorch 1.13's autocast lists for the device type (Note [autocast policy]
-- in runtime/ops/autocast.c has the table): matmul, bmm, linear and conv2d run in the lower
-- precision dtype on both; cross_entropy, nll_loss and mse_loss in f32 on both; softmax,
-- log_softmax, sum, exp, log and layer_norm in f32 on CUDA and in their input's dtype on
-- the CPU (PyTorch's CPU lists omit them); the other ops as their inputs say.
-- Casts of parameters are cached until the outermost region ends. Regions nest; leaving
-- one restores the state it found, also when fn raises (the error is raised again).
-- backward() always runs without autocast (in the forward's dtypes), as PyTorch.
-- Errors: an unknown device type, a dtype other than bf16/f16, an unknown option.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local C = lib.C

local M = {}

local KNOWN = options.known { "dtype", "enabled", "cache_enabled" }
local TYPES = { cpu = C.DDP_AUTOCAST_CPU, cuda = C.DDP_AUTOCAST_CUDA }

local Region = {}
Region.__index = Region

--- autocast(device_type, opts, fn, ...) -> fn(...)'s results; without fn, a region object
-- with :enter() and :exit() (enter/exit pairs may repeat; an exit without enter raises).
function M.autocast(device_type, opts, fn, ...)
  local kind = TYPES[device_type]
  if kind == nil then
    lib.raise(("autocast: device_type must be 'cpu' or 'cuda', got %s"):format(tostring(device_type)))
  end
  opts = options.check("autocast", opts, KNOWN)
  local dtype = C.ddp_autocast_get_dtype(kind)
  if opts.dtype ~= nil then
    dtype = lib.dtype(opts.dtype)
    if dtype ~= C.DDP_F16 and dtype ~= C.DDP_BF16 then
      lib.raise(("autocast: dtype must be 'bf16' or 'f16', got %s"):format(tostring(opts.dtype)))
    end
  end
  local region = setmetatable({ kind = kind, dtype = dtype, enabled = opts.enabled ~= false, saved = {} }, Region)
  if fn == nil then return region end
  region:enter()
  local res = { pcall(fn, ...) }
  region:exit()
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

--- region:enter(): turn the region's autocast state on (saving the one it replaces).
function Region:enter()
  local k = self.kind
  self.saved[#self.saved + 1] = { C.ddp_autocast_is_enabled(k), C.ddp_autocast_get_dtype(k) }
  lib.check(C.ddp_autocast_set_enabled(k, self.enabled and 1 or 0))
  lib.check(C.ddp_autocast_set_dtype(k, self.dtype))
  C.ddp_autocast_nesting_add(1)
  return self
end

--- region:exit(): restore the state enter() found; the outermost exit drops the cast cache.
function Region:exit()
  local s = table.remove(self.saved)
  if not s then lib.raise("autocast: exit() without a matching enter()") end
  C.ddp_autocast_nesting_add(-1)
  lib.check(C.ddp_autocast_set_enabled(self.kind, s[1]))
  lib.check(C.ddp_autocast_set_dtype(self.kind, s[2]))
end

--- is_autocast_enabled(device_type) -> boolean (device_type default "cpu").
function M.is_autocast_enabled(device_type)
  local kind = TYPES[device_type or "cpu"]
  return kind ~= nil and C.ddp_autocast_is_enabled(kind) ~= 0
end

return M
