-- Specs for ddplua.ops.loss: nll_loss, cross_entropy (class indices and probabilities,
-- weights, ignore_index, label smoothing, every reduction, (N, C), (N, C, d1, ...) and (C)
-- layouts) and mse_loss, against references written here in plain Lua (log-sum-exp by
-- hand), gradients by finite differences in f64, and the error messages.
local dl = require "ddplua"
local gradcheck = require("gradcheck").gradcheck
local assert_close = require("close").assert_close
local views = require "views"

-- ---- data in plain Lua ------------------------------------------------------------------

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- Nested tables of shape `shape` from a flat row-major list.
local function nested(flat, shape)
  local pos = 0
  local function build(d)
    if d > #shape then
      pos = pos + 1
      return flat[pos]
    end
    local t = {}
    for i = 1, shape[d] do t[i] = build(d + 1) end
    return t
  end
  return build(1)
end

local function make(flat, shape, dtype)
  return dl.tensor(nested(flat, shape), { dtype = dtype or "f64" })
end

local function flatten(v, out)
  out = out or {}
  if type(v) == "table" then
    for i = 1, #v do flatten(v[i], out) end
  else
    out[#out + 1] = v
  end
  return out
end

-- (N, C, D) of an input shape: (C), (N, C) or (N, C, d1, ...).
local function layout(shape)
  if #shape == 1 then return 1, shape[1], 1 end
  local D = 1
  for k = 3, #shape do D = D * shape[k] end
  return shape[1], shape[2], D
end

-- The per-sample shape: input's shape without the class dimension.
local function sample_shape(shape)
  local s = {}
  if #shape == 1 then return s end
  s[1] = shape[1]
  for k = 3, #shape do s[#s + 1] = shape[k] end
  return s
end

local function rand_values(n, lo, hi)
  local t = {}
  for i = 1, n do t[i] = lo + (hi - lo) * math.random() end
  return t
end

-- n class indices in 0 .. C-1; about one in four replaced by `ignore` when given.
local function rand_targets(n, C, ignore)
  local t = {}
  for i = 1, n do
    t[i] = math.random(0, C - 1)
    if ignore and math.random() < 0.25 then t[i] = ignore end
  end
  return t
end

-- Class probabilities in the (N, C, D) layout of `shape`: positive, summing to 1 over C.
local function rand_probs(shape)
  local N, C, D = layout(shape)
  local p = rand_values(N * C * D, 0.05, 1)
  for n = 0, N - 1 do
    for d = 0, D - 1 do
      local s = 0
      for c = 0, C - 1 do s = s + p[(n * C + c) * D + d + 1] end
      for c = 0, C - 1 do
        local k = (n * C + c) * D + d + 1
        p[k] = p[k] / s
      end
    end
  end
  return p
end

-- ---- references ---------------------------------------------------------------------

-- kind: "nll" (x log-probabilities), "ce" (x logits, t class indices), "prob" (x logits,
-- t probabilities in x's layout). o: weight (Lua list, class c at c + 1), reduction,
-- ignore_index, label_smoothing. Returns a number or the flat per-sample list ("none").
local function ref_class_loss(kind, x, shape, t, o)
  local N, C, D = layout(shape)
  local ignore = o.ignore_index or -100
  local eps = o.label_smoothing or 0
  local function w(c) return o.weight and o.weight[c + 1] or 1 end
  local losses, total, denom = {}, 0, 0
  for n = 0, N - 1 do
    for d = 0, D - 1 do
      local function xv(c) return x[(n * C + c) * D + d + 1] end
      local i = n * D + d + 1
      local l = 0
      if kind == "nll" then
        local y = t[i]
        if y ~= ignore then
          l = -w(y) * xv(y)
          denom = denom + w(y)
        end
      else
        local m = -math.huge
        for c = 0, C - 1 do m = math.max(m, xv(c)) end
        local s = 0
        for c = 0, C - 1 do s = s + math.exp(xv(c) - m) end
        local lse = m + math.log(s)
        local function logp(c) return xv(c) - lse end
        if kind == "ce" then
          local y = t[i]
          if y ~= ignore then
            local smooth = 0
            for c = 0, C - 1 do smooth = smooth - w(c) * logp(c) end
            l = (1 - eps) * (-w(y) * logp(y)) + eps / C * smooth
            denom = denom + w(y)
          end
        else
          for c = 0, C - 1 do
            local q = (1 - eps) * t[(n * C + c) * D + d + 1] + eps / C
            l = l - w(c) * q * logp(c)
          end
          denom = denom + 1
        end
      end
      losses[i] = l
      total = total + l
    end
  end
  if o.reduction == "none" then return losses end
  if o.reduction == "sum" then return total end
  return total / denom
end

local function ref_mse(x, t, reduction)
  local losses, total = {}, 0
  for i = 1, #x do
    losses[i] = (x[i] - t[i]) ^ 2
    total = total + losses[i]
  end
  if reduction == "none" then return losses end
  if reduction == "sum" then return total end
  return total / #x
end

-- ---- option sets ----------------------------------------------------------------------

local LAYOUTS = { { 5, 4 }, { 3, 4, 2 }, { 4 }, { 2, 3, 2, 2 } }
local REDUCTIONS = { "none", "mean", "sum" }

local function shape_str(s) return "(" .. table.concat(s, ", ") .. ")" end

-- Every combination of layout, weight (nil or random), reduction and ignore setting.
-- ignore: nil (none present), -100 (default, present in targets), 1 (a valid class used as
-- ignore_index). Calls fn(case) with case = {shape, weight, reduction, ignore, name}.
local function each_case(fn, with_ignore)
  local ignores = with_ignore and { false, -100, 1 } or { false }
  for _, shape in ipairs(LAYOUTS) do
    for _, weighted in ipairs { false, true } do
      for _, reduction in ipairs(REDUCTIONS) do
        for _, ignore in ipairs(ignores) do
          local _, C = layout(shape)
          local case = {
            shape = shape,
            weight = weighted and rand_values(C, 0.2, 2) or nil,
            reduction = reduction,
            ignore = ignore or nil,
          }
          case.name = ("%s weight=%s reduction=%s ignore=%s"):format(shape_str(shape),
            tostring(weighted), reduction, tostring(ignore))
          fn(case)
        end
      end
    end
  end
end

-- The Lua options table of a case (weight as a tensor of dtype).
local function opts_of(case, dtype, extra)
  local o = { reduction = case.reduction }
  if case.weight then o.weight = make(case.weight, { #case.weight }, dtype) end
  if case.ignore then o.ignore_index = case.ignore end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local function ref_opts(case, extra)
  local o = { weight = case.weight, reduction = case.reduction, ignore_index = case.ignore }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Targets of a class-index case (with ignore_index values when the case has one).
local function case_targets(case)
  local N, C, D = layout(case.shape)
  local t = rand_targets(N * D, C, case.ignore)
  return t, make(t, sample_shape(case.shape), "i64")
end

local function check_loss(actual, expected, reduction, name, tol)
  tol = tol or {}
  if reduction == "none" then
    assert.equal(#expected, actual:numel(), name)
  else
    assert.equal(0, actual:dim(), name)
  end
  local ok, err = pcall(assert_close, actual, expected, { atol = tol.atol or 1e-10, rtol = tol.rtol or 1e-10 })
  if not ok then error(name .. ": " .. err, 2) end
end

describe("ddplua.ops.loss", function()
  before_each(function() math.randomseed(20261123) end)

  describe("nll_loss", function()
    it("matches the reference for every layout, weight, reduction and ignore_index", function()
      each_case(function(case)
        local x = rand_values(numel(case.shape), -3, 0)
        local t, target = case_targets(case)
        local out = dl.nll_loss(make(x, case.shape), target, opts_of(case, "f64"))
        check_loss(out, ref_class_loss("nll", x, case.shape, t, ref_opts(case)), case.reduction, case.name)
        if case.reduction == "none" then
          assert.same(sample_shape(case.shape), out:size())
        end
      end, true)
    end)

    it("has the gradient of finite differences for every option set", function()
      each_case(function(case)
        local x = make(rand_values(numel(case.shape), -3, 0), case.shape)
        local _, target = case_targets(case)
        local o = opts_of(case, "f64")
        assert.is_true(gradcheck(function(a) return a:nll_loss(target, o) end, { x }), case.name)
      end, true)
    end)

    it("computes f32 like f64, with any target integer dtype and non-contiguous inputs", function()
      local x = rand_values(12, -3, 0)
      local t = rand_targets(4, 3, -100)
      local w = rand_values(3, 0.5, 2)
      local expected = ref_class_loss("nll", x, { 4, 3 }, t, { weight = w })
      -- input as a transposed view of its (C, N) transpose, target strided
      local xt = {}
      for n = 0, 3 do for c = 0, 2 do xt[c * 4 + n + 1] = x[n * 3 + c + 1] end end
      local xv, owner = views.transposed(make(xt, { 3, 4 }, "f32"))
      assert.is_false(xv:is_contiguous())
      local tv, towner = views.strided(make(t, { 4 }, "i64"), 2)
      assert.is_false(tv:is_contiguous())
      local out = dl.nll_loss(xv, tv, { weight = make(w, { 3 }, "f32") })
      assert.equal("f32", out.dtype)
      assert_close(out, expected, { atol = 1e-5, rtol = 1e-5 })
      assert_close(dl.nll_loss(make(x, { 4, 3 }), make(t, { 4 }, "i32"), { weight = make(w, { 3 }) }),
        expected, { atol = 1e-12 })
      assert(owner and towner)
    end)

    it("takes a (C) input with a 0-d target", function()
      local x = rand_values(5, -3, 0)
      local out = dl.nll_loss(make(x, { 5 }), dl.tensor(3, { dtype = "i64" }), { reduction = "none" })
      assert.equal(0, out:dim())
      assert_close(out, -x[4], { atol = 1e-12 })
      local w = rand_values(5, 0.5, 2)
      assert_close(dl.nll_loss(make(x, { 5 }), dl.tensor(3, { dtype = "i64" }), { weight = make(w, { 5 }) }),
        -x[4], { atol = 1e-12 })
    end)

    it("gives nan for mean over nothing (N = 0 or every target ignored), as PyTorch", function()
      local empty_t = dl.zeros({ 0 }, { dtype = "i64" })
      local x0 = dl.zeros({ 0, 3 }, { dtype = "f64", requires_grad = true })
      local m = dl.nll_loss(x0, empty_t)
      assert.is_true(m:item() ~= m:item())
      assert.equal(0, dl.nll_loss(x0, empty_t, { reduction = "sum" }):item())
      assert.same({ 0 }, dl.nll_loss(x0, empty_t, { reduction = "none" }):size())
      assert.same({ 0, 2 }, dl.nll_loss(dl.zeros { 0, 3, 2 }, dl.zeros({ 0, 2 }, { dtype = "i64" }),
        { reduction = "none" }):size())
      m:backward()
      assert.same({ 0, 3 }, x0.grad:size())
      local all_ignored = dl.nll_loss(dl.randn { 2, 3 }, dl.tensor({ -100, -100 }, { dtype = "i64" }))
      assert.is_true(all_ignored:item() ~= all_ignored:item())
    end)
  end)

  describe("cross_entropy", function()
    it("matches the reference with class indices for every option set, with and without smoothing", function()
      for _, eps in ipairs { 0, 0.2, 1 } do
        each_case(function(case)
          local x = rand_values(numel(case.shape), -3, 3)
          local t, target = case_targets(case)
          local out = dl.cross_entropy(make(x, case.shape), target,
            opts_of(case, "f64", { label_smoothing = eps }))
          check_loss(out, ref_class_loss("ce", x, case.shape, t, ref_opts(case, { label_smoothing = eps })),
            case.reduction, case.name .. " eps=" .. eps, { atol = 1e-12, rtol = 1e-12 })
        end, true)
      end
    end)

    it("matches the reference with class-probability targets", function()
      for _, eps in ipairs { 0, 0.3 } do
        each_case(function(case)
          local x = rand_values(numel(case.shape), -3, 3)
          local p = rand_probs(case.shape)
          local out = dl.cross_entropy(make(x, case.shape), make(p, case.shape),
            opts_of(case, "f64", { label_smoothing = eps }))
          check_loss(out, ref_class_loss("prob", x, case.shape, p, ref_opts(case, { label_smoothing = eps })),
            case.reduction, case.name .. " eps=" .. eps, { atol = 1e-12, rtol = 1e-12 })
        end)
      end
    end)

    it("has the gradient of finite differences with class indices (every option set)", function()
      for _, eps in ipairs { 0, 0.25 } do
        each_case(function(case)
          local x = make(rand_values(numel(case.shape), -2, 2), case.shape)
          local _, target = case_targets(case)
          local o = opts_of(case, "f64", { label_smoothing = eps })
          assert.is_true(gradcheck(function(a) return a:cross_entropy(target, o) end, { x }),
            case.name .. " eps=" .. eps)
        end, true)
      end
    end)

    it("has the gradient of finite differences with class-probability targets", function()
      for _, eps in ipairs { 0, 0.25 } do
        each_case(function(case)
          local x = make(rand_values(numel(case.shape), -2, 2), case.shape)
          local p = make(rand_probs(case.shape), case.shape)
          local o = opts_of(case, "f64", { label_smoothing = eps })
          assert.is_true(gradcheck(function(a) return a:cross_entropy(p, o) end, { x }),
            case.name .. " eps=" .. eps)
        end)
      end
    end)

    it("computes f32 like f64 (forward and gradient), with non-contiguous inputs", function()
      local x = rand_values(6 * 5, -4, 4)
      local t = rand_targets(6, 5, -100)
      local w = rand_values(5, 0.5, 2)
      local o64 = { weight = make(w, { 5 }), label_smoothing = 0.1 }
      local o32 = { weight = make(w, { 5 }, "f32"), label_smoothing = 0.1 }
      local x64 = make(x, { 6, 5 })
      x64.requires_grad = true
      local l64 = dl.cross_entropy(x64, make(t, { 6 }, "i64"), o64)
      l64:backward()
      local xt = {}
      for n = 0, 5 do for c = 0, 4 do xt[c * 6 + n + 1] = x[n * 5 + c + 1] end end
      local xv, owner = views.transposed(make(xt, { 5, 6 }, "f32"))
      assert.is_false(xv:is_contiguous())
      xv.requires_grad = true
      local l32 = xv:cross_entropy(make(t, { 6 }, "i64"), o32)
      assert.equal("f32", l32.dtype)
      assert_close(l32, l64:item(), { atol = 1e-5, rtol = 1e-5 })
      l32:backward()
      assert.equal("f32", xv.grad.dtype)
      assert_close(xv.grad, x64.grad, { atol = 1e-6, rtol = 1e-4 })
      -- a strided (N, C, d1) input with probability targets
      local x3 = rand_values(2 * 3 * 4, -2, 2)
      local p3 = rand_probs { 2, 3, 4 }
      local sv, sowner = views.strided(make(x3, { 2, 3, 4 }), 3)
      assert.is_false(sv:is_contiguous())
      assert_close(dl.cross_entropy(sv, make(p3, { 2, 3, 4 }), { reduction = "none" }),
        ref_class_loss("prob", x3, { 2, 3, 4 }, p3, { reduction = "none" }), { atol = 1e-12 })
      assert(owner and sowner)
    end)

    it("is stable for large logits", function()
      local x = dl.tensor({ { 1000, 0, -1000 }, { -1e4, 1e4, 0 } }, { dtype = "f32" })
      local l = dl.cross_entropy(x, dl.tensor({ 0, 0 }, { dtype = "i64" }), { reduction = "none" })
      assert_close(l, { 0, 2e4 }, { atol = 1e-3 })
    end)

    it("computes f16 and bf16 inputs in f32 and returns their dtype and gradient", function()
      for _, dt in ipairs { "f16", "bf16" } do
        local x = make(rand_values(12, -2, 2), { 4, 3 }, dt)
        local xr = flatten(x:tolist()) -- the values the half input really holds
        local t = rand_targets(4, 3)
        x.requires_grad = true
        local l = x:cross_entropy(make(t, { 4 }, "i64"), { label_smoothing = 0.1 })
        assert.equal(dt, l.dtype)
        assert_close(l, ref_class_loss("ce", xr, { 4, 3 }, t, { label_smoothing = 0.1 }), { atol = 1e-2, rtol = 1e-2 })
        l:backward()
        assert.equal(dt, x.grad.dtype)
        local n = x:nll_loss(make(t, { 4 }, "i64"), { reduction = "sum" })
        assert.equal(dt, n.dtype)
        assert_close(n, ref_class_loss("nll", xr, { 4, 3 }, t, { reduction = "sum" }), { atol = 2e-2, rtol = 1e-2 })
      end
    end)

    it("handles N = 0 and all-ignored targets as PyTorch (mean over nothing is nan)", function()
      local x0 = dl.zeros({ 0, 4 }, { dtype = "f64", requires_grad = true })
      local t0 = dl.zeros({ 0 }, { dtype = "i64" })
      local m = dl.cross_entropy(x0, t0, { label_smoothing = 0.1 })
      assert.is_true(m:item() ~= m:item())
      assert.equal(0, dl.cross_entropy(x0, t0, { reduction = "sum" }):item())
      assert.same({ 0 }, dl.cross_entropy(x0, t0, { reduction = "none" }):size())
      local mp = dl.cross_entropy(x0, dl.zeros { 0, 4 })
      assert.is_true(mp:item() ~= mp:item())
      assert.same({ 0, 3 }, dl.cross_entropy(dl.zeros { 0, 4, 3 }, dl.zeros { 0, 4, 3 }, { reduction = "none" }):size())
      m:backward()
      assert.same({ 0, 4 }, x0.grad:size())
      local all = dl.cross_entropy(dl.randn { 3, 4 }, dl.tensor({ 2, 2, 2 }, { dtype = "i64" }), { ignore_index = 2 })
      assert.is_true(all:item() ~= all:item())
    end)

    it("gives the same bits with 1 and 2 threads on a large batch", function()
      local N, C = 5000, 10
      local x = dl.randn({ N, C }, { generator = dl.Generator(7) })
      local t = dl.randint(0, C, { N }, { generator = dl.Generator(8) })
      local threads = dl.get_num_threads()
      local function run(n)
        dl.set_num_threads(n)
        local xi = x:clone():requires_grad_()
        local l = xi:cross_entropy(t, { label_smoothing = 0.05 })
        l:backward()
        return l:item(), xi.grad:tolist()
      end
      local l1, g1 = run(1)
      local l2, g2 = run(2)
      dl.set_num_threads(threads)
      assert.equal(l1, l2)
      assert.same(g1, g2)
      local ref = ref_class_loss("ce", flatten(x:tolist()), { N, C }, flatten(t:tolist()), { label_smoothing = 0.05 })
      assert.is_true(math.abs(l1 - ref) < 1e-5 * math.abs(ref))
    end)

    it("splits large (N, C, d1) batches over threads with the same bits, and mse too", function()
      local shape = { 300, 5, 40 } -- 12000 samples: several chunks
      local x = rand_values(numel(shape), -3, 3)
      local p = rand_probs(shape)
      local t = rand_targets(300 * 40, 5, -100)
      local threads = dl.get_num_threads()
      local function run(n)
        dl.set_num_threads(n)
        local xi = make(x, shape, "f32"):requires_grad_()
        local lp = xi:cross_entropy(make(p, shape, "f32"), { reduction = "sum" })
        local li = xi:cross_entropy(make(t, { 300, 40 }, "i64"), { weight = make({ 1, 2, 3, 4, 5 }, { 5 }, "f32") })
        lp:backward()
        local g = xi.grad:tolist()
        local m = dl.mse_loss(make(x, shape, "f32"), make(p, shape, "f32"))
        return lp:item(), li:item(), g, m:item()
      end
      local p1, i1, g1, m1 = run(1)
      local p2, i2, g2, m2 = run(2)
      dl.set_num_threads(threads)
      assert.equal(p1, p2)
      assert.equal(i1, i2)
      assert.equal(m1, m2)
      assert.same(g1, g2)
      local rp = ref_class_loss("prob", x, shape, p, { reduction = "sum" })
      local ri = ref_class_loss("ce", x, shape, t, { weight = { 1, 2, 3, 4, 5 } })
      assert.is_true(math.abs(p1 - rp) < 1e-5 * math.abs(rp))
      assert.is_true(math.abs(i1 - ri) < 1e-5 * math.abs(ri))
      assert.is_true(math.abs(m1 - ref_mse(x, p, "mean")) < 1e-5)
    end)

    it("propagates nan and handles -inf logits", function()
      local nan = 0 / 0
      local l = dl.cross_entropy(dl.tensor { { 0, nan, 1 }, { 0, 1, 2 } }, dl.tensor({ 0, 0 }, { dtype = "i64" }),
        { reduction = "none" }):tolist()
      assert.is_true(l[1] ~= l[1])
      assert.is_true(math.abs(l[2] - ref_class_loss("ce", { 0, 1, 2 }, { 3 }, { 0 }, { reduction = "sum" })) < 1e-5)
      local li = dl.cross_entropy(dl.tensor { -math.huge, 0, 1, 2, 3, 4, 5, 6, 7, 8 }, dl.tensor(9, { dtype = "i64" }))
      local ref = ref_class_loss("ce", { -1e300, 0, 1, 2, 3, 4, 5, 6, 7, 8 }, { 10 }, { 9 }, { reduction = "sum" })
      assert.is_true(math.abs(li:item() - ref) < 1e-5)
    end)

    it("refuses a backward after the input was modified in place", function()
      local x = dl.randn({ 3, 4 }, { dtype = "f64", requires_grad = true })
      local l = x:cross_entropy(dl.tensor({ 0, 1, 2 }, { dtype = "i64" }))
      dl.no_grad(function() x:fill_(0) end)
      assert.has_error(function() l:backward() end)
    end)
  end)

  describe("mse_loss", function()
    it("matches the reference for every reduction, with broadcasting and mixed dtypes", function()
      for _, reduction in ipairs(REDUCTIONS) do
        local x, t = rand_values(12, -2, 2), rand_values(12, -2, 2)
        check_loss(dl.mse_loss(make(x, { 3, 4 }), make(t, { 3, 4 }), { reduction = reduction }),
          ref_mse(x, t, reduction), reduction, "mse " .. reduction)
        -- target (4) broadcast over the rows of input (3, 4)
        local tb = rand_values(4, -2, 2)
        local tfull = {}
        for i = 1, 12 do tfull[i] = tb[(i - 1) % 4 + 1] end
        local out = make(x, { 3, 4 }):mse_loss(make(tb, { 4 }), { reduction = reduction })
        check_loss(out, ref_mse(x, tfull, reduction), reduction, "mse broadcast " .. reduction)
        local mixed = dl.mse_loss(make(x, { 3, 4 }, "f32"), make(t, { 3, 4 }), { reduction = reduction })
        assert.equal("f64", mixed.dtype)
        assert_close(mixed, ref_mse(x, t, reduction), { atol = 1e-6, rtol = 1e-6 })
      end
    end)

    it("has the gradient of finite differences w.r.t. input and target", function()
      for _, reduction in ipairs(REDUCTIONS) do
        local o = { reduction = reduction }
        assert.is_true(gradcheck(function(a, b) return a:mse_loss(b, o) end,
          { dl.randn({ 3, 4 }, { dtype = "f64" }), dl.randn({ 3, 4 }, { dtype = "f64" }) }))
        assert.is_true(gradcheck(function(a, b) return dl.mse_loss(a, b, o) end,
          { dl.randn({ 3, 1 }, { dtype = "f64" }), dl.randn({ 4 }, { dtype = "f64" }) }))
      end
    end)

    it("takes non-contiguous, f16/bf16 and zero-size inputs", function()
      local x, t = rand_values(12, -2, 2), rand_values(12, -2, 2)
      local xt = {}
      for r = 0, 2 do for c = 0, 3 do xt[c * 3 + r + 1] = x[r * 4 + c + 1] end end
      local xv, owner = views.transposed(make(xt, { 4, 3 }))
      assert_close(dl.mse_loss(xv, make(t, { 3, 4 })), ref_mse(x, t, "mean"), { atol = 1e-12 })
      for _, dt in ipairs { "f16", "bf16" } do
        local xh = make(x, { 3, 4 }, dt)
        local th = make(t, { 3, 4 }, dt)
        xh.requires_grad = true
        local l = dl.mse_loss(xh, th, { reduction = "sum" })
        assert.equal(dt, l.dtype)
        assert_close(l, ref_mse(flatten(xh:tolist()), flatten(th:tolist()), "sum"), { rtol = 1e-2 })
        l:backward()
        assert.equal(dt, xh.grad.dtype)
      end
      local m = dl.mse_loss(dl.zeros { 0, 3 }, dl.zeros { 0, 3 })
      assert.is_true(m:item() ~= m:item())
      assert.equal(0, dl.mse_loss(dl.zeros { 0 }, dl.zeros { 0 }, { reduction = "sum" }):item())
      assert.same({ 0, 3 }, dl.mse_loss(dl.zeros { 0, 3 }, dl.zeros { 3 }, { reduction = "none" }):size())
      assert(owner)
    end)
  end)

  describe("errors", function()
    local x = dl.randn { 4, 3 }

    it("names the target value, its position and C for a target out of range", function()
      local ok, err = pcall(dl.nll_loss, x, dl.tensor({ 0, 1, 7, 2 }, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("nll_loss: target value 7 at position %(2%)", err)
      assert.matches("C = 3", err)
      ok, err = pcall(dl.cross_entropy, dl.randn { 2, 3, 2 }, dl.tensor({ { 0, 1 }, { -1, 2 } }, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("cross_entropy: target value %-1 at position %(1, 0%)", err)
      assert.matches("C = 3", err)
      -- ignore_index itself is fine, a class equal to C is not
      assert.has_no.errors(function() dl.cross_entropy(x, dl.tensor({ 0, -100, 2, 1 }, { dtype = "i64" })) end)
      assert.has_error(function() x:cross_entropy(dl.tensor({ 3, 0, 0, 0 }, { dtype = "i64" })) end)
    end)

    it("refuses a target of the wrong dtype", function()
      local ok, err = pcall(dl.cross_entropy, x, dl.tensor { 0, 1, 2, 1 })
      assert.is_false(ok)
      assert.matches("cross_entropy: target of dtype f32 and shape %(4,?%).*integer", err)
      ok, err = pcall(dl.nll_loss, x, dl.tensor { 0, 1, 2, 1 })
      assert.is_false(ok)
      assert.matches("nll_loss: target of dtype f32", err)
      ok, err = pcall(dl.cross_entropy, x, dl.zeros({ 4, 3 }, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("cross_entropy: .*probabilities and must be floating, got i64", err)
    end)

    it("names both shapes when input and target do not match", function()
      local ok, err = pcall(dl.nll_loss, x, dl.tensor({ 0, 1, 2, 1, 0 }, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("nll_loss: target %(5,?%) does not match input %(4, 3%)", err)
      ok, err = pcall(dl.cross_entropy, dl.randn { 2, 3, 4 }, dl.zeros({ 2, 3 }, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("cross_entropy: target %(2, 3%) does not match input %(2, 3, 4%)", err)
      ok, err = pcall(dl.cross_entropy, dl.randn { 3 }, dl.zeros({ 1 }, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("cross_entropy: target %(1,?%) does not match input %(3,?%)", err)
      ok, err = pcall(dl.mse_loss, x, dl.randn { 5 })
      assert.is_false(ok)
      assert.matches("mse_loss: input %(4, 3%) and target %(5,?%)", err)
      ok, err = pcall(dl.cross_entropy, dl.tensor(1), dl.tensor(0, { dtype = "i64" }))
      assert.is_false(ok)
      assert.matches("cross_entropy: input must have a class dimension", err)
    end)

    it("refuses a weight of the wrong size", function()
      local t = dl.tensor({ 0, 1, 2, 1 }, { dtype = "i64" })
      local ok, err = pcall(dl.cross_entropy, x, t, { weight = dl.ones { 4 } })
      assert.is_false(ok)
      assert.matches("cross_entropy: weight %(4,?%) must be a 1%-d tensor of C = 3", err)
      ok, err = pcall(dl.nll_loss, x, t, { weight = dl.ones { 3, 1 } })
      assert.is_false(ok)
      assert.matches("nll_loss: weight %(3, 1%)", err)
    end)

    it("refuses bad options", function()
      local t = dl.tensor({ 0, 1, 2, 1 }, { dtype = "i64" })
      assert.matches("cross_entropy: reduction must be", select(2, pcall(dl.cross_entropy, x, t, { reduction = "avg" })))
      assert.matches("label_smoothing must be in %[0, 1%]",
        select(2, pcall(dl.cross_entropy, x, t, { label_smoothing = 1.5 })))
      assert.matches("ignore_index %(0%) is not supported",
        select(2, pcall(dl.cross_entropy, x, dl.zeros { 4, 3 }, { ignore_index = 0 })))
      assert.matches("mse_loss: .*must be floating",
        select(2, pcall(dl.mse_loss, dl.zeros({ 2 }, { dtype = "i64" }), dl.zeros { 2 })))
      assert.matches("nll_loss: input must be floating",
        select(2, pcall(dl.nll_loss, dl.zeros({ 2, 3 }, { dtype = "i64" }), dl.zeros({ 2 }, { dtype = "i64" }))))
    end)
  end)
end)
