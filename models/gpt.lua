--- models/gpt.lua: the GPT-2 architecture with nanoGPT's configuration and parameter names,
-- so a state dict crosses to nanoGPT's model.py (PyTorch) and back.
--
--   local GPT = require "models.gpt"
--   local model = GPT { block_size = 64, vocab_size = 65, n_layer = 4, n_head = 4, n_embd = 128,
--     dropout = 0.0, bias = true }
--   local logits, loss = model(idx, targets)   -- idx, targets: (B, T) i64, T <= block_size
--   local out = model:generate(idx, 100, { temperature = 0.8, top_k = 200 })
--   local opt = model:configure_optimizers(0.1, 1e-3, { 0.9, 0.99 })
--
-- Configuration (nanoGPT's GPTConfig; these defaults are its): block_size (1024), vocab_size
-- (50304), n_layer (12), n_head (12), n_embd (768; a multiple of n_head), dropout (0.0),
-- bias (true: biases in the Linear layers and LayerNorms, as GPT-2; false leaves them out).
-- Also dtype ("f32") and generator (the initialisation's random stream; default the global).
--
-- Parameters, in nanoGPT's state_dict order: transformer.wte.weight (vocab_size, n_embd),
-- transformer.wpe.weight (block_size, n_embd), then per block N: transformer.h.N.ln_1,
-- .attn.c_attn (n_embd -> 3 n_embd), .attn.c_proj, .ln_2, .mlp.c_fc (n_embd -> 4 n_embd),
-- .mlp.c_proj; transformer.ln_f; lm_head.weight. Note [gpt weight tying]: lm_head.weight IS
-- transformer.wte.weight (one tensor, as nanoGPT's `self.transformer.wte.weight =
-- self.lm_head.weight`): parameters() lists it once (under transformer.wte.weight), while
-- state_dict() holds it under both names, as PyTorch's does, so nanoGPT's
-- load_state_dict(strict) finds every key; loading one writes the shared tensor, and the
-- two entries of a checkpoint are equal.
--
-- Initialisation as nanoGPT's _init_weights: every Linear and Embedding weight from N(0,
-- 0.02), Linear biases 0, LayerNorm weight 1 and bias 0; then each c_proj.weight (the
-- projections into the residual stream) from N(0, 0.02 / sqrt(2 n_layer)).
local dl = require "ddplua"
local nn = require "ddplua.nn"
local F = require "ddplua.nn.functional"
local optim = require "ddplua.optim"

local DEFAULTS = { block_size = 1024, vocab_size = 50304, n_layer = 12, n_head = 12, n_embd = 768, dropout = 0.0,
  bias = true }
local KNOWN = { block_size = true, vocab_size = true, n_layer = true, n_head = true, n_embd = true, dropout = true,
  bias = true, dtype = true, generator = true }

-- ---- blocks ---------------------------------------------------------------------------

local CausalSelfAttention = nn.Module:extend("CausalSelfAttention")

function CausalSelfAttention:init(c, lin)
  self.c_attn = lin(c.n_embd, 3 * c.n_embd)
  self.c_proj = lin(c.n_embd, c.n_embd)
  self.resid_dropout = nn.Dropout(c.dropout)
  self.n_head, self.n_embd, self.dropout = c.n_head, c.n_embd, c.dropout
end

--- attn(x) -> (B, T, C): causal self-attention of x (B, T, C) through the fused
-- scaled_dot_product_attention (dropout on the weights while training). Under tensor
-- parallelism (GPT.tp_plan) c_attn gives this rank's heads only: q, k and v of C / tp
-- features each, so the width and the head count are read from c_attn's output.
function CausalSelfAttention:forward(x)
  local s = x:size()
  local B, T, C = s[1], s[2], s[3]
  local hs = C / self.n_head
  local qkv_all = self.c_attn(x)
  local Cl = qkv_all:size(3) / 3 -- C, or this rank's C / tp
  local nh = Cl / hs
  local qkv = qkv_all:split(Cl, 3)
  local function heads(t) return t:view(B, T, nh, hs):transpose(2, 3) end -- (B, nh, T, hs)
  local y = F.scaled_dot_product_attention(heads(qkv[1]), heads(qkv[2]), heads(qkv[3]),
    { is_causal = true, dropout_p = self.training and self.dropout or 0 })
  y = y:transpose(2, 3):contiguous():view(B, T, Cl)
  return self.resid_dropout(self.c_proj(y))
end

local MLP = nn.Module:extend("MLP")

function MLP:init(c, lin)
  self.c_fc = lin(c.n_embd, 4 * c.n_embd)
  self.gelu = nn.GELU() -- exact (erf), as nanoGPT's nn.GELU()
  self.c_proj = lin(4 * c.n_embd, c.n_embd)
  self.dropout = nn.Dropout(c.dropout)
end

--- mlp(x) -> c_proj(gelu(c_fc(x))) with dropout, x's shape (B, T, n_embd).
function MLP:forward(x) return self.dropout(self.c_proj(self.gelu(self.c_fc(x)))) end

local Block = nn.Module:extend("Block")

function Block:init(c, lin, ln)
  self.ln_1 = ln()
  self.attn = CausalSelfAttention(c, lin)
  self.ln_2 = ln()
  self.mlp = MLP(c, lin)
end

--- block(x) -> x + attn(ln_1(x)), then + mlp(ln_2(.)): a pre-norm residual block, (B, T, n_embd).
function Block:forward(x)
  x = x + self.attn(self.ln_1(x))
  return x + self.mlp(self.ln_2(x))
end

-- ---- the model --------------------------------------------------------------------------

local GPT = nn.Module:extend("GPT")

--- GPT(config) -> the model (see the top for the fields). Raises naming an unknown field,
-- or an n_embd that n_head does not divide.
function GPT:init(config)
  local c = {}
  for k, v in pairs(config or {}) do
    if not KNOWN[k] then error(("GPT: unknown config field '%s'"):format(tostring(k)), 2) end
    c[k] = v
  end
  for k, v in pairs(DEFAULTS) do if c[k] == nil then c[k] = v end end
  if c.n_embd % c.n_head ~= 0 then
    error(("GPT: n_embd (%d) must be a multiple of n_head (%d)"):format(c.n_embd, c.n_head), 2)
  end
  self.config = c
  local dt, gen = c.dtype or "f32", c.generator
  local function lin(i, o, bias)
    if bias == nil then bias = c.bias end
    return nn.Linear(i, o, { bias = bias, dtype = dt, generator = gen })
  end
  local function ln() return nn.LayerNorm(c.n_embd, { bias = c.bias, dtype = dt }) end
  local h = {}
  for i = 1, c.n_layer do h[i] = Block(c, lin, ln) end
  self.transformer = nn.ModuleDict {
    { "wte", nn.Embedding(c.vocab_size, c.n_embd, { dtype = dt, generator = gen }) },
    { "wpe", nn.Embedding(c.block_size, c.n_embd, { dtype = dt, generator = gen }) },
    { "drop", nn.Dropout(c.dropout) },
    { "h", nn.ModuleList(h) },
    { "ln_f", ln() },
  }
  self.lm_head = lin(c.n_embd, c.vocab_size, false)
  self.lm_head.weight = self.transformer.wte.weight -- Note [gpt weight tying]
  self:_init_weights()
end

-- nanoGPT's initialisation (see the top).
function GPT:_init_weights()
  local gen = self.config.generator
  local o = gen and { generator = gen } or nil
  dl.no_grad(function()
    for _, m in self:named_modules() do
      local kind = m:_get_name()
      if kind == "Linear" then
        nn.init.normal_(m.weight, 0, 0.02, o)
        if m.bias then nn.init.zeros_(m.bias) end
      elseif kind == "Embedding" then
        nn.init.normal_(m.weight, 0, 0.02, o)
      end
    end
    local std = 0.02 / math.sqrt(2 * self.config.n_layer)
    for name, p in self:named_parameters() do
      if name:match("c_proj%.weight$") then nn.init.normal_(p, 0, std, o) end
    end
  end)
end

--- model:get_num_params([non_embedding]) -> the number of parameters (the tied lm_head
-- counted once); with non_embedding (default true, as nanoGPT) without wpe.
function GPT:get_num_params(non_embedding)
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  if non_embedding ~= false then n = n - self.transformer.wpe.weight:numel() end
  return n
end

--- model(idx[, targets]) -> logits, loss. idx: (B, T) i64 token ids, T <= block_size.
-- With targets ((B, T) i64; -1 = ignored): logits (B, T, vocab_size) and the mean
-- cross-entropy (a 0-d tensor). Without: the logits of the last position only, (B, 1,
-- vocab_size), and nil (nanoGPT's inference shortcut). Raises when T > block_size.
function GPT:forward(idx, targets)
  local s = idx:size()
  local T = s[2]
  if T > self.config.block_size then
    error(("GPT: cannot forward a sequence of length %d, block size is only %d"):format(T, self.config.block_size), 2)
  end
  local pos = dl.arange(0, T, { device = idx.device })
  local x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
  for _, block in ipairs(self.transformer.h:list()) do x = block(x) end
  x = self.transformer.ln_f(x)
  if targets then
    local logits = self.lm_head(x)
    local V = self.config.vocab_size
    return logits, F.cross_entropy(logits:view(-1, V), targets:reshape(-1), { ignore_index = -1 })
  end
  return self.lm_head(x:narrow(2, -1, 1)), nil
end

-- Index of the draw u in [0, 1) from the probabilities p (a Lua list summing to ~1).
local function draw(p, u)
  local acc = 0
  for i = 1, #p do
    acc = acc + p[i]
    if u < acc then return i end
  end
  for i = #p, 1, -1 do if p[i] > 0 then return i end end
  return #p
end

--- model:generate(idx, max_new_tokens[, opts]) -> (B, T + max_new_tokens) i64: idx
-- followed by sampled tokens, each from the softmax of the last logits divided by
-- opts.temperature (1.0), restricted to the opts.top_k most likely (nil: all), the context
-- cropped to the last block_size tokens (nanoGPT's generate). opts.generator: the random
-- stream of the draws (default the global one). Runs under no_grad; put the model in eval
-- mode first (dropout). Raises when temperature <= 0 or top_k < 1.
function GPT:generate(idx, max_new_tokens, opts)
  opts = opts or {}
  local temperature, top_k = opts.temperature or 1.0, opts.top_k
  if temperature <= 0 then error("GPT:generate: temperature must be > 0, got " .. temperature, 2) end
  if top_k ~= nil and top_k < 1 then error("GPT:generate: top_k must be >= 1, got " .. top_k, 2) end
  local ro = opts.generator and { generator = opts.generator } or nil
  return dl.no_grad(function()
    for _ = 1, max_new_tokens do
      local T = idx:size()[2]
      local cond = T <= self.config.block_size and idx or idx:narrow(2, T - self.config.block_size + 1, self.config.block_size)
      local logits = self(cond)
      local rows = logits:select(2, 1):to("cpu"):to("f64"):tolist() -- (B, V)
      local u = dl.rand({ #rows }, ro):to("f64"):tolist()
      local next_ids = {}
      for b, row in ipairs(rows) do
        local V = #row
        local l = {}
        for i = 1, V do l[i] = row[i] / temperature end
        if top_k and top_k < V then
          local sorted = {}
          for i = 1, V do sorted[i] = l[i] end
          table.sort(sorted, function(a2, b2) return a2 > b2 end)
          local cut = sorted[top_k]
          for i = 1, V do if l[i] < cut then l[i] = -math.huge end end
        end
        local m = -math.huge
        for i = 1, V do if l[i] > m then m = l[i] end end
        local p, z = {}, 0
        for i = 1, V do p[i] = math.exp(l[i] - m); z = z + p[i] end
        for i = 1, V do p[i] = p[i] / z end
        next_ids[b] = { draw(p, u[b]) - 1 }
      end
      idx = dl.cat({ idx, dl.tensor(next_ids, { dtype = "i64" }):to(idx.device) }, 2)
    end
    return idx
  end)
end

--- model:configure_optimizers(weight_decay, learning_rate, betas) -> an optim.AdamW with
-- nanoGPT's two parameter groups: weight decay on every parameter of 2 or more dimensions
-- (the Linear and Embedding weights), none on the others (biases, LayerNorm weights).
function GPT:configure_optimizers(weight_decay, learning_rate, betas)
  local decay, no_decay = {}, {}
  for _, p in self:named_parameters() do
    if p:dim() >= 2 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
  end
  return optim.AdamW({ { params = decay, weight_decay = weight_decay }, { params = no_decay, weight_decay = 0.0 } },
    { lr = learning_rate, betas = betas })
end

--- GPT.tp_plan(config, tp_size) -> the Megatron-style tensor-parallel plan of this model
-- for ddplua.distributed.tensor.parallel.parallelize_module over a tp mesh of tp_size ranks:
-- the token embedding and lm_head (tied) cut by vocabulary rows (RowwiseParallel on wte:
-- vocabulary-parallel lookup; ColwiseParallel on lm_head with class-sharded DTensor logits,
-- so the loss is the vocabulary-parallel cross entropy), each attention's fused q/k/v
-- projection cut by heads (ColwiseParallel{fused = 3}) and its output projection by rows of
-- its input (RowwiseParallel), each MLP column- then row-parallel. The position embedding,
-- LayerNorms and biases of row-parallel layers stay replicated. Under it forward returns
-- DTensor logits and loss (loss:backward(), loss:item() as usual). Raises when n_head is
-- not a multiple of tp_size.
function GPT.tp_plan(config, tp_size)
  local tp = require "ddplua.distributed.tensor.parallel"
  local dt = require "ddplua.distributed.tensor"
  local n_head = (config and config.n_head) or DEFAULTS.n_head
  if n_head % tp_size ~= 0 then
    error(("GPT.tp_plan: n_head (%d) must be a multiple of the tensor-parallel size (%d)"):format(n_head, tp_size), 2)
  end
  return {
    ["transformer.wte"] = tp.RowwiseParallel { input_layouts = dt.Replicate() },
    ["transformer.h.*.attn.c_attn"] = tp.ColwiseParallel { fused = 3 },
    ["transformer.h.*.attn.c_proj"] = tp.RowwiseParallel(),
    ["transformer.h.*.mlp.c_fc"] = tp.ColwiseParallel(),
    ["transformer.h.*.mlp.c_proj"] = tp.RowwiseParallel(),
    ["lm_head"] = tp.ColwiseParallel { output_layouts = dt.Shard(-1), use_local_output = false },
  }
end

return GPT
