-- Specs for the launcher's live view (runtime/cli/live_view.c, Note [live view]; the status
-- pages of runtime/core/status.c, Note [rank status pages]): one line per rank with its
-- last step, throughput, loss, the collective it is in or waits for and the time since its
-- last progress; plain "[status]" lines when stdout is not a terminal, lines redrawn in place
-- and erased at the end on a terminal.
local files = require "files"
local pty = require "pty"
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

-- The pane's visible rows only (pty's screen() includes the history, where tmux keeps lines
-- that an erase below the cursor cleared).
local function visible(term)
  local p = io.popen(("tmux -L %s capture-pane -p -J -t 0 2>/dev/null"):format(term.socket))
  local text = p:read("*a") or ""
  p:close()
  return text
end

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
    if not pty.available() then pending("tmux is not installed") return end
    local term = pty.start(("env DDPLUA_STORE_SECRET=live-view-spec SLEEP_S=4 %s --nproc_per_node=2 --standalone %s")
      :format(exe, script))
    local ok, err = pcall(function()
      term:wait_for("rank 0: step 7, 1000 samples/s, loss 0.2500, in all_reduce #", 30)
      term:wait_for("rank 1: step 7, 1001 samples/s", 30)
      -- in place: two lines on the screen at any time, however many redraws happened
      require("ddplua.os").sleep(1.2)
      local _, shown = visible(term):gsub("rank 0: step 7", "")
      assert.are.equal(1, shown, visible(term))
      local screen = term:wait_for("[rank 1]: done", 30)
      -- the job is over: the lines are gone, the workers' output stays
      for _ = 1, 40 do
        screen = visible(term)
        if not screen:find("rank 0: step 7", 1, true) then break end
        require("ddplua.os").sleep(0.1)
      end
      assert.is_nil(screen:find("rank 0: step 7", 1, true), screen)
      assert.is_nil(screen:find("[status]", 1, true), screen)
      assert.matches("%[rank 0%]: done", screen)
    end)
    term:close()
    assert(ok, err)
  end)
end)
