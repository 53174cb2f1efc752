-- Fashion-MNIST held as u8 and normalised batch by batch in the loader (issue 16, part 4):
-- the training set costs its own 47 MB, not the 188 MB of an f32 copy, and the batches the
-- DataLoader makes from the u8 images are, bit for bit, ToFloat then Normalize computed on
-- each pixel as ddplua/io.h specifies (out = (float)(u * (scale / std) - mean / std), in
-- double, rounded once), over the whole training set in a shuffled order.
local ffi = require "ffi"
local dl = require "ddplua"
local data = require "ddplua.data"
local C = require("ddplua.lib").C

local ROOT = "/usr/share/datasets/fashion-mnist"

local function have_data()
  local f = io.open(ROOT .. "/train-images-idx3-ubyte.gz", "rb")
  if f then f:close() end
  return f ~= nil
end

describe("Fashion-MNIST in memory", function()
  it("holds the images as u8 (N, 1, 28, 28): 47 MB for the training set", function()
    if not have_data() then return pending("no Fashion-MNIST files in " .. ROOT) end
    collectgarbage()
    local before = dl.memory_stats().live
    local ds = data.FashionMNIST { train = true }
    collectgarbage()
    local held = dl.memory_stats().live - before
    assert.are.equal("u8", ds.data.dtype)
    assert.are.same({ 60000, 1, 28, 28 }, ds.data:size())
    -- 47,040,000 image bytes and 480,000 bytes of i64 labels; an f32 copy would be 188 MB
    assert.is_true(held >= 47040000 + 480000 and held < 48 * 2 ^ 20, "held " .. held .. " bytes")
  end)

  it("gives loader batches bitwise equal to Normalize's arithmetic on the u8 pixels, whole training set", function()
    if not have_data() then return pending("no Fashion-MNIST files in " .. ROOT) end
    local ds = data.FashionMNIST { train = true }
    local n = #ds
    local order = dl.randperm(n, { generator = dl.Generator(7) })
    local loader = data.DataLoader(ds, { batch_size = 64, sampler = { indices = function() return order end } })
    local px = ffi.cast("const uint8_t *", C.ddp_tensor_data(ds.data))
    local labels = ffi.cast("const int64_t *", C.ddp_tensor_data(ds.targets))
    local idx = ffi.cast("const int64_t *", C.ddp_tensor_data(order))
    -- the transform's constants as the C spec receives them (FashionMNIST's default)
    local scale, mean, std = 1 / 255, 0.2860, 0.3530
    local a, b = scale / std, -mean / std
    local ref = ffi.new("float[256]") -- Normalize's value of each u8 level, rounded to f32
    for u = 0, 255 do ref[u] = u * a + b end
    local ref_bits = ffi.cast("const uint32_t *", ref)
    local pos, mismatches, first = 0, 0, nil
    for x, y in loader:iter() do
      assert.are.equal("f32", x.dtype)
      local B = x:size(1)
      local xb = ffi.cast("const uint32_t *", C.ddp_tensor_data(x))
      local yb = ffi.cast("const int64_t *", C.ddp_tensor_data(y))
      for s = 0, B - 1 do
        local i = tonumber(idx[pos + s])
        if yb[s] ~= labels[i] then mismatches = mismatches + 1; first = first or ("label of sample " .. i) end
        local src, dst = px + i * 784, xb + s * 784
        for k = 0, 783 do
          if dst[k] ~= ref_bits[src[k]] then
            mismatches = mismatches + 1
            first = first or ("sample " .. i .. " pixel " .. k)
          end
        end
      end
      pos = pos + B
    end
    assert.are.equal(n, pos)
    assert.are.equal(0, mismatches, first)
  end)
end)
