-- Specs for ddplua.optim's learning-rate schedulers: the lr sequence of every scheduler
-- over many steps against the closed forms of PyTorch's documentation, computed here;
-- OneCycleLR's lr and momentum/beta1; state_dict round trips; errors.
local dl = require "ddplua"
local optim = require "ddplua.optim"

local function close(a, e, what)
  if not (math.abs(a - e) <= 1e-12 + 1e-9 * math.abs(e)) then
    error(("%s: %.15g, expected %.15g"):format(what, a, e), 2)
  end
end

local function sgd(lrs, opts)
  local groups = {}
  for i, lr in ipairs(lrs) do
    groups[i] = { params = { dl.tensor({ 1 }, { requires_grad = true }) }, lr = lr }
  end
  return optim.SGD(groups, opts or {})
end

-- Check `steps` epochs: after construction and after each step(), every group's lr and
-- get_last_lr() equal closed(base_lr, epoch).
local function check_sequence(make, closed, steps, lrs)
  lrs = lrs or { 0.1, 0.5 }
  local opt = sgd(lrs)
  local sched = make(opt)
  for epoch = 0, steps do
    if epoch > 0 then sched:step() end
    assert.are.equal(epoch, sched.last_epoch)
    local last = sched:get_last_lr()
    for i, base in ipairs(lrs) do
      local want = closed(base, epoch)
      close(opt.param_groups[i].lr, want, ("group %d epoch %d"):format(i, epoch))
      close(last[i], want, ("get_last_lr %d epoch %d"):format(i, epoch))
    end
  end
  return opt, sched
end

