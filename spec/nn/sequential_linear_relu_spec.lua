-- nn.Sequential runs a stock Linear followed by a stock ReLU as the linear then relu_ in
-- place on its output (Note [sequential linear relu] in ddplua/nn/sequential.lua): the bits
-- of the children run one by one, forward and backward (NaN, -0, ties at 0; f32, f64; 1 and
-- 2 threads), one output tensor fewer per pair, and no fusion for replaced forwards or
-- subclasses.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local assert_same_bits = require("close").assert_same_bits
local with_threads = require("threads").with_threads
local edge_values = require("edge_values").edge_values

local seed = 2600
local function gen() seed = seed + 1; return dl.Generator(seed) end

-- Values from a small set (many exact zeros and ties), NaN and -0 sprinkled.
local function values(shape, dtype) return edge_values(shape, dtype, gen, -4, 4, 0.25) end

local function mlp(dtype)
  dl.manual_seed(11)
  local m = nn.Sequential(nn.Flatten(), nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 7), nn.ReLU(),
    nn.Linear(7, 3))
  if dtype ~= "f32" then m:to(dtype) end
  return m
end

-- output, input gradient and every parameter's gradient; `forward` runs the net on x
local function run(m, x, forward)
  local xx = x:detach():requires_grad_()
  local y = forward(m, xx)
  y:sum():backward()
  local out = { y:detach(), xx.grad }
  for _, p in ipairs(m:parameters()) do out[#out + 1] = p.grad end
  return out
end

local function by_hand(m, x)
  local y = x
  for i = 1, m:len() do y = m[i](y) end
  return y
end

local function through(m, x) return m(x) end

describe("nn.Sequential with Linear then ReLU", function()
  it("gives the bits of the children run one by one, forward and backward", function()
    for _, dtype in ipairs { "f32", "f64" } do
      for _, threads in ipairs { 1, 2 } do
        with_threads(threads, function()
          local x = values({ 5, 3, 4 }, dtype)
          local want = run(mlp(dtype), x, by_hand)
          local got = run(mlp(dtype), x, through)
          assert.equal(#want, #got)
          for i = 1, #want do
            assert_same_bits(("%s, %d threads, result %d"):format(dtype, threads, i), got[i], want[i])
          end
        end)
      end
    end
  end)

  it("makes one output tensor per Linear + ReLU pair, not two", function()
    local m = nn.Sequential(nn.Linear(8, 1000), nn.ReLU())
    local x = dl.randn({ 4, 8 }, { generator = gen() })
    local out_bytes = 4 * 1000 * 4
    collectgarbage()
    collectgarbage("stop")
    local ok, err = pcall(function()
      local live0 = dl.memory_stats().live
      local y = m(x)
      local grew = dl.memory_stats().live - live0
      assert.is_true(grew < 2 * out_bytes, ("the forward left %d bytes live, one output is %d"):format(grew, out_bytes))
      assert.same({ 4, 1000 }, y:size())
    end)
    collectgarbage("restart")
    assert(ok, err)
  end)

  it("does not fuse a ReLU or a Linear whose forward was replaced, or a Linear subclass", function()
    local x = dl.randn({ 3, 6 }, { generator = gen() })
    dl.manual_seed(3)
    local lin = nn.Linear(6, 5)
    local plain = dl.relu(dl.linear(x, lin.weight, lin.bias))
    local stock = nn.ReLU.forward
    nn.ReLU.forward = function(_, t) return dl.relu(t) * 2 end
    local ok, y = pcall(function() return nn.Sequential(lin, nn.ReLU())(x) end)
    nn.ReLU.forward = stock
    assert(ok, y)
    assert_same_bits("replaced ReLU forward", y, plain * 2)
    local stock_linear = nn.Linear.forward
    nn.Linear.forward = function(self, t) return dl.linear(t, self.weight, self.bias) - 1 end
    ok, y = pcall(function() return nn.Sequential(lin, nn.ReLU())(x) end)
    nn.Linear.forward = stock_linear
    assert(ok, y)
    assert_same_bits("replaced Linear forward", y, dl.relu(dl.linear(x, lin.weight, lin.bias) - 1))
    local Scaled = nn.Linear:extend("ScaledLinear")
    function Scaled:forward(t) return dl.linear(t, self.weight, self.bias) * 3 end
    dl.manual_seed(3)
    local s = Scaled(6, 5)
    assert_same_bits("subclass", nn.Sequential(s, nn.ReLU())(x), dl.relu(dl.linear(x, s.weight, s.bias) * 3))
    -- and the fused pair leaves the Linear's input as it was
    local before = x:clone()
    nn.Sequential(lin, nn.ReLU())(x)
    assert_same_bits("input untouched", x, before)
  end)
end)
