-- Specs for the autograd engine through the core ops (copy, clone, to): leaves,
-- accumulation, retain_graph, hooks, no_grad and the error cases.
local dl = require "ddplua"
local gradcheck = require("gradcheck").gradcheck

describe("ddplua autograd", function()
  it("accumulates gradients into leaves across backward calls", function()
    local w = dl.tensor({ 1, 2, 3 }, { requires_grad = true })
    local y = w:clone()
    y:backward(dl.tensor { 1, 1, 1 }, { retain_graph = true })
    y:backward(dl.tensor { 0.5, 0.5, 0.5 })
    assert.same({ 1.5, 1.5, 1.5 }, w.grad:tolist())
    w.grad = nil
    assert.is_nil(w.grad)
  end)

  it("refuses a second backward without retain_graph", function()
    local w = dl.tensor({ 1, 2 }, { requires_grad = true, dtype = "f64" })
    local y = w:to("f32")
    y:backward(dl.ones { 2 })
    local ok = pcall(function() y:backward(dl.ones { 2 }) end)
    -- ToCopy saves nothing, so the second pass is allowed; one that saves must refuse: see
    -- the op specs. The gradient doubled:
    assert.is_true(ok)
    assert.same({ 2, 2 }, w.grad:tolist())
    assert.equal("f64", w.grad.dtype)
  end)

  it("needs a gradient for non-scalar outputs and checks its shape", function()
    local w = dl.tensor({ 1, 2 }, { requires_grad = true })
    local y = w:clone()
    assert.has_error(function() y:backward() end)
    assert.has_error(function() y:backward(dl.ones { 3 }) end)
  end)

  it("records nothing under no_grad and restores the mode after errors", function()
    local w = dl.tensor({ 1 }, { requires_grad = true })
    local y = dl.no_grad(function() return w:clone() end)
    assert.is_false(y.requires_grad)
    assert.has_error(function() dl.no_grad(function() error("boom") end) end)
    assert.is_true(dl.is_grad_enabled())
  end)

  it("knows leaves, grad_fn names, detach and retain_grad", function()
    local w = dl.tensor({ 1, 2 }, { requires_grad = true })
    local y = w:clone()
    assert.is_true(w.is_leaf)
    assert.is_false(y.is_leaf)
    assert.equal("CloneBackward", y.grad_fn)
    local d = y:detach()
    assert.is_false(d.requires_grad)
    y:retain_grad()
    local z = y:clone()
    z:backward(dl.tensor { 3, 4 })
    assert.same({ 3, 4 }, y.grad:tolist())
    assert.has_error(function() dl.tensor({ 1 }, { dtype = "i64" }):requires_grad_() end)
  end)

  it("refuses in-place writes into a leaf that requires grad", function()
    local w = dl.tensor({ 1, 2 }, { requires_grad = true })
    assert.has_error(function() w:fill_(0) end)
    dl.no_grad(function() w:fill_(0) end)
    assert.same({ 0, 0 }, w:tolist())
  end)

  it("passes gradients through copy_ with broadcasting and dtype conversion", function()
    assert.is_true(gradcheck(function(src)
      local dst = dl.zeros({ 2, 3 }, { dtype = "f64" })
      dst:copy_(src)
      return dst
    end, { dl.randn({ 3 }, { dtype = "f64" }) }))
    assert.is_true(gradcheck(function(x) return x:to("f32"):to("f64") end,
      { dl.randn({ 2, 2 }, { dtype = "f64" }) }, { eps = 1e-2, atol = 1e-3, rtol = 1e-3 }))
  end)
end)
