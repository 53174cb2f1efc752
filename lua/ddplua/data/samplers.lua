--- ddplua.data.samplers: PyTorch's samplers of torch.utils.data, for a DataLoader's
-- `sampler` option.
--
--   local sampler = data.WeightedRandomSampler(class_weight_of_each_sample, #ds)
--   local loader = data.DataLoader(ds, { batch_size = 64, sampler = sampler })
--
-- Each follows the sampler protocol of ddplua/data/loader.lua: sampler:indices() draws the
-- epoch's order (afresh at each call, that is at each loader:iter()) as a 1-d i64 tensor of
-- 0-based dataset indices, and sampler:len() (and #sampler) gives its count without drawing.
-- The draws come from the sampler's generator (opts.generator, a dl.Generator; the default
-- generator when nil), so an order is reproducible from a seed; the generator is ddplua's
-- Philox, so the indices are not PyTorch's for the same seed (as for DataLoader's shuffle
-- and random_split). Argument errors carry PyTorch's texts.
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local options = require "ddplua.options"
local generator = require "ddplua.generator"
local fn = require "ddplua.functions"

local M = {}

local function is_tensor(v) return require("ddplua.tensor").is_tensor(v) end

-- The generator of opts (the default one when nil), checked.
local function generator_of(who, opts)
  local g = opts and opts.generator or generator.default
  if type(g) ~= "table" or g.handle == nil then lib.raise(who .. ": generator must be a dl.Generator") end
  return g
end

local function check_num_samples(who, n)
  if type(n) ~= "number" or n % 1 ~= 0 or n <= 0 then
    lib.raise(("%s: num_samples should be a positive integer value, but got num_samples=%s"):format(who, tostring(n)))
  end
end

local function check_replacement(who, r)
  if type(r) ~= "boolean" then
    lib.raise(("%s: replacement should be a boolean value, but got replacement=%s"):format(who, tostring(r)))
  end
end

-- A list of numbers (a table, or a 1-d tensor's values) as a Lua list, checked by check(v, i).
local function number_list(who, what, values, check)
  if is_tensor(values) then
    if values:dim() ~= 1 then
      lib.raise(("%s: %s should be a 1d sequence but given %s have shape (%s)"):format(who, what, what,
        table.concat(values:size(), ", ")))
    end
    values = values:tolist()
  elseif type(values) ~= "table" then
    lib.raise(("%s: %s must be a list or a 1-d tensor, got %s"):format(who, what, type(values)))
  end
  local out = {}
  for i = 1, #values do
    local v = values[i]
    if type(v) ~= "number" then lib.raise(("%s: %s[%d] is a %s, not a number"):format(who, what, i, type(v))) end
    check(v, i)
    out[i] = v
  end
  return out
end

-- A Lua list of 0-based indices as a 1-d i64 tensor.
local function index_tensor(list)
  return fn.tensor(list, { dtype = "i64" })
end

local SequentialSampler = { name = "SequentialSampler" }

--- data.SequentialSampler(data_source): the indices 0 .. #data_source - 1 in order (PyTorch's
-- SequentialSampler; what a DataLoader without shuffle or sampler reads).
function M.SequentialSampler(data_source)
  return object.new(SequentialSampler, { data_source = data_source })
end

--- sampler:len() -> #data_source.
function SequentialSampler.len(self) return object.len(self.data_source) end

--- sampler:indices() -> (n) i64: 0 .. n-1.
function SequentialSampler.indices(self)
  return fn.arange(0, object.len(self.data_source), 1, { dtype = "i64" })
end

local RandomSampler = { name = "RandomSampler" }

