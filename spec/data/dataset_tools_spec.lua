-- Specs for the dataset tools of ddplua.data: random_split (lengths against PyTorch 1.13's
-- random_split, indices against randperm of the same generator), ConcatDataset (against
-- Python's indexing rules), IterableDataset (sharding over ranks and workers, the
-- DataLoader over a stream) and get_worker_info.
local dl = require "ddplua"
local data = require "ddplua.data"
local worker_info = require "ddplua.data.worker_info"
local pytorch = require "pytorch"

-- A dataset whose sample i is the number i - 1 (its 0-based index), as a Lua class.
local Range = {}
function Range.len(self) return self.n end
function Range.get(self, i)
  if i < 1 or i > self.n then error("Range: index " .. i .. " out of range") end
  return self.base + i - 1
end
local function range(n, base) return data.Dataset(Range, { n = n, base = base or 0 }) end

local function values(ds)
  local out = {}
  for i = 1, #ds do out[i] = ds:get(i) end
  return out
end

describe("data.random_split", function()
  local cases = {
    { 10, { 0.5, 0.5 } }, { 10, { 0.3, 0.3, 0.4 } }, { 7, { 0.25, 0.25, 0.25, 0.25 } },
    { 5, { 0.1, 0.9 } }, { 11, { 3, 8 } }, { 3, { 0.2, 0.2, 0.2, 0.2, 0.2 } }, { 100, { 1 / 3, 1 / 3, 1 / 3 } },
  }

  it("gives PyTorch's subset lengths for counts and fractions (the remainder round-robin)", function()
    local lines = {}
    for i, c in ipairs(cases) do
      local ls = {}
      for k, v in ipairs(c[2]) do ls[k] = ("%.17g"):format(v) end
      lines[i] = ("[%d, [%s]]"):format(c[1], table.concat(ls, ", "))
    end
    local ref, why = pytorch.run(([[
from torch.utils.data import random_split
cases = [%s]
print(json.dumps([[len(s) for s in random_split(range(n), ls, generator=torch.Generator().manual_seed(0))] for n, ls in cases]))
]]):format(table.concat(lines, ", ")))
    if not ref then return pending(why) end
    for i, c in ipairs(cases) do
      local parts = data.random_split(range(c[1]), c[2], dl.Generator(0))
      local got = {}
      for k, p in ipairs(parts) do got[k] = #p end
      assert.are.same(ref[i], got, ("case %d: n = %d, lengths {%s}"):format(i, c[1], table.concat(c[2], ", ")))
    end
  end)

  it("splits randperm(n) of the generator into consecutive slices (disjoint, covering the dataset)", function()
    local ds = range(23, 100)
    local parts = data.random_split(ds, { 0.6, 0.3, 0.1 }, dl.Generator(42))
    local perm = dl.randperm(23, { generator = dl.Generator(42) })
    local seen, at = {}, 0
    for _, p in ipairs(parts) do
      for _, v in ipairs(values(p)) do
        at = at + 1
        assert.are.equal(100 + perm:get(at), v)
        assert.is_nil(seen[v])
        seen[v] = true
      end
    end
    assert.are.equal(23, at)
    -- the same seed gives the same split; another seed another one
    local again = data.random_split(ds, { 0.6, 0.3, 0.1 }, dl.Generator(42))
    assert.are.same(values(parts[1]), values(again[1]))
    assert.are_not.same(values(parts[1]), values(data.random_split(ds, { 0.6, 0.3, 0.1 }, dl.Generator(7))[1]))
  end)

  it("raises PyTorch's errors for bad lengths", function()
    local ds = range(10)
    assert.has_error(function() data.random_split(ds, { 3, 4 }) end,
      "random_split: Sum of input lengths does not equal the length of the input dataset! (3, 4 sum to 7, the dataset has 10 samples)")
    assert.error_matches(function() data.random_split(ds, { 1.5, -0.5 }) end, "Fraction at index 0 is not between 0 and 1")
    assert.error_matches(function() data.random_split(ds, { 2.5, 7.5 }) end, "lengths%[1%] = 2.5 is not a count")
    assert.error_matches(function() data.random_split(ds, {}) end, "non%-empty list")
  end)

  it("gives empty subsets for zero lengths", function()
    local parts = data.random_split(range(2), { 0.1, 0.1, 0.8 }, dl.Generator(1))
    local lens = {}
    for k, p in ipairs(parts) do lens[k] = #p end
    assert.are.same({ 1, 0, 1 }, lens)
  end)
end)

