-- spec/models/gpt_spec.lua: models/gpt.lua, nanoGPT's GPT: names, weight tying,
-- initialisation, loss, gradients (finite differences), generate, configure_optimizers, and
-- a ddplua checkpoint loaded into a nanoGPT-shaped PyTorch model giving the same logits,
-- loss and gradients.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local train_state = require "ddplua.train_state"
local files = require "files"
local torch_ref = require "torch_ref"
local GPT = require "models.gpt"

local TINY = { block_size = 8, vocab_size = 13, n_layer = 2, n_head = 2, n_embd = 8 }

local function config(extra)
  local c = {}
  for k, v in pairs(TINY) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

local function tokens(B, T, V, seed)
  local g = dl.Generator(seed)
  return (dl.rand({ B, T }, { generator = g }) * V):to("i64")
end

describe("models.gpt", function()
  it("has nanoGPT's parameter names, with lm_head tied to wte", function()
    dl.manual_seed(0)
    local m = GPT(config())
    local keys = nn.state_dict_keys(m:state_dict())
    local want = { "transformer.wte.weight", "transformer.wpe.weight" }
    for i = 0, 1 do
      for _, n in ipairs { "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
        "mlp.c_proj.bias" } do
        want[#want + 1] = ("transformer.h.%d.%s"):format(i, n)
      end
    end
    for _, n in ipairs { "transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight" } do want[#want + 1] = n end
    assert.same(want, keys)
    assert.equal(m.transformer.wte.weight, m.lm_head.weight) -- one tensor
    assert.equal(#want - 1, #m:parameters())                   -- listed once
    assert.same({ 24, 8 }, m.transformer.h[1].attn.c_attn.weight:size())
    assert.same({ 32, 8 }, m.transformer.h[1].mlp.c_fc.weight:size())
    local nobias = GPT(config { bias = false })
    for _, k in ipairs(nn.state_dict_keys(nobias:state_dict())) do assert.is_nil(k:match("bias$"), k) end
  end)

  it("initialises as nanoGPT: N(0, 0.02), c_proj N(0, 0.02 / sqrt(2 n_layer)), biases 0", function()
    dl.manual_seed(1)
    local m = GPT { block_size = 64, vocab_size = 65, n_layer = 8, n_head = 4, n_embd = 128 }
    local function std(t) return t:double():pow(2):mean():sqrt():item() end
    local b = m.transformer.h[1]
    assert.near(0.02, std(m.transformer.wte.weight), 0.001)
    assert.near(0.02, std(b.attn.c_attn.weight), 0.001)
    assert.near(0.02, std(b.mlp.c_fc.weight), 0.001)
    assert.near(0.02 / 4, std(b.attn.c_proj.weight), 0.0003)
    assert.near(0.02 / 4, std(b.mlp.c_proj.weight), 0.0003)
    assert.equal(0, b.attn.c_attn.bias:abs():sum():item())
    assert.equal(1, b.ln_1.weight:mean():item())
    assert.is_true(m:get_num_params() < m:get_num_params(false))
  end)

  it("returns the mean cross-entropy with targets, the last position's logits without", function()
    dl.manual_seed(2)
    local m = GPT(config())
    local idx = tokens(3, 8, 13, 5)
    local logits, loss = m(idx, idx)
    assert.same({ 3, 8, 13 }, logits:size())
    local want = dl.cross_entropy(logits:view(-1, 13), idx:reshape(-1)):item()
    assert.near(want, loss:item(), 1e-6)
    assert.near(math.log(13), loss:item(), 0.3) -- small init: near uniform
    local last, none = m(idx)
    assert.is_nil(none)
    assert.same({ 3, 1, 13 }, last:size())
    assert.is_true(torch_ref.rel_diff(last:select(2, 1), logits:select(2, 8)) < 1e-6)
    assert.has_error(function() m(tokens(1, 9, 13, 1)) end,
      "GPT: cannot forward a sequence of length 9, block size is only 8")
  end)

  it("is causal: changing a later token leaves the earlier logits unchanged", function()
    dl.manual_seed(3)
    local m = GPT(config { dtype = "f64" })
    local a = tokens(1, 8, 13, 7)
    local b = a:clone()
    b:set(1, 6, (a:get(1, 6) + 1) % 13)
    local la, lb = m(a, a), m(b, b)
    assert.equal(0, (la:narrow(2, 1, 5) - lb:narrow(2, 1, 5)):abs():max():item())
    assert.is_true((la:narrow(2, 6, 3) - lb:narrow(2, 6, 3)):abs():max():item() > 0)
  end)

  it("has gradients that match central finite differences (f64)", function()
    dl.manual_seed(4)
    local m = GPT { block_size = 4, vocab_size = 5, n_layer = 1, n_head = 2, n_embd = 4, dtype = "f64" }
    local idx = tokens(2, 4, 5, 9)
    local _, loss = m(idx, idx)
    m:zero_grad()
    loss:backward()
    local eps = 1e-6
    for _, name in ipairs { "transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
      "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.bias" } do
      local p = m:get_parameter(name)
      local g = p.grad:contiguous():view(-1)
      local flat = p:detach():view(-1)
      local n = flat:numel()
      for _, i in ipairs { 1, math.floor(n / 2) + 1, n } do
        local v = flat:get(i)
        local function l(x)
          dl.no_grad(function() flat:set(i, x) end)
          local _, lo = m(idx, idx)
          return lo:item()
        end
        local fd = (l(v + eps) - l(v - eps)) / (2 * eps)
        l(v)
        assert.near(fd, g:get(i), 1e-7, name .. "[" .. i .. "]")
      end
    end
  end)

  it("generates: greedy with top_k = 1, tokens in range, context cropped to block_size", function()
    dl.manual_seed(5)
    local m = GPT(config())
    m:eval()
    local idx = tokens(2, 3, 13, 11)
    local out = m:generate(idx, 10, { top_k = 1 })
    assert.same({ 2, 13 }, out:size())
    assert.equal(0, (out:narrow(2, 1, 3) - idx):abs():sum():item())
    -- greedy: each new token is the argmax of the logits of its (cropped) context
    for t = 4, 13 do
      local s = math.max(1, t - 8)
      local last = m(out:narrow(2, s, t - s))
      assert.equal(0, (last:select(2, 1):argmax(2) - out:select(2, t)):abs():sum():item(), "token " .. t)
    end
    local g1, g2 = dl.Generator(3), dl.Generator(3)
    local s1 = m:generate(idx, 6, { temperature = 0.8, top_k = 5, generator = g1 })
    local s2 = m:generate(idx, 6, { temperature = 0.8, top_k = 5, generator = g2 })
    assert.equal(0, (s1 - s2):abs():sum():item()) -- same stream, same text
    assert.is_true(s1:min():item() >= 0 and s1:max():item() < 13)
    assert.has_error(function() m:generate(idx, 1, { temperature = 0 }) end, "GPT:generate: temperature must be > 0, got 0")
  end)

  it("configure_optimizers decays the 2-d parameters only", function()
    local m = GPT(config())
    local opt = m:configure_optimizers(0.1, 1e-3, { 0.9, 0.99 })
    local g1, g2 = opt.param_groups[1], opt.param_groups[2]
    assert.equal(0.1, g1.weight_decay)
    assert.equal(0, g2.weight_decay)
    for _, p in ipairs(g1.params) do assert.equal(2, p:dim()) end
    for _, p in ipairs(g2.params) do assert.equal(1, p:dim()) end
    assert.equal(#m:parameters(), #g1.params + #g2.params)
    assert.same({ 0.9, 0.99 }, g1.betas)
    assert.equal(1e-3, g1.lr)
  end)

  it("saves a checkpoint that nanoGPT's model loads (strict) to the same logits, loss and gradients", function()
    local ok, why = torch_ref.available()
    if not ok then return pending(why) end
    dl.manual_seed(6)
    local m = GPT { block_size = 8, vocab_size = 13, n_layer = 2, n_head = 2, n_embd = 8, dtype = "f64" }
    local dir = files.tmpdir("gpt")
    train_state.save_model(dir .. "/model.safetensors", m)
    local idx = tokens(3, 8, 13, 21)
    local logits, loss = m(idx, idx)
    m:zero_grad()
    loss:backward()
    local out = torch_ref.run(("PATH = %q\n"):format(dir .. "/model.safetensors") .. [[
import math
import torch.nn as nn
from torch.nn import functional as F
class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)
class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        self.n_head = c["n_head"]
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)
class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])
    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], True)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], True)
        self.mlp = MLP(c)
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], True)))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight
    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(0, T))
        for b in self.transformer.h:
            x = b(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
model = GPT(dict(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=8))
sd = load(PATH)
assert set(sd) == set(model.state_dict()), (sorted(sd), sorted(model.state_dict()))
model.load_state_dict(sd, strict=True)
idx = T["idx"]
logits, loss = model(idx, idx)
loss.backward()
OUT["logits"] = logits.detach()
OUT["loss"] = loss.detach().reshape(1)
OUT["g_wte"] = model.transformer.wte.weight.grad
OUT["g_attn"] = model.transformer.h[1].attn.c_attn.weight.grad
]], { idx = idx })
    files.remove(dir)
    assert.is_true(torch_ref.rel_diff(logits, out.logits) < 1e-12)
    assert.near(out.loss:get(1), loss:item(), 1e-12)
    assert.is_true(torch_ref.rel_diff(m.transformer.wte.weight.grad, out.g_wte) < 1e-10)
    assert.is_true(torch_ref.rel_diff(m.transformer.h[2].attn.c_attn.weight.grad, out.g_attn) < 1e-10)
  end)
end)
