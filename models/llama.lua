--- models/llama.lua: a Llama-2-style decoder (Touvron et al. 2023, arXiv:2307.09288), shaped
-- as pytorch/examples' distributed/tensor_parallelism/llama2_model.py so that its
-- tensor-parallel plan (the fsdp_tp_example) applies name for name: tok_embeddings, layers.N
-- {attention_norm, attention {wq, wk, wv, wo}, ffn_norm, feed_forward {w1, w2, w3}}, norm,
-- output. RMSNorm before attention and feed-forward, rotary position embeddings (RoPE) on q and
-- k, grouped-query attention (n_kv_heads <= n_heads), SwiGLU feed-forward, no biases.
--
--   local Llama = require "models.llama"
--   local model = Llama { dim = 64, n_layers = 2, n_heads = 4, vocab_size = 128, max_seq_len = 32 }
--   local logits = model(tokens)                  -- tokens (B, T) i64 -> (B, T, vocab_size)
--
-- Config (ModelArgs' names and defaults, smaller ones where the example's would not fit a
-- spec): dim (256), n_layers (2), n_heads (16), n_kv_heads (n_heads), vocab_size (required),
-- multiple_of (256: the feed-forward width is rounded up to it), ffn_dim_multiplier (nil),
-- norm_eps (1e-5), max_seq_len (2048), rope_theta (10000), dtype ("f32").
-- Initialisation as the example's depth_init: every weight from N(0, 0.02), except wo, w2 and
-- w3 of layer l (0-based) from N(0, 0.02 / sqrt(2 (l + 1))) (the example uses a truncated
-- normal at 3 sigma: ddplua draws a plain normal).
--
-- Under tensor parallelism (Llama.tp_plan) each attention keeps n_heads / tp heads: the head
-- counts are read from the local widths of wq and wk, so the same forward runs whole or cut.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local F = require "ddplua.nn.functional"

local DEFAULTS = { dim = 256, n_layers = 2, n_heads = 16, multiple_of = 256, norm_eps = 1e-5, max_seq_len = 2048,
  rope_theta = 10000 }
local KNOWN = { dim = true, n_layers = true, n_heads = true, n_kv_heads = true, vocab_size = true, multiple_of = true,
  ffn_dim_multiplier = true, norm_eps = true, max_seq_len = true, rope_theta = true, dtype = true }

-- Note [llama rope]: RoPE (Su et al. 2021, arXiv:2104.09864) rotates each pair (x[2i], x[2i+1])
-- of a head (0-based i < head_dim / 2) at position t by the angle t * theta^(-2i / head_dim),
-- as the example's apply_rotary_emb does with complex numbers: here with the real cos / sin
-- tables (T, head_dim / 2) made once.
local function rope_tables(head_dim, max_seq_len, theta, dtype)
  local half = head_dim / 2
  local c, s = {}, {}
  for t = 1, max_seq_len do
    local cr, sr = {}, {}
    for i = 1, half do
      local angle = (t - 1) * theta ^ (-2 * (i - 1) / head_dim)
      cr[i], sr[i] = math.cos(angle), math.sin(angle)
    end
    c[t], s[t] = cr, sr
  end
  return dl.tensor(c, { dtype = dtype }), dl.tensor(s, { dtype = dtype })
end

-- x (B, T, h, hd) rotated pairwise by the first T rows of cos, sin (max_seq_len, hd / 2).
local function apply_rope(x, cos, sin)
  local s = x:size()
  local B, T, h, hd = s[1], s[2], s[3], s[4]
  local pairs_ = x:reshape(B, T, h, hd / 2, 2)
  local xe = pairs_:select(5, 1)
  local xo = pairs_:select(5, 2)
  local c = cos:narrow(1, 1, T):view(1, T, 1, hd / 2)
  local sn = sin:narrow(1, 1, T):view(1, T, 1, hd / 2)
  return dl.stack({ xe * c - xo * sn, xe * sn + xo * c }, 5):reshape(B, T, h, hd)
end

local Attention = nn.Module:extend("Attention")

function Attention:init(c)
  local dt = c.dtype or "f32"
  self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.dim / c.n_heads
  self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, { bias = false, dtype = dt })
  self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, { bias = false, dtype = dt })
  self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, { bias = false, dtype = dt })
  self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, { bias = false, dtype = dt })