describe("data.ConcatDataset", function()
  it("indexes the datasets one after another, negative indices from the end", function()
    local a, b, c = range(3, 0), range(0, 50), range(4, 10)
    local ds = data.ConcatDataset { a, b, c }
    assert.are.same({ 3, 3, 7 }, ds.cumulative_sizes)
    assert.are.equal(7, #ds)
    assert.are.same({ 0, 1, 2, 10, 11, 12, 13 }, values(ds))
    -- Python's ds[-k] is ds[len - k]; here get(-k) is get(len + 1 - k)
    for k = 1, 7 do assert.are.equal(ds:get(8 - k), ds:get(-k)) end
    local k, j = ds:locate(4)
    assert.are.same({ 3, 1 }, { k, j })
  end)

  it("raises for an empty list, an iterable dataset and out-of-range indices", function()
    assert.error_matches(function() data.ConcatDataset {} end, "datasets should not be an empty iterable")
    local S = { iter = function() return function() end end }
    assert.error_matches(function() data.ConcatDataset { range(2), data.IterableDataset(S) } end,
      "does not support IterableDataset %(datasets%[2%]%)")
    local ds = data.ConcatDataset { range(2), range(3) }
    assert.error_matches(function() ds:get(-6) end, "absolute value of index should not exceed dataset length")
    assert.error_matches(function() ds:get(6) end, "index 6 out of range 1..5")
    assert.error_matches(function() ds:get(0) end, "index 0 out of range")
  end)

  it("batches through a DataLoader", function()
    local ds = data.ConcatDataset { range(3, 0), range(2, 100) }
    local got = {}
    for x in data.DataLoader(ds, { batch_size = 2 }):iter() do
      for i = 1, x:size(1) do got[#got + 1] = x:get(i) end
    end
    assert.are.same({ 0, 1, 2, 100, 101 }, got)
  end)
end)

describe("data.IterableDataset", function()
  -- A stream of the numbers 0 .. n-1 with their squares.
  local Squares = { name = "Squares" }
  function Squares.iter(self)
    local i = -1
    return function()
      i = i + 1
      if i < self.n then return i, i * i end
    end
  end

  local function drain(ds)
    local xs = {}
    local f = ds:stream()
    while true do
      local x, y = f()
      if x == nil then break end
      assert.are.equal(x * x, y)
      xs[#xs + 1] = x
    end
    return xs
  end

  after_each(function() worker_info.set_worker_info(nil) end)

  it("get_worker_info() is nil in the main process", function()
    assert.is_nil(data.get_worker_info())
  end)

  it("shards the stream over ranks and workers: every sample once, round-robin", function()
    local n, world, workers = 23, 3, 2
    local count = {}
    for rank = 0, world - 1 do
      for id = 0, workers - 1 do
        worker_info.set_worker_info { id = id, num_workers = workers }
        local ds = data.IterableDataset(Squares, { n = n }, { num_replicas = world, rank = rank })
        local shard, shards = ds:shard_info()
        assert.are.same({ rank * workers + id, world * workers }, { shard, shards })
        for _, x in ipairs(drain(ds)) do
          assert.are.equal(shard, x % shards)
          count[x] = (count[x] or 0) + 1
        end
      end
    end
    for x = 0, n - 1 do assert.are.equal(1, count[x], "sample " .. x) end
  end)

  it("reads the whole stream in every copy with shard = false (PyTorch's default)", function()
    worker_info.set_worker_info { id = 1, num_workers = 2 }
    local ds = data.IterableDataset(Squares, { n = 5 }, { shard = false, num_replicas = 2, rank = 1 })
    assert.are.same({ 0, 1, 2, 3, 4 }, drain(ds))
  end)

  it("takes the rank from WORLD_SIZE / RANK when no process group is up", function()
    local ds = data.IterableDataset(Squares, { n = 4 })
    local shard, shards = ds:shard_info()
    assert.are.equal(tonumber(os.getenv("WORLD_SIZE") or "1"), shards)
    assert.are.equal(tonumber(os.getenv("RANK") or "0"), shard)
  end)

  it("is batched by a DataLoader in stream order, with drop_last", function()
    local ds = data.IterableDataset(Squares, { n = 7 }, { num_replicas = 1, rank = 0 })
    local xs, sizes = {}, {}
    for x, y in data.DataLoader(ds, { batch_size = 3 }):iter() do
      sizes[#sizes + 1] = x:size(1)
      for i = 1, x:size(1) do
        xs[#xs + 1] = x:get(i)
        assert.are.equal(x:get(i) ^ 2, y:get(i))
      end
    end
    assert.are.same({ 3, 3, 1 }, sizes)
    assert.are.same({ 0, 1, 2, 3, 4, 5, 6 }, xs)
    local n = 0
    for _ in data.DataLoader(ds, { batch_size = 3, drop_last = true }):iter() do n = n + 1 end
    assert.are.equal(2, n)
  end)

  it("refuses shuffle, a sampler, indexing and len() without a class len", function()
    local ds = data.IterableDataset(Squares, { n = 3 })
    assert.has_error(function() data.DataLoader(ds, { shuffle = true }) end,
      "DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle=true")
    assert.error_matches(function() ds:get(1) end, "cannot be indexed")
    assert.error_matches(function() return #ds end, "has no len%(%)")
    assert.error_matches(function() data.IterableDataset({}) end, "class must have an iter")
    assert.error_matches(function() data.IterableDataset(Squares, {}, { shards = 2 }) end, "unknown option 'shards'")
  end)
end)
