-- Writing elements and slices of a tensor that requires grad (issue 23, item 4): y[{2, 3}] = 5
-- on a non-leaf y was a raw write autograd never saw, so the overwritten element still
-- passed its gradient back (x.grad 2 everywhere for y = 2x; PyTorch gives 0 there). Now an
-- element write is fill_ of the element's select view and y[{i}] = v fills or copies into
-- the row's view, both recorded as in-place ops on views (Note [in-place on views]).
-- Gradients are checked against central finite differences (spec/helpers/gradcheck.lua).
local dl = require "ddplua"
local gradcheck = require("gradcheck").gradcheck

local function f64(v, requires_grad) return dl.tensor(v, { dtype = "f64", requires_grad = requires_grad }) end

-- x = 1..12 as (3, 4), f64, requiring grad.
local function x34()
  local x = dl.arange(1, 13, { dtype = "f64" }):view(3, 4):detach()
  x.requires_grad = true
  return x
end

-- The gradient of sum(2x) with the elements where `overwritten(i, j)` is true replaced.
local function expected_grad(overwritten)
  local g = {}
  for i = 1, 3 do
    g[i] = {}
    for j = 1, 4 do g[i][j] = overwritten(i, j) and 0 or 2 end
  end
  return g
end

describe("ddplua autograd element and slice assignment", function()
  it("an overwritten element of a non-leaf gets no gradient (the issue's case)", function()
    local x = x34()
    local y = x * 2
    y[{ 2, 3 }] = 5
    assert.equal(5, y[{ 2, 3 }])
    assert.equal("CopySlices", y.grad_fn)
    y:sum():backward()
    assert.same(expected_grad(function(i, j) return i == 2 and j == 3 end), x.grad:tolist())
    -- t:set is the same write, negative indices too
    local x2 = x34()
    local y2 = x2 * 2
    y2:set(-1, -1, 0)
    y2:sum():backward()
    assert.same(expected_grad(function(i, j) return i == 3 and j == 4 end), x2.grad:tolist())
  end)

  it("element writes agree with finite differences", function()
    gradcheck(function(x)
      local y = x * x
      y[{ 2, 3 }] = 5
      y[{ 1, -1 }] = -1
      return y * x
    end, { dl.randn({ 3, 4 }, { dtype = "f64", generator = dl.Generator(7) }) })
  end)

  it("y[{i}] = number fills row i, y[{i}] = tensor copies into it", function()
    local x = x34()
    local y = x * 2
    y[{ 2 }] = 0
    assert.same({ 0, 0, 0, 0 }, y[{ 2 }]:tolist())
    y:sum():backward()
    assert.same(expected_grad(function(i) return i == 2 end), x.grad:tolist())

    local a, src = x34(), f64({ 10, 20, 30, 40 }, true)
    local b = a * 2
    b[{ -1 }] = src
    assert.same({ 10, 20, 30, 40 }, b[{ 3 }]:tolist())
    ;(b * b):sum():backward()
    assert.same({ 20, 40, 60, 80 }, src.grad:tolist()) -- 2 * src
    assert.same({ 8, 16, 24, 32 }, a.grad[{ 1 }]:tolist()) -- 2 * b * 2 = 8a on kept rows
    assert.same({ 0, 0, 0, 0 }, a.grad[{ 3 }]:tolist())

    gradcheck(function(x, s)
      local y = x * x
      y[{ 2 }] = s
      y[{ 3 }] = 1.5
      return y * x
    end, { dl.randn({ 3, 4 }, { dtype = "f64", generator = dl.Generator(8) }),
      dl.randn({ 4 }, { dtype = "f64", generator = dl.Generator(9) }) })
  end)

  it("narrow():copy_ and fill_ of a view agree with finite differences", function()
    gradcheck(function(x, s)
      local y = x * x
      y:narrow(2, 2, 2):copy_(s)
      y:select(1, 1):narrow(1, 1, 2):fill_(3)
      return y * x
    end, { dl.randn({ 3, 4 }, { dtype = "f64", generator = dl.Generator(10) }),
      dl.randn({ 3, 2 }, { dtype = "f64", generator = dl.Generator(11) }) })
  end)

  it("writing an element of a leaf that requires grad raises PyTorch's message", function()
    local x = x34()
    local ok, err = pcall(function() x[{ 1, 1 }] = 0 end)
    assert.is_false(ok)
    assert.matches("a view of a leaf Variable that requires grad is being used in an in-place operation.",
      err, 1, true)
    assert.equal(1, x[{ 1, 1 }])
    -- under no_grad it is a plain write, as for PyTorch's torch.no_grad()
    dl.no_grad(function() x[{ 1, 1 }] = 7 end)
    assert.equal(7, x[{ 1, 1 }])
    -- a tensor autograd does not record takes plain writes, indices checked as before
    local t = dl.zeros { 2, 2 }
    t[{ 2, 1 }] = 4
    assert.equal(4, t:get(2, 1))
    assert.has_error(function() t[{ 3, 1 }] = 1 end)
  end)
end)
