--- ddplua.amp: automatic mixed precision (PyTorch's torch.amp / torch.cuda.amp).
--
--   local amp = require "ddplua.amp"     -- also dl.amp
--   amp.GradScaler(opts)                 -- dynamic loss scaling (ddplua/amp/grad_scaler.lua)
--   amp.autocast(device_type, opts, fn)  -- also dl.autocast (ddplua/amp/autocast.lua)
local M = {}

M.GradScaler = require "ddplua.amp.grad_scaler"
local autocast = require "ddplua.amp.autocast"
M.autocast = autocast.autocast
M.is_autocast_enabled = autocast.is_autocast_enabled

return M
