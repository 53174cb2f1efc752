-- Specs for ddplua.ops.shape: views, index_select, gather, scatter_add, cat, stack, split,
-- chunk. Every op is checked against a plain-Lua reference over :tolist() on seeded random
-- inputs (contiguous and not), zero-size dims and negative dims; views must share storage;
-- every op passes gradcheck in f64; bad input raises naming the op and the shapes.
local dl = require "ddplua"
local close = require "close"
local views = require "views"
local gradcheck = require("gradcheck").gradcheck

-- ---- plain-Lua reference helpers --------------------------------------------------------

local function shape_of(list)
  local s = {}
  while type(list) == "table" do
    s[#s + 1] = #list
    list = list[1]
  end
  return s
end

-- Element of nested list at a 1-based index table.
local function at(list, idx)
  local v = list
  for i = 1, #idx do v = v[idx[i]] end
  return v
end

-- Nested table of `shape` whose element at idx is f(idx) (idx: a fresh 1-based table).
local function build(shape, f)
  local function go(d, idx)
    if d > #shape then
      local copy = {}
      for i = 1, #idx do copy[i] = idx[i] end
      return f(copy)
    end
    local out = {}
    for i = 1, shape[d] do
      idx[d] = i
      out[i] = go(d + 1, idx)
    end
    idx[d] = nil
    return out
  end
  return go(1, {})
end

local function flat(list, out)
  out = out or {}
  if type(list) ~= "table" then
    out[#out + 1] = list
    return out
  end
  for i = 1, #list do flat(list[i], out) end
  return out
end

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- Row-major flat position (1-based) of idx in shape.
local function linear(shape, idx)
  local p = 0
  for i = 1, #shape do p = p * shape[i] + (idx[i] - 1) end
  return p + 1
end

local function lua_dim(d, n) return d < 0 and n + d + 1 or d end

local gen = dl.Generator(20240521)
local function randn(shape, dtype)
  return dl.randn(shape, { dtype = dtype or "f64", generator = gen })
end
local function randint(lo, hi, shape)
  return dl.randint(lo, hi, shape, { generator = gen })
end

-- The same values as t in three layouts: contiguous, a transposed-storage view (2-d) or a
-- strided view (any ndim).
local function layouts(t)
  local out = { t }
  local s = t:size()
  if #s == 2 then
    local owner = t:t():contiguous() -- (n, m) storage; its transpose is t's values
    out[#out + 1] = owner:t()
  end
  if #s >= 1 then
    local v, owner = views.strided(t, 2)
    out[#out + 1] = v
    out.owner = owner
  end
  return out
end

-- Storage sharing is not exposed as a method: ask the C API directly.
local C = require("ddplua.lib").C
local function shares_storage(a, b) return C.ddp_tensor_shares_storage(a, b) ~= 0 end
local function assert_same_storage(a, b) assert.is_true(shares_storage(a, b)) end

local function raises(pattern, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.matches(pattern, err)
end

describe("ddplua.ops.shape", function()
  -- ---- views -------------------------------------------------------------------------------

  describe("view and reshape", function()
    it("keep the row-major order for every layout, with -1 inferred", function()
      local base = randn({ 4, 6 })
      local expected = flat(base:tolist())
      for _, t in ipairs(layouts(base)) do
        local r = t:reshape(3, -1, 2)
        assert.same({ 3, 4, 2 }, r:size())
        assert.same(expected, flat(r:tolist()))
        assert.same(expected, flat(t:reshape({ 24 }):tolist()))
        if t:is_contiguous() then
          local v = t:view({ 2, 12 })
          assert.same(expected, flat(v:tolist()))
          assert_same_storage(v, t)
        end
      end
    end)

    it("views compatible strides of non-contiguous tensors without a copy", function()
      local base = randn({ 2, 3, 4 })
      local p = base:permute(2, 1, 3) -- (3, 2, 4), last dim contiguous
      local v = p:view(3, 2, 2, 2)    -- splits the contiguous last dim
      assert_same_storage(v, base)
      local ref = build({ 3, 2, 2, 2 }, function(i) return at(base:tolist(), { i[2], i[1], (i[3] - 1) * 2 + i[4] }) end)
      assert.same(ref, v:tolist())
      -- a strided view whose merged dims are still regular
      local s = views.strided(randn({ 3, 4 }), 2)
      assert.same({ 3, 2, 2 }, s:view(3, 2, 2):size())
      -- reshape of a transpose copies
      local tt = base:transpose(1, 3)
      local r = tt:reshape(-1)
      assert.is_false(shares_storage(r, base))
      assert.same(flat(tt:tolist()), flat(r:tolist()))
    end)

    it("writes through the view into the base", function()
      local base = dl.zeros { 2, 3 }
      local v = base:view(6)
      v:set(5, 7)
      assert.equal(7, base:get(2, 2))
      local tr = base:t()
      tr:set(3, 1, 9)
      assert.equal(9, base:get(1, 3))
    end)

    it("handles zero-size and 0-d tensors", function()
      local z = dl.zeros { 0, 3 }
      assert.same({ 3, 0 }, z:view(3, 0):size())
      assert.same({ 0, 5 }, z:reshape(0, 5):size())
      local s = dl.tensor(4)
      assert.same({ 1, 1 }, s:view(1, 1):size())
      assert.same({}, s:view({}):size())
      assert.equal(4, s:reshape(1):tolist()[1])
    end)

    it("raises naming the shapes", function()
      local t = randn({ 2, 3 })
      raises("view: shape %(4, 2%) is invalid for a tensor of shape %(2, 3%)", function() t:view(4, 2) end)
      raises("only one size can be %-1", function() t:view(-1, -1) end)
      raises("invalid size %-2", function() t:view(-2, 3) end)
      raises("view: a tensor of shape %(3, 2%) with strides %(1, 3%) cannot be viewed as shape %(6,?%)",
        function() t:t():view(6) end)
      raises("shape_spec.lua", function() t:view(5) end)
      raises("reshape: shape %(0, %-1%) is invalid", function() dl.zeros({ 0, 2 }):reshape(0, -1) end)
    end)

    it("pass gradcheck (contiguous and not)", function()
      gradcheck(function(x) return x:view(3, 4) end, { randn({ 2, 6 }) })
      gradcheck(function(x) return x:t():reshape(12) end, { randn({ 3, 4 }) })
      local v, owner = views.transposed(randn({ 3, 4 }))
      gradcheck(function(x) return x:reshape(2, 6) end, { v })
      assert.is_not_nil(owner)
    end)
  end)

  describe("transpose, t and permute", function()
    it("match the reference and share storage", function()
      local base = randn({ 2, 3, 4 })
      for _, t in ipairs(layouts(base)) do
        local l = t:tolist()
        local tr = t:transpose(1, -1)
        assert.same({ 4, 3, 2 }, tr:size())
        assert.same(build({ 4, 3, 2 }, function(i) return at(l, { i[3], i[2], i[1] }) end), tr:tolist())
        assert_same_storage(tr, t)
        local p = t:permute(3, 1, 2)
        assert.same(build({ 4, 2, 3 }, function(i) return at(l, { i[2], i[3], i[1] }) end), p:tolist())
        assert.same(p:tolist(), t:permute({ -1, 1, 2 }):tolist())
        assert_same_storage(p, t)
      end
      local m = randn({ 3, 5 })
      assert.same(build({ 5, 3 }, function(i) return at(m:tolist(), { i[2], i[1] }) end), m:t():tolist())
      assert.same(m:tolist(), m:t():t():tolist())
      assert.is_true(m:t():t():is_contiguous())
      local v = randn({ 4 })
      assert.same(v:tolist(), v:t():tolist())
      assert.equal(3, dl.tensor(3):t():item())
      assert.same({ 0, 2 }, dl.zeros({ 2, 0 }):t():size())
    end)

    it("raise on bad dims", function()
      local t = randn({ 2, 3 })
      raises("transpose: dimension 3 is out of range for a tensor with 2 dimensions", function() t:transpose(1, 3) end)
      raises("t: expects a tensor with at most 2 dimensions, got %(2, 3, 1%)", function() t:view(2, 3, 1):t() end)
      raises("permute: dimension 1 appears twice", function() t:permute(1, 1) end)
      raises("permute: 3 dimensions given for a tensor %(2, 3%)", function() t:permute(1, 2, 3) end)
      raises("permute: dimension %-3 is out of range", function() t:permute(-3, 1) end)
    end)

    it("pass gradcheck", function()
      gradcheck(function(x) return x:transpose(1, 3) end, { randn({ 2, 3, 2 }) })
      gradcheck(function(x) return x:t() end, { randn({ 2, 3 }) })
      gradcheck(function(x) return x:permute(2, 3, 1) end, { randn({ 2, 3, 2 }) })
      local s, owner = views.strided(randn({ 2, 3 }), 3)
      gradcheck(function(x) return x:permute(2, 1) end, { s })
      assert.is_not_nil(owner)
    end)
  end)

  describe("squeeze, unsqueeze, flatten, unflatten", function()
    it("reshape as the reference and share storage", function()
      local base = randn({ 1, 3, 1, 2 })
      local e = flat(base:tolist())
      assert.same({ 3, 2 }, base:squeeze():size())
      assert.same({ 3, 1, 2 }, base:squeeze(1):size())
      assert.same({ 1, 3, 1, 2 }, base:squeeze(2):size()) -- size 3: unchanged
      assert.same({ 1, 3, 2 }, base:squeeze(-2):size())
      assert.same(e, flat(base:squeeze():tolist()))
      assert_same_storage(base:squeeze(), base)
      local m = randn({ 3, 4 })
      for _, t in ipairs(layouts(m)) do
        assert.same({ 1, 3, 4 }, t:unsqueeze(1):size())
        assert.same({ 3, 4, 1 }, t:unsqueeze(-1):size())
        assert.same({ 3, 1, 4 }, t:unsqueeze(2):size())
        assert.same(t:tolist(), t:unsqueeze(2):squeeze(2):tolist())
        assert.same(build({ 3, 1, 4 }, function(i) return at(t:tolist(), { i[1], i[3] }) end), t:unsqueeze(2):tolist())
        assert.same(flat(t:tolist()), t:flatten():tolist())
        assert_same_storage(t:unsqueeze(3), t)
      end
      local c = randn({ 2, 3, 4 })
      assert.same({ 6, 4 }, c:flatten(1, 2):size())
      assert.same({ 2, 12 }, c:flatten(2):size())
      assert.same({ 2, 12 }, c:flatten(-2, -1):size())
      assert.same(flat(c:tolist()), flat(c:flatten(2):tolist()))
      assert_same_storage(c:flatten(), c)
      assert.same({ 1 }, dl.tensor(5):flatten():size())
      assert.same({ 2, 3, 2, 2 }, c:unflatten(3, { 2, -1 }):size())
      assert.same(flat(c:tolist()), flat(c:unflatten(-1, { 2, 2 }):tolist()))
      assert.same({ 1 }, dl.tensor(2):unsqueeze(1):size())
      assert.same({}, dl.tensor(2):squeeze():size())
      assert.same({ 0, 1 }, dl.zeros({ 0 }):unsqueeze(2):size())
    end)

    it("raise on bad dims and sizes", function()
      local t = randn({ 2, 3 })
      raises("unsqueeze: dimension 5 is out of range for a tensor with 3 dimensions", function() t:unsqueeze(5) end)
      raises("squeeze: dimension 3 is out of range", function() t:squeeze(3) end)
      raises("flatten: start dimension 2 comes after end dimension 1", function() t:flatten(2, 1) end)
      raises("unflatten: shape %(2, 2%) is invalid", function() t:unflatten(2, { 2, 2 }) end)
    end)

    it("pass gradcheck", function()
      gradcheck(function(x) return x:squeeze() end, { randn({ 1, 3, 1 }) })
      gradcheck(function(x) return x:unsqueeze(2) end, { randn({ 3, 2 }) })
      gradcheck(function(x) return x:t():flatten() end, { randn({ 3, 2 }) })
      gradcheck(function(x) return x:unflatten(1, { 2, 3 }) end, { randn({ 6 }) })
    end)
  end)

  describe("expand", function()
    it("broadcasts with stride 0 and matches the reference", function()
      local base = randn({ 3, 1 })
      for _, t in ipairs(layouts(base)) do
        local e = t:expand(2, -1, 4)
        assert.same({ 2, 3, 4 }, e:size())
        assert.equal(0, e:stride(1))
        assert.equal(0, e:stride(3))
        assert.same(build({ 2, 3, 4 }, function(i) return at(t:tolist(), { i[2], 1 }) end), e:tolist())
        assert_same_storage(e, t)
        assert.same(e:tolist(), t:expand({ 2, 3, 4 }):tolist())
      end
      assert.same({ 2, 0 }, dl.zeros({ 1, 0 }):expand(2, 0):size())
      assert.same({ 3 }, dl.tensor(1):expand(3):size())
      assert.same({ 2, 3, 1 }, base:expand_as(dl.zeros { 2, 3, 1 }):size())
    end)

    it("raises on bad sizes", function()
      local t = randn({ 3, 2 })
      raises("expand: the size 2 of dimension 2 of tensor %(3, 2%) must be 1 to expand it to 4", function() t:expand(3, 4) end)
      raises("expand: 1 sizes given for a tensor %(3, 2%)", function() t:expand(3) end)
      raises("expand: size %-1 is not allowed for the new leading dimension 1", function() t:expand(-1, 3, 2) end)
      raises("expand: invalid size %-3", function() t:expand(-3, 2) end)
    end)

    it("sums the gradient back (gradcheck)", function()
      gradcheck(function(x) return x:expand(2, 3, 4) end, { randn({ 3, 1 }) })
      gradcheck(function(x) return x:expand(2, 2) end, { randn({ 2 }) })
    end)
  end)

  describe("narrow and select", function()
    it("match the reference, share storage and take negative positions", function()
      local base = randn({ 4, 5 })
      for _, t in ipairs(layouts(base)) do
        local l = t:tolist()
        local n = t:narrow(2, 2, 3)
        assert.same(build({ 4, 3 }, function(i) return at(l, { i[1], i[2] + 1 }) end), n:tolist())
        assert_same_storage(n, t)
        assert.same(t:narrow(2, -4, 3):tolist(), n:tolist())
        assert.same({ 4, 0 }, t:narrow(2, 6, 0):size())
        local s = t:select(1, 3)
        assert.same(l[3], s:tolist())
        assert.same(l[4], t:select(1, -1):tolist())
        assert.same(build({ 4 }, function(i) return l[i[1]][2] end), t:select(-1, 2):tolist())
      end
      local z = dl.zeros { 3, 4 }
      z:narrow(1, 2, 2):fill_(1)
      assert.same({ { 0, 0, 0, 0 }, { 1, 1, 1, 1 }, { 1, 1, 1, 1 } }, z:tolist())
      z:select(2, 4):fill_(5)
      assert.equal(5, z:get(1, 4))
      assert.equal(2, dl.tensor({ 1, 2, 3 }):select(1, 2):item())
    end)

    it("raise naming the op, the dim and the size", function()
      local t = randn({ 3, 4 })
      raises("select: index 5 is out of range for dimension 2 of size 4", function() t:select(2, 5) end)
      raises("select: index %-4 is out of range for dimension 1 of size 3", function() t:select(1, -4) end)
      raises("select: cannot select from a 0%-d tensor", function() dl.tensor(1):select(1, 1) end)
      raises("narrow: start 3 with length 3 runs past the end of dimension 1 of size 3", function() t:narrow(1, 3, 3) end)
      raises("narrow: start 6 is out of range for dimension 2 of size 4", function() t:narrow(2, 6, 0) end)
      raises("narrow: dimension 3 is out of range", function() t:narrow(3, 1, 1) end)
      raises("positions count from 1", function() t:narrow(1, 0, 1) end)
    end)

    it("pass gradcheck", function()
      gradcheck(function(x) return x:narrow(2, 2, 2) end, { randn({ 3, 4 }) })
      gradcheck(function(x) return x:select(1, -1) end, { randn({ 3, 4 }) })
      gradcheck(function(x) return x:t():select(1, 2) end, { randn({ 3, 4 }) })
    end)
  end)

  -- ---- indexing ------------------------------------------------------------------------------

  describe("index_select", function()
    it("matches the reference on every layout and dtype", function()
      local base = randn({ 4, 5 })
      local idx = dl.tensor({ 3, 0, 3, 1 }, { dtype = "i64" })
      local il = idx:tolist()
      for _, t in ipairs(layouts(base)) do
        local l = t:tolist()
        assert.same(build({ 4, 4 }, function(i) return l[i[1]][il[i[2]] + 1] end), t:index_select(2, idx):tolist())
        assert.same(build({ 4, 5 }, function(i) return l[il[i[1]] + 1][i[2]] end), t:index_select(-2, idx):tolist())
      end
      local ints = randint(-50, 50, { 3, 4 })
      local it = dl.tensor({ 2, 2, 0 }, { dtype = "i64" })
      assert.same(build({ 3, 4 }, function(i) return ints:tolist()[it:tolist()[i[1]] + 1][i[2]] end), ints:index_select(1, it):tolist())
      assert.same({ 4, 0 }, base:index_select(2, dl.zeros({ 0 }, { dtype = "i64" })):size())
      assert.same({ 0, 2 }, dl.zeros({ 0, 3 }):index_select(2, dl.tensor({ 1, 2 }, { dtype = "i64" })):size())
      local c = base:index_select(1, dl.tensor(1, { dtype = "i64" }))
      assert.same({ 1, 5 }, c:size())
      assert.is_false(shares_storage(c, base))
    end)

    it("raises on bad indices", function()
      local t = randn({ 3, 4 })
      raises("index_select: index value 4 is out of bounds for dimension 2 of size 4",
        function() t:index_select(2, dl.tensor({ 0, 4 }, { dtype = "i64" })) end)
      raises("index_select: index value %-1 is out of bounds for dimension 1 of size 3",
        function() t:index_select(1, dl.tensor({ -1 }, { dtype = "i64" })) end)
      raises("index_select: index must be an i64 tensor, got f32", function() t:index_select(1, dl.tensor({ 0 })) end)
      raises("index_select: index must be 0%-d or 1%-d, got shape %(1, 1%)",
        function() t:index_select(1, dl.zeros({ 1, 1 }, { dtype = "i64" })) end)
      raises("index_select: dimension 3 is out of range", function() t:index_select(3, dl.tensor({ 0 }, { dtype = "i64" })) end)
    end)

    it("accumulates repeated indices in backward (gradcheck)", function()
      local idx = dl.tensor({ 2, 0, 2, 2 }, { dtype = "i64" })
      gradcheck(function(x) return x:index_select(1, idx) end, { randn({ 3, 2 }) })
      gradcheck(function(x) return x:index_select(2, idx) end, { randn({ 2, 3, 2 }) })
    end)
  end)

  describe("gather and scatter_add", function()
    local function ref_gather(l, d, il, shape)
      return build(shape, function(i)
        local j = { unpack(i) }
        j[d] = at(il, i) + 1
        return at(l, j)
      end)
    end
    local function ref_scatter_add(sl, d, il, srcl)
      local out = build(shape_of(sl), function(i) return at(sl, i) end)
      local ishape = shape_of(il)
      build(ishape, function(i)
        local j = { unpack(i) }
        j[d] = at(il, i) + 1
        local row = out
        for k = 1, #j - 1 do row = row[j[k]] end
        row[j[#j]] = row[j[#j]] + at(srcl, i)
        return 0
      end)
      return out
    end

    it("gather matches the reference (every dim, layouts, smaller index)", function()
      local base = randn({ 4, 5 })
      for _, t in ipairs(layouts(base)) do
        local l = t:tolist()
        for _, d in ipairs({ 1, 2, -1 }) do
          local ld = lua_dim(d, 2)
          local ishape = ld == 1 and { 6, 3 } or { 3, 7 }
          local idx = randint(0, t:size(ld), ishape)
          close.assert_close(t:gather(d, idx), ref_gather(l, ld, idx:tolist(), ishape), { atol = 0, rtol = 0 })
        end
      end
      local idx3 = randint(0, 3, { 2, 3, 2 })
      local c = randn({ 2, 3, 4 })
      assert.same(ref_gather(c:tolist(), 2, idx3:tolist(), { 2, 3, 2 }), c:gather(2, idx3):tolist())
      local i64 = randint(-9, 9, { 3, 3 })
      assert.same(ref_gather(i64:tolist(), 1, idx3:select(3, 1):tolist(), { 2, 3 }), i64:gather(1, idx3:select(3, 1)):tolist())
      assert.same({ 0, 5 }, base:gather(1, dl.zeros({ 0, 5 }, { dtype = "i64" })):size())
      local strided_idx = views.strided(randint(0, 4, { 3, 5 }), 2)
      assert.same(ref_gather(base:tolist(), 1, strided_idx:tolist(), { 3, 5 }), base:gather(1, strided_idx):tolist())
    end)

    it("scatter_add matches the reference, out of place and in place", function()
      for _, d in ipairs({ 1, 2 }) do
        local self = randn({ 4, 5 })
        local src = randn({ 4, 6 })
        local ishape = d == 1 and { 3, 5 } or { 4, 6 }
        if d == 1 then src = randn({ 3, 6 }) end
        local idx = randint(0, self:size(d), ishape)
        local expected = ref_scatter_add(self:tolist(), d, idx:tolist(), src:tolist())
        for _, s in ipairs(layouts(self)) do
          local before = s:tolist()
          close.assert_close(s:scatter_add(d, idx, src), expected)
          assert.same(before, s:tolist()) -- out of place leaves self alone
        end
        local inplace = self:clone()
        assert.equal(inplace, inplace:scatter_add_(d, idx, src))
        close.assert_close(inplace, expected)
        local sview, owner = views.strided(self, 2)
        sview:scatter_add_(d, idx, src)
        close.assert_close(sview, expected)
        assert.is_not_nil(owner)
      end
      local ints = dl.zeros({ 3 }, { dtype = "i64" })
      ints:scatter_add_(1, dl.tensor({ 0, 2, 0, 0 }, { dtype = "i64" }), dl.tensor({ 1, 2, 3, 4 }, { dtype = "i64" }))
      assert.same({ 8, 0, 2 }, ints:tolist())
      local h = dl.zeros({ 2 }, { dtype = "f16" }):scatter_add(1, dl.tensor({ 1, 1 }, { dtype = "i64" }), dl.tensor({ 0.5, 0.25 }, { dtype = "f16" }))
      assert.same({ 0, 0.75 }, h:tolist())
    end)

    it("raise naming the value, the dim and its size", function()
      local t = randn({ 3, 4 }, "f32")
      local bad = dl.tensor({ { 0, 4 } }, { dtype = "i64" })
      raises("gather: index value 4 is out of bounds for dimension 2 of size 4", function() t:gather(2, bad) end)
      raises("gather: index value %-1 is out of bounds", function() t:gather(1, dl.tensor({ { -1 } }, { dtype = "i64" })) end)
      raises("gather: index %(2,?%) must have as many dimensions as self %(3, 4%)",
        function() t:gather(1, dl.tensor({ 0, 1 }, { dtype = "i64" })) end)
      raises("gather: index %(1, 5%) is larger than self %(3, 4%) in dimension 2",
        function() t:gather(1, dl.zeros({ 1, 5 }, { dtype = "i64" })) end)
      raises("gather: index must be an i64 tensor, got i32", function() t:gather(1, dl.zeros({ 1, 1 }, { dtype = "i32" })) end)
      raises("scatter_add: index value 3 is out of bounds for dimension 1 of size 3",
        function() t:scatter_add(1, dl.tensor({ { 3 } }, { dtype = "i64" }), randn({ 1, 1 }, "f32")) end)
      raises("scatter_add: index %(2, 2%) is larger than src %(1, 2%) in dimension 1",
        function() t:scatter_add(1, dl.zeros({ 2, 2 }, { dtype = "i64" }), randn({ 1, 2 }, "f32")) end)
      raises("scatter_add: src dtype f64 does not match self dtype f32",
        function() t:scatter_add(1, dl.zeros({ 1, 1 }, { dtype = "i64" }), randn({ 1, 1 })) end)
      raises("scatter_add_: dimension 3 is out of range",
        function() t:scatter_add_(3, dl.zeros({ 1, 1 }, { dtype = "i64" }), randn({ 1, 1 }, "f32")) end)
      raises("scatter_add_: self %(3, 4%) has overlapping elements",
        function() dl.zeros({ 3, 1 }):expand(3, 4):scatter_add_(1, dl.zeros({ 1, 1 }, { dtype = "i64" }), randn({ 1, 1 }, "f32")) end)
      local leaf = randn({ 3 }):requires_grad_()
      raises("scatter_add_: a leaf Variable that requires grad",
        function() leaf:scatter_add_(1, dl.zeros({ 1 }, { dtype = "i64" }), randn({ 1 })) end)
    end)

    it("pass gradcheck (gather, scatter_add w.r.t. self and a larger src, in place)", function()
      local idx = dl.tensor({ { 0, 2 }, { 2, 2 }, { 1, 0 } }, { dtype = "i64" })
      gradcheck(function(x) return x:gather(2, idx) end, { randn({ 3, 3 }) })
      gradcheck(function(x) return x:gather(1, idx) end, { randn({ 3, 4 }) })
      gradcheck(function(x) return x:t():gather(2, idx) end, { randn({ 3, 3 }) })
      gradcheck(function(s, src) return s:scatter_add(1, idx, src) end, { randn({ 3, 2 }), randn({ 4, 3 }) })
      gradcheck(function(s, src) return s:clone():scatter_add_(2, idx, src) end, { randn({ 3, 3 }), randn({ 3, 2 }) })
    end)

    it("gather backward scatters the gradient to the gathered positions", function()
      local x = randn({ 3, 3 }):requires_grad_()
      local idx = dl.tensor({ { 0 }, { 1 }, { 2 } }, { dtype = "i64" })
      local y = x:gather(2, idx)
      assert.equal("GatherBackward", y.grad_fn)
      y:backward(dl.ones({ 3, 1 }, { dtype = "f64" }))
      assert.same({ { 1, 0, 0 }, { 0, 1, 0 }, { 0, 0, 1 } }, x.grad:tolist())
    end)
  end)

  -- ---- cat, stack, split, chunk -------------------------------------------------------------

  describe("cat and stack", function()
    local function ref_cat(lists, d)
      local shape = shape_of(lists[1])
      local sizes = {}
      shape[d] = 0
      for k, l in ipairs(lists) do
        sizes[k] = shape_of(l)[d]
        shape[d] = shape[d] + sizes[k]
      end
      return build(shape, function(i)
        local j = { unpack(i) }
        for k, l in ipairs(lists) do
          if j[d] <= sizes[k] then return at(l, j) end
          j[d] = j[d] - sizes[k]
        end
      end)
    end

    it("cat matches the reference along every dim, with mixed layouts", function()
      for _, d in ipairs({ 1, 2, 3, -1 }) do
        local ld = lua_dim(d, 3)
        local s1, s2, s3 = { 2, 3, 2 }, { 2, 3, 2 }, { 2, 3, 2 }
        s1[ld], s2[ld], s3[ld] = 1, 3, 0
        local a, b, c = randn(s1), randn(s2), randn(s3)
        local bp = b:permute(3, 2, 1):contiguous():permute(3, 2, 1) -- same values, not contiguous
        local out = dl.cat({ a, bp, c, b }, d)
        assert.same(ref_cat({ a:tolist(), b:tolist(), c:tolist(), b:tolist() }, ld), out:tolist())
        assert.is_true(out:is_contiguous())
      end
      local m = randn({ 3, 4 })
      local v = views.strided(m, 2)
      assert.same(ref_cat({ m:tolist(), m:tolist() }, 1), dl.cat({ v, m:t():t() }):tolist())
      -- legacy: (0) tensors are skipped; dtypes promote
      assert.same(m:tolist(), dl.cat({ dl.zeros({ 0 }), m }, 1):tolist())
      local mixed = dl.cat({ dl.tensor({ 1, 2 }, { dtype = "i64" }), dl.tensor({ 0.5 }, { dtype = "f32" }) })
      assert.equal("f32", mixed.dtype)
      assert.same({ 1, 2, 0.5 }, mixed:tolist())
      assert.same({ 0, 3 }, dl.cat({ dl.zeros { 0, 3 }, dl.zeros { 0, 3 } }):size())
      assert.same({ 2 }, dl.concat({ dl.tensor { 1 }, dl.tensor { 2 } }):size())
    end)

    it("stack matches the reference", function()
      local a, b = randn({ 2, 3 }), randn({ 2, 3 })
      local bt = views.transposed(b:t():contiguous())
      for _, d in ipairs({ 1, 2, 3, -1 }) do
        local ld = lua_dim(d, 3)
        local out = dl.stack({ a, bt, a }, d)
        local lists = { a:tolist(), b:tolist(), a:tolist() }
        local shape = { 2, 3 }
        table.insert(shape, ld, 3)
        assert.same(shape, out:size())
        assert.same(build(shape, function(i)
          local j = { unpack(i) }
          local k = table.remove(j, ld)
          return at(lists[k], j)
        end), out:tolist())
      end
      assert.same({ 2 }, dl.stack({ dl.tensor(1), dl.tensor(2) }):size())
      assert.same({ 2, 0 }, dl.stack({ dl.zeros { 0 }, dl.zeros { 0 } }):size())
    end)

    it("raise naming the tensor position and the shapes", function()
      local a, b = randn({ 2, 3 }), randn({ 2, 4 })
      raises("cat: tensor 2 has shape %(2, 4%) but tensor 1 has shape %(2, 3%): sizes must match except in dimension 1",
        function() dl.cat({ a, b }, 1) end)
      raises("cat: tensor 3 has shape %(3,?%)", function() dl.cat({ a, a, dl.zeros { 3 } }, 1) end)
      raises("cat: dimension 3 is out of range", function() dl.cat({ a, a }, 3) end)
      raises("cat: expected a non%-empty list", function() dl.cat({}) end)
      raises("cat: argument 'tensors%[2%]' is a freed tensor", function()
        local f = randn({ 2, 3 }); f:free(); dl.cat({ a, f })
      end)
      raises("stack: tensor 2 has shape %(2, 4%) but tensor 1 has shape %(2, 3%)", function() dl.stack({ a, b }) end)
      raises("stack: dimension 4 is out of range", function() dl.stack({ a, a }, 4) end)
    end)

    it("pass gradcheck for every input", function()
      gradcheck(function(x, y, z) return dl.cat({ x, y, z }, 2) end, { randn({ 2, 1 }), randn({ 2, 3 }), randn({ 2, 2 }) })
      gradcheck(function(x, y) return dl.cat({ x:t(), y }, 1) end, { randn({ 2, 2 }), randn({ 1, 2 }) })
      gradcheck(function(x, y) return dl.stack({ x, y }, 2) end, { randn({ 2, 3 }), randn({ 2, 3 }) })
      -- an input that needs no gradient gets none
      local x = randn({ 2 }):requires_grad_()
      local out = dl.cat({ x, randn({ 3 }) })
      out:backward(dl.ones({ 5 }, { dtype = "f64" }))
      assert.same({ 1, 1 }, x.grad:tolist())
    end)
  end)

  describe("split and chunk", function()
    it("return views matching narrow's reference", function()
      local base = randn({ 7, 4 })
      for _, t in ipairs(layouts(base)) do
        local l = t:tolist()
        local parts = t:split(3)
        assert.equal(3, #parts)
        local starts, lens = { 0, 3, 6 }, { 3, 3, 1 }
        for k, p in ipairs(parts) do
          assert.same(build({ lens[k], 4 }, function(i) return l[i[1] + starts[k]][i[2]] end), p:tolist())
          assert_same_storage(p, t)
        end
        local sized = t:split({ 1, 0, 3 }, -1)
        assert.same({ { 7, 1 }, { 7, 0 }, { 7, 3 } }, { sized[1]:size(), sized[2]:size(), sized[3]:size() })
        assert.same(build({ 7, 3 }, function(i) return l[i[1]][i[2] + 1] end), sized[3]:tolist())
        local ch = t:chunk(3, 2)
        assert.equal(2, #ch) -- ceil(4 / 3) = 2 per chunk: two chunks
        assert.same(build({ 7, 2 }, function(i) return l[i[1]][i[2] + 2] end), ch[2]:tolist())
        assert.equal(4, #t:chunk(4, 1))
      end
      local w = dl.zeros { 4 }
      w:split(2)[2]:fill_(3)
      assert.same({ 0, 0, 3, 3 }, w:tolist())
      assert.equal(1, #dl.zeros({ 0 }):split(2))
      assert.equal(1, #dl.zeros({ 0 }):split(0))
      assert.equal(3, #dl.zeros({ 0, 2 }):chunk(3))
      assert.equal(4, #dl.split(dl.zeros { 4 }, 1))
    end)

    it("raise on bad sizes and dims", function()
      local t = randn({ 4, 2 })
      raises("split: split_size 0 is invalid for dimension 1 of size 4", function() t:split(0) end)
      raises("split: sizes %(1, 2%) sum to 3 but dimension 1 of tensor %(4, 2%) has size 4", function() t:split({ 1, 2 }) end)
      raises("split: dimension 3 is out of range", function() t:split(1, 3) end)
      raises("chunk: the number of chunks must be at least 1, got 0", function() t:chunk(0) end)
      raises("split: cannot split a 0%-d tensor", function() dl.tensor(1):split(1) end)
    end)

    it("give each piece its own gradient (gradcheck per piece)", function()
      for k = 1, 3 do
        gradcheck(function(x) return x:split(2, 2)[k] end, { randn({ 2, 5 }) })
        gradcheck(function(x) return x:split({ 1, 2, 2 }, 1)[k] end, { randn({ 5, 2 }) })
      end
      for k = 1, 2 do
        gradcheck(function(x) return x:t():chunk(2, 1)[k] end, { randn({ 2, 3 }) })
      end
      -- pieces used together accumulate into one gradient
      local x = randn({ 4 }):requires_grad_()
      local p = x:chunk(2)
      local y = dl.cat({ p[2], p[1] })
      assert.equal("CatBackward", y.grad_fn)
      assert.equal("ChunkBackward", p[1].grad_fn)
      y:backward(dl.tensor({ 1, 2, 3, 4 }, { dtype = "f64" }))
      assert.same({ 3, 4, 1, 2 }, x.grad:tolist())
    end)
  end)

  describe("autograd records", function()
    it("names the nodes and records nothing under no_grad or without requires_grad", function()
      local x = randn({ 2, 3 }):requires_grad_()
      assert.equal("ViewBackward", x:view(6).grad_fn)
      assert.equal("TransposeBackward", x:t().grad_fn)
      assert.equal("ExpandBackward", x:expand(2, 2, 3).grad_fn)
      assert.equal("SelectBackward", x:select(1, 1).grad_fn)
      assert.is_nil(dl.no_grad(function() return x:view(6) end).grad_fn)
      assert.is_false(randn({ 2, 3 }):view(6).requires_grad)
    end)
  end)
end)
