-- Note [collector pressure] (lua/ddplua/lib.lua): dead tensors wait for the Lua collector
-- only up to a headroom of max(8 MiB, 8 x the Lua heap, live / 4) over what is live, not
-- "as much again as is live": with a large long-lived tensor (a dataset) held, a loop that
-- drops its tensors at once must not pile up that much again of dead ones. Run in a fresh
-- process: the suite's own Lua heap (over 10 MiB) would set the headroom by itself.
local files = require "files"

local CHECK = [[
local dl = require "ddplua"
local MiB = 2 ^ 20
collectgarbage()
local held = dl.zeros({ 48 * MiB / 4 }) -- 48 MiB that stays live, as a dataset does
local live0 = dl.memory_stats().live
local heap = collectgarbage("count") * 1024
dl.reset_peak_memory()
for _ = 1, 400 do
  local t = dl.ones({ MiB / 4 }) -- 1 MiB, dead at the next iteration
  t:add_(1)
end
print(("excess=%d live=%d heap=%d held=%d"):format(dl.memory_stats().peak - live0, live0, heap,
  held:numel()))
]]

describe("collector pressure", function()
  it("keeps dead tensors under a quarter of a large live set while a loop drops them", function()
    local out = files.run_fresh("collector", CHECK)
    local excess, live, heap = out:match("excess=(%d+) live=(%d+) heap=(%d+)")
    assert(excess, out)
    excess, live, heap = tonumber(excess), tonumber(live), tonumber(heap)
    local MiB = 2 ^ 20
    -- the rule's headroom, plus slack for the loop's own tensor and the collector's timing
    local allowed = math.max(8 * MiB, 8 * heap, live / 4) + 4 * MiB
    assert(allowed < 32 * MiB, ("a fresh process's Lua heap (%.1f MiB) is too large for the "
      .. "check to tell the rules apart"):format(heap / MiB))
    assert(excess <= allowed, ("%.1f MiB of dead tensors waited (allowed %.1f MiB over %.1f MiB "
      .. "live)"):format(excess / MiB, allowed / MiB, live / MiB))
  end)
end)
