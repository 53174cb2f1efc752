--- ddplua.nn.identity: nn.Identity(...), PyTorch's: returns its input (arguments ignored).
local module = require "ddplua.nn.module"

local Identity = module.Module:extend("Identity")

function Identity:forward(x) return x end

return Identity
