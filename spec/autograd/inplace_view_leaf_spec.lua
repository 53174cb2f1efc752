-- In-place ops on a view of a leaf that is itself a view (issue 23, item 5; Note [in-place
-- on a view of a leaf] in runtime/tape/view_history.c): t = zeros(2, 2); x = t:view(4);
-- x.requires_grad = true makes x a leaf that requires grad while its base t does not, and
-- x:narrow(1, 1, 2):mul_(2) used to go through. PyTorch 1.13 raises "a view of a leaf
-- Variable that requires grad is being used in an in-place operation." for it, for
-- x:mul_(2) itself and for any other view of x.
local dl = require "ddplua"

local VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation."
local LEAF = "a leaf Variable that requires grad is being used in an in-place operation."

local function raises(text, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "accepted; expected: " .. text)
  assert.matches(text, tostring(err), 1, true)
end

-- A leaf that requires grad and is a view of a plain tensor.
local function leaf_view()
  local t = dl.zeros { 2, 2 }
  local x = t:view { 4 }
  x.requires_grad = true
  assert.is_true(x.is_leaf)
  return x, t
end

describe("ddplua autograd in-place on a view of a leaf", function()
  it("refuses in-place ops through a leaf that is a view (the issue's case)", function()
    local x = leaf_view()
    raises("mul_: " .. VIEW_OF_LEAF, function() x:narrow(1, 1, 2):mul_(2) end)
    raises("mul_: " .. VIEW_OF_LEAF, function() x:mul_(2) end)
    raises("fill_: " .. VIEW_OF_LEAF, function() x:select(1, 3):fill_(1) end)
    raises("copy_: " .. VIEW_OF_LEAF, function() x:view(2, 2):copy_(dl.ones { 2, 2 }) end)
    raises(VIEW_OF_LEAF, function() x[{ 2 }] = 5 end)
    assert.same({ 0, 0, 0, 0 }, x:tolist()) -- nothing was written
  end)

  it("allows them under no_grad, as PyTorch does", function()
    local x, t = leaf_view()
    dl.no_grad(function() x:narrow(1, 1, 2):mul_(2):add_(1) end)
    assert.same({ 1, 1, 0, 0 }, x:tolist())
    assert.same({ { 1, 1 }, { 0, 0 } }, t:tolist())
  end)

  it("keeps the plain leaf and leaf-base cases and the views that need no grad", function()
    local a = dl.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    raises("mul_: " .. LEAF, function() a:mul_(2) end)
    raises("mul_: " .. VIEW_OF_LEAF, function() a:narrow(1, 2, 2):mul_(2) end)
    -- a view of a tensor that requires no grad, written with one that does: allowed, and
    -- the base takes the history
    local b, z = dl.zeros { 4 }, dl.tensor({ 3 }, { requires_grad = true })
    b:view(2, 2):select(1, 2):narrow(1, 1, 1):add_(z)
    assert.is_true(b.requires_grad)
    ;(b * b):sum():backward()
    assert.same({ 6 }, z.grad:tolist())
  end)
end)
