-- Specs for activation checkpointing under DistributedDataParallel (dl.utils.checkpoint,
-- Note [checkpoint node] in lua/ddplua/nn/checkpoint.lua) with 2 real ranks on 127.0.0.1:
-- PyTorch's non-reentrant semantics, so a parameter used inside and outside a checkpointed
-- segment is marked ready once (no "marked ready twice", with or without
-- find_unused_parameters and static_graph; the reentrant checkpoint of
-- spec/distributed/ddp_static_graph_spec.lua needs static_graph for that).
--
-- Each run is checked against one process trained on the whole batches from the same seed
-- (rank 0 computes it and prints the largest relative difference of the first step's
-- gradients and of the trained parameters), and the replicas against each other.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  helpers = { "batches", "shard", "mse", "max_rel", "params_text" },
} .. [[
local lib = require "ddplua.lib"
-- a -> tanh -> checkpoint(b -> tanh -> c) -> head, with b used again outside the
-- checkpoint; Net(true) also has a layer `unused` that forward never uses.
Net = nn.Module:extend("Net")
function Net:init(with_unused)
  dl.manual_seed(3)
  self.a = nn.Linear(6, 8)
  self.b = nn.Linear(8, 8)
  self.c = nn.Linear(8, 8)
  if with_unused then self.unused = nn.Linear(8, 8) end
  self.head = nn.Linear(8, 4)
end
function Net:forward(x)
  local h = dl.tanh(self.a(x))
  local seg = function(t, scale) return self.c(dl.tanh(self.b(t))) * scale end
  local k = dl.utils.checkpoint(seg, h, 0.5)
  return self.head(k + dl.tanh(self.b(h)))
end
-- The largest relative difference between two lists of gradients.
function grads_rel(g1, g2)
  local worst = 0
  for i = 1, #g2 do
    local d = (g1[i] - g2[i]):abs():max():item()
    worst = math.max(worst, d / math.max(g2[i]:abs():max():item(), 1e-12))
  end
  return worst
end
local function grads(m)
  local out = {}
  for i, p in ipairs(m:parameters()) do out[i] = p.grad and p.grad:clone() or dl.zeros(p.shape) end
  return out
end
-- k SGD-momentum steps; returns the model and its gradients after the first backward.
function train(m, xs, ys, is_ddp)
  local opt = optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
  local first
  for s = 1, #xs do
    opt:zero_grad()
    local x, y = xs[s], ys[s]
    if is_ddp then x, y = shard(x), shard(y) end
    mse(m(x), y):backward()
    first = first or grads(is_ddp and m.module or m)
    opt:step()
  end
  return m, first
end
-- Train DDP(Net(with_unused), opts) and compare it with one process (rank 0 prints).
function check(with_unused, opts)
  local xs, ys = batches(4, 8, {6}, 4)
  local model, g_ddp = train(DDP(Net(with_unused), opts), xs, ys, true)
  out("params", params_text(model.module))
  if RANK == 0 then
    local ref, g_ref = train(Net(with_unused), xs, ys, false)
    out("grads_rel", grads_rel(g_ddp, g_ref))
    out("max_rel", max_rel(model.module, ref))
  end
  local counts = {}
  if opts.static_graph then
    for i = 0, #model.params - 1 do
      counts[#counts + 1] = model.param_names[i + 1] .. "=" .. lib.C.ddp_reducer_static_hook_count(model.reducer, i)
    end
  end
  out("hook_counts", table.concat(counts, " "))
  out("unused_grad", with_unused and tostring(model.module.unused.weight.grad) or "n/a")
  model:verify_sync()
  model:destroy()
end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

local function check_trained(ranks)
  local o = ranks[1].out
  assert.is_not_nil(o.max_rel, "rank 0 printed no max_rel")
  assert.is_true(tonumber(o.grads_rel) <= 1e-5, "first gradients' relative difference " .. o.grads_rel)
  assert.is_true(tonumber(o.max_rel) <= 1e-5, "parameters' relative difference " .. o.max_rel)
  assert.is_not_nil(o.params)
  assert.equal(o.params, ranks[2].out.params)
end

describe("dl.utils.checkpoint under DistributedDataParallel #dist", function()
  it("a parameter used inside and outside the segment, without flags: as one process", function()
    local ranks = run([[try("train", function() check(false, {}) end)]])
    for i = 1, 2 do assert.equal("no error", ranks[i].err.train) end
    check_trained(ranks)
  end)

  it("with find_unused_parameters = true: as one process, the unused layer untouched", function()
    local ranks = run([[try("train", function() check(true, {find_unused_parameters = true}) end)]])
    for i = 1, 2 do
      assert.equal("no error", ranks[i].err.train)
      assert.equal("nil", ranks[i].out.unused_grad)
    end
    check_trained(ranks)
  end)

  it("with static_graph = true: every hook fires once per backward, as one process", function()
    local ranks = run([[try("train", function() check(true, {static_graph = true}) end)]])
    for i = 1, 2 do
      assert.equal("no error", ranks[i].err.train)
      -- b is used inside and outside the segment: once, where PyTorch's reentrant
      -- checkpoint counts 2 (spec/distributed/ddp_static_graph_spec.lua)
      assert.equal("a.weight=1 a.bias=1 b.weight=1 b.bias=1 c.weight=1 c.bias=1 "
        .. "unused.weight=0 unused.bias=0 head.weight=1 head.bias=1", ranks[i].out.hook_counts)
    end
    check_trained(ranks)
  end)
end)
