-- dl.autocast("cpu") follows PyTorch 1.13's CPU autocast lists (issue 23, item 7; Note
-- [autocast policy] in runtime/ops/autocast.c). ddplua used PyTorch's CUDA lists on both
-- device types, so softmax, log_softmax and sum of a bf16 input came out f32 where PyTorch's
-- CPU autocast gives bf16.
--
-- PYTORCH_1_13_CPU is the output dtype of each op under
--   with torch.autocast("cpu", dtype=torch.bfloat16): ...
-- for a bf16 input and for an f32 input, measured with Debian's python3-torch 1.13.1 on this
-- kind of machine (script: for each op, build its inputs in that dtype, call the op inside
-- the region, print the result's dtype). batch_norm and layer_norm take f32 weight and bias
-- as nn.BatchNorm2d and nn.LayerNorm hold them; 1.13 raises for layer_norm of a bf16 input
-- with f32 parameters ("expected scalar type BFloat16 but found Float"), where ddplua runs it
-- in f32 and gives bf16 (the note says why), so that row records ddplua's choice.
local dl = require "ddplua"
local F = require("ddplua.nn").functional
local cuda = require "cuda"

local PYTORCH_1_13_CPU = { -- op = {output for a bf16 input, output for an f32 input}
  matmul = { "bf16", "bf16" }, bmm = { "bf16", "bf16" }, linear = { "bf16", "bf16" },
  conv2d = { "bf16", "bf16" },
  softmax = { "bf16", "f32" }, log_softmax = { "bf16", "f32" },
  sum = { "bf16", "f32" }, mean = { "bf16", "f32" }, exp = { "bf16", "f32" }, log = { "bf16", "f32" },
  cross_entropy = { "f32", "f32" }, nll_loss = { "f32", "f32" }, mse_loss = { "f32", "f32" },
  batch_norm = { "bf16", "f32" },
  layer_norm = { "bf16", "f32" }, -- 1.13: raises for the bf16 input (see above)
}

-- PyTorch 1.13's CUDA lists (aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten,
-- Autocast, ...): lower_precision_fp, fp32, fp32_set_opt_dtype) for an f16 input (CUDA's
-- default) and an f32 input, read from the source (no GPU here to run them): mean and
-- batch_norm are in no list; cross_entropy_loss is in none either, but its log_softmax and
-- nll_loss parts are f32. Checked on the simulated device, whose tensors autocast treats
-- as CUDA tensors.
local PYTORCH_1_13_CUDA = {
  matmul = { "f16", "f16" }, bmm = { "f16", "f16" }, linear = { "f16", "f16" },
  conv2d = { "f16", "f16" },
  softmax = { "f32", "f32" }, log_softmax = { "f32", "f32" }, sum = { "f32", "f32" },
  mean = { "f16", "f32" }, exp = { "f32", "f32" }, log = { "f32", "f32" },
  cross_entropy = { "f32", "f32" }, nll_loss = { "f32", "f32" }, mse_loss = { "f32", "f32" },
  batch_norm = { "f16", "f32" }, layer_norm = { "f32", "f32" },
}

