-- Specs for ddplua.data: IDX and CIFAR-10 readers (real Fashion-MNIST files and synthetic
-- files written here), batch collation and transforms against Lua references, and the
-- DataLoader (batch counts, shuffling, samplers, prefetch thread, early stop).
local dl = require "ddplua"
local data = require "ddplua.data"
local lib = require "ddplua.lib"
local close = require "close"
local views = require "views"
local ffi, C = lib.ffi, lib.C
local bit = require "bit"

ffi.cdef [[
void *gzopen(const char *path, const char *mode);
int gzwrite(void *file, const void *buf, unsigned len);
int gzclose(void *file);
]]
local zlib = ffi.load("z")

local FMNIST = "/usr/share/datasets/fashion-mnist"

local files = require "files"
local with_threads = require("threads").with_threads
for _, decl in ipairs { "long sysconf(int name);", "int getpid(void);",
  "int setenv(const char *name, const char *value, int overwrite);", "int unsetenv(const char *name);" } do
  pcall(ffi.cdef, decl) -- one at a time: another spec may have declared some already
end
local SC_NPROCESSORS_ONLN = 84 -- glibc's value on Linux
local tmpdir
setup(function() tmpdir = files.tmpdir("data") end)
teardown(function() files.remove(tmpdir) end)

local function write_file(name, bytes)
  local path = tmpdir .. "/" .. name
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  return path
end

local function write_gz(name, bytes)
  local path = tmpdir .. "/" .. name
  local f = zlib.gzopen(path, "wb")
  assert(f ~= nil)
  if #bytes > 0 then assert(zlib.gzwrite(f, bytes, #bytes) == #bytes) end
  assert(zlib.gzclose(f) == 0)
  return path
end

local function be32(n)
  return string.char(bit.band(bit.rshift(n, 24), 255), bit.band(bit.rshift(n, 16), 255),
    bit.band(bit.rshift(n, 8), 255), bit.band(n, 255))
end

-- Big-endian bytes of one value in the IDX type `code`.
local function be_value(code, v)
  if code == 0x08 then return string.char(v) end
  if code == 0x09 then return string.char(v % 256) end
  if code == 0x0B then v = v % 65536 return string.char(math.floor(v / 256), v % 256) end
  if code == 0x0C then return be32(v) end
  local ct = code == 0x0D and "float[1]" or "double[1]"
  local buf = ffi.new(ct, v)
  return ffi.string(buf, ffi.sizeof(buf)):reverse()
end

