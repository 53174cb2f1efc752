--- ddplua.utils.mixed_precision: the training loop's mixed precision switch (train.lua's
-- `amp` config field and --amp flag), PyTorch's recipe in one object:
--
--   local amp = mixed_precision.new(cfg.amp, device, "train.lua")  -- nil, "bf16" or "f16"
--   local logits, loss = amp:run(function() local l = net(x); return l, loss_fn(l, y) end)
--   amp:backward(loss)          -- scaled by the GradScaler for f16
--   amp:step(opt)               -- GradScaler step + update for f16, else opt:step()
--   train_state.save(path, {..., scaler = amp.scaler})   -- nil unless f16
--
-- "bf16": the forward runs under dl.autocast(device type, {dtype = "bf16"}); bf16 has f32's
-- exponent range, so no loss scaling (as PyTorch's recipe). "f16": autocast in f16 and a
-- dl.amp.GradScaler (PyTorch's defaults) against gradient underflow. nil or "f32": nothing.
-- Raises (error(msg, 0), prefixed by prog) for any other value.
local amp = require "ddplua.amp"

local M = {}
M.__index = M

--- mixed_precision.new(mode, device, prog) -> the switch. device: "cpu", "cuda" or
-- "cuda:k" (the autocast device type follows it).
function M.new(mode, device, prog)
  if mode ~= nil and mode ~= "f32" and mode ~= "bf16" and mode ~= "f16" then
    error(("%s: amp must be bf16, f16 or f32, got %s"):format(prog or "ddplua", tostring(mode)), 0)
  end
  local self = setmetatable({ mode = (mode ~= "f32") and mode or nil }, M)
  if self.mode then
    self.region = amp.autocast(device == "cpu" and "cpu" or "cuda", { dtype = self.mode })
  end
  if self.mode == "f16" then self.scaler = amp.GradScaler() end
  return self
end

--- amp:run(fn) -> fn()'s results, computed under autocast when amp is on.
function M:run(fn)
  if not self.region then return fn() end
  self.region:enter()
  local res = { pcall(fn) }
  self.region:exit()
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

--- amp:backward(loss): loss:backward(), through the scaler for f16.
function M:backward(loss)
  if self.scaler then self.scaler:scale(loss):backward() else loss:backward() end
end

--- amp:step(opt): opt:step(), skipped by the scaler when a gradient overflowed (f16), then
-- the scale's update.
function M:step(opt)
  if not self.scaler then return opt:step() end
  self.scaler:step(opt)
  self.scaler:update()
end

return M
