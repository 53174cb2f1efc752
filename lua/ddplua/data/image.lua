--- ddplua.data.image: PNG / JPEG files to and from u8 image tensors (C in
-- runtime/io/image.c: libpng, libjpeg-turbo; ddplua/image.h).
--
--   local img = data.read_image("cat.jpg")                 -- u8 (3, H, W)
--   local g = data.read_image("cat.png", {mode = "gray", layout = "HWC"})   -- u8 (H, W, 1)
--   data.write_png("out.png", img); data.write_jpeg("out.jpg", img, 90)
local lib = require "ddplua.lib"
local C = lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

local MODES = { unchanged = 0, gray = 1, rgb = 3 }
local LAYOUTS = { CHW = 0, HWC = 1 }

--- image.mode_code(mode, op) / image.layout_code(layout, op): the C codes of the option
-- values ("unchanged" | "gray" | "rgb"; "CHW" | "HWC"); raise naming op otherwise.
function M.mode_code(mode, op)
  local m = MODES[mode or "unchanged"]
  if not m then lib.raise(("%s: mode must be 'unchanged', 'gray' or 'rgb', got %s"):format(op, tostring(mode))) end
  return m
end
function M.layout_code(layout, op)
  local l = LAYOUTS[layout or "CHW"]
  if not l then lib.raise(("%s: layout must be 'CHW' or 'HWC', got %s"):format(op, tostring(layout))) end
  return l
end

--- data.read_image(path, {mode = "unchanged", layout = "CHW"}) -> u8 tensor: the PNG or
-- JPEG file (told apart by its first bytes) as (C, H, W) (layout "CHW",
-- torchvision.io.read_image's) or (H, W, C) ("HWC", PIL / NumPy's). mode "unchanged" keeps
-- the file's channels (1 gray, 2 gray + alpha, 3 RGB, 4 RGBA), "gray" gives 1 channel (PIL's
-- convert("L") luma), "rgb" 3 (alpha dropped, gray replicated). Raises naming the file and
-- the fault (cannot open, not a PNG or JPEG, corrupt or truncated data, too large).
function M.read_image(path, opts)
  lib.path(path, "read_image")
  opts = opts or {}
  check(C.ddp_image_read(box, path, M.mode_code(opts.mode, "read_image"), M.layout_code(opts.layout, "read_image")))
  return wrap(box[0])
end

--- data.write_png(path, img): write img, u8 (C, H, W) with C = 1 or 3, as a PNG file
-- (atomically). Raises naming the fault (dtype, shape) or the file.
function M.write_png(path, img)
  lib.path(path, "write_png")
  check(C.ddp_image_write_png(path, img))
end

--- data.write_jpeg(path, img[, quality = 90]): write img, u8 (C, H, W) with C = 1 or 3,
-- as a baseline JPEG of quality 1..100 (atomically). Raises as write_png.
function M.write_jpeg(path, img, quality)
  lib.path(path, "write_jpeg")
  quality = quality or 90
  if type(quality) ~= "number" or quality % 1 ~= 0 then
    lib.raise("write_jpeg: quality must be an integer 1..100, got " .. tostring(quality))
  end
  check(C.ddp_image_write_jpeg(path, img, quality))
end

return M
