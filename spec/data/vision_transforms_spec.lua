-- Specs for ddplua.data.vision_transforms: Resize against PyTorch's interpolate (bilinear,
-- align_corners = False) for f32 and u8, CenterCrop's offsets and padding, the window
-- sampling of RandomResizedCrop, ColorJitter's brightness / contrast against torchvision's
-- formulas written in PyTorch, ToTensor, and Compose with the C transforms.
local dl = require "ddplua"
local data = require "ddplua.data"
local vision = require "ddplua.data.vision_transforms"
local torch_ref = require "torch_ref"

local function max_abs(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end

local function image(c, h, w, seed, dtype)
  local x = dl.rand({ c, h, w }, { generator = dl.Generator(seed) })
  if dtype == "u8" then return (x * 255):to("u8") end
  return x
end

describe("data.Resize", function()
  it("matches torch.nn.functional.interpolate(bilinear, align_corners = False) on f32 and u8", function()
    local ok, why = torch_ref.available()
    if not ok then return pending(why) end
    local xf = image(3, 13, 9, 1)
    local xu = image(1, 10, 17, 2, "u8")
    local out = {
      up = data.Resize { 20, 31 }(xf), down = data.Resize { 5, 4 }(xf), short = data.Resize(6)(xf),
      u8 = data.Resize { 7, 23 }(xu),
    }
    -- the smaller edge (9) becomes 6, the other int(6 * 13 / 9) = 8, as torchvision
    assert.are.same({ 3, 8, 6 }, out.short:size())
    local ref = torch_ref.run([[
import torch.nn.functional as F
def rs(x, h, w): return F.interpolate(x.unsqueeze(0), size=(h, w), mode="bilinear", align_corners=False).squeeze(0)
OUT["up"] = rs(T["xf"], 20, 31)
OUT["down"] = rs(T["xf"], 5, 4)
OUT["short"] = rs(T["xf"], 8, 6)
OUT["u8"] = rs(T["xu"].float(), 7, 23).round().to(torch.uint8)
]], { xf = xf, xu = xu })
    for _, k in ipairs { "up", "down", "short" } do
      assert.are.same(ref[k]:size(), out[k]:size(), k)
      assert.is_true(max_abs(ref[k], out[k]) < 1e-5, k .. ": " .. max_abs(ref[k], out[k]))
    end
    assert.are.equal("u8", out.u8.dtype)
    assert.is_true(max_abs(ref.u8, out.u8) <= 1, "u8: " .. max_abs(ref.u8, out.u8)) -- a .5 tie may round apart
  end)
end)

describe("data.CenterCrop", function()
  it("takes torchvision's central window (offsets rounded half to even) and pads a larger one", function()
    local x = dl.arange(0, 2 * 5 * 6):to("f32"):reshape { 2, 5, 6 }
    local c = data.CenterCrop { 2, 3 }(x)
    -- top = round((5 - 2) / 2) = round(1.5) = 2, left = round(1.5) = 2 (Python's round)
    assert.are.same({ 2, 2, 3 }, c:size())
    assert.are.equal(0, max_abs(x:narrow(2, 3, 2):narrow(3, 3, 3), c))
    local odd = data.CenterCrop(3)(x)
    -- top = round(1.0) = 1, left = round(1.5) = 2
    assert.are.equal(0, max_abs(x:narrow(2, 2, 3):narrow(3, 3, 3), odd))
    -- larger than the image: zero padding of (7 - 5) // 2 = 1 above, (8 - 6) // 2 = 1 left
    local big = data.CenterCrop { 7, 8 }(x)
    assert.are.same({ 2, 7, 8 }, big:size())
    assert.are.equal(0, max_abs(x, big:narrow(2, 2, 5):narrow(3, 2, 6)))
    assert.are.equal(0, big:narrow(2, 1, 1):abs():sum():item())
    assert.are.equal(0, big:narrow(3, 8, 1):abs():sum():item())
    assert.are.equal(2, vision.round(2.5))
    assert.are.equal(4, vision.round(3.5))
  end)
end)

describe("data.RandomResizedCrop", function()
  it("samples windows within torchvision's scale and ratio bounds, reproducibly", function()
    local g = dl.Generator(5)
    for _ = 1, 200 do
      local top, left, h, w = vision.resized_crop_params(40, 60, { 0.08, 1 }, { 3 / 4, 4 / 3 }, g)
      assert.is_true(top >= 0 and left >= 0 and top + h <= 40 and left + w <= 60)
      local area = h * w / (40 * 60)
      -- rounding h and w moves the area and ratio a little past the bounds
      assert.is_true(area > 0.06 and area <= 1.0, "area " .. area)
      assert.is_true(w / h > 0.7 and w / h < 1.45, "ratio " .. (w / h))
    end
    local x = dl.rand({ 3, 40, 60 }, { generator = dl.Generator(1) })
    local a = data.RandomResizedCrop(16)(x, dl.Generator(9))
    local b = data.RandomResizedCrop(16)(x, dl.Generator(9))
    assert.are.same({ 3, 16, 16 }, a:size())
    assert.are.equal(0, max_abs(a, b))
  end)

  it("falls back to the central crop clamped to the ratio range after 10 failed tries", function()
    -- a scale above 1 never fits: the fallback is the whole 10 x 40 image cut to ratio 2
    local top, left, h, w = vision.resized_crop_params(10, 40, { 1.5, 2 }, { 0.5, 2 }, dl.Generator(0))
    assert.are.same({ 0, 10, 10, 20 }, { top, left, h, w })
    top, left, h, w = vision.resized_crop_params(30, 10, { 1.5, 2 }, { 0.5, 2 }, dl.Generator(0))
    assert.are.same({ 5, 0, 20, 10 }, { top, left, h, w })
    assert.error_matches(function() data.RandomResizedCrop(8, { scale = { 1, 0.5 } }) end,
      "scale should be an increasing pair")
  end)
end)

describe("data.ColorJitter", function()
  it("matches torchvision's adjust_brightness and adjust_contrast (written in PyTorch)", function()
    local ok, why = torch_ref.available()
    if not ok then return pending(why) end
    local xu = (dl.rand({ 3, 6, 7 }, { generator = dl.Generator(3) }) * 255):to("u8")
    local xf = dl.rand({ 1, 5, 5 }, { generator = dl.Generator(4) })
    local out = {
      bu = data.ColorJitter { brightness = { 1.7, 1.7 } }(xu),
      cu = data.ColorJitter { contrast = { 0.4, 0.4 } }(xu),
      bf = data.ColorJitter { brightness = { 0.6, 0.6 } }(xf),
      cf = data.ColorJitter { contrast = { 2.5, 2.5 } }(xf),
    }
    local ref = torch_ref.run([[
def blend(a, b, r, bound): return (r * a + (1.0 - r) * b).clamp(0, bound)
xu, xf = T["xu"], T["xf"].float()
OUT["bu"] = blend(xu.float(), torch.zeros(1), 1.7, 255.0).to(torch.uint8)
r, g, b = xu.unbind(0)
gray = (0.2989 * r + 0.587 * g + 0.114 * b).to(torch.uint8)
OUT["cu"] = blend(xu.float(), gray.float().mean(), 0.4, 255.0).to(torch.uint8)
OUT["bf"] = blend(xf, torch.zeros(1, dtype=torch.float32), 0.6, 1.0)
OUT["cf"] = blend(xf, xf.mean(), 2.5, 1.0)
]], { xu = xu, xf = xf })
    for _, k in ipairs { "bu", "cu", "bf", "cf" } do
      assert.are.equal(ref[k].dtype, out[k].dtype, k)
      local tol = out[k].dtype == "u8" and 1 or 1e-5 -- f32 sums in another order may cross a truncation
      assert.is_true(max_abs(ref[k], out[k]) <= tol, k .. ": " .. max_abs(ref[k], out[k]))
    end
  end)

  it("draws factors in the given range and raises torchvision's errors", function()
    local x = dl.full({ 1, 2, 2 }, 0.5)
    local g = dl.Generator(2)
    local jitter = data.ColorJitter { brightness = 0.5 }
    for _ = 1, 20 do
      local v = jitter(x, g):max():item()
      assert.is_true(v >= 0.25 - 1e-6 and v <= 0.75 + 1e-6, tostring(v))
    end
    assert.error_matches(function() data.ColorJitter { brightness = -1 } end, "it must be non negative")
    assert.error_matches(function() data.ColorJitter { hue = 0.1 } end, "unknown option 'hue'")
  end)
end)

describe("data.ToTensor", function()
  it("turns u8 (H, W, C) into f32 (C, H, W) / 255", function()
    local hwc = (dl.rand({ 4, 5, 3 }, { generator = dl.Generator(8) }) * 255):to("u8")
    local t = data.ToTensor()(hwc)
    assert.are.same({ 3, 4, 5 }, t:size())
    assert.are.equal("f32", t.dtype)
    assert.is_true(max_abs(hwc:permute { 3, 1, 2 }:to("f32") / 255, t) < 1e-7)
    assert.error_matches(function() data.ToTensor()(t) end, "to_tensor: expected a u8 CPU image %(H, W, C%)")
  end)

  it("composes with Normalize and the C transforms", function()
    local hwc = (dl.rand({ 8, 8, 3 }, { generator = dl.Generator(1) }) * 255):to("u8")
    local tf = data.Compose { data.ToTensor(), data.CenterCrop(6), data.Normalize({ 0.5, 0.5, 0.5 }, { 0.25, 0.25, 0.25 }) }
    local y = tf(hwc)
    assert.are.same({ 3, 6, 6 }, y:size())
    local ref = (hwc:permute { 3, 1, 2 }:to("f32") / 255):narrow(2, 2, 6):narrow(3, 2, 6)
    assert.is_true(max_abs((ref - 0.5) / 0.25, y) < 1e-5)
    assert.are.equal("Compose{ToTensor(), CenterCrop({6, 6}), Normalize({0.5, 0.5, 0.5}, {0.25, 0.25, 0.25})}", tostring(tf))
  end)
end)

describe("the vision transforms against torchvision 0.14's functional", function()
  it("give torchvision's resize (antialias False), center_crop, adjust_* and to_tensor", function()
    local ok, why = torch_ref.available()
    if not ok then return pending(why) end
    local probe = io.popen("/usr/bin/python3 -c 'import torchvision' 2>&1; echo rc=$?")
    local txt = probe:read("*a")
    probe:close()
    if not txt:match("rc=0%s*$") then return pending("no torchvision (python3-torchvision)") end
    local xu = (dl.rand({ 3, 13, 10 }, { generator = dl.Generator(11) }) * 255):to("u8")
    local xf = dl.rand({ 3, 7, 12 }, { generator = dl.Generator(12) })
    local hwc = xu:permute { 2, 3, 1 }:contiguous()
    local out = {
      resize_u8 = data.Resize(6)(xu), resize_f = data.Resize { 11, 5 }(xf),
      crop_u8 = data.CenterCrop { 6, 5 }(xu), crop_big = data.CenterCrop { 16, 9 }(xf),
      bright_u8 = data.ColorJitter { brightness = { 1.3, 1.3 } }(xu),
      contrast_u8 = data.ColorJitter { contrast = { 0.6, 0.6 } }(xu),
      contrast_f = data.ColorJitter { contrast = { 1.8, 1.8 } }(xf),
      to_tensor = data.ToTensor()(hwc),
    }
    local ref = torch_ref.run([[
import torchvision.transforms.functional as F
torch.set_default_dtype(torch.float32)  # as torchvision runs (the helper sets f64)
xu, xf = T["xu"], T["xf"].float()
OUT["resize_u8"] = F.resize(xu, 6, antialias=False)
OUT["resize_f"] = F.resize(xf, [11, 5], antialias=False)
OUT["crop_u8"] = F.center_crop(xu, [6, 5])
OUT["crop_big"] = F.center_crop(xf, [16, 9])
OUT["bright_u8"] = F.adjust_brightness(xu, 1.3)
OUT["contrast_u8"] = F.adjust_contrast(xu, 0.6)
OUT["contrast_f"] = F.adjust_contrast(xf, 1.8)
OUT["to_tensor"] = F.to_tensor(T["hwc"].numpy())
]], { xu = xu, xf = xf, hwc = hwc })
    for k, v in pairs(out) do
      assert.are.same(ref[k]:size(), v:size(), k)
      assert.are.equal(ref[k].dtype, v.dtype, k)
      local tol = v.dtype == "u8" and 0 or 1e-6
      assert.is_true(max_abs(ref[k], v) <= tol, k .. ": " .. max_abs(ref[k], v))
    end
  end)
end)
