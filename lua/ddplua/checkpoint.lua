--- ddplua.checkpoint: safetensors checkpoints (runtime/io/safetensors.c).
--
--   checkpoint.save("ckpt.safetensors", {["fc.weight"] = w, ...}, {epoch = 3, lr = 0.1})
--   local tensors, meta = checkpoint.load("ckpt.safetensors")
--   local ok, diffs = checkpoint.compare(tensors, model_state)
--
-- Files are standard safetensors (PyTorch users read them with safetensors.torch.load_file);
-- saving is atomic: a crash mid-save leaves the previous file intact.
--
-- Metadata convention (Note [checkpoint metadata]): safetensors metadata maps strings to
-- strings. A string value is stored as is. Any other value (number, boolean, nested table
-- of those and strings) is stored as its JSON text, and the key is listed in the reserved
-- metadata entry "ddplua.json_keys" (a JSON array of key names, sorted), so load() gives
-- back exactly the Lua types saved. Tables with keys 1..n become JSON arrays, other tables
-- objects (string keys only); an empty table becomes {}. Numbers must be finite.
-- Integers up to 2^53 are exact; other numbers are written with the fewest of 15, 16 or 17
-- significant digits that read back bit for bit.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

local JSON_KEYS = "ddplua.json_keys"
M.JSON_KEYS = JSON_KEYS

local function is_tensor(v) return require("ddplua.tensor").is_tensor(v) end

-- ---- JSON (RFC 8259) for metadata values ---------------------------------------------

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
  ["\r"] = "\\r", ["\t"] = "\\t" }

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

