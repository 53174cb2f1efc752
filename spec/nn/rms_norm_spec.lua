-- Specs for nn.RMSNorm (lua/ddplua/nn/rms_norm.lua): the formula against an independent
-- computation element by element, eps defaults, gradients by finite differences, the repr.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local gradcheck = require("gradcheck").gradcheck

describe("nn.RMSNorm", function()
  it("normalises by the root mean square of the last dimensions, times the weight", function()
    dl.manual_seed(4)
    local x = dl.randn({ 3, 2, 5 }, { dtype = "f64" })
    local m = nn.RMSNorm({ 2, 5 }, { eps = 1e-6, dtype = "f64" })
    dl.no_grad(function() m.weight:copy_(dl.randn({ 2, 5 }, { dtype = "f64" })) end)
    local y = m(x):tolist()
    local xs, w = x:tolist(), m.weight:tolist()
    for a = 1, 3 do
      local ss = 0
      for b = 1, 2 do for c = 1, 5 do ss = ss + xs[a][b][c] ^ 2 end end
      local r = 1 / math.sqrt(ss / 10 + 1e-6)
      for b = 1, 2 do for c = 1, 5 do
        assert.is_true(math.abs(y[a][b][c] - xs[a][b][c] * r * w[b][c]) < 1e-12)
      end end
    end
    assert.are.equal("RMSNorm((2, 5), eps=1e-06, elementwise_affine=True)", tostring(m))
    assert.are.equal("RMSNorm((4,), eps=None, elementwise_affine=False)",
      tostring(nn.RMSNorm(4, { elementwise_affine = false })))
  end)

  it("has finite-difference gradients for x and the weight (f64)", function()
    dl.manual_seed(5)
    local m = nn.RMSNorm(6, { dtype = "f64" })
    dl.no_grad(function() m.weight:copy_(dl.randn({ 6 }, { dtype = "f64" })) end)
    gradcheck(function(x) return m(x) end, { dl.randn({ 4, 6 }, { dtype = "f64" }) })
    -- the weight's gradient: backward against the same contraction by finite differences
    local x = dl.randn({ 4, 6 }, { dtype = "f64" })
    local r = dl.randn({ 4, 6 }, { dtype = "f64" })
    m.weight.grad = nil
    ;(m(x) * r):sum():backward()
    local g = m.weight.grad:tolist()
    for j = 1, 6 do
      local function loss(delta)
        dl.no_grad(function() m.weight:narrow(1, j, 1):add_(delta) end)
        local l = dl.no_grad(function() return (m(x) * r):sum():item() end)
        dl.no_grad(function() m.weight:narrow(1, j, 1):add_(-delta) end)
        return l
      end
      local num = (loss(1e-6) - loss(-1e-6)) / 2e-6
      assert.is_true(math.abs(num - g[j]) < 1e-6, ("weight %d: %g vs %g"):format(j, num, g[j]))
    end
  end)

  it("raises for a bad shape", function()
    assert.has_error(function() nn.RMSNorm({}) end)
    assert.matches("unknown option", select(2, pcall(nn.RMSNorm, 4, { epsilon = 1 })))
  end)
end)
