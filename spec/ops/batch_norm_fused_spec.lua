-- Specs for the vectorised batch-norm passes (runtime/backend/cpu/batch_norm.c) and the
-- fused batch norm + ReLU (+ residual) op (dl.batch_norm_relu, BatchNorm:forward_relu,
-- models/resnet.lua): f32 results against the f64 computation over shapes with odd sizes
-- (vector tails, one value per slice, slices long enough for the per-slice moments), the
-- same bits at 1 and 2 threads, the fused op bitwise equal to batch_norm, add and relu in a
-- row (values, every gradient, running statistics), f64 finite-difference gradients, and
-- the errors.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local gradcheck = require("gradcheck").gradcheck
local assert_close = require("close").assert_close

local flatten = require("close").flatten

-- Bitwise equality (the sign of zero and NaN payloads included, through %a).
local function assert_same_bits(a, b, what)
  local p, q = flatten(a:tolist()), flatten(b:tolist())
  assert.are.equal(#q, #p, what .. ": sizes")
  for i = 1, #p do
    local sp, sq = ("%a"):format(p[i]), ("%a"):format(q[i])
    if sp ~= sq then error(("%s: element %d differs: %s vs %s"):format(what, i, sp, sq), 2) end
  end
end

local function randn(shape, seed, dtype, scale, shift)
  local t = dl.randn(shape, { dtype = dtype or "f32", generator = dl.Generator(seed) })
  if scale then t = t * scale end
  if shift then t = t + shift end
  return t
end

-- Shapes covering the f32 paths: S = 1 and (N, C) inputs, S below one vector, S with a tail
-- (63, 289), S a multiple of 16 (256, 1024: moments by slices).
local SHAPES = { { 7, 3 }, { 5, 4, 1 }, { 3, 5, 7 }, { 4, 3, 7, 9 }, { 2, 3, 16, 16 },
  { 3, 2, 17, 17 }, { 2, 3, 32, 32 } }

-- y, running stats and gradients of batch_norm (training) of x in dtype dt.
local function bn_run(x0, w0, b0, dy0, dt, relu, r0)
  local function leaf(t) return t:detach():to(dt):detach():requires_grad_() end
  local x, w, b = leaf(x0), leaf(w0), leaf(b0)
  local r = r0 and leaf(r0) or nil
  local C = x0:size(2)
  local rm, rv = dl.zeros({ C }, { dtype = dt }), dl.ones({ C }, { dtype = dt })
  local y
  if relu then
    y = dl.batch_norm_relu(x, rm, rv, { weight = w, bias = b, training = true, residual = r })
  else
    y = dl.batch_norm(x, rm, rv, { weight = w, bias = b, training = true })
    if r then y = y + r end
    if relu ~= nil then y = y:relu() end
  end
  y:backward(dy0:to(dt))
  return { y = y, rm = rm, rv = rv, gx = x.grad, gw = w.grad, gb = b.grad, gr = r and r.grad }
end

describe("batch norm passes (f32, vectorised)", function()
  it("match the f64 computation over shapes with odd sizes", function()
    for i, shape in ipairs(SHAPES) do
      local C = shape[2]
      local x, w, b = randn(shape, 10 + i), randn({ C }, 20 + i), randn({ C }, 30 + i)
      local dy = randn(shape, 40 + i)
      local r32, r64 = bn_run(x, w, b, dy, "f32"), bn_run(x, w, b, dy, "f64")
      local tag = table.concat(shape, "x")
      assert_close(r32.y, r64.y:to("f32"), { atol = 1e-5, rtol = 1e-5 })
      assert_close(r32.rm, r64.rm:to("f32"), { atol = 1e-6, rtol = 1e-6 })
      assert_close(r32.rv, r64.rv:to("f32"), { atol = 1e-6, rtol = 1e-5 })
      assert_close(r32.gx, r64.gx:to("f32"), { atol = 1e-4, rtol = 1e-4 })
      assert_close(r32.gw, r64.gw:to("f32"), { atol = 1e-4, rtol = 1e-4 })
      assert_close(r32.gb, r64.gb:to("f32"), { atol = 1e-4, rtol = 1e-4 })
      assert.is_true(r32.y:size(1) == shape[1], tag)
    end
  end)

  it("keep the variance accurate when the mean is far larger than the spread", function()
    -- mean 1000, std 0.01: a sum-of-squares formula in f32 or a naive one-pass in f64
    -- would lose most digits of the variance here
    for _, shape in ipairs { { 4, 2, 16, 16 }, { 3, 2, 17, 17 }, { 6, 2, 5 } } do
      local x = randn(shape, 7, "f32", 0.01, 1000)
      local C = shape[2]
      local rv32, rv64 = dl.zeros { C }, dl.zeros({ C }, { dtype = "f64" })
      dl.batch_norm(x, nil, rv32, { training = true, momentum = 1 })
      dl.batch_norm(x:to("f64"), nil, rv64, { training = true, momentum = 1 })
      assert_close(rv32, rv64:to("f32"), { atol = 0, rtol = 1e-5 })
      local s, sq = dl.batch_norm_sums(x)
      local s64, sq64 = dl.batch_norm_sums(x:to("f64"))
      assert_close(s, s64, { atol = 0, rtol = 1e-12 })
      assert_close(sq, sq64, { atol = 0, rtol = 1e-12 })
    end
  end)

  it("give the same bits at 1 and 2 threads", function()
    local saved = dl.get_num_threads()
    finally(function() dl.set_num_threads(saved) end)
    for i, shape in ipairs { { 16, 16, 32, 32 }, { 32, 64, 8, 8 }, { 8, 16, 17, 17 } } do
      local C = shape[2]
      local x, w, b = randn(shape, 50 + i), randn({ C }, 60 + i), randn({ C }, 70 + i)
      local dy, r = randn(shape, 80 + i), randn(shape, 90 + i)
      dl.set_num_threads(1)
      local one, onef = bn_run(x, w, b, dy, "f32"), bn_run(x, w, b, dy, "f32", true, r)
      local onen = bn_run(x, w, b, dy, "f32", true)
      dl.set_num_threads(2)
      local two, twof = bn_run(x, w, b, dy, "f32"), bn_run(x, w, b, dy, "f32", true, r)
      local twon = bn_run(x, w, b, dy, "f32", true)
      for _, k in ipairs { "y", "rm", "rv", "gx", "gw", "gb" } do
        assert_same_bits(two[k], one[k], "batch_norm " .. k)
        assert_same_bits(twof[k], onef[k], "batch_norm_relu " .. k)
        assert_same_bits(twon[k], onen[k], "batch_norm_relu (no residual) " .. k)
      end
      assert_same_bits(twof.gr, onef.gr, "batch_norm_relu residual grad")
    end
  end)
end)

describe("dl.batch_norm_relu", function()
  it("is bitwise batch_norm, add and relu in a row (values, gradients, running stats)", function()
    for i, shape in ipairs(SHAPES) do
      for _, dt in ipairs { "f32", "f64" } do
        for _, with_res in ipairs { false, true } do
          local C = shape[2]
          local x, w, b = randn(shape, 100 + i), randn({ C }, 110 + i), randn({ C }, 120 + i)
          local dy, r = randn(shape, 130 + i), with_res and randn(shape, 140 + i) or nil
          local plain, fused = bn_run(x, w, b, dy, dt, false, r), bn_run(x, w, b, dy, dt, true, r)
          local tag = ("%s %s%s"):format(table.concat(shape, "x"), dt, with_res and " residual" or "")
          for _, k in ipairs { "y", "rm", "rv", "gx", "gw", "gb" } do
            assert_same_bits(fused[k], plain[k], tag .. " " .. k)
          end
          if with_res then assert_same_bits(fused.gr, plain.gr, tag .. " gr") end
        end
      end
    end
  end)

  it("is bitwise the composition in eval mode", function()
    local shape = { 4, 3, 5, 6 }
    local x, r, dy = randn(shape, 1):requires_grad_(), randn(shape, 2):requires_grad_(), randn(shape, 3)
    local rm, rv = randn({ 3 }, 4), randn({ 3 }, 5):abs() + 0.5
    local w = randn({ 3 }, 6):requires_grad_()
    local y1 = (dl.batch_norm(x, rm, rv, { weight = w }) + r):relu()
    y1:backward(dy)
    local gx, gr, gw = x.grad, r.grad, w.grad
    x.grad, r.grad, w.grad = nil, nil, nil
    local y2 = dl.batch_norm_relu(x, rm, rv, { weight = w, residual = r })
    y2:backward(dy)
    assert_same_bits(y2, y1, "y")
    assert_same_bits(x.grad, gx, "gx")
    assert_same_bits(r.grad, gr, "gr")
    assert_same_bits(w.grad, gw, "gw")
  end)

  it("keeps NaN through the ReLU and gives 0 gradient where the output is 0", function()
    local x = dl.tensor({ { 1, 2 }, { 3, 0 / 0 }, { -1, 5 } }):requires_grad_()
    local dy = dl.tensor { { 0.5, 1 }, { -2, 1 }, { 3, 1 } }
    local ref = dl.batch_norm(x, nil, nil, { training = true }):relu()
    ref:backward(dy)
    local gref = x.grad
    x.grad = nil
    local y = dl.batch_norm_relu(x, nil, nil, { training = true })
    assert_same_bits(y, ref, "y")
    local v = y:tolist()
    assert.is_true(v[2][2] ~= v[2][2], "NaN kept")
    assert.are.equal(0, v[3][1])
    y:backward(dy)
    assert_same_bits(x.grad, gref, "grad")
    local y2 = dl.batch_norm_relu(dl.tensor { { -3 }, { 3 } }, nil, nil, { training = true, eps = 0 })
    assert_same_bits(y2, dl.tensor { { 0 }, { 1 } }, "relu of the normalised values")
    -- weight 0: every pre-activation is +-0 (relu keeps -0), the mask is off everywhere
    for _, res in ipairs { false, true } do
      local xz = randn({ 4, 2, 9 }, 77):requires_grad_()
      local w = dl.zeros({ 2 }):requires_grad_()
      local r = res and dl.zeros({ 4, 2, 9 }):requires_grad_() or nil
      local g = randn({ 4, 2, 9 }, 78)
      local yz = dl.batch_norm(xz, nil, nil, { weight = w, training = true })
      if r then yz = yz + r end
      yz = yz:relu()
      yz:backward(g)
      local gx, gw, gr = xz.grad, w.grad, r and r.grad
      xz.grad, w.grad = nil, nil
      if r then r.grad = nil end
      local yf = dl.batch_norm_relu(xz, nil, nil, { weight = w, training = true, residual = r })
      yf:backward(g)
      assert_same_bits(yf, yz, "zero weight y")
      assert_same_bits(xz.grad, gx, "zero weight gx")
      assert_same_bits(w.grad, gw, "zero weight gw")
      if r then assert_same_bits(r.grad, gr, "zero weight gr") end
    end
  end)

  it("takes strided inputs and a residual alone requiring grad as the composition does", function()
    local base, rbase = randn({ 4, 5, 6, 3 }, 61), randn({ 4, 5, 6, 3 }, 62)
    local x = base:permute(1, 4, 2, 3) -- (4, 3, 5, 6), not contiguous
    local r = rbase:permute(1, 4, 2, 3):requires_grad_()
    local dy = randn({ 4, 3, 5, 6 }, 63)
    local ref = (dl.batch_norm(x, nil, nil, { training = true }) + r):relu()
    ref:backward(dy)
    local gr = r.grad
    r.grad = nil
    local y = dl.batch_norm_relu(x, nil, nil, { training = true, residual = r })
    y:backward(dy)
    assert_same_bits(y, ref, "y")
    assert_same_bits(r.grad, gr, "residual grad")
    assert.is_nil(x.grad)
  end)

  it("has gradients matching finite differences in f64", function()
    -- fresh leaves for each check (gradcheck reads the accumulated .grad)
    local shape = { 3, 2, 3, 4 }
    local function x() return randn(shape, 11, "f64") end
    local function w() return randn({ 2 }, 12, "f64") end
    local function b() return randn({ 2 }, 13, "f64") end
    local function r() return randn(shape, 14, "f64") end
    gradcheck(function(xx, ww, bb, rr)
      return dl.batch_norm_relu(xx, nil, nil, { weight = ww, bias = bb, training = true, residual = rr })
    end, { x(), w(), b(), r() })
    gradcheck(function(xx, ww, bb)
      return dl.batch_norm_relu(xx, nil, nil, { weight = ww, bias = bb, training = true })
    end, { x(), w(), b() })
    local rm, rv = randn({ 2 }, 15, "f64"), randn({ 2 }, 16, "f64"):abs() + 0.5
    gradcheck(function(xx, ww, rr)
      return dl.batch_norm_relu(xx, rm, rv, { weight = ww, residual = rr })
    end, { x(), w(), r() })
  end)

  it("runs f16 and bf16 through the composition", function()
    local x = randn({ 4, 3, 5 }, 21)
    local r = randn({ 4, 3, 5 }, 22)
    for _, dt in ipairs { "f16", "bf16" } do
      local y = dl.batch_norm_relu(x:to(dt), nil, nil, { training = true, residual = r:to(dt) })
      local ref = (dl.batch_norm(x:to(dt), nil, nil, { training = true }) + r:to(dt)):relu()
      assert.are.equal(dt, y.dtype)
      assert_same_bits(y, ref, dt)
    end
  end)

  it("names the residual that does not fit", function()
    local x = randn({ 4, 3, 5 }, 1)
    local ok, err = pcall(dl.batch_norm_relu, x, nil, nil, { training = true, residual = randn({ 4, 3, 1 }, 2) })
    assert.is_false(ok)
    assert.matches("batch_norm_relu: residual of shape (4, 3, 1) must have the shape of input (4, 3, 5)",
      err, 1, true)
    ok, err = pcall(dl.batch_norm_relu, x, nil, nil,
      { training = true, residual = randn({ 4, 3, 5 }, 2, "f64") })
    assert.is_false(ok)
    assert.matches("batch_norm_relu: residual has dtype f64 but input has dtype f32", err, 1, true)
    ok, err = pcall(dl.batch_norm_relu, x, nil, nil, { training = false })
    assert.is_false(ok)
    assert.matches("batch_norm_relu: running_mean and running_var are required", err, 1, true)
  end)
end)

describe("BatchNorm:forward_relu", function()
  it("equals (bn(x) + residual):relu() with the same running stats and batch count", function()
    local a, b = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    local x, r = randn({ 4, 3, 5, 5 }, 31), randn({ 4, 3, 5, 5 }, 32)
    for _ = 1, 2 do
      assert_same_bits(a:forward_relu(x, r), (b(x) + r):relu(), "y")
      assert_same_bits(a:forward_relu(x), b(x):relu(), "y without residual")
    end
    assert_same_bits(a.running_mean, b.running_mean, "running_mean")
    assert_same_bits(a.running_var, b.running_var, "running_var")
    assert.are.equal(b.num_batches_tracked:item(), a.num_batches_tracked:item())
    a:eval()
    b:eval()
    assert_same_bits(a:forward_relu(x, r), (b(x) + r):relu(), "eval")
  end)

  it("uses a subclass's own forward (SyncBatchNorm) through the composition", function()
    local Doubled = nn.BatchNorm1d:extend("Doubled")
    function Doubled:forward(x) return nn.BatchNorm1d.forward(self, x) * 2 end
    local m, ref = Doubled(3), nn.BatchNorm1d(3)
    local x = randn({ 6, 3 }, 41)
    assert_same_bits(m:forward_relu(x), (ref(x) * 2):relu(), "subclass")
  end)
end)

describe("models/resnet.lua with fused batch norm + ReLU", function()
  it("trains bitwise as the unfused blocks and keeps its state_dict names", function()
    local resnet = require "models.resnet"
    local BatchNorm = require("ddplua.nn.batch_norm").BatchNorm
    local function run(fused)
      local saved = BatchNorm.forward_relu
      if not fused then
        BatchNorm.forward_relu = function(self, x, residual)
          local y = self(x)
          if residual ~= nil then y = y + residual end
          return y:relu()
        end
      end
      finally(function() BatchNorm.forward_relu = saved end)
      dl.manual_seed(3)
      local model = resnet { depth = 8 }
      model:train()
      local x = randn({ 4, 3, 32, 32 }, 51)
      local t = dl.tensor({ 1, 2, 3, 4 }, { dtype = "i64" })
      local loss = dl.cross_entropy(model(x), t)
      loss:backward()
      BatchNorm.forward_relu = saved
      return model, loss
    end
    local m1, l1 = run(true)
    local m2, l2 = run(false)
    assert_same_bits(l1, l2, "loss")
    local sd1, sd2 = m1:state_dict(), m2:state_dict()
    local names = {}
    for k in pairs(sd2) do names[#names + 1] = k end
    table.sort(names)
    local n1 = 0
    for _ in pairs(sd1) do n1 = n1 + 1 end
    assert.are.equal(#names, n1)
    assert.is_true(#names > 20)
    for _, k in ipairs(names) do
      assert.is_not_nil(sd1[k], k)
      assert_same_bits(sd1[k], sd2[k], k)
    end
    local p1 = {}
    for name, p in m1:named_parameters() do p1[name] = p end
    local n = 0
    for name, p in m2:named_parameters() do
      assert_same_bits(p1[name].grad, p.grad, name .. " grad")
      n = n + 1
    end
    assert.is_true(n > 10)
  end)
end)
