-- Specs for the CPU block cache (Note [block cache] in runtime/core/alloc.c): cached page
-- ranges are handed out exactly (a recently freed block of the size in its place first), carved,
-- merged back and, past the most that was ever live, moved together; a loop allocating the
-- same sizes gets the same blocks back every iteration; whatever the order of allocations
-- and frees, live blocks never overlap and keep their contents.
local dl = require "ddplua"
local files = require "files"
local ffi = require "ffi"
local C = require("ddplua.lib").C

local MiB = 2 ^ 20

local function cached() return dl.memory_stats().cached end

-- A u8 tensor of n bytes (its storage is one large block) filled with v.
local function block(n, v) return dl.full({ n }, v, { dtype = "u8" }) end

-- true when every byte of t equals v (read in place: no allocation that would use the cache).
local function holds(t, v)
  local p = ffi.cast("const uint8_t *", C.ddp_tensor_data(t))
  for i = 0, t:numel() - 1 do
    if p[i] ~= v then return false end
  end
  return true
end

-- The address of t's data, as a number (for comparing which block a tensor got).
local function address(t) return tonumber(ffi.cast("uintptr_t", C.ddp_tensor_data(t))) end

-- Run `code` in a fresh ddplua process (its own allocator state) and return its stdout.
local function run_fresh(code) return files.run_fresh("alloc_cache", code) end

