--- bench/small_op.lua: the cost of one small op called from Lua, ddplua's side of
-- bench/small_op_torch.py (same ops, same method): `a + b` and `a:add(b)` on (4,) f32
-- tensors, tape on (the right operand requires grad) and off, in microseconds per call:
-- the median of `runs` runs of `calls` calls (after one untimed run), by wall clock and by
-- the process's CPU time (user + system, 1 thread: less disturbed by a loaded machine).
-- Each call makes a tensor handle that the collector releases; that cost is in the figure
-- (Note [handle registry] and Note [collector pacing] in lua/ddplua/lib.lua).
--   build/ddplua bench/small_op.lua [calls] [runs]     (defaults 100000, 7)
-- Prints one line per op: "framework=ddplua op=<plus_tape|plus_nograd|add_tape|add_nograd>
-- wall_us=<x> cpu_us=<y>" (plus = `a + b`, add = `a:add(b)`).
local dl = require "ddplua"
local clock = require "ddplua.clock"
local os_ = require "ddplua.os"

local calls = tonumber(arg[1]) or 100000
local runs = tonumber(arg[2]) or 7
dl.set_num_threads(1)
local a, b = dl.randn { 4 }, dl.randn({ 4 }, { requires_grad = true })

local function cpu_seconds()
  local u = os_.resource_usage()
  return u.user_seconds + u.system_seconds
end

local function median_us(fn, now)
  for _ = 1, calls do fn() end
  local times = {}
  for r = 1, runs do
    local t0 = now()
    for _ = 1, calls do fn() end
    times[r] = (now() - t0) / calls * 1e6
  end
  table.sort(times)
  return times[math.floor(runs / 2) + 1]
end

for _, case in ipairs {
  { "plus_tape", function() local _ = a + b end },
  { "plus_nograd", function() local _ = a + a end },
  { "add_tape", function() local _ = a:add(b) end },
  { "add_nograd", function() local _ = a:add(a) end },
} do
  print(("framework=ddplua op=%s wall_us=%.3f cpu_us=%.3f"):format(case[1], median_us(case[2], clock.now),
    median_us(case[2], cpu_seconds)))
end