end

--- attention(x, cos, sin) -> (B, T, dim): causal grouped-query attention with RoPE; x (B, T,
-- dim) a tensor or a replicated DTensor (tensor parallelism).
function Attention:forward(x, cos, sin)
  local s = x:size()
  local B, T = s[1], s[2]
  local hd = self.head_dim
  local q, k, v = self.wq(x), self.wk(x), self.wv(x)
  local nh, nkv = q:size(3) / hd, k:size(3) / hd -- this rank's heads
  q = apply_rope(q:view(B, T, nh, hd), cos, sin)
  k = apply_rope(k:view(B, T, nkv, hd), cos, sin)
  v = v:view(B, T, nkv, hd)
  if nkv < nh then -- grouped-query attention: each kv head serves nh / nkv query heads
    local rep = nh / nkv
    k = k:unsqueeze(4):expand(B, T, nkv, rep, hd):reshape(B, T, nh, hd)
    v = v:unsqueeze(4):expand(B, T, nkv, rep, hd):reshape(B, T, nh, hd)
  end
  local y = F.scaled_dot_product_attention(q:transpose(2, 3), k:transpose(2, 3), v:transpose(2, 3), { is_causal = true })
  return self.wo(y:transpose(2, 3):contiguous():view(B, T, nh * hd))
end

local FeedForward = nn.Module:extend("FeedForward")

function FeedForward:init(c)
  local hidden = math.floor(2 * 4 * c.dim / 3)
  if c.ffn_dim_multiplier then hidden = math.floor(c.ffn_dim_multiplier * hidden) end
  hidden = c.multiple_of * math.ceil(hidden / c.multiple_of)
  local dt = c.dtype or "f32"
  self.w1 = nn.Linear(c.dim, hidden, { bias = false, dtype = dt })
  self.w2 = nn.Linear(hidden, c.dim, { bias = false, dtype = dt })
  self.w3 = nn.Linear(c.dim, hidden, { bias = false, dtype = dt })
end

--- ffn(x) -> w2(silu(w1 x) * w3 x) (SwiGLU).
function FeedForward:forward(x) return self.w2(self.w1(x):silu() * self.w3(x)) end

local TransformerBlock = nn.Module:extend("TransformerBlock")

function TransformerBlock:init(c)
  self.attention = Attention(c)
  self.feed_forward = FeedForward(c)
  self.attention_norm = nn.RMSNorm(c.dim, { eps = c.norm_eps, dtype = c.dtype })
  self.ffn_norm = nn.RMSNorm(c.dim, { eps = c.norm_eps, dtype = c.dtype })
end

--- block(x, cos, sin) -> x + attention(norm(x)), then + feed_forward(norm(.)).
function TransformerBlock:forward(x, cos, sin)
  local h = x + self.attention(self.attention_norm(x), cos, sin)
  return h + self.feed_forward(self.ffn_norm(h))
end

local Transformer = nn.Module:extend("Transformer")

--- Llama(config) -> the model (see the top of the file). Raises for an unknown config field,
-- a missing vocab_size, dim not a multiple of n_heads, n_heads not a multiple of n_kv_heads.
function Transformer:init(config)
  local c = {}
  for k, v in pairs(config or {}) do
    if not KNOWN[k] then error(("Llama: unknown config field '%s'"):format(tostring(k)), 3) end
    c[k] = v
  end
  for k, v in pairs(DEFAULTS) do if c[k] == nil then c[k] = v end end
  c.n_kv_heads = c.n_kv_heads or c.n_heads
  if type(c.vocab_size) ~= "number" or c.vocab_size < 1 then error("Llama: vocab_size must be given", 3) end
  if c.dim % c.n_heads ~= 0 then error(("Llama: dim (%d) must be a multiple of n_heads (%d)"):format(c.dim, c.n_heads), 3) end
  if c.n_heads % c.n_kv_heads ~= 0 then
    error(("Llama: n_heads (%d) must be a multiple of n_kv_heads (%d)"):format(c.n_heads, c.n_kv_heads), 3)
  end
  self.config = c
  local dt = c.dtype or "f32"
  self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim, { dtype = dt })
  local layers = {}
  for i = 1, c.n_layers do layers[i] = TransformerBlock(c) end
  self.layers = nn.ModuleList(layers)
  self.norm = nn.RMSNorm(c.dim, { eps = c.norm_eps, dtype = dt })
  self.output = nn.Linear(c.dim, c.vocab_size, { bias = false, dtype = dt })
  self.rope_cos, self.rope_sin = rope_tables(c.dim / c.n_heads, c.max_seq_len, c.rope_theta, dt)
  dl.no_grad(function()
    nn.init.normal_(self.tok_embeddings.weight, 0, 0.02)
    nn.init.normal_(self.output.weight, 0, 0.02)
    for l, block in ipairs(layers) do
      local deep = 0.02 / math.sqrt(2 * l)
      for _, lin in ipairs { block.attention.wq, block.attention.wk, block.attention.wv } do nn.init.normal_(lin.weight, 0, 0.02) end
      for _, lin in ipairs { block.attention.wo, block.feed_forward.w2, block.feed_forward.w3 } do
        nn.init.normal_(lin.weight, 0, deep)
      end
      nn.init.normal_(block.feed_forward.w1.weight, 0, 0.02)
    end
  end)
