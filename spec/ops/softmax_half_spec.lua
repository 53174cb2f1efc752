-- bf16 and f16 softmax / log_softmax round once from f32, forward and backward (issue 23,
-- item 6; Note [half softmax backward] in runtime/ops/reduce.c). The backward used the
-- output rounded to bf16, and its cancellation (dy - sum(dy * y)) turned that rounding into
-- hundreds of ulps. Each result is compared with the f64 computation from the same half
-- inputs, rounded to the half dtype: within 1 ulp of it, element by element.
local dl = require "ddplua"

-- Spacing of the half dtype's values at |v| (`mant` stored mantissa bits, `emin` the least
-- normal exponent): the ulp of the exactly rounded value.
local function ulp(v, mant, emin)
  v = math.abs(v)
  local e = v > 0 and math.floor(math.log(v) / math.log(2)) or emin
  if e < emin then e = emin end
  -- guard against log rounding at powers of two
  if 2 ^ e > v then e = e - 1 elseif 2 ^ (e + 1) <= v then e = e + 1 end
  return 2 ^ (math.max(e, emin) - mant)
end

local HALF = { bf16 = { mant = 7, emin = -126 }, f16 = { mant = 10, emin = -14 } }

-- Largest |got - round(want)| in ulps of round(want), and where.
local function max_ulps(got, want, dtype)
  local h = HALF[dtype]
  local g = got:double():reshape(-1):tolist()
  local rounded = want:to(dtype):double():reshape(-1):tolist()
  local worst, at = 0, 0
  for i = 1, #g do
    local d = math.abs(g[i] - rounded[i]) / ulp(rounded[i], h.mant, h.emin)
    if d > worst then worst, at = d, i end
  end
  return worst, at
end

local CASES = { -- shape, softmax dimension (rows; long rows; channels of (N, C, H, W))
  { { 64, 10 }, -1 }, { { 16, 1000 }, -1 }, { { 8, 3, 4, 4 }, 2 }, { { 5, 7 }, 1 },
}

describe("half-precision softmax", function()
  for _, dtype in ipairs { "bf16", "f16" } do
    for _, is_log in ipairs { false, true } do
      local op = is_log and "log_softmax" or "softmax"
      it(("%s %s forward and backward are within 1 ulp of f64 rounded to %s"):format(dtype, op, dtype), function()
        local gen = dl.Generator(23)
        for _, case in ipairs(CASES) do
          local shape, dim = case[1], case[2]
          for _, scale in ipairs { 1, 4 } do
            local x = (dl.randn(shape, { generator = gen }) * scale):to(dtype):detach()
            local dy = dl.randn(shape, { generator = gen }):to(dtype)
            x.requires_grad = true
            local y = x[op](x, dim)
            assert.equal(dtype, y.dtype)
            y:backward(dy)
            assert.equal(dtype, x.grad.dtype)
            local x64 = x:detach():double()
            x64.requires_grad = true
            local y64 = x64[op](x64, dim)
            y64:backward(dy:double())
            local where = ("%s %s (%s) scale %g"):format(dtype, op, table.concat(shape, ", "), scale)
            local fw = max_ulps(y, y64:detach(), dtype)
            assert.is_true(fw <= 1, ("%s: forward %.2f ulps"):format(where, fw))
            local bw, at = max_ulps(x.grad, x64.grad, dtype)
            assert.is_true(bw <= 1, ("%s: backward %.2f ulps at element %d"):format(where, bw, at))
          end
        end
      end)
    end
  end
end)
