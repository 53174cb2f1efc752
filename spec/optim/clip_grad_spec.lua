-- Specs for ddplua.optim.clip_grad: clip_grad_norm_ (total norm and scaling) and
-- clip_grad_value_ against values worked out by hand here.
local dl = require "ddplua"
local optim = require "ddplua.optim"
local views = require "views"

local function leaf(list, grad, dtype)
  local p = dl.tensor(list, { dtype = dtype or "f64", requires_grad = true })
  if grad then p.grad = dl.tensor(grad, { dtype = dtype or "f64" }) end
  return p
end

local function close_list(a, e, tol, what)
  for i = 1, #e do
    if not (math.abs(a[i] - e[i]) <= tol * (1 + math.abs(e[i]))) then
      error(("%s %d: %.12g, expected %.12g"):format(what, i, a[i], e[i]), 2)
    end
  end
end

describe("ddplua.optim.clip_grad", function()
  it("clip_grad_norm_: 2-norm over all gradients and scaling by max_norm / (total + 1e-6)", function()
    local a = leaf({ 0, 0 }, { 3, 4 })        -- |a| = 5
    local b = leaf({ 0, 0, 0 }, { 12, 0, 0 }) -- |b| = 12
    local c = leaf({ 0 })                      -- no grad: skipped
    local total = optim.clip_grad_norm_({ a, b, c }, 2.6)
    assert.are.equal(13, total)
    local coef = 2.6 / (13 + 1e-6)
    close_list(a.grad:tolist(), { 3 * coef, 4 * coef }, 1e-14, "a")
    close_list(b.grad:tolist(), { 12 * coef, 0, 0 }, 1e-14, "b")
    assert.is_nil(c.grad)
  end)

  it("leaves gradients when the total is below max_norm", function()
    local a = leaf({ 0, 0 }, { 3, 4 })
    assert.are.equal(5, optim.clip_grad_norm_(a, 10))
    assert.are.same({ 3, 4 }, a.grad:tolist())
  end)

  it("inf and 1 norms, f32 and a non-contiguous gradient", function()
    local a = leaf({ 0, 0 }, { -7, 2 }, "f32")
    local b = leaf({ 0 }, { 5 }, "f32")
    assert.are.equal(7, optim.clip_grad_norm_({ a, b }, 100, { norm_type = math.huge }))
    assert.are.equal(7, optim.clip_grad_norm_({ a, b }, 100, { norm_type = "inf" }))
    assert.are.equal(14, optim.clip_grad_norm_({ a, b }, 100, { norm_type = 1 }))
    close_list({ optim.clip_grad_norm_({ a, b }, 100, { norm_type = 3 }) }, { (343 + 8 + 125) ^ (1 / 3) }, 1e-12, "p=3")
    local total = optim.clip_grad_norm_({ a, b }, 3.5, { norm_type = math.huge })
    assert.are.equal(7, total)
    close_list(a.grad:tolist(), { -7 * 3.5 / (7 + 1e-6), 2 * 3.5 / (7 + 1e-6) }, 1e-6, "a scaled")

    local p = dl.tensor({ { 0, 0, 0 }, { 0, 0, 0 } }, { dtype = "f64", requires_grad = true })
    local g = views.transposed(dl.tensor({ { 1, 2 }, { 2, 4 }, { 0, 0 } }, { dtype = "f64" })) -- (2, 3) view
    assert.is_false(g:is_contiguous())
    p.grad = g
    local stored = p.grad
    assert.are.equal(5, optim.clip_grad_norm_({ p }, 1))
    local s = 1 / (5 + 1e-6)
    close_list(stored:tolist()[1], { 1 * s, 2 * s, 0 }, 1e-14, "row 1")
    close_list(stored:tolist()[2], { 2 * s, 4 * s, 0 }, 1e-14, "row 2")
  end)

  it("a large gradient gives the same norm as its sum written out", function()
    local n = 100003
    local p = dl.zeros({ n }, { dtype = "f64" })
    p.requires_grad = true
    p.grad = dl.full({ n }, 0.5, { dtype = "f64" })
    local total = optim.clip_grad_norm_({ p }, 1)
    close_list({ total }, { math.sqrt(n * 0.25) }, 1e-12, "total")
    close_list({ p.grad:tolist()[n] }, { 0.5 / (total + 1e-6) }, 1e-12, "scaled")
  end)

  it("error_if_nonfinite raises on an infinite total", function()
    local a = leaf({ 0 }, { math.huge })
    local ok, err = pcall(optim.clip_grad_norm_, { a }, 1, { error_if_nonfinite = true })
    assert.is_false(ok)
    assert.matches("clip_grad_norm_: the total norm of order 2 for gradients is non%-finite", err)
  end)

  it("clip_grad_value_ clamps into [-v, v]", function()
    local a = leaf({ 0, 0, 0, 0 }, { -3, 0.5, 2, -0.25 })
    local b = leaf({ 0 }, { 7 }, "f32")
    optim.clip_grad_value_({ a, b }, 1)
    assert.are.same({ -1, 0.5, 1, -0.25 }, a.grad:tolist())
    assert.are.same({ 1 }, b.grad:tolist())
  end)

  it("errors name the argument", function()
    local a = leaf({ 0 }, { 1 })
    local function err_of(fn, ...) local ok, e = pcall(fn, ...); assert.is_false(ok); return e end
    assert.matches("clip_grad_value_: invalid clip_value %-1", err_of(optim.clip_grad_value_, { a }, -1))
    assert.matches("clip_grad_norm_: invalid norm_type 0", err_of(optim.clip_grad_norm_, { a }, 1, { norm_type = 0 }))
    assert.matches("clip_grad_norm_: parameter 2 is not a tensor", err_of(optim.clip_grad_norm_, { a, "x" }, 1))
    assert.matches("max_norm must be a number", err_of(optim.clip_grad_norm_, { a }))
  end)
end)
