--- ddplua.nn.avg_pool2d: nn.AvgPool2d(kernel_size[, opts]), PyTorch's nn.AvgPool2d: the
-- mean over each window of x (N, C, H, W) or (C, H, W). kernel_size a number or {kh, kw};
-- opts.stride (= kernel_size), opts.padding (0), opts.ceil_mode (false),
-- opts.count_include_pad (true). See dl.avg_pool2d.
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local module = require "ddplua.nn.module"
local window_args = require "ddplua.nn.window_args"

local AvgPool2d = module.Module:extend("AvgPool2d")

local KNOWN = options.known { "stride", "padding", "ceil_mode", "count_include_pad" }
function AvgPool2d:init(kernel_size, opts)
  opts = options.check("AvgPool2d", opts, KNOWN)
  self.kernel_size = kernel_size
  self.stride = opts.stride or kernel_size
  self.padding = opts.padding or 0
  self.ceil_mode = opts.ceil_mode or false
  self.count_include_pad = opts.count_include_pad ~= false
  local function pair(v, what) return window_args.pair(v, "AvgPool2d", what) end
  window_args.pool("AvgPool2d", pair(self.kernel_size, "kernel_size"), pair(self.stride, "stride"),
    pair(self.padding, "padding"))
end

function AvgPool2d:forward(x)
  return dl.avg_pool2d(x, self.kernel_size, { stride = self.stride, padding = self.padding,
    ceil_mode = self.ceil_mode, count_include_pad = self.count_include_pad })
end

function AvgPool2d:extra_repr()
  local repr = module.repr
  return ("kernel_size=%s, stride=%s, padding=%s"):format(repr(self.kernel_size), repr(self.stride),
    repr(self.padding))
end

return AvgPool2d
