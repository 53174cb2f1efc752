-- The runtime embeds without Lua: compile examples/embed_linear.c against ddplua.h and
-- build/libddplua.so only, run it, and check it trained and released everything.
local lib = require "ddplua.lib"

describe("embedding the C runtime", function()
  it("trains a linear model from a C program that includes only ddplua.h", function()
    local build_dir = lib.lib_path:match("^(.*)/[^/]*$")
    local exe = os.tmpname()
    finally(function() os.remove(exe) end)
    local sanitize = os.getenv("LD_PRELOAD") and " -fsanitize=address,undefined" or ""
    local sh = require("files").run
    local status, compile_out = sh(("cc -std=c11 -Wall -Werror%s -Iruntime/include examples/embed_linear.c -L%s -lddplua -Wl,-rpath,%s -o %s")
      :format(sanitize, build_dir, build_dir, exe))
    assert.equal(0, status, "compile failed: " .. compile_out)
    local run_status, out = sh(exe)
    assert.equal(0, run_status, "embed_linear failed: " .. out)
    local first, last = out:match("first loss ([%d%.e%-]+), last loss ([%d%.e%-]+)")
    assert.is_truthy(first, out)
    assert.is_true(tonumber(last) < 1e-3 * tonumber(first))
    assert.matches("live bytes after release: 0\n", out)
  end)
end)
