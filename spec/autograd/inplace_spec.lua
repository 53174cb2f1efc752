-- Specs for in-place writes under autograd (Note [in-place on views] in
-- runtime/tape/view_history.c): version counters, views that know their base, in-place
-- ops on views rewriting the base's history (PyTorch's CopySlices), the leaf rules, and the
-- saved-tensor check of every op that saves. Expected values are PyTorch 1.13's in f64,
-- worked out by hand in the comments (d/dx of sum(y*y) is 2*y*dy/dx).
local dl = require "ddplua"
local gradcheck = require("gradcheck").gradcheck

local function f64(v, requires_grad) return dl.tensor(v, { dtype = "f64", requires_grad = requires_grad }) end
local function flat(t) return t:reshape(-1):tolist() end

describe("ddplua autograd in-place", function()
  it("an in-place op on a view of a non-leaf reaches the base's history (the issue's case)", function()
    local x = f64({ 1, 2, 3, 4 }, true)
    local y = x * 1.0
    y:narrow(1, 2, 2):mul_(3)
    ;(y * y):sum():backward()
    -- y = {1, 6, 9, 4}; dy/dx = {1, 3, 3, 1}: x.grad = 2*y*dy/dx
    assert.same({ 2, 36, 54, 8 }, x.grad:tolist())
    assert.equal("CopySlices", y.grad_fn)
  end)

  it("add_ of another tensor into a view gives that tensor its gradient", function()
    local x, z = f64({ 1, 2, 3, 4 }, true), f64({ 5 }, true)
    local b = x * 1.0
    b:narrow(1, 1, 1):add_(z)
    ;(b * b):sum():backward()
    -- b = {6, 2, 3, 4}: x.grad = 2b, z.grad = 2*b[1]
    assert.same({ 12, 4, 6, 8 }, x.grad:tolist())
    assert.same({ 12 }, z.grad:tolist())
  end)

  it("a base that needs no grad takes a history from an in-place op on its view", function()
    local z = f64({ 5 }, true)
    local b = f64({ 1, 2, 3, 4 })
    b:narrow(1, 1, 1):add_(z)
    assert.is_true(b.requires_grad)
    assert.equal("CopySlices", b.grad_fn)
    ;(b * b):sum():backward()
    assert.same({ 12 }, z.grad:tolist())
  end)

  it("copy_ into a row: the source gets the row's gradient, the overwritten row none", function()
    local x, z = f64({ { 1, 2 }, { 3, 4 } }, true), f64({ 7, 8 }, true)
    local y = x * 1.0
    y:select(1, 2):copy_(z)
    ;(y * y):sum():backward()
    assert.same({ 2, 4, 0, 0 }, flat(x.grad))
    assert.same({ 14, 16 }, z.grad:tolist())
  end)

  it("relu_ on a transposed view keeps the relu mask", function()
    local x = f64({ { 1, -2 }, { -3, 4 } }, true)
    local y = x * 1.0
    y:t():relu_()
    ;(y * y):sum():backward()
    assert.same({ 2, 0, 0, 8 }, flat(x.grad))
  end)

  it("mul_ on view(-1) keeps the factor", function()
    local x = f64({ { 1, -2 }, { -3, 4 } }, true)
    local y = x * 1.0
    y:view(-1):mul_(2)
    ;(y * y):sum():backward()
    -- y = 2x: d/dx sum(4x^2) = 8x
    assert.same({ 8, -16, -24, 32 }, flat(x.grad))
  end)

  it("a view made before its base was written in place sees the new history", function()
    local x = f64({ 1, 2, 3, 4 }, true)
    local y = x * 1.0
    local v = y:narrow(1, 2, 2)
    y:mul_(2)
    ;(v * v):sum():backward()
    -- v = 2*x[2:3]: d/dx sum(4x^2) = 8x there, 0 elsewhere
    assert.same({ 0, 16, 24, 0 }, x.grad:tolist())
    assert.equal("AsStridedBackward", v.grad_fn)
  end)

  it("writes through two views of one base compose", function()
    local x = f64({ 1, 2, 3, 4 }, true)
    local y = x * 1.0
    local a, b = y:narrow(1, 1, 2), y:narrow(1, 2, 2)
    a:mul_(2) -- y = {2, 4, 3, 4}
    b:mul_(3) -- y = {2, 12, 9, 4}
    ;(y * y):sum():backward()
    -- dy/dx = {2, 6, 3, 1}
    assert.same({ 8, 144, 54, 8 }, x.grad:tolist())
  end)

  it("passes a finite-difference check through in-place ops on views", function()
    gradcheck(function(x, z)
      local y = x * 1.0
      y:narrow(2, 2, 2):mul_(z)
      y:select(1, 1):pow_(2) -- saves the row's old values (a copy), not the storage
      y:t():narrow(1, 1, 1):add_(1)
      return y * y
    end, { dl.randn({ 3, 3 }, { dtype = "f64" }), dl.randn({ 3, 2 }, { dtype = "f64" }) })
  end)

  it("refuses in-place writes into a leaf that requires grad, and into its views", function()
    local w = f64({ 1, 2 }, true)
    local cases = {
      mul_ = function(t) t:mul_(2) end,
      add_ = function(t) t:add_(f64 { 1, 1 }:narrow(1, 1, t:size(1))) end,
      relu_ = function(t) t:relu_() end,
      copy_ = function(t) t:copy_(f64 { 3, 4 }:narrow(1, 1, t:size(1))) end,
      fill_ = function(t) t:fill_(1) end,
      zero_ = function(t) t:zero_() end,
    }
    for name, write in pairs(cases) do
      local ok, err = pcall(write, w)
      assert.is_false(ok, name)
      assert.matches("a leaf Variable that requires grad is being used in an in%-place operation%.", err)
      ok, err = pcall(write, w:narrow(1, 1, 1))
      assert.is_false(ok, name)
      assert.matches("a view of a leaf Variable that requires grad is being used in an in%-place "
        .. "operation%.", err)
    end
    dl.no_grad(function() w:narrow(1, 1, 1):mul_(3) end) -- allowed off grad mode
    assert.same({ 3, 2 }, w:tolist())
  end)

  it("frees everything in-place writes through views allocate, forward and backward", function()
    local function work()
      local x, z = dl.randn({ 4, 4 }, { dtype = "f64", requires_grad = true }), dl.randn({ 4 }, { dtype = "f64", requires_grad = true })
      local y = x * 1.0
      local stale = y:narrow(1, 2, 2)
      y:select(1, 1):copy_(z)
      y:view(-1):narrow(1, 3, 5):mul_(2)
      y:t():narrow(1, 2, 1):relu_() -- last: relu_ saves what it wrote
      ;(y:sum() + stale:sum()):backward()
      local b = dl.zeros { 4 }
      b:narrow(1, 1, 2):add_(z:narrow(1, 1, 2))
      b:sum():backward()
      assert.is_truthy(x.grad and z.grad)
    end
    work()
    collectgarbage("collect")
    collectgarbage("collect")
    local before = dl.memory_stats().live
    for _ = 1, 5 do work() end
    collectgarbage("collect")
    collectgarbage("collect")
    assert.equal(before, dl.memory_stats().live)
  end)

  it("counts versions on the storage, shared by views and detached aliases", function()
    local y = f64({ 1, 2, 3 })
    local v, d = y:narrow(1, 1, 2), y:detach()
    local v0 = y._version
    v:add_(1)
    d:mul_(2)
    assert.equal(v0 + 2, y._version)
    assert.equal(y._version, v._version)
  end)

  -- Every op that saves a tensor for its gradient, the saved tensor then written in place:
  -- backward must refuse, naming the op's node.
  local saving = {
    { "MulBackward", function(a, b) return a * b end },
    { "DivBackward", function(a, b) return a / b end },
    { "PowBackward", function(a) return a:pow(2) end },
    { "ExpBackward", function(a) return a:exp() end },
    { "LogBackward", function(a) return a:log() end },
    { "SqrtBackward", function(a) return a:sqrt() end },
    { "TanhBackward", function(a) return a:tanh() end },
    { "SigmoidBackward", function(a) return a:sigmoid() end },
    { "ReluBackward", function(a) return a:relu() end },
    { "GeluBackward", function(a) return a:gelu() end },
    { "MmBackward", function(a, b) return a:matmul(b:t()) end },
    { "SoftmaxBackward", function(a) return a:softmax(2) end },
    { "LogSoftmaxBackward", function(a) return a:log_softmax(2) end },
    { "MaximumBackward", function(a, b) return dl.maximum(a, b) end },
    { "NormBackward", function(a) return a:norm() end },
    { "VarBackward", function(a) return a:var() end },
    { "MseLossBackward", function(a, b) return dl.mse_loss(a, b) end },
    { "MinimumBackward", function(a, b) return dl.minimum(a, b) end },
    { "AbsBackward", function(a) return a:abs() end },
    { "ClampBackward", function(a) return a:clamp(0.2, 0.8) end },
    { "LeakyReluBackward", function(a) return a:leaky_relu(0.1) end },
    { "SiluBackward", function(a) return a:silu() end },
    { "RsqrtBackward", function(a) return a:rsqrt() end },
    { "StdBackward", function(a) return a:std() end },
    { "AmaxBackward", function(a) return a:max() end },
    { "LinearBackward", function(a, b) return dl.linear(a, b) end },
    { "LayerNormBackward", function(a, b) return dl.layer_norm(a, { 3 }, b:select(1, 1), b:select(1, 2)) end },
    { "ConvolutionBackward", function(a, b) return dl.conv2d(a:view(1, 1, 2, 3), b:view(1, 1, 2, 3)) end },
    { "CrossEntropyBackward", function(a) return dl.cross_entropy(a, dl.tensor({ 0, 2 }, { dtype = "i64" })) end },
    { "NllLossBackward", function(a) return dl.nll_loss(a, dl.tensor({ 0, 2 }, { dtype = "i64" })) end },
  }
  for _, case in ipairs(saving) do
    local node, op = case[1], case[2]
    it("refuses a backward through " .. node .. " after a saved tensor was written in place", function()
      local x = dl.rand({ 2, 3 }, { dtype = "f64", requires_grad = true })
      local a, b = x * 1.0, x + 1.0
      local out = op(a, b)
      local y = out:sum()
      a:add_(1)
      b:add_(1)
      out:mul_(1)
      local ok, err = pcall(function() y:backward() end)
      assert.is_false(ok)
      assert.matches("modified by an in%-place operation", err)
      assert.matches(node, err, 1, true)
      assert.is_true(dl.is_grad_enabled()) -- the failed walk was ended
    end)
  end
end)
