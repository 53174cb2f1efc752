--- bench/batch_norm_layers.lua: time of one batch-norm layer of ResNet-20 (batch 128, the
-- three stage shapes) in training, forward and forward + backward, for the plain batch norm,
-- batch norm + ReLU and batch norm + residual add + ReLU. The last two use the fused
-- dl.batch_norm_relu when the build has it, else the composition (so the same script times
-- an older build for a before/after comparison; the line says which ran).
--
--   build/ddplua bench/batch_norm_layers.lua [--reps 5] [--runs 9]
--
-- Prints one line per shape: the median milliseconds per call (clock.median_time over
-- --runs runs of --reps calls, after one warm-up run). Gradients of x, residual, weight and
-- bias are dropped after each backward so every call allocates as a training step does.
local dl = require "ddplua"
local clock = require "ddplua.clock"

local reps, runs = 5, 9
for i = 1, #arg do
  if arg[i] == "--reps" then reps = assert(tonumber(arg[i + 1]), "--reps N") end
  if arg[i] == "--runs" then runs = assert(tonumber(arg[i + 1]), "--runs N") end
end

local fused = dl.batch_norm_relu ~= nil
print(("batch norm layers, %s, %d thread(s)"):format(fused and "fused batch_norm_relu" or
  "composition batch_norm, add, relu", dl.get_num_threads()))

for _, shape in ipairs { { 128, 16, 32, 32 }, { 128, 32, 16, 16 }, { 128, 64, 8, 8 } } do
  local C = shape[2]
  local x, r = dl.randn(shape):requires_grad_(), dl.randn(shape):requires_grad_()
  local w, b = dl.ones({ C }):requires_grad_(), dl.zeros({ C }):requires_grad_()
  local rm, rv = dl.zeros({ C }), dl.ones({ C })
  local g = dl.randn(shape)
  local opts = { weight = w, bias = b, training = true }
  local res_opts = { weight = w, bias = b, training = true, residual = r }
  local variants = {
    { "bn", function() return dl.batch_norm(x, rm, rv, opts) end },
    { "bn+relu", function()
      if fused then return dl.batch_norm_relu(x, rm, rv, opts) end
      return dl.batch_norm(x, rm, rv, opts):relu()
    end },
    { "bn+add+relu", function()
      if fused then return dl.batch_norm_relu(x, rm, rv, res_opts) end
      return (dl.batch_norm(x, rm, rv, opts) + r):relu()
    end },
  }
  local cells = {}
  for _, v in ipairs(variants) do
    local f = v[2]
    local tf = clock.median_time(function() f() end, reps, runs)
    local tb = clock.median_time(function()
      f():backward(g)
      x.grad, r.grad, w.grad, b.grad = nil, nil, nil, nil
    end, reps, runs)
    cells[#cells + 1] = ("%s fwd %.2f fwd+bwd %.2f"):format(v[1], tf * 1e3, tb * 1e3)
  end
  print(("(%s) ms: %s"):format(table.concat(shape, ", "), table.concat(cells, " | ")))
end
