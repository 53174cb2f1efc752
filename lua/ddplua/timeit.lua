--- ddplua.timeit: times a function as `:time` does at the REPL prompt (median of several
-- runs, after a warm-up run), for interactive use and quick comparisons.
local clock = require "ddplua.clock"

local M = {}

local TARGET_SECONDS = 0.5 -- aim for about this much measuring in all
local MIN_RUNS, MAX_RUNS = 5, 101

-- "12.3 ms", "4.56 µs", "1.23 s".
local function human(seconds)
  if seconds >= 1 then return ("%.3g s"):format(seconds) end
  if seconds >= 1e-3 then return ("%.3g ms"):format(seconds * 1e3) end
  if seconds >= 1e-6 then return ("%.3g µs"):format(seconds * 1e6) end
  return ("%.3g ns"):format(seconds * 1e9)
end
M.human = human

-- Wait for queued device work (a CUDA kernel is timed to its end, not to its launch).
local function synchronize()
  local ok, cuda = pcall(require, "ddplua.cuda")
  if ok and cuda.is_available() then cuda.synchronize() end
end

--- dl.timeit(fn[, opts]) -> median seconds, report: calls fn() once to warm up, then times
-- opts.runs calls (default: as many as fit in about half a second by one more call's time,
-- between 5 and 101) and
-- returns the median of one call in seconds and a line such as
-- "median 1.2 ms over 41 runs (min 1.1 ms, max 1.9 ms)". Device work is waited for after
-- each call. Raises what fn raises.
function M.timeit(fn, opts)
  assert(type(fn) == "function" or (getmetatable(fn) or {}).__call,
    "timeit: expected a function")
  fn() -- warm-up: first-call costs (allocations, loading) stay out of the figures
  synchronize()
  local runs = opts and opts.runs
  if not runs then
    local t0 = clock.now()
    fn()
    synchronize()
    runs = math.floor(TARGET_SECONDS / math.max(clock.now() - t0, 1e-7))
    runs = math.max(MIN_RUNS, math.min(MAX_RUNS, runs))
  end
  local times = {}
  for i = 1, runs do
    local s = clock.now()
    fn()
    synchronize()
    times[i] = clock.now() - s
  end
  table.sort(times)
  local median = times[math.floor((runs + 1) / 2)]
  local report = ("median %s over %d runs (min %s, max %s)"):format(human(median), runs,
    human(times[1]), human(times[runs]))
  return median, report
end

return M
