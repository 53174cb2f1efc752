--- ddplua.utils.step_profiler: where the time of a training step goes (data, forward,
-- backward, exposed communication, optimizer), summed over an epoch, in milliseconds per
-- step.
--
--   local StepProfiler = require "ddplua.utils.step_profiler"
--   local prof = StepProfiler.new { enabled = opts.profile, synchronize = dl.cuda.synchronize }
--   prof:start()                                       -- before fetching the batch
--   for x, y in loader:iter() do
--     prof:lap("data"); ...forward...; prof:lap("forward"); loss:backward(); prof:lap("backward")
--     opt:step(); prof:lap("optimizer"); prof:add("comm", ddp:exposed_comm_seconds()); prof:step_done()
--   end
--   prof:report("profile epoch 1")   -- prints, then starts the next epoch's sums from zero
--
-- Kernels run asynchronously on a GPU: with `synchronize` set, every lap first waits for
-- the device, so that a phase's time is its own (this costs some overlap; a disabled
-- profiler never waits and never reads the clock).
local options = require "ddplua.options"
local clock = require "ddplua.clock"

local StepProfiler = {}
StepProfiler.__index = StepProfiler

-- The phases of the report, in order; "comm" is part of "backward" (the communication
-- backward waited for, not the communication it overlapped).
local PHASES = { "data", "forward", "backward", "comm", "optimizer" }

local KNOWN = options.known { "enabled", "profile", "synchronize" }

--- StepProfiler.new{enabled = bool, synchronize = fn} -> a profiler. enabled = false
-- (default true) makes every method do nothing. synchronize (optional) is called before
-- each clock reading (dl.cuda.synchronize on a GPU).
function StepProfiler.new(opts)
  opts = options.check("StepProfiler", opts, KNOWN)
  local self = setmetatable({ enabled = opts.enabled ~= false, synchronize = opts.synchronize, steps = 0,
    seconds = {} }, StepProfiler)
  for _, p in ipairs(PHASES) do self.seconds[p] = 0 end
  return self
end

local function now(self)
  if self.synchronize then self.synchronize() end
  return clock.now()
end

--- prof:start(): mark the beginning of the next phase (call before the first batch).
function StepProfiler:start()
  if self.enabled then self.t = now(self) end
end

--- prof:lap(phase): add the time since the last mark to `phase` ("data", "forward",
-- "backward" or "optimizer") and mark now.
function StepProfiler:lap(phase)
  if not self.enabled then return end
  local t = now(self)
  self.seconds[phase] = self.seconds[phase] + (t - self.t)
  self.t = t
end

--- prof:add(phase, seconds): add a time measured elsewhere (e.g. "comm" from
-- DDP:exposed_comm_seconds()).
function StepProfiler:add(phase, seconds)
  if self.enabled then self.seconds[phase] = self.seconds[phase] + seconds end
end

--- prof:step_done(): count one step.
function StepProfiler:step_done()
  if self.enabled then self.steps = self.steps + 1 end
end

--- prof:summary() -> {data = ms, forward = ms, backward = ms, comm = ms, optimizer = ms,
-- steps = n}: milliseconds per step since the last report.
function StepProfiler:summary()
  local n = math.max(self.steps, 1)
  local s = { steps = self.steps }
  for _, p in ipairs(PHASES) do s[p] = 1000 * self.seconds[p] / n end
  return s
end

--- prof:report(title, print_fn): print "<title> (ms per step, N steps): data .. | forward ..
-- | backward .. (of which exposed communication ..) | optimizer .." with print_fn (default
-- print), then reset the sums.
function StepProfiler:report(title, print_fn)
  if not self.enabled then return end
  local s = self:summary();
  (print_fn or print)(("%s (ms per step, %d steps): data %.2f | forward %.2f | backward %.2f " ..
    "(of which exposed communication %.2f) | optimizer %.2f"):format(title, s.steps, s.data, s.forward,
    s.backward, s.comm, s.optimizer))
  self.steps = 0
  for _, p in ipairs(PHASES) do self.seconds[p] = 0 end
end

return StepProfiler
