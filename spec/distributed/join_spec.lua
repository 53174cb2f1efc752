-- Specs for uneven inputs: the generic Join (lua/ddplua/distributed/algorithms/join.lua) and
-- DistributedDataParallel's join (ddp:join, lua/ddplua/distributed/ddp_join_hook.lua over
-- ddplua/reducer_join.h), with real ranks on 127.0.0.1 (spec/helpers/multiproc.lua).
--
-- Reference: rank r trains on counts[r] batches of its own; step s has the ranks P_s that
-- still have a batch. DDP under join gives every non-joined rank sum_{r in P_s} g_r / D with
-- g_r the gradient of rank r's mean loss and D = 2 (divide_by_initial_world_size) or |P_s|,
-- which is the gradient of sum_{r in P_s} loss_r / D: one process trains on that loss with
-- the same optimizer and every rank's final weights must equal it (every rank computes the
-- reference itself, from the same seeds).
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  helpers = { "mlp", "mse", "max_rel", "params_text", "device" },
} .. [[
local Join = require "ddplua.distributed.algorithms.join"
-- data[r][s] = {x (4, 6), y (4, 4)}: rank r's batch s, the same on every rank.
function make_data(counts)
  local data = {}
  dl.manual_seed(100)
  for r = 0, #counts - 1 do
    data[r] = {}
    for s = 1, counts[r + 1] do data[r][s] = { dl.randn({4, 6}), dl.randn({4, 4}) } end
  end
  return data
end
-- One process: step s minimises sum over the ranks with a batch s of their loss / divisor.
function reference(make, data, counts, divide_by_initial, opt_args, loss_of)
  local m = make()
  local opt = optim.SGD(m:parameters(), opt_args)
  local steps = math.max(unpack(counts))
  for s = 1, steps do
    opt:zero_grad()
    local total, present = nil, 0
    for r = 0, #counts - 1 do
      if s <= counts[r + 1] then
        present = present + 1
        local l = loss_of(m, data[r][s], r, s)
        total = total and total + l or l
      end
    end
    (total / (divide_by_initial and #counts or present)):backward()
    opt:step()
  end
  return m
end
function default_loss(m, batch) return mse(m(batch[1]), batch[2]) end
-- Train DDP(make()) under ddp:join on this rank's batches; print the replicas' weights, the
-- reference's distance, the iterations and buckets.
function uneven(counts, join_opts, ddp_opts, make, loss_of)
  make, loss_of = make or mlp, loss_of or default_loss
  local data = make_data(counts)
  local opt_args = {lr = 0.1, momentum = 0.9}
  local model = DDP(make(), ddp_opts or {bucket_cap_mb = 0.0002})
  local opt = optim.SGD(model:parameters(), opt_args)
  local steps = model:join(join_opts, function()
    for s = 1, counts[RANK + 1] do
      opt:zero_grad()
      loss_of(model, data[RANK][s], RANK, s):backward()
      opt:step()
    end
    return counts[RANK + 1]
  end)
  out("steps", steps)
  out("iterations", tonumber(require("ddplua.lib").C.ddp_reducer_num_iterations(model.reducer)))
  out("params", tensors_text(model.module:parameters()))
  local b = {}
  for k, names in ipairs(model:buckets()) do b[k] = table.concat(names, "+") end
  out("buckets", table.concat(b, "|"))
  out("rebuilt", tostring(model:has_rebuilt_buckets()))
  local divide = join_opts.divide_by_initial_world_size
  if divide == nil then divide = true end
  out("max_rel", max_rel(model.module, reference(make, data, counts, divide, opt_args, loss_of)))
  model:verify_sync()
  return model
end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 40 })

local function check_reference(ranks, tol)
  for i = 1, #ranks do
    local rel = tonumber(ranks[i].out.max_rel)
    assert.is_not_nil(rel, "rank " .. (i - 1) .. " printed no max_rel:\n" .. ranks[i].output)
    assert.is_true(rel <= (tol or 2e-6), "rank " .. (i - 1) .. ": max relative difference " .. rel)
  end
  assert.equal(ranks[1].out.params, ranks[2].out.params)
  assert.equal(ranks[1].out.buckets, ranks[2].out.buckets)
end

describe("ddplua.distributed.algorithms.join #dist", function()
  it("ranks with 5 and 8 batches finish; weights equal one process with divisor 2", function()
    local ranks = run([[uneven({5, 8}, {divide_by_initial_world_size = true})]])
    check_reference(ranks)
    assert.equal("5", ranks[1].out.steps)
    assert.equal("8", ranks[2].out.steps)
    -- the joined rank finished 5 reductions of its own and shadowed 3
    assert.equal("5", ranks[1].out.iterations)
    assert.equal("8", ranks[2].out.iterations)
    assert.equal("true", ranks[1].out.rebuilt)
    local n_buckets = select(2, ranks[1].out.buckets:gsub("|", "|")) + 1
    assert.is_true(n_buckets >= 3, "several buckets: " .. ranks[1].out.buckets)
  end)

  it("divide_by_initial_world_size = false divides by the ranks still training", function()
    local ranks = run([[uneven({8, 5}, {divide_by_initial_world_size = false})]])
    check_reference(ranks)
    assert.equal("8", ranks[1].out.steps)
    assert.equal("5", ranks[2].out.steps)
    -- gradients as views into the buckets: the shadow all-reduces use buffers of their own
    ranks = run([[uneven({8, 5}, {divide_by_initial_world_size = false},
                         {gradient_as_bucket_view = true, bucket_cap_mb = 0.0002})]])
    check_reference(ranks)
  end)

  it("the two divisors give different weights (the reference tells them apart)", function()
    local ranks = run([[
local data = make_data({5, 8})
local a = reference(mlp, data, {5, 8}, true, {lr = 0.1}, default_loss)
local b = reference(mlp, data, {5, 8}, false, {lr = 0.1}, default_loss)
out("rel", max_rel(a, b))
]], 1)
    assert.is_true(tonumber(ranks[1].out.rel) > 1e-3, "rel " .. ranks[1].out.rel)
  end)

  it("a rank with no batch at all, and a rebuild while a rank has joined", function()
    -- rank 0 joins before any iteration: it shadows rank 1's first backward, takes the
    -- registration order as its record and broadcasts it at the rebuild (as rank 0)
    local ranks = run([[uneven({0, 3}, {})]])
    check_reference(ranks)
    assert.equal("0", ranks[1].out.iterations)
    assert.equal("true", ranks[1].out.rebuilt)
    assert.equal("true", ranks[2].out.rebuilt)
    -- rank 0 joins after one iteration, so both rebuild in rank 1's second iteration
    ranks = run([[uneven({1, 4}, {divide_by_initial_world_size = false})]])
    check_reference(ranks)
    assert.equal("true", ranks[1].out.rebuilt)
  end)

  it("find_unused_parameters: parameters unused on some or all ranks", function()
    local ranks = run([[
local Net = nn.Module:extend("Net")
function Net:init()
  dl.manual_seed(3)
  self.a = nn.Linear(6, 4)
  self.b = nn.Linear(6, 4)
end
function Net:forward(x, use_b)
  if use_b then return self.a(x) + self.b(x) end
  return self.a(x)
end
-- b used by rank 0 on odd steps, by rank 1 on steps not divisible by 3 (steps 6 on: by none)
local function loss_of(m, batch, r, s)
  local use = (r == 0 and s % 2 == 1) or (r == 1 and s % 3 ~= 0 and s < 6)
  return mse(m(batch[1], use), batch[2])
end
uneven({5, 8}, {}, {find_unused_parameters = true, bucket_cap_mb = 0.00005}, Net, loss_of)
]])
    check_reference(ranks)
    assert.equal("8", ranks[2].out.iterations)
  end)

  it("broadcast_buffers: the joined rank takes part, every rank ends with the last joiner's buffers", function()
    local ranks = run([[
local function make()
  dl.manual_seed(5)
  return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 4))
end
local data = make_data({3, 6})
local model = DDP(make())
local opt = optim.SGD(model:parameters(), {lr = 0.1})
model:join({}, function()
  for s = 1, ({3, 6})[RANK + 1] do
    opt:zero_grad()
    mse(model(data[RANK][s][1]), data[RANK][s][2]):backward()
    opt:step()
  end
  out("own_buffers", tensors_text(model.module:buffers()))
end)
out("buffers", tensors_text(model.module:buffers()))
out("params", tensors_text(model.module:parameters()))
model:verify_sync()
]])
    assert.equal(ranks[2].out.own_buffers, ranks[1].out.buffers)
    assert.equal(ranks[2].out.own_buffers, ranks[2].out.buffers)
    assert.are_not.equal(ranks[1].out.own_buffers, ranks[2].out.own_buffers)
    assert.equal(ranks[1].out.params, ranks[2].out.params)
  end)

  it("no_sync and no_grad forwards inside join: the joined rank shadows only synced backwards", function()
    -- each step: a no_grad forward (evaluation), a micro-batch under no_sync, then a synced
    -- one; the reference sums both halves' losses over the ranks present
    local ranks = run([[
local counts = {3, 6}
local data = make_data(counts)
local function halves(batch)
  return batch[1]:narrow(1, 1, 2), batch[2]:narrow(1, 1, 2), batch[1]:narrow(1, 3, 2), batch[2]:narrow(1, 3, 2)
end
local model = DDP(mlp(), {bucket_cap_mb = 0.0002})
local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
model:join({divide_by_initial_world_size = false}, function()
  for s = 1, counts[RANK + 1] do
    local x1, y1, x2, y2 = halves(data[RANK][s])
    dl.no_grad(function() model(x1) end)
    opt:zero_grad()
    model:no_sync(function() mse(model(x1), y1):backward() end)
    mse(model(x2), y2):backward()
    opt:step()
  end
end)
out("params", tensors_text(model.module:parameters()))
out("buckets", "-")
local ref = reference(mlp, data, counts, false, {lr = 0.1, momentum = 0.9}, function(m, batch)
  local x1, y1, x2, y2 = halves(batch)
  return mse(m(x1), y1) + mse(m(x2), y2)
end)
out("max_rel", max_rel(model.module, ref))
]])
    check_reference(ranks)
  end)

  it("two joins in a row (epochs with different counts) keep training the same model", function()
    local ranks = run([[
-- plain SGD: optimizer state is per rank, and a joined rank's would lag (as PyTorch)
local opt_args = {lr = 0.1}
local model = DDP(mlp(), {bucket_cap_mb = 0.0002})
local opt = optim.SGD(model:parameters(), opt_args)
local epochs = { {5, 8}, {4, 2} }
for e, counts in ipairs(epochs) do
  local data = make_data(counts)
  model:join({divide_by_initial_world_size = e == 1}, function()
    for s = 1, counts[RANK + 1] do
      opt:zero_grad()
      mse(model(data[RANK][s][1]), data[RANK][s][2]):backward()
      opt:step()
    end
  end)
end
-- after the joins: plain DDP again (no join collectives, divisor back to the world size)
local x, y = dl.randn({4, 6}), dl.randn({4, 4})
opt:zero_grad(); mse(model(x), y):backward(); opt:step()
out("params", tensors_text(model.module:parameters()))
out("buckets", "-")
-- reference: one optimizer across both epochs, then the plain step (same x, y on both ranks)
local m = mlp()
local ropt = optim.SGD(m:parameters(), opt_args)
for e, counts in ipairs(epochs) do
  local data = make_data(counts)
  for s = 1, math.max(unpack(counts)) do
    ropt:zero_grad()
    local total, present = nil, 0
    for r = 0, 1 do
      if s <= counts[r + 1] then
        present = present + 1
        local l = mse(m(data[r][s][1]), data[r][s][2])
        total = total and total + l or l
      end
    end
    (total / (e == 1 and 2 or present)):backward()
    ropt:step()
  end
end
ropt:zero_grad(); mse(m(x), y):backward(); ropt:step()
out("max_rel", max_rel(model.module, m))
]])
    check_reference(ranks)
  end)

  it("under join the buffers come from the highest rank still training", function()
    -- each rank writes its own tag into a buffer before each forward; the forward sees the
    -- authoritative rank's tag (broadcast before the module runs)
    local ranks = run([[
local Tagged = nn.Module:extend("Tagged")
function Tagged:init()
  dl.manual_seed(6)
  self.fc = nn.Linear(6, 4)
  self:register_buffer("tag", dl.zeros({1}))
  self.seen = {}
end
function Tagged:forward(x)
  self.seen[#self.seen + 1] = self.tag:item()
  return self.fc(x)
end
local counts = {3, 5}
local data = make_data(counts)
local model = DDP(Tagged())
model:join({}, function()
  for s = 1, counts[RANK + 1] do
    model.module.tag:fill_(10 * (RANK + 1) + s)
    mse(model(data[RANK][s][1]), data[RANK][s][2]):backward()
  end
end)
out("seen", table.concat(model.module.seen, ","))
out("final_tag", model.module.tag:item())
]])
    assert.equal("21,22,23", ranks[1].out.seen)
    assert.equal("21,22,23,24,25", ranks[2].out.seen)
    assert.equal("25", ranks[1].out.final_tag) -- the joined rank took every broadcast
  end)

  it("throw_on_early_termination: every rank raises when one runs out", function()
    local ranks = run([[
local data = make_data({2, 5})
local model = DDP(mlp())
local done = 0
try("join", function()
  model:join({throw_on_early_termination = true}, function()
    for s = 1, ({2, 5})[RANK + 1] do
      mse(model(data[RANK][s][1]), data[RANK][s][2]):backward()
      done = s
    end
  end)
end)
out("done", done)
-- the group is still usable: the same collectives ran on both ranks
local t = dl.full({1}, RANK + 1)
dist.all_reduce(t)
out("sum", t:item())
]])
    assert.matches("Rank 0 exhausted all inputs.", ranks[1].err.join, 1, true)
    assert.matches("Detected at least one rank that exhausted inputs. Throwing across all ranks.",
                   ranks[2].err.join, 1, true)
    assert.equal("2", ranks[1].out.done)
    assert.equal("2", ranks[2].out.done)
    assert.equal("3", ranks[1].out.sum)
  end)

  it("enable = false is plain DDP: even inputs train as without join", function()
    local ranks = run([[uneven({4, 4}, {enable = false})]])
    check_reference(ranks)
  end)

  it("enable = false with uneven inputs fails with an error (no hang)", function()
    local ranks = run([[
local data = make_data({2, 3})
local model = DDP(mlp(), {timeout = 3})
try("train", function()
  model:join({enable = false}, function()
    for s = 1, ({2, 3})[RANK + 1] do
      mse(model(data[RANK][s][1]), data[RANK][s][2]):backward()
    end
  end)
  dist.barrier()
end)
]], 2, { timeout = 30 })
    -- rank 0 reached its barrier while rank 1 all-reduced a gradient bucket: both raise
    -- (Note [collective fingerprints]) instead of waiting for the 300 s timeout
    assert.matches("gradient bucket 0", ranks[2].err.train, 1, true)
    assert.matches("collective mismatch", ranks[2].err.train, 1, true)
    assert.matches("collective mismatch", ranks[1].err.train, 1, true)
  end)

  it("a custom Joinable: main hooks shadow its all-reduces, post hooks see the last joiner", function()
    local ranks = run([[
local Counter = {}
Counter.__index = Counter
Counter.JOIN_HOOK_OPTIONS = {"scale"}
function Counter.new() return setmetatable({total = 0}, Counter) end
function Counter:join_hook(opts)
  self.scale = opts.scale or 1
  return {
    main_hook = function()
      local t = dl.zeros({1})
      dist.all_reduce(t)
      self.total = self.total + t:item()
      self.shadowed = (self.shadowed or 0) + 1
    end,
    post_hook = function(is_last_joiner) self.last = is_last_joiner end,
  }
end
function Counter:join_device() return -1 end
function Counter:join_process_group() return dist.get_default_group() end
function Counter:step(v)
  Join.notify_join_context(self)
  local t = dl.full({1}, v * self.scale)
  dist.all_reduce(t)
  self.total = self.total + t:item()
end
local c = Counter.new()
local steps = ({3, 6})[RANK + 1]
local ret = Join({c}, {scale = 2}):run(function(v)
  for _ = 1, steps do c:step(v) end
  return "ret" .. v
end, RANK == 0 and 1 or 10)
out("total", c.total)
out("last", tostring(c.last))
out("shadowed", c.shadowed or 0)
out("ret", ret)
out("config", tostring(c._join_config.enable))
-- a second Join with the table form and the joinables listed inline
local d = Counter.new()
Join{d, enable = true}:run(function() for _ = 1, 6 - steps do d:step(1) end end)
out("total2", d.total)
try("unknown", function() Join({c}, {scael = 2}) end)
try("empty", function() Join({}, {}) end)
try("notjoinable", function() Join({c, {}}, {}) end)
]])
    for i = 1, 2 do
      -- steps 1-3: 2 * (1 + 10) each; steps 4-6: 2 * 10 each
      assert.equal("126", ranks[i].out.total)
      assert.equal("false", ranks[i].out.config)
      assert.equal("3", ranks[i].out.total2) -- rank 0's 3 steps of 1, rank 1 joined at once
    end
    assert.equal("false", ranks[1].out.last)
    assert.equal("true", ranks[2].out.last)
    assert.equal("3", ranks[1].out.shadowed)
    assert.equal("0", ranks[2].out.shadowed)
    assert.equal("ret1", ranks[1].out.ret)
    assert.equal("ret10", ranks[2].out.ret)
    assert.matches("unknown option 'scael'", ranks[1].err.unknown, 1, true)
    assert.matches("did you mean 'scale'", ranks[1].err.unknown, 1, true)
    assert.matches("The join context manager requires at least one joinable", ranks[1].err.empty, 1, true)
    assert.matches("joinable 2 is not a Joinable", ranks[1].err.notjoinable, 1, true)
  end)

  it("DDP and a custom Joinable in one Join", function()
    local ranks = run([[
local Counter = {}
Counter.__index = Counter
function Counter:join_hook() return {main_hook = function()
  local t = dl.zeros({1}); dist.all_reduce(t); self.total = self.total + t:item() end} end
function Counter:join_device() return -1 end
function Counter:join_process_group() return dist.get_default_group() end
local c = setmetatable({total = 0}, Counter)
local counts = {4, 7}
local data = make_data(counts)
local model = DDP(mlp(), {bucket_cap_mb = 0.0005})
local opt = optim.SGD(model:parameters(), {lr = 0.1})
Join({model, c}, {divide_by_initial_world_size = false}):run(function()
  for s = 1, counts[RANK + 1] do
    opt:zero_grad()
    mse(model(data[RANK][s][1]), data[RANK][s][2]):backward()
    local t = dl.ones({1}); dist.all_reduce(t); c.total = c.total + t:item()
    opt:step()
  end
end)
out("total", c.total)
out("max_rel", max_rel(model.module, reference(mlp, data, counts, false, {lr = 0.1}, default_loss)))
out("params", tensors_text(model.module:parameters()))
out("buckets", "-")
]])
    check_reference(ranks)
    assert.equal("11", ranks[1].out.total) -- 4 * 2 + 3 * 1
    assert.equal("11", ranks[2].out.total)
  end)
end)
-- Join with a communication hook (Note [join shadow with a comm hook], ddplua/reducer_join.h):
-- the joined rank runs the hook on zero buckets. HOOKED trains under ddp:join with a hook and
-- checks the weights against the join reference with the hook's rounding: at step s each
-- rank r still present contributes its own gradient g_r (a plain copy of the model) cast to
-- the hook's dtype and divided by D there, the contributions are summed in f32 (exact for
-- two) and rounded once to the dtype (the reduction's rounding), then cast back; a joined
-- rank contributes nothing (its zeros). Without a dtype: sum of g_r / D (allreduce_hook).
local HOOKED = [[
local default = dist.algorithms.ddp_comm_hooks.default_hooks
local function hook_reference(data, counts, divide, opt_args, dt)
  local m = mlp()
  local opt = optim.SGD(m:parameters(), opt_args)
  for s = 1, math.max(unpack(counts)) do
    local present = {}
    for r = 0, #counts - 1 do if s <= counts[r + 1] then present[#present + 1] = r end end
    local D = divide and #counts or #present
    local sums = {}
    for _, r in ipairs(present) do
      opt:zero_grad()
      default_loss(m, data[r][s]):backward()
      for i, p in ipairs(m:parameters()) do
        local c = dt and p.grad:to(dt):div_(D):float() or p.grad / D
        sums[i] = sums[i] and sums[i] + c or c
      end
    end
    for i, p in ipairs(m:parameters()) do p.grad:copy_(dt and sums[i]:to(dt):float() or sums[i]) end
    opt:step()
  end
  return m
end
-- name: the case; hook; dt: its rounding dtype (nil: none); join_opts: ddp:join's options.
-- The hook divides by the group's size (the initial world size), as PyTorch's built-in
-- hooks, unless join_opts.comm_hook_divide_by_non_joined (with divide_by_initial_world_size
-- = false) makes it divide by the ranks still training.
function hooked(name, counts, hook, dt, join_opts, ddp_opts)
  local data = make_data(counts)
  local opt_args = {lr = 0.1, momentum = 0.9}
  local model = DDP(mlp(), ddp_opts or {bucket_cap_mb = 0.0002})
  model:register_comm_hook(nil, hook)
  local opt = optim.SGD(model:parameters(), opt_args)
  local own
  local divide = not (join_opts.divide_by_initial_world_size == false and join_opts.comm_hook_divide_by_non_joined)
  model:join(join_opts, function()
    for s = 1, counts[RANK + 1] do
      opt:zero_grad()
      default_loss(model, data[RANK][s]):backward()
      opt:step()
    end
    own = {}
    for i, p in ipairs(model.module:parameters()) do own[i] = p.grad end
    own = tensors_text(own)
  end)
  local after = {}
  for i, p in ipairs(model.module:parameters()) do after[i] = p.grad end
  out(name .. "_grads_kept", tostring(tensors_text(after) == own))
  out(name .. "_params", tensors_text(model.module:parameters()))
  out(name .. "_max_rel", max_rel(model.module, hook_reference(data, counts, divide, opt_args, dt)))
  -- the plain join reference (no rounding): the rounding must be visible
  out(name .. "_plain_rel", max_rel(model.module, reference(mlp, data, counts, divide, opt_args, default_loss)))
  out(name .. "_buckets", #model:buckets())
  model:verify_sync()
end
]]

local function check_hooked(ranks, name, rounds)
  for i = 1, 2 do
    local o = ranks[i].out
    local rel = tonumber(o[name .. "_max_rel"])
    assert.is_not_nil(rel, name .. ": rank " .. (i - 1) .. " printed nothing:\n" .. ranks[i].output)
    assert.is_true(rel <= 1e-6, name .. ": rank " .. (i - 1) .. " max relative difference " .. rel)
    assert.equal("true", o[name .. "_grads_kept"], name .. ": the shadow changed rank " .. (i - 1) .. "'s gradients")
    assert.is_true(tonumber(o[name .. "_buckets"]) >= 3, name .. ": several buckets")
  end
  if rounds then
    local plain = tonumber(ranks[1].out[name .. "_plain_rel"])
    assert.is_true(plain > 1e-5, name .. ": the rounding should be visible against the f32 reference, " .. plain)
  end
  assert.equal(ranks[1].out[name .. "_params"], ranks[2].out[name .. "_params"])
end

describe("ddp:join with a communication hook #dist", function()
  it("fp16/bf16 compress, their wrappers and allreduce_hook: 5 and 8 batches equal the rounded join reference", function()
    local ranks = run(HOOKED .. [[
local by_live = {divide_by_initial_world_size = false, comm_hook_divide_by_non_joined = true}
hooked("fp16", {5, 8}, default.fp16_compress_hook, "f16", {})
hooked("bf16", {8, 5}, default.bf16_compress_hook, "bf16", by_live)
hooked("fp16w", {5, 8}, default.fp16_compress_wrapper(default.allreduce_hook), "f16", by_live)
hooked("allreduce", {5, 8}, default.allreduce_hook, nil, by_live,
       {bucket_cap_mb = 0.0002, gradient_as_bucket_view = true})
hooked("fp16view", {0, 3}, default.fp16_compress_hook, "f16", {divide_by_initial_world_size = true},
       {bucket_cap_mb = 0.0002, gradient_as_bucket_view = true})
]], 2, { timeout = 90 })
    for _, name in ipairs { "fp16", "bf16", "fp16w", "fp16view" } do check_hooked(ranks, name, true) end
    check_hooked(ranks, "allreduce", false)
  end)

  it("a hook written in Lua runs on zero buckets on the joined rank; refused with comm_hook_divide_by_non_joined", function()
    local ranks = run(HOOKED .. [[
local calls, zero_calls = 0, 0
local function lua_fp16(state, bucket)
  calls = calls + 1
  if bucket:buffer():abs():max():item() == 0 then zero_calls = zero_calls + 1 end
  -- zero buckets on the joined rank: buffer and gradients() views (shaped as the parameters)
  for i, g in ipairs(bucket:gradients()) do
    assert(g:numel() == bucket:parameters()[i]:numel())
  end
  return default.fp16_compress_hook(state, bucket)
end
hooked("lua", {5, 8}, lua_fp16, "f16", {divide_by_initial_world_size = true})
out("calls", calls)
out("zero_calls", zero_calls)
try("lua_false", function()
  local model = DDP(mlp())
  model:register_comm_hook(nil, function(s, b) return default.allreduce_hook(s, b) end)
  model:join({divide_by_initial_world_size = false, comm_hook_divide_by_non_joined = true}, function() end)
end)
]], 2, { timeout = 90 })
    check_hooked(ranks, "lua", true)
    -- both ranks ran the hook once per bucket of each of the 8 synchronised backwards
    local nb = tonumber(ranks[1].out.lua_buckets)
    assert.equal(8 * nb, tonumber(ranks[1].out.calls))
    assert.equal(8 * nb, tonumber(ranks[2].out.calls))
    -- the joined rank's 3 shadowed backwards ran it on zeros; rank 1 never
    assert.equal(3 * nb, tonumber(ranks[1].out.zero_calls))
    assert.equal(0, tonumber(ranks[2].out.zero_calls))
    for i = 1, 2 do
      assert.truthy(ranks[i].err.lua_false:find("comm_hook_divide_by_non_joined = true cannot be combined " ..
                                               "with a communication hook written in Lua", 1, true), ranks[i].err.lua_false)
    end
  end)

  it("divide_by_initial_world_size = false leaves a hook's divisor alone, as PyTorch: the hook run equals the no-hook run with true", function()
    -- PyTorch 1.13 (checked with Debian's torch, 2 gloo ranks, 5 and 8 batches):
    -- allreduce_hook with divide_by_initial_world_size = False trains exactly as no hook with
    -- True, and differs from no hook with False. ddplua divided the hook's bucket by the
    -- ranks still training instead.
    local ranks = run(HOOKED .. [[
local function train(hook, join_opts)
  local counts, data = {5, 8}, make_data({5, 8})
  local model = DDP(mlp(), {bucket_cap_mb = 0.0002})
  if hook then model:register_comm_hook(nil, hook) end
  local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
  model:join(join_opts, function()
    for s = 1, counts[RANK + 1] do
      opt:zero_grad()
      default_loss(model, data[RANK][s]):backward()
      opt:step()
    end
  end)
  return model.module
end
local plain_true = train(nil, {divide_by_initial_world_size = true})
local plain_false = train(nil, {divide_by_initial_world_size = false})
local hook_false = train(default.allreduce_hook, {divide_by_initial_world_size = false})
local lua_false = train(function(s, b) return default.allreduce_hook(s, b) end, {divide_by_initial_world_size = false})
local hook_live = train(default.allreduce_hook, {divide_by_initial_world_size = false, comm_hook_divide_by_non_joined = true})
out("hook_vs_true", max_rel(hook_false, plain_true))
out("lua_vs_true", max_rel(lua_false, plain_true))
out("hook_vs_false", max_rel(hook_false, plain_false))
out("live_vs_false", max_rel(hook_live, plain_false))
]], 2, { timeout = 90 })
    for i = 1, 2 do
      local o = ranks[i].out
      assert.is_not_nil(o.hook_vs_true, ranks[i].output)
      assert.is_true(tonumber(o.hook_vs_true) <= 1e-6, "rank " .. (i - 1) .. ": hook vs no hook (true) " .. o.hook_vs_true)
      assert.is_true(tonumber(o.lua_vs_true) <= 1e-6, "rank " .. (i - 1) .. ": Lua hook vs no hook (true) " .. o.lua_vs_true)
      assert.is_true(tonumber(o.hook_vs_false) > 1e-3, "rank " .. (i - 1) .. ": the two divisors must differ " .. o.hook_vs_false)
      -- the explicit option keeps the other divisor
      assert.is_true(tonumber(o.live_vs_false) <= 1e-6, "rank " .. (i - 1) .. ": option vs no hook (false) " .. o.live_vs_false)
    end
  end)

  it("powerSGD_hook: the joined rank's state advances as with zero gradients (equals a run without join)", function()
    -- Without join, rank 0 keeps stepping with a zero loss after its 5 batches: its hook
    -- sees zero buckets, which is what the joined rank's shadow must reproduce (PyTorch runs
    -- the hook on zeros). With error feedback and warm start the joined rank's P
    -- contributions are its error memory times its warm-started Q, so rank 1's weights,
    -- rank 0's error memories and both iteration counts must equal the run without join.
    local ranks = run(HOOKED .. [[
local psgd = dist.algorithms.ddp_comm_hooks.powerSGD_hook
local counts = {5, 8}
local data = make_data({8, 8})
local function train(with_join)
  local model = DDP(mlp(), {bucket_cap_mb = 0.0002})
  local state = psgd.PowerSGDState{matrix_approximation_rank = 1, start_powerSGD_iter = 2, random_seed = 7,
                                   min_compression_rate = 0}
  model:register_comm_hook(state, psgd.powerSGD_hook)
  local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
  local function step(s, scale)
    opt:zero_grad()
    local loss = default_loss(model, data[RANK][s]) * scale
    loss:backward()
    opt:step()
  end
  if with_join then
    model:join({}, function() for s = 1, counts[RANK + 1] do step(s, 1) end end)
  else
    for s = 1, 8 do step(s, s <= counts[RANK + 1] and 1 or 0) end
  end
  local errs = {}
  for k = 0, #model:buckets() - 1 do errs[#errs + 1] = state:error(k) end
  return tensors_text(model.module:parameters()), state:iter(), tensors_text(errs), #errs
end
local p1, it1, e1, nb = train(true)
local p0, it0, e0 = train(false)
out("params_join", p1); out("params_nojoin", p0)
out("iter_join", it1); out("iter_nojoin", it0)
out("errors_equal", tostring(e1 == e0)); out("errors_nonempty", tostring(#e1 > 0)); out("nb", nb)
]], 2, { timeout = 120 })
    for i = 1, 2 do
      local o = ranks[i].out
      assert.is_not_nil(o.params_join, ranks[i].output)
      assert.equal(o.params_nojoin, o.params_join)
      assert.equal("8", o.iter_join)
      assert.equal("8", o.iter_nojoin)
      assert.equal("true", o.errors_equal)
      assert.equal("true", o.errors_nonempty)
      assert.is_true(tonumber(o.nb) >= 3)
    end
    assert.equal(ranks[1].out.params_join, ranks[2].out.params_join)
  end)
end)



-- The device paths (Note [device buckets], Note [nccl work]) on the simulated device and its
-- simulated NCCL (build/libddplua_cuda_sim.so, DDPLUA_SIM_NCCL=1; see device_spec.lua): the
-- presence and join-state all-reduces, the zero buckets and the flags go through device
-- memory, and the weights still equal the CPU reference.
describe("ddp:join on the simulated NCCL #dist", function()
  it("ranks with 3 and 5 batches on cuda:0 and cuda:1 equal the CPU reference", function()
    local root = io.popen("pwd"):read("*l")
    local ranks = run([[
out("backend", dist.get_backend())
local counts = {3, 5}
local data = make_data(counts)
local model = DDP(module_to(mlp(), RANK), {device_ids = {RANK}, bucket_cap_mb = 0.0002,
                                           find_unused_parameters = true})
local opt = optim.SGD(model:parameters(), {lr = 0.1})
model:join({divide_by_initial_world_size = false}, function()
  for s = 1, counts[RANK + 1] do
    opt:zero_grad()
    mse(model(data[RANK][s][1]), to_dev(data[RANK][s][2], RANK)):backward()
    opt:step()
  end
end)
local host = {}
for i, p in ipairs(model.module:parameters()) do host[i] = to_dev(p, -1) end
out("device", model.module:parameters()[1].device)
out("params", tensors_text(host))
out("buckets", "-")
local ref = reference(mlp, data, counts, false, {lr = 0.1}, default_loss):parameters()
local worst = 0
for i = 1, #ref do
  worst = math.max(worst, (host[i] - ref[i]):abs():max():item() / ref[i]:abs():max():item())
end
out("max_rel", worst)
]], 2, { init = '{backend = "nccl", device_id = tonumber(os.getenv("RANK")), timeout = 20}',
            env = { DDPLUA_CUDA_PLUGIN = root .. "/build/libddplua_cuda_sim.so", DDPLUA_SIM_NCCL = "1" } })
    check_reference(ranks)
    assert.equal("nccl", ranks[1].out.backend)
    assert.equal("cuda:0", ranks[1].out.device)
    assert.equal("cuda:1", ranks[2].out.device)
  end)
end)
