--- ddplua.nn.adaptive_avg_pool2d: nn.AdaptiveAvgPool2d(output_size), PyTorch's: x (N, C, H, W)
-- or (C, H, W) -> (..., OH, OW) averaging adaptive windows; output_size a number or {OH, OW}.
-- See dl.adaptive_avg_pool2d.
local dl = require "ddplua.functions"
local module = require "ddplua.nn.module"

local AdaptiveAvgPool2d = module.Module:extend("AdaptiveAvgPool2d")

function AdaptiveAvgPool2d:init(output_size)
  self.output_size = output_size
end

function AdaptiveAvgPool2d:forward(x) return dl.adaptive_avg_pool2d(x, self.output_size) end

function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. module.repr(self.output_size) end

return AdaptiveAvgPool2d
