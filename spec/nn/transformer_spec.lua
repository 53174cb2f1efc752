-- spec/nn/transformer_spec.lua: nn.MultiheadAttention, nn.TransformerEncoderLayer and
-- nn.TransformerDecoderLayer against PyTorch 1.13 (Debian's python3-torch, where
-- installed): the same weights loaded by name into PyTorch's modules, forward and the
-- gradients of every parameter and input compared in f64 (1e-10 norm-wise, dropout 0);
-- and, without PyTorch, the parameter names, shapes, initialisation and the fused and
-- explicit attention paths against each other.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local torch_ref = require "torch_ref"

local function randn(shape, seed)
  return dl.randn(shape, { dtype = "f64", generator = dl.Generator(seed) })
end

local function names_of(m)
  local names = {}
  for name in m:named_parameters() do names[#names + 1] = name end
  return names
end

-- Side-by-side cases with PyTorch, run in one Python process (importing torch takes a
-- second or two): case(build, ctor, extra_py) registers a case while the describes load
-- and returns its check, to call inside an `it`. build() -> m, inputs, args, masks,
-- extra_lua: the module, its inputs, args the input indices of the call (the same index
-- twice passes the same tensor), masks the named mask tensors (Lua opts / Python keyword
-- arguments), extra_lua / extra_py the other keyword arguments. The first check runs
-- every case here and in PyTorch (`ctor` builds PyTorch's module, whose parameters are
-- loaded by name from ours); each check compares its output, attention weights and the
-- gradients of every parameter and input.
local CASES, results = {}, {}

-- Runs the registered cases not run yet (busted loads a describe's body when it reaches
-- it, so each top-level describe makes one batch) and adds their PyTorch results.
local function run_pending()
  local send, script = {}, { "cases = []" }
  for c, case in ipairs(CASES) do
    if case.lua then goto continue end
    local m, inputs, args, masks, extra_lua = case.build()
    local pre = "c" .. c .. "."
    for name, p in m:named_parameters() do send[pre .. "param." .. name] = p end
    for i, x in ipairs(inputs) do send[pre .. "in" .. i] = x end
    for name, t in pairs(masks) do send[pre .. "mask." .. name] = t end
    for _, x in ipairs(inputs) do x.requires_grad = true end
    local call, opts = {}, {}
    for i, a in ipairs(args) do call[i] = inputs[a] end
    for name, t in pairs(masks) do opts[name] = t end
    for k, v in pairs(extra_lua or {}) do opts[k] = v end
    call[#call + 1] = opts
    local out, weights = m(unpack(call))
    local R = randn(out:size(), 77)
    send[pre .. "R"] = R
    out:backward(R)
    case.lua = { m = m, inputs = inputs, out = out, weights = weights }
    local idx = {}
    for i, a in ipairs(args) do idx[i] = tostring(a) end
    script[#script + 1] = ("cases.append((%q, lambda: %s, (%s,), dict(%s)))"):format(pre, case.ctor,
      table.concat(idx, ", "), case.extra_py or "")
    ::continue::
  end
  script[#script + 1] = [[
for pre, ctor, args, extra in cases:
    C = {k[len(pre):]: v for k, v in T.items() if k.startswith(pre)}
    m = ctor().double().train()
    m.load_state_dict({k[6:]: v for k, v in C.items() if k.startswith("param.")}, strict=True)
    ins = {int(k[2:]): v.requires_grad_() for k, v in C.items() if k.startswith("in")}
    kw = {k[5:]: v for k, v in C.items() if k.startswith("mask.")}
    res = m(*[ins[i] for i in args], **kw, **extra)
    out = res[0] if isinstance(res, tuple) else res
    out.backward(C["R"])
    OUT[pre + "out"] = out
    if isinstance(res, tuple) and res[1] is not None:
        OUT[pre + "weights"] = res[1]
    for name, p in m.named_parameters():
        OUT[pre + "grad." + name] = p.grad
    for i, x in ins.items():
        OUT[pre + "gin%d" % i] = x.grad
]]
  for k, v in pairs(torch_ref.run(table.concat(script, "\n"), send)) do results[k] = v end
end

local function case(build, ctor, extra_py)
  local c = { build = build, ctor = ctor, extra_py = extra_py }
  CASES[#CASES + 1] = c
  local pre = "c" .. #CASES .. "."
  return function()
    local ok, why = torch_ref.available()
    if not ok then return pending(why) end
    if not c.lua then run_pending() end
    local function close(a, b, what)
      assert(b, what .. ": missing on the PyTorch side")
      assert.same(b:size(), a:size(), what)
      local r = torch_ref.rel_diff(a, b)
      assert.is_true(r < 1e-10, what .. ": relative difference " .. r)
    end
    local L = c.lua
    close(L.out, results[pre .. "out"], "output")
    if L.weights then close(L.weights, results[pre .. "weights"], "attn_weights")
    else assert.is_nil(results[pre .. "weights"]) end
    local n = 0
    for name, p in L.m:named_parameters() do
      close(p.grad, results[pre .. "grad." .. name], "gradient of " .. name)
      n = n + 1
    end
    for i, x in ipairs(L.inputs) do close(x.grad, results[pre .. "gin" .. i], "gradient of input " .. i) end
    assert.is_true(n > 0)
  end
end

describe("nn.MultiheadAttention", function()
  it("has PyTorch's parameter names and shapes, zero biases and xavier-bounded projections", function()
    local m = nn.MultiheadAttention(8, 2)
    assert.same({ "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias" }, names_of(m))
    assert.same({ 24, 8 }, m.in_proj_weight:size())
    assert.equal(0, m.in_proj_bias:abs():max():item())
    assert.is_true(m.in_proj_weight:abs():max():item() <= math.sqrt(6 / (8 + 24)))
    local sep = nn.MultiheadAttention(8, 2, { kdim = 5, vdim = 3, bias = false })
    assert.same({ "q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight" }, names_of(sep))
    assert.same({ 8, 5 }, sep.k_proj_weight:size())
    assert.same({ 8, 3 }, sep.v_proj_weight:size())
  end)

  it("gives the same output and gradients on the fused path (need_weights = false) as on the explicit one", function()
    local m = nn.MultiheadAttention(12, 3, { dtype = "f64", generator = dl.Generator(1) })
    local x = randn({ 7, 2, 12 }, 2)
    local kpm = dl.zeros({ 2, 7 }, { dtype = "bool" })
    kpm:set(2, 7, true)
    local mask = randn({ 7, 7 }, 3)
    local function run(need)
      local xi = x:clone()
      xi.requires_grad = true
      for _, p in ipairs(m:parameters()) do p.grad = nil end
      local out = m(xi, xi, xi, { key_padding_mask = kpm, attn_mask = mask, need_weights = need })
      out:backward(randn(out:size(), 4))
      return out, xi.grad, m.in_proj_weight.grad
    end
    local a = { run(true) }
    local b = { run(false) }
    for i = 1, 3 do assert.is_true(torch_ref.rel_diff(b[i], a[i]) < 1e-12, "item " .. i) end
  end)

  it("applies is_causal without a mask on both paths, as the explicit -inf mask", function()
    local m = nn.MultiheadAttention(8, 2, { dtype = "f64", generator = dl.Generator(2) })
    local x = randn({ 5, 3, 8 }, 3)
    local causal = dl.zeros({ 5, 5 }, { dtype = "f64" })
    for i = 1, 5 do
      for j = i + 1, 5 do causal:set(i, j, -math.huge) end
    end
    local want = m(x, x, x, { attn_mask = causal })
    assert.is_true(torch_ref.rel_diff(m(x, x, x, { is_causal = true }), want) < 1e-13)
    assert.is_true(torch_ref.rel_diff(m(x, x, x, { is_causal = true, need_weights = false }), want) < 1e-13)
  end)

  it("takes unbatched (L, E) inputs as a batch of one", function()
    local m = nn.MultiheadAttention(8, 2, { dtype = "f64", generator = dl.Generator(4) })
    local x = randn({ 5, 8 }, 5)
    local kpm = dl.zeros({ 5 }, { dtype = "bool" })
    kpm:set(5, true)
    local out, w = m(x, x, x, { key_padding_mask = kpm })
    local xb = x:unsqueeze(2)
    local outb, wb = m(xb, xb, xb, { key_padding_mask = kpm:unsqueeze(1) })
    assert.same({ 5, 8 }, out:size())
    assert.same({ 5, 5 }, w:size())
    assert.equal(0, (out - outb:squeeze(2)):abs():max():item())
    assert.equal(0, (w - wb:squeeze(1)):abs():max():item())
  end)

  it("raises PyTorch's message for a 2-D attn_mask of the wrong shape", function()
    local m = nn.MultiheadAttention(4, 2)
    local x = dl.randn({ 3, 1, 4 })
    assert.error_matches(function() m(x, x, x, { attn_mask = dl.zeros({ 3, 2 }) }) end,
      "The shape of the 2D attn_mask is %(3, 2%), but should be %(3, 3%).")
  end)

  describe("against PyTorch 1.13 (f64, 1e-10)", function()
    it("self-attention, (L, N, E), key_padding_mask (bool) and attn_mask (float), need_weights", case(function()
      local m = nn.MultiheadAttention(12, 3, { dtype = "f64", generator = dl.Generator(1) })
      local kpm = dl.zeros({ 2, 7 }, { dtype = "bool" })
      kpm:set(1, 6, true)
      kpm:set(2, 2, true)
      return m, { randn({ 7, 2, 12 }, 2) }, { 1, 1, 1 }, { key_padding_mask = kpm, attn_mask = randn({ 7, 7 }, 3) }
    end, "torch.nn.MultiheadAttention(12, 3)"))

    it("cross attention, batch_first, bool attn_mask (true = masked), need_weights = false", case(function()
      local m = nn.MultiheadAttention(8, 2, { dtype = "f64", batch_first = true, generator = dl.Generator(5) })
      local am = randn({ 4, 6 }, 6):gt(0.5)
      for i = 1, 4 do am:set(i, 1, false) end
      local kpm = dl.zeros({ 3, 6 }, { dtype = "bool" })
      kpm:set(3, 6, true)
      return m, { randn({ 3, 4, 8 }, 7), randn({ 3, 6, 8 }, 8), randn({ 3, 6, 8 }, 9) }, { 1, 2, 3 },
        { attn_mask = am, key_padding_mask = kpm }, { need_weights = false }
    end, "torch.nn.MultiheadAttention(8, 2, batch_first=True)", "need_weights=False"))

    it("kdim / vdim, a 3-D float attn_mask, per-head weights (average_attn_weights = false)", case(function()
      local m = nn.MultiheadAttention(8, 2, { dtype = "f64", kdim = 5, vdim = 3, generator = dl.Generator(9) })
      return m, { randn({ 4, 2, 8 }, 10), randn({ 6, 2, 5 }, 11), randn({ 6, 2, 3 }, 12) }, { 1, 2, 3 },
        { attn_mask = randn({ 4, 4, 6 }, 13) }, { average_attn_weights = false }
    end, "torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3)", "average_attn_weights=False"))
  end)
end)

describe("nn.TransformerEncoderLayer", function()
  it("has PyTorch's children and parameter names", function()
    local l = nn.TransformerEncoderLayer(8, 2, { dim_feedforward = 16 })
    assert.same({ "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
      "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
      "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias" }, names_of(l))
  end)

  it("prints PyTorch's tree (out_proj is PyTorch's NonDynamicallyQuantizableLinear, a Linear)", function()
    local want = table.concat({
      "TransformerEncoderLayer(",
      "  (self_attn): MultiheadAttention(",
      "    (out_proj): Linear(in_features=8, out_features=8, bias=True)",
      "  )",
      "  (linear1): Linear(in_features=8, out_features=16, bias=True)",
      "  (dropout): Dropout(p=0.1, inplace=False)",
      "  (linear2): Linear(in_features=16, out_features=8, bias=True)",
      "  (norm1): LayerNorm((8,), eps=1e-05, elementwise_affine=True)",
      "  (norm2): LayerNorm((8,), eps=1e-05, elementwise_affine=True)",
      "  (dropout1): Dropout(p=0.1, inplace=False)",
      "  (dropout2): Dropout(p=0.1, inplace=False)",
      ")" }, "\n")
    assert.equal(want, tostring(nn.TransformerEncoderLayer(8, 2, { dim_feedforward = 16 })))
  end)

  describe("against PyTorch 1.13 (f64, 1e-10, dropout 0)", function()
    for _, cfg in ipairs {
      { norm_first = false, activation = "relu", batch_first = false },
      { norm_first = true, activation = "gelu", batch_first = true },
      { norm_first = false, activation = "gelu", batch_first = true },
      { norm_first = true, activation = "relu", batch_first = false },
    } do
      local name = ("norm_first=%s, %s, batch_first=%s"):format(tostring(cfg.norm_first), cfg.activation,
        tostring(cfg.batch_first))
      local py = ("torch.nn.TransformerEncoderLayer(12, 3, dim_feedforward=20, dropout=0.0, activation=%q, "
        .. "norm_first=%s, batch_first=%s)"):format(cfg.activation, cfg.norm_first and "True" or "False",
        cfg.batch_first and "True" or "False")
      it(name .. ", src_mask and src_key_padding_mask", case(function()
        local l = nn.TransformerEncoderLayer(12, 3, { dim_feedforward = 20, dropout = 0, activation = cfg.activation,
          norm_first = cfg.norm_first, batch_first = cfg.batch_first, dtype = "f64", generator = dl.Generator(3) })
        local kpm = dl.zeros({ 2, 5 }, { dtype = "bool" })
        kpm:set(2, 5, true)
        local x = cfg.batch_first and randn({ 2, 5, 12 }, 4) or randn({ 5, 2, 12 }, 4)
        return l, { x }, { 1 }, { src_mask = randn({ 5, 5 }, 5), src_key_padding_mask = kpm }
      end, py))
    end
  end)
end)

describe("nn.TransformerDecoderLayer", function()
  it("has PyTorch's children and parameter names", function()
    local l = nn.TransformerDecoderLayer(8, 2, { dim_feedforward = 16 })
    local names = names_of(l)
    assert.equal("self_attn.in_proj_weight", names[1])
    assert.equal("multihead_attn.in_proj_weight", names[5])
    assert.equal("norm3.bias", names[#names])
    assert.equal(18, #names)
  end)

  describe("against PyTorch 1.13 (f64, 1e-10, dropout 0)", function()
    for _, norm_first in ipairs { false, true } do
      local py = ("torch.nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0, activation='gelu', "
        .. "norm_first=%s)"):format(norm_first and "True" or "False")
      it("norm_first=" .. tostring(norm_first) .. ", causal tgt_mask, memory_key_padding_mask", case(function()
        local l = nn.TransformerDecoderLayer(8, 2, { dim_feedforward = 16, dropout = 0, norm_first = norm_first,
          activation = "gelu", dtype = "f64", generator = dl.Generator(6) })
        local T, S = 5, 7
        local causal = dl.zeros({ T, T }, { dtype = "f64" })
        for i = 1, T do
          for j = i + 1, T do causal:set(i, j, -math.huge) end
        end
        local mkpm = dl.zeros({ 2, S }, { dtype = "bool" })
        mkpm:set(1, S, true)
        return l, { randn({ T, 2, 8 }, 7), randn({ S, 2, 8 }, 8) }, { 1, 2 },
          { tgt_mask = causal, memory_key_padding_mask = mkpm }
      end, py))
    end
  end)
end)
