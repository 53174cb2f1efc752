-- Specs for the launcher's live view (runtime/cli/live_view.c, Note [live view]; the status
-- pages of runtime/core/status.c, Note [rank status pages]): one line per rank with its
-- last step, throughput, loss, the collective it is in or waits for and the time since its
-- last progress; plain "[status]" lines when stdout is not a terminal, lines redrawn in place
-- and erased at the end on a terminal.
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- Rank 1 sleeps before the all-reduce rank 0 is already in, after both published a step.
local SCRIPT = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local Progress = require "ddplua.utils.progress"
dist.init_process_group { backend = "gloo" }
local rank = dist.get_rank()
Progress.new { total = 10, enabled = false }:update(7, 0.25 + rank, 1000 + rank)
if rank == 1 then require("ddplua.os").sleep(tonumber(os.getenv("SLEEP_S") or "3.5")) end
local t = dl.ones { 4 }
dist.all_reduce(t)
print("done", t:sum():item())
]]

describe("the launcher's live view #dist", function()
  local dir, script
  setup(function()
    dir = files.tmpdir("live-view")
    script = files.write(dir, "live.lua", SCRIPT)
  end)
  teardown(function() files.remove(dir) end)

  it("prints a status line per rank when stdout is not a terminal, naming the collective rank 0 waits in", function()
    local status, out = files.run(("env DDPLUA_STORE_SECRET=live-view-spec %s --nproc_per_node=2 --standalone "
      .. "--status_interval=1 %s"):format(exe, script))
    assert.are.equal(0, status, out)
    assert.matches("%[status%] rank 0: step 7, 1000 samples/s, loss 0%.2500, in all_reduce #%d+ for %d%.%d s, "
      .. "last progress %d%.%d s ago", out)
    assert.matches("%[status%] rank 1: step 7, 1001 samples/s, loss 1%.2500", out)
    assert.matches("%[rank 0%]: done\t8", out)
    local quiet_status, quiet = files.run(("env DDPLUA_STORE_SECRET=live-view-spec SLEEP_S=1.5 %s --nproc_per_node=2 "
      .. "--standalone --status_interval=0 %s"):format(exe, script))
    assert.are.equal(0, quiet_status, quiet)
    assert.is_nil(quiet:find("[status]", 1, true), quiet)
  end)

  it("redraws the lines in place on a terminal and erases them at the end", function()
    -- script(1) gives the launcher a terminal and keeps the bytes written to it: what a
    -- terminal draws from them is the terminal's business, the sequences are ours
    if os.execute("command -v script >/dev/null 2>&1") ~= 0 then pending("script(1) is not installed") return end
    local raw = dir .. "/typescript"
    local cmd = ("env DDPLUA_STORE_SECRET=live-view-spec SLEEP_S=3 %s --nproc_per_node=2 --standalone %s")
      :format(exe, script)
    local status = os.execute(("script -q -e -c %s %s > /dev/null 2>&1"):format(files.quote(cmd), files.quote(raw)))
    assert.are.equal(0, status)
    local bytes = files.read(raw)
    local ERASE = "\27[2A\27[J"
    -- the two lines, drawn again and again: each drawing after the first replaces the last
    local draws, erased = 0, 0
    for _ in bytes:gmatch("rank 0: step 7, 1000 samples/s, loss 0%.2500, in all_reduce #%d+ for [%d.]+ s") do draws = draws + 1 end
    for _ in bytes:gmatch(ERASE:gsub("%[", "%%["), "") do erased = erased + 1 end
    assert.is_true(draws >= 3, bytes)
    assert.is_true(erased >= draws, ("%d drawings, %d erasures"):format(draws, erased))
    assert.matches("rank 1: step 7, 1001 samples/s, loss 1%.2500", bytes)
    -- after the last erasure only the workers' output follows: no status line is left behind
    local last = 0
    local from = 1
    while true do
      local a, b = bytes:find(ERASE, from, true)
      if not a then break end
      last, from = b + 1, b + 1
    end
    local tail = bytes:sub(last)
    assert.is_nil(tail:find("rank 0: step 7", 1, true), tail)
    assert.matches("%[rank 0%]: done", bytes)
    assert.matches("%[rank 1%]: done", bytes)
  end)
end)
