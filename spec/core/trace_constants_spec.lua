-- Specs for Note [traces keep closures] (ddplua/lib.lua): what a compiled LuaJIT trace keeps
-- alive. Each case runs in a fresh process (files.run_fresh): a trace keeps a closure only
-- when it is the first of its prototype, so the library's code must not have run before.
-- Every case drops what it made, collects, and prints the live bytes left over the start.
local files = require "files"

-- The live bytes the fresh process printed as "left N".
local function left(out)
  local n = tonumber(out:match("left%s+(%-?%d+)"))
  assert(n, out)
  return n
end

describe("compiled traces and dropped tensors", function()
  it("a dropped model whose named_parameters() a compiled loop iterated is freed by a collection", function()
    local out = files.run_fresh("trace-model", [[
      local dl = require "ddplua"
      dl.empty_cache()
      local base = dl.memory_stats().live
      do
        local layers = {}
        for i = 1, 200 do layers[i] = dl.nn.Linear(4, 4) end
        local m = dl.nn.Sequential(unpack(layers))
        local n = 0
        for _, p in m:named_parameters() do n = n + p:numel() end
        local d = dl.nn.ModuleDict { a = dl.nn.Linear(3, 3), b = dl.nn.Linear(3, 3) }
        for _ = 1, 100 do for _, mod in d:items() do n = n + mod.weight:numel() end end
        print("numel", n)
      end
      collectgarbage()
      print("left", dl.memory_stats().live - base)
    ]])
    assert.truthy(out:find("numel%s+5800"), out)
    -- the model held 41,600 bytes while the trace of the loop kept its iterator
    assert.are.equal(0, left(out))
  end)

  for _, case in ipairs {
    { "a TensorDataset batched in C", "data.TensorDataset(dl.randn({4000, 64}), dl.randint(0, 10, {4000}))", 0 },
    { "a Lua dataset batched in Lua", "object.new(Rows, { x = dl.randn({4000, 64}) })", 0 },
    { "a Lua dataset with 2 workers", "object.new(Rows, { x = dl.randn({4000, 64}) })", 2 },
    -- its iter() returns the script's own closure, which a trace keeps with the dataset
    -- until dl.empty_cache() flushes the traces
    { "an IterableDataset", "data.IterableDataset(Stream, { x = dl.randn({4000, 64}) })", 0, "dl.empty_cache()" },
  } do
    local release = case[4] or "collectgarbage()"
    it("a dropped DataLoader and its dataset (" .. case[1] .. ") are freed by " .. release .. " after an epoch", function()
      local out = files.run_fresh("trace-loader", ([[
        local dl = require "ddplua"
        local data = require "ddplua.data"
        local object = require "ddplua.data.object"
        Rows = { name = "Rows" }
        function Rows.len(self) return self.x:size(1) end
        function Rows.get(self, i) return self.x:select(1, i) end
        Stream = { name = "Stream" }
        function Stream.iter(self)
          local i = 0
          return function()
            i = i + 1
            if i <= self.x:size(1) then return self.x:select(1, i) end
          end
        end
        dl.empty_cache()
        local base = dl.memory_stats().live
        do
          local ds = %s
          local loader = data.DataLoader(ds, { batch_size = 16, num_workers = %d })
          local n = 0
          for x in loader:iter() do n = n + x:size(1) end
          print("samples", n)
        end
        %s
        print("left", dl.memory_stats().live - base)
      ]]):format(case[2], case[3], release))
      assert.truthy(out:find("samples%s+4000"), out)
      -- the TensorDataset's 1,056,000 bytes stayed while a trace kept the epoch's iterator
      assert.are.equal(0, left(out))
    end)
  end

  it("dl.empty_cache() frees what a script's own closure left in a compiled trace", function()
    local out = files.run_fresh("trace-closure", [[
      local dl = require "ddplua"
      dl.empty_cache()
      local base = dl.memory_stats().live
      do
        local t = dl.randn({1000})
        local function scale(k) return k * t:size(1) end -- the only closure of its prototype
        local s = 0
        for k = 1, 1000 do s = s + scale(k) end
        print("sum", s)
      end
      collectgarbage()
      print("kept", dl.memory_stats().live - base)
      dl.empty_cache()
      print("left", dl.memory_stats().live - base)
    ]])
    -- the case is what it says: a collection alone left the tensor, which the trace kept
    assert.are.equal(4000, tonumber(out:match("kept%s+(%-?%d+)")), out)
    assert.are.equal(0, left(out))
  end)
end)
