--- ddplua.distributed.monitored_barrier: a barrier through the store that names the ranks
-- that did not arrive (PyTorch's dist.monitored_barrier), behind dist.monitored_barrier.
--
-- Group rank 0 waits for every other member's arrival key, one after another, within one
-- deadline; then it sets the release key the others wait for. A member missing at the
-- deadline is named in rank 0's error (all the missing ones with wait_all_ranks); the
-- others fail when rank 0 does not release them in time. It goes through the store, not
-- the process group, so it works while a collective of the group is stuck, and it is slow
-- (store round trips): a debugging aid, as in PyTorch.
local clock = require "ddplua.clock"
local lib = require "ddplua.lib"

local M = {}

-- Calls made so far per group key: every member calls in the same order, so the n-th call
-- of each rank meets under the same keys.
local calls = {}

--- M.run(store, ranks, me, timeout, wait_all_ranks): ranks (global ranks of the group in
-- group-rank order), me (this rank's group rank), timeout (seconds > 0). Raises
-- "monitored_barrier: rank(s) 1, 3 did not arrive within <t> s" on group rank 0, or
-- "monitored_barrier: rank <r> was not released by rank <r0> within <t> s" on the others
-- (or "...: <cause>" when the store failed before the deadline: rank 0, which hosts it, may
-- have ended).
function M.run(store, ranks, me, timeout, wait_all_ranks)
  local gkey = table.concat(ranks, ",")
  calls[gkey] = (calls[gkey] or 0) + 1
  local prefix = ("monitored_barrier/%s/%d/"):format(gkey, calls[gkey])
  if me ~= 0 then
    store:set(prefix .. "arrive/" .. me, "1")
    local t0 = clock.now()
    local ok, err = pcall(store.wait, store, { prefix .. "release" }, timeout)
    if not ok then
      if clock.now() - t0 < timeout then -- not the deadline: the store failed; say why
        lib.raise(("monitored_barrier: rank %d was not released by rank %d: %s")
          :format(ranks[me + 1], ranks[1], tostring(err)))
      end
      lib.raise(("monitored_barrier: rank %d was not released by rank %d within %g s (rank %d "
        .. "names the ranks that did not arrive)"):format(ranks[me + 1], ranks[1], timeout, ranks[1]))
    end
    return
  end
  local deadline = clock.now() + timeout
  local missing = {}
  for r = 1, #ranks - 1 do
    local left = deadline - clock.now()
    local ok = left > 0 and pcall(store.wait, store, { prefix .. "arrive/" .. r }, left)
    if not ok and not store:check({ prefix .. "arrive/" .. r }) then
      missing[#missing + 1] = tostring(ranks[r + 1])
      if not wait_all_ranks then break end
    end
  end
  if #missing > 0 then
    lib.raise(("monitored_barrier: rank%s %s did not arrive within %g s (checked by rank %d)")
      :format(#missing > 1 and "s" or "", table.concat(missing, ", "), timeout, ranks[1]))
  end
  store:set(prefix .. "release", "1")
end

return M
