-- Group abort (Note [group abort] in runtime/comm/pg.c): once a collective fails or
-- times out on one rank, or a rank calls dist.abort_process_group, every pending and later
-- collective of the group on every rank raises within about a second, naming the first
-- failure (its rank, collective, call site and cause). Before it, a rank that went on after a
-- peer's timeout paired its next all-reduce with the peer's abandoned contribution: through
-- shared memory rank 1 got 21 = its own 20 + rank 0's stale 1 (issue 24), and a rank left
-- waiting in a collective waited out its own timeout.
local mp = require "multiproc"

local BACKENDS = {
  { "gloo through shared memory", {} },
  { "gloo over TCP", { DDPLUA_SHM = "0" } },
}

-- Each rank prints "T <name> <seconds>" lines on the system's monotonic clock, which every
-- process of the machine shares.
local PRELUDE = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local dos = require "ddplua.os"
local function stamp(name) io.write(("T %s %.3f\n"):format(name, dos.monotonic())) io.flush() end
]]

local function stamp(output, name)
  return tonumber(output:match("T " .. name .. " ([%d.]+)"))
end

local root = io.popen("pwd"):read("*l")
local SIM = root .. "/build/libddplua_cuda_sim.so"

describe("group abort #faults #dist", function()
  it("abort_process_group aborts an nccl group on every rank (simulated NCCL)", function()
    local r = mp.run { code = PRELUDE .. [[
local lib = require "ddplua.lib"
local RANK = tonumber(os.getenv("RANK"))
dist.init_process_group{backend = "nccl", device_id = RANK, timeout = 10}
local box = lib.ffi.new("ddp_tensor*[1]")
lib.check(lib.C.ddp_tensor_to_device(box, dl.ones({2}), RANK, 0))
local t = lib.wrap(box[0])
dist.all_reduce(t)
print("FIRST", t:cpu():tolist()[1], dist.is_aborted())
if RANK == 0 then dist.abort_process_group() end
dos.sleep(1.5) -- rank 1 learns of it from its watcher (every 0.25 s)
print("LATER", dist.is_aborted(), pcall(dist.all_reduce, t))
dist.destroy_process_group()
print("DESTROYED")
]], env = { DDPLUA_SIM_NCCL = "1", DDPLUA_CUDA_PLUGIN = SIM }, timeout = 40 }
    assert.is_true(r.ok, mp.describe(r))
    for i = 1, 2 do
      local o = r[i].output
      assert.matches("FIRST\t2\tfalse", o, 1, true)
      assert.matches("LATER\ttrue\tfalse\t[^\n]*all_reduce on rank " .. (i - 1) ..
                     ": the process group was aborted: abort_process_group called on rank 0 at [^\n]*script.lua:13", o)
      assert.matches("DESTROYED", o, 1, true)
    end
  end)

  for _, b in ipairs(BACKENDS) do
    it("a timed-out all_reduce on one rank makes the other rank's next all_reduce raise, not add the stale contribution (" .. b[1] .. ")", function()
      local r = mp.run { code = PRELUDE .. [[
dist.init_process_group{backend = "gloo", timeout = 3}
local R = dist.get_rank()
if R == 0 then
  local ok, err = pcall(dist.all_reduce, dl.ones({1}))
  print("FIRST", ok, err)
else
  dos.sleep(5)
end
local t = dl.full({1}, 10 * (R + 1))
stamp("call")
local ok, err = pcall(dist.all_reduce, t)
stamp("raised")
print("SECOND", ok, ok and t:item() or err)
dos.sleep(1) -- rank 0 hosts the store: leave it up while rank 1 reads it
]], env = b[2], timeout = 40 }
      local o0, o1 = r[1].output, r[2].output
      assert.matches("FIRST\tfalse\t[^\n]*all_reduce timed out on rank 0", o0)
      -- both ranks raise: nothing is built from the abandoned contribution
      assert.matches("SECOND\tfalse", o0, 1, true)
      assert.matches("SECOND\tfalse", o1, 1, true)
      assert.not_matches("SECOND\ttrue", o1, 1, true)
      -- rank 1's error names the first failure: rank 0's all_reduce, its call site, the cause
      local line = o1:match("SECOND\tfalse\t([^\n]*)")
      assert.matches("the process group was aborted", line, 1, true)
      assert.matches("all_reduce timed out on rank 0", line, 1, true)
      assert.matches("script.lua:8", line, 1, true)
      -- at once: the group's timeout is 3 s
      assert.is_true(stamp(o1, "raised") - stamp(o1, "call") < 2.5, o1)
    end)

    it("a rank's timeout makes a peer's pending collective raise within a second, and a late rank's at its call (" .. b[1] .. ")", function()
      -- Rank 0 gives up after 2 s, rank 1 would wait 30 s, rank 2 comes after 6 s.
      local r = mp.run { nprocs = 3, code = PRELUDE .. [[
dist.init_process_group{backend = "gloo", timeout = 30}
local R = dist.get_rank()
dist.barrier()
if R == 0 then dist.set_timeout(2) end
if R == 2 then dos.sleep(6) end
stamp("call")
local ok, err = pcall(dist.all_reduce, dl.ones({4}))
stamp("raised")
print("RESULT", ok, err)
dos.sleep(1)
]], env = b[2], timeout = 60 }
      local o = { r[1].output, r[2].output, r[3].output }
      for i = 1, 3 do assert.matches("RESULT\tfalse\t", o[i], 1, true) end
      local failed_at = stamp(o[1], "raised")
      assert.is_number(failed_at, o[1])
      -- rank 1 was waiting: it raises within about a second of rank 0's timeout
      assert.is_true(stamp(o[2], "raised") - failed_at < 2.5,
                     ("rank 1 raised %.2f s after rank 0's timeout:\n%s"):format(stamp(o[2], "raised") - failed_at, o[2]))
      -- rank 2 came late: it raises at its call
      assert.is_true(stamp(o[3], "raised") - stamp(o[3], "call") < 2.5, o[3])
      for i = 2, 3 do
        local line = o[i]:match("RESULT\tfalse\t([^\n]*)")
        assert.matches("the process group was aborted", line, 1, true)
        assert.matches("all_reduce timed out on rank 0", line, 1, true)
        assert.matches("script.lua:11", line, 1, true)
      end
    end)

    it("aborting a subgroup leaves the world working, and new_group makes another (" .. b[1] .. ")", function()
      local r = mp.run { code = PRELUDE .. [[
dist.init_process_group{backend = "gloo", timeout = 10}
local R = dist.get_rank()
local sub = dist.new_group({0, 1})
if R == 0 then dist.abort_process_group(sub) end
dos.sleep(1)
print("SUB", dist.is_aborted(sub), pcall(dist.all_reduce, dl.ones{1}, {group = sub}))
local t = dl.ones{1}
dist.all_reduce(t)
print("WORLD", t:item(), dist.is_aborted())
dist.destroy_process_group(sub)
local u = dl.ones{1}
dist.all_reduce(u, {group = dist.new_group({0, 1})})
print("SUB2", u:item())
dos.sleep(0.5)
]], env = b[2], timeout = 40 }
      assert.is_true(r.ok, mp.describe(r))
      for i = 1, 2 do
        local o = r[i].output
        assert.matches("SUB\ttrue\tfalse\t[^\n]*the process group was aborted: abort_process_group called on rank 0 at [^\n]*script.lua:8", o)
        assert.matches("WORLD\t2\tfalse", o, 1, true)
        assert.matches("SUB2\t2", o, 1, true)
      end
    end)

    it("abort_process_group fails the asynchronous work pending on another rank, queued ones too (" .. b[1] .. ")", function()
      local r = mp.run { code = PRELUDE .. [[
dist.init_process_group{backend = "gloo", timeout = 30}
local R = dist.get_rank()
dist.barrier()
if R == 0 then
  dos.sleep(1.5)
  stamp("abort")
  dist.abort_process_group()
  dos.sleep(1)
else
  local w1 = dist.all_reduce(dl.ones({8}), {async_op = true})
  local w2 = dist.broadcast(dl.ones({8}), 0, {async_op = true}) -- queued behind w1
  for i, w in ipairs { w1, w2 } do
    local ok, err = pcall(w.wait, w)
    stamp("raised" .. i)
    print("WAIT" .. i, ok, err)
  end
end
]], env = b[2], timeout = 40 }
      assert.is_true(r.ok, mp.describe(r))
      local o0, o1 = r[1].output, r[2].output
      assert.matches("WAIT1\tfalse\t[^\n]*all_reduce on rank 1: the process group was aborted: abort_process_group called on rank 0", o1)
      assert.matches("WAIT2\tfalse\t[^\n]*broadcast on rank 1: the process group was aborted: abort_process_group called on rank 0", o1)
      assert.is_true(stamp(o1, "raised2") - stamp(o0, "abort") < 2.5, o0 .. o1)
    end)

    it("abort_process_group on one rank makes the other rank's pending collective raise within a second, and the group can be made again (" .. b[1] .. ")", function()
      local r = mp.run { code = PRELUDE .. [[
local R = tonumber(os.getenv("RANK"))
local store = require("ddplua.distributed.store").TCPStore("127.0.0.1", tonumber(os.getenv("MASTER_PORT")), {is_server = R == 0, timeout = 30})
dist.init_process_group{backend = "gloo", store = store, rank = R, world_size = 2, timeout = 30}
if R == 0 then
  dos.sleep(1.5)
  stamp("abort")
  dist.abort_process_group()
  local ok, err = pcall(dist.all_reduce, dl.ones({2}))
  print("AFTER", ok, err)
else
  stamp("call")
  local ok, err = pcall(dist.all_reduce, dl.ones({2}))
  stamp("raised")
  print("PENDING", ok, err)
  ok, err = pcall(dist.all_reduce, dl.ones({2}))
  print("AFTER", ok, err)
end
-- a new group on the same store (a new name)
dist.destroy_process_group()
dist.init_process_group{backend = "gloo", store = store, group_name = "pg2", timeout = 30}
local t = dl.full({2}, R + 1)
dist.all_reduce(t)
print("AGAIN", t:tolist()[1])
dos.sleep(0.5)
]], env = b[2], timeout = 60 }
      assert.is_true(r.ok, mp.describe(r))
      local o0, o1 = r[1].output, r[2].output
      local line = o1:match("PENDING\tfalse\t([^\n]*)")
      assert.is_string(line, o1)
      assert.matches("the process group was aborted", line, 1, true)
      assert.matches("abort_process_group called on rank 0 at [^\n]*script.lua:11", line)
      assert.is_true(stamp(o1, "raised") - stamp(o0, "abort") < 2.5, o0 .. o1)
      -- later calls raise at once on both ranks, naming the abort
      for _, o in ipairs { o0, o1 } do
        assert.matches("AFTER\tfalse\t[^\n]*abort_process_group called on rank 0", o)
        assert.matches("AGAIN\t3", o, 1, true)
      end
    end)
  end
end)
