-- dl.relu_max_pool2d (runtime/ops/pool.c, Note [fused relu max pooling] in
-- runtime/backend/cpu/pool.c) gives, bit for bit, the output and input gradient of dl.relu
-- then dl.max_pool2d: 2x2 windows of every row length (vector and masked tails), odd sizes,
-- overlapping (3x3 stride 2, dilated) windows, ceil_mode; values with ties, negatives only
-- windows, NaN and signed zeros; f32, f64 and bf16; 1 and 2 threads. And nn.Sequential runs
-- a ReLU followed by a MaxPool2d through it (Note [sequential relu pooling]) only when both
-- are the stock modules.
local dl = require "ddplua"
local assert_same_bits = require("close").assert_same_bits
local edge_values = require("edge_values").edge_values
local nn = require "ddplua.nn"

local seed = 1700
local function gen() seed = seed + 1; return dl.Generator(seed) end

-- Values from a small set (ties are frequent, whole windows negative), NaN and -0 sprinkled.
local function values(shape, dtype) return edge_values(shape, dtype, gen, -6, 4, 0.5) end


-- output and input gradient of f(x) for the output gradient g
local function run(f, x, g)
  local xx = x:detach():requires_grad_()
  local y = f(xx)
  y:backward(g)
  return y:detach(), xx.grad
end

describe("relu_max_pool2d", function()
  local threads
  before_each(function() threads = dl.get_num_threads() end)
  after_each(function() dl.set_num_threads(threads) end)

  local cases = {}
  for w = 2, 21 do cases[#cases + 1] = { shape = { 2, 3, 4, w }, k = 2 } end
  for _, c in ipairs {
    { shape = { 3, 4, 28, 28 }, k = 2 }, { shape = { 3, 4, 14, 14 }, k = 2 },
    { shape = { 2, 3, 7, 9 }, k = 2 }, { shape = { 2, 3, 7, 9 }, k = 2, o = { ceil_mode = true } },
    { shape = { 2, 2, 9, 9 }, k = 3, o = { stride = 2, padding = 1 } },
    { shape = { 2, 2, 9, 11 }, k = 2, o = { dilation = 2 } },
    { shape = { 1, 2, 8, 7 }, k = { 2, 3 }, o = { stride = { 1, 2 } } },
  } do cases[#cases + 1] = c end

  it("gives the bits of relu then max_pool2d, forward and backward", function()
    for _, dtype in ipairs { "f32", "f64", "bf16" } do
      for _, c in ipairs(cases) do
        local x = values(c.shape, dtype)
        local g = values(dl.max_pool2d(x, c.k, c.o):size(), dtype)
        local want_y, want_dx = run(function(t) return dl.max_pool2d(dl.relu(t), c.k, c.o) end, x, g)
        for _, t in ipairs { 1, 2 } do
          dl.set_num_threads(t)
          local y, dx = run(function(v) return dl.relu_max_pool2d(v, c.k, c.o) end, x, g)
          local what = ("%s %s threads %d"):format(dtype, table.concat(c.shape, "x"), t)
          assert_same_bits(what .. " forward", y, want_y)
          assert_same_bits(what .. " backward", dx, want_dx)
        end
      end
    end
  end)

  it("is one autograd node, also a tensor method, and refuses return_indices", function()
    local x = values({ 1, 2, 4, 4 }, "f32")
    assert.equal("ReluMaxPool2DWithIndicesBackward", dl.relu_max_pool2d(x:detach():requires_grad_(), 2).grad_fn)
    assert_same_bits("method", x:relu_max_pool2d(2), dl.max_pool2d(dl.relu(x), 2))
    assert.has_error(function() dl.relu_max_pool2d(x, 2, { return_indices = true }) end,
      "relu_max_pool2d: return_indices is not supported")
    assert.has_error(function() dl.relu_max_pool2d(x, 0) end)
  end)
end)

describe("nn.Sequential with ReLU then MaxPool2d", function()
  local function net()
    dl.manual_seed(5)
    return nn.Sequential(nn.Conv2d(1, 4, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(4 * 5 * 7, 3))
  end

  -- output, and the gradients of input and of the first conv's weight, the children run by
  -- hand one after the other (no fusion)
  local function by_hand(m, x)
    local xx = x:detach():requires_grad_()
    local y = xx
    for i = 1, m:len() do y = m[i](y) end
    y:sum():backward()
    return y:detach(), xx.grad, m[1].weight.grad
  end

  local function through(m, x)
    local xx = x:detach():requires_grad_()
    local y = m(xx)
    y:sum():backward()
    return y:detach(), xx.grad, m[1].weight.grad
  end

  it("fuses them with the unfused bits", function()
    local x = dl.randn({ 3, 1, 11, 15 }, { generator = gen() })
    local m1, m2 = net(), net()
    local a = { by_hand(m1, x) }
    local b = { through(m2, x) }
    for i = 1, 3 do assert_same_bits("output/grad " .. i, b[i], a[i]) end
    local probe = m2[2](m2[1](x))
    assert.equal("ReluMaxPool2DWithIndicesBackward", nn.Sequential(m2[1], m2[2], m2[3])(x).grad_fn)
    assert.equal("ReluBackward", probe.grad_fn)
  end)

  it("does not fuse a ReLU whose forward was replaced, a subclass, or a MaxPool2d returning indices", function()
    local x = dl.randn({ 2, 1, 6, 6 }, { generator = gen() })
    local stock = nn.ReLU.forward
    nn.ReLU.forward = function(_, t) return dl.relu(t) * 2 end
    local ok, y = pcall(function() return nn.Sequential(nn.ReLU(), nn.MaxPool2d(2))(x) end)
    nn.ReLU.forward = stock
    assert(ok, y)
    assert_same_bits("replaced forward", y, dl.max_pool2d(dl.relu(x) * 2, 2))
    local out, idx = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2, { return_indices = true }))(x)
    assert_same_bits("return_indices", out, dl.max_pool2d(dl.relu(x), 2))
    local Leaky = nn.ReLU:extend("MyReLU")
    function Leaky:forward(t) return dl.leaky_relu(t, 0.5) end
    assert_same_bits("subclass", nn.Sequential(Leaky(), nn.MaxPool2d(2))(x),
      dl.max_pool2d(dl.leaky_relu(x, 0.5), 2))
  end)
end)
