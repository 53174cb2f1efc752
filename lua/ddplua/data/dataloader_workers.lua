--- ddplua.data.dataloader_workers: the worker processes of data.DataLoader (num_workers > 0)
-- and data.get_worker_info().
--
-- Note [dataloader workers]: a DataLoader with num_workers = N > 0 over a Lua dataset (one
-- without c_sources, or any dataset with a collate_fn) forks N worker processes, as
-- PyTorch's DataLoader does with the fork start method: a worker is a copy of the training
-- process, so it has the dataset, the collate_fn and everything they reach (upvalues,
-- loaded modules, opened files) without pickling anything. Why processes rather than
-- Lua states on threads: a dataset is arbitrary Lua holding tensors and closures that
-- cannot move to another lua_State, and LuaJIT has one interpreter lock-free state per
-- thread only; fork gives each worker its own state for free, and the OS reaps it.
--  * Order: batch b (0-based) of an epoch is made by worker b % N, which receives its
--    batches in increasing order, at most prefetch_factor of them ahead of the training
--    loop (prefetch_factor * N batches in flight in all); the loop takes batch b from
--    worker b % N only. The batches and their order are therefore those of num_workers = 0
--    for any N (PyTorch's guarantee), whatever the workers' speeds.
--  * The epoch's order (shuffle, sampler) is drawn in the training process, from the
--    loader's generator, exactly as with num_workers = 0.
--  * Seeds: worker w seeds the default generator and math.random with base_seed + w,
--    as PyTorch's workers seed torch and random; base_seed is derived from the loader's
--    generator state and its epoch count without drawing from it (so the generator, and
--    the next epoch's shuffle, are the same for every N). Random transforms drawn inside
--    ds:get therefore give other values than with num_workers = 0 (as in PyTorch).
--  * A worker sets its compute threads to 1 (as PyTorch), runs worker_init_fn(worker_id)
--    once, then makes the batches it is sent: ds:get for each sample, the collation
--    (default or collate_fn), and writes the tensors' bytes into one of its shared-memory
--    slots (memfds mapped in both processes: Note [dataloader worker channels],
--    ddplua/io_workers.h, and Note [worker slots], runtime/io/workers.c); the default
--    collation stacks the samples straight into the slot (Note [stacking in the slot]) and
--    the training process makes the batch's tensors over the slot (Note [lent slots]): no
--    Lua runs per sample on the training side.
--  * A worker must not use CUDA: a forked process cannot use its parent's CUDA context
--    (as with PyTorch's fork start method). Batches come back as CPU tensors; pin_memory
--    pins them in the training process.
--  * Iterable datasets (ds:stream()): worker w reads its copy of the stream, sharded by
--    get_worker_info(), and its j-th batch is task j * N + w; the loop takes the workers'
--    batches in turn and skips a worker whose stream ended (an end-of-stream result), as
--    PyTorch does for an IterableDataset.
--  * Errors: a Lua error in a worker (ds:get, collate_fn, worker_init_fn) is sent back with
--    the worker's traceback, the sample index (the i of ds:get(i)) and the batch, and raised
--    in the training loop when that batch is due. A worker that dies (a signal, os.exit) is
--    reported by the next wait with its pid and signal (each wait looks at the workers
--    every 100 ms); `timeout` > 0 bounds the wait for one batch.
--  * Lifetime: without persistent_workers the workers of an epoch exit once it has no task
--    left for them, after their last batch (Note [finished workers] in
--    runtime/io/workers.c), and the epoch's end does not wait for their exit (they are
--    reaped by the next group, loader:close(), dl.empty_cache() or the process's exit:
--    Note [retired workers]); an epoch left early stops them at the next iter() or
--    loader:close(); with persistent_workers they serve every epoch
--    (a new epoch count tells an abandoned epoch's late batches apart). loader:close() and
--    the collection of the loader close the sockets, wait up to 1 s and SIGKILL what is
--    left, and reap every worker; a worker also dies with the training process
--    (PR_SET_PDEATHSIG) and leaves when its socket closes. Nothing is left in /dev/shm.
local lib = require "ddplua.lib"
local generator = require "ddplua.generator"
local worker_info = require "ddplua.data.worker_info"
local buffer = require "string.buffer"
local ffi, C = lib.ffi, lib.C
local check, wrap = lib.check, lib.wrap

local M = {}

local MAX_TENSORS = 256                  -- tensors per batch through the channel
local TENSOR_KEY = "\0ddplua_tensor"     -- a tensor's place in a batch's structure

local END_MARK = "\0ddplua:end of stream" -- a worker's stream has no more batches

--- data.get_worker_info(): in a DataLoader worker process, a table {id = worker id (0 ..
-- num_workers-1), num_workers = N, seed = the seed this worker gave the default generator
-- and math.random (base_seed + id), dataset = the worker's copy of the dataset}; nil in
-- the training process (as torch.utils.data.get_worker_info()). Useful in ds:get, a
-- collate_fn or worker_init_fn, e.g. to shard an iterable source per worker. The value
-- lives in ddplua.data.worker_info, which the worker sets when it starts.
M.get_worker_info = worker_info.get_worker_info

local function is_tensor(v) return require("ddplua.tensor").is_tensor(v) end

-- A part of a batch that the worker stacks straight into its slot (Note [stacking in the
-- slot], runtime/io/workers.c): the list of its samples' tensors, already checked.
local Stack = {}
Stack.__index = Stack

--- stack_later(items) -> a batch part made of the tensors items[1..B] (checked with
-- ddp_io_stack_check) that a worker stacks into its slot when it sends the batch; what
-- loader.lua's default collation returns in a worker instead of the stacked tensor.
function M.stack_later(items) return setmetatable({ items = items }, Stack) end

local function is_part(v) return getmetatable(v) == Stack or is_tensor(v) end

-- splitmix64's finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number
-- generators", OOPSLA 2014): a well-mixed 64-bit value from x.
local function mix64(x)
  x = ffi.cast("uint64_t", x)
  x = bit.bxor(x, bit.rshift(x, 30)) * 0xbf58476d1ce4e5b9ULL
  x = bit.bxor(x, bit.rshift(x, 27)) * 0x94d049bb133111ebULL
  return bit.bxor(x, bit.rshift(x, 31))
end

--- base_seed(gen, epoch) -> a number in 0 .. 2^52-1 from the generator's state (seed,
-- offset) and the loader's epoch count, without drawing from the generator (Note
-- [dataloader workers]: the generator stays what num_workers = 0 leaves).
function M.base_seed(gen, epoch)
  local st = gen:get_state()
  local x = mix64(mix64(mix64(st.seed) + st.offset) + epoch)
  return tonumber(x % 0x10000000000000ULL)
end

-- The batch's values (n of them) as tensors (or stack_later parts) and the structure bytes
-- ("" when the values are n tensors or parts, the default collation's case).
local function flatten(values, n)
  local tensors, plain = {}, true
  for k = 1, n do
    if not is_part(values[k]) then plain = false break end
    tensors[k] = values[k]
  end
  if plain then return tensors, "" end
  tensors = {}
  local function strip(v, depth)
    if is_part(v) then -- a tensor, or a stack_later part nested in the batch's tables
      tensors[#tensors + 1] = v
      return { [TENSOR_KEY] = #tensors }
    end
    if type(v) == "table" then
      if depth > 100 then lib.raise("DataLoader worker: the batch nests tables more than 100 deep") end
      local c = {}
      for key, x in pairs(v) do c[key] = strip(x, depth + 1) end
      return c
    end
    if type(v) == "function" or type(v) == "thread" or type(v) == "userdata" or type(v) == "cdata" then
      lib.raise(("DataLoader worker: the batch holds a %s, which cannot leave the worker process " ..
        "(a batch is made of tensors, numbers, strings, booleans and tables of them)"):format(type(v)))
    end
    return v
  end
  local skeleton = { n = n }
  for k = 1, n do skeleton[k] = strip(values[k], 0) end
  return tensors, buffer.encode(skeleton)
end

--- unflatten(tensors, ntensors, meta) -> the batch's values and their count: the inverse of
-- a worker's flatten (tensors: a ddp_tensor*[] whose references are taken); nil when the
-- worker's stream ended (an iterable dataset).
function M.unflatten(tbuf, ntensors, meta)
  if meta == END_MARK then return nil end
  local ts = {}
  for k = 1, ntensors do ts[k] = wrap(tbuf[k - 1]) end
  if meta == "" then return ts, ntensors end
  local skeleton = buffer.decode(meta)
  local function restore(v)
    if type(v) ~= "table" then return v end
    local k = v[TENSOR_KEY]
    if k then return ts[k] end
    for key, x in pairs(v) do v[key] = restore(x) end
    return v
  end
  for k = 1, skeleton.n do skeleton[k] = restore(skeleton[k]) end
  return skeleton, skeleton.n
end

-- What a worker does until its socket closes; never returns (Note [dataloader workers]).
-- make_batch(indices, count, batch, where, tag) -> values, n builds a batch from the
-- 0-based sample indices (where.sample is set to the 1-based index of each ds:get it
-- calls), or, for an iterable dataset, the next batch of the worker's stream for epoch
-- `tag` (nil at the stream's end).
local function worker_main(handle, id, nworkers, seed, dataset, init_fn, make_batch, batch_size)
  local init_error
  local ok = pcall(function()
    C.ddp_set_num_threads(1)
    worker_info.set_worker_info({ id = id, num_workers = nworkers, seed = seed, dataset = dataset })
    generator.default:manual_seed(seed)
    math.randomseed(seed % 2147483647)
    if init_fn then
      local iok, err = xpcall(init_fn, debug.traceback, id)
      if not iok then
        init_error = ("Caught an error in DataLoader worker process %d in worker_init_fn(%d).\n" ..
          "Original traceback:\n%s"):format(id, id, tostring(err))
      end
    end
    local tag, batch, count = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
    local indices = ffi.new("int64_t[?]", batch_size)
    local counts = ffi.new("int32_t[?]", MAX_TENSORS)
    local items_cap = MAX_TENSORS
    local items = ffi.new("ddp_tensor*[?]", items_cap)
    local where = {}
    while true do
      local st = C.ddp_io_worker_take(handle, tag, batch, indices, batch_size, count)
      if st == C.DDP_IO_END then break end
      if st ~= 0 then error(ffi.string(C.ddp_last_error()), 0) end
      local b = tonumber(batch[0])
      -- the previous batch's tensors (samples, collated batch) are garbage now: a task is a
      -- step of this process (Note [step lifetimes], ddplua/lib.lua); without it the
      -- worker's memory grew until a full collection, each batch on pages new to it
      lib.release_step()
      where.sample, where.stream = nil, nil
      local msg
      if init_error then
        msg = init_error
      else
        local bok, values, n = xpcall(make_batch, debug.traceback, indices, tonumber(count[0]), b, where,
          tonumber(tag[0]))
        if bok and values == nil then -- an iterable dataset's stream ended
          st = C.ddp_io_worker_send(handle, tag[0], batch[0], 0, items, END_MARK, #END_MARK)
          if st ~= 0 then error(ffi.string(C.ddp_last_error()), 0) end
        elseif bok then
          local fok, tensors, meta = pcall(flatten, values, n)
          if fok and #tensors > MAX_TENSORS then
            fok, tensors = false, ("the batch holds %d tensors, at most %d pass"):format(#tensors, MAX_TENSORS)
          end
          if fok then
            local nitems = 0
            for k = 1, #tensors do
              local t = tensors[k]
              counts[k - 1] = getmetatable(t) == Stack and #t.items or 0
              nitems = nitems + math.max(counts[k - 1], 1)
            end
            if nitems > items_cap then
              items_cap = nitems
              items = ffi.new("ddp_tensor*[?]", items_cap)
            end
            local at = 0
            for k = 1, #tensors do
              local t = tensors[k]
              if counts[k - 1] > 0 then
                for i = 1, counts[k - 1] do items[at + i - 1] = t.items[i] end
                at = at + counts[k - 1]
              else
                items[at] = t
                at = at + 1
              end
            end
            st = C.ddp_io_worker_send_parts(handle, tag[0], batch[0], #tensors, counts, items, meta, #meta)
            if st ~= 0 then error(ffi.string(C.ddp_last_error()), 0) end
          else
            msg = ("Caught an error in DataLoader worker process %d while sending batch %d " ..
              "(batches count from 0): %s"):format(id, b, tostring(tensors))
          end
        else
          local at = where.sample and (" while fetching sample index %d (ds:get(%d))"):format(where.sample,
            where.sample)
            or where.stream and (" while reading sample %d of its stream's batch"):format(where.position)
            or " while collating"
          msg = ("Caught an error in DataLoader worker process %d%s of batch %d (batches count from 0).\n" ..
            "Original traceback:\n%s"):format(id, at, b, tostring(values))
        end
      end
      if msg then
        st = C.ddp_io_worker_send_error(handle, tag[0], batch[0], msg, #msg)
        if st ~= 0 then error(ffi.string(C.ddp_last_error()), 0) end
      end
    end
  end)
  pcall(io.stdout.flush, io.stdout)
  pcall(io.stderr.flush, io.stderr)
  C.ddp_process_exit(ok and 0 or 1)
end

--- start(opts) -> a worker group {handle, num_workers, seed, pids, tag}: forks
-- opts.num_workers workers (Note [dataloader workers]). opts: dataset, num_workers,
-- worker_init_fn (or nil), seed (base_seed), batch_size (most samples per task),
-- prefetch_factor (most tasks in flight per worker: its batch slots),
-- make_batch (see worker_main). In the workers this never returns. Raises when a fork
-- fails (the workers already forked are stopped).
function M.start(opts)
  local box = ffi.new("ddp_io_workers*[1]")
  check(C.ddp_io_workers_new(box, opts.num_workers, opts.prefetch_factor))
  local handle = ffi.gc(box[0], C.ddp_io_workers_free)
  local is_child = ffi.new("int[1]")
  local pids = {}
  -- tensors nobody reaches go to the allocator's cache first, which a worker does not
  -- inherit (Note [cache across fork]): left to a worker's collector, the worker reused
  -- them, and each page it wrote was copied from this process's (a DataLoader epoch after
  -- one without workers: a batch's 19 MB, ~5% of the workers' time)
  lib.collect()
  for w = 0, opts.num_workers - 1 do
    check(C.ddp_io_workers_fork(handle, w, is_child))
    if is_child[0] == 1 then
      worker_main(handle, w, opts.num_workers, opts.seed + w, opts.dataset, opts.worker_init_fn,
        opts.make_batch, opts.batch_size)
    end
    pids[w + 1] = C.ddp_io_workers_pid(handle, w)
  end
  return { handle = handle, num_workers = opts.num_workers, seed = opts.seed, pids = pids, tag = 0 }
end

-- Take the group's handle from it (nil when it has none): the group is stopped from now on.
local function take_handle(group)
  if not group or group.handle == nil then return nil end
  local h = group.handle
  group.handle = nil
  ffi.gc(h, nil)
  return h
end

--- stop(group): close the sockets, let the workers exit (SIGKILL after 1 s) and reap them.
-- Safe to call twice.
function M.stop(group)
  local h = take_handle(group)
  if h ~= nil then C.ddp_io_workers_free(h) end
end

--- retire(group): stop a group whose workers were told their epoch ended and sent every
-- result (ddp_io_workers_finish): its slots go to the pool at once and the workers are
-- reaped later (Note [retired workers], runtime/io/workers.c); as stop otherwise. Safe to
-- call twice.
function M.retire(group)
  local h = take_handle(group)
  if h ~= nil then C.ddp_io_workers_retire(h) end
end

return M
