-- Specs for dl.autograd.Function (ddplua.autograd.function): custom ops defined in Lua,
-- run by the Lua driver of the backward walk (Note [Lua in backward]).
local dl = require "ddplua"
local lib = require "ddplua.lib"
local gradcheck = require("gradcheck").gradcheck

local function f64(v, rg) return dl.tensor(v, { dtype = "f64", requires_grad = rg }) end

-- y = x * exp(w) + a (a a number), saving the output and an input
local Scaled = dl.autograd.Function:extend("Scaled")
function Scaled.forward(ctx, x, w, a)
  local e = w:exp()
  ctx:save_for_backward(x, e)
  ctx.a = a
  return x * e + a
end
function Scaled.backward(ctx, g)
  local x, e = ctx.saved_tensors[1], ctx.saved_tensors[2]
  local gx = ctx.needs_input_grad[1] and g * e or nil
  local gw = ctx.needs_input_grad[2] and g * x * e or nil -- summed back to w's shape
  return gx, gw, nil
end

describe("ddplua.autograd.Function", function()
  it("passes a finite-difference check (two tensor inputs, a number, broadcasting)", function()
    assert.is_true(gradcheck(function(x, w) return Scaled.apply(x, w, 3.5) end,
      { dl.randn({ 4, 3 }, { dtype = "f64" }), dl.randn({ 3 }, { dtype = "f64" }) }))
  end)

  it("composes with built-in ops before and after it (finite differences)", function()
    local Cube = dl.autograd.Function:extend("Cube")
    function Cube.forward(ctx, x) ctx:save_for_backward(x); return x * x * x end
    function Cube.backward(ctx, g) local x = ctx.saved_tensors[1]; return g * x * x * 3 end
    assert.is_true(gradcheck(function(x) return Cube.apply(x:sigmoid() * 2):log_softmax(2) end,
      { dl.randn({ 3, 4 }, { dtype = "f64" }) }))
  end)

  it("names its node and fills .grad of leaves as PyTorch", function()
    local x, w = f64({ 1, 2 }, true), f64({ 0 }, true)
    local y = Scaled.apply(x, w, 1)
    assert.equal("ScaledBackward", y.grad_fn)
    y:sum():backward()
    assert.same({ 1, 1 }, x.grad:tolist())
    assert.same({ 3 }, w.grad:tolist()) -- sum(x * e^0)
  end)

  it("records nothing under no_grad or when no input requires grad", function()
    local x = f64({ 1, 2 })
    assert.is_false(Scaled.apply(x, f64 { 0 }, 0).requires_grad)
    local xr = f64({ 1, 2 }, true)
    local y = dl.no_grad(function() return Scaled.apply(xr, f64 { 0 }, 0) end)
    assert.is_false(y.requires_grad)
  end)

  it("marks outputs non-differentiable and passes zeros for them to backward", function()
    local Sort = dl.autograd.Function:extend("Double")
    local seen
    function Sort.forward(ctx, x)
      local idx = dl.tensor({ 1, 0 }, { dtype = "f64" })
      ctx:mark_non_differentiable(idx)
      return x * 2, idx
    end
    function Sort.backward(ctx, g, gidx)
      seen = gidx
      return g * 2
    end
    local x = f64({ 1, 2 }, true)
    local y, idx = Sort.apply(x)
    assert.is_false(idx.requires_grad)
    y:sum():backward()
    assert.same({ 2, 2 }, x.grad:tolist())
    assert.same({ 0, 0 }, seen:tolist())
  end)

  it("refuses a backward after a saved tensor was modified in place, naming the Function", function()
    local x = f64({ 1, 2 }, true)
    local h = x * 1
    local y = Scaled.apply(h, f64({ 0 }, true), 0)
    h:mul_(2)
    local ok, err = pcall(function() y:sum():backward() end)
    assert.is_false(ok)
    assert.matches("ScaledBackward: a tensor of shape %(2,%) saved for the gradient was modified by an in%-place operation", err)
  end)

  it("frees its saved tensors after backward and refuses a second one without retain_graph", function()
    local x = f64({ 1, 2 }, true)
    local y = Scaled.apply(x, f64({ 0 }, true), 0):sum()
    y:backward(nil, { retain_graph = true })
    y:backward()
    assert.same({ 2, 2 }, x.grad:tolist())
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("ScaledBackward: trying to backward through the graph a second time", err)
  end)

  it("reports errors of backward at the caller's line and leaves grad mode on", function()
    local Bad = dl.autograd.Function:extend("Bad")
    function Bad.forward(ctx, x) return x * 1 end
    function Bad.backward(ctx, g) error("bad backward") end
    local Shape = dl.autograd.Function:extend("Shape")
    function Shape.forward(ctx, x) return x * 1 end
    function Shape.backward(ctx, g) return dl.ones({ 5 }, { dtype = "f64" }) end -- (2,) does not broadcast to it
    local x = f64({ 1, 2 }, true)
    local ok, err = pcall(function() Bad.apply(x):sum():backward() end)
    assert.is_false(ok)
    assert.matches("bad backward", err)
    assert.is_true(dl.is_grad_enabled())
    ok, err = pcall(function() Shape.apply(x):sum():backward() end)
    assert.is_false(ok)
    assert.matches("ShapeBackward: backward returned a gradient of shape %(5,%) for input 1 of shape %(2,%)", err)
    -- the walk was abandoned cleanly: the next backward works
    ;(x * 3):sum():backward()
    assert.same({ 3, 3 }, x.grad:tolist())
  end)

  it("refuses more than one differentiable output", function()
    local Two = dl.autograd.Function:extend("Two")
    function Two.forward(ctx, x) return x * 1, x * 2 end
    function Two.backward(ctx, g1, g2) return g1 end
    local ok, err = pcall(Two.apply, f64({ 1 }, true))
    assert.is_false(ok)
    assert.matches("more than one differentiable tensor", err)
  end)

  it("cannot be run by the C-only ddp_backward, which says why", function()
    local y = Scaled.apply(f64({ 1 }, true), f64({ 0 }, true), 0)
    local status = lib.C.ddp_backward(y, nil, 0)
    assert.is_not.equal(0, status)
    assert.matches("a Function defined by the front end", lib.ffi.string(lib.C.ddp_last_error()))
    assert.is_true(dl.is_grad_enabled())
  end)

  it("frees what it holds once its graph is gone", function()
    local function work()
      local x = dl.randn({ 64 }, { dtype = "f64", requires_grad = true })
      Scaled.apply(x, dl.randn({ 1 }, { dtype = "f64", requires_grad = true }), 1):sum():backward()
      Scaled.apply(x, dl.randn({ 1 }, { dtype = "f64" }), 1) -- never back-propagated
    end
    work()
    collectgarbage("collect")
    collectgarbage("collect")
    local before = dl.memory_stats().live
    for _ = 1, 5 do work() end
    collectgarbage("collect")
    collectgarbage("collect")
    -- records of freed nodes are let go at the next walk or apply: none piles up
    assert.is_true(dl.memory_stats().live <= before)
  end)
end)
