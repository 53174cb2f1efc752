--- ddplua.nn.sync_batch_norm_function: the computation behind nn.SyncBatchNorm in training
-- mode, after PyTorch's SyncBatchNorm (torch/nn/modules/_functions.py): batch statistics
-- over the batches of every rank of a process group, written with differentiable ops and
-- the differentiable collectives of ddplua.distributed.nn.functional, so the autograd tape
-- derives its backward in C (no autograd.Function, no Lua step in backward).
--
--   local y = sync_batch_norm(x, weight, bias, state)
--
-- x: (N, C, *) floating, channels in dim 2 (N may differ between ranks, and may be 0);
-- weight, bias: (C) or nil; state: a table {running_mean =, running_var = (C) or nil,
-- eps =, momentum = (the update factor, a number), group = (a process group object)}.
-- Returns y of x's shape; its dtype is x's (a half x with f32 parameters included, as
-- dl.batch_norm), or f64 when the weight is f64. f16/bf16 are computed through f32.
--
-- Forward (Note [sync batch norm statistics]): each rank computes its per-channel mean_r,
-- biased variance var_r and count M_r = N_r * spatial; the rows (mean_r, var_r, M_r) are
-- all-gathered in f64 (F.all_gather_tensor: Note [gathering the statistics rows]) and
-- combined as PyTorch's batch_norm_gather_stats_with_counts (Chan et al.'s pairwise merge
-- of moments):
--   M = sum_r M_r,  mean = sum_r M_r mean_r / M,
--   var = (sum_r M_r var_r + sum_r M_r (mean_r - mean)^2) / M,
-- so ranks with different batch sizes give the exact statistics of the concatenated batch.
-- y = (x - mean) * (invstd * weight) + bias with invstd = 1 / sqrt(var + eps).
-- running_mean / running_var (when given) become (1 - momentum) * running + momentum *
-- (mean, var * M / (M - 1)): the UNBIASED global variance, as PyTorch.
--
-- Backward: the tape's. The gradient reaches each rank's (mean_r, var_r) through the
-- all-gather's adjoint (a reduce-scatter of the rows' gradients: one collective of
-- W * (2C + 1) f64 in backward, where PyTorch all-reduces 2C sums), and x through both its
-- statistics and the normalisation, which gives PyTorch's
--   grad_input = (dy - sum_dy / M - (x - mean) * invstd^2 * sum_dy_xmu / M) * invstd * weight
-- with the global sums; grad_weight and grad_bias stay local (DDP averages them as any
-- parameter gradient). Every rank takes part in the collectives, an empty batch included
-- (its statistics are zeros with count 0 and still depend on x, so its tape records the
-- all-gather too).
local dl = require "ddplua.functions"
local F = require "ddplua.distributed.nn.functional"

-- Note [sync batch norm statistics]: the gathered rows are f64 whatever x's dtype (a count
-- stays exact past 2^24 values per channel, and the merge loses nothing to f32), C small.
-- A rank with an empty batch sends mean 0, variance 0 and count 0: its terms vanish from
-- every sum (PyTorch masks such rows out on the host; the zero count does it here without
-- reading the counts back, so a device input never synchronises).

-- Note [gathering the statistics rows]: the rows must reach every rank unchanged, not
-- summed (the counts differ: PyTorch all-gathers them). One F.all_gather_tensor of the
-- (1, 2C + 1) row: through shared memory on one host (all_gather_into_tensor's segment
-- path), exact, and differentiable, its backward a reduce-scatter that hands each rank the
-- gradient of its own row.

-- The output dtype, as dl.batch_norm's: x's, also for a half x with f32 parameters (PyTorch's
-- mixed batch norm; autocast leaves batch norm alone: Note [autocast policy]); f64 when
-- either is f64; f32 for an f32 x with half parameters.
local function result_dtype(x, weight)
  if weight == nil or weight.dtype == x.dtype then return x.dtype end
  if x.dtype == "f64" or weight.dtype == "f64" then return "f64" end
  if x.dtype == "f16" or x.dtype == "bf16" then return x.dtype end
  return "f32"
end

--- sync_batch_norm(x, weight, bias, state) -> y: see the file's comment. Differentiable
-- (through the tape) in x, weight and bias; updates state.running_mean / running_var in
-- place (no gradient). Collectives on state.group: one all-gather in forward, its adjoint in
-- backward when x requires grad.
local function sync_batch_norm(x, weight, bias, state)
  local C, dev = x:size(2), x.device
  local count = x:numel() / C
  -- Note [sync batch norm statistics]; (2, C) f64: mean_r, biased var_r (zeros when empty)
  local moments = dl.batch_norm_moments(x)
  local row = dl.cat({ moments:view({ 2 * C }), dl.full({ 1 }, count, { dtype = "f64", device = dev }) }, 1)
  -- Note [gathering the statistics rows]
  local rows = F.all_gather_tensor(row:view({ 1, 2 * C + 1 }), 1, state.group) -- (W, 2C+1)
  local mean_all, var_all = rows:narrow(2, 1, C), rows:narrow(2, C + 1, C)
  local counts = rows:narrow(2, 2 * C + 1, 1):detach()              -- (W, 1) constants
  local total = counts:sum()                                         -- 0-d: M over the group
  local mean = (mean_all * counts):sum(1) / total                    -- (C)
  local var = ((var_all * counts):sum(1) + ((mean_all - mean):pow(2) * counts):sum(1)) / total
  dl.no_grad(function()
    local m = state.momentum
    if state.running_mean ~= nil then
      local rm = state.running_mean
      rm:copy_(rm:to("f64") * (1 - m) + mean * m)
    end
    if state.running_var ~= nil then
      local rv = state.running_var
      rv:copy_(rv:to("f64") * (1 - m) + var * total / (total - 1) * m)
    end
  end)
  -- the normalisation as batch norm's own kernels, differentiable in x, weight, bias and the
  -- global statistics (Note [differentiable sync batch norm steps] in runtime/ops/norm.c)
  local y = dl.batch_norm_elemt(x, weight, bias, mean, var, state.eps)
  local out_dtype = result_dtype(x, weight)
  if y.dtype ~= out_dtype then y = y:to(out_dtype) end
  return y
end

return sync_batch_norm
