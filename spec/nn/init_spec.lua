-- Specs for ddplua.nn.weight_init (nn.init): gains, fans, the bounds and spreads of each
-- initialisation against the formulas of torch/nn/init.py, generators, no_grad on leaves.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local init = nn.init

local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for i = 1, #v do walk(v[i]) end else out[#out + 1] = v end
  end
  walk(t:tolist())
  return out
end

local function stats(t)
  local v = flat(t)
  local s, mx = 0, 0
  for _, x in ipairs(v) do s = s + x; mx = math.max(mx, math.abs(x)) end
  local mean = s / #v
  local sq = 0
  for _, x in ipairs(v) do sq = sq + (x - mean) ^ 2 end
  return mean, math.sqrt(sq / (#v - 1)), mx
end

local function param(shape)
  return nn.Parameter(dl.empty(shape))
end

describe("ddplua.nn.init", function()
  it("calculate_gain follows PyTorch's table", function()
    assert.equal(1, init.calculate_gain("linear"))
    assert.equal(1, init.calculate_gain("conv2d"))
    assert.equal(1, init.calculate_gain("sigmoid"))
    assert.near(5 / 3, init.calculate_gain("tanh"), 1e-15)
    assert.near(math.sqrt(2), init.calculate_gain("relu"), 1e-15)
    assert.near(math.sqrt(2 / (1 + 0.01 ^ 2)), init.calculate_gain("leaky_relu"), 1e-15)
    assert.near(math.sqrt(2 / 6), init.calculate_gain("leaky_relu", math.sqrt(5)), 1e-15)
    assert.equal(0.75, init.calculate_gain("selu"))
    local ok, err = pcall(init.calculate_gain, "swish")
    assert.is_false(ok)
    assert.matches("unsupported nonlinearity swish", err)
  end)

  it("computes fans as _calculate_fan_in_and_fan_out", function()
    assert.same({ 3, 5 }, { init.calculate_fan_in_and_fan_out(dl.empty({ 5, 3 })) })
    assert.same({ 4 * 9, 8 * 9 }, { init.calculate_fan_in_and_fan_out(dl.empty({ 8, 4, 3, 3 })) })
    local ok, err = pcall(init.calculate_fan_in_and_fan_out, dl.empty({ 5 }))
    assert.is_false(ok)
    assert.matches("fewer than 2 dimensions", err)
  end)

  it("kaiming_uniform_ draws in +-sqrt(3) gain / sqrt(fan), filling the range", function()
    local w = param({ 64, 50, 3, 3 }) -- fan_in 450, fan_out 576
    local cases = {
      { {}, math.sqrt(3) * math.sqrt(2) / math.sqrt(450) },                       -- a = 0
      { { a = math.sqrt(5) }, 1 / math.sqrt(450) },                               -- Linear's
      { { nonlinearity = "relu", mode = "fan_out" }, math.sqrt(3) * math.sqrt(2) / math.sqrt(576) },
      { { nonlinearity = "tanh" }, math.sqrt(3) * 5 / 3 / math.sqrt(450) },
    }
    for _, c in ipairs(cases) do
      assert.equal(w, init.kaiming_uniform_(w, c[1]))
      local mean, std, mx = stats(w)
      local bound = c[2]
      assert.is_true(mx <= bound * (1 + 1e-6))
      assert.is_true(mx > 0.99 * bound)
      assert.near(0, mean, 0.02 * bound)
      assert.near(bound / math.sqrt(3), std, 0.03 * bound) -- U(-b, b) has std b / sqrt(3)
    end
    assert.is_true(w.requires_grad and w.is_leaf)
    local ok, err = pcall(init.kaiming_uniform_, w, { mode = "fan_avg" })
    assert.is_false(ok)
    assert.matches("mode fan_avg not supported", err)
  end)

  it("kaiming_normal_ has std gain / sqrt(fan)", function()
    local w = param({ 200, 100 })
    init.kaiming_normal_(w, { nonlinearity = "relu" })
    local mean, std = stats(w)
    local expected = math.sqrt(2) / math.sqrt(100)
    assert.near(0, mean, 0.02 * expected)
    assert.near(expected, std, 0.03 * expected)
  end)

  it("xavier_uniform_ and xavier_normal_ use gain * sqrt(2 / (fan_in + fan_out))", function()
    local w = param({ 300, 100 })
    local std_expected = 2 * math.sqrt(2 / 400)
    init.xavier_uniform_(w, 2)
    local _, std, mx = stats(w)
    assert.is_true(mx <= math.sqrt(3) * std_expected * (1 + 1e-6))
    assert.is_true(mx > 0.99 * math.sqrt(3) * std_expected)
    assert.near(std_expected, std, 0.03 * std_expected)
    init.xavier_normal_(w, { gain = 2 })
    _, std = stats(w)
    assert.near(std_expected, std, 0.03 * std_expected)
    init.xavier_normal_(w)
    _, std = stats(w)
    assert.near(std_expected / 2, std, 0.03 * std_expected)
  end)

  it("normal_, uniform_, constant_, zeros_, ones_", function()
    local w = param({ 100, 100 })
    init.normal_(w, 3, 0.5)
    local mean, std = stats(w)
    assert.near(3, mean, 0.02)
    assert.near(0.5, std, 0.02)
    init.uniform_(w, -2, -1)
    local v = flat(w)
    for _, x in ipairs(v) do assert.is_true(x >= -2 and x < -1) end
    init.constant_(w, 0.25)
    assert.same({ 0.25, 0.25 }, { w:get(1, 1), w:get(100, 100) })
    init.zeros_(w)
    assert.equal(0, w:get(7, 3))
    init.ones_(w)
    assert.equal(1, w:get(7, 3))
  end)

  it("draws from the default generator (manual_seed) or the one given", function()
    local a, b = param({ 4, 4 }), param({ 4, 4 })
    dl.manual_seed(11)
    init.kaiming_uniform_(a)
    dl.manual_seed(11)
    init.kaiming_uniform_(b)
    assert.same(a:tolist(), b:tolist())
    init.kaiming_uniform_(a, { generator = dl.Generator(3) })
    dl.manual_seed(99)
    init.kaiming_uniform_(b, { generator = dl.Generator(3) })
    assert.same(a:tolist(), b:tolist())
    init.normal_(a, 0, 1, { generator = dl.Generator(4) })
    init.normal_(b, 0, 1, { generator = dl.Generator(4) })
    assert.same(a:tolist(), b:tolist())
    init.normal_(b, 0, 1, { generator = dl.Generator(5) })
    assert.are_not.same(a:tolist(), b:tolist())
  end)

  it("runs under no_grad: no graph is recorded even when grad mode is on", function()
    local w = param({ 3, 3 })
    init.uniform_(w)
    assert.is_true(w.is_leaf)
    assert.is_nil(w.grad_fn)
    assert.is_true(dl.is_grad_enabled())
  end)

  it("leaves an empty tensor as is", function()
    local w = param({ 0, 3 })
    assert.equal(w, init.kaiming_uniform_(w))
  end)
end)
