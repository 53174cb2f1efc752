--- ddplua.nn.linear: nn.Linear(in_features, out_features[, opts]), PyTorch's nn.Linear:
-- y = x · weightᵀ + bias, x (..., in_features) -> (..., out_features).
-- Parameters: weight (out_features, in_features), bias (out_features) unless opts.bias is
-- false. opts.dtype ("f32"), opts.device ("cpu"; "cuda", "cuda:k": initialised on the CPU,
-- then moved, so the values equal the CPU's), opts.generator (default generator) for the
-- initialisation:
-- weight kaiming_uniform_(a = sqrt(5)) (bound 1 / sqrt(in_features)), bias
-- U(-1 / sqrt(in_features), 1 / sqrt(in_features)), as PyTorch's reset_parameters.
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local init = require "ddplua.nn.weight_init"

local Linear = module.Module:extend("Linear")

local function check_size(v, what)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
    lib.raise("Linear: " .. what .. " must be a non-negative integer, got " .. tostring(v))
  end
end

local KNOWN = options.known { "bias", "dtype", "device", "generator" }
function Linear:init(in_features, out_features, opts)
  check_size(in_features, "in_features")
  check_size(out_features, "out_features")
  opts = options.check("Linear", opts, KNOWN)
  self.in_features, self.out_features = in_features, out_features
  local dtype = opts.dtype or "f32"
  self.weight = module.Parameter(dl.empty({ out_features, in_features }, { dtype = dtype }))
  if opts.bias ~= false then
    self.bias = module.Parameter(dl.empty({ out_features }, { dtype = dtype }))
  else
    self:register_parameter("bias", nil)
  end
  self:reset_parameters(opts.generator)
  if opts.device ~= nil then self:to(opts.device) end -- initialised on the CPU, then moved
end

--- linear:reset_parameters([generator]): redraw the initial values (see above).
function Linear:reset_parameters(generator)
  init.default_affine_(self.weight, self.bias, generator)
end

function Linear:forward(x) return dl.linear(x, self.weight, self.bias) end

function Linear:extra_repr()
  return ("in_features=%d, out_features=%d, bias=%s"):format(self.in_features, self.out_features,
    self.bias ~= nil and "True" or "False")
end

return Linear
