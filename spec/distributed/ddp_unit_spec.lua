-- Unit specs for the DDP reducer (ddplua/reducer.h) in one process: bucket assignment
-- (Note [bucket assignment]), the hooks and finalisation with a world-size-1 reducer (pg NULL),
-- the ready-order record and the bucket rebuild (Note [bucket rebuild]), no_sync, unused
-- parameters, gradient_as_bucket_view and the tensor digest. Multi-rank behaviour is in
-- ddp_spec.lua.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local MB = 1024 * 1024

-- Reference assignment written from the note, independently of the C code: walk in `order`
-- (1-based tensor numbers), per dtype an open bucket closed at its cap (first bucket of each
-- dtype: first_cap), buckets numbered by creation. Returns bucket numbers (0-based) per tensor.
local function reference_assignment(bytes, dtypes, order, cap, first_cap)
  local open, size, closed, out, nb = {}, {}, {}, {}, 0
  for _, i in ipairs(order) do
    local d = dtypes[i]
    if open[d] == nil then
      open[d], size[d] = nb, 0
      nb = nb + 1
    end
    out[i] = open[d]
    size[d] = size[d] + bytes[i]
    if size[d] >= ((closed[d] or 0) == 0 and first_cap or cap) then
      open[d] = nil
      closed[d] = (closed[d] or 0) + 1
    end
  end
  return out, nb
end

local function c_assignment(bytes, dtypes, order, cap, first_cap)
  local n = #bytes
  local b = ffi.new("int64_t[?]", n)
  local d = ffi.new("int[?]", n)
  local o = order and ffi.new("int[?]", n) or nil
  for i = 1, n do
    b[i - 1], d[i - 1] = bytes[i], dtypes[i]
    if order then o[i - 1] = order[i] - 1 end
  end
  local out = ffi.new("int[?]", n)
  local nb = C.ddp_compute_bucket_assignment(out, n, o, b, d, cap, first_cap)
  local res = {}
  for i = 1, n do res[i] = out[i - 1] end
  return res, nb
end

