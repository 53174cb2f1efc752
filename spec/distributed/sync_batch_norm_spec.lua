-- Specs for nn.SyncBatchNorm and nn.SyncBatchNorm.convert_sync_batchnorm
-- (lua/ddplua/nn/sync_batch_norm.lua, sync_batch_norm_function.lua over the differentiable
-- collectives of ddplua.distributed.nn.functional), with real ranks on
-- 127.0.0.1 (spec/helpers/multiproc.lua).
--
-- The reference: every rank builds the same global batch (seeded), takes its own slice of
-- it (slices may have different sizes), and also runs nn.BatchNorm on the whole batch in
-- one process; SyncBatchNorm on the slices must give that reference's output, input
-- gradient, parameter gradients (summed over ranks: they stay local to each rank) and
-- running statistics, in f64, within 1e-12.
local ddp_ranks = require "ddp_ranks"
local files = require "files"
local dl = require "ddplua"
local nn = require "ddplua.nn"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local PRELUDE = ddp_ranks.prelude() .. [[
function maxdiff(a, b)
  if a:numel() == 0 and b:numel() == 0 then return 0 end
  return (a:to("f64") - b:to("f64")):abs():max():item()
end
-- Rank r's slice of a global batch cut into pieces of the given sizes (first dim).
function slice(t, sizes, rank)
  local start = 1
  for r = 0, rank - 1 do start = start + sizes[r + 1] end
  return t:narrow(1, start, sizes[rank + 1])
end
function total(sizes) local n = 0; for _, s in ipairs(sizes) do n = n + s end; return n end
-- A layer with non-trivial affine parameters (seeded: the same on every rank).
function make(cls, C, opts)
  dl.manual_seed(5)
  local m = cls(C, opts)
  if m.weight then
    dl.no_grad(function()
      m.weight:copy_(dl.randn({C}, {dtype = "f64"}) * 0.5 + 1)
      m.bias:copy_(dl.randn({C}, {dtype = "f64"}))
    end)
  end
  return m
end
]]

-- run(code, n, opts): spec/helpers/ddp_ranks.lua's (opts.init: Lua source of
-- init_process_group's options, default gloo; opts.env; opts.expect_failure).
local run = ddp_ranks.runner(PRELUDE, { timeout = 40 })

