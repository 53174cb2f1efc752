--- ddplua.data.loader: DataLoader, the batch iterator over a dataset.
--
--   local loader = data.DataLoader(ds, {batch_size = 64, shuffle = true, generator = g})
--   for epoch = 1, 10 do
--     for x, y in loader:iter() do ... end      -- x f32 (B, C, H, W), y i64 (B)
--   end
--   print(#loader)                              -- batches per epoch
--
-- Two paths:
--  * C path, for datasets with c_sources() (the built-in ones and TensorDataset, with
--    transforms made of data.* objects): a C loader (runtime/io/loader.c) gathers each
--    batch into one contiguous tensor per source and applies the transforms, on a
--    background thread that keeps `prefetch` batches ready (prefetch = 0: on the caller's
--    thread, split over the thread pool; by default the thread only where a core is free).
--    Prefetching changes no value (Note [transform randomness], ddplua/io.h).
--  * Lua path, for any other dataset (the protocol in ddplua.data.datasets): each batch
--    calls ds:get(i) for its samples and stacks them in C (ddp_io_stack): tensors of equal
--    shape stack to (B, ...); numbers become an i64 tensor when all are integers, else
--    f64; booleans a bool tensor. `prefetch` is ignored there (no thread).
--
-- Workers (num_workers > 0, Note [dataloader workers] in ddplua/data/dataloader_workers.lua):
--  * Lua path: the batches are made in num_workers forked worker processes (ds:get and the
--    collation run there), batch b by worker b % num_workers, and come back in order: the
--    same batches in the same order as num_workers = 0. prefetch_factor (2) batches per
--    worker are in flight. data.get_worker_info() answers inside a worker.
--  * Iterable datasets (ds.is_iterable, samples from ds:stream(): the protocol of
--    ddplua.data.iterable_dataset): each worker batches its own copy of the stream (which
--    shards itself by data.get_worker_info()) and the loop takes one batch from each worker
--    in turn, skipping those whose stream ended, as PyTorch's DataLoader does.
--  * C path: the batches are already gathered in C off the training thread, with no Lua per
--    sample; num_workers > 0 keeps that path and makes its prefetch thread run, keeping
--    prefetch_factor * num_workers batches ready (unless `prefetch` is given). No process
--    is forked there, so worker_init_fn is not called and persistent_workers has nothing
--    to keep. The batches are those of num_workers = 0 (Note [transform randomness]).
--
-- collate_fn (PyTorch's DataLoader argument): a function that receives the list of the
-- batch's samples and returns the batch. Each sample is what ds:get(i) returned: the value
-- itself when get returns one value, else the list {v1, v2, ...} of its values (Lua's
-- tuple). Whatever collate_fn returns (one or several values) is what the iterator yields;
-- it must return something other than nil (nil would end the for loop). With collate_fn
-- every batch takes the Lua path (ds:get per sample), as PyTorch calls dataset[i] for each.
-- data.default_collate(samples) is the default's collation of such a list, for a
-- collate_fn that adjusts it. Without collate_fn each value of get is collated as
-- PyTorch's default_collate does, tables of fields and lists included (Note [default
-- collation]).
--
-- An IterableDataset (ddplua/data/iterable_dataset.lua) is read as a stream: batches of its
-- ds:stream() in order (its share for this rank, Note [iterable sharding]), collated as
-- above; no sampler or shuffle (PyTorch's rule), and #loader only when the dataset has len.
--
-- Sampler protocol: any object with sampler:indices() returning the epoch's sample order
-- as a Lua table or a 1-d i64 tensor of 0-based indices (dataset positions minus one, as
-- PyTorch's samplers yield). Called once per iter(). Optionally sampler:len() (or #sampler)
-- gives the count without drawing the order (used by #loader). A DistributedSampler
-- plugs in here; its set_epoch is the caller's business, as in PyTorch. PyTorch's own
-- samplers are in ddplua/data/samplers.lua.
--
-- Note [batch sampler]: opts.batch_sampler (PyTorch's) makes the batches themselves: any
-- object with batch_sampler:batches() returning the epoch's list of batches, each a Lua
-- list or a 1-d tensor of 0-based indices (not empty; sizes may differ, as for batches of
-- sequences of similar lengths), and optionally len() (or #) for #loader. Called once per
-- iter(). The batches are joined into the epoch's order, with each batch's start kept
-- (batch_bounds), so the Lua and worker paths read batch b as order[starts[b] ..
-- starts[b+1]-1], batch b still from worker b % num_workers; the C path, whose batches have
-- one size, is not used (a dataset with c_sources is read by ds:get, as with collate_fn).
-- As in PyTorch it excludes batch_size, shuffle, sampler and drop_last, and
-- loader.batch_size is nil. Persistent workers are started again when an epoch has a
-- larger batch than their task buffers hold. data.BatchSampler(sampler, batch_size,
-- drop_last) groups a sampler's order.
--
-- Note [no automatic batching]: batch_size = false is PyTorch's batch_size=None: the loop
-- receives each sample as ds:get(i) (or the stream) returned it, in the order of the
-- sampler or shuffle, nothing stacked; collate_fn, when given, receives each sample alone
-- (the value, or the list of values) instead of a list of samples (PyTorch's
-- default_convert has nothing to do here: Lua samples are tensors already). For datasets
-- whose get (or stream) makes whole batches itself. #loader is the count of samples. The
-- Lua and worker paths take it as batches of one sample; a dataset with c_sources is read
-- by ds:get. Not with drop_last (PyTorch's error).
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local transforms = require "ddplua.data.transforms"
local generator = require "ddplua.generator"
local iterable = require "ddplua.data.iterable_dataset"
local workers = require "ddplua.data.dataloader_workers"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

local DataLoader = { name = "DataLoader" }

local function is_tensor(v) return require("ddplua.tensor").is_tensor(v) end

local KNOWN = options.known { "batch_size", "shuffle", "sampler", "batch_sampler", "generator", "drop_last",
  "prefetch", "pin_memory", "collate_fn", "num_workers", "prefetch_factor", "persistent_workers", "worker_init_fn",
  "timeout" }

--- data.DataLoader(dataset, opts): batches of `dataset`.
-- opts.batch_size (64; false: no batching, Note [no automatic batching]), opts.shuffle
-- (false: a new dl.randperm order each iter(), drawn from opts.generator), opts.sampler
-- (see the protocol above; not with shuffle), opts.batch_sampler (Note [batch sampler];
-- not with batch_size, shuffle, sampler or drop_last),
-- opts.generator (a dl.Generator; the default generator when nil; drives shuffling and the
-- random transforms), opts.drop_last (false: keep the short last batch), opts.prefetch
-- (batches the C loader's thread keeps ready; 0: no thread, each batch made on the caller's
-- thread and split over the thread pool; nil: chosen at each iter(), 2 when the compute
-- threads of the node's processes leave a core free or pin_memory is set, else 0: Note
-- [default prefetch] in runtime/io/loader.c), opts.pin_memory (false: true
-- puts every batch tensor in pinned host memory, so that x:to("cuda", {non_blocking =
-- true}) copies it asynchronously; on the C path the prefetch thread does the pinning, see
-- Note [pinned batches] in runtime/io/loader.c; without CUDA nothing is pinned, as PyTorch,
-- and loader.pin_memory reads false; with workers the training process pins what they
-- send), opts.collate_fn (nil: the default collation; a function(samples) -> batch, see
-- the top of this file; with workers it runs in the workers), opts.num_workers (0: batches
-- made in the training process; N > 0: by N worker processes, see "Workers" above),
-- opts.prefetch_factor (batches in flight per worker; 2 when num_workers > 0, and only
-- allowed then, as PyTorch), opts.persistent_workers (false: the workers exit at each
-- epoch's end; true: the same processes serve every epoch; needs num_workers > 0),
-- opts.worker_init_fn (nil, or a function(worker_id) run once in each worker after its
-- seeding; worker ids count from 0), opts.timeout (0: wait for a worker's batch as long as
-- the workers live; T > 0: raise "DataLoader timed out after T seconds ..." past T seconds;
-- a dead worker is reported at once either way). Raises on bad options, with PyTorch's
-- texts where it has one.
function M.DataLoader(dataset, opts)
  opts = options.check("DataLoader", opts, KNOWN)
  if dataset == nil or (type(dataset) ~= "table" and type(dataset) ~= "userdata") then
    lib.raise("DataLoader: expected a dataset, got " .. type(dataset))
  end
  local bs = opts.batch_size
  if bs == nil then bs = 64 end
  local auto_batching = bs ~= false -- Note [no automatic batching]
  if auto_batching and (type(bs) ~= "number" or bs < 1 or bs % 1 ~= 0) then
    lib.raise("DataLoader: batch_size must be a positive integer (or false: no batching), got " .. tostring(bs))
  end
  if not auto_batching and opts.drop_last then
    lib.raise("DataLoader: batch_size=false (PyTorch's batch_size=None) option disables auto-batching and is " ..
      "mutually exclusive with drop_last")
  end
  local prefetch = opts.prefetch -- nil: chosen at each iter() (Note [default prefetch])
  if prefetch ~= nil and (type(prefetch) ~= "number" or prefetch < 0 or prefetch % 1 ~= 0) then
    lib.raise("DataLoader: prefetch must be an integer >= 0, got " .. tostring(prefetch))
  end
  if opts.sampler and opts.shuffle then
    lib.raise("DataLoader: sampler and shuffle = true are mutually exclusive")
  end
  if opts.batch_sampler ~= nil then
    if (opts.batch_size ~= nil and opts.batch_size ~= 1) or opts.shuffle or opts.sampler ~= nil or opts.drop_last then
      lib.raise("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
    end
    local bsm = opts.batch_sampler
    local ok, f = pcall(function() return bsm.batches end)
    if not ok or type(f) ~= "function" then
      lib.raise("DataLoader: batch_sampler must have a batches() method (see data.BatchSampler)")
    end
  end
  if opts.collate_fn ~= nil and type(opts.collate_fn) ~= "function" then
    lib.raise("DataLoader: collate_fn must be a function(samples) -> batch, got " .. type(opts.collate_fn))
  end
  if iterable.is_iterable(dataset) and (opts.sampler or opts.shuffle or opts.batch_sampler) then
    local name = opts.sampler and "sampler" or opts.batch_sampler and "batch_sampler" or "shuffle"
    lib.raise(("DataLoader with IterableDataset: expected unspecified %s option, but got %s"):format(name,
      name == "shuffle" and "shuffle=true" or name .. "=" .. tostring(opts[name])))
  end
  if opts.sampler and type(opts.sampler.indices) ~= "function" then
    lib.raise("DataLoader: sampler must have an indices() method")
  end
  local nw = opts.num_workers or 0
  if type(nw) ~= "number" or nw % 1 ~= 0 or nw < 0 then
    lib.raise("DataLoader: num_workers option should be non-negative; use num_workers=0 to disable " ..
      "multiprocessing (got " .. tostring(nw) .. ")")
  end
  local pf = opts.prefetch_factor
  if pf ~= nil and nw == 0 then
    lib.raise("DataLoader: prefetch_factor option could only be specified in multiprocessing. Let " ..
      "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to nil")
  end
  pf = pf or (nw > 0 and 2 or nil)
  if pf ~= nil and (type(pf) ~= "number" or pf % 1 ~= 0 or pf < 1) then
    lib.raise("DataLoader: prefetch_factor must be an integer >= 1, got " .. tostring(pf))
  end
  if opts.persistent_workers and nw == 0 then
    lib.raise("DataLoader: persistent_workers option needs num_workers > 0")
  end
  if opts.worker_init_fn ~= nil and type(opts.worker_init_fn) ~= "function" then
    lib.raise("DataLoader: worker_init_fn must be a function(worker_id), got " .. type(opts.worker_init_fn))
  end
  local timeout = opts.timeout or 0
  if type(timeout) ~= "number" or timeout < 0 or timeout ~= timeout then
    lib.raise("DataLoader: timeout option should be non-negative (seconds), got " .. tostring(timeout))
  end
  return object.new(DataLoader, {
    dataset = dataset, batch_size = (opts.batch_sampler == nil and auto_batching) and bs or nil,
    auto_batching = auto_batching or opts.batch_sampler ~= nil, shuffle = opts.shuffle and true or false,
    sampler = opts.sampler, batch_sampler = opts.batch_sampler, generator = opts.generator or generator.default,
    drop_last = opts.drop_last and true or false, prefetch = prefetch, epoch = nil,
    pin_memory = (opts.pin_memory and C.ddp_cuda_is_available() ~= 0) and true or false,
    collate_fn = opts.collate_fn, num_workers = nw, prefetch_factor = pf,
    persistent_workers = opts.persistent_workers and true or false, worker_init_fn = opts.worker_init_fn,
    timeout = timeout, epochs = 0, workers = nil,
  })
end

-- Number of samples of the epoch.
local function epoch_len(self)
  local s = self.sampler
  if s then
    local ok, f = pcall(function() return s.len end)
    if ok and type(f) == "function" then return f(s) end
    local ok2, n = pcall(function() return #s end)
    if ok2 and type(n) == "number" and n > 0 then return n end
    local idx = s:indices()
    return is_tensor(idx) and idx:numel() or #idx
  end
  return object.len(self.dataset)
end

--- Number of batches per epoch: ceil(len / batch_size), floor with drop_last; with a
-- batch_sampler, its len() (or #batch_sampler), else the count of its batches().
function DataLoader.len(self)
  local bsm = self.batch_sampler
  if bsm then
    local ok, f = pcall(function() return bsm.len end)
    if ok and type(f) == "function" then return f(bsm) end
    return #bsm:batches()
  end
  local n = epoch_len(self)
  if not self.auto_batching then return n end
  if self.drop_last then return math.floor(n / self.batch_size) end
  return math.ceil(n / self.batch_size)
end

-- The dataset index v at position k of batch b of a batch_sampler, checked (n samples).
local function batch_index(v, n, b, k)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 0 or v >= n then
    lib.raise(("DataLoader: batch_sampler index %s at position %d of batch %d is out of range 0..%d (indices count from 0)")
      :format(tostring(v), k, b, n - 1))
  end
  return v
end

-- A batch_sampler's epoch (Note [batch sampler]): its batches() joined as one 1-d i64
-- tensor of 0-based indices, the 0-based start of each batch in it followed by the total
-- (a Lua list of nb + 1), and the largest batch.
local function batch_sampler_order(self, n)
  local batches = self.batch_sampler:batches()
  if type(batches) ~= "table" then
    lib.raise("DataLoader: batch_sampler:batches() must return a list of batches, got " .. type(batches))
  end
  local starts, total, largest = { 0 }, 0, 0
  for b, batch in ipairs(batches) do
    local len
    if is_tensor(batch) then
      if batch:dim() ~= 1 then lib.raise(("DataLoader: batch_sampler batch %d is a tensor that is not 1-d"):format(b)) end
      len = batch:numel()
    elseif type(batch) == "table" then
      len = #batch
    else
      lib.raise(("DataLoader: batch_sampler batch %d is a %s, not a list of indices"):format(b, type(batch)))
    end
    if len == 0 then lib.raise(("DataLoader: batch_sampler batch %d has no index"):format(b)) end
    total = total + len
    starts[b + 1] = total
    largest = math.max(largest, len)
  end
  local buf = ffi.new("int64_t[?]", math.max(total, 1))
  for b, batch in ipairs(batches) do
    local at = starts[b]
    if is_tensor(batch) then batch = batch:tolist() end
    for k = 1, #batch do buf[at + k - 1] = batch_index(batch[k], n, b, k) end
  end
  local len = ffi.new("int64_t[1]", total)
  check(C.ddp_tensor_from_data(box, 1, len, C.DDP_I64, buf, C.DDP_I64))
  return wrap(box[0]), starts, largest
end

-- The epoch's order as a 1-d i64 tensor of 0-based indices; with a batch_sampler also its
-- batches' starts and largest batch (batch_sampler_order).
local function epoch_order(self)
  local n = object.len(self.dataset)
  if self.batch_sampler then return batch_sampler_order(self, n) end
  if self.sampler then
    local idx = self.sampler:indices()
    if is_tensor(idx) then
      if idx:dim() ~= 1 then lib.raise("DataLoader: sampler:indices() returned a tensor that is not 1-d") end
      if idx.dtype ~= "i64" then idx = idx:to("i64") end
      if idx:numel() > 0 then -- as the list's check below: a Lua dataset's get may not check
        local lo, hi = idx:min():item(), idx:max():item()
        if lo < 0 or hi >= n then
          local bad = lo < 0 and lo or hi
          lib.raise(("DataLoader: sampler index %d is out of range 0..%d (indices count from 0)"):format(bad, n - 1))
        end
      end
      return idx
    end
    if type(idx) ~= "table" then lib.raise("DataLoader: sampler:indices() must return a table or an i64 tensor") end
    local buf = ffi.new("int64_t[?]", math.max(#idx, 1))
    for i = 1, #idx do
      local v = idx[i]
      if type(v) ~= "number" or v % 1 ~= 0 or v < 0 or v >= n then
        lib.raise(("DataLoader: sampler index %s at position %d is out of range 0..%d (indices count from 0)"):format(
          tostring(v), i, n - 1))
      end
      buf[i - 1] = v
    end
    local len = ffi.new("int64_t[1]", #idx)
    check(C.ddp_tensor_from_data(box, 1, len, C.DDP_I64, buf, C.DDP_I64))
    return wrap(box[0])
  end
  if self.shuffle then
    check(C.ddp_randperm(box, n, C.DDP_I64, self.generator.handle))
    return wrap(box[0])
  end
  check(C.ddp_arange(box, 0, n, 1, C.DDP_I64))
  return wrap(box[0])
end

-- Stop the current epoch: the C loader (joins its thread, frees queued batches) and, unless
-- they are persistent, the epoch's workers.
local function close_epoch(self)
  local ep = self.epoch
  if ep and ep.handle ~= nil then
    local h = ep.handle
    ep.handle = nil
    ffi.gc(h, nil)
    C.ddp_io_loader_free(h)
  end
  self.epoch = nil
  if self.workers and not self.persistent_workers then
    workers.stop(self.workers)
    self.workers = nil
  end
end

--- loader:close(): stop the current epoch's C loader (joins its thread, frees queued
-- batches) and the worker processes, persistent ones included (each is reaped: Note
-- [dataloader workers]). iter() and the end of an epoch do the same but keep persistent
-- workers; the collector does it for a loader that is dropped. Safe to call any time and
-- twice; the loader stays usable (a later iter() starts new workers).
function DataLoader.close(self)
  close_epoch(self)
  if self.workers then
    workers.stop(self.workers)
    self.workers = nil
  end
end

--- loader:worker_pids() -> the pids of the running worker processes (a list, empty when
-- none run), e.g. to check that persistent workers are the same processes each epoch.
function DataLoader.worker_pids(self)
  local out = {}
  if self.workers and self.workers.handle ~= nil then
    for w = 0, self.num_workers - 1 do out[w + 1] = C.ddp_io_workers_pid(self.workers.handle, w) end
  end
  return out
end

-- Note [epoch iterators]: an epoch's iterator is a table made callable (lib.iterator) whose
-- step function is shared by every epoch, not a closure over the epoch: a loop compiled
-- while the first epoch's closure was the only one kept that closure, its loader and
-- dataset (a 1 MB TensorDataset) live after the script dropped them (Note [traces keep
-- closures] in ddplua/lib.lua).

-- C path: the next batch of a ddp_io_loader (it.ep.handle), a tensor per source.
local c_epoch = lib.iterator(function(it)
  local self, ep = it.loader, it.ep
  local h = ep.handle
  if h == nil then return nil end
  lib.release_step() -- the previous batch's dropped temporaries (Note [step lifetimes])
  local outs, n = it.outs, it.n
  local st = C.ddp_io_loader_next(h, outs)
  if st == C.DDP_IO_END then
    if self.epoch == ep then close_epoch(self) else ep.handle = nil end
    return nil
  end
  check(st)
  if n == 2 then return wrap(outs[0]), wrap(outs[1]) end
  local res = it.res
  for k = 1, n do res[k] = wrap(outs[k - 1]) end
  return unpack(res, 1, n)
end)

-- C path: the iterator over a ddp_io_loader.
local function c_iter(self, sources, tfs, order)
  local n = #sources
  local srcs = ffi.new("ddp_tensor*[?]", n)
  local specs = ffi.new("ddp_io_transform[?]", n)
  for k = 1, n do
    srcs[k - 1] = sources[k]
    if tfs[k] then specs[k - 1] = transforms.spec(tfs[k], C.ddp_tensor_dtype(sources[k])) end
  end
  local lbox = ffi.new("ddp_io_loader*[1]")
  local pin = self.pin_memory and 1 or 0
  local prefetch = self.prefetch or (self.num_workers > 0 and self.num_workers * self.prefetch_factor)
    or C.ddp_io_loader_default_prefetch(pin)
  check(C.ddp_io_loader_new(lbox, n, srcs, specs, order, self.batch_size, self.drop_last and 1 or 0,
    prefetch, pin, self.generator.handle))
  local ep = { handle = ffi.gc(lbox[0], C.ddp_io_loader_free) }
  self.epoch = ep
  return c_epoch { loader = self, ep = ep, n = n, outs = ffi.new("ddp_tensor*[?]", n), res = {} }
end

-- Note [default collation]: the default collation is PyTorch's default_collate, applied
-- to each value that ds:get returns (a Lua function's several results are PyTorch's tuple:
-- the loop receives one collated value per position). For the B samples' values at one
-- place, by the type of sample 1's:
--   tensor            -> the stack, (B, ...) (all of one shape and dtype);
--   number            -> a 1-d i64 tensor when all are integers, else f64 (PyTorch's int
--                        and float); boolean -> a bool tensor;
--   string            -> the list of the B strings (PyTorch keeps strings as a list);
--   table with keys   -> a table with the same keys, each collated over the B samples
--                        (PyTorch's Mapping; every sample must have sample 1's keys);
--   list {v1, .., vn} -> the list of the n positions, each collated (PyTorch's Sequence;
--                        every sample must have n elements); {} gives {}.
-- Nested tables are collated the same way, at most MAX_COLLATE_DEPTH deep. A table that
-- mixes list positions and keys, a function, userdata or nil is refused, naming the place
-- (part 1.image, part 2[3]) and the sample. In a DataLoader worker a tensor place is left
-- for the worker to stack into its slot (workers.stack_later), wherever it is nested.
local MAX_COLLATE_DEPTH = 100

-- The name of key `key` under place `path` in messages: part 1.image, part 1["a b"], part 1[2].
local function sub_place(path, key)
  if type(key) == "number" then return ("%s[%d]"):format(path, key) end
  if type(key) == "string" and key:match("^[%a_][%w_]*$") then return path .. "." .. key end
  return ("%s[%q]"):format(path, tostring(key))
end

-- The B tensors of one place (sample 1's is a tensor), as a C array for ddp_io_stack.
local function tensor_items(values, path)
  local arr = ffi.new("ddp_tensor*[?]", #values)
  for i, v in ipairs(values) do
    if not is_tensor(v) then lib.raise(("DataLoader: %s of sample %d is not a tensor (sample 1's is)"):format(path, i)) end
    arr[i - 1] = v
  end
  return arr
end

-- Raise the C error of a stack or its check (status ~= 0) naming the place it was for.
local function check_stack(status, path)
  if status ~= 0 then lib.raise(("DataLoader: %s: %s"):format(path, ffi.string(C.ddp_last_error()))) end
end

-- The stack of the B tensors of one place, (B, ...).
local function stack_now(values, path)
  check_stack(C.ddp_io_stack(box, #values, tensor_items(values, path)), path)
  return wrap(box[0])
end

-- The tensor of B numbers or booleans of one place (Note [default collation]).
local function collate_scalars(values, path)
  local tv = type(values[1])
  local buf = ffi.new("double[?]", #values)
  local integral = true
  for i, v in ipairs(values) do
    if type(v) ~= tv then lib.raise(("DataLoader: %s of sample %d is a %s, sample 1's is a %s"):format(path, i, type(v), tv)) end
    if tv == "boolean" then v = v and 1 or 0 end
    if v % 1 ~= 0 then integral = false end
    buf[i - 1] = v
  end
  local dtype = tv == "boolean" and C.DDP_BOOL or integral and C.DDP_I64 or C.DDP_F64
  local len = ffi.new("int64_t[1]", #values)
  check(C.ddp_tensor_from_data(box, 1, len, dtype, buf, C.DDP_F64))
  return wrap(box[0])
end

-- What table t is for the collation: "list" when its keys are 1 .. #t ({} included),
-- "keys" when #t is 0 and it has keys, nil when it mixes list positions and other keys.
local function table_kind(t)
  local n = #t
  for key in pairs(t) do
    if not (type(key) == "number" and key >= 1 and key <= n and key % 1 == 0) then
      return n == 0 and "keys" or nil
    end
  end
  return "list"
end

-- The B samples' values at `key` of their tables at place `path` (a list position or a
-- field). A missing one raises: a hole in a list would shift the later samples' values
-- into its place, a missing field leave the batch short.
local function column_of(values, key, path)
  local column = {}
  for i, v in ipairs(values) do
    if v[key] == nil then
      if type(key) == "number" then lib.raise(("DataLoader: %s of sample %d is nil"):format(sub_place(path, key), i)) end
      lib.raise(("DataLoader: %s of sample %d has no field '%s' (sample 1's has)"):format(path, i, tostring(key)))
    end
    column[i] = v[key]
  end
  return column
end

-- The B samples' values of one place, collated (Note [default collation]); stack(values,
-- path) stacks the tensor places.
local function collate_place(values, path, stack, depth)
  local first = values[1]
  if is_tensor(first) then return stack(values, path) end
  local tv = type(first)
  if tv == "number" or tv == "boolean" then return collate_scalars(values, path) end
  if tv == "string" then
    local out = {}
    for i, v in ipairs(values) do
      if type(v) ~= "string" then lib.raise(("DataLoader: %s of sample %d is a %s, sample 1's is a string"):format(path, i, type(v))) end
      out[i] = v
    end
    return out
  end
  if tv ~= "table" then lib.raise(("DataLoader: cannot collate %s of type %s"):format(path, tv)) end
  if depth >= MAX_COLLATE_DEPTH then
    lib.raise(("DataLoader: cannot collate %s: its tables nest more than %d deep"):format(path, MAX_COLLATE_DEPTH))
  end
  local kind = table_kind(first)
  if not kind then
    lib.raise(("DataLoader: cannot collate %s: sample 1's table mixes list positions and keys"):format(path))
  end
  for i, v in ipairs(values) do
    if type(v) ~= "table" or is_tensor(v) then
      lib.raise(("DataLoader: %s of sample %d is a %s, sample 1's is a table"):format(path, i, is_tensor(v) and "tensor" or type(v)))
    end
  end
  local out = {}
  if kind == "list" then
    local n = #first
    for i, v in ipairs(values) do
      if #v ~= n or table_kind(v) ~= "list" then
        lib.raise(("DataLoader: %s of sample %d is not a list of %d elements as sample 1's "
          .. "(each element in list of batch should be of equal size)"):format(path, i, n))
      end
    end
    for j = 1, n do out[j] = collate_place(column_of(values, j, path), sub_place(path, j), stack, depth + 1) end
  else
    for key in pairs(first) do
      out[key] = collate_place(column_of(values, key, path), sub_place(path, key), stack, depth + 1)
    end
  end
  return out
end

-- Collate place k (a get's k-th value) of B samples (Note [default collation]).
local function collate_part(values, k, stack)
  return collate_place(values, "part " .. tostring(k), stack or stack_now, 0)
end

-- In a worker: check a tensor place and leave it to the worker to stack into its slot.
local function stack_in_slot(values, path)
  check_stack(C.ddp_io_stack_check(#values, tensor_items(values, path)), path)
  return workers.stack_later(values)
end

--- data.default_collate(samples) -> the batch's parts: the default collation of a list of
-- samples (PyTorch's default_collate), each a value or a list of values (as collate_fn
-- receives them). Tensors of one shape and dtype stack to (B, ...); numbers become an i64
-- tensor when all are integers, else f64; booleans a bool tensor; strings stay a list;
-- tables with keys give a table of collated fields and lists a list of collated
-- positions, at any depth (Note [default collation]). Samples that are lists give one
-- collated part per position, returned as several values (what the DataLoader yields for
-- a get that returns several values). Raises naming the place and the sample that does not
-- fit.
function M.default_collate(samples)
  if type(samples) ~= "table" or #samples == 0 then
    lib.raise("default_collate: expected a non-empty list of samples, got " .. type(samples))
  end
  local first = samples[1]
  if type(first) ~= "table" or is_tensor(first) or table_kind(first) ~= "list" or #first == 0 then
    return collate_part(samples, 1)
  end
  local nparts = #first
  local parts = {}
  for k = 1, nparts do parts[k] = {} end
  for i, s in ipairs(samples) do
    if type(s) ~= "table" or is_tensor(s) or #s ~= nparts then
      lib.raise(("default_collate: sample %d has %s parts, sample 1 has %d"):format(i,
        (type(s) == "table" and not is_tensor(s)) and #s or "no", nparts))
    end
    for k = 1, nparts do
      if s[k] == nil then lib.raise(("default_collate: part %d of sample %d is nil"):format(k, i)) end
      parts[k][i] = s[k]
    end
  end
  local out = {}
  for k = 1, nparts do out[k] = collate_part(parts[k], k) end
  return unpack(out, 1, nparts)
end

-- v with its tensors pinned (pin_memory): a tensor's pinned copy, a table's copy with its
-- values pinned at any depth (PyTorch's pin_memory walks mappings and sequences the same
-- way; the batch's own tables are not changed), anything else as it is.
local function pinned(v, depth)
  if is_tensor(v) then
    check(C.ddp_tensor_pin_memory(box, v))
    return wrap(box[0])
  end
  if type(v) ~= "table" or depth >= MAX_COLLATE_DEPTH then return v end
  local c = {}
  for key, x in pairs(v) do c[key] = pinned(x, depth + 1) end
  return setmetatable(c, getmetatable(v))
end

-- Pin the tensors in values[1..n] (pin_memory), replacing each value by its pinned form.
local function pin_all(values, n)
  for k = 1, n do values[k] = pinned(values[k], 0) end
end

-- Raise for ds:get(i) that returned no value: an empty batch would end the training loop's
-- for as if the epoch were over.
local function got_nothing(i)
  lib.raise(("DataLoader: ds:get(%d) returned nothing (a sample is one value or several)"):format(i))
end

-- One batch of the Lua path from the 0-based sample indices idx[0 .. count-1] (batch b,
-- counting from 1, for messages): ds:get for each, collated by the default or by
-- collate_fn. where.sample (when where is given) holds the ds:get index in progress.
-- Returns the batch's values and their count. Runs in the training process
-- (num_workers = 0) or in a worker (in_worker true), where a part of tensors under the
-- default collation is checked and left for the worker to stack into its slot (Note
-- [stacking in the slot], runtime/io/workers.c).
local function make_batch(self, idx, count, b, where, in_worker)
  local ds = self.dataset
  local collate_fn = self.collate_fn
  local out, n
  if not self.auto_batching then -- one sample, not collated (Note [no automatic batching])
    local i = tonumber(idx[0]) + 1
    if where then where.sample = i end
    local sample = { ds:get(i) }
    if where then where.sample = nil end
    n = table.maxn(sample)
    if n == 0 then got_nothing(i) end
    if not collate_fn then return sample, n end
    out = { collate_fn(n == 1 and sample[1] or sample) }
    n = table.maxn(out)
    if out[1] == nil then
      lib.raise(("DataLoader: collate_fn returned nil for sample %d (it must return the sample)"):format(i))
    end
    return out, n
  end
  if collate_fn then
    local samples = {}
    for p = 0, count - 1 do
      local i = tonumber(idx[p]) + 1
      if where then where.sample = i end
      local sample = { ds:get(i) }
      local cnt = table.maxn(sample)
      samples[#samples + 1] = cnt == 1 and sample[1] or sample
    end
    if where then where.sample = nil end
    out = { collate_fn(samples) }
    n = table.maxn(out)
    if out[1] == nil then
      lib.raise(("DataLoader: collate_fn returned nil for batch %d (it must return the batch)"):format(b))
    end
  else
    local parts, nparts = {}, nil
    for p = 0, count - 1 do
      local i = tonumber(idx[p]) + 1
      if where then where.sample = i end
      local sample = { ds:get(i) }
      local cnt = table.maxn(sample)
      nparts = nparts or cnt
      if cnt ~= nparts then lib.raise(("DataLoader: samples have %d and %d parts"):format(nparts, cnt)) end
      for k = 1, cnt do
        -- a nil would shift the later samples' values into its place
        if sample[k] == nil then lib.raise(("DataLoader: part %d of ds:get(%d) is nil"):format(k, i)) end
        parts[k] = parts[k] or {}
        parts[k][p + 1] = sample[k]
      end
    end
    if where then where.sample = nil end
    if nparts == 0 then
      got_nothing(tonumber(idx[0]) + 1)
    end
    out, n = {}, nparts
    for k = 1, nparts do out[k] = collate_part(parts[k], k, in_worker and stack_in_slot or nil) end
  end
  return out, n
end

-- Batch b's (0-based) part of the epoch's order it.idx[start .. stop-1]: from the
-- batch_sampler's starts (Note [batch sampler]), else batch_size samples each.
local function batch_bounds(it, b)
  local starts = it.starts
  if starts then return starts[b + 1], starts[b + 2] end
  local bs = it.loader.batch_size or 1 -- one sample at a time: Note [no automatic batching]
  local start = b * bs
  return start, math.min(start + bs, it.total)
end

-- The epoch's count of batches: the batch_sampler's, else by batch_size and drop_last.
local function batch_count(self, total, starts)
  if starts then return #starts - 1 end
  local bs = self.batch_size or 1 -- Note [no automatic batching]
  return self.drop_last and math.floor(total / bs) or math.ceil(total / bs)
end

-- Lua path: batch it.b + 1 of it.nb from ds:get (Note [epoch iterators]).
local lua_epoch = lib.iterator(function(it)
  local self = it.loader
  if it.b >= it.nb or self.epoch ~= it.ep then return nil end
  lib.release_step() -- Note [step lifetimes], ddplua/lib.lua
  local start, stop = batch_bounds(it, it.b)
  it.b = it.b + 1
  local out, n = make_batch(self, it.idx + start, stop - start, it.b)
  if self.pin_memory then pin_all(out, n) end
  return unpack(out, 1, n)
end)

-- Lua path: batches from ds:get, collated by the default or by collate_fn.
local function lua_iter(self, order, starts)
  local total = order:numel()
  local nb = batch_count(self, total, starts)
  -- ep keeps `order` alive: idx points into its storage, and nothing else holds it
  local ep = { handle = nil, order = order }
  self.epoch = ep
  return lua_epoch { loader = self, ep = ep, b = 0, nb = nb, total = total, starts = starts,
    idx = ffi.cast("const int64_t*", C.ddp_tensor_data(order)) }
end

-- Worker path (Note [dataloader workers]): batch b from worker b % num_workers, at most
-- prefetch_factor batches per worker in flight.
local tensor_buf = ffi.new("ddp_tensor*[?]", 256)
local ntensors_box = ffi.new("int[1]")
local meta_box = ffi.new("char*[1]")
local meta_len_box = ffi.new("size_t[1]")

-- The loader's worker group, started (forked) when there is none (Note [dataloader
-- workers]); make(indices, count, b, where, tag) is what the workers run per task, and
-- `largest` the most samples a task of this epoch has. Persistent workers whose task
-- buffers are smaller (a batch_sampler's larger batch) are replaced by new ones.
local function worker_group(self, make, largest)
  local group = self.workers
  if group and group.handle ~= nil and group.largest < largest then
    workers.stop(group)
    self.workers, group = nil, nil
  end
  if not group or group.handle == nil then
    group = workers.start {
      dataset = self.dataset, num_workers = self.num_workers, worker_init_fn = self.worker_init_fn,
      batch_size = largest, prefetch_factor = self.prefetch_factor,
      seed = workers.base_seed(self.generator, self.epochs), make_batch = make,
    }
    group.largest = largest
    self.workers = group
  end
  group.tag = group.tag + 1
  return group, group.tag
end

-- The error of a failed worker call (status ~= 0), or of a worker's error (status 0):
-- stops the group unless it is persistent and sound, ends the epoch; returns the message.
local function worker_failure(self, group, ep, status)
  local msg = ffi.string(C.ddp_last_error())
  if status ~= 0 or not self.persistent_workers then
    workers.stop(group)
    if self.workers == group then self.workers = nil end
  end
  if self.epoch == ep then self.epoch = nil end
  return msg
end

-- Worker `w`'s result for batch b of epoch `tag`: its values and count, or nil at the end of
-- its stream; raises the worker's error or the channel's.
local function take_batch(self, group, ep, w, tag, b)
  -- Note [lent slots] (runtime/io/workers.c): the batches the loop dropped hold worker w's
  -- slots until a collection finds them; without one its batch would be copied out
  if C.ddp_io_workers_lend_full(group.handle, w) ~= 0 then lib.collect() end
  local st = C.ddp_io_workers_get(group.handle, w, tag, b, self.timeout, tensor_buf, 256, ntensors_box,
    meta_box, meta_len_box)
  if st ~= 0 then lib.raise(worker_failure(self, group, ep, st)) end
  local meta = meta_box[0] ~= nil and ffi.string(meta_box[0], meta_len_box[0]) or ""
  C.ddp_io_string_free(meta_box[0])
  local nt = ntensors_box[0]
  if nt < 0 then -- the worker's error, with its traceback
    worker_failure(self, group, ep, 0)
    lib.raise(meta)
  end
  return workers.unflatten(tensor_buf, nt, meta)
end

-- Give batch it.sent of the epoch to its worker (it.sent % num_workers).
local function send_next(it)
  local self, sent = it.loader, it.sent
  local nw = self.num_workers
  local start, stop = batch_bounds(it, sent)
  local st = C.ddp_io_workers_put(it.group.handle, sent % nw, it.tag, sent, it.idx + start, stop - start)
  if st ~= 0 then lib.raise(worker_failure(self, it.group, it.ep, st)) end
  it.sent = sent + 1
  -- the epoch's last task: workers that end with the epoch exit once their results are
  -- sent, while the loop takes the batches they made ahead (Note [finished workers],
  -- runtime/io/workers.c)
  if it.sent == it.nb and not self.persistent_workers then
    for w = 0, nw - 1 do check(C.ddp_io_workers_finish(it.group.handle, w)) end
  end
end

-- Worker path: batch it.got + 1 of it.nb, from worker it.got % num_workers (Note [epoch
-- iterators]).
local worker_epoch = lib.iterator(function(it)
  local self, ep, group = it.loader, it.ep, it.group
  if self.epoch ~= ep or group.handle == nil then return nil end
  if it.got >= it.nb then
    if not self.persistent_workers and self.workers == group then
      -- every result read from workers told the epoch ended: the loop need not wait for
      -- their exit (Note [retired workers], runtime/io/workers.c)
      workers.retire(group)
      self.workers = nil
    end
    close_epoch(self)
    return nil
  end
  lib.release_step() -- Note [step lifetimes], ddplua/lib.lua
  local got = it.got
  local out, n = take_batch(self, group, ep, got % self.num_workers, it.tag, got)
  it.got = got + 1
  if it.sent < it.nb then send_next(it) end -- the slot is the batch's (Note [lent slots])
  if self.pin_memory then pin_all(out, n) end
  return unpack(out, 1, n)
end)

local function worker_iter(self, order, starts, largest)
  local total = order:numel()
  local nb = batch_count(self, total, starts)
  self.epochs = self.epochs + 1
  local group, tag = worker_group(self, function(indices, count, b, where)
    return make_batch(self, indices, count, b + 1, where, true)
  end, largest or self.batch_size or 1)
  -- ep keeps `order` alive: idx points into its storage
  local ep = { handle = nil, order = order }
  self.epoch = ep
  local it = worker_epoch { loader = self, ep = ep, group = group, tag = tag, nb = nb, total = total,
    starts = starts, idx = ffi.cast("const int64_t*", C.ddp_tensor_data(order)), sent = 0, got = 0 }
  while it.sent < math.min(nb, self.prefetch_factor * self.num_workers) do send_next(it) end
  return it
end

-- Whether ds is an iterable dataset (a stream: ds.is_iterable, samples from ds:stream(),
-- the protocol of ddplua.data.iterable_dataset).
local function is_iterable(ds)
  local ok, v = pcall(function() return ds.is_iterable end)
  return ok and v == true
end

-- In a worker: the batches of its copy of an iterable dataset's stream (sharded over the
-- workers by the stream itself through get_worker_info: Note [iterable sharding]), a new
-- stream for each epoch `tag`; nil once it ended (a short last batch is kept unless
-- drop_last).
local function stream_batches(self)
  local stream_tag, stream, done
  return function(_, _, _, where, tag)
    where.stream = true -- for the error message: the stream's sample in progress
    if tag ~= stream_tag then stream_tag, stream, done = tag, self.dataset:stream(), false end
    if done then return nil end
    if not self.auto_batching then -- each sample as it is (Note [no automatic batching])
      where.position = 1
      local sample = { stream() }
      local n = table.maxn(sample)
      where.stream = nil
      if n == 0 then
        done = true
        return nil
      end
      if not self.collate_fn then return sample, n end
      local out = { self.collate_fn(n == 1 and sample[1] or sample) }
      if out[1] == nil then lib.raise("DataLoader: collate_fn returned nil (it must return the batch)") end
      return out, table.maxn(out)
    end
    local samples = {}
    while #samples < self.batch_size do
      where.position = #samples + 1
      local sample = { stream() }
      local n = table.maxn(sample)
      if n == 0 then
        done = true
        break
      end
      samples[#samples + 1] = n == 1 and sample[1] or sample
    end
    where.stream = nil
    if #samples == 0 or (self.drop_last and #samples < self.batch_size) then
      done = true
      return nil
    end
    local out = { (self.collate_fn or M.default_collate)(samples) }
    if out[1] == nil then lib.raise("DataLoader: collate_fn returned nil (it must return the batch)") end
    return out, table.maxn(out)
  end
end

-- Ask worker w of an iterable dataset for its next batch (task sent[w] * num_workers + w).
local function send_stream_task(it, w)
  local nw = it.loader.num_workers
  local st = C.ddp_io_workers_put(it.group.handle, w, it.tag, it.sent[w] * nw + w, nil, 0)
  if st ~= 0 then lib.raise(worker_failure(it.loader, it.group, it.ep, st)) end
  it.sent[w] = it.sent[w] + 1
end

-- Iterable dataset with workers: the next batch, from worker it.w or the next whose stream
-- has not ended (Note [epoch iterators]).
local stream_epoch = lib.iterator(function(it)
  local self, ep, group = it.loader, it.ep, it.group
  if self.epoch ~= ep or group.handle == nil then return nil end
  lib.release_step() -- Note [step lifetimes], ddplua/lib.lua
  local nw, taken, ended = self.num_workers, it.taken, it.ended
  while it.left > 0 do
    local w = it.w
    while ended[w] do w = (w + 1) % nw end
    local out, n = take_batch(self, group, ep, w, it.tag, taken[w] * nw + w)
    taken[w] = taken[w] + 1
    if out == nil then
      ended[w] = true
      it.left = it.left - 1
      it.w = w
    else
      send_stream_task(it, w)
      it.w = (w + 1) % nw
      if self.pin_memory then pin_all(out, n) end
      return unpack(out, 1, n)
    end
  end
  close_epoch(self)
  return nil
end)

-- Iterable dataset with workers: each worker batches its own shard of the stream; the loop
-- takes one batch from each worker in turn (worker k-th batch is task k * num_workers + w),
-- skipping the workers whose stream ended, until every stream ended: PyTorch's order for an
-- IterableDataset with workers.
local function iterable_worker_iter(self)
  local nw, pf = self.num_workers, self.prefetch_factor
  self.epochs = self.epochs + 1
  local group, tag = worker_group(self, stream_batches(self), 1)
  local ep = { handle = nil }
  self.epoch = ep
  local it = stream_epoch { loader = self, ep = ep, group = group, tag = tag, sent = {}, taken = {},
    ended = {}, left = nw, w = 0 }
  for w = 0, nw - 1 do
    it.sent[w], it.taken[w] = 0, 0
    for _ = 1, pf do send_stream_task(it, w) end
  end
  return it
end

-- An iterable dataset's batches (it.batches), pinned (Note [epoch iterators]).
local pinned_stream = lib.iterator(function(it)
  local out = { it.batches() }
  pin_all(out, table.maxn(out))
  return unpack(out, 1, table.maxn(out))
end)

--- loader:iter(): an iterator for one epoch, `for x, y in loader:iter() do ... end`,
-- yielding one tensor per sample part (B, ...), in the order of the epoch (shuffled afresh
-- on every call when shuffle is set; the sampler's indices() otherwise). Starting a new
-- iter() stops the previous epoch's loader; leaving the loop early is fine (the thread is
-- stopped by the next iter(), loader:close() or the collector).
function DataLoader.iter(self)
  close_epoch(self)
  if self.num_workers > 0 and is_iterable(self.dataset) then return iterable_worker_iter(self) end
  if iterable.is_iterable(self.dataset) then -- a stream: batches in stream order
    local collate = self.collate_fn or (self.auto_batching and M.default_collate or nil)
    local it = iterable.batches(self.dataset, self.batch_size, self.drop_last, collate)
    if not self.pin_memory then return it end
    return pinned_stream { batches = it }
  end
  local order, starts, largest = epoch_order(self)
  local ds = self.dataset
  local ok, f = pcall(function() return ds.c_sources end)
  if ok and type(f) == "function" and not self.collate_fn and not starts and self.auto_batching then
    local sources, tfs = f(ds)
    if sources then
      local len = object.len(ds)
      for k, s in ipairs(sources) do
        if s:size(1) ~= len then
          lib.raise(("DataLoader: c_sources()[%d] has %d samples but the dataset has %d"):format(k, s:size(1), len))
        end
      end
      return c_iter(self, sources, tfs or {}, order)
    end
  end
  if self.num_workers > 0 then return worker_iter(self, order, starts, largest) end
  return lua_iter(self, order, starts)
end

function DataLoader.__tostring(self)
  local size = self.batch_sampler and "batch_sampler = " .. tostring(self.batch_sampler)
    or "batch_size = " .. tostring(self.batch_size or false)
  return ("DataLoader(%s, %s, %d batches)"):format(tostring(self.dataset), size, DataLoader.len(self))
end

return M
