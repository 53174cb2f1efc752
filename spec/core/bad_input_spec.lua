-- Bad input never crashes: a sweep of wrong-kind arguments over the whole Lua API runs in a
-- child process (spec/fixtures/bad_input_sweep.lua) and must reach its end.
local files = require "files"

describe("ddplua bad input", function()
  it("raises Lua errors, never crashes, for wrong-kind arguments anywhere in the API", function()
    local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
    local status, out = files.run(exe .. " spec/fixtures/bad_input_sweep.lua")
    assert.equal(0, status, out)
    local n = tonumber(out:match("survived (%d+) calls"))
    assert.is_truthy(n, out)
    assert.is_true(n > 10000)
  end)

  it("reads a nil handle as an empty tensor in the accessors (expand_as(nil) once crashed)", function()
    local dl = require "ddplua"
    local ok, err = pcall(function() return dl.randn({ 2, 3 }):expand_as(nil) end)
    assert.is_false(ok)
    assert.matches("expand", err)
  end)
end)
