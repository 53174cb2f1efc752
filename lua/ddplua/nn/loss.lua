--- ddplua.nn.loss: the loss layers, PyTorch's (torch/nn/modules/loss.py); forward(input,
-- target) -> the loss (a 0-d tensor, or per element with reduction "none").
-- CrossEntropyLoss([opts]): logits (N, C) or (N, C, d...), target class ids (i64, 0-based)
--   or probabilities; opts.weight (C) (registered as the buffer "weight", as PyTorch),
--   opts.ignore_index (-100), opts.reduction ("mean", "sum", "none"), opts.label_smoothing (0).
-- NLLLoss([opts]): log-probabilities; opts as CrossEntropyLoss's but label_smoothing.
-- MSELoss([opts]): opts.reduction. See dl.cross_entropy, dl.nll_loss, dl.mse_loss.
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local Module = module.Module

local M = {}

local function reduction_of(name, opts)
  local r = opts and opts.reduction or "mean"
  if r ~= "mean" and r ~= "sum" and r ~= "none" then
    lib.raise(name .. ": reduction must be 'none', 'mean' or 'sum', got '" .. tostring(r) .. "'")
  end
  return r
end

local WEIGHTED = options.known { "weight", "ignore_index", "reduction" }
local CROSS_ENTROPY = options.known { "weight", "ignore_index", "reduction", "label_smoothing" }
local REDUCTION = options.known { "reduction" }

local function weighted_init(name, known)
  return function(self, opts)
    opts = options.check(name, opts, known)
    self.reduction = reduction_of(name, opts)
    self.ignore_index = opts.ignore_index or -100
    self:register_buffer("weight", opts.weight)
  end
end

M.CrossEntropyLoss = Module:extend("CrossEntropyLoss")
local ce_init = weighted_init("CrossEntropyLoss", CROSS_ENTROPY)
function M.CrossEntropyLoss:init(opts)
  ce_init(self, opts)
  self.label_smoothing = opts and opts.label_smoothing or 0
end
function M.CrossEntropyLoss:forward(input, target)
  return dl.cross_entropy(input, target, { weight = self.weight, ignore_index = self.ignore_index,
    reduction = self.reduction, label_smoothing = self.label_smoothing })
end

M.NLLLoss = Module:extend("NLLLoss")
M.NLLLoss.init = weighted_init("NLLLoss", WEIGHTED)
function M.NLLLoss:forward(input, target)
  return dl.nll_loss(input, target, { weight = self.weight, ignore_index = self.ignore_index,
    reduction = self.reduction })
end

M.MSELoss = Module:extend("MSELoss")
function M.MSELoss:init(opts)
  self.reduction = reduction_of("MSELoss", options.check("MSELoss", opts, REDUCTION))
end
function M.MSELoss:forward(input, target) return dl.mse_loss(input, target, { reduction = self.reduction }) end

return M
