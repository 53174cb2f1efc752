-- Distributed code on device tensors (ddplua/pg.h Note [gloo staging] and Note [nccl work],
-- ddplua/reducer.h Note [device buckets]) with real ranks on 127.0.0.1.
--
-- On a machine without a GPU the device paths run on the simulated device
-- (build/libddplua_cuda_sim.so: host memory and CPU kernels, set with DDPLUA_CUDA_PLUGIN in
-- the children) with the gloo backend, which stages CUDA tensors through host memory as
-- PyTorch's gloo does. That checks the bookkeeping (device checks, staging, write-back,
-- buckets allocated and scaled on the device, DDP equivalence), not NCCL: the nccl specs
-- are tagged `cuda` and skip without a real GPU.
local mp = require "multiproc"
local ddp_ranks = require "ddp_ranks"

local root = io.popen("pwd"):read("*l")
local SIM = root .. "/build/libddplua_cuda_sim.so"

-- Helpers of every child: moving tensors and modules between devices through the C API
-- (the front end's own device methods are not needed for these specs).
local PRELUDE = ddp_ranks.prelude { init = false, helpers = { "device" } } .. [[
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local Parameter = require("ddplua.nn.module").Parameter
function cpu(t) return to_dev(t, -1) end
function dev_of(t) return t.device end
function show(t)
  local parts = {}
  for i, v in ipairs(cpu(t):contiguous():view({-1}):tolist()) do parts[i] = string.format("%g", v) end
  return table.concat(parts, ",")
end
]]

local function run(code, opts)
  opts = opts or {}
  local env = { DDPLUA_CUDA_PLUGIN = opts.plugin or SIM }
  for k, v in pairs(opts.env or {}) do env[k] = v end
  return mp.run { code = PRELUDE .. code, nprocs = opts.nprocs or 2, timeout = opts.timeout or 60,
                  env = env }
end

local function line(output, key)
  return output:match("OUT " .. key:gsub("%p", "%%%0") .. " ([^\n]*)")
end

local function err_line(output, key)
  return output:match("ERR " .. key:gsub("%p", "%%%0") .. " ([^\n]*)")
end

describe("gloo collectives on cuda tensors (simulated device) #dist", function()
  it("all_reduce, broadcast, all_gather stage through the host and write back on the device", function()
    local r = run [[
dist.init_process_group{backend = "gloo", timeout = 20}
local dev = RANK % 2 -- rank 0 on cuda:0, rank 1 on cuda:1
local t = to_dev(dl.tensor({RANK + 1, 10 * (RANK + 1), -1}), dev)
dist.all_reduce(t)
out("sum", show(t) .. " " .. dev_of(t))
local a = to_dev(dl.tensor({1.5, 2.5}, {dtype = "f64"}), dev)
dist.all_reduce(a, {op = "avg"})
out("avg", show(a))
local m = to_dev(dl.tensor({RANK, 5 - RANK}), dev)
dist.all_reduce(m, {op = "max"})
out("max", show(m))
local b = to_dev(RANK == 0 and dl.tensor({7, 8, 9}) or dl.zeros({3}), dev)
dist.broadcast(b, 0)
out("broadcast", show(b))
local mine = to_dev(dl.tensor({RANK, RANK + 0.5}), dev)
local all = to_dev(dl.zeros({WORLD, 2}), dev)
dist.all_gather(all, mine)
out("all_gather", show(all) .. " " .. dev_of(all))
local list = {to_dev(dl.zeros({2}), dev), to_dev(dl.zeros({2}), dev)}
dist.all_gather(list, mine)
out("all_gather_list", show(list[1]) .. "|" .. show(list[2]))
-- a non-contiguous device view, asynchronous
local base = to_dev(dl.tensor({{1, 2}, {3, 4}}), dev)
local view = base:t()
local w = dist.all_reduce(view, {async_op = true})
w:wait()
out("view", show(base))
-- a CPU output with a device input (gloo takes any mix)
local cpu_out = dl.zeros({WORLD, 2})
dist.all_gather(cpu_out, mine)
out("mixed", show(cpu_out))
local rs = to_dev(dl.zeros({1}), dev)
dist.reduce_scatter(rs, to_dev(dl.tensor({1, 2}), dev))
out("reduce_scatter", show(rs))
local red = to_dev(dl.tensor({RANK + 1}), dev)
dist.reduce(red, 1)
out("reduce", show(red))
local g = RANK == 0 and to_dev(dl.zeros({WORLD, 1}), dev) or nil
dist.gather(to_dev(dl.tensor({RANK + 3}), dev), g, 0)
if g then out("gather", show(g)) end
local sc = to_dev(dl.zeros({1}), dev)
dist.scatter(sc, RANK == 0 and to_dev(dl.tensor({{4}, {6}}), dev) or nil, 0)
out("scatter", show(sc))
local a2a = to_dev(dl.zeros({2}), dev)
dist.all_to_all(a2a, to_dev(dl.tensor({10 * RANK, 10 * RANK + 1}), dev))
out("all_to_all", show(a2a))
local p2p = to_dev(dl.tensor({RANK == 0 and 42 or 0}), dev)
if RANK == 0 then dist.send(p2p, 1) else dist.recv(p2p, 0) end
out("p2p", show(p2p))
dist.barrier()
dist.destroy_process_group()
]]
    assert.is_true(r.ok, mp.describe(r))
    for rank = 1, 2 do
      local o = r[rank].output
      local dev = "cuda:" .. (rank - 1)
      assert.are.equal("3,30,-2 " .. dev, line(o, "sum"), o)
      assert.are.equal("1.5,2.5", line(o, "avg"), o)
      assert.are.equal("1,5", line(o, "max"), o)
      assert.are.equal("7,8,9", line(o, "broadcast"), o)
      assert.are.equal("0,0.5,1,1.5 " .. dev, line(o, "all_gather"), o)
      assert.are.equal("0,0.5|1,1.5", line(o, "all_gather_list"), o)
      assert.are.equal("2,4,6,8", line(o, "view"), o)
      assert.are.equal("0,0.5,1,1.5", line(o, "mixed"), o)
      assert.are.equal(tostring(2 * rank), line(o, "reduce_scatter"), o)
      assert.are.equal(rank == 2 and "3" or "1", line(o, "reduce"), o)
      if rank == 1 then assert.are.equal("3,4", line(o, "gather"), o) end
      assert.are.equal(rank == 1 and "4" or "6", line(o, "scatter"), o)
      assert.are.equal(rank == 1 and "0,10" or "1,11", line(o, "all_to_all"), o)
      assert.are.equal("42", line(o, "p2p"), o)
    end
  end)

  it("refuses the nccl backend on the simulated device (no NCCL) and without CUDA", function()
    local code = [[
try("nccl", function() dist.init_process_group{backend = "nccl", timeout = 5} end)
out("available", dist.is_nccl_available())
]]
    local r = run(code, { nprocs = 1 })
    assert.is_true(r.ok, mp.describe(r))
    assert.matches("nccl backend: NCCL is not available", err_line(r[1].output, "nccl"), 1, true)
    assert.are.equal("false", line(r[1].output, "available"))
    r = run(code, { nprocs = 1, plugin = "/nonexistent/libddplua_cuda.so" })
    assert.is_true(r.ok, mp.describe(r))
    assert.matches("nccl backend: CUDA is not available: the CUDA plug-in did not load",
                   err_line(r[1].output, "nccl"), 1, true)
    -- the default backend stays gloo for a CPU job; a device_id asks for nccl
    r = run([[
try("default", function() dist.init_process_group{device_id = "cuda:0", timeout = 5} end)
dist.init_process_group{timeout = 5}
out("backend", dist.get_backend())
dist.destroy_process_group()
]], { nprocs = 1 })
    assert.is_true(r.ok, mp.describe(r))
    assert.matches("nccl backend: NCCL is not available", err_line(r[1].output, "default"), 1, true)
    assert.are.equal("gloo", line(r[1].output, "backend"))
  end)
end)

-- The simulated device's one-rank NCCL (DDPLUA_SIM_NCCL=1): the nccl paths of the process
-- group and the front end (checks, work handles, subgroups, DDP on the group's device).
describe("the nccl backend on the simulated one-rank NCCL #dist", function()
  it("runs collectives on the group's device and refuses other tensors", function()
    local r = run([[
dist.init_process_group{backend = "nccl", device_id = "cuda:1", timeout = 10}
out("backend", dist.get_backend())
out("available", dist.is_nccl_available())
local cur = ffi.new("int[1]")
lib.check(C.ddp_cuda_current_device(cur))
out("current", cur[0])
local t = to_dev(dl.tensor({1, 2}), 1)
dist.all_reduce(t, {op = "avg"})
out("all_reduce", show(t))
try("cpu", function() dist.all_reduce(dl.ones({2})) end)
try("other_device", function() dist.all_reduce(to_dev(dl.ones({2}), 0)) end)
try("noncontig", function() dist.all_reduce(to_dev(dl.ones({2, 3}), 1):t()) end)
local list = {to_dev(dl.zeros({2}), 1)}
local w = dist.all_gather(list, to_dev(dl.tensor({3, 4}), 1), {async_op = true})
w:wait()
out("list", show(list[1]) .. " " .. dev_of(list[1]))
local gl = {to_dev(dl.zeros({2}), 1)}
dist.gather(to_dev(dl.tensor({5, 6}), 1), gl, 0)
out("gather", show(gl[1]))
local w2 = dist.broadcast(t, 0, {async_op = true})
w2:synchronize()
out("completed", w2:is_completed())
local g = dist.new_group({0})
dist.all_reduce(t, {group = g})
out("sub", dist.get_backend(g))
dist.barrier()
local m = module_to(nn.Linear(3, 2), 1)
local ddp = DDP(m, {device_ids = {1}})
ddp(dl.ones({4, 3})):sum():backward()
out("grad", dev_of(m.weight.grad) .. " " .. show(m.weight.grad))
try("ddp_other_device", function() DDP(module_to(nn.Linear(3, 2), 0)) end)
dist.destroy_process_group()
]], { nprocs = 1, env = { DDPLUA_SIM_NCCL = "1" } })
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    assert.are.equal("nccl", line(o, "backend"), o)
    assert.are.equal("true", line(o, "available"), o)
    assert.are.equal("1", line(o, "current"), o)
    assert.are.equal("1,2", line(o, "all_reduce"), o)
    assert.matches("all_reduce: tensor is on cpu but the nccl backend of this rank takes CUDA tensors on cuda:1",
                   err_line(o, "cpu"), 1, true)
    assert.matches("tensor is on cuda:0 but the nccl backend", err_line(o, "other_device"), 1, true)
    assert.matches("must be contiguous for the nccl backend", err_line(o, "noncontig"), 1, true)
    assert.are.equal("3,4 cuda:1", line(o, "list"), o)
    assert.are.equal("5,6", line(o, "gather"), o)
    assert.are.equal("true", line(o, "completed"), o)
    assert.are.equal("nccl", line(o, "sub"), o)
    assert.are.equal("cuda:1 4,4,4,4,4,4", line(o, "grad"), o)
    assert.matches("parameter 0 is on cuda:0 but the nccl process group of this rank works on cuda:1",
                   err_line(o, "ddp_other_device"), 1, true)
  end)
end)

-- k = 3 SGD steps on 2 ranks with device parameters, each rank with its half of the batch,
-- must equal 3 steps of one process on the CPU with the whole batch (the loss is a mean and
-- DDP averages the gradients).
local TRAIN = [[
dist.init_process_group{backend = "gloo", timeout = 30}
local dev = RANK -- one device per process
local function net()
  dl.manual_seed(1)
  return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
end
dl.manual_seed(100)
local K, B = 3, 8
local xs, ys = {}, {}
for s = 1, K do xs[s], ys[s] = dl.randn({B, 5}), dl.randn({B, 3}) end
local function mse(a, b) return (a - b):pow(2):mean() end
local function step(m, lr)
  dl.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:sub_(p.grad * lr) end
  end)
  m:zero_grad()
end
local model = module_to(net(), dev)
local ddp = DDP(model, {device_ids = {dev}, bucket_cap_mb = 0.0001, gradient_as_bucket_view = AS_VIEW,
                        find_unused_parameters = AS_VIEW})
out("buckets", #ddp:buckets())
for s = 1, K do
  local n = B / WORLD
  local x = xs[s]:narrow(1, RANK * n + 1, n) -- a CPU input: device_ids moves it
  local y = to_dev(ys[s]:narrow(1, RANK * n + 1, n):contiguous(), dev)
  local loss = mse(ddp(x), y)
  loss:backward()
  out("grad_device" .. s, dev_of(model:parameters()[1].grad))
  step(model, 0.1)
end
ddp:verify_sync()
local ref = net()
for s = 1, K do
  mse(ref(xs[s]), ys[s]):backward()
  step(ref, 0.1)
end
local worst = 0
local p1, p2 = model:parameters(), ref:parameters()
for i = 1, #p1 do
  local d = (cpu(p1[i]) - p2[i]):abs():max():item()
  worst = math.max(worst, d / math.max(p2[i]:abs():max():item(), 1e-12))
end
out("param_device", dev_of(p1[1]))
out("max_rel", string.format("%.3g", worst))
dist.destroy_process_group()
]]

describe("DistributedDataParallel on the simulated NCCL (2 ranks) #dist", function()
  for _, as_view in ipairs { false, true } do
    it("matches a single CPU process over 3 steps (gradient_as_bucket_view and find_unused_parameters = " ..
       tostring(as_view) .. ")", function()
      local code = TRAIN:gsub('dist.init_process_group{backend = "gloo", timeout = 30}',
        'dist.init_process_group{backend = "nccl", device_id = RANK, timeout = 30}')
      code = code:gsub("dist.destroy_process_group%(%)%s*$", "")
      local r = run("AS_VIEW = " .. tostring(as_view) .. "\n" .. code .. [[
local t = to_dev(dl.tensor({RANK + 1, 2}), RANK)
dist.all_reduce(t, {op = "max"})
out("max", show(t))
local rs = to_dev(dl.zeros({1}), RANK)
dist.reduce_scatter(rs, to_dev(dl.tensor({1, 2}), RANK), {op = "avg"})
out("reduce_scatter", show(rs))
out("backend", dist.get_backend())
dist.destroy_process_group()
]], { env = { DDPLUA_SIM_NCCL = "1" } })
      assert.is_true(r.ok, mp.describe(r))
      for rank = 1, 2 do
        local o = r[rank].output
        assert.are.equal("cuda:" .. (rank - 1), line(o, "grad_device3"), o)
        assert.is_true(tonumber(line(o, "max_rel")) < 1e-5, o)
        assert.are.equal("2,2", line(o, "max"), o)
        assert.are.equal(tostring(rank), line(o, "reduce_scatter"), o)
        assert.are.equal("nccl", line(o, "backend"), o)
      end
    end)
  end
end)

describe("the nccl backend when a peer is gone (simulated NCCL) #dist", function()
  it("times out naming the collective and the rank, and the group stays failed", function()
    local r = run([[
dist.init_process_group{backend = "nccl", timeout = 2}
if RANK == 1 then os.exit(0) end
local t = to_dev(dl.ones({2}), 0)
try("first", function() dist.all_reduce(t) end)
try("second", function() dist.all_reduce(t) end)
out("error", C.ddp_pg_error(dist.get_default_group().handle) ~= nil and
    ffi.string(C.ddp_pg_error(dist.get_default_group().handle)) ~= "")
]], { env = { DDPLUA_SIM_NCCL = "1", DDPLUA_SHM = "0" } })
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    -- The wait that runs out is the fingerprint exchange before the data (Note [collective
    -- fingerprints]): with DDPLUA_SHM=0 an NCCL all-gather of the records (through shared
    -- memory the dead peer is seen at once: the next spec).
    assert.matches("all_reduce on rank 0 (nccl backend, exchanging fingerprints): all_gather: the " ..
                   "simulated NCCL timed out after 2 s", err_line(o, "first"), 1, true)
    -- the failure aborted the group (Note [group abort]): later calls name it
    assert.matches("all_reduce on rank 0: the process group was aborted: all_reduce on rank 0 (nccl backend, " ..
                   "exchanging fingerprints): all_gather: the simulated NCCL timed out", err_line(o, "second"), 1, true)
    assert.are.equal("true", line(o, "error"), o)
  end)
end)

describe("the nccl backend's fingerprint exchange when a peer is gone (simulated NCCL) #dist", function()
  it("names the rank that exited at once, and the group stays failed", function()
    local r = run([[
dist.init_process_group{backend = "nccl", timeout = 20}
if RANK == 1 then os.exit(0) end
local t = to_dev(dl.ones({2}), 0)
try("first", function() dist.all_reduce(t) end)
try("second", function() dist.all_reduce(t) end)
]], { env = { DDPLUA_SIM_NCCL = "1" } })
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    assert.matches("all_reduce on rank 0 (nccl backend, exchanging fingerprints): shared memory: rank 1 " ..
                   "(pid ", err_line(o, "first"), 1, true)
    assert.matches("exited while rank 0 waited for it", err_line(o, "first"), 1, true)
    assert.matches("all_reduce on rank 0: the process group was aborted: all_reduce on rank 0 (nccl backend, " ..
                   "exchanging fingerprints): shared memory: rank 1 (pid ", err_line(o, "second"), 1, true)
  end)
end)

describe("DistributedDataParallel on device parameters (simulated device, gloo) #dist", function()
  for _, as_view in ipairs { false, true } do
    it("matches a single CPU process over 3 steps (gradient_as_bucket_view and find_unused_parameters = " ..
       tostring(as_view) .. ")", function()
      local r = run("AS_VIEW = " .. tostring(as_view) .. "\n" .. TRAIN)
      assert.is_true(r.ok, mp.describe(r))
      for rank = 1, 2 do
        local o = r[rank].output
        assert.is_true(tonumber(line(o, "buckets")) > 1, o)
        assert.are.equal("cuda:" .. (rank - 1), line(o, "param_device"), o)
        assert.are.equal("cuda:" .. (rank - 1), line(o, "grad_device3"), o)
        assert.is_true(tonumber(line(o, "max_rel")) < 1e-5, o)
      end
    end)
  end

  it("broadcasts rank 0's device buffers at construction and before each forward", function()
    local r = run [[
dist.init_process_group{backend = "gloo", timeout = 20}
local m = module_to(nn.Linear(2, 2), RANK)
m:register_buffer("stat", to_dev(dl.tensor({RANK + 1, 10 * (RANK + 1)}), RANK))
local ddp = DDP(m, {device_ids = {"cuda:" .. RANK}})
out("after_init", show(m.stat) .. " " .. dev_of(m.stat))
dl.no_grad(function() m.stat:fill_(RANK + 5) end)
dl.no_grad(function() ddp(dl.ones({1, 2})) end)
out("after_forward", show(m.stat))
dist.destroy_process_group()
]]
    assert.is_true(r.ok, mp.describe(r))
    for rank = 1, 2 do
      local o = r[rank].output
      assert.are.equal("1,10 cuda:" .. (rank - 1), line(o, "after_init"), o)
      assert.are.equal("5,5", line(o, "after_forward"), o)
    end
  end)

  it("refuses parameters on mixed devices and device_ids that do not match", function()
    local r = run([[
dist.init_process_group{backend = "gloo", timeout = 10}
local m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
local first = m:modules()[2]
local d = rawget(first, "_parameters")
dl.no_grad(function() d.values.weight = Parameter(to_dev(d.values.weight, 0)) end)
try("mixed", function() DDP(m) end)
local m2 = module_to(nn.Linear(2, 2), 1)
try("device_ids", function() DDP(m2, {device_ids = {0}}) end)
try("two_ids", function() DDP(m2, {device_ids = {0, 1}}) end)
dist.destroy_process_group()
]], { nprocs = 1 })
    assert.is_true(r.ok, mp.describe(r))
    local o = r[1].output
    assert.matches("parameters on several devices are not supported", err_line(o, "mixed"), 1, true)
    assert.matches("device_ids is {cuda:0} but the module's parameters are on cuda:1",
                   err_line(o, "device_ids"), 1, true)
    assert.matches("device_ids must list exactly one device", err_line(o, "two_ids"), 1, true)
  end)
end)

-- ---- a real GPU: the nccl backend ---------------------------------------------------------

-- The number of real CUDA devices with NCCL (spec/helpers/cuda.lua).
local real_gpus = require("cuda").nccl_gpus

describe("nccl collectives on a real GPU #cuda #dist", function()
  local gpus = real_gpus()
  local nprocs = math.min(gpus, 2)

  it("all_reduce, broadcast, all_gather, reduce_scatter, barrier and DDP on nccl", function()
    if gpus < 1 then
      pending("no real CUDA device with NCCL here: the nccl specs need a GPU")
      return
    end
    local r = run([[
dist.init_process_group{backend = "nccl", timeout = 60}
local dev = RANK
out("backend", dist.get_backend())
local t = to_dev(dl.tensor({RANK + 1, 2}), dev)
dist.all_reduce(t)
out("sum", show(t))
local h = to_dev(dl.tensor({1, 3}, {dtype = "f16"}), dev)
dist.all_reduce(h, {op = "avg"})
out("avg16", show(h))
local b = to_dev(RANK == 0 and dl.tensor({7, 8}) or dl.zeros({2}), dev)
local w = dist.broadcast(b, 0, {async_op = true})
w:wait()
out("broadcast", show(b))
local all = to_dev(dl.zeros({WORLD, 2}), dev)
dist.all_gather(all, to_dev(dl.tensor({RANK, RANK}), dev))
out("all_gather", show(all))
local rs = to_dev(dl.zeros({1}), dev)
dist.reduce_scatter(rs, to_dev(dl.arange(1, WORLD + 1):float(), dev))
out("reduce_scatter", show(rs))
try("cpu", function() dist.all_reduce(dl.ones({2})) end)
dist.barrier()
local w2 = dist.all_reduce(to_dev(dl.ones({1000}), dev), {async_op = true})
w2:synchronize(30)
out("completed", w2:is_completed())
]] .. TRAIN:gsub('dist.init_process_group{backend = "gloo", timeout = 30}', "")
      :gsub("AS_VIEW", "false"), { plugin = "", nprocs = nprocs, timeout = 120,
                                   env = { DDPLUA_CUDA_PLUGIN = false } })
    assert.is_true(r.ok, mp.describe(r))
    for rank = 1, nprocs do
      local o = r[rank].output
      local W = nprocs
      assert.are.equal("nccl", line(o, "backend"), o)
      assert.are.equal(("%g,%g"):format(W * (W + 1) / 2, 2 * W), line(o, "sum"), o)
      assert.are.equal("1,3", line(o, "avg16"), o)
      assert.are.equal("7,8", line(o, "broadcast"), o)
      assert.matches("nccl backend of this rank takes CUDA tensors", err_line(o, "cpu"), 1, true)
      assert.are.equal("true", line(o, "completed"), o)
      assert.are.equal(tostring(rank * W), line(o, "reduce_scatter"), o)
      assert.is_true(tonumber(line(o, "max_rel")) < 1e-4, o)
    end
  end)
end)
