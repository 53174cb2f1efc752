-- Specs for ddplua.utils.argparse: values in both spellings, flags, numbers, dest names,
-- the usage text, and the error messages train.lua users see.
local argparse = require "ddplua.utils.argparse"
local files = require "files"

local function parser()
  local p = argparse.ArgumentParser { prog = "demo.lua", usage = "ddplua demo.lua [options]" }
  p:add_argument("--batch-size", { type = "number", metavar = "N", help = "batch size" })
  p:add_argument("--out", { metavar = "DIR", help = "output folder\nsecond line" })
  p:add_argument("--quiet", { action = "store_true", help = "no progress output" })
  return p
end

describe("ddplua.utils.argparse", function()
  it("parses `--name value`, `--name=value` and flags into dest keys", function()
    local o = parser():parse_args { "--batch-size", "32", "--out=runs/x", "--quiet" }
    assert.are.same({ batch_size = 32, out = "runs/x", quiet = true }, o)
    assert.are.same({}, parser():parse_args {})
    assert.are.same({ out = "a=b" }, parser():parse_args { "--out=a=b" })
  end)

  it("takes flags spelt with underscores, as Python's argparse (`--world_size 3`)", function()
    local p = argparse.ArgumentParser { prog = "demo.lua" }
    p:add_argument("--world_size", { type = "number" })
    p:add_argument("--init_method", {})
    assert.are.same({ world_size = 3, init_method = "file:///tmp/x" },
      p:parse_args { "--world_size", "3", "--init_method=file:///tmp/x" })
    assert.has_error(function() p:parse_args { "--world-size", "3" } end) -- the spelling declared only
  end)

  it("formats the usage with aligned, indented help", function()
    assert.are.equal("usage: ddplua demo.lua [options]\n" ..
      "  --batch-size N     batch size\n" ..
      "  --out DIR          output folder\n" ..
      "                     second line\n" ..
      "  --quiet            no progress output\n", parser():format_help())
  end)

  it("raises on unknown options, missing values and non-numbers, naming the program", function()
    local ok, err = pcall(parser().parse_args, parser(), { "--bogus", "1" })
    assert.is_false(ok)
    assert.matches("^demo.lua: unknown option '%-%-bogus'\nusage: ", err)
    ok, err = pcall(parser().parse_args, parser(), { "--out" })
    assert.matches("^demo.lua: %-%-out needs a value\n", err)
    ok, err = pcall(parser().parse_args, parser(), { "--batch-size", "many" })
    assert.are.equal("demo.lua: --batch-size expects a number, got 'many'", err)
    assert.has_error(function() parser():add_argument("-x") end)
    assert.has_error(function() parser():add_argument("--x", { action = "count" }) end)
  end)

  it("prints the usage and exits 0 on --help", function()
    local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
    local status, out = files.run(exe .. [[ -e 'local a = require "ddplua.utils.argparse"
      local p = a.ArgumentParser { prog = "x" }; p:add_argument("--n", { help = "a number" })
      p:parse_args { "--help" }; print("not reached")']])
    assert.are.equal(0, status, out)
    assert.matches("usage: x %[options%]\n  %-%-n N +a number\n$", out)
  end)
end)
