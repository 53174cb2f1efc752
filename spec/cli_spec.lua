-- Specs for the ddplua executable (runtime/cli/): scripts with arguments, -e, -i, stdin,
-- --version, exit statuses, errors, and a REPL session driven through a pipe.
-- The executable is $DDPLUA_EXE or ./build/ddplua; it runs as a child process.

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- Quote a string for /bin/sh.
local function sh(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- Write `text` to a new temporary file; returns its path.
local function temp_file(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

-- Run the executable with the shell-quoted `args` (a string put after the executable),
-- optionally feeding `input` on stdin; `merge` sends stderr into stdout (to check the order
-- of results and errors). Returns stdout, stderr and the exit status.
local function run(args, input, merge)
  local err_path = os.tmpname()
  local cmd = sh(exe) .. " " .. args
  local in_path
  if input then
    in_path = temp_file(input)
    cmd = cmd .. " < " .. sh(in_path)
  else
    cmd = cmd .. " < /dev/null"
  end
  local redirect = merge and " 2>&1" or " 2> " .. sh(err_path)
  local p = assert(io.popen(cmd .. redirect .. "; echo \"status=$?\"", "r"))
  local out = p:read("*a")
  p:close()
  local f = io.open(err_path, "r")
  local err = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(err_path)
  if in_path then os.remove(in_path) end
  local status = tonumber(out:match("status=(%d+)\n$"))
  out = out:gsub("status=%d+\n$", "")
  return out, err, status
end

-- Assert that the plain strings in `list` occur in `text` in that order.
local function assert_in_order(text, list)
  local pos = 1
  for _, s in ipairs(list) do
    local a, b = text:find(s, pos, true)
    assert(a, ("expected %q after position %d in:\n%s"):format(s, pos, text))
    pos = b + 1
  end
end

describe("ddplua executable", function()
  it("runs a script that sees arg and ... as under the stock luajit", function()
    local script = temp_file([[
      print("n", select("#", ...))
      print("dots", ...)
      print("arg", arg[-1], arg[0], arg[1], arg[2], #arg)
    ]])
    finally(function() os.remove(script) end)
    local out, err, status = run(sh(script) .. " first 'two words'")
    assert.equal(0, status, err)
    assert.matches("n\t2\n", out, 1, true)
    assert.matches("dots\tfirst\ttwo words\n", out, 1, true)
    assert.matches("arg\t" .. exe .. "\t" .. script .. "\tfirst\ttwo words\t2\n", out, 1, true)
  end)

  it("finds require \"ddplua\" from any directory", function()
    local abs = exe:sub(1, 1) == "/" and exe or (os.getenv("PWD") .. "/" .. exe)
    local p = assert(io.popen("cd / && " .. sh(abs)
      .. " -e 'local dl = require \"ddplua\"; print(table.concat(dl.zeros{2, 3}:size(), \"x\"))' 2>&1"))
    local out = p:read("*a")
    p:close()
    assert.equal("2x3\n", out)
  end)

  it("runs -e code, several in order, with no implicit globals", function()
    local out, err, status = run("-e 'x = 40' -e 'x = x + 2' -e 'print(x, dl)'")
    assert.equal(0, status, err)
    assert.equal("42\tnil\n", out)
  end)

  it("runs scripts with SIGPIPE ignored, so a dead peer's socket gives EPIPE, not death", function()
    -- /proc/self/status's SigIgn is a hex mask of the ignored signals; SIGPIPE is 13
    local out, err, status = run("-e 'for l in io.lines(\"/proc/self/status\") do "
      .. "local m = l:match(\"^SigIgn:%s*(%x+)\") if m then print(m) end end'")
    assert.equal(0, status, err)
    local mask = tonumber(out:match("%x+"), 16)
    assert.is_not_nil(mask, out)
    assert.equal(1, math.floor(mask / 2 ^ 12) % 2, "SigIgn " .. out)
  end)

  it("runs a script read from stdin with -", function()
    local out, err, status = run("- a b", "print(arg[0], ...)\n")
    assert.equal(0, status, err)
    assert.equal("-\ta\tb\n", out)
  end)

  it("prints its version and that of LuaJIT", function()
    local out, _, status = run("--version")
    assert.equal(0, status)
    local dl = require "ddplua"
    assert.equal("ddplua " .. dl.version .. " (" .. jit.version .. ")\n", out)
  end)

  it("prints help", function()
    local out, _, status = run("--help")
    assert.equal(0, status)
    assert.matches("usage: ddplua", out, 1, true)
    assert.matches("-e code", out, 1, true)
  end)

  it("exits 1 with the message and a traceback when a script fails", function()
    local script = temp_file("local function f() error('went wrong') end\nf()\n")
    finally(function() os.remove(script) end)
    local _, err, status = run(sh(script))
    assert.equal(1, status)
    assert.matches("ddplua: " .. script .. ":1: went wrong", err, 1, true)
    assert.matches("stack traceback:", err, 1, true)
    assert.matches("in function 'f'", err, 1, true)
  end)

  it("exits 1 on a syntax error and on an -e error", function()
    local script = temp_file("x = = 1\n")
    finally(function() os.remove(script) end)
    local _, err, status = run(sh(script))
    assert.equal(1, status)
    assert.matches("ddplua: " .. script .. ":1:", err, 1, true)
    _, err, status = run("-e 'error(\"bad -e\")' -e 'print(\"not reached\")'")
    assert.equal(1, status)
    assert.matches("bad -e", err, 1, true)
  end)

  it("exits 1 naming a missing script", function()
    local out, err, status = run("no_such_script.lua")
    assert.equal(1, status)
    assert.equal("", out)
    assert.equal("ddplua: cannot open no_such_script.lua: No such file or directory\n", err)
  end)

  it("exits 2 on an unknown option, naming it", function()
    local _, err, status = run("--no-such-flag=3 script.lua")
    assert.equal(2, status)
    assert.matches("unknown option '--no-such-flag=3'", err, 1, true)
    _, err, status = run("-Z")
    assert.equal(2, status)
    assert.matches("unknown option '-Z'", err, 1, true)
    _, err, status = run("-e")
    assert.equal(2, status)
    assert.matches("'-e' needs an argument", err, 1, true)
  end)

  it("passes options after the script to the script", function()
    local out, err, status = run("-e 'print(1)' - --no-such-flag", "print(...)\n")
    assert.equal(0, status, err)
    assert.equal("1\n--no-such-flag\n", out)
  end)

  describe("REPL through a pipe", function()
    it("prints results, continues incomplete input, survives errors, exits 0 on EOF", function()
      local out, err, status = run("",
        'x = 1 + 1\nx\nfor i = 1, 2 do\nprint(i)\nend\nerror("boom")\nx * 3\n', true)
      assert.equal(0, status, err)
      assert_in_order(out, { "> ", "> 2\n", "> ", ">> ", ">> 1\n2\n",
        "> ddplua: stdin:1: boom\nstack traceback:", "> 6\n" })
      assert.not_matches("ddplua %d", out) -- no banner on a pipe
    end)

    it("prints several results separated by tabs, nil included", function()
      local out, _, status = run("", '1, "a", nil\n=2\n')
      assert.equal(0, status)
      assert.equal('> 1\ta\tnil\n> 2\n> \n', out)
    end)

    it("reports a syntax error and goes on", function()
      local out, err, status = run("", 'x = = 1\n7\n')
      assert.equal(0, status)
      assert.matches("stdin:1:", err, 1, true)
      assert.matches("> 7\n", out, 1, true)
    end)

    it("has dl loaded and prints a tensor's summary", function()
      local out, err, status = run("", "t = dl.zeros{2, 3}\nt\n#t:size()\n")
      assert.equal(0, status, err)
      local dl = require "ddplua"
      assert_in_order(out, { "> > ", tostring(dl.zeros { 2, 3 }), "\n> 2\n" })
    end)

    it("runs the script first with -i", function()
      local script = temp_file("y = 21\n")
      finally(function() os.remove(script) end)
      local out, err, status = run("-i " .. sh(script), "y * 2\n")
      assert.equal(0, status, err)
      assert.equal("> 42\n> \n", out)
    end)

    it("is not entered after a script without -i", function()
      local out, err, status = run("-e 'print(\"only\")'", "print('repl')\n")
      assert.equal(0, status, err)
      assert.equal("only\n", out)
    end)
  end)
end)