describe("ddplua.optim.lr_scheduler", function()
  it("StepLR: base * gamma^floor(epoch / step_size)", function()
    check_sequence(function(o) return optim.StepLR(o, { step_size = 3, gamma = 0.5 }) end,
      function(b, e) return b * 0.5 ^ math.floor(e / 3) end, 20)
    check_sequence(function(o) return optim.StepLR(o, { step_size = 2 }) end,
      function(b, e) return b * 0.1 ^ math.floor(e / 2) end, 9)
  end)

  it("MultiStepLR: base * gamma^(milestones passed), a repeated milestone counts twice", function()
    local ms = { 2, 5, 5, 9 }
    check_sequence(function(o) return optim.MultiStepLR(o, { milestones = { 9, 5, 2, 5 }, gamma = 0.3 }) end,
      function(b, e)
        local k = 0
        for _, m in ipairs(ms) do if e >= m then k = k + 1 end end
        return b * 0.3 ^ k
      end, 14)
  end)

  it("ExponentialLR: base * gamma^epoch", function()
    check_sequence(function(o) return optim.ExponentialLR(o, { gamma = 0.9 }) end,
      function(b, e) return b * 0.9 ^ e end, 30)
  end)

  it("CosineAnnealingLR: eta_min + (base - eta_min)(1 + cos(pi e / T_max)) / 2, also past T_max", function()
    check_sequence(function(o) return optim.CosineAnnealingLR(o, { T_max = 10, eta_min = 0.001 }) end,
      function(b, e) return 0.001 + (b - 0.001) * (1 + math.cos(math.pi * e / 10)) / 2 end, 35)
    check_sequence(function(o) return optim.CosineAnnealingLR(o, { T_max = 7 }) end,
      function(b, e) return b * (1 + math.cos(math.pi * e / 7)) / 2 end, 7)
  end)

  it("LinearLR: base * (start + (end - start) * min(e, total) / total)", function()
    check_sequence(function(o) return optim.LinearLR(o) end,
      function(b, e) return b * (1 / 3 + (1 - 1 / 3) * math.min(e, 5) / 5) end, 12)
    check_sequence(function(o) return optim.LinearLR(o, { start_factor = 1, end_factor = 0.25, total_iters = 4 }) end,
      function(b, e) return b * (1 + (0.25 - 1) * math.min(e, 4) / 4) end, 8)
  end)

  it("sets initial_lr on the groups and starts at last_epoch 0", function()
    local opt = sgd({ 0.2 })
    local sched = optim.ExponentialLR(opt, { gamma = 0.5 })
    assert.are.equal(0.2, opt.param_groups[1].initial_lr)
    assert.are.same({ 0.2 }, sched.base_lrs)
    assert.are.equal(0, sched.last_epoch)
    assert.is_function(optim.lr_scheduler.StepLR.new)
  end)

  describe("OneCycleLR", function()
    -- PyTorch's documented schedule, written out here: phase ends at pct*T - 1 (and
    -- 2*pct*T - 2 for three phases) and T - 1.
    local function expected(step, o)
      local T = o.total_steps
      local max_lr = o.max_lr
      local initial = max_lr / (o.div_factor or 25)
      local min_lr = initial / (o.final_div_factor or 1e4)
      local pct = o.pct_start or 0.3
      local mmax, mbase = o.max_momentum or 0.95, o.base_momentum or 0.85
      local anneal
      if (o.anneal_strategy or "cos") == "cos" then
        anneal = function(a, b, t) return b + (a - b) / 2 * (1 + math.cos(math.pi * t)) end
      else
        anneal = function(a, b, t) return a + (b - a) * t end
      end
      local phases
      if o.three_phase then
        phases = {
          { pct * T - 1, initial, max_lr, mmax, mbase },
          { 2 * pct * T - 2, max_lr, initial, mbase, mmax },
          { T - 1, initial, min_lr, mmax, mmax },
        }
      else
        phases = { { pct * T - 1, initial, max_lr, mmax, mbase }, { T - 1, max_lr, min_lr, mbase, mmax } }
      end
      local start = 0
      for k, ph in ipairs(phases) do
        if step <= ph[1] or k == #phases then
          local t = (step - start) / (ph[1] - start)
          return anneal(ph[2], ph[3], t), anneal(ph[4], ph[5], t)
        end
        start = ph[1]
      end
    end

    local cases = {
      { max_lr = 0.1, total_steps = 100 },
      { max_lr = 1.0, total_steps = 37, pct_start = 0.25, anneal_strategy = "linear", div_factor = 10, final_div_factor = 100 },
      { max_lr = 0.5, total_steps = 50, three_phase = true, base_momentum = 0.8, max_momentum = 0.9 },
      { max_lr = 0.5, total_steps = 41, three_phase = true, anneal_strategy = "linear" },
    }
    for ci, o in ipairs(cases) do
      it("lr and SGD momentum follow the schedule (case " .. ci .. ")", function()
        local opt = sgd({ 0.01 }, { momentum = 0.9 })
        local sched = optim.OneCycleLR(opt, o)
        for step = 0, o.total_steps - 1 do
          if step > 0 then sched:step() end
          local lr, mom = expected(step, o)
          close(opt.param_groups[1].lr, lr, "lr at step " .. step)
          close(sched:get_last_lr()[1], lr, "last lr at step " .. step)
          close(opt.param_groups[1].momentum, mom, "momentum at step " .. step)
        end
        sched:step() -- step total_steps is allowed (PyTorch raises only beyond it)
        local ok, err = pcall(sched.step, sched)
        assert.is_false(ok)
        assert.matches("total steps is " .. o.total_steps, err)
      end)
    end

    it("cycles Adam's beta1 and keeps beta2; epochs * steps_per_epoch gives total_steps", function()
      local p = dl.tensor({ 1 }, { requires_grad = true })
      local opt = optim.Adam({ p }, { betas = { 0.9, 0.99 } })
      local o = { max_lr = 0.01, epochs = 4, steps_per_epoch = 5 }
      local sched = optim.OneCycleLR(opt, o)
      assert.are.equal(20, sched.total_steps)
      o.total_steps = 20
      for step = 0, 19 do
        if step > 0 then sched:step() end
        local lr, mom = expected(step, o)
        close(opt.param_groups[1].lr, lr, "lr")
        close(opt.param_groups[1].betas[1], mom, "beta1")
        assert.are.equal(0.99, opt.param_groups[1].betas[2])
      end
    end)

    it("max_lr per group; cycle_momentum = false leaves momentum", function()
      local opt = sgd({ 0.1, 0.2 }, { momentum = 0.5 })
      local sched = optim.OneCycleLR(opt, { max_lr = { 1, 2 }, total_steps = 10, cycle_momentum = false })
      close(opt.param_groups[1].lr, 1 / 25, "g1")
      close(opt.param_groups[2].lr, 2 / 25, "g2")
      sched:step()
      assert.are.equal(0.5, opt.param_groups[1].momentum)
    end)

    it("refuses an optimizer without momentum or betas, and bad options", function()
      local p = dl.tensor({ 1 }, { requires_grad = true })
      local function err_of(fn) local ok, e = pcall(fn); assert.is_false(ok); return e end
      assert.matches("momentum or beta1", err_of(function() optim.OneCycleLR(optim.Adadelta({ p }), { max_lr = 1, total_steps = 5 }) end))
      local opt = sgd({ 0.1 })
      assert.matches("total_steps or %(epochs and steps_per_epoch%)", err_of(function() optim.OneCycleLR(opt, { max_lr = 1 }) end))
      assert.matches("invalid total_steps 0", err_of(function() optim.OneCycleLR(opt, { max_lr = 1, total_steps = 0 }) end))
      assert.matches("invalid pct_start", err_of(function() optim.OneCycleLR(opt, { max_lr = 1, total_steps = 5, pct_start = 2 }) end))
      assert.matches("invalid anneal_strategy", err_of(function() optim.OneCycleLR(opt, { max_lr = 1, total_steps = 5, anneal_strategy = "x" }) end))
      assert.matches("invalid max_lr", err_of(function() optim.OneCycleLR(opt, { max_lr = { 1, 2 }, total_steps = 5 }) end))
    end)
  end)

  it("state_dict round trip resumes the same sequence", function()
    for _, make in ipairs {
      function(o) return optim.CosineAnnealingLR(o, { T_max = 6, eta_min = 0.01 }) end,
      function(o) return optim.OneCycleLR(o, { max_lr = 1, total_steps = 20 }) end,
      function(o) return optim.MultiStepLR(o, { milestones = { 2, 4 } }) end,
    } do
      local opt_a = sgd({ 0.1 }, { momentum = 0.9 })
      local a = make(opt_a)
      for _ = 1, 4 do a:step() end
      local sd, osd = a:state_dict(), opt_a:state_dict()
      assert.is_nil(sd.optimizer)
      local opt_b = sgd({ 0.1 }, { momentum = 0.9 })
      local b = make(opt_b)
      opt_b:load_state_dict(osd)
      b:load_state_dict(sd)
      assert.are.equal(a.last_epoch, b.last_epoch)
      for _ = 1, 8 do
        a:step(); b:step()
        assert.are.same(a:get_last_lr(), b:get_last_lr())
        assert.are.equal(opt_a.param_groups[1].lr, opt_b.param_groups[1].lr)
        assert.are.equal(opt_a.param_groups[1].momentum, opt_b.param_groups[1].momentum)
      end
    end
  end)

  it("errors name the option", function()
    local opt = sgd({ 0.1 })
    local function err_of(fn) local ok, e = pcall(fn); assert.is_false(ok); return e end
    assert.matches("StepLR: invalid step_size", err_of(function() optim.StepLR(opt, {}) end))
    assert.matches("StepLR: unknown option 'gama'", err_of(function() optim.StepLR(opt, { step_size = 1, gama = 1 }) end))
    assert.matches("MultiStepLR: invalid milestones", err_of(function() optim.MultiStepLR(opt, { milestones = 3 }) end))
    assert.matches("ExponentialLR: invalid gamma", err_of(function() optim.ExponentialLR(opt, {}) end))
    assert.matches("CosineAnnealingLR: invalid T_max", err_of(function() optim.CosineAnnealingLR(opt, { T_max = 0 }) end))
    assert.matches("LinearLR: invalid start_factor", err_of(function() optim.LinearLR(opt, { start_factor = 0 }) end))
    assert.matches("LinearLR: invalid end_factor", err_of(function() optim.LinearLR(opt, { end_factor = 2 }) end))
    local fresh = sgd({ 0.1 })
    assert.matches("initial_lr", err_of(function() optim.StepLR(fresh, { step_size = 1, last_epoch = 3 }) end))
  end)
