-- Specs for DistributedDataParallel's optimizer in backward (ddp:_register_fused_optim /
-- ddp:register_optimizer_in_backward; Note [optimizer in backward] in
-- ddplua/reducer_fused_optim.h) with 2 real ranks on 127.0.0.1.
--
-- The reference is the plain path in the same processes: a second DDP of the same model
-- (same seed) trained with backward then the Lua optimizer's step. The fused path must give
-- the same weights BIT FOR BIT (digests of the raw bytes, ddp_tensor_digest), and the plain
-- path itself must match one process on the whole batch (as ddp_spec.lua checks), so the
-- fused one does too.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  helpers = { "batches", "shard", "mse", "max_abs", "device" },
} .. [[
local lib = require "ddplua.lib"
-- 6-32-24-4: wider than ddp_ranks' mlp, so a small bucket cap gives several buckets.
function mlp()
  dl.manual_seed(1)
  return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, 4))
end
local box = lib.ffi.new("uint64_t[1]")
-- Digests of the raw bytes of every parameter (bitwise comparison).
function digests(m)
  local parts = {}
  for _, p in ipairs(m:parameters()) do
    lib.check(lib.C.ddp_tensor_digest(box, p))
    parts[#parts + 1] = tostring(box[0])
  end
  return table.concat(parts, ",")
end
-- k steps of the plain path and of the fused path with optimizer class cls and options (and
-- the comm hook `hook` on both, when given); prints whether they are bitwise equal, the
-- largest difference, and the fused .grad state.
function compare(tag, cls, args, k, ddp_opts, hook)
  local xs, ys = batches(k, 8, {6}, 4)
  local plain = DDP(mlp(), ddp_opts)
  local opt = cls(plain:parameters(), args)
  local fused = DDP(mlp(), ddp_opts)
  if hook then
    plain:register_comm_hook(nil, hook)
    fused:register_comm_hook(nil, hook)
  end
  fused:register_optimizer_in_backward(cls, args)
  local grads_nil, bucket_steps = true, 0
  for s = 1, k do
    opt:zero_grad()
    mse(plain(shard(xs[s])), shard(ys[s])):backward()
    opt:step()
    local loss = mse(fused(shard(xs[s])), shard(ys[s]))
    bucket_steps = bucket_steps + #fused:buckets() -- after the forward (which may rebuild)
    loss:backward()
    for _, p in ipairs(fused:parameters()) do grads_nil = grads_nil and p.grad == nil end
  end
  out(tag .. "_bitwise", tostring(digests(plain.module) == digests(fused.module)))
  out(tag .. "_maxabs", max_abs(plain.module, fused.module))
  out(tag .. "_moved", max_abs(fused.module, mlp()))
  out(tag .. "_grads_nil", tostring(grads_nil))
  local during, at_end = fused:fused_optim_counts()
  out(tag .. "_steps", during + at_end)
  out(tag .. "_buckets", #fused:buckets())
  out(tag .. "_bucket_steps", bucket_steps)
  out(tag .. "_during", during)
  out(tag .. "_digest", digests(fused.module))
  plain:destroy()
  fused:destroy()
end
]]

local root = io.popen("pwd"):read("*l")

local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

local function check_same(ranks, tag, k)
  for i = 1, 2 do
    local o = ranks[i].out
    assert.equal("true", o[tag .. "_bitwise"], tag .. ": max |plain - fused| = " .. tostring(o[tag .. "_maxabs"]))
    assert.is_true(tonumber(o[tag .. "_moved"]) > 1e-4, tag .. ": the fused path did not train")
    assert.equal("true", o[tag .. "_grads_nil"])
    -- every bucket stepped once per iteration
    assert.equal(o[tag .. "_bucket_steps"], o[tag .. "_steps"])
  end
  assert.equal(ranks[1].out[tag .. "_digest"], ranks[2].out[tag .. "_digest"])
end

