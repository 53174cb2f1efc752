--- ddplua.nn.conv2d: nn.Conv2d(in_channels, out_channels, kernel_size[, opts]), PyTorch's
-- nn.Conv2d: x (N, C_in, H, W) -> (N, C_out, H_out, W_out) with
-- H_out = floor((H + 2 padding - dilation (kH - 1) - 1) / stride) + 1.
-- kernel_size, opts.stride (1), opts.padding (0, or "valid", or "same" for stride 1),
-- opts.dilation (1): numbers or {h, w} pairs; opts.groups (1; divides both channel counts);
-- opts.bias (true); opts.dtype ("f32"); opts.device ("cpu"; "cuda", "cuda:k": initialised
-- on the CPU, then moved); opts.generator for the initialisation.
-- Parameters: weight (C_out, C_in / groups, kH, kW), bias (C_out). Initialisation as
-- PyTorch: weight kaiming_uniform_(a = sqrt(5)), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
-- with fan_in = C_in / groups * kH * kW.
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local init = require "ddplua.nn.weight_init"
local window_args = require "ddplua.nn.window_args"

local Conv2d = module.Module:extend("Conv2d")

local function pair(v, what) return window_args.pair(v, "Conv2d", what) end

local function positive_int(v, what)
  if type(v) ~= "number" or v % 1 ~= 0 or v <= 0 then
    lib.raise("Conv2d: " .. what .. " must be a positive integer, got " .. tostring(v))
  end
end

local KNOWN = options.known { "stride", "padding", "dilation", "groups", "bias", "dtype", "device", "generator" }
function Conv2d:init(in_channels, out_channels, kernel_size, opts)
  positive_int(in_channels, "in_channels")
  positive_int(out_channels, "out_channels")
  opts = options.check("Conv2d", opts, KNOWN)
  local groups = opts.groups or 1
  positive_int(groups, "groups")
  if in_channels % groups ~= 0 then
    lib.raise(("Conv2d: in_channels (%d) must be divisible by groups (%d)"):format(in_channels, groups))
  end
  if out_channels % groups ~= 0 then
    lib.raise(("Conv2d: out_channels (%d) must be divisible by groups (%d)"):format(out_channels, groups))
  end
  self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
  self.kernel_size = pair(kernel_size, "kernel_size")
  self.stride = pair(opts.stride or 1, "stride")
  self.dilation = pair(opts.dilation or 1, "dilation")
  window_args.conv("Conv2d", self.kernel_size, self.stride, nil, self.dilation)
  local padding = opts.padding or 0
  if padding == "valid" then
    padding = { 0, 0 }
  elseif padding == "same" then
    if self.stride[1] ~= 1 or self.stride[2] ~= 1 then
      lib.raise("Conv2d: padding='same' is not supported for strided convolutions")
    end
    padding = {}
    for i = 1, 2 do
      local total = self.dilation[i] * (self.kernel_size[i] - 1)
      if total % 2 ~= 0 then
        lib.raise("Conv2d: padding='same' needs an even dilation * (kernel_size - 1) here, got " .. total)
      end
      padding[i] = total / 2
    end
  end
  self.padding = pair(padding, "padding")
  window_args.conv("Conv2d", self.kernel_size, self.stride, self.padding, self.dilation)
  local dtype = opts.dtype or "f32"
  self.weight = module.Parameter(dl.empty({ out_channels, in_channels / groups, self.kernel_size[1],
    self.kernel_size[2] }, { dtype = dtype }))
  if opts.bias ~= false then
    self.bias = module.Parameter(dl.empty({ out_channels }, { dtype = dtype }))
  else
    self:register_parameter("bias", nil)
  end
  self:reset_parameters(opts.generator)
  if opts.device ~= nil then self:to(opts.device) end -- initialised on the CPU, then moved
end

--- conv:reset_parameters([generator]): redraw the initial values (see above).
function Conv2d:reset_parameters(generator)
  init.default_affine_(self.weight, self.bias, generator)
end

function Conv2d:forward(x)
  return dl.conv2d(x, self.weight, self.bias, { stride = self.stride, padding = self.padding,
    dilation = self.dilation, groups = self.groups })
end

local function all_equal(p, v) return p[1] == v and p[2] == v end

function Conv2d:extra_repr()
  local repr = module.repr
  local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
    repr(self.kernel_size), repr(self.stride))
  if not all_equal(self.padding, 0) then s = s .. ", padding=" .. repr(self.padding) end
  if not all_equal(self.dilation, 1) then s = s .. ", dilation=" .. repr(self.dilation) end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if self.bias == nil then s = s .. ", bias=False" end
  return s
end

return Conv2d
