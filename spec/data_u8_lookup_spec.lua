-- u8 images made float through a per-channel table of the 256 levels (Note [u8 lookup] in
-- runtime/io/batch.c) give, bit for bit, what the arithmetic path gives for the same pixel
-- values held as f32: (double)u * (scale / std) + (-mean / std), rounded once. Checked with
-- crops, zero padding before and after Normalize, flips, one and several channels, and more
-- channels than the table serves.
local dl = require "ddplua"
local data = require "ddplua.data"
local lib = require "ddplua.lib"
local transforms = require "ddplua.data.transforms"
local ffi, C = lib.ffi, lib.C

local function collate(src, idx, tf, seed)
  local ti = dl.tensor(idx, { dtype = "i64" })
  local spec = transforms.spec(tf, C.ddp_tensor_dtype(src))
  lib.check(C.ddp_io_collate(lib.box, src, ti, spec, dl.Generator(seed).handle))
  return lib.wrap(lib.box[0])
end

-- Number of elements whose bits differ (both f32, same shape).
local differing = require("close").count_bit_differences

describe("u8 lookup in the loader's gather", function()
  local cases = {
    { "1 channel, ToFloat + Normalize", { 50, 1, 28, 28 },
      function() return data.Compose { data.ToFloat(1 / 255), data.Normalize(0.2860, 0.3530) } end },
    { "3 channels, crop with padding, flip, per-channel Normalize", { 40, 3, 9, 11 },
      function()
        return data.Compose { data.RandomCrop(8, { padding = 2 }), data.RandomHorizontalFlip(0.5), data.ToFloat(1 / 255),
          data.Normalize({ 0.4914, 0.4822, 0.4465 }, { 0.2470, 0.2435, 0.2616 }) }
      end },
    { "padding after Normalize (output zeros)", { 20, 2, 5, 6 },
      function()
        return data.Compose { data.ToFloat(1 / 255), data.Normalize({ 0.5, 0.25 }, { 0.2, 0.3 }),
          data.RandomCrop({ 6, 7 }, { padding = 1 }) }
      end },
    { "ToFloat alone with a scale", { 10, 4, 3, 5 }, function() return data.ToFloat(0.37) end },
    { "17 channels (more than the table serves)", { 6, 17, 4, 4 },
      function() return data.Compose { data.ToFloat(1 / 255), data.Normalize(0.3, 0.7) } end },
    { "planes of 8k + 1 .. 8k + 7 pixels, 1 and 3 channels", { 9, 3, 7, 9 },
      function() return data.Compose { data.ToFloat(1 / 255), data.Normalize({ 0.1, 0.2, 0.3 }, { 0.3, 0.4, 0.5 }) } end },
    { "a plane shorter than 8 pixels", { 5, 1, 2, 3 },
      function() return data.Compose { data.ToFloat(1 / 255), data.Normalize(0.2860, 0.3530) } end },
    { "rows of 13 with a crop (rows of 8k + 5 read one by one)", { 12, 2, 13, 13 },
      function() return data.Compose { data.RandomCrop(13, { padding = 3 }), data.ToFloat(1 / 255), data.Normalize(0.5, 0.2) } end },
  }
  for _, case in ipairs(cases) do
    it("matches the arithmetic path bitwise: " .. case[1], function()
      local u8 = dl.randint(0, 256, case[2], { dtype = "u8", generator = dl.Generator(11) })
      local f32 = u8:to("f32") -- the same levels, through the arithmetic path
      local idx = {}
      for i = 1, case[2][1] do idx[i] = (i * 7) % case[2][1] end
      local a = collate(u8, idx, case[3](), 5)
      local b = collate(f32, idx, case[3](), 5)
      assert.are.equal("f32", a.dtype)
      assert.are.equal(0, differing(a, b))
    end)
  end

  it("matches the arithmetic path bitwise on a strided (transposed) u8 source", function()
    -- samples whose rows are not contiguous take the element-by-element lookup
    local u8 = dl.randint(0, 256, { 16, 1, 11, 12 }, { dtype = "u8", generator = dl.Generator(3) })
    local t = u8:transpose(3, 4)
    local tf = function() return data.Compose { data.ToFloat(1 / 255), data.Normalize(0.2860, 0.3530) } end
    local idx = { 3, 0, 15, 7 }
    local a = collate(t, idx, tf(), 1)
    local b = collate(t:to("f32"), idx, tf(), 1)
    local c = collate(t:contiguous(), idx, tf(), 1) -- the same values through the plane path
    assert.are.same({ 4, 1, 12, 11 }, a:size())
    assert.are.equal(0, differing(a, b))
    assert.are.equal(0, differing(a, c))
  end)

  it("gives each u8 level the value (double)u * a + b rounded once", function()
    local levels = dl.arange(0, 256, { dtype = "i64" }):to("u8"):reshape({ 1, 1, 16, 16 })
    local x = collate(levels, { 0 }, data.Compose { data.ToFloat(1 / 255), data.Normalize(0.2860, 0.3530) }, 1)
    local p = ffi.cast("const float *", C.ddp_tensor_data(x))
    local a, b = (1 / 255) / 0.3530, -0.2860 / 0.3530
    local want = ffi.new("float[1]")
    for u = 0, 255 do
      want[0] = u * a + b -- Lua numbers are doubles; the store rounds once to f32
      assert.are.equal(want[0], p[u], "level " .. u)
    end
  end)
end)
