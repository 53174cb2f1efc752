--- ddplua.nn.batch_norm: nn.BatchNorm1d and nn.BatchNorm2d (num_features[, opts]), PyTorch's.
-- BatchNorm1d takes x (N, C) or (N, C, L), BatchNorm2d x (N, C, H, W); C = num_features.
-- opts.eps (1e-5); opts.momentum (0.1; false = PyTorch's momentum=None: the running stats
-- are a cumulative average, factor 1 / num_batches_tracked); opts.affine (true: parameters
-- weight = 1 and bias = 0, (C)); opts.track_running_stats (true: buffers running_mean = 0,
-- running_var = 1 (C) and num_batches_tracked = 0 (i64, 0-d)); opts.dtype ("f32");
-- opts.device ("cpu"; "cuda", "cuda:k": made on the CPU, then moved).
-- Training mode normalises with the batch statistics and updates the running ones (when
-- tracked); eval mode uses the running statistics (or the batch's when not tracked).
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local BatchNorm = module.Module:extend("_BatchNorm")

local KNOWN = options.known { "eps", "momentum", "affine", "track_running_stats", "dtype", "device" }

function BatchNorm:init(num_features, opts)
  if type(num_features) ~= "number" or num_features % 1 ~= 0 or num_features <= 0 then
    lib.raise(self:_get_name() .. ": num_features must be a positive integer, got " .. tostring(num_features))
  end
  opts = options.check(self:_get_name(), opts, KNOWN)
  self.num_features = num_features
  self.eps = opts.eps or 1e-5
  if opts.momentum == false then self.momentum = false else self.momentum = opts.momentum or 0.1 end
  self.affine = opts.affine ~= false
  self.track_running_stats = opts.track_running_stats ~= false
  local dtype = opts.dtype or "f32"
  if self.affine then
    self.weight = module.Parameter(dl.ones({ num_features }, { dtype = dtype }))
    self.bias = module.Parameter(dl.zeros({ num_features }, { dtype = dtype }))
  else
    self:register_parameter("weight", nil)
    self:register_parameter("bias", nil)
  end
  if self.track_running_stats then
    self:register_buffer("running_mean", dl.zeros({ num_features }, { dtype = dtype }))
    self:register_buffer("running_var", dl.ones({ num_features }, { dtype = dtype }))
    self:register_buffer("num_batches_tracked", dl.tensor(0, { dtype = "i64" }))
  else
    self:register_buffer("running_mean", nil)
    self:register_buffer("running_var", nil)
    self:register_buffer("num_batches_tracked", nil)
  end
  if opts.device ~= nil then self:to(opts.device) end -- made on the CPU, then moved
end

--- bn:reset_running_stats(): running_mean 0, running_var 1, num_batches_tracked 0.
function BatchNorm:reset_running_stats()
  if not self.track_running_stats then return end
  dl.no_grad(function()
    self.running_mean:zero_()
    self.running_var:fill_(1)
    self.num_batches_tracked:zero_()
  end)
end

--- bn:reset_parameters(): the running stats reset, weight 1 and bias 0.
function BatchNorm:reset_parameters()
  self:reset_running_stats()
  if self.affine then
    dl.no_grad(function()
      self.weight:fill_(1)
      self.bias:zero_()
    end)
  end
end

function BatchNorm:_check_input_dim() end

-- The running stats to use and the options of dl.batch_norm for input x; counts the batch
-- in num_batches_tracked (training with tracked stats).
function BatchNorm:_batch_norm_args(x)
  self:_check_input_dim(x)
  local factor = self.momentum or 0
  if self.training and self.track_running_stats and self.num_batches_tracked ~= nil then
    local n = self.num_batches_tracked:item() + 1
    dl.no_grad(function() self.num_batches_tracked:fill_(n) end)
    if self.momentum == false then factor = 1 / n end
  end
  local bn_training = self.training or (self.running_mean == nil and self.running_var == nil)
  local use_stats = not self.training or self.track_running_stats
  return use_stats and self.running_mean or nil, use_stats and self.running_var or nil,
    { weight = self.weight, bias = self.bias, training = bn_training, momentum = factor, eps = self.eps }
end

function BatchNorm:forward(x)
  local rm, rv, opts = self:_batch_norm_args(x)
  return dl.batch_norm(x, rm, rv, opts)
end

--- bn:forward_relu(x[, residual]) -> relu(bn(x) + residual), the tail of a ResNet block, with
-- batch norm, the add and the ReLU fused into one pass (dl.batch_norm_relu): the same values,
-- gradients and running-stat updates as `(bn(x) + residual):relu()`, less memory traffic.
-- residual: nil or a tensor of x's shape. A subclass that overrides forward (SyncBatchNorm)
-- gets that composition with its own forward.
function BatchNorm:forward_relu(x, residual)
  if self.forward ~= BatchNorm.forward then
    local y = self:forward(x)
    if residual ~= nil then y = y + residual end
    return y:relu()
  end
  local rm, rv, opts = self:_batch_norm_args(x)
  opts.residual = residual
  return dl.batch_norm_relu(x, rm, rv, opts)
end

function BatchNorm:extra_repr()
  return ("%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s"):format(self.num_features,
    module.repr_float(self.eps), self.momentum and module.repr_float(self.momentum) or "None",
    module.repr(self.affine), module.repr(self.track_running_stats))
end

local function dim_checker(allowed, text)
  return function(self, x)
    if not dl.is_tensor(x) then
      lib.raise(self:_get_name() .. ": expected a tensor input, got " .. type(x))
    end
    local d = x:dim()
    if not allowed[d] then
      lib.raise(("%s: expected %s input (got %dD input)"):format(self:_get_name(), text, d))
    end
  end
end

local BatchNorm1d = BatchNorm:extend("BatchNorm1d")
BatchNorm1d._check_input_dim = dim_checker({ [2] = true, [3] = true }, "2D or 3D")

local BatchNorm2d = BatchNorm:extend("BatchNorm2d")
BatchNorm2d._check_input_dim = dim_checker({ [4] = true }, "4D")

return { BatchNorm = BatchNorm, BatchNorm1d = BatchNorm1d, BatchNorm2d = BatchNorm2d }
