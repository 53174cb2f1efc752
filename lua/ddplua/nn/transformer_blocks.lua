--- ddplua.nn.transformer_blocks: the parts nn.TransformerEncoderLayer and
-- nn.TransformerDecoderLayer share (internal): option checks, the attention, feed-forward
-- and norm children built as PyTorch 1.13 builds them.
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local LayerNorm = require "ddplua.nn.layer_norm"
local Linear = require "ddplua.nn.linear"
local Dropout = require "ddplua.nn.dropout"
local MultiheadAttention = require "ddplua.nn.multihead_attention"

local M = {}

local ACTIVATIONS = {
  relu = function(x) return dl.relu(x) end,
  gelu = function(x) return dl.gelu(x) end,
}

--- common(layer, name, d_model, nhead, opts) -> c: the checked options with defaults
-- (PyTorch's), and layer.activation set. Raises naming `name`.
function M.common(layer, name, d_model, nhead, opts)
  local c = {
    dim_feedforward = opts.dim_feedforward or 2048,
    dropout = opts.dropout == nil and 0.1 or opts.dropout,
    eps = opts.layer_norm_eps or 1e-5,
    batch_first = opts.batch_first and true or false,
    norm_first = opts.norm_first and true or false,
    bias = opts.bias ~= false,
    dtype = opts.dtype or "f32",
    generator = opts.generator,
  }
  local act = opts.activation or "relu"
  if type(act) == "string" then
    if not ACTIVATIONS[act] then
      lib.raise(("%s: activation should be relu/gelu, not %s"):format(name, act))
    end
    layer.activation_relu_or_gelu = act
    act = ACTIVATIONS[act]
  elseif type(act) ~= "function" then
    lib.raise(("%s: activation must be \"relu\", \"gelu\" or a function, got %s"):format(name, type(act)))
  end
  layer.activation = act
  return c
end

--- attention(d_model, nhead, c) -> an nn.MultiheadAttention with the layer's options.
function M.attention(d_model, nhead, c)
  return MultiheadAttention(d_model, nhead, { dropout = c.dropout, bias = c.bias, batch_first = c.batch_first,
    dtype = c.dtype, generator = c.generator })
end

--- feed_forward(layer, d_model, c): layer.linear1, layer.dropout, layer.linear2 (PyTorch's order).
function M.feed_forward(layer, d_model, c)
  layer.linear1 = Linear(d_model, c.dim_feedforward, { bias = c.bias, dtype = c.dtype, generator = c.generator })
  layer.dropout = M.dropout(c)
  layer.linear2 = Linear(c.dim_feedforward, d_model, { bias = c.bias, dtype = c.dtype, generator = c.generator })
end

--- norm(d_model, c) -> an nn.LayerNorm(d_model) with the layer's eps.
function M.norm(d_model, c)
  return LayerNorm(d_model, { eps = c.eps, dtype = c.dtype, elementwise_affine = true, bias = c.bias })
end

--- dropout(c) -> an nn.Dropout(c.dropout) drawing from the layer's generator.
function M.dropout(c) return Dropout(c.dropout, { generator = c.generator }) end

return M