--- data.RandomSampler(data_source[, opts]): random indices of data_source (PyTorch's
-- RandomSampler). opts.replacement (false): false gives whole permutations of 0 .. n-1,
-- as many as num_samples needs, the last one cut (so each index appears
-- floor(num_samples / n) or one more times); true gives num_samples indices drawn uniformly
-- and independently. opts.num_samples (n = #data_source): the epoch's count.
-- opts.generator: see the top of this file. Raises PyTorch's errors for a num_samples that
-- is not a positive integer (an empty data_source included) and a replacement that is not
-- a boolean.
function M.RandomSampler(data_source, opts)
  opts = options.check("RandomSampler", opts, options.known { "replacement", "num_samples", "generator" })
  local replacement = opts.replacement
  if replacement == nil then replacement = false end
  check_replacement("RandomSampler", replacement)
  local self = object.new(RandomSampler, { data_source = data_source, replacement = replacement,
    num_samples_opt = opts.num_samples, generator = generator_of("RandomSampler", opts) })
  check_num_samples("RandomSampler", self:len())
  return self
end

--- sampler:len() -> num_samples (#data_source when not given).
function RandomSampler.len(self) return self.num_samples_opt or object.len(self.data_source) end

--- sampler:indices() -> (num_samples) i64, drawn afresh.
function RandomSampler.indices(self)
  local n, m = object.len(self.data_source), self:len()
  check_num_samples("RandomSampler", m)
  if n == 0 then lib.raise("RandomSampler: the data source is empty") end
  local g = self.generator
  if self.replacement then return fn.randint(0, n, { m }, { generator = g }) end
  local parts = {}
  for _ = 1, math.floor(m / n) do parts[#parts + 1] = fn.randperm(n, { generator = g }) end
  if m % n > 0 then parts[#parts + 1] = fn.randperm(n, { generator = g }):narrow(1, 1, m % n) end
  return #parts == 1 and parts[1] or fn.cat(parts, 1)
end

local SubsetRandomSampler = { name = "SubsetRandomSampler" }

--- data.SubsetRandomSampler(indices[, opts]): the given 0-based dataset indices (a list or
-- a 1-d tensor of integers >= 0), in a new random order each epoch, without replacement
-- (PyTorch's SubsetRandomSampler: indices[randperm(#indices)]). opts.generator: see the top
-- of this file. Raises naming an index that is not an integer >= 0.
function M.SubsetRandomSampler(indices, opts)
  opts = options.check("SubsetRandomSampler", opts, options.known { "generator" })
  local list = number_list("SubsetRandomSampler", "indices", indices, function(v, i)
    if v % 1 ~= 0 or v < 0 then
      lib.raise(("SubsetRandomSampler: indices[%d] = %s is not a dataset index (an integer >= 0; indices count from 0)")
        :format(i, tostring(v)))
    end
  end)
  return object.new(SubsetRandomSampler, { list = list, generator = generator_of("SubsetRandomSampler", opts) })
end

--- sampler:len() -> #indices.
function SubsetRandomSampler.len(self) return #self.list end

--- sampler:indices() -> (#indices) i64: the indices in a new random order.
function SubsetRandomSampler.indices(self)
  local m = #self.list
  if m == 0 then return fn.empty({ 0 }, { dtype = "i64" }) end
  return index_tensor(self.list):index_select(1, fn.randperm(m, { generator = self.generator }))
end

local WeightedRandomSampler = { name = "WeightedRandomSampler" }

--- data.WeightedRandomSampler(weights, num_samples[, opts]): num_samples indices in
-- 0 .. #weights - 1, index i drawn with probability weights[i+1] / sum(weights) (PyTorch's
-- WeightedRandomSampler, torch.multinomial's draws). weights: a list or a 1-d tensor of
-- finite numbers >= 0 (they need not sum to 1), not all 0. opts.replacement (true): true
-- draws each index independently; false draws without replacement, each next index among
-- those not drawn yet in proportion to their weights (Efraimidis and Spirakis, "Weighted
-- random sampling with a reservoir", IPL 2006: the num_samples largest u^(1/w), u uniform,
-- in decreasing order), and needs num_samples <= the count of non-zero weights.
-- opts.generator: see the top of this file. Raises PyTorch's errors (num_samples,
-- replacement, a weights tensor that is not 1-d, an invalid distribution).
function M.WeightedRandomSampler(weights, num_samples, opts)
  local who = "WeightedRandomSampler"
  opts = options.check(who, opts, options.known { "replacement", "generator" })
  check_num_samples(who, num_samples)
  local replacement = opts.replacement
  if replacement == nil then replacement = true end
  check_replacement(who, replacement)
  local total, nonzero = 0, 0
  local w = number_list(who, "weights", weights, function(v, i)
    if v ~= v or v == math.huge or v < 0 then
      lib.raise(("%s: invalid multinomial distribution: weights[%d] = %s (probability tensor contains either "
        .. "`inf`, `nan` or element < 0)"):format(who, i, tostring(v)))
    end
  end)
  local cdf = {}
  for i, v in ipairs(w) do
    total = total + v
    cdf[i] = total
    if v > 0 then nonzero = nonzero + 1 end
  end
  if total <= 0 then lib.raise(who .. ": invalid multinomial distribution (sum of probabilities <= 0)") end
  if not replacement and num_samples > nonzero then
    lib.raise(("%s: cannot sample num_samples = %d > %d non-zero weights without replacement (invalid multinomial "
      .. "distribution (with replacement=False, not enough non-negative category to sample))"):format(who,
      num_samples, nonzero))
  end
  return object.new(WeightedRandomSampler, { weights = w, cdf = cdf, total = total, num_samples = num_samples,
    replacement = replacement, generator = generator_of(who, opts) })
end

--- sampler:len() -> num_samples.
function WeightedRandomSampler.len(self) return self.num_samples end

-- The 0-based index whose cdf interval holds x in [0, total): the first i with cdf[i] > x
-- (a zero weight has an empty interval and is never found).
local function search(cdf, x)
  local lo, hi = 1, #cdf
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] > x then hi = mid else lo = mid + 1 end
  end
  return lo - 1
end

--- sampler:indices() -> (num_samples) i64, drawn afresh.
function WeightedRandomSampler.indices(self)
  local m, w = self.num_samples, self.weights
  local out = {}
  if self.replacement then
    local u = fn.rand({ m }, { dtype = "f64", generator = self.generator }):tolist()
    local cdf, total = self.cdf, self.total
    -- (u * total rounds to total at worst: the last index with a non-zero weight then)
    local last = #w
    while w[last] == 0 do last = last - 1 end
    for k = 1, m do out[k] = math.min(search(cdf, u[k] * total), last - 1) end
  else
    local u = fn.rand({ #w }, { dtype = "f64", generator = self.generator }):tolist()
    local keys, order = {}, {}
    for i, wi in ipairs(w) do
      if wi > 0 then
        -- log(u^(1/w)); u = 0 (possible in [0, 1)) gives -inf, the least likely key
        keys[i] = math.log(u[i]) / wi
        order[#order + 1] = i
      end
    end
    table.sort(order, function(a, b)
      if keys[a] ~= keys[b] then return keys[a] > keys[b] end
      return a < b
    end)
    for k = 1, m do out[k] = order[k] - 1 end
  end
  return index_tensor(out)
end


local BatchSampler = { name = "BatchSampler" }

--- data.BatchSampler(sampler, batch_size, drop_last): the batches of sampler's order, for a
-- DataLoader's batch_sampler (PyTorch's BatchSampler; Note [batch sampler] in
-- ddplua/data/loader.lua): consecutive groups of batch_size indices, the last one shorter
-- unless drop_last. sampler: an object with indices() (any sampler, drawn once per epoch),
-- or a fixed list or 1-d tensor of 0-based indices. Raises PyTorch's errors for a
-- batch_size that is not a positive integer and a drop_last that is not a boolean.
function M.BatchSampler(sampler, batch_size, drop_last)
  if type(batch_size) ~= "number" or batch_size % 1 ~= 0 or batch_size <= 0 then
    lib.raise(("BatchSampler: batch_size should be a positive integer value, but got batch_size=%s"):format(
      tostring(batch_size)))
  end
  if type(drop_last) ~= "boolean" then
    lib.raise(("BatchSampler: drop_last should be a boolean value, but got drop_last=%s"):format(tostring(drop_last)))
  end
  local draws = not is_tensor(sampler) and (type(sampler) == "table" or type(sampler) == "userdata")
    and pcall(function() assert(type(sampler.indices) == "function") end)
  if not draws then
    sampler = number_list("BatchSampler", "sampler", sampler, function(v, i)
      if v % 1 ~= 0 or v < 0 then
        lib.raise(("BatchSampler: sampler[%d] = %s is not a dataset index (an integer >= 0)"):format(i, tostring(v)))
      end
    end)
  end
  return object.new(BatchSampler, { sampler = sampler, draws = draws, batch_size = batch_size, drop_last = drop_last })
end

-- The count of indices an epoch of the sampler gives.
local function order_len(self)
  if not self.draws then return #self.sampler end
  return object.len(self.sampler)
end

--- batch_sampler:len() -> the count of batches: ceil(n / batch_size), floor with drop_last,
-- n the sampler's len().
function BatchSampler.len(self)
  local n = order_len(self)
  return self.drop_last and math.floor(n / self.batch_size) or math.ceil(n / self.batch_size)
end

--- batch_sampler:batches() -> the epoch's list of batches, each a Lua list of 0-based
-- indices (the sampler's indices() drawn once).
function BatchSampler.batches(self)
  local order = self.sampler
  if self.draws then
    order = order:indices()
    if is_tensor(order) then order = order:tolist() end
  end
  local out, bs = {}, self.batch_size
  local full = math.floor(#order / bs)
  local count = (self.drop_last or #order % bs == 0) and full or full + 1
  for b = 1, count do
    local batch = {}
    for k = 1, math.min(bs, #order - (b - 1) * bs) do batch[k] = order[(b - 1) * bs + k] end
    out[b] = batch
  end
  return out
end

return M
