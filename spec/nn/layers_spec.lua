-- Specs for the nn layers and losses: default initialisation (PyTorch's bounds), seeds,
-- forward against the functional ops and plain-Lua references, BatchNorm's running stats
-- in train and eval, Dropout in train and eval, shapes, options and errors.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local F = nn.functional
local assert_close = require("close").assert_close

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  else
    out[#out + 1] = v
  end
  return out
end
local function flat(t) return flatten(t:tolist()) end

local function randn(shape, seed, dtype)
  return dl.randn(shape, { dtype = dtype or "f32", generator = dl.Generator(seed) })
end

local function max_abs(t)
  local m = 0
  for _, v in ipairs(flat(t)) do m = math.max(m, math.abs(v)) end
  return m
end

local function errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(err)
end

describe("ddplua.nn layers", function()
  describe("default initialisation", function()
    it("Linear: weight and bias within 1 / sqrt(in_features), filling the range", function()
      local lin = nn.Linear(400, 300)
      local bound = 1 / math.sqrt(400)
      assert.same({ 300, 400 }, lin.weight:size())
      assert.same({ 300 }, lin.bias:size())
      local mw, mb = max_abs(lin.weight), max_abs(lin.bias)
      assert.is_true(mw <= bound * (1 + 1e-6) and mw > 0.99 * bound)
      assert.is_true(mb <= bound * (1 + 1e-6) and mb > 0.95 * bound)
      assert.same({ "weight", "bias" }, nn.state_dict_keys(lin:state_dict()))
      local nb = nn.Linear(3, 2, { bias = false })
      assert.is_nil(nb.bias)
      assert.equal(1, #nb:parameters())
    end)

    it("Conv2d: bounds use fan_in = in_channels / groups * kH * kW", function()
      local conv = nn.Conv2d(16, 32, { 3, 5 }, { groups = 4 })
      assert.same({ 32, 4, 3, 5 }, conv.weight:size())
      local bound = 1 / math.sqrt(4 * 3 * 5)
      local mw, mb = max_abs(conv.weight), max_abs(conv.bias)
      assert.is_true(mw <= bound * (1 + 1e-6) and mw > 0.98 * bound)
      assert.is_true(mb <= bound * (1 + 1e-6) and mb > 0.5 * bound)
    end)

    it("Embedding: N(0, 1) with the padding row zero; BatchNorm and LayerNorm: 1 and 0", function()
      local emb = nn.Embedding(300, 50, { padding_idx = 2 })
      local v = flat(emb.weight)
      local s, sq = 0, 0
      for _, x in ipairs(v) do s = s + x; sq = sq + x * x end
      local mean = s / #v
      assert.near(0, mean, 0.03)
      assert.near(1, math.sqrt(sq / #v - mean * mean), 0.03)
      assert.same({ 0, 0, 0 }, { emb.weight:get(3, 1), emb.weight:get(3, 25), emb.weight:get(3, 50) })
      local bn = nn.BatchNorm2d(3)
      assert.same({ 1, 1, 1 }, bn.weight:tolist())
      assert.same({ 0, 0, 0 }, bn.bias:tolist())
      assert.same({ 0, 0, 0 }, bn.running_mean:tolist())
      assert.same({ 1, 1, 1 }, bn.running_var:tolist())
      assert.equal(0, bn.num_batches_tracked:item())
      local ln = nn.LayerNorm({ 2, 3 })
      assert.same({ { 1, 1, 1 }, { 1, 1, 1 } }, ln.weight:tolist())
      assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, ln.bias:tolist())
    end)

    it("same seed gives identical parameters; a generator option is independent of it", function()
      local function build()
        return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Linear(8, 3), nn.Embedding(5, 2))
      end
      dl.manual_seed(42)
      local a = build()
      dl.manual_seed(42)
      local b = build()
      local c = build()
      local sa, sb, sc = a:state_dict(), b:state_dict(), c:state_dict()
      local differs = false
      for _, k in ipairs(nn.state_dict_keys(sa)) do
        assert.same(sa[k]:tolist(), sb[k]:tolist())
        if k:match("weight") and k ~= "1.weight" then
          differs = differs or not (table.concat(flat(sa[k]), ",") == table.concat(flat(sc[k]), ","))
        end
      end
      assert.is_true(differs)
      local l1 = nn.Linear(4, 4, { generator = dl.Generator(7) })
      dl.manual_seed(1000)
      local l2 = nn.Linear(4, 4, { generator = dl.Generator(7) })
      assert.same(l1.weight:tolist(), l2.weight:tolist())
      assert.same(l1.bias:tolist(), l2.bias:tolist())
    end)

    it("dtype option makes f64 parameters and buffers", function()
      local lin = nn.Linear(2, 2, { dtype = "f64" })
      assert.equal("f64", lin.weight:type())
      assert.equal("f64", lin.bias:type())
      local bn = nn.BatchNorm1d(2, { dtype = "f64" })
      assert.equal("f64", bn.running_mean:type())
      assert.equal("i64", bn.num_batches_tracked:type())
    end)
  end)

  describe("Linear and Conv2d forward", function()
    it("Linear equals the functional op and a plain-Lua reference", function()
      local lin = nn.Linear(5, 3)
      local x = randn({ 4, 5 }, 1)
      local y = lin(x)
      assert_close(y, F.linear(x, lin.weight, lin.bias), { atol = 0 })
      local xs, w, b = x:tolist(), lin.weight:tolist(), lin.bias:tolist()
      local ref = {}
      for i = 1, 4 do
        ref[i] = {}
        for o = 1, 3 do
          local s = b[o]
          for k = 1, 5 do s = s + xs[i][k] * w[o][k] end
          ref[i][o] = s
        end
      end
      assert_close(y, ref, { atol = 1e-5 })
      local x3 = randn({ 2, 3, 5 }, 2)
      assert.same({ 2, 3, 3 }, lin(x3):size())
      local msg = errmsg(function() lin(randn({ 4, 6 }, 3)) end)
      assert.matches("linear", msg)
    end)

    it("Conv2d equals the functional op and a plain-Lua reference (stride, padding, groups)", function()
      local conv = nn.Conv2d(4, 6, 3, { stride = 2, padding = 1, groups = 2 })
      local x = randn({ 2, 4, 5, 5 }, 4)
      local y = conv(x)
      assert.same({ 2, 6, 3, 3 }, y:size())
      assert_close(y, F.conv2d(x, conv.weight, conv.bias, { stride = 2, padding = 1, groups = 2 }), { atol = 0 })
      local xs, w, b = x:tolist(), conv.weight:tolist(), conv.bias:tolist()
      local ref = {}
      for n = 1, 2 do
        ref[n] = {}
        for o = 1, 6 do
          ref[n][o] = {}
          local g = o <= 3 and 0 or 1
          for i = 1, 3 do
            ref[n][o][i] = {}
            for j = 1, 3 do
              local s = b[o]
              for c = 1, 2 do
                for ki = 1, 3 do
                  for kj = 1, 3 do
                    local hi, wj = (i - 1) * 2 - 1 + ki, (j - 1) * 2 - 1 + kj
                    if hi >= 1 and hi <= 5 and wj >= 1 and wj <= 5 then
                      s = s + xs[n][g * 2 + c][hi][wj] * w[o][c][ki][kj]
                    end
                  end
                end
              end
              ref[n][o][i][j] = s
            end
          end
        end
      end
      assert_close(y, ref, { atol = 1e-5 })
    end)

    it("Conv2d padding 'same' keeps the size; bad options raise naming Conv2d", function()
      local conv = nn.Conv2d(1, 2, 5, { padding = "same", bias = false })
      assert.same({ 2, 2 }, conv.padding)
      assert.same({ 1, 2, 7, 7 }, conv(randn({ 1, 1, 7, 7 }, 5)):size())
      assert.matches("Conv2d: in_channels %(3%) must be divisible by groups %(2%)",
        errmsg(function() nn.Conv2d(3, 4, 3, { groups = 2 }) end))
      assert.matches("Conv2d: kernel_size must be an integer or a {h, w} pair",
        errmsg(function() nn.Conv2d(3, 4, "x") end))
      assert.matches("Conv2d: padding='same' is not supported for strided",
        errmsg(function() nn.Conv2d(3, 4, 3, { padding = "same", stride = 2 }) end))
    end)
  end)

  describe("pooling and reshaping layers", function()
    it("MaxPool2d, AvgPool2d, AdaptiveAvgPool2d equal their functional ops", function()
      local x = randn({ 2, 3, 6, 6 }, 6)
      assert_close(nn.MaxPool2d(2)(x), F.max_pool2d(x, 2), { atol = 0 })
      assert_close(nn.MaxPool2d(3, { stride = 1, padding = 1 })(x),
        F.max_pool2d(x, 3, { stride = 1, padding = 1 }), { atol = 0 })
      assert_close(nn.AvgPool2d(2)(x), F.avg_pool2d(x, 2), { atol = 0 })
      assert.same({ 2, 3, 1, 1 }, nn.AdaptiveAvgPool2d(1)(x):size())
      assert.same({ 2, 3, 2, 3 }, nn.AdaptiveAvgPool2d({ 2, 3 })(x):size())
      -- max over the 2x2 window, by hand
      local xs, y = x:tolist(), nn.MaxPool2d(2)(x)
      local m = math.max(xs[2][3][5][3], xs[2][3][5][4], xs[2][3][6][3], xs[2][3][6][4])
      assert.equal(m, y:get(2, 3, 3, 2))
    end)

    it("Flatten keeps the batch dim by default (Lua numbering)", function()
      local x = randn({ 2, 3, 4, 5 }, 7)
      assert.same({ 2, 60 }, nn.Flatten()(x):size())
      assert.same({ 120 }, nn.Flatten(1)(x):size())
      assert.same({ 2, 12, 5 }, nn.Flatten(2, 3)(x):size())
      assert.same(flat(x), flat(nn.Flatten()(x)))
      assert.same({ 120 }, F.flatten(x):size())
      local id = nn.Identity(1, 2)
      assert.equal(x, id(x))
    end)
  end)

  describe("BatchNorm", function()
    -- Per-channel mean, biased and unbiased variance of x (N, C, *).
    local function channel_stats(x)
      local s = x:size()
      local N, Cn = s[1], s[2]
      local S = x:numel() / (N * Cn)
      local v = flat(x)
      local mean, var, unb = {}, {}, {}
      for c = 1, Cn do
        local sum, cnt = 0, N * S
        for n = 0, N - 1 do for k = 1, S do sum = sum + v[(n * Cn + c - 1) * S + k] end end
        local m = sum / cnt
        local sq = 0
        for n = 0, N - 1 do for k = 1, S do sq = sq + (v[(n * Cn + c - 1) * S + k] - m) ^ 2 end end
        mean[c], var[c], unb[c] = m, sq / cnt, sq / (cnt - 1)
      end
      return mean, var, unb
    end

    it("training normalises with batch stats and updates the running stats (momentum 0.1)", function()
      local bn = nn.BatchNorm2d(3, { dtype = "f64" })
      local x = randn({ 4, 3, 2, 2 }, 8, "f64")
      local y = bn(x)
      local mean, var, unb = channel_stats(x)
      local xv, yv = flat(x), flat(y)
      for i = 1, #xv do
        local c = math.floor((i - 1) / 4) % 3 + 1
        assert.near((xv[i] - mean[c]) / math.sqrt(var[c] + 1e-5), yv[i], 1e-10)
      end
      local rm, rv = bn.running_mean:tolist(), bn.running_var:tolist()
      for c = 1, 3 do
        assert.near(0.1 * mean[c], rm[c], 1e-12)
        assert.near(0.9 + 0.1 * unb[c], rv[c], 1e-12)
      end
      assert.equal(1, bn.num_batches_tracked:item())
      bn(x)
      assert.equal(2, bn.num_batches_tracked:item())
    end)

    it("eval normalises with the running stats and leaves them unchanged", function()
      local bn = nn.BatchNorm1d(2, { dtype = "f64" })
      dl.no_grad(function()
        bn.running_mean:copy_(dl.tensor({ 1, -2 }, { dtype = "f64" }))
        bn.running_var:copy_(dl.tensor({ 4, 0.25 }, { dtype = "f64" }))
        bn.weight:copy_(dl.tensor({ 2, 3 }, { dtype = "f64" }))
        bn.bias:copy_(dl.tensor({ 0.5, -1 }, { dtype = "f64" }))
      end)
      bn:eval()
      local x = randn({ 5, 2 }, 9, "f64")
      local y = bn(x)
      local xs, ys = x:tolist(), y:tolist()
      local rm, rv, w, b = { 1, -2 }, { 4, 0.25 }, { 2, 3 }, { 0.5, -1 }
      for n = 1, 5 do
        for c = 1, 2 do
          assert.near((xs[n][c] - rm[c]) / math.sqrt(rv[c] + 1e-5) * w[c] + b[c], ys[n][c], 1e-10)
        end
      end
      assert.same(rm, bn.running_mean:tolist())
      assert.same(rv, bn.running_var:tolist())
      assert.equal(0, bn.num_batches_tracked:item())
    end)

    it("momentum = false keeps a cumulative average (PyTorch's momentum=None)", function()
      local bn = nn.BatchNorm1d(2, { momentum = false, dtype = "f64" })
      local x1, x2, x3 = randn({ 6, 2 }, 10, "f64"), randn({ 6, 2 }, 11, "f64"), randn({ 6, 2 }, 12, "f64")
      bn(x1); bn(x2); bn(x3)
      local m1, _, u1 = channel_stats(x1)
      local m2, _, u2 = channel_stats(x2)
      local m3, _, u3 = channel_stats(x3)
      local rm, rv = bn.running_mean:tolist(), bn.running_var:tolist()
      for c = 1, 2 do
        assert.near((m1[c] + m2[c] + m3[c]) / 3, rm[c], 1e-12)
        assert.near((u1[c] + u2[c] + u3[c]) / 3, rv[c], 1e-12)
      end
      assert.equal(3, bn.num_batches_tracked:item())
    end)

    it("track_running_stats = false uses batch stats in eval too; affine = false has no parameters", function()
      local bn = nn.BatchNorm1d(3, { track_running_stats = false, affine = false })
      assert.equal(0, #bn:parameters())
      assert.equal(0, #bn:buffers())
      assert.same({}, nn.state_dict_keys(bn:state_dict()))
      bn:eval()
      local x = randn({ 8, 3, 4 }, 13)
      local y = bn(x)
      local m = channel_stats(y)
      for c = 1, 3 do assert.near(0, m[c], 1e-5) end
    end)

    it("raises for a wrong input rank naming the layer", function()
      assert.matches("BatchNorm2d: expected 4D input %(got 3D input%)",
        errmsg(function() nn.BatchNorm2d(3)(randn({ 2, 3, 4 }, 1)) end))
      assert.matches("BatchNorm1d: expected 2D or 3D input %(got 4D input%)",
        errmsg(function() nn.BatchNorm1d(3)(randn({ 2, 3, 4, 4 }, 1)) end))
      assert.matches("batch_norm", errmsg(function() nn.BatchNorm1d(3)(randn({ 2, 4 }, 1)) end))
    end)
  end)

  describe("Dropout", function()
    it("zeroes about p of the elements and scales the rest in training; identity in eval", function()
      local drop = nn.Dropout(0.25)
      local x = dl.ones({ 100, 100 })
      local y = drop(x)
      local zeros = 0
      for _, v in ipairs(flat(y)) do
        if v == 0 then zeros = zeros + 1 else assert.near(1 / 0.75, v, 1e-6) end
      end
      assert.near(0.25, zeros / 10000, 0.02)
      drop:eval()
      assert.same(flat(x), flat(drop(x)))
      drop:train()
      assert.are_not.same(flat(drop(x)), flat(drop(x)))
    end)

    it("draws masks from its generator option, reproducibly", function()
      local x = dl.ones({ 50 })
      local a = nn.Dropout(0.5, { generator = dl.Generator(3) })(x)
      local b = nn.Dropout(0.5, { generator = dl.Generator(3) })(x)
      assert.same(flat(a), flat(b))
      assert.matches("Dropout: dropout probability has to be between 0 and 1", errmsg(function() nn.Dropout(1.5) end))
    end)
  end)

  describe("LayerNorm and Embedding", function()
    it("LayerNorm normalises each row over the trailing dims", function()
      local ln = nn.LayerNorm(4, { dtype = "f64" })
      dl.no_grad(function() ln.weight:fill_(2); ln.bias:fill_(1) end)
      local x = randn({ 3, 4 }, 14, "f64")
      local y = ln(x)
      local xs, ys = x:tolist(), y:tolist()
      for r = 1, 3 do
        local m, v = 0, 0
        for k = 1, 4 do m = m + xs[r][k] / 4 end
        for k = 1, 4 do v = v + (xs[r][k] - m) ^ 2 / 4 end
        for k = 1, 4 do assert.near((xs[r][k] - m) / math.sqrt(v + 1e-5) * 2 + 1, ys[r][k], 1e-10) end
      end
      local plain = nn.LayerNorm({ 4 }, { elementwise_affine = false })
      assert.equal(0, #plain:parameters())
      assert.matches("layer_norm", errmsg(function() ln(randn({ 3, 5 }, 1, "f64")) end))
    end)

    it("Embedding looks up rows; the padding row gets no gradient", function()
      local emb = nn.Embedding(6, 3, { padding_idx = 0 })
      local ids = dl.tensor({ { 0, 2 }, { 5, 2 } }, { dtype = "i64" })
      local y = emb(ids)
      assert.same({ 2, 2, 3 }, y:size())
      local w = emb.weight:tolist()
      assert.same(w[3], y:tolist()[1][2])
      assert.same(w[6], y:tolist()[2][1])
      dl.mse_loss(y, dl.ones({ 2, 2, 3 }), { reduction = "sum" }):backward()
      local g = emb.weight.grad:tolist()
      assert.same({ 0, 0, 0 }, g[1])
      for j = 1, 3 do assert.near(2 * 2 * (w[3][j] - 1), g[3][j], 1e-5) end
      assert.same({ 0, 0, 0 }, g[2])
      assert.matches("Embedding: padding_idx 6 must be within num_embeddings %(6%)",
        errmsg(function() nn.Embedding(6, 3, { padding_idx = 6 }) end))
      assert.equal(5, nn.Embedding(6, 3, { padding_idx = -1 }).padding_idx)
    end)
  end)

  describe("activations", function()
    local x = dl.tensor({ { -2, -0.5, 0, 0.5, 3 } }, { dtype = "f64" })
    local xs = x:tolist()[1]
    local function check(layer, fn, tol)
      local ys = layer(x):tolist()[1]
      for i, v in ipairs(xs) do assert.near(fn(v), ys[i], tol or 1e-12) end
    end

    it("ReLU, LeakyReLU, Tanh, Sigmoid, SiLU, GELU match their formulas", function()
      check(nn.ReLU(), function(v) return math.max(v, 0) end)
      check(nn.LeakyReLU(), function(v) return v > 0 and v or 0.01 * v end)
      check(nn.LeakyReLU(0.2), function(v) return v > 0 and v or 0.2 * v end)
      check(nn.Tanh(), math.tanh)
      check(nn.Sigmoid(), function(v) return 1 / (1 + math.exp(-v)) end)
      check(nn.SiLU(), function(v) return v / (1 + math.exp(-v)) end)
      check(nn.GELU({ approximate = "tanh" }), function(v)
        return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3)))
      end)
      -- exact GELU = x Phi(x): compare with a numerically integrated Phi
      check(nn.GELU(), function(v)
        local s, n = 0, 20000
        local lo = -10
        local h = (v - lo) / n
        for k = 0, n do
          local t = lo + k * h
          local wgt = (k == 0 or k == n) and 0.5 or 1
          s = s + wgt * math.exp(-t * t / 2)
        end
        return v * s * h / math.sqrt(2 * math.pi)
      end, 1e-6)
      assert.matches("GELU: approximate must be", errmsg(function() nn.GELU("fast") end))
    end)

    it("Softmax and LogSoftmax along a Lua dim", function()
      local t = randn({ 2, 3 }, 15, "f64")
      local ts = t:tolist()
      local sm, lsm = nn.Softmax(2)(t):tolist(), nn.LogSoftmax(-1)(t):tolist()
      local sm1 = nn.Softmax(1)(t):tolist()
      for r = 1, 2 do
        local z = 0
        for c = 1, 3 do z = z + math.exp(ts[r][c]) end
        for c = 1, 3 do
          assert.near(math.exp(ts[r][c]) / z, sm[r][c], 1e-12)
          assert.near(ts[r][c] - math.log(z), lsm[r][c], 1e-12)
        end
      end
      for c = 1, 3 do
        assert.near(math.exp(ts[1][c]) / (math.exp(ts[1][c]) + math.exp(ts[2][c])), sm1[1][c], 1e-12)
      end
      assert.matches("Softmax: dim must be a non%-zero integer", errmsg(function() nn.Softmax() end))
    end)
  end)

  describe("losses", function()
    local logits = dl.tensor({ { 1, 2, 0.5 }, { -1, 0, 3 }, { 0.2, 0.1, -0.3 } }, { dtype = "f64" })
    local target = dl.tensor({ 2, 0, 1 }, { dtype = "i64" })
    local ls, ts = logits:tolist(), { 2, 0, 1 }
    local function logp(r, c)
      local z = 0
      for k = 1, 3 do z = z + math.exp(ls[r][k]) end
      return ls[r][c + 1] - math.log(z)
    end

    it("CrossEntropyLoss: mean, sum, weight, ignore_index", function()
      local mean = 0
      for r = 1, 3 do mean = mean - logp(r, ts[r]) / 3 end
      assert.near(mean, nn.CrossEntropyLoss()(logits, target):item(), 1e-12)
      assert.near(3 * mean, nn.CrossEntropyLoss({ reduction = "sum" })(logits, target):item(), 1e-12)
      local w = { 1, 2, 3 }
      local num, den = 0, 0
      for r = 1, 3 do
        num = num - w[ts[r] + 1] * logp(r, ts[r])
        den = den + w[ts[r] + 1]
      end
      local crit = nn.CrossEntropyLoss({ weight = dl.tensor(w, { dtype = "f64" }) })
      assert.near(num / den, crit(logits, target):item(), 1e-12)
      assert.same({ "weight" }, nn.state_dict_keys(crit:state_dict()))
      local ign = nn.CrossEntropyLoss({ ignore_index = 0 })(logits, target):item()
      assert.near(-(logp(1, 2) + logp(3, 1)) / 2, ign, 1e-12)
      local none = nn.CrossEntropyLoss({ reduction = "none" })(logits, target)
      assert.same({ 3 }, none:size())
      assert.matches("CrossEntropyLoss: reduction must be",
        errmsg(function() nn.CrossEntropyLoss({ reduction = "avg" }) end))
    end)

    it("NLLLoss on log-probabilities and MSELoss", function()
      local lp = {}
      for r = 1, 3 do lp[r] = { logp(r, 0), logp(r, 1), logp(r, 2) } end
      local lpt = dl.tensor(lp, { dtype = "f64" })
      local expected = 0
      for r = 1, 3 do expected = expected - lp[r][ts[r] + 1] / 3 end
      assert.near(expected, nn.NLLLoss()(lpt, target):item(), 1e-12)
      assert.near(nn.CrossEntropyLoss()(logits, target):item(), nn.NLLLoss()(lpt, target):item(), 1e-12)
      local a = dl.tensor({ 1, 2, 3 }, { dtype = "f64" })
      local b = dl.tensor({ 0, 2, 5 }, { dtype = "f64" })
      assert.near(5 / 3, nn.MSELoss()(a, b):item(), 1e-12)
      assert.near(5, nn.MSELoss({ reduction = "sum" })(a, b):item(), 1e-12)
      assert.equal("MSELoss()", tostring(nn.MSELoss()))
    end)
  end)

  describe("functional", function()
    it("wraps the dl functions in PyTorch's argument order", function()
      local x = randn({ 2, 4 }, 16, "f64")
      assert_close(F.relu(x), dl.relu(x), { atol = 0 })
      assert_close(F.leaky_relu(x, 0.3), dl.leaky_relu(x, 0.3), { atol = 0 })
      assert_close(F.gelu(x), dl.gelu(x), { atol = 0 })
      assert_close(F.tanh(x), dl.tanh(x), { atol = 0 })
      assert_close(F.sigmoid(x), dl.sigmoid(x), { atol = 0 })
      assert_close(F.silu(x), dl.silu(x), { atol = 0 })
      assert_close(F.softmax(x, 2), x:softmax(2), { atol = 0 })
      assert_close(F.log_softmax(x, 1), x:log_softmax(1), { atol = 0 })
      local y = F.dropout(x, 0.5, { training = false })
      assert_close(y, x, { atol = 0 })
      local ln = F.layer_norm(x, { 4 })
      assert_close(ln, dl.layer_norm(x, { 4 }), { atol = 0 })
      local rm, rv = dl.zeros({ 4 }, { dtype = "f64" }), dl.ones({ 4 }, { dtype = "f64" })
      assert_close(F.batch_norm(x, rm, rv), dl.batch_norm(x, rm, rv), { atol = 0 })
      local ids = dl.tensor({ 1, 0 }, { dtype = "i64" })
      assert_close(F.embedding(ids, x), dl.embedding(ids, x), { atol = 0 })
      local t = dl.tensor({ 1, 0 }, { dtype = "i64" })
      assert.near(dl.cross_entropy(x, t):item(), F.cross_entropy(x, t):item(), 0)
      assert.near(dl.nll_loss(x, t):item(), F.nll_loss(x, t):item(), 0)
      assert.near(dl.mse_loss(x, x):item(), F.mse_loss(x, x):item(), 0)
    end)
  end)
end)
