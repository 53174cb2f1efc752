--- ddplua.data.text.evaluate: a language model's loss over fixed windows of a token file,
-- split between the ranks and reduced across them (what a training loop calls every
-- eval_interval steps; nanoGPT's estimate_loss, with fixed windows instead of random ones
-- so that two evaluations of one model give the same number).
--
--   model:eval()
--   local val_loss = text.evaluate(function(x, y) return F.cross_entropy(...) end, val_file,
--                                  {block_size = 64, batch_size = 12, max_windows = 240})
--   model:train()
--
-- Note [evaluation windows]: the windows are the file's non-overlapping windows (starts 0,
-- T, 2T, ... while a target token remains: floor((n - 1) / T) of them), or max_windows of
-- them evenly spaced (window j of the m taken is number floor(j * all / m)). Window j goes
-- to rank j mod world_size (DistributedSampler's rank::world split, without its padding:
-- the shares may differ by one window, and no window is counted twice). Each rank sums
-- loss * windows over its batches; one all_reduce of (sum, count) gives every rank the
-- same mean, which is the mean over all the windows (every window has T tokens).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local tensor = require "ddplua.tensor"
local RandomWindows = require "ddplua.data.text.random_windows"
local ffi, C = lib.ffi, lib.C

local M = {}

local function check_count(name, what, v, min)
  if type(v) ~= "number" or v < min or v % 1 ~= 0 or v >= 2 ^ 53 then
    lib.raise(("%s: %s must be an integer >= %d, got %s"):format(name, what, min, tostring(v)))
  end
end

--- text.eval_starts(n_tokens, block_size, max_windows) -> the list of window starts
-- (0-based) Note [evaluation windows] describes; max_windows nil: all of them. Raises on
-- counts that are not integers (n_tokens >= 0, block_size and max_windows >= 1).
function M.eval_starts(n, T, max_windows)
  check_count("text.eval_starts", "n_tokens", n, 0)
  check_count("text.eval_starts", "block_size", T, 1)
  if max_windows ~= nil then check_count("text.eval_starts", "max_windows", max_windows, 1) end
  local all = math.floor((n - 1) / T)
  local m = all
  if max_windows and max_windows < all then m = max_windows end
  local out = {}
  for j = 0, m - 1 do out[j + 1] = math.floor(j * all / m) * T end
  return out
end

--- text.evaluate(loss_fn, token_file, opts) -> the mean loss over the evaluation windows on
-- every rank (a number), and the number of windows. loss_fn(x, y) gets (B, T) i64 tensors
-- and returns the batch's mean loss (a 0-d tensor or a number); it runs with grad mode off.
-- opts: block_size, batch_size (required), max_windows (nil: every window), group (the
-- process group to reduce over; default: the default group when one is initialized),
-- rank and world_size (default: the group's). Every rank of the group must call it (one
-- all_reduce). Raises naming a bad option, a file too short for one window, or a loss_fn
-- that returns no number.
function M.evaluate(loss_fn, token_file, opts)
  local name = "text.evaluate"
  opts = options.check(name, opts, { block_size = true, batch_size = true, max_windows = true, group = true,
    rank = true, world_size = true })
  if type(loss_fn) ~= "function" then lib.raise(name .. ": loss_fn must be a function(x, y) -> loss") end
  for _, k in ipairs { "block_size", "batch_size" } do
    local v = opts[k]
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
      lib.raise(("%s: %s must be a positive integer, got %s"):format(name, k, tostring(v)))
    end
  end
  local mw = opts.max_windows
  if mw ~= nil and (type(mw) ~= "number" or mw < 1 or mw % 1 ~= 0) then
    lib.raise(name .. ": max_windows must be a positive integer, got " .. tostring(mw))
  end
  local dist = package.loaded["ddplua.distributed"]
  local group = opts.group
  local rank, world = opts.rank, opts.world_size
  if group ~= nil then
    rank = rank or dist.get_rank(group)
    world = world or dist.get_world_size(group)
  end
  rank, world = RandomWindows.rank_and_world({ rank = rank, world_size = world }, name)
  local T, B = opts.block_size, opts.batch_size
  local n = #token_file
  if n < T + 1 then
    lib.raise(("%s: %s holds %d tokens, fewer than block_size + 1 = %d"):format(name, token_file.path, n, T + 1))
  end
  local starts = M.eval_starts(n, T, mw)
  local mine = {}
  for j = rank + 1, #starts, world do mine[#mine + 1] = starts[j] end
  local sum, count = 0, 0
  local prev = C.ddp_set_grad_enabled(0)
  local ok, err = pcall(function()
    for first = 1, #mine, B do
      local batch = {}
      for k = first, math.min(first + B - 1, #mine) do batch[#batch + 1] = mine[k] end
      local x, y = token_file:windows(batch, T)
      local loss = loss_fn(x, y)
      if tensor.is_tensor(loss) then loss = loss:item() end
      if type(loss) ~= "number" then
        lib.raise(name .. ": loss_fn returned " .. type(loss) .. ", expected a 0-d tensor or a number")
      end
      sum = sum + loss * #batch
      count = count + #batch
    end
  end)
  C.ddp_set_grad_enabled(prev)
  if not ok then error(err, 0) end
  if world > 1 then
    if not (dist and dist.is_initialized()) then
      lib.raise(name .. ": world_size " .. world .. " needs an initialized process group (dist.init_process_group)")
    end
    local vals, len = ffi.new("double[2]", sum, count), ffi.new("int64_t[1]", 2)
    lib.check(C.ddp_tensor_from_data(lib.box, 1, len, C.DDP_F64, vals, C.DDP_F64))
    local t = lib.wrap(lib.box[0])
    dist.all_reduce(t, { op = "sum", group = group })
    local v = t:tolist()
    sum, count = v[1], v[2]
  end
  return sum / count, count
end

return M
