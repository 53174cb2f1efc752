-- Specs for the REPL as a user meets it: the ddplua executable in a pseudo-terminal (tmux,
-- spec/helpers/pty.lua), typed at key by key: locals that persist, printed values, :time,
-- Ctrl-C, Tab completion and ?help. Waits poll the screen with generous deadlines (a loaded
-- machine makes them slower, not red). The pipe-driven REPL specs are in cli_spec.lua.
local pty = require "pty"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local describe_tty = pty.available() and describe or pending

describe_tty("REPL in a terminal", function()
  local term
  before_each(function()
    term = pty.start(exe)
    term:wait_prompt()
  end)
  after_each(function() term:close() end)

  local function enter(line) return term:enter(line) end

  describe("Part 3: values and locals", function()
    it("keeps a local from one line to the next, assignments to it too", function()
      enter("local z = 5")
      assert.equal("5\n", enter("z"))
      enter("z = z + 1")
      assert.equal("6\n", enter("z"))
      assert.is_nil(rawget(_G, "z"))
      assert.equal("nil\n", enter("rawget(_G, 'z')")) -- it stayed a local
    end)

    it("prints an expression's values and a trailing expression after statements", function()
      assert.matches("^1%s+a%s+nil\n$", enter('1, "a", nil')) -- tabs (tmux shows spaces)
      assert.equal("6\n", enter("x = 2; x * 3"))
      assert.equal("", enter("y = 7"))
    end)

    it("times an expression with :time (median of several runs)", function()
      assert.matches("^median [%d.]+ %S*s over %d+ runs %(min .+, max .+%)\n$",
        enter(":time dl.zeros{100}"))
    end)
  end)

  describe("Part 4: Ctrl-C", function()
    it("stops `while true do end`, returns to the prompt and still answers", function()
      term:send("while true do end", "Enter")
      os.execute("sleep 0.3")
      term:send("C-c")
      term:wait_for("interrupted!")
      term:wait_prompt()
      assert.equal("2\n", enter("1+1"))
    end)

    it("stops a loop inside a function defined at the prompt", function()
      enter("function spin() local i = 0 while true do i = i + 1 end end")
      term:send("spin()", "Enter")
      os.execute("sleep 0.3")
      term:send("C-c")
      term:wait_for("in function 'spin'")
      term:wait_prompt()
      assert.equal("2\n", enter("1+1"))
    end)

    it("drops unfinished multi-line input on Ctrl-C at the >> prompt", function()
      term:send("for i = 1, 3 do", "Enter")
      term:wait_prompt(">>")
      term:send("C-c")
      term:wait_prompt()
      assert.equal("4\n", enter("2+2"))
    end)

    it("survives Ctrl-C after Ctrl-C (each interrupts; only Ctrl-D ends the REPL)", function()
      for round = 1, 3 do
        term:send("local n = 0; while true do n = n + 1 end", "Enter")
        os.execute("sleep 0.2")
        term:send("C-c")
        term:wait_count("interrupted!", round)
        term:wait_prompt()
      end
      term:send("C-c", "C-c")
      assert.equal("2\n", enter("1+1"))
      assert.is_false(term:dead())
      term:send("C-d")
      local deadline = os.time() + 30
      while not term:dead() and os.time() < deadline do os.execute("sleep 0.05") end
      assert.is_true(term:dead())
    end)
  end)

  describe("Part 1: Tab completion", function()
    -- Type `text`, press Tab, and return the prompt line then.
    local function tab(text, times)
      term:send(text)
      for _ = 1, times or 1 do term:send("Tab") end
    end

    it("completes dl.zer to dl.zeros and lists dl.zeros and dl.zeros_like on a second Tab", function()
      tab("dl.zer")
      term:wait_for("> dl.zeros")
      term:send("Tab")
      term:wait_for("dl.zeros_like")
      term:send("C-c")
      term:wait_prompt()
    end)

    it("completes globals, methods of tensors, modules and optimizers", function()
      enter("t = dl.zeros{2}")
      enter("m = dl.nn.Linear(2, 3)")
      enter("opt = dl.optim.SGD(m:parameters(), {lr = 0.1})")
      for _, case in ipairs {
        { "pri", "> print" }, { "t:resh", "> t:reshape" }, { "m:zero_g", "> m:zero_grad" },
        { "opt:ste", "> opt:step" }, { "dl.nn.Line", "> dl.nn.Linear" },
        { "dl.optim.Adade", "dl.optim.Adadelta" }, { 'require "ddplua.distributed.sa', '"ddplua.distributed.sampler' },
      } do
        tab(case[1])
        term:wait_for(case[2])
        term:send("C-c")
        term:wait_prompt()
      end
    end)

    it("completes a local of the prompt and the methods of a process group's class", function()
      enter("local my_long_name = 1")
      tab("my_long")
      term:wait_for("> my_long_name")
      term:send("C-c")
      term:wait_prompt()
      enter("G = require('ddplua.distributed.group')")
      enter("g = setmetatable({ranks = {0, 1}}, G)")
      tab("g:group_r")
      term:wait_for("g:group_rank")
    end)
  end)

  describe("Part 2: help", function()
    it("?dl.zeros prints its signature and doc comment", function()
      local out = enter("?dl.zeros")
      assert.matches("dl.zeros(shape, opts)", out, 1, true)
      assert.matches("lua/ddplua/functions.lua:", out, 1, true)
      assert.matches("dl.zeros(shape, opts) / dl.ones(shape, opts)", out, 1, true)
    end)

    it("help(obj) describes a module's class; ? lists the namespaces; ?ddp_ the C API", function()
      enter("m = dl.nn.Linear(2, 3)")
      assert.matches("nn.Linear(in_features, out_features", enter("help(m)"), 1, true)
      local list = enter("?")
      for _, ns in ipairs { "dl.nn", "dl.optim", "dl.data", "dl.distributed", "dl.cuda" } do
        assert.matches(ns, list, 1, true)
      end
      assert.matches("As ddp_tensor_empty, filled with zeros", enter("?ddp_tensor_zeros"), 1, true)
      assert.matches("Number of dimensions", enter("?dl.zeros{1}.dim"), 1, true)
    end)
  end)
end)

