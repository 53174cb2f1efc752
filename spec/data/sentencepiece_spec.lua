-- Specs for ddplua.data.text.SentencePiece (the BPE tokenizer over libsentencepiece through
-- the C shim of runtime/io/): training on a few KB of Shakespeare (or a synthetic text
-- without the corpus), exact round trips including newlines and runs of spaces, errors
-- turned into statuses that name the file or argument, prepare() with it.
local dl = require "ddplua"
local text = require "ddplua.data.text"
local files = require "files"

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

-- A few KB of Shakespeare, or a synthetic text of the same kind.
local function corpus_text()
  local list = text.shakespeare_files()
  if list then return files.read(list[1]):sub(1, 8000) end
  local words = { "ROMEO", "thou", "art", "wherefore", "love", "night", "the", "and", "JULIET" }
  local out, s = {}, 3
  for i = 1, 1500 do
    s = (s * 1103515245 + 12345) % 2147483648
    out[i] = words[s % #words + 1] .. ((s % 7 == 0) and ".\n" or " ")
  end
  return table.concat(out)
end

describe("ddplua.data.text.SentencePiece", function()
  local tmp
  before_each(function() tmp = files.tmpdir("spm") end)
  after_each(function() files.remove(tmp) end)

  local function available()
    if text.SentencePiece.available() then return true end
    pending("ddplua was built without SentencePiece (libsentencepiece-dev, or NO_SENTENCEPIECE=1)")
    return false
  end

  it("trains a BPE model whose encode/decode give the text back, newlines and spaces included", function()
    if not available() then return end
    local corpus = tmp .. "/corpus.txt"
    local f = assert(io.open(corpus, "wb"))
    f:write(corpus_text())
    f:close()
    local tok = text.SentencePiece.train(corpus, { vocab_size = 300, model_prefix = tmp .. "/tok" })
    assert.are.equal(300, tok.vocab_size)
    local s = corpus_text():sub(1, 500) .. "\n\n  two  spaces\n"
    local ids = tok:encode(s)
    assert.are.equal("i64", ids.dtype)
    assert.is_true(ids:numel() < #s, "BPE merges characters")
    assert.are.equal(s, tok:decode(ids))
    assert.are.equal(s, tok:decode(ids:tolist()))
    -- the same model loaded from its file encodes the same
    local again = text.SentencePiece.load(tmp .. "/tok.model")
    assert.are.same(ids:tolist(), again:encode(s):tolist())
    -- every id in range, and the largest pieces are longer than one character
    local max = 0
    for _, v in ipairs(ids:tolist()) do max = math.max(max, v) end
    assert.is_true(max < 300)
  end)

  it("prepare() with tokenizer = \"sentencepiece\" writes token files that decode to the text", function()
    if not available() then return end
    local input = tmp .. "/in.txt"
    local s = corpus_text()
    local f = assert(io.open(input, "wb"))
    f:write(s)
    f:close()
    local info = text.prepare { input = input, out_dir = tmp .. "/o", tokenizer = "sentencepiece", vocab_size = 250 }
    assert.are.equal(250, info.vocab_size)
    local tok = text.load_tokenizer(tmp .. "/o")
    assert.are.equal("SentencePiece", tok.name)
    local train = text.TokenFile(info.train_path, { vocab_size = 250 })
    local val = text.TokenFile(info.val_path, { vocab_size = 250 })
    assert.are.equal(s, tok:decode(train:read(0, #train)) .. tok:decode(val:read(0, #val)))
  end)

  it("errors become statuses naming the file or the argument", function()
    if not available() then return end
    local corpus = tmp .. "/c.txt"
    local f = assert(io.open(corpus, "wb"))
    f:write(corpus_text())
    f:close()
    assert.matches("vocab_size must be in 2 .. 65536", err_of(text.SentencePiece.train, corpus, { vocab_size = 70000 }))
    -- more pieces than the corpus can make: the library's own message, no abort
    local e = err_of(text.SentencePiece.train, corpus, { vocab_size = 60000, model_prefix = tmp .. "/big" })
    assert.is_truthy(e:find("spm_train: training on " .. corpus, 1, true), e)
    assert.is_truthy(e:find("Vocabulary size", 1, true) or e:find("vocab_size", 1, true), e)
    e = err_of(text.SentencePiece.train, tmp .. "/none.txt", { vocab_size = 100 })
    assert.is_truthy(e:find(tmp .. "/none.txt is not a readable non-empty file", 1, true), e)
    e = err_of(text.SentencePiece.load, corpus)
    assert.is_truthy(e:find("spm_load: cannot load " .. corpus, 1, true), e)
    local tok = text.SentencePiece.train(corpus, { vocab_size = 200, model_prefix = tmp .. "/t" })
    assert.matches("id 200 at position 1 %(0%-based%) is outside 0 .. 199", err_of(tok.decode, tok, { 5, 200 }))
    assert.matches("ids must be 1%-d", err_of(tok.decode, tok, dl.zeros({ 2, 2 }, { dtype = "i64" })))
    assert.matches("model_type must be bpe, unigram, char or word",
      err_of(text.SentencePiece.train, corpus, { vocab_size = 100, model_type = "wordpiece" }))
  end)
end)
