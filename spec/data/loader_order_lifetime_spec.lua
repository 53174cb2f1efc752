-- Spec for the DataLoader's Lua path keeping the epoch's order alive: the iterator reads
-- the order tensor (a sampler's indices, or the shuffle's randperm) through a raw pointer,
-- so the tensor must live as long as the iterator (a collection between batches freed it,
-- and batches read indices from freed memory: "index 7.03e+18 out of range").
local dl = require "ddplua"
local data = require "ddplua.data"

local Range = {}
function Range.len(self) return self.n end
function Range.get(self, i) return i - 1 end

describe("DataLoader (Lua path)", function()
  it("keeps the epoch's order alive while the iterator runs", function()
    local ds = data.Dataset(Range, { n = 64 })
    local loader = data.DataLoader(ds, { batch_size = 4, shuffle = true, generator = dl.Generator(3) })
    local seen = {}
    for x in loader:iter() do
      collectgarbage() -- what a long step may do between batches (Note [step lifetimes])
      collectgarbage()
      local keep = {}
      for k = 1, 50 do keep[k] = dl.full({ 128 }, 7e9) end -- take the freed blocks (512 bytes, as the order)
      for i = 1, x:size(1) do
        local v = x:get(i)
        assert.is_true(v >= 0 and v < 64, "index " .. v)
        assert.is_nil(seen[v])
        seen[v] = true
      end
    end
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.are.equal(64, n)
  end)
end)
