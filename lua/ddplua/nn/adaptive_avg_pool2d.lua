--- ddplua.nn.adaptive_avg_pool2d: nn.AdaptiveAvgPool2d(output_size), PyTorch's: x (N, C, H, W)
-- or (C, H, W) -> (..., OH, OW) averaging adaptive windows; output_size a number or {OH, OW}.
-- See dl.adaptive_avg_pool2d.
local dl = require "ddplua.functions"
local module = require "ddplua.nn.module"
local window_args = require "ddplua.nn.window_args"
local lib = require "ddplua.lib"

local AdaptiveAvgPool2d = module.Module:extend("AdaptiveAvgPool2d")

function AdaptiveAvgPool2d:init(output_size)
  local size = window_args.pair(output_size, "AdaptiveAvgPool2d", "output_size")
  if size[1] < 0 or size[2] < 0 then
    lib.raise(("AdaptiveAvgPool2d: elements of output_size must be greater than or equal to 0 "
      .. "but received {%d, %d}"):format(size[1], size[2]))
  end
  self.output_size = output_size
end

function AdaptiveAvgPool2d:forward(x) return dl.adaptive_avg_pool2d(x, self.output_size) end

function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. module.repr(self.output_size) end

return AdaptiveAvgPool2d
