-- Specs for the readers of bytes in memory (ddp_io_read_idx_bytes, ddp_io_read_cifar_bytes,
-- ddp_io_safetensors_load_bytes): the same parsers the file readers use (Note [one IDX reader
-- for files and bytes] and its CIFAR and safetensors twins), which the fuzz targets call.
-- Each gives what the file reader gives on the same bytes, and errors naming the name.
local dl = require "ddplua"
local checkpoint = require "ddplua.checkpoint"
local data = require "ddplua.data"
local lib = require "ddplua.lib"
local files = require "files"
local ffi = lib.ffi
local C = lib.C

local FMNIST = "/usr/share/datasets/fashion-mnist"

-- The tensor of a bytes reader, or nil and its error.
local function idx_bytes(s, name)
  local box = ffi.new("ddp_tensor*[1]")
  if C.ddp_io_read_idx_bytes(box, s, #s, name) ~= 0 then return nil, ffi.string(C.ddp_last_error()) end
  return box[0]
end

describe("io readers of bytes", function()
  local dir
  before_each(function() dir = files.tmpdir("iobytes") end)
  after_each(function() files.remove(dir) end)

  it("read an IDX file's bytes, gzipped or raw, as the file reader does", function()
    local path = FMNIST .. "/t10k-labels-idx1-ubyte.gz"
    local want = data.read_idx(path)
    local gz = files.read(path)
    local t = assert(idx_bytes(gz, "labels.gz"))
    assert.equal(want:numel(), C.ddp_tensor_numel(t))
    local a, b = ffi.cast("uint8_t *", C.ddp_tensor_data(t)), ffi.cast("uint8_t *", C.ddp_tensor_data(want))
    for i = 0, want:numel() - 1 do
      if a[i] ~= b[i] then error(("label %d: %d, the file reader %d"):format(i, a[i], b[i])) end
    end
    C.ddp_tensor_release(t)
    -- raw bytes, and the same cut short
    local raw = "\0\0\8\2\0\0\0\2\0\0\0\3" .. "\1\2\3\4\5\6"
    t = assert(idx_bytes(raw, "raw"))
    assert.equal(6, C.ddp_tensor_numel(t))
    assert.equal(6, ffi.cast("uint8_t *", C.ddp_tensor_data(t))[5])
    C.ddp_tensor_release(t)
    local _, err = idx_bytes(raw:sub(1, -2), "short-idx")
    assert.matches("short-idx: truncated: header says (2, 3) of u8, expected 6 bytes of data, found 5", err, 1, true)
    _, err = idx_bytes(gz:sub(1, #gz - 4), "cut.gz")
    assert.matches("cut.gz: corrupt gzip data", err, 1, true)
  end)

  it("read a CIFAR-10 batch's bytes as the file reader does", function()
    local rec = string.char(7) .. string.rep("\200", 3072) .. string.char(2) .. string.rep("\1", 3072)
    local path = files.write(dir, "batch.bin", rec)
    local want_images, want_labels = data.read_cifar(path)
    local boxes = ffi.new("ddp_tensor*[2]")
    assert.equal(0, C.ddp_io_read_cifar_bytes(boxes, boxes + 1, rec, #rec, "batch.bin"))
    local lp = ffi.cast("int64_t *", C.ddp_tensor_data(boxes[1]))
    assert.same({ 7, 2 }, { tonumber(lp[0]), tonumber(lp[1]) })
    assert.same(want_labels:tolist(), { 7, 2 })
    local ip = ffi.cast("uint8_t *", C.ddp_tensor_data(boxes[0]))
    assert.same({ 200, 1 }, { ip[3071], ip[3072] })
    assert.equal(want_images:numel(), C.ddp_tensor_numel(boxes[0]))
    C.ddp_tensor_release(boxes[0])
    C.ddp_tensor_release(boxes[1])
    local bad = string.char(10) .. string.rep("\0", 3072)
    assert.equal(C.DDP_ERR_IO, C.ddp_io_read_cifar_bytes(boxes, boxes + 1, bad, #bad, "bad.bin"))
    assert.matches("bad.bin: record 0 (0-based) has label 10, expected 0..9", ffi.string(C.ddp_last_error()), 1, true)
  end)

  it("load a safetensors file's bytes as the file reader does", function()
    local path = dir .. "/w.safetensors"
    checkpoint.save(path, { w = dl.tensor({ 1.5, -2 }), n = dl.tensor({ 3 }, { dtype = "i64" }) })
    local s = files.read(path)
    local fbox = ffi.new("ddp_io_safetensors*[1]")
    assert.equal(0, C.ddp_io_safetensors_load_bytes(fbox, s, #s, "w.safetensors"))
    local got = {}
    local tbox = ffi.new("ddp_tensor*[1]")
    for i = 0, C.ddp_io_safetensors_count(fbox[0]) - 1 do
      assert.equal(0, C.ddp_io_safetensors_tensor(tbox, fbox[0], i))
      got[ffi.string(C.ddp_io_safetensors_name(fbox[0], i))] = C.ddp_tensor_numel(tbox[0])
      C.ddp_tensor_release(tbox[0])
    end
    C.ddp_io_safetensors_free(fbox[0])
    assert.same({ w = 2, n = 1 }, got)
    assert.equal(C.DDP_ERR_IO, C.ddp_io_safetensors_load_bytes(fbox, s, #s - 1, "cut.safetensors"))
    assert.matches("cut.safetensors: tensor '", ffi.string(C.ddp_last_error()), 1, true)
  end)
end)
