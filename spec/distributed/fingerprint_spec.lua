-- Collective fingerprints (Note [collective fingerprints] in runtime/comm/pg_fingerprint.h):
-- two ranks that call a collective with different sizes, dtypes, reduce ops, collectives or
-- roots both fail at once with a message naming both calls and both call sites, on every
-- backend: gloo through shared memory (the default), gloo over TCP (DDPLUA_SHM=0), and nccl
-- on the simulated device's NCCL. Before fingerprints these runs returned garbage with exit
-- 0 (shared memory), aborted in Gloo's own thread (TCP) or hung to the timeout (f32 / i64).
local mp = require "multiproc"

local root = io.popen("pwd"):read("*l")
local SIM = root .. "/build/libddplua_cuda_sim.so"

-- Line 10 of the child holds rank 0's call, line 12 rank 1's.
local SCRIPT = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local lib = require "ddplua.lib"
local RANK, NCCL = tonumber(os.getenv("RANK")), os.getenv("DDPLUA_SIM_NCCL") == "1"
dist.init_process_group{backend = NCCL and "nccl" or "gloo", device_id = NCCL and RANK or nil, timeout = 5}
local box = lib.ffi.new("ddp_tensor*[1]")
local function T(t) if not NCCL then return t end lib.check(lib.C.ddp_tensor_to_device(box, t, RANK, 0)) return lib.wrap(box[0]) end
dist.all_reduce(T(dl.ones({2}))) -- an agreeing call first
if RANK == 0 then
  %s
else
  %s
end
print("NO ERROR")
]]

local CASES = {
  { "size", "dist.all_reduce(T(dl.ones({4})))", "dist.all_reduce(T(dl.ones({8})))",
    { "all_reduce(op sum, f32, shape (4,), #1)", "all_reduce(op sum, f32, shape (8,), #1)" } },
  { "dtype", "dist.all_reduce(T(dl.ones({4})))", "dist.all_reduce(T(dl.ones({4}, {dtype = 'i64'})))",
    { "all_reduce(op sum, f32, shape (4,), #1)", "all_reduce(op sum, i64, shape (4,), #1)" } },
  { "reduce op", "dist.all_reduce(T(dl.ones({4})))", "dist.all_reduce(T(dl.ones({4})), {op = 'max'})",
    { "all_reduce(op sum,", "all_reduce(op max," } },
  { "collective", "dist.all_reduce(T(dl.ones({4})))", "dist.broadcast(T(dl.ones({4})), 0)",
    { "all_reduce(op sum, f32, shape (4,), #1)", "broadcast(f32, shape (4,), root 0, #1)" } },
  { "root", "dist.broadcast(T(dl.ones({3, 2})), 0)", "dist.broadcast(T(dl.ones({3, 2})), 1)",
    { "broadcast(f32, shape (3, 2), root 0, #1)", "broadcast(f32, shape (3, 2), root 1, #1)" } },
}

local BACKENDS = {
  { "gloo through shared memory", {} },
  { "gloo over TCP", { DDPLUA_SHM = "0" } },
  { "nccl (simulated), through shared memory", { DDPLUA_SIM_NCCL = "1", DDPLUA_CUDA_PLUGIN = SIM } },
  { "nccl (simulated), through an NCCL all-gather", { DDPLUA_SIM_NCCL = "1", DDPLUA_CUDA_PLUGIN = SIM, DDPLUA_SHM = "0" } },
}

local function now()
  local p = io.popen("date +%s.%N")
  local s = tonumber(p:read("*l"))
  p:close()
  return s
end

describe("collective fingerprints #faults #dist", function()
  for _, b in ipairs(BACKENDS) do
    for _, c in ipairs(CASES) do
      it("a mismatched " .. c[1] .. " fails on both ranks, naming both calls (" .. b[1] .. ")", function()
        local t0 = now()
        local r = mp.run { code = SCRIPT:format(c[2], c[3]), env = b[2], timeout = 20, kill_on_failure = false }
        local elapsed = now() - t0
        assert.is_falsy(r.timed_out, mp.describe(r))
        assert.is_true(elapsed < 10, "took " .. elapsed .. " s")
        for rank = 1, 2 do
          local o = r[rank].output
          assert.is_truthy(r[rank].status and r[rank].status ~= 0, mp.describe(r))
          assert.not_matches("NO ERROR", o, 1, true)
          assert.matches("collective mismatch", o, 1, true)
          assert.matches(c[4][1], o, 1, true)
          assert.matches(c[4][2], o, 1, true)
          assert.matches("script.lua:10", o, 1, true) -- each rank's call site
          assert.matches("script.lua:12", o, 1, true)
        end
      end)
    end
  end

  -- The call site skips the library's own frames: a collective that a library module
  -- submits (here all_gather_object's, in ddplua.distributed.objects) names the user's line.
  -- When distributed_c10d moved out of distributed/init.lua, the prefix of the library's
  -- files kept the old file name and named objects.lua instead.
  it("a collective a library module submits names the user's line, not the module's", function()
    local r = mp.run { code = SCRIPT:format("dist.all_gather_object({}, {1})", "dist.all_reduce(T(dl.ones({4})))"),
      timeout = 20, kill_on_failure = false }
    assert.is_falsy(r.timed_out, mp.describe(r))
    for rank = 1, 2 do
      local o = r[rank].output
      assert.matches("collective mismatch", o, 1, true)
      assert.matches("at [^ ]*script.lua:10", o)
      assert.not_matches("called [%w_]+%b() at [^ ]*objects%.lua", o) -- (the traceback may name it)
    end
  end)

  it("agreeing collectives of every kind still run (gloo through shared memory)", function()
    local r = mp.run { code = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group{backend = "gloo", timeout = 5}
local R = dist.get_rank()
local t = dl.ones({5})
dist.all_reduce(t)
dist.all_reduce(dl.ones({3}, {dtype = "i64"}))
dist.broadcast(t, 1)
local out = dl.zeros({2, 5})
dist.all_gather(out, t)
dist.reduce(t, 0)
dist.barrier()
local w = dist.all_reduce(dl.ones({2}), {async_op = true})
w:wait()
print("SUM " .. out:sum():item())
]] }
    assert.is_true(r.ok, mp.describe(r))
    assert.matches("SUM 20", r[1].output, 1, true)
  end)
end)