describe("ddplua.distributed.ddp optimizer in backward #dist", function()
  it("SGD (momentum, weight decay, nesterov) and Adam/AdamW: bitwise the plain path", function()
    local code = [[
compare("sgd", optim.SGD, {lr = 0.1, momentum = 0.9}, 4, {bucket_cap_mb = 0.0005})
compare("sgd_wd_nesterov", optim.SGD, {lr = 0.05, momentum = 0.8, weight_decay = 0.01, nesterov = true}, 3, {bucket_cap_mb = 0.0005})
compare("adam", optim.Adam, {lr = 0.01}, 4, {bucket_cap_mb = 0.0005})
compare("adamw_amsgrad", optim.AdamW, {lr = 0.01, weight_decay = 0.1, amsgrad = true}, 3, {})
compare("sgd_view", optim.SGD, {lr = 0.1, momentum = 0.9}, 3, {bucket_cap_mb = 0.0005, gradient_as_bucket_view = true})
compare("adam_static", optim.Adam, {lr = 0.01}, 3, {bucket_cap_mb = 0.0005, static_graph = true})
compare("sgd_find_unused", optim.SGD, {lr = 0.1, momentum = 0.9}, 3, {bucket_cap_mb = 0.0005, find_unused_parameters = true})
local hooks = dist.algorithms.ddp_comm_hooks.default_hooks
compare("sgd_fp16_hook", optim.SGD, {lr = 0.1, momentum = 0.9}, 3, {bucket_cap_mb = 0.0005}, hooks.fp16_compress_hook)
compare("adam_allreduce_hook", optim.Adam, {lr = 0.01}, 3, {bucket_cap_mb = 0.0005}, hooks.allreduce_hook)
]]
    local ranks = run(code)
    check_same(ranks, "sgd", 4)
    check_same(ranks, "sgd_wd_nesterov", 3)
    check_same(ranks, "adam", 4)
    check_same(ranks, "adamw_amsgrad", 3)
    check_same(ranks, "sgd_view", 3)
    check_same(ranks, "adam_static", 3)
    check_same(ranks, "sgd_find_unused", 3)
    check_same(ranks, "sgd_fp16_hook", 3)        -- with a comm hook: stepped after its waits
    check_same(ranks, "adam_allreduce_hook", 3)
    assert.is_true(tonumber(ranks[1].out.sgd_buckets) >= 3, "buckets: " .. ranks[1].out.sgd_buckets)
  end)

  -- Device buckets (Note [device buckets]) on the simulated device (host memory, CPU
  -- kernels: build/libddplua_cuda_sim.so) with gloo staging and with the simulated NCCL,
  -- whose work completes on its own stream: polling and stepping on the device.
  for _, backend in ipairs { "gloo", "nccl" } do
    it("device parameters (simulated device, " .. backend .. "): bitwise the plain path", function()
      local code = [[
local xs, ys = batches(3, 8, {6}, 4)
local results = {}
for _, cls in ipairs {optim.SGD, optim.Adam} do
  local args = cls == optim.SGD and {lr = 0.1, momentum = 0.9} or {lr = 0.01}
  local opts = {device_ids = {RANK}, bucket_cap_mb = 0.0005}
  local plain = DDP(module_to(mlp(), RANK), opts)
  local opt = cls(plain:parameters(), args)
  local fused = DDP(module_to(mlp(), RANK), opts):register_optimizer_in_backward(cls, args)
  for s = 1, #xs do
    opt:zero_grad()
    mse(plain(shard(xs[s])), shard(ys[s]):to(plain.module:parameters()[1].device)):backward()
    opt:step()
    mse(fused(shard(xs[s])), shard(ys[s]):to(fused.module:parameters()[1].device)):backward()
  end
  results[#results + 1] = cls.name .. "=" .. tostring(digests(plain.module) == digests(fused.module))
  out("device_" .. cls.name, fused.module:parameters()[1].device)
end
out("bitwise", table.concat(results, " "))
out("backend", dist.get_backend())
]]
      local init = backend == "nccl" and '{backend = "nccl", device_id = tonumber(os.getenv("RANK")), timeout = 20}' or nil
      local ranks = run(code, 2, { init = init, env = { DDPLUA_CUDA_PLUGIN = root .. "/build/libddplua_cuda_sim.so",
                                                        DDPLUA_SIM_NCCL = backend == "nccl" and "1" or nil } })
      for i = 1, 2 do
        assert.equal("SGD=true Adam=true", ranks[i].out.bitwise)
        assert.equal("cuda:" .. (i - 1), ranks[i].out.device_SGD)
        assert.equal(backend, ranks[i].out.backend)
      end
    end)
  end

  it("no_sync accumulation, then a synced backward, steps once on the summed gradients", function()
    local code = [[
local xs, ys = batches(2, 8, {6}, 4)
local plain = DDP(mlp())
local opt = optim.SGD(plain:parameters(), {lr = 0.1, momentum = 0.9})
local fused = DDP(mlp()):_register_fused_optim(optim.SGD, {lr = 0.1, momentum = 0.9})
for _, m in ipairs {plain, fused} do
  if m == plain then opt:zero_grad() end
  m:no_sync(function() mse(m(shard(xs[1])), shard(ys[1])):backward() end)
  mse(m(shard(xs[2])), shard(ys[2])):backward()
  if m == plain then opt:step() end
end
out("bitwise", tostring(digests(plain.module) == digests(fused.module)))
]]
    local ranks = run(code)
    for i = 1, 2 do assert.equal("true", ranks[i].out.bitwise) end
  end)

  it("raises for an unsupported optimizer, a second registration, and after the first backward", function()
    local code = [[
local m = DDP(mlp())
try("unsupported", function() m:_register_fused_optim(optim.Adadelta, {lr = 1}) end)
try("not_a_class", function() m:_register_fused_optim("SGD", {lr = 1}) end)
try("bad_option", function() m:_register_fused_optim(optim.SGD, {lr = 0.1, momentun = 0.9}) end)
try("bad_value", function() m:_register_fused_optim(optim.Adam, {lr = -1}) end)
try("first", function() m:_register_fused_optim(optim.SGD, {lr = 0.1}) end)
try("twice", function() m:register_optimizer_in_backward(optim.Adam, {lr = 0.1}) end)
try("set_lr", function() m:fused_optim_set_lr(0.05) end)
local late = DDP(mlp())
mse(late(dl.randn({2, 6})), dl.randn({2, 4})):backward()
try("late", function() late:_register_fused_optim(optim.SGD, {lr = 0.1}) end)
try("set_lr_none", function() late:fused_optim_set_lr(0.05) end)
]]
    local ranks = run(code)
    for i = 1, 2 do
      local e = ranks[i].err
      assert.matches("optimizer Adadelta is not supported in backward (supported: optim.SGD, optim.Adam, optim.AdamW)", e.unsupported, 1, true)
      assert.matches("optimizer string is not supported", e.not_a_class, 1, true)
      assert.matches("SGD: unknown option 'momentun' (did you mean 'momentum'?", e.bad_option, 1, true)
      assert.matches("Adam: invalid lr -1", e.bad_value, 1, true)
      assert.equal("no error", e.first)
      assert.matches("an optimizer in backward is already registered on rank " .. (i - 1), e.twice, 1, true)
      assert.equal("no error", e.set_lr)
      assert.matches("register the optimizer before the first backward (rank " .. (i - 1) ..
                     " has reduced 1 iterations)", e.late, 1, true)
      assert.matches("no optimizer in backward is registered", e.set_lr_none, 1, true)
    end
  end)

  -- A checkpoint of the optimizer in backward (ddp:fused_optim_state_dict /
  -- fused_optim_load_state_dict): 3 steps, save, a fresh DDP (registered with another lr,
  -- which the load replaces) loads and runs 2 more: bitwise the 5 uninterrupted steps; and
  -- the state dict is the plain Lua optimizer's after the same 3 steps (same ids and keys,
  -- the same values).
  it("state_dict / load_state_dict: a resumed run is bitwise the uninterrupted one, in the Lua optimizer's format", function()
    local code = [[
-- "same" when the two state dicts have the same ids, keys and values (tensors within 1e-6),
-- else the first difference.
local function keys(t) local ks = {} for k in pairs(t) do ks[#ks + 1] = tostring(k) end table.sort(ks) return table.concat(ks, ",") end
local function compare_sd(a, b)
  if keys(a.state) ~= keys(b.state) then return "state ids " .. keys(a.state) .. " vs " .. keys(b.state) end
  local worst = 0
  for id, st in pairs(a.state) do
    local o = b.state[id]
    if keys(st) ~= keys(o) then return ("state %s: keys %s vs %s"):format(id, keys(st), keys(o)) end
    for k, v in pairs(st) do
      if dl.is_tensor(v) then worst = math.max(worst, (v - o[k]):abs():max():item())
      elseif v ~= o[k] then return ("state %s %s: %s vs %s"):format(id, k, tostring(v), tostring(o[k])) end
    end
  end
  local ga, gb = a.param_groups[1], b.param_groups[1]
  if #a.param_groups ~= 1 or #b.param_groups ~= 1 then return "groups" end
  if keys(ga) ~= keys(gb) then return "group keys " .. keys(ga) .. " vs " .. keys(gb) end
  for k, v in pairs(ga) do
    if type(v) ~= "table" and v ~= gb[k] then return ("group %s: %s vs %s"):format(k, tostring(v), tostring(gb[k])) end
  end
  if table.concat(ga.params, ",") ~= table.concat(gb.params, ",") then return "param ids" end
  return worst <= 1e-6 and ("same " .. #ga.params) or ("max diff " .. worst)
end
local xs, ys = batches(5, 8, {6}, 4)
local opts = {bucket_cap_mb = 0.0005}
local function steps(m, from, to) for s = from, to do mse(m(shard(xs[s])), shard(ys[s])):backward() end end
for _, case in ipairs { {optim.SGD, {lr = 0.1, momentum = 0.9}}, {optim.Adam, {lr = 0.01, amsgrad = true}},
                        {optim.AdamW, {lr = 0.01, weight_decay = 0.1}} } do
  local cls, args = case[1], case[2]
  local whole = DDP(mlp(), opts):register_optimizer_in_backward(cls, args)
  steps(whole, 1, 5)
  local first = DDP(mlp(), opts):register_optimizer_in_backward(cls, args)
  steps(first, 1, 3)
  local sd = first:fused_optim_state_dict()
  local weights = first:state_dict()
  local plain = DDP(mlp(), opts)
  local opt = cls(plain:parameters(), args)
  for s = 1, 3 do
    opt:zero_grad()
    mse(plain(shard(xs[s])), shard(ys[s])):backward()
    opt:step()
  end
  out(cls.name .. "_format", compare_sd(sd, opt:state_dict()))
  local m = mlp()
  m:load_state_dict(weights)
  local resumed = DDP(m, opts):register_optimizer_in_backward(cls, {lr = 0.5})
  resumed:fused_optim_load_state_dict(sd)
  steps(resumed, 4, 5)
  out(cls.name .. "_resumed", tostring(digests(whole.module) == digests(resumed.module)))
  -- the plain optimizer's own state dict loads the same way
  local m2 = mlp()
  m2:load_state_dict(weights)
  local from_plain = DDP(m2, opts):register_optimizer_in_backward(cls, args)
  from_plain:fused_optim_load_state_dict(opt:state_dict())
  steps(from_plain, 4, 5)
  out(cls.name .. "_from_plain", tostring(digests(whole.module) == digests(from_plain.module)))
  for _, d in ipairs {whole, first, plain, resumed, from_plain} do d:destroy() end
end
]]
    local ranks = run(code)
    for i = 1, 2 do
      local o = ranks[i].out
      for _, name in ipairs { "SGD", "Adam", "AdamW" } do
        assert.equal("same 6", o[name .. "_format"], name)
        assert.equal("true", o[name .. "_resumed"], name)
        assert.equal("true", o[name .. "_from_plain"], name)
      end
    end
  end)

  -- Note [optimizer state store]: the optimizer in backward keeps its state in the store the
  -- Lua optimizers keep theirs in, stepped by the same C step function: after the same
  -- steps, its state (ddp:fused_optim_state(), a view like opt.state) and its state dict
  -- (the Lua optimizer's state_dict over the reducer's store) are the plain optimizer's
  -- BIT FOR BIT, entry by entry, names in the same order.
  it("its state is the Lua optimizer's bit for bit, through the same store and state_dict code", function()
    local code = [[
local function digest(t)
  lib.check(lib.C.ddp_tensor_digest(box, t))
  return tostring(box[0])
end
-- "same N" when the two views hold the same entries (names in order, tensors bitwise,
-- numbers equal) for the parameters lists a and b, else the first difference.
local function compare_views(va, a, vb, b)
  local n = 0
  for i = 1, #a do
    local ea, eb = va[a[i] ], vb[b[i] ]
    if (ea == nil) ~= (eb == nil) then return "entry " .. i end
    if ea then
      n = n + 1
      local na, nb = {}, {}
      for name, v in ea:items() do na[#na + 1] = name .. "=" .. (dl.is_tensor(v) and digest(v) or tostring(v)) end
      for name, v in eb:items() do nb[#nb + 1] = name .. "=" .. (dl.is_tensor(v) and digest(v) or tostring(v)) end
      if table.concat(na, ",") ~= table.concat(nb, ",") then
        return ("entry %d: %s vs %s"):format(i, table.concat(na, ","), table.concat(nb, ","))
      end
    end
  end
  return "same " .. n
end
-- "same N" when two state dicts hold bitwise-equal state for the same ids.
local function compare_sd(a, b)
  local n = 0
  for id, st in pairs(a.state) do
    local o = b.state[id]
    if o == nil then return "id " .. id end
    for k, v in pairs(st) do
      local w = o[k]
      if dl.is_tensor(v) then if digest(v) ~= digest(w) then return ("id %s %s"):format(id, k) end
      elseif v ~= w then return ("id %s %s: %s vs %s"):format(id, k, tostring(v), tostring(w)) end
    end
    n = n + 1
  end
  for id in pairs(b.state) do if a.state[id] == nil then return "id " .. id .. " missing" end end
  return "same " .. n
end
local xs, ys = batches(3, 8, {6}, 4)
local opts = {bucket_cap_mb = 0.0005}
for _, case in ipairs { {optim.SGD, {lr = 0.1, momentum = 0.9, nesterov = true}}, {optim.Adam, {lr = 0.01, amsgrad = true}},
                        {optim.AdamW, {lr = 0.01, weight_decay = 0.1}} } do
  local cls, args = case[1], case[2]
  local fused = DDP(mlp(), opts):register_optimizer_in_backward(cls, args)
  local plain = DDP(mlp(), opts)
  local opt = cls(plain:parameters(), args)
  for s = 1, 3 do
    mse(fused(shard(xs[s])), shard(ys[s])):backward()
    opt:zero_grad()
    mse(plain(shard(xs[s])), shard(ys[s])):backward()
    opt:step()
  end
  local state = fused:fused_optim_state()
  out(cls.name .. "_count", state:count())
  out(cls.name .. "_views", compare_views(state, fused:parameters(), opt.state, plain:parameters()))
  out(cls.name .. "_sd", compare_sd(fused:fused_optim_state_dict(), opt:state_dict()))
  -- the view is the state the next step reads: zeroing a tensor in place shows in the step
  local p = fused:parameters()[1]
  local name = cls == optim.SGD and "momentum_buffer" or "exp_avg"
  state[p][name]:zero_()
  out(cls.name .. "_zeroed", tostring(fused:fused_optim_state_dict().state[0][name]:abs():max():item() == 0))
  fused:destroy()
  plain:destroy()
end
]]
    local ranks = run(code)
    for i = 1, 2 do
      local o = ranks[i].out
      for _, name in ipairs { "SGD", "Adam", "AdamW" } do
        assert.equal("6", o[name .. "_count"], name)
        assert.equal("same 6", o[name .. "_views"], name)
        assert.equal("same 6", o[name .. "_sd"], name)
        assert.equal("true", o[name .. "_zeroed"], name)
      end
    end
  end)

  it("load_state_dict raises, changing nothing, for another optimizer's state dict or another shape", function()
    local code = [[
local xs, ys = batches(1, 8, {6}, 4)
local m = DDP(mlp()):register_optimizer_in_backward(optim.SGD, {lr = 0.1, momentum = 0.9})
mse(m(shard(xs[1])), shard(ys[1])):backward()
local before = m:fused_optim_state_dict()
local adam = DDP(mlp()):register_optimizer_in_backward(optim.Adam, {lr = 0.01})
mse(adam(shard(xs[1])), shard(ys[1])):backward()
try("adam_into_sgd", function() m:fused_optim_load_state_dict(adam:fused_optim_state_dict()) end)
local extra = m:fused_optim_state_dict()
extra.state[1].exp_avg = extra.state[1].momentum_buffer
try("foreign_key", function() m:fused_optim_load_state_dict(extra) end)
local shaped = m:fused_optim_state_dict()
shaped.state[2].momentum_buffer = dl.zeros({3})
try("shape", function() m:fused_optim_load_state_dict(shaped) end)
try("not_a_table", function() m:fused_optim_load_state_dict(3) end)
local none = DDP(mlp())
try("none_save", function() none:fused_optim_state_dict() end)
try("none_load", function() none:fused_optim_load_state_dict(before) end)
local after = m:fused_optim_state_dict()
local same = true
for id, st in pairs(before.state) do
  same = same and (st.momentum_buffer - after.state[id].momentum_buffer):abs():max():item() == 0
end
out("unchanged", tostring(same and after.param_groups[1].lr == 0.1))
]]
    local ranks = run(code)
    for i = 1, 2 do
      local e = ranks[i].err
      assert.matches("fused_optim_load_state_dict: loaded param group 1 has options 'amsgrad', 'betas', 'eps', which SGD does not have", e.adam_into_sgd, 1, true)
      assert.matches("the loaded state of parameter 1 (0.bias) has 'exp_avg', which SGD does not keep", e.foreign_key, 1, true)
      assert.matches("the loaded state of parameter 2 (2.weight): momentum_buffer has shape (3), the parameter (24, 32)", e.shape, 1, true)
      assert.matches("expects a table {state = ..., param_groups = ...}", e.not_a_table, 1, true)
      assert.matches("fused_optim_state_dict: no optimizer in backward is registered", e.none_save, 1, true)
      assert.matches("fused_optim_load_state_dict: no optimizer in backward is registered", e.none_load, 1, true)
      assert.equal("true", ranks[i].out.unchanged)
    end
  end)
end)
