-- spec/ops/attention_spec.lua: dl.scaled_dot_product_attention (runtime/ops/attention.c,
-- runtime/backend/cpu/attention.c) against the explicit formula softmax(q kᵀ scale + mask) v
-- (ddplua's own ops, and PyTorch 1.13 where installed), finite differences, dropout's
-- replay in backward, errors, and memory growing linearly in the sequence length.
local dl = require "ddplua"
local F = require "ddplua.nn.functional"
local gradcheck = require("gradcheck").gradcheck
local torch_ref = require "torch_ref"
local with_threads = require("threads").with_threads

-- The causal mask as an additive (L, S) tensor: -inf above the diagonal.
local function causal_mask(L, S, dtype)
  local m = dl.zeros({ L, S }, { dtype = dtype })
  for i = 1, L do
    for j = i + 1, S do m:set(i, j, -math.huge) end
  end
  return m
end

-- A bool mask as the additive one: 0 where true, -inf where false.
local function additive(bool_mask, dtype)
  local z = dl.zeros(bool_mask:size(), { dtype = dtype })
  return dl.where(bool_mask, z, z - math.huge)
end

-- softmax(q kᵀ scale + mask) v with ddplua's separate ops (the whole score matrix).
local function explicit(q, k, v, opts)
  opts = opts or {}
  local E = q:size(q:dim())
  local s = q:matmul(k:transpose(-2, -1)):mul(opts.scale or 1 / math.sqrt(E))
  local mask = opts.attn_mask
  if mask and mask.dtype == "bool" then mask = additive(mask, q.dtype) end
  if opts.is_causal then mask = causal_mask(q:size(q:dim() - 1), k:size(k:dim() - 1), q.dtype) end
  if mask then s = s + mask end
  return s:softmax(-1):matmul(v)
end

local function randn(shape, seed, dtype)
  return dl.randn(shape, { dtype = dtype or "f64", generator = dl.Generator(seed) })
end

local function rel(a, b) return torch_ref.rel_diff(a, b) end

-- Forward and the gradients of q, k, v (and a floating mask) of both computations, with
-- the same upstream gradient.
local function both(shapes, opts)
  local function inputs()
    local t = {}
    for i, s in ipairs(shapes) do
      t[i] = randn(s, 10 + i)
      t[i].requires_grad = true
    end
    return t
  end
  local results = {}
  for _, fn in ipairs { F.scaled_dot_product_attention, explicit } do
    local t = inputs()
    local o = {}
    for key, val in pairs(opts or {}) do o[key] = val end
    if t[4] then o.attn_mask = t[4] end
    local out = fn(t[1], t[2], t[3], o)
    local R = randn(out:size(), 99)
    out:backward(R)
    results[#results + 1] = { out = out, grads = { t[1].grad, t[2].grad, t[3].grad, t[4] and t[4].grad } }
  end
  return results[1], results[2]
end

local CASES = {
  { name = "no mask, L ~= S, E ~= Ev", shapes = { { 2, 3, 5, 4 }, { 2, 3, 7, 4 }, { 2, 3, 7, 6 } } },
  { name = "causal, longer than a tile (L = S = 150)", opts = { is_causal = true },
    shapes = { { 1, 2, 150, 8 }, { 1, 2, 150, 8 }, { 1, 2, 150, 8 } } },
  { name = "causal with L > S", opts = { is_causal = true },
    shapes = { { 2, 9, 4 }, { 2, 5, 4 }, { 2, 5, 3 } } },
  { name = "float mask (L, S) broadcast over batch and heads",
    shapes = { { 2, 2, 6, 4 }, { 2, 2, 140, 4 }, { 2, 2, 140, 5 }, { 6, 140 } } },
  { name = "float mask (B, 1, L, S)", shapes = { { 2, 3, 5, 4 }, { 2, 3, 7, 4 }, { 2, 3, 7, 4 }, { 2, 1, 5, 7 } } },
  { name = "custom scale, 2-d inputs", opts = { scale = 0.3 }, shapes = { { 5, 4 }, { 6, 4 }, { 6, 2 } } },
}

describe("scaled_dot_product_attention", function()
  for _, case in ipairs(CASES) do
    it("matches softmax(q kT scale + mask) v in f64 (forward and gradients, 1e-10): " .. case.name, function()
      local a, b = both(case.shapes, case.opts)
      assert.is_true(rel(a.out, b.out) < 1e-10, "forward " .. rel(a.out, b.out))
      for i = 1, #case.shapes do
        assert.is_true(rel(a.grads[i], b.grads[i]) < 1e-10, "gradient " .. i .. ": " .. rel(a.grads[i], b.grads[i]))
      end
    end)
  end

  it("takes a bool mask (true = takes part) as -inf where false", function()
    local q, k, v = randn({ 2, 2, 5, 4 }, 1), randn({ 2, 2, 7, 4 }, 2), randn({ 2, 2, 7, 3 }, 3)
    local keep = randn({ 2, 1, 1, 7 }, 4):gt(-0.5)
    keep:set(1, 1, 1, 1, true)
    keep:set(2, 1, 1, 1, true) -- every row keeps a key
    local got = F.scaled_dot_product_attention(q, k, v, { attn_mask = keep })
    assert.is_true(rel(got, explicit(q, k, v, { attn_mask = keep })) < 1e-12)
  end)

  it("gives NaN for a row whose every key is masked, as the explicit softmax", function()
    local q, k, v = randn({ 1, 2, 3 }, 1), randn({ 1, 4, 3 }, 2), randn({ 1, 4, 3 }, 3)
    local keep = dl.ones({ 2, 4 }, { dtype = "bool" })
    for j = 1, 4 do keep:set(2, j, false) end
    local got = F.scaled_dot_product_attention(q, k, v, { attn_mask = keep })
    assert.is_true(got:get(1, 2, 1) ~= got:get(1, 2, 1))
    assert.is_true(got:get(1, 1, 1) == got:get(1, 1, 1))
  end)

  it("gives zeros for no keys (S = 0) and an empty result for no queries, as the explicit product", function()
    local out = F.scaled_dot_product_attention(randn({ 2, 3, 4 }, 1), randn({ 2, 0, 4 }, 2), randn({ 2, 0, 5 }, 3))
    assert.same({ 2, 3, 5 }, out:size())
    assert.equal(0, out:abs():sum():item())
    assert.same({ 2, 0, 5 }, F.scaled_dot_product_attention(randn({ 2, 0, 4 }, 1), randn({ 2, 3, 4 }, 2),
      randn({ 2, 3, 5 }, 3)):size())
  end)

  it("passes finite differences in f64 for q, k, v and a float mask", function()
    gradcheck(function(q, k, v, m) return F.scaled_dot_product_attention(q, k, v, { attn_mask = m }) end,
      { randn({ 2, 3, 4 }, 1), randn({ 2, 5, 4 }, 2), randn({ 2, 5, 3 }, 3), randn({ 3, 5 }, 4) })
  end)

  it("passes finite differences in f64 with is_causal and with a bool mask", function()
    gradcheck(function(q, k, v) return F.scaled_dot_product_attention(q, k, v, { is_causal = true }) end,
      { randn({ 2, 4, 3 }, 1), randn({ 2, 4, 3 }, 2), randn({ 2, 4, 2 }, 3) })
    local keep = randn({ 4, 5 }, 5):gt(0)
    for i = 1, 4 do keep:set(i, 1, true) end
    gradcheck(function(q, k, v) return F.scaled_dot_product_attention(q, k, v, { attn_mask = keep }) end,
      { randn({ 4, 3 }, 1), randn({ 5, 3 }, 2), randn({ 5, 2 }, 3) })
  end)

  it("drops attention weights: with v = I the output is softmax * keep / (1 - p), one mask per seed", function()
    local L, S, p = 6, 5, 0.4
    local q, k = randn({ 3, L, 4 }, 1), randn({ 3, S, 4 }, 2)
    local eye = dl.zeros({ 3, S, S }, { dtype = "f64" })
    for b = 1, 3 do
      for j = 1, S do eye:set(b, j, j, 1) end
    end
    local probs = explicit(q, k, eye)
    local out = F.scaled_dot_product_attention(q, k, eye, { dropout_p = p, generator = dl.Generator(7) })
    local again = F.scaled_dot_product_attention(q, k, eye, { dropout_p = p, generator = dl.Generator(7) })
    local other = F.scaled_dot_product_attention(q, k, eye, { dropout_p = p, generator = dl.Generator(8) })
    local dropped, differs = 0, false
    for b = 1, 3 do
      for i = 1, L do
        for j = 1, S do
          local o, want = out:get(b, i, j), probs:get(b, i, j) / (1 - p)
          if o == 0 then dropped = dropped + 1 else assert.near(want, o, 1e-12) end
          assert.equal(o, again:get(b, i, j))
          if other:get(b, i, j) ~= o then differs = true end
        end
      end
    end
    assert.is_true(dropped > 0 and dropped < 3 * L * S, "dropped " .. dropped)
    assert.is_true(differs)
  end)

  it("replays the forward's dropout in backward (finite differences with a fixed seed)", function()
    gradcheck(function(q, k, v)
      return F.scaled_dot_product_attention(q, k, v, { dropout_p = 0.3, generator = dl.Generator(11) })
    end, { randn({ 2, 4, 3 }, 1), randn({ 2, 6, 3 }, 2), randn({ 2, 6, 2 }, 3) })
  end)

  it("computes f32 as f64 does (1e-5) and rounds f16 / bf16 inputs once from f32", function()
    local q, k, v = randn({ 2, 2, 70, 16 }, 1), randn({ 2, 2, 90, 16 }, 2), randn({ 2, 2, 90, 8 }, 3)
    local ref = F.scaled_dot_product_attention(q, k, v, { is_causal = true })
    local f32 = F.scaled_dot_product_attention(q:float(), k:float(), v:float(), { is_causal = true })
    assert.equal("f32", f32.dtype)
    assert.is_true(rel(f32, ref) < 1e-5)
    for _, half in ipairs { "bf16", "f16" } do
      local h = F.scaled_dot_product_attention(q:to(half), k:to(half), v:to(half))
      assert.equal(half, h.dtype)
      local want = F.scaled_dot_product_attention(q:to(half):float(), k:to(half):float(), v:to(half):float())
      assert.equal(0, (h:float() - want:to(half):float()):abs():max():item())
    end
  end)

  it("raises naming the op and the argument, with PyTorch's words", function()
    local q, k, v = randn({ 2, 3, 4 }, 1), randn({ 2, 5, 4 }, 2), randn({ 2, 5, 3 }, 3)
    assert.error_matches(function()
      F.scaled_dot_product_attention(q, k, v, { is_causal = true, attn_mask = randn({ 3, 5 }, 4) })
    end, "scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True", 1, true)
    assert.error_matches(function() F.scaled_dot_product_attention(q, randn({ 2, 5, 3 }, 2), v) end,
      "scaled_dot_product_attention: query %(2, 3, 4%) and key %(2, 5, 3%) must have the same embedding size E")
    assert.error_matches(function() F.scaled_dot_product_attention(q, k:float(), v) end,
      "Expected query, key, and value to have the same dtype")
    assert.error_matches(function() F.scaled_dot_product_attention(q, k, v, { attn_mask = randn({ 4, 5 }, 4) }) end,
      "attn_mask %(4, 5%) does not broadcast to %(%.%.%., L, S%) = %(2, 3, 5%)")
    assert.error_matches(function() F.scaled_dot_product_attention(q, k, v, { dropout_p = 1 }) end,
      "dropout_p must be in %[0, 1%), got 1")
  end)

  it("reads q, k, v views in place (heads transposed out of a packed qkv, an expanded k) with the bits of copies", function()
    local B, T, H, D = 2, 37, 3, 8
    local function run(contiguous)
      local qkv = randn({ B, T, 3 * H * D }, 1, "f32")
      qkv.requires_grad = true
      local function head(i) -- (B, T, H * D) slice i -> (B, H, T, D), a strided view
        local x = qkv:narrow(3, (i - 1) * H * D + 1, H * D):view(B, T, H, D):transpose(2, 3)
        return contiguous and x:contiguous() or x
      end
      local q, k, v = head(1), head(2), head(3)
      local k1 = randn({ B, 1, T, D }, 2, "f32")
      k1.requires_grad = true
      local kx = contiguous and k1:expand(B, H, T, D):contiguous() or k1:expand(B, H, T, D)
      local out = F.scaled_dot_product_attention(q, k + kx, v, { is_causal = true })
      local out2 = F.scaled_dot_product_attention(q, kx, v, { dropout_p = 0.25, generator = dl.Generator(4) })
      local R = randn(out:size(), 3, "f32")
      ;(out * R + out2 * R):sum():backward()
      return { out, out2, qkv.grad, k1.grad }
    end
    local strided, copied = run(false), run(true)
    for i = 1, 4 do assert.equal(0, (strided[i] - copied[i]):abs():max():item(), "result " .. i) end
  end)

  it("notices an in-place change of an input read in place before backward", function()
    local q = randn({ 2, 4, 3 }, 1)
    q.requires_grad = true
    local x = q * 1
    local out = F.scaled_dot_product_attention(x, randn({ 2, 5, 3 }, 2), randn({ 2, 5, 3 }, 3))
    x:add_(1)
    assert.error_matches(function() out:sum():backward() end, "saved for the gradient was modified by an in%-place operation")
  end)

  it("gives the same bits on 1 and 3 threads (forward split by head and row block, backward by head)", function()
    local function run()
      local q, k, v = randn({ 2, 3, 70, 16 }, 1, "f32"), randn({ 2, 3, 90, 16 }, 2, "f32"), randn({ 2, 3, 90, 8 }, 3, "f32")
      local m = randn({ 70, 90 }, 4, "f32")
      for _, t in ipairs { q, k, v, m } do t.requires_grad = true end
      local out = F.scaled_dot_product_attention(q, k, v, { attn_mask = m, dropout_p = 0.2, generator = dl.Generator(3) })
      out:backward(randn(out:size(), 5, "f32"))
      return { out, q.grad, k.grad, v.grad, m.grad }
    end
    local one = with_threads(1, run)
    local three = with_threads(3, run)
    for i = 1, 5 do assert.equal(0, (one[i] - three[i]):abs():max():item(), "result " .. i) end
  end)

  it("allocates memory linear in the sequence length (forward and backward, T = 256 and 2048)", function()
    local function peak(T)
      local q, k, v = randn({ 1, 1, T, 16 }, 1, "f32"), randn({ 1, 1, T, 16 }, 2, "f32"), randn({ 1, 1, T, 16 }, 3, "f32")
      q.requires_grad, k.requires_grad, v.requires_grad = true, true, true
      local base = dl.memory_stats().live
      dl.reset_peak_memory()
      local out = F.scaled_dot_product_attention(q, k, v, { is_causal = true })
      out:sum():backward()
      return dl.memory_stats().peak - base
    end
    local small, large = peak(256), peak(2048)
    -- inputs, output, gradients and the (T) logsumexp: ~ 20 T * 16 * 4 bytes; one (T, T)
    -- f32 score matrix alone would be T^2 * 4 = 16 MiB at T = 2048
    assert.is_true(large < 2048 * 2048 * 4 / 16, "peak " .. large .. " bytes at T = 2048")
    assert.is_true(large / small < 12, "peak grows " .. large / small .. "x from T = 256 to 2048")
  end)

  describe("against PyTorch 1.13's explicit formula (f64, 1e-10 norm-wise)", function()
    it("forward and gradients of q, k, v and a float mask; causal; bool mask", function()
      local ok, why = torch_ref.available()
      if not ok then return pending(why) end
      local q, k, v = randn({ 2, 3, 70, 8 }, 1), randn({ 2, 3, 150, 8 }, 2), randn({ 2, 3, 150, 5 }, 3)
      local m = randn({ 3, 70, 150 }, 4)
      local qc, kc, vc = randn({ 2, 2, 130, 8 }, 5), randn({ 2, 2, 130, 8 }, 6), randn({ 2, 2, 130, 8 }, 7)
      local keep = randn({ 2, 1, 1, 150 }, 8):gt(-1)
      keep:set(1, 1, 1, 1, true)
      keep:set(2, 1, 1, 1, true)
      local R, Rc = randn({ 2, 3, 70, 5 }, 9), randn({ 2, 2, 130, 8 }, 10)
      local ref = torch_ref.run([[
def sdpa(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v
q, k, v, m = (T[n].requires_grad_() for n in ("q", "k", "v", "m"))
out = sdpa(q, k, v, m)
out.backward(T["R"])
OUT.update(out=out, dq=q.grad, dk=k.grad, dv=v.grad, dm=m.grad)
qc, kc, vc = (T[n].requires_grad_() for n in ("qc", "kc", "vc"))
L = qc.shape[-2]
causal = torch.zeros(L, L).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
outc = sdpa(qc, kc, vc, causal)
outc.backward(T["Rc"])
OUT.update(outc=outc, dqc=qc.grad, dkc=kc.grad, dvc=vc.grad)
keep = T["keep"]
outb = sdpa(T["q"].detach(), T["k"].detach(), T["v"].detach(),
            torch.zeros(keep.shape).masked_fill(~keep, float("-inf")))
OUT.update(outb=outb)
]], { q = q, k = k, v = v, m = m, R = R, qc = qc, kc = kc, vc = vc, Rc = Rc, keep = keep })
      for _, t in ipairs { q, k, v, m, qc, kc, vc } do t.requires_grad = true end
      local out = F.scaled_dot_product_attention(q, k, v, { attn_mask = m })
      out:backward(R)
      local outc = F.scaled_dot_product_attention(qc, kc, vc, { is_causal = true })
      outc:backward(Rc)
      local outb = F.scaled_dot_product_attention(q:detach(), k:detach(), v:detach(), { attn_mask = keep })
      local pairs_ = { { out, ref.out }, { q.grad, ref.dq }, { k.grad, ref.dk }, { v.grad, ref.dv },
        { m.grad, ref.dm }, { outc, ref.outc }, { qc.grad, ref.dqc }, { kc.grad, ref.dkc },
        { vc.grad, ref.dvc }, { outb, ref.outb } }
      for i, p in ipairs(pairs_) do
        assert.same(p[2]:size(), p[1]:size())
        assert.is_true(rel(p[1], p[2]) < 1e-10, "pair " .. i .. ": " .. rel(p[1], p[2]))
      end
    end)
  end)
end)