-- The same session logic without a terminal (no tmux needed): lines from a pipe.
describe("REPL through a pipe: locals, trailing expressions, help", function()
  local function run(input)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(input)
    f:close()
    local p = assert(io.popen(exe .. " < " .. path .. " 2>&1"))
    local out = p:read("*a")
    p:close()
    os.remove(path)
    return out
  end

  it("keeps locals, prints trailing expressions, shows help, goes on after errors", function()
    local out = run("local z = 5\nz\ndo local hidden = 1 end\nhidden\nz = z * 2; z + 1\n" ..
      "?dl.zeros\nerror('boom')\nlocal a, b = 1, 2\na + b + z\n")
    assert.matches("> > 5\n", out, 1, true)
    assert.matches("> nil\n", out, 1, true)   -- a block's local ends with its block
    assert.matches("> 11\n", out, 1, true)
    assert.matches("dl.zeros(shape, opts)", out, 1, true)
    assert.matches("stdin:1: boom", out, 1, true)
    assert.matches("> 13\n", out, 1, true)
  end)
end)

describe("dl.timeit", function()
  local dl = require "ddplua"
  it("returns the median seconds of a call and a report", function()
    local calls = 0
    local median, report = dl.timeit(function() calls = calls + 1 end, { runs = 7 })
    assert.equal(8, calls) -- one warm-up, then 7 runs
    assert.is_true(median >= 0 and median < 0.1)
    assert.matches("^median .+ over 7 runs %(min .+, max .+%)$", report)
  end)

  it("refuses what it cannot call", function()
    assert.has_error(function() dl.timeit(42) end, "timeit: expected a function")
  end)
end)