end

--- model(tokens) -> logits (B, T, vocab_size); tokens (B, T) i64, T <= max_seq_len.
function Transformer:forward(tokens)
  local T = tokens:size(2)
  if T > self.config.max_seq_len then
    error(("Llama: a sequence of %d tokens is longer than max_seq_len %d"):format(T, self.config.max_seq_len), 2)
  end
  local h = self.tok_embeddings(tokens)
  for _, layer in ipairs(self.layers:list()) do h = layer(h, self.rope_cos, self.rope_sin) end
  return self.output(self.norm(h))
end

--- Llama.tp_plan(config, tp_size) -> the tensor- and sequence-parallel plan of the example
-- (fsdp_tp_example.py), in ddplua's dimension numbers (the sequence is dimension 2): the
-- token embedding cut by vocabulary rows with its output cut along the sequence; RMSNorms
-- sequence-parallel; each attention's input made whole (PrepareModuleInput), wq / wk / wv
-- column-parallel, wo row-parallel back to sequence pieces; the feed-forward likewise (w1,
-- w3 column-, w2 row-parallel); the output projection column-parallel from sequence pieces
-- to replicated logits. Raises when n_heads or n_kv_heads is not a multiple of tp_size.
function Transformer.tp_plan(config, tp_size)
  local tp = require "ddplua.distributed.tensor.parallel"
  local dt = require "ddplua.distributed.tensor"
  local n_heads = config.n_heads or DEFAULTS.n_heads
  local n_kv = config.n_kv_heads or n_heads
  if n_heads % tp_size ~= 0 or n_kv % tp_size ~= 0 then
    error(("Llama.tp_plan: n_heads (%d) and n_kv_heads (%d) must be multiples of the tensor-parallel size (%d)")
      :format(n_heads, n_kv, tp_size), 2)
  end
  local seq = dt.Shard(2)
  return {
    tok_embeddings = tp.RowwiseParallel { input_layouts = dt.Replicate(), output_layouts = seq },
    norm = tp.SequenceParallel(),
    output = tp.ColwiseParallel { input_layouts = seq, output_layouts = dt.Replicate() },
    ["layers.*.attention_norm"] = tp.SequenceParallel(),
    ["layers.*.attention"] = tp.PrepareModuleInput { input_layouts = { seq }, desired_input_layouts = { dt.Replicate() } },
    ["layers.*.attention.wq"] = tp.ColwiseParallel(),
    ["layers.*.attention.wk"] = tp.ColwiseParallel(),
    ["layers.*.attention.wv"] = tp.ColwiseParallel(),
    ["layers.*.attention.wo"] = tp.RowwiseParallel { output_layouts = seq },
    ["layers.*.ffn_norm"] = tp.SequenceParallel(),
    ["layers.*.feed_forward"] = tp.PrepareModuleInput { input_layouts = { seq }, desired_input_layouts = { dt.Replicate() } },
    ["layers.*.feed_forward.w1"] = tp.ColwiseParallel(),
    ["layers.*.feed_forward.w2"] = tp.RowwiseParallel { output_layouts = seq },
    ["layers.*.feed_forward.w3"] = tp.ColwiseParallel(),
  }
end

return Transformer
