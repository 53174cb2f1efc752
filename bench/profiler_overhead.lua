--- bench/profiler_overhead.lua: what recording with ddplua.profiler costs (issue 27: goal
-- <= 5% on MLP training, <= 3% per op), against the same work with the profiler off.
--   build/ddplua bench/profiler_overhead.lua [--steps 200] [--rounds 9] [--calls 200000]
-- 1. MLP training (models/mlp.lua, batch 64, random data, SGD, 1 thread): samples/s with
--    the profiler off, on, and on with record_shapes. Each round runs the three modes in a
--    rotated order (so all see the same machine load); the figures are the median over
--    rounds of samples/s and of the per-round ratios on/off (paired medians) of wall time
--    and of the process's CPU time (less disturbed by other jobs on a shared machine).
-- 2. One small op (`a:add(b)` on (4,) f32, no tape, then a (64, 256) one): ns per call off
--    and on, median over rounds, paired ratio.
-- Recording keeps every event: each "on" round starts its own profile (events of the last
-- round only, no export), and the rounds are short enough for the default buffers.
-- Prints one line per figure: "mode=<...> value=<x> unit=<...> ratio=<on/off> [cpu_ratio=...]".
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"
local profiler = require "ddplua.profiler"
local os_ = require "ddplua.os"

-- CPU seconds of the process so far (one thread trains here; a shared machine disturbs this
-- less than the wall clock).
local function cpu_now()
  local ru = os_.resource_usage()
  return ru.user_seconds + ru.system_seconds
end

local steps, rounds, calls = 200, 9, 200000
for i = 1, #arg do
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--rounds" then rounds = tonumber(arg[i + 1]) end
  if arg[i] == "--calls" then calls = tonumber(arg[i + 1]) end
end
dl.set_num_threads(1)

dl.manual_seed(0)
local model = require("models.mlp")()
local opt = optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
local x, y = dl.randn({ 64, 784 }), dl.randint(0, 10, { 64 })

-- `steps` training steps under `mode` ("off", "on", "shapes"); wall and CPU seconds.
local function train(mode)
  local prof
  if mode ~= "off" then
    prof = profiler.profile { record_shapes = mode == "shapes", events_per_thread = 64 * steps }
    prof:start()
  end
  local t0, c0 = clock.now(), cpu_now()
  for _ = 1, steps do
    opt:zero_grad()
    nn.functional.cross_entropy(model(x), y):backward()
    opt:step()
    if prof then prof:step() end
  end
  local t, c = clock.now() - t0, cpu_now() - c0
  if prof then prof:stop() end
  return t, c
end

local function median(list)
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  return s[math.ceil(#s / 2)]
end

local modes = { "off", "on", "shapes" }
local sps, ratio, cpu_ratio = {}, {}, {}
for _, m in ipairs(modes) do sps[m], ratio[m], cpu_ratio[m] = {}, {}, {} end
train("off") -- warm-up
for round = 1, rounds do
  local t, c = {}, {}
  for k = 0, #modes - 1 do
    local m = modes[(round + k) % #modes + 1]
    t[m], c[m] = train(m)
  end
  for _, m in ipairs(modes) do
    sps[m][#sps[m] + 1] = steps * 64 / t[m]
    ratio[m][#ratio[m] + 1] = t.off / t[m] -- samples/s on / off
    cpu_ratio[m][#cpu_ratio[m] + 1] = c.off / c[m] -- samples per CPU second on / off
  end
end
for _, m in ipairs(modes) do
  print(("mode=mlp_%s value=%.0f unit=samples/s ratio=%.4f cpu_ratio=%.4f"):format(m, median(sps[m]),
    median(ratio[m]), median(cpu_ratio[m])))
end

-- Small ops: ns per call of fn, off and on, paired per round.
local function op_cost(name, fn, n)
  local off, on, r = {}, {}, {}
  local function timed(record)
    local prof
    if record then
      prof = profiler.profile { events_per_thread = n + 16 }
      prof:start()
    end
    local t0 = clock.now()
    for _ = 1, n do fn() end
    local t = (clock.now() - t0) / n * 1e9
    if prof then prof:stop() end
    return t
  end
  timed(false)
  for round = 1, rounds do
    local a, b
    if round % 2 == 0 then a = timed(false); b = timed(true) else b = timed(true); a = timed(false) end
    off[#off + 1], on[#on + 1], r[#r + 1] = a, b, b / a
  end
  print(("mode=%s_off value=%.1f unit=ns/call"):format(name, median(off)))
  print(("mode=%s_on value=%.1f unit=ns/call ratio=%.4f"):format(name, median(on), median(r)))
end

local a, b = dl.randn { 4 }, dl.randn { 4 }
dl.no_grad(function() op_cost("add_4", function() return a:add(b) end, calls) end)
local c, d = dl.randn { 64, 256 }, dl.randn { 64, 256 }
dl.no_grad(function() op_cost("add_64x256", function() return c:add(d) end, math.floor(calls / 10)) end)
