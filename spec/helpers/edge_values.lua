-- spec/helpers/edge_values.lua: inputs for specs that compare kernels bit for bit where
-- ties, zeros, NaN and -0 decide (masks, max positions, signs).
local dl = require "ddplua"

local M = {}

--- edge_values(shape, dtype, gen, lo, hi, step): a tensor of `shape` and `dtype` holding
-- k * step for integers k drawn from [lo, hi) (so many exact ties and zeros), with about 3%
-- NaN and 5% -0 put in at random places. gen() must return a fresh dl.Generator each call
-- (two are drawn, the values' then the places').
function M.edge_values(shape, dtype, gen, lo, hi, step)
  local x = dl.randint(lo, hi, shape, { generator = gen() }):to("f64") * step
  local u = dl.rand(shape, { generator = gen(), dtype = "f64" })
  x = dl.where(u:lt(0.03), dl.full(shape, 0 / 0, { dtype = "f64" }), x)
  x = dl.where(u:gt(0.95), dl.full(shape, -0.0, { dtype = "f64" }), x)
  return x:to(dtype)
end

return M