end)

describe("ddplua.optim LambdaLR, SequentialLR, WarmupCosineLR", function()
  local pytorch = require "pytorch"
  local function err_of(fn) local ok, e = pcall(fn); assert.is_false(ok); return e end

  -- The lr of every group after construction and after each of `steps` step() calls.
  local function lr_sequence(opt, sched, steps)
    local out = {}
    for e = 0, steps do
      if e > 0 then sched:step() end
      local row = {}
      for i, g in ipairs(opt.param_groups) do
        row[i] = g.lr
        close(sched:get_last_lr()[i], g.lr, ("get_last_lr group %d epoch %d"):format(i, e))
      end
      out[#out + 1] = row
    end
    return out
  end

  local function same_sequence(got, want, what)
    assert.are.equal(#want, #got, what)
    for e = 1, #want do
      for i = 1, #want[e] do close(got[e][i], want[e][i], ("%s: group %d epoch %d"):format(what, i, e - 1)) end
    end
  end

  local function f1(e) return 0.95 ^ e end
  local function f2(e) return 1 / (e + 1) end

  -- nanoGPT's get_lr, written out here from its train.py.
  local function nanogpt_lr(it, lr, warmup, decay, min_lr)
    if it < warmup then return lr * (it + 1) / (warmup + 1) end
    if it > decay then return min_lr end
    local r = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (lr - min_lr)
  end

  it("LambdaLR: base_lr * lr_lambda(epoch), one function or one per group", function()
    check_sequence(function(o) return optim.LambdaLR(o, f1) end, function(b, e) return b * f1(e) end, 20)
    local opt = sgd({ 0.1, 0.5 })
    local sched = optim.LambdaLR(opt, { f1, f2 })
    local seq = lr_sequence(opt, sched, 10)
    for e = 0, 10 do
      close(seq[e + 1][1], 0.1 * f1(e), "group 1")
      close(seq[e + 1][2], 0.5 * f2(e), "group 2")
    end
    local opt2 = sgd({ 0.1, 0.5 })
    same_sequence(lr_sequence(opt2, optim.LambdaLR(opt2, { lr_lambda = { f1, f2 } }), 10), seq, "options form")
  end)

  it("LambdaLR: state_dict leaves the functions out and resumes the sequence", function()
    local opt_a = sgd({ 0.1 })
    local a = optim.LambdaLR(opt_a, f2)
    for _ = 1, 3 do a:step() end
    local sd = a:state_dict()
    assert.is_nil(sd.lr_lambdas)
    assert.is_nil(sd.optimizer)
    local opt_b = sgd({ 0.1 })
    local b = optim.LambdaLR(opt_b, f2)
    b:load_state_dict(sd)
    assert.are.equal(f2, b.lr_lambdas[1])
    for _ = 1, 5 do
      a:step(); b:step()
      assert.are.same(a:get_last_lr(), b:get_last_lr())
    end
  end)

  it("SequentialLR: the first scheduler until the milestone, then the next from its epoch 0", function()
    local opt = sgd({ 0.1, 0.5 })
    local warm = optim.LinearLR(opt, { start_factor = 0.1, total_iters = 5 })
    local cos = optim.CosineAnnealingLR(opt, { T_max = 15, eta_min = 0.001 })
    local sched = optim.SequentialLR(opt, { warm, cos }, { 5 })
    local seq = lr_sequence(opt, sched, 25)
    for e = 0, 25 do
      for i, b in ipairs { 0.1, 0.5 } do
        local want = e < 5 and b * (0.1 + 0.9 * e / 5) or 0.001 + (b - 0.001) * (1 + math.cos(math.pi * (e - 5) / 15)) / 2
        close(seq[e + 1][i], want, ("group %d epoch %d"):format(i, e))
      end
    end
    assert.are.equal(25, sched.last_epoch)
  end)

  it("SequentialLR: state_dict holds each scheduler's and resumes the sequence", function()
    local function make(opt)
      return optim.SequentialLR(opt, {
        schedulers = { optim.LinearLR(opt, { start_factor = 0.2, total_iters = 3 }), optim.ExponentialLR(opt, { gamma = 0.9 }) },
        milestones = { 3 },
      })
    end
    local opt_a = sgd({ 0.1 })
    local a = make(opt_a)
    for _ = 1, 4 do a:step() end
    local sd = a:state_dict()
    assert.are.equal(2, #sd._schedulers)
    assert.is_nil(sd._schedulers[1].optimizer)
    local opt_b = sgd({ 0.1 })
    local b = make(opt_b)
    opt_b:load_state_dict(opt_a:state_dict())
    b:load_state_dict(sd)
    for _ = 1, 6 do
      a:step(); b:step()
      assert.are.same(a:get_last_lr(), b:get_last_lr())
      assert.are.equal(opt_a.param_groups[1].lr, opt_b.param_groups[1].lr)
    end
  end)

  it("SequentialLR of LinearLR and WarmupCosineLR survives a train_state checkpoint", function()
    local train_state = require "ddplua.train_state"
    local files = require "files"
    local dir = files.tmpdir("sched")
    local function make()
      local opt = sgd({ 0.1, 0.3 }, { momentum = 0.9 })
      local s = optim.SequentialLR(opt, { optim.LinearLR(opt, { start_factor = 0.5, total_iters = 3 }),
        optim.WarmupCosineLR(opt, { warmup_iters = 2, lr_decay_iters = 12, min_lr = 0.01 }) }, { 3 })
      return opt, s
    end
    local opt_a, a = make()
    for _ = 1, 5 do a:step() end
    train_state.save(dir .. "/ckpt.safetensors", { optimizer = opt_a, scheduler = a, progress = { step = 5 } })
    local opt_b, b = make()
    local progress = train_state.load(dir .. "/ckpt.safetensors", { optimizer = opt_b, scheduler = b })
    files.remove(dir)
    assert.are.equal(5, progress.step)
    assert.are.equal(a.last_epoch, b.last_epoch)
    for _ = 1, 12 do
      a:step(); b:step()
      for i = 1, 2 do close(opt_b.param_groups[i].lr, opt_a.param_groups[i].lr, "group " .. i) end
    end
  end)

  it("WarmupCosineLR follows nanoGPT's get_lr, every group from its own base lr", function()
    local opt = sgd({ 1e-3, 5e-3 })
    local sched = optim.WarmupCosineLR(opt, { warmup_iters = 10, lr_decay_iters = 50, min_lr = 1e-4 })
    local seq = lr_sequence(opt, sched, 60)
    for e = 0, 60 do
      close(seq[e + 1][1], nanogpt_lr(e, 1e-3, 10, 50, 1e-4), "group 1 epoch " .. e)
      close(seq[e + 1][2], nanogpt_lr(e, 5e-3, 10, 50, 1e-4), "group 2 epoch " .. e)
    end
    close(seq[1][1], 1e-3 / 11, "first warm-up lr")
    close(seq[61][1], 1e-4, "min_lr after lr_decay_iters")
    assert.are.equal("LambdaLR", sched.name)
  end)

  it("errors name the argument, with PyTorch's texts", function()
    local opt = sgd({ 0.1, 0.2 })
    assert.matches("LambdaLR: Expected 2 lr_lambdas, but got 1", err_of(function() optim.LambdaLR(opt, { f1 }) end))
    assert.matches("LambdaLR: invalid lr_lambda", err_of(function() optim.LambdaLR(opt, 3) end))
    local bad = optim.LambdaLR(sgd({ 0.1 }), function() return 1 end)
    bad.lr_lambdas[1] = function() return "x" end
    assert.matches("lr_lambda of param group 1 returned string at epoch 1", err_of(function() bad:step() end))
    local other = sgd({ 0.1, 0.2 })
    local s1, s2 = optim.ExponentialLR(opt, { gamma = 0.5 }), optim.ExponentialLR(other, { gamma = 0.5 })
    assert.matches("SequentialLR: Sequential Schedulers expects all schedulers to belong to the same optimizer, but got schedulers at index 1",
      err_of(function() optim.SequentialLR(opt, { s1, s2 }, { 2 }) end))
    assert.matches("expects number of schedulers provided to be one more than the number of milestone points, but got number of schedulers 2 and the number of milestones to be equal to 0",
      err_of(function() optim.SequentialLR(opt, { s1, optim.StepLR(opt, { step_size = 1 }) }, {}) end))
    assert.matches("SequentialLR: invalid milestones%[2%]",
      err_of(function()
        optim.SequentialLR(opt, { s1, optim.StepLR(opt, { step_size = 1 }), optim.StepLR(opt, { step_size = 2 }) }, { 3, 2 })
      end))
    assert.matches("WarmupCosineLR: invalid lr_decay_iters 5",
      err_of(function() optim.WarmupCosineLR(opt, { warmup_iters = 5, lr_decay_iters = 5 }) end))
    assert.matches("WarmupCosineLR: unknown option 'warmup'", err_of(function() optim.WarmupCosineLR(opt, { warmup = 5 }) end))
    assert.matches("StepLR: step%(epoch%): epoch must be an integer >= 0", err_of(function() s1.name = "StepLR"; s1:step(-1) end))
  end)

  it("lr sequences equal PyTorch 1.13's (LambdaLR, SequentialLR of two and of three, warm-up + cosine)", function()
    local ref, why = pytorch.run [==[
import math
from torch.optim.lr_scheduler import LambdaLR, SequentialLR, LinearLR, CosineAnnealingLR, ExponentialLR, StepLR
def opt(lrs):
    return torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in lrs], lr=1.0)
def seq(o, s, n):
    out = [[g["lr"] for g in o.param_groups]]
    for _ in range(n):
        o.step(); s.step()
        out.append([g["lr"] for g in o.param_groups])
    return out
def nanogpt(it, lr=1e-3, warmup=10, decay=50, min_lr=1e-4):
    if it < warmup: return lr * (it + 1) / (warmup + 1)
    if it > decay: return min_lr
    r = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)
res = {}
o = opt([0.1, 0.5]); res["lambda"] = seq(o, LambdaLR(o, [lambda e: 0.95 ** e, lambda e: 1 / (e + 1)]), 20)
o = opt([0.1, 0.5])
res["seq2"] = seq(o, SequentialLR(o, [LinearLR(o, start_factor=0.1, total_iters=5),
                                      CosineAnnealingLR(o, T_max=15, eta_min=0.001)], milestones=[5]), 25)
o = opt([0.1, 0.5])
res["seq3"] = seq(o, SequentialLR(o, [LinearLR(o, start_factor=0.25, total_iters=4), ExponentialLR(o, gamma=0.9),
                                      StepLR(o, step_size=3, gamma=0.5)], milestones=[3, 8]), 20)
o = opt([1e-3]); res["warmup_cosine"] = seq(o, LambdaLR(o, lambda it: nanogpt(it) / 1e-3), 60)
print(json.dumps(res))
]==]
    if not ref then pending(why) return end
    local o = sgd({ 0.1, 0.5 })
    same_sequence(lr_sequence(o, optim.LambdaLR(o, { f1, f2 }), 20), ref.lambda, "LambdaLR")
    o = sgd({ 0.1, 0.5 })
    same_sequence(lr_sequence(o, optim.SequentialLR(o, { optim.LinearLR(o, { start_factor = 0.1, total_iters = 5 }),
      optim.CosineAnnealingLR(o, { T_max = 15, eta_min = 0.001 }) }, { 5 }), 25), ref.seq2, "SequentialLR of two")
    o = sgd({ 0.1, 0.5 })
    same_sequence(lr_sequence(o, optim.SequentialLR(o, { optim.LinearLR(o, { start_factor = 0.25, total_iters = 4 }),
      optim.ExponentialLR(o, { gamma = 0.9 }), optim.StepLR(o, { step_size = 3, gamma = 0.5 }) }, { 3, 8 }), 20),
      ref.seq3, "SequentialLR of three")
    o = sgd({ 1e-3 })
    same_sequence(lr_sequence(o, optim.WarmupCosineLR(o, { warmup_iters = 10, lr_decay_iters = 50, min_lr = 1e-4 }), 60),
      ref.warmup_cosine, "WarmupCosineLR")
  end)
end)
