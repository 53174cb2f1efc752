-- Specs for tensor parallelism (lua/ddplua/distributed/tensor/parallel/): the GPT of
-- models/gpt.lua parallelized with GPT.tp_plan (Megatron-style: vocabulary-parallel
-- embedding and loss, attention heads split, MLP column- then row-parallel) trains as one
-- process does, alone on 2 ranks and under DDP on a 2 x 2 (dp, tp) mesh, f64.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude {} .. [[
package.path = "./?.lua;" .. package.path
local GPT = require "models.gpt"
tp = require "ddplua.distributed.tensor.parallel"
dt = require "ddplua.distributed.tensor"
CONFIG = { block_size = 8, vocab_size = 13, n_layer = 2, n_head = 2, n_embd = 8, dropout = 0.0, bias = true,
  dtype = "f64" }
function gpt() dl.manual_seed(3); return GPT(CONFIG) end
dl.manual_seed(50)
IDX, TGT = {}, {}
for s = 1, 20 do
  IDX[s] = dl.randint(0, 13, {4, 8}, {dtype = "i64"})
  TGT[s] = dl.randint(0, 13, {4, 8}, {dtype = "i64"})
end
-- steps of AdamW on rows [first, first + count) of each batch; the losses as text
function train(model, steps, first, count)
  local opt = model.configure_optimizers and model:configure_optimizers(0.1, 1e-2, {0.9, 0.95})
    or model.module:configure_optimizers(0.1, 1e-2, {0.9, 0.95})
  local losses = {}
  for s = 1, steps do
    opt:zero_grad()
    local _, loss = model(IDX[s]:narrow(1, first, count), TGT[s]:narrow(1, first, count))
    losses[s] = ("%.12f"):format(loss:item())
    loss:backward()
    opt:step()
  end
  return table.concat(losses, " ")
end
-- the largest difference between two state dicts (name -> tensor), and a missing name
function sd_diff(a, b)
  local worst, missing = 0, nil
  for name, t in pairs(b) do
    if not a[name] then missing = name else
      worst = math.max(worst, (a[name] - t):abs():max():item())
    end
  end
  return missing and ("missing " .. missing) or worst
end
GPT_CLASS = GPT
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 120 })

local function small(v, tol) return tonumber(v) ~= nil and tonumber(v) <= tol end

describe("ddplua.distributed.tensor.parallel #dist", function()
  it("the GPT's tensor-parallel plan on 2 ranks trains as one process (f64)", function()
    local ranks = run([[
local ref = gpt()
local ref_losses = train(ref, 4, 1, 4)
local mesh = dist.init_device_mesh("cpu", {2}, {mesh_dim_names = {"tp"}})
local model = tp.parallelize_module(gpt(), mesh, GPT_CLASS.tp_plan(CONFIG, 2))
out("c_attn", table.concat(model.transformer.h[1].attn.c_attn.weight:size(), "x"))
out("wte", table.concat(model.transformer.wte.weight:size(), "x"))
out("tied", tostring(model.lm_head.weight == model.transformer.wte.weight))
out("spec", tostring(tp.param_spec(model.transformer.h[1].mlp.c_proj.weight).placements[1]))
local losses = train(model, 4, 1, 4)
out("losses", tostring(losses == ref_losses) .. " " .. losses .. " | " .. ref_losses)
out("state", sd_diff(tp.full_state_dict(model), ref:state_dict()))
try("plan", function() GPT_CLASS.tp_plan(CONFIG, 3) end)
try("mesh2d", function() tp.parallelize_module(gpt(), dist.init_device_mesh("cpu", {2, 1}), {}) end)
try("nomatch", function() tp.parallelize_module(gpt(), mesh, {["transformer.h.*.nope"] = tp.ColwiseParallel()}) end)
]], 2)
    for r = 1, 2 do
      local o, e = ranks[r].out, ranks[r].err
      assert.are.equal("12x8", o.c_attn) -- q, k, v: 4 features (one head) each
      assert.are.equal(r == 1 and "7x8" or "6x8", o.wte) -- 13 rows: 7 + 6
      assert.are.equal("true", o.tied)
      assert.are.equal("Shard(dim=2)", o.spec)
      local same, losses, ref = o.losses:match("^(%S+) (.-) | (.*)$")
      local worst = 0
      local a, b = {}, {}
      for v in losses:gmatch("%S+") do a[#a + 1] = tonumber(v) end
      for v in ref:gmatch("%S+") do b[#b + 1] = tonumber(v) end
      for i = 1, #b do worst = math.max(worst, math.abs(a[i] - b[i])) end
      assert.is_true(worst <= 1e-10, o.losses .. " " .. tostring(same))
      assert.is_true(small(o.state, 1e-10), "state dict differs by " .. o.state)
      assert.matches("n_head %(2%) must be a multiple of the tensor%-parallel size %(3%)", e.plan)
      assert.matches("Tensor Parallel only accepts a 1D DeviceMesh, but found 2D!", e.mesh2d)
      assert.matches("no submodule of the module matches 'transformer%.h%.%*%.nope'", e.nomatch)
    end
  end)

  it("DDP over mesh['dp'] of a tensor-parallel GPT on a 2 x 2 mesh equals one process, 20 steps (4 ranks)", function()
    local ranks = run([[
local ref = gpt()
local ref_losses = train(ref, 20, 1, 4)
local mesh = dist.init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}})
local model = tp.parallelize_module(gpt(), mesh["tp"], GPT_CLASS.tp_plan(CONFIG, 2))
local ddp = DDP(model, {device_mesh = mesh["dp"]})
local dp = mesh:get_coordinate()[1]
train(ddp, 20, 1 + 2 * dp, 2)
out("state", sd_diff(tp.full_state_dict(model), ref:state_dict()))
]], 4)
    for r = 1, 4 do
      local o = ranks[r].out
      assert.is_true(small(o.state, 1e-10), ("rank %d: state dict differs by %s"):format(r - 1, tostring(o.state)))
    end
  end)
  it("FSDP over mesh['dp'] of a tensor-parallel GPT on a 2 x 2 mesh equals one process, 20 steps (4 ranks)", function()
    local ranks = run([[
local fsdp = require "ddplua.distributed.fsdp"
local ref = gpt()
train(ref, 20, 1, 4)
local mesh = dist.init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}})
local model = tp.parallelize_module(gpt(), mesh["tp"], GPT_CLASS.tp_plan(CONFIG, 2))
for _, block in ipairs(model.transformer.h:list()) do fsdp.fully_shard(block, {mesh = mesh["dp"]}) end
fsdp.fully_shard(model, {mesh = mesh["dp"]})
local dp = mesh:get_coordinate()[1]
out("shard_rows", model.transformer.h[1].mlp.c_fc.weight:size(1)) -- 32 rows: 16 per tp rank, 8 per dp rank
train(model, 20, 1 + 2 * dp, 2)
out("state", sd_diff(tp.full_state_dict(model, fsdp.get_model_state_dict(model, {full_state_dict = true})), ref:state_dict()))
]], 4)
    for r = 1, 4 do
      local o = ranks[r].out
      assert.are.equal("8", o.shard_rows)
      assert.is_true(small(o.state, 1e-10), ("rank %d: state dict differs by %s"):format(r - 1, tostring(o.state)))
    end
  end)
end)
