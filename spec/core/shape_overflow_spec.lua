-- Shape arithmetic is checked where a shape enters (issue 23, item 1; Note [shape
-- arithmetic] in runtime/core/core.h): a product of sizes that does not fit in 64 bits is
-- an error naming the function and the shape, also when a size 0 makes numel 0 (the
-- strides of the dimensions before it are still those products), and sizes given from
-- Lua must be integers an int64_t holds.
local dl = require "ddplua"
local data = require "ddplua.data"
local checkpoint = require "ddplua.checkpoint"
local files = require "files"

local P40 = 2 ^ 40 -- 1099511627776

local function raises(pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.matches(pattern, tostring(err), 1, true)
  return err
end

local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end

describe("shape arithmetic", function()
  it("rejects a shape whose strides overflow even when a size 0 makes it empty", function()
    raises("zeros: shape (0, 1099511627776, 1099511627776, 1099511627776) has more elements "
      .. "than fit in 64 bits (counting each size 0 as 1", dl.zeros, { 0, P40, P40, P40 })
    raises("zeros: shape (1099511627776, 1099511627776, 1099511627776, 0) has more elements",
      dl.zeros, { P40, P40, P40, 0 })
    raises("randn: shape (0, 1099511627776, 1099511627776, 1099511627776) has more elements",
      dl.randn, { 0, P40, P40, P40 })
    raises("empty: shape (2305843009213693952, 8) has more elements", dl.empty, { 2 ^ 61, 8 })
    -- the bytes overflow although the element count fits
    raises("ones: shape (2305843009213693952, 2) needs more bytes than fit in 64 bits",
      dl.ones, { 2 ^ 61, 2 }, { dtype = "f64" })
    -- within range and empty: fine, and its strides are right
    local t = dl.zeros { 0, 2 ^ 20, 2 ^ 20 }
    assert.same({ 0, 2 ^ 20, 2 ^ 20 }, t:size())
    assert.equal(2 ^ 20, t:stride(2))
  end)

  it("checks view, reshape and expand the same way", function()
    local e = dl.zeros { 0 }
    raises("view: shape (0, 1099511627776, 1099511627776, 1099511627776) has more elements",
      function() return e:view(0, P40, P40, P40) end)
    raises("reshape: shape (1099511627776, 1099511627776, 1099511627776, 0) has more elements",
      function() return e:reshape { P40, P40, P40, 0 } end)
    raises("expand: shape (1099511627776, 1099511627776, 1099511627776) has more elements",
      function() return dl.zeros({ 1, 1, 1 }):expand(P40, P40, P40) end)
    raises("expand: shape (0, 1099511627776, 1099511627776, 1099511627776) has more elements",
      function() return dl.zeros({ 0, 1, 1, 1 }):expand(0, P40, P40, P40) end)
    -- an expand within range still works, stride 0 along the grown dimension
    local x = dl.zeros({ 1, 3 }):expand(2 ^ 40, 3)
    assert.same({ 2 ^ 40, 3 }, x:size())
    assert.equal(0, x:stride(1))
  end)

  it("rejects sizes that are not integers an int64_t holds, naming the argument", function()
    raises("zeros: shape entry 1 must be an integer that fits in 64 bits, got 9223372036854775808",
      dl.zeros, { 2 ^ 63 })
    raises("randn: shape entry 1 must be an integer that fits in 64 bits, got inf",
      dl.randn, { math.huge })
    raises("rand: shape entry 2 must be an integer that fits in 64 bits, got -inf",
      dl.rand, { 2, -math.huge })
    raises("zeros: shape entry 1 must be an integer that fits in 64 bits, got nan",
      dl.zeros, { 0 / 0 })
    raises("full: shape entry 1 must be an integer that fits in 64 bits, got 2.5",
      dl.full, { 2.5 }, 1)
    raises("view: size 2 must be an integer that fits in 64 bits, got inf",
      function() return dl.zeros { 4 }:view(2, math.huge) end)
    raises("reshape: size 1 must be an integer that fits in 64 bits, got 1.5",
      function() return dl.zeros { 4 }:reshape(1.5, 2) end)
    raises("expand: shape entry 1 must be an integer that fits in 64 bits, got 9223372036854775808",
      function() return dl.zeros { 1 }:expand { 2 ^ 63 } end)
    raises("zeros: size -3 of dimension 2 is negative", dl.zeros, { 2, -3 })
  end)

  describe("file headers", function()
    local dir
    before_each(function() dir = files.tmpdir("shapeoverflow") end)
    after_each(function() files.remove(dir) end)

    it("an IDX header with a size 0 and huge other sizes is refused, naming the file", function()
      local path = dir .. "/zero.idx"
      local f = assert(io.open(path, "wb"))
      f:write("\0\0\8\4", be32(0), be32(4294967295), be32(4294967295), be32(4294967295))
      f:close()
      raises("zero.idx: absurd sizes (0, 4294967295, 4294967295, 4294967295) of u8: more than "
        .. "2^33 bytes of data (counting each size 0 as 1", data.read_idx, path)
    end)

    it("a safetensors header with a size 0 and huge other sizes is refused", function()
      local path = dir .. "/zero.safetensors"
      local header = '{"w":{"dtype":"F32","shape":[0,1099511627776,1099511627776,1099511627776],'
        .. '"data_offsets":[0,0]}}'
      local n = #header
      local f = assert(io.open(path, "wb"))
      f:write(string.char(n % 256, math.floor(n / 256) % 256, 0, 0, 0, 0, 0, 0), header)
      f:close()
      raises("zero.safetensors: tensor 'w': shape (0, 1099511627776, 1099511627776) is absurdly large",
        checkpoint.load, path)
    end)
  end)
end)
