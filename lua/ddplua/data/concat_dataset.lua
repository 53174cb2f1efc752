--- ddplua.data.concat_dataset: ConcatDataset, datasets one after another (PyTorch's
-- torch.utils.data.ConcatDataset).
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"

local M = {}

local ConcatDataset = { name = "ConcatDataset" }

--- data.ConcatDataset(list): the samples of list[1], then of list[2], ... (a list of at
-- least one map-style dataset; an IterableDataset is refused as PyTorch does). Fields:
-- ds.datasets (the list) and ds.cumulative_sizes ({#list[1], #list[1] + #list[2], ...}).
-- ds:get(i) for i in 1 .. #ds; a negative i counts from the end (-1 is the last sample),
-- as PyTorch's negative indices (which count from -1 too). Samples take the Lua path of
-- the DataLoader (ds:get per sample). Raises naming the dataset at fault.
function M.ConcatDataset(list)
  if type(list) ~= "table" or #list == 0 then
    lib.raise("ConcatDataset: datasets should not be an empty iterable (expected a list of datasets)")
  end
  local cumulative, total = {}, 0
  for k, ds in ipairs(list) do
    if type(ds) ~= "table" and type(ds) ~= "userdata" then
      lib.raise(("ConcatDataset: datasets[%d] is a %s, not a dataset"):format(k, type(ds)))
    end
    local ok, iterable = pcall(function() return ds.is_iterable end)
    if ok and iterable then lib.raise(("ConcatDataset: ConcatDataset does not support IterableDataset (datasets[%d])"):format(k)) end
    total = total + object.len(ds)
    cumulative[k] = total
  end
  local copy = {}
  for k, ds in ipairs(list) do copy[k] = ds end
  return object.new(ConcatDataset, { datasets = copy, cumulative_sizes = cumulative })
end

--- ds:len() -> the sum of the datasets' lengths.
function ConcatDataset.len(self) return self.cumulative_sizes[#self.cumulative_sizes] end

--- ds:locate(i) -> k, j: sample i of ds (1-based; negative from the end) is sample j of
-- datasets[k] (both 1-based). Raises out of range.
function ConcatDataset.locate(self, i)
  local n = ConcatDataset.len(self)
  if type(i) ~= "number" or i % 1 ~= 0 or i == 0 or i > n or i < -n then
    if type(i) == "number" and i < -n then
      lib.raise(("ConcatDataset: absolute value of index should not exceed dataset length (index %d, length %d)")
        :format(i, n))
    end
    lib.raise(("ConcatDataset: index %s out of range 1..%d (or -%d..-1)"):format(tostring(i), n, n))
  end
  if i < 0 then i = n + 1 + i end
  local cum = self.cumulative_sizes
  -- bisect_right on the 0-based index: the first dataset whose cumulative size exceeds it
  local lo, hi = 1, #cum
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cum[mid] > i - 1 then hi = mid else lo = mid + 1 end
  end
  return lo, i - (lo > 1 and cum[lo - 1] or 0)
end

--- ds:get(i) -> datasets[k]:get(j) for the (k, j) of ds:locate(i).
function ConcatDataset.get(self, i)
  local k, j = ConcatDataset.locate(self, i)
  return self.datasets[k]:get(j)
end

function ConcatDataset.__tostring(self)
  return ("ConcatDataset(%d datasets, %d samples)"):format(#self.datasets, ConcatDataset.len(self))
end

return M
