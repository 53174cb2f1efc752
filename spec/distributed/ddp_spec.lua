-- Specs for DistributedDataParallel (lua/ddplua/distributed/ddp.lua over the reducer,
-- ddplua/reducer.h) with real ranks on 127.0.0.1 (spec/helpers/multiproc.lua).
--
-- Equivalence: k = 3 SGD-with-momentum steps on W ranks, each with its own B/W slice of the
-- batch, must equal k steps of one process with the whole batch B (the loss is a mean, and
-- DDP averages the gradients). Rank 0 trains the single-process reference itself, from the
-- same seed, and prints the largest relative difference per tensor (max |a - b| / max |b|);
-- every rank prints a digest of its parameters so the spec checks the replicas agree.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  helpers = { "mlp", "cnn", "batches", "shard", "mse", "max_rel", "params_text", "branch_net" },
} .. [[
-- k steps of one process on the whole batches (rank 0's reference).
function reference(make, xs, ys, opt_args, forward)
  local m = make()
  local opt = optim.SGD(m:parameters(), opt_args)
  for s = 1, #xs do
    opt:zero_grad()
    local loss = forward and forward(m, xs[s], s) or mse(m(xs[s]), ys[s])
    loss:backward()
    opt:step()
  end
  return m
end
]]

-- run(code, n, opts): code after the prelude on n ranks; returns per-rank {out = {name =
-- value}, err = {name = msg}} and the raw result (spec/helpers/ddp_ranks.lua).
local run = ddp_ranks.runner(PRELUDE, { timeout = 40 })

-- The equivalence body: train DDP(make()) for k steps on the rank's shards, compare with the
-- reference on rank 0, print the replicas' parameters.
local function equivalence(make, xshape, ydim, B, ddp_opts, extra)
  return ([[
local xs, ys = batches(3, %d, %s, %d)
local opt_args = {lr = 0.1, momentum = 0.9}
local model = DDP(%s(), %s)
local opt = optim.SGD(model:parameters(), opt_args)
for s = 1, #xs do
  opt:zero_grad()
  local x, y = shard(xs[s], WORLD, RANK), shard(ys[s], WORLD, RANK)
  %s
  opt:step()
end
out("buckets", #model:buckets())
out("rebuilt", tostring(model:has_rebuilt_buckets()))
out("params", params_text(model.module))
model:verify_sync()
if RANK == 0 then out("max_rel", max_rel(model.module, reference(%s, xs, ys, opt_args))) end
]]):format(B, xshape, ydim, make, ddp_opts, extra or "mse(model(x), y):backward()", make)
end

local function check_equivalence(ranks, n, tol)
  local rel = tonumber(ranks[1].out.max_rel)
  assert.is_not_nil(rel, "rank 0 printed no max_rel")
  assert.is_true(rel <= (tol or 1e-5), "max relative difference " .. tostring(rel))
  for i = 2, n do
    assert.equal(ranks[1].out.params, ranks[i].out.params)
  end
end

describe("ddplua.distributed.ddp #dist", function()
  it("2 ranks with B/2 each equal one process with B (MLP, SGD momentum)", function()
    local ranks = run(equivalence("mlp", "{6}", 4, 8, "{}"), 2)
    check_equivalence(ranks, 2)
    assert.equal("1", ranks[1].out.buckets)
    assert.equal("true", ranks[1].out.rebuilt)
  end)

  it("a small CNN with many small buckets (bucket_cap_mb) is equivalent too", function()
    local ranks = run(equivalence("cnn", "{2, 8, 8}", 3, 8, "{bucket_cap_mb = 0.0002}"), 2)
    check_equivalence(ranks, 2)
    assert.is_true(tonumber(ranks[1].out.buckets) >= 4, "buckets: " .. ranks[1].out.buckets)
    assert.equal(ranks[1].out.buckets, ranks[2].out.buckets)
  end)

  it("rebuilds identical buckets on every rank from rank 0's ready order", function()
    -- Two parallel branches used in a rank-dependent order: the ranks see their gradients
    -- arrive in different orders, yet must end with the same buckets (rank 0's order).
    local code = [[
local lib = require "ddplua.lib"
local Net = nn.Module:extend("Net")
function Net:init()
  dl.manual_seed(7)
  self.a = nn.Linear(6, 4)
  self.b = nn.Linear(6, 4)
end
function Net:forward(x)
  if RANK == 0 then local ya = self.a(x); return ya + self.b(x) end
  local yb = self.b(x); return self.a(x) + yb
end
local model = DDP(Net(), {bucket_cap_mb = 0.00001})
local x, y = dl.randn({2, 6}), dl.randn({2, 4})
local function order_text()
  local buf = lib.ffi.new("int[8]")
  local n = lib.C.ddp_reducer_ready_order(model.reducer, buf, 8)
  local t = {}
  for i = 1, n do t[i] = model.param_names[buf[i - 1] + 1] end
  return table.concat(t, " ")
end
local function buckets_text()
  local t = {}
  for k, b in ipairs(model:buckets()) do t[k] = table.concat(b, "+") end
  return table.concat(t, " | ")
end
out("initial", buckets_text())
mse(model(x), y):backward()
out("order", order_text())
mse(model(x), y):backward()
out("rebuilt", buckets_text())
model:verify_sync()
]]
    local ranks = run(code, 2)
    -- reverse registration order at first
    assert.equal("b.bias | b.weight | a.bias | a.weight", ranks[1].out.initial)
    assert.are_not.equal(ranks[1].out.order, ranks[2].out.order)
    assert.equal(ranks[1].out.rebuilt, ranks[2].out.rebuilt)
    assert.equal(ranks[1].out.order:gsub(" ", " | "), ranks[1].out.rebuilt)
  end)

  it("gradient_as_bucket_view is equivalent", function()
    local ranks = run(equivalence("mlp", "{6}", 4, 8, "{gradient_as_bucket_view = true, bucket_cap_mb = 0.0005}"), 2)
    check_equivalence(ranks, 2)
  end)

  it("no_sync: two accumulated micro-batches then a synced one equal the big batch", function()
    -- each rank: B/2 = 4 samples, two micro-batches of 2; loss halves so the sum is the mean
    local body = [[
local x1, y1 = x:narrow(1, 1, 2), y:narrow(1, 1, 2)
local x2, y2 = x:narrow(1, 3, 2), y:narrow(1, 3, 2)
model:no_sync(function() local l1 = mse(model(x1), y1) * 0.5; l1:backward() end)
local l2 = mse(model(x2), y2) * 0.5
l2:backward()
]]
    local ranks = run(equivalence("mlp", "{6}", 4, 8, "{}", body), 2)
    check_equivalence(ranks, 2)
  end)

  it("find_unused_parameters: a branch unused on some iterations", function()
    local code = [[
local Net = BranchNet
local xs, ys = batches(3, 8, {6}, 4)
local use = {true, false, true}
local opt_args = {lr = 0.1, momentum = 0.9}
local model = DDP(Net(), {find_unused_parameters = true})
local opt = optim.SGD(model:parameters(), opt_args)
for s = 1, 3 do
  opt:zero_grad()
  local x, y = shard(xs[s], WORLD, RANK), shard(ys[s], WORLD, RANK)
  mse(model(x, use[s]), y):backward()
  if s == 2 then out("branch_grad_nil", tostring(model.module.branch.weight.grad == nil)) end
  opt:step()
end
out("params", params_text(model.module))
if RANK == 0 then
  out("max_rel", max_rel(model.module, reference(Net, xs, ys, opt_args,
      function(m, x, s) return mse(m(x, use[s]), ys[s]) end)))
end
-- used on rank 1 only: rank 0 still gets the averaged gradient of the branch
opt:zero_grad()
local x, y = shard(xs[1], WORLD, RANK), shard(ys[1], WORLD, RANK)
mse(model(x, RANK == 1), y):backward()
local g = model.module.branch.weight.grad
out("partial_grad", g and string.format("%.9g", g:abs():sum():item()) or "nil")
]]
    local ranks = run(code, 2)
    check_equivalence(ranks, 2)
    assert.equal("true", ranks[1].out.branch_grad_nil)
    assert.equal("true", ranks[2].out.branch_grad_nil)
    assert.are_not.equal("nil", ranks[1].out.partial_grad)
    assert.is_true(tonumber(ranks[1].out.partial_grad) > 0)
    assert.equal(ranks[1].out.partial_grad, ranks[2].out.partial_grad)
  end)

  it("an unused parameter without find_unused_parameters fails the next forward, named", function()
    local code = [[
local Net = nn.Module:extend("Net")
function Net:init() self.fc = nn.Linear(4, 4); self.unused = nn.Linear(4, 2) end
function Net:forward(x) return self.fc(x) end
local model = DDP(Net())
local x = dl.randn({2, 4})
model(x):sum():backward()
try("second_forward", function() model(x) end)
]]
    local ranks = run(code, 2)
    for i = 1, 2 do
      local e = ranks[i].err.second_forward
      assert.matches("Expected to have finished reduction in the prior iteration", e, 1, true)
      assert.matches("Parameter indices which did not receive grad for rank " .. (i - 1) .. ": 2 3", e, 1, true)
      assert.matches("Parameters which did not receive grad for rank " .. (i - 1) ..
                     ": unused.weight, unused.bias", e, 1, true)
    end
  end)

  it("a model that differs on one rank fails construction naming the parameter and ranks", function()
    local code = [[
local Net = nn.Module:extend("Net")
function Net:init() self.fc = nn.Linear(RANK == 1 and 6 or 5, 10); self.out = nn.Linear(10, 2) end
try("construct", function() DDP(Net()) end)
]]
    local ranks = run(code, 2)
    for i = 1, 2 do
      assert.matches("DistributedDataParallel: parameter 'fc.weight' has shape (10, 5) on rank 0 " ..
                     "but (10, 6) on rank 1", ranks[i].err.construct, 1, true)
    end
  end)

  it("a rank that dies before backward fails the peer's backward naming the bucket and ranks", function()
    local code = [[
local model = DDP(mlp(), {timeout = 10})
local x, y = dl.randn({2, 6}), dl.randn({2, 4})
if RANK == 1 then os.exit(0) end
try("backward", function() mse(model(x), y):backward() end)
]]
    local ranks = run(code, 2)
    local e = ranks[1].err.backward
    assert.matches("DistributedDataParallel: the all%-reduce of gradient bucket 0 %(%d+ parameters, %d+ bytes%) failed on rank 0", e)
    assert.matches("rank 1", e, 1, true)
  end)

  it("3 ranks: equivalence, then verify_sync passes and names a perturbed parameter", function()
    local code = equivalence("mlp", "{6}", 4, 12, "{bucket_cap_mb = 0.001}") .. [[
try("verify_ok", function() model:verify_sync() end)
if RANK == 2 then
  dl.no_grad(function() local w = model.module[3].weight; w:add_(1e-3) end)
end
try("verify_bad", function() model:verify_sync() end)
]]
    local ranks = run(code, 3)
    check_equivalence(ranks, 3)
    for i = 1, 3 do
      assert.equal("no error", ranks[i].err.verify_ok)
      assert.matches("verify_sync: parameter '2.weight' differs: ranks 0 and 2 hold different values",
                     ranks[i].err.verify_bad, 1, true)
    end
  end)
end)
