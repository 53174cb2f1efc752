--- ddplua.data.text.RandomWindows: the training batches of a language model, nanoGPT's
-- get_batch: `batch_size` windows of `block_size` tokens at random starts of a TokenFile,
-- each rank drawing from its own Philox stream.
--
--   local batches = text.RandomWindows(train_file, {block_size = 64, batch_size = 12, seed = 1337})
--   local x, y = batches:next()     -- (12, 64) i64 each, y = x shifted by one token
--
-- Note [per-rank windows]: rank r's generator is Philox under key `seed` with its counter
-- starting at r * 2^40: the ranks read disjoint parts of one counter-based stream (2^40
-- windows each before they could meet), so their batches are independent and the whole
-- job is reproducible from (seed, world size). Against DistributedSampler: that sampler
-- splits one shuffled permutation of the dataset per epoch between the ranks (each sample
-- once per epoch, padded or dropped to equal shares, reshuffled by set_epoch); here every
-- rank samples windows with replacement, as nanoGPT does (its ranks seed torch with
-- 1337 + rank), so there is no epoch, no padding and no set_epoch: a window may come twice
-- or on two ranks, and over many steps every start is equally likely. Resuming takes the
-- generator state from state_dict() (seed and offset), so a resumed run draws the batches
-- the uninterrupted one would have.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local generator = require "ddplua.generator"

local M = {}
M.__index = M
M.name = "RandomWindows"

--- The counter offset where rank r's stream starts (Note [per-rank windows]).
M.RANK_STRIDE = 2 ^ 40

--- RandomWindows.rank_and_world(opts, name) -> rank, world_size: opts.rank / opts.world_size
-- when given, else the default process group's when one is initialized, else 0 and 1.
-- Raises (starting with `name`) on a rank outside 0 .. world_size-1 or a bad world_size.
function M.rank_and_world(opts, name)
  local rank, world = opts.rank, opts.world_size
  local dist = package.loaded["ddplua.distributed"]
  if rank == nil then rank = (dist and dist.is_initialized()) and dist.get_rank() or 0 end
  if world == nil then world = (dist and dist.is_initialized()) and dist.get_world_size() or 1 end
  if type(world) ~= "number" or world < 1 or world % 1 ~= 0 then
    lib.raise(("%s: world_size must be a positive integer, got %s"):format(name, tostring(world)))
  end
  if type(rank) ~= "number" or rank < 0 or rank >= world or rank % 1 ~= 0 then
    lib.raise(("%s: rank must be an integer in 0 .. %d, got %s"):format(name, world - 1, tostring(rank)))
  end
  return rank, world
end

--- text.RandomWindows(token_file, opts) -> the batch source. opts: block_size (T, required),
-- batch_size (B, required), seed (default 1337, nanoGPT's), rank and world_size (default:
-- the default process group's when one is initialized, else 0 and 1). Raises naming a bad
-- option, or the file when it holds fewer than block_size + 1 tokens.
function M.new(token_file, opts)
  local name = "RandomWindows"
  opts = options.check(name, opts, { block_size = true, batch_size = true, seed = true, rank = true, world_size = true })
  for _, k in ipairs { "block_size", "batch_size" } do
    local v = opts[k]
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
      lib.raise(("%s: %s must be a positive integer, got %s"):format(name, k, tostring(v)))
    end
  end
  if token_file == nil or type(token_file.random_windows) ~= "function" then
    lib.raise(name .. ": the first argument must be a text.TokenFile")
  end
  local n = #token_file
  if n < opts.block_size + 1 then
    lib.raise(("%s: %s holds %d tokens, fewer than block_size + 1 = %d"):format(name, token_file.path, n,
      opts.block_size + 1))
  end
  local seed = opts.seed or 1337
  if type(seed) ~= "number" or seed < 0 or seed % 1 ~= 0 then
    lib.raise(name .. ": seed must be an integer >= 0, got " .. tostring(seed))
  end
  local rank, world = M.rank_and_world(opts, name)
  local g = generator.new(seed)
  g:set_state({ seed = seed, offset = rank * M.RANK_STRIDE })
  return setmetatable({ file = token_file, block_size = opts.block_size, batch_size = opts.batch_size,
    seed = seed, rank = rank, world_size = world, generator = g }, M)
end

--- batches:next() -> x, y: (B, T) i64 tensors of B random windows (and their starts, an
-- int64_t array of 0-based positions). Each call moves this rank's stream on by B windows.
function M:next()
  return self.file:random_windows(self.batch_size, self.block_size, self.generator)
end

--- batches:state_dict() -> {seed =, offset =}: the stream's position, for checkpoints.
function M:state_dict() return self.generator:get_state() end

--- batches:load_state_dict(sd): continue from a saved position (same seed and rank layout).
function M:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.seed) ~= "number" or type(sd.offset) ~= "number" then
    lib.raise("RandomWindows:load_state_dict: expected {seed =, offset =} from state_dict()")
  end
  self.generator:set_state(sd)
end

return setmetatable(M, { __call = function(_, ...) return M.new(...) end })
