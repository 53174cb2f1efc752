--- ddplua.ops.loss: loss functions with PyTorch's semantics (torch.nn.functional.nll_loss,
-- cross_entropy, mse_loss), as functions (dl.cross_entropy(input, target, opts)) and
-- tensor methods (input:cross_entropy(target, opts)).
--
-- Class labels are data: they count from 0 (0 .. C-1), as in PyTorch and the data files.
-- Options come in a trailing table; reduction is "mean" (default), "sum" or "none".
local lib = require "ddplua.lib"
local C = lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = { methods = {}, functions = {}, meta = {} }

local REDUCTIONS = {
  none = C.DDP_REDUCTION_NONE,
  mean = C.DDP_REDUCTION_MEAN,
  sum = C.DDP_REDUCTION_SUM,
}

-- The reduction enum of opts.reduction (nil: mean); raises naming the op otherwise.
local function reduction_of(opts, op)
  local name = opts and opts.reduction
  if name == nil then return C.DDP_REDUCTION_MEAN end
  local r = REDUCTIONS[name]
  if r == nil then
    lib.raise(op .. ": reduction must be 'none', 'mean' or 'sum', got '" .. tostring(name) .. "'")
  end
  return r
end

--- dl.nll_loss(input, target, opts): negative log-likelihood of log-probabilities.
-- input: (N, C), (N, C, d1, ...) or (C), floating (log-probabilities);
-- target: (N), (N, d1, ...) or () integer class indices 0 .. C-1 (i64);
-- opts.weight: (C) class weights; opts.reduction: "mean" (sum divided by the sum of the
-- weights of the non-ignored targets; nan when that is 0), "sum", "none" (target's shape);
-- opts.ignore_index (default -100): targets of this value add nothing.
-- Differentiable w.r.t. input. Raises on a target outside [0, C) (naming the value, its
-- position and C), on shapes that do not match (naming both), on a weight not of C
-- elements, on a floating target.
function M.functions.nll_loss(input, target, opts)
  local weight, ignore_index = nil, -100
  if opts then
    weight = opts.weight
    if opts.ignore_index ~= nil then ignore_index = opts.ignore_index end
  end
  check(C.ddp_nll_loss(box, input, target, weight, reduction_of(opts, "nll_loss"), ignore_index))
  return wrap(box[0])
end

--- dl.cross_entropy(input, target, opts): cross-entropy of logits, with a fused, stable
-- log-softmax over the class dimension (2nd; the only one for a (C) input).
-- input: (N, C), (N, C, d1, ...) or (C) logits, floating;
-- target: class indices as for nll_loss (integer, 0-based), or class probabilities
-- (floating, of input's shape);
-- opts.weight (C), opts.reduction ("mean", "sum", "none"), opts.ignore_index (-100; class
-- indices only), opts.label_smoothing (0; in [0, 1]: the target becomes
-- (1 - eps) * onehot + eps / C, PyTorch's exact weighting). Mean divides by the sum of the
-- target weights (class indices) or by the number of samples (probabilities).
-- Differentiable w.r.t. input. Raises as nll_loss, and on a floating target whose shape
-- differs from input's.
function M.functions.cross_entropy(input, target, opts)
  local weight, ignore_index, smoothing = nil, -100, 0
  if opts then
    weight = opts.weight
    if opts.ignore_index ~= nil then ignore_index = opts.ignore_index end
    if opts.label_smoothing ~= nil then smoothing = opts.label_smoothing end
  end
  check(C.ddp_cross_entropy(box, input, target, weight, reduction_of(opts, "cross_entropy"),
    ignore_index, smoothing))
  return wrap(box[0])
end

--- dl.mse_loss(input, target, opts): mean squared error (input - target)^2, input and
-- target broadcasting (NumPy rules), floating (result in their promoted dtype).
-- opts.reduction: "mean" (over the broadcast elements; nan for none), "sum", "none"
-- (broadcast shape). Differentiable w.r.t. input and target. Raises naming both shapes
-- when they do not broadcast.
function M.functions.mse_loss(input, target, opts)
  check(C.ddp_mse_loss(box, input, target, reduction_of(opts, "mse_loss")))
  return wrap(box[0])
end

--- input:nll_loss(target, opts), input:cross_entropy(target, opts),
-- input:mse_loss(target, opts): the functions above as methods.
M.methods.nll_loss = M.functions.nll_loss
M.methods.cross_entropy = M.functions.cross_entropy
M.methods.mse_loss = M.functions.mse_loss

return M
