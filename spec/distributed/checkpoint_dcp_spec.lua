-- Specs for ddplua.distributed.checkpoint (Note [DCP layout]): a tensor-parallel GPT under
-- DDP on 4 ranks (2 x 2 mesh) saves its pieces; the checkpoint loads onto 2 ranks (tensor
-- parallel only) and onto 1 process with tensors identical to the saved model's, and
-- converts to one safetensors file; missing or reshaped tensors are named.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {} .. [[
package.path = "./?.lua;" .. package.path
GPT = require "models.gpt"
tp = require "ddplua.distributed.tensor.parallel"
dcp = require "ddplua.distributed.checkpoint"
ckpt = require "ddplua.checkpoint"
CONFIG = { block_size = 8, vocab_size = 13, n_layer = 1, n_head = 2, n_embd = 8, dropout = 0.0, bias = true }
function gpt(seed) dl.manual_seed(seed); return GPT(CONFIG) end
function sd_diff(a, b)
  local worst, n = 0, 0
  for name, t in pairs(b) do
    if not a[name] then return "missing " .. name end
    worst = math.max(worst, (a[name]:double() - t:double()):abs():max():item())
    n = n + 1
  end
  return worst .. " over " .. n
end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 120 })

describe("ddplua.distributed.checkpoint #dist", function()
  local dir
  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
  end)
  teardown(function() os.execute("rm -rf " .. dir) end)

  it("saves on 4 ranks (DDP + TP), loads on 2 (TP) and on 1 with identical tensors", function()
    local save = run(([[
local DIR = %q
local mesh = dist.init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}})
local model = tp.parallelize_module(gpt(3), mesh["tp"], GPT.tp_plan(CONFIG, 2))
local ddp = DDP(model, {device_mesh = mesh["dp"]})
local opt = model:configure_optimizers(0.1, 1e-2, {0.9, 0.95})
dl.manual_seed(9)
for s = 1, 2 do
  local idx, tgt = dl.randint(0, 13, {4, 8}, {dtype = "i64"}), dl.randint(0, 13, {4, 8}, {dtype = "i64"})
  local dp = mesh:get_coordinate()[1]
  opt:zero_grad()
  local _, loss = ddp(idx:narrow(1, 1 + 2 * dp, 2), tgt:narrow(1, 1 + 2 * dp, 2))
  loss:backward()
  opt:step()
end
dcp.save(dcp.get_model_state_dict(model), {checkpoint_id = DIR .. "/dcp"})
local full = tp.full_state_dict(model)
if RANK == 0 then ckpt.save(DIR .. "/full.safetensors", full) end
dist.barrier()
out("files", io.open(DIR .. "/dcp/.metadata") and "metadata" or "none")
]]):format(dir), 4)
    for r = 1, 4 do assert.are.equal("metadata", save[r].out.files) end

    local two = run(([[
local DIR = %q
local mesh = dist.init_device_mesh("cpu", {2}, {mesh_dim_names = {"tp"}})
local model = tp.parallelize_module(gpt(77), mesh, GPT.tp_plan(CONFIG, 2))
dcp.load(dcp.get_model_state_dict(model), {checkpoint_id = DIR .. "/dcp"})
out("diff", sd_diff(tp.full_state_dict(model), ckpt.load(DIR .. "/full.safetensors")))
try("missing", function() dcp.load({nope = dl.zeros{2}}, {checkpoint_id = DIR .. "/dcp"}) end)
try("shape", function() dcp.load({["lm_head.weight"] = dl.zeros{2}}, {checkpoint_id = DIR .. "/dcp"}) end)
try("no_ckpt", function() dcp.load({}, {checkpoint_id = DIR .. "/none"}) end)
]]):format(dir), 2)
    for r = 1, 2 do
      local o, e = two[r].out, two[r].err
      assert.matches("^0 over %d+$", o.diff)
      assert.matches("'nope' is not in the checkpoint", e.missing)
      assert.matches("'lm_head%.weight' has shape %(2%) but the checkpoint .* holds %(13, 8%)", e.shape)
      assert.matches("holds no checkpoint %(no %.metadata", e.no_ckpt)
    end

    local one = run(([[
local DIR = %q
local model = gpt(55)
dcp.load(model:state_dict(), {checkpoint_id = DIR .. "/dcp"})
local want = ckpt.load(DIR .. "/full.safetensors")
out("diff", sd_diff(model:state_dict(), want))
dcp.dcp_to_safetensors(DIR .. "/dcp", DIR .. "/converted.safetensors")
out("converted", sd_diff(ckpt.load(DIR .. "/converted.safetensors"), want))
]]):format(dir), 1)
    assert.matches("^0 over %d+$", one[1].out.diff)
    assert.matches("^0 over %d+$", one[1].out.converted)
  end)
  it("saves FSDP + TP shards on 4 ranks, loads into FSDP on 2 ranks and into one process", function()
    local save = run(([[
local fsdp = require "ddplua.distributed.fsdp"
local DIR = %q
local mesh = dist.init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}})
local model = tp.parallelize_module(gpt(3), mesh["tp"], GPT.tp_plan(CONFIG, 2))
for _, block in ipairs(model.transformer.h:list()) do fsdp.fully_shard(block, {mesh = mesh["dp"]}) end
fsdp.fully_shard(model, {mesh = mesh["dp"]})
local opt = model:configure_optimizers(0.1, 1e-2, {0.9, 0.95})
dl.manual_seed(9)
local idx, tgt = dl.randint(0, 13, {4, 8}, {dtype = "i64"}), dl.randint(0, 13, {4, 8}, {dtype = "i64"})
local dp = mesh:get_coordinate()[1]
local _, loss = model(idx:narrow(1, 1 + 2 * dp, 2), tgt:narrow(1, 1 + 2 * dp, 2))
loss:backward()
opt:step()
dcp.save(dcp.get_model_state_dict(model), {checkpoint_id = DIR .. "/fsdp_tp"})
local full = tp.full_state_dict(model, fsdp.get_model_state_dict(model, {full_state_dict = true}))
if RANK == 0 then ckpt.save(DIR .. "/fsdp_tp_full.safetensors", full) end
dist.barrier()
]]):format(dir), 4)
    assert.are.equal(4, #save)

    local two = run(([[
local fsdp = require "ddplua.distributed.fsdp"
local DIR = %q
local model = gpt(77)
for _, block in ipairs(model.transformer.h:list()) do fsdp.fully_shard(block) end
fsdp.fully_shard(model)
dcp.load(dcp.get_model_state_dict(model), {checkpoint_id = DIR .. "/fsdp_tp"})
out("diff", sd_diff(fsdp.get_model_state_dict(model, {full_state_dict = true}), ckpt.load(DIR .. "/fsdp_tp_full.safetensors")))
]]):format(dir), 2)
    for r = 1, 2 do assert.matches("^0 over %d+$", two[r].out.diff) end

    local one = run(([[
local DIR = %q
local model = gpt(55)
dcp.load(model:state_dict(), {checkpoint_id = DIR .. "/fsdp_tp"})
out("diff", sd_diff(model:state_dict(), ckpt.load(DIR .. "/fsdp_tp_full.safetensors")))
]]):format(dir), 1)
    assert.matches("^0 over %d+$", one[1].out.diff)
  end)
  it("async_save writes while training goes on; the checkpoint is the state at the call (2 ranks)", function()
    local ranks = run(([[
local DIR = %q
local mesh = dist.init_device_mesh("cpu", {2}, {mesh_dim_names = {"tp"}})
local model = tp.parallelize_module(gpt(3), mesh, GPT.tp_plan(CONFIG, 2))
local before = {}
for k, v in pairs(tp.full_state_dict(model)) do before[k] = v:clone() end -- a snapshot (state_dict views share data)
local fut = dcp.async_save(dcp.get_model_state_dict(model), {checkpoint_id = DIR .. "/async"})
-- training changes the parameters before the write is waited for
local opt = model:configure_optimizers(0.1, 0.5, {0.9, 0.95})
local idx = dl.randint(0, 13, {2, 8}, {dtype = "i64"})
local _, loss = model(idx, idx)
loss:backward()
opt:step()
out("dir", fut:wait())
out("changed", sd_diff(tp.full_state_dict(model), before))
local fresh = tp.parallelize_module(gpt(77), mesh, GPT.tp_plan(CONFIG, 2))
dcp.load(dcp.get_model_state_dict(fresh), {checkpoint_id = DIR .. "/async"})
out("loaded", sd_diff(tp.full_state_dict(fresh), before))
local ckpt_lib = require "ddplua.checkpoint"
try("bad_dir", function() ckpt_lib.save_async("/proc/none/x.safetensors", {a = dl.zeros{2}}):wait() end)
]]):format(dir), 2)
    for r = 1, 2 do
      local o, e = ranks[r].out, ranks[r].err
      assert.are.equal(dir .. "/async", o.dir)
      assert.is_true(tonumber(o.changed:match("^(%S+)")) > 0, o.changed) -- the step did change them
      assert.matches("^0 over %d+$", o.loaded)
      assert.matches("/proc/none/x%.safetensors", e.bad_dir)
    end
  end)
end)
