--- ddplua.nn.sync_batch_norm: nn.SyncBatchNorm(num_features[, opts]), PyTorch's
-- torch.nn.SyncBatchNorm: batch norm whose training statistics are those of the whole
-- batch over the ranks of a process group.
--
--   local bn = nn.SyncBatchNorm(64, {process_group = group})          -- x (N, C, *), C = 64
--   model = nn.SyncBatchNorm.convert_sync_batchnorm(model[, group])   -- every BatchNorm*d
--
-- opts: as nn.BatchNorm1d/2d (eps 1e-5, momentum 0.1 or false for a cumulative average,
-- affine, track_running_stats, dtype, device) and process_group (default: the world group
-- at forward time). Input: any rank >= 2, channels in dim 2 (N, C), (N, C, L), (N, C, H, W).
--
-- In training with a group of more than one rank, the forward all-gathers each rank's
-- per-channel mean, biased variance and count, normalises with the global mean and biased
-- variance, and updates the running stats with the global mean and unbiased variance; the
-- forward is made of differentiable ops and collectives (ddplua.nn.sync_batch_norm_function
-- over ddplua.distributed.nn.functional, after PyTorch's torch/nn/modules/_functions.py), so
-- the backward is the tape's, in C, with the all-gather's adjoint (a reduce-scatter of the
-- statistics' gradients) as its one collective. Every rank of the group must run the layer the
-- same number of times; batch sizes may differ (also 0). Eval mode uses the running stats
-- without any communication; without an initialised process group, or with a group of size
-- 1, the layer is exactly nn.BatchNorm (as PyTorch, which falls back to F.batch_norm).
-- Gradients of weight and bias stay local: DDP averages them as any other parameter's.
-- Unlike PyTorch 1.x it works on the CPU (gloo) as well as on CUDA (nccl).
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local bn = require "ddplua.nn.batch_norm"
local Group = require "ddplua.distributed.group"
local sync_batch_norm = require "ddplua.nn.sync_batch_norm_function"

local BatchNorm = bn.BatchNorm
local SyncBatchNorm = BatchNorm:extend("SyncBatchNorm")

local KNOWN = options.known { "eps", "momentum", "affine", "track_running_stats", "process_group",
  "dtype", "device" }

local function check_group(group, what)
  if group ~= nil and getmetatable(group) ~= Group then
    lib.raise(("%s: process_group must be a process group (dist.new_group or "
      .. "dist.get_default_group), got %s"):format(what, type(group)))
  end
end

--- nn.SyncBatchNorm(num_features[, opts]): see the file's comment. Raises for unknown
-- options, a num_features that is not a positive integer, and a process_group that is not
-- a process group.
function SyncBatchNorm:init(num_features, opts)
  opts = options.check("SyncBatchNorm", opts, KNOWN)
  check_group(opts.process_group, "SyncBatchNorm")
  local rest = {}
  for k, v in pairs(opts) do
    if k ~= "process_group" then rest[k] = v end
  end
  BatchNorm.init(self, num_features, rest)
  self.process_group = opts.process_group
end

-- PyTorch's _check_input_dim and _check_non_zero_input_channels, and the channel count
-- (which PyTorch's kernels check deeper down).
function SyncBatchNorm:_check_input_dim(x)
  if not dl.is_tensor(x) then lib.raise("SyncBatchNorm: expected a tensor input, got " .. type(x)) end
  if x:dim() < 2 then
    lib.raise(("SyncBatchNorm: expected at least 2D input (got %dD input)"):format(x:dim()))
  end
  local c = x:size(2)
  if c == 0 then lib.raise("SyncBatchNorm number of input channels should be non-zero") end
  if c ~= self.num_features then
    lib.raise(("SyncBatchNorm: expected input with %d channels (num_features) in dim 2, got input "
      .. "of shape (%s) with %d"):format(self.num_features, table.concat(x:size(), ", "), c))
  end
end

-- The group the layer synchronises over in this forward, or nil when there is nothing to
-- synchronise (no process group initialised, or a group of one rank).
function SyncBatchNorm:_sync_group()
  local group = self.process_group
  if group == nil then
    local dist = require "ddplua.distributed"
    if not dist.is_initialized() then return nil end
    group = dist.get_default_group()
  end
  if group:size() < 2 then return nil end
  if not group:is_member() then
    lib.raise("SyncBatchNorm: this rank is not a member of process_group (its ranks: "
      .. table.concat(group.ranks, ", ") .. ")")
  end
  return group
end

--- bn:forward(x) -> y of x's shape: see the file's comment. Raises for an input of rank < 2,
-- with no channels or with a channel count other than num_features, and for a
-- process_group this rank is not a member of.
function SyncBatchNorm:forward(x)
  self:_check_input_dim(x)
  -- mini-batch statistics in training, and in eval when there are no running stats; only
  -- training synchronises (PyTorch: "Don't sync batchnorm stats in inference mode")
  local group = self.training and self:_sync_group() or nil
  if group == nil then return BatchNorm.forward(self, x) end
  local factor = self.momentum or 0
  if self.track_running_stats and self.num_batches_tracked ~= nil then
    local n = self.num_batches_tracked:item() + 1
    dl.no_grad(function() self.num_batches_tracked:fill_(n) end)
    if self.momentum == false then factor = 1 / n end
  end
  local running_mean = self.track_running_stats and self.running_mean or nil
  local running_var = self.track_running_stats and self.running_var or nil
  return sync_batch_norm(x, self.weight, self.bias, {
    running_mean = running_mean, running_var = running_var, eps = self.eps, momentum = factor,
    group = group })
end

-- Whether m is a batch norm layer (an instance of BatchNorm1d/2d, SyncBatchNorm, ...).
local function is_batch_norm(m)
  local cls = getmetatable(m)
  while cls ~= nil do
    if cls == BatchNorm then return true end
    cls = rawget(cls, "super")
  end
  return false
end

--- nn.SyncBatchNorm.convert_sync_batchnorm(module[, process_group]) -> module with every
-- BatchNorm layer of its tree replaced by a SyncBatchNorm over process_group (default: the
-- world at forward time), as PyTorch's: each new layer takes the old one's num_features,
-- eps, momentum, affine and track_running_stats, the SAME weight and bias parameters and
-- running_mean / running_var / num_batches_tracked buffers, and its training flag. Children
-- are replaced in place under their names (registration order kept); when module itself is
-- a batch norm layer the new layer is returned. Raises when process_group is not a group.
function SyncBatchNorm.convert_sync_batchnorm(module, process_group)
  check_group(process_group, "convert_sync_batchnorm")
  local out = module
  if is_batch_norm(module) then
    out = SyncBatchNorm(module.num_features, { eps = module.eps, momentum = module.momentum,
      affine = module.affine, track_running_stats = module.track_running_stats,
      process_group = process_group })
    if module.affine then
      out.weight = module.weight
      out.bias = module.bias
    end
    out.running_mean = module.running_mean
    out.running_var = module.running_var
    out.num_batches_tracked = module.num_batches_tracked
    out.training = module.training
  end
  for name, child in module:named_children() do
    out:add_module(name, SyncBatchNorm.convert_sync_batchnorm(child, process_group))
  end
  return out
end

return SyncBatchNorm
