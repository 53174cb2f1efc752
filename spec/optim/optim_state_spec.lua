-- Specs for the optimizer-state store (Note [optimizer state store] in
-- runtime/include/ddplua/optim_state.h): the C API through the FFI, the step function over
-- it (ddp_optim_step_param / _params: the same bits as the kernels called by hand), and the
-- Lua view opt.state (ddplua.optim.state) the optimizers keep their state in.
local dl = require "ddplua"
local optim = require "ddplua.optim"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local function ok(status) assert(status == 0, status ~= 0 and ffi.string(C.ddp_last_error()) or "") end

-- The error message of a failing status.
local function fails(status)
  assert.are_not.equal(0, status)
  return ffi.string(C.ddp_last_error())
end

local store_box = ffi.new("ddp_optim_state*[1]")
local function new_store()
  ok(C.ddp_optim_state_new(store_box))
  return ffi.gc(store_box[0], C.ddp_optim_state_free)
end

local tbox = ffi.new("ddp_tensor*[1]")
local nbox = ffi.new("double[1]")
local ibox = ffi.new("int[1]")
local sbox = ffi.new("const char*[1]")

local function get_tensor(s, p, name)
  ok(C.ddp_optim_state_get_tensor(s, p, name, tbox))
  return lib.wrap(tbox[0])
end

local function get_number(s, p, name)
  ok(C.ddp_optim_state_get_number(s, p, name, nbox))
  return nbox[0]
end

