-- Specs for DistributedDataParallel's static_graph = true and ddp:_get_ddp_logging_data()
-- (ddplua/reducer_static_graph.h, Note [static graph]) with 2 real ranks on 127.0.0.1.
--
-- Each training run is checked against one process trained on the whole batches from the
-- same seed (rank 0 computes it and prints the largest relative difference per tensor), and
-- the replicas against each other (their parameters printed in full).
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  helpers = { "batches", "shard", "mse", "max_rel", "params_text", "device", "branch_net" },
} .. [[
local lib = require "ddplua.lib"
-- k SGD-momentum steps of model `m` (a DDP or a plain module) on the batches (sharded when
-- m is a DDP); forward(m, x, s) gives the loss's input.
function train(m, xs, ys, is_ddp, forward)
  local opt = optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
  for s = 1, #xs do
    opt:zero_grad()
    local x, y = xs[s], ys[s]
    if is_ddp then x, y = shard(x), shard(y) end
    mse(forward(m, x, s), y):backward()
    opt:step()
  end
  return m
end
-- A reentrant checkpoint (PyTorch's CheckpointFunction): the segment runs without grad in
-- forward, and its backward recomputes it with grad and walks that graph (Note [reentrant
-- backward] in runtime/autograd/engine.c); the parameters inside get their gradients, and
-- their DDP hooks fire, inside that inner backward.
-- (spec/helpers/reentrant_checkpoint.lua)
local Ckpt = require("spec.helpers.reentrant_checkpoint")("Checkpoint")
function checkpoint(fn, x) return Ckpt.apply(fn, x) end
-- a -> tanh -> checkpoint(b -> tanh) -> head, with b used again outside the checkpoint, so
-- its hook fires twice in one backward; CheckpointNet(true) also has a layer `unused` that
-- forward never uses.
CheckpointNet = nn.Module:extend("Net")
function CheckpointNet:init(with_unused)
  dl.manual_seed(3)
  self.a = nn.Linear(6, 8)
  self.b = nn.Linear(8, 8)
  if with_unused then self.unused = nn.Linear(8, 8) end
  self.head = nn.Linear(8, 4)
end
function CheckpointNet:forward(x)
  local h = dl.tanh(self.a(x))
  h = checkpoint(function(t) return dl.tanh(self.b(t)) end, h) -- b inside the checkpoint
  return self.head(h + dl.tanh(self.b(h)))                       -- and outside it
end
]]

local root = io.popen("pwd"):read("*l")

-- run(code, n, opts): spec/helpers/ddp_ranks.lua's, on 2 ranks by default.
local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

local function check_trained(ranks, tol)
  local rel = tonumber(ranks[1].out.max_rel)
  assert.is_not_nil(rel, "rank 0 printed no max_rel")
  assert.is_true(rel <= (tol or 1e-5), "max relative difference " .. tostring(rel))
  assert.is_not_nil(ranks[1].out.params)
  assert.equal(ranks[1].out.params, ranks[2].out.params)
end

describe("ddplua.distributed.ddp static_graph #dist", function()
  it("trains as one process, rebuilds once, and reports PyTorch's logging data", function()
    local code = [[
local function mlp()
  dl.manual_seed(1)
  return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 4))
end
local xs, ys = batches(4, 8, {6}, 4)
local fwd = function(m, x) return m(x) end
local model = DDP(mlp(), {static_graph = true, bucket_cap_mb = 0.001})
local before = model:_get_ddp_logging_data()
out("before_iteration", before.iteration)
out("before_rebuilt", tostring(before.has_rebuilt_buckets))
local rebuilt_at = {}
local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
for s = 1, #xs do
  opt:zero_grad()
  mse(model(shard(xs[s])), shard(ys[s])):backward()
  opt:step()
  rebuilt_at[s] = tostring(model:has_rebuilt_buckets())
end
out("rebuilt_at", table.concat(rebuilt_at, " "))
local counts = {}
for i = 0, #model.params - 1 do counts[#counts + 1] = lib.C.ddp_reducer_static_hook_count(model.reducer, i) end
out("hook_counts", table.concat(counts, " "))
out("params", params_text(model.module))
if RANK == 0 then out("max_rel", max_rel(model.module, train(mlp(), xs, ys, false, fwd))) end
local d = model:_get_ddp_logging_data()
local function sum(t) local s = 0; for _, v in ipairs(t) do s = s + v end; return s end
out("static", tostring(d.static_graph))
out("world_rank", d.world_size .. " " .. d.rank)
out("iteration", d.iteration)
out("rebuilt", tostring(d.has_rebuilt_buckets))
out("bucket_sum", sum(d.bucket_sizes))
out("rebuilt_sum", d.rebuilt_bucket_sizes and sum(d.rebuilt_bucket_sizes) or "nil")
out("n_buckets", #d.bucket_sizes .. " " .. #d.rebuilt_bucket_sizes)
out("total", d.total_parameter_size_bytes)
out("cap", d.bucket_cap_bytes)
out("flags", tostring(d.find_unused_parameters) .. " " .. tostring(d.gradient_as_bucket_view))
out("unused", d.unused_parameter_size)
out("times", d.avg_backward_compute_time .. " " .. d.avg_backward_comm_time .. " " ..
    d.avg_backward_compute_comm_overlap_time)
out("names", d.module_name .. " " .. d.backend_name)
out("can_set", tostring(d.can_set_static_graph))
local plain = DDP(mlp())
try("set_early", function() plain:_set_static_graph() end)
out("plain_static", tostring(plain:_get_ddp_logging_data().static_graph))
local late = DDP(mlp())
mse(late(shard(xs[1])), shard(ys[1])):backward()
try("set_late", function() late:_set_static_graph() end)
try("typo", function() DDP(mlp(), {static_graf = true}) end)
]]
    local ranks = run(code)
    check_trained(ranks)
    for i = 1, 2 do
      local o = ranks[i].out
      assert.equal("0", o.before_iteration)
      assert.equal("false", o.before_rebuilt)
      -- rebuilt before the third forward, as PyTorch for static_graph (Note [static graph])
      assert.equal("false false true true", o.rebuilt_at)
      assert.equal("1 1 1 1 1 1", o.hook_counts)
      assert.equal("true", o.static)
      assert.equal("2 " .. (i - 1), o.world_rank)
      assert.equal("4", o.iteration)
      assert.equal("true", o.rebuilt)
      local total = (6 * 16 + 16 + 16 * 12 + 12 + 12 * 4 + 4) * 4
      assert.equal(tostring(total), o.total)
      assert.equal(tostring(total), o.bucket_sum)
      assert.equal(tostring(total), o.rebuilt_sum)
      assert.equal(tostring(math.floor(0.001 * 1024 * 1024 + 0.5)), o.cap)
      assert.equal("false false", o.flags)
      assert.equal("0", o.unused)
      local compute, comm, overlap = o.times:match("^(%d+) (%d+) (%d+)$")
      assert.is_true(tonumber(compute) > 0 and tonumber(comm) > 0, o.times)
      assert.is_true(tonumber(overlap) <= tonumber(compute), o.times)
      assert.equal("Sequential gloo", o.names)
      assert.equal("true", o.can_set)
      assert.matches("static_graph must be set before the first backward", ranks[i].err.set_late, 1, true)
      assert.equal("no error", ranks[i].err.set_early)
      assert.equal("true", o.plain_static)
      assert.matches("unknown option 'static_graf' (did you mean 'static_graph'?", ranks[i].err.typo, 1, true)
    end
  end)

  it("a parameter whose hook fires twice (used inside and outside a reentrant checkpoint)", function()
    local code = [[
local Net = CheckpointNet
local xs, ys = batches(4, 8, {6}, 4)
local fwd = function(m, x) return m(x) end
-- without static_graph the second firing is an error, as in PyTorch
local plain = DDP(Net())
try("plain", function() mse(plain(shard(xs[1])), shard(ys[1])):backward() end)
plain:destroy()
local model = train(DDP(Net(), {static_graph = true}), xs, ys, true, fwd)
local counts = {}
for i = 0, #model.params - 1 do
  counts[#counts + 1] = model.param_names[i + 1] .. "=" .. lib.C.ddp_reducer_static_hook_count(model.reducer, i)
end
out("hook_counts", table.concat(counts, " "))
out("rebuilt", tostring(model:has_rebuilt_buckets()))
out("params", params_text(model.module))
if RANK == 0 then out("max_rel", max_rel(model.module, train(Net(), xs, ys, false, fwd))) end
model:verify_sync()
]]
    local ranks = run(code)
    check_trained(ranks)
    for i = 1, 2 do
      assert.matches("marked ready twice", ranks[i].err.plain, 1, true)
      assert.equal("a.weight=1 a.bias=1 b.weight=2 b.bias=2 head.weight=1 head.bias=1", ranks[i].out.hook_counts)
      assert.equal("true", ranks[i].out.rebuilt)
    end
  end)

  it("unused parameters are skipped without a search; a changed graph raises PyTorch's error", function()
    local code = [[
local Net = BranchNet
local xs, ys = batches(3, 8, {6}, 4)
-- the branch is never used: static_graph learns it in the first iteration
local fwd = function(m, x) return m(x, false) end
local model = train(DDP(Net(), {static_graph = true}), xs, ys, true, fwd)
out("branch_grad", tostring(model.module.branch.weight.grad))
out("params", params_text(model.module))
if RANK == 0 then out("max_rel", max_rel(model.module, train(Net(), xs, ys, false, fwd))) end
local d = model:_get_ddp_logging_data()
out("unused", d.unused_parameter_size)
out("rebuilt", tostring(d.has_rebuilt_buckets))
-- now the branch is used on every rank: the graph changed
try("now_used", function() mse(model(shard(xs[1]), true), shard(ys[1])):backward() end)
model:destroy()
-- a parameter used in the first iteration and not later
local m2 = DDP(Net(), {static_graph = true})
mse(m2(shard(xs[1]), false), shard(ys[1])):backward()
try("now_unused", function() mse(m2(shard(xs[2]), false, false), shard(ys[2])):backward() end)
m2:destroy()
-- find_unused_parameters without static_graph: can_set_static_graph says whether the unused
-- set stayed the same (PyTorch's ddp_graph_static_)
local dyn = DDP(Net(), {find_unused_parameters = true})
local flags = {}
for s = 1, 3 do
  mse(dyn(shard(xs[s]), false), shard(ys[s])):backward()
  flags[#flags + 1] = tostring(dyn:_get_ddp_logging_data().can_set_static_graph)
end
out("dyn_unused", dyn:_get_ddp_logging_data().unused_parameter_size)
mse(dyn(shard(xs[1]), true), shard(ys[1])):backward()
flags[#flags + 1] = tostring(dyn:_get_ddp_logging_data().can_set_static_graph)
out("can_set", table.concat(flags, " "))
out("dyn_unused_after", dyn:_get_ddp_logging_data().unused_parameter_size)
]]
    local ranks = run(code)
    check_trained(ranks)
    for i = 1, 2 do
      local o, e = ranks[i].out, ranks[i].err
      assert.equal("nil", o.branch_grad)
      assert.equal(tostring((8 * 4 + 4) * 4), o.unused)
      assert.equal("true", o.rebuilt)
      local changed = "Your training graph has changed in this iteration, e.g., one parameter is unused " ..
                      "in first iteration, but then got used in the second iteration. this is not " ..
                      "compatible with static_graph set to True."
      assert.matches(changed, e.now_used, 1, true)
      assert.matches("fired more often than the 0 time(s) of the first iteration on rank " .. (i - 1), e.now_used, 1, true)
      assert.matches(changed, e.now_unused, 1, true)
      -- head.weight and head.bias (indices 4 and 5) fired 0 of 1 times
      assert.matches("on rank " .. (i - 1) .. " (fired of expected): 4 (0 of 1), 5 (0 of 1)", e.now_unused, 1, true)
      assert.equal("true true true false", o.can_set)
      assert.equal(tostring((8 * 4 + 4) * 4), o.dyn_unused)
      assert.equal("0", o.dyn_unused_after)
    end
  end)

  -- Device buckets on the simulated device (build/libddplua_cuda_sim.so) with the simulated
  -- NCCL: the used flags of the first iteration go through the group's device.
  it("device parameters (simulated device, nccl): a reentrant checkpoint and an unused branch", function()
    local code = [[
local function Net() return CheckpointNet(true) end
local xs, ys = batches(4, 8, {6}, 4)
local model = DDP(module_to(Net(), RANK), {device_ids = {RANK}, static_graph = true, bucket_cap_mb = 0.0005})
local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
for s = 1, #xs do
  opt:zero_grad()
  mse(model(shard(xs[s])), to_dev(shard(ys[s]):contiguous(), RANK)):backward()
  opt:step()
end
out("device", model.module.b.weight.device)
out("unused_grad", tostring(model.module.unused.weight.grad))
out("rebuilt", tostring(model:has_rebuilt_buckets()))
out("backend", dist.get_backend())
local ref = train(Net(), xs, ys, false, function(m, x) return m(x) end)
local worst = 0
local p1, p2 = model.module:parameters(), ref:parameters()
for i = 1, #p1 do
  local d = (to_dev(p1[i], -1) - p2[i]):abs():max():item()
  worst = math.max(worst, d / math.max(p2[i]:abs():max():item(), 1e-12))
end
out("max_rel", worst)
]]
    local ranks = run(code, 2, { init = '{backend = "nccl", device_id = tonumber(os.getenv("RANK")), timeout = 20}',
      env = { DDPLUA_CUDA_PLUGIN = root .. "/build/libddplua_cuda_sim.so", DDPLUA_SIM_NCCL = "1" } })
    for i = 1, 2 do
      local o = ranks[i].out
      assert.equal("cuda:" .. (i - 1), o.device)
      assert.equal("nil", o.unused_grad)
      assert.equal("true", o.rebuilt)
      assert.equal("nccl", o.backend)
      assert.is_true(tonumber(o.max_rel) <= 1e-5, "max relative difference " .. tostring(o.max_rel))
    end
  end)
end)