-- The equivalence body: `steps` training steps of SyncBatchNorm on this rank's slice against
-- BatchNorm (class ref_cls) on the global batch; prints the largest difference of each
-- compared quantity over the steps. shape: the per-sample shape {C, ...}; opts: the
-- layers' options.
local function equivalence(sizes, shape, ref_cls, opts, steps)
  return ([[
local sizes, shape, opts = %s, %s, %s
local C = shape[1]
local sync = make(nn.SyncBatchNorm, C, opts)
local ref = make(nn.%s, C, opts)
local worst = {y = 0, dx = 0, dw = 0, db = 0, rm = 0, rv = 0, nbt = 0}
local function note(k, v) worst[k] = math.max(worst[k], v) end
for step = 1, %d do
  dl.manual_seed(100 + step)
  local gshape = {total(sizes)}
  for _, d in ipairs(shape) do gshape[#gshape + 1] = d end
  local X = dl.randn(gshape, {dtype = "f64"}) * 2 + 3           -- mean 3: not centred
  local G = dl.randn(gshape, {dtype = "f64"})                   -- the upstream gradient
  -- reference: the whole batch in one process
  local Xr = X:clone():requires_grad_()
  local Yr = ref(Xr)
  ;(Yr * G):sum():backward()
  -- this rank's slice through SyncBatchNorm
  local x = slice(X, sizes, RANK):clone():requires_grad_()
  local y = sync(x)
  ;(y * slice(G, sizes, RANK)):sum():backward()
  note("y", maxdiff(y, slice(Yr, sizes, RANK)))
  note("dx", maxdiff(x.grad or dl.zeros_like(x), slice(Xr.grad, sizes, RANK))) -- no grad for an empty slice
  if sync.weight then -- local gradients: their sum over the ranks is the global one
    local gw, gb = sync.weight.grad:clone(), sync.bias.grad:clone()
    dist.all_reduce(gw); dist.all_reduce(gb)
    note("dw", maxdiff(gw, ref.weight.grad)); note("db", maxdiff(gb, ref.bias.grad))
    sync.weight.grad, sync.bias.grad, ref.weight.grad, ref.bias.grad = nil, nil, nil, nil
  end
  if sync.running_mean then
    note("rm", maxdiff(sync.running_mean, ref.running_mean))
    note("rv", maxdiff(sync.running_var, ref.running_var))
    note("nbt", math.abs(sync.num_batches_tracked:item() - ref.num_batches_tracked:item()))
  end
end
for k, v in pairs(worst) do out(k, string.format("%%.3e", v)) end
]]):format(sizes, shape, opts, ref_cls, steps or 3)
end

local function check_equivalence(ranks, n, keys)
  for i = 1, n do
    for _, k in ipairs(keys) do
      local v = tonumber(ranks[i].out[k])
      assert.is_not_nil(v, ("rank %d printed no %s"):format(i - 1, k))
      assert.is_true(v <= 1e-12, ("rank %d: largest difference of %s is %g"):format(i - 1, k, v))
    end
  end
end

local ALL = { "y", "dx", "dw", "db", "rm", "rv", "nbt" }

describe("nn.SyncBatchNorm #dist", function()
  it("2 ranks, equal batches (N, C, H, W): output, gradients and running stats equal BatchNorm2d on the whole batch", function()
    local ranks = run(equivalence("{4, 4}", "{3, 2, 3}", "BatchNorm2d", "{dtype = 'f64'}"), 2)
    check_equivalence(ranks, 2, ALL)
  end)

  it("2 ranks, unequal batches 3 and 5: still the global batch's statistics", function()
    local ranks = run(equivalence("{3, 5}", "{3, 2, 2}", "BatchNorm2d", "{dtype = 'f64'}"), 2)
    check_equivalence(ranks, 2, ALL)
  end)

  it("2 ranks, (N, C) and (N, C, L) inputs, momentum = false (cumulative average), unequal batches", function()
    local ranks = run(equivalence("{2, 7}", "{4}", "BatchNorm1d", "{dtype = 'f64', momentum = false}", 4), 2)
    check_equivalence(ranks, 2, ALL)
    ranks = run(equivalence("{5, 1}", "{2, 3}", "BatchNorm1d", "{dtype = 'f64', momentum = 0.3}"), 2)
    check_equivalence(ranks, 2, ALL)
  end)

  it("2 ranks, a wide layer (C = 70000: the rows go through all_gather, not the padded all-reduce)", function()
    local ranks = run(equivalence("{2, 3}", "{70000}", "BatchNorm1d", "{dtype = 'f64'}", 2), 2)
    check_equivalence(ranks, 2, ALL)
  end)

  it("2 ranks, affine = false and track_running_stats = false", function()
    local ranks = run(equivalence("{3, 4}", "{2, 2}", "BatchNorm1d",
      "{dtype = 'f64', affine = false, track_running_stats = false}"), 2)
    check_equivalence(ranks, 2, { "y", "dx" })
    assert.equal("0.000e+00", ranks[1].out.rm) -- no running stats to compare
  end)

  it("3 ranks, one of them with an empty batch", function()
    local ranks = run(equivalence("{3, 0, 4}", "{2, 3}", "BatchNorm1d", "{dtype = 'f64'}"), 3)
    check_equivalence(ranks, 3, ALL)
  end)

  it("process_group: 3 ranks, a group {0, 1} synchronises its two batches, rank 2's own group of one is BatchNorm", function()
    local ranks = run([[
local g01, g2 = dist.new_group({0, 1}), dist.new_group({2})
local group = RANK < 2 and g01 or g2
local model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(make(nn.BatchNorm2d, 3, {dtype = "f64"})), group)
local ref = make(nn.BatchNorm2d, 3, {dtype = "f64"})
dl.manual_seed(11)
local X = dl.randn({9, 3, 2, 2}, {dtype = "f64"})
local sizes = {2, 4, 3}
local x = slice(X, sizes, RANK):clone():requires_grad_()
local mine = RANK < 2 and X:narrow(1, 1, 6) or slice(X, sizes, 2)   -- what this rank's group sees
local Xr = mine:clone():requires_grad_()
local y, yr = model(x), ref(Xr)
y:pow(2):sum():backward()                        -- the backward's all-reduce on the subgroup
yr:pow(2):sum():backward()
local gpart = RANK < 2 and slice(Xr.grad, {2, 4}, RANK) or Xr.grad
out("dx", string.format("%.3e", maxdiff(x.grad, gpart)))
local part = RANK < 2 and slice(yr, {2, 4}, RANK) or yr
out("y", string.format("%.3e", maxdiff(y, part)))
out("rv", string.format("%.3e", maxdiff(model[1].running_var, ref.running_var)))
out("grad_fn", tostring(y.grad_fn))
]], 3)
    for i = 1, 3 do
      assert.is_true(tonumber(ranks[i].out.y) <= 1e-12, ranks[i].out.y)
      assert.is_true(tonumber(ranks[i].out.rv) <= 1e-12, ranks[i].out.rv)
      assert.is_true(tonumber(ranks[i].out.dx) <= 1e-12, ranks[i].out.dx)
    end
    -- ranks 0 and 1 went through the synchronised graph (made of differentiable ops and
    -- collectives since it left autograd.Function: its last node is the normalisation's,
    -- where PyTorch names one SyncBatchNormBackward), rank 2 through BatchNorm's own node
    assert.equal("BatchNormElemtBackward", ranks[1].out.grad_fn)
    assert.equal("BatchNormBackward", ranks[3].out.grad_fn)
  end)

  it("gradients match finite differences of the global loss (inputs on both ranks, weight, bias)", function()
    local ranks = run([[
local sizes, C = {3, 5}, 2
local sync = make(nn.SyncBatchNorm, C, {dtype = "f64"})
dl.manual_seed(7)
local X = dl.randn({total(sizes), C, 3}, {dtype = "f64"})
local G = dl.randn({total(sizes), C, 3}, {dtype = "f64"})
local x = slice(X, sizes, RANK):clone():requires_grad_()
local g = slice(G, sizes, RANK)
-- the global loss sum over ranks of sum(y * g), evaluated collectively
local function loss()
  local l = dl.no_grad(function() return (sync(x) * g):sum() end)
  local t = dl.tensor({l:item()}, {dtype = "f64"})
  dist.all_reduce(t)
  return t:item()
end
;(sync(x) * g):sum():backward()
local gw, gb = sync.weight.grad:clone(), sync.bias.grad:clone()
dist.all_reduce(gw); dist.all_reduce(gb)
local h, worst = 1e-6, 0
local function fd(t, i, analytic) -- every rank perturbs t (its own x, or the shared weight)
  local e = t:view({-1}):narrow(1, i, 1)
  local v = e:item()
  dl.no_grad(function() e:fill_(v + h) end); local lp = loss()
  dl.no_grad(function() e:fill_(v - h) end); local lm = loss()
  dl.no_grad(function() e:fill_(v) end)
  local num = (lp - lm) / (2 * h)
  worst = math.max(worst, math.abs(num - analytic) / math.max(1, math.abs(num)))
end
-- x: each rank in turn perturbs its elements while the other only takes part
for owner = 0, 1 do
  local n = sizes[owner + 1] * C * 3
  for i = 1, n, 2 do
    local analytic = RANK == owner and x.grad:view({-1}):tolist()[i] or 0
    if RANK == owner then fd(x, i, analytic) else loss(); loss() end
  end
end
for i = 1, C do fd(sync.weight, i, gw:tolist()[i]); fd(sync.bias, i, gb:tolist()[i]) end
out("worst", string.format("%.3e", worst))
]], 2)
    for i = 1, 2 do
      local v = tonumber(ranks[i].out.worst)
      assert.is_not_nil(v)
      assert.is_true(v < 1e-6, ("rank %d: finite differences differ by %g"):format(i - 1, v))
    end
  end)

  it("eval mode uses the running stats without communicating", function()
    local ranks = run([[
local sync = make(nn.SyncBatchNorm, 3, {dtype = "f64"})
local ref = make(nn.BatchNorm2d, 3, {dtype = "f64"})
dl.manual_seed(9 + RANK)
sync(dl.randn({2 + RANK, 3, 2, 2}, {dtype = "f64"}))     -- training: running stats move
dl.no_grad(function()
  ref.running_mean:copy_(sync.running_mean); ref.running_var:copy_(sync.running_var)
end)
sync:eval(); ref:eval()
if RANK == 0 then -- rank 1 does not call it: a collective here would meet rank 1's barrier
  local x = dl.randn({4, 3, 2, 2}, {dtype = "f64"}):requires_grad_()
  local y = sync(x)
  local xr = x:detach():clone():requires_grad_()
  local yr = ref(xr)
  y:sum():backward(); yr:sum():backward()
  out("y", maxdiff(y, yr)); out("dx", maxdiff(x.grad, xr.grad))
end
dist.barrier()
out("done", "yes")
]], 2)
    assert.equal("0", ranks[1].out.y)
    assert.equal("0", ranks[1].out.dx)
    assert.equal("yes", ranks[2].out.done)
  end)

  it("a group of one rank behaves exactly as BatchNorm", function()
    local ranks = run([[
local sync = make(nn.SyncBatchNorm, 3, {dtype = "f64"})
local ref = make(nn.BatchNorm2d, 3, {dtype = "f64"})
dl.manual_seed(3)
local x = dl.randn({5, 3, 2, 2}, {dtype = "f64"})
local xs, xr = x:clone():requires_grad_(), x:clone():requires_grad_()
local y, yr = sync(xs), ref(xr)
y:pow(2):sum():backward(); yr:pow(2):sum():backward()
out("diff", math.max(maxdiff(y, yr), maxdiff(xs.grad, xr.grad), maxdiff(sync.weight.grad, ref.weight.grad),
  maxdiff(sync.running_var, ref.running_var)))
out("grad_fn", tostring(y.grad_fn))
]], 1)
    assert.equal("0", ranks[1].out.diff)
    assert.equal("BatchNormBackward", ranks[1].out.grad_fn) -- the plain batch norm op, no collective
  end)

  it("after DDP training with converted BatchNorm the replicas' running stats are identical (ddplua verify), unlike BatchNorm's", function()
    local dir = files.tmpdir("syncbn")
    finally(function() files.remove(dir) end)
    local code = [[
local train_state = require "ddplua.train_state"
local function net()
  dl.manual_seed(1)
  return nn.Sequential(nn.Conv2d(2, 4, 3, {padding = 1}), nn.BatchNorm2d(4), nn.ReLU(),
    nn.Flatten(), nn.Linear(4 * 4 * 4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)):to("f64")
end
local sync_bn = os.getenv("SYNC_BN") == "1"
local model = net()
if sync_bn then model = nn.SyncBatchNorm.convert_sync_batchnorm(model) end
local ddp = DDP(model, {broadcast_buffers = false})   -- nothing else keeps the buffers alike
local opt = optim.SGD(ddp:parameters(), {lr = 0.1, momentum = 0.9})
-- the reference: one process, plain BatchNorm, the whole batch
local ref = net()
local ropt = optim.SGD(ref:parameters(), {lr = 0.1, momentum = 0.9})
local sizes = {6, 6}
for step = 1, 3 do
  dl.manual_seed(50 + step)
  local X, Y = dl.randn({12, 2, 4, 4}, {dtype = "f64"}), dl.randn({12, 2}, {dtype = "f64"})
  opt:zero_grad()
  ;((ddp(slice(X, sizes, RANK)) - slice(Y, sizes, RANK)):pow(2):mean()):backward()
  opt:step()
  ropt:zero_grad()
  ;((ref(X) - Y):pow(2):mean()):backward()
  ropt:step()
end
try("verify_sync", function() ddp:verify_sync() end)
local worst = 0
local sd, rsd = model:state_dict(), ref:state_dict()
for k, v in pairs(rsd) do worst = math.max(worst, maxdiff(sd[k], v)) end
out("max_diff", string.format("%.3e", worst))
train_state.save_model(os.getenv("OUT_DIR") .. "/model_rank" .. RANK .. ".safetensors", model)
dist.destroy_process_group()
]]
    local verify = ("%s verify %s/model_rank0.safetensors %s/model_rank1.safetensors"):format(exe, dir, dir)
    -- SyncBatchNorm: the global batch's statistics on every rank
    local ranks = run(code, 2, { env = { OUT_DIR = dir, SYNC_BN = "1" } })
    for i = 1, 2 do
      assert.equal("no error", ranks[i].err.verify_sync)
      assert.is_true(tonumber(ranks[i].out.max_diff) <= 1e-12, "rank " .. (i - 1) .. ": " .. ranks[i].out.max_diff)
    end
    local status, text = files.run(verify)
    assert.equal(0, status, text)
    assert.matches("16 tensors identical across 2 files", text, 1, true)
    -- plain BatchNorm: each replica's running stats follow its own shard (seed multigpu-demos)
    ranks = run(code, 2, { env = { OUT_DIR = dir, SYNC_BN = "0" } })
    assert.matches("verify_sync: buffer '1.running_mean' differs", ranks[1].err.verify_sync, 1, true)
    status, text = files.run(verify)
    assert.is_not.equal(0, status, text)
    assert.matches("running_mean", text, 1, true)
  end)
end)

