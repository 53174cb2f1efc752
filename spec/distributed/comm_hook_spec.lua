-- Specs for DDP communication hooks (ddp:register_comm_hook, ddplua/comm_hook.h Note [comm
-- hooks]; lua/ddplua/distributed/algorithms/ddp_comm_hooks/) and ddplua.futures, with real
-- ranks on 127.0.0.1 (spec/helpers/multiproc.lua). Each hook is checked against a reference
-- computed in one process from the ranks' own gradients (all-gathered): the default hook
-- bitwise against no hook, fp16/bf16 against the sum rounded as the hook rounds, PowerSGD
-- against the same math written here in plain Lua (Note [PowerSGD]).
local ddp_ranks = require "ddp_ranks"

-- batches (step s: B samples, the same on every rank) and shard (rank r takes rows
-- r*B/W+1 .. (r+1)*B/W) come from spec/helpers/ddp_ranks.lua.
local PRELUDE = ddp_ranks.prelude {
  helpers = { "mlp", "cnn", "batches", "shard", "mse", "params_text" },
} .. [[
local futures = require "ddplua.futures"
local hooks = dist.algorithms.ddp_comm_hooks
local default = hooks.default_hooks
function grads_text(m)
  local parts = {}
  for _, p in ipairs(m:parameters()) do
    for _, v in ipairs(p.grad:reshape({-1}):tolist()) do parts[#parts + 1] = string.format("%a", v) end
  end
  return table.concat(parts, ",")
end
-- k SGD steps of DDP(make()) on the rank's shards, with `register` applied first.
function train(make, k, register, B, xshape, ydim)
  local xs, ys = batches(k, B or 8, xshape or {6}, ydim or 4)
  local model = DDP(make(), {bucket_cap_mb = 0.0005})
  if register then register(model) end
  local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
  local losses = {}
  for s = 1, k do
    opt:zero_grad()
    local loss = mse(model(shard(xs[s])), shard(ys[s]))
    loss:backward()
    losses[s] = loss:item()
    opt:step()
  end
  return model, losses
end
-- The ranks' local gradients of a plain (non-DDP) copy: grads[r + 1][i] (tensors).
function local_grads(make, x, y)
  local m = make()
  mse(m(x), y):backward()
  local per_rank = {}
  for r = 1, WORLD do per_rank[r] = {} end
  for i, p in ipairs(m:parameters()) do
    local outs = {}
    for r = 1, WORLD do outs[r] = dl.zeros(p.grad:size()) end
    dist.all_gather(outs, p.grad)
    for r = 1, WORLD do per_rank[r][i] = outs[r] end
  end
  return per_rank
end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

describe("ddplua.futures", function()
  local futures = require "ddplua.futures"
  it("then_ chains values, errors propagate, value() needs completion", function()
    local f = futures.Future()
    local g = f:then_(function(x) return x:value() * 2 end)
    local h = g["then"](g, function(x) return x:value() + 1 end)
    assert.is_false(h:done())
    assert.has_error(function() h:value() end, "Future: value() called before the future completed (call wait())")
    f:set_result(20)
    assert.is_true(h:done())
    assert.equal(41, h:wait())
    assert.equal(41, h:value())
    assert.equal(7, futures.completed(7):value())
    local bad = futures.completed(1):then_(function() error("boom") end):then_(function() return 3 end)
    assert.has_error(function() bad:wait() end)
    local ok, err = pcall(bad.wait, bad)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom", 1, true))
    assert.has_error(function() f:set_result(1) end, "Future: set_result on a future that is already completed")
  end)
end)

describe("ddp:register_comm_hook #dist", function()
  it("async collectives give futures; allreduce_hook (C and Lua) equals no hook bitwise; a Lua hook that all-reduces and divides", function()
    local ranks = run [[
local t = dl.full({3}, RANK + 1)
local fut = dist.all_reduce(t, {async_op = true}):get_future()
local f2 = fut:then_(function(f) return f:value()[1]:div_(WORLD) end)
out("fut", table.concat(f2:wait():tolist(), ","))
out("same", tostring(f2:value() == t))
local none = train(mlp, 3)
local c_hook = train(mlp, 3, function(m) m:register_comm_hook(nil, default.allreduce_hook) end)
local lua_default = train(mlp, 3, function(m)
  m:register_comm_hook(nil, function(s, b) return default.allreduce_hook(s, b) end) end)
local seen = {}
local lua_own = train(mlp, 3, function(m)
  m:register_comm_hook({count = 0}, function(state, bucket)
    state.count = state.count + 1
    seen[#seen + 1] = ("%d:%d:%s:%d"):format(bucket:index(), #bucket:gradients(), tostring(bucket:is_last()),
                                            #bucket:parameters())
    local buf = bucket:buffer()
    assert(bucket:gradients()[1]:numel() == bucket:parameters()[1]:numel())
    return dist.all_reduce(buf, {async_op = true}):get_future():then_(function(f)
      return f:value()[1]:div_(WORLD)
    end)
  end)
end)
out("none", params_text(none.module))
out("c_hook", params_text(c_hook.module))
out("lua_default", params_text(lua_default.module))
out("lua_own", params_text(lua_own.module))
out("buckets", #none:buckets())
out("seen", table.concat(seen, " ", 1, #none:buckets()))
out("bytes", c_hook:comm_hook_bytes())
]]
    local o = ranks[1].out
    assert.equal("1.5,1.5,1.5", o.fut)
    assert.equal("true", o.same)
    assert.equal(o.none, o.c_hook)
    assert.equal(o.none, o.lua_default)
    assert.equal(o.none, o.lua_own)
    assert.equal(o.none, ranks[2].out.none)
    assert.equal(o.c_hook, ranks[2].out.c_hook)
    assert.is_true(tonumber(o.buckets) > 1)
    -- every bucket, in index order, the last one flagged
    local nb = tonumber(o.buckets)
    local i = 0
    for entry in o.seen:gmatch("%S+") do
      local k, _, last = entry:match("^(%d+):(%d+):(%a+):")
      assert.equal(i, tonumber(k))
      assert.equal(tostring(i == nb - 1), last)
      i = i + 1
    end
    assert.equal(nb, i)
    -- 3 steps, every parameter (f32) all-reduced once a step: 6*16+16+16*12+12+12*4+4 floats
    assert.equal(3 * 4 * (6 * 16 + 16 + 16 * 12 + 12 + 12 * 4 + 4), tonumber(o.bytes))
  end)

  it("fp16/bf16 compress equal the ranks' sum rounded as the hook rounds; wrappers; bytes halved", function()
    local ranks = run [[
local xs, ys = batches(1, 8, {6}, 4)
local x, y = shard(xs[1]), shard(ys[1])
local g = local_grads(mlp, x, y)
for _, case in ipairs {
  {"fp16", default.fp16_compress_hook, "f16"},
  {"bf16", default.bf16_compress_hook, "bf16"},
  {"fp16w", default.fp16_compress_wrapper(default.allreduce_hook), "f16"},
  {"bf16w", default.bf16_compress_wrapper(default.allreduce_hook), "bf16"},
  {"lua16", function(s, b) return default.fp16_compress_hook(s, b) end, "f16"},
  -- the wrapper around a hook written in Lua runs in Lua (GradBucket:set_buffer)
  {"luaw", default.fp16_compress_wrapper(function(s, b) return default._allreduce_fut(s, b:buffer()) end), "f16"},
} do
  local name, hook, dt = case[1], case[2], case[3]
  local model = DDP(mlp(), {bucket_cap_mb = 0.0005})
  model:register_comm_hook(nil, hook)
  mse(model(x), y):backward()
  local worst, total = 0, 0
  for i, p in ipairs(model:parameters()) do
    -- each rank: cast, divide by the world size in the narrow dtype; the sum of two is
    -- exact in f32 and rounded once to the narrow dtype (gloo and the shared-memory path
    -- reduce f16/bf16 in f32), then cast back
    local sum = dl.zeros(p:size())
    for r = 1, WORLD do sum = sum + g[r][i]:to(dt):div_(WORLD):float() end
    local want = sum:to(dt):float()
    worst = math.max(worst, (p.grad - want):abs():max():item())
    total = total + p:numel()
  end
  out(name .. "_maxdiff", worst)
  out(name .. "_bytes", model:comm_hook_bytes())
  out("f32_bytes", total * 4)
  -- not the f32 average (the rounding is visible)
  local exact = 0
  for i, p in ipairs(model:parameters()) do
    exact = math.max(exact, (p.grad - (g[1][i] + g[2][i]) / 2):abs():max():item())
  end
  out(name .. "_vs_f32", exact)
end
]]
    local o = ranks[1].out
    for _, name in ipairs { "fp16", "bf16", "fp16w", "bf16w", "lua16", "luaw" } do
      assert.equal(0, tonumber(o[name .. "_maxdiff"]), name)
      assert.is_true(tonumber(o[name .. "_vs_f32"]) > 0, name .. " should differ from the f32 average")
    end
    for _, name in ipairs { "fp16", "bf16", "fp16w", "bf16w" } do
      assert.equal(tonumber(o.f32_bytes) / 2, tonumber(o[name .. "_bytes"]), name)
    end
    assert.equal("0", o.lua16_bytes) -- a Lua hook's collectives are not counted by the reducer
  end)

  it("fp16_compress_hook trains the CNN close to the default, with half the bytes", function()
    local ranks = run [[
local none, l0 = train(cnn, 6, nil, 8, {2, 8, 8}, 3)
local fp16, l1 = train(cnn, 6, function(m) m:register_comm_hook(nil, default.fp16_compress_hook) end, 8, {2, 8, 8}, 3)
local bytes32 = 0
for _, p in ipairs(none:parameters()) do bytes32 = bytes32 + 4 * p:numel() end
out("bytes", fp16:comm_hook_bytes())
out("bytes32", bytes32 * 6)
out("first", l1[1]); out("last", l1[6]); out("last_none", l0[6])
local worst = 0
for i, p in ipairs(fp16:parameters()) do
  worst = math.max(worst, (p - none:parameters()[i]):abs():max():item())
end
out("maxdiff", worst)
fp16:verify_sync()
out("synced", "yes")
]]
    local o = ranks[1].out
    assert.equal(tonumber(o.bytes32) / 2, tonumber(o.bytes))
    assert.is_true(tonumber(o.last) < tonumber(o.first))
    assert.is_true(tonumber(o.maxdiff) < 1e-2, o.maxdiff)
    assert.is_true(math.abs(tonumber(o.last) - tonumber(o.last_none)) < 1e-2 * math.abs(tonumber(o.last_none)))
    assert.equal("yes", o.synced)
  end)

  it("powerSGD_hook equals a plain-Lua PowerSGD over the ranks' gradients; error feedback and warm start persist", function()
    local ranks = run [==[
local psgd = hooks.powerSGD_hook
local T, START, RANKK, SEED = 6, 2, 2, 7
local xs, ys = batches(T, 8, {6}, 4)
local model = DDP(mlp())
local state = psgd.PowerSGDState{matrix_approximation_rank = RANKK, start_powerSGD_iter = START, random_seed = SEED}
model:register_comm_hook(state, psgd.powerSGD_hook)
local got, g_all = {}, {}
for t = 1, T do
  model:zero_grad()
  mse(model(shard(xs[t])), shard(ys[t])):backward()
  got[t] = {}
  for i, p in ipairs(model.params) do got[t][i] = p.grad:reshape({-1}):tolist() end
  g_all[t] = local_grads(mlp, shard(xs[t]), shard(ys[t]))
end
out("buckets", #model:buckets())
out("iter", state:iter())
out("has_error", tostring(state:error(0) ~= nil))
local rate = state:compression_stats()
out("rate", rate)
out("grads", grads_text(model.module))

-- The reference (Note [PowerSGD]) in doubles: slots in the rebuilt bucket's order.
local index_of = {}
for i, name in ipairs(model.param_names) do index_of[name] = i end
local order = {}
for s, name in ipairs(model:buckets()[1]) do order[s] = index_of[name] end
local function orth(mat, rows, cols)
  for c = 1, cols do
    local norm = 0
    for i = 1, rows do norm = norm + mat[i][c] ^ 2 end
    norm = math.sqrt(norm)
    for i = 1, rows do mat[i][c] = mat[i][c] / norm end
    for j = c + 1, cols do
      local dot = 0
      for i = 1, rows do dot = dot + mat[i][c] * mat[i][j] end
      for i = 1, rows do mat[i][j] = mat[i][j] - dot * mat[i][c] end
    end
  end
end
local function zeros2(r, c) local m = {} for i = 1, r do m[i] = {} for j = 1, c do m[i][j] = 0 end end return m end
local function reference(use_ef, warm)
  local gen = dl.Generator(SEED)
  local err, qmem = {}, nil
  for r = 1, WORLD do err[r] = {} end
  local result = {}
  for t = 1, T do
    result[t] = {}
    if t - 1 < START then
      for i = 1, #model.params do
        local a, b = g_all[t][1][i]:reshape({-1}):tolist(), g_all[t][2][i]:reshape({-1}):tolist()
        local avg = {}
        for e = 1, #a do avg[e] = (a[e] + b[e]) / WORLD end
        result[t][i] = avg
      end
    else
      local fresh = not warm or qmem == nil
      local gq
      if fresh then
        qmem = {}
        local seed = dl.randint(0, 1000000000, {1}, {generator = gen}):tolist()[1]
        gq = dl.Generator(seed)
      end
      for _, i in ipairs(order) do
        local p = model.params[i]
        local n = p:dim() > 0 and p:size(1) or 1
        local m = p:numel() / n
        local rk = math.min(n, m, RANKK)
        local M = {}
        for r = 1, WORLD do
          local flat = g_all[t][r][i]:reshape({-1}):tolist()
          if use_ef and err[r][i] then for e = 1, #flat do flat[e] = flat[e] + err[r][i][e] end end
          M[r] = flat
        end
        local out_flat = {}
        if (n + m) * rk * 2 < n * m then
          local q
          if fresh then
            local qt = dl.randn({m, rk}, {generator = gq}):tolist()
            q = qt
          else
            q = qmem[i]
          end
          orth(q, m, rk)
          local P = zeros2(n, rk)
          for r = 1, WORLD do
            for a = 1, n do for c = 1, rk do
              local acc = 0
              for j = 1, m do acc = acc + M[r][(a - 1) * m + j] * q[j][c] end
              P[a][c] = P[a][c] + acc
            end end
          end
          orth(P, n, rk)
          local Q = zeros2(m, rk)
          for r = 1, WORLD do
            for j = 1, m do for c = 1, rk do
              local acc = 0
              for a = 1, n do acc = acc + M[r][(a - 1) * m + j] * P[a][c] end
              Q[j][c] = Q[j][c] + acc / WORLD
            end end
          end
          qmem[i] = Q
          for a = 1, n do for j = 1, m do
            local acc = 0
            for c = 1, rk do acc = acc + P[a][c] * Q[j][c] end
            out_flat[(a - 1) * m + j] = acc
          end end
        else
          for e = 1, #M[1] do
            local sum = 0
            for r = 1, WORLD do sum = sum + M[r][e] end
            out_flat[e] = sum / WORLD
          end
        end
        for r = 1, WORLD do
          err[r][i] = {}
          for e = 1, #out_flat do err[r][i][e] = M[r][e] - out_flat[e] end
        end
        result[t][i] = out_flat
      end
    end
  end
  return result
end
local function compare(ref)
  local worst = 0
  for t = 1, T do
    for i = 1, #model.params do
      local scale = 1e-12
      for _, v in ipairs(ref[t][i]) do scale = math.max(scale, math.abs(v)) end
      for e, v in ipairs(ref[t][i]) do worst = math.max(worst, math.abs(got[t][i][e] - v) / scale) end
    end
  end
  return worst
end
out("rel", compare(reference(true, true)))
out("rel_no_ef", compare(reference(false, true)))
out("rel_no_warm", compare(reference(true, false)))
]==]
    local o = ranks[1].out
    assert.equal("1", o.buckets)
    assert.equal("6", o.iter)
    assert.equal("true", o.has_error)
    assert.is_true(tonumber(o.rate) > 1, o.rate)
    assert.is_true(tonumber(o.rel) < 1e-4, "PowerSGD differs from the reference by " .. o.rel)
    -- the comparison sees the persistent state: without it the reference differs
    assert.is_true(tonumber(o.rel_no_ef) > 1e-2, o.rel_no_ef)
    assert.is_true(tonumber(o.rel_no_warm) > 1e-2, o.rel_no_warm)
    assert.equal(o.grads, ranks[2].out.grads)
  end)

  it("fp16_compress_wrapper(powerSGD_hook) halves PowerSGD's bytes and stays close to it", function()
    local ranks = run [==[
local psgd = hooks.powerSGD_hook
local xs, ys = batches(4, 8, {6}, 4)
local function go(hook)
  local st = psgd.PowerSGDState{matrix_approximation_rank = 1, start_powerSGD_iter = 2}
  local m = DDP(mlp(), {gradient_as_bucket_view = true})
  m:register_comm_hook(st, hook)
  for t = 1, 4 do
    m:zero_grad()
    mse(m(shard(xs[t])), shard(ys[t])):backward()
  end
  return m, st
end
local plain, st1 = go(psgd.powerSGD_hook)
local wrapped, st2 = go(default.fp16_compress_wrapper(psgd.powerSGD_hook))
out("bytes", plain:comm_hook_bytes())
out("bytes16", wrapped:comm_hook_bytes())
out("iters", st1:iter() .. "," .. st2:iter())
local worst, scale = 0, 0
for i, p in ipairs(plain.params) do
  worst = math.max(worst, (p.grad - wrapped.params[i].grad):abs():max():item())
  scale = math.max(scale, p.grad:abs():max():item())
end
out("rel", worst / scale)
out("grads", grads_text(wrapped.module))
]==]
    local o = ranks[1].out
    assert.equal(tonumber(o.bytes) / 2, tonumber(o.bytes16))
    assert.equal("4,4", o.iters)
    assert.is_true(tonumber(o.rel) < 2e-2, o.rel)
    assert.equal(o.grads, ranks[2].out.grads)
  end)

  it("misuse: twice, after backward, a hook that returns no future or a wrong shape", function()
    local ranks = run [[
local xs, ys = batches(1, 8, {6}, 4)
local x, y = shard(xs[1]), shard(ys[1])
local m = DDP(mlp())
m:register_comm_hook(nil, default.allreduce_hook)
try("twice", function() m:register_comm_hook(nil, default.fp16_compress_hook) end)
try("builtin_twice", function() m:_register_builtin_comm_hook("FP16_COMPRESS") end)
local m2 = DDP(mlp())
mse(m2(x), y):backward()
try("after", function() m2:register_comm_hook(nil, default.allreduce_hook) end)
local m3 = DDP(mlp())
m3:register_comm_hook(nil, function(s, b) return b:buffer() end)
try("nofuture", function() mse(m3(x), y):backward() end)
local m4 = DDP(mlp())
m4:register_comm_hook(nil, function(s, b) return futures.completed(dl.zeros({3})) end)
try("shape", function() mse(m4(x), y):backward() end)
try("state", function() DDP(mlp()):register_comm_hook(7, default.allreduce_hook) end)
local psgd = hooks.powerSGD_hook
try("psgd_state", function() DDP(mlp()):register_comm_hook(nil, psgd.powerSGD_hook) end)
try("psgd_start", function() psgd.PowerSGDState{start_powerSGD_iter = 1} end)
try("psgd_key", function() psgd.PowerSGDState{rank = 2} end)
try("unused", function() DDP(mlp(), {find_unused_parameters = true}):register_comm_hook(nil, function() end) end)
-- after a failed backward the module still works with a good hook? (a fresh one)
local m5 = DDP(mlp())
m5:_register_builtin_comm_hook("ALLREDUCE")
mse(m5(x), y):backward()
out("ok", "yes")
]]
    local e = ranks[1].err
    assert.truthy(e.twice:find("register_comm_hook or register_builtin_comm_hook can only be called once.", 1, true), e.twice)
    assert.truthy(e.builtin_twice:find("can only be called once.", 1, true), e.builtin_twice)
    assert.truthy(e.after:find("before the first backward", 1, true), e.after)
    assert.truthy(e.nofuture:find("must return a Future", 1, true), e.nofuture)
    assert.truthy(e.shape:find("has a value of shape (3,)", 1, true), e.shape)
    assert.truthy(e.state:find("must be a process group or nil", 1, true), e.state)
    assert.truthy(e.psgd_state:find("needs a PowerSGDState", 1, true), e.psgd_state)
    assert.truthy(e.psgd_start:find("Expect `start_powerSGD_iter` > 1", 1, true), e.psgd_start)
    assert.truthy(e.psgd_key:find("rank", 1, true), e.psgd_key)
    assert.truthy(e.unused:find("find_unused_parameters", 1, true), e.unused)
    assert.equal("yes", ranks[1].out.ok)
  end)
end)
