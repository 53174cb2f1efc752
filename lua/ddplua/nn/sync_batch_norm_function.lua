--- ddplua.nn.sync_batch_norm_function: the autograd Function behind nn.SyncBatchNorm in
-- training mode, after PyTorch's SyncBatchNorm Function (torch/nn/modules/_functions.py):
-- batch statistics over the batches of every rank of a process group.
--
--   local y = SyncBatchNormFunction.apply(x, weight, bias, state)
--
-- x: (N, C, *) floating, channels in dim 2 (N may differ between ranks, and may be 0);
-- weight, bias: (C) or nil; state: a table {running_mean =, running_var = (C) or nil,
-- eps =, momentum = (the update factor, a number), group = (a process group object),
-- world_size =}. Returns y of x's shape; its dtype is x's (a half x with f32 parameters
-- included, as dl.batch_norm), or f64 when the weight is f64. f16/bf16 are computed through
-- f32.
--
-- Forward (Note [sync batch norm statistics]): each rank computes its per-channel mean and
-- invstd = 1 / sqrt(biased var + eps) (dl.batch_norm_stats) and its count M_r = N_r * spatial;
-- the rows (mean, invstd, M_r) are all-gathered in f64 (Note [gathering the statistics
-- rows]) and combined as PyTorch's batch_norm_gather_stats_with_counts (Chan et al.'s
-- pairwise merge of moments):
--   M = sum_r M_r,  mean = sum_r M_r mean_r / M,
--   var = (sum_r M_r var_r + sum_r M_r (mean_r - mean)^2) / M,  var_r = invstd_r^-2 - eps,
-- so ranks with different batch sizes give the exact statistics of the concatenated batch.
-- y = (x - mean) * invstd * weight + bias. running_mean / running_var (when given) become
-- (1 - momentum) * running + momentum * (mean, var * M / (M - 1)): the UNBIASED global
-- variance, as PyTorch.
--
-- Backward (PyTorch's batch_norm_backward_reduce / batch_norm_backward_elemt): the local
-- per-channel sums sum_dy = sum(dy) and sum_dy_xmu = sum(dy * (x - mean)) give
-- grad_weight = sum_dy_xmu * invstd and grad_bias = sum_dy (local: DDP averages them as
-- any parameter gradient); when x needs a gradient the two sums are all-reduced (SUM) and
--   grad_input = (dy - sum_dy / M - (x - mean) * invstd^2 * sum_dy_xmu / M) * invstd * weight
-- with the global M. Every rank takes part in both collectives, an empty batch included
-- (its gradients are zeros of their shapes).
--
-- The passes over the data are the batch norm kernels of x's device (dl.batch_norm_stats,
-- batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt: PyTorch's
-- names); the rest is (C)-sized tensor ops and dl.distributed collectives. So a CUDA input
-- runs on its device with nccl, and nothing is read back on the host.
local dl = require "ddplua.functions"
local Function = require "ddplua.autograd.function"

local SyncBatchNormFunction = Function:extend("SyncBatchNorm")

-- Note [sync batch norm statistics]: the gathered rows are f64 whatever x's dtype (a count
-- stays exact past 2^24 values per channel, and the merge loses nothing to f32), C small.
-- A rank with an empty batch sends mean 0, invstd 1 and count 0: its terms vanish from
-- every sum (PyTorch sends invstd 0 and masks the row out on the host; invstd 1 keeps the
-- merge finite without reading the counts back, so a device input never synchronises).

-- Note [gathering the statistics rows]: the rows must reach every rank unchanged, not
-- summed (the counts differ: PyTorch all-gathers them). An all-reduce (SUM) of a (W, 2C+1)
-- matrix that is zero except for this rank's row is the same all-gather bit for bit (each
-- element is one rank's value plus zeros, exact in any order), and on one host it takes the
-- shared-memory all-reduce (ddplua/pg.h), about 0.02 ms here against 1-2 ms for Gloo's TCP
-- all-gather of a few hundred bytes. It moves W times the data, so past
-- PADDED_ALL_REDUCE_MAX elements (1 MiB of f64) the real all_gather is used.
local PADDED_ALL_REDUCE_MAX = 131072

-- The output dtype, as dl.batch_norm's: x's, also for a half x with f32 parameters (PyTorch's
-- mixed batch norm; autocast leaves batch norm alone: Note [autocast policy]); f64 when
-- either is f64; f32 for an f32 x with half parameters.
local function result_dtype(x, weight)
  if weight == nil or weight.dtype == x.dtype then return x.dtype end
  if x.dtype == "f64" or weight.dtype == "f64" then return "f64" end
  if x.dtype == "f16" or x.dtype == "bf16" then return x.dtype end
  return "f32"
