-- Specs for DataLoader worker processes (num_workers > 0, Note [dataloader workers] in
-- lua/ddplua/data/dataloader_workers.lua): the same batches in the same order for every
-- num_workers, worker_init_fn and get_worker_info inside the workers, a worker's error
-- naming its sample index and batch with its traceback, a worker killed by SIGKILL
-- reported within the timeout, a silent worker timing out, persistent workers reused
-- across epochs, and nothing left behind (processes, descriptors, /dev/shm) after close or
-- collection. The workers are forked processes: tiny datasets, a few seconds in all.
local dl = require "ddplua"
local data = require "ddplua.data"
local files = require "files"
local object = require "ddplua.data.object"
local dlos = require "ddplua.os"
local lib = require "ddplua.lib"
local ffi = lib.ffi

for _, decl in ipairs { "int getpid(void);", "int kill(int pid, int sig);" } do
  pcall(ffi.cdef, decl) -- one at a time: another spec may have declared some already
end
local SIGKILL = 9

-- The pids of this process's children that are not zombies, and those that are (the
-- workers: anything but the `ls` listing /proc).
local function children()
  local me = ffi.C.getpid()
  local live, zombies = {}, {}
  local p = io.popen("ls /proc")
  for name in p:lines() do
    if name:match("^%d+$") then
      local f = io.open("/proc/" .. name .. "/stat")
      local stat = f and f:read("*a")
      if f then f:close() end
      -- pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'
      local comm, state, ppid
      if stat then comm, state, ppid = stat:match("%((.*)%) (%S) (%d+)") end
      -- (the `ls` reading /proc, and its shell, are children too)
      if ppid and tonumber(ppid) == me and comm ~= "ls" and comm ~= "sh" then
        if state == "Z" then zombies[#zombies + 1] = tonumber(name) else live[#live + 1] = tonumber(name) end
      end
    end
  end
  p:close()
  return live, zombies
end

local function count_lines(cmd)
  local p = io.popen(cmd)
  local n = 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n
end
-- Sockets open here (the workers' channels are socketpairs; counting every descriptor
-- would count the pipe of the `ls` too, or not, as it races).
local function open_fds() return count_lines("ls -l /proc/" .. ffi.C.getpid() .. "/fd | grep socket:") end
-- Shared memory of the loader: memfds still open here, or names under /dev/shm (the
-- machine's other processes use /dev/shm too, so only names of ours count).
local function memfds() return count_lines("ls -l /proc/" .. ffi.C.getpid() .. "/fd | grep memfd:") end
local function shm_files() return count_lines("ls /dev/shm 2>/dev/null | grep -i -e dataloader -e ddplua-worker") end
-- The loader's shared-memory mappings in this process: {line = the /proc/self/maps line,
-- mode = the octal mode of the memfd behind it}.
local function shm_mappings()
  local out = {}
  local f = assert(io.open("/proc/" .. ffi.C.getpid() .. "/maps"))
  for line in f:lines() do
    if line:find("memfd:ddplua-dataloader", 1, true) then
      local range = line:match("^(%x+%-%x+)")
      local p = io.popen("stat -L -c %a /proc/" .. ffi.C.getpid() .. "/map_files/" .. range .. " 2>&1")
      out[#out + 1] = { line = line, mode = p:read("*l") }
      p:close()
    end
  end
  f:close()
  return out
end

-- A Lua dataset of n samples: sample i is (x (2) f32 = {i, -i} scaled, label i % 3), made
-- by ds:get (no c_sources, so the Lua path); `extra(i)` may add a third part or raise.
local Dataset = { name = "LuaDataset" }
function Dataset.len(self) return self.n end
function Dataset.get(self, i)
  if self.fail_at == i then error("sample " .. i .. " is corrupt") end
  if self.hang then while true do dlos.sleep(0.05) end end
  local x = dl.tensor({ i * 0.5, -i })
  if self.extra then return x, i % 3, self.extra(i) end
  return x, i % 3
end
local function dataset(n, fields)
  local state = fields or {}
  state.n = n
  return object.new(Dataset, state)
end

-- The address of tensor t's first element, as a number.
local function address(t) return tonumber(ffi.cast("uintptr_t", lib.C.ddp_tensor_data(t))) end

-- In a worker: 1 when the f32 at `addr` is mapped there and reads `mark` (a block of this
-- process's, as it left it), else 0.
local function inherited(addr, mark)
  local f = assert(io.open("/proc/" .. ffi.C.getpid() .. "/maps"))
  local mapped = false
  for line in f:lines() do
    local lo, hi = line:match("^(%x+)%-(%x+)")
    if tonumber(lo, 16) <= addr and addr < tonumber(hi, 16) then mapped = true end
  end
  f:close()
  return mapped and ffi.cast("float *", addr)[0] == mark and 1 or 0
end

-- One epoch of `loader`, checking that each batch's third part (a tensor) holds `expected`
-- (as tolist gives it); the number of batches.
local function third_parts_are(loader, expected)
  local n = 0
  for _, _, t in loader:iter() do
    assert.are.same(expected, t:tolist())
    n = n + 1
  end
  return n
end

-- Every batch of `epochs` epochs as a list of strings (values and dtypes), bit-exact.
local function epochs_of(loader, epochs)
  local out = {}
  for _ = 1, epochs do
    for x, y in loader:iter() do
      out[#out + 1] = table.concat(x:view(-1):tolist(), ",") .. "|" .. table.concat(y:tolist(), ",") .. "|" ..
        x.dtype .. y.dtype
    end
  end
  return out
end

describe("DataLoader workers", function()
  it("gives the same batches in the same order for num_workers 0, 1, 2, 3", function()
    local ds = dataset(41)
    local reference
    for _, nw in ipairs { 0, 1, 2, 3 } do
      for _, drop_last in ipairs { false, true } do
        local loader = data.DataLoader(ds, { batch_size = 4, shuffle = true, generator = dl.Generator(7),
          drop_last = drop_last, num_workers = nw })
        local got = epochs_of(loader, 3)
        loader:close()
        local key = tostring(drop_last)
        reference = reference or {}
        if not reference[key] then
          reference[key] = got
          assert.are.equal(drop_last and 30 or 33, #got) -- 3 epochs of 10 or 11 batches
        else
          assert.are.same(reference[key], got, ("num_workers = %d, drop_last = %s"):format(nw, key))
        end
      end
    end
    -- the epochs differ (the shuffle is drawn afresh), and the first batch is a real one
    assert.are_not.equal(reference["false"][1], reference["false"][12])
  end)

  it("runs collate_fn in the workers and brings back its tables, numbers and strings", function()
    local ds = dataset(10)
    local function collate(samples)
      local xs, names = {}, {}
      for k, s in ipairs(samples) do
        xs[k] = s[1]
        names[k] = "s" .. s[2]
      end
      return { x = dl.stack(xs), names = names, worker = data.get_worker_info() and data.get_worker_info().id or -1 },
        #samples
    end
    local function run(nw)
      local out = {}
      local loader = data.DataLoader(ds, { batch_size = 3, collate_fn = collate, num_workers = nw })
      for batch, count in loader:iter() do
        out[#out + 1] = { x = batch.x:view(-1):tolist(), names = batch.names, count = count, worker = batch.worker }
      end
      return out
    end
    local base, two = run(0), run(2)
    assert.are.equal(4, #two)
    for b = 1, 4 do
      assert.are.same(base[b].x, two[b].x)
      assert.are.same(base[b].names, two[b].names)
      assert.are.equal(base[b].count, two[b].count)
      assert.are.equal(-1, base[b].worker)
      assert.are.equal((b - 1) % 2, two[b].worker) -- batch b (from 0) by worker b % 2
    end
  end)

  it("collates samples that are tables, nested, as PyTorch's default_collate, alike for num_workers 0 and 2", function()
    -- what a PyTorch user's dataset returns: a dict of an image, a label, a name and a list
    local Dicts = { name = "Dicts" }
    function Dicts.len() return 7 end
    function Dicts.get(_, i)
      return { image = dl.full({ 2, 3 }, i), label = i % 3, name = "img" .. i,
        boxes = { dl.tensor({ i, i + 0.5 }), { weight = i / 4, keep = i % 2 == 0 } } }, i * 10
    end
    local ds = object.new(Dicts, {})
    local function run(nw)
      local out = {}
      for b, ids in data.DataLoader(ds, { batch_size = 3, num_workers = nw }):iter() do
        out[#out + 1] = {
          image = { b.image:size(), b.image.dtype, b.image:view(-1):tolist() },
          label = { b.label.dtype, b.label:tolist() }, name = b.name,
          box = { b.boxes[1]:size(), b.boxes[1]:tolist() },
          weight = { b.boxes[2].weight.dtype, b.boxes[2].weight:tolist() },
          keep = { b.boxes[2].keep.dtype, b.boxes[2].keep:tolist() },
          ids = ids:tolist(),
        }
      end
      return out
    end
    local base = run(0)
    assert.are.equal(3, #base)
    local first = base[1]
    assert.are.same({ { 3, 2, 3 }, "f32", { 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3 } }, first.image)
    assert.are.same({ "i64", { 1, 2, 0 } }, first.label)
    assert.are.same({ "img1", "img2", "img3" }, first.name)
    assert.are.same({ { 3, 2 }, { { 1, 1.5 }, { 2, 2.5 }, { 3, 3.5 } } }, first.box)
    assert.are.same({ "f64", { 0.25, 0.5, 0.75 } }, first.weight)
    assert.are.same({ "bool", { false, true, false } }, first.keep)
    assert.are.same({ 10, 20, 30 }, first.ids)
    assert.are.same({ "img7" }, base[3].name)
    assert.are.same(base, run(2))
    -- data.default_collate gives the same for a collate_fn
    local via = {}
    for b in data.DataLoader(ds, { batch_size = 3, num_workers = 2, collate_fn = function(samples)
      local dicts = {}
      for k, s in ipairs(samples) do dicts[k] = s[1] end
      return data.default_collate(dicts)
    end }):iter() do via[#via + 1] = b.boxes[1]:tolist() end
    assert.are.same(first.box[2], via[1])
  end)

  it("yields each sample as get returns it with batch_size = false (PyTorch's None), alike with workers", function()
    -- a dataset whose get makes a whole batch itself
    local Batches = { name = "Batches" }
    function Batches.len() return 5 end
    function Batches.get(_, i) return dl.full({ 2, 3 }, i), { id = i, name = "b" .. i } end
    local function run(nw, extra)
      local opts = { batch_size = false, num_workers = nw, shuffle = true, generator = dl.Generator(4) }
      for k, v in pairs(extra or {}) do opts[k] = v end
      local loader = data.DataLoader(object.new(Batches, {}), opts)
      assert.equal(5, #loader)
      assert.is_nil(loader.batch_size)
      local out = {}
      for x, meta in loader:iter() do
        out[#out + 1] = { x:size(), x:sum():item(), meta and meta.id, meta and meta.name }
      end
      loader:close()
      return out
    end
    local plain = run(0)
    assert.equal(5, #plain)
    local ids = {}
    for k, b in ipairs(plain) do
      assert.same({ 2, 3 }, b[1]) -- not stacked: the sample's own shape
      assert.equal(6 * b[3], b[2])
      assert.equal("b" .. b[3], b[4])
      ids[k] = b[3]
    end
    table.sort(ids)
    assert.same({ 1, 2, 3, 4, 5 }, ids)
    assert.same(plain, run(2))
    -- collate_fn receives each sample alone (the list of get's values here)
    local summed = run(2, { collate_fn = function(sample) return sample[1] * 2, sample[2] end })
    for k, b in ipairs(summed) do assert.equal(2 * plain[k][2], b[2]) end
    -- a dataset with C sources is read by get: one sample's tensors, 0-d here
    local got = {}
    for x, y in data.DataLoader(data.TensorDataset(dl.arange(0, 3), dl.arange(0, 3):mul(3)), { batch_size = false }):iter() do
      got[#got + 1] = { x:dim(), x:item(), y:item() }
    end
    assert.same({ { 0, 0, 0 }, { 0, 1, 3 }, { 0, 2, 6 } }, got)
    -- an iterable dataset's stream, sample by sample
    local Stream = { name = "Stream" }
    function Stream.iter()
      local i = 0
      return function()
        i = i + 1
        if i <= 3 then return dl.full({ 4 }, i), i end
      end
    end
    for _, nw in ipairs { 0, 1 } do
      local items = {}
      for x, i in data.DataLoader(data.IterableDataset(Stream, {}), { batch_size = false, num_workers = nw }):iter() do
        items[#items + 1] = { x:size(), x:sum():item(), i }
      end
      assert.same({ { { 4 }, 4, 1 }, { { 4 }, 8, 2 }, { { 4 }, 12, 3 } }, items, "num_workers = " .. nw)
    end
    local ok, err = pcall(data.DataLoader, object.new(Batches, {}), { batch_size = false, drop_last = true })
    assert.is_false(ok)
    assert.matches("batch_size=false (PyTorch's batch_size=None) option disables auto-batching and is mutually " ..
      "exclusive with drop_last", err, 1, true)
  end)

  it("names the place and the sample of a table that does not collate, with workers as without", function()
    local Bad = { name = "Bad" }
    function Bad.len() return 4 end
    function Bad.get(_, i)
      if i == 3 then return { x = dl.zeros { 2 }, meta = { 1, 2, 3 } } end
      return { x = dl.zeros { 2 }, meta = { 1, 2 } }
    end
    for _, nw in ipairs { 0, 2 } do
      local ok, err = pcall(function()
        for _ in data.DataLoader(object.new(Bad, {}), { batch_size = 4, num_workers = nw }):iter() do end
      end)
      assert.is_false(ok)
      assert.matches("DataLoader: part 1.meta of sample 3 is not a list of 2 elements as sample 1's", tostring(err), 1, true)
      if nw > 0 then assert.matches("while collating of batch 0", tostring(err), 1, true) end
    end
    -- a nil part would shift the later samples' values; a get returning nothing would end
    -- the loop as if the epoch were over
    local Holes = { name = "Holes" }
    function Holes.len() return 4 end
    function Holes.get(_, i)
      if i == 2 then return dl.zeros { 1 }, nil, 3 end
      return dl.zeros { 1 }, 1, 3
    end
    local Nothing = { name = "Nothing" }
    function Nothing.len() return 4 end
    function Nothing.get() end
    for _, nw in ipairs { 0, 2 } do
      local ok, err = pcall(function()
        for _ in data.DataLoader(object.new(Holes, {}), { batch_size = 4, num_workers = nw }):iter() do end
      end)
      assert.is_false(ok)
      assert.matches("DataLoader: part 2 of ds:get(2) is nil", tostring(err), 1, true)
      local batches = 0
      ok, err = pcall(function()
        for _ in data.DataLoader(object.new(Nothing, {}), { batch_size = 2, num_workers = nw }):iter() do
          batches = batches + 1
        end
      end)
      assert.is_false(ok, ("num_workers = %d: %d batches and no error"):format(nw, batches))
      assert.matches("DataLoader: ds:get(1) returned nothing", tostring(err), 1, true)
    end
    local ok, err = pcall(data.default_collate, { { x = 1, [1] = 2 }, { x = 1, [1] = 2 } })
    assert.is_false(ok)
    assert.matches("cannot collate part 1: sample 1's table mixes list positions and keys", err, 1, true)
    ok, err = pcall(data.default_collate, { { a = { b = "s" } }, { a = { b = 2 } } })
    assert.is_false(ok)
    assert.matches("part 1.a.b of sample 2 is a number, sample 1's is a string", err, 1, true)
    ok, err = pcall(data.default_collate, { { a = { [1] = {}, [2] = print } }, { a = { {}, print } } })
    assert.is_false(ok)
    assert.matches("cannot collate part 1.a[2] of type function", err, 1, true)
    ok, err = pcall(data.default_collate, { { x = 1 }, { y = 2 } })
    assert.is_false(ok)
    assert.matches("part 1 of sample 2 has no field 'x' (sample 1's has)", err, 1, true)
    -- a hole in a list whose length still reads 4 must not shift the other samples' values
    local holed = { 1, 2, 3, 4 }
    holed[2] = nil
    assert.equal(4, #holed) -- LuaJIT's border for this table: the array part's end
    ok, err = pcall(data.default_collate, { { v = { 1, 2, 3, 4 } }, { v = holed } })
    assert.is_false(ok)
    assert.matches("part 1.v[2] of sample 2 is nil", err, 1, true)
    ok, err = pcall(data.default_collate, { { 1, 2, 3, 4 }, holed })
    assert.is_false(ok)
    assert.matches("default_collate: part 2 of sample 2 is nil", err, 1, true)
  end)

  it("brings back batches whose size changes from batch to batch, strided ones included", function()
    -- each worker's shared-memory slots grow (a new memfd) when a batch outgrows them
    local Ragged = { name = "Ragged" }
    function Ragged.len() return 24 end
    function Ragged.get(_, i) return dl.arange(0, i * 300):to("f32") end
    local ds = object.new(Ragged, {})
    local function collate(samples)
      local total = 0
      for _, s in ipairs(samples) do total = total + s:numel() end
      local flat = dl.cat(samples, 1)
      return flat, flat:view(total / 100, 100):t() -- the second is a strided view
    end
    local function run(nw, persistent)
      local out = {}
      local loader = data.DataLoader(ds, { batch_size = 5, shuffle = true, generator = dl.Generator(11),
        collate_fn = collate, num_workers = nw, persistent_workers = persistent })
      for _ = 1, 2 do
        for flat, strided in loader:iter() do
          local row_major = strided:contiguous():view(-1):tolist() -- the transpose's order
          out[#out + 1] = { flat:numel(), flat:sum():item(), strided:size(1), row_major[2], row_major[#row_major - 1] }
        end
      end
      loader:close()
      return out
    end
    local base = run(0)
    assert.are.equal(10, #base)
    assert.are.same(base, run(2))
    assert.are.same(base, run(3, true))
  end)

  it("stacks the default collation's samples straight into the workers' slots, strided ones included", function()
    -- Note [stacking in the slot]: sample i is a transposed (4, 3) view whose values say i,
    -- and the worker's allocation count when ds:get(i) began; the batches equal
    -- num_workers = 0's bit for bit, and between two batches of a worker it allocated no
    -- batch-sized tensor (before: the stacked batch, then copied into the slot)
    local Strided = { name = "Strided" }
    function Strided.len() return 22 end
    function Strided.get(_, i)
      local allocated = tonumber(lib.C.ddp_memory_allocated_bytes())
      local x = dl.arange(0, 12):to("f32"):view(3, 4):t() * i
      return x, dl.zeros { 32768 }, allocated -- a 128 KiB part: a stack of 4 is 512 KiB
    end
    local ds = object.new(Strided, {})
    local function run(nw)
      local loader = data.DataLoader(ds, { batch_size = 4, shuffle = true, generator = dl.Generator(5), num_workers = nw })
      local out, counts = {}, {}
      for x, pad, allocated in loader:iter() do
        assert.are.same({ x:size(1), 4, 3 }, x.shape)
        assert.are.same({ x:size(1), 32768 }, pad.shape)
        out[#out + 1] = table.concat(x:contiguous():view(-1):tolist(), ",")
        counts[#counts + 1] = allocated:tolist()
      end
      loader:close()
      return out, counts
    end
    local base = run(0)
    assert.are.equal(6, #base)
    local got, counts = run(2)
    assert.are.same(base, got)
    -- batch b and b + 2 come from the same worker: what it allocated from its last get of b
    -- to its first get of b + 2 is that get's own sample (128 KiB and a little), no stack
    for b = 1, #counts - 2 do
      local between = counts[b + 2][1] - counts[b][#counts[b]]
      assert(between < 256 * 1024, ("worker allocated %d bytes between batches %d and %d"):format(between, b - 1, b + 1))
    end
  end)

  it("hands out batches over the workers' slots, and copies once the loop keeps more of them", function()
    -- Note [lent slots]: a batch's tensors are made over its slot while a worker has fewer
    -- than 2 slots lent; a loop that keeps every batch gets copies after that, and every
    -- batch it kept keeps its values while the workers go on writing their slots
    local function in_slot(x)
      local at = tonumber(ffi.cast("uintptr_t", lib.C.ddp_tensor_data(x)))
      for _, m in ipairs(shm_mappings()) do
        local lo, hi = m.line:match("^(%x+)%-(%x+)")
        if at >= tonumber(lo, 16) and at < tonumber(hi, 16) then return true end
      end
      return false
    end
    local ds = dataset(40)
    local base = epochs_of(data.DataLoader(ds, { batch_size = 2, shuffle = true, generator = dl.Generator(3) }), 1)
    local loader = data.DataLoader(ds, { batch_size = 2, shuffle = true, generator = dl.Generator(3), num_workers = 2 })
    local kept, lent = {}, 0
    for x, y in loader:iter() do
      if in_slot(x) then lent = lent + 1 end
      kept[#kept + 1] = { x, y }
    end
    assert.are.equal(4, lent) -- 2 per worker, then copies
    local got = {}
    for i, b in ipairs(kept) do
      got[i] = table.concat(b[1]:view(-1):tolist(), ",") .. "|" .. table.concat(b[2]:tolist(), ",") .. "|" ..
        b[1].dtype .. b[2].dtype
    end
    assert.are.same(base, got)
    -- a batch over a slot is the loop's own: writing it changes no other batch
    kept[1][1]:mul_(0)
    assert.are.same(base[2], got[2])
    loader:close()
  end)

  it("collects for a worker's lent slots only when they are all lent, not for every large batch", function()
    -- Note [lent slots]: 12 batches of 12 MB, each past Note [step lifetimes]' 8 MiB (which
    -- collected for every batch when lent bytes counted as allocated); a loop that drops
    -- them gets each one lent and collects when a worker has LEND_MAX (2) of them out. In a
    -- fresh process: this one's Lua heap (8 heaps per collection) would hide the count.
    local out = files.run_fresh("lent-collect", [=[
      local dl = require "ddplua"
      local data = require "ddplua.data"
      local object = require "ddplua.data.object"
      local profiler = require "ddplua.profiler"
      local Big = { name = "BigSamples" }
      function Big.len() return 36 end
      function Big.get(_, i) return dl.full({ 1024, 1024 }, i) end
      local loader = data.DataLoader(object.new(Big, {}), { batch_size = 3, num_workers = 2 })
      local prof = profiler.profile {}
      prof:start()
      local batches, wrong = 0, 0
      for x in loader:iter() do
        batches = batches + 1
        if x:select(1, 2):max():item() ~= 3 * batches - 1 then wrong = wrong + 1 end
      end
      prof:stop()
      local collections = 0
      for _, e in ipairs(prof:events()) do
        if e.name == "ddplua: collect garbage" then collections = collections + 1 end
      end
      print(("batches %d wrong %d collections %d"):format(batches, wrong, collections))
    ]=])
    local batches, wrong, collections = out:match("batches (%d+) wrong (%d+) collections (%d+)")
    assert(batches, out)
    assert.are.equal(12, tonumber(batches))
    assert.are.equal(0, tonumber(wrong))
    assert.is_true(tonumber(collections) >= 1, "no collection: the lent slots were never released")
    assert.is_true(tonumber(collections) <= 6, collections .. " collections for 12 batches")
  end)

  it("keeps a batch's slot for the loader when a worker forked later lets go of its copy", function()
    -- loader B's worker inherits the batch held here and releases its copy; only this
    -- process frees the slot, so loader A's worker does not write over the batch
    local ds = dataset(40)
    local a = data.DataLoader(ds, { batch_size = 2, num_workers = 1, prefetch_factor = 1, persistent_workers = true })
    finally(function() a:close() end)
    local it = a:iter()
    local holder = {}
    local function first() holder[1] = it() end -- the batch in holder only, no local
    first()
    local want = holder[1]:view(-1):tolist()
    local b = data.DataLoader(dataset(4), { batch_size = 2, num_workers = 1, worker_init_fn = function()
      holder[1] = nil
      collectgarbage()
      collectgarbage()
    end })
    for _ in b:iter() do end
    b:close()
    for _ = 1, 10 do assert(it()) end
    assert.are.same(want, holder[1]:view(-1):tolist())
    holder[1] = nil -- busted keeps the spec's closures, and with them the batch and its slot
  end)

  it("raises a mismatch of the samples' shapes in the training loop, as num_workers = 0 does", function()
    local Uneven = { name = "Uneven" }
    function Uneven.len() return 12 end
    function Uneven.get(_, i) return dl.zeros(i == 7 and { 3 } or { 2 }), i end
    local ds = object.new(Uneven, {})
    local errs = {}
    for _, nw in ipairs { 0, 2 } do
      local loader = data.DataLoader(ds, { batch_size = 4, num_workers = nw })
      local seen = 0
      local ok, err = pcall(function() for _ in loader:iter() do seen = seen + 1 end end)
      loader:close()
      assert.is_false(ok)
      assert.are.equal(1, seen) -- batch 0; samples 5..8 make batch 1
      errs[nw] = tostring(err)
    end
    local cause = "DataLoader: part 1: stack: item 2 is (3,) f32 but item 0 is (2,) f32"
    assert.matches(cause, errs[0], 1, true)
    assert.matches(cause, errs[2], 1, true)
    assert.matches("worker process 1 while collating of batch 1", errs[2], 1, true)
    assert.are.same({}, children())
  end)

  it("calls worker_init_fn in each worker and answers get_worker_info there only", function()
    assert.is_nil(data.get_worker_info())
    local init_id = -1
    local ds = dataset(12, { extra = function()
      local info = data.get_worker_info()
      return dl.tensor({ info.id, info.num_workers, init_id, info.seed % 1000000,
        dl.rand({}):item() * 1e6, info.dataset == nil and 0 or info.dataset.n })
    end })
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 3,
      worker_init_fn = function(id) init_id = id end })
    local seeds, draws, b = {}, {}, 0
    for _, _, info in loader:iter() do
      local rows = info:tolist()
      for _, r in ipairs(rows) do
        assert.are.equal(b % 3, r[1])         -- the worker that made batch b
        assert.are.equal(3, r[2])             -- num_workers
        assert.are.equal(b % 3, r[3])         -- worker_init_fn(id) ran in that worker
        assert.are.equal(12, r[6])            -- the worker's dataset
        seeds[r[1]] = r[4]
        draws[#draws + 1] = r[5]
      end
      b = b + 1
    end
    assert.are.equal(6, b)
    -- seeds are base_seed + id (mod 10^6 here, barring a wrap), so the workers draw differently
    assert.are.equal((seeds[0] + 1) % 1000000, seeds[1])
    assert.are.equal((seeds[0] + 2) % 1000000, seeds[2])
    assert.are_not.equal(draws[1], draws[3])
    assert.is_nil(data.get_worker_info())
    assert.are.equal(-1, init_id) -- worker_init_fn never ran in this process
  end)

  it("raises a worker's error in the training loop naming the sample index, the batch and the traceback", function()
    local ds = dataset(20, { fail_at = 13 })
    local loader = data.DataLoader(ds, { batch_size = 4, num_workers = 2 })
    local seen = 0
    local ok, err = pcall(function()
      for _ in loader:iter() do seen = seen + 1 end
    end)
    assert.is_false(ok)
    err = tostring(err)
    assert.matches("worker process 1", err, 1, true)       -- batch 3 goes to worker 3 % 2
    assert.matches("sample index 13 (ds:get(13))", err, 1, true)
    assert.matches("of batch 3", err, 1, true)             -- samples 13..16 (positions 12..15)
    assert.matches("sample 13 is corrupt", err, 1, true)
    assert.matches("stack traceback", err, 1, true)
    assert.matches("dataloader_workers_spec.lua", err, 1, true)
    assert.are.equal(3, seen) -- the batches before it arrived first
    loader:close()
    local live, zombies = children()
    assert.are.same({}, live)
    assert.are.same({}, zombies)
  end)

  it("raises an error of worker_init_fn, and a batch that cannot leave a worker, naming the cause", function()
    local loader = data.DataLoader(dataset(6), { batch_size = 2, num_workers = 2,
      worker_init_fn = function(id) if id == 1 then error("no config for worker " .. id) end end })
    local ok, err = pcall(function() for _ in loader:iter() do end end)
    assert.is_false(ok)
    assert.matches("Caught an error in DataLoader worker process 1 in worker_init_fn(1)", tostring(err), 1, true)
    assert.matches("no config for worker 1", tostring(err), 1, true)
    loader = data.DataLoader(dataset(6), { batch_size = 2, num_workers = 1,
      collate_fn = function(samples) return { n = #samples, f = print } end })
    ok, err = pcall(function() for _ in loader:iter() do end end)
    assert.is_false(ok)
    assert.matches("the batch holds a function, which cannot leave the worker process", tostring(err), 1, true)
    assert.are.same({}, children())
  end)

  it("reports a worker killed by SIGKILL with its pid and signal within the timeout", function()
    local ds = dataset(8, { hang = true })
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 2, timeout = 30 })
    local it = loader:iter()
    local pids = loader:worker_pids()
    assert.are.equal(2, #pids)
    ffi.C.kill(pids[1], SIGKILL)
    local t0 = dlos.monotonic()
    local ok, err = pcall(it)
    local waited = dlos.monotonic() - t0
    assert.is_false(ok)
    assert.matches(("DataLoader worker 0 (pid %d) exited unexpectedly: killed by signal SIGKILL"):format(pids[1]),
      tostring(err), 1, true)
    assert.is_true(waited < 5, "reported after " .. waited .. " s")
    -- the other worker (hung in ds:get) was stopped and reaped with it
    local live, zombies = children()
    assert.are.same({}, live)
    assert.are.same({}, zombies)
  end)

  it("raises after `timeout` seconds when a worker sends nothing", function()
    local loader = data.DataLoader(dataset(4, { hang = true }), { batch_size = 2, num_workers = 1, timeout = 0.3 })
    local t0 = dlos.monotonic()
    local ok, err = pcall(function() for _ in loader:iter() do end end)
    local waited = dlos.monotonic() - t0
    assert.is_false(ok)
    assert.matches("DataLoader timed out after 0.3 seconds waiting for batch 0 from worker 0", tostring(err), 1, true)
    assert.is_true(waited >= 0.3 and waited < 3, "waited " .. waited .. " s")
    local live = children()
    assert.are.same({}, live)
  end)

  it("keeps persistent workers across epochs and starts new ones per epoch otherwise", function()
    local ds = dataset(10)
    local loader = data.DataLoader(ds, { batch_size = 3, num_workers = 2, persistent_workers = true })
    local first
    for epoch = 1, 3 do
      local n = 0
      for _ in loader:iter() do n = n + 1 end
      assert.are.equal(4, n)
      local pids = loader:worker_pids()
      assert.are.equal(2, #pids)
      first = first or pids
      assert.are.same(first, pids)
      assert.are.equal(2, #children())
    end
    -- an epoch left early: the next one still gets its own batches, in order
    for _ in loader:iter() do break end
    local reference = epochs_of(data.DataLoader(ds, { batch_size = 3 }), 1)
    assert.are.same(reference, epochs_of(loader, 1))
    assert.are.same(first, loader:worker_pids())
    loader:close()
    assert.are.same({}, loader:worker_pids())

    local plain = data.DataLoader(ds, { batch_size = 3, num_workers = 2 })
    local seen = {}
    for _ = 1, 2 do
      for _ in plain:iter() do
        for _, pid in ipairs(plain:worker_pids()) do seen[pid] = true end
      end
      assert.are.same({}, plain:worker_pids()) -- the epoch's workers ended with it
    end
    local distinct = 0
    for _ in pairs(seen) do distinct = distinct + 1 end
    assert.are.equal(4, distinct)
  end)

  it("ends an epoch's workers once they have sent their last batch, and does not wait for their exit", function()
    -- Note [finished workers], Note [retired workers]: 8 batches from 2 workers, 2 tasks
    -- ahead each; the last task goes out when batch 4 is taken, and worker 0's last batch
    -- is batch 6
    local function state(pid) -- "Z" once it exited (not reaped), nil once reaped
      local f = io.open("/proc/" .. pid .. "/stat")
      if not f then return nil end
      local st = f:read("*a"):match("%) (%S) ")
      f:close()
      return st
    end
    local loader = data.DataLoader(dataset(16), { batch_size = 2, num_workers = 2 })
    local pids, n, exited_early = nil, 0, nil
    for x in loader:iter() do
      n = n + 1
      pids = pids or loader:worker_pids()
      assert.are.same({ n - 0.5, n }, x:select(2, 1):tolist()) -- samples 2n - 1 and 2n: i / 2
      if n == 7 then -- worker 0 sent its last batch: it exits while the loop goes on
        local t0 = dlos.monotonic()
        while state(pids[1]) ~= "Z" and dlos.monotonic() - t0 < 5 do dlos.sleep(0.01) end
        exited_early = state(pids[1])
      end
    end
    assert.are.equal(8, n)
    assert.are.equal("Z", exited_early, "worker 0 had not exited before the epoch's last batch")
    -- the epoch ended without reaping them: their /proc entries remain until a reap
    for _, pid in ipairs(pids) do assert.is_not_nil(state(pid), "worker " .. pid .. " was reaped at the epoch's end") end
    assert.are.same({}, loader:worker_pids())
    dl.empty_cache() -- reaps them (so do the next group, loader:close() and the exit)
    for _, pid in ipairs(pids) do assert.is_nil(state(pid), "worker " .. pid .. " is left") end
    local live, zombies = children()
    assert.are.same({}, live)
    assert.are.same({}, zombies)
  end)

  it("runs each worker on one thread: OpenBLAS's thread pool, stopped by fork, stays stopped", function()
    -- Note [pool and OpenBLAS threads]: restarted in every worker, its thread spun on a core
    -- for ~0.1 s each epoch
    local ds = dataset(4, { extra = function()
      local f = assert(io.open("/proc/" .. ffi.C.getpid() .. "/status"))
      local threads = tonumber(f:read("*a"):match("\nThreads:%s*(%d+)"))
      f:close()
      return dl.tensor({ threads })
    end })
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 2 })
    assert.are.equal(2, third_parts_are(loader, { { 1 }, { 1 } }))
  end)

  it("forks workers without the allocator's cached blocks, and with the blocks handed out since", function()
    -- Note [cache across fork] (runtime/core/alloc.c)
    local MARK = 7.25
    local block = dl.full({ 1024, 1024 }, MARK) -- 4 MiB: a mapped block, cached once freed
    local addr = address(block)
    block = nil
    collectgarbage()
    assert.is_true(dl.memory_stats().cached >= 4 * 1024 * 1024)
    local kept
    local ds = dataset(4, { extra = function()
      return dl.tensor({ inherited(addr, MARK), kept and kept:sum():item() or -1 })
    end })
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 2 })
    assert.are.equal(2, third_parts_are(loader, { { 0, -1 }, { 0, -1 } }))
    -- the same block, now a tensor's (after the fork that left it out): the next epoch's
    -- workers have it
    kept = dl.full({ 1024, 1024 }, 2)
    assert.are.equal(addr, address(kept))
    assert.are.equal(2, third_parts_are(loader, { { 0, 2 * 1024 * 1024 }, { 0, 2 * 1024 * 1024 } }))
  end)

  it("collects before it forks its workers: a tensor dropped just before is not in them", function()
    -- lua/ddplua/data/dataloader_workers.lua start(): left to a worker's collector, the
    -- worker reused the block and copied each page it wrote from this process
    local MARK = 5.5
    local dropped = dl.full({ 1024, 1024 }, MARK)
    local addr = address(dropped)
    dropped = nil -- garbage now, not collected yet
    local ds = dataset(4, { extra = function() return dl.tensor({ inherited(addr, MARK) }) end })
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 2 })
    assert.are.equal(2, third_parts_are(loader, { { 0 }, { 0 } }))
  end)

  it("leaves no process, zombie, descriptor or shared memory behind after close or collection", function()
    -- batches of other specs (this busted process runs many files) that something still
    -- holds keep their slots mapped (Note [lent slots]): this loader's are the ones to go
    local function mapped_lines()
      local lines = {}
      for _, m in ipairs(shm_mappings()) do lines[#lines + 1] = m.line end
      table.sort(lines)
      return lines
    end
    dl.empty_cache()
    local earlier = mapped_lines()
    local fds = open_fds()
    local ds = dataset(30)
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 3, persistent_workers = true })
    local kept
    for x in loader:iter() do kept = x break end
    assert.are.equal(3, #children())
    -- the batch slots this process maps: memfds without a name (deleted) and of mode 0600
    local slots = shm_mappings()
    assert.is_true(#slots > #earlier)
    for _, m in ipairs(slots) do
      assert.matches("(deleted)", m.line, 1, true)
      -- (map_files needs CAP_SYS_ADMIN: without it stat fails and the mode goes unchecked)
      if m.mode and m.mode:match("^%d+$") then assert.are.equal("600", m.mode, m.line) end
    end
    loader:close()
    -- a batch is made over its slot (Note [lent slots]): it outlives its loader and workers;
    -- then its slot joins the others in the pool kept for the next workers (Note [slot
    -- pool]), which dl.empty_cache() unmaps
    assert.are.same({ 0.5, -1, 1, -2 }, kept:view(-1):tolist())
    local pooled = dl.memory_stats().dataloader_slots
    kept = nil
    collectgarbage()
    collectgarbage()
    assert(dl.memory_stats().dataloader_slots > pooled, "the batch's slot was not pooled when released")
    dl.empty_cache()
    assert.are.equal(0, dl.memory_stats().dataloader_slots)
    assert.are.same(earlier, mapped_lines()) -- this loader's slots are unmapped
    local live, zombies = children()
    assert.are.same({}, live)
    assert.are.same({}, zombies)
    -- a loader dropped mid-epoch: the collector stops its workers
    local function drop()
      local l = data.DataLoader(ds, { batch_size = 2, num_workers = 2 })
      local it = l:iter()
      it()
      assert.are.equal(2, #children())
    end
    drop()
    collectgarbage("collect")
    collectgarbage("collect")
    live, zombies = children()
    assert.are.same({}, live)
    assert.are.same({}, zombies)
    assert.are.equal(fds, open_fds())
    assert.are.equal(0, memfds())
    assert.are.equal(0, shm_files())
  end)

  it("takes its workers along when the training process exits without closing the loader", function()
    local dir = files.tmpdir("workers-exit")
    local script = files.write(dir, "main.lua", [[
      local dl = require "ddplua"
      local data = require "ddplua.data"
      local object = require "ddplua.data.object"
      local DS = { name = "DS" }
      function DS.len() return 50 end
      function DS.get(_, i) return dl.tensor({ i }) end
      local loader = data.DataLoader(object.new(DS, {}), { batch_size = 2, num_workers = 2, persistent_workers = true })
      for _ in loader:iter() do break end
      print(table.concat(loader:worker_pids(), " "))
      io.stdout:flush()
      os.exit(0) -- no close, no collection
    ]])
    -- output to a file: a pipe would stay open as long as a worker lived
    local status = os.execute("build/ddplua " .. files.quote(script) .. " > " .. files.quote(dir .. "/out.txt") .. " 2>&1")
    local out = files.read(dir .. "/out.txt")
    files.remove(dir)
    assert.is_true(status == 0 or status == true, out)
    local pids = {}
    for pid in out:gmatch("%d+") do pids[#pids + 1] = tonumber(pid) end
    assert.are.equal(2, #pids, out)
    local deadline = dlos.monotonic() + 3
    local function alive(pid)
      local f = io.open("/proc/" .. pid .. "/stat")
      if not f then return false end
      local stat = f:read("*a")
      f:close()
      return stat:match("%) (%S)") ~= "Z"
    end
    while (alive(pids[1]) or alive(pids[2])) and dlos.monotonic() < deadline do dlos.sleep(0.02) end
    assert.is_false(alive(pids[1]))
    assert.is_false(alive(pids[2]))
  end)

  it("pins what the workers send when pin_memory is set (simulated CUDA device)", function()
    local status, out = require("cuda").run_sim([[
      local data = require "ddplua.data"
      local object = require "ddplua.data.object"
      local DS = { name = "DS" }
      function DS.len() return 9 end
      function DS.get(_, i) return dl.tensor({ i, -i }), i end
      local ds = object.new(DS, {})
      local plain, pinned = {}, 0
      for x in data.DataLoader(ds, { batch_size = 2 }):iter() do plain[#plain + 1] = x:sum():item() end
      local k = 0
      for x, y in data.DataLoader(ds, { batch_size = 2, num_workers = 2, pin_memory = true }):iter() do
        k = k + 1
        assert(x:sum():item() == plain[k], "batch " .. k)
        if x:is_pinned() and y:is_pinned() then pinned = pinned + 1 end
      end
      print("pinned " .. pinned .. " of " .. k)
      -- tensors nested in the batch's tables are pinned too (PyTorch's pin_memory walks them)
      local Dicts = { name = "Dicts" }
      function Dicts.len() return 4 end
      function Dicts.get(_, i) return { x = dl.tensor({ i }), more = { dl.tensor({ -i }), "s" .. i } } end
      local nested = 0
      for nw = 0, 2, 2 do
        for b in data.DataLoader(object.new(Dicts, {}), { batch_size = 2, num_workers = nw, pin_memory = true }):iter() do
          if b.x:is_pinned() and b.more[1]:is_pinned() and b.more[2][2] == "s" .. b.x:view(-1):tolist()[2] then
            nested = nested + 1
          end
        end
      end
      print("nested pinned " .. nested .. " of 4")
    ]])
    assert.are.equal(0, status, out)
    assert.matches("pinned 5 of 5", out, 1, true)
    assert.matches("nested pinned 4 of 4", out, 1, true)
  end)

  it("closes one loader's workers at once while another loader's workers run", function()
    -- the second loader's workers must not keep the first's sockets open (they would wait
    -- for the SIGKILL after the 1 s grace)
    local a = data.DataLoader(dataset(20), { batch_size = 2, num_workers = 2, persistent_workers = true })
    local b = data.DataLoader(dataset(20), { batch_size = 2, num_workers = 2, persistent_workers = true })
    local ia, ib = a:iter(), b:iter()
    ia()
    ib()
    assert.are.equal(4, #children())
    local t0 = dlos.monotonic()
    a:close()
    local took = dlos.monotonic() - t0
    assert.is_true(took < 0.5, ("closing took %.2f s"):format(took))
    assert.are.equal(2, #children())
    local n = 1
    for _ in ib do n = n + 1 end
    assert.are.equal(10, n)
    b:close()
    assert.are.same({}, children())
  end)

  it("keeps the C path for datasets with c_sources, with the same batches", function()
    local x = dl.arange(0, 60):view(30, 2):to("f32")
    local y = dl.arange(0, 30)
    local ds = data.TensorDataset(x, y)
    local a = epochs_of(data.DataLoader(ds, { batch_size = 4, shuffle = true, generator = dl.Generator(3) }), 2)
    local loader = data.DataLoader(ds, { batch_size = 4, shuffle = true, generator = dl.Generator(3), num_workers = 2 })
    assert.are.same(a, epochs_of(loader, 2))
    assert.are.same({}, children()) -- a thread, no process
  end)

  it("lets a worker collect a C loader it inherited with its prefetch thread running", function()
    -- the thread exists in the training process only: a worker that joined it hung
    local c_loader = data.DataLoader(data.TensorDataset(dl.arange(0, 40):to("f32")), { batch_size = 2, prefetch = 2 })
    local it = c_loader:iter()
    it()
    c_loader, it = nil, nil -- garbage now, in the workers forked below too
    local ds = dataset(6, { extra = function()
      collectgarbage("collect") -- the worker's collector finalizes its copy of the C loader
      return 0
    end })
    local loader = data.DataLoader(ds, { batch_size = 2, num_workers = 1, timeout = 3 })
    local n = 0
    for _ in loader:iter() do n = n + 1 end
    assert.are.equal(3, n)
  end)

  it("reads an iterable dataset in the workers, each its shard, batches taken from the workers in turn", function()
    -- the stream protocol of ddplua.data.iterable_dataset: ds.is_iterable, ds:stream()
    -- (the error below: worker 1's second batch, samples 5 and 7, is batch 3 of the loop)
    -- (sharded here by get_worker_info as Note [iterable sharding] does: sample k to worker
    -- k % num_workers)
    local Stream = { name = "Stream", is_iterable = true }
    function Stream.stream(self)
      local info = data.get_worker_info()
      local id, n = info and info.id or 0, info and info.num_workers or 1
      local k = id - n
      return function()
        k = k + n
        if self.fail_at == k then error("stream broke at " .. k) end
        if k < self.n then return dl.tensor({ k }), k end
      end
    end
    local function stream(n, fail_at) return object.new(Stream, { n = n, fail_at = fail_at }) end
    -- PyTorch's order: worker w's j-th batch holds its shard's samples j*B .. j*B+B-1; the
    -- loop takes batch j of workers 0, 1, ... in turn, skipping a worker whose stream ended
    local function expected(n, nw, bs, drop_last)
      local per = {}
      for w = 0, nw - 1 do
        per[w] = {}
        local shard = {}
        for k = w, n - 1, nw do shard[#shard + 1] = k end
        for j = 1, #shard, bs do
          local b = {}
          for q = j, math.min(j + bs - 1, #shard) do b[#b + 1] = shard[q] end
          if not drop_last or #b == bs then per[w][#per[w] + 1] = table.concat(b, ",") end
        end
      end
      local out, j = {}, 1
      while true do
        local any = false
        for w = 0, nw - 1 do
          if per[w][j] then out[#out + 1], any = per[w][j], true end
        end
        if not any then return out end
        j = j + 1
      end
    end
    local function run(loader, epochs)
      local out = {}
      for _ = 1, epochs do
        for x, y in loader:iter() do
          assert.are.same(x:view(-1):tolist(), y:tolist())
          out[#out + 1] = table.concat(y:tolist(), ",")
        end
      end
      return out
    end
    for _, c in ipairs { { 23, 2, 4, false }, { 23, 3, 4, true }, { 5, 2, 2, false } } do
      local n, nw, bs, drop_last = c[1], c[2], c[3], c[4]
      local want = expected(n, nw, bs, drop_last)
      local loader = data.DataLoader(stream(n), { batch_size = bs, num_workers = nw, drop_last = drop_last,
        persistent_workers = true })
      local got = run(loader, 2)
      local twice = {}
      for _, b in ipairs(want) do twice[#twice + 1] = b end
      for _, b in ipairs(want) do twice[#twice + 1] = b end
      assert.are.same(twice, got)
      loader:close()
    end
    local ok, err = pcall(run, data.DataLoader(stream(12, 7), { batch_size = 2, num_workers = 2 }), 1)
    assert.is_false(ok)
    assert.matches("worker process 1 while reading sample 2 of its stream's batch of batch 3", tostring(err), 1, true)
    assert.matches("stream broke at 7", tostring(err), 1, true)
    assert.are.same({}, children())
  end)

  it("gives each DDP rank the same batches with workers as without, beside gloo collectives #dist", function()
    local mp = require "multiproc"
    local r = mp.run { nprocs = 2, timeout = 60, code = [[
      local dl = require "ddplua"
      local data = require "ddplua.data"
      local object = require "ddplua.data.object"
      local dist = require "ddplua.distributed"
      local DistributedSampler = require "ddplua.distributed.sampler"
      dist.init_process_group { backend = "gloo" }
      local DS = { name = "DS" }
      function DS.len() return 37 end
      function DS.get(_, i) return dl.tensor({ i, 2 * i }), i % 5 end
      local ds = object.new(DS, {})
      local function run(nw)
        local sampler = DistributedSampler(37, { shuffle = true, seed = 3 })
        local loader = data.DataLoader(ds, { batch_size = 4, sampler = sampler, num_workers = nw,
          persistent_workers = nw > 0 })
        local out = {}
        for epoch = 1, 2 do
          sampler:set_epoch(epoch)
          for x, y in loader:iter() do
            local s = x:sum()
            dist.all_reduce(s) -- a collective while the workers run
            out[#out + 1] = table.concat(x:view(-1):tolist(), ",") .. "|" .. table.concat(y:tolist(), ",") ..
              "|" .. s:item()
          end
        end
        loader:close()
        return table.concat(out, ";")
      end
      local a, b = run(0), run(2)
      print("SAME " .. tostring(a == b) .. " BATCHES " .. select(2, a:gsub(";", ";")) + 1)
      dist.destroy_process_group()
    ]] }
    assert.is_true(r.ok, mp.describe(r))
    for rank = 1, 2 do
      assert.matches("SAME true BATCHES 10", r[rank].output, 1, true) -- 2 epochs of ceil(19 / 4)
    end
  end)

  it("checks the worker options as PyTorch does", function()
    local ds = dataset(4)
    assert.has_error(function() data.DataLoader(ds, { num_workers = -1 }) end,
      "DataLoader: num_workers option should be non-negative; use num_workers=0 to disable multiprocessing (got -1)")
    assert.error_matches(function() data.DataLoader(ds, { prefetch_factor = 2 }) end,
      "prefetch_factor option could only be specified in multiprocessing", 1, true)
    assert.error_matches(function() data.DataLoader(ds, { persistent_workers = true }) end,
      "persistent_workers option needs num_workers > 0", 1, true)
    assert.error_matches(function() data.DataLoader(ds, { num_workers = 1, timeout = -1 }) end,
      "timeout option should be non-negative", 1, true)
    assert.error_matches(function() data.DataLoader(ds, { num_workers = 1, worker_init_fn = 3 }) end,
      "worker_init_fn must be a function", 1, true)
    assert.are.equal(2, data.DataLoader(ds, { num_workers = 2 }).prefetch_factor)
    assert.is_nil(data.DataLoader(ds, {}).prefetch_factor)
  end)
end)