local function idx_bytes(code, dims, values)
  local parts = { "\0\0", string.char(code, #dims) }
  for _, d in ipairs(dims) do parts[#parts + 1] = be32(d) end
  for _, v in ipairs(values or {}) do parts[#parts + 1] = be_value(code, v) end
  return table.concat(parts)
end

local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for i = 1, #v do walk(v[i]) end else out[#out + 1] = v end
  end
  walk(t)
  return out
end

-- Raw u8 contents of a contiguous u8 tensor through the FFI (fast, for big tensors).
local function u8_ptr(t)
  assert(t:is_contiguous() and t.dtype == "u8")
  return ffi.cast("const uint8_t*", C.ddp_tensor_data(t))
end
local function i64_ptr(t)
  assert(t:is_contiguous() and t.dtype == "i64")
  return ffi.cast("const int64_t*", C.ddp_tensor_data(t))
end

describe("ddplua.data", function()
  describe("IDX reader", function()
    it("reads the real Fashion-MNIST files with their known properties", function()
      local img = data.read_idx(FMNIST .. "/train-images-idx3-ubyte.gz")
      local lab = data.read_idx(FMNIST .. "/train-labels-idx1-ubyte.gz")
      assert.same({ 60000, 28, 28 }, img:size())
      assert.same({ 60000 }, lab:size())
      assert.equal("u8", img.dtype)
      assert.equal("u8", lab.dtype)
      local counts = {}
      local lp = u8_ptr(lab)
      for i = 0, 59999 do counts[lp[i]] = (counts[lp[i]] or 0) + 1 end
      for c = 0, 9 do assert.equal(6000, counts[c]) end
      assert.is_nil(counts[10])
      -- mean and std of the pixels scaled to [0, 1]: the Normalize constants of the default
      -- transform (0.2860, 0.3530)
      local p, n = u8_ptr(img), 60000 * 28 * 28
      local s, s2 = 0, 0
      for i = 0, n - 1 do
        local v = p[i]
        s = s + v
        s2 = s2 + v * v
      end
      local mean = s / n / 255
      local std = math.sqrt(s2 / n / 255 / 255 - mean * mean)
      assert.is_true(math.abs(mean - 0.2860) < 5e-4, "mean " .. mean)
      assert.is_true(math.abs(std - 0.3530) < 5e-4, "std " .. std)
      local ti = data.read_idx(FMNIST .. "/t10k-images-idx3-ubyte.gz")
      local tl = data.read_idx(FMNIST .. "/t10k-labels-idx1-ubyte.gz")
      assert.same({ 10000, 28, 28 }, ti:size())
      local tc = {}
      lp = u8_ptr(tl)
      for i = 0, 9999 do tc[lp[i]] = (tc[lp[i]] or 0) + 1 end
      for c = 0, 9 do assert.equal(1000, tc[c]) end
    end)

    it("reads synthetic raw and gzipped files of every type code", function()
      local cases = {
        { 0x08, "u8", { 0, 1, 127, 128, 255, 7 } },
        { 0x09, "i32", { -128, -1, 0, 1, 127, 5 } },
        { 0x0B, "i32", { -32768, -2, 0, 300, 32767, 9 } },
        { 0x0C, "i32", { -2147483648, -70000, 0, 1, 2147483647, 65536 } },
        { 0x0D, "f32", { -1.5, 0, 0.25, 3e10, -7.125, 1 } },
        { 0x0E, "f64", { -1.5, 0.1, 1e300, -2 ^ -30, 12345.678, 0 } },
      }
      for _, case in ipairs(cases) do
        local code, dtype, values = case[1], case[2], case[3]
        local bytes = idx_bytes(code, { 2, 3 }, values)
        for _, path in ipairs { write_file("t" .. code .. ".idx", bytes), write_gz("t" .. code .. ".idx.gz", bytes) } do
          local t = data.read_idx(path)
          assert.equal(dtype, t.dtype, path)
          assert.same({ 2, 3 }, t:size())
          local got = flat(t:tolist())
          for i = 1, 6 do
            local want = values[i]
            if code == 0x0D then want = tonumber(ffi.new("float", want)) end
            if code == 0x0C and want < 0 then want = want end
            assert.equal(want, got[i], path .. " element " .. i)
          end
        end
      end
      -- one dimension and an empty dimension
      assert.same({ 3, 4, 5 }, data.read_idx(write_file("v.idx", idx_bytes(0x08, { 3 }, { 3, 4, 5 }))):tolist())
      assert.same({ 0, 5 }, data.read_idx(write_file("e.idx", idx_bytes(0x08, { 0, 5 }))):size())
    end)

    it("names the file and the fault for malformed files", function()
      local missing = tmpdir .. "/nope.idx.gz"
      assert.has_error(function() data.read_idx(missing) end)
      local ok, err = pcall(data.read_idx, missing)
      assert.is_false(ok)
      assert.matches("cannot open " .. missing:gsub("%p", "%%%0") .. ": No such file", err)

      local bad = write_file("magic.idx", "\222\173\190\239" .. string.rep("\0", 20))
      ok, err = pcall(data.read_idx, bad)
      assert.matches("magic.idx: wrong magic: found bytes de ad be ef", err)

      local code = write_file("code.idx", "\0\0\7\1" .. be32(1) .. "x")
      ok, err = pcall(data.read_idx, code)
      assert.matches("code.idx: wrong magic: found bytes 00 00 07 01", err)

      -- header promises 3 x 4 = 12 bytes, 7 are there
      local trunc = idx_bytes(0x08, { 3, 4 }, { 1, 2, 3, 4, 5, 6, 7 })
      for _, path in ipairs { write_file("trunc.idx", trunc), write_gz("trunc.idx.gz", trunc) } do
        ok, err = pcall(data.read_idx, path)
        assert.matches("trunc.idx[.gz]*: truncated: header says %(3, 4%) of u8, expected 12 bytes of data, found 7", err)
      end
      -- f32 data: 2 elements = 8 bytes expected, 6 found
      ok, err = pcall(data.read_idx, write_file("trunc32.idx", idx_bytes(0x0D, { 2 }) .. "abcdef"))
      assert.matches("trunc32.idx: truncated: .* expected 8 bytes of data, found 6", err)

      -- header cut inside the sizes
      ok, err = pcall(data.read_idx, write_file("hdr.idx", "\0\0\8\3" .. be32(1) .. "\0"))
      assert.matches("hdr.idx: truncated header: expected 12 bytes of sizes, found 5", err)
      ok, err = pcall(data.read_idx, write_file("short.idx", "\0\0"))
      assert.matches("short.idx: truncated header", err)
      ok, err = pcall(data.read_idx, write_file("empty.idx", ""))
      assert.matches("empty.idx: truncated header: expected 4 bytes of magic, found 0", err)

      -- more data than the header says (mis-sized)
      ok, err = pcall(data.read_idx, write_file("long.idx", idx_bytes(0x08, { 2 }, { 1, 2, 3 })))
      assert.matches("long.idx: trailing bytes after the 2 bytes of data", err)

      -- absurd sizes: 2^32-1 cubed overflows 64 bits; 2^17 x 2^17 f64 is 2^37 bytes
      ok, err = pcall(data.read_idx, write_file("huge.idx", "\0\0\8\3" .. string.rep("\255\255\255\255", 3)))
      assert.matches("huge.idx: absurd sizes", err)
      ok, err = pcall(data.read_idx, write_file("huge2.idx", idx_bytes(0x0E, { 131072, 131072 })))
      assert.matches("huge2.idx: absurd sizes %(131072, 131072%) of f64: more than 2%^33 bytes", err)

      ok, err = pcall(data.read_idx, write_file("dims.idx", "\0\0\8\0"))
      assert.matches("dims.idx: 0 dimensions", err)
      ok, err = pcall(data.read_idx, write_file("dims9.idx", "\0\0\8\9" .. string.rep(be32(1), 9) .. "x"))
      assert.matches("dims9.idx: 9 dimensions", err)

      -- a gzip stream cut short and one with corrupt bytes
      local gz = io.open(write_gz("whole.gz", idx_bytes(0x08, { 64, 64 }, flat((function()
        local v = {}
        for i = 1, 4096 do v[i] = (i * 37) % 251 end
        return v
      end)()))), "rb"):read("*a")
      ok, err = pcall(data.read_idx, write_file("cut.idx.gz", gz:sub(1, #gz - 40)))
      assert.is_false(ok)
      assert.matches("cut.idx.gz: ", err)
      local corrupt = gz:sub(1, 20) .. string.rep("\255", 30) .. gz:sub(51)
      ok, err = pcall(data.read_idx, write_file("corrupt.idx.gz", corrupt))
      assert.is_false(ok)
      assert.matches("corrupt.idx.gz: ", err)

      ok, err = pcall(data.read_idx, tmpdir)
      assert.is_false(ok)
      assert.matches(tmpdir:gsub("%p", "%%%0"), err)
    end)
  end)

  describe("CIFAR-10 reader", function()
    -- record r of a synthetic file: label (r*3) % 10, pixel (c, y, x) = (r + 7c + 3y + 5x) % 256
    local function cifar_bytes(nrec, first, label_of)
      local parts = {}
      for r = first, first + nrec - 1 do
        parts[#parts + 1] = string.char(label_of and label_of(r) or (r * 3) % 10)
        local px = {}
        for c = 0, 2 do
          for y = 0, 31 do
            for x = 0, 31 do px[#px + 1] = string.char((r + 7 * c + 3 * y + 5 * x) % 256) end
          end
        end
        parts[#parts + 1] = table.concat(px)
      end
      return table.concat(parts)
    end

    local function check_records(images, labels, first, n)
      assert.same({ n, 3, 32, 32 }, images:size())
      assert.same({ n }, labels:size())
      assert.equal("u8", images.dtype)
      assert.equal("i64", labels.dtype)
      local p, lp = u8_ptr(images), i64_ptr(labels)
      for i = 0, n - 1 do
        local r = first + i
        assert.equal((r * 3) % 10, tonumber(lp[i]))
        for c = 0, 2 do
          for y = 0, 31, 7 do
            for x = 0, 31, 5 do
              assert.equal((r + 7 * c + 3 * y + 5 * x) % 256, p[((i * 3 + c) * 32 + y) * 32 + x])
            end
          end
        end
      end
    end

    it("reads a file of 5 records exactly and concatenates files", function()
      local a = write_file("a.bin", cifar_bytes(5, 0))
      local b = write_file("b.bin", cifar_bytes(2, 5))
      local images, labels = data.read_cifar(a)
      check_records(images, labels, 0, 5)
      images, labels = data.read_cifar { a, b }
      check_records(images, labels, 0, 7)
    end)

    it("rejects mis-sized files and bad labels naming them", function()
      local odd = write_file("odd.bin", cifar_bytes(5, 0) .. "x")
      local ok, err = pcall(data.read_cifar, odd)
      assert.is_false(ok)
      assert.matches("odd.bin has 15366 bytes, not a positive multiple of the 3073%-byte record", err)
      ok, err = pcall(data.read_cifar, write_file("zero.bin", ""))
      assert.matches("zero.bin has 0 bytes", err)
      local lab = write_file("label.bin", cifar_bytes(4, 0, function(r) return r == 2 and 11 or 1 end))
      ok, err = pcall(data.read_cifar, lab)
      assert.matches("label.bin: record 2 %(0%-based%) has label 11, expected 0..9", err)
      ok, err = pcall(data.read_cifar, { write_file("fine.bin", cifar_bytes(1, 0)), tmpdir .. "/gone.bin" })
      assert.matches("cannot open .*gone.bin: No such file", err)
    end)

    it("builds the CIFAR10 dataset from data_batch_1..5 and test_batch", function()
      local root = tmpdir .. "/cifar"
      os.execute("mkdir -p '" .. root .. "/cifar-10-batches-bin'")
      for i = 1, 5 do write_file("cifar/cifar-10-batches-bin/data_batch_" .. i .. ".bin", cifar_bytes(2, 2 * (i - 1))) end
      write_file("cifar/cifar-10-batches-bin/test_batch.bin", cifar_bytes(3, 100))
      local train = data.CIFAR10 { root = root, transform = false }
      assert.equal(10, #train)
      check_records(train.data, train.targets, 0, 10)
      local test = data.CIFAR10 { root = root, train = false }
      assert.equal(3, #test)
      local x, y = test:get(2)
      assert.equal((101 * 3) % 10, y)
      assert.same({ 3, 32, 32 }, x:size())
      assert.equal("f32", x.dtype)
      -- default Normalize with CIFAR-10's per-channel statistics
      local mean, std = { 0.4914, 0.4822, 0.4465 }, { 0.2470, 0.2435, 0.2616 }
      for c = 0, 2 do
        local raw = (101 + 7 * c + 3 * 4 + 5 * 9) % 256
        close.assert_close(dl.tensor { x:get(c + 1, 5, 10) }, { (raw / 255 - mean[c + 1]) / std[c + 1] }, { atol = 1e-5 })
      end
      local aug = data.CIFAR10 { root = root, transform = data.Compose { data.RandomCrop(32, { padding = 4 }),
        data.RandomHorizontalFlip(), data.ToFloat(), data.Normalize(mean, std) } }
      local xb, yb = data.DataLoader(aug, { batch_size = 4, shuffle = true }):iter()()
      assert.same({ 4, 3, 32, 32 }, xb:size())
      assert.same({ 4 }, yb:size())
      local ok, err = pcall(data.CIFAR10, { root = tmpdir .. "/nothing" })
      assert.matches("CIFAR10: .*nothing/data_batch_1.bin not found", err)
    end)
  end)

  describe("collation and transforms", function()
    local function source(shape, dtype, seed)
      return dl.randint(0, 256, shape, { dtype = dtype or "u8", generator = dl.Generator(seed or 1) })
    end
    local function collate(src, idx, spec, g)
      local ti = dl.tensor(idx, { dtype = "i64" })
      lib.check(C.ddp_io_collate(lib.box, src, ti, spec, g and g.handle))
      return lib.wrap(lib.box[0])
    end
    local function spec_of(tf, dtype)
      return require("ddplua.data.transforms").spec(tf, C[dtype or "DDP_U8"])
    end

    it("gathers samples like a reference loop, for every dtype and strided sources", function()
      for _, dtype in ipairs { "u8", "f32", "f64", "i64", "i32", "f16", "bf16", "bool" } do
        local src = source({ 7, 2, 3, 4 }, "i32"):to(dtype)
        local idx = { 3, 0, 6, 3, 1 }
        local out = collate(src, idx, nil)
        assert.equal(dtype, out.dtype)
        assert.same({ 5, 2, 3, 4 }, out:size())
        local s = src:tolist()
        local want = {}
        for i, k in ipairs(idx) do want[i] = s[k + 1] end
        assert.same(want, out:tolist())
      end
      -- a strided (non-contiguous) source and a transposed one
      local base = source({ 6, 5 }, "f32", 3)
      local sv, owner = views.strided(base, 3)
      local tv, owner2 = views.transposed(base)
      assert.is_false(sv:is_contiguous())
      local out = collate(sv, { 5, 0, 2 }, nil)
      local b = base:tolist()
      assert.same({ b[6], b[1], b[3] }, out:tolist())
      out = collate(tv, { 4, 1 }, nil)
      local tl = tv:tolist()
      assert.same({ tl[5], tl[2] }, out:tolist())
      -- labels: a 1-d source gives (B); a 0-d index gives one sample without batch dim
      local labels = dl.tensor({ 5, 3, 9, 0 }, { dtype = "i64" })
      assert.same({ 9, 5, 9 }, collate(labels, { 2, 0, 2 }, nil):tolist())
      local one = require("ddplua.data.transforms").sample(base, 2, nil)
      assert.same(b[3], one:tolist())
      assert.is_not_nil(owner)
      assert.is_not_nil(owner2)
    end)

    it("raises naming the position of an out-of-range index", function()
      local src = source({ 4, 3 })
      local ok, err = pcall(collate, src, { 1, 4 }, nil)
      assert.is_false(ok)
      assert.matches("collate: index 4 at position 1 is out of range for a source of 4 samples %(4, 3%)", err)
      ok, err = pcall(collate, src, { -1 }, nil)
      assert.matches("index %-1 at position 0", err)
      ok, err = pcall(collate, source({ 2, 5, 5 }), { 0 }, spec_of(data.RandomCrop(8)))
      assert.matches("RandomCrop size %(8, 8%) is larger than the padded sample %(5, 5%)", err)
      ok, err = pcall(collate, source({ 2, 3, 5, 5 }), { 0 }, spec_of(data.Normalize({ 0, 0 }, { 1, 1 })))
      assert.matches("Normalize has 2 channels of mean/std but samples %(3, 5, 5%) have 3 channels", err)
      ok, err = pcall(collate, source({ 4 }), { 0 }, spec_of(data.RandomHorizontalFlip(1)))
      assert.matches("need samples of at least 2 dims", err)
      assert.has_error(function() data.Normalize(0.5, 0) end)
      assert.has_error(function() data.RandomHorizontalFlip(2) end)
      assert.has_error(function() data.Compose { data.Normalize(0, 1), data.ToFloat() }(source({ 1, 2, 2 }):contiguous()) end)
    end)

    it("computes ToFloat and Normalize values as by hand", function()
      local src = dl.tensor({ { { { 0, 51 }, { 102, 255 } }, { { 10, 20 }, { 30, 40 } } } }, { dtype = "u8" }) -- (1, 2, 2, 2)
      local x = collate(src, { 0 }, spec_of(data.ToFloat()))
      assert.equal("f32", x.dtype)
      close.assert_close(x, { { { { 0, 0.2 }, { 0.4, 1 } }, { { 10 / 255, 20 / 255 }, { 30 / 255, 40 / 255 } } } })
      local tf = data.Compose { data.ToFloat(), data.Normalize({ 0.5, 0.1 }, { 0.25, 2 }) }
      x = collate(src, { 0, 0 }, spec_of(tf))
      local want = { { { (0 - 0.5) / 0.25, (0.2 - 0.5) / 0.25 }, { (0.4 - 0.5) / 0.25, (1 - 0.5) / 0.25 } },
        { { (10 / 255 - 0.1) / 2, (20 / 255 - 0.1) / 2 }, { (30 / 255 - 0.1) / 2, (40 / 255 - 0.1) / 2 } } }
      close.assert_close(x, { want, want }, { atol = 1e-6 })
      -- one shared mean/std for every channel; Normalize alone works on raw values
      x = collate(src, { 0 }, spec_of(data.Normalize(100, 50)))
      close.assert_close(x, { { { { -2, (51 - 100) / 50 }, { 0.04, 3.1 } }, { { -1.8, -1.6 }, { -1.4, -1.2 } } } }, { atol = 1e-6 })
      -- the transform objects apply to one sample too
      close.assert_close(tf(dl.tensor({ { { 0, 51 }, { 102, 255 } }, { { 10, 20 }, { 30, 40 } } }, { dtype = "u8" })), want, { atol = 1e-6 })
      -- ToFloat on a float source keeps the scale 1
      close.assert_close(data.ToFloat()(dl.tensor({ { 1.5, 2 } }, { dtype = "f64" })), { { 1.5, 2 } })
    end)

    it("flips rows exactly and mixes flipped and unflipped samples for p = 0.5", function()
      local src = source({ 40, 3, 4, 5 }, "u8", 9)
      local s = src:tolist()
      local idx = {}
      for i = 1, 40 do idx[i] = i - 1 end
      local x = collate(src, idx, spec_of(data.RandomHorizontalFlip(1)), dl.Generator(1))
      local xl = x:tolist()
      for i = 1, 40 do
        for c = 1, 3 do
          for y = 1, 4 do
            for w = 1, 5 do assert.equal(s[i][c][y][6 - w], xl[i][c][y][w]) end
          end
        end
      end
      local flipped, kept = 0, 0
      x = collate(src, idx, spec_of(data.RandomHorizontalFlip(0.5)), dl.Generator(2)):tolist()
      for i = 1, 40 do
        local same, rev = true, true
        for c = 1, 3 do
          for y = 1, 4 do
            for w = 1, 5 do
              if x[i][c][y][w] ~= s[i][c][y][w] then same = false end
              if x[i][c][y][w] ~= s[i][c][y][6 - w] then rev = false end
            end
          end
        end
        assert.is_true(same or rev, "sample " .. i .. " is neither the image nor its mirror")
        if same then kept = kept + 1 else flipped = flipped + 1 end
      end
      assert.is_true(flipped >= 8 and kept >= 8, ("flipped %d, kept %d of 40"):format(flipped, kept))
    end)

    -- the padded sample value at (c, y, x) of a (C, H, W) nested table, 1-based, 0 outside
    local function padded(sm, c, y, x, pad)
      local yy, xx = y - pad, x - pad
      local row = sm[c][yy]
      if row == nil or row[xx] == nil then return 0 end
      return row[xx]
    end

    it("crops a window of the zero-padded image, reproducibly from the seed", function()
      local src = source({ 12, 2, 6, 7 }, "u8", 4)
      local s = src:tolist()
      local idx = {}
      for i = 1, 12 do idx[i] = i - 1 end
      local tf = spec_of(data.RandomCrop({ 5, 4 }, { padding = 2 }))
      local a = collate(src, idx, tf, dl.Generator(7)):tolist()
      local b = collate(src, idx, tf, dl.Generator(7)):tolist()
      assert.same(a, b)
      local c = collate(src, idx, tf, dl.Generator(8)):tolist()
      assert.are_not.same(a, c)
      local offsets = {}
      for i = 1, 12 do
        -- find the window (oy, ox) of the padded sample that the crop shows
        local found
        for oy = 0, 6 + 4 - 5 do
          for ox = 0, 7 + 4 - 4 do
            local match = true
            for ch = 1, 2 do
              for y = 1, 5 do
                for x = 1, 4 do
                  if a[i][ch][y][x] ~= padded(s[i], ch, oy + y, ox + x, 2) then match = false end
                end
              end
            end
            if match then found = { oy, ox } end
          end
        end
        assert.is_not_nil(found, "sample " .. i .. " is not a window of the padded image")
        offsets[found[1] * 100 + found[2]] = true
      end
      local distinct = 0
      for _ in pairs(offsets) do distinct = distinct + 1 end
      assert.is_true(distinct >= 4, "only " .. distinct .. " distinct crop offsets in 12 samples")
    end)

    it("draws crop and flip from the generator's Philox blocks as documented", function()
      -- Note [transform randomness]: sample p uses block (seed, offset + p): word 0 flip,
      -- word 1 the row offset, word 2 the column offset.
      local src = source({ 3, 1, 4, 4 }, "u8", 5)
      local s = src:tolist()
      local g = dl.Generator(1234)
      g:set_state { seed = 1234, offset = 10 }
      local x = collate(src, { 0, 1, 2 }, spec_of(data.Compose { data.RandomCrop(3, { padding = 1 }), data.RandomHorizontalFlip(0.5) }), g):tolist()
      assert.same({ seed = 1234, offset = 13 }, g:get_state())
      for p = 0, 2 do
        local w = ffi.new("uint32_t[4]")
        C.ddp_philox4x32_10(w, ffi.new("uint32_t[4]", 10 + p, 0, 0, 0), ffi.new("uint32_t[2]", 1234, 0))
        local flip = tonumber(w[0]) / 2 ^ 32 < 0.5
        local oy, ox = tonumber(w[1]) % 4, tonumber(w[2]) % 4
        for y = 1, 3 do
          for xx = 1, 3 do
            local sx = flip and (4 - xx) or xx
            assert.equal(padded(s[p + 1], 1, oy + y, ox + sx, 1), x[p + 1][1][y][xx])
          end
        end
      end
    end)

    it("pads with raw zeros before Normalize and output zeros after it", function()
      local src = dl.full({ 1, 1, 2, 2 }, 255, { dtype = "u8" })
      local before = data.Compose { data.RandomCrop(6, { padding = 2 }), data.ToFloat(), data.Normalize(0.5, 0.25) }
      local after = data.Compose { data.ToFloat(), data.Normalize(0.5, 0.25), data.RandomCrop(6, { padding = 2 }) }
      local x = collate(src, { 0 }, spec_of(before)):tolist()[1][1]
      local y = collate(src, { 0 }, spec_of(after)):tolist()[1][1]
      -- a 6x6 crop of a 6x6 padded image is the whole padded image
      for r = 1, 6 do
        for c = 1, 6 do
          local inside = r >= 3 and r <= 4 and c >= 3 and c <= 4
          assert.is_true(math.abs((inside and 2 or -2) - x[r][c]) < 1e-6, "before " .. r .. "," .. c)
          assert.is_true(math.abs((inside and 2 or 0) - y[r][c]) < 1e-6, "after " .. r .. "," .. c)
        end
      end
    end)

    it("stacks Lua samples and names the one that differs", function()
      local a, b = dl.tensor { 1, 2 }, dl.tensor { 3, 4 }
      local arr = ffi.new("ddp_tensor*[2]", a, b)
      lib.check(C.ddp_io_stack(lib.box, 2, arr))
      assert.same({ { 1, 2 }, { 3, 4 } }, lib.wrap(lib.box[0]):tolist())
      arr[1] = dl.tensor { 1, 2, 3 }
      assert.equal(1, C.ddp_io_stack(lib.box, 2, arr))
      assert.matches("stack: item 1 is %(3,%) f32 but item 0 is %(2,%) f32", ffi.string(C.ddp_last_error()))
    end)
  end)

  describe("datasets", function()
    it("FashionMNIST gives (1, 28, 28) f32 normalized images and 0-based labels", function()
      local ds = data.FashionMNIST { train = false }
      assert.equal(10000, #ds)
      local raw = data.read_idx(FMNIST .. "/t10k-images-idx3-ubyte.gz")
      local labels = data.read_idx(FMNIST .. "/t10k-labels-idx1-ubyte.gz")
      local x, y = ds:get(10)
      assert.same({ 1, 28, 28 }, x:size())
      assert.equal("f32", x.dtype)
      assert.equal(labels:get(10), y)
      local rp = u8_ptr(raw)
      for _, pos in ipairs { { 1, 1 }, { 14, 14 }, { 20, 7 }, { 28, 28 } } do
        local v = rp[9 * 784 + (pos[1] - 1) * 28 + pos[2] - 1]
        close.assert_close(dl.tensor { x:get(1, pos[1], pos[2]) }, { (v / 255 - 0.2860) / 0.3530 }, { atol = 1e-5 })
      end
      local rawds = data.FashionMNIST { train = false, transform = false }
      assert.equal("u8", rawds:get(1).dtype)
      local ok, err = pcall(data.FashionMNIST, { root = tmpdir })
      assert.matches("FashionMNIST: .*train%-images%-idx3%-ubyte%(.gz%) not found", err)
      -- MNIST reads the same layout
      os.execute(("mkdir -p '%s/mnist' && cp %s/t10k-* '%s/mnist/'"):format(tmpdir, FMNIST, tmpdir))
      local m = data.MNIST { root = tmpdir .. "/mnist", train = false, transform = false }
      assert.equal(10000, #m)
      assert.same(rawds:get(5):tolist(), m:get(5):tolist())
    end)

    it("TensorDataset returns the samples of each tensor", function()
      local xs = dl.randn({ 5, 3 }, { generator = dl.Generator(1) })
      local ys = dl.tensor({ 4, 3, 2, 1, 0 }, { dtype = "i64" })
      local ds = data.TensorDataset(xs, ys)
      assert.equal(5, #ds)
      local x, y = ds:get(2)
      assert.same(xs:tolist()[2], x:tolist())
      assert.equal(3, y:item())
      assert.has_error(function() ds:get(6) end)
      assert.has_error(function() data.TensorDataset(xs, dl.tensor { 1, 2 }) end)
    end)
  end)

  describe("Subset", function()
    local DistributedSampler = require "ddplua.distributed.sampler"
    -- (n, 2) f32 rows {i, -i} and labels i: sample i (0-based) is recognisable by its label
    local function numbered(n)
      local ys = dl.arange(n)
      return data.TensorDataset(dl.stack({ ys:to("f32"), ys:to("f32"):neg() }, 2), ys)
    end
    local function labels_of(loader)
      local seen = {}
      for x, y in loader:iter() do
        assert.same(y:to("f32"):tolist(), x:select(2, 1):tolist()) -- rows travel with labels
        for _, v in ipairs(y:tolist()) do seen[#seen + 1] = v end
      end
      return seen
    end

    it("takes 0-based dataset indices (a table or an i64 tensor), as PyTorch's Subset", function()
      local base = numbered(10)
      local idx = { 7, 2, 9, 0, 5 }
      for _, indices in ipairs { idx, dl.tensor(idx, { dtype = "i64" }) } do
        local sub = data.Subset(base, indices)
        assert.equal(5, #sub)
        assert.equal(base, sub.dataset)
        for i, j in ipairs(idx) do -- positions count from 1 (the dataset protocol)
          local x, y = sub:get(i)
          assert.equal(j, y:item())
          assert.same(base:get(j + 1):tolist(), x:tolist())
        end
        assert.same(idx, labels_of(data.DataLoader(sub, { batch_size = 2 })))
      end
      assert.matches("Subset: index 6 out of range 1..5", select(2, pcall(function() data.Subset(base, idx):get(6) end)))
    end)

    it("works with DataLoader on both paths and with DistributedSampler", function()
      local base = numbered(10)
      local idx = { 7, 2, 9, 0, 5 }
      -- the Lua path: a dataset without c_sources
      local plain = data.Dataset({ len = function() return 10 end,
        get = function(_, i) return dl.tensor { i - 1, 1 - i }, i - 1 end })
      assert.same(idx, labels_of(data.DataLoader(data.Subset(plain, idx), { batch_size = 3 })))
      -- a subset of a subset
      assert.same({ 5, 7 }, labels_of(data.DataLoader(data.Subset(data.Subset(base, idx), { 4, 0 }))))
      -- DistributedSampler over the subset: each rank reads its share of the subset's
      -- positions, which the subset maps to the dataset's samples
      local sub = data.Subset(base, idx)
      local seen = {}
      for rank = 0, 1 do
        local sampler = DistributedSampler.new(sub, { num_replicas = 2, rank = rank, seed = 3 })
        local expected = {}
        for _, p in ipairs(sampler:indices():tolist()) do expected[#expected + 1] = idx[p + 1] end
        local got = labels_of(data.DataLoader(sub, { batch_size = 2, sampler = sampler }))
        assert.same(expected, got)
        for _, v in ipairs(got) do seen[v] = true end
      end
      for _, j in ipairs(idx) do assert.is_true(seen[j], "sample " .. j .. " read by no rank") end
    end)

    it("names the bad index", function()
      local base = numbered(4)
      assert.matches("Subset: indices%[2%] = 4 is out of range 0..3 %(indices are 0%-based",
        select(2, pcall(data.Subset, base, { 0, 4 })))
      assert.matches("Subset: indices%[1%] = %-1 is out of range",
        select(2, pcall(data.Subset, base, dl.tensor({ -1 }, { dtype = "i64" }))))
      assert.matches("Subset: indices%[1%] = 1.5 is not an integer", select(2, pcall(data.Subset, base, { 1.5 })))
      assert.matches("Subset: indices must be a table or a 1%-d integer tensor",
        select(2, pcall(data.Subset, base, dl.tensor { 1, 2 })))
      assert.matches("Subset: expected a dataset", select(2, pcall(data.Subset, nil, { 0 })))
    end)
  end)

  describe("DataLoader", function()
    local function labels_ds(n)
      local ys = dl.arange(n)
      local xs = dl.randint(0, 256, { n, 1, 4, 4 }, { dtype = "u8", generator = dl.Generator(n) })
      return data.TensorDataset(xs, ys), xs, ys
    end
    local function epoch_labels(loader)
      local seen = {}
      for _, y in loader:iter() do
        for _, v in ipairs(y:tolist()) do seen[#seen + 1] = v end
      end
      return seen
    end

    it("counts batches with and without drop_last", function()
      local ds = labels_ds(10)
      for _, case in ipairs { { 3, false, 4, { 3, 3, 3, 1 } }, { 3, true, 3, { 3, 3, 3 } }, { 5, true, 2, { 5, 5 } },
        { 20, true, 0, {} }, { 20, false, 1, { 10 } } } do
        local loader = data.DataLoader(ds, { batch_size = case[1], drop_last = case[2] })
        assert.equal(case[3], #loader)
        local sizes = {}
        for x, y in loader:iter() do
          sizes[#sizes + 1] = y:size(1)
          assert.equal(y:size(1), x:size(1))
        end
        assert.same(case[4], sizes)
      end
      assert.equal(157, #data.DataLoader(data.FashionMNIST { train = false }, { batch_size = 64 }))
      assert.equal(156, #data.DataLoader(data.FashionMNIST { train = false }, { batch_size = 64, drop_last = true }))
    end)

    it("keeps the order without shuffle and covers every index once per shuffled epoch", function()
      local ds = labels_ds(103)
      local plain = epoch_labels(data.DataLoader(ds, { batch_size = 10 }))
      for i = 1, 103 do assert.equal(i - 1, plain[i]) end
      local loader = data.DataLoader(ds, { batch_size = 10, shuffle = true, generator = dl.Generator(42) })
      local e1, e2 = epoch_labels(loader), epoch_labels(loader)
      for _, e in ipairs { e1, e2 } do
        local sorted = { unpack(e) }
        table.sort(sorted)
        assert.same(plain, sorted)
      end
      assert.are_not.same(e1, e2)
      assert.are_not.same(plain, e1)
      local again = data.DataLoader(ds, { batch_size = 10, shuffle = true, generator = dl.Generator(42) })
      assert.same(e1, epoch_labels(again))
      assert.same(e2, epoch_labels(again))
    end)

    it("gives identical batches with and without the prefetch thread", function()
      local ds = data.FashionMNIST {
        train = false,
        transform = data.Compose { data.RandomCrop(28, { padding = 4 }), data.RandomHorizontalFlip(), data.ToFloat(),
          data.Normalize(0.2860, 0.3530) },
      }
      local runs = {}
      -- prefetch 0 at 2 threads splits each batch's samples over the pool (Note [gather on
      -- the pool], runtime/io/batch.c); nil is the default choice (Note [default prefetch])
      for _, case in ipairs { { 0, 1 }, { 0, 2 }, { 1, 2 }, { 2, 2 }, { 5, 1 }, { nil, 2 }, { nil, 1 } } do
        local prefetch, threads = case[1], case[2]
        local batches = {}
        with_threads(threads, function()
          local loader = data.DataLoader(ds, { batch_size = 500, shuffle = true, generator = dl.Generator(3), prefetch = prefetch })
          for x, y in loader:iter() do
            batches[#batches + 1] = { ffi.string(C.ddp_tensor_data(x), x:numel() * 4), ffi.string(C.ddp_tensor_data(y), y:numel() * 8) }
            assert.same({ y:size(1), 1, 28, 28 }, x:size())
          end
        end)
        assert.equal(20, #batches)
        runs[#runs + 1] = batches
      end
      for r = 2, #runs do
        for b = 1, 20 do
          assert.is_true(runs[1][b][1] == runs[r][b][1], "images of batch " .. b .. " differ in run " .. r)
          assert.is_true(runs[1][b][2] == runs[r][b][2], "labels of batch " .. b .. " differ in run " .. r)
        end
      end
      -- the first batch matches ds:get on the same samples when nothing is random
      local plain = data.FashionMNIST { train = false }
      local loader = data.DataLoader(plain, { batch_size = 4 })
      local x, y = loader:iter()()
      for i = 1, 4 do
        local xi, yi = plain:get(i)
        assert.same(xi:tolist(), x:tolist()[i])
        assert.equal(yi, y:get(i))
      end
      loader:close()
    end)

    it("by default keeps a prefetch thread only when the compute threads leave a core free", function()
      -- Note [default prefetch] (runtime/io/loader.c): threads x LOCAL_WORLD_SIZE < cores
      -- gives the thread (prefetch 2), otherwise batches are made on the caller's thread
      local cores = tonumber(C.sysconf(SC_NPROCESSORS_ONLN))
      local ds = data.FashionMNIST { train = false }
      local function tasks() -- this process's threads
        local n = 0
        for _ in io.popen("ls /proc/" .. C.getpid() .. "/task"):lines() do n = n + 1 end
        return n
      end
      -- threads during the first batch of an epoch of the default loader, minus before it
      local function extra_threads()
        data.DataLoader(ds, { batch_size = 64, prefetch = 0 }):iter()() -- the pool is started
        local loader = data.DataLoader(ds, { batch_size = 64 })
        local before = tasks()
        local it = loader:iter()
        assert.is_not_nil(it())
        local during = tasks()
        loader:close()
        return during - before
      end
      with_threads(cores, function()
        assert.equal(0, C.ddp_io_loader_default_prefetch(0))
        assert.equal(2, C.ddp_io_loader_default_prefetch(1)) -- pinning is the thread's job
        assert.equal(0, extra_threads())
      end)
      if cores >= 2 then
        with_threads(1, function()
          assert.equal(2, C.ddp_io_loader_default_prefetch(0))
          assert.equal(1, extra_threads())
          -- under the launcher the node's other processes count: LOCAL_WORLD_SIZE = cores
          C.setenv("LOCAL_WORLD_SIZE", tostring(cores), 1)
          local ok, err = pcall(function()
            assert.equal(0, C.ddp_io_loader_default_prefetch(0))
            assert.equal(0, extra_threads())
          end)
          C.unsetenv("LOCAL_WORLD_SIZE")
          assert(ok, err)
        end)
      end
    end)

    it("stops early, drops loaders mid-epoch and starts again without hanging", function()
      local ds = data.FashionMNIST { train = false }
      local live0 = dl.memory_stats().live
      for round = 1, 20 do
        local loader = data.DataLoader(ds, { batch_size = 16, prefetch = 4, shuffle = round % 2 == 0 })
        local n = 0
        for x in loader:iter() do
          n = n + 1
          if n == round then break end
        end
        if round % 3 == 0 then loader:close() end
        if round % 4 == 0 then
          -- a new epoch on the same loader stops the abandoned one first
          local it = loader:iter()
          assert.is_not_nil(it())
        end
        loader = nil
        collectgarbage()
      end
      collectgarbage()
      collectgarbage()
      -- no batches left behind once every loader is collected
      assert.is_true(dl.memory_stats().live - live0 < 1e6, "live bytes grew by " .. (dl.memory_stats().live - live0))
      -- after the end of an epoch the iterator stays finished
      local loader = data.DataLoader(labels_ds(5), { batch_size = 5 })
      local it = loader:iter()
      assert.is_not_nil(it())
      assert.is_nil(it())
      assert.is_nil(it())
    end)

    it("reports an error raised on the prefetch thread at the next batch", function()
      -- (under ASan this needs ASAN_OPTIONS=allocator_may_return_null=1, which `make test
      -- SANITIZE=...` sets)
      -- a source whose samples are 2^50 bytes (stride-0 view over one byte): making batch 0
      -- fails on the thread with out of memory
      local byte = dl.zeros({ 1 }, { dtype = "u8" })
      local shape = ffi.new("int64_t[3]", 2, 2 ^ 25, 2 ^ 25)
      local strides = ffi.new("int64_t[3]", 0, 0, 0)
      lib.check(C.ddp_tensor_from_blob(lib.box, C.ddp_tensor_data(byte), 3, shape, strides, C.DDP_U8, nil, nil))
      local huge = lib.wrap(lib.box[0])
      for _, prefetch in ipairs { 2, 0 } do
        local loader = data.DataLoader(data.TensorDataset(huge), { batch_size = 1, prefetch = prefetch })
        local it = loader:iter()
        local ok, err = pcall(it)
        assert.is_false(ok)
        assert.matches("loader: batch 0.*out of memory", err)
        ok, err = pcall(it) -- the error stays
        assert.is_false(ok)
        loader:close()
      end
      assert.is_not_nil(byte)
    end)

    it("takes indices from a sampler (table or i64 tensor)", function()
      local ds = labels_ds(20)
      local sampler = { indices = function() return { 19, 0, 7, 7, 3 } end }
      assert.same({ 19, 0, 7, 7, 3 }, epoch_labels(data.DataLoader(ds, { batch_size = 2, sampler = sampler })))
      assert.equal(3, #data.DataLoader(ds, { batch_size = 2, sampler = sampler }))
      local ts = { indices = function() return dl.tensor({ 5, 6, 1 }, { dtype = "i64" }) end, len = function() return 3 end }
      assert.same({ 5, 6, 1 }, epoch_labels(data.DataLoader(ds, { batch_size = 2, sampler = ts })))
      local bad = { indices = function() return { 1, 20 } end }
      local ok, err = pcall(function() epoch_labels(data.DataLoader(ds, { sampler = bad })) end)
      assert.is_false(ok)
      assert.matches("sampler index 20 at position 2 is out of range 0..19", err)
      assert.has_error(function() data.DataLoader(ds, { sampler = sampler, shuffle = true }) end)
      assert.has_error(function() data.DataLoader(ds, { batch_sise = 2 }) end)
    end)

    it("collates a generic Lua dataset in Lua", function()
      local Squares = {}
      function Squares.len() return 7 end
      function Squares.get(_, i) return dl.tensor { i, i * i }, i % 3, i / 2, i % 2 == 0 end
      local ds = data.Dataset(Squares)
      assert.equal(7, #ds)
      local loader = data.DataLoader(ds, { batch_size = 3 })
      assert.equal(3, #loader)
      local batches = {}
      for x, y, z, w in loader:iter() do batches[#batches + 1] = { x, y, z, w } end
      assert.equal(3, #batches)
      local x, y, z, w = unpack(batches[1])
      assert.same({ { 1, 1 }, { 2, 4 }, { 3, 9 } }, x:tolist())
      assert.equal("i64", y.dtype)
      assert.same({ 1, 2, 0 }, y:tolist())
      assert.equal("f64", z.dtype)
      assert.same({ 0.5, 1, 1.5 }, z:tolist())
      assert.equal("bool", w.dtype)
      assert.same({ false, true, false }, w:tolist())
      assert.same({ { 7, 49 } }, batches[3][1]:tolist())
      -- a plain table with len() works too, and a Lua function in a transform falls back
      local plain = { len = function() return 2 end, get = function(_, i) return dl.tensor { i } end }
      local n = 0
      for xb in data.DataLoader(plain, { batch_size = 2 }):iter() do
        n = n + 1
        assert.same({ { 1 }, { 2 } }, xb:tolist())
      end
      assert.equal(1, n)
      local fm = data.FashionMNIST { train = false, transform = data.Compose { data.ToFloat(), function(t) return t end } }
      local xb, yb = data.DataLoader(fm, { batch_size = 2 }):iter()()
      assert.same({ 2, 1, 28, 28 }, xb:size())
      assert.equal("i64", yb.dtype)
    end)

    it("collate_fn receives the list of samples and returns the batch (PyTorch's contract)", function()
      -- variable-length sequences padded to the longest of each batch: what collate_fn is for
      local Seqs = {}
      function Seqs.len() return 5 end
      function Seqs.get(_, i)
        local t = {}
        for k = 1, i do t[k] = 10 * i + k end
        return dl.tensor(t, { dtype = "i64" }), i
      end
      local seen = {}
      local function pad_collate(samples)
        seen[#seen + 1] = #samples
        local longest = 0
        for _, s in ipairs(samples) do longest = math.max(longest, s[1]:numel()) end
        local rows, lens = {}, {}
        for b, s in ipairs(samples) do
          local row = s[1]:tolist()
          for k = #row + 1, longest do row[k] = 0 end
          rows[b], lens[b] = row, s[2]
        end
        return dl.tensor(rows, { dtype = "i64" }), dl.tensor(lens, { dtype = "i64" })
      end
      local loader = data.DataLoader(data.Dataset(Seqs), { batch_size = 2, collate_fn = pad_collate })
      local got = {}
      for x, lens in loader:iter() do got[#got + 1] = { x:tolist(), lens:tolist() } end
      assert.same({ 2, 2, 1 }, seen)
      assert.same({ { { 11, 0 }, { 21, 22 } }, { 1, 2 } }, got[1])
      assert.same({ { { 31, 32, 33, 0 }, { 41, 42, 43, 44 } }, { 3, 4 } }, got[2])
      assert.same({ { { 51, 52, 53, 54, 55 } }, { 5 } }, got[3])
      -- a dataset with C sources goes through ds:get too; a one-value sample is the value
      local xs = dl.arange(6)
      local single = data.DataLoader(data.TensorDataset(xs), { batch_size = 4, collate_fn = function(samples)
        local sum = 0
        for _, v in ipairs(samples) do
          assert.is_true(dl.is_tensor(v))
          sum = sum + v:item()
        end
        return sum
      end })
      local sums = {}
      for v in single:iter() do sums[#sums + 1] = v end
      assert.same({ 0 + 1 + 2 + 3, 4 + 5 }, sums)
      -- default_collate is the default's collation: the same batches as no collate_fn
      local ds = data.TensorDataset(dl.arange(5), dl.arange(5):mul(2))
      local a = data.DataLoader(ds, { batch_size = 3, collate_fn = data.default_collate })
      local b = data.DataLoader(ds, { batch_size = 3 })
      local ia, ib = a:iter(), b:iter()
      for _ = 1, 2 do
        local xa, ya = ia()
        local xb, yb = ib()
        assert.same(xb:tolist(), xa:tolist())
        assert.same(yb:tolist(), ya:tolist())
      end
      assert.is_nil(ia())
      local dict = data.default_collate { { x = dl.tensor { 1, 2 }, y = 3 }, { x = dl.tensor { 4, 5 }, y = 6 } }
      assert.same({ { 1, 2 }, { 4, 5 } }, dict.x:tolist())
      assert.same({ 3, 6 }, dict.y:tolist())
    end)

    it("collate_fn errors: not a function, returning nil, default_collate's misfits", function()
      local ds = data.TensorDataset(dl.arange(4))
      assert.matches("DataLoader: collate_fn must be a function", select(2, pcall(data.DataLoader, ds, { collate_fn = 3 })))
      local loader = data.DataLoader(ds, { batch_size = 2, collate_fn = function() end })
      local ok, err = pcall(function() for _ in loader:iter() do end end)
      assert.is_false(ok)
      assert.matches("collate_fn returned nil for batch 1", err)
      ok, err = pcall(data.default_collate, { { 1, 2 }, { 3 } })
      assert.is_false(ok)
      assert.matches("default_collate: sample 2 has 1 parts, sample 1 has 2", err)
      ok, err = pcall(data.default_collate, { { x = 1 }, { y = 2 } })
      assert.matches("sample 2 has no field 'x'", err)
    end)
  end)
end)