local function reducer_new(params, opts)
  opts = opts or {}
  local arr = ffi.new("ddp_tensor*[?]", #params)
  for i, p in ipairs(params) do arr[i - 1] = p end
  local box = ffi.new("ddp_reducer*[1]")
  lib.check(C.ddp_reducer_new(box, nil, arr, #params, opts.cap or 25 * MB, opts.first_cap or MB,
                              opts.find_unused and 1 or 0, opts.as_view and 1 or 0, 10))
  return ffi.gc(box[0], C.ddp_reducer_free)
end

local function buckets_of(r, n)
  local buf = ffi.new("int[?]", n)
  local out = {}
  for k = 0, C.ddp_reducer_num_buckets(r) - 1 do
    local m = C.ddp_reducer_bucket_params(r, k, buf, n)
    local b = {}
    for s = 1, m do b[s] = buf[s - 1] + 1 end
    out[k + 1] = b
  end
  return out
end

local function mlp()
  dl.manual_seed(3)
  return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
end

local function step(model, r, x)
  lib.check(C.ddp_reducer_prepare_for_forward(r))
  lib.check(C.ddp_reducer_prepare_for_backward(r))
  local loss = model(x):pow(2):sum()
  loss:backward()
end

describe("ddplua.distributed.reducer", function()
  describe("bucket assignment", function()
    it("matches the note's walk on random sizes, dtypes and orders", function()
      local rng = dl.Generator(11)
      for trial = 1, 40 do
        local n = 1 + (trial % 13)
        local bytes, dtypes, order = {}, {}, {}
        local sizes = dl.randint(1, 400, { n }, { generator = rng }):tolist()
        local kinds = dl.randint(0, 2, { n }, { generator = rng }):tolist()
        local perm = dl.randperm(n, { generator = rng }):tolist()
        for i = 1, n do
          bytes[i], dtypes[i], order[i] = sizes[i], kinds[i], perm[i] + 1
        end
        local cap, first = 100 + trial * 10, 50
        local want, want_nb = reference_assignment(bytes, dtypes, order, cap, first)
        local got, nb = c_assignment(bytes, dtypes, order, cap, first)
        assert.are.same(want, got)
        assert.equal(want_nb, nb)
        local rev = {}
        for i = 1, n do rev[i] = n + 1 - i end
        want, want_nb = reference_assignment(bytes, dtypes, rev, cap, first)
        got, nb = c_assignment(bytes, dtypes, nil, cap, first)
        assert.are.same(want, got)
        assert.equal(want_nb, nb)
      end
    end)

    it("caps the first bucket small and puts an oversized tensor alone", function()
      -- reverse order walks 4, 3, 2, 1: first cap 10 closes {4} (12 >= 10), then cap 100:
      -- {3, 2} = 60 + 50 >= 100 closes, {1} alone.
      local got, nb = c_assignment({ 500, 50, 60, 12 }, { 0, 0, 0, 0 }, nil, 100, 10)
      assert.are.same({ 2, 1, 1, 0 }, got)
      assert.equal(3, nb)
    end)

    it("keeps one dtype per bucket", function()
      local got = c_assignment({ 4, 8, 4, 8 }, { 0, 1, 0, 1 }, nil, 1000, 1000)
      assert.equal(got[1], got[3])
      assert.equal(got[2], got[4])
      assert.are_not.equal(got[1], got[2])
    end)

    it("refuses an order that is not a permutation", function()
      local _, nb = c_assignment({ 4, 4 }, { 0, 0 }, { 1, 1 }, 10, 10)
      assert.equal(-1, nb)
      assert.matches("not a permutation", ffi.string(C.ddp_last_error()))
    end)
  end)

  describe("reducer (world size 1)", function()
    it("builds buckets in reverse registration order with the first one small", function()
      local model = mlp()
      local params = model:parameters()
      -- 4-byte floats: caps chosen so the first bucket holds the last bias only.
      local r = reducer_new(params, { cap = 200, first_cap = 12 })
      local b = buckets_of(r, #params)
      assert.are.same({ 6 }, b[1])              -- (3,) f32 = 12 bytes reaches the first cap
      -- (3, 6) = 72 bytes, (6,) = 24, (6, 8) = 192: 288 >= 200 closes; then 32 + 160 < 200
      assert.are.same({ 5, 4, 3 }, b[2])
      assert.are.same({ 2, 1 }, b[3])
      assert.equal(3, #b)
    end)

    it("leaves the gradients of one rank unchanged and counts iterations", function()
      local model = mlp()
      local params = model:parameters()
      local x = dl.randn({ 4, 5 })
      -- reference gradients without a reducer
      model:zero_grad()
      model(x):pow(2):sum():backward()
      local want = {}
      for i, p in ipairs(params) do want[i] = p.grad:clone() end
      model:zero_grad()
      local r = reducer_new(params, { cap = 64, first_cap = 16 })
      step(model, r, x)
      for i, p in ipairs(params) do
        assert.are.same(want[i]:tolist(), p.grad:tolist())
      end
      assert.equal(1, tonumber(C.ddp_reducer_num_iterations(r)))
      -- a backward that was not armed is not reduced
      model(x):pow(2):sum():backward()
      assert.equal(1, tonumber(C.ddp_reducer_num_iterations(r)))
    end)

    it("records the ready order and rebuilds the buckets once in it", function()
      local model = mlp()
      local params = model:parameters()
      local r = reducer_new(params, { cap = 100, first_cap = 16 })
      local x = dl.randn({ 2, 5 })
      step(model, r, x)
      local buf = ffi.new("int[?]", #params)
      local n = C.ddp_reducer_ready_order(r, buf, #params)
      assert.equal(#params, n)
      local order = {}
      for k = 1, n do order[k] = buf[k - 1] + 1 end
      -- every parameter once
      local seen = {}
      for _, i in ipairs(order) do
        assert.is_nil(seen[i])
        seen[i] = true
      end
      -- the last layer's parameters are ready before the first layer's
      local pos = {}
      for k, i in ipairs(order) do pos[i] = k end
      assert.is_true(pos[5] < pos[1] and pos[6] < pos[2])
      assert.equal(0, C.ddp_reducer_has_rebuilt_buckets(r))
      lib.check(C.ddp_reducer_prepare_for_forward(r))
      assert.equal(1, C.ddp_reducer_has_rebuilt_buckets(r))
      -- the rebuilt buckets follow the recorded order with the same caps
      local bytes, dtypes = {}, {}
      for i, p in ipairs(params) do bytes[i], dtypes[i] = p:numel() * 4, 0 end
      local want = reference_assignment(bytes, dtypes, order, 100, 16)
      local got = buckets_of(r, #params)
      for k, b in ipairs(got) do
        for _, i in ipairs(b) do assert.equal(k - 1, want[i]) end
      end
      -- slots in walk order inside each bucket
      local flat = {}
      for _, b in ipairs(got) do for _, i in ipairs(b) do flat[#flat + 1] = i end end
      assert.are.same(order, flat)
      -- later iterations still reduce, and the rebuild happens once
      step(model, r, x)
      assert.equal(2, tonumber(C.ddp_reducer_num_iterations(r)))
    end)

    it("does nothing while sync is off: gradients accumulate locally (no_sync)", function()
      local model = mlp()
      local params = model:parameters()
      local r = reducer_new(params)
      local x1, x2 = dl.randn({ 3, 5 }), dl.randn({ 3, 5 })
      model:zero_grad()
      model(x1):pow(2):sum():backward()
      model(x2):pow(2):sum():backward()
      local want = {}
      for i, p in ipairs(params) do want[i] = p.grad:clone() end
      model:zero_grad()
      C.ddp_reducer_set_sync(r, 0)
      assert.equal(0, C.ddp_reducer_get_sync(r))
      model(x1):pow(2):sum():backward()
      assert.equal(0, tonumber(C.ddp_reducer_num_iterations(r)))
      C.ddp_reducer_set_sync(r, 1)
      step(model, r, x2)
      assert.equal(1, tonumber(C.ddp_reducer_num_iterations(r)))
      for i, p in ipairs(params) do
        local g, w = p.grad:tolist(), want[i]:tolist()
        assert.are.same(#w, #g)
        assert.is_true((p.grad - want[i]):abs():max():item() <= 1e-6)
      end
    end)

    it("with gradient_as_bucket_view, gradients are views into the buckets", function()
      local model = mlp()
      local params = model:parameters()
      local r = reducer_new(params, { as_view = true, cap = 25 * MB, first_cap = 25 * MB })
      local x = dl.randn({ 3, 5 })
      model:zero_grad()
      model(x):pow(2):sum():backward()
      local want = {}
      for i, p in ipairs(params) do want[i] = p.grad:clone() end
      model:zero_grad() -- set_to_none: the views are re-created
      step(model, r, x)
      assert.equal(1, C.ddp_reducer_num_buckets(r))
      for i, p in ipairs(params) do
        assert.are.same(want[i]:tolist(), p.grad:tolist())
        assert.equal(1, C.ddp_tensor_shares_storage(p.grad, params[1].grad))
      end
      -- zero_grad(false) keeps the views; the next backward accumulates into them (after the
      -- rebuild at the second forward, which moves them into the new buckets)
      model:zero_grad(false)
      step(model, r, x)
      assert.equal(1, C.ddp_reducer_has_rebuilt_buckets(r))
      assert.are.same(want[1]:tolist(), params[1].grad:tolist())
      model:zero_grad(false)
      local g1 = params[1].grad
      step(model, r, x)
      assert.equal(1, C.ddp_tensor_shares_storage(params[1].grad, g1))
      assert.are.same(want[1]:tolist(), params[1].grad:tolist())
    end)

    it("an unused parameter without find_unused_parameters fails the next forward", function()
      local Net = nn.Module:extend("Net")
      function Net:init()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 2)
      end
      function Net:forward(x) return self.b(self.a(x)) end
      local model = Net()
      local params = model:parameters()
      local r = reducer_new(params)
      step(model, r, dl.randn({ 2, 4 }))
      local status = C.ddp_reducer_prepare_for_forward(r)
      assert.are_not.equal(0, status)
      local msg = ffi.string(C.ddp_last_error())
      assert.matches("Expected to have finished reduction in the prior iteration", msg, 1, true)
      assert.matches("Parameter indices which did not receive grad for rank 0: 4 5", msg, 1, true)
      local buf = ffi.new("int[4]")
      assert.equal(2, C.ddp_reducer_unready_params(r, buf, 4))
      assert.are.same({ 4, 5 }, { buf[0], buf[1] })
      -- it keeps failing
      assert.are_not.equal(0, C.ddp_reducer_prepare_for_forward(r))
    end)

    it("with find_unused_parameters, an unused parameter keeps a nil gradient", function()
      local Net = nn.Module:extend("Net")
      function Net:init()
        self.a = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 2)
        self.b = nn.Linear(4, 2)
      end
      function Net:forward(x) return self.b(self.a(x)) end
      local model = Net()
      local r = reducer_new(model:parameters(), { find_unused = true })
      model:zero_grad()
      step(model, r, dl.randn({ 2, 4 }))
      assert.is_nil(model.unused.weight.grad)
      assert.is_nil(model.unused.bias.grad)
      assert.is_not_nil(model.a.weight.grad)
      lib.check(C.ddp_reducer_prepare_for_forward(r))
      assert.equal(0, C.ddp_reducer_has_rebuilt_buckets(r)) -- no rebuild with find_unused
    end)

    it("refuses bad parameters and caps, naming them", function()
      local a = nn.Parameter(dl.randn({ 2 }))
      local box = ffi.new("ddp_reducer*[1]")
      local arr = ffi.new("ddp_tensor*[2]", { a, a })
      assert.are_not.equal(0, C.ddp_reducer_new(box, nil, arr, 2, MB, MB, 0, 0, 1))
      assert.matches("parameters 0 and 1 are the same tensor", ffi.string(C.ddp_last_error()))
      local nonleaf = a * 2
      arr[0], arr[1] = nonleaf, a
      assert.are_not.equal(0, C.ddp_reducer_new(box, nil, arr, 2, MB, MB, 0, 0, 1))
      assert.matches("parameter 0 %(2,?%) is not a leaf", ffi.string(C.ddp_last_error()))
      arr[0] = a
      assert.are_not.equal(0, C.ddp_reducer_new(box, nil, arr, 1, 0, MB, 0, 0, 1))
      assert.matches("bucket caps must be > 0", ffi.string(C.ddp_last_error()))
      local ints = dl.zeros({ 2 }, { dtype = "i64" })
      arr[0] = ints
      assert.are_not.equal(0, C.ddp_reducer_new(box, nil, arr, 1, MB, MB, 0, 0, 1))
      assert.matches("not a leaf that requires grad", ffi.string(C.ddp_last_error()))
    end)

    it("leaves the thread's error as it was when freed (ffi.gc may free it between a failing call and ddp_last_error)", function()
      local a = nn.Parameter(dl.randn({ 2 }))
      local r = reducer_new({ a })
      local box = ffi.new("ddp_reducer*[1]")
      local arr = ffi.new("ddp_tensor*[2]", { a, a })
      assert.are_not.equal(0, C.ddp_reducer_new(box, nil, arr, 2, MB, MB, 0, 0, 1))
      ffi.gc(r, nil)
      C.ddp_reducer_free(r) -- as the collector would, before the caller reads its error
      assert.matches("parameters 0 and 1 are the same tensor", ffi.string(C.ddp_last_error()))
      assert.are_not.equal(0, C.ddp_last_status())
    end)

    it("removes its hooks when freed", function()
      local model = mlp()
      local params = model:parameters()
      local r = reducer_new(params)
      ffi.gc(r, nil)
      C.ddp_reducer_free(r)
      model(dl.randn({ 2, 5 })):sum():backward() -- must not touch the freed reducer
      assert.is_not_nil(params[1].grad)
    end)
  end)

  describe("tensor digest", function()
    local function digest(t)
      local box = ffi.new("uint64_t[1]")
      lib.check(C.ddp_tensor_digest(box, t))
      return box[0]
    end

    it("is FNV-1a 64 of the bytes, equal for equal tensors and views", function()
      -- the published FNV-1a 64 test vector: "a" -> 0xaf63dc4c8601ec8c
      assert.equal(0xaf63dc4c8601ec8cULL, C.ddp_bytes_digest("a", 1))
      assert.equal(0xcbf29ce484222325ULL, C.ddp_bytes_digest("", 0))
      local t = dl.randn({ 3, 4 })
      assert.equal(digest(t), digest(t:clone()))
      local tt = t:t()
      assert.equal(digest(tt), digest(tt:contiguous()))
      local u = t:clone()
      u[{ 1, 1 }] = u[{ 1, 1 }] + 1e-3
      assert.are_not.equal(digest(t), digest(u))
      assert.are_not.equal(digest(t), digest(t:view({ 4, 3 })))
      assert.are_not.equal(digest(dl.zeros({ 2 })), digest(dl.zeros({ 2 }, { dtype = "f64" })))
    end)
  end)
end)
