-- Specs for ddplua.amp.GradScaler (lua/ddplua/amp/grad_scaler.lua over ddp_amp_unscale_):
-- PyTorch's defaults and protocol errors, a forced overflow skipping the step and halving
-- the scale, growth after the interval, f16/bf16 gradients, state_dict and resume through
-- train_state, and 2 real ranks where only one overflows (both skip, replicas identical).
local dl = require "ddplua"
local optim = require "ddplua.optim"
local train_state = require "ddplua.train_state"
local files = require "files"
local mp = require "multiproc"

local GradScaler = dl.amp.GradScaler

-- A one-parameter problem: p = {1, 2}, loss = sum(p * w) so p.grad = w exactly.
local function problem(w, dtype)
  local p = dl.tensor({ 1, 2 }, { dtype = dtype or "f32", requires_grad = true })
  local opt = optim.SGD({ p }, { lr = 0.5 })
  local function loss() return (p * dl.tensor(w, { dtype = dtype or "f32" })):sum() end
  return p, opt, loss
end

describe("ddplua.amp.GradScaler", function()
  it("has PyTorch's defaults", function()
    local s = GradScaler()
    assert.equal(65536, s:get_scale())
    assert.equal(2, s:get_growth_factor())
    assert.equal(0.5, s:get_backoff_factor())
    assert.equal(2000, s:get_growth_interval())
    assert.is_true(s:is_enabled())
    assert.same({ scale = 65536, growth_factor = 2, backoff_factor = 0.5, growth_interval = 2000,
      _growth_tracker = 0 }, s:state_dict())
  end)

  it("scales the loss, unscales the gradients exactly and steps", function()
    local p, opt, loss = problem({ 3, -0.25 })
    local s = GradScaler { init_scale = 1024 }
    local scaled = s:scale(loss())
    assert.equal(1024 * (3 - 0.5), scaled:item())
    scaled:backward()
    assert.same({ 3 * 1024, -0.25 * 1024 }, p.grad:tolist())
    s:step(opt)
    assert.same({ 3, -0.25 }, p.grad:tolist()) -- unscaled in place
    assert.same({ 1 - 1.5, 2 + 0.125 }, p:tolist())
    s:update()
    assert.equal(1024, s:get_scale()) -- no growth before the interval
  end)

  it("skips the step and halves the scale when a gradient overflows", function()
    for _, w in ipairs { { 1, math.huge }, { 0 / 0, 1 } } do
      local p, opt, loss = problem(w)
      local s = GradScaler()
      s:scale(loss()):backward()
      assert.is_nil(s:step(opt))
      assert.same({ 1, 2 }, p:tolist()) -- untouched
      s:update()
      assert.equal(32768, s:get_scale())
      assert.equal(0, s:state_dict()._growth_tracker)
    end
  end)

  it("finds inf and NaN in f16 and bf16 gradients (computed in f32, rounded once)", function()
    for _, dtype in ipairs { "f16", "bf16" } do
      local p = dl.tensor({ 1, 2 }, { dtype = dtype, requires_grad = true })
      local opt = optim.SGD({ p }, { lr = 1 })
      local s = GradScaler { init_scale = 8 }
      p.grad = dl.tensor({ 8, 24 }, { dtype = dtype })
      s:unscale_(opt)
      assert.same({ 1, 3 }, p.grad:tolist())
      s:step(opt)
      assert.same({ 0, -1 }, p:tolist())
      s:update()
      p.grad = dl.tensor({ 1, math.huge }, { dtype = dtype })
      s:step(opt)
      assert.same({ 0, -1 }, p:tolist())
      s:update()
      assert.equal(4, s:get_scale())
    end
  end)

  it("grows the scale after growth_interval steps without overflow", function()
    local p, opt, loss = problem({ 1, 1 })
    local s = GradScaler { init_scale = 4, growth_interval = 3 }
    local seen = {}
    for i = 1, 7 do
      opt:zero_grad()
      if i == 5 then p.grad = dl.tensor({ math.huge, 0 }) else s:scale(loss()):backward() end
      s:step(opt)
      s:update()
      seen[i] = s:get_scale()
    end
    -- growth at 3; the overflow at 5 halves and resets the count; 6, 7 count anew
    assert.same({ 4, 4, 8, 8, 4, 4, 4 }, seen)
    assert.equal(2, s:state_dict()._growth_tracker)
    s:update(256)
    assert.equal(256, s:get_scale())
  end)

  it("raises on misuse as PyTorch does", function()
    local _, opt, loss = problem({ 1, 1 })
    local s = GradScaler()
    assert.has_error(function() s:update() end, "No inf checks were recorded prior to update.")
    s:scale(loss()):backward()
    s:unscale_(opt)
    assert.has_error(function() s:unscale_(opt) end,
      "unscale_() has already been called on this optimizer since the last update().")
    s:step(opt)
    assert.has_error(function() s:unscale_(opt) end, "unscale_() is being called after step().")
    assert.has_error(function() s:step(opt) end, "step() has already been called since the last update().")
    assert.has_error(function() s:step(opt, function() end) end)
    s:update()
    assert.has_error(function() GradScaler { growth_factor = 1 } end,
      "GradScaler: growth_factor should be > 1, got 1")
    assert.has_error(function() GradScaler { bogus = 1 } end)
    assert.has_error(function() s:load_state_dict({}) end,
      "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.")
  end)

  it("passes everything through when disabled", function()
    local p, opt, loss = problem({ 1, 1 })
    local s = GradScaler { enabled = false }
    local l = loss()
    assert.equal(l, s:scale(l))
    l:backward()
    s:unscale_(opt)
    s:step(opt)
    s:update()
    assert.same({ 0.5, 1.5 }, p:tolist())
    assert.equal(1, s:get_scale())
    assert.same({}, s:state_dict())
  end)

  it("resumes its scale and growth count from a train_state checkpoint", function()
    local dir = files.tmpdir("scaler")
    finally(function() files.remove(dir) end)
    local p, opt, loss = problem({ 1, 1 })
    local s = GradScaler { init_scale = 64, growth_interval = 5 }
    for _ = 1, 2 do opt:zero_grad(); s:scale(loss()):backward(); s:step(opt); s:update() end
    s:update(128)
    train_state.save(dir .. "/ckpt.safetensors", { optimizer = opt, scaler = s })
    local s2 = GradScaler { growth_interval = 5 }
    train_state.load(dir .. "/ckpt.safetensors", { optimizer = opt, scaler = s2 })
    assert.same(s:state_dict(), s2:state_dict())
    assert.equal(128, s2:get_scale())
    assert.equal(2, s2:state_dict()._growth_tracker)
  end)

  it("2 ranks, only rank 1 overflows: both skip, halve the scale, replicas identical #dist", function()
    local dir = files.tmpdir("scaler_dist")
    finally(function() files.remove(dir) end)
    local r = mp.run { nprocs = 2, timeout = 40, env = { OUT_DIR = dir }, code = [[
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local train_state = require "ddplua.train_state"
local rank = tonumber(os.getenv("RANK"))
dist.init_process_group { backend = "gloo", timeout = 20 }
dl.manual_seed(3)
local model = DDP(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
local opt = optim.SGD(model:parameters(), { lr = 0.1 })
local scaler = dl.amp.GradScaler { init_scale = 1024 }
dl.manual_seed(10 + rank)
for step = 1, 2 do
  opt:zero_grad()
  local x, y = dl.randn({ 3, 4 }), dl.randn({ 3, 2 })
  scaler:scale(((model(x) - y) ^ 2):mean()):backward()
  -- after the reduction: only rank 1's first gradient overflows, at step 2
  if step == 2 and rank == 1 then model.module:parameters()[1].grad:fill_(math.huge) end
  local before = model.module:parameters()[1]:clone()
  scaler:step(opt)
  scaler:update()
  local moved = (model.module:parameters()[1] - before):abs():max():item() > 0
  io.write(("OUT step%d moved=%s scale=%g\n"):format(step, tostring(moved), scaler:get_scale()))
end
train_state.save_model(("%s/model_rank%d.safetensors"):format(os.getenv("OUT_DIR"), rank), model.module)
dist.destroy_process_group()
]] }
    assert.is_true(r.ok, mp.describe(r))
    for i = 1, 2 do
      assert.matches("OUT step1 moved=true scale=1024", r[i].output, 1, true)
      assert.matches("OUT step2 moved=false scale=512", r[i].output, 1, true)
    end
    local status, out = files.run(("%s verify %s/model_rank0.safetensors %s/model_rank1.safetensors"):format(
      os.getenv("DDPLUA_EXE") or "./build/ddplua", dir, dir))
    assert.equal(0, status, out)
    assert.matches("4 tensors identical across 2 files", out, 1, true)
  end)
end)
