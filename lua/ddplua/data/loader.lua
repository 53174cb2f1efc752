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
-- collate_fn (PyTorch's DataLoader argument): a function that receives the list of the
-- batch's samples and returns the batch. Each sample is what ds:get(i) returned: the value
-- itself when get returns one value, else the list {v1, v2, ...} of its values (Lua's
-- tuple). Whatever collate_fn returns (one or several values) is what the iterator yields;
-- it must return something other than nil (nil would end the for loop). With collate_fn
-- every batch takes the Lua path (ds:get per sample), as PyTorch calls dataset[i] for each.
-- data.default_collate(samples) is the default's collation of such a list, for a
-- collate_fn that adjusts it.
--
-- An IterableDataset (ddplua/data/iterable_dataset.lua) is read as a stream: batches of its
-- ds:stream() in order (its share for this rank, Note [iterable sharding]), collated as
-- above; no sampler or shuffle (PyTorch's rule), and #loader only when the dataset has len.
--
-- Sampler protocol: any object with sampler:indices() returning the epoch's sample order
-- as a Lua table or a 1-d i64 tensor of 0-based indices (dataset positions minus one, as
-- PyTorch's samplers yield). Called once per iter(). Optionally sampler:len() (or #sampler)
-- gives the count without drawing the order (used by #loader). A DistributedSampler
-- plugs in here; its set_epoch is the caller's business, as in PyTorch.
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local transforms = require "ddplua.data.transforms"
local generator = require "ddplua.generator"
local iterable = require "ddplua.data.iterable_dataset"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

local DataLoader = { name = "DataLoader" }

local function is_tensor(v) return require("ddplua.tensor").is_tensor(v) end

local KNOWN = options.known { "batch_size", "shuffle", "sampler", "generator", "drop_last", "prefetch", "pin_memory",
  "collate_fn" }

--- data.DataLoader(dataset, opts): batches of `dataset`.
-- opts.batch_size (64), opts.shuffle (false: a new dl.randperm order each iter(), drawn from
-- opts.generator), opts.sampler (see the protocol above; not with shuffle),
-- opts.generator (a dl.Generator; the default generator when nil; drives shuffling and the
-- random transforms), opts.drop_last (false: keep the short last batch), opts.prefetch
-- (batches the C loader's thread keeps ready; 0: no thread, each batch made on the caller's
-- thread and split over the thread pool; nil: chosen at each iter(), 2 when the compute
-- threads of the node's processes leave a core free or pin_memory is set, else 0: Note
-- [default prefetch] in runtime/io/loader.c), opts.pin_memory (false: true
-- puts every batch tensor in pinned host memory, so that x:to("cuda", {non_blocking =
-- true}) copies it asynchronously; on the C path the prefetch thread does the pinning, see
-- Note [pinned batches] in runtime/io/loader.c; without CUDA nothing is pinned, as PyTorch,
-- and loader.pin_memory reads false), opts.collate_fn (nil: the default collation; a
-- function(samples) -> batch, see the top of this file). Raises on bad options.
function M.DataLoader(dataset, opts)
  opts = options.check("DataLoader", opts, KNOWN)
  local known = { batch_size = true, shuffle = true, generator = true, sampler = true, drop_last = true, prefetch = true,
    pin_memory = true, collate_fn = true }
  for k in pairs(opts) do
    if not known[k] then lib.raise("DataLoader: unknown option '" .. tostring(k) .. "'") end
  end
  if dataset == nil or (type(dataset) ~= "table" and type(dataset) ~= "userdata") then
    lib.raise("DataLoader: expected a dataset, got " .. type(dataset))
  end
  local bs = opts.batch_size or 64
  if type(bs) ~= "number" or bs < 1 or bs % 1 ~= 0 then
    lib.raise("DataLoader: batch_size must be a positive integer, got " .. tostring(bs))
  end
  local prefetch = opts.prefetch -- nil: chosen at each iter() (Note [default prefetch])
  if prefetch ~= nil and (type(prefetch) ~= "number" or prefetch < 0 or prefetch % 1 ~= 0) then
    lib.raise("DataLoader: prefetch must be an integer >= 0, got " .. tostring(prefetch))
  end
  if opts.sampler and opts.shuffle then
    lib.raise("DataLoader: sampler and shuffle = true are mutually exclusive")
  end
  if opts.collate_fn ~= nil and type(opts.collate_fn) ~= "function" then
    lib.raise("DataLoader: collate_fn must be a function(samples) -> batch, got " .. type(opts.collate_fn))
  end
  if iterable.is_iterable(dataset) and (opts.sampler or opts.shuffle) then
    lib.raise(("DataLoader with IterableDataset: expected unspecified %s option, but got %s"):format(
      opts.sampler and "sampler" or "shuffle", opts.sampler and tostring(opts.sampler) or "shuffle=true"))
  end
  if opts.sampler and type(opts.sampler.indices) ~= "function" then
    lib.raise("DataLoader: sampler must have an indices() method")
  end
  return object.new(DataLoader, {
    dataset = dataset, batch_size = bs, shuffle = opts.shuffle and true or false,
    sampler = opts.sampler, generator = opts.generator or generator.default,
    drop_last = opts.drop_last and true or false, prefetch = prefetch, epoch = nil,
    pin_memory = (opts.pin_memory and C.ddp_cuda_is_available() ~= 0) and true or false,
    collate_fn = opts.collate_fn,
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

--- Number of batches per epoch: ceil(len / batch_size), floor with drop_last.
function DataLoader.len(self)
  local n = epoch_len(self)
  if self.drop_last then return math.floor(n / self.batch_size) end
  return math.ceil(n / self.batch_size)
end

-- The epoch's order as a 1-d i64 tensor of 0-based indices.
local function epoch_order(self)
  local n = object.len(self.dataset)
  if self.sampler then
    local idx = self.sampler:indices()
    if is_tensor(idx) then
      if idx:dim() ~= 1 then lib.raise("DataLoader: sampler:indices() returned a tensor that is not 1-d") end
      if idx.dtype ~= "i64" then idx = idx:to("i64") end
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

--- Stop the current epoch's C loader (joins its thread, frees queued batches). Called by
-- iter() before a new epoch and when an epoch ends; safe to call any time.
function DataLoader.close(self)
  local ep = self.epoch
  if ep and ep.handle ~= nil then
    local h = ep.handle
    ep.handle = nil
    ffi.gc(h, nil)
    C.ddp_io_loader_free(h)
  end
  self.epoch = nil
end

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
  local prefetch = self.prefetch or C.ddp_io_loader_default_prefetch(pin)
  check(C.ddp_io_loader_new(lbox, n, srcs, specs, order, self.batch_size, self.drop_last and 1 or 0,
    prefetch, pin, self.generator.handle))
  local ep = { handle = ffi.gc(lbox[0], C.ddp_io_loader_free) }
  self.epoch = ep
  local outs = ffi.new("ddp_tensor*[?]", n)
  local res = {}
  return function()
    local h = ep.handle
    if h == nil then return nil end
    lib.release_step() -- the previous batch's dropped temporaries (Note [step lifetimes])
    local st = C.ddp_io_loader_next(h, outs)
    if st == C.DDP_IO_END then
      if self.epoch == ep then self:close() else ep.handle = nil end
      return nil
    end
    check(st)
    if n == 2 then return wrap(outs[0]), wrap(outs[1]) end
    for k = 1, n do res[k] = wrap(outs[k - 1]) end
    return unpack(res, 1, n)
  end
end

-- Stack one part of B samples.
local function collate_part(values, k)
  local first = values[1]
  if is_tensor(first) then
    local arr = ffi.new("ddp_tensor*[?]", #values)
    for i, v in ipairs(values) do
      if not is_tensor(v) then lib.raise(("DataLoader: part %s of sample %d is not a tensor (sample 1's is)"):format(tostring(k), i)) end
      arr[i - 1] = v
    end
    check(C.ddp_io_stack(box, #values, arr))
    return wrap(box[0])
  end
  local tv = type(first)
  local buf = ffi.new("double[?]", #values)
  local integral = true
  for i, v in ipairs(values) do
    if type(v) ~= tv then lib.raise(("DataLoader: part %s of sample %d is a %s, sample 1's is a %s"):format(tostring(k), i, type(v), tv)) end
    if tv == "boolean" then v = v and 1 or 0
    elseif tv ~= "number" then lib.raise(("DataLoader: cannot collate part %s of type %s"):format(tostring(k), tv)) end
    if v % 1 ~= 0 then integral = false end
    buf[i - 1] = v
  end
  local dtype = tv == "boolean" and C.DDP_BOOL or integral and C.DDP_I64 or C.DDP_F64
  local len = ffi.new("int64_t[1]", #values)
  check(C.ddp_tensor_from_data(box, 1, len, dtype, buf, C.DDP_F64))
  return wrap(box[0])
end

--- data.default_collate(samples) -> the batch's parts: the default collation of a list of
-- samples, each a value or a list of values (as collate_fn receives them). Tensors of one
-- shape and dtype stack to (B, ...); numbers become an i64 tensor when all are integers,
-- else f64; booleans a bool tensor; samples that are lists give one collated part per
-- position, returned as several values; samples that are tables with string keys give a
-- table of collated fields. Raises naming the part and the sample that does not fit.
function M.default_collate(samples)
  if type(samples) ~= "table" or #samples == 0 then
    lib.raise("default_collate: expected a non-empty list of samples, got " .. type(samples))
  end
  local first = samples[1]
  if type(first) ~= "table" or is_tensor(first) then return collate_part(samples, 1) end
  if #first == 0 and next(first) ~= nil then
    local out = {}
    for key in pairs(first) do
      local column = {}
      for i, s in ipairs(samples) do
        if type(s) ~= "table" or s[key] == nil then
          lib.raise(("default_collate: sample %d has no field '%s' (sample 1 has)"):format(i, tostring(key)))
        end
        column[i] = s[key]
      end
      out[key] = collate_part(column, key)
    end
    return out
  end
  local nparts = #first
  local parts = {}
  for k = 1, nparts do parts[k] = {} end
  for i, s in ipairs(samples) do
    if type(s) ~= "table" or is_tensor(s) or #s ~= nparts then
      lib.raise(("default_collate: sample %d has %s parts, sample 1 has %d"):format(i,
        (type(s) == "table" and not is_tensor(s)) and #s or "no", nparts))
    end
    for k = 1, nparts do parts[k][i] = s[k] end
  end
  local out = {}
  for k = 1, nparts do out[k] = collate_part(parts[k], k) end
  return unpack(out, 1, nparts)
end

-- Pin the tensors among values[1..n] (pin_memory), in place.
local function pin_all(values, n)
  for k = 1, n do
    if is_tensor(values[k]) then
      check(C.ddp_tensor_pin_memory(box, values[k]))
      values[k] = wrap(box[0])
    end
  end
end

-- Lua path: batches from ds:get, collated by the default or by collate_fn.
local function lua_iter(self, order)
  local ds = self.dataset
  local idx = ffi.cast("const int64_t*", C.ddp_tensor_data(order))
  local total = order:numel()
  local nb = self.drop_last and math.floor(total / self.batch_size) or math.ceil(total / self.batch_size)
  -- ep keeps `order` alive: idx points into its storage, and nothing else holds it
  local ep = { handle = nil, order = order }
  self.epoch = ep
  local b = 0
  local collate_fn = self.collate_fn
  return function()
    if b >= nb or self.epoch ~= ep then return nil end
    lib.release_step() -- Note [step lifetimes], ddplua/lib.lua
    local start = b * self.batch_size
    local stop = math.min(start + self.batch_size, total)
    b = b + 1
    local out, n
    if collate_fn then
      local samples = {}
      for p = start, stop - 1 do
        local sample = { ds:get(tonumber(idx[p]) + 1) }
        local cnt = table.maxn(sample)
        samples[#samples + 1] = cnt == 1 and sample[1] or sample
      end
      out = { collate_fn(samples) }
      n = table.maxn(out)
      if out[1] == nil then
        lib.raise(("DataLoader: collate_fn returned nil for batch %d (it must return the batch)"):format(b))
      end
    else
      local parts, nparts = {}, nil
      for p = start, stop - 1 do
        local sample = { ds:get(tonumber(idx[p]) + 1) }
        local cnt = table.maxn(sample)
        nparts = nparts or cnt
        if cnt ~= nparts then lib.raise(("DataLoader: samples have %d and %d parts"):format(nparts, cnt)) end
        for k = 1, cnt do
          parts[k] = parts[k] or {}
          parts[k][#parts[k] + 1] = sample[k]
        end
      end
      out, n = {}, nparts
      for k = 1, nparts do out[k] = collate_part(parts[k], k) end
    end
    if self.pin_memory then pin_all(out, n) end
    return unpack(out, 1, n)
  end
end

--- loader:iter(): an iterator for one epoch, `for x, y in loader:iter() do ... end`,
-- yielding one tensor per sample part (B, ...), in the order of the epoch (shuffled afresh
-- on every call when shuffle is set; the sampler's indices() otherwise). Starting a new
-- iter() stops the previous epoch's loader; leaving the loop early is fine (the thread is
-- stopped by the next iter(), loader:close() or the collector).
function DataLoader.iter(self)
  self:close()
  if iterable.is_iterable(self.dataset) then -- a stream: batches in stream order
    local collate = self.collate_fn or M.default_collate
    local it = iterable.batches(self.dataset, self.batch_size, self.drop_last, collate)
    if not self.pin_memory then return it end
    return function()
      local out = { it() }
      pin_all(out, table.maxn(out))
      return unpack(out, 1, table.maxn(out))
    end
  end
  local order = epoch_order(self)
  local ds = self.dataset
  local ok, f = pcall(function() return ds.c_sources end)
  if ok and type(f) == "function" and not self.collate_fn then
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
  return lua_iter(self, order)
end

function DataLoader.__tostring(self)
  return ("DataLoader(%s, batch_size = %d, %d batches)"):format(tostring(self.dataset), self.batch_size,
    DataLoader.len(self))
end

return M
