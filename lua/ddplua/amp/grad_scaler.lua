--- ddplua.amp.GradScaler: dynamic loss scaling for half-precision training (PyTorch's
-- torch.cuda.amp.GradScaler / torch.amp.GradScaler, same defaults and the same protocol).
--
--   local scaler = dl.amp.GradScaler()   -- {init_scale = 2^16, growth_factor = 2,
--                                        --  backoff_factor = 0.5, growth_interval = 2000,
--                                        --  enabled = true}
--   scaler:scale(loss):backward()
--   scaler:unscale_(opt)                 -- optional, e.g. before clip_grad_norm_
--   scaler:step(opt)                     -- skipped when a gradient holds inf or NaN
--   scaler:update()
--
-- unscale_ multiplies every .grad of the optimizer's parameters by 1/scale and looks for
-- inf/NaN in the same pass (ddp_amp_unscale_, one kernel per gradient through the kernel
-- table). step(opt) calls opt:step() only when nothing was found. update() then halves the
-- scale (backoff_factor) after a step with inf/NaN, or multiplies it by growth_factor after
-- growth_interval steps in a row without, as torch._amp_update_scale_. The scale is an f32
-- value, as PyTorch's scale tensor.
--
-- Note [found_inf across ranks]: under DDP the gradients are averaged before unscale_, so an
-- overflow on one rank normally reaches all of them; but a gradient changed after the
-- reduction (or a rank whose local step differs) could make ranks disagree, one stepping and
-- another skipping, and the replicas would drift apart. So when the default process group is
-- initialised, unscale_ combines the found-inf flag of every rank with an all_reduce(max)
-- (one f32 element) and every rank takes the same decision. PyTorch leaves this to the
-- gradients' reduction; the extra collective costs one small message per step.
--
-- With enabled = false every method is a pass-through (scale returns the loss, step calls
-- opt:step(), get_scale returns 1), as PyTorch. Errors (raised at the caller): unscale_
-- twice for one optimizer before update(), unscale_ after step(), step twice before update(),
-- update() with no recorded inf check, a closure passed to step, an empty state dict loaded
-- into an enabled scaler.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local tensor = require "ddplua.tensor"
local ffi, C = lib.ffi, lib.C

local M = {}
M.__index = M

local KNOWN = options.known { "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled" }
local READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"

local f32 = ffi.new("float[1]")
-- x rounded to f32 (PyTorch keeps the scale in an f32 tensor).
local function to_f32(x) f32[0] = x; return tonumber(f32[0]) end

local function positive(name, v, what)
  if type(v) ~= "number" or not (v > 0) then
    lib.raise(("GradScaler: %s must be %s, got %s"):format(name, what, tostring(v)))
  end
end

--- GradScaler(opts) -> a scaler. opts: init_scale (2^16), growth_factor (2.0, > 1),
-- backoff_factor (0.5, in (0, 1)), growth_interval (2000, a positive integer), enabled
-- (true). Raises naming an unknown or invalid option.
function M.new(opts)
  opts = options.check("GradScaler", opts, KNOWN)
  local self = setmetatable({}, M)
  self._enabled = opts.enabled ~= false
  self._scale = to_f32(opts.init_scale or 65536.0)
  self._growth_factor = opts.growth_factor or 2.0
  self._backoff_factor = opts.backoff_factor or 0.5
  self._growth_interval = opts.growth_interval or 2000
  self._growth_tracker = 0
  positive("init_scale", self._scale, "a positive number")
  if type(self._growth_factor) ~= "number" or not (self._growth_factor > 1) then
    lib.raise("GradScaler: growth_factor should be > 1, got " .. tostring(self._growth_factor))
  end
  if type(self._backoff_factor) ~= "number" or not (self._backoff_factor > 0 and self._backoff_factor < 1) then
    lib.raise("GradScaler: backoff_factor should be in (0, 1), got " .. tostring(self._backoff_factor))
  end
  local gi = self._growth_interval
  if type(gi) ~= "number" or gi < 1 or gi % 1 ~= 0 then
    lib.raise("GradScaler: growth_interval should be a positive integer, got " .. tostring(gi))
  end
  self._per_optimizer = setmetatable({}, { __mode = "k" }) -- opt -> {stage, found_inf}
  return self
end

local function opt_state(self, opt)
  local st = self._per_optimizer[opt]
  if not st then st = { stage = READY, found_inf = nil }; self._per_optimizer[opt] = st end
  return st
end

--- scaler:scale(outputs) -> outputs * scale: a tensor, or a (nested) list of tensors scaled
-- element by element. With the scaler disabled, outputs unchanged.
function M:scale(outputs)
  if not self._enabled then return outputs end
  if tensor.is_tensor(outputs) then return outputs * self._scale end
  if type(outputs) ~= "table" then
    lib.raise("GradScaler:scale: outputs must be a tensor or a list of tensors, got " .. type(outputs))
  end
  local out = {}
  for i, v in ipairs(outputs) do out[i] = self:scale(v) end
  return out
end

-- The found-inf flags of every rank, combined (Note [found_inf across ranks]).
local function combine_across_ranks(found)
  local dist = package.loaded["ddplua.distributed.distributed_c10d"]
  if not (dist and dist.is_initialized()) then return found end
  local dl = require "ddplua.functions"
  local flag = dl.tensor({ found and 1 or 0 }, { dtype = "f32" })
  local device = dist.get_backend() == "nccl" and ("cuda:" .. dl.cuda.current_device()) or nil
  if device then flag = flag:to(device) end
  dist.all_reduce(flag, { op = "max" })
  return flag:item() > 0
