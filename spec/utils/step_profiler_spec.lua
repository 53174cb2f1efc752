-- Specs for ddplua.utils.step_profiler: laps land in their phase, the report's text and
-- reset, synchronize before each reading, and a disabled profiler doing nothing.
local StepProfiler = require "ddplua.utils.step_profiler"
local clock = require "ddplua.clock"

local function spin(seconds)
  local t = clock.now()
  while clock.now() - t < seconds do end
end

describe("ddplua.utils.step_profiler", function()
  it("sums laps per phase in ms per step and resets after a report", function()
    local syncs = 0
    local p = StepProfiler.new { synchronize = function() syncs = syncs + 1 end }
    for _ = 1, 2 do
      p:start()
      spin(0.002); p:lap("data")
      spin(0.004); p:lap("forward")
      p:lap("backward")
      p:lap("optimizer")
      p:add("comm", 0.001)
      p:step_done()
    end
    assert.are.equal(10, syncs)
    local s = p:summary()
    assert.are.equal(2, s.steps)
    assert.is_true(s.data >= 2 and s.data < 50, tostring(s.data))
    assert.is_true(s.forward >= 4 and s.forward < 50, tostring(s.forward))
    assert.is_true(math.abs(s.comm - 1) < 1e-9)
    local line
    p:report("profile epoch 3", function(l) line = l end)
    assert.matches("^profile epoch 3 %(ms per step, 2 steps%): data [%d.]+ | forward [%d.]+ | backward [%d.]+ " ..
      "%(of which exposed communication 1.00%) | optimizer [%d.]+$", line)
    assert.are.equal(0, p:summary().steps)
    assert.are.equal(0, p:summary().data)
  end)

  it("does nothing when disabled", function()
    local p = StepProfiler.new { enabled = false, synchronize = function() error("no sync when disabled") end }
    p:start(); p:lap("data"); p:add("comm", 1); p:step_done()
    local printed = false
    p:report("x", function() printed = true end)
    assert.is_false(printed)
  end)
end)