-- Device tensors: the same Function on cuda:RANK. Without a GPU on the simulated device
-- (build/libddplua_cuda_sim.so: gloo stages through the host; DDPLUA_SIM_NCCL=1 gives its
-- nccl backend); with two real GPUs on NCCL.
local root = io.popen("pwd"):read("*l")
local SIM = root .. "/build/libddplua_cuda_sim.so"

local DEVICE = [[
local dev = "cuda:" .. RANK
local sizes = {3, 5}
local sync = make(nn.SyncBatchNorm, 4, {dtype = "f64"}):to(dev)
local ref = make(nn.BatchNorm1d, 4, {dtype = "f64"})
dl.manual_seed(1)
local X = dl.randn({8, 4, 3}, {dtype = "f64"}) * 3 + 1
local G = dl.randn({8, 4, 3}, {dtype = "f64"})
local x = slice(X, sizes, RANK):to(dev):requires_grad_()
local y = sync(x)
;(y * slice(G, sizes, RANK):to(dev)):sum():backward()
local Xr = X:clone():requires_grad_()
local yr = ref(Xr)
;(yr * G):sum():backward()
dist.all_reduce(sync.weight.grad)                -- on the device, through the same backend
out("devices", y.device .. "," .. x.grad.device .. "," .. sync.weight.grad.device .. "," .. sync.running_var.device)
out("diff", string.format("%.3e", math.max(maxdiff(y:to("cpu"), slice(yr, sizes, RANK)),
  maxdiff(x.grad:to("cpu"), slice(Xr.grad, sizes, RANK)), maxdiff(sync.weight.grad:to("cpu"), ref.weight.grad),
  maxdiff(sync.running_var:to("cpu"), ref.running_var))))
out("backend", dist.get_backend())
]]

