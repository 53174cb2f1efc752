--- ddplua.distributed.sampler: DistributedSampler, the share of a dataset each rank reads.
--
--   local DistributedSampler = require "ddplua.distributed.sampler"
--   local sampler = DistributedSampler(train_ds)            -- world and rank from the job
--   local loader = data.DataLoader(train_ds, {sampler = sampler, batch_size = 64})
--   for epoch = 0, epochs - 1 do
--     sampler:set_epoch(epoch)                              -- a new shuffle every epoch
--     for x, y in loader:iter() do ... end
--   end
--   -- evaluation: every test sample exactly once across ranks, nothing padded
--   local test_sampler = DistributedSampler(test_ds, {shuffle = false, pad = false})
--
-- The rules are PyTorch's torch.utils.data.distributed.DistributedSampler (Note [sampler
-- rules] in runtime/include/ddplua/sampler.h): without drop_last the list is padded to
-- ceil(N / world) * world by repeating it from the front; with drop_last it is cut to
-- floor(N / world) * world; rank r takes indices[r::world]. The shuffle is a permutation
-- drawn from a generator seeded with seed + epoch, identical on every rank. It comes from
-- ddplua's Philox generator, so the shuffled ORDER differs from PyTorch's (mt19937);
-- everything else matches PyTorch index for index.
--
-- Evaluation mode, pad = false: no padding, rank r takes r, r + world, ... < N, so ranks
-- may get DIFFERENT counts (ceil((N - r) / world)); sum per-sample metrics across ranks
-- (all_reduce of sums and counts) rather than averaging per-rank means.
--
-- It follows the DataLoader's sampler protocol (ddplua/data/loader.lua): indices() gives
-- the epoch's 0-based indices as a 1-d i64 tensor, len() (and #sampler) their count.
--
-- Note [elastic resume] (Horovod's ElasticSampler, for ddplua.distributed.elastic): the
-- sampler can resume an epoch part-way, on another world size, without skipping or
-- repeating a sample. Rank r of W takes positions r, r + W, r + 2W, ... of the epoch's
-- order `base` (the permutation of rule 1 of Note [sampler rules]), so once every rank has
-- trained k samples of the epoch, the positions trained are exactly base[0 .. kW-1]: a
-- prefix. record_batch(b) adds b * W to that prefix length (`processed`); state_dict()
-- keeps {epoch, processed}. After load_state_dict (on any world size W'), the epoch goes on
-- with the remainder rem = base[processed .. n-1] (m = n - processed positions), split by
-- the same rules as a whole epoch: padded to ceil(m / W') * W' by repeating rem from its
-- front (or cut to floor(m / W') * W' with drop_last; left ragged with pad = false), rank r
-- taking rem[r::W']. With processed = 0 this is the plain epoch. When m is a multiple of W'
-- nothing is padded, and every sample of the epoch is trained exactly once across the
-- rounds; otherwise up to W' - 1 samples repeat at the epoch's end, as they do in any
-- padded epoch (PyTorch's rule). set_epoch(e) starts epoch e from its beginning, unless e is
-- the epoch already set (a resumed epoch keeps its position when the loop calls
-- set_epoch(epoch) as usual).
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
require "ddplua.tensor" -- tensor methods on the handles we return
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box
local fn = require "ddplua.functions"

local M = {}

local DistributedSampler = { name = "DistributedSampler" }
M.DistributedSampler = DistributedSampler

local len_buf = ffi.new("int64_t[1]")

local function is_int(v) return type(v) == "number" and v % 1 == 0 and v == v and v > -2 ^ 63 and v < 2 ^ 63 end

-- World size and rank of the running job when the caller gave none: the initialized
-- process group (ddplua.distributed), else the launcher's WORLD_SIZE / RANK, else 1 / 0.
local function env_int(name)
  local s = os.getenv(name)
  if s == nil or s == "" then return nil end
  local v = tonumber(s)
  if not is_int(v) then
    lib.raise(("DistributedSampler: environment variable %s = '%s' is not an integer; pass num_replicas and rank explicitly")
      :format(name, s))
  end
  return v
end

local function process_group()
  local ok, dist = pcall(require, "ddplua.distributed.distributed_c10d")
  if not ok then
    if tostring(dist):find("module 'ddplua.distributed.distributed_c10d' not found", 1, true) then return nil end
    lib.raise("DistributedSampler: cannot load ddplua.distributed.distributed_c10d (" .. tostring(dist) ..
      "); pass num_replicas and rank explicitly")
  end
  if type(dist) ~= "table" or type(dist.is_initialized) ~= "function" then return nil end
  if not dist.is_initialized() then return nil end
  if type(dist.get_world_size) ~= "function" or type(dist.get_rank) ~= "function" then
    lib.raise("DistributedSampler: the process group is initialized but ddplua.distributed lacks " ..
      "get_world_size/get_rank; pass num_replicas and rank explicitly")
  end
  return dist
end

local function job_defaults(opts)
  local world, rank = opts.num_replicas, opts.rank
  if world ~= nil and rank ~= nil then return world, rank end
  local dist = process_group()
  if dist then
    return world or dist.get_world_size(), rank or dist.get_rank()
  end
  return world or env_int("WORLD_SIZE") or 1, rank or env_int("RANK") or 0
end

local KNOWN = options.known { "num_replicas", "rank", "shuffle", "seed", "drop_last", "pad" }

--- DistributedSampler(dataset_or_n, opts) -> sampler over a dataset (anything with len()
-- or #) or a sample count N.
-- opts.num_replicas (world size; default: the initialized process group's, else
-- $WORLD_SIZE, else 1), opts.rank (0-based; default: the group's, else $RANK, else 0),
-- opts.shuffle (true), opts.seed (0; must be the same on every rank), opts.drop_last
-- (false), opts.pad (true; false = evaluation mode, see above; not with drop_last).
-- Raises naming the values for num_replicas < 1, rank outside [0, num_replicas),
-- non-integers, unknown options, or pad = false with drop_last = true.
function M.new(dataset, opts)
  opts = options.check("DistributedSampler", opts, KNOWN)
  local n
  if type(dataset) == "number" then n = dataset
  elseif type(dataset) == "table" or type(dataset) == "userdata" then n = object.len(dataset)
  else lib.raise("DistributedSampler: expected a dataset or a sample count, got " .. type(dataset)) end
  if not is_int(n) or n < 0 then
    lib.raise("DistributedSampler: dataset size must be an integer >= 0, got " .. tostring(n))
  end
  local world, rank = job_defaults(opts)
  if not is_int(world) or world < 1 then
    lib.raise("DistributedSampler: num_replicas must be an integer >= 1, got " .. tostring(world))
  end
  if not is_int(rank) or rank < 0 or rank >= world then
    lib.raise(("DistributedSampler: rank %s is outside [0, %d) for num_replicas = %d"):format(
      tostring(rank), world, world))
  end
  local seed = opts.seed or 0
  if not is_int(seed) then lib.raise("DistributedSampler: seed must be an integer, got " .. tostring(seed)) end
  local shuffle = opts.shuffle == nil and true or (opts.shuffle and true or false)
  local drop_last = opts.drop_last and true or false
  local pad = opts.pad == nil and true or (opts.pad and true or false)
  if drop_last and not pad then
    lib.raise("DistributedSampler: pad = false (evaluation mode) and drop_last = true exclude each other")
  end
  check(C.ddp_dist_sampler_len(len_buf, n, world, rank, drop_last and 1 or 0, pad and 1 or 0))
  local num_samples = tonumber(len_buf[0])
  return object.new(DistributedSampler, {
    n = n, num_replicas = world, rank = rank, shuffle = shuffle, seed = seed,
    drop_last = drop_last, pad = pad, epoch = 0, num_samples = num_samples,
    -- Note [elastic resume]: positions of the epoch's order trained before this pass
    -- (start) and in all (processed)
    start = 0, processed = 0,
    -- PyTorch's total_size: the padded (or cut) list length; N itself in evaluation mode
    total_size = pad and num_samples * world or n,
  })
end

--- sampler:indices() -> 1-d i64 tensor (len() elements) of 0-based dataset indices this
-- rank reads in the current epoch; the same call on every rank gives disjoint shares of
-- one permutation (apart from the padding repeats).
function DistributedSampler.indices(self)
  if self.start > 0 then return self:_remainder_indices() end
  check(C.ddp_dist_sampler_indices(box, self.n, self.num_replicas, self.rank, self.shuffle and 1 or 0,
    self.seed, self.epoch, self.drop_last and 1 or 0, self.pad and 1 or 0))
  return wrap(box[0])
end

-- The share of a resumed epoch (Note [elastic resume]): rem[j % m] for j = rank, rank + W,
-- ... below the remainder's (padded or cut) length.
function DistributedSampler._remainder_indices(self)
  check(C.ddp_dist_sampler_indices(box, self.n, 1, 0, self.shuffle and 1 or 0, self.seed, self.epoch, 0, 1))
  local base = wrap(box[0]):tolist()
  local m, w = self.n - self.start, self.num_replicas
  local total = self.pad and self:len() * w or m
  local out = {}
  for j = self.rank, total - 1, w do out[#out + 1] = base[self.start + j % m + 1] end
  return fn.tensor(out, { dtype = "i64" })
end

--- sampler:len() -> number of indices this rank gets per epoch (PyTorch's num_samples); in
-- a resumed epoch, per the rest of the epoch (Note [elastic resume]).
function DistributedSampler.len(self)
  if self.start == 0 then return self.num_samples end
  check(C.ddp_dist_sampler_len(len_buf, self.n - self.start, self.num_replicas, self.rank,
    self.drop_last and 1 or 0, self.pad and 1 or 0))
  return tonumber(len_buf[0])
end

--- sampler:set_epoch(e): use the permutation of epoch e (an integer) from now on. Call it
-- on every rank before each epoch, or every epoch repeats the same order (as PyTorch).
-- A new epoch starts at its beginning; the epoch already set keeps its position (Note
-- [elastic resume]).
function DistributedSampler.set_epoch(self, e)
  if not is_int(e) then lib.raise("DistributedSampler:set_epoch: epoch must be an integer, got " .. tostring(e)) end
  if e ~= self.epoch then self.start, self.processed = 0, 0 end
  self.epoch = e
end

--- sampler:record_batch(batch_size): every rank has trained one more batch of batch_size
-- samples (this rank's batch; all ranks the same) of the epoch: the epoch's position moves
-- by batch_size * num_replicas (at most to the epoch's end). Horovod's
-- ElasticSampler.record_batch, counting batches itself. Raises for a negative or
-- non-integer size.
function DistributedSampler.record_batch(self, batch_size)
  if not is_int(batch_size) or batch_size < 0 then
    lib.raise("DistributedSampler:record_batch: batch_size must be an integer >= 0, got " .. tostring(batch_size))
  end
  self.processed = math.min(self.n, self.processed + batch_size * self.num_replicas)
end

--- sampler:state_dict() -> {epoch = e, processed = k}: where the epoch is (Note [elastic
-- resume]); plain numbers, for commits and broadcasts.
function DistributedSampler.state_dict(self)
  return { epoch = self.epoch, processed = self.processed }
end

--- sampler:load_state_dict(sd): go on with epoch sd.epoch after its first sd.processed
-- positions, on this sampler's world size (Note [elastic resume]). Raises for values that
-- are not integers or a position outside 0 .. N.
function DistributedSampler.load_state_dict(self, sd)
  if type(sd) ~= "table" or not is_int(sd.epoch) or not is_int(sd.processed) or sd.processed < 0
    or sd.processed > self.n then
    lib.raise(("DistributedSampler:load_state_dict: expected {epoch = integer, processed = 0 .. %d}, got %s")
      :format(self.n, type(sd) == "table" and ("{epoch = %s, processed = %s}"):format(tostring(sd.epoch),
        tostring(sd.processed)) or type(sd)))
  end
  self.epoch, self.start, self.processed = sd.epoch, sd.processed, sd.processed
end

function DistributedSampler.__tostring(self)
  return ("DistributedSampler(N = %d, num_replicas = %d, rank = %d, shuffle = %s, seed = %d, drop_last = %s, pad = %s, epoch = %d)")
    :format(self.n, self.num_replicas, self.rank, tostring(self.shuffle), self.seed,
      tostring(self.drop_last), tostring(self.pad), self.epoch)
end

--- DistributedEvalSampler(dataset_or_n, opts): DistributedSampler with shuffle = false and
-- pad = false (evaluation mode) unless opts says otherwise.
function M.DistributedEvalSampler(dataset, opts)
  local o = { shuffle = false, pad = false }
  for k, v in pairs(opts or {}) do o[k] = v end
  return M.new(dataset, o)
end

return setmetatable(M, { __call = function(_, dataset, opts) return M.new(dataset, opts) end })
