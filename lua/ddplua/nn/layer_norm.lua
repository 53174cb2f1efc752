--- ddplua.nn.layer_norm: nn.LayerNorm(normalized_shape[, opts]), PyTorch's: normalises x
-- (..., *normalized_shape) over its trailing dims. normalized_shape a number or a table of
-- sizes; opts.eps (1e-5); opts.elementwise_affine (true: weight = 1 and bias = 0 of
-- normalized_shape); opts.bias (true; false leaves bias out); opts.dtype ("f32");
-- opts.device ("cpu"; "cuda", "cuda:k": made on the CPU, then moved).
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local LayerNorm = module.Module:extend("LayerNorm")

local KNOWN = options.known { "eps", "elementwise_affine", "bias", "dtype", "device" }
function LayerNorm:init(normalized_shape, opts)
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or #normalized_shape == 0 then
    lib.raise("LayerNorm: normalized_shape must be a number or a non-empty table of sizes, got "
      .. tostring(normalized_shape))
  end
  opts = options.check("LayerNorm", opts, KNOWN)
  local shape = {}
  for i, s in ipairs(normalized_shape) do
    if type(s) ~= "number" or s % 1 ~= 0 or s < 0 then
      lib.raise(("LayerNorm: normalized_shape entry %d must be a non-negative integer, got %s")
        :format(i, tostring(s)))
    end
    shape[i] = s
  end
  self.normalized_shape = shape
  self.eps = opts.eps or 1e-5
  self.elementwise_affine = opts.elementwise_affine ~= false
  local dtype = opts.dtype or "f32"
  if self.elementwise_affine then
    self.weight = module.Parameter(dl.ones(shape, { dtype = dtype }))
    if opts.bias ~= false then
      self.bias = module.Parameter(dl.zeros(shape, { dtype = dtype }))
    else
      self:register_parameter("bias", nil)
    end
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
  if opts.device ~= nil then self:to(opts.device) end -- made on the CPU, then moved
end

function LayerNorm:forward(x)
  return dl.layer_norm(x, self.normalized_shape, { weight = self.weight, bias = self.bias, eps = self.eps })
end

function LayerNorm:extra_repr()
  return ("%s, eps=%s, elementwise_affine=%s"):format(module.repr(self.normalized_shape),
    module.repr_float(self.eps), module.repr(self.elementwise_affine))
end

return LayerNorm
