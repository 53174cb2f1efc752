--- ddplua.nn.rms_norm: nn.RMSNorm, as PyTorch's torch.nn.RMSNorm (Zhang and Sennrich 2019,
-- "Root Mean Square Layer Normalization", arXiv:1910.07467; the norm of Llama):
--   y = x / sqrt(mean(x^2 over the normalised dimensions) + eps) * weight
-- x: (..., *normalized_shape) floating. Built from differentiable ops (pow, mean, rsqrt,
-- mul), so its gradient is theirs.
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local RMSNorm = module.Module:extend("RMSNorm")

local KNOWN = options.known { "eps", "elementwise_affine", "dtype", "device" }

--- nn.RMSNorm(normalized_shape, {eps = nil, elementwise_affine = true, dtype, device}):
-- normalized_shape a size or a list of the trailing sizes; eps nil takes the dtype's machine
-- epsilon (PyTorch's torch.finfo(x.dtype).eps); weight (normalized_shape) starts at ones.
-- Raises for a bad shape or an unknown option.
function RMSNorm:init(normalized_shape, opts)
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  if type(normalized_shape) ~= "table" or #normalized_shape == 0 then
    lib.raise("RMSNorm: normalized_shape must be a number or a non-empty table of sizes, got " .. tostring(normalized_shape))
  end
  opts = options.check("RMSNorm", opts, KNOWN)
  self.normalized_shape = { unpack(normalized_shape) }
  self.eps = opts.eps
  self.elementwise_affine = opts.elementwise_affine ~= false
  if self.elementwise_affine then
    self.weight = module.Parameter(dl.ones(self.normalized_shape, { dtype = opts.dtype or "f32" }))
  else
    self:register_parameter("weight", nil)
  end
  if opts.device ~= nil then self:to(opts.device) end
end

local EPS = { f32 = 1.1920928955078125e-07, f64 = 2.220446049250313e-16, f16 = 0.0009765625, bf16 = 0.0078125 }

--- rms(x) -> y of x's shape (see the top of the file).
function RMSNorm:forward(x)
  local dims = {}
  local n = x:dim()
  for i = 1, #self.normalized_shape do dims[i] = n - #self.normalized_shape + i end
  local eps = self.eps or EPS[x.dtype] or EPS.f32
  local y = x * (x:pow(2):mean(dims, { keepdim = true }) + eps):rsqrt()
  if self.weight ~= nil then y = y * self.weight end
  return y
end

--- The repr's arguments: "(8,), eps=None, elementwise_affine=True".
function RMSNorm:extra_repr()
  return ("%s, eps=%s, elementwise_affine=%s"):format(module.repr(self.normalized_shape),
    self.eps and module.repr_float(self.eps) or "None", module.repr(self.elementwise_affine))
end

return RMSNorm
