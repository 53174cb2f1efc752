-- spec/helpers/dist_gradcheck.lua: a finite-difference gradient check of a function whose
-- outputs depend on the inputs of EVERY rank (a differentiable collective), run by all ranks
-- of the default group together, in f64. The distributed form of spec/helpers/gradcheck.lua.
--
--   local dgc = require "dist_gradcheck"
--   local report = dgc.check(function(x) return F.all_gather(x) end, { x }, { shapes = ... })
--
-- The loss is a fixed function of every rank's outputs:
--   L = sum over ranks r, outputs j of <W(r, j), out_j on rank r>
-- with weights W(r, j) drawn from a generator seeded by (r, j), so every rank knows them.
-- Analytic: each rank backpropagates its own term <W(rank, j), out_j> (the adjoint
-- collectives in backward sum the other ranks' terms into its gradient), which gives
-- dL/d(inputs of this rank). Numeric: for each rank p, each input i of p and each element k
-- of it, in the same order on every rank (the forward is collective), rank p sets the
-- element to x + eps and x - eps, every rank runs the forward without grad, and L is the sum
-- over ranks of the local terms (a plain dist.all_reduce of one f64 number); rank p compares
-- (L+ - L-) / (2 eps) with its analytic gradient. So a wrong adjoint, a wrong forward, and a
-- gradient sent to the wrong rank all fail. A mismatch does not raise at once (the other
-- ranks would wait in the next forward): the loops finish and the report carries the first.
local dl = require "ddplua"
local dist = require "ddplua.distributed"

local M = {}

local function flat_index(sizes, k) -- 0-based flat position -> 1-based index table
  local idx = {}
  for d = #sizes, 1, -1 do
    idx[d] = k % sizes[d] + 1
    k = math.floor(k / sizes[d])
  end
  return idx
end

local function as_list(out)
  if dl.is_tensor(out) then return { out } end
  return out
end

-- W(r, j): the weights of output j of rank r (its shape), the same on every rank.
local function weight(shape, r, j)
  return dl.randn(shape, { dtype = "f64", generator = dl.Generator(7919 * (r + 1) + 31 * j) })
end

-- This rank's term of L as a 0-d tensor (differentiable).
local function local_term(outs, rank)
  local total = dl.zeros({}, { dtype = "f64" })
  for j, o in ipairs(outs) do
    local w = weight(o:size(), rank, j)
    total = total + (o * w):sum()
  end
  return total
end

--- check(fn, inputs, opts) -> report {max_err =, checked =, grad_norm =, first =}.
-- fn(inputs...) -> a tensor or a list of tensors (this rank's outputs); inputs: this rank's
-- f64 tensors (each gets requires_grad). opts.shapes(r) -> the list of input shapes of rank
-- r (default: this rank's shapes, the same on every rank); opts.eps (1e-6), opts.atol
-- (1e-6), opts.rtol (1e-5). report.first names the first mismatch (nil when none);
-- grad_norm is the sum of |analytic| (a check that found only zeros checked little).
function M.check(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-6, opts.rtol or 1e-5
  local rank, world = dist.get_rank(), dist.get_world_size()
  local shapes = opts.shapes or function()
    local s = {}
    for i, x in ipairs(inputs) do s[i] = x:size() end
    return s
  end
  for _, x in ipairs(inputs) do x.requires_grad = true end
  local_term(as_list(fn(unpack(inputs))), rank):backward()
  local grads = {}
  for i, x in ipairs(inputs) do grads[i] = x.grad end

  local function global_loss()
    local l
    dl.no_grad(function() l = local_term(as_list(fn(unpack(inputs))), rank):item() end)
    local t = dl.tensor({ l }, { dtype = "f64" })
    dist.all_reduce(t)
    return t:item()
  end

  local report = { max_err = 0, checked = 0, grad_norm = 0 }
  for p = 0, world - 1 do
    for i, sizes in ipairs(shapes(p)) do
      local n = 1
      for _, s in ipairs(sizes) do n = n * s end
      for k = 0, n - 1 do
        local idx = flat_index(sizes, k)
        local x = p == rank and inputs[i] or nil
        local orig = x and x:get(unpack(idx))
        local function set(v)
          if not x then return end
          local args = { unpack(idx) }
          args[#args + 1] = v
          dl.no_grad(function() x:set(unpack(args)) end)
        end
        set(orig and orig + eps)
        local lp = global_loss()
        set(orig and orig - eps)
        local lm = global_loss()
        set(orig)
        if x then
          local numeric = (lp - lm) / (2 * eps)
          local analytic = grads[i] and grads[i]:get(unpack(idx)) or 0
          local err = math.abs(numeric - analytic)
          report.checked = report.checked + 1
          report.grad_norm = report.grad_norm + math.abs(analytic)
          report.max_err = math.max(report.max_err, err / (1 + math.abs(numeric)))
          if err > atol + rtol * math.abs(numeric) and not report.first then
            report.first = ("rank %d input %d element {%s}: analytic %.10g, numeric %.10g"):format(
              rank, i, table.concat(idx, ", "), analytic, numeric)
          end
        end
      end
    end
  end
  return report
end

return M
