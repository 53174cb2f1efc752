-- Specs for DDP's comm_overlap (lua/ddplua/distributed/ddp.lua; ddplua/reducer.h, Note
-- [bucket overlap] and Note [last bucket inline]): whether the buckets are all-reduced on the
-- group's communication thread during the backward or on the backward's thread after it
-- changes when the collectives run, never which ones nor their order. So both settings
-- must give the same bits, equal to one process; and the ranks must agree on the setting
-- (other collectives during the backward would otherwise be submitted in different orders).
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {
  helpers = { "mlp", "cnn", "batches", "shard", "mse", "max_rel", "params_text", "branch_net" },
} .. [[
-- k SGD-momentum steps of DDP(make(), opts) on this rank's shards -> its parameters as text
-- (9 significant digits: every f32 bit) and the wrapped model.
function train(make, opts, xs, ys, forward)
  local model = DDP(make(), opts)
  local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
  for s = 1, #xs do
    opt:zero_grad()
    local x, y = shard(xs[s], WORLD, RANK), shard(ys[s], WORLD, RANK)
    local loss = forward and forward(model, x, s) or mse(model(x), y)
    loss:backward()
    opt:step()
  end
  model:verify_sync()
  return params_text(model.module), model
end
-- the same k steps in one process on the whole batches (rank 0's reference)
function reference(make, xs, ys, forward)
  local m = make()
  local opt = optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})
  for s = 1, #xs do
    opt:zero_grad()
    local loss = forward and forward(m, xs[s], s, ys[s]) or mse(m(xs[s]), ys[s])
    loss:backward()
    opt:step()
  end
  return m
end
-- comm_overlap true and false, in this order on every rank (the constructions are collective)
SETTINGS = { { "on", true }, { "off", false } }
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })

-- every setting's text equals the "on" one, on every rank; and the ranks agree
local function check_same(ranks, n, names, prefix)
  prefix = prefix or ""
  for i = 1, n do
    for _, name in ipairs(names) do
      local t = ranks[i].out[prefix .. name]
      assert.is_not_nil(t, "rank " .. (i - 1) .. " printed no " .. prefix .. name)
      assert.equal(ranks[1].out[prefix .. "on"], t, prefix .. name .. " on rank " .. (i - 1))
    end
  end
end

