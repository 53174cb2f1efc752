--- ddplua.data.worker_info: which DataLoader worker this Lua state is (PyTorch's
-- torch.utils.data.get_worker_info()).
--
-- Each worker of a DataLoader with num_workers > 0 runs in its own Lua state (or process),
-- so this module's value is per worker: the worker code sets it once with
-- set_worker_info before it calls the dataset; the main process never sets it.
local lib = require "ddplua.lib"

local M = {}

local current = nil

--- data.get_worker_info() -> nil in the main process (num_workers = 0, or outside any
-- loader); in a DataLoader worker a table {id = 0 .. num_workers-1, num_workers = n,
-- seed = the worker's seed, dataset = this worker's copy of the dataset}, as PyTorch's.
-- An IterableDataset uses it to give each worker its own part of the stream.
function M.get_worker_info() return current end

--- worker_info.set_worker_info(info): for the DataLoader's worker code only: record this
-- worker's info (a table with integer id in 0 .. num_workers-1 and num_workers >= 1), or
-- nil to clear it. Raises on a malformed table.
function M.set_worker_info(info)
  if info ~= nil then
    if type(info) ~= "table" or type(info.num_workers) ~= "number" or info.num_workers < 1
      or type(info.id) ~= "number" or info.id < 0 or info.id >= info.num_workers or info.id % 1 ~= 0 then
      lib.raise("set_worker_info: expected {id = 0 .. num_workers-1, num_workers = n >= 1}, got " .. tostring(info))
    end
  end
  current = info
end

return M
