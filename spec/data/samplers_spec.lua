-- Specs for PyTorch's samplers (lua/ddplua/data/samplers.lua): each one's indices against
-- its definition (orders, counts, frequencies within 5 standard deviations of what the
-- weights give), reproducibility from a seed, PyTorch's argument errors, and the DataLoader
-- reading them with and without workers.
local dl = require "ddplua"
local data = require "ddplua.data"

local function sorted(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c
end

local function range(a, b)
  local t = {}
  for i = a, b do t[#t + 1] = i end
  return t
end

-- counts[i] of index i (0-based) in the list
local function counts(list, n)
  local c = {}
  for i = 0, n - 1 do c[i] = 0 end
  for _, v in ipairs(list) do c[v] = c[v] + 1 end
  return c
end

-- |count - m p| within 5 binomial standard deviations
local function near(count, m, p, what)
  local sd = math.sqrt(m * p * (1 - p))
  assert(math.abs(count - m * p) <= 5 * sd + 1e-9,
    ("%s: %d draws, expected %.1f +- %.1f"):format(what, count, m * p, 5 * sd))
end

local function raises(pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok)
  assert.matches(pattern, tostring(err), 1, true)
end

describe("samplers", function()
  local ds = data.TensorDataset(dl.arange(0, 10))

  it("SequentialSampler gives 0 .. n-1", function()
    local s = data.SequentialSampler(ds)
    assert.equal(10, #s)
    assert.same(range(0, 9), s:indices():tolist())
    assert.equal("i64", s:indices().dtype)
  end)

  it("RandomSampler draws whole permutations, or uniform indices with replacement", function()
    local s = data.RandomSampler(ds, { generator = dl.Generator(3) })
    assert.equal(10, #s)
    local a, b = s:indices():tolist(), s:indices():tolist()
    assert.same(range(0, 9), sorted(a))
    assert.same(range(0, 9), sorted(b))
    assert.are_not.same(a, b) -- drawn afresh at each call, that is each epoch
    assert.same(a, data.RandomSampler(ds, { generator = dl.Generator(3) }):indices():tolist())
    -- num_samples past n: permutations one after another, the last one cut
    local long = data.RandomSampler(ds, { num_samples = 25, generator = dl.Generator(4) }):indices():tolist()
    assert.equal(25, #long)
    assert.same(range(0, 9), sorted({ unpack(long, 1, 10) }))
    assert.same(range(0, 9), sorted({ unpack(long, 11, 20) }))
    local tail = sorted({ unpack(long, 21, 25) })
    for k = 2, 5 do assert.is_true(tail[k] > tail[k - 1]) end
    -- with replacement: independent uniform draws
    local m = 40000
    local with = data.RandomSampler(ds, { replacement = true, num_samples = m, generator = dl.Generator(5) })
    assert.equal(m, #with)
    local c = counts(with:indices():tolist(), 10)
    for i = 0, 9 do near(c[i], m, 0.1, "index " .. i) end
  end)

  it("SubsetRandomSampler permutes the given indices", function()
    local s = data.SubsetRandomSampler({ 1, 3, 5, 7 }, { generator = dl.Generator(1) })
    assert.equal(4, #s)
    local seen = {}
    for _ = 1, 20 do
      local idx = s:indices():tolist()
      assert.same({ 1, 3, 5, 7 }, sorted(idx))
      seen[table.concat(idx, ",")] = true
    end
    local orders = 0
    for _ in pairs(seen) do orders = orders + 1 end
    assert.is_true(orders > 5, orders .. " orders in 20 epochs")
    assert.same({ 2, 9 }, sorted(data.SubsetRandomSampler(dl.tensor({ 9, 2 }, { dtype = "i64" })):indices():tolist()))
    assert.same({}, data.SubsetRandomSampler({}):indices():tolist())
  end)

  it("WeightedRandomSampler draws in proportion to the weights, with replacement or without", function()
    local m = 40000
    local s = data.WeightedRandomSampler({ 0, 1, 0, 3 }, m, { generator = dl.Generator(2) })
    assert.equal(m, #s)
    local c = counts(s:indices():tolist(), 4)
    assert.equal(0, c[0])
    assert.equal(0, c[2])
    near(c[1], m, 0.25, "index 1")
    near(c[3], m, 0.75, "index 3")
    -- a weights tensor, not normalised
    local t = data.WeightedRandomSampler(dl.tensor { 2, 2, 4 }, m, { generator = dl.Generator(6) })
    c = counts(t:indices():tolist(), 3)
    near(c[0], m, 0.25, "tensor weights, index 0")
    near(c[2], m, 0.5, "tensor weights, index 2")
    -- without replacement: distinct indices among the non-zero weights; the first draw in
    -- proportion to the weights, the second among those left (P(second = 3 | first = 2)
    -- = 4 / 7 for weights 1, 2, 3, 4)
    local w = data.WeightedRandomSampler({ 1, 2, 3, 4, 0 }, 4, { replacement = false, generator = dl.Generator(8) })
    local first, after2, second3 = counts({}, 5), 0, 0
    local trials = 6000
    for _ = 1, trials do
      local idx = w:indices():tolist()
      assert.same({ 0, 1, 2, 3 }, sorted(idx))
      first[idx[1]] = first[idx[1]] + 1
      if idx[1] == 2 then
        after2 = after2 + 1
        if idx[2] == 3 then second3 = second3 + 1 end
      end
    end
    for i = 0, 3 do near(first[i], trials, (i + 1) / 10, "first draw " .. i) end
    near(second3, after2, 4 / 7, "second draw 3 after 2")
  end)

  it("raises PyTorch's errors for bad arguments", function()
    raises("RandomSampler: num_samples should be a positive integer value, but got num_samples=0",
      data.RandomSampler, ds, { num_samples = 0 })
    raises("RandomSampler: num_samples should be a positive integer value, but got num_samples=0",
      data.RandomSampler, data.TensorDataset(dl.zeros { 0 }))
    raises("RandomSampler: replacement should be a boolean value, but got replacement=1",
      data.RandomSampler, ds, { replacement = 1 })
    raises("RandomSampler: unknown option 'replace'", data.RandomSampler, ds, { replace = true })
    raises("WeightedRandomSampler: num_samples should be a positive integer value, but got num_samples=2.5",
      data.WeightedRandomSampler, { 1, 2 }, 2.5)
    raises("WeightedRandomSampler: weights should be a 1d sequence but given weights have shape (2, 2)",
      data.WeightedRandomSampler, dl.ones { 2, 2 }, 3)
    raises("WeightedRandomSampler: invalid multinomial distribution (sum of probabilities <= 0)",
      data.WeightedRandomSampler, { 0, 0 }, 3)
    raises("WeightedRandomSampler: invalid multinomial distribution: weights[2] = -1",
      data.WeightedRandomSampler, { 1, -1 }, 3)
    raises("WeightedRandomSampler: invalid multinomial distribution: weights[1] = nan",
      data.WeightedRandomSampler, { 0 / 0 }, 3)
    raises("cannot sample num_samples = 3 > 2 non-zero weights without replacement",
      data.WeightedRandomSampler, { 0, 1, 0, 3 }, 3, { replacement = false })
    raises("SubsetRandomSampler: indices[2] = -1 is not a dataset index", data.SubsetRandomSampler, { 0, -1 })
    raises("SubsetRandomSampler: generator must be a dl.Generator", data.SubsetRandomSampler, { 0 }, { generator = 3 })
  end)

  it("feeds a DataLoader, the same batches with workers as without", function()
    local function epochs(nw)
      local sampler = data.WeightedRandomSampler({ 1, 0, 2, 0, 3, 0, 4, 0, 5, 6 }, 13, { generator = dl.Generator(9) })
      -- (a collate_fn takes a TensorDataset off the C path, so that workers are forked)
      local loader = data.DataLoader(data.TensorDataset(dl.arange(0, 10)), { batch_size = 4, sampler = sampler,
        num_workers = nw, collate_fn = nw > 0 and data.default_collate or nil })
      assert.equal(4, #loader)
      local out = {}
      for _ = 1, 2 do
        for x in loader:iter() do out[#out + 1] = table.concat(x:tolist(), ",") end
      end
      loader:close()
      return out
    end
    local plain = epochs(0)
    assert.equal(8, #plain)
    for _, b in ipairs(plain) do assert.is_nil(b:find("[1357]")) end -- zero weights never drawn
    assert.same(plain, epochs(2))
  end)

  it("BatchSampler groups a sampler's order, the last batch shorter unless drop_last", function()
    local b = data.BatchSampler(data.SequentialSampler(ds), 4, false)
    assert.equal(3, #b)
    assert.same({ { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9 } }, b:batches())
    local d = data.BatchSampler(data.SequentialSampler(ds), 4, true)
    assert.equal(2, #d)
    assert.same({ { 0, 1, 2, 3 }, { 4, 5, 6, 7 } }, d:batches())
    assert.same({ { 5, 1 }, { 3 } }, data.BatchSampler({ 5, 1, 3 }, 2, false):batches())
    -- a random sampler is drawn once per epoch: every index once, a new order each time
    local r = data.BatchSampler(data.RandomSampler(ds, { generator = dl.Generator(2) }), 3, false)
    local e1, e2 = {}, {}
    for _, batch in ipairs(r:batches()) do for _, v in ipairs(batch) do e1[#e1 + 1] = v end end
    for _, batch in ipairs(r:batches()) do for _, v in ipairs(batch) do e2[#e2 + 1] = v end end
    assert.same(range(0, 9), sorted(e1))
    assert.same(range(0, 9), sorted(e2))
    assert.are_not.same(e1, e2)
    raises("BatchSampler: batch_size should be a positive integer value, but got batch_size=0",
      data.BatchSampler, { 1 }, 0, false)
    raises("BatchSampler: drop_last should be a boolean value, but got drop_last=nil", data.BatchSampler, { 1 }, 2)
    raises("BatchSampler: sampler[2] = 1.5 is not a dataset index", data.BatchSampler, { 1, 1.5 }, 2, false)
  end)

  it("DataLoader batch_sampler: batches of any sizes, the same with workers, persistent ones included", function()
    -- buckets of similar lengths, as for text: the sizes differ from batch to batch and from
    -- epoch to epoch (the second epoch's largest batch is larger than the first's)
    local Buckets = { name = "Buckets", epoch = 0 }
    function Buckets.batches(self)
      self.epoch = self.epoch + 1
      if self.epoch % 2 == 1 then return { { 0, 1, 2 }, { 9 }, dl.tensor({ 4, 5 }, { dtype = "i64" }) } end
      return { { 3, 4, 5, 6, 7, 8, 9 }, { 0, 0 } }
    end
    local pairs_ds = data.TensorDataset(dl.arange(0, 10), dl.arange(0, 10):mul(2))
    local function epochs(nw, persistent)
      local bsm = setmetatable({ epoch = 0 }, { __index = Buckets })
      local loader = data.DataLoader(pairs_ds, { batch_sampler = bsm, num_workers = nw,
        persistent_workers = persistent or nil })
      assert.is_nil(loader.batch_size)
      local out = {}
      for _ = 1, 3 do
        for x, y in loader:iter() do out[#out + 1] = table.concat(x:tolist(), ",") .. "|" .. table.concat(y:tolist(), ",") end
      end
      loader:close()
      return out
    end
    local plain = epochs(0)
    assert.same({ "0,1,2|0,2,4", "9|18", "4,5|8,10", "3,4,5,6,7,8,9|6,8,10,12,14,16,18", "0,0|0,0",
      "0,1,2|0,2,4", "9|18", "4,5|8,10" }, plain)
    assert.same(plain, epochs(2))
    assert.same(plain, epochs(2, true))
    -- #loader: the batch_sampler's len(), else its count of batches
    assert.equal(3, #data.DataLoader(ds, { batch_sampler = setmetatable({ epoch = 0 }, { __index = Buckets }) }))
    assert.equal(3, #data.DataLoader(ds, { batch_sampler = data.BatchSampler(data.SequentialSampler(ds), 4, false) }))
    local seen = {}
    for x in data.DataLoader(ds, { batch_sampler = data.BatchSampler(data.RandomSampler(ds), 3, false),
      num_workers = 2 }):iter() do
      for _, v in ipairs(x:tolist()) do seen[#seen + 1] = v end
    end
    assert.same(range(0, 9), sorted(seen))
  end)

  it("DataLoader batch_sampler: PyTorch's exclusions, and a bad batch named", function()
    local b = data.BatchSampler(data.SequentialSampler(ds), 4, false)
    for _, extra in ipairs { { batch_size = 4 }, { shuffle = true }, { sampler = data.SequentialSampler(ds) },
      { drop_last = true } } do
      extra.batch_sampler = b
      raises("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last",
        data.DataLoader, ds, extra)
    end
    raises("DataLoader: batch_sampler must have a batches() method", data.DataLoader, ds, { batch_sampler = {} })
    local function batches_of(list)
      return function()
        for _ in data.DataLoader(ds, { batch_sampler = { batches = function() return list end } }):iter() do end
      end
    end
    raises("DataLoader: batch_sampler index 10 at position 2 of batch 2 is out of range 0..9", batches_of { { 1 }, { 2, 10 } })
    raises("DataLoader: batch_sampler batch 1 has no index", batches_of { {} })
    raises("DataLoader: batch_sampler batch 2 is a number, not a list of indices", batches_of { { 1 }, 3 })
    local Stream = { name = "Stream" }
    function Stream.iter() return function() end end
    raises("DataLoader with IterableDataset: expected unspecified batch_sampler option",
      data.DataLoader, data.IterableDataset(Stream, {}), { batch_sampler = b })
  end)

  it("DataLoader checks a sampler's tensor indices against the dataset", function()
    local bad = { indices = function() return dl.tensor({ 1, 10 }, { dtype = "i64" }) end }
    raises("DataLoader: sampler index 10 is out of range 0..9 (indices count from 0)", function()
      for _ in data.DataLoader(ds, { batch_size = 4, sampler = bad }):iter() do end
    end)
    local negative = { indices = function() return dl.tensor({ -1, 2 }, { dtype = "i64" }) end }
    raises("DataLoader: sampler index -1 is out of range 0..9", function()
      for _ in data.DataLoader(ds, { batch_size = 4, sampler = negative }):iter() do end
    end)
  end)
end)