local function check_device(ranks, backend)
  for i = 1, 2 do
    assert.equal(("cuda:%d,cuda:%d,cuda:%d,cuda:%d"):format(i - 1, i - 1, i - 1, i - 1), ranks[i].out.devices)
    assert.is_true(tonumber(ranks[i].out.diff) <= 1e-12, ranks[i].out.diff)
    assert.equal(backend, ranks[i].out.backend)
  end
end

describe("nn.SyncBatchNorm on device tensors #dist", function()
  it("equals BatchNorm on the whole batch on the simulated device (gloo staging, unequal batches)", function()
    check_device(run(DEVICE, 2, { env = { DDPLUA_CUDA_PLUGIN = SIM } }), "gloo")
  end)

  it("equals BatchNorm on the whole batch on the simulated device's nccl backend", function()
    check_device(run(DEVICE, 2, { init = '{backend = "nccl", device_id = tonumber(os.getenv("RANK")), timeout = 20}',
      env = { DDPLUA_CUDA_PLUGIN = SIM, DDPLUA_SIM_NCCL = "1" } }), "nccl")
  end)
end)

-- The number of real CUDA devices with NCCL (spec/helpers/cuda.lua).
local real_gpus = require("cuda").nccl_gpus

describe("nn.SyncBatchNorm on real GPUs #cuda #dist", function()
  it("equals BatchNorm on the whole batch with the nccl backend (two GPUs)", function()
    if real_gpus() < 2 then
      pending("needs two CUDA devices with NCCL (one rank per GPU)")
      return
    end
    check_device(run(DEVICE, 2, { init = '{backend = "nccl", timeout = 60}', timeout = 120,
      env = { DDPLUA_CUDA_PLUGIN = false } }), "nccl")
  end)
end)

