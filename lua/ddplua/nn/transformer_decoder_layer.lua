--- ddplua.nn.transformer_decoder_layer: nn.TransformerDecoderLayer(d_model, nhead[, opts]),
-- PyTorch 1.13's: self-attention over the target, cross attention to the encoder's memory,
-- then a feed-forward block, each with dropout, a residual connection and a LayerNorm
-- (after the residual, or before the block with norm_first). Children and parameter names
-- as PyTorch's: self_attn, multihead_attn (nn.MultiheadAttention), linear1, dropout,
-- linear2, norm1, norm2, norm3, dropout1, dropout2, dropout3. Options as
-- nn.TransformerEncoderLayer's.
--
-- layer(tgt, memory[, opts]) -> output of tgt's shape; tgt (T, N, E), memory (S, N, E)
-- ((N, T, E), (N, S, E) batch_first). opts.tgt_mask (T, T) / opts.memory_mask (T, S) (or
-- with N * nhead in front), opts.tgt_key_padding_mask (N, T),
-- opts.memory_key_padding_mask (N, S), opts.tgt_is_causal, opts.memory_is_causal, with
-- nn.MultiheadAttention's conventions. Attention runs fused (need_weights = false).
local options = require "ddplua.options"
local module = require "ddplua.nn.module"
local blocks = require "ddplua.nn.transformer_blocks"

local TransformerDecoderLayer = module.Module:extend("TransformerDecoderLayer")

local KNOWN = options.known { "dim_feedforward", "dropout", "activation", "layer_norm_eps", "batch_first",
  "norm_first", "bias", "dtype", "device", "generator" }

function TransformerDecoderLayer:init(d_model, nhead, opts)
  opts = options.check("TransformerDecoderLayer", opts, KNOWN)
  local c = blocks.common(self, "TransformerDecoderLayer", d_model, nhead, opts)
  self.self_attn = blocks.attention(d_model, nhead, c)
  self.multihead_attn = blocks.attention(d_model, nhead, c)
  blocks.feed_forward(self, d_model, c)
  self.norm_first = c.norm_first
  self.norm1 = blocks.norm(d_model, c)
  self.norm2 = blocks.norm(d_model, c)
  self.norm3 = blocks.norm(d_model, c)
  self.dropout1 = blocks.dropout(c)
  self.dropout2 = blocks.dropout(c)
  self.dropout3 = blocks.dropout(c)
  if opts.device ~= nil then self:to(opts.device) end
end

function TransformerDecoderLayer:_sa_block(x, attn_mask, key_padding_mask, is_causal)
  x = self.self_attn(x, x, x, { attn_mask = attn_mask, key_padding_mask = key_padding_mask,
    is_causal = is_causal, need_weights = false })
  return self.dropout1(x)
end

function TransformerDecoderLayer:_mha_block(x, mem, attn_mask, key_padding_mask, is_causal)
  x = self.multihead_attn(x, mem, mem, { attn_mask = attn_mask, key_padding_mask = key_padding_mask,
    is_causal = is_causal, need_weights = false })
  return self.dropout2(x)
end

function TransformerDecoderLayer:_ff_block(x)
  return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))
end

function TransformerDecoderLayer:forward(tgt, memory, opts)
  opts = opts or {}
  local x = tgt
  if self.norm_first then
    x = x + self:_sa_block(self.norm1(x), opts.tgt_mask, opts.tgt_key_padding_mask, opts.tgt_is_causal)
    x = x + self:_mha_block(self.norm2(x), memory, opts.memory_mask, opts.memory_key_padding_mask,
      opts.memory_is_causal)
    x = x + self:_ff_block(self.norm3(x))
  else
    x = self.norm1(x + self:_sa_block(x, opts.tgt_mask, opts.tgt_key_padding_mask, opts.tgt_is_causal))
    x = self.norm2(x + self:_mha_block(x, memory, opts.memory_mask, opts.memory_key_padding_mask,
      opts.memory_is_causal))
    x = self.norm3(x + self:_ff_block(x))
  end
  return x
end

return TransformerDecoderLayer
