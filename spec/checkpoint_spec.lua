-- Specs for ddplua.checkpoint: safetensors round trips (every dtype, metadata), atomic
-- saves (a writer killed mid-save), malformed files, the compare helper, and reading our
-- files from Python (stdlib parser always; safetensors/torch when installed).
local dl = require "ddplua"
local checkpoint = require "ddplua.checkpoint"
local lib = require "ddplua.lib"
local views = require "views"
local ffi = lib.ffi

local files = require "files"
local tmpdir
setup(function() tmpdir = files.tmpdir("ckpt") end)
teardown(function() files.remove(tmpdir) end)

local function read_all(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
local function write_all(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end
local function le64(n)
  local b = {}
  for i = 1, 8 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end
-- A safetensors file from a header text and data bytes (the header is used as is).
local function raw_file(name, header, payload)
  local path = tmpdir .. "/" .. name
  write_all(path, le64(#header) .. header .. (payload or ""))
  return path
end
local function esc(s) return (s:gsub("%p", "%%%0")) end

-- Values exactly representable in every dtype they are used with.
local function sample_tensors()
  return {
    f32 = dl.tensor({ { 1.5, -2.25, 3e-8 }, { 1e30, 0, -0.0 } }, { dtype = "f32" }),
    f64 = dl.tensor({ 0.1, -1e-300, 12345.678901234567 }, { dtype = "f64" }),
    f16 = dl.tensor({ { 1.5, -65504 }, { 2 ^ -24, 0.333251953125 } }, { dtype = "f64" }):to("f16"),
    bf16 = dl.tensor({ 1.5, -3.140625, 2 ^ 100 }, { dtype = "f64" }):to("bf16"),
    i64 = dl.tensor({ 2 ^ 40 + 1, -7, 0, -(2 ^ 52) }, { dtype = "i64" }),
    i32 = dl.tensor({ { -2147483648, 2147483647 } }, { dtype = "i32" }),
    u8 = dl.tensor({ 0, 1, 254, 255, 128 }, { dtype = "u8" }),
    bool = dl.tensor({ true, false, true }),
    scalar = dl.tensor(3.25, { dtype = "f64" }),
    empty = dl.zeros({ 0, 4 }, { dtype = "f32" }),
  }
end

describe("ddplua.checkpoint", function()
  it("round-trips every dtype, 0-d and empty tensors, and strided inputs", function()
    local ts = sample_tensors()
    local tv, owner = views.transposed(dl.tensor { { 1, 2, 3 }, { 4, 5, 6 } })
    ts.transposed = tv
    local path = tmpdir .. "/all.safetensors"
    checkpoint.save(path, ts)
    local back, meta = checkpoint.load(path)
    assert.same({}, meta)
    local n = 0
    for name, t in pairs(ts) do
      n = n + 1
      local b = back[name]
      assert.is_not_nil(b, name)
      assert.equal(t.dtype, b.dtype, name)
      assert.same(t:size(), b:size(), name)
      assert.same(t:tolist(), b:tolist(), name)
    end
    for _ in pairs(back) do n = n - 1 end
    assert.equal(0, n)
    assert.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, back.transposed:tolist())
    assert.is_not_nil(owner)
    -- the file is a safetensors file: 8-byte length, JSON padded to 8, dtype names
    local s = read_all(path)
    local hlen = 0
    for i = 8, 1, -1 do hlen = hlen * 256 + s:byte(i) end
    assert.equal(0, hlen % 8)
    local header = s:sub(9, 8 + hlen)
    assert.matches('^{', header)
    for _, name in ipairs { "F32", "F64", "F16", "BF16", "I64", "I32", "U8", "BOOL" } do
      assert.matches('"dtype":"' .. name .. '"', header)
    end
  end)

  it("round-trips metadata of strings, numbers, booleans and nested tables", function()
    local meta = {
      name = "run \"7\"\n\ttab\\ é",
      looks_like_number = "42",
      epoch = 12, lr = 0.1, neg = -3.5e-7, big = 2 ^ 53, flag = true, off = false,
      nested = { sizes = { 784, 256, 10 }, opt = { name = "sgd", momentum = 0.9 }, empty = {} },
      mixed = { 1, "two", true, { 3 } },
    }
    local path = tmpdir .. "/meta.safetensors"
    checkpoint.save(path, { w = dl.ones { 2 } }, meta)
    local _, back = checkpoint.load(path)
    assert.same(meta, back)
    assert.equal("string", type(back.looks_like_number))
    assert.equal("number", type(back.epoch))
    -- the raw metadata is string -> string with the JSON keys listed
    local s = read_all(path)
    assert.matches('"ddplua.json_keys":"%[', s)
    assert.matches('"looks_like_number":"42"', s)
    assert.matches('"lr":"0.1"', s) -- the shortest text that reads back exactly
    assert.has_error(function() checkpoint.save(path, {}, { x = 0 / 0 }) end)
    assert.has_error(function() checkpoint.save(path, {}, { x = { [2] = 1 } }) end)
    assert.has_error(function() checkpoint.save(path, {}, { ["ddplua.json_keys"] = "x" }) end)
    assert.has_error(function() checkpoint.save(path, { w = 3 }) end)
  end)

  it("leaves the previous checkpoint intact when a writer dies mid-save", function()
    local path = tmpdir .. "/atomic.safetensors"
    local old = dl.arange(0, 1000, 1, { dtype = "f32" })
    checkpoint.save(path, { w = old }, { version = "old" })
    local helper = tmpdir .. "/writer.lua"
    write_all(helper, ([[
      package.path = %q
      local dl = require "ddplua"
      local checkpoint = require "ddplua.checkpoint"
      local path, mb, marker = arg[1], tonumber(arg[2]), arg[3]
      local big = dl.full({ mb * 262144 }, 7)
      for i = 1, 1000 do
        if marker then io.open(marker, "w"):close() end
        checkpoint.save(path, { w = big }, { version = "new" .. i })
      end
    ]]):format(package.path))
    local env = ""
    if os.getenv("DDPLUA_LIB") then env = "DDPLUA_LIB='" .. os.getenv("DDPLUA_LIB") .. "' " end
    -- 1) deterministic: a file size limit kills the writer with SIGXFSZ partway through
    -- writing its 4 MiB temporary file
    local rc = os.execute(("ulimit -f 256; %sexec luajit '%s' '%s' 4 2>/dev/null"):format(env, helper, path))
    assert.are_not.equal(0, rc)
    local function listing()
      local p = io.popen("ls '" .. tmpdir .. "'")
      local text = p:read("*a")
      p:close()
      return text
    end
    assert.matches("atomic.safetensors.tmp.%S+%.%d+", listing()) -- the half-written temporary
    local t, meta = checkpoint.load(path)
    assert.equal("old", meta.version)
    assert.same(old:tolist(), t.w:tolist())
    assert.not_matches("atomic.safetensors.tmp.", listing(), 1, true) -- load swept it
    -- 2) SIGKILL at an arbitrary moment of a loop of saves: the file is always whole
    local marker = tmpdir .. "/started"
    local pidf = io.popen(("%sluajit '%s' '%s' 16 '%s' >/dev/null 2>&1 & echo $!"):format(env, helper, path, marker))
    local pid = pidf:read("*l")
    pidf:close()
    for _ = 1, 200 do -- wait (bounded, 10 s) until the writer is saving
      if io.open(marker, "r") then break end
      os.execute("sleep 0.05")
    end
    os.execute("sleep 0.1; kill -9 " .. pid .. " 2>/dev/null; sleep 0.1")
    t, meta = checkpoint.load(path)
    if meta.version == "old" then
      assert.same(old:tolist(), t.w:tolist())
    else
      assert.matches("^new%d+$", meta.version)
      assert.equal(16 * 262144, t.w:numel())
    end
    -- 3) a stale temporary file next to the checkpoint changes nothing, and saving again works
    write_all(path .. ".tmp.999999", "garbage")
    checkpoint.save(path, { w = old }, { version = "again" })
    t, meta = checkpoint.load(path)
    assert.equal("again", meta.version)
    assert.same(old:tolist(), t.w:tolist())
  end)

  it("rejects malformed files naming the file and the tensor", function()
    local good = tmpdir .. "/good.safetensors"
    checkpoint.save(good, { a = dl.ones { 4 }, b = dl.zeros({ 2 }, { dtype = "i64" }) })
    local s = read_all(good)
    local function fails(path, pattern)
      local ok, err = pcall(checkpoint.load, path)
      assert.is_false(ok, path)
      assert.matches(esc(path), err)
      assert.matches(pattern, err)
    end
    -- truncated data, truncated header, too short for the length
    local p = tmpdir .. "/trunc.safetensors"
    write_all(p, s:sub(1, #s - 3))
    fails(p, "tensor 'a': data_offsets %[16, 32%] out of range: the data part has 29 bytes")
    write_all(p, s .. "xyz")
    fails(p, "the tensors' data ends at offset 32 but the file has 35 data bytes")
    write_all(p, s:sub(1, 20))
    fails(p, "bad header length %d+: the file has only 12 bytes after it")
    write_all(p, s:sub(1, 5))
    fails(p, "truncated: 5 bytes")
    fails(raw_file("emptyhdr.safetensors", "", ""), "the 0%-byte header is not a JSON object")
    write_all(tmpdir .. "/len.safetensors", le64(2 ^ 40) .. "{}")
    fails(tmpdir .. "/len.safetensors", "bad header length 1099511627776")
    fails(raw_file("notjson.safetensors", "{\"a\": [1, 2", ""), "header is not a JSON object")
    fails(raw_file("range.safetensors", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "1234"),
      "tensor 'w': data_offsets %[0, 8%] out of range: the data part has 4 bytes")
    fails(raw_file("size.safetensors", '{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', "12345678"),
      "tensor 'w': data_offsets %[0, 8%] hold 8 bytes but F32 %(3,%) needs 12")
    fails(raw_file("dtype.safetensors", '{"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}', "1"),
      "tensor 'w': unsupported dtype \"F8_E4M3\"")
    fails(raw_file("fields.safetensors", '{"w":{"dtype":"F32","data_offsets":[0,4]}}', "1234"),
      "tensor 'w': needs a string \"dtype\", an array \"shape\"")
    fails(raw_file("neg.safetensors", '{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', "1"),
      "tensor 'w': shape entry 0 is not a non%-negative integer")
    -- 2^61 F64 elements are 2^64 bytes, which wrapped to 0 and passed for offsets [0, 0]
    fails(raw_file("wrap.safetensors", '{"w":{"dtype":"F64","shape":[2147483648,1073741824],"data_offsets":[0,0]}}', ""),
      "tensor 'w': shape %(2147483648, 1073741824%) of F64 is absurdly large")
    fails(raw_file("overlap.safetensors",
      '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', "123"),
      "tensor 'b' starts at data offset 1 but the previous tensor ends at 2 %(overlap%)")
    fails(raw_file("gap.safetensors", '{"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', "123"),
      "tensor 'a' starts at data offset 1 but the previous tensor ends at 0 %(gap%)")
    fails(raw_file("meta.safetensors", '{"__metadata__":{"k":3}}', ""), "metadata 'k' is not a string")
    -- the second __metadata__ was counted into the first one's arrays: a heap overflow
    -- (fuzz/corpus/safetensors_json/finding-metadata-twice)
    fails(raw_file("meta2.safetensors", '{"__metadata__":{"k":"1","l":"2"},"__metadata__":{"m":"3"}}', ""),
      "__metadata__ appears twice in the header")
    fails(tmpdir .. "/absent.safetensors", "cannot open .*: No such file")
  end)

  it("compares names, shapes and dtypes against what is expected", function()
    local path = tmpdir .. "/cmp.safetensors"
    checkpoint.save(path, { ["fc.weight"] = dl.zeros { 4, 3 }, ["fc.bias"] = dl.zeros { 4 }, extra = dl.zeros { 1 },
      steps = dl.zeros({ 1 }, { dtype = "f64" }) })
    local t = checkpoint.load(path)
    local ok, diffs = checkpoint.compare(t, {
      ["fc.weight"] = dl.zeros { 3, 4 },
      ["fc.bias"] = { shape = { 4 }, dtype = "float32" },
      steps = { dtype = "i64" },
      ["out.weight"] = { shape = { 10, 4 }, dtype = "f32" },
    })
    assert.is_false(ok)
    assert.same({
      "unexpected: extra (1,) f32",
      "shape of fc.weight: (4, 3) in the checkpoint, expected (3, 4)",
      "missing: out.weight (expected shape (10, 4) f32)",
      "dtype of steps: f64 in the checkpoint, expected i64",
    }, { diffs[1], diffs[2], diffs[3], diffs[4] })
    assert.equal(4, #diffs)
    assert.matches("missing: out.weight", diffs.text)
    ok, diffs = checkpoint.compare(t, t)
    assert.is_true(ok)
    assert.equal(0, #diffs)
  end)

  it("writes files Python reads with the same values", function()
    if not io.open("/usr/bin/python3", "r") then
      pending("no /usr/bin/python3")
      return
    end
    local ts = sample_tensors()
    local path = tmpdir .. "/py.safetensors"
    checkpoint.save(path, ts, { epoch = 3, note = "hi" })
    -- an independent reader written with the standard library: struct + json
    local script = tmpdir .. "/read.py"
    write_all(script, [==[
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
fmt = {"F32": "f", "F64": "d", "F16": "e", "I64": "q", "I32": "i", "U8": "B", "BOOL": "?"}
out = {"__metadata__": header.pop("__metadata__", {})}
for name, e in sorted(header.items()):
    b, end = e["data_offsets"]
    chunk = data[b:end]
    if e["dtype"] == "BF16":
        vals = [struct.unpack("<f", b"\0\0" + chunk[i:i + 2])[0] for i in range(0, len(chunk), 2)]
    else:
        f = fmt[e["dtype"]]
        vals = list(struct.unpack("<%d%s" % (len(chunk) // struct.calcsize(f), f), chunk))
    out[name] = {"dtype": e["dtype"], "shape": e["shape"], "values": [repr(v) for v in vals]}
print(json.dumps(out))
]==])
    local p = io.popen("/usr/bin/python3 '" .. script .. "' '" .. path .. "'")
    local text = p:read("*a")
    p:close()
    local got = checkpoint.json_decode(text)
    assert.same({ epoch = "3", note = "hi", ["ddplua.json_keys"] = '["epoch"]' }, got.__metadata__)
    local st_names = { f32 = "F32", f64 = "F64", f16 = "F16", bf16 = "BF16", i64 = "I64", i32 = "I32", u8 = "U8", bool = "BOOL" }
    for name, t in pairs(ts) do
      local e = got[name]
      assert.is_not_nil(e, name)
      assert.equal(st_names[t.dtype], e.dtype)
      assert.same(t:size(), e.shape)
      local flat = {}
      local function walk(v)
        if type(v) == "table" then for i = 1, #v do walk(v[i]) end else flat[#flat + 1] = v end
      end
      walk(t:tolist())
      assert.equal(#flat, #e.values, name)
      for i, v in ipairs(flat) do
        local pv = e.values[i]
        if pv == "True" then pv = true elseif pv == "False" then pv = false else pv = tonumber(pv) end
        assert.equal(v, pv, name .. " element " .. i)
      end
    end
    -- the real libraries, when installed (one Python start: importing torch is slow)
    local check = tmpdir .. "/check.py"
    write_all(check, [==[
import sys
try:
    from safetensors.torch import load_file
    ts = load_file(sys.argv[1])
    reader = "safetensors"
except ImportError:
    try:
        import torch
    except ImportError:
        print('{"__none__": true}')
        sys.exit(0)
    import json, struct
    raw = open(sys.argv[1], "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    dt = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
    ts = {}
    for k, e in h.items():
        b, end = e["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + end])
        t = torch.frombuffer(buf, dtype=dt[e["dtype"]]) if buf else torch.empty(0, dtype=dt[e["dtype"]])
        ts[k] = t.reshape(e["shape"])
    reader = "torch"
import json
out = {k: {"dtype": str(t.dtype), "shape": list(t.shape),
           "values": t.double().flatten().tolist()} for k, t in ts.items()}
out["__reader__"] = reader
print(json.dumps(out))
]==])
    p = io.popen("/usr/bin/python3 '" .. check .. "' '" .. path .. "'")
    local torch_view = checkpoint.json_decode(p:read("*a"))
    p:close()
    if torch_view.__none__ then
      pending("python3 has neither safetensors nor torch: checked with the stdlib reader only")
      return
    end
    local has = torch_view.__reader__ == "safetensors"
    local torch_names = { f32 = "torch.float32", f64 = "torch.float64", f16 = "torch.float16", bf16 = "torch.bfloat16",
      i64 = "torch.int64", i32 = "torch.int32", u8 = "torch.uint8", bool = "torch.bool" }
    for name, t in pairs(ts) do
      local e = torch_view[name]
      assert.is_not_nil(e, name)
      assert.equal(torch_names[t.dtype], e.dtype, name)
      assert.same(t:size(), e.shape, name)
      local flat = {}
      local function walk(v)
        if type(v) == "table" then for i = 1, #v do walk(v[i]) end else flat[#flat + 1] = v end
      end
      walk(t:tolist())
      for i, v in ipairs(flat) do
        if type(v) == "boolean" then v = v and 1 or 0 end
        assert.equal(v, e.values[i], name .. " element " .. i .. " read by " .. (has and "safetensors" or "torch"))
      end
    end
  end)
end)
