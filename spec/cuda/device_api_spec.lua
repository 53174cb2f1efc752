-- Specs for the Lua front end of devices (dl.cuda, device tensors, Module:to, DataLoader
-- pin_memory, nn.DataParallel), driven through the simulated device
-- (build/libddplua_cuda_sim.so: 2 devices backed by host memory and the CPU kernels) in a
-- child luajit, since the CUDA plug-in is probed once per process. Each snippet asserts
-- and prints "OK" last. The simulated device checks the plumbing (devices, copies,
-- counters, autograd across devices), not CUDA kernels: the #cuda block at the end runs
-- on a real GPU only.
local cuda = require "cuda"

-- Run a snippet on the simulated device and expect it to finish with "OK".
local function sim(code, opts)
  local status, out = cuda.run_sim(code .. "\nprint('OK')\n", opts)
  assert.are.equal(0, status, out)
  assert.matches("OK\n$", out)
  return out
end

-- Shared helpers for the snippets.
local PRELUDE = [[
local function close(a, b, tol)
  a, b = a:cpu():to("f64"), b:cpu():to("f64")
  local d = (a - b):abs():max():item()
  assert(d <= (tol or 1e-6), "max difference " .. d)
end
local function same(a, b)
  local la, lb = a:cpu():tolist(), b:cpu():tolist()
  local function eq(x, y)
    if type(x) ~= "table" then return x == y or (x ~= x and y ~= y) end
    if #x ~= #y then return false end
    for i = 1, #x do if not eq(x[i], y[i]) then return false end end
    return true
  end
  assert(eq(la, lb), "values differ")
end
local function raises(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching " .. pattern)
  assert(tostring(err):find(pattern), "error '" .. tostring(err) .. "' does not match '" .. pattern .. "'")
end
]]

describe("dl.cuda on the simulated device", function()
  it("reports two devices, their names, the backend and versions", function()
    sim(PRELUDE .. [[
      assert(dl.cuda.is_available())
      assert(dl.cuda.device_count() == 2)
      assert(dl.cuda.backend_name() == "cuda-sim")
      assert(dl.cuda.unavailable_reason() == "")
      assert(dl.cuda.get_device_name(1):find("simulated device 1"))
      assert(dl.cuda.get_device_name():find("simulated device 0"))
      local v = dl.cuda.versions()
      assert(type(v.cudart) == "number" and type(v.nccl) == "number")
      assert(dl.cuda.current_device() == 0)
      dl.cuda.set_device(1)
      assert(dl.cuda.current_device() == 1)
      dl.cuda.set_device("cuda:0")
      assert(dl.cuda.current_device() == 0)
      dl.cuda.synchronize(); dl.cuda.synchronize(1)
      assert(dl.cuda.allow_tf32() == false)
      assert(dl.cuda.set_allow_tf32(true) == false)
      assert(dl.cuda.allow_tf32() == true)
      dl.cuda.set_allow_tf32(false)
    ]])
  end)

  it("says why CUDA is not available without a plug-in, and every device call raises so", function()
    sim(PRELUDE .. [[
      assert(dl.cuda.is_available() == false)
      assert(dl.cuda.device_count() == 0)
      assert(dl.cuda.backend_name() == "")
      assert(dl.cuda.unavailable_reason():find("did not load"), dl.cuda.unavailable_reason())
      raises(function() return dl.ones{2}:cuda() end, "CUDA is not available")
      raises(function() return dl.ones{2}:to("cuda") end, "device 'cuda': CUDA is not available")
      raises(function() return dl.ones{2}:to("cuda:0") end, "CUDA is not available")
      raises(function() return dl.zeros({2}, {device = "cuda:0"}) end, "CUDA is not available")
      raises(function() return dl.cuda.memory_allocated(0) end, "CUDA is not available")
      raises(function() return dl.ones{2}:pin_memory() end, "CUDA is not available")
      raises(function() dl.cuda.set_device(0) end, "CUDA is not available")
      -- the CPU is untouched
      assert(dl.ones{2}:to("cpu").device == "cpu")
      assert(dl.nn.Linear(2, 2):to("cpu"):parameters()[1].device == "cpu")
      -- DataParallel without CUDA runs the module as it is
      local lin = dl.nn.Linear(3, 2)
      local dp = dl.nn.DataParallel(lin)
      same(dp(dl.ones{4, 3}), lin(dl.ones{4, 3}))
      -- a DataLoader asked to pin does not pin without CUDA (as PyTorch)
      local ld = dl.data.DataLoader(dl.data.TensorDataset(dl.ones{4, 2}), {batch_size = 2, pin_memory = true})
      assert(ld.pin_memory == false)
      for x in ld:iter() do assert(not x:is_pinned()) end
    ]], { plugin = false })
  end)

  it("raises for bad devices, naming them", function()
    sim(PRELUDE .. [[
      raises(function() dl.cuda.set_device(5) end, "cuda:5 does not exist %(2 devices%)")
      raises(function() dl.cuda.set_device("cpu") end, "expects a CUDA device, got cpu")
      raises(function() dl.cuda.set_device("gpu:1") end, "invalid device 'gpu:1'")
      raises(function() return dl.ones{2}:to("cuda:7") end, "cuda:7 does not exist")
      raises(function() return dl.ones{2}:cuda("cpu") end, "expected a CUDA device")
      raises(function() return dl.zeros({2}, {device = "cuda:2"}) end, "cuda:2 does not exist")
      raises(function() return dl.cuda.memory_allocated(3) end, "")
      raises(function() return dl.ones{2}:to("f33") end, "unknown dtype 'f33'")
      raises(function() dl.ones{2}:record_stream(dl.cuda.Stream()) end, "not in CUDA memory")
    ]])
  end)
end)

describe("device tensors on the simulated device", function()
  it("move between the CPU and devices and back with the same values, for every dtype", function()
    sim(PRELUDE .. [[
      for _, dt in ipairs { "f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool" } do
        local t = dl.arange(0, 24):to(dt):view{2, 3, 4}
        local d1 = t:cuda(1)
        assert(d1.device == "cuda:1" and d1.is_cuda and d1.dtype == dt)
        local d0 = d1:to("cuda:0")
        assert(d0.device == "cuda:0")
        local back = d0:cpu()
        assert(back.device == "cpu" and not back.is_cuda)
        same(back, t)
        -- already there: the same tensor
        assert(d0:to("cuda:0") == d0 and t:cpu() == t and t:to("cpu") == t)
      end
      -- "cuda" is the current device
      dl.cuda.set_device(1)
      assert(dl.ones{2}:cuda().device == "cuda:1")
      assert(dl.ones{2}:to("cuda").device == "cuda:1")
      dl.cuda.set_device(0)
      assert(dl.ones{2}:cuda().device == "cuda:0")
      -- a non-contiguous source is packed first
      local m = dl.randn{3, 5}
      local mt = m:t()
      same(mt:cuda(1), mt:contiguous())
      same(mt:cuda(1):cpu(), mt:contiguous())
      -- to(other tensor): its device and dtype
      local other = dl.zeros({1}, {dtype = "f64", device = "cuda:1"})
      local o = m:to(other)
      assert(o.device == "cuda:1" and o.dtype == "f64")
    ]])
  end)

  it("converts dtype and device together and is differentiable across devices", function()
    sim(PRELUDE .. [[
      local t = dl.randn{4, 3}
      local a = t:to("cuda:1", "f64")
      assert(a.device == "cuda:1" and a.dtype == "f64")
      close(a, t:to("f64"), 0)
      local b = a:to("f16")
      assert(b.device == "cuda:1" and b.dtype == "f16")
      same(b, t:to("f16"))
      local c = a:to{device = "cpu", dtype = "f32"}
      assert(c.device == "cpu" and c.dtype == "f32")
      same(c, t)
      local d = t:to("cuda:0", "f32", {non_blocking = true})
      assert(d.device == "cuda:0")
      -- gradient back to the CPU leaf through two moves
      local x = dl.randn({5}, {requires_grad = true})
      local y = x:cuda(1):to("cuda:0")
      assert(y.grad_fn ~= nil)
      local w = dl.arange(1, 6):to("f32")
      y:backward(w:cuda(0))
      assert(x.grad.device == "cpu")
      same(x.grad, w)
    ]])
  end)

  it("print, tolist, get, set and item through a host copy", function()
    sim(PRELUDE .. [[
      local t = dl.tensor({{1, 2}, {3, 4}}):cuda(1)
      assert(tostring(t):find("3.0000"))
      assert(tostring(t):find("%[f32 tensor of shape %(2, 2%) on cuda:1%]"), tostring(t))
      assert(not tostring(t:cpu()):find(" on "))
      local l = t:tolist()
      assert(l[2][1] == 3 and l[1][2] == 2)
      assert(t:get(2, 2) == 4 and t[{1, 1}] == 1)
      t:set(1, 1, 7)
      assert(t:cpu():get(1, 1) == 7)
      assert(t:sum():item() == 16)
    ]])
  end)

  it("factories with a device option hold exactly the CPU's values", function()
    sim(PRELUDE .. [[
      local function both(make)
        dl.manual_seed(7); local c = make({})
        dl.manual_seed(7); local d = make({device = "cuda:1"})
        assert(d.device == "cuda:1", "device " .. d.device)
        assert(c.device == "cpu")
        same(c, d)
        assert(c.dtype == d.dtype)
      end
      both(function(o) return dl.zeros({2, 3}, o) end)
      both(function(o) return dl.ones({2, 3}, o) end)
      both(function(o) return dl.full({2, 3}, 2.5, o) end)
      both(function(o) return dl.rand({3, 4}, o) end)
      both(function(o) return dl.randn({3, 4}, o) end)
      both(function(o) return dl.randint(0, 10, {5}, o) end)
      both(function(o) return dl.randperm(9, o) end)
      both(function(o) return dl.arange(0, 10, 2, o) end)
      both(function(o) return dl.linspace(0, 1, 5, o) end)
      both(function(o) return dl.eye(3, o) end)
      both(function(o) o.dtype = "f64"; return dl.tensor({{1, 2}, {3, 4}}, o) end)
      local e = dl.empty({2, 2}, {device = "cuda:0", dtype = "f64"})
      assert(e.device == "cuda:0" and e.dtype == "f64")
      local r = dl.randn({3}, {device = "cuda:0", requires_grad = true})
      assert(r.is_leaf and r.requires_grad)
      -- *_like keep the device
      local z = dl.zeros_like(r)
      assert(z.device == "cuda:0" and not z.requires_grad)
      assert(dl.ones_like(dl.ones{2}, {device = "cuda:1"}).device == "cuda:1")
      assert(dl.rand_like(z).device == "cuda:0")
    ]])
  end)

  it("count device memory up and down", function()
    sim(PRELUDE .. [[
      collectgarbage("collect")
      local before = dl.cuda.memory_allocated(1)
      local before0 = dl.cuda.memory_allocated(0)
      dl.cuda.reset_peak_memory_stats(1)
      local t = dl.zeros({1024}, {device = "cuda:1"})
      local during = dl.cuda.memory_allocated(1)
      assert(during >= before + 4096, ("allocated %d -> %d"):format(before, during))
      assert(dl.cuda.memory_allocated(0) == before0, "another device's count moved")
      assert(dl.cuda.max_memory_allocated(1) >= during)
      assert(dl.cuda.memory_reserved(1) >= during)
      assert(dl.cuda.max_memory_reserved(1) >= dl.cuda.memory_reserved(1))
      local st = dl.cuda.memory_stats(1)
      assert(st.allocated == during and st.alloc_calls >= 1)
      t:free()
      assert(dl.cuda.memory_allocated(1) == before, "not freed: " .. dl.cuda.memory_allocated(1))
      assert(dl.cuda.max_memory_allocated(1) >= during)
      dl.cuda.reset_peak_memory_stats(1)
      assert(dl.cuda.max_memory_allocated(1) == before)
      -- the collector frees unreferenced device tensors too
      do local u = dl.ones{2048}:cuda(1) end
      collectgarbage("collect"); collectgarbage("collect")
      assert(dl.cuda.memory_allocated(1) == before)
      dl.cuda.empty_cache()
      assert(dl.cuda.memory_reserved(1) >= dl.cuda.memory_allocated(1))
    ]])
  end)

  it("pin host memory and copy from it with non_blocking", function()
    sim(PRELUDE .. [[
      local t = dl.randn{4, 5}
      assert(not t:is_pinned())
      local p = t:pin_memory()
      assert(p:is_pinned() and p.device == "cpu")
      same(p, t)
      assert(p:pin_memory() == p)
      local d = p:to("cuda:1", {non_blocking = true})
      dl.cuda.synchronize(1)
      same(d, t)
      local h = d:cpu()
      same(h, t)
      raises(function() return d:pin_memory() end, "only CPU tensors can be pinned")
    ]])
  end)
end)

describe("streams and events on the simulated device", function()
  it("make streams, switch the current stream and restore it", function()
    sim(PRELUDE .. [[
      local s = dl.cuda.Stream(1)
      assert(s.device == 1)
      local def = dl.cuda.current_stream(1)
      assert(def.handle == nil, "the default stream is NULL")
      assert(dl.cuda.current_stream(1) == dl.cuda.default_stream(1))
      local inside = dl.cuda.stream(s, function(a, b)
        assert(dl.cuda.current_stream(1) == s)
        return a + b
      end, 2, 3)
      assert(inside == 5)
      assert(dl.cuda.current_stream(1).handle == nil, "not restored")
      -- restored when fn raises
      local ok, err = pcall(dl.cuda.stream, s, function() error("boom", 0) end)
      assert(not ok and err == "boom")
      assert(dl.cuda.current_stream(1).handle == nil, "not restored after an error")
      dl.cuda.set_stream(s)
      assert(dl.cuda.current_stream(1) == s)
      dl.cuda.set_stream(def)
      s:synchronize()
      assert(s:query())
      local s2 = dl.cuda.Stream{priority = -1}
      assert(s2.device == 0)
      local s3 = dl.cuda.Stream.new(1)
      assert(dl.cuda.is_stream(s3) and s3.device == 1 and s3.handle ~= nil)
      s2:wait_stream(s)
      local t = dl.ones{3}:cuda(1)
      t:record_stream(s)
      s:free(); s:free()
      raises(function() dl.cuda.set_stream("x") end, "expected a dl.cuda.Stream")
    ]])
  end)

  it("record, query, synchronize and time events", function()
    sim(PRELUDE .. [[
      local a = dl.cuda.Event{enable_timing = true}
      local b = dl.cuda.Event.new(0, {enable_timing = true})
      assert(dl.cuda.is_event(b) and not dl.cuda.is_event(dl.cuda.Stream()))
      a:record()
      local x = dl.randn{64, 64}:cuda(0)
      b:record(dl.cuda.current_stream(0))
      b:synchronize()
      assert(a:query() and b:query())
      local ms = a:elapsed_time(b)
      assert(type(ms) == "number" and ms >= 0)
      local s = dl.cuda.Stream(0)
      s:wait_event(a)
      a:wait(s)
      local e = s:record_event()
      e:synchronize()
      a:free(); a:free()
      raises(function() a:record() end, "the event was freed")
      raises(function() s:wait_event(nil) end, "expected a dl.cuda.Event")
    ]])
  end)
end)

describe("DataLoader pin_memory on the simulated device", function()
  it("gives pinned batches equal to unpinned ones, with and without the prefetch thread", function()
    sim(PRELUDE .. [[
      local data = dl.data
      local xs = dl.randn{10, 3, 4, 4}
      local ys = dl.arange(0, 10)
      local ds = data.TensorDataset(xs, ys)
      for _, prefetch in ipairs { 0, 2 } do
        local plain = data.DataLoader(ds, {batch_size = 4, prefetch = prefetch})
        local pinned = data.DataLoader(ds, {batch_size = 4, prefetch = prefetch, pin_memory = true})
        assert(pinned.pin_memory == true)
        local a = {}
        for x, y in plain:iter() do a[#a + 1] = {x, y} end
        local i = 0
        for x, y in pinned:iter() do
          i = i + 1
          assert(x:is_pinned() and y:is_pinned(), "batch " .. i .. " is not pinned")
          same(x, a[i][1]); same(y, a[i][2])
          local xd = x:to("cuda:1", {non_blocking = true})
          same(xd, a[i][1])
        end
        assert(i == 3)
      end
      -- made while another device is current: the thread pins from that device
      dl.cuda.set_device(1)
      local n = 0
      for x in data.DataLoader(ds, {batch_size = 5, pin_memory = true}):iter() do
        assert(x:is_pinned()); n = n + 1
      end
      assert(n == 2)
      dl.cuda.set_device(0)
      -- the Lua path (a dataset without c_sources) pins too
      local lua_ds = data.Dataset({len = function() return 3 end, get = function(_, i) return dl.ones{2} * i, i end}, {})
      for x, y in data.DataLoader(lua_ds, {batch_size = 2, pin_memory = true}):iter() do
        assert(x:is_pinned() and y:is_pinned())
      end
    ]])
  end)
end)

describe("nn on the simulated device", function()
  it("Module:to / cuda / cpu move parameters, gradients and buffers", function()
    sim(PRELUDE .. [[
      local nn = dl.nn
      dl.manual_seed(3)
      local net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
      local shared = nn.Sequential(net[1], net[1])   -- one module under two names
      local w0 = net[1].weight
      w0.grad = dl.ones{3, 4}
      local ref = {}
      for name, t in pairs(net:state_dict()) do ref[name] = t:clone() end
      local opt_before = dl.optim.SGD(net:parameters(), {lr = 0.1})
      assert(net:cuda(1) == net)
      assert(net[1].weight == w0, "Module:to must keep the Parameter objects (Note [module to])")
      assert(opt_before.param_groups[1].params[1].device == "cuda:1")
      for name, p in net:named_parameters() do
        assert(p.device == "cuda:1", name .. " on " .. p.device)
        assert(nn.is_parameter(p) and p.requires_grad and p.is_leaf)
      end
      for name, b in net:named_buffers() do assert(b.device == "cuda:1", name) end
      assert(net[2].num_batches_tracked.dtype == "i64")
      assert(net[1].weight.grad.device == "cuda:1")
      same(net[1].weight.grad, dl.ones{3, 4})
      assert(shared[1].weight == net[1].weight, "sharing lost")
      for name, t in pairs(net:state_dict()) do same(t, ref[name]) end
      -- parameters stay the same objects through every move
      net:to("cuda:1")
      assert(net[1].weight == w0)
      -- dtype and device at once; integer buffers keep their dtype
      net:to("cuda:0", "f64")
      assert(net[1].weight.device == "cuda:0" and net[1].weight.dtype == "f64" and net[1].weight == w0)
      assert(w0.grad.dtype == "f64" and w0.grad.device == "cuda:0")
      assert(net[2].num_batches_tracked.dtype == "i64" and net[2].num_batches_tracked.device == "cuda:0")
      net:to{dtype = "f32"}
      net:cpu()
      assert(net[1].weight.device == "cpu" and net[1].weight == w0 and w0.requires_grad and w0.is_leaf)
      for name, t in pairs(net:state_dict()) do same(t, ref[name]) end
      -- forward on the device equals the CPU's
      net:eval()
      local x = dl.randn{5, 4}
      local y = net(x)
      net:cuda()
      assert(net[1].weight.device == "cuda:0")
      close(net(x:cuda()), y, 1e-6)
      -- layers take a device option: initialised on the CPU, then moved
      dl.manual_seed(9); local lc = nn.Linear(4, 3)
      dl.manual_seed(9); local ld = nn.Linear(4, 3, {device = "cuda:1"})
      assert(ld.weight.device == "cuda:1" and nn.is_parameter(ld.weight))
      same(ld.weight, lc.weight); same(ld.bias, lc.bias)
      assert(nn.Conv2d(1, 2, 3, {device = "cuda:0"}).weight.device == "cuda:0")
      assert(nn.BatchNorm2d(3, {device = "cuda:1"}).running_var.device == "cuda:1")
      assert(nn.LayerNorm({4}, {device = "cuda:1"}).weight.device == "cuda:1")
      assert(nn.Embedding(5, 2, {device = "cuda:1"}).weight.device == "cuda:1")
      -- an optimizer built after to() updates the device parameters
      local opt = dl.optim.SGD(net:parameters(), {lr = 0.1})
      assert(opt.param_groups[1].params[1].device == "cuda:0")
    ]])
  end)

  it("loads state dicts across devices and saves device tensors to checkpoints as host copies", function()
    sim(PRELUDE .. [[
      local nn = dl.nn
      dl.manual_seed(4)
      local cpu_net = nn.Linear(3, 2)
      local dev_net = nn.Linear(3, 2):cuda(1)
      dev_net:load_state_dict(cpu_net:state_dict())           -- CPU -> device
      assert(dev_net.weight.device == "cuda:1")
      same(dev_net.weight, cpu_net.weight)
      local other = nn.Linear(3, 2)
      other:load_state_dict(dev_net:state_dict())             -- device -> CPU
      same(other.weight, cpu_net.weight)
      local d0 = nn.Linear(3, 2):cuda(0)
      d0:load_state_dict(dev_net:state_dict())                -- device -> device
      same(d0.bias, cpu_net.bias)
      local dir = os.tmpname(); os.remove(dir)
      dl.checkpoint.save(dir .. ".a", cpu_net:state_dict())
      dl.checkpoint.save(dir .. ".b", dev_net:state_dict())
      local fa, fb = io.open(dir .. ".a", "rb"), io.open(dir .. ".b", "rb")
      local sa, sb = fa:read("*a"), fb:read("*a")
      fa:close(); fb:close()
      os.remove(dir .. ".a"); os.remove(dir .. ".b")
      assert(sa == sb, "a device checkpoint differs from the CPU one")
      -- an optimizer's state follows its parameters onto their device when loaded
      local p = nn.Parameter(dl.ones{2}:cuda(1))
      local opt = dl.optim.SGD({p}, {lr = 0.1, momentum = 0.9})
      opt:load_state_dict({state = {[1] = {momentum_buffer = dl.ones{2}}},
        param_groups = {{params = {1}, lr = 0.1, momentum = 0.9, dampening = 0, weight_decay = 0, nesterov = false,
          maximize = false}}})
      local st = opt.state[p]
      assert(st and st.momentum_buffer.device == "cuda:1", "state not moved")
    ]])
  end)

  it("DataParallel over 2 simulated devices matches the module on the CPU, gradients included", function()
    sim(PRELUDE .. [[
      local nn = dl.nn
      dl.manual_seed(5)
      local net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
      local ref = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
      ref:load_state_dict(net:state_dict())
      net:cuda(0)
      local dp = nn.DataParallel(net, {device_ids = {0, 1}})
      assert(#dp.device_ids == 2 and dp.output_device == 0)
      local keys = nn.state_dict_keys(dp:state_dict())
      assert(keys[1] == "module.0.weight", keys[1])
      for _, B in ipairs { 7, 8, 1 } do                        -- uneven, even, one sample
        net:zero_grad(); ref:zero_grad()
        local x = dl.randn{B, 6}
        local c = dl.randn{B, 3}
        local out = dp(x)
        assert(out.device == "cuda:0")
        assert(out:size(1) == B and out:size(2) == 3)
        local want = ref(x)
        close(out, want, 1e-5)
        local loss = (out * c:cuda(0)):sum()
        loss:backward()
        ;(want * c):sum():backward()
        local rp = ref:parameters()
        for i, p in ipairs(net:parameters()) do
          assert(p.grad ~= nil, "no gradient for parameter " .. i)
          assert(p.grad.device == "cuda:0", "gradient on " .. p.grad.device)
          close(p.grad, rp[i].grad, 1e-5)
        end
      end
      -- gradient for an input that requires it comes back to its device
      local x = dl.randn({4, 6}, {requires_grad = true})
      local xr = x:detach():requires_grad_()
      dp(x):sum():backward()
      ref(xr):sum():backward()
      assert(x.grad.device == "cpu")
      close(x.grad, xr.grad, 1e-5)
      -- output on another device, inputs already on a device, a table of tensors out
      local dp1 = nn.DataParallel(net, {device_ids = {0, 1}, output_device = 1})
      local o = dp1(dl.randn{4, 6}:cuda(1))
      assert(o.device == "cuda:1")
      local Pair = nn.Module:extend("Pair")
      function Pair:init() self.lin = nn.Linear(2, 2) end
      function Pair:forward(a, k) return {y = self.lin(a) * k, n = a:sum()} end
      local pair = Pair():cuda(0)
      local r = nn.DataParallel(pair, {device_ids = {0, 1}})(dl.ones{4, 2}, 3)
      assert(r.y.device == "cuda:0" and r.y:size(1) == 4)
      assert(r.n:numel() == 2, "one value per replica")   -- 0-d outputs stack
      -- one device: the module just runs there
      local one = nn.DataParallel(net, {device_ids = {0}})
      close(one(dl.ones{3, 6}), ref(dl.ones{3, 6}), 1e-5)
      -- parameters on the wrong device, devices that do not exist
      raises(function() nn.DataParallel(ref, {device_ids = {0, 1}})(dl.ones{2, 6}) end,
        "module must have its parameters and buffers on device cuda:0")
      raises(function() nn.DataParallel(net, {device_ids = {0, 3}}) end, "device_ids%[2%] is cuda:3 but there are 2")
      raises(function() nn.DataParallel(net, {device_ids = {"cpu"}}) end, "must be a CUDA device")
      -- default device_ids: every device
      assert(#nn.DataParallel(net).device_ids == 2)
    ]])
  end)
end)

describe("device tensors on a real GPU #cuda", function()
  it("round-trip values and count memory", function()
    if cuda.skip_unless_gpu() then return end
    local dl = require "ddplua"
    local t = dl.randn{1000, 10}
    local d = t:cuda()
    assert.are.equal("cuda:" .. dl.cuda.current_device(), d.device)
    assert.is_true(dl.cuda.memory_allocated() >= 40000)
    assert.are.same(t:tolist(), d:cpu():tolist())
    local p = t:pin_memory()
    local d2 = p:to("cuda", { non_blocking = true })
    dl.cuda.synchronize()
    assert.are.same(t:tolist(), d2:cpu():tolist())
  end)
end)
