-- The flight recorder, the stall report and the SIGUSR1 dump (Note [flight recorder] in
-- runtime/distributed/pg_recorder.h). Before them a SIGSTOPped rank ended the job only at
-- the timeout with "timed out", and nothing could show what each rank had run.
local mp = require "multiproc"

local PRELUDE = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group{backend = "gloo", timeout = 4, stall_report_s = 1}
local R = dist.get_rank()
local t = dl.ones({4})
]]

describe("stall reports and the flight recorder #faults #dist", function()
  for _, env in ipairs { {}, { DDPLUA_SHM = "0" } } do
    it("name a SIGSTOPped rank as behind, and the job still ends at its timeout" ..
       (env.DDPLUA_SHM and " (gloo over TCP)" or ""), function()
      local pidfile = os.tmpname()
      local r = mp.run { code = PRELUDE .. [[
dist.all_reduce(t)
dist.barrier()
if R == 1 then os.execute("echo $PPID > ]] .. pidfile .. [[; kill -STOP $PPID") end
dist.all_reduce(t)
]], env = env, timeout = 30 }
      -- the stopped rank is gone once the run returns (it once stayed behind, stopped)
      local f = assert(io.open(pidfile))
      local stopped_pid = tonumber(f:read("*a"))
      f:close()
      os.remove(pidfile)
      assert.is_number(stopped_pid)
      local stat = io.open("/proc/" .. stopped_pid .. "/stat")
      local state = stat and stat:read("*a"):match("^%d+ %b() (%a)")
      if stat then stat:close() end
      assert.is_true(state == nil or state == "Z", "rank 1 (pid " .. stopped_pid .. ") is still there, state " .. tostring(state))
      local o = r[1].output
      assert.is_truthy(r[1].status and r[1].status ~= 0, mp.describe(r))
      assert.matches("stall report %(rank 0, group 'pg'%): all_reduce #2 called at [^\n]*script.lua:9 has waited", o)
      assert.matches("the last collective this rank completed: barrier #1 at [^\n]*script.lua:7", o)
      assert.matches("rank 1 is BEHIND: it has not reached all_reduce #2", o, 1, true)
      local waited = tonumber(o:match("has waited ([%d.]+) s"))
      assert.is_true(waited < 60, o)
      assert.matches("timed out on rank 0 after 4 s", o, 1, true) -- the timeout still rules
    end)
  end

  it("dumps each rank's last collectives on demand and on SIGUSR1", function()
    local r = mp.run { code = PRELUDE .. [[
dist.all_reduce(t)
dist.broadcast(t, 1)
dist.barrier()
if R == 0 then
  dist.dump_flight_recorder()
  os.execute("kill -USR1 $PPID; sleep 1.5")
end
dist.barrier()
]] }
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    local _, dumps = o:gsub("flight recorder of rank 0, group 'pg'", "")
    assert.are.equal(2, dumps, o) -- dump_flight_recorder, then SIGUSR1
    assert.matches("#0 all_reduce f32%[4%] at [^\n]*script.lua:6: enqueued [%d.]+, started [%d.]+, completed", o)
    assert.matches("#1 broadcast f32%[4%] at [^\n]*script.lua:7", o)
    assert.matches("#2 barrier %-%[0%] at [^\n]*script.lua:8", o)
  end)
end)
