-- Specs for ddplua.data.arrays: .npy and .npz files written by NumPy (Debian's python3-numpy,
-- through the PyTorch helper's python3) read back with their shapes, dtypes and values
-- (byte orders, Fortran order, 0-d and empty arrays, savez and savez_compressed), malformed
-- files named in errors, and CSV tables (quoting, header, empty fields, errors).
local dl = require "ddplua"
local data = require "ddplua.data"
local files = require "files"
local pytorch = require "pytorch"

local tmpdir
setup(function() tmpdir = files.tmpdir("arrays") end)
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

-- The values of t, row-major, as a flat Lua list (f64).
local function flat(t)
  local c = t:to("f64"):contiguous():reshape { t:numel() }
  local out = {}
  for i = 1, t:numel() do out[i] = c:get(i) end
  return out
end

describe("data.read_npy / read_npz", function()
  local ref, why
  setup(function()
    ref, why = pytorch.run(([==[
import numpy as np
d = %q
arrays = {
  "f4": np.arange(12, dtype="<f4").reshape(3, 4) / 7,
  "f8be": (np.arange(6, dtype=">f8") - 2.5).reshape(2, 3),
  "f2": np.array([0.5, -1.25, 65504], dtype="<f2"),
  "i1": np.array([-128, 0, 127], dtype="i1"),
  "i2be": np.array([[-300, 7]], dtype=">i2"),
  "i8": np.array([-(2**40), 2**40 + 3], dtype="<i8"),
  "u1": np.arange(250, 256, dtype="u1").reshape(1, 2, 3),
  "u2": np.array([65535, 1], dtype="<u2"),
  "u4": np.array([4294967295, 2], dtype="<u4"),
  "b1": np.array([True, False, True]),
  "fortran": np.asfortranarray(np.arange(24, dtype="<f4").reshape(2, 3, 4)),
  "scalar": np.array(3.5),
  "empty": np.zeros((0, 5), dtype="<f4"),
}
out = {}
for k, a in arrays.items():
    np.save(d + "/" + k + ".npy", a)
    out[k] = {"shape": list(a.shape), "values": [float(v) for v in np.ascontiguousarray(a).reshape(-1)]}
np.savez(d + "/plain.npz", x=arrays["f4"], y=arrays["i8"])
np.savez_compressed(d + "/packed.npz", labels=arrays["u1"], feats=arrays["f8be"])
np.save(d + "/u8.npy", np.array([1], dtype="<u8"))
np.save(d + "/c8.npy", np.array([1j], dtype="<c8"))
print(json.dumps(out))
]==]):format(tmpdir))
  end)

  local dtypes = { f4 = "f32", f8be = "f64", f2 = "f16", i1 = "i32", i2be = "i32", i8 = "i64", u1 = "u8",
    u2 = "i32", u4 = "i64", b1 = "bool", fortran = "f32", scalar = "f64", empty = "f32" }

  it("reads NumPy's arrays with their shapes, dtypes and values", function()
    if not ref then return pending(why) end
    for k, dtype in pairs(dtypes) do
      local t = data.read_npy(tmpdir .. "/" .. k .. ".npy")
      assert.are.equal(dtype, t.dtype, k)
      assert.are.same(ref[k].shape, t:size(), k)
      assert.are.same(ref[k].values, flat(t), k)
    end
  end)

  it("reads savez and savez_compressed archives in order", function()
    if not ref then return pending(why) end
    local a, names = data.read_npz(tmpdir .. "/plain.npz")
    assert.are.same({ "x", "y" }, names)
    assert.are.same(ref.f4.values, flat(a.x))
    assert.are.same(ref.i8.values, flat(a.y))
    local b, bn = data.read_npz(tmpdir .. "/packed.npz")
    assert.are.same({ "labels", "feats" }, bn)
    assert.are.equal("u8", b.labels.dtype)
    assert.are.same(ref.u1.values, flat(b.labels))
    assert.are.same(ref.f8be.values, flat(b.feats))
  end)

  it("names the file and the fault for malformed or unsupported files", function()
    if not ref then return pending(why) end
    local good = read_bytes(tmpdir .. "/f4.npy")
    local cases = {
      { "u8.npy", nil, "dtype '<u8' has no ddplua equivalent" },
      { "c8.npy", nil, "dtype '<c8' has no ddplua equivalent" },
      { "trunc.npy", good:sub(1, #good - 3), "expected 48 bytes of data for the shape, found 45 %(truncated%)" },
      { "extra.npy", good .. "xy", "found 50 %(trailing bytes%)" },
      { "magic.npy", "NUMPY" .. good, "is not a .npy file" },
      { "header.npy", good:sub(1, 8) .. "\255\127" .. good:sub(11), "the header says 32767 bytes" },
      { "shape.npy", (good:gsub("'shape': %(3, 4%)", "'shape': [3, 4]")), "the header's shape is not a tuple" },
    }
    for _, c in ipairs(cases) do
      local path = tmpdir .. "/" .. c[1]
      if c[2] then write_bytes(path, c[2]) end
      local ok, err = pcall(data.read_npy, path)
      assert.is_false(ok, c[1])
      assert.is_truthy(tostring(err):find(path, 1, true), tostring(err))
      assert.is_truthy(tostring(err):find(c[3]), c[1] .. ": " .. tostring(err))
    end
    -- a key with nothing after it at the header's end: the value was read past the header
    -- (a heap overflow under ASan, found by fuzz/npy.c)
    local hdr = "{'descr': '<f4', 'fortran_order': False, 'shape':"
    local cut = write_bytes(tmpdir .. "/cut.npy", "\147NUMPY\1\0" .. string.char(#hdr, 0) .. hdr)
    assert.error_matches(function() data.read_npy(cut) end, "cut.npy: the header lacks 'shape'")
    -- a size 0 hid the sizes after it: their product (a 0 counted as 1, as a tensor's
    -- strides do) passed 64 bits and the tensor's error did not name the file (fuzz/npy.c)
    hdr = "{'descr': '|u1', 'fortran_order': True, 'shape': (7000000000, 0, 32438427, 54, 3), }"
    local wide = write_bytes(tmpdir .. "/wide.npy", "\147NUMPY\1\0" .. string.char(#hdr, 0) .. hdr)
    assert.error_matches(function() data.read_npy(wide) end,
      "wide.npy: the shape's product is too large %(counting each size 0 as 1%)")
    write_bytes(tmpdir .. "/bad.npz", "PK\3\4 not really a zip")
    assert.error_matches(function() data.read_npz(tmpdir .. "/bad.npz") end, "bad.npz is not a readable zip archive")
    assert.error_matches(function() data.read_npz(tmpdir .. "/missing.npz") end, "cannot open .*missing.npz")
  end)
end)

describe("data.read_csv", function()
  it("reads numbers with a header, quotes, spaces, empty fields and blank lines", function()
    local path = write_bytes(tmpdir .. "/t.csv",
      'a,"b, quoted",c\n1, 2.5 ,-3e2\n\n"4",,0x10\r\n7,8,nan\n')
    local t, names = data.read_csv(path, { header = true })
    assert.are.same({ "a", "b, quoted", "c" }, names)
    assert.are.same({ 3, 3 }, t:size())
    assert.are.equal("f64", t.dtype)
    local v = flat(t)
    assert.are.same({ 1, 2.5, -300, 4 }, { v[1], v[2], v[3], v[4] })
    assert.is_true(v[5] ~= v[5]) -- the empty field
    assert.are.same({ 16, 7, 8 }, { v[6], v[7], v[8] })
    assert.is_true(v[9] ~= v[9])
    local tab = data.read_csv(write_bytes(tmpdir .. "/t.tsv", "1\t2\n3\t4\n"), { delimiter = "\t", dtype = "f32" })
    assert.are.equal("f32", tab.dtype)
    assert.are.same({ 1, 2, 3, 4 }, flat(tab))
  end)

  it("names the file, record and column at fault", function()
    local function err_of(name, text, opts)
      local path = write_bytes(tmpdir .. "/" .. name, text)
      local ok, e = pcall(data.read_csv, path, opts)
      assert.is_false(ok)
      assert.is_truthy(tostring(e):find(path, 1, true), tostring(e))
      return tostring(e)
    end
    assert.matches("record 2, column 2: 'x1' is not a number", err_of("n.csv", "1,2\n3,x1\n"))
    assert.matches("record 3 has 3 fields, record 1 has 2", err_of("f.csv", "a,b\n1,2\n1,2,3\n", { header = true }))
    assert.matches("has no data rows after the header", err_of("h.csv", "a,b\n", { header = true }))
    assert.matches("has no data rows", err_of("e.csv", ""))
    assert.matches("record 1: ", err_of("q.csv", '"1"x,2\n'))
    assert.error_matches(function() data.read_csv(tmpdir .. "/n.csv", { delimiter = ",," }) end, "one%-byte string")
    -- a NUL byte in a column name would split it in two in the names' NUL-separated list
    -- (found by fuzz/csv.c: "2 names for 1 columns")
    assert.matches("record 1, column 1: the column name holds a NUL byte", err_of("nul.csv", "3\0" .. "16\n5\n", { header = true }))
  end)
end)