-- Each op on inputs of dtype dt on `device` (weights and statistics of the normalisations
-- in f32), as source text: the CUDA column runs it in a child process with the simulated
-- device. Returns function(dl, F, dt, device) -> {name = fn}.
local OPS = [==[
return function(dl, F, dt, device)
  local gen = dl.Generator(5)
  local function r(shape) return dl.randn(shape, { generator = gen }):to(device, dt) end
  local function f32(t) return t:to(device) end
  local labels = dl.tensor({ 0, 1, 2, 3 }, { dtype = "i64" }):to(device)
  return {
    matmul = function() return dl.matmul(r { 4, 5 }, r { 5, 3 }) end,
    bmm = function() return dl.bmm(r { 2, 4, 5 }, r { 2, 5, 3 }) end,
    linear = function() return F.linear(r { 4, 5 }, r { 3, 5 }, r { 3 }) end,
    conv2d = function() return dl.conv2d(r { 1, 2, 5, 5 }, r { 3, 2, 3, 3 }, r { 3 }) end,
    softmax = function() return F.softmax(r { 4, 5 }, -1) end,
    log_softmax = function() return F.log_softmax(r { 4, 5 }, -1) end,
    sum = function() return r({ 4, 5 }):sum() end,
    mean = function() return r({ 4, 5 }):mean() end,
    exp = function() return r({ 4, 5 }):exp() end,
    log = function() return r({ 4, 5 }):abs():log() end,
    cross_entropy = function() return dl.cross_entropy(r { 4, 5 }, labels) end,
    nll_loss = function() return dl.nll_loss(r { 4, 5 }, labels) end,
    mse_loss = function() return dl.mse_loss(r { 4, 5 }, r { 4, 5 }) end,
    batch_norm = function()
      return F.batch_norm(r { 4, 3, 2, 2 }, f32(dl.zeros { 3 }), f32(dl.ones { 3 }),
        { weight = f32(dl.ones { 3 }), bias = f32(dl.zeros { 3 }), training = true })
    end,
    layer_norm = function()
      return F.layer_norm(r { 4, 5 }, { 5 }, { weight = f32(dl.ones { 5 }), bias = f32(dl.zeros { 5 }) })
    end,
  }
end
]==]

-- {name = {dtype for a `half` input, dtype for an f32 input}} under autocast(device_type).
local function output_dtypes(dl, F, half, device, device_type)
  local make = assert(loadstring(OPS))()
  local got = {}
  for col, dt in ipairs { half, "f32" } do
    for name, fn in pairs(make(dl, F, dt, device)) do
      got[name] = got[name] or {}
      got[name][col] = dl.autocast(device_type, nil, function() return fn().dtype end)
    end
  end
  return got
end

describe("autocast('cpu') op lists", function()
  it("gives every op PyTorch 1.13's CPU autocast output dtype, for bf16 and f32 inputs", function()
    assert.same(PYTORCH_1_13_CPU, output_dtypes(dl, F, "bf16", "cpu", "cpu"))
  end)

  it("follows PyTorch 1.13's CUDA lists for CUDA tensors (on the simulated device)", function()
    local status, out = cuda.run_sim(("local F = require('ddplua.nn').functional\n"
      .. "local OPS = %q\n"
      .. "local make = assert(loadstring(OPS))()\n"
      .. "for col, dt in ipairs { 'f16', 'f32' } do\n"
      .. "  for name, fn in pairs(make(dl, F, dt, 'cuda')) do\n"
      .. "    print(('DTYPE %%s %%d %%s'):format(name, col, dl.autocast('cuda', nil, function() return fn().dtype end)))\n"
      .. "  end\n"
      .. "end\n"):format(OPS))
    assert.equal(0, status, out)
    local got = {}
    for name, col, dt in out:gmatch("DTYPE (%S+) (%d) (%S+)") do
      got[name] = got[name] or {}
      got[name][tonumber(col)] = dt
    end
    assert.same(PYTORCH_1_13_CUDA, got)
  end)

  it("keeps gradients of a bf16 softmax and a mixed batch_norm flowing under autocast", function()
    local x = dl.randn({ 4, 5 }):bfloat16():detach()
    x.requires_grad = true
    local w = dl.ones({ 3 }, { requires_grad = true })
    local h = dl.randn({ 4, 3, 2, 2 }):bfloat16()
    dl.autocast("cpu", nil, function()
      local s = F.softmax(x, -1)
      assert.equal("bf16", s.dtype)
      s:sum():backward()
      local y = F.batch_norm(h, nil, nil, { weight = w, training = true })
      assert.equal("bf16", y.dtype)
      y:float():pow(2):sum():backward()
    end)
    assert.equal("bf16", x.grad.dtype)
    assert.equal("f32", w.grad.dtype)
  end)
end)
