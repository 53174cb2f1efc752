--- ddplua.nn.multihead_attention: nn.MultiheadAttention(embed_dim, num_heads[, opts]),
-- PyTorch 1.13's (Vaswani et al. 2017, "Attention Is All You Need"), with its parameter
-- names so state dicts cross both ways:
--   in_proj_weight (3 E, E) and in_proj_bias (3 E) (q, k, v stacked in that order), or,
--   when kdim or vdim differ from E, q_proj_weight (E, E), k_proj_weight (E, kdim),
--   v_proj_weight (E, vdim) with in_proj_bias (3 E); out_proj.weight (E, E), out_proj.bias (E).
-- opts.dropout (0) on the attention weights in training mode, opts.bias (true),
-- opts.batch_first (false: inputs and output (L, N, E); true: (N, L, E)), opts.kdim,
-- opts.vdim (E), opts.dtype ("f32"), opts.device, opts.generator (initialisation and
-- dropout). Initialisation as PyTorch's _reset_parameters: xavier_uniform_ on the input
-- projections, zero biases, out_proj.weight as nn.Linear's.
--
-- mha(query, key, value[, opts]) -> attn_output, attn_weights:
--   query (L, N, E) (or (N, L, E) batch_first; (L, E) unbatched), key (S, N, kdim), value
--   (S, N, vdim); attn_output as query with E features.
--   opts.key_padding_mask (N, S) (or (S) unbatched): bool, true = that key is ignored, or
--   floating, added; opts.attn_mask (L, S) or (N * num_heads, L, S): bool, true = NOT
--   allowed to attend (PyTorch's MultiheadAttention convention, the opposite of
--   scaled_dot_product_attention's), or floating, added; opts.is_causal (false): key j > i
--   takes no part (with attn_mask given it is only a hint, as PyTorch 2.x, and the mask is
--   used; without one the causal mask is applied, where PyTorch raises);
--   opts.need_weights (true): also return the attention weights (N, L, S) averaged over
--   the heads (opts.average_attn_weights, true) or (N, num_heads, L, S) (after dropout,
--   as PyTorch 1.13 returns them), computed
--   explicitly; with need_weights = false attn_weights is nil and the attention runs as
--   the fused dl.scaled_dot_product_attention (memory linear in L and S).
-- Raises naming MultiheadAttention for shapes that do not fit (PyTorch's messages).
local dl = require "ddplua.functions"
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local init = require "ddplua.nn.weight_init"
local Linear = require "ddplua.nn.linear"

local MultiheadAttention = module.Module:extend("MultiheadAttention")

local KNOWN = options.known { "dropout", "bias", "batch_first", "kdim", "vdim", "dtype", "device",
  "generator", "add_bias_kv", "add_zero_attn" }

function MultiheadAttention:init(embed_dim, num_heads, opts)
  opts = options.check("MultiheadAttention", opts, KNOWN)
  if type(embed_dim) ~= "number" or embed_dim <= 0 or embed_dim % 1 ~= 0 then
    lib.raise("MultiheadAttention: embed_dim must be a positive integer, got " .. tostring(embed_dim))
  end
  if type(num_heads) ~= "number" or num_heads <= 0 or num_heads % 1 ~= 0 then
    lib.raise("MultiheadAttention: num_heads must be a positive integer, got " .. tostring(num_heads))
  end
  if embed_dim % num_heads ~= 0 then
    lib.raise("MultiheadAttention: embed_dim must be divisible by num_heads")
  end
  if opts.add_bias_kv or opts.add_zero_attn then
    lib.raise("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
  end
  local dropout = opts.dropout or 0
  if type(dropout) ~= "number" or dropout < 0 or dropout >= 1 then
    lib.raise("MultiheadAttention: dropout must be in [0, 1), got " .. tostring(dropout))
  end
  local E, dtype = embed_dim, opts.dtype or "f32"
  self.embed_dim, self.num_heads, self.head_dim = E, num_heads, math.floor(E / num_heads)
  self.kdim, self.vdim = opts.kdim or E, opts.vdim or E
  self._qkv_same_embed_dim = self.kdim == E and self.vdim == E
  self.dropout = dropout
  self.batch_first = opts.batch_first and true or false
  self.generator = opts.generator
  local function param(shape) return module.Parameter(dl.empty(shape, { dtype = dtype })) end
  if self._qkv_same_embed_dim then
    self.in_proj_weight = param { 3 * E, E }
    self:register_parameter("q_proj_weight", nil)
    self:register_parameter("k_proj_weight", nil)
    self:register_parameter("v_proj_weight", nil)
  else
    self.q_proj_weight = param { E, E }
    self.k_proj_weight = param { E, self.kdim }
    self.v_proj_weight = param { E, self.vdim }
    self:register_parameter("in_proj_weight", nil)
  end
  if opts.bias ~= false then
    self.in_proj_bias = param { 3 * E }
  else
    self:register_parameter("in_proj_bias", nil)
  end
  self.out_proj = Linear(E, E, { bias = opts.bias ~= false, dtype = dtype, generator = opts.generator })
  self:_reset_parameters(opts.generator)
  if opts.device ~= nil then self:to(opts.device) end
end

--- mha:_reset_parameters([generator]): PyTorch's initialisation (see above).
function MultiheadAttention:_reset_parameters(generator)
  local g = { generator = generator }
  if self._qkv_same_embed_dim then
    init.xavier_uniform_(self.in_proj_weight, g)
  else
    init.xavier_uniform_(self.q_proj_weight, g)
    init.xavier_uniform_(self.k_proj_weight, g)
    init.xavier_uniform_(self.v_proj_weight, g)
  end
  if self.in_proj_bias ~= nil then
    init.constant_(self.in_proj_bias, 0)
    init.constant_(self.out_proj.bias, 0)
  end
end

-- A mask as an additive floating tensor of dtype: bool true -> -inf, false -> 0.
local function additive(mask, dtype)
  if mask.dtype == "bool" then
    return dl.where(mask, -math.huge, dl.zeros(mask:size(), { dtype = dtype }))
  end
  if not mask:is_floating_point() then
    lib.raise("MultiheadAttention: only bool and floating masks are supported, got " .. mask.dtype)
  end
  return mask
end

local function shape_str(t) return "(" .. table.concat(t:size(), ", ") .. ")" end

-- The combined additive mask, broadcastable to (N, H, L, S), or nil.
function MultiheadAttention:_merged_mask(attn_mask, key_padding_mask, N, L, S, dtype)
  local H, mask = self.num_heads, nil
  if attn_mask ~= nil then
    if attn_mask:dim() == 2 then
      if attn_mask:size(1) ~= L or attn_mask:size(2) ~= S then
        lib.raise(("MultiheadAttention: The shape of the 2D attn_mask is %s, but should be (%d, %d).")
          :format(shape_str(attn_mask), L, S))
      end
      mask = additive(attn_mask, dtype)
    elseif attn_mask:dim() == 3 then
      if attn_mask:size(1) ~= N * H or attn_mask:size(2) ~= L or attn_mask:size(3) ~= S then
        lib.raise(("MultiheadAttention: The shape of the 3D attn_mask is %s, but should be (%d, %d, %d).")
          :format(shape_str(attn_mask), N * H, L, S))
      end
      mask = additive(attn_mask, dtype):view(N, H, L, S)
    else
      lib.raise(("MultiheadAttention: attn_mask's dimension %d is not supported"):format(attn_mask:dim()))
    end
  end
  if key_padding_mask ~= nil then
    if key_padding_mask:dim() ~= 2 or key_padding_mask:size(1) ~= N or key_padding_mask:size(2) ~= S then
      lib.raise(("MultiheadAttention: expecting key_padding_mask shape of (%d, %d), but got %s")
        :format(N, S, shape_str(key_padding_mask)))
    end
    local kpm = additive(key_padding_mask, dtype):view(N, 1, 1, S)
    mask = mask and mask + kpm or kpm
  end
  return mask
end

function MultiheadAttention:forward(query, key, value, opts)
  opts = opts or {}
  local E, H, hd = self.embed_dim, self.num_heads, self.head_dim
  -- self-attention (one tensor for query, key and value): one packed input projection
  local packed = rawequal(query, key) and rawequal(key, value) and self._qkv_same_embed_dim
  local batched = query:dim() == 3
  if not batched then
    if query:dim() ~= 2 then
      lib.raise("MultiheadAttention: query should be unbatched 2D or batched 3D tensor but received "
        .. query:dim() .. "-D query tensor")
    end
    -- (L, E) as a batch of one, in the layout batch_first says
    local d = self.batch_first and 1 or 2
    query, key, value = query:unsqueeze(d), key:unsqueeze(d), value:unsqueeze(d)
    if opts.key_padding_mask ~= nil then
      opts = setmetatable({ key_padding_mask = opts.key_padding_mask:unsqueeze(1) }, { __index = opts })
    end
  end
  -- work batch-major: (N, L, E)
  if not self.batch_first then
    query, key, value = query:transpose(1, 2), key:transpose(1, 2), value:transpose(1, 2)
  end
  local N, L, S = query:size(1), query:size(2), key:size(2)
  if query:size(3) ~= E then
    lib.raise(("MultiheadAttention: was expecting embedding dimension of %d, but got %d"):format(E, query:size(3)))
  end
  if key:size(1) ~= N or value:size(1) ~= N or value:size(2) ~= S then
    lib.raise(("MultiheadAttention: key %s and value %s do not match query %s in batch and sequence dims")
      :format(shape_str(key), shape_str(value), shape_str(query)))
  end
  local b = self.in_proj_bias
  local bq, bk, bv
  if b ~= nil then bq, bk, bv = b:narrow(1, 1, E), b:narrow(1, E + 1, E), b:narrow(1, 2 * E + 1, E) end
  local wq, wk, wv
  if self._qkv_same_embed_dim then
    local w = self.in_proj_weight
    wq, wk, wv = w:narrow(1, 1, E), w:narrow(1, E + 1, E), w:narrow(1, 2 * E + 1, E)
  else
    wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
  end
  -- (N, L, E) -> (N, H, L, hd)
  local function heads(x, w, bias, len)
    return dl.linear(x, w, bias):view(N, len, H, hd):transpose(2, 3)
  end
  local q, k, v
  if packed then -- (N, L, 3 E) -> (3, N, H, L, hd), as PyTorch's _in_projection_packed
    local qkv = dl.linear(query, self.in_proj_weight, b):view(N, L, 3, H, hd):permute(3, 1, 4, 2, 5)
    q, k, v = qkv:select(1, 1), qkv:select(1, 2), qkv:select(1, 3)
  else
    q, k, v = heads(query, wq, bq, L), heads(key, wk, bk, S), heads(value, wv, bv, S)
  end
  local mask = self:_merged_mask(opts.attn_mask, opts.key_padding_mask, N, L, S, q.dtype)
  local causal = opts.is_causal and mask == nil
  local p = self.training and self.dropout or 0
  local need_weights = opts.need_weights ~= false
  local ctx, weights
  if need_weights then
    local s = q:matmul(k:transpose(3, 4)):mul(1 / math.sqrt(hd))
    if causal then
      local above = dl.arange(S):view(1, S):gt(dl.arange(L):view(L, 1)) -- key j > query i
      mask = dl.where(above, -math.huge, dl.zeros({ L, S }, { dtype = q.dtype }))
    end
    if mask ~= nil then s = s + mask end
    weights = s:softmax(-1)
    -- PyTorch 1.13 returns the weights after dropout
    if p > 0 then weights = dl.dropout(weights, p, { generator = self.generator }) end
    ctx = weights:matmul(v)
  else
    ctx = dl.scaled_dot_product_attention(q, k, v, { attn_mask = mask, dropout_p = p, is_causal = causal,
      generator = self.generator })
  end
  -- (N, H, L, hd) -> (N, L, E) -> out_proj
  local out = self.out_proj(ctx:transpose(2, 3):reshape(N, L, E))
  if not self.batch_first then out = out:transpose(1, 2) end
  if not batched then out = out:squeeze(self.batch_first and 1 or 2) end
  if need_weights then
    if opts.average_attn_weights ~= false then weights = weights:sum(2) / H end
    if not batched then weights = weights:squeeze(1) end
    return out, weights
  end
  return out, nil
end

return MultiheadAttention
