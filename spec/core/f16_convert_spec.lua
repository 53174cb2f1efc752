-- Specs for the bulk f32 <-> f16 conversions (runtime/core/f16_convert.c, Note [f16 bulk
-- conversion]): a contiguous cast takes the F16C path, a cast from or into a strided view
-- (every other element) takes the scalar ddp_f32_to_f16 / ddp_f16_to_f32 per element; both
-- must give the same bits for every f16 value and for f32 values of every class (random
-- bit patterns: NaNs with payloads, infinities, subnormals; and every rounding tie).
local dl = require "ddplua"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local function u16(t) return ffi.cast("uint16_t*", C.ddp_tensor_data(t)) end
local function u32(t) return ffi.cast("uint32_t*", C.ddp_tensor_data(t)) end

-- The first mismatch of n elements read through `get` from a and b, or nil.
local function first_diff(a, b, n)
  for i = 0, n - 1 do
    if a[i] ~= b[i] then return i end
  end
end

describe("f32 <-> f16 bulk conversion", function()
  it("f16 -> f32: all 65536 values, the vector path equals the scalar path bit for bit", function()
    local n = 65536
    local h = dl.zeros({ n }, { dtype = "f16" })
    local hs = dl.zeros({ n, 2 }, { dtype = "f16" }) -- column 1 strided: the scalar path
    local p, ps = u16(h), u16(hs)
    for i = 0, n - 1 do p[i] = i; ps[2 * i] = i end
    local fast = h:to("f32")
    local col = hs:select(2, 1)
    assert.is_false(col:is_contiguous())
    local slow = col:to("f32")
    local into = dl.zeros({ n, 2 })
    into:select(2, 1):copy_(h) -- strided destination: the scalar path too
    local a, b, c = u32(fast), u32(slow:contiguous()), u32(into)
    local strided = ffi.new("uint32_t[?]", n)
    for i = 0, n - 1 do strided[i] = c[2 * i] end
    assert.is_nil(first_diff(a, b, n))
    assert.is_nil(first_diff(a, strided, n))
    -- spot values: a signalling NaN keeps its payload (not quieted), subnormals, infinity
    assert.equal(0x7f802000, a[0x7c01])
    assert.equal(0x7fc00000, a[0x7e00])
    assert.equal(0x33800000, a[0x0001]) -- 2^-24
    assert.equal(0xff800000, a[0xfc00])
  end)

  it("f32 -> f16: random bit patterns and every rounding tie, vector equals scalar", function()
    -- every f16 value widened, then +-1 and the exact midpoint (bit 12) to the next value,
    -- plus 2^20 random 32-bit patterns (math.random from a fixed seed)
    math.randomseed(12345)
    local h = dl.zeros({ 65536 }, { dtype = "f16" })
    local hp = u16(h)
    for i = 0, 65535 do hp[i] = i end
    local wide = u32(h:to("f32"))
    local m = 0
    local n = 65536 * 4 + 1048576
    local src = dl.zeros({ n })
    local srcs = dl.zeros({ n, 2 })
    local sp, ssp = u32(src), u32(srcs)
    local function put(w)
      sp[m] = w; ssp[2 * m] = w; m = m + 1
    end
    for i = 0, 65535 do
      local w = wide[i]
      put(w); put(w + 0x1000); put(w + 0xfff); put(w + 0x1001)
    end
    for _ = 1, 1048576 do put(math.random(0, 65535) * 65536 + math.random(0, 65535)) end
    assert.equal(n, m)
    local fast = u16(src:to("f16"))
    local slow = u16(srcs:select(2, 1):to("f16"):contiguous())
    local d = first_diff(fast, slow, n)
    assert.is_nil(d, d and ("element %d: f32 bits 0x%08x: vector 0x%04x, scalar 0x%04x"):format(
      d, sp[d], fast[d], slow[d]))
    -- ties round to even; overflow to infinity; NaN quieted with its payload
    local function one(w)
      local t = dl.zeros({ 16 })
      local q = u32(t)
      for i = 0, 15 do q[i] = w end
      return u16(t:to("f16"))[9] -- from the vector body, not the tail
    end
    assert.equal(0x3c00, one(0x3f801000)) -- 1 + 2^-11: the tie goes down to even 1
    assert.equal(0x3c02, one(0x3f803000)) -- 1 + 3 * 2^-11: up to even
    assert.equal(0x7c00, one(0x477ff000)) -- 65520: infinity
    assert.equal(0x7bff, one(0x477fefff)) -- just below: 65504
    assert.equal(0x7e15, one(0x7f82aaaa)) -- signalling NaN quieted, top payload kept
    assert.equal(0x0001, one(0x33800000)) -- 2^-24: the smallest subnormal
  end)
end)
