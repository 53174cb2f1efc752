-- The flight recorder, the stall report and the SIGUSR1 dump (Note [flight recorder] in
-- runtime/comm/pg_recorder.h). Before them a SIGSTOPped rank ended the job only at
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
      -- SIGKILLed, it may still be on its way out (state R) for a moment on a loaded machine
      local state
      for _ = 1, 100 do
        local stat = io.open("/proc/" .. stopped_pid .. "/stat")
        state = stat and stat:read("*a"):match("^%d+ %b() (%a)")
        if stat then stat:close() end
        if state == nil or state == "Z" or state == "T" then break end
        os.execute("sleep 0.02")
      end
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

  it("reports once stall_report_s has passed, not a tick or two later", function()
    -- The watcher looked once a second and printed a tick after it published this rank's
    -- position: stall_report_s = 3 reported at 5.0 s, 2 between 3 and 4 s.
    local r = mp.run { code = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group{backend = "gloo", timeout = 20, stall_report_s = 2}
local t = dl.ones({4})
dist.all_reduce(t)
if dist.get_rank() == 1 then os.execute("sleep 4") end
dist.all_reduce(t)
]], timeout = 40 }
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    assert.matches("stall report %(rank 0, group 'pg'%): all_reduce #1 called at [^\n]*script.lua:7 has waited", o)
    local waited = tonumber(o:match("has waited ([%d.]+) s"))
    -- generous bounds: the machine may be loaded
    assert.is_true(waited >= 1.6 and waited <= 2.9, "reported after " .. waited .. " s, stall_report_s 2:\n" .. o)
  end)

  it("a rank cut off from the store still reports, naming its collective and the store it cannot reach", function()
    -- The store lives in a helper process that rank 1 stops (SIGSTOP) between two
    -- collectives: the ranks still reach each other, not the store. Rank 0 then waits in
    -- the all-reduce; its watcher used to block on the store for the job's timeout and print
    -- nothing.
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir) == 0)
    local helper = dir .. "/store.lua"
    local f = assert(io.open(helper, "w"))
    f:write([[
local store = require "ddplua.distributed.store"
local s = store.TCPStore("127.0.0.1", 0, {is_server = true, timeout = 60, secret = "stall-spec"})
local f = io.open(arg[1] .. ".tmp", "w"); f:write(s:port()); f:close()
os.rename(arg[1] .. ".tmp", arg[1])
os.execute("sleep 60")
]])
    f:close()
    local pid = tonumber(io.popen(("%s %s %s/port > %s/helper.log 2>&1 & echo $!"):format(
      mp.exe(), helper, dir, dir)):read("*a"))
    finally(function()
      os.execute(("kill -CONT %d; kill %d; rm -rf %s"):format(pid, pid, dir))
    end)
    local port
    for _ = 1, 500 do
      local pf = io.open(dir .. "/port")
      if pf then port = tonumber(pf:read("*a")); pf:close(); break end
      os.execute("sleep 0.02")
    end
    assert.is_number(port, "the store helper did not start")
    local r = mp.run { code = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local store = require "ddplua.distributed.store"
local R = tonumber(os.getenv("RANK"))
local s = store.TCPStore("127.0.0.1", ]] .. port .. [[, {timeout = 20, rank = R, secret = "stall-spec"})
dist.init_process_group{backend = "gloo", store = s, rank = R, world_size = 2, timeout = 20, stall_report_s = 1}
local t = dl.ones({4})
dist.all_reduce(t)
dist.barrier()
if R == 1 then os.execute("kill -STOP ]] .. pid .. [[; sleep 4; kill -CONT ]] .. pid .. [[") end
dist.all_reduce(t)
]], timeout = 40 }
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    assert.matches("stall report %(rank 0, group 'pg'%): all_reduce #2 called at [^\n]*script.lua:11 has waited", o)
    assert.matches("this rank cannot reach the store: [^\n]*127%.0%.0%.1:" .. port, o)
    assert.matches("the position of rank 1 is unknown", o, 1, true)
    local waited = tonumber(o:match("has waited ([%d.]+) s"))
    assert.is_true(waited < 2.5, "reported after " .. waited .. " s, stall_report_s 1:\n" .. o)
  end)

  it("SIGUSR1 dumps the recorder without cutting the rank's sleep short", function()
    -- ddplua.os.sleep resumes the time left when a signal handler (the recorder's SIGUSR1
    -- dump) interrupts it; libc's sleep, the only one a script had, returned early: a
    -- sleep(12) ended at ~5 s when SIGUSR1 came then.
    local r = mp.run { code = PRELUDE .. [[
local os_ = require "ddplua.os"
dist.barrier()
if R == 0 then os.execute("(sleep 0.5; kill -USR1 $PPID) &") end
local t0 = os_.monotonic()
os_.sleep(2)
print(("slept %.3f s"):format(os_.monotonic() - t0))
dist.barrier()
]] }
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    assert.matches("flight recorder of rank 0, group 'pg'", o, 1, true)
    for i = 1, 2 do
      local slept = tonumber(r[i].output:match("slept ([%d.]+) s"))
      assert.is_true(slept >= 1.99, "rank " .. (i - 1) .. " slept " .. tostring(slept) .. " s of 2")
    end
  end)

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
