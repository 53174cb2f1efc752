-- Specs for the lifetime of tensor handles (Note [handle registry] in lua/ddplua/lib.lua):
-- a tensor is released in the collection that finds its handle unreachable, however many
-- handles come and go, reachable ones keep their data, and lua_close releases the rest.
local dl = require "ddplua"
local lib = require "ddplua.lib"
local files = require "files"

local function live() return dl.memory_stats().live end

-- Bytes the runtime holds for one more tensor of `shape` (f32).
local function bytes_of(shape)
  collectgarbage("collect")
  local before = live()
  local t = dl.zeros(shape)
  local n = live() - before
  assert(t and n > 0)
  return n
end

describe("tensor handle lifetime", function()
  it("frees every unreachable tensor in one collection, across slot reuse and growth", function()
    local each = bytes_of { 16 }
    collectgarbage("collect")
    local base = live()
    local kept = {}
    for round = 1, 3 do
      -- 5000 handles per round: more than the first slot table holds, and the slots freed
      -- by the previous round's collection are taken again
      for i = 1, 5000 do
        local t = dl.full({ 16 }, round * 10000 + i)
        if i % 7 == 0 then kept[#kept + 1] = { t, round * 10000 + i } end
      end
      collectgarbage("collect")
      assert.equal(base + #kept * each, live(), "round " .. round)
    end
    for _, k in ipairs(kept) do
      local t, v = k[1], k[2]
      assert.equal(v, t:get(1))
      assert.equal(v, t:get(16))
    end
    kept = nil
    collectgarbage("collect")
    assert.equal(base, live())
  end)

  it("frees temporaries of a hot (compiled) loop, with and without the tape", function()
    local w = dl.randn({ 8 }, { requires_grad = true })
    local x = dl.randn { 8 }
    collectgarbage("collect")
    local base = live()
    local acc = 0
    for i = 1, 20000 do
      local y = (x:add(w) * x):relu()
      if i % 1000 == 0 then acc = acc + y:numel() end
    end
    assert.equal(20 * 8, acc)
    collectgarbage("collect")
    -- nothing of the loop's 20,000 temporaries is left (each step's are 3 tensors of 32
    -- bytes and their graph). At most base: in CI this file shares its process with the
    -- earlier spec files, whose leftovers may be freed meanwhile (once 816 bytes below base)
    local now = live()
    assert(now <= base, ("%d bytes live after the loop, %d before"):format(now, base))
  end)

  it("keeps a tensor alive while a gradient or a graph refers to it", function()
    collectgarbage("collect")
    local x = dl.tensor({ 1, 2, 3 }, { requires_grad = true })
    local y = (x * x):sum()
    for _ = 1, 3000 do local _ = dl.zeros { 4 } end -- garbage: several collections
    collectgarbage("collect")
    y:backward()
    assert.same({ 2, 4, 6 }, x.grad:tolist())
    local g = x.grad
    x = nil
    collectgarbage("collect")
    assert.same({ 2, 4, 6 }, g:tolist()) -- the gradient's own handle keeps it
  end)

  it("releases the tensors still referenced when the Lua state closes", function()
    -- A child LuaJIT keeps a tensor over memory whose deleter removes a file (remove(3)
    -- takes the path, the first argument a deleter gets) until its state closes.
    local dir = files.tmpdir("registry")
    finally(function() files.remove(dir) end)
    local marker = dir .. "/marker"
    assert(io.open(marker, "w")):close()
    local script = dir .. "/child.lua"
    local f = assert(io.open(script, "w"))
    f:write(([[
      local lib = require "ddplua.lib"
      local ffi = lib.ffi
      ffi.cdef "int remove(const char *path);"
      local path = ffi.new("char[?]", 256, %q)
      local shape = ffi.new("int64_t[1]", 1)
      local box = ffi.new("ddp_tensor*[1]")
      lib.check(lib.C.ddp_tensor_from_blob(box, path, 1, shape, nil, lib.C.DDP_U8,
        ffi.cast("ddp_deleter_fn", ffi.C.remove), nil))
      KEEP = { lib.wrap(box[0]), path }
      local f = io.open(%q, "r")
      print(f and "present" or "missing")
      if f then f:close() end
    ]]):format(marker, marker))
    f:close()
    local status, out = files.run(("DDPLUA_LIB=%s luajit -e 'package.path = %q .. package.path' %s")
      :format(files.quote(lib.lib_path), "lua/?.lua;lua/?/init.lua;build/lua/?.lua;", files.quote(script)))
    assert.equal(0, status, out)
    assert.matches("present", out) -- still referenced while the script ran
    assert.is_nil(io.open(marker, "r")) -- released at lua_close
  end)
end)
