-- Specs for tensor hooks (register_hook, register_post_accumulate_grad_hook),
-- dl.autograd.grad / dl.autograd.backward, create_graph, zero_/fill_ on non-leaves and
-- cat's gradient for an empty input. Expected values by hand (PyTorch 1.13 agrees).
local dl = require "ddplua"
local gradcheck = require("gradcheck").gradcheck

local function f64(v, rg) return dl.tensor(v, { dtype = "f64", requires_grad = rg }) end

describe("ddplua autograd hooks", function()
  it("register_hook on a leaf sees the gradient and may replace it before .grad", function()
    local x = f64({ 1, 2 }, true)
    local seen
    local h = x:register_hook(function(g) seen = g:tolist(); return g * 10 end)
    ;(x * x):sum():backward()
    assert.same({ 2, 4 }, seen)
    assert.same({ 20, 40 }, x.grad:tolist())
    h:remove()
    h:remove() -- harmless
    x.grad = nil
    ;(x * x):sum():backward()
    assert.same({ 2, 4 }, x.grad:tolist())
  end)

  it("register_hook on a non-leaf changes what flows on; nil keeps the gradient", function()
    local x = f64({ 1, 2 }, true)
    local y = x * 3
    local calls = 0
    y:register_hook(function() calls = calls + 1 end)
    y:register_hook(function(g) return g * 2 end)
    ;(y * 1):sum():backward()
    assert.equal(1, calls)
    assert.same({ 6, 6 }, x.grad:tolist())
  end)

  it("a hook returning a wrong shape raises; the hook's error surfaces", function()
    local x = f64({ 1, 2 }, true)
    local h = x:register_hook(function() return f64 { 1, 2, 3 } end)
    local ok, err = pcall(function() (x * 1):sum():backward() end)
    assert.is_false(ok)
    assert.matches("hook: the hook returned a gradient of shape %(3,%)", err)
    h:remove()
    x:register_hook(function() error("hook failed") end)
    ok, err = pcall(function() (x * 1):sum():backward() end)
    assert.is_false(ok)
    assert.matches("hook failed", err)
    assert.is_true(dl.is_grad_enabled())
  end)

  it("register_post_accumulate_grad_hook runs once the leaf's .grad is final", function()
    local x = f64({ 1, 2 }, true)
    local seen = {}
    x:register_post_accumulate_grad_hook(function(t) seen[#seen + 1] = t.grad:tolist() end)
    local y = x * 2
    ;(y + y * x):sum():backward() -- two paths into x: one call, after both (2 + 4x)
    assert.same({ { 6, 10 } }, seen)
    assert.has_error(function() (x * 1):register_post_accumulate_grad_hook(function() end) end)
    assert.has_error(function() f64({ 1 }):register_hook(function() end) end)
  end)

  it("bounds backward started from inside a hook (endless reentrance), and recovers", function()
    local x = f64({ 1, 2 }, true)
    local h = x:register_hook(function() -- hooks run with grad mode off, as in PyTorch
      dl.enable_grad(function() (x * 1):sum():backward() end) -- fires this hook again
    end)
    local ok, err = pcall(function() (x * 2):sum():backward() end)
    assert.is_false(ok)
    assert.matches("backward walks are open on this thread", err)
    h:remove()
    x.grad = nil
    ;(x * 2):sum():backward()
    assert.same({ 2, 2 }, x.grad:tolist())
  end)

  -- Note [reentrant backward] in runtime/autograd/engine.c, checked the way PyTorch's
  -- reentrant checkpoint uses it: a Function whose forward runs without grad and whose
  -- backward recomputes the segment with grad and walks it.
  local function checkpoint_fn() return require("reentrant_checkpoint")("Ckpt") end

  it("runs a backward inside a Function's backward (reentrant checkpoint): same gradients", function()
    local Ckpt = checkpoint_fn()
    local w, v = f64({ 0.5, -1.5 }, true), f64({ 2, 3 }, true)
    local x = f64({ 1, 2 }, true)
    local posts = {}
    w:register_post_accumulate_grad_hook(function(t) posts[#posts + 1] = t.grad:tolist() end)
    local seg = function(t) return (t * w):tanh() * w end -- w used twice inside the segment
    local loss = (Ckpt.apply(seg, x * v) * w):sum() -- and once outside it
    loss:backward()
    local gw, gv, gx = w.grad:tolist(), v.grad:tolist(), x.grad:tolist()
    -- one post-accumulate call per walk that reaches w: the outer one (for the use outside
    -- the segment) and the inner one, as PyTorch's AccumulateGrad per graph task
    assert.equal(2, #posts)
    for _, t in ipairs { w, v, x } do t.grad = nil end
    ;((seg(x * v)) * w):sum():backward()
    local ref = { w.grad:tolist(), v.grad:tolist(), x.grad:tolist() }
    for k, got in ipairs { gw, gv, gx } do
      for i = 1, 2 do assert.is_true(math.abs(got[i] - ref[k][i]) < 1e-12) end
    end
  end)

  it("refuses a reentrant backward that reaches the outer backward's graph", function()
    local x = f64({ 1, 2 }, true)
    local y = x * 3
    local Bad = dl.autograd.Function:extend("Bad")
    function Bad.forward(ctx, t) return t * 2 end
    function Bad.backward(ctx, g)
      dl.enable_grad(function() y:sum():backward(nil, { retain_graph = true }) end)
      return g * 2
    end
    local ok, err = pcall(function() Bad.apply(y):sum():backward(nil, { retain_graph = true }) end)
    assert.is_false(ok)
    assert.matches("a node of the graph the outer backward is walking", err)
    x.grad = nil
    ;(x * 2):sum():backward()
    assert.same({ 2, 2 }, x.grad:tolist())
  end)

  it("lets hooks of freed tensors go", function()
    local engine = require "ddplua.autograd.engine"
    for _ = 1, 3 do
      local x = f64({ 1 }, true)
      x:register_hook(function() end)
    end
    collectgarbage("collect")
    collectgarbage("collect")
    engine.forget_dropped() -- no error; the ids of the freed tensors' hooks are taken
  end)
end)

describe("ddplua.autograd.grad", function()
  it("gives first-order gradients without touching .grad", function()
    local x, w = f64({ 1, 2 }, true), f64({ 3, 4 }, true)
    local y = (x * w):sum()
    local gx, gw = unpack(dl.autograd.grad(y, { x, w }))
    assert.same({ 3, 4 }, gx:tolist())
    assert.same({ 1, 2 }, gw:tolist())
    assert.is_nil(x.grad)
    assert.is_nil(w.grad)
  end)

  it("takes several outputs, grad_outputs and non-leaf inputs", function()
    local x = f64({ 1, 2 }, true)
    local h = x * x
    local a, b = h * 2, h:sum()
    local g = dl.autograd.grad({ a, b }, { h, x }, { f64 { 1, 10 }, nil })
    assert.same({ 3, 21 }, g[1]:tolist())     -- 2 * {1, 10} + 1
    assert.same({ 6, 84 }, g[2]:tolist())     -- 2x * that
    assert.is_nil(x.grad)
  end)

  it("matches finite differences", function()
    local x0 = dl.randn({ 2, 3 }, { dtype = "f64" })
    local x = x0:clone():requires_grad_()
    local g = dl.autograd.grad((x:tanh() * x):sum(), x)[1]
    x0.requires_grad = true
    ;(x0:tanh() * x0):sum():backward()
    assert.same(x0.grad:tolist(), g:tolist())
    assert.is_true(gradcheck(function(v) return v:tanh() * v end, { dl.randn({ 2, 3 }, { dtype = "f64" }) }))
  end)

  it("refuses unused inputs unless allow_unused, and inputs that need no grad", function()
    local x, z = f64({ 1 }, true), f64({ 2 }, true)
    local ok, err = pcall(dl.autograd.grad, (x * 2):sum(), { x, z }, nil, { retain_graph = true })
    assert.is_false(ok)
    assert.matches("input 2 was not used in the graph", err)
    local g = dl.autograd.grad((x * 2):sum(), { x, z }, nil, { allow_unused = true })
    assert.same({ 2 }, g[1]:tolist())
    assert.is_nil(g[2])
    assert.has_error(function() dl.autograd.grad((x * 2):sum(), f64 { 1 }) end)
  end)

  it("runs tensor hooks but not post-accumulate hooks", function()
    local x = f64({ 1 }, true)
    local post = false
    x:register_post_accumulate_grad_hook(function() post = true end)
    x:register_hook(function(g) return g * 5 end)
    assert.same({ 10 }, dl.autograd.grad((x * 2):sum(), x)[1]:tolist())
    assert.is_false(post)
  end)
end)

describe("ddplua autograd create_graph", function()
  it("raises a clear error instead of ignoring it", function()
    local x = f64({ 1 }, true)
    local y = (x * x):sum()
    local ok, err = pcall(function() y:backward(nil, { create_graph = true }) end)
    assert.is_false(ok)
    assert.matches("backward: create_graph = true is not supported", err)
    ok, err = pcall(dl.autograd.grad, y, x, nil, { create_graph = true })
    assert.is_false(ok)
    assert.matches("autograd.grad: create_graph = true is not supported", err)
    assert.has_error(function() y:backward(nil, { retain_grpah = true }) end) -- misspelt option
    y:backward() -- the graph is intact
    assert.same({ 2 }, x.grad:tolist())
  end)
end)

describe("ddplua autograd in-place fills and cat", function()
  it("zero_ and fill_ on a non-leaf keep its history", function()
    local x = f64({ 1, 2 }, true)
    local y = x * 3
    y:zero_()
    assert.is_true(y.requires_grad)
    assert.equal("FillBackward", y.grad_fn)
    ;(y + x * 2):sum():backward()
    assert.same({ 2, 2 }, x.grad:tolist())
    local z = x * 1
    z:narrow(1, 1, 1):fill_(7) -- through a view: the filled element has no gradient
    x.grad = nil
    ;(z * z):sum():backward()
    assert.same({ 0, 4 }, x.grad:tolist())
  end)

  it("zero_ on a non-leaf gives its leaves a zero gradient, as PyTorch", function()
    local x = f64({ 1, 2 }, true)
    local y = x * 3
    y:zero_()
    y:sum():backward()
    assert.same({ 0, 0 }, x.grad:tolist())
  end)

  it("cat gives an empty input a zero gradient", function()
    local a, e = f64({ 1, 2 }, true), dl.zeros({ 0 }, { dtype = "f64", requires_grad = true })
    local b = dl.zeros({ 2, 0 }, { dtype = "f64", requires_grad = true })
    dl.cat({ a, e }, 1):sum():backward()
    assert.same({ 1, 1 }, a.grad:tolist())
    assert.is_not_nil(e.grad)
    assert.same({ 0 }, e.grad:size())
    local m = f64({ { 1 }, { 2 } }, true)
    dl.cat({ m, b }, 2):sum():backward()
    assert.same({ 2, 0 }, b.grad:size())
  end)
end)
