-- fuzz/make_corpus.lua: writes the seed corpora of the fuzz targets into fuzz/corpus/<name>/
-- (a few valid inputs and edge cases each, all tiny). Run from the repository root:
--   luajit fuzz/make_corpus.lua
-- The files are committed; run it again after changing it. Inputs that libFuzzer found
-- (crashes, reports) are kept in the same folders as finding-<what> and are not written
-- here (this script only adds or overwrites its own seeds); review-* and refused-* are
-- faults found by reading the code, written here.
local function write(name, file, bytes)
  local dir = "fuzz/corpus/" .. name
  os.execute("mkdir -p " .. dir)
  local f = assert(io.open(dir .. "/" .. file, "wb"))
  f:write(bytes)
  f:close()
end

local function le(n, k) -- n as k little-endian bytes
  local b = {}
  for i = 1, k do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end
local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end

-- ---- safetensors ---------------------------------------------------------------------------
local function st(header, data) return le(#header, 8) .. header .. (data or "") end
write("safetensors_file", "one_f32", st('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', le(0x3f800000, 4) .. le(0x40000000, 4)))
write("safetensors_file", "empty", st("{}"))
write("safetensors_file", "padded_meta", st('{"__metadata__":{"format":"pt"},"b":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}}    ', "\1"))
write("safetensors_file", "three", st('{"a":{"dtype":"U8","shape":[2,1],"data_offsets":[0,2]},"c":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},'
  .. '"b":{"dtype":"F16","shape":[1],"data_offsets":[2,4]}}', string.rep("\7", 12)))
write("safetensors_file", "zero_size", st('{"e":{"dtype":"F64","shape":[0,3],"data_offsets":[0,0]}}'))
-- 2^61 F64 elements: 2^64 bytes wrapped to 0 (found by review, fixed; spec/checkpoint_spec.lua)
write("safetensors_file", "review-size-wraps", st('{"w":{"dtype":"F64","shape":[2147483648,1073741824],"data_offsets":[0,0]}}'))

write("safetensors_json", "metadata", '{"__metadata__":{"format":"pt","step":"12","json_keys":"[\\"step\\"]"}}')
write("safetensors_json", "tensor64", '{"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}')
write("safetensors_json", "two_and_meta", '{"a":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},'
  .. '"__metadata__":{"x":"y"},"b":{"dtype":"BF16","shape":[2,8],"data_offsets":[32,64]}}')
write("safetensors_json", "escapes", '{"__metadata__":{"\\u00e9\\u0000k":"v\\n\\"\\\\","":""}}')
write("safetensors_json", "nested", '{"__metadata__":{"k":{"a":[1,2,{"b":null}]}}}')
write("safetensors_json", "numbers", '{"w":{"dtype":"I32","shape":[1e1,1.6],"data_offsets":[-0,64.0]}}')

-- ---- IDX -------------------------------------------------------------------------------
local idx_u8 = "\0\0\8\2" .. be32(2) .. be32(3) .. "\1\2\3\4\5\6"
local idx_i16 = "\0\0\11\1" .. be32(3) .. "\255\254\0\1\128\0"
local idx_f64 = "\0\0\14\1" .. be32(1) .. "\63\240\0\0\0\0\0\0"
local idx_i32 = "\0\0\12\3" .. be32(1) .. be32(1) .. be32(1) .. "\128\0\0\1"
local idx_empty = "\0\0\13\2" .. be32(0) .. be32(5)
for _, name in ipairs { "idx", "idx_gzip" } do
  write(name, "u8_2x3", idx_u8)
  write(name, "i16", idx_i16)
  write(name, "f64", idx_f64)
  write(name, "i32_3d", idx_i32)
  write(name, "empty", idx_empty)
  write(name, "i8_8d", "\0\0\9\8" .. string.rep(be32(1), 8) .. "\200")
end
-- a gzipped seed for the target that takes files as they come
local tmp = os.tmpname()
local f = assert(io.open(tmp, "wb"))
f:write(idx_u8)
f:close()
local p = assert(io.popen("gzip -9 -n -c " .. tmp, "r"))
write("idx", "u8_2x3.gz", p:read("*a"))
p:close()
os.remove(tmp)

-- ---- CIFAR-10 --------------------------------------------------------------------------
local function record(label, fill) return string.char(label) .. string.rep(string.char(fill), 3072) end
write("cifar", "one", record(3, 200))
write("cifar", "two", record(0, 1) .. record(9, 2))
write("cifar", "bad_label", record(10, 0))
write("cifar", "short", record(1, 0):sub(1, 3000))

-- ---- token files (fuzz/tokens.c: vocab byte, block byte, 2-byte start, then uint16 words) --
local function tokens(vocab_byte, block_byte, start, words)
  local out = { string.char(vocab_byte, block_byte), le(start, 2) }
  for _, w in ipairs(words) do out[#out + 1] = le(w, 2) end
  return table.concat(out)
end
write("tokens", "chars", tokens(1, 3, 2, { 18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52 }))
write("tokens", "gpt2_vocab", tokens(196, 7, 0, { 50256, 464, 3290, 0, 50255, 11, 13, 198, 262 }))
write("tokens", "full_range", tokens(255, 0, 1, { 65535, 0, 65535 }))
write("tokens", "empty", tokens(1, 0, 0, {}))
write("tokens", "too_short", tokens(1, 15, 0, { 1, 2, 3 }))
write("tokens", "bad_token", tokens(0, 1, 0, { 0, 1 }))
write("tokens", "odd_size", tokens(1, 1, 0, { 5, 6 }) .. "\1")
write("tokens", "start_past_end", tokens(1, 1, 40000, { 5, 6, 7 }))

-- ---- the store (Note [store wire protocol]) ---------------------------------------------
local function frame(op, ...)
  local out = { string.char(op), le(select("#", ...), 4) }
  for _, a in ipairs { ... } do out[#out + 1] = le(#a, 4) .. a end
  return table.concat(out)
end
-- store_requests input: pieces of at most 128 bytes, each after its control byte
local function pieces(list) -- list of {conn, bytes}
  local out = {}
  for _, p in ipairs(list) do
    local which, s = p[1], p[2]
    for i = 1, #s, 128 do
      local chunk = s:sub(i, i + 127)
      out[#out + 1] = string.char(which + 2 * (#chunk - 1)) .. chunk
    end
  end
  return table.concat(out)
end
local SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUMKEYS, CANCEL = 1, 2, 3, 4, 5, 6, 7, 8, 9
write("store_requests", "set_get", pieces { { 0, frame(SET, "k", "v") .. frame(GET, "k") } })
write("store_requests", "parked_get_woken", pieces { { 0, frame(GET, "late") }, { 1, frame(SET, "late", "now") } })
write("store_requests", "wait_cancel", pieces { { 0, frame(WAIT, "a", "b") }, { 1, frame(SET, "a", "1") }, { 0, frame(CANCEL) } })
write("store_requests", "add", pieces { { 1, frame(ADD, "n", le(5, 8)) .. frame(ADD, "n", le(2 ^ 53, 8)) .. frame(NUMKEYS) } })
write("store_requests", "cas_check_delete", pieces { { 0, frame(CAS, "c", "", "x") .. frame(CAS, "c", "x", "y")
  .. frame(CAS, "c", "no", "z") .. frame(CHECK, "c", "d") .. frame(DELETE, "c") .. frame(DELETE, "c") } })
write("store_requests", "refused_big_value", pieces { { 0, "\1" .. le(2, 4) .. le(1, 4) .. "k" .. le(2 ^ 30, 4) .. string.rep("z", 200) } })
write("store_requests", "malformed", pieces { { 0, frame(12) }, { 1, frame(SET, "", "v") } })
write("store_requests", "partial", pieces { { 0, frame(SET, "key", string.rep("v", 300)):sub(1, 250) } })
write("store_requests", "split_one_byte", (frame(SET, "k", "value") .. frame(GET, "k")):gsub(".", function(c) return "\0" .. c end))

-- store_handshake input: byte 0 (bits 0-5 piece size - 1, bit 6 write the right proof),
-- then the client's 64-byte answer (32-byte nonce, 32-byte proof) and what follows it
write("store_handshake", "right_then_request", string.char(64 + 63) .. string.rep("\17", 32) .. string.rep("\0", 32) .. frame(NUMKEYS) .. frame(SET, "a", "b"))
write("store_handshake", "right_one_byte_pieces", string.char(64) .. string.rep("\3", 64) .. frame(GET, "x"))
write("store_handshake", "wrong", string.char(7) .. string.rep("\0", 64) .. frame(NUMKEYS))
write("store_handshake", "short", string.char(2) .. "DDPSTOR1")

-- ---- object collectives (Note [object bytes] in runtime/include/ddplua/objects.h) --------
local ffi = require "ffi"
local dbox = ffi.new("double[1]")
local function enc(v)
  local tv = type(v)
  if v == nil then return "n" end
  if tv == "boolean" then return v and "t" or "f" end
  if tv == "number" then
    dbox[0] = v
    return "d" .. ffi.string(dbox, 8)
  end
  if tv == "string" then return "s" .. le(#v, 4) .. v end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local out = { "T" .. le(#keys, 4) }
  for _, k in ipairs(keys) do out[#out + 1] = enc(k) .. enc(v[k]) end
  return table.concat(out)
end
write("object_decode", "scalars", enc { true, false, 0, -0.0, 1 / 0, -1 / 0, 0.1, "", "a\0b" })
write("object_decode", "rank_value", enc { rank = 1, loss = 0.25, name = "rank 1", list = { 1, 2, 3 },
  nested = { a = { b = { c = 1 } } }, [1.5] = "float key", [true] = "bool key" })
write("object_decode", "nil", enc(nil))
write("object_decode", "nan_value", enc { x = 0 / 0 })
write("object_decode", "empty_table", enc {})
local deep = "n"
for _ = 1, 512 do deep = "T" .. le(1, 4) .. "sx" .. deep end
write("object_decode", "deep_512", (deep:gsub("sx", "s" .. le(1, 4) .. "x")))
-- bytes no sender makes, which the Lua decoder mishandled before the check moved to C
-- (found by reading it while writing the C contract, not by libFuzzer;
-- spec/distributed/objects_spec.lua)
dbox[0] = 0 / 0
write("object_decode", "refused-nan-key", "T" .. le(1, 4) .. "d" .. ffi.string(dbox, 8) .. "t")
write("object_decode", "refused-nil-key", "T" .. le(1, 4) .. "nt")
write("object_decode", "refused-table-key", "T" .. le(1, 4) .. "T" .. le(0, 4) .. "t")
write("object_decode", "refused-deep", string.rep("T" .. le(1, 4) .. "t", 600) .. "n")

-- ---- the distributed REPL's frames (fuzz/repl_frames.c) ----------------------------------
-- byte 0: side (0 the prompt reading a rank, 1 a rank reading the prompt); byte 1: piece seed
local function frame(t, payload) return t .. ("%010d"):format(#payload) .. payload end
local hex64 = string.rep("0123456789abcdef", 4)
write("repl_frames", "rank_hello_proof_output", "\0\7" .. frame("H", "1 " .. hex64) .. frame("P", hex64) .. frame("O", "[tensor]\n"))
write("repl_frames", "prompt_answer_input_interrupt", "\1\3" .. frame("A", hex64 .. " " .. hex64) .. frame("L", "print(1)") .. frame("I", ""))
-- the eleven bytes that made the prompt free a partial frame twice (fixed; spec/dist_repl_security_spec.lua)
write("repl_frames", "review-eleven-bytes", "\0\1H0000000010")
write("repl_frames", "review-signed-length", "\0\1H-000000001")
write("repl_frames", "review-truncated-answer", "\1\1A0000000129" .. string.rep("a", 20))

-- ---- images (fuzz/image.c) -------------------------------------------------------------
-- Written by ddplua's own encoders (data.write_png / write_jpeg, runtime/io/image.c): needs
-- build/libddplua.so; skipped with a note when it is not built.
package.path = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;" .. package.path
local ok_dl, dl = pcall(require, "ddplua")
if ok_dl then
  local data = require "ddplua.data"
  local tmp = os.tmpname()
  local function encoded(fn, img, ...)
    fn(tmp, img, ...)
    local f = assert(io.open(tmp, "rb"))
    local s = f:read("*a")
    f:close()
    return s
  end
  local gray = (dl.rand({ 1, 3, 5 }, { generator = dl.Generator(1) }) * 255):to("u8")
  local rgb = (dl.rand({ 3, 4, 4 }, { generator = dl.Generator(2) }) * 255):to("u8")
  local png_gray, png_rgb = encoded(data.write_png, gray), encoded(data.write_png, rgb)
  local jpg_gray, jpg_rgb = encoded(data.write_jpeg, gray, 80), encoded(data.write_jpeg, rgb, 50)
  write("image", "png_gray", png_gray)
  write("image", "png_rgb", png_rgb)
  write("image", "jpeg_gray", jpg_gray)
  write("image", "jpeg_rgb", jpg_rgb)
  write("image", "png_truncated", png_rgb:sub(1, #png_rgb - 12))
  write("image", "jpeg_truncated", jpg_rgb:sub(1, math.floor(#jpg_rgb / 2)))
  write("image", "png_signature_only", png_rgb:sub(1, 8))
  os.remove(tmp)
else
  io.stderr:write("make_corpus: build/libddplua.so not loadable, fuzz/corpus/image not written: " .. tostring(dl) .. "\n")
end

-- ---- NumPy arrays and CSV tables (fuzz/npy.c, fuzz/npz.c, fuzz/csv.c) ---------------------
local function npy(descr, shape, body, fortran)
  local header = ("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }"):format(descr, fortran and "True" or "False", shape)
  local pad = 64 - (10 + #header + 1) % 64
  header = header .. string.rep(" ", pad % 64) .. "\n"
  return "\147NUMPY\1\0" .. le(#header, 2) .. header .. body
end
local npy_f4 = npy("<f4", "(2, 2)", le(0x3f800000, 4) .. le(0x40000000, 4) .. le(0, 4) .. le(0xbf800000, 4))
local npy_i8 = npy(">i8", "(3,)", string.rep("\0", 7) .. "\1" .. string.rep("\255", 8) .. string.rep("\0", 7) .. "\7")
write("npy", "f4_2x2", npy_f4)
write("npy", "i8_big_endian", npy_i8)
write("npy", "u1_fortran", npy("|u1", "(2, 3)", "\1\2\3\4\5\6", true))
write("npy", "b1_scalar", npy("|b1", "()", "\1"))
write("npy", "f2_empty", npy("<f2", "(0, 4)", ""))
write("npy", "v2_header", "\147NUMPY\2\0" .. le(npy_f4:byte(9) + 256 * npy_f4:byte(10), 4) .. npy_f4:sub(11))
write("npy", "truncated", npy_f4:sub(1, #npy_f4 - 3))

-- a zip archive of stored entries (the layout numpy.savez writes, without compression)
local zlib_ok, zlib = pcall(ffi.load, "z")
if zlib_ok then
  pcall(ffi.cdef, "unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len);")
  local function zip(entries)
    local out, central, offset = {}, {}, 0
    for _, e in ipairs(entries) do
      local name, body = e[1], e[2]
      local crc = tonumber(zlib.crc32(0, body, #body))
      local fields = le(20, 2) .. le(0, 2) .. le(0, 2) .. le(0, 2) .. le(0x21, 2) .. le(crc, 4) .. le(#body, 4) .. le(#body, 4)
        .. le(#name, 2) .. le(0, 2)
      local lfh = "PK\3\4" .. fields .. name .. body
      central[#central + 1] = "PK\1\2" .. le(20, 2) .. fields:sub(1, 24) .. le(0, 2) .. le(0, 2) .. le(0, 2) .. le(0, 2)
        .. le(0, 4) .. le(offset, 4) .. name
      out[#out + 1] = lfh
      offset = offset + #lfh
    end
    local cd = table.concat(central)
    return table.concat(out) .. cd .. "PK\5\6" .. le(0, 2) .. le(0, 2) .. le(#entries, 2) .. le(#entries, 2)
      .. le(#cd, 4) .. le(offset, 4) .. le(0, 2)
  end
  write("npz", "two_stored", zip { { "x.npy", npy_f4 }, { "y.npy", npy_i8 } })
  write("npz", "one_and_other", zip { { "notes.txt", "hello" }, { "a.npy", npy_f4 } })
  write("npz", "bad_entry", zip { { "t.npy", npy_f4:sub(1, 40) } })
end

-- byte 0: bit 0 header, bit 1 ';' as the delimiter (fuzz/csv.c)
write("csv", "header_quotes", "\1" .. 'a,"b, c",d\n1,2.5,-3e2\n"4",,0x10\r\n')
write("csv", "semicolon", "\2" .. "1;2\n3;4\n\n5;6\n")
write("csv", "ragged", "\0" .. "1,2\n3\n")
write("csv", "bad_quote", "\1" .. 'a\n"1"x\n')
