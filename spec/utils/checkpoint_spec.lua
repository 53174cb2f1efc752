-- Specs for activation checkpointing: dl.utils.checkpoint, dl.utils.checkpoint_sequential
-- (ddplua.utils.checkpoint, Note [checkpoint node]), nn.CheckpointWrapper and
-- ddplua.nn.activation_checkpointing. The DDP side is in
-- spec/distributed/ddp_checkpoint_spec.lua.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local gradcheck = require("gradcheck").gradcheck

-- Every parameter's gradient, and the listed tensors', as lists (exact values).
local function grads_of(model, extra)
  local out = {}
  for name, p in model:named_parameters() do out[name] = p.grad and p.grad:tolist() or "none" end
  for k, t in pairs(extra or {}) do out[k] = t.grad and t.grad:tolist() or "none" end
  return out
end

local function zero(model, extra)
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  for _, t in pairs(extra or {}) do t.grad = nil end
end

-- fn raises an error whose text starts with msg (the runtime's add the C file and line).
local function raises(msg, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error")
  assert.matches(msg, tostring(err), 1, true)
end

local function mlp(depth, width, dropout)
  dl.manual_seed(7)
  local layers = {}
  for i = 1, depth do
    layers[#layers + 1] = nn.Linear(width, width)
    layers[#layers + 1] = nn.Tanh()
    if dropout then layers[#layers + 1] = nn.Dropout(dropout) end
  end
  return nn.Sequential(layers)
end

describe("dl.utils.checkpoint", function()
  it("gives an MLP the gradients of the run without it, bit for bit", function()
    local m = mlp(4, 8)
    local x = dl.randn({ 5, 8 }, { generator = dl.Generator(1) })
    x.requires_grad = true
    local y = dl.utils.checkpoint(m, x)
    assert.equal("CheckpointBackward", y.grad_fn)
    y:pow(2):sum():backward()
    local got = grads_of(m, { x = x })
    zero(m, { x })
    m(x):pow(2):sum():backward()
    assert.same(grads_of(m, { x = x }), got)
  end)

  it("checkpoint_sequential splits an nn.Sequential or a list into segments, same gradients", function()
    local m = mlp(6, 6)
    local x = dl.randn({ 4, 6 }, { generator = dl.Generator(2) })
    m(x):sum():backward()
    local ref = grads_of(m)
    for _, segments in ipairs { 1, 2, 3, 5 } do
      zero(m)
      local y = dl.utils.checkpoint_sequential(m, segments, x)
      y:sum():backward()
      assert.same(ref, grads_of(m), "segments = " .. segments)
    end
    zero(m)
    dl.utils.checkpoint_sequential(m:children(), 4, x):sum():backward()
    assert.same(ref, grads_of(m))
    raises("checkpoint_sequential: segments must be an integer between 1 and the number of functions (12), got 0",
      function() dl.utils.checkpoint_sequential(m, 0, x) end)
  end)

  it("replays the random state: dropout inside gives the masks and gradients of the run without it", function()
    local m = mlp(3, 16, 0.5)
    local x = dl.randn({ 6, 16 }, { generator = dl.Generator(3) })
    dl.manual_seed(11)
    local y_ref = m(x)
    y_ref:sum():backward()
    local after_ref = dl.rand({ 4 }):tolist() -- the stream goes on as without checkpointing
    local ref = grads_of(m)
    zero(m)
    dl.manual_seed(11)
    local y = dl.utils.checkpoint(m, x)
    dl.rand({ 1 }) -- draws between forward and backward do not reach the recomputation
    assert.same(y_ref:tolist(), y:tolist())
    y:sum():backward()
    assert.same(ref, grads_of(m))
    dl.manual_seed(11)
    local y2 = dl.utils.checkpoint(m, x)
    assert.same(after_ref, dl.rand({ 4 }):tolist())
    y2:sum():backward(); zero(m)
    -- preserve_rng_state = false: the recomputation draws other masks (as PyTorch's)
    dl.manual_seed(11)
    dl.utils.checkpoint({ preserve_rng_state = false }, m, x):sum():backward()
    assert.are_not.same(ref, grads_of(m))
  end)

  it("passes a finite-difference check in f64 (arguments, a captured parameter, two outputs)", function()
    local w = dl.randn({ 3 }, { dtype = "f64", generator = dl.Generator(4) })
    assert.is_true(gradcheck(function(x, v, w2)
      local a, b = dl.utils.checkpoint(function(t, u)
        local h = (t * w2):tanh() -- w2 captured, not an argument
        return h * u, h:exp()
      end, x, v)
      return a + b * w
    end, { dl.randn({ 2, 3 }, { dtype = "f64" }), dl.randn({ 3 }, { dtype = "f64" }), w:clone() }))
  end)

  it("takes several inputs and outputs, inputs without grad, non-tensor values", function()
    local w = dl.tensor({ 0.5, -1.5, 2 }, { dtype = "f64", requires_grad = true })
    local x = dl.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
    local c = dl.tensor({ 3, 1, 2 }, { dtype = "f64" }) -- no grad
    local function seg(t, k, s, u)
      assert.equal("scale", s)
      local h = (t * w):tanh() * k + u
      return h, "tag", h:argmax(), (h * t):sum(), 42
    end
    local function run(f)
      local h, tag, idx, s, n = f(seg, x, 2.5, "scale", c)
      ;(h:pow(2):sum() + s * 3):backward()
      return { h:tolist(), tag, idx:tolist(), s:tolist(), n, w.grad:tolist(), x.grad:tolist() }
    end
    local got = run(dl.utils.checkpoint)
    w.grad, x.grad = nil, nil
    local ref = run(function(f, ...) return f(...) end)
    assert.same(ref, got)
  end)

  it("fires a parameter's post-accumulate hook once, used inside and outside the segment", function()
    local w = dl.tensor({ 0.5, -1.5 }, { dtype = "f64", requires_grad = true })
    local x = dl.tensor({ 1, 2 }, { dtype = "f64", requires_grad = true })
    local fired = 0
    w:register_post_accumulate_grad_hook(function() fired = fired + 1 end)
    local seg = function(t) return (t * w):tanh() * w end
    ;(dl.utils.checkpoint(seg, x * 2) * w):sum():backward()
    assert.equal(1, fired) -- PyTorch's non-reentrant semantics (the reentrant one fires twice)
    local gw, gx = w.grad:tolist(), x.grad:tolist()
    w.grad, x.grad = nil, nil
    ;(seg(x * 2) * w):sum():backward()
    for i = 1, 2 do
      assert.near(w.grad:tolist()[i], gw[i], 1e-14) -- two contributions, summed in another order
      assert.equal(x.grad:tolist()[i], gx[i])
    end
  end)

  it("shows a parameter's register_hook hook the whole gradient once, as without checkpointing", function()
    local w = dl.tensor({ 0.5, -1.5 }, { dtype = "f64", requires_grad = true })
    local x = dl.tensor({ 1, 2 }, { dtype = "f64", requires_grad = true })
    local seen = {}
    w:register_hook(function(g) seen[#seen + 1] = g:tolist() end)
    local seg = function(t) return (t * w):tanh() * w end
    ;(dl.utils.checkpoint(seg, x * 2) * w):sum():backward()
    local got = seen
    seen = {}
    ;(seg(x * 2) * w):sum():backward()
    assert.equal(1, #seen)
    assert.equal(1, #got) -- not once more with the segment's part during the recomputation
    for i = 1, 2 do assert.near(seen[1][i], got[1][i], 1e-14) end
  end)

  it("nests, returns inputs and views, and runs plainly under no_grad", function()
    local m = mlp(2, 4)
    local x = dl.randn({ 3, 4 }, { generator = dl.Generator(5) })
    x.requires_grad = true
    local function inner(t) return m[3](m[2](m[1](t))) end
    local y = dl.utils.checkpoint(function(t)
      return m[4](dl.utils.checkpoint(inner, t)):transpose(1, 2)
    end, x)
    y:sum():backward()
    local got = grads_of(m, { x = x })
    zero(m, { x })
    m(x):sum():backward()
    assert.same(grads_of(m, { x = x }), got)
    zero(m, { x })
    local same = dl.utils.checkpoint(function(t) return t end, x)
    ;(same * 3):sum():backward()
    assert.same({ 3, 3, 3, 3 }, x.grad:tolist()[1])
    local z = dl.no_grad(function() return dl.utils.checkpoint(m, x) end)
    assert.is_nil(z.grad_fn)
  end)

  it("frees the segment's activations after forward", function()
    local width, depth = 256, 8
    local m = mlp(depth, width)
    local x = dl.randn({ 64, width }, { generator = dl.Generator(6) })
    local function live_after(fn)
      collectgarbage("collect")
      local before = dl.memory_stats().live
      local y = fn()
      collectgarbage("collect")
      local held = dl.memory_stats().live - before
      y:sum():backward()
      return held
    end
    local plain = live_after(function() return m(x) end)
    local ck = live_after(function() return dl.utils.checkpoint(m, x) end)
    -- without: a (64, 256) f32 tensor per layer at least; with: the output only
    assert.is_true(plain >= depth * 64 * width * 4, "plain " .. plain)
    assert.is_true(ck <= 2 * 64 * width * 4, "checkpointed " .. ck)
  end)

  -- Pending: in the full suite's process this step peaked at twice the plain one (38 vs
  -- 19 MB, with the JIT on or off), and in a fresh `ddplua` process at 13.1 vs 14.7 MB;
  -- alone under busted it passes. What checkpointing saves still depends on when the
  -- collector frees a segment's dead handles (README, activation checkpointing, "Known
  -- limit"); deterministic tensor lifetimes are to make this spec hold everywhere.
  pending("lowers the peak memory of a training step (Note [checkpoint collection])", function()
    local m = mlp(8, 256)
    local x = dl.randn({ 1024, 256 }, { generator = dl.Generator(7) })
    local function peak_of(forward)
      forward():sum():backward() -- the gradients exist from then on
      collectgarbage("collect")
      local base = dl.memory_stats().live
      dl.reset_peak_memory()
      forward():sum():backward()
      return dl.memory_stats().peak - base
    end
    local plain = peak_of(function() return m(x) end)
    local ck = peak_of(function() return dl.utils.checkpoint_sequential(m, 4, x) end)
    -- 16 activations of 1 MiB without; with: 3 boundaries, the last segment's 4 and one
    -- recomputed segment's at a time, with the collector's help
    assert.is_true(plain >= 16 * 2 ^ 20, "plain " .. plain)
    assert.is_true(ck < 0.75 * plain, ("checkpointed %d, plain %d"):format(ck, plain))
  end)

  it("raises PyTorch's errors, naming what is at fault", function()
    local x = dl.randn({ 2, 3 }, { requires_grad = true })
    local h = x * 2
    raises("checkpoint: the checkpointed function uses a tensor that requires grad, computed outside "
      .. "it by MulBackward, without taking it as an argument (pass that tensor to checkpoint "
      .. "as an argument of the function)", function() dl.utils.checkpoint(function(t) return t + h end, x) end)
    raises("checkpoint: use_reentrant = true is not supported: ddplua implements the non-reentrant "
      .. "variant (use_reentrant = false), which PyTorch recommends",
      function() dl.utils.checkpoint({ use_reentrant = true }, function(t) return t end, x) end)
    raises("checkpoint: function must be a function or a callable module, got number",
      function() dl.utils.checkpoint(42, x) end)
    local ok, err = pcall(dl.utils.checkpoint, { preserve_rng_stat = false }, function(t) return t end, x)
    assert.is_false(ok)
    assert.matches("unknown option 'preserve_rng_stat'", err, 1, true)
    raises("checkpoint: the differentiable outputs must share one dtype and device: output 1 is "
      .. "f32 on cpu, output 2 is f64 on cpu",
      function() dl.utils.checkpoint(function(t) return t * 2, (t * 3):double() end, x) end)
    local calls = 0
    local y = dl.utils.checkpoint(function(t)
      calls = calls + 1
      return calls == 1 and t * 2 or (t * 2):sum()
    end, x)
    ok, err = pcall(function() y:sum():backward() end)
    assert.is_false(ok)
    assert.matches("Recomputed values for the following tensors have different metadata", err, 1, true)
  end)
end)

describe("nn.CheckpointWrapper", function()
  local cw = require "ddplua.nn.activation_checkpointing"

  it("wraps a module: same parameters, same gradients, PyTorch's child name", function()
    local m = mlp(3, 5)
    local x = dl.randn({ 2, 5 }, { generator = dl.Generator(8) })
    m(x):sum():backward()
    local ref = grads_of(m)
    zero(m)
    local wrapped = nn.CheckpointWrapper(m)
    assert.equal(m, wrapped._checkpoint_wrapped_module)
    assert.equal(#m:parameters(), #wrapped:parameters())
    local y = wrapped(x)
    assert.equal("CheckpointBackward", y.grad_fn)
    y:sum():backward()
    assert.same(ref, grads_of(m))
    local names = {}
    for name in wrapped:named_parameters() do names[#names + 1] = name end
    assert.equal("_checkpoint_wrapped_module.0.weight", names[1])
  end)

  it("apply_activation_checkpointing wraps the submodules check_fn picks", function()
    local m = mlp(3, 5)
    local x = dl.randn({ 2, 5 }, { generator = dl.Generator(9) })
    m(x):sum():backward()
    local ref = {}
    for i, p in ipairs(m:parameters()) do ref[i] = p.grad:tolist() end
    zero(m)
    cw.apply_activation_checkpointing(m, { check_fn = function(c) return getmetatable(c) == nn.Linear end })
    assert.equal(cw.CheckpointWrapper, getmetatable(m[1]))
    assert.equal(nn.Tanh, getmetatable(m[2]))
    m(x):sum():backward()
    for i, p in ipairs(m:parameters()) do assert.same(ref[i], p.grad:tolist()) end
    raises("checkpoint_wrapper: checkpoint_impl must be CheckpointImpl.NO_REENTRANT (ddplua implements "
      .. "the non-reentrant checkpoint only), got reentrant",
      function() cw.checkpoint_wrapper(nn.Tanh(), { checkpoint_impl = cw.CheckpointImpl.REENTRANT }) end)
  end)
end)
