-- Specs for fully_shard (lua/ddplua/distributed/fsdp/) with real ranks on 127.0.0.1
-- (spec/helpers/multiproc.lua through ddp_ranks).
--
-- Reference: every rank also trains the unwrapped model on the WHOLE batch in-process (one
-- process's training), while the FSDP model sees this rank's rows of it; after the steps
-- the full state dict (all-gathered) must equal the reference's state dict: the largest
-- |a - b| over every entry is printed and asserted (f64 <= 1e-10, f32 <= 1e-5).
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  init = '{backend = "gloo", timeout = 30}',
} .. [[
fsdp = dist.fsdp
GPT = require "models.gpt"
-- 6-15-1-4 (f64 by default): 15 rows (odd: padded on 2 ranks) and a (1, 15) weight and (1)
-- bias: fewer rows than ranks (rank 1 holds (0, 15) and (0) shards).
function mlp(dtype)
  dl.manual_seed(1)
  local o = {dtype = dtype or "f64"}
  return nn.Sequential(nn.Linear(6, 15, o), nn.Tanh(), nn.Linear(15, 1, o), nn.Tanh(), nn.Linear(1, 4, o))
end
function gpt(dtype)
  dl.manual_seed(3)
  return GPT{block_size = 8, vocab_size = 13, n_layer = 2, n_head = 2, n_embd = 8, dtype = dtype or "f64"}
end
-- fully_shard each transformer block, then the root.
function shard_gpt(m, opts)
  for _, b in ipairs(m.transformer.h:list()) do fsdp.fully_shard(b, opts) end
  return fsdp.fully_shard(m, opts)
end
-- This rank's rows of a batch tensor (first dimension split in WORLD equal parts).
function mine(t)
  local n = t:size(1) / WORLD
  return t:narrow(1, RANK * n + 1, n)
end
-- The largest |a - b| between the full state dict of an FSDP model and a reference's;
-- -1 when their key sets differ. strip: a pattern removed from the FSDP model's keys.
function worst_vs(model, ref, strip)
  local full = fsdp.get_model_state_dict(model, {full_state_dict = true})
  local rsd, worst, n, nr = ref:state_dict(), 0, 0, 0
  for _ in pairs(rsd) do nr = nr + 1 end
  for k, v in pairs(full) do
    n = n + 1
    local r = rsd[strip and k:gsub(strip, "") or k]
    if r == nil then return -1 end
    worst = math.max(worst, (v - r):abs():max():item())
  end
  return n == nr and worst or -1
end
function mse(a, b) return (a - b):pow(2):mean() end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

local function num(ranks, i, name)
  local v = tonumber(ranks[i].out[name])
  assert(v ~= nil, ("rank %d printed no %s"):format(i - 1, name))
  return v
end

local function assert_within(ranks, names, tol)
  for i = 1, #ranks do
    for _, name in ipairs(names) do
      local d = num(ranks, i, name)
      assert.is_true(d >= 0 and d <= tol, ("rank %d: %s = %s (tolerance %g)"):format(i - 1, name, tostring(d), tol))
    end
  end
end

describe("ddplua.distributed.fsdp", function()
  it("#dist an MLP with odd rows and fewer rows than ranks, 5 steps of AdamW and of SGD on 2 ranks, equals one process (f64)", function()
    local ranks = run([[
for _, kind in ipairs{"adamw", "sgd"} do
  local ref, m = mlp(), mlp()
  for i = 1, 5, 2 do fsdp.fully_shard(m[i]) end
  fsdp.fully_shard(m)
  out(kind .. "_class", m:_get_name() .. "," .. m[1]:_get_name())
  local make = kind == "adamw" and function(ps) return optim.AdamW(ps, {lr = 0.01}) end
    or function(ps) return optim.SGD(ps, {lr = 0.1, momentum = 0.9}) end
  local o1, o2 = make(ref:parameters()), make(m:parameters())
  dl.manual_seed(100)
  for s = 1, 5 do
    local x, y = dl.randn({8, 6}, {dtype = "f64"}), dl.randn({8, 4}, {dtype = "f64"})
    o1:zero_grad(); mse(ref(x), y):backward(); o1:step()
    o2:zero_grad(); mse(m(mine(x)), mine(y)):backward(); o2:step()
  end
  out(kind, worst_vs(m, ref))
end
-- the registered parameters are the shards: rows 0..7 / 8..14 of the (15, 6) weight, the
-- (1, 15) weight on rank 0 only
local m = mlp()
fsdp.fully_shard(m)
out("shard_rows", m[1].weight:size(1) .. "," .. m[3].weight:size(1) .. "," .. m[3].bias:size(1))
local sh = fsdp.get_sharded_state_dict(m)
out("offsets", sh["0.weight"].offsets[1] .. "," .. table.concat(sh["0.weight"].global_shape, "x"))
out("params_are_shards", m:parameters()[1] == m[1].weight)
-- a whole state dict loads into the shards (each rank its rows) and gathers back the same
local src = mlp()
dl.no_grad(function() for _, p in ipairs(src:parameters()) do p:mul_(3) end end)
fsdp.set_model_state_dict(m, src:state_dict())
out("loaded", worst_vs(m, src))
local r0 = fsdp.get_model_state_dict(m, {full_state_dict = true, rank0_only = true})
out("rank0_only_keys", #nn.state_dict_keys(r0))
try("missing", function() fsdp.set_model_state_dict(m, {}) end)
]], 2)
    assert_within(ranks, { "adamw", "sgd" }, 1e-10)
    assert.equal("FSDPSequential,FSDPLinear", ranks[1].out.adamw_class)
    assert.equal("8,1,1", ranks[1].out.shard_rows)
    assert.equal("7,0,0", ranks[2].out.shard_rows)
    assert.equal("0,15x6", ranks[1].out.offsets)
    assert.equal("8,15x6", ranks[2].out.offsets)
    assert.equal("true", ranks[1].out.params_are_shards)
    assert.equal(0, num(ranks, 1, "loaded"))
    assert.equal(0, num(ranks, 2, "loaded"))
    assert.equal("6", ranks[1].out.rank0_only_keys)
    assert.equal("0", ranks[2].out.rank0_only_keys)
    assert.truthy(ranks[1].err.missing:find("set_model_state_dict: missing key '0.weight'", 1, true))
  end)

  it("#dist the GPT wrapped per block and at the root: AdamW with reshard_after_forward true and false, gradient accumulation without sync, equals one process (f64); SGD in f32", function()
    local ranks = run([[
for _, mode in ipairs{"reshard", "keep", "accumulate"} do
  local ref, m = gpt(), shard_gpt(gpt(), {reshard_after_forward = mode ~= "keep"})
  local o1 = optim.AdamW(ref:parameters(), {lr = 0.01})
  local o2 = optim.AdamW(m:parameters(), {lr = 0.01})
  dl.manual_seed(100)
  for s = 1, 5 do
    local x, y = dl.randint(0, 13, {4, 8}), dl.randint(0, 13, {4, 8})
    o1:zero_grad(); local _, l1 = ref(x, y); l1:backward(); o1:step()
    o2:zero_grad()
    local xm, ym = mine(x), mine(y)
    if mode == "accumulate" then -- two micro-batches, one reduce-scatter
      m:set_requires_gradient_sync(false)
      local _, la = m(xm:narrow(1, 1, 1), ym:narrow(1, 1, 1)); (la * 0.5):backward()
      m:set_requires_gradient_sync(true)
      local _, lb = m(xm:narrow(1, 2, 1), ym:narrow(1, 2, 1)); (lb * 0.5):backward()
    else
      local _, l2 = m(xm, ym); l2:backward()
    end
    o2:step()
  end
  out(mode, worst_vs(m, ref))
end
local ref, m = gpt("f32"), shard_gpt(gpt("f32"))
local o1, o2 = optim.SGD(ref:parameters(), {lr = 0.1}), optim.SGD(m:parameters(), {lr = 0.1})
dl.manual_seed(100)
for s = 1, 5 do
  local x, y = dl.randint(0, 13, {4, 8}), dl.randint(0, 13, {4, 8})
  o1:zero_grad(); local _, l1 = ref(x, y); l1:backward(); o1:step()
  o2:zero_grad(); local _, l2 = m(mine(x), mine(y)); l2:backward(); o2:step()
end
out("sgd_f32", worst_vs(m, ref))
]], 2)
    assert_within(ranks, { "reshard", "keep", "accumulate" }, 1e-10)
    assert_within(ranks, { "sgd_f32" }, 1e-5)
  end)

  it("#dist works with activation checkpointing: checkpoint() around an FSDP module and CheckpointWrapper inside one (f64)", function()
    local ranks = run([[
Net = nn.Module:extend("Net")
function Net:init(ck)
  local o = {dtype = "f64"}
  self.l1, self.l2, self.l3 = nn.Linear(6, 9, o), nn.Linear(9, 7, o), nn.Linear(7, 3, o)
  self.ck = ck
end
function Net:forward(x)
  local function f(m, v) if self.ck then return dl.utils.checkpoint(m, v) end return m(v) end
  return self.l3(dl.tanh(f(self.l2, dl.tanh(f(self.l1, x)))))
end
for _, mode in ipairs{"around", "inside"} do
  dl.manual_seed(1); local ref = Net(false)
  dl.manual_seed(1); local m = Net(mode == "around")
  if mode == "inside" then m.l1, m.l2 = nn.CheckpointWrapper(m.l1), nn.CheckpointWrapper(m.l2) end
  fsdp.fully_shard(m.l1); fsdp.fully_shard(m.l2); fsdp.fully_shard(m)
  local o1 = optim.SGD(ref:parameters(), {lr = 0.1, momentum = 0.9})
  local o2 = optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
  dl.manual_seed(100)
  for s = 1, 5 do
    local x, y = dl.randn({8, 6}, {dtype = "f64"}), dl.randn({8, 3}, {dtype = "f64"})
    o1:zero_grad(); mse(ref(x), y):backward(); o1:step()
    o2:zero_grad(); mse(m(mine(x)), mine(y)):backward(); o2:step()
  end
  out(mode, worst_vs(m, ref, "_checkpoint_wrapped_module%."))
end
]], 2)
    assert_within(ranks, { "around", "inside" }, 1e-10)
  end)

  it("#dist takes a 1-D DeviceMesh, and names what is wrong: a non-module, a second call, a 2-D mesh, an original parameter used after sharding, an unsharded parameter kept past its reshard", function()
    local ranks = run([[
local mesh = dist.init_device_mesh("cpu", {WORLD}, {mesh_dim_names = {"dp"}})
local ref, m = mlp(), mlp()
fsdp.fully_shard(m[1], {mesh = mesh}); fsdp.fully_shard(m, {mesh = mesh})
local o1, o2 = optim.SGD(ref:parameters(), {lr = 0.1}), optim.SGD(m:parameters(), {lr = 0.1})
dl.manual_seed(100)
local x, y = dl.randn({8, 6}, {dtype = "f64"}), dl.randn({8, 4}, {dtype = "f64"})
mse(ref(x), y):backward(); o1:step()
mse(m(mine(x)), mine(y)):backward(); o2:step()
out("mesh", worst_vs(m, ref))
try("not_module", function() fsdp.fully_shard(42) end)
try("twice", function() fsdp.fully_shard(m) end)
try("mesh_2d", function() fsdp.fully_shard(mlp(), {mesh = dist.init_device_mesh("cpu", {1, WORLD})}) end)
try("unknown_option", function() fsdp.fully_shard(mlp(), {reshard = true}) end)
local m2 = mlp()
local original = m2[1].weight
fsdp.fully_shard(m2)
try("original", function() return original + 1 end)
-- a Probe keeps the unsharded weight its forward used; after the forward it is freed
Keep = nn.Linear:extend("Keep")
function Keep:forward(x) self.kept = self.weight; return nn.Linear.forward(self, x) end
local m3 = nn.Sequential(Keep(6, 4, {dtype = "f64"}), nn.Tanh(), nn.Linear(4, 2, {dtype = "f64"}))
fsdp.fully_shard(m3[1]); fsdp.fully_shard(m3)
m3(dl.randn({2, 6}, {dtype = "f64"}))
try("kept", function() return m3[1].kept:sum() end)
]], 2)
    assert_within(ranks, { "mesh" }, 1e-10)
    local e = ranks[1].err
    assert.truthy(e.not_module:find("fully_shard: module must be an nn.Module, got number", 1, true))
    assert.truthy(e.twice:find("already fully_shard'ed", 1, true))
    assert.truthy(e.mesh_2d:find("expected a 1-D mesh", 1, true))
    assert.truthy(e.unknown_option:find("reshard", 1, true))
    assert.truthy(e.original:find("freed tensor", 1, true))
    assert.truthy(e.kept:find("has no data: its storage was resized to 0 bytes", 1, true))
  end)

  it("#dist frees a dropped FSDP model (shards, unsharded parameters, hooks): no growth over models built, trained and dropped", function()
    local ranks = run([[
local function live() dl.empty_cache(); return dl.memory_stats().live end
local base, sizes = live(), {}
for i = 1, 3 do
  local m = shard_gpt(gpt())
  local opt = optim.AdamW(m:parameters(), {lr = 1e-3})
  local x = dl.randint(0, 13, {2, 8})
  local _, loss = m(x, x); loss:backward(); opt:step()
  m, opt, loss = nil, nil, nil
  sizes[i] = live() - base
end
out("sizes", table.concat(sizes, ","))
local m = shard_gpt(gpt())
local held = live() - base
out("model", held - sizes[3])
]], 2)
    for i = 1, 2 do
      local a, b, c = ranks[i].out.sizes:match("^(%-?%d+),(%-?%d+),(%-?%d+)$")
      local model = num(ranks, i, "model")
      assert.is_true(model > 0)
      -- what stays after dropping a model (the run's own small leftovers) does not grow with
      -- the models dropped, and is less than one model's shards
      assert.is_true(tonumber(c) < model, ranks[i].out.sizes .. " vs one model " .. model)
      assert.equal(b, c, "bytes left after models 1, 2, 3: " .. ranks[i].out.sizes)
      assert.is_truthy(a)
    end
  end)

  it("#dist prefetches: from the second step the next module's all-gather is in flight while one computes, forward and backward (set_prefetch(false) turns it off)", function()
    local ranks = run([[
-- Probe: a Linear that records, during its forward and its input gradient, the state of
-- the param group of `peer`
Probe = nn.Linear:extend("Probe")
function Probe:forward(x)
  if self.peer then
    self.seen[#self.seen + 1] = "f:" .. self.peer:_get_fsdp_state().group.state
    local peer, seen = self.x_peer, self.seen
    x:register_hook(function() seen[#seen + 1] = "b:" .. peer:_get_fsdp_state().group.state end)
  end
  return nn.Linear.forward(self, x)
end
for _, prefetch in ipairs{true, false} do
  dl.manual_seed(1)
  local a, b, c = Probe(4, 6), Probe(6, 5), Probe(5, 2)
  local m = nn.Sequential(a, nn.Tanh(), b, nn.Tanh(), c)
  fsdp.fully_shard(a); fsdp.fully_shard(b); fsdp.fully_shard(c); fsdp.fully_shard(m)
  m:set_prefetch(prefetch)
  -- b's forward sees c's group; b's input gradient (b's backward) sees a's group
  b.seen = {}
  b.peer = c
  b.x_peer = a
  for s = 1, 2 do
    local x = dl.randn({2, 4}):requires_grad_(true)
    m(x):sum():backward()
  end
  out(prefetch and "on" or "off", table.concat(b.seen, ","))
end
]], 2)
    -- the forward order is known once the first forward ended: step 1's forward does not
    -- prefetch, its backward does (b's pre-backward issued a's all-gather); step 2 both
    assert.equal("f:sharded,b:gathering,f:gathering,b:gathering", ranks[1].out.on)
    assert.equal("f:sharded,b:sharded,f:sharded,b:sharded", ranks[1].out.off)
  end)

  it("#dist mixed precision: param_dtype f32 over f64 shards computes in f32, reduces in f64 and keeps f64 gradients and optimizer", function()
    local ranks = run([[
Probe = nn.Linear:extend("Probe")
function Probe:forward(x)
  self.dtypes = self.weight.dtype .. "/" .. x.dtype
  return nn.Linear.forward(self, x)
end
dl.manual_seed(1)
local o = {dtype = "f64"}
local function net() dl.manual_seed(1); return nn.Sequential(Probe(6, 9, o), nn.Tanh(), Probe(9, 3, o)) end
local ref, m = net(), net()
local mp = fsdp.MixedPrecisionPolicy{param_dtype = "f32", reduce_dtype = "f64"}
fsdp.fully_shard(m[1], {mp_policy = mp}); fsdp.fully_shard(m, {mp_policy = mp})
local o1, o2 = optim.SGD(ref:parameters(), {lr = 0.1}), optim.SGD(m:parameters(), {lr = 0.1})
dl.manual_seed(100)
for s = 1, 3 do
  local x, y = dl.randn({8, 6}, o), dl.randn({8, 3}, o)
  o1:zero_grad(); mse(ref(x), y):backward(); o1:step()
  o2:zero_grad(); mse(m(mine(x)), mine(y)):backward()
  out("grad_dtype", m[1].weight.grad.dtype .. "," .. m[1].weight.dtype)
  o2:step()
end
out("compute", m[1].dtypes .. "," .. m[3].dtypes)
out("worst", worst_vs(m, ref))
try("bad_policy", function() fsdp.MixedPrecisionPolicy{param_dtype = "i64"} end)
]], 2)
    assert.equal("f32/f32,f32/f32", ranks[1].out.compute)
    assert.equal("f64,f64", ranks[1].out.grad_dtype)
    assert_within(ranks, { "worst" }, 1e-5)
    assert.truthy(ranks[1].err.bad_policy:find("param_dtype must be a floating dtype name", 1, true))
  end)

  it("#dist on 4 ranks the GPT's parameter + gradient + AdamW state bytes per rank are <= 0.3x DDP's, and its full state dict equals one process's", function()
    local ranks = run([[
local function tiny() dl.manual_seed(3); return GPT{block_size = 16, vocab_size = 64, n_layer = 2, n_head = 2, n_embd = 64} end
dl.manual_seed(7)
local x, y = dl.randint(0, 64, {4, 16}), dl.randint(0, 64, {4, 16})
-- live allocator bytes after dropping what the script no longer reaches
local function live() dl.empty_cache(); return dl.memory_stats().live end
local function step(model, opt, xb, yb) opt:zero_grad(); local _, loss = model(xb, yb); loss:backward(); opt:step() end
local base = live()
local model = tiny()
local ddp = DDP(model)
local opt = optim.AdamW(ddp:parameters(), {lr = 1e-3})
step(ddp, opt, mine(x), mine(y))
local ddp_bytes = live() - base
model, ddp, opt = nil, nil, nil
base = live()
model = tiny()
for _, b in ipairs(model.transformer.h:list()) do fsdp.fully_shard(b) end
fsdp.fully_shard(model)
opt = optim.AdamW(model:parameters(), {lr = 1e-3})
step(model, opt, mine(x), mine(y))
local fsdp_bytes = live() - base
out("ddp_bytes", ddp_bytes)
out("fsdp_bytes", fsdp_bytes)
local ref = tiny()
local ro = optim.AdamW(ref:parameters(), {lr = 1e-3})
step(ref, ro, x, y)
out("full", worst_vs(model, ref))
]], 4, { timeout = 90 })
    for i = 1, 4 do
      local d, f = num(ranks, i, "ddp_bytes"), num(ranks, i, "fsdp_bytes")
      assert.is_true(d > 0 and f > 0 and f <= 0.3 * d,
        ("rank %d: FSDP holds %d bytes, DDP %d (ratio %.3f, bar 0.3)"):format(i - 1, f, d, f / d))
    end
    assert_within(ranks, { "full" }, 1e-5)
  end)
end)
