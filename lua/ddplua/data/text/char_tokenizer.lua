--- ddplua.data.text.CharTokenizer: a character-level tokenizer, as nanoGPT's
-- data/shakespeare_char/prepare.py builds one: the vocabulary is the sorted list of the
-- distinct characters of a corpus (Unicode code points read from UTF-8; sorted by code
-- point, which is Python's sorted(set(text))), token id = position in that list (0-based).
--
--   local tok = text.CharTokenizer.from_text(corpus)     -- or from_file(path)
--   tok.vocab_size                                       -- 65 for Shakespeare (nanoGPT)
--   local ids = tok:encode("ROMEO:")                     -- (6) i64 tensor
--   tok:decode(ids) == "ROMEO:"                          -- a tensor or a list of ids
--   tok:save("meta.json"); local same = text.CharTokenizer.load("meta.json")
--
-- The saved vocabulary is JSON {"type": "char", "chars": "<every character in id order>"}.
-- Errors name the argument: text that is not valid UTF-8 (its byte offset), a character
-- not in the vocabulary (the character and its offset), an id outside 0 .. vocab_size-1
-- (its position), a vocabulary file that cannot be read or is not a char vocabulary.
local lib = require "ddplua.lib"
local checkpoint = require "ddplua.checkpoint"
local tensor = require "ddplua.tensor"
local ffi, C = lib.ffi, lib.C

local M = {}
M.__index = M
M.name = "CharTokenizer"

local byte, char, concat = string.byte, string.char, table.concat

-- Decode the UTF-8 character starting at byte i of s: code point, next byte position; nil and
-- the offset of the fault when the bytes there are not valid UTF-8.
local function utf8_at(s, i)
  local c = byte(s, i)
  if c < 0x80 then return c, i + 1 end
  local n, cp
  if c >= 0xC2 and c <= 0xDF then n, cp = 1, c - 0xC0
  elseif c >= 0xE0 and c <= 0xEF then n, cp = 2, c - 0xE0
  elseif c >= 0xF0 and c <= 0xF4 then n, cp = 3, c - 0xF0
  else return nil, i end
  for k = 1, n do
    local d = byte(s, i + k)
    if not d or d < 0x80 or d > 0xBF then return nil, i end
    cp = cp * 64 + (d - 0x80)
  end
  if (n == 2 and cp < 0x800) or (n == 3 and (cp < 0x10000 or cp > 0x10FFFF)) or (cp >= 0xD800 and cp <= 0xDFFF) then
    return nil, i
  end
  return cp, i + n + 1
end

-- The UTF-8 bytes of code point cp.
local function utf8_char(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64, 0x80 + math.floor(cp / 64) % 64,
    0x80 + cp % 64)
end

local function bad_utf8(what, at)
  lib.raise(("CharTokenizer: %s is not valid UTF-8 at byte %d (1-based)"):format(what, at))
end

-- A tokenizer over the sorted list of code points `cps`.
local function from_codepoints(cps)
  if #cps == 0 then lib.raise("CharTokenizer: the vocabulary is empty (no characters)") end
  if #cps > 65536 then lib.raise(("CharTokenizer: %d characters do not fit uint16 token files (65536 at most)"):format(#cps)) end
  local self = setmetatable({ vocab_size = #cps, itos = {}, stoi = {} }, M)
  for i, cp in ipairs(cps) do
    self.itos[i - 1] = utf8_char(cp)
    self.stoi[cp] = i - 1
  end
  self._codepoints = cps
  return self
end

--- CharTokenizer.from_text(s) -> the tokenizer whose vocabulary is the sorted distinct
-- characters of s (a UTF-8 string). Raises on invalid UTF-8 (naming the byte offset) or an
-- empty s.
function M.from_text(s)
  if type(s) ~= "string" then lib.raise("CharTokenizer.from_text: expected a string, got " .. type(s)) end
  local seen, cps = {}, {}
  local i, n = 1, #s
  while i <= n do
    local c = byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      local at = i
      c, i = utf8_at(s, i)
      if not c then bad_utf8("the text", at) end
    end
    if not seen[c] then
      seen[c] = true
      cps[#cps + 1] = c
    end
  end
  table.sort(cps)
  return from_codepoints(cps)
end

--- CharTokenizer.from_file(path) -> the tokenizer of the file's text (see from_text).
-- Raises naming the file when it cannot be read.
function M.from_file(path)
  local f, err = io.open(path, "rb")
  if not f then lib.raise("CharTokenizer.from_file: cannot open " .. tostring(err)) end
  local s = f:read("*a")
  f:close()
  return M.from_text(s)
end

--- tok:encode(s) -> a 1-d i64 tensor of the ids of the characters of s (UTF-8). Raises on
-- invalid UTF-8 and on a character outside the vocabulary (naming it and its byte offset).
function M:encode(s)
  if type(s) ~= "string" then lib.raise("CharTokenizer:encode: expected a string, got " .. type(s)) end
  local n = #s
  local buf = ffi.new("int64_t[?]", math.max(n, 1))
  local stoi = self.stoi
  local count, i = 0, 1
  while i <= n do
    local at = i
    local c = byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      c, i = utf8_at(s, i)
      if not c then bad_utf8("the text to encode", at) end
    end
    local id = stoi[c]
    if not id then
      lib.raise(("CharTokenizer:encode: character %q (U+%04X) at byte %d is not in the vocabulary of %d characters"):format(
        utf8_char(c), c, at, self.vocab_size))
    end
    buf[count] = id
    count = count + 1
  end
  local len = ffi.new("int64_t[1]", count)
  lib.check(C.ddp_tensor_from_data(lib.box, 1, len, C.DDP_I64, buf, C.DDP_I64))
  return lib.wrap(lib.box[0])
end

--- tok:decode(ids) -> the string of the ids (a 1-d integer tensor or a Lua list of numbers).
-- Raises on an id outside 0 .. vocab_size-1, naming its (1-based) position.
function M:decode(ids)
  local list = ids
  if tensor.is_tensor(ids) then
    if ids:dim() ~= 1 then lib.raise("CharTokenizer:decode: expected a 1-d tensor of ids, got " .. ids:dim() .. " dims") end
    list = ids:tolist()
  elseif type(ids) ~= "table" then
    lib.raise("CharTokenizer:decode: expected a tensor or a list of ids, got " .. type(ids))
  end
  local out, itos = {}, self.itos
  for k = 1, #list do
    local s = itos[list[k]]
    if not s then
      lib.raise(("CharTokenizer:decode: id %s at position %d is outside 0 .. %d"):format(tostring(list[k]), k,
        self.vocab_size - 1))
    end
    out[k] = s
  end
  return concat(out)
end

--- tok:save(path): write the vocabulary as JSON {"type": "char", "chars": "..."} (ids in
-- order), atomically enough for one writer (a temporary file renamed over path). Raises
-- naming the file.
function M:save(path)
  local text = checkpoint.json_encode({ type = "char", chars = concat(self.itos, "", 0, self.vocab_size - 1) })
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then lib.raise("CharTokenizer:save: cannot create " .. tmp .. ": " .. tostring(err)) end
  f:write(text, "\n")
  f:close()
  local ok, rerr = os.rename(tmp, path)
  if not ok then lib.raise("CharTokenizer:save: cannot rename " .. tmp .. " to " .. path .. ": " .. tostring(rerr)) end
end

--- CharTokenizer.load(path) -> the tokenizer saved there by tok:save. Raises naming the file
-- when it cannot be read, is not JSON, or holds no char vocabulary (sorted distinct chars).
function M.load(path)
  local f, err = io.open(path, "rb")
  if not f then lib.raise("CharTokenizer.load: cannot open " .. tostring(err)) end
  local s = f:read("*a")
  f:close()
  local ok, v = pcall(checkpoint.json_decode, s)
  if not ok or type(v) ~= "table" or v.type ~= "char" or type(v.chars) ~= "string" then
    lib.raise("CharTokenizer.load: " .. path .. " is not a char vocabulary (JSON {\"type\": \"char\", \"chars\": ...})")
  end
  local cps, i = {}, 1
  while i <= #v.chars do
    local at = i
    local c
    c, i = utf8_at(v.chars, i)
    if not c then bad_utf8(path .. "'s chars", at) end
    if #cps > 0 and c <= cps[#cps] then
      lib.raise("CharTokenizer.load: " .. path .. ": the characters are not sorted and distinct")
    end
    cps[#cps + 1] = c
  end
  return from_codepoints(cps)
end

function M:__tostring() return ("CharTokenizer(vocab_size = %d)"):format(self.vocab_size) end

return M
