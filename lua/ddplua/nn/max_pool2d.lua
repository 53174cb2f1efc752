--- ddplua.nn.max_pool2d: nn.MaxPool2d(kernel_size[, opts]), PyTorch's nn.MaxPool2d: the
-- maximum over each window of x (N, C, H, W) or (C, H, W). kernel_size a number or {kh, kw};
-- opts.stride (= kernel_size), opts.padding (0), opts.dilation (1), opts.ceil_mode (false),
-- opts.return_indices (false: forward then also returns the i64 indices). See dl.max_pool2d.
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local module = require "ddplua.nn.module"
local window_args = require "ddplua.nn.window_args"

local MaxPool2d = module.Module:extend("MaxPool2d")

local KNOWN = options.known { "stride", "padding", "dilation", "ceil_mode", "return_indices" }
function MaxPool2d:init(kernel_size, opts)
  opts = options.check("MaxPool2d", opts, KNOWN)
  self.kernel_size = kernel_size
  self.stride = opts.stride or kernel_size
  self.padding = opts.padding or 0
  self.dilation = opts.dilation or 1
  self.ceil_mode = opts.ceil_mode or false
  self.return_indices = opts.return_indices or false
  local function pair(v, what) return window_args.pair(v, "MaxPool2d", what) end
  window_args.pool("MaxPool2d", pair(self.kernel_size, "kernel_size"), pair(self.stride, "stride"),
    pair(self.padding, "padding"), pair(self.dilation, "dilation"))
end

function MaxPool2d:forward(x)
  return dl.max_pool2d(x, self.kernel_size, { stride = self.stride, padding = self.padding,
    dilation = self.dilation, ceil_mode = self.ceil_mode, return_indices = self.return_indices })
end

function MaxPool2d:extra_repr()
  local repr = module.repr
  return ("kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s"):format(
    repr(self.kernel_size), repr(self.stride), repr(self.padding), repr(self.dilation), repr(self.ceil_mode))
end

return MaxPool2d