-- The names of p's entry, in order, joined by ",".
local function names(s, p)
  ok(C.ddp_optim_state_name_count(s, p, ibox))
  local out = {}
  for j = 0, ibox[0] - 1 do
    ok(C.ddp_optim_state_name_at(s, p, j, sbox, nil))
    out[#out + 1] = ffi.string(sbox[0])
  end
  return table.concat(out, ",")
end

local digest_box = ffi.new("uint64_t[1]")
-- The digest of t's raw bytes (bitwise comparison).
local function digest(t)
  ok(C.ddp_tensor_digest(digest_box, t))
  return tostring(digest_box[0])
end

local function param(values, dtype)
  return dl.tensor(values, { dtype = dtype or "f64" }):requires_grad_()
end

describe("optimizer-state store (C API)", function()
  it("keeps named tensors, numbers and booleans per parameter, tensors shared with the caller", function()
    local s = new_store()
    local p, q = param({ 1, 2 }), param({ 3 })
    assert.are.equal(0, tonumber(C.ddp_optim_state_count(s)))
    assert.are.equal(0, C.ddp_optim_state_has(s, p))
    local buf = dl.zeros({ 2 }, { dtype = "f64" })
    ok(C.ddp_optim_state_set_tensor(s, p, "momentum_buffer", buf))
    ok(C.ddp_optim_state_set_number(s, p, "step", 7))
    ok(C.ddp_optim_state_set_boolean(s, p, "flag", 1))
    assert.are.equal(1, C.ddp_optim_state_has(s, p))
    assert.are.equal(0, C.ddp_optim_state_has(s, q))
    assert.are.equal("momentum_buffer,step,flag", names(s, p))
    assert.are.equal(C.DDP_OPTIM_STATE_TENSOR, C.ddp_optim_state_kind(s, p, "momentum_buffer"))
    assert.are.equal(C.DDP_OPTIM_STATE_NUMBER, C.ddp_optim_state_kind(s, p, "step"))
    assert.are.equal(C.DDP_OPTIM_STATE_BOOLEAN, C.ddp_optim_state_kind(s, p, "flag"))
    assert.are.equal(C.DDP_OPTIM_STATE_NONE, C.ddp_optim_state_kind(s, p, "exp_avg"))
    assert.are.equal(7, get_number(s, p, "step"))
    assert.are.equal(1, get_number(s, p, "flag"))
    -- the same tensor: an in-place change by the caller is what the store holds
    buf:fill_(5)
    assert.are.same({ 5, 5 }, get_tensor(s, p, "momentum_buffer"):tolist())
    -- setting a name again replaces its value whatever its kind, in place in the order
    ok(C.ddp_optim_state_set_number(s, p, "momentum_buffer", 1))
    assert.are.equal("momentum_buffer,step,flag", names(s, p))
    assert.are.equal(1, get_number(s, p, "momentum_buffer"))
    ok(C.ddp_optim_state_remove(s, p, "step"))
    assert.are.equal("momentum_buffer,flag", names(s, p))
    ok(C.ddp_optim_state_set_tensor(s, p, "flag", nil)) -- NULL removes the name
    assert.are.equal("momentum_buffer", names(s, p))
    assert.is_nil(get_tensor(s, q, "exp_avg")) -- no entry: NULL, not an error
    ok(C.ddp_optim_state_add(s, q))            -- an empty entry counts
    assert.are.equal(2, tonumber(C.ddp_optim_state_count(s)))
    assert.are.equal("", names(s, q))
  end)

  it("holds a reference to the parameter: its entry outlives the caller's last reference", function()
    local s = new_store()
    local shape = ffi.new("int64_t[1]", 3)
    ok(C.ddp_tensor_zeros(tbox, 1, shape, C.DDP_F64, -1))
    local raw = tbox[0]
    ok(C.ddp_optim_state_set_number(s, raw, "step", 1))
    C.ddp_tensor_release(raw) -- the caller's only reference
    ok(C.ddp_optim_state_param_at(s, 0, tbox))
    local back = lib.wrap(tbox[0])
    assert.are.equal(1, C.ddp_tensor_is_alive(back))
    assert.are.same({ 0, 0, 0 }, back:tolist())
    assert.are.equal(1, get_number(s, back, "step"))
    C.ddp_optim_state_clear(s)
    assert.are.equal(0, tonumber(C.ddp_optim_state_count(s)))
  end)

  it("finds each of many parameters' entries, in creation order, also after entries are cleared", function()
    local s = new_store()
    local ps = {}
    for i = 1, 300 do
      ps[i] = param({ i })
      ok(C.ddp_optim_state_set_number(s, ps[i], "step", i))
    end
    for i = 1, 300 do assert.are.equal(i, get_number(s, ps[i], "step")) end
    for i = 1, 300, 3 do ok(C.ddp_optim_state_clear_entry(s, ps[i])) end
    assert.are.equal(200, tonumber(C.ddp_optim_state_count(s)))
    for i = 1, 300 do
      assert.are.equal(i % 3 == 1 and 0 or 1, C.ddp_optim_state_has(s, ps[i]), "parameter " .. i)
      if i % 3 ~= 1 then assert.are.equal(i, get_number(s, ps[i], "step")) end
    end
    -- iteration sees every remaining entry once
    local seen = {}
    for k = 0, 199 do
      ok(C.ddp_optim_state_param_at(s, k, tbox))
      local p = lib.wrap(tbox[0])
      local v = get_number(s, p, "step")
      assert.is_nil(seen[v])
      seen[v] = true
    end
    -- copy_entry: shares the tensors, replaces what the destination had
    local d = new_store()
    local t = dl.ones({ 1 }, { dtype = "f64" })
    ok(C.ddp_optim_state_set_tensor(s, ps[2], "exp_avg", t))
    ok(C.ddp_optim_state_set_number(d, ps[2], "other", 1))
    ok(C.ddp_optim_state_copy_entry(d, s, ps[2]))
    assert.are.equal("step,exp_avg", names(d, ps[2]))
    t:fill_(4)
    assert.are.same({ 4 }, get_tensor(d, ps[2], "exp_avg"):tolist())
    ok(C.ddp_optim_state_copy_entry(d, s, ps[1])) -- none in src: none in dst
    assert.are.equal(0, C.ddp_optim_state_has(d, ps[1]))
  end)

  it("raises clear errors naming the call and the argument", function()
    local s = new_store()
    local p = param({ 1, 2 })
    assert.matches("optim_state_set_tensor: NULL store", fails(C.ddp_optim_state_set_tensor(nil, p, "x", p)), 1, true)
    assert.matches("optim_state_set_number: NULL name", fails(C.ddp_optim_state_set_number(s, p, nil, 1)), 1, true)
    assert.matches("a state name has 1 to 63 bytes, got 0", fails(C.ddp_optim_state_set_number(s, p, "", 1)), 1, true)
    assert.matches("got 64", fails(C.ddp_optim_state_set_number(s, p, ("x"):rep(64), 1)), 1, true)
    assert.matches("optim_state_get_number: the parameter has no state entry (asked for 'step')",
      fails(C.ddp_optim_state_get_number(s, p, "step", nbox)), 1, true)
    ok(C.ddp_optim_state_set_tensor(s, p, "exp_avg", dl.zeros({ 2 }, { dtype = "f64" })))
    assert.matches("the parameter's state has no 'step'", fails(C.ddp_optim_state_get_number(s, p, "step", nbox)), 1, true)
    assert.matches("state 'exp_avg' is a tensor, not a number", fails(C.ddp_optim_state_get_number(s, p, "exp_avg", nbox)), 1, true)
    ok(C.ddp_optim_state_set_number(s, p, "step", 1))
    assert.matches("optim_state_get_tensor: state 'step' is a number, not a tensor",
      fails(C.ddp_optim_state_get_tensor(s, p, "step", tbox)), 1, true)
    assert.matches("shares its storage with its parameter", fails(C.ddp_optim_state_set_tensor(s, p, "exp_avg", p:view({ 2 }))), 1, true)
    assert.matches("entry 5 out of range (the store has 1 entries)", fails(C.ddp_optim_state_param_at(s, 5, tbox)), 1, true)
    assert.matches("name 3 out of range (the entry has 2 names)", fails(C.ddp_optim_state_name_at(s, p, 3, sbox, nil)), 1, true)
    local freed = param({ 1 })
    freed:free()
    assert.matches("freed", fails(C.ddp_optim_state_add(s, freed)), 1, true)
  end)
end)

describe("ddp_optim_step_param over the store", function()
  local cfg = ffi.new("ddp_optim_config")

  -- A fresh f64 parameter, its gradient, and a copy of both.
  local function pair()
    local v, g = { 0.5, -1.25, 2, 0.75 }, { 0.1, -0.3, 0.2, 0.05 }
    return param(v), dl.tensor(g, { dtype = "f64" }), param(v), dl.tensor(g, { dtype = "f64" })
  end

  it("SGD, Adam, AdamW and Adadelta give the bits of the kernels called by hand, creating the state lazily", function()
    -- SGD with momentum and nesterov
    local s = new_store()
    local p, g, rp, rg = pair()
    cfg.kind, cfg.lr, cfg.momentum, cfg.dampening, cfg.weight_decay = C.DDP_OPTIM_SGD, 0.1, 0.9, 0, 0.01
    cfg.nesterov, cfg.maximize = 1, 0
    local buf = dl.zeros({ 4 }, { dtype = "f64" })
    for k = 1, 3 do
      ok(C.ddp_optim_step_param(s, cfg, p, g))
      ok(C.ddp_sgd_step_(rp, rg, buf, 0.1, 0.9, 0, 0.01, 1, 0, k == 1 and 1 or 0))
    end
    assert.are.equal(digest(rp), digest(p))
    assert.are.equal(digest(buf), digest(get_tensor(s, p, "momentum_buffer")))
    assert.are.equal("momentum_buffer", names(s, p))
    -- SGD without momentum: an empty entry
    cfg.momentum, cfg.nesterov = 0, 0
    local q = param({ 1 })
    ok(C.ddp_optim_step_param(s, cfg, q, dl.tensor({ 1 }, { dtype = "f64" })))
    assert.are.equal(1, C.ddp_optim_state_has(s, q))
    assert.are.equal("", names(s, q))
    -- Adam / AdamW with amsgrad
    for _, case in ipairs { { C.DDP_OPTIM_ADAM, C.ddp_adam_step_ }, { C.DDP_OPTIM_ADAMW, C.ddp_adamw_step_ } } do
      local s2 = new_store()
      p, g, rp, rg = pair()
      cfg.kind, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay = case[1], 0.01, 0.9, 0.99, 1e-8, 0.1
      cfg.amsgrad, cfg.maximize = 1, 0
      local m, v, vm = dl.zeros({ 4 }, { dtype = "f64" }), dl.zeros({ 4 }, { dtype = "f64" }), dl.zeros({ 4 }, { dtype = "f64" })
      for k = 1, 3 do
        ok(C.ddp_optim_step_param(s2, cfg, p, g))
        ok(case[2](rp, rg, m, v, vm, k, 0.01, 0.9, 0.99, 1e-8, 0.1, 1, 0))
      end
      assert.are.equal(digest(rp), digest(p))
      assert.are.equal(digest(m), digest(get_tensor(s2, p, "exp_avg")))
      assert.are.equal(digest(v), digest(get_tensor(s2, p, "exp_avg_sq")))
      assert.are.equal(digest(vm), digest(get_tensor(s2, p, "max_exp_avg_sq")))
      assert.are.equal(3, get_number(s2, p, "step"))
    end
    -- Adadelta
    local s3 = new_store()
    p, g, rp, rg = pair()
    cfg.kind, cfg.lr, cfg.rho, cfg.eps, cfg.weight_decay, cfg.maximize = C.DDP_OPTIM_ADADELTA, 1.0, 0.9, 1e-6, 0, 1
    local sq, acc = dl.zeros({ 4 }, { dtype = "f64" }), dl.zeros({ 4 }, { dtype = "f64" })
    for _ = 1, 3 do
      ok(C.ddp_optim_step_param(s3, cfg, p, g))
      ok(C.ddp_adadelta_step_(rp, rg, sq, acc, 1.0, 0.9, 1e-6, 0, 1))
    end
    assert.are.equal(digest(rp), digest(p))
    assert.are.equal(digest(acc), digest(get_tensor(s3, p, "acc_delta")))
    assert.are.equal(3, get_number(s3, p, "step"))
  end)

  it("ddp_optim_step_params skips parameters without a gradient; foreach gives the per-parameter bits", function()
    local a, b = new_store(), new_store()
    local pa = { param({ 1, 2 }), param({ 3 }), param({ 4, 5, 6 }) }
    local pb = { param({ 1, 2 }), param({ 3 }), param({ 4, 5, 6 }) }
    local arr_a, arr_b = ffi.new("ddp_tensor*[3]", pa), ffi.new("ddp_tensor*[3]", pb)
    cfg.kind, cfg.lr, cfg.momentum, cfg.dampening, cfg.weight_decay = C.DDP_OPTIM_SGD, 0.1, 0.9, 0.1, 0
    cfg.nesterov, cfg.maximize = 0, 0
    for k = 1, 3 do
      for i = 1, 3 do
        if i ~= 2 then
          pa[i].grad = dl.ones(pa[i]:size(), { dtype = "f64" }) * k
          pb[i].grad = dl.ones(pb[i]:size(), { dtype = "f64" }) * k
        end
      end
      cfg.foreach = 1
      ok(C.ddp_optim_step_params(a, cfg, 3, arr_a))
      cfg.foreach = 0
      ok(C.ddp_optim_step_params(b, cfg, 3, arr_b))
    end
    assert.are.equal(0, C.ddp_optim_state_has(a, pa[2]))
    assert.are.equal(2, tonumber(C.ddp_optim_state_count(a)))
    for i = 1, 3, 2 do
      assert.are.equal(digest(pb[i]), digest(pa[i]))
      assert.are.equal(digest(get_tensor(b, pb[i], "momentum_buffer")), digest(get_tensor(a, pa[i], "momentum_buffer")))
    end
  end)

  it("raises naming the kind, the parameter and the state at fault", function()
    local s = new_store()
    local p = param({ 1, 2 })
    local g = dl.tensor({ 1, 1 }, { dtype = "f64" })
    cfg.kind = 9
    assert.matches("optim_step_param: unknown optimizer kind 9", fails(C.ddp_optim_step_param(s, cfg, p, g)), 1, true)
    cfg.kind, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.amsgrad = C.DDP_OPTIM_ADAM, 0.1, 0.9, 0.99, 1e-8, 0, 0
    assert.matches("optim_step_param: NULL grad", fails(C.ddp_optim_step_param(s, cfg, p, nil)), 1, true)
    ok(C.ddp_optim_state_set_number(s, p, "step", 1.5))
    assert.matches("adam_step_: state 'step' must be a count >= 0, got 1.5", fails(C.ddp_optim_step_param(s, cfg, p, g)), 1, true)
    ok(C.ddp_optim_state_set_number(s, p, "step", 1))
    ok(C.ddp_optim_state_set_tensor(s, p, "exp_avg", dl.zeros({ 3 }, { dtype = "f64" })))
    ok(C.ddp_optim_state_set_tensor(s, p, "exp_avg_sq", dl.zeros({ 2 }, { dtype = "f64" })))
    assert.matches("adam_step_: exp_avg has shape (3,) but param has shape (2,)", fails(C.ddp_optim_step_param(s, cfg, p, g)), 1, true)
    assert.are.equal(1, get_number(s, p, "step")) -- a failed step counts nothing
    p.grad = g
    local arr = ffi.new("ddp_tensor*[2]", { param({ 0 }), p })
    assert.matches("(parameter 1)", fails(C.ddp_optim_step_params(s, cfg, 2, arr)), 1, true)
  end)
end)

describe("opt.state, the view over the store", function()
  it("is nil before a parameter's first step, then the entry; tensors are the storage the step updates", function()
    local p = param({ 1, -2 })
    local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.9 })
    assert.is_nil(opt.state[p])
    p.grad = dl.tensor({ 1, 1 }, { dtype = "f64" })
    opt:step()
    local buf = opt.state[p].momentum_buffer
    assert.are.same({ 1, 1 }, buf:tolist())
    opt:step() -- b = 0.9 b + g: the handle read before sees it
    assert.are.same({ 1.9, 1.9 }, buf:tolist())
    -- an in-place change of the buffer is what the next step reads
    buf:zero_()
    opt:step()
    assert.are.same({ 1, 1 }, opt.state[p].momentum_buffer:tolist())
    -- another handle of the same tensor finds the same entry
    C.ddp_tensor_retain(p)
    local p2 = lib.wrap(ffi.cast("ddp_tensor*", p))
    assert.are.same({ 1, 1 }, opt.state[p2].momentum_buffer:tolist())
  end)

  it("takes assignments of values and entries, and iterates with items() (no pairs: LuaJIT has no __pairs)", function()
    local p, q = param({ 1, 2 }), param({ 3 })
    local opt = optim.Adam({ p, q }, { lr = 0.1 })
    p.grad = dl.tensor({ 1, 1 }, { dtype = "f64" })
    opt:step()
    assert.are.equal(1, opt.state[p].step)
    opt.state[p].step = 5
    assert.are.equal(5, opt.state[p].step)
    local e = dl.ones({ 2 }, { dtype = "f64" })
    opt.state[p].exp_avg = e
    e:fill_(3) -- assignment shares the tensor
    assert.are.same({ 3, 3 }, opt.state[p].exp_avg:tolist())
    opt.state[q] = { step = 2, exp_avg = dl.zeros({ 1 }, { dtype = "f64" }), exp_avg_sq = dl.zeros({ 1 }, { dtype = "f64" }) }
    assert.are.equal(2, opt:state_dict().state[1].step)
    local seen = {}
    for k, entry in opt.state:items() do
      seen[#seen + 1] = k
      local n = 0
      for name, v in entry:items() do
        n = n + 1
        assert.are.equal(entry[name], v)
      end
      assert.are.equal(3, n)
    end
    assert.are.equal(2, #seen)
    assert.are.equal(p, seen[1]) -- the optimizer's own handles
    assert.are.equal(q, seen[2])
    assert.are.equal(2, opt.state:count())
    opt.state[q] = nil
    assert.is_nil(opt.state[q])
    assert.are.equal(1, opt.state:count())
    assert.has_error(function() opt.state.x = {} end, "optimizer state: keys are parameters (tensors), got a string")
    assert.has_error(function() opt.state[p].exp_avg = "x" end,
      "optimizer state: exp_avg must be a tensor, a number or a boolean, got a string")
    opt.state:clear()
    assert.is_nil(opt.state[p])
    -- state assigned to a tensor the optimizer does not hold yet does not make it one of its
    -- parameters: add_param_group takes it afterwards
    local r = param({ 7 })
    opt.state[r] = { step = 1 }
    opt:add_param_group({ params = { r } })
    assert.are.equal(1, opt.state[r].step)
  end)

  it("load_state_dict then step is bitwise the uninterrupted run (SGD nesterov, Adam amsgrad, AdamW, Adadelta)", function()
    local cases = {
      { optim.SGD, { lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 0.01 } },
      { optim.SGD, { lr = 0.1, momentum = 0.9, foreach = false } },
      { optim.Adam, { lr = 0.05, amsgrad = true } },
      { optim.AdamW, { lr = 0.05, weight_decay = 0.1 } },
      { optim.Adadelta, { lr = 1.0 } },
    }
    local grads = { { 0.1, -0.2, 0.3 }, { -0.5, 0.25, 0.125 }, { 0.3, 0.3, -0.1 }, { 0.05, -0.7, 0.2 } }
    for _, case in ipairs(cases) do
      local cls, args = case[1], case[2]
      local function run_steps(opt, p, from, to)
        for k = from, to do
          p.grad = dl.tensor(grads[k], { dtype = "f64" })
          opt:step()
        end
      end
      local whole = param({ 1, 2, 3 })
      local ow = cls({ whole }, args)
      run_steps(ow, whole, 1, 4)
      local first = param({ 1, 2, 3 })
      local of = cls({ first }, args)
      run_steps(of, first, 1, 2)
      local sd = of:state_dict()
      local resumed = param(first:tolist())
      local orr = cls({ resumed }, args)
      orr:load_state_dict(sd)
      run_steps(orr, resumed, 3, 4)
      assert.are.equal(digest(whole), digest(resumed), cls.name)
      for name, v in ow.state[whole]:items() do
        if dl.is_tensor(v) then assert.are.equal(digest(v), digest(orr.state[resumed][name]), cls.name .. " " .. name)
        else assert.are.equal(v, orr.state[resumed][name]) end
      end
    end
  end)
end)
