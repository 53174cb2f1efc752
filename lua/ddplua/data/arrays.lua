--- ddplua.data.arrays: NumPy .npy / .npz files and CSV tables of numbers as tensors (C in
-- runtime/io/npy.c and runtime/io/csv.c, ddplua/arrays.h; libzip and libcsv underneath).
--
--   local x = data.read_npy("features.npy")                 -- the array's shape and dtype
--   local arrays, names = data.read_npz("data.npz")         -- arrays.x, arrays.y; names in order
--   local t, cols = data.read_csv("table.csv", {header = true})   -- f64 (rows, cols), {"a", "b"}
--   local ds = data.TensorDataset(arrays.x, arrays.y:to("i64"))
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

--- data.read_npy(path) -> tensor: the .npy file's array (its shape; f2/f4/f8 -> f16/f32/f64,
-- i1/i2/i4 -> i32, i8 -> i64, u1 -> u8, u2 -> i32, u4 -> i64, b1 -> bool; Fortran order made
-- row-major). Raises naming the file and the fault (magic, header, an unsupported dtype
-- such as uint64 or complex, truncated data, ...).
function M.read_npy(path)
  lib.path(path, "read_npy")
  check(C.ddp_npy_read(box, path))
  return wrap(box[0])
end

--- data.read_npz(path) -> arrays, names: the .npy entries of an .npz archive (numpy.savez
-- or savez_compressed) as a table name -> tensor (names without ".npy", as numpy.load's
-- keys) and the list of names in the archive's order. Raises naming the file (and entry)
-- and the fault.
function M.read_npz(path)
  lib.path(path, "read_npz")
  local zbox = ffi.new("ddp_npz*[1]")
  check(C.ddp_npz_read(zbox, path))
  local z = ffi.gc(zbox[0], C.ddp_npz_free)
  local arrays, names = {}, {}
  for i = 0, C.ddp_npz_count(z) - 1 do
    local name = ffi.string(C.ddp_npz_name(z, i))
    names[#names + 1] = name
    arrays[name] = wrap(C.ddp_npz_array(z, i))
  end
  ffi.gc(z, nil)
  C.ddp_npz_free(z)
  return arrays, names
end

--- data.read_csv(path, {delimiter = ",", header = false, dtype = "f64"}) -> tensor, names:
-- a CSV file of numbers (RFC 4180 quoting) as a (rows, columns) tensor (f64, or converted
-- to opts.dtype), and with header = true the first record's column names (a list; nil
-- without a header). Empty fields are NaN; blank lines are skipped. Raises naming the file
-- and the record / column at fault (a field that is not a number, a record with another
-- number of fields, a malformed quote, no data rows).
function M.read_csv(path, opts)
  lib.path(path, "read_csv")
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "delimiter" and k ~= "header" and k ~= "dtype" then
      lib.raise("read_csv: unknown option '" .. tostring(k) .. "' (delimiter, header, dtype)")
    end
  end
  local delim = opts.delimiter or ","
  if type(delim) ~= "string" or #delim ~= 1 then
    lib.raise("read_csv: delimiter must be a one-byte string, got " .. tostring(delim))
  end
  local header = opts.header and 1 or 0
  local needed = ffi.new("size_t[1]")
  local cap = 4096
  while true do
    local buf = ffi.new("char[?]", cap)
    local st = C.ddp_csv_read(box, path, delim:byte(), header, buf, cap, needed)
    if st == 0 then
      local t = wrap(box[0])
      if opts.dtype and opts.dtype ~= "f64" then t = t:to(opts.dtype) end
      if header == 0 then return t, nil end
      local names, at, n = {}, 0, tonumber(needed[0])
      while at < n do
        local s = ffi.string(buf + at)
        names[#names + 1] = s
        at = at + #s + 1
      end
      return t, names
    end
    if tonumber(needed[0]) <= cap then check(st) end
    cap = tonumber(needed[0])
  end
end

return M
