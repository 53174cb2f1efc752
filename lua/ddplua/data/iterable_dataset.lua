--- ddplua.data.iterable_dataset: IterableDataset, a dataset read as a stream of samples
-- (PyTorch's torch.utils.data.IterableDataset), with its sharding over ranks and workers.
--
--   local Lines = {}
--   function Lines.iter(self)                     -- one sample per call, nil at the end
--     local f = io.lines(self.path)
--     return function() local l = f() if l then return tokenize(l) end end
--   end
--   local ds = data.IterableDataset(Lines, {path = "corpus.txt"})
--   for x in data.DataLoader(ds, {batch_size = 32}):iter() do ... end
--
-- Note [iterable sharding]
-- A stream cannot be indexed, so a sampler cannot split it: each copy of the dataset (one
-- per rank, and per DataLoader worker within a rank) reads the whole stream and keeps its
-- share. With shard = true (the default) sample k (0-based, in stream order) goes to shard
-- k % S, S = num_replicas * num_workers, and this copy is shard rank * num_workers +
-- worker id: round-robin, so the shards' sizes differ by at most one and their union is
-- the stream, each sample once. (PyTorch leaves this to the dataset's __iter__, with
-- get_worker_info(); without it every worker and rank sees every sample: shard = false
-- gives that.) The ranks see different numbers of samples when S does not divide the
-- stream's length; a DDP loop that needs equal step counts uses drop_last on a stream of
-- known length or the Join context.
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local worker_info = require "ddplua.data.worker_info"

local M = {}

local function int_env(name)
  local s = os.getenv(name)
  if s == nil or s == "" then return nil end
  local v = tonumber(s)
  if not v or v % 1 ~= 0 then lib.raise(("IterableDataset: environment variable %s = '%s' is not an integer"):format(name, s)) end
  return v
end

-- World size and rank: opts, else the initialized process group when its module is loaded
-- (read from package.loaded: data sits below distributed, Note [lua layers]), else the
-- launcher's WORLD_SIZE / RANK, else 1 / 0.
local function job(self)
  local world, rank = self.num_replicas, self.rank
  if world and rank then return world, rank end
  local dist = package.loaded["ddplua.distributed.distributed_c10d"]
  if type(dist) == "table" and type(dist.is_initialized) == "function" and dist.is_initialized() then
    return world or dist.get_world_size(), rank or dist.get_rank()
  end
  return world or int_env("WORLD_SIZE") or 1, rank or int_env("RANK") or 0
end

local Base = { name = "IterableDataset", is_iterable = true }

--- ds:shard_info() -> shard, count: this copy's shard (0-based) and the number of shards
-- (Note [iterable sharding]); 0, 1 when sharding is off.
function Base.shard_info(self)
  if not self.shard then return 0, 1 end
  local world, rank = job(self)
  local info = worker_info.get_worker_info()
  local nw, id = info and info.num_workers or 1, info and info.id or 0
  if rank < 0 or rank >= world then
    lib.raise(("IterableDataset: rank %d is outside 0 .. %d (num_replicas %d)"):format(rank, world - 1, world))
  end
  return rank * nw + id, world * nw
end

-- (keep, ...) for one sample of a sharded stream: whether sample number it.k (from 0) is
-- in this copy's shard, then the sample; nil at the end.
local function sharded_sample(it, ...)
  if select(1, ...) == nil then return nil end
  it.k = it.k + 1
  if it.k % it.count ~= it.shard then return false end
  return true, ...
end

-- The next sample of it.f's stream in this copy's shard (a lib.iterator: Note [traces keep
-- closures] in ddplua/lib.lua).
local sharded_stream = lib.iterator(function(it)
  while true do
    local res = { sharded_sample(it, it.f()) }
    if res[1] == nil then return nil end
    if res[1] then return unpack(res, 2, table.maxn(res)) end
  end
end)

--- ds:stream() -> an iterator over this copy's samples: class.iter(ds)'s samples, keeping
-- those of ds:shard_info()'s shard. Each call of the iterator returns one sample's parts
-- (several values), nothing at the end.
function Base.stream(self)
  local f = self.__class.iter(self)
  if type(f) ~= "function" then
    lib.raise(("%s: iter() must return an iterator function, got %s"):format(self.name, type(f)))
  end
  local shard, count = Base.shard_info(self)
  if count == 1 then return f end
  return sharded_stream { f = f, shard = shard, count = count, k = -1 }
end

--- ds:len(): class.len(ds) when the class has one (the stream's length as the class
-- defines it, before sharding); raises otherwise, as len() of a PyTorch IterableDataset
-- without __len__.
function Base.len(self)
  local f = self.__class.len
  if type(f) ~= "function" then
    lib.raise(("%s: this IterableDataset has no len() (its class defines none)"):format(self.name))
  end
  return f(self)
end

--- ds:get(): refused: an IterableDataset is read with stream() (a DataLoader does it).
function Base.get(self)
  lib.raise(("%s: an IterableDataset cannot be indexed; iterate it (ds:stream() or a DataLoader)"):format(self.name))
end

--- data.IterableDataset(class, state, opts): a stream dataset whose samples come from
-- class.iter(self), an iterator function (each call returns one sample's parts, nothing at
-- the end), over the fields of `state` (methods receive the dataset as self; class.len is
-- optional). opts.shard (true: Note [iterable sharding]; false: every copy reads every
-- sample, PyTorch's behaviour), opts.num_replicas and opts.rank (default: the process
-- group's, else WORLD_SIZE / RANK, else 1 / 0). A DataLoader batches ds:stream() in order
-- (no sampler or shuffle, as PyTorch). Fields: ds.is_iterable = true.
function M.IterableDataset(class, state, opts)
  if type(class) ~= "table" or type(class.iter) ~= "function" then
    lib.raise("IterableDataset: class must have an iter(self) method returning an iterator function")
  end
  opts = opts or {}
  if type(opts) ~= "table" then lib.raise("IterableDataset: opts must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "shard" and k ~= "num_replicas" and k ~= "rank" then
      lib.raise("IterableDataset: unknown option '" .. tostring(k) .. "' (shard, num_replicas, rank)")
    end
  end
  local world, rank = opts.num_replicas, opts.rank
  if world ~= nil and (type(world) ~= "number" or world < 1 or world % 1 ~= 0) then
    lib.raise("IterableDataset: num_replicas must be an integer >= 1, got " .. tostring(world))
  end
  if rank ~= nil and (type(rank) ~= "number" or rank < 0 or rank % 1 ~= 0) then
    lib.raise("IterableDataset: rank must be an integer >= 0, got " .. tostring(rank))
  end
  local merged = setmetatable({ name = class.name or Base.name, is_iterable = true }, { __index = function(_, k)
    if Base[k] ~= nil and k ~= "name" then return Base[k] end
    return class[k]
  end })
  state = state or {}
  state.__class = class
  state.shard = opts.shard ~= false
  state.num_replicas, state.rank = world, rank
  return object.new(merged, state)
end

--- iterable.is_iterable(ds) -> true for an IterableDataset (its is_iterable field).
function M.is_iterable(ds)
  if type(ds) ~= "table" and type(ds) ~= "userdata" then return false end
  local ok, v = pcall(function() return ds.is_iterable end)
  return ok and v == true
end

-- The next batch of it.f's stream, collated (a lib.iterator: Note [traces keep closures]).
local stream_batches = lib.iterator(function(it)
  if it.done then return nil end
  local f, batch_size = it.f, it.batch_size
  if not batch_size then -- each sample as it is (Note [no automatic batching], loader.lua)
    local s = { f() }
    local n = table.maxn(s)
    if n == 0 then
      it.done = true
      return nil
    end
    if not it.collate then return unpack(s, 1, n) end
    return it.collate(n == 1 and s[1] or s)
  end
  local samples = {}
  while #samples < batch_size do
    local s = { f() }
    local n = table.maxn(s)
    if n == 0 then it.done = true break end
    samples[#samples + 1] = n == 1 and s[1] or s
  end
  if #samples == 0 or (it.drop_last and #samples < batch_size) then
    it.done = true
    return nil
  end
  return it.collate(samples)
end)

--- iterable.batches(ds, batch_size, drop_last, collate) -> an iterator over batches of
-- ds:stream(): lists of batch_size samples (each the value itself for one part, else the
-- list of its parts) given to collate(samples), whose results the iterator returns; the
-- last short batch is dropped with drop_last. batch_size nil: each sample as the stream
-- gives it, or collate(sample) when collate is given (Note [no automatic batching] in
-- ddplua/data/loader.lua). Used by DataLoader.iter.
function M.batches(ds, batch_size, drop_last, collate)
  return stream_batches { f = ds:stream(), batch_size = batch_size, drop_last = drop_last,
    collate = collate, done = false }
end

return M
