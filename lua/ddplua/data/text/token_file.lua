--- ddplua.data.text.TokenFile: a token file as nanoGPT writes them (train.bin / val.bin:
-- uint16 little-endian token ids, no header), memory-mapped by the C reader
-- (runtime/io/tokens.c).
--
--   local tf = text.TokenFile("data/shakespeare_char/train.bin", {vocab_size = 65})
--   #tf                              -- tokens in the file
--   tf:read(0, 100)                  -- (100) i64: tokens 0 .. 99 (positions count from 0)
--   local x, y = tf:windows({0, 640}, 64)       -- (2, 64) i64 each: y is x shifted by one
--   local x, y = tf:random_windows(12, 64, g)   -- 12 windows from generator g
--
-- A window at start i is x = tokens[i .. i+T-1], y = tokens[i+1 .. i+T] (Note [token
-- windows] in runtime/io/tokens.c), i in 0 .. #tf - T - 1. Token positions are data
-- offsets and count from 0, as in the file. Opening checks the file: an odd size or a
-- token >= vocab_size raises naming the file (and the token's position).
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local generator = require "ddplua.generator"
local ffi, C = lib.ffi, lib.C

local M = {}

local TokenFile = { name = "TokenFile" }

local box2 = ffi.new("ddp_tensor*[1]")

--- text.TokenFile(path, {vocab_size = N}) -> the mapped file. vocab_size (1 .. 65536,
-- required) bounds the token ids. Raises naming the file (cannot open, odd size, a token
-- out of range) or the bad option.
function M.TokenFile(path, opts)
  if type(path) ~= "string" then lib.raise("TokenFile: path must be a string, got " .. type(path)) end
  opts = require("ddplua.options").check("TokenFile", opts, { vocab_size = true })
  local v = opts.vocab_size
  if type(v) ~= "number" or v % 1 ~= 0 then
    lib.raise("TokenFile: " .. path .. ": vocab_size must be given (an integer in 1 .. 65536), got " .. tostring(v))
  end
  local out = ffi.new("ddp_io_tokens*[1]")
  lib.check(C.ddp_io_tokens_open(out, path, v))
  return object.new(TokenFile, { handle = ffi.gc(out[0], C.ddp_io_tokens_free), path = path, vocab_size = v })
end

--- Number of tokens (#tf).
function TokenFile.len(self) return tonumber(C.ddp_io_tokens_count(self.handle)) end

--- tf:read(start, count) -> (count) i64 tensor of tokens start .. start+count-1 (0-based).
function TokenFile.read(self, start, count)
  lib.check(C.ddp_io_tokens_read(lib.box, self.handle, start, count))
  return lib.wrap(lib.box[0])
end

--- tf:windows(starts, block_size) -> x, y: (B, T) i64 tensors of the windows at `starts`
-- (a list or 1-d integer tensor of 0-based token positions, each in 0 .. #tf - T - 1).
-- Raises naming the file and the window at fault.
function TokenFile.windows(self, starts, block_size)
  local list = starts
  if require("ddplua.tensor").is_tensor(starts) then list = starts:tolist() end
  if type(list) ~= "table" or #list == 0 then lib.raise("TokenFile:windows: starts must be a non-empty list or tensor") end
  local buf = ffi.new("int64_t[?]", #list)
  for i, s in ipairs(list) do
    if type(s) ~= "number" or s % 1 ~= 0 then
      lib.raise(("TokenFile:windows: start %d is %s, not an integer"):format(i, tostring(s)))
    end
    buf[i - 1] = s
  end
  lib.check(C.ddp_io_tokens_windows(lib.box, box2, self.handle, #list, buf, block_size))
  local x = lib.wrap(lib.box[0])
  return x, lib.wrap(box2[0])
end

--- tf:random_windows(batch, block_size, g) -> x, y (B, T) i64 and the starts (a B-entry
-- int64_t array, 0-based) of `batch` windows drawn from generator g (a dl.Generator; nil:
-- the default one), one Philox block per window (ddplua/io.h). Raises as windows().
function TokenFile.random_windows(self, batch, block_size, g)
  local starts = ffi.new("int64_t[?]", math.max(batch, 1))
  lib.check(C.ddp_io_tokens_random_windows(lib.box, box2, starts, self.handle, batch, block_size,
    (g or generator.default).handle))
  local x = lib.wrap(lib.box[0])
  return x, lib.wrap(box2[0]), starts
end

function TokenFile.__tostring(self)
  return ("TokenFile(%s, %d tokens, vocab_size = %d)"):format(self.path, TokenFile.len(self), self.vocab_size)
end

--- text.write_tokens(path, tokens, vocab_size): write a 1-d integer tensor as a uint16 token
-- file, atomically (temporary file, fsync, rename). Raises naming the file, or the token
-- outside 0 .. vocab_size-1.
function M.write_tokens(path, tokens, vocab_size)
  lib.check(C.ddp_io_tokens_write(path, tokens, vocab_size))
end

return M