local function encode(v, path, depth)
  local t = type(v)
  if t == "string" then return encode_string(v) end
  if t == "boolean" then return v and "true" or "false" end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      lib.raise("checkpoint: metadata " .. path .. " is not finite (" .. tostring(v) .. "): JSON cannot hold it")
    end
    if v % 1 == 0 and math.abs(v) <= 2 ^ 53 then return ("%d"):format(v) end
    for digits = 15, 16 do -- the shortest text that reads back to the same double
      local text = ("%." .. digits .. "g"):format(v)
      if tonumber(text) == v then return text end
    end
    return ("%.17g"):format(v)
  end
  if t == "table" then
    if depth > 64 then lib.raise("checkpoint: metadata " .. path .. " nests too deep (a cycle?)") end
    local n = #v
    local count = 0
    for _ in pairs(v) do count = count + 1 end
    local parts = {}
    if n > 0 and count == n then
      for i = 1, n do parts[i] = encode(v[i], path .. "[" .. i .. "]", depth + 1) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do
      if type(k) ~= "string" then
        lib.raise("checkpoint: metadata " .. path .. " has a key of type " .. type(k) .. " (only strings, or a 1..n array)")
      end
      keys[#keys + 1] = k
    end
    table.sort(keys)
    for i, k in ipairs(keys) do parts[i] = encode_string(k) .. ":" .. encode(v[k], path .. "." .. k, depth + 1) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  lib.raise("checkpoint: metadata " .. path .. " has a value of type " .. t .. " (strings, numbers, booleans, tables)")
end

--- checkpoint.json_encode(v): JSON text of a Lua value (strings, finite numbers, booleans,
-- tables as described in Note [checkpoint metadata]).
function M.json_encode(v) return encode(v, "value", 0) end

--- checkpoint.json_decode(s): the Lua value of JSON text s (null becomes nil). Raises on
-- malformed text, naming the position.
function M.json_decode(s)
  local pos = 1
  local function fail(msg) error(("checkpoint: bad JSON at byte %d: %s"):format(pos, msg), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local c = s:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1 break end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local simple = ({ ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" })[e]
        if simple then out[#out + 1] = simple; pos = pos + 2
        elseif e == "u" then
          local hex = s:sub(pos + 2, pos + 5)
          if not hex:match("^%x%x%x%x$") then fail("bad \\u escape") end
          local cp = tonumber(hex, 16)
          pos = pos + 6
          if cp >= 0xD800 and cp <= 0xDBFF and s:sub(pos, pos + 1) == "\\u" then
            local lo = tonumber(s:sub(pos + 2, pos + 5), 16)
            if lo and lo >= 0xDC00 and lo <= 0xDFFF then
              cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)
              pos = pos + 6
            end
          end
          if cp < 0x80 then out[#out + 1] = string.char(cp)
          elseif cp < 0x800 then out[#out + 1] = string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
          elseif cp < 0x10000 then
            out[#out + 1] = string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
          else
            out[#out + 1] = string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
              0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
          end
        else fail("bad escape \\" .. e) end
      else
        local stop = s:find('["\\]', pos) or #s + 1
        out[#out + 1] = s:sub(pos, stop - 1)
        pos = stop
      end
    end
    return table.concat(out)
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      pos = pos + 1
      local obj = {}
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1 return obj end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a key") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        obj[k] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      pos = pos + 1
      local arr = {}
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1 return arr end
      while true do
        arr[#arr + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4 return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5 return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4 return nil
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if not num or num == "" or not tonumber(num) then fail("unexpected '" .. c .. "'") end
      pos = pos + #num
      return tonumber(num)
    end
  end
  local v = value()
  ws()
  if pos <= #s then fail("trailing text") end
  return v
end

-- ---- save / load -------------------------------------------------------------------------

-- The C arguments of a save: names (sorted), tensors (host copies of device tensors),
-- metadata keys and values, and the Lua values that must stay alive during the call.
local function marshal(path, tensors, metadata, op)
  lib.path(path, op)
  if type(tensors) ~= "table" then lib.raise(op .. ": tensors must be a table name -> tensor") end
  local names = {}
  for k, v in pairs(tensors) do
    lib.c_string(k, op, "a tensor name")
    if not is_tensor(v) then lib.raise(op .. ": tensors['" .. k .. "'] is not a tensor") end
    names[#names + 1] = k
  end
  table.sort(names)
  local keys, json_keys = {}, {}
  for k, v in pairs(metadata or {}) do
    lib.c_string(k, op, "a metadata key")
    if type(v) == "string" then lib.c_string(v, op, "metadata '" .. k .. "'") end
    if k == JSON_KEYS then lib.raise(op .. ": metadata key '" .. JSON_KEYS .. "' is reserved") end
    keys[#keys + 1] = k
    if type(v) ~= "string" then json_keys[#json_keys + 1] = k end
  end
  table.sort(keys)
  table.sort(json_keys)
  local n, nm = #names, #keys + (#json_keys > 0 and 1 or 0)
  local cnames = ffi.new("const char*[?]", math.max(n, 1))
  local ctensors = ffi.new("ddp_tensor*[?]", math.max(n, 1))
  local ckeys = ffi.new("const char*[?]", math.max(nm, 1))
  local cvalues = ffi.new("const char*[?]", math.max(nm, 1))
  local anchor = {} -- keeps the Lua strings alive during the call
  for i, name in ipairs(names) do
    cnames[i - 1] = name
    local t = tensors[name]
    if lib.C.ddp_tensor_device(t) ~= lib.C.DDP_DEVICE_CPU then -- a device tensor: its host copy
      t = t:cpu()
      anchor[#anchor + 1] = t
    end
    ctensors[i - 1] = t
  end
  for i, k in ipairs(keys) do
    local v = metadata[k]
    if type(v) ~= "string" then v = encode(v, "'" .. k .. "'", 0) end
    anchor[#anchor + 1] = v
    ckeys[i - 1] = k
    cvalues[i - 1] = v
  end
  if #json_keys > 0 then
    local v = encode(json_keys, JSON_KEYS, 0)
    anchor[#anchor + 1] = v
    ckeys[nm - 1] = JSON_KEYS
    cvalues[nm - 1] = v
  end
  return n, cnames, ctensors, nm, ckeys, cvalues, anchor
end

--- checkpoint.save(path, tensors, metadata): write `tensors` (table name -> tensor, any
-- device: device tensors are copied to the host first; any dtype of f32 f64 f16 bf16 i64 i32 u8 bool) and `metadata` (table string key -> string,
-- number, boolean or nested table; see Note [checkpoint metadata]; may be nil) to path as
-- safetensors, atomically (temporary file, fsync, rename; stale temporary files of path
-- that killed savers left are removed first). Tensors are written in name
-- order within each element size. Raises naming the path and the cause.
function M.save(path, tensors, metadata)
  local n, cnames, ctensors, nm, ckeys, cvalues, anchor = marshal(path, tensors, metadata, "checkpoint.save")
  check(C.ddp_io_save_safetensors(path, n, cnames, ctensors, nm, ckeys, cvalues))
  local _ = anchor
end

local AsyncSave = {}
AsyncSave.__index = AsyncSave

--- checkpoint.save_async(path, tensors, metadata) -> a pending write: what save writes,
-- written on a thread of its own (runtime/io/safetensors_async.c). The tensors are copied
-- before it returns (Note [async save snapshot]), so training may go on changing them.
-- handle:wait([timeout_s]) raises the write's error (naming the path) or a timeout;
-- handle:done() -> true once the write finished. Raises at once for the arguments save
-- refuses.
function M.save_async(path, tensors, metadata)
  local n, cnames, ctensors, nm, ckeys, cvalues, anchor = marshal(path, tensors, metadata, "checkpoint.save_async")
  local box = ffi.new("ddp_io_async_save*[1]")
  check(C.ddp_io_save_safetensors_async(box, path, n, cnames, ctensors, nm, ckeys, cvalues))
  local _ = anchor
  return setmetatable({ handle = ffi.gc(box[0], C.ddp_io_async_save_free), path = path }, AsyncSave)
end

--- handle:wait([timeout_s]): block until the write finished (timeout_s: seconds, default no
-- limit); raises its error.
function AsyncSave:wait(timeout_s) check(C.ddp_io_async_save_wait(self.handle, timeout_s or 0)) end

--- handle:done() -> true when the write finished (successfully or not).
function AsyncSave:done() return C.ddp_io_async_save_done(self.handle) == 1 end

--- checkpoint.sweep_temp_files(path) -> n: remove the temporary files that savers of `path`
-- killed midway left behind (on this host, by processes that no longer run; Note
-- [checkpoint temp files] in runtime/io/safetensors.c) and return how many went. save does
-- this itself before writing, and load before reading, so a run that resumes starts
-- clean. Raises when the folder cannot be listed.
function M.sweep_temp_files(path)
  lib.path(path, "checkpoint.sweep_temp_files")
  local n = ffi.new("int[1]")
  check(C.ddp_io_sweep_temp_files(path, n))
  return n[0]
end

--- checkpoint.load(path) -> tensors (table name -> tensor), metadata (table key -> value,
-- the JSON-encoded values decoded per Note [checkpoint metadata]). Raises naming the file
-- and the tensor at fault for malformed files. First removes the stale temporary files of
-- path (checkpoint.sweep_temp_files).
function M.load(path)
  lib.path(path, "checkpoint.load")
  C.ddp_io_sweep_temp_files(path, nil) -- best effort: a read-only folder still loads
  local fbox = ffi.new("ddp_io_safetensors*[1]")
  check(C.ddp_io_safetensors_load(fbox, path))
  local f = ffi.gc(fbox[0], C.ddp_io_safetensors_free)
  local tensors, meta = {}, {}
  for i = 0, C.ddp_io_safetensors_count(f) - 1 do
    check(C.ddp_io_safetensors_tensor(box, f, i))
    tensors[ffi.string(C.ddp_io_safetensors_name(f, i))] = wrap(box[0])
  end
  for i = 0, C.ddp_io_safetensors_metadata_count(f) - 1 do
    meta[ffi.string(C.ddp_io_safetensors_metadata_key(f, i))] = ffi.string(C.ddp_io_safetensors_metadata_value(f, i))
  end
  ffi.gc(f, nil)
  C.ddp_io_safetensors_free(f)
  local jk = meta[JSON_KEYS]
  if jk then
    meta[JSON_KEYS] = nil
    local ok, list = pcall(M.json_decode, jk)
    if not ok or type(list) ~= "table" then lib.raise("checkpoint.load: " .. path .. ": bad " .. JSON_KEYS .. " metadata: " .. tostring(list)) end
    for _, k in ipairs(list) do
      if meta[k] ~= nil then
        local ok2, v = pcall(M.json_decode, meta[k])
        if not ok2 then lib.raise("checkpoint.load: " .. path .. ": metadata '" .. k .. "': " .. tostring(v)) end
        meta[k] = v
      end
    end
  end
  return tensors, meta
end

-- ---- comparing against what a model expects ------------------------------------------

local function shape_str(s) return "(" .. table.concat(s, ", ") .. (#s == 1 and ",)" or ")") end

local function describe(v)
  if is_tensor(v) then return v:size(), v.dtype end
  if type(v) == "table" then return v.shape, v.dtype and lib.dtype_name(lib.dtype(v.dtype)) end
  lib.raise("checkpoint.compare: expected a tensor or {shape = ..., dtype = ...}, got " .. type(v))
end

--- checkpoint.compare(tensors, expected) -> ok, diffs. `tensors` as load() returns;
-- `expected` maps names to tensors or {shape = {...}, dtype = "f32"} (either field may be
-- left out to skip that check). diffs is a list of lines, one per difference, sorted by
-- name: "missing: <name> (expected shape (3, 4) f32)", "unexpected: <name>",
-- "shape of <name>: (4, 3) in the checkpoint, expected (3, 4)", "dtype of <name>: f64 in
-- the checkpoint, expected f32". ok is true when diffs is empty. diffs.text joins them.
function M.compare(tensors, expected)
  local diffs = {}
  local names = {}
  for k in pairs(expected) do names[#names + 1] = k end
  for k in pairs(tensors) do if expected[k] == nil then names[#names + 1] = k end end
  table.sort(names)
  for _, name in ipairs(names) do
    local have, want = tensors[name], expected[name]
    if want == nil then
      diffs[#diffs + 1] = "unexpected: " .. name .. " " .. shape_str(have:size()) .. " " .. have.dtype
    else
      local ws, wd = describe(want)
      if have == nil then
        diffs[#diffs + 1] = "missing: " .. name .. " (expected" .. (ws and " shape " .. shape_str(ws) or "") .. (wd and " " .. wd or "") .. ")"
      else
        local hs = have:size()
        if ws and shape_str(hs) ~= shape_str(ws) then
          diffs[#diffs + 1] = "shape of " .. name .. ": " .. shape_str(hs) .. " in the checkpoint, expected " .. shape_str(ws)
        end
        if wd and have.dtype ~= wd then
          diffs[#diffs + 1] = "dtype of " .. name .. ": " .. have.dtype .. " in the checkpoint, expected " .. wd
        end
      end
    end
  end
  diffs.text = table.concat(diffs, "\n")
  return #diffs == 0, diffs
end

return M
