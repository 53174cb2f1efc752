-- Fault-injection specs for how failures are reported (issue 10, part 4): the error cause
-- survives being wrapped (Note [error text is an argument] in runtime/core/error.c).
-- Each case injects the fault (a rank that does not take part, a rank that raises) with
-- short timeouts, so every case takes a few seconds.
local mp = require "multiproc"

describe("failure messages #dist #faults", function()
  it("a DDP bucket that times out keeps the cause after 'failed on rank 0:'", function()
    local r = mp.run { nprocs = 2, timeout = 20, kill_on_failure = false, code = [[
local dl = require "ddplua"
local nn = require "ddplua.nn"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local RANK = tonumber(os.getenv("RANK"))
dist.init_process_group{backend = "gloo", timeout = 20}
dl.manual_seed(1)
local model = DDP(nn.Linear(6, 4), {timeout = 1})
local x, y = dl.randn({2, 6}), dl.randn({2, 4})
if RANK == 1 then os.execute("sleep 2.5") os.exit(0) end -- never reduces
local ok, err = pcall(function() ((model(x) - y):pow(2):mean()):backward() end)
io.write("ERR ", tostring(err), "\n")
]] }
    local err = r[1].output:match("ERR ([^\n]*)")
    assert.is_not_nil(err, mp.describe(r))
    -- before the fix: "... failed on rank 0:  (runtime/distributed/reducer.c:338)"
    local cause = err:match("failed on rank 0: (.*)$")
    assert.is_not_nil(cause, err)
    assert.matches("did not complete within 1 s", cause, 1, true)
    assert.is_nil(cause:find("failed on rank 0", 1, true), err)
  end)
end)
