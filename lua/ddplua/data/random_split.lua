--- ddplua.data.random_split: split a dataset into non-overlapping random Subsets
-- (PyTorch's torch.utils.data.random_split).
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local datasets = require "ddplua.data.datasets"
local generator = require "ddplua.generator"
local C = lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

-- math.isclose(a, b) with Python's defaults (rel_tol 1e-9, abs_tol 0).
local function isclose(a, b) return math.abs(a - b) <= 1e-9 * math.max(math.abs(a), math.abs(b)) end

--- random_split.lengths(n, lengths) -> the list of subset sizes for a dataset of n samples:
-- `lengths` as given when they are counts summing to n; when they are fractions summing to
-- 1 (math.isclose, and the sum <= 1), floor(n * frac) each, then the remainder handed out
-- one by one round-robin from the first subset on (PyTorch 1.13's rule). Raises as
-- PyTorch: a fraction outside [0, 1] ("Fraction at index i is not between 0 and 1", i
-- 0-based as there), a negative or non-integer count, or a sum that is not n ("Sum of
-- input lengths does not equal the length of the input dataset!").
function M.lengths(n, lengths)
  if type(lengths) ~= "table" or #lengths == 0 then
    lib.raise("random_split: lengths must be a non-empty list of counts or fractions, got " .. type(lengths))
  end
  local sum = 0
  for i, v in ipairs(lengths) do
    if type(v) ~= "number" then lib.raise(("random_split: lengths[%d] is a %s, not a number"):format(i, type(v))) end
    sum = sum + v
  end
  local out = {}
  if isclose(sum, 1) and sum <= 1 then
    for i, frac in ipairs(lengths) do
      if frac < 0 or frac > 1 then
        lib.raise(("random_split: Fraction at index %d is not between 0 and 1 (lengths[%d] = %s)"):format(
          i - 1, i, tostring(frac)))
      end
      out[i] = math.floor(n * frac)
    end
    local remainder = n
    for _, v in ipairs(out) do remainder = remainder - v end
    for i = 0, remainder - 1 do
      local at = i % #out + 1
      out[at] = out[at] + 1
    end
  else
    for i, v in ipairs(lengths) do
      if v < 0 or v % 1 ~= 0 then
        lib.raise(("random_split: lengths[%d] = %s is not a count >= 0 (or give fractions summing to 1)"):format(
          i, tostring(v)))
      end
      out[i] = v
    end
  end
  local total = 0
  for _, v in ipairs(out) do total = total + v end
  if total ~= n then
    lib.raise(("random_split: Sum of input lengths does not equal the length of the input dataset! (%s sum to %s, "
      .. "the dataset has %d samples)"):format(table.concat(lengths, ", "), tostring(total), n))
  end
  return out
end

--- data.random_split(dataset, lengths[, generator]) -> a list of data.Subset, one per entry
-- of `lengths` (counts summing to #dataset, or fractions summing to 1: see
-- random_split.lengths), together a random permutation of the dataset's indices:
-- subset k holds perm[offset_k .. offset_k + len_k - 1] of perm = dl.randperm(#dataset,
-- {generator = generator}) (the default generator when nil), as PyTorch. The split is
-- reproducible from the generator's seed, but the permutation is ddplua's (Philox), not
-- PyTorch's (Mersenne Twister): the same seed does not give PyTorch's indices.
function M.random_split(dataset, lengths, gen)
  if dataset == nil or (type(dataset) ~= "table" and type(dataset) ~= "userdata") then
    lib.raise("random_split: expected a dataset, got " .. type(dataset))
  end
  local n = object.len(dataset)
  local sizes = M.lengths(n, lengths)
  local g = gen or generator.default
  if type(g) ~= "table" or g.handle == nil then lib.raise("random_split: generator must be a dl.Generator") end
  check(C.ddp_randperm(box, n, C.DDP_I64, g.handle))
  local perm = wrap(box[0])
  local out, offset = {}, 0
  for k, len in ipairs(sizes) do
    out[k] = datasets.Subset(dataset, len > 0 and perm:narrow(1, offset + 1, len) or {})
    offset = offset + len
  end
  return out
end

return M
