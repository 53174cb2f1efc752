--- ddplua.clock: a monotonic clock (seconds) and a median-of-runs timer (benchmarks, logs).
local C = require("ddplua.lib").C

local M = {}

--- Seconds from a monotonic clock (CLOCK_MONOTONIC, through ddp_os_monotonic_seconds).
function M.now()
  return C.ddp_os_monotonic_seconds()
end

--- Median time in seconds of one call of fn, over `runs` runs of `reps` calls each (after
-- one warm-up run).
function M.median_time(fn, reps, runs)
  runs = runs or 5
  local times = {}
  for r = 0, runs do
    local t0 = M.now()
    for _ = 1, reps do fn() end
    local dt = (M.now() - t0) / reps
    if r > 0 then times[#times + 1] = dt end
  end
  table.sort(times)
  return times[math.floor((#times + 1) / 2)]
end

--- Median times of fa and fb (seconds per call) measured alternately, `reps` calls per
-- run, `runs` runs each after one warm-up run of each, so both see the same machine load
-- (for ratios on a noisy machine).
function M.paired_median_time(fa, fb, reps, runs)
  runs = runs or 5
  local ta, tb = {}, {}
  for r = 0, runs do
    local t0 = M.now()
    for _ = 1, reps do fa() end
    local t1 = M.now()
    for _ = 1, reps do fb() end
    local t2 = M.now()
    if r > 0 then
      ta[#ta + 1] = (t1 - t0) / reps
      tb[#tb + 1] = (t2 - t1) / reps
    end
  end
  table.sort(ta)
  table.sort(tb)
  local mid = math.floor((runs + 1) / 2)
  return ta[mid], tb[mid]
end

return M
