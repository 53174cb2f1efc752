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
