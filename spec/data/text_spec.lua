-- Specs for ddplua.data.text: the character tokenizer (nanoGPT's vocabulary), prepare()
-- against nanoGPT's prepare.py logic written in Python's standard library (byte for byte),
-- token files (mapping, checks naming the file, windows), random windows per rank from
-- their Philox streams, evaluation reduced across ranks, and the `ddplua prepare` tool.
local dl = require "ddplua"
local data = require "ddplua.data"
local text = require "ddplua.data.text"
local files = require "files"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local PYTHON = "/usr/bin/python3"

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- A few kilobytes of Shakespeare when `make deps` fetched the corpus, else nil and why.
local function shakespeare_sample(bytes)
  local list, why = text.shakespeare_files()
  if not list then return nil, why end
  local s = files.read(list[1])
  return s:sub(1, bytes), list
end

-- Deterministic text with newlines, punctuation and a few non-ASCII letters.
local function synthetic_text(n)
  local words = { "ROMEO:", "thou", "art", "é", "wherefore", "\n", "love,", "Ω", "night." }
  local out, s = {}, 7
  for i = 1, n do
    s = (s * 1103515245 + 12345) % 2147483648
    out[i] = words[s % #words + 1]
  end
  return table.concat(out, " ")
end

describe("ddplua.data.text", function()
  local tmp
  before_each(function() tmp = files.tmpdir("text") end)
  after_each(function() files.remove(tmp) end)

  describe("CharTokenizer", function()
    it("takes the sorted distinct characters (code points) as its vocabulary, as nanoGPT", function()
      local s = "hello world\nhé!"
      local tok = text.CharTokenizer.from_text(s)
      -- sorted(set(s)) written out: by code point, é (U+00E9) after the ASCII letters
      local want = { "\n", " ", "!", "d", "e", "h", "l", "o", "r", "w", "é" }
      assert.are.equal(#want, tok.vocab_size)
      for i, c in ipairs(want) do assert.are.equal(c, tok.itos[i - 1]) end
      local ids = tok:encode("hé lo")
      assert.are.equal("i64", ids.dtype)
      assert.are.same({ 5, 10, 1, 6, 7 }, ids:tolist())
      assert.are.equal("hé lo", tok:decode(ids))
      assert.are.equal("hé lo", tok:decode({ 5, 10, 1, 6, 7 }))
      local t2 = text.CharTokenizer.from_text(synthetic_text(300))
      local s2 = synthetic_text(50)
      assert.are.equal(s2, t2:decode(t2:encode(s2)))
    end)

    it("saves and loads its vocabulary", function()
      local tok = text.CharTokenizer.from_text(synthetic_text(200))
      tok:save(tmp .. "/meta.json")
      local back = text.CharTokenizer.load(tmp .. "/meta.json")
      assert.are.equal(tok.vocab_size, back.vocab_size)
      for i = 0, tok.vocab_size - 1 do assert.are.equal(tok.itos[i], back.itos[i]) end
      assert.are.equal(tok.vocab_size, text.load_tokenizer(tmp).vocab_size)
    end)

    it("errors name the character, the offset or the file", function()
      local tok = text.CharTokenizer.from_text("abc")
      assert.matches("character \"z\" %(U%+007A%) at byte 3 is not in the vocabulary of 3 characters",
        err_of(tok.encode, tok, "abz"))
      assert.matches("id 3 at position 2 is outside 0 .. 2", err_of(tok.decode, tok, { 0, 3 }))
      assert.matches("not valid UTF%-8 at byte 2", err_of(text.CharTokenizer.from_text, "a\255b"))
      assert.matches("not valid UTF%-8 at byte 1", err_of(text.CharTokenizer.from_text, "\192\128")) -- overlong
      write(tmp .. "/bad.json", '{"type": "bpe"}')
      assert.matches("bad.json is not a char vocabulary", err_of(text.CharTokenizer.load, tmp .. "/bad.json"))
      assert.is_truthy(err_of(text.CharTokenizer.load, tmp .. "/none.json"):find("cannot open " .. tmp .. "/none.json: No such file", 1, true))
    end)
  end)

  describe("prepare", function()
    -- nanoGPT's data/shakespeare_char/prepare.py, rewritten with the standard library:
    -- sorted(set(data)), stoi, data[:int(n*0.9)] / data[int(n*0.9):], uint16 tofile.
    local REFERENCE = [==[
import array, sys
data = open(sys.argv[1], encoding="utf-8").read()
chars = sorted(list(set(data)))
stoi = {ch: i for i, ch in enumerate(chars)}
n = len(data)
train, val = data[:int(n * 0.9)], data[int(n * 0.9):]
for name, part in (("train.bin", train), ("val.bin", val)):
    a = array.array("H", [stoi[c] for c in part])
    assert sys.byteorder == "little"
    open(sys.argv[2] + "/" + name, "wb").write(a.tobytes())
print(len(chars), len(train), len(val))
]==]

    local function check_against_python(corpus)
      if not io.open(PYTHON, "r") then return pending("no " .. PYTHON .. " for the reference") end
      local input = tmp .. "/input.txt"
      write(input, corpus)
      os.execute("mkdir -p " .. tmp .. "/py")
      write(tmp .. "/ref.py", REFERENCE)
      local p = io.popen(PYTHON .. " " .. tmp .. "/ref.py " .. input .. " " .. tmp .. "/py")
      local line = p:read("*l")
      p:close()
      local v, ntrain, nval = line:match("^(%d+) (%d+) (%d+)$")
      assert.is_not_nil(v, "reference output: " .. tostring(line))
      local info = text.prepare { input = input, out_dir = tmp .. "/ours" }
      assert.are.equal(tonumber(v), info.vocab_size)
      assert.are.equal(tonumber(ntrain), info.train_tokens)
      assert.are.equal(tonumber(nval), info.val_tokens)
      for _, name in ipairs { "train.bin", "val.bin" } do
        local ours, ref = files.read(tmp .. "/ours/" .. name), files.read(tmp .. "/py/" .. name)
        assert.are.equal(#ref, #ours, name .. " size")
        assert.is_true(ours == ref, name .. " differs from the reference's bytes")
      end
      return info
    end

    it("writes nanoGPT's train.bin / val.bin byte for byte on a few KB of Shakespeare", function()
      local s, why = shakespeare_sample(6000)
      if not s then return pending(why) end
      local info = check_against_python(s)
      if info then
        local tf = text.TokenFile(info.train_path, { vocab_size = info.vocab_size })
        assert.are.equal(info.train_tokens, #tf)
        assert.are.equal(s:sub(1, 200), info.tokenizer:decode(tf:read(0, 200)))
      end
    end)

    it("writes nanoGPT's files byte for byte on UTF-8 text", function()
      check_against_python(synthetic_text(2000))
    end)

    it("concatenates the inputs in order and splits at val_fraction", function()
      write(tmp .. "/a.txt", "abcabc")
      write(tmp .. "/b.txt", "ddd")
      local info = text.prepare { input = { tmp .. "/a.txt", tmp .. "/b.txt" }, out_dir = tmp .. "/o", val_fraction = 1 / 3 }
      assert.are.equal(6, info.train_tokens)
      assert.are.equal(3, info.val_tokens)
      local tok = text.load_tokenizer(tmp .. "/o")
      local val = text.TokenFile(tmp .. "/o/val.bin", { vocab_size = 4 })
      assert.are.equal("ddd", tok:decode(val:read(0, 3)))
      assert.matches("val_fraction must be in %(0, 1%)", err_of(text.prepare, { input = tmp .. "/a.txt", out_dir = tmp, val_fraction = 1 }))
      assert.is_truthy(err_of(text.prepare, { input = tmp .. "/none.txt", out_dir = tmp }):find("cannot open " .. tmp .. "/none.txt: No such file", 1, true))
    end)
  end)

  describe("TokenFile", function()
    local function tokens_file(name, list)
      local path = tmp .. "/" .. name
      text.write_tokens(path, dl.tensor(list, { dtype = "i64" }), 1000)
      return path
    end

    it("maps uint16 little-endian tokens and cuts windows with y shifted by one", function()
      local list = {}
      for i = 1, 50 do list[i] = (i * 37) % 1000 end
      local path = tokens_file("t.bin", list)
      local raw = files.read(path)
      assert.are.equal(100, #raw)
      assert.are.equal(list[2] % 256, raw:byte(3)) -- little-endian
      assert.are.equal(math.floor(list[2] / 256), raw:byte(4))
      local tf = text.TokenFile(path, { vocab_size = 1000 })
      assert.are.equal(50, #tf)
      local x, y = tf:windows({ 0, 40 }, 9)
      assert.are.same({ 2, 9 }, x:size())
      assert.are.equal("i64", y.dtype)
      for b, start in ipairs { 0, 40 } do
        for t = 1, 9 do
          assert.are.equal(list[start + t], x:tolist()[b][t])
          assert.are.equal(list[start + t + 1], y:tolist()[b][t])
        end
      end
      assert.matches("start 41 of window 1 is outside 0 .. 40", err_of(tf.windows, tf, { 0, 41 }, 9))
      assert.matches("holds 50 tokens, fewer than block_size %+ 1 = 51", err_of(tf.windows, tf, { 0 }, 50))
    end)

    it("refuses an odd-sized file and a token >= vocab_size, naming the file", function()
      write(tmp .. "/odd.bin", "abc")
      assert.matches("odd.bin: size 3 bytes is odd: not a file of uint16 tokens",
        err_of(text.TokenFile, tmp .. "/odd.bin", { vocab_size = 100 }))
      local path = tokens_file("big.bin", { 1, 2, 999, 3 })
      assert.matches("big.bin: token 2 %(0%-based%) is 999, not below vocab_size 65",
        err_of(text.TokenFile, path, { vocab_size = 65 }))
      assert.is_truthy(err_of(text.TokenFile, tmp .. "/none.bin", { vocab_size = 65 }):find("cannot open " .. tmp .. "/none.bin: No such file", 1, true))
      assert.matches("vocab_size must be given", err_of(text.TokenFile, path))
      assert.matches("token 1 %(0%-based%) is 70, outside 0 .. 64",
        err_of(text.write_tokens, tmp .. "/w.bin", dl.tensor({ 1, 70 }, { dtype = "i64" }), 65))
      assert.matches("tokens must be an integer tensor",
        err_of(text.write_tokens, tmp .. "/w.bin", dl.tensor({ 1, 2 }), 65))
      -- the failed writes left nothing behind
      local p = io.popen("ls -A " .. tmp)
      local listing = p:read("*a")
      p:close()
      assert.is_nil(listing:find("w.bin", 1, true))
    end)

    it("checks bytes in memory as it checks a file (ddp_io_tokens_from_bytes, the fuzz target's door)", function()
      local function from_bytes(bytes, vocab)
        local out = ffi.new("ddp_io_tokens*[1]")
        lib.check(C.ddp_io_tokens_from_bytes(out, bytes, #bytes, "mem.bin", vocab))
        return ffi.gc(out[0], C.ddp_io_tokens_free)
      end
      local f = from_bytes("\5\0\7\1\0\0", 300) -- 5, 263, 0: copied, the string may go
      assert.are.equal(3, tonumber(C.ddp_io_tokens_count(f)))
      assert.are.equal("mem.bin", ffi.string(C.ddp_io_tokens_path(f)))
      lib.check(C.ddp_io_tokens_read(lib.box, f, 0, 3))
      assert.are.same({ 5, 263, 0 }, lib.wrap(lib.box[0]):tolist())
      assert.are.equal(0, tonumber(C.ddp_io_tokens_count(from_bytes("", 1))))
      assert.matches("mem.bin: size 3 bytes is odd: not a file of uint16 tokens", err_of(from_bytes, "abc", 100))
      assert.matches("mem.bin: token 1 %(0%-based%) is 263, not below vocab_size 263", err_of(from_bytes, "\5\0\7\1", 263))
      assert.matches("mem.bin: vocab_size must be in 1 .. 65536", err_of(from_bytes, "\5\0", 65537))
    end)

    it("draws random windows from the generator's Philox blocks as documented", function()
      local list = {}
      for i = 1, 300 do list[i] = (i * 7) % 1000 end
      local tf = text.TokenFile(tokens_file("r.bin", list), { vocab_size = 1000 })
      local g = dl.Generator(42)
      g:set_state({ seed = 42, offset = 5 })
      local x, y, starts = tf:random_windows(4, 16, g)
      assert.are.same({ seed = 42, offset = 9 }, g:get_state()) -- one block per window
      local out, ctr, key = ffi.new("uint32_t[4]"), ffi.new("uint32_t[4]"), ffi.new("uint32_t[2]", 42, 0)
      local xs = x:tolist()
      for b = 0, 3 do
        ctr[0] = 5 + b
        C.ddp_philox4x32_10(out, ctr, key)
        -- start = (w0 + 2^32 w1) mod (n - T), in exact integer arithmetic
        local w = ffi.cast("uint64_t", out[0]) + ffi.cast("uint64_t", out[1]) * 4294967296ULL
        local want = tonumber(w % (300 - 16))
        assert.are.equal(want, tonumber(starts[b]))
        assert.are.equal(list[want + 1], xs[b + 1][1])
        assert.are.equal(list[want + 17], y:tolist()[b + 1][16])
      end
      g:set_state({ seed = 42, offset = 5 })
      local x2 = tf:random_windows(4, 16, g)
      assert.are.same(xs, x2:tolist())
    end)
  end)

  describe("RandomWindows", function()
    local function big_file()
      local list = {}
      for i = 1, 2000 do list[i] = (i * 31) % 500 end
      local path = tmp .. "/big.bin"
      text.write_tokens(path, dl.tensor(list, { dtype = "i64" }), 500)
      return text.TokenFile(path, { vocab_size = 500 })
    end

    it("gives each rank its own part of one Philox stream (Note [per-rank windows])", function()
      local tf = big_file()
      local r0 = text.RandomWindows(tf, { block_size = 8, batch_size = 3, seed = 7, rank = 0, world_size = 2 })
      local r1 = text.RandomWindows(tf, { block_size = 8, batch_size = 3, seed = 7, rank = 1, world_size = 2 })
      local _, _, s0 = r0:next()
      local _, _, s1 = r1:next()
      local g = dl.Generator(7)
      g:set_state({ seed = 7, offset = 2 ^ 40 })
      local _, _, want = tf:random_windows(3, 8, g)
      for b = 0, 2 do assert.are.equal(tonumber(want[b]), tonumber(s1[b])) end
      local differ = false
      for b = 0, 2 do differ = differ or s0[b] ~= s1[b] end
      assert.is_true(differ)
      assert.are.same({ seed = 7, offset = 3 }, r0:state_dict())
    end)

    it("resumes from state_dict with the batches of the uninterrupted run", function()
      local tf = big_file()
      local a = text.RandomWindows(tf, { block_size = 8, batch_size = 2, seed = 1 })
      a:next()
      local sd = a:state_dict()
      local xa = a:next()
      local b = text.RandomWindows(tf, { block_size = 8, batch_size = 2, seed = 1 })
      b:load_state_dict(sd)
      assert.are.same(xa:tolist(), b:next():tolist())
      assert.matches("RandomWindows: rank must be an integer in 0 .. 1",
        err_of(text.RandomWindows, tf, { block_size = 8, batch_size = 2, rank = 2, world_size = 2 }))
      assert.matches("RandomWindows: block_size must be a positive integer",
        err_of(text.RandomWindows, tf, { batch_size = 2 }))
      assert.matches("fewer than block_size %+ 1 = 2001",
        err_of(text.RandomWindows, tf, { block_size = 2000, batch_size = 2 }))
    end)
  end)

  describe("evaluate", function()
    it("averages loss_fn over the non-overlapping windows, or max_windows evenly spaced", function()
      assert.are.same({ 0, 10, 20, 30 }, text.eval_starts(45, 10, nil))
      assert.are.same({ 0, 20 }, text.eval_starts(45, 10, 2))
      assert.matches("block_size must be an integer >= 1, got 2.5", err_of(text.eval_starts, 45, 2.5))
      assert.matches("max_windows must be an integer >= 1, got nan", err_of(text.eval_starts, 45, 10, 0 / 0))
      local list = {}
      for i = 1, 101 do list[i] = i % 10 end
      local path = tmp .. "/e.bin"
      text.write_tokens(path, dl.tensor(list, { dtype = "i64" }), 10)
      local tf = text.TokenFile(path, { vocab_size = 10 })
      -- a "loss" that is the mean of the first target token of each window: checkable by hand
      local seen_grad
      local function loss_fn(x, y)
        seen_grad = dl.is_grad_enabled()
        return y:select(2, 1):to("f64"):mean()
      end
      local mean, count = text.evaluate(loss_fn, tf, { block_size = 10, batch_size = 3 })
      assert.are.equal(10, count)
      local want = 0
      for k = 0, 9 do want = want + list[k * 10 + 2] end
      assert.are.near(want / 10, mean, 1e-12)
      assert.is_false(seen_grad)
      -- rank 1 of 3 alone sees windows 1, 4, 7; with world_size 1 nothing is reduced
      local part, n = text.evaluate(loss_fn, tf, { block_size = 10, batch_size = 2, rank = 0, world_size = 1 })
      assert.are.equal(10, n)
      assert.are.near(mean, part, 1e-12)
      assert.matches("needs an initialized process group",
        err_of(text.evaluate, loss_fn, tf, { block_size = 10, batch_size = 2, rank = 1, world_size = 3 }))
      assert.matches("loss_fn returned string", err_of(text.evaluate, function() return "x" end, tf, { block_size = 10, batch_size = 2 }))
    end)

    it("gives every rank the mean over all windows (2 ranks, one all_reduce) #dist", function()
      local mp = require "multiproc"
      local list = {}
      for i = 1, 161 do list[i] = (i * 3) % 10 end
      local path = tmp .. "/d.bin"
      text.write_tokens(path, dl.tensor(list, { dtype = "i64" }), 10)
      local code = ([[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local text = require "ddplua.data.text"
dist.init_process_group { timeout = 20 }
local tf = text.TokenFile(%q, { vocab_size = 10 })
local mean, n = text.evaluate(function(x, y) return y:to("f64"):mean() end, tf, { block_size = 10, batch_size = 2, max_windows = 15 })
print(("MEAN %%.17g %%d"):format(mean, n))
local rw = text.RandomWindows(tf, { block_size = 10, batch_size = 3, seed = 5 })
local _, _, st = rw:next()
print(("STARTS %%d %%d %%d %%d %%d"):format(rw.rank, rw.world_size, tonumber(st[0]), tonumber(st[1]), tonumber(st[2])))
dist.destroy_process_group()
]]):format(path)
      local r = mp.run { code = code, nprocs = 2, timeout = 40 }
      assert.is_true(r.ok, mp.describe(r))
      local tf = text.TokenFile(path, { vocab_size = 10 })
      local one = text.evaluate(function(x, y) return y:to("f64"):mean() end, tf, { block_size = 10, batch_size = 2, max_windows = 15 })
      for i = 1, 2 do
        local m, n = r[i].output:match("MEAN (%S+) (%d+)")
        assert.is_not_nil(m, r[i].output)
        assert.are.equal(15, tonumber(n))
        assert.are.near(one, tonumber(m), 1e-12)
        -- RandomWindows takes the rank and world size from the process group
        local rank, world, a, b, c = r[i].output:match("STARTS (%d+) (%d+) (%d+) (%d+) (%d+)")
        assert.are.equal(i - 1, tonumber(rank))
        assert.are.equal(2, tonumber(world))
        local _, _, want = text.RandomWindows(tf, { block_size = 10, batch_size = 3, seed = 5, rank = i - 1, world_size = 2 }):next()
        assert.are.same({ tonumber(want[0]), tonumber(want[1]), tonumber(want[2]) }, { tonumber(a), tonumber(b), tonumber(c) })
      end
    end)
  end)

  describe("ddplua prepare", function()
    local exe = os.getenv("DDPLUA_EXE") or "build/ddplua"
    local function run(args)
      local p = io.popen(exe .. " prepare " .. args .. " 2>&1; echo \"rc=$?\"")
      local out = p:read("*a")
      p:close()
      return out, tonumber(out:match("rc=(%d+)%s*$"))
    end

    it("writes the token files and prints the counts; usage errors exit 2", function()
      write(tmp .. "/in.txt", synthetic_text(500))
      local out, rc = run("--out " .. tmp .. "/o " .. tmp .. "/in.txt")
      assert.are.equal(0, rc, out)
      local tr, va, v = out:match("(%d+) train tokens, (%d+) val tokens, vocab_size (%d+)")
      assert.is_not_nil(tr, out)
      local tok = text.load_tokenizer(tmp .. "/o")
      assert.are.equal(tonumber(v), tok.vocab_size)
      assert.are.equal(tonumber(tr), #text.TokenFile(tmp .. "/o/train.bin", { vocab_size = tok.vocab_size }))
      out, rc = run(tmp .. "/in.txt")
      assert.are.equal(2, rc)
      assert.matches("%-%-out DIR is required", out)
      out, rc = run("--out " .. tmp .. "/o --bogus")
      assert.are.equal(2, rc)
      assert.matches("unknown option %-%-bogus", out)
    end)
  end)
end)