describe("ddplua.distributed.ddp comm_overlap #dist", function()
  it("on (the default) and off give the same bits as one process (CNN, many buckets)", function()
    local ranks = run([[
local xs, ys = batches(3, 8, {2, 8, 8}, 3)
for _, setting in ipairs(SETTINGS) do
  local name, v = setting[1], setting[2]
  local opts = {comm_overlap = v, bucket_cap_mb = 0.0002}
  if v then opts.comm_overlap = nil end -- the default
  local text, model = train(cnn, opts, xs, ys)
  out(name, text)
  out(name .. "_buckets", #model:buckets())
  out(name .. "_flag", tostring(model.comm_overlap))
  if name == "on" and RANK == 0 then out("max_rel", max_rel(model.module, reference(cnn, xs, ys))) end
end
]], 2)
    check_same(ranks, 2, { "on", "off" })
    assert.is_true(tonumber(ranks[1].out.on_buckets) >= 4, "buckets: " .. ranks[1].out.on_buckets)
    assert.is_true(tonumber(ranks[1].out.max_rel) <= 1e-5, "max_rel " .. ranks[1].out.max_rel)
    for i = 1, 2 do
      assert.equal("true", ranks[i].out.on_flag)
      assert.equal("false", ranks[i].out.off_flag)
    end
  end)

  it("3 ranks, one bucket (the last bucket runs on the backward's thread): the same bits", function()
    local ranks = run([[
local xs, ys = batches(3, 12, {6}, 4)
local off
for _, setting in ipairs(SETTINGS) do
  local name, v = setting[1], setting[2]
  local text, model = train(mlp, {comm_overlap = v}, xs, ys)
  out(name, text)
  if name == "off" then off = model end
end
if RANK == 0 then out("max_rel", max_rel(off.module, reference(mlp, xs, ys))) end
]], 3)
    check_same(ranks, 3, { "on", "off" })
    assert.is_true(tonumber(ranks[1].out.max_rel) <= 1e-5, "max_rel " .. ranks[1].out.max_rel)
  end)

  it("with gradient_as_bucket_view and with find_unused_parameters, the same bits", function()
    local ranks = run([[
local xs, ys = batches(3, 8, {6}, 4)
local use = {true, false, true}
local function branch_forward(model, x, s) return mse(model(x, use[s]), shard(ys[s], WORLD, RANK)) end
local off
for _, setting in ipairs(SETTINGS) do
  local name, v = setting[1], setting[2]
  out("view_" .. name, (train(mlp, {comm_overlap = v, gradient_as_bucket_view = true,
                                    bucket_cap_mb = 0.0005}, xs, ys)))
  local text, model = train(BranchNet, {comm_overlap = v, find_unused_parameters = true,
                                         bucket_cap_mb = 0.0005}, xs, ys, branch_forward)
  out("unused_" .. name, text)
  if name == "off" then off = model end
end
if RANK == 0 then
  out("max_rel", max_rel(off.module, reference(BranchNet, xs, ys,
      function(m, x, s, y) return mse(m(x, use[s]), y) end)))
end
]], 2)
    check_same(ranks, 2, { "on", "off" }, "view_")
    check_same(ranks, 2, { "on", "off" }, "unused_")
    assert.is_true(tonumber(ranks[1].out.max_rel) <= 1e-5, "max_rel " .. ranks[1].out.max_rel)
  end)

  it("the optimizer in backward steps every bucket once with overlap on or off, the same bits", function()
    local ranks = run([[
local xs, ys = batches(3, 8, {6}, 4)
for _, setting in ipairs(SETTINGS) do
  local name, v = setting[1], setting[2]
  local model = DDP(mlp(), {comm_overlap = v, bucket_cap_mb = 0.0005})
  model:register_optimizer_in_backward(optim.SGD, {lr = 0.1, momentum = 0.9})
  for s = 1, #xs do mse(model(shard(xs[s], WORLD, RANK)), shard(ys[s], WORLD, RANK)):backward() end
  local during, at_end = model:fused_optim_counts()
  out(name, params_text(model.module))
  out(name .. "_steps", during + at_end)
  out(name .. "_buckets", #model:buckets())
  model:destroy()
end
out("plain", (train(mlp, {bucket_cap_mb = 0.0005}, xs, ys)))
]], 2)
    check_same(ranks, 2, { "on", "off" })
    for i = 1, 2 do
      local o = ranks[i].out
      assert.equal(o.plain, o.on)
      for _, name in ipairs({ "on", "off" }) do
        -- 3 iterations, every bucket stepped once in each
        assert.equal(tostring(3 * tonumber(o[name .. "_buckets"])), o[name .. "_steps"])
      end
    end
  end)

  it("exposed_comm_seconds counts all-reduces run on the backward's thread", function()
    local ranks = run([[
local x, y = dl.randn({4, 6}), dl.randn({4, 4})
for _, setting in ipairs(SETTINGS) do
  local model = DDP(mlp(), {comm_overlap = setting[2]}) -- one bucket: the last, inline either way
  mse(model(x), y):backward()
  out(setting[1], string.format("%.9g", model:exposed_comm_seconds()))
end
]], 2)
    for i = 1, 2 do
      for _, name in ipairs({ "on", "off" }) do
        assert.is_true(tonumber(ranks[i].out[name]) > 0, name .. ": " .. ranks[i].out[name])
      end
    end
  end)

  it("a dead peer fails the backward naming the bucket, with overlap on or off", function()
    for _, v in ipairs({ "true", "false" }) do
      local ranks = run(([[
local model = DDP(mlp(), {timeout = 10, comm_overlap = %s})
local x, y = dl.randn({2, 6}), dl.randn({2, 4})
if RANK == 1 then os.exit(0) end
try("backward", function() mse(model(x), y):backward() end)
]]):format(v), 2)
      local e = ranks[1].err.backward
      assert.matches("DistributedDataParallel: the all%-reduce of gradient bucket 0 %(%d+ parameters, %d+ bytes%) failed on rank 0", e)
      assert.matches("rank 1", e, 1, true)
    end
  end)

  it("settings that differ across ranks fail construction on every rank, naming them", function()
    local ranks = run([[try("construct", function() DDP(mlp(), {comm_overlap = RANK == 0}) end)]], 2)
    for i = 1, 2 do
      assert.matches("comm_overlap differs across ranks (rank 0 true, rank 1 false)",
                     ranks[i].err.construct, 1, true)
    end
  end)

  it("rejects a comm_overlap that is not a boolean", function()
    local ranks = run([[try("construct", function() DDP(mlp(), {comm_overlap = "yes"}) end)]], 2)
    for i = 1, 2 do
      assert.matches("comm_overlap must be true or false, got yes", ranks[i].err.construct, 1, true)
    end
  end)
end)
