--- ddplua.data.text.SentencePiece: a BPE tokenizer through SentencePiece (Debian's
-- libsentencepiece, wrapped in C by runtime/io/sentencepiece.c; Kudo & Richardson,
-- "SentencePiece: A simple and language independent subword tokenizer", 2018).
--
--   local tok = text.SentencePiece.train("corpus.txt", {vocab_size = 2000, model_prefix = "out/tok"})
--   local tok = text.SentencePiece.load("out/tok.model")
--   tok.vocab_size                    -- ids are 0 .. vocab_size-1
--   local ids = tok:encode("ROMEO:\n")   -- 1-d i64 tensor
--   tok:decode(ids) == "ROMEO:\n"     -- a tensor or a list of ids
--
-- Models trained here keep the text as it is (identity normalization, spaces kept, "\n"
-- a piece of its own: Note [newlines in SentencePiece] in runtime/io/sentencepiece.c), so
-- decode(encode(s)) == s for text made of the corpus's characters. Any SentencePiece
-- .model loads (one trained elsewhere keeps its own normalization).
-- text.SentencePiece.available() tells whether the runtime was built with SentencePiece;
-- without it every other call raises saying so (DDP_ERR_UNAVAILABLE).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local tensor = require "ddplua.tensor"
local checkpoint = require "ddplua.checkpoint"
local ffi, C = lib.ffi, lib.C

local M = {}
M.__index = M
M.name = "SentencePiece"

--- SentencePiece.available() -> true when the runtime was built with SentencePiece.
function M.available() return C.ddp_io_spm_available() ~= 0 end

--- SentencePiece.load(model_path) -> the tokenizer of a .model file. Raises naming the file
-- when it is missing or not a model.
function M.load(model_path)
  if type(model_path) ~= "string" then lib.raise("SentencePiece.load: expected a path, got " .. type(model_path)) end
  local out = ffi.new("ddp_io_spm*[1]")
  lib.check(C.ddp_io_spm_load(out, model_path))
  local h = ffi.gc(out[0], C.ddp_io_spm_free)
  return setmetatable({ handle = h, model_path = model_path, vocab_size = tonumber(C.ddp_io_spm_vocab_size(h)) }, M)
end

--- SentencePiece.train(input, opts) -> the trained tokenizer. input: a UTF-8 text file.
-- opts: vocab_size (required, 2 .. 65536), model_prefix (default: input without its
-- extension; writes <prefix>.model and <prefix>.vocab), model_type ("bpe"; or "unigram",
-- "char", "word"). Raises naming the file or the option (a vocab_size the corpus cannot
-- fill gives the library's message).
function M.train(input, opts)
  opts = options.check("SentencePiece.train", opts, { vocab_size = true, model_prefix = true, model_type = true })
  if type(input) ~= "string" then lib.raise("SentencePiece.train: input must be a path, got " .. type(input)) end
  local v = opts.vocab_size
  if type(v) ~= "number" or v % 1 ~= 0 then
    lib.raise("SentencePiece.train: vocab_size must be given (an integer in 2 .. 65536), got " .. tostring(v))
  end
  local prefix = opts.model_prefix or input:gsub("%.[^./]*$", "")
  lib.check(C.ddp_io_spm_train(input, prefix, v, opts.model_type or "bpe"))
  return M.load(prefix .. ".model")
end

--- tok:encode(s) -> a 1-d i64 tensor of the ids of the UTF-8 string s.
function M:encode(s)
  if type(s) ~= "string" then lib.raise("SentencePiece:encode: expected a string, got " .. type(s)) end
  lib.check(C.ddp_io_spm_encode(lib.box, self.handle, s, #s))
  return lib.wrap(lib.box[0])
end

local out_str, out_len = ffi.new("char*[1]"), ffi.new("size_t[1]")

--- tok:decode(ids) -> the text of ids (a 1-d integer tensor or a list of numbers). Raises
-- naming the position of an id outside 0 .. vocab_size-1.
function M:decode(ids)
  if not tensor.is_tensor(ids) then
    if type(ids) ~= "table" then lib.raise("SentencePiece:decode: expected a tensor or a list of ids, got " .. type(ids)) end
    local buf = ffi.new("int64_t[?]", math.max(#ids, 1))
    for i, v in ipairs(ids) do
      if type(v) ~= "number" or v % 1 ~= 0 then
        lib.raise(("SentencePiece:decode: id at position %d is %s, not an integer"):format(i, tostring(v)))
      end
      buf[i - 1] = v
    end
    local len = ffi.new("int64_t[1]", #ids)
    lib.check(C.ddp_tensor_from_data(lib.box, 1, len, C.DDP_I64, buf, C.DDP_I64))
    ids = lib.wrap(lib.box[0])
  end
  lib.check(C.ddp_io_spm_decode(out_str, out_len, self.handle, ids))
  local s = ffi.string(out_str[0], out_len[0])
  C.ddp_io_string_free(out_str[0])
  return s
end

--- tok:save(meta_path): write meta.json {"type": "sentencepiece", "model": NAME,
-- "vocab_size": N} with the model file copied beside it as NAME (the model's own name)
-- unless it is there already; text.load_tokenizer reads it back. Raises naming the file.
function M:save(meta_path)
  local dir = meta_path:match("^(.*)/[^/]*$") or "."
  local name = self.model_path:match("([^/]*)$")
  local dest = dir .. "/" .. name
  if dest ~= self.model_path then
    local src = assert(io.open(self.model_path, "rb"))
    local bytes = src:read("*a")
    src:close()
    local f, err = io.open(dest, "wb")
    if not f then lib.raise("SentencePiece:save: cannot create " .. tostring(err)) end
    f:write(bytes)
    f:close()
  end
  local f, err = io.open(meta_path, "wb")
  if not f then lib.raise("SentencePiece:save: cannot create " .. tostring(err)) end
  f:write(checkpoint.json_encode({ type = "sentencepiece", model = name, vocab_size = self.vocab_size }), "\n")
  f:close()
end

--- SentencePiece.load_meta(meta_path, meta) -> the tokenizer a meta.json names (its
-- decoded table `meta`; the model path is relative to the meta file's folder).
function M.load_meta(meta_path, meta)
  local dir = meta_path:match("^(.*)/[^/]*$") or "."
  if type(meta.model) ~= "string" then lib.raise("text.load_tokenizer: " .. meta_path .. " names no model file") end
  return M.load(dir .. "/" .. meta.model)
end

function M:__tostring() return ("SentencePiece(%s, vocab_size = %d)"):format(self.model_path, self.vocab_size) end

return M
