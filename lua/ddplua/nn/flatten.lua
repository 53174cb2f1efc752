--- ddplua.nn.flatten: nn.Flatten([start_dim[, end_dim]]), PyTorch's: merges dims start_dim
-- .. end_dim of x into one. Lua numbering: the defaults start_dim = 2, end_dim = -1 keep the
-- batch dim (PyTorch's 1 and -1), so (N, C, H, W) -> (N, C * H * W).
local module = require "ddplua.nn.module"

local Flatten = module.Module:extend("Flatten")

function Flatten:init(start_dim, end_dim)
  self.start_dim = start_dim or 2
  self.end_dim = end_dim or -1
end

function Flatten:forward(x) return x:flatten(self.start_dim, self.end_dim) end

function Flatten:extra_repr() return ("start_dim=%d, end_dim=%d"):format(self.start_dim, self.end_dim) end

return Flatten
