--- ddplua.data.text.prepare: turn text files into nanoGPT's token files (its
-- data/shakespeare_char/prepare.py): the texts concatenated, tokenized, split 90/10 into
-- train.bin and val.bin (uint16 tokens, written atomically), and the tokenizer saved beside
-- them so that sampling can decode.
--
--   local info = text.prepare{input = {"a.txt", "b.txt"}, out_dir = "data/shakespeare_char"}
--   -- info.vocab_size, info.train_tokens, info.val_tokens, info.tokenizer
--   local tok = text.load_tokenizer("data/shakespeare_char")   -- from its meta.json
--
-- From the command line: `ddplua tools/prepare_text.lua --out DIR FILE...` (see there).
--
-- Files written in out_dir: train.bin (the first floor(n * (1 - val_fraction)) tokens),
-- val.bin (the rest), meta.json (the tokenizer: a char vocabulary, or for a SentencePiece
-- model {"type": "sentencepiece", "model": "tokenizer.model"} with tokenizer.model beside).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local checkpoint = require "ddplua.checkpoint"
local CharTokenizer = require "ddplua.data.text.char_tokenizer"
local token_file = require "ddplua.data.text.token_file"

local M = {}

local function read_file(path, who)
  local f, err = io.open(path, "rb")
  if not f then lib.raise(who .. ": cannot open " .. tostring(err)) end
  local s = f:read("*a")
  f:close()
  return s
end

--- text.prepare(opts) -> {vocab_size =, train_tokens =, val_tokens =, tokenizer =,
-- train_path =, val_path =}. opts: input (a path or a list of paths, concatenated in that
-- order), out_dir (made when missing), tokenizer ("char", the default; "sentencepiece" to
-- train a BPE model on the input with vocab_size; or a tokenizer object with encode,
-- vocab_size and save), vocab_size (for "sentencepiece"), val_fraction (0.1). Raises naming
-- the file or option at fault, or when a split would hold fewer than 2 tokens.
function M.prepare(opts)
  local name = "text.prepare"
  opts = options.check(name, opts, { input = true, out_dir = true, tokenizer = true, vocab_size = true,
    val_fraction = true })
  local inputs = opts.input
  if type(inputs) == "string" then inputs = { inputs } end
  if type(inputs) ~= "table" or #inputs == 0 then lib.raise(name .. ": input must be a path or a list of paths") end
  local out = opts.out_dir
  if type(out) ~= "string" or out == "" then lib.raise(name .. ": out_dir must be a folder path") end
  local vf = opts.val_fraction or 0.1
  if type(vf) ~= "number" or not (vf > 0 and vf < 1) then
    lib.raise(name .. ": val_fraction must be in (0, 1), got " .. tostring(vf))
  end
  local C = lib.C
  lib.check(C.ddp_os_mkdir_p(out))
  local parts = {}
  for i, p in ipairs(inputs) do parts[i] = read_file(p, name) end
  local text = table.concat(parts)
  local tok = opts.tokenizer or "char"
  if tok == "char" then
    tok = CharTokenizer.from_text(text)
  elseif tok == "sentencepiece" then
    local SentencePiece = require "ddplua.data.text.sentencepiece"
    local corpus = out .. "/corpus.txt"
    if #inputs == 1 then corpus = inputs[1] else
      local f = assert(io.open(corpus, "wb"))
      f:write(text)
      f:close()
    end
    local ok, res = pcall(SentencePiece.train, corpus, { model_prefix = out .. "/tokenizer", vocab_size = opts.vocab_size })
    if corpus ~= inputs[1] then os.remove(corpus) end -- the concatenation, ours to remove
    if not ok then error(res, 0) end
    tok = res
  elseif type(tok) ~= "table" or type(tok.encode) ~= "function" then
    lib.raise(name .. ": tokenizer must be \"char\", \"sentencepiece\" or a tokenizer object, got " .. tostring(tok))
  end
  local ids = tok:encode(text)
  local n = ids:numel()
  local n_train = math.floor(n * (1 - vf))
  if n_train < 2 or n - n_train < 2 then
    lib.raise(("%s: %d tokens give a split of %d / %d; each part needs at least 2 tokens"):format(name, n, n_train,
      n - n_train))
  end
  local train_path, val_path = out .. "/train.bin", out .. "/val.bin"
  token_file.write_tokens(train_path, ids:narrow(1, 1, n_train), tok.vocab_size)
  token_file.write_tokens(val_path, ids:narrow(1, n_train + 1, n - n_train), tok.vocab_size)
  tok:save(out .. "/meta.json")
  return { vocab_size = tok.vocab_size, train_tokens = n_train, val_tokens = n - n_train, tokenizer = tok,
    train_path = train_path, val_path = val_path }
end

--- text.load_tokenizer(dir_or_meta) -> the tokenizer a prepare() saved (dir/meta.json, or
-- the meta.json path itself). Raises naming the file when it is missing or unknown.
function M.load_tokenizer(path)
  local meta = path
  if not meta:match("%.json$") then meta = path .. "/meta.json" end
  local ok, v = pcall(checkpoint.json_decode, read_file(meta, "text.load_tokenizer"))
  if not ok or type(v) ~= "table" then lib.raise("text.load_tokenizer: " .. meta .. " is not JSON") end
  if v.type == "char" then return CharTokenizer.load(meta) end
  if v.type == "sentencepiece" then return require("ddplua.data.text.sentencepiece").load_meta(meta, v) end
  lib.raise("text.load_tokenizer: " .. meta .. " has an unknown tokenizer type " .. tostring(v.type))
end

return M
