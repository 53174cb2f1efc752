--- ddplua.tools.prepare: `ddplua prepare --out DIR [options] FILE... | --shakespeare`
-- writes nanoGPT's token files for text files (ddplua.data.text.prepare): DIR/train.bin
-- and DIR/val.bin (uint16 tokens, 90/10 split, written atomically) and DIR/meta.json (the
-- tokenizer), then prints one line with the counts.
--
--   ddplua prepare --shakespeare --out data/shakespeare_char          # the corpus make deps fetched
--   ddplua prepare --tokenizer sentencepiece --vocab-size 2000 --out data/sp plays/*.txt
--
-- Options: --out DIR (required), --tokenizer char|sentencepiece (char), --vocab-size N (for
-- sentencepiece), --val-fraction F (0.1), --shakespeare (the plays of `make deps`, sorted by
-- name, instead of FILE...). Exit status: 0 on success; 2 on a usage error or a failure
-- (missing file, invalid UTF-8, ...), with the message on stderr.
local text = require "ddplua.data.text"

local M = {}

local USAGE = "usage: ddplua prepare --out DIR [--tokenizer char|sentencepiece] [--vocab-size N] "
  .. "[--val-fraction F] (FILE... | --shakespeare)"

local function fail(msg)
  io.stderr:write("ddplua prepare: ", msg, "\n", USAGE, "\n")
  return 2
end

--- main(args) -> exit status (see the top).
function M.main(args)
  local opts, inputs, shakespeare = {}, {}, false
  local i = 1
  while i <= #args do
    local a = args[i]
    local function value()
      i = i + 1
      if args[i] == nil then error({ usage = a .. " needs a value" }) end
      return args[i]
    end
    local ok, err = pcall(function()
      if a == "--out" then opts.out_dir = value()
      elseif a == "--tokenizer" then opts.tokenizer = value()
      elseif a == "--vocab-size" then opts.vocab_size = tonumber(value())
      elseif a == "--val-fraction" then opts.val_fraction = tonumber(value())
      elseif a == "--shakespeare" then shakespeare = true
      elseif a == "-h" or a == "--help" then error({ help = true })
      elseif a:sub(1, 2) == "--" then error({ usage = "unknown option " .. a })
      else inputs[#inputs + 1] = a end
    end)
    if not ok then
      if type(err) == "table" and err.help then print(USAGE) return 0 end
      return fail(type(err) == "table" and err.usage or tostring(err))
    end
    i = i + 1
  end
  if not opts.out_dir then return fail("--out DIR is required") end
  if opts.tokenizer and opts.tokenizer ~= "char" and opts.tokenizer ~= "sentencepiece" then
    return fail("--tokenizer must be char or sentencepiece, got " .. opts.tokenizer)
  end
  if shakespeare then
    if #inputs > 0 then return fail("give either --shakespeare or files, not both") end
    local files, why = text.shakespeare_files()
    if not files then return fail(why) end
    inputs = files
  end
  if #inputs == 0 then return fail("no input files") end
  opts.input = inputs
  local ok, info = pcall(text.prepare, opts)
  if not ok then
    io.stderr:write("ddplua prepare: ", tostring(info), "\n")
    return 2
  end
  print(("%s: %d train tokens, %d val tokens, vocab_size %d (%d files)"):format(opts.out_dir, info.train_tokens,
    info.val_tokens, info.vocab_size, #inputs))
  return 0
end

return M