end

local found_box = ffi.new("int[1]")

--- scaler:unscale_(opt): divide (in place) every .grad of opt's parameters by the scale,
-- recording whether any held inf or NaN (combined over ranks under DDP). Call it at most
-- once per optimizer between update()s, before step(); useful to clip unscaled gradients.
-- Raises when called twice, or after step().
function M:unscale_(opt)
  if not self._enabled then return end
  local st = opt_state(self, opt)
  if st.stage == UNSCALED then
    lib.raise("unscale_() has already been called on this optimizer since the last update().")
  elseif st.stage == STEPPED then
    lib.raise("unscale_() is being called after step().")
  end
  local grads = {}
  for _, group in ipairs(opt.param_groups) do
    for _, p in ipairs(group.params) do
      local g = p.grad
      if g ~= nil then grads[#grads + 1] = g end
    end
  end
  local arr = ffi.new("ddp_tensor*[?]", math.max(#grads, 1))
  for i, g in ipairs(grads) do arr[i - 1] = g end
  -- PyTorch: inv_scale = scale.double().reciprocal().float()
  lib.check(C.ddp_amp_unscale_(found_box, arr, #grads, to_f32(1.0 / self._scale)))
  st.found_inf = combine_across_ranks(found_box[0] ~= 0)
  st.stage = UNSCALED
end

--- scaler:step(opt) -> opt:step()'s result, or nil when the step was skipped: unscale_ the
-- gradients first if not done yet, then step only when no gradient held inf or NaN. Raises
-- when called twice before update(), or when given a closure (as PyTorch).
function M:step(opt, closure)
  if not self._enabled then return opt:step(closure) end
  if closure ~= nil then
    lib.raise("Closure use is not currently supported if GradScaler is enabled.")
  end
  local st = opt_state(self, opt)
  if st.stage == STEPPED then
    lib.raise("step() has already been called since the last update().")
  end
  if st.stage == READY then self:unscale_(opt) end
  local ret
  if not st.found_inf then ret = opt:step() end
  st.stage = STEPPED
  return ret
end

--- scaler:update(new_scale): set the scale for the next iteration. new_scale (a number or a
-- one-element tensor) replaces it; without it, the scale is multiplied by backoff_factor
-- when any optimizer's step found inf/NaN since the last update (growth count reset), else
-- the growth count goes up and at growth_interval the scale is multiplied by growth_factor
-- (kept when the product would be infinite). Raises when no inf check was recorded.
function M:update(new_scale)
  if not self._enabled then return end
  if new_scale ~= nil then
    if tensor.is_tensor(new_scale) then new_scale = new_scale:item() end
    positive("new_scale", new_scale, "a positive number")
    self._scale = to_f32(new_scale)
  else
    local any, found = false, false
    for _, st in pairs(self._per_optimizer) do
      if st.found_inf ~= nil then any = true; found = found or st.found_inf end
    end
    if not any then lib.raise("No inf checks were recorded prior to update.") end
    if found then
      self._scale = to_f32(self._scale * self._backoff_factor)
      self._growth_tracker = 0
    else
      local successful = self._growth_tracker + 1
      if successful == self._growth_interval then
        local grown = to_f32(self._scale * self._growth_factor)
        if grown < math.huge then self._scale = grown end
        self._growth_tracker = 0
      else
        self._growth_tracker = successful
      end
    end
  end
  self._per_optimizer = setmetatable({}, { __mode = "k" })
end

--- scaler:get_scale() -> the current scale (a number); 1.0 when disabled.
function M:get_scale() return self._enabled and self._scale or 1.0 end
function M:get_growth_factor() return self._growth_factor end
function M:get_backoff_factor() return self._backoff_factor end
function M:get_growth_interval() return self._growth_interval end
function M:is_enabled() return self._enabled end

--- scaler:state_dict() -> {scale, growth_factor, backoff_factor, growth_interval,
-- _growth_tracker} (PyTorch's keys), or {} when disabled.
function M:state_dict()
  if not self._enabled then return {} end
  return { scale = self._scale, growth_factor = self._growth_factor, backoff_factor = self._backoff_factor,
    growth_interval = self._growth_interval, _growth_tracker = self._growth_tracker }
end

--- scaler:load_state_dict(sd): restore what state_dict returned. Raises for an empty dict
-- (saved from a disabled scaler) or a field of the wrong type.
function M:load_state_dict(sd)
  if not self._enabled then return end
  if type(sd) ~= "table" or next(sd) == nil then
    lib.raise("The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.")
  end
  local function num(k, int)
    local v = sd[k]
    if tensor.is_tensor(v) then v = v:item() end
    if type(v) ~= "number" or (int and v % 1 ~= 0) then
      lib.raise(("GradScaler:load_state_dict: %s must be a number, got %s"):format(k, tostring(v)))
    end
    return v
  end
  local scale, gf, bf = num("scale"), num("growth_factor"), num("backoff_factor")
  local gi, tracker = num("growth_interval", true), num("_growth_tracker", true)
  self._scale, self._growth_factor, self._backoff_factor = to_f32(scale), gf, bf
  self._growth_interval, self._growth_tracker = gi, tracker
end

setmetatable(M, { __call = function(_, opts) return M.new(opts) end })

return M
