-- Specs for DTensor (lua/ddplua/distributed/tensor/): placements and uneven pieces,
-- redistribution both ways, the gradient convention of Note [DTensor gradients], and the
-- sharding rules of linear, embedding, layer norm, dropout and the vocabulary-parallel
-- cross entropy, each against one process computing on whole tensors (f64), on 2 ranks.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {} .. [[
dt = require "ddplua.distributed.tensor"
Shard, Replicate, Partial = dt.Shard, dt.Replicate, dt.Partial
mesh = dist.init_device_mesh("cpu", {WORLD}, {mesh_dim_names = {"tp"}})
F64 = {dtype = "f64"}
function diff(a, b) return (a - b):abs():max():item() end
-- the same tensor on every rank
function rnd(shape, seed) dl.manual_seed(seed); return dl.randn(shape, F64) end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

local function small(v, tol) return tonumber(v) ~= nil and tonumber(v) <= (tol or 1e-12) end

describe("ddplua.distributed.tensor (DTensor) #dist", function()
  it("cuts uneven pieces as torch.chunk and redistributes between every pair of placements", function()
    local ranks = run([[
local x = rnd({5, 3}, 7)
local s1 = dt.distribute_tensor(x, mesh, {Shard(1)})
out("local", table.concat(s1:to_local():size(), "x") .. " " .. table.concat(s1:size(), "x"))
out("repr", tostring(s1.placements[1]))
out("full", diff(s1:full_tensor(), x))
local s2 = s1:redistribute(mesh, {Shard(2)})
out("s2_local", table.concat(s2:to_local():size(), "x"))
out("s2_full", diff(s2:full_tensor(), x))
local p = s2:redistribute(mesh, {Partial()})
out("partial_sum", diff(p:redistribute(mesh, {Replicate()}):to_local(), x))
out("p_to_s", diff(p:redistribute(mesh, {Shard(1)}):full_tensor(), x))
local neg = dt.distribute_tensor(x, mesh, {Shard(-1)})
out("neg_dim", tostring(neg.placements[1]))
try("bad_placements", function() dt.distribute_tensor(x, mesh, {Shard(1), Shard(2)}) end)
try("bad_dim", function() dt.distribute_tensor(x, mesh, {Shard(3)}) end)
try("no_rule", function() return s1:cumsum(1) end)
try("from_local", function() dt.DTensor.from_local(dl.zeros({3, 3}), mesh, {Shard(1)}, {shape = {5, 3}}) end)
]], 2)
    for r = 1, 2 do
      local o, e = ranks[r].out, ranks[r].err
      assert.are.equal((r == 1 and "3x3" or "2x3") .. " 5x3", o["local"])
      assert.are.equal("Shard(dim=1)", o.repr)
      assert.are.equal((r == 1 and "5x2" or "5x1"), o.s2_local)
      for _, k in ipairs { "full", "s2_full", "partial_sum", "p_to_s" } do assert.is_true(small(o[k]), k .. " " .. o[k]) end
      assert.are.equal("Shard(dim=2)", o.neg_dim)
      assert.matches("placements must be a list of 1 placements %(one per mesh dimension%), got 2 entries", e.bad_placements)
      assert.matches("Shard%(dim=3%) is outside the 2 dimensions of the tensor", e.bad_dim)
      assert.matches("DTensor: op 'cumsum' has no sharding rule %(placements %(Shard%(dim=1%),%)%)", e.no_rule)
      if r == 2 then
        assert.matches("the local tensor has shape %(3, 3%) but placements %(Shard%(dim=1%),%) of shape %(5, 3%) give this rank %(2, 3%)", e.from_local)
      end
    end
  end)

  it("a column- then row-parallel MLP equals one process, values and gradients (Note [DTensor gradients])", function()
    local ranks = run([[
local x, w1, b1, w2, b2 = rnd({4, 6}, 1), rnd({10, 6}, 2), rnd({10}, 3), rnd({5, 10}, 4), rnd({5}, 5)
local c = rnd({4, 5}, 6)
-- one process, whole tensors
local function leaves(...) local t = {} for i, v in ipairs({...}) do t[i] = v:clone():requires_grad_() end return unpack(t) end
local X, W1, B1, W2, B2 = leaves(x, w1, b1, w2, b2)
local ref = (dl.linear(dl.linear(X, W1, B1):tanh(), W2, B2) * c):sum()
ref:backward()
-- tensor parallel: w1, b1 by rows (column parallel), w2 by columns (row parallel)
local lx, lw1, lb1, lw2, lb2 = leaves(x, w1, b1, w2, b2)
local d1 = dt.distribute_tensor(lw1, mesh, {Shard(1)})
local db1 = dt.distribute_tensor(lb1, mesh, {Shard(1)})
local d2 = dt.distribute_tensor(lw2, mesh, {Shard(2)})
local dx = dt.DTensor.from_local(lx, mesh, {Replicate()})
local h = dt.ops.linear(dx, d1, db1):tanh()
out("h", tostring(h.placements[1]))
local y = dt.ops.linear(h, d2, lb2)
out("y", tostring(y.placements[1]))
local loss = (y:full_tensor() * c):sum()
out("loss", diff(loss, ref))
loss:backward()
out("gx", diff(lx.grad, X.grad))
out("gw1", diff(lw1.grad, W1.grad))
out("gb1", diff(lb1.grad, B1.grad))
out("gw2", diff(lw2.grad, W2.grad))
out("gb2", diff(lb2.grad, B2.grad))
-- batch-sharded input against replicated weights: the weight gradient is all-reduced
local lx2, lw = leaves(x, w1)
local ys = dt.ops.linear(dt.distribute_tensor(lx2, mesh, {Shard(1)}), dt.DTensor.from_local(lw, mesh, {Replicate()}))
out("ys", tostring(ys.placements[1]))
local X2, W = leaves(x, w1)
;(dl.linear(X2, W) * 2):sum():backward()
;(ys:full_tensor() * 2):sum():backward()
out("gw_batch", diff(lw.grad, W.grad))
out("gx_batch", diff(lx2.grad, X2.grad))
]], 2)
    for r = 1, 2 do
      local o = ranks[r].out
      assert.are.equal("Shard(dim=2)", o.h)
      assert.are.equal("Partial(sum)", o.y)
      assert.are.equal("Shard(dim=1)", o.ys)
      for _, k in ipairs { "loss", "gx", "gw1", "gb1", "gw2", "gb2", "gw_batch", "gx_batch" } do
        assert.is_true(small(o[k], 1e-10), ("rank %d %s: %s"):format(r - 1, k, tostring(o[k])))
      end
    end
  end)

  it("vocabulary-parallel embedding and cross entropy, layer norm and dropout equal one process", function()
    local ranks = run([[
local V, D, N = 7, 4, 6
local w, logits = rnd({V, D}, 11), rnd({N, V}, 12)
local ids = dl.tensor({0, 6, 3, 4, 1, 6}, {dtype = "i64"})
local target = dl.tensor({2, 6, -100, 0, 5, 3}, {dtype = "i64"})
local function leaf(t) return t:clone():requires_grad_() end
-- embedding, weight cut by rows
local W, lw = leaf(w), leaf(w)
local ref = (dl.embedding(ids, W) * dl.arange(1, D + 1, F64)):sum()
ref:backward()
local e = dt.ops.embedding(ids, dt.distribute_tensor(lw, mesh, {Shard(1)}))
out("emb_p", tostring(e.placements[1]))
local got = (e:full_tensor() * dl.arange(1, D + 1, F64)):sum()
got:backward()
out("emb", diff(got, ref))
out("emb_grad", diff(lw.grad, W.grad))
-- cross entropy over logits cut along the classes
local L, ll = leaf(logits), leaf(logits)
local ref_ce = dl.cross_entropy(L, target)
ref_ce:backward()
local ce = dt.ops.cross_entropy(dt.distribute_tensor(ll, mesh, {Shard(2)}), target)
out("ce", diff(ce:to_local(), ref_ce))
ce:to_local():backward()
out("ce_grad", diff(ll.grad, L.grad))
-- layer norm of a row-sharded input
local x, g, b = rnd({N, D}, 13), rnd({D}, 14), rnd({D}, 15)
local X, G, Bb, lx, lg, lb = leaf(x), leaf(g), leaf(b), leaf(x), leaf(g), leaf(b)
local ref_ln = (dl.layer_norm(X, {D}, {weight = G, bias = Bb}) * x):sum()
ref_ln:backward()
local ln = dt.ops.layer_norm(dt.distribute_tensor(lx, mesh, {Shard(1)}), {D}, {weight = lg, bias = lb})
local got_ln = (ln:full_tensor() * x):sum()
got_ln:backward()
out("ln", diff(got_ln, ref_ln))
out("ln_grads", math.max(diff(lx.grad, X.grad), diff(lg.grad, G.grad), diff(lb.grad, Bb.grad)))
-- dropout: the whole tensor's mask from the same generator state
dl.manual_seed(99)
local ref_do = dl.dropout(x, 0.5)
dl.manual_seed(99)
local got_do = dt.ops.dropout(dt.distribute_tensor(x, mesh, {Shard(2)}), 0.5):full_tensor()
out("dropout", diff(got_do, ref_do))
]], 2)
    for r = 1, 2 do
      local o = ranks[r].out
      assert.are.equal("Partial(sum)", o.emb_p)
      for _, k in ipairs { "emb", "emb_grad", "ce", "ce_grad", "ln", "ln_grads", "dropout" } do
        assert.is_true(small(o[k], 1e-10), ("rank %d %s: %s"):format(r - 1, k, tostring(o[k])))
      end
    end
  end)
end)
