--- ddplua.tools.verify: `ddplua verify A.safetensors B.safetensors ... [--atol X] [--quiet]`
-- checks that replicas hold the same tensors (the check PyTorch DDP users write by hand
-- after training: every rank saves its model, then the files are compared).
--
-- The first file is compared with each other one, tensor by tensor: names present on one
-- side only, shape and dtype differences, and values. Every tensor that differs is printed
-- with its maximum absolute difference (computed in f64) and the two files.
-- Exit status: 0 when every tensor is bitwise equal (or within --atol), printing
-- "N tensors identical across K files"; 1 when any differs; 2 on a usage error or a file
-- that cannot be read (missing, malformed), with the message on stderr.
--
-- --atol X: elements whose absolute difference is at most X count as equal (default 0:
-- bitwise, so -0 vs 0 or two different NaN payloads differ; with X > 0 they do not, and two
-- NaNs at the same place count as equal). --quiet: print nothing; the status tells.
local lib = require "ddplua.lib"
local checkpoint = require "ddplua.checkpoint"
require "ddplua.tensor"
local ffi, C = lib.ffi, lib.C

local M = {}

local USAGE = "usage: ddplua verify A.safetensors B.safetensors ... [--atol X] [--quiet]"

local function usage_error(msg)
  io.stderr:write("ddplua verify: ", msg, "\n", USAGE, "\n")
  return 2
end

local function shape_text(t)
  return "(" .. table.concat(lib.size_table(t), ", ") .. ")"
end

local function same_shape(a, b)
  local sa, sb = lib.size_table(a), lib.size_table(b)
  if #sa ~= #sb then return false end
  for i = 1, #sa do if sa[i] ~= sb[i] then return false end end
  return true
end

local function bitwise_equal(a, b)
  a, b = a:contiguous(), b:contiguous()
  local nbytes = C.ddp_tensor_numel(a) * C.ddp_dtype_size(C.ddp_tensor_dtype(a))
  if nbytes == 0 then return true end
  return C.ddp_os_bytes_equal(C.ddp_tensor_data(a), C.ddp_tensor_data(b), nbytes) == 1
end

--- M.max_abs_diff(a, b) -> d, nan_mismatch: the largest |a - b| over elements of two tensors
-- of one shape and dtype, computed in f64 (equal values, including equal infinities and two
-- NaNs, count 0); nan_mismatch is true when some element is NaN on one side only.
function M.max_abs_diff(a, b)
  local fa, fb = a:to("f64"):contiguous(), b:to("f64"):contiguous()
  local pa = ffi.cast("const double *", C.ddp_tensor_data(fa))
  local pb = ffi.cast("const double *", C.ddp_tensor_data(fb))
  local maxd, nan = 0, false
  for i = 0, tonumber(C.ddp_tensor_numel(fa)) - 1 do
    local x, y = pa[i], pb[i]
    if x ~= y then
      if x ~= x or y ~= y then
        if not (x ~= x and y ~= y) then nan = true end
      else
        local d = math.abs(x - y)
        if d > maxd then maxd = d end
      end
    end
  end
  return maxd, nan
end

-- Compare file 1 (ta) with file k (tb); calls report(line) for each difference and returns
-- the number of names that differ.
local function compare(ta, tb, fa, fb, atol, report)
  local names, seen = {}, {}
  for name in pairs(ta) do names[#names + 1] = name; seen[name] = true end
  for name in pairs(tb) do if not seen[name] then names[#names + 1] = name end end
  table.sort(names)
  local ndiff = 0
  for _, name in ipairs(names) do
    local a, b = ta[name], tb[name]
    local line
    if b == nil then
      line = ("tensor '%s' missing in %s (present in %s)"):format(name, fb, fa)
    elseif a == nil then
      line = ("tensor '%s' missing in %s (present in %s)"):format(name, fa, fb)
    elseif a.dtype ~= b.dtype then
      line = ("tensor '%s' dtype differs: %s in %s, %s in %s"):format(name, a.dtype, fa, b.dtype, fb)
    elseif not same_shape(a, b) then
      line = ("tensor '%s' shape differs: %s in %s, %s in %s"):format(name, shape_text(a), fa, shape_text(b), fb)
    elseif not bitwise_equal(a, b) then
      local d, nan = M.max_abs_diff(a, b)
      if atol == 0 or nan or d > atol then
        local what = nan and "NaN on one side only, max abs diff elsewhere" or "max abs diff"
        local note = (d == 0 and not nan) and " (bits differ: -0 vs 0, NaN payloads or i64 beyond 2^53)" or ""
        line = ("tensor '%s' differs: %s %.6g%s (%s vs %s)"):format(name, what, d, note, fa, fb)
      end
    end
    if line then
      ndiff = ndiff + 1
      report(line)
    end
  end
  return ndiff
end

--- main(args) -> exit status (0 identical, 1 different, 2 error); see the top of the file.
function M.main(args)
  local files, atol, quiet = {}, 0, false
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--help" or a == "-h" then
      print(USAGE)
      return 0
    elseif a == "--quiet" or a == "-q" then
      quiet = true
    elseif a == "--atol" or a:match("^%-%-atol=") then
      local v = a:match("^%-%-atol=(.*)$")
      if not v then
        i = i + 1
        v = args[i]
      end
      atol = tonumber(v)
      if not atol or atol < 0 or atol ~= atol then
        return usage_error("--atol needs a number >= 0, got " .. tostring(v))
      end
    elseif a:sub(1, 2) == "--" then
      return usage_error("unknown option " .. a)
    else
      files[#files + 1] = a
    end
    i = i + 1
  end
  if #files < 2 then return usage_error("needs at least two files, got " .. #files) end

  local loaded = {}
  for k, path in ipairs(files) do
    local ok, tensors = pcall(checkpoint.load, path)
    if not ok then
      -- the message names the file and the cause; the Lua position adds nothing here
      io.stderr:write("ddplua verify: ", (tostring(tensors):gsub("^[^\n]-:%d+: ", "")), "\n")
      return 2
    end
    loaded[k] = tensors
  end

  local out = quiet and function() end or print
  local ntensors = 0
  for _ in pairs(loaded[1]) do ntensors = ntensors + 1 end
  local ndiff = 0
  for k = 2, #files do
    ndiff = ndiff + compare(loaded[1], loaded[k], files[1], files[k], atol, out)
  end
  if ndiff > 0 then
    out(("%d difference%s found across %d files"):format(ndiff, ndiff == 1 and "" or "s", #files))
    return 1
  end
  if atol == 0 then
    out(("%d tensors identical across %d files"):format(ntensors, #files))
  else
    out(("%d tensors identical across %d files (within atol %g)"):format(ntensors, #files, atol))
  end
  return 0
end

return M
