--- ddplua.data.image_folder: DatasetFolder and ImageFolder, datasets of files sorted into
-- one folder per class (torchvision.datasets.DatasetFolder / ImageFolder):
--
--   root/cat/001.png, root/cat/nested/002.jpg, root/dog/003.png, ...
--
--   local ds = data.ImageFolder{root = "root", transform = data.Compose{data.Resize(32),
--                               data.ToFloat(), data.Normalize(0.5, 0.5)}}
--   ds.classes       -- {"cat", "dog"}: the class folders, sorted
--   ds.class_to_idx  -- {cat = 0, dog = 1}: class labels count from 0, as torchvision's
--   ds.samples       -- {{"root/cat/001.png", 0}, ...}: sorted by folder, then file name
--   ds.targets       -- {0, 0, 1, ...}
--   local img, label = ds:get(1)
--
-- Files are read when a sample is asked for (the DataLoader's Lua path, one ds:get per
-- sample). Order is torchvision's: classes sorted by name; within a class, the folders of
-- its tree sorted by path (sorted(os.walk(...))) and each folder's files sorted by name;
-- names compare byte by byte.
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local transforms = require "ddplua.data.transforms"
local image = require "ddplua.data.image"
local os_ = require "ddplua.os"

local M = {}

--- The file name extensions ImageFolder accepts by default (lower case; the decoders'
-- formats: torchvision's IMG_EXTENSIONS less the formats ddplua does not decode).
M.IMG_EXTENSIONS = { ".jpg", ".jpeg", ".png" }

--- image_folder.find_classes(root) -> classes, class_to_idx: the sub-folders of root,
-- sorted, and their labels 0 .. K-1. Raises "Couldn't find any class folder in <root>."
-- as torchvision, or naming the folder that cannot be read.
function M.find_classes(root)
  local classes = {}
  for _, e in ipairs(os_.list_dir(root)) do
    if e.type == "dir" then classes[#classes + 1] = e.name end
  end
  table.sort(classes)
  if #classes == 0 then lib.raise("DatasetFolder: Couldn't find any class folder in " .. root .. ".") end
  local idx = {}
  for i, c in ipairs(classes) do idx[c] = i - 1 end
  return classes, idx
end

local function has_extension(name, exts)
  local lower = name:lower()
  for _, e in ipairs(exts) do
    if #lower >= #e and lower:sub(-#e) == e:lower() then return true end
  end
  return false
end

-- Every (folder, file names) under dir, recursively, as os.walk with followlinks.
local function walk(dir, out, depth)
  if depth > 64 then lib.raise("DatasetFolder: folders nested more than 64 deep under " .. dir .. " (a link cycle?)") end
  local files, subdirs = {}, {}
  for _, e in ipairs(os_.list_dir(dir)) do
    if e.type == "dir" then subdirs[#subdirs + 1] = e.name else files[#files + 1] = e.name end
  end
  out[#out + 1] = { dir = dir, files = files }
  table.sort(subdirs)
  for _, s in ipairs(subdirs) do walk(dir .. "/" .. s, out, depth + 1) end
  return out
end

--- image_folder.make_dataset(root, class_to_idx, extensions, is_valid_file) -> samples:
-- the list of {path, class_index} in torchvision's order (see the top). Exactly one of
-- extensions (a list of suffixes, compared case-insensitively) and is_valid_file (a
-- function(path) -> boolean) is given. Raises as torchvision when both or neither are, and
-- "Found no valid file for the classes <names>. Supported extensions are: <list>" for
-- classes without a file.
function M.make_dataset(root, class_to_idx, extensions, is_valid_file)
  if (extensions == nil) == (is_valid_file == nil) then
    lib.raise("DatasetFolder: Both extensions and is_valid_file cannot be None or not None at the same time")
  end
  local valid = is_valid_file
  if extensions then
    if type(extensions) == "string" then extensions = { extensions } end
    valid = function(path) return has_extension(path, extensions) end
  elseif type(valid) ~= "function" then
    lib.raise("DatasetFolder: is_valid_file must be a function(path) -> boolean, got " .. type(valid))
  end
  local names = {}
  for name in pairs(class_to_idx) do names[#names + 1] = name end
  table.sort(names)
  local samples, empty = {}, {}
  for _, cls in ipairs(names) do
    local dirs = walk(root .. "/" .. cls, {}, 0)
    table.sort(dirs, function(a, b) return a.dir < b.dir end)
    local found = false
    for _, d in ipairs(dirs) do
      table.sort(d.files)
      for _, f in ipairs(d.files) do
        local path = d.dir .. "/" .. f
        if valid(path) then
          samples[#samples + 1] = { path, class_to_idx[cls] }
          found = true
        end
      end
    end
    if not found then empty[#empty + 1] = cls end
  end
  if #empty > 0 then
    local msg = "DatasetFolder: Found no valid file for the classes " .. table.concat(empty, ", ") .. ". "
    if extensions then msg = msg .. "Supported extensions are: " .. table.concat(extensions, ", ") end
    lib.raise(msg)
  end
  return samples
end

local DatasetFolder = { name = "DatasetFolder" }

local KNOWN = { root = true, loader = true, extensions = true, is_valid_file = true, transform = true,
  target_transform = true, generator = true }

--- data.DatasetFolder{root = dir, loader = fn(path) -> sample, extensions = {".x", ...} or
-- is_valid_file = fn(path), transform = ..., target_transform = fn, generator = g}: the
-- files of root's class folders (see the top of the file). ds:get(i) returns
-- transform(loader(path)), target (target_transform(target) when given), the target a
-- number 0 .. K-1. transform: a transform object (data.Compose{...}) called as tf(x,
-- generator), or a function(x). Fields: root, classes, class_to_idx, samples, targets,
-- imgs (= samples, as torchvision), loader, transform, target_transform. Raises on a bad
-- option or folder (find_classes, make_dataset); a file that fails to load raises from
-- get, naming the file.
function M.DatasetFolder(opts)
  if type(opts) ~= "table" then lib.raise("DatasetFolder: expected a table of options {root = ..., loader = ...}") end
  for k in pairs(opts) do
    if not KNOWN[k] then lib.raise("DatasetFolder: unknown option '" .. tostring(k) .. "'") end
  end
  local root = opts.root
  lib.path(root, "DatasetFolder", "root")
  root = root:gsub("/+$", "")
  if root == "" then root = "/" end
  if type(opts.loader) ~= "function" then lib.raise("DatasetFolder: loader must be a function(path) -> sample") end
  local tf = opts.transform
  if tf ~= nil and type(tf) ~= "function" and not transforms.is_transform(tf) then
    lib.raise("DatasetFolder: transform must be a transform object or a function, got " .. type(tf))
  end
  local classes, class_to_idx = M.find_classes(root)
  local samples = M.make_dataset(root, class_to_idx, opts.extensions, opts.is_valid_file)
  local targets = {}
  for i, s in ipairs(samples) do targets[i] = s[2] end
  return object.new(DatasetFolder, {
    name = "DatasetFolder", root = root, loader = opts.loader, extensions = opts.extensions,
    classes = classes, class_to_idx = class_to_idx, samples = samples, imgs = samples, targets = targets,
    transform = tf, target_transform = opts.target_transform, generator = opts.generator,
  })
end

--- ds:len() -> the number of files.
function DatasetFolder.len(self) return #self.samples end

--- ds:get(i) -> sample, target for file i (1-based); raises out of range or naming the
-- file that cannot be loaded.
function DatasetFolder.get(self, i)
  local n = #self.samples
  if type(i) ~= "number" or i < 1 or i > n or i % 1 ~= 0 then
    lib.raise(("%s: index %s out of range 1..%d"):format(self.name, tostring(i), n))
  end
  local path, target = self.samples[i][1], self.samples[i][2]
  local x = self.loader(path)
  local tf = self.transform
  if tf then
    if type(tf) == "function" then x = tf(x) else x = tf(x, self.generator) end
  end
  if self.target_transform then target = self.target_transform(target) end
  return x, target
end

function DatasetFolder.__tostring(self)
  return ("%s(%s, %d classes, %d samples)"):format(self.name, self.root, #self.classes, #self.samples)
end

--- data.ImageFolder{root = dir, mode = "rgb", layout = "CHW", transform = ...,
-- target_transform = fn, loader = fn, is_valid_file = fn, generator = g}: a DatasetFolder
-- of PNG and JPEG images (extensions IMG_EXTENSIONS unless is_valid_file is given) whose
-- default loader is data.read_image(path, {mode = mode, layout = layout}): u8 (3, H, W)
-- by default (RGB, as torchvision's PIL loader converts to), "gray" for one channel,
-- "unchanged" for the file's own; layout "HWC" gives (H, W, C) for data.ToTensor.
function M.ImageFolder(opts)
  if type(opts) ~= "table" then lib.raise("ImageFolder: expected a table of options {root = ...}") end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  local mode = image.mode_code(opts.mode or "rgb", "ImageFolder") and (opts.mode or "rgb")
  local layout = image.layout_code(opts.layout, "ImageFolder") and opts.layout
  o.loader = opts.loader or function(path) return image.read_image(path, { mode = mode, layout = layout }) end
  if o.is_valid_file == nil and o.extensions == nil then o.extensions = M.IMG_EXTENSIONS end
  o.mode, o.layout = nil, nil
  local ds = M.DatasetFolder(o)
  ds.name = "ImageFolder"
  return ds
end

return M