describe("CPU block cache", function()
  before_each(function()
    collectgarbage()
    dl.empty_cache()
  end)

  it("hands a freed range out again: exactly, carved from a larger one, merged back", function()
    local a = block(4 * MiB, 1)
    a:free()
    assert.are.equal(4 * MiB, cached())
    local b = block(MiB, 2) -- the head of the 4 MiB range: no new mapping
    assert.are.equal(3 * MiB, cached())
    assert.is_true(holds(b, 2))
    local c = block(MiB + 1, 3) -- rounded up to whole pages, carved from the tail
    assert.are.equal(2 * MiB - 4096, cached())
    b:free()
    c:free() -- merges with both neighbours: one 4 MiB range again
    assert.are.equal(4 * MiB, cached())
    local d = block(4 * MiB, 4)
    assert.are.equal(0, cached())
    assert.is_true(holds(d, 4))
    d:free()
    dl.empty_cache()
    assert.are.equal(0, cached())
  end)

  it("hands a freed block of the requested size back whole before carving a merged range", function()
    -- a and b are carved from one range, side by side, then freed: a request of b's size gets
    -- b's block itself, not the head of the range they would merge back into
    local whole = block(3 * MiB, 1)
    whole:free()
    local a = block(MiB, 2)
    local b = block(2 * MiB, 3)
    local a_at, b_at = address(a), address(b)
    b:free()
    a:free()
    local c = block(2 * MiB, 4)
    assert.are.equal(b_at, address(c))
    local d = block(MiB, 5)
    assert.are.equal(a_at, address(d))
    assert.are.equal(0, cached())
    c:free()
    d:free()
  end)

  it("gives a training-like loop the same blocks every iteration", function()
    -- each iteration: activations made in order, a gradient while they are live, a temporary
    -- of a size no other buffer has, frees in the order a backward makes them. Every block
    -- a buffer gets must be one of the blocks its size had: as many distinct addresses per
    -- size as buffers of that size live at once (warm pages, nothing carved afresh)
    local sizes = { 800 * 1024, 200 * 1024, 64 * 1024, 256 * 1024, 100 * 1024 + 7 }
    local seen = {} -- size -> { address -> true }
    local function note(t, n)
      seen[n] = seen[n] or {}
      seen[n][address(t)] = true
    end
    for _ = 1, 8 do
      local acts = {}
      for i, n in ipairs(sizes) do
        acts[i] = block(n, i)
        note(acts[i], n)
      end
      local grad = block(sizes[1], 9) -- the first layer's weight gradient
      note(grad, sizes[1])
      for i = #sizes, 1, -1 do
        acts[i]:free()
        if i == 3 then
          local n = sizes[2] + sizes[3]
          local tmp = block(n, 7)
          note(tmp, n)
          tmp:free()
        end
      end
      grad:free()
    end
    local buffers = { [sizes[1]] = 2 } -- two live 800 KiB buffers; one of each other size
    for n, addresses in pairs(seen) do
      local count = 0
      for _ in pairs(addresses) do count = count + 1 end
      assert.are.equal(buffers[n] or 1, count, ("size %d: distinct blocks"):format(n))
    end
  end)

  it("keeps live blocks apart and their contents intact through random allocations and frees", function()
    local state = 12345
    local function rand(n) -- deterministic LCG, 1 .. n
      state = (state * 1103515245 + 12345) % 2147483648
      return state % n + 1
    end
    local live = {}
    for step = 1, 400 do
      if #live > 0 and rand(3) == 1 then
        local i = rand(#live)
        local e = table.remove(live, i)
        assert.is_true(holds(e.t, e.v), "block of step " .. e.step .. " was overwritten")
        e.t:free()
      else
        -- 64 KiB .. ~3 MiB, odd sizes included, so ranges are carved and merged unevenly
        local n = 65536 + rand(3 * 1024 * 1024) - 1
        local v = step % 251 + 1
        live[#live + 1] = { t = block(n, v), v = v, step = step }
      end
    end
    for _, e in ipairs(live) do
      assert.is_true(holds(e.t, e.v), "block of step " .. e.step .. " was overwritten")
      e.t:free()
    end
  end)

  it("keeps blocks apart and intact when more are freed than it remembers", function()
    -- 1100 blocks, more than the cache's table and its list of recently freed blocks hold:
    -- neighbours merge or the oldest go; then blocks of other sizes are carved from what
    -- stayed, and all keep their bytes
    local first = {}
    for i = 1, 1100 do first[i] = block(65536, i % 251 + 1) end
    for i = 1, 1100, 2 do first[i]:free() end
    for i = 2, 1100, 2 do first[i]:free() end
    assert.is_true(cached() <= 1100 * 65536)
    local second = {}
    for i = 1, 300 do
      second[i] = { t = block(65536 * (i % 3 + 1) + 4096, i % 251 + 1), v = i % 251 + 1 }
    end
    for i, e in ipairs(second) do
      assert.is_true(holds(e.t, e.v), "block " .. i .. " was overwritten")
    end
    for _, e in ipairs(second) do e.t:free() end
  end)

  it("moves cached ranges into one block rather than map anew past the most ever live", function()
    -- fresh process: the mark is what this script had live, not what earlier specs had
    local out = run_fresh([[
      local dl = require "ddplua"
      local MiB = 2 ^ 20
      local a = dl.full({ 2 * MiB }, 1, { dtype = "u8" })
      local spacer = dl.full({ MiB }, 2, { dtype = "u8" }) -- keeps a and c apart
      local c = dl.full({ 2 * MiB }, 3, { dtype = "u8" })
      a:free(); c:free()
      local before = dl.memory_stats().cached
      -- 4 MiB: no range that large, and new pages would pass the most ever live (5 MiB)
      local d = dl.full({ 4 * MiB }, 7, { dtype = "u8" })
      local after = dl.memory_stats().cached
      local ok = d:sum():item() == 7 * 4 * MiB and d:min():item() == 7 and spacer:sum():item() == 2 * MiB
      print(("before=%d after=%d ok=%s"):format(before, after, tostring(ok)))
    ]])
    assert.matches("before=4194304 after=0 ok=true", out, 1, true)
  end)

  it("gives back the small blocks another thread made once they pile up unused", function()
    -- Note [block list trim]: the loader's prefetch thread makes each batch's tensor headers
    -- and storages, the main thread frees them; malloc's in-use bytes must not keep growing
    -- with the batches (they grew ~0.5 KB per batch here before the trim).
    local out = run_fresh([[
      local dl = require "ddplua"
      local data = require "ddplua.data"
      local ffi = require "ffi"
      ffi.cdef [=[
        struct spec_mallinfo2 { size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks,
          uordblks, fordblks, keepcost; };
        struct spec_mallinfo2 mallinfo2(void);
      ]=]
      local n = 20000
      local ds = data.TensorDataset(dl.randn({ n, 4 }), dl.arange(0, n, 1, { dtype = "i64" }))
      local loader = data.DataLoader(ds, { batch_size = 2, prefetch = 2 })
      local in_use = {}
      for epoch = 1, 4 do
        local seen = 0
        for x, y in loader:iter() do seen = seen + y:numel() end
        assert(seen == n)
        collectgarbage()
        in_use[epoch] = tonumber(ffi.C.mallinfo2().uordblks)
      end
      print(("growth=%d"):format(in_use[4] - in_use[1]))
    ]])
    local growth = tonumber(out:match("growth=(%-?%d+)"))
    assert.is_not_nil(growth, out)
    -- 30 000 batches after the first epoch: without the trim ~15 MB, with it a few trims' worth
    assert.is_true(growth < 2 * MiB, ("malloc in use grew by %d bytes over 3 epochs"):format(growth))
  end)
end)
