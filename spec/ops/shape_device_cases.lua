-- spec/ops/shape_device_cases.lua: cases for shape_device_spec.lua (run through
-- spec/helpers/sim_cases.lua on the simulated device, and on a real GPU by its cuda-tagged
-- part). Each op runs on CPU tensors and on copies on a device, forward and backward; the
-- device results, copied back, must equal the CPU's (exactly on the simulated device;
-- copies are exact on a GPU too, the atomic sums within rounding).
local dl = require "ddplua"
local lib = require "ddplua.lib"
local C = lib.C

local cases = {}
local function case(name, fn) cases[#cases + 1] = {name, fn} end

local FLOATS = {"f32", "f64"}
local ALL = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8"}

-- Random values of dtype (integers small and non-negative for the integer dtypes).
local function rand(shape, dtype, seed)
  dl.manual_seed(seed)
  if dtype == "i64" or dtype == "i32" or dtype == "u8" then
    return dl.randint(0, 50, shape, {dtype = dtype})
  end
  return dl.randn(shape, {dtype = "f64"}):to(dtype)
end

local function index(values) return dl.tensor(values, {dtype = "i64"}) end

-- A random i64 index of `shape` with values in [0, hi).
local function rand_index(shape, hi, seed)
  dl.manual_seed(seed)
  return dl.randint(0, hi, shape, {dtype = "i64"})
end

local function on_device(t, ctx, device) return ctx.dev(t, device or 0) end

-- x on the device, non-contiguous when `transposed` (same values as the CPU's x).
local function dev_like(x, ctx, transposed, device)
  if not transposed then return on_device(x, ctx, device) end
  return on_device(x:t():contiguous(), ctx, device):t()
end

local function check_device(t, device, what)
  local want = "cuda:" .. (device or 0)
  if t.device ~= want then error(("%s is on %s, expected %s"):format(what, t.device, want), 2) end
end

-- forward and backward ----------------------------------------------------------------------

case("index_select on cuda:0 equals the CPU (every dtype, every dim, non-contiguous input)", function(ctx)
  for _, dtype in ipairs(ALL) do
    for _, transposed in ipairs({false, true}) do
      local x = rand({6, 5}, dtype, 1)
      if transposed then x = x:t():contiguous():t() end
      local dx = dev_like(x:contiguous(), ctx, transposed)
      for _, d in ipairs({1, 2, -1}) do
        local size = x:size(d < 0 and 2 or d)
        local idx = index({size - 1, 0, 2, 2, 1})
        local a, b = x:index_select(d, idx), dx:index_select(d, on_device(idx, ctx))
        check_device(b, 0, "index_select result")
        ctx.close(ctx.cpu(b), a, ("index_select %s dim %d transposed %s"):format(dtype, d, tostring(transposed)))
      end
    end
  end
  -- a 3-d input, a 0-d index, an empty index
  local x = rand({3, 4, 5}, "f32", 2)
  local dx = on_device(x, ctx)
  ctx.close(ctx.cpu(dx:index_select(2, on_device(index({3, 1}), ctx))), x:index_select(2, index({3, 1})), "3-d")
  ctx.close(ctx.cpu(dx:index_select(3, on_device(dl.tensor(4, {dtype = "i64"}), ctx))),
            x:index_select(3, dl.tensor(4, {dtype = "i64"})), "0-d index")
  local e = dx:index_select(1, on_device(dl.zeros({0}, {dtype = "i64"}), ctx))
  check_device(e, 0, "empty result")
  assert(table.concat(e.shape, ",") == "0,4,5")
end)

case("index_select backward on cuda:0 (repeated indices add up, index_add)", function(ctx)
  for _, dtype in ipairs({"f32", "f64", "f16", "bf16"}) do
    local x = rand({4, 5}, dtype, 3):requires_grad_()
    local dx = on_device(x:detach(), ctx):requires_grad_()
    local idx = index({4, 1, 1, 0, 4, 4})
    local g = rand({4, 6}, dtype, 4)
    x:index_select(2, idx):backward(g)
    dx:index_select(2, on_device(idx, ctx)):backward(on_device(g, ctx))
    local x2 = rand({5, 4}, dtype, 3):requires_grad_()
    x2:index_select(1, index({0, 0, 3})):backward(rand({3, 4}, dtype, 5))
    local dx2 = on_device(x2:detach(), ctx):requires_grad_()
    dx2:index_select(1, on_device(index({0, 0, 3}), ctx)):backward(on_device(rand({3, 4}, dtype, 5), ctx))
    check_device(dx.grad, 0, "grad")
    local rtol = (dtype == "f16" or dtype == "bf16") and 1e-2 or 1e-5
    ctx.close(ctx.cpu(dx.grad), x.grad, dtype .. " grad dim 2", rtol, rtol)
    ctx.close(ctx.cpu(dx2.grad), x2.grad, dtype .. " grad dim 1", rtol, rtol)
  end
end)

case("gather on cuda:0 equals the CPU, forward and backward (non-contiguous input, every dim)", function(ctx)
  for _, dtype in ipairs(ALL) do
    local x = rand({4, 6}, dtype, 6)
    for _, transposed in ipairs({false, true}) do
      local xs = transposed and x:t():contiguous():t() or x
      local dx = dev_like(x, ctx, transposed)
      for d = 1, 2 do
        local ishape = d == 1 and {7, 5} or {3, 9}
        local idx = rand_index(ishape, x:size(d), 7 + d)
        local a, b = xs:gather(d, idx), dx:gather(d, on_device(idx, ctx))
        check_device(b, 0, "gather result")
        ctx.close(ctx.cpu(b), a, ("gather %s dim %d transposed %s"):format(dtype, d, tostring(transposed)))
      end
    end
  end
  for _, dtype in ipairs(FLOATS) do
    local x = rand({3, 4, 5}, dtype, 10):requires_grad_()
    local dx = on_device(x:detach(), ctx):requires_grad_()
    local idx = rand_index({3, 8, 5}, 4, 11)
    local g = rand({3, 8, 5}, dtype, 12)
    x:gather(2, idx):backward(g)
    dx:gather(2, on_device(idx, ctx)):backward(on_device(g, ctx))
    check_device(dx.grad, 0, "gather grad")
    ctx.close(ctx.cpu(dx.grad), x.grad, dtype .. " gather grad", 1e-5, 1e-6)
  end
end)

case("scatter_add and scatter_add_ on cuda:0 equal the CPU, forward and backward", function(ctx)
  for _, dtype in ipairs(ALL) do
    local self = rand({5, 4}, dtype, 13)
    local src = rand({6, 7}, dtype, 14)
    local idx = rand_index({6, 4}, 5, 15) -- along dim 1: values < 5, positions inside src
    local a = self:scatter_add(1, idx, src)
    local b = on_device(self, ctx):scatter_add(1, on_device(idx, ctx), on_device(src, ctx))
    check_device(b, 0, "scatter_add result")
    local rtol = (dtype == "f16" or dtype == "bf16") and 1e-2 or 1e-5
    ctx.close(ctx.cpu(b), a, "scatter_add " .. dtype, rtol, rtol)
    -- in place into a non-contiguous self, along the last dim
    local s2 = self:t():contiguous():t()
    local ds2 = dev_like(self, ctx, true)
    local idx2 = rand_index({5, 3}, 4, 16)
    s2:scatter_add_(2, idx2, src)
    ds2:scatter_add_(2, on_device(idx2, ctx), on_device(src, ctx))
    ctx.close(ctx.cpu(ds2), s2, "scatter_add_ " .. dtype, rtol, rtol)
  end
  for _, dtype in ipairs(FLOATS) do
    local self = rand({4, 3}, dtype, 17):requires_grad_()
    local src = rand({6, 3}, dtype, 18):requires_grad_()
    local ds = on_device(self:detach(), ctx):requires_grad_()
    local dsrc = on_device(src:detach(), ctx):requires_grad_()
    local idx = rand_index({5, 2}, 4, 19)
    local g = rand({4, 3}, dtype, 20)
    self:scatter_add(1, idx, src):backward(g)
    ds:scatter_add(1, on_device(idx, ctx), dsrc):backward(on_device(g, ctx))
    check_device(ds.grad, 0, "self grad")
    check_device(dsrc.grad, 0, "src grad")
    ctx.close(ctx.cpu(ds.grad), self.grad, dtype .. " self grad")
    ctx.close(ctx.cpu(dsrc.grad), src.grad, dtype .. " src grad")
  end
end)

case("cat and stack on cuda:0 equal the CPU (mixed dtypes, non-contiguous, skipped empties)", function(ctx)
  for _, dtype in ipairs(ALL) do
    local a, b, c = rand({3, 4}, dtype, 21), rand({3, 2}, dtype, 22), rand({3, 5}, dtype, 23)
    local da, db = on_device(a, ctx), on_device(b, ctx)
    local dc = dev_like(c, ctx, true)
    local cc = c:t():contiguous():t()
    for _, d in ipairs({2, -1}) do
      local r = dl.cat({da, db, dc}, d)
      check_device(r, 0, "cat result")
      ctx.close(ctx.cpu(r), dl.cat({a, b, cc}, d), "cat " .. dtype)
    end
    local r = dl.cat({da, on_device(dl.zeros({0}), ctx), da}, 1)
    ctx.close(ctx.cpu(r), dl.cat({a, dl.zeros({0}), a}, 1), "cat with an empty " .. dtype)
    local s = dl.stack({da, da, on_device(rand({3, 4}, dtype, 24), ctx)}, 2)
    check_device(s, 0, "stack result")
    ctx.close(ctx.cpu(s), dl.stack({a, a, rand({3, 4}, dtype, 24)}, 2), "stack " .. dtype)
  end
  -- promotion: f32 with f64 gives f64 on the device
  local r = dl.cat({on_device(dl.ones({2}), ctx), on_device(dl.ones({3}, {dtype = "f64"}), ctx)})
  assert(r.dtype == "f64")
  check_device(r, 0, "promoted cat")
end)

case("cat and stack backward on cuda:0 give device gradients", function(ctx)
  local a = rand({2, 3}, "f64", 25):requires_grad_()
  local b = rand({2, 4}, "f64", 26):requires_grad_()
  local da = on_device(a:detach(), ctx):requires_grad_()
  local db = on_device(b:detach(), ctx):requires_grad_()
  local g = rand({2, 7}, "f64", 27)
  dl.cat({a, b}, 2):backward(g)
  dl.cat({da, db}, 2):backward(on_device(g, ctx))
  check_device(da.grad, 0, "cat grad")
  ctx.close(ctx.cpu(da.grad), a.grad, "cat grad a")
  ctx.close(ctx.cpu(db.grad), b.grad, "cat grad b")
  local x = rand({3}, "f64", 28):requires_grad_()
  local dx = on_device(x:detach(), ctx):requires_grad_()
  local gs = rand({2, 3}, "f64", 29)
  dl.stack({x, x}):backward(gs)
  dl.stack({dx, dx}):backward(on_device(gs, ctx))
  ctx.close(ctx.cpu(dx.grad), x.grad, "stack grad")
end)

case("views, split and chunk of a device tensor stay on it", function(ctx)
  local x = on_device(rand({4, 6}, "f32", 30), ctx)
  for _, v in ipairs({x:t(), x:view(3, 8), x:narrow(2, 2, 3), x:select(1, 2), x:unsqueeze(1),
                      x:reshape(24), x:t():reshape(24), x:expand(2, 4, 6), x:flatten()}) do
    check_device(v, 0, "view")
  end
  for _, p in ipairs(x:split(4, 2)) do check_device(p, 0, "split piece") end
  for _, p in ipairs(x:chunk(3, 1)) do check_device(p, 0, "chunk piece") end
  ctx.close(ctx.cpu(x:t():reshape(24)), ctx.cpu(x):t():reshape(24), "reshape of a transposed view")
end)

case("results on cuda:1 stay on cuda:1", function(ctx)
  if ctx.devices < 2 then return end
  local x = rand({4, 5}, "f32", 31)
  local idx = index({3, 0})
  local dx, di = on_device(x, ctx, 1), on_device(idx, ctx, 1)
  local r = dx:index_select(1, di)
  check_device(r, 1, "index_select")
  ctx.close(ctx.cpu(r), x:index_select(1, idx), "index_select on cuda:1")
  check_device(dl.cat({dx, dx}), 1, "cat")
  check_device(dx:gather(1, on_device(index({{0, 1}}), ctx, 1)), 1, "gather")
end)

-- errors ----------------------------------------------------------------------------------------

case("tensors on different devices are refused naming the arguments and devices", function(ctx)
  local x = on_device(rand({4, 5}, "f32", 32), ctx)
  local idx = index({0, 1})
  ctx.raises(function() x:index_select(1, idx) end,
             "index_select: expected all tensors on the same device, but self is on cuda:0 and index is on cpu")
  ctx.raises(function() x:gather(1, index({{0, 1}})) end,
             "gather: expected all tensors on the same device, but self is on cuda:0 and index is on cpu")
  ctx.raises(function() x:scatter_add(1, on_device(index({{0}}), ctx), dl.ones({1, 1})) end,
             "scatter_add: expected all tensors on the same device, but self is on cuda:0 and src is on cpu")
  ctx.raises(function() dl.cat({x, dl.ones({4, 5})}) end,
             "cat: expected all tensors on the same device, but tensors[1] is on cuda:0 and tensors[2] is on cpu")
  ctx.raises(function() dl.stack({dl.ones({4, 5}), x}) end,
             "stack: expected all tensors on the same device, but tensors[1] is on cpu and tensors[2] is on cuda:0")
  if ctx.devices > 1 then
    ctx.raises(function() dl.cat({x, on_device(dl.ones({4, 5}), ctx, 1)}) end,
               "tensors[1] is on cuda:0 and tensors[2] is on cuda:1")
    ctx.raises(function() x:scatter_add_(1, on_device(index({{0}}), ctx, 1), on_device(dl.ones({1, 1}), ctx, 1)) end,
               "self is on cuda:0 and index is on cuda:1")
  end
end)

case("index values on the device are checked (out of bounds raises, nothing written)", function(ctx)
  local x = on_device(rand({3, 4}, "f32", 33), ctx)
  ctx.raises(function() x:index_select(2, on_device(index({0, 4}), ctx)) end,
             "index_select: index value 4 is out of bounds for dimension 2 of size 4")
  ctx.raises(function() x:gather(1, on_device(index({{-1}}), ctx)) end,
             "gather: index value -1 is out of bounds for dimension 1 of size 3")
  local before = ctx.cpu(x)
  ctx.raises(function() x:scatter_add_(1, on_device(index({{0, 3}}), ctx), on_device(dl.ones({1, 2}), ctx)) end,
             "scatter_add_: index value 3 is out of bounds for dimension 1 of size 3")
  ctx.close(ctx.cpu(x), before, "self after a refused scatter_add_")
end)

-- larger random inputs (GPU grids of several blocks, many colliding atomics) ----------------------

case("large random index_select, gather, scatter_add and cat against the CPU", function(ctx)
  for _, dtype in ipairs({"f32", "f64", "i64"}) do
    local x = rand({300, 257}, dtype, 40)
    local dx = on_device(x, ctx)
    local idx = rand_index({1000}, 300, 41)
    ctx.close(ctx.cpu(dx:index_select(1, on_device(idx, ctx))), x:index_select(1, idx), "index_select " .. dtype)
    local gi = rand_index({300, 500}, 257, 42)
    ctx.close(ctx.cpu(dx:gather(2, on_device(gi, ctx))), x:gather(2, gi), "gather " .. dtype)
    local src = rand({300, 500}, dtype, 43)
    local rtol = dtype == "f32" and 1e-4 or 1e-10
    ctx.close(ctx.cpu(dx:scatter_add(2, on_device(gi, ctx), on_device(src, ctx))),
              x:scatter_add(2, gi, src), "scatter_add " .. dtype, rtol, rtol)
    ctx.close(ctx.cpu(dl.cat({dx, dx:narrow(2, 1, 3), dx}, 2)), dl.cat({x, x:narrow(2, 1, 3), x}, 2), "cat " .. dtype)
  end
  local g = rand({2000, 64}, "f32", 44):requires_grad_()
  local dg = on_device(g:detach(), ctx):requires_grad_()
  local idx = rand_index({5000}, 2000, 45) -- many repeats: atomics collide
  local up = rand({5000, 64}, "f32", 46)
  g:index_select(1, idx):backward(up)
  dg:index_select(1, on_device(idx, ctx)):backward(on_device(up, ctx))
  ctx.close(ctx.cpu(dg.grad), g.grad, "index_add of many repeats", 1e-4, 1e-5)
end)

return cases
