-- Specs for ddplua.data's image files and folders: PNG / JPEG round trips through
-- write_png / write_jpeg and read_image (modes, layouts), malformed files (each error names
-- the file), and ImageFolder / DatasetFolder (torchvision's classes, order and errors).
local dl = require "ddplua"
local data = require "ddplua.data"
local files = require "files"

local tmpdir
setup(function() tmpdir = files.tmpdir("image") end)
teardown(function() files.remove(tmpdir) end)

local function write_bytes(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

local function read_bytes(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- A u8 RGB test image (3, h, w) with smooth gradients (JPEG keeps them well).
local function gradient(h, w)
  local t = {}
  for c = 1, 3 do
    t[c] = {}
    for y = 1, h do
      t[c][y] = {}
      for x = 1, w do
        local v = math.floor(200 * ((y - 1) * w + x - 1) / (h * w))
        t[c][y][x] = c == 1 and v or c == 2 and 90 or 255 - v
      end
    end
  end
  return dl.tensor(t, { dtype = "u8" })
end

local function max_abs(a, b) return (a:to("f32") - b:to("f32")):abs():max():item() end

describe("data.read_image / write_png / write_jpeg", function()
  it("round-trips PNG exactly, RGB and gray, CHW and HWC", function()
    local img = gradient(5, 7)
    local p = tmpdir .. "/rgb.png"
    data.write_png(p, img)
    local back = data.read_image(p)
    assert.are.same({ 3, 5, 7 }, back:size())
    assert.are.equal("u8", back.dtype)
    assert.are.equal(0, max_abs(img, back))
    local hwc = data.read_image(p, { layout = "HWC" })
    assert.are.same({ 5, 7, 3 }, hwc:size())
    assert.are.equal(0, max_abs(img:permute { 2, 3, 1 }, hwc))
    local gray = img:narrow(1, 2, 1):contiguous()
    data.write_png(tmpdir .. "/g.png", gray)
    local g1 = data.read_image(tmpdir .. "/g.png")
    assert.are.same({ 1, 5, 7 }, g1:size())
    assert.are.equal(0, max_abs(gray, g1))
    -- gray -> rgb replicates the channel
    local g3 = data.read_image(tmpdir .. "/g.png", { mode = "rgb" })
    assert.are.same({ 3, 5, 7 }, g3:size())
    for c = 1, 3 do assert.are.equal(0, max_abs(gray, g3:narrow(1, c, 1))) end
  end)

  it("converts RGB to gray with PIL's luma, (19595 R + 38470 G + 7471 B + 2^15) >> 16", function()
    local img = gradient(4, 6)
    data.write_png(tmpdir .. "/c.png", img)
    local g = data.read_image(tmpdir .. "/c.png", { mode = "gray" })
    assert.are.same({ 1, 4, 6 }, g:size())
    local f = img:to("f64")
    local ref = dl.zeros { 1, 4, 6 }
    for y = 1, 4 do
      for x = 1, 6 do
        local r, gg, b = f:get(1, y, x), f:get(2, y, x), f:get(3, y, x)
        ref:narrow(2, y, 1):narrow(3, x, 1):fill_(math.floor((19595 * r + 38470 * gg + 7471 * b + 32768) / 65536))
      end
    end
    assert.are.equal(0, max_abs(ref, g))
  end)

  it("round-trips JPEG within the codec's error", function()
    local img = gradient(16, 16)
    data.write_jpeg(tmpdir .. "/a.jpg", img, 95)
    assert.are.equal("\255\216\255", read_bytes(tmpdir .. "/a.jpg"):sub(1, 3))
    local back = data.read_image(tmpdir .. "/a.jpg")
    assert.are.same({ 3, 16, 16 }, back:size())
    assert.is_true(max_abs(img, back) <= 12, "max error " .. max_abs(img, back))
    assert.is_true(max_abs(img, back) > 0) -- it went through the lossy codec
  end)

  it("names the file and the fault for malformed files, never crashing", function()
    local img = gradient(8, 8)
    data.write_png(tmpdir .. "/ok.png", img)
    data.write_jpeg(tmpdir .. "/ok.jpg", img, 90)
    local png, jpg = read_bytes(tmpdir .. "/ok.png"), read_bytes(tmpdir .. "/ok.jpg")
    local bad = {
      { "empty.png", "", "is not a PNG or JPEG file %(0 bytes" },
      { "text.png", "hello world", "is not a PNG or JPEG file %(11 bytes, starting 68 65 6c 6c 6f 20 77 6f" },
      { "trunc.png", png:sub(1, #png - 20), "corrupt PNG" },
      { "head.png", png:sub(1, 20), "corrupt PNG" },
      { "trunc.jpg", jpg:sub(1, math.floor(#jpg / 2)), "corrupt JPEG" },
      { "head.jpg", jpg:sub(1, 4), "corrupt JPEG" },
    }
    for _, case in ipairs(bad) do
      local path = write_bytes(tmpdir .. "/" .. case[1], case[2])
      local ok, err = pcall(data.read_image, path)
      assert.is_false(ok, case[1])
      assert.is_truthy(tostring(err):find(path, 1, true), tostring(err))
      assert.is_truthy(tostring(err):find(case[3]), case[1] .. ": " .. tostring(err))
    end
    assert.error_matches(function() data.read_image(tmpdir .. "/missing.png") end, "cannot open .*missing.png: No such file")
    assert.error_matches(function() data.read_image(tmpdir .. "/ok.png", { mode = "cmyk" }) end, "mode must be")
    assert.error_matches(function() data.write_png(tmpdir .. "/x.png", img:to("f32")) end,
      "write_png: .*x.png: expected a u8 CPU image %(C, H, W%) with C = 1 or 3, got a 3d f32 tensor")
    assert.error_matches(function() data.write_jpeg(tmpdir .. "/x.jpg", img, 101) end, "quality must be 1 .. 100, got 101")
  end)
end)

describe("data.ImageFolder", function()
  local root
  setup(function()
    root = tmpdir .. "/folder"
    local img = gradient(6, 6)
    for _, p in ipairs { "b_dog/2.png", "b_dog/1.JPG", "a_cat/z.png", "a_cat/sub/a.jpg", "a_cat/notes.txt",
      "c_empty_ok/x.jpeg" } do
      local dir = (root .. "/" .. p):match("(.*)/[^/]*$")
      require("ddplua.os").mkdir_p(dir)
      if p:match("%.png$") then data.write_png(root .. "/" .. p, img)
      elseif p:match("%.txt$") then write_bytes(root .. "/" .. p, "not an image")
      else data.write_jpeg(root .. "/" .. p, img, 90) end
    end
  end)

  it("has torchvision's classes, class_to_idx, samples and targets", function()
    local ds = data.ImageFolder { root = root }
    assert.are.same({ "a_cat", "b_dog", "c_empty_ok" }, ds.classes)
    assert.are.same({ a_cat = 0, b_dog = 1, c_empty_ok = 2 }, ds.class_to_idx)
    -- sorted(os.walk): the class folder's own files first ("a_cat" < "a_cat/sub"), names sorted
    assert.are.same({
      { root .. "/a_cat/z.png", 0 }, { root .. "/a_cat/sub/a.jpg", 0 },
      { root .. "/b_dog/1.JPG", 1 }, { root .. "/b_dog/2.png", 1 }, { root .. "/c_empty_ok/x.jpeg", 2 },
    }, ds.samples)
    assert.are.same({ 0, 0, 1, 1, 2 }, ds.targets)
    assert.are.equal(5, #ds)
    local x, y = ds:get(4)
    assert.are.same({ 3, 6, 6 }, x:size())
    assert.are.equal(1, y)
    local g = data.ImageFolder { root = root, mode = "gray", layout = "HWC" }
    assert.are.same({ 6, 6, 1 }, g:get(1):size())
  end)

  it("applies transform and target_transform, and batches through a DataLoader", function()
    local ds = data.ImageFolder { root = root, transform = data.Compose { data.Resize(4), data.ToFloat() },
      target_transform = function(t) return t * 10 end }
    local x, y = ds:get(1)
    assert.are.same({ 3, 4, 4 }, x:size())
    assert.are.equal("f32", x.dtype)
    assert.are.equal(0, y)
    local n = 0
    for bx, by in data.DataLoader(ds, { batch_size = 2 }):iter() do
      n = n + by:size(1)
      assert.are.same({ by:size(1), 3, 4, 4 }, bx:size())
    end
    assert.are.equal(5, n)
  end)

  it("takes is_valid_file or extensions (not both), and raises torchvision's errors", function()
    local ds = data.DatasetFolder { root = root .. "/", loader = function(p) return p end,
      is_valid_file = function(p) return p:match("%.txt$") == nil end }
    assert.are.equal(5, #ds)
    assert.are.equal(root .. "/a_cat/z.png", (ds:get(1)))
    assert.error_matches(function() data.DatasetFolder { root = root, loader = function(p) return p end,
      is_valid_file = function(p) return p:match("%.txt$") ~= nil end } end,
      "Found no valid file for the classes b_dog, c_empty_ok")
    assert.error_matches(function() data.ImageFolder { root = root, extensions = { ".png" } } end,
      "Found no valid file for the classes c_empty_ok%. Supported extensions are: %.png")
    assert.error_matches(function() data.ImageFolder { root = root .. "/a_cat/sub" } end,
      "Couldn't find any class folder in .*a_cat/sub%.")
    assert.error_matches(function() data.ImageFolder { root = tmpdir .. "/nowhere" } end,
      "cannot open folder .*nowhere: No such file")
    assert.error_matches(function() data.DatasetFolder { root = root, loader = function(p) return p end,
      extensions = { ".txt" }, is_valid_file = function() return true end } end,
      "Both extensions and is_valid_file cannot be None or not None at the same time")
  end)
end)

describe("data.ImageFolder against torchvision 0.14", function()
  local pytorch = require "pytorch"

  it("finds the same classes, samples and targets, and decodes the same pixels as PIL", function()
    local root = tmpdir .. "/tv"
    local os_ = require "ddplua.os"
    local img = gradient(9, 11)
    local names = { "zeta/b.png", "zeta/A.png", "Alpha/x/y/1.jpg", "Alpha/x/0.png", "Alpha/2.jpeg", "beta/q.JPG",
      "beta/skip.txt", "beta/sub.png/ok.png" }
    for _, p in ipairs(names) do
      local full = root .. "/" .. p
      os_.mkdir_p(full:match("(.*)/[^/]*$"))
      if p:match("%.txt$") then write_bytes(full, "x")
      elseif p:lower():match("%.png$") then data.write_png(full, img)
      else data.write_jpeg(full, img, 85) end
    end
    local ref, why = pytorch.run(([==[
import torchvision, numpy as np
from PIL import Image
ds = torchvision.datasets.ImageFolder(%q)
pix = [np.asarray(Image.open(p).convert("RGB")).astype(int).tolist() for p, _ in ds.samples]
gray = [np.asarray(Image.open(p).convert("L")).astype(int).tolist() for p, _ in ds.samples]
print(json.dumps({"classes": ds.classes, "class_to_idx": ds.class_to_idx,
                  "samples": [[p, t] for p, t in ds.samples], "targets": ds.targets, "pix": pix, "gray": gray}))
]==]):format(root))
    if not ref then return pending(why) end
    local ds = data.ImageFolder { root = root, layout = "HWC" }
    assert.are.same(ref.classes, ds.classes)
    assert.are.same(ref.class_to_idx, ds.class_to_idx)
    assert.are.same(ref.samples, ds.samples)
    assert.are.same(ref.targets, ds.targets)
    local gds = data.ImageFolder { root = root, mode = "gray" }
    for i = 1, #ds do
      local x = ds:get(i)
      local g = gds:get(i)
      local h, w = x:size(1), x:size(2)
      local worst, gworst = 0, 0
      for y = 1, h do
        for xx = 1, w do
          for c = 1, 3 do worst = math.max(worst, math.abs(x:get(y, xx, c) - ref.pix[i][y][xx][c])) end
          gworst = math.max(gworst, math.abs(g:get(1, y, xx) - ref.gray[i][y][xx]))
        end
      end
      assert.are.equal(0, worst, ds.samples[i][1])   -- libpng and libjpeg-turbo, as PIL's
      assert.are.equal(0, gworst, ds.samples[i][1])  -- and PIL's convert("L")
    end
  end)
end)
