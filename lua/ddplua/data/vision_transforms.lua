--- ddplua.data.vision_transforms: the vision transforms that change an image's size or
-- colours (torchvision.transforms' names and sampling), each a transform object run on
-- one sample by a C kernel of runtime/io/image_ops.c (ddplua/image.h). They take images
-- (C, H, W) of u8 or f32 (ToTensor takes u8 (H, W, C)) and compose with data.Compose,
-- data.Normalize, data.RandomHorizontalFlip, data.ToFloat.
--
--   data.Resize(size)                    bilinear; size a number (the smaller edge, the
--                                        other scaled and truncated as torchvision) or {h, w}
--   data.CenterCrop(size)                the central window (zero-padded when larger)
--   data.RandomResizedCrop(size, {scale = {0.08, 1}, ratio = {3/4, 4/3}})
--   data.ColorJitter{brightness = b, contrast = c}
--   data.ToTensor()                      u8 (H, W, C) -> f32 (C, H, W) / 255
--
-- Resize is torchvision's resize of tensors with antialias = False (the default of
-- torchvision 0.14 for tensors): torch.nn.functional.interpolate(mode = "bilinear",
-- align_corners = False), u8 results rounded. PIL images are resized with antialiasing,
-- so a downscale here differs from a PIL pipeline's. Random parameters come from the
-- generator given to the call (the dataset's or the default one), drawn as
-- ddplua.data.draw describes; the draws follow torchvision's recipe but not its stream
-- (PyTorch's Mersenne Twister), so the same seed gives other crops than PyTorch's.
local lib = require "ddplua.lib"
local transforms = require "ddplua.data.transforms"
local draw = require "ddplua.data.draw"
local C = lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

-- Python's round() to an integer: half to even.
local function round(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 then return f + 1 end
  if d < 0.5 then return f end
  return f % 2 == 0 and f or f + 1
end
M.round = round

-- Height and width of an image (C, H, W) (or (H, W)).
local function hw(x, op)
  if not require("ddplua.tensor").is_tensor(x) or x:dim() < 2 then
    lib.raise(op .. ": expected an image tensor (C, H, W), got " .. tostring(x))
  end
  local d = x:dim()
  return x:size(d - 1), x:size(d)
end

local function size_pair(size, op)
  local h, w
  if type(size) == "number" then h, w = size, size
  elseif type(size) == "table" then h, w = size[1], size[2] end
  if type(h) ~= "number" or type(w) ~= "number" or h < 1 or w < 1 or h % 1 ~= 0 or w % 1 ~= 0 then
    lib.raise(op .. ": size must be a positive integer or {h, w}, got " .. tostring(size))
  end
  return h, w
end

local function resized_crop(x, top, left, h, w, oh, ow)
  check(C.ddp_image_resized_crop(box, x, top, left, h, w, oh, ow))
  return wrap(box[0])
end

--- data.Resize(size): resize (C, H, W) by bilinear interpolation (see the top of this
-- file). size a number: the smaller edge becomes size and the other int(size * long /
-- short) (torchvision's rule); {h, w}: exactly that. u8 stays u8, f32 stays f32.
function M.Resize(size)
  local fixed = type(size) == "table"
  local sh, sw = size_pair(size, "Resize")
  return transforms.new_step("resize", { size = size, describe = "Resize(" .. (fixed and ("{" .. sh .. ", " .. sw .. "}") or sh) .. ")" },
    function(_, x)
      local h, w = hw(x, "Resize")
      local oh, ow = sh, sw
      if not fixed then
        if w <= h then ow, oh = sh, math.floor(sh * h / w) else oh, ow = sh, math.floor(sh * w / h) end
      end
      return resized_crop(x, 0, 0, h, w, oh, ow)
    end)
end

--- data.CenterCrop(size): the central size x size (or {h, w}) window of (C, H, W), with
-- torchvision's offsets (top = round((H - h) / 2), half to even); a window larger than the
-- image is padded with zeros around it first (as torchvision's center_crop).
function M.CenterCrop(size)
  local ch, cw = size_pair(size, "CenterCrop")
  return transforms.new_step("center_crop", { describe = ("CenterCrop({%d, %d})"):format(ch, cw) }, function(_, x)
    local h, w = hw(x, "CenterCrop")
    local top = ch > h and -math.floor((ch - h) / 2) or round((h - ch) / 2)
    local left = cw > w and -math.floor((cw - w) / 2) or round((w - cw) / 2)
    return resized_crop(x, top, left, ch, cw, ch, cw)
  end)
end

--- RandomResizedCrop.params(h, w, scale, ratio, generator) -> top, left, ch, cw: the
-- window torchvision's get_params picks for an image of h x w: up to 10 tries of an area
-- fraction uniform in scale and a log-uniform aspect ratio in ratio, cw = round(sqrt(area
-- * r)), ch = round(sqrt(area / r)), kept when it fits and placed uniformly; else the
-- central crop of the whole image clamped to the ratio range.
function M.resized_crop_params(h, w, scale, ratio, gen)
  local area = h * w
  local lr0, lr1 = math.log(ratio[1]), math.log(ratio[2])
  for _ = 1, 10 do
    local u = draw.uniforms(gen, 2)
    local target = area * (scale[1] + (scale[2] - scale[1]) * u[1])
    local ar = math.exp(lr0 + (lr1 - lr0) * u[2])
    local cw = round(math.sqrt(target * ar))
    local ch = round(math.sqrt(target / ar))
    if cw > 0 and cw <= w and ch > 0 and ch <= h then
      local top = draw.randint(gen, 0, h - ch)
      local left = draw.randint(gen, 0, w - cw)
      return top, left, ch, cw
    end
  end
  local in_ratio = w / h
  local ch, cw
  if in_ratio < math.min(ratio[1], ratio[2]) then
    cw = w; ch = round(cw / math.min(ratio[1], ratio[2]))
  elseif in_ratio > math.max(ratio[1], ratio[2]) then
    ch = h; cw = round(ch * math.max(ratio[1], ratio[2]))
  else
    cw, ch = w, h
  end
  return math.floor((h - ch) / 2), math.floor((w - cw) / 2), ch, cw
end

--- data.RandomResizedCrop(size, {scale = {0.08, 1.0}, ratio = {3/4, 4/3}}): a random window
-- (resized_crop_params) resized to size x size (or {h, w}) by bilinear interpolation.
-- Raises for a scale or ratio that is not an increasing pair of positive numbers.
function M.RandomResizedCrop(size, opts)
  local oh, ow = size_pair(size, "RandomResizedCrop")
  opts = opts or {}
  local scale = opts.scale or { 0.08, 1.0 }
  local ratio = opts.ratio or { 3 / 4, 4 / 3 }
  for name, p in pairs { scale = scale, ratio = ratio } do
    if type(p) ~= "table" or type(p[1]) ~= "number" or type(p[2]) ~= "number" or p[1] > p[2] or p[1] < 0
      or (name == "ratio" and p[1] <= 0) then
      lib.raise(("RandomResizedCrop: %s should be an increasing pair {min, max} of positive numbers, got %s"):format(
        name, type(p) == "table" and ("{" .. tostring(p[1]) .. ", " .. tostring(p[2]) .. "}") or tostring(p)))
    end
  end
  return transforms.new_step("random_resized_crop",
    { scale = scale, ratio = ratio, describe = ("RandomResizedCrop({%d, %d})"):format(oh, ow) },
    function(_, x, gen)
      local h, w = hw(x, "RandomResizedCrop")
      local top, left, ch, cw = M.resized_crop_params(h, w, scale, ratio, gen)
      return resized_crop(x, top, left, ch, cw, oh, ow)
    end)
end

-- torchvision's _check_input: a number v gives {max(0, 1 - v), 1 + v}; a pair as is.
local function jitter_range(v, name)
  if v == nil or v == 0 then return nil end
  if type(v) == "number" then
    if v < 0 then lib.raise(("ColorJitter: If %s is a single number, it must be non negative (got %s)"):format(name, v)) end
    return { math.max(0, 1 - v), 1 + v }
  end
  if type(v) == "table" and type(v[1]) == "number" and type(v[2]) == "number" and 0 <= v[1] and v[1] <= v[2] then
    if v[1] == 1 and v[2] == 1 then return nil end
    return { v[1], v[2] }
  end
  lib.raise(("ColorJitter: %s values should be between 0 and inf and in increasing order, got %s"):format(name, tostring(v)))
end

--- data.ColorJitter{brightness = b, contrast = c}: torchvision's ColorJitter limited to
-- brightness and contrast: each a number v >= 0 (factor uniform in [max(0, 1 - v), 1 + v])
-- or a pair {min, max}; 0 or nil leaves it out. The two adjustments run in a random order
-- with factors drawn per call (ddp_image_adjust: brightness scales, contrast blends with
-- the mean gray level; results clamped to [0, 255] (u8) or [0, 1] (f32)).
function M.ColorJitter(opts)
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "brightness" and k ~= "contrast" then
      lib.raise("ColorJitter: unknown option '" .. tostring(k) .. "' (brightness and contrast are supported)")
    end
  end
  local b, c = jitter_range(opts.brightness, "brightness"), jitter_range(opts.contrast, "contrast")
  return transforms.new_step("color_jitter", { brightness = b, contrast = c, describe = "ColorJitter" },
    function(_, x, gen)
      local u = draw.uniforms(gen, 3)
      local ops = {}
      if b then ops[#ops + 1] = { C.DDP_IMAGE_BRIGHTNESS, b[1] + (b[2] - b[1]) * u[2] } end
      if c then ops[#ops + 1] = { C.DDP_IMAGE_CONTRAST, c[1] + (c[2] - c[1]) * u[3] } end
      if #ops == 2 and u[1] < 0.5 then ops[1], ops[2] = ops[2], ops[1] end
      for _, o in ipairs(ops) do
        check(C.ddp_image_adjust(box, x, o[1], o[2]))
        x = wrap(box[0])
      end
      return x
    end)
end

--- data.ToTensor(): torchvision's ToTensor for arrays: u8 (H, W, C) (or (H, W)) -> f32
-- (C, H, W) divided by 255. For images read as (C, H, W) (the default layout) use
-- data.ToFloat() instead.
function M.ToTensor()
  return transforms.new_step("to_tensor", { describe = "ToTensor()" }, function(_, x)
    check(C.ddp_image_to_tensor(box, x))
    return wrap(box[0])
  end)
end

return M
