-- spec/helpers/gradcheck.lua: check an op's gradients against central finite differences
-- in f64, using nothing but the core tensor API (get/set, backward with a given gradient),
-- so it does not depend on the ops it checks.
--
--   gradcheck(function(a, b) return a:mul(b) end, {dl.randn({2, 3}, {dtype = "f64"}), ...})
--
-- Every input that is a floating tensor gets requires_grad; the output is contracted with a
-- fixed random tensor R (loss = sum(out * R)); analytic d(loss)/d(input) from backward(R) is
-- compared to (loss(x + eps) - loss(x - eps)) / (2 eps) element by element.
local dl = require "ddplua"

local M = {}

local function flat_index(sizes, k) -- 0-based flat position -> 1-based index table
  local idx = {}
  for d = #sizes, 1, -1 do
    idx[d] = k % sizes[d] + 1
    k = math.floor(k / sizes[d])
  end
  return idx
end

local function contract(out, R)
  local a, b = out:contiguous():tolist(), R:tolist()
  local function dot(x, y)
    if type(x) == "number" then return x * y end
    local s = 0
    for i = 1, #x do s = s + dot(x[i], y[i]) end
    return s
  end
  return dot(a, b)
end

--- gradcheck(fn, inputs, opts) -> true, or raises with the first mismatch.
-- opts.eps (1e-6), opts.atol (1e-5), opts.rtol (1e-4), opts.skip = {[i] = true} inputs to
-- leave without gradient.
function M.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-4
  local checked = {}
  for i, x in ipairs(inputs) do
    if dl.is_tensor(x) and x:is_floating_point() and not (opts.skip and opts.skip[i]) then
      x.requires_grad = true
      checked[#checked + 1] = i
    end
  end
  local out = fn(unpack(inputs))
  local R = dl.randn(out:size(), { dtype = "f64", generator = dl.Generator(1234) })
  out:backward(R)
  for _, i in ipairs(checked) do
    local x = inputs[i]
    local g = x.grad
    local sizes = x:size()
    local n = x:numel()
    for k = 0, n - 1 do
      local idx = flat_index(sizes, k)
      local orig = x:get(unpack(idx))
      local function set(v) -- x:set(i, j, ..., v)
        local args = { unpack(idx) }
        args[#args + 1] = v
        x:set(unpack(args))
      end
      local lp, lm
      dl.no_grad(function()
        set(orig + eps)
        lp = contract(fn(unpack(inputs)), R)
        set(orig - eps)
        lm = contract(fn(unpack(inputs)), R)
        set(orig)
      end)
      local numeric = (lp - lm) / (2 * eps)
      local analytic = g and g:get(unpack(idx)) or 0
      if math.abs(numeric - analytic) > atol + rtol * math.abs(numeric) then
        error(("gradcheck: input %d element {%s}: analytic %.10g, numeric %.10g"):format(
          i, table.concat(idx, ", "), analytic, numeric), 2)
      end
    end
  end
  return true
end

return M
