-- dist.monitored_barrier (lua/ddplua/distributed/monitored_barrier.lua): a barrier through
-- the store naming the ranks that did not arrive, as PyTorch's.
local mp = require "multiproc"

local PRELUDE = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group{backend = "gloo", timeout = 40}
local R = dist.get_rank()
local function try(name, fn)
  local ok, err = pcall(fn)
  io.write("ERR ", name, " ", ok and "no error" or tostring(err):gsub("\n", " | "), "\n")
  io.flush()
end
]]

describe("dist.monitored_barrier #faults #dist", function()
  it("lets every rank through when all arrive, several times in a row", function()
    local r = mp.run { code = PRELUDE .. [[
for _ = 1, 3 do dist.monitored_barrier(30) end
dist.monitored_barrier{timeout = 30, wait_all_ranks = true}
dist.barrier() -- rank 0 hosts the store: it must not end before the others were released
print("PASSED")
]], nprocs = 3 }
    assert.is_true(r.ok, mp.describe(r))
    for i = 1, 3 do assert.matches("PASSED", r[i].output, 1, true) end
  end)

  it("names the ranks that did not arrive (all of them with wait_all_ranks)", function()
    local r = mp.run { code = PRELUDE .. [[
if R == 0 then
  try("first", function() dist.monitored_barrier(0.5) end)
  try("all", function() dist.monitored_barrier{timeout = 0.5, wait_all_ranks = true} end)
  try("bad", function() dist.monitored_barrier(-1) end)
  dist.get_store():set("done", "1")
elseif R == 1 then
  dist.get_store():wait({"done"}, 10)
else
  try("released", function() dist.monitored_barrier(0.5) end)
  dist.get_store():wait({"done"}, 10)
end
]], nprocs = 3, timeout = 30 }
    assert.is_true(r.ok, mp.describe(r))
    local o0, o2 = r[1].output, r[3].output
    assert.matches("ERR first [^\n]*monitored_barrier: rank 1 did not arrive within 0.5 s", o0)
    assert.matches("ERR all [^\n]*monitored_barrier: ranks 1, 2 did not arrive within 0.5 s", o0)
    assert.matches("ERR bad [^\n]*timeout must be a number of seconds > 0", o0)
    assert.matches("ERR released [^\n]*monitored_barrier: rank 2 was not released by rank 0 within 0.5 s", o2)
  end)

  -- Before, any failure of the store's wait read "not released ... within 20 s", at once.
  it("says why when the store fails before the deadline (rank 0 ended)", function()
    local r = mp.run { code = PRELUDE .. [[
if R == 0 then -- end (and take the store down) once rank 1 has arrived, before releasing it
  dist.get_store():wait({"monitored_barrier/0,1/1/arrive/1"}, 20)
  os.exit(0)
end
try("gone", function() dist.monitored_barrier(20) end)
]], nprocs = 2, timeout = 30 }
    local o1 = r[2].output
    assert.matches("ERR gone [^\n]*monitored_barrier: rank 1 was not released by rank 0: ", o1)
    assert.not_matches("within 20 s", o1, 1, true)
  end)
end)
