-- Specs for ddplua.os (runtime/core/os.c through the FFI): the monotonic clock, isatty,
-- mkdir -p and its errors, resource usage, byte comparison; and that Lua code keeps no libc
-- declarations of its own (everything from the OS comes through ddplua.h).
local os_ = require "ddplua.os"
local clock = require "ddplua.clock"
local lib = require "ddplua.lib"
local files = require "files"
local ffi = lib.ffi

describe("ddplua.os", function()
  it("reads a monotonic clock in seconds", function()
    local a = os_.monotonic()
    local b = clock.now()
    assert.is_true(type(a) == "number" and a > 0)
    assert.is_true(b >= a)
    local t0 = os_.monotonic()
    os.execute("sleep 0.05")
    local dt = os_.monotonic() - t0
    assert.is_true(dt >= 0.04 and dt < 5, "slept 0.05 s, measured " .. dt)
  end)

  it("reads the time of day in seconds since the epoch, with fractions", function()
    local before = os.time()
    local t = os_.time()
    local after = os.time()
    assert.is_true(t >= before and t < after + 1, ("os.time %d..%d, os_.time %.6f"):format(before, after, t))
    local frac = false
    for _ = 1, 50 do
      if os_.time() % 1 ~= 0 then frac = true end
    end
    assert.is_true(frac)
  end)

  it("sleeps the time asked and refuses a bad duration", function()
    local t0 = os_.monotonic()
    os_.sleep(0.2)
    local dt = os_.monotonic() - t0
    assert.is_true(dt >= 0.2 and dt < 2, "slept " .. dt .. " s")
    os_.sleep(0)
    assert.matches("sleep: seconds must be a number in 0 .. 1e9, got %-1", select(2, pcall(os_.sleep, -1)))
    assert.matches("os_spec.lua:%d+: sleep: seconds must be a number, got string", select(2, pcall(function() os_.sleep("1") end)))
  end)

  it("tells a terminal from a pipe", function()
    assert.is_false(os_.isatty(-1))
    -- a child whose stdout is a pipe
    local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
    local _, out = files.run(exe .. [[ -e 'print(require("ddplua.os").isatty(1))' | cat]])
    assert.matches("false", out)
  end)

  it("creates nested folders, accepts existing ones and names the part it cannot make", function()
    local dir = files.tmpdir("os")
    finally(function() files.remove(dir) end)
    os_.mkdir_p(dir .. "/a/b//c/")
    os_.mkdir_p(dir .. "/a/b/c") -- exists: fine
    local f = assert(io.open(dir .. "/a/b/c/x", "w"))
    f:close()
    local ok, err = pcall(os_.mkdir_p, dir .. "/a/b/c/x/y")
    assert.is_false(ok)
    assert.matches("mkdir %-p '.*/a/b/c/x/y': cannot create '.*/a/b/c/x': Not a directory", err)
    assert.matches("os_spec.lua", err) -- raised at the caller's line
    ok, err = pcall(os_.mkdir_p, "")
    assert.is_false(ok)
    assert.matches("the path is empty", err)
  end)

  it("reports peak memory and CPU time", function()
    local before = os_.resource_usage()
    local x = 0
    for i = 1, 3e6 do x = x + math.sqrt(i) end
    local ru = os_.resource_usage()
    assert.is_true(x > 0)
    assert.is_true(ru.peak_rss_bytes > 1e6 and ru.peak_rss_bytes < 1e12, tostring(ru.peak_rss_bytes))
    assert.is_true(ru.user_seconds >= before.user_seconds)
    assert.is_true(ru.user_seconds + ru.system_seconds > 0)
  end)

  it("compares bytes", function()
    local a, b = ffi.new("char[4]", "abc"), ffi.new("char[4]", "abd")
    assert.is_true(os_.bytes_equal(a, a, 4))
    assert.is_false(os_.bytes_equal(a, b, 4))
    assert.is_true(os_.bytes_equal(a, b, 2))
    assert.is_true(os_.bytes_equal(a, b, 0))
  end)
end)

describe("Lua code and libc", function()
  -- The generated cdef of ddplua.h is the one ffi.cdef of the front end. bench/ops.lua
  -- declares OpenBLAS's sgemm (the reference it measures against, not libc).
  local allowed = { ["lua/ddplua/lib.lua"] = true, ["bench/ops.lua"] = true }

  it("declares no libc functions outside ddplua.h", function()
    local p = io.popen("find lua bench examples train.lua -name '*.lua' 2>/dev/null")
    local offenders = {}
    for path in p:lines() do
      if not allowed[path] then
        local s = files.read(path)
        if s:find("ffi%.cdef") or s:find("ffi%.C%.") then offenders[#offenders + 1] = path end
      end
    end
    p:close()
    assert.are.same({}, offenders)
  end)
end)