end

--- Forward of SyncBatchNorm (see the file's comment). Runs with grad mode off.
function SyncBatchNormFunction.forward(ctx, x, weight, bias, state)
  local dist = require "ddplua.distributed"
  local C, W, dev = x:size(2), state.world_size, x.device
  local count = x:numel() / C
  local row
  if count > 0 then
    local mean, invstd = dl.batch_norm_stats(x, state.eps)   -- f16/bf16 through f32
    row = dl.cat({ mean:to("f64"), invstd:to("f64"), dl.full({ 1 }, count, { dtype = "f64", device = dev }) }, 1)
  else -- Note [sync batch norm statistics]: an empty batch still takes part
    row = dl.cat({ dl.zeros({ C }, { dtype = "f64", device = dev }), dl.ones({ C }, { dtype = "f64", device = dev }),
      dl.zeros({ 1 }, { dtype = "f64", device = dev }) }, 1)
  end
  -- Note [gathering the statistics rows]
  local rows
  if W * (2 * C + 1) <= PADDED_ALL_REDUCE_MAX then
    rows = dl.zeros({ W, 2 * C + 1 }, { dtype = "f64", device = dev })
    rows:narrow(1, state.group:rank() + 1, 1):copy_(row:view({ 1, 2 * C + 1 }))
    dist.all_reduce(rows, { group = state.group })
  else
    rows = dl.empty({ W, 2 * C + 1 }, { dtype = "f64", device = dev })
    dist.all_gather(rows, row, { group = state.group })
  end
  local mean_all, invstd_all = rows:narrow(2, 1, C), rows:narrow(2, C + 1, C)
  local counts = rows:narrow(2, 2 * C + 1, 1)                  -- (W, 1)
  local total = counts:sum()                                   -- 0-d: M over the group
  local mean = (mean_all * counts):sum(1) / total              -- (C)
  local var_all = invstd_all:pow(-2) - state.eps               -- (W, C): each rank's biased var
  local var = ((var_all * counts):sum(1) + ((mean_all - mean):pow(2) * counts):sum(1)) / total
  local invstd = (var + state.eps):rsqrt()                     -- (C)
  local m = state.momentum
  if state.running_mean ~= nil then
    local rm = state.running_mean
    rm:copy_(rm:to("f64") * (1 - m) + mean * m)
  end
  if state.running_var ~= nil then
    local rv = state.running_var
    rv:copy_(rv:to("f64") * (1 - m) + var * total / (total - 1) * m)
  end
  ctx:save_for_backward(x, weight, mean, invstd, total)
  ctx.group, ctx.bias_dtype = state.group, bias ~= nil and bias.dtype or nil
  -- the kernels of BatchNorm's own forward, with the global mean and biased variance
  local y = dl.batch_norm_elemt(x, weight, bias, mean, var, state.eps)
  local out_dtype = result_dtype(x, weight)
  if y.dtype ~= out_dtype then y = y:to(out_dtype) end
  return y
end

--- Backward of SyncBatchNorm (see the file's comment): grad_input, grad_weight, grad_bias.
function SyncBatchNormFunction.backward(ctx, dy)
  local dist = require "ddplua.distributed"
  local x, weight, mean, invstd, total = unpack(ctx.saved_tensors, 1, 5)
  local needs = ctx.needs_input_grad
  local C = x:size(2)
  local grad_input, grad_weight, grad_bias
  -- (C) f64 each; zeros for an empty batch, which still takes part in the all-reduce
  local sum_dy, sum_dy_xmu = dl.batch_norm_backward_reduce(dy, x, mean)
  -- local: DDP averages them; zeros for an empty batch (PyTorch returns None there), a
  -- gradient DDP can reduce
  if weight ~= nil and needs[2] then grad_weight = (sum_dy_xmu * invstd):to(weight.dtype) end
  if needs[3] then grad_bias = sum_dy:to(ctx.bias_dtype) end
  if needs[1] then
    local sums = dl.cat({ sum_dy, sum_dy_xmu }, 1)             -- (2C) f64
    dist.all_reduce(sums, { group = ctx.group })
    sums:div_(total)                                           -- the means over the global batch
    grad_input = dl.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sums:narrow(1, 1, C),
      sums:narrow(1, C + 1, C))
    if grad_input.dtype ~= x.dtype then grad_input = grad_input:to(x.dtype) end
  end
  return grad_input, grad_weight, grad_bias, nil
end

return SyncBatchNormFunction
