--- ddplua.data.transforms: image transforms as objects (torchvision's names), computed in
-- C (ddp_io_collate, runtime/io/batch.c) fused into one pass per sample.
--
-- A sample is seen as (C, H, W): its last two dims are H and W, the dims before them are the
-- channels. Each transform is callable on one sample, `tf(x[, generator])` -> new tensor,
-- and a dataset's transform is folded into a C transform spec for the batch loader.
--
--   data.ToFloat([scale])          f32; u8 values are divided by 255 (scale defaults to
--                                  1/255 for u8 sources, 1 otherwise), like ToTensor
--   data.Normalize(mean, std)      (x - mean[c]) / std[c]; numbers or one entry per channel
--   data.RandomCrop(size, {padding = p})   a random size x size (or {h, w}) window of the
--                                  sample padded with p zeros on every side
--   data.RandomHorizontalFlip([p]) flip left-right with probability p (0.5)
--   data.Compose{t1, t2, ...}      in order; plain Lua functions x -> x may appear too
--                                  (then the dataset falls back to the Lua path)
--
-- The vision transforms that resize or recolour (data.Resize, CenterCrop, RandomResizedCrop,
-- ColorJitter, ToTensor: ddplua/data/vision_transforms.lua) are per-sample steps
-- (new_step): each runs its own C kernel on one sample, so a Compose holding one takes the
-- per-sample path (c_able is false) and a dataset using it the DataLoader's Lua path.
--
-- In C the work runs as crop, flip, scale, normalize whatever the order given; results are
-- the same because crop and flip move pixels and scale/normalize act on values, with one
-- exception handled: padding added after Normalize is 0 in the output, padding added
-- before it is a raw 0 that gets normalized (as torchvision pads the raw image).
-- Restrictions: at most one of each transform in a Compose; Normalize needs a float input
-- (it implies f32 output; put ToFloat first to scale u8 to [0, 1]).
-- Randomness: see Note [transform randomness] in ddplua/io.h (one Philox block per sample
-- from the generator given, the default one when nil).
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

local Transform = {}
Transform.__index = Transform

local function new(kind, fields)
  fields.kind = kind
  return setmetatable(fields, Transform)
end

--- ToFloat([scale]): convert to f32 and multiply by scale (default: 1/255 for u8 sources,
-- else 1), as torchvision's ToTensor does for u8 images.
function M.ToFloat(scale)
  if scale ~= nil and type(scale) ~= "number" then lib.raise("ToFloat: scale must be a number, got " .. type(scale)) end
  return new("to_float", { scale = scale })
end

local function channels(v, what)
  if type(v) == "number" then return { v } end
  if type(v) ~= "table" or #v == 0 then
    lib.raise("Normalize: " .. what .. " must be a number or a non-empty table of numbers, got " .. tostring(v))
  end
  if #v > 16 then lib.raise("Normalize: at most 16 channels, got " .. #v .. " " .. what .. " values") end
  for i = 1, #v do
    if type(v[i]) ~= "number" then lib.raise("Normalize: " .. what .. "[" .. i .. "] is not a number") end
  end
  return v
end

--- Normalize(mean, std): out[c] = (x[c] - mean[c]) / std[c]. mean and std are numbers (every
-- channel) or tables with one entry per channel (C of the samples). std entries non-zero.
function M.Normalize(mean, std)
  local m, s = channels(mean, "mean"), channels(std, "std")
  if #m ~= #s then
    if #m == 1 then m = {} for i = 1, #s do m[i] = mean end
    elseif #s == 1 then s = {} for i = 1, #m do s[i] = std end
    else lib.raise(("Normalize: mean has %d channels but std has %d"):format(#m, #s)) end
  end
  for i = 1, #s do
    if s[i] == 0 then lib.raise("Normalize: std[" .. i .. "] is 0") end
  end
  return new("normalize", { mean = m, std = s })
end

--- RandomCrop(size, {padding = 0}): a random window of size (number: square; {h, w}) from
-- the sample padded with `padding` zeros on each side. Raises in use when the window is
-- larger than the padded sample.
function M.RandomCrop(size, opts)
  local h, w
  if type(size) == "number" then h, w = size, size
  elseif type(size) == "table" then h, w = size[1], size[2]
  end
  if type(h) ~= "number" or type(w) ~= "number" or h < 1 or w < 1 or h % 1 ~= 0 or w % 1 ~= 0 then
    lib.raise("RandomCrop: size must be a positive integer or {h, w}, got " .. tostring(size))
  end
  local padding = opts and opts.padding or 0
  if type(padding) ~= "number" or padding < 0 or padding % 1 ~= 0 then
    lib.raise("RandomCrop: padding must be an integer >= 0, got " .. tostring(padding))
  end
  return new("crop", { h = h, w = w, padding = padding })
end

--- RandomHorizontalFlip([p]): reverse the W axis with probability p (default 0.5).
function M.RandomHorizontalFlip(p)
  p = p == nil and 0.5 or p
  if type(p) ~= "number" or p < 0 or p > 1 then
    lib.raise("RandomHorizontalFlip: p must be in [0, 1], got " .. tostring(p))
  end
  return new("flip", { p = p })
end

--- Compose{t1, t2, ...}: apply the transforms in order (nested Composes are flattened).
function M.Compose(list)
  if type(list) ~= "table" then lib.raise("Compose: expected a table of transforms") end
  local flat = {}
  local function add(t)
    if getmetatable(t) == Transform and t.kind == "compose" then
      for _, u in ipairs(t.list) do add(u) end
    elseif getmetatable(t) == Transform or type(t) == "function" then
      flat[#flat + 1] = t
    else
      lib.raise("Compose: item " .. (#flat + 1) .. " is not a transform or a function")
    end
  end
  for _, t in ipairs(list) do add(t) end
  return new("compose", { list = flat })
end

--- True when v is a transform object (not a plain function).
function M.is_transform(v) return getmetatable(v) == Transform end

--- The list of steps of a transform (a Compose's items, or the transform itself).
local function steps(t)
  if t == nil then return {} end
  if getmetatable(t) == Transform and t.kind == "compose" then return t.list end
  return { t }
end

--- True when every step of t folds into the batch loader's C spec (no plain functions and
-- no per-sample steps such as Resize: those have an `apply` method and run one call each).
function M.c_able(t)
  for _, s in ipairs(steps(t)) do
    if type(s) == "function" or s.apply then return false end
  end
  return true
end

--- transforms.new_step(kind, fields, apply): a transform object of `kind` run per sample by
-- apply(step, x, generator) -> new tensor (for the vision transforms of
-- ddplua.data.vision_transforms); `fields` become its fields. It composes with the others
-- in a Compose, which then takes the per-sample path (c_able is false).
function M.new_step(kind, fields, apply)
  fields.apply = apply
  return new(kind, fields)
end

--- Fold transform t (nil: none) into a C spec (ddp_io_transform) for a source of dtype
-- `dtype` (enum value). Raises naming the offending transform.
function M.spec(t, dtype)
  local spec = ffi.new("ddp_io_transform")
  local seen = {}
  for _, s in ipairs(steps(t)) do
    if type(s) == "function" then lib.raise("transform: a Lua function cannot run in C") end
    local kind = s.kind
    if seen[kind] then lib.raise("Compose: more than one " .. kind .. " step is not supported") end
    seen[kind] = true
    if kind == "to_float" then
      if seen.normalize then lib.raise("Compose: ToFloat must come before Normalize") end
      spec.to_float = 1
      spec.scale = s.scale or (dtype == C.DDP_U8 and 1 / 255 or 1)
    elseif kind == "normalize" then
      spec.normalize = 1
      spec.nchannels = #s.mean
      for i = 1, #s.mean do
        spec.mean[i - 1] = s.mean[i]
        spec.std[i - 1] = s.std[i]
      end
    elseif kind == "crop" then
      spec.crop_h, spec.crop_w, spec.padding = s.h, s.w, s.padding
      spec.pad_mode = seen.normalize and C.DDP_IO_PAD_OUTPUT or C.DDP_IO_PAD_INPUT
    elseif kind == "flip" then
      spec.flip_p = s.p
    end
  end
  return spec
end

local idx_buf = ffi.new("int64_t[1]")
local function scalar_index(i)
  idx_buf[0] = i
  check(C.ddp_tensor_from_data(box, 0, nil, C.DDP_I64, idx_buf, C.DDP_I64))
  return wrap(box[0])
end
M.scalar_index = scalar_index

--- Sample `i` (0-based) of source (N, ...) with the C spec applied, as a new tensor (...).
function M.sample(src, i, spec, generator)
  check(C.ddp_io_collate(box, src, scalar_index(i), spec, generator and generator.handle))
  return wrap(box[0])
end

-- The per-sample plan of a transform that is not c_able: its steps in order, each run of
-- consecutive C steps (no kind twice) folded into one Compose so that it is one C pass
-- (made once, kept in t.plan).
local function plan(t)
  if t.plan then return t.plan end
  local out, run, kinds = {}, {}, {}
  local function flush()
    if #run == 1 then out[#out + 1] = run[1] elseif #run > 1 then out[#out + 1] = M.Compose(run) end
    run, kinds = {}, {}
  end
  for _, s in ipairs(steps(t)) do
    if type(s) == "function" or s.apply then
      flush()
      out[#out + 1] = s
    else
      if kinds[s.kind] then flush() end
      run[#run + 1] = s
      kinds[s.kind] = true
    end
  end
  flush()
  t.plan = out
  return out
end

--- tf(x[, generator]): apply the transform to one sample x (C, H, W) (any dtype), giving a
-- new tensor. Plain functions inside a Compose are called as f(x).
function Transform.__call(t, x, generator)
  if not M.c_able(t) then
    for _, s in ipairs(plan(t)) do
      if type(s) == "function" then x = s(x)
      elseif s.apply then x = s:apply(x, generator)
      else x = s(x, generator) end -- C steps: one pass
    end
    return x
  end
  if not x:is_contiguous() then x = x:contiguous() end
  local shape = x:size()
  table.insert(shape, 1, 1)
  local buf, n = lib.shape(shape)
  check(C.ddp_io_reshape(box, x, n, buf))
  local src = wrap(box[0])
  return M.sample(src, 0, M.spec(t, C.ddp_tensor_dtype(x)), generator)
end

function Transform.__tostring(t)
  if t.kind == "compose" then
    local parts = {}
    for i, s in ipairs(t.list) do parts[i] = type(s) == "function" and "function" or tostring(s) end
    return "Compose{" .. table.concat(parts, ", ") .. "}"
  elseif t.kind == "to_float" then return "ToFloat(" .. (t.scale and tostring(t.scale) or "") .. ")"
  elseif t.kind == "normalize" then
    return "Normalize({" .. table.concat(t.mean, ", ") .. "}, {" .. table.concat(t.std, ", ") .. "})"
  elseif t.kind == "crop" then return ("RandomCrop({%d, %d}, {padding = %d})"):format(t.h, t.w, t.padding)
  elseif t.describe then return t.describe
  else return "RandomHorizontalFlip(" .. t.p .. ")" end
end

return M
