--- ddplua.nn.transformer_encoder_layer: nn.TransformerEncoderLayer(d_model, nhead[, opts]),
-- PyTorch 1.13's: self-attention then a feed-forward block, each with dropout, a residual
-- connection and a LayerNorm (after the residual, or before the block with norm_first).
-- Children and parameter names as PyTorch's: self_attn (nn.MultiheadAttention), linear1
-- (d_model -> dim_feedforward), dropout, linear2 (dim_feedforward -> d_model), norm1,
-- norm2, dropout1, dropout2.
-- opts.dim_feedforward (2048), opts.dropout (0.1), opts.activation ("relu", "gelu" or a
-- function of a tensor), opts.layer_norm_eps (1e-5), opts.batch_first (false: (S, N, E);
-- true: (N, S, E)), opts.norm_first (false), opts.bias (true), opts.dtype, opts.device,
-- opts.generator (initialisation and dropout).
--
-- layer(src[, opts]) -> output of src's shape: opts.src_mask (S, S) or (N * nhead, S, S)
-- and opts.src_key_padding_mask (N, S), with nn.MultiheadAttention's conventions (bool
-- true = masked out, or floating, added); opts.is_causal as there. The attention runs as
-- the fused scaled_dot_product_attention (need_weights = false).
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local blocks = require "ddplua.nn.transformer_blocks"

local TransformerEncoderLayer = module.Module:extend("TransformerEncoderLayer")

local KNOWN = options.known { "dim_feedforward", "dropout", "activation", "layer_norm_eps", "batch_first",
  "norm_first", "bias", "dtype", "device", "generator" }

function TransformerEncoderLayer:init(d_model, nhead, opts)
  opts = options.check("TransformerEncoderLayer", opts, KNOWN)
  local c = blocks.common(self, "TransformerEncoderLayer", d_model, nhead, opts)
  self.self_attn = blocks.attention(d_model, nhead, c)
  blocks.feed_forward(self, d_model, c)
  self.norm_first = c.norm_first
  self.norm1 = blocks.norm(d_model, c)
  self.norm2 = blocks.norm(d_model, c)
  self.dropout1 = blocks.dropout(c)
  self.dropout2 = blocks.dropout(c)
  if opts.device ~= nil then self:to(opts.device) end
end

function TransformerEncoderLayer:_sa_block(x, attn_mask, key_padding_mask, is_causal)
  x = self.self_attn(x, x, x, { attn_mask = attn_mask, key_padding_mask = key_padding_mask,
    is_causal = is_causal, need_weights = false })
  return self.dropout1(x)
end

function TransformerEncoderLayer:_ff_block(x)
  return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
end

function TransformerEncoderLayer:forward(src, opts)
  opts = opts or {}
  local x, mask, kpm, causal = src, opts.src_mask, opts.src_key_padding_mask, opts.is_causal
  if self.norm_first then
    x = x + self:_sa_block(self.norm1(x), mask, kpm, causal)
    x = x + self:_ff_block(self.norm2(x))
  else
    x = self.norm1(x + self:_sa_block(x, mask, kpm, causal))
    x = self.norm2(x + self:_ff_block(x))
  end
  return x
end

return TransformerEncoderLayer