describe("nn.SyncBatchNorm in one process", function()
  it("without a process group is BatchNorm, forward, backward and running stats", function()
    dl.manual_seed(4)
    local sync, ref = nn.SyncBatchNorm(3, { dtype = "f64" }), nn.BatchNorm1d(3, { dtype = "f64" })
    local x = dl.randn({6, 3, 4}, { dtype = "f64" })
    local xs, xr = x:clone():requires_grad_(), x:clone():requires_grad_()
    local y, yr = sync(xs), ref(xr)
    y:pow(2):sum():backward(); yr:pow(2):sum():backward()
    assert.equal(0, (y - yr):abs():max():item())
    assert.equal(0, (xs.grad - xr.grad):abs():max():item())
    assert.equal(0, (sync.weight.grad - ref.weight.grad):abs():max():item())
    assert.equal(0, (sync.running_var - ref.running_var):abs():max():item())
    assert.equal(1, sync.num_batches_tracked:item())
    sync:eval(); ref:eval()
    assert.equal(0, (sync(x) - ref(x)):abs():max():item())
  end)

  it("checks its input and options as PyTorch", function()
    local bn = nn.SyncBatchNorm(4)
    assert.has_error(function() bn(dl.randn({ 4 })) end, "SyncBatchNorm: expected at least 2D input (got 1D input)")
    assert.has_error(function() bn(dl.randn({ 2, 3, 5 })) end,
      "SyncBatchNorm: expected input with 4 channels (num_features) in dim 2, got input of shape (2, 3, 5) with 3")
    assert.has_error(function() bn(dl.randn({ 2, 0 })) end, "SyncBatchNorm number of input channels should be non-zero")
    assert.has_error(function() nn.SyncBatchNorm(4, { process_group = 1 }) end)
    assert.has_error(function() nn.SyncBatchNorm(4, { bogus = 1 }) end)
    assert.has_error(function() nn.SyncBatchNorm(0) end)
    assert.has_error(function() nn.SyncBatchNorm.convert_sync_batchnorm(nn.Linear(2, 2), "world") end)
  end)

  it("convert_sync_batchnorm replaces nested BatchNorm layers, keeping parameters, buffers and training flags", function()
    local Block = nn.Module:extend("Block")
    function Block:init()
      self.conv = nn.Conv2d(3, 4, 3)
      self.norm = nn.BatchNorm2d(4, { momentum = false, eps = 1e-3 })
      self.inner = nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.BatchNorm1d(5, { affine = false }))
    end
    local model = nn.Sequential(nn.BatchNorm2d(3), Block(), nn.Linear(5, 2))
    model[2].norm:eval()
    dl.no_grad(function() model[2].norm.running_mean:fill_(0.25) end)
    local keys_before = nn.state_dict_keys(model:state_dict())
    local w, rm = model[2].norm.weight, model[2].norm.running_mean
    local nbt = model[1].num_batches_tracked
    local converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert.equal(model, converted) -- the container itself is kept
    local names = {}
    for name, m in converted:named_modules() do names[#names + 1] = name .. "=" .. m:_get_name() end
    assert.same({ "=Sequential", "0=SyncBatchNorm", "1=Block", "1.conv=Conv2d", "1.norm=SyncBatchNorm",
      "1.inner=Sequential", "1.inner.0=Flatten", "1.inner.1=Linear", "1.inner.2=SyncBatchNorm", "2=Linear" }, names)
    local norm = converted[2].norm
    assert.equal(w, norm.weight)                 -- the same parameter objects and buffers
    assert.equal(rm, norm.running_mean)
    assert.equal(nbt, converted[1].num_batches_tracked)
    assert.equal(false, norm.momentum)
    assert.equal(1e-3, norm.eps)
    assert.is_false(norm.training)
    assert.is_true(converted[1].training)
    assert.is_false(converted[2].inner[3].affine)
    assert.is_nil(converted[2].inner[3].weight)
    assert.same(keys_before, nn.state_dict_keys(converted:state_dict()))
    -- a batch norm layer itself is replaced by a new layer
    local single = nn.BatchNorm1d(7)
    local s = nn.SyncBatchNorm.convert_sync_batchnorm(single)
    assert.equal("SyncBatchNorm", s:_get_name())
    assert.equal(single.weight, s.weight)
  end)
end)
