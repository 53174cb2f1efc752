-- Specs for ddplua.nn.module (nn.Module, nn.Parameter) and the containers: registration
-- order and dotted names, state_dict keys as PyTorch's, load_state_dict reports, modes,
-- zero_grad, to(dtype), apply and the printed tree.
local dl = require "ddplua"
local nn = require "ddplua.nn"

local function names_of(iter)
  local out = {}
  for name in iter do out[#out + 1] = name end
  return out
end

local function shape_of(t) return table.concat(t:size(), "x") end

-- A model with nested modules, own parameters, buffers and a shared child.
local function make_net()
  local Block = nn.Module:extend("Block")
  function Block:init(n)
    self.lin = nn.Linear(n, n)
    self.norm = nn.BatchNorm1d(n)
  end
  function Block:forward(x) return self.norm(self.lin(x)) end

  local Net = nn.Module:extend("Net")
  function Net:init()
    self.stem = nn.Linear(4, 3)
    self.scale = nn.Parameter(dl.ones({ 3 }))
    self.blocks = nn.ModuleList({ Block(3), Block(3) })
    self:register_buffer("step", dl.zeros({ 1 }))
    self:register_buffer("scratch", dl.zeros({ 2 }), { persistent = false })
    self.head = nn.Linear(3, 2, { bias = false })
  end
  return Net()
end

describe("ddplua.nn.module", function()
  describe("class idiom", function()
    it("constructs with init, calls forward, and finds methods, attributes and members", function()
      local Net = nn.Module:extend("Net")
      function Net:init(n, k) self.n, self.k = n, k; self.fc = nn.Linear(n, k) end
      function Net:forward(x, y) return x, y, self.n end
      local net = Net(5, 2)
      assert.equal(5, net.n)
      assert.equal(2, net.k)
      assert.is_true(nn.is_module(net.fc))
      local a, b, c = net("x", "y")
      assert.same({ "x", "y", 5 }, { a, b, c })
      assert.equal("Net", net:_get_name())
      assert.is_true(net.training)
    end)

    it("subclasses of subclasses inherit methods and the metamethods", function()
      local Base = nn.Module:extend("Base")
      function Base:init(v) self.v = v end
      function Base:forward(x) return x + self.v end
      function Base:twice() return 2 * self.v end
      local Child = Base:extend("Child")
      function Child:init(v) Base.init(self, v); self.extra = true end
      local c = Child(3)
      assert.equal(Base, Child.super)
      assert.equal(6, c:twice())
      assert.equal(4, c(1))
      assert.is_true(c.extra)
      assert.equal("Child()", tostring(c))
    end)

    it("raises for a forward that was not defined", function()
      local m = nn.Module()
      assert.has_error(function() m(1) end)
      local ok, err = pcall(function() m(1) end)
      assert.is_false(ok)
      assert.matches("forward is not defined", err)
    end)
  end)

  describe("registration", function()
    it("keeps parameters, buffers and children in registration order", function()
      local m = nn.Module()
      m.zeta = nn.Parameter(dl.zeros({ 1 }))
      m.alpha = nn.Parameter(dl.zeros({ 2 }))
      m.mid = nn.Parameter(dl.zeros({ 3 }))
      m:register_buffer("b2", dl.zeros({ 1 }))
      m:register_buffer("b1", dl.zeros({ 1 }))
      m.z = nn.Identity()
      m.a = nn.Identity()
      assert.same({ "zeta", "alpha", "mid" }, names_of(m:named_parameters()))
      assert.same({ "b2", "b1" }, names_of(m:named_buffers()))
      assert.same({ "z", "a" }, names_of(m:named_children()))
      local ps = m:parameters()
      assert.equal(3, #ps)
      assert.equal(1, ps[1]:numel())
      assert.equal(2, ps[2]:numel())
      assert.equal(3, ps[3]:numel())
    end)

    it("gives dotted names for nested modules, own members first (PyTorch's pre-order)", function()
      local net = make_net()
      assert.same({
        "scale", "stem.weight", "stem.bias",
        "blocks.0.lin.weight", "blocks.0.lin.bias", "blocks.0.norm.weight", "blocks.0.norm.bias",
        "blocks.1.lin.weight", "blocks.1.lin.bias", "blocks.1.norm.weight", "blocks.1.norm.bias",
        "head.weight",
      }, names_of(net:named_parameters()))
      assert.same({
        "step", "scratch",
        "blocks.0.norm.running_mean", "blocks.0.norm.running_var", "blocks.0.norm.num_batches_tracked",
        "blocks.1.norm.running_mean", "blocks.1.norm.running_var", "blocks.1.norm.num_batches_tracked",
      }, names_of(net:named_buffers()))
      assert.same({ "", "stem", "blocks", "blocks.0", "blocks.0.lin", "blocks.0.norm", "blocks.1",
        "blocks.1.lin", "blocks.1.norm", "head" }, names_of(net:named_modules()))
      assert.equal(10, #net:modules())
      assert.same({ "stem", "blocks", "head" }, names_of(net:named_children()))
      assert.equal(3, #net:children())
      assert.same({ "scale" }, names_of(net:named_parameters("", false)))
      assert.same({ "m.scale" }, names_of(net:named_parameters("m", false)))
    end)

    it("get_submodule and get_parameter follow dotted paths", function()
      local net = make_net()
      assert.equal(net.blocks[2].norm, net:get_submodule("blocks.1.norm"))
      assert.equal(net, net:get_submodule(""))
      assert.equal(net.blocks[1].lin.weight, net:get_parameter("blocks.0.lin.weight"))
      assert.equal(net.scale, net:get_parameter("scale"))
      local ok, err = pcall(function() net:get_submodule("blocks.7.lin") end)
      assert.is_false(ok)
      assert.matches("ModuleList has no attribute `7`", err)
      ok, err = pcall(function() net:get_parameter("head.bias") end)
      assert.is_false(ok)
      assert.matches("Linear has no parameter `bias`", err)
    end)

    it("parameters are leaves that require grad; plain tensors stay plain attributes", function()
      local m = nn.Module()
      local raw = dl.ones({ 2 })
      m.p = nn.Parameter(raw)
      m.plain = dl.zeros({ 2 })
      assert.is_true(m.p.requires_grad)
      assert.is_true(m.p.is_leaf)
      assert.is_false(raw.requires_grad)
      assert.is_true(nn.is_parameter(m.p))
      assert.is_false(nn.is_parameter(m.plain))
      assert.equal(1, #m:parameters())
      assert.equal(0, #m:buffers())
      assert.is_true(dl.is_tensor(m.plain))
      assert.is_false(nn.Parameter(dl.zeros({ 1 }), false).requires_grad)
    end)

    it("deduplicates shared parameters and modules", function()
      local shared = nn.Linear(2, 2)
      local seq = nn.Sequential(shared, nn.ReLU(), shared)
      assert.same({ "0.weight", "0.bias" }, names_of(seq:named_parameters()))
      assert.equal(2, #seq:parameters())
      assert.equal(3, #seq:modules()) -- seq, shared, ReLU
      -- state_dict keeps every name, as PyTorch's
      assert.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, nn.state_dict_keys(seq:state_dict()))
    end)

    it("moves a name between kinds on re-assignment, as PyTorch's __setattr__", function()
      local m = nn.Module()
      m.x = 5
      m.x = nn.Linear(1, 1)
      assert.same({ "x" }, names_of(m:named_children()))
      m.x = nil
      assert.is_nil(m.x)
      assert.equal(0, #m:children())
      m.x = nn.Parameter(dl.zeros({ 1 }))
      assert.same({ "x" }, names_of(m:named_parameters()))
      assert.equal(0, #m:children())
      m.x = nil -- keeps the name reserved, no parameter
      assert.equal(0, #m:parameters())
      assert.is_nil(m.x)
    end)

    it("raises when a plain tensor is assigned to a parameter name or a bad buffer is given", function()
      local lin = nn.Linear(2, 2)
      local ok, err = pcall(function() lin.weight = dl.zeros({ 2, 2 }) end)
      assert.is_false(ok)
      assert.matches("Linear: cannot assign a tensor as parameter 'weight'", err)
      ok, err = pcall(function() lin:register_buffer("buf", 3) end)
      assert.is_false(ok)
      assert.matches("cannot assign a number as buffer 'buf'", err)
      ok, err = pcall(function() lin:register_buffer("a.b", dl.zeros({ 1 })) end)
      assert.is_false(ok)
      assert.matches("without '%.'", err)
      ok, err = pcall(function() nn.Parameter(3) end)
      assert.is_false(ok)
      assert.matches("nn.Parameter: expected a tensor", err)
    end)
  end)

  describe("state_dict", function()
    it("has PyTorch's keys for a Sequential CNN", function()
      local model = nn.Sequential(
        nn.Conv2d(1, 4, 3, { padding = 1 }), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5),
        nn.Linear(8, 10))
      assert.same({
        "0.weight", "0.bias",
        "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
        "4.weight", "4.bias",
        "9.weight", "9.bias",
      }, nn.state_dict_keys(model:state_dict()))
    end)

    it("has BatchNorm's buffers, non-persistent buffers left out, no module. prefix", function()
      local bn = nn.BatchNorm2d(3)
      local sd = bn:state_dict()
      assert.same({ "weight", "bias", "running_mean", "running_var", "num_batches_tracked" },
        nn.state_dict_keys(sd))
      assert.equal("i64", sd.num_batches_tracked:type())
      assert.equal(0, sd.num_batches_tracked:dim())
      local net = make_net()
      local keys = nn.state_dict_keys(net:state_dict())
      assert.same({ "scale", "step", "stem.weight", "stem.bias",
        "blocks.0.lin.weight", "blocks.0.lin.bias", "blocks.0.norm.weight", "blocks.0.norm.bias",
        "blocks.0.norm.running_mean", "blocks.0.norm.running_var", "blocks.0.norm.num_batches_tracked",
        "blocks.1.lin.weight", "blocks.1.lin.bias", "blocks.1.norm.weight", "blocks.1.norm.bias",
        "blocks.1.norm.running_mean", "blocks.1.norm.running_var", "blocks.1.norm.num_batches_tracked",
        "head.weight" }, keys)
      local n = 0
      for k, v in pairs(net:state_dict()) do
        n = n + 1
        assert.equal("string", type(k))
        assert.is_true(dl.is_tensor(v))
      end
      assert.equal(#keys, n)
    end)

    it("tensors share the module's data and are cut from the graph", function()
      local lin = nn.Linear(2, 2)
      local sd = lin:state_dict()
      assert.is_false(sd.weight.requires_grad)
      dl.no_grad(function() lin.weight:fill_(7) end)
      assert.equal(7, sd.weight:get(1, 1))
    end)
  end)

  describe("load_state_dict", function()
    it("round-trips a state dict into a fresh model, keeping the parameter objects", function()
      dl.manual_seed(1)
      local a = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
      dl.manual_seed(2)
      local b = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
      dl.no_grad(function() a[2].running_mean:fill_(0.5); a[2].num_batches_tracked:fill_(9) end)
      local w_before = b[1].weight
      local report = b:load_state_dict(a:state_dict())
      assert.same({ missing_keys = {}, unexpected_keys = {}, mismatched = {} }, report)
      assert.equal(w_before, b[1].weight)
      assert.is_true(b[1].weight.requires_grad)
      assert.is_true(b[1].weight.is_leaf)
      local sa, sb = a:state_dict(), b:state_dict()
      for _, k in ipairs(nn.state_dict_keys(sa)) do
        assert.same(sa[k]:tolist(), sb[k]:tolist())
      end
      assert.equal(9, b[2].num_batches_tracked:item())
    end)

    it("converts dtypes while copying", function()
      local a = nn.Linear(2, 2, { dtype = "f64" })
      local b = nn.Linear(2, 2)
      b:load_state_dict(a:state_dict())
      assert.equal("f32", b.weight:type())
      local wa, wb = a.weight:tolist(), b.weight:tolist()
      for i = 1, 2 do for j = 1, 2 do assert.near(wa[i][j], wb[i][j], 1e-6) end end
    end)

    it("strict: raises naming the missing, unexpected and mismatched keys, copying nothing", function()
      local m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
      local before = m[1].weight:tolist()
      local sd = {
        ["0.weight"] = dl.ones({ 3, 2 }),
        ["0.bias"] = dl.ones({ 3 }),
        ["1.weight"] = dl.ones({ 1, 4 }),
        ["extra.weight"] = dl.ones({ 1 }),
      }
      local ok, err = pcall(function() m:load_state_dict(sd) end)
      assert.is_false(ok)
      assert.matches("Error%(s%) in loading state_dict for Sequential", err)
      assert.matches('Unexpected key%(s%) in state_dict: "extra.weight"', err)
      assert.matches('Missing key%(s%) in state_dict: "1.bias"', err)
      assert.matches("size mismatch for 1.weight: copying a param with shape %(1, 4%) from checkpoint, "
        .. "the shape in current model is %(1, 3%)", err)
      assert.same(before, m[1].weight:tolist())
    end)

    it("non-strict: returns the report and copies what matches", function()
      local m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
      local w1 = m[2].weight:tolist()
      local report = m:load_state_dict({
        ["0.weight"] = dl.full({ 3, 2 }, 2),
        ["1.weight"] = dl.ones({ 1, 4 }),
        ["zz"] = dl.ones({ 1 }),
        ["aa"] = dl.ones({ 1 }),
      }, { strict = false })
      assert.same({ "0.bias", "1.bias" }, report.missing_keys)
      assert.same({ "aa", "zz" }, report.unexpected_keys)
      assert.same({ { "1.weight", { 1, 3 }, { 1, 4 } } }, report.mismatched)
      assert.same({ { 2, 2 }, { 2, 2 }, { 2, 2 } }, m[1].weight:tolist())
      assert.same(w1, m[2].weight:tolist())
    end)

    it("raises for a value that is not a tensor", function()
      local m = nn.Linear(1, 1)
      local ok, err = pcall(function() m:load_state_dict({ weight = 3, bias = dl.zeros({ 1 }) }) end)
      assert.is_false(ok)
      assert.matches("entry 'weight' is a number", err)
    end)
  end)

  describe("modes and gradients", function()
    it("train/eval are recursive", function()
      local net = make_net()
      net:eval()
      for _, m in ipairs(net:modules()) do assert.is_false(m.training) end
      assert.equal(net, net:train())
      for _, m in ipairs(net:modules()) do assert.is_true(m.training) end
      net.blocks:train(false)
      assert.is_true(net.training)
      assert.is_false(net.blocks[1].norm.training)
      assert.is_true(net.head.training)
    end)

    it("zero_grad sets gradients to nil by default, or to zeros", function()
      local lin = nn.Linear(3, 2)
      local loss = dl.mse_loss(lin.weight, dl.ones({ 2, 3 }))
      loss:backward()
      assert.is_not_nil(lin.weight.grad)
      lin:zero_grad({ set_to_none = false })
      assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, lin.weight.grad:tolist())
      lin:zero_grad()
      assert.is_nil(lin.weight.grad)
    end)

    it("requires_grad_ switches every parameter", function()
      local net = make_net()
      net:requires_grad_(false)
      for _, p in ipairs(net:parameters()) do assert.is_false(p.requires_grad) end
      net:requires_grad_()
      for _, p in ipairs(net:parameters()) do assert.is_true(p.requires_grad) end
    end)

    it("apply visits children before their parent", function()
      local seq = nn.Sequential(nn.Sequential(nn.Identity(), nn.ReLU()), nn.Tanh())
      local seen = {}
      assert.equal(seq, seq:apply(function(m) seen[#seen + 1] = m:_get_name() end))
      assert.same({ "Identity", "ReLU", "Sequential", "Tanh", "Sequential" }, seen)
    end)
  end)

  describe("to(dtype)", function()
    it("converts floating parameters and buffers, keeps integer buffers and shared parameters", function()
      local shared = nn.Linear(2, 2)
      local net = nn.Sequential(shared, nn.BatchNorm1d(2), shared)
      local w = shared.weight:tolist()
      local same = net:to("f32")
      assert.equal(net, same)
      assert.equal(shared.weight, net[1].weight) -- nothing to convert: the same object
      local old = shared.weight
      net:double()
      assert.equal("f64", net[1].weight:type())
      assert.equal(old, net[1].weight) -- the same object with new data (Note [module to])
      assert.equal(net[1].weight, net[3].weight)
      assert.is_true(nn.is_parameter(net[1].weight))
      assert.is_true(net[1].weight.requires_grad)
      assert.equal("f64", net[2].running_var:type())
      assert.equal("i64", net[2].num_batches_tracked:type())
      local w2 = net[1].weight:tolist()
      for i = 1, 2 do for j = 1, 2 do assert.near(w[i][j], w2[i][j], 1e-7) end end
      assert.equal(2, #net:parameters() - 2) -- shared counted once: 2 (linear) + 2 (bn)
      local ok, err = pcall(function() net:to("i64") end)
      assert.is_false(ok)
      assert.matches("expected a floating dtype", err)
    end)
  end)

  describe("to(dtype) keeps the objects", function()
    it("an optimizer built before to() updates the converted parameters; grads convert too", function()
      local dl = require "ddplua"
      local lin = nn.Linear(3, 2)
      local opt = dl.optim.SGD(lin:parameters(), { lr = 1 })
      lin.weight.grad = dl.ones { 2, 3 }
      lin:double()
      assert.equal("f64", lin.weight.grad:type())
      local before = lin.weight:clone()
      opt:step()
      local after = lin.weight
      assert.near(before:get(1, 1) - 1, after:get(1, 1), 1e-12)
      assert.equal("f64", opt.param_groups[1].params[1]:type())
    end)

    it("set_data refuses non-leaves and integer data for a tensor that requires grad", function()
      local dl = require "ddplua"
      local C = require("ddplua.lib").C
      local p = nn.Parameter(dl.ones { 2 })
      local y = p * 2
      assert.are_not.equal(0, C.ddp_tensor_set_data(y, dl.zeros { 2 }))
      assert.matches("not a leaf", require("ffi").string(C.ddp_last_error()))
      assert.are_not.equal(0, C.ddp_tensor_set_data(p, dl.zeros({ 2 }, { dtype = "i64" })))
      assert.matches("only floating", require("ffi").string(C.ddp_last_error()))
      assert.equal(0, C.ddp_tensor_set_data(p, dl.zeros { 3 }))
      assert.same({ 3 }, p:size())
    end)
  end)

  describe("printing", function()
    it("prints the module tree as PyTorch's repr", function()
      local model = nn.Sequential(nn.Conv2d(1, 32, 3, { padding = 1 }), nn.ReLU())
      assert.equal("Sequential(\n"
        .. "  (0): Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        .. "  (1): ReLU()\n"
        .. ")", tostring(model))
    end)

    it("indents nested modules and prints each layer's options", function()
      local Net = nn.Module:extend("Net")
      function Net:init()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 5, { stride = 2, bias = false, groups = 1 }),
          nn.BatchNorm2d(8, { momentum = false }), nn.MaxPool2d(2), nn.AvgPool2d(2, { stride = 1 }))
        self.pool = nn.AdaptiveAvgPool2d({ 1, 1 })
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8, 4, { bias = false })
        self.norm = nn.LayerNorm(4)
        self.drop = nn.Dropout(0.1)
        self.act = nn.LeakyReLU(0.2)
        self.gelu = nn.GELU()
        self.sm = nn.LogSoftmax(2)
        self.emb = nn.Embedding(10, 4, { padding_idx = -1 })
        self.loss = nn.CrossEntropyLoss()
      end
      assert.equal([[Net(
  (features): Sequential(
    (0): Conv2d(3, 8, kernel_size=(5, 5), stride=(2, 2), bias=False)
    (1): BatchNorm2d(8, eps=1e-05, momentum=None, affine=True, track_running_stats=True)
    (2): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)
    (3): AvgPool2d(kernel_size=2, stride=1, padding=0)
  )
  (pool): AdaptiveAvgPool2d(output_size=(1, 1))
  (flat): Flatten(start_dim=2, end_dim=-1)
  (fc): Linear(in_features=8, out_features=4, bias=False)
  (norm): LayerNorm((4,), eps=1e-05, elementwise_affine=True)
  (drop): Dropout(p=0.1, inplace=False)
  (act): LeakyReLU(negative_slope=0.2)
  (gelu): GELU(approximate='none')
  (sm): LogSoftmax(dim=2)
  (emb): Embedding(10, 4, padding_idx=9)
  (loss): CrossEntropyLoss()
)]], tostring(Net()))
    end)
  end)

  describe("containers", function()
    it("Sequential indexes from 1, names from 0, appends, replaces and chains forward", function()
      local Add = nn.Module:extend("Add")
      function Add:init(v) self.v = v end
      function Add:forward(x) return x * 10 + self.v end
      local seq = nn.Sequential(Add(1), Add(2))
      seq:append(Add(3))
      assert.equal(3, seq:len())
      assert.equal(1, seq[1].v)
      assert.equal(3, seq[-1].v)
      assert.is_nil(seq[4])
      assert.equal(seq[1], seq["0"])
      assert.equal(123, seq(0))
      seq[2] = Add(5)
      assert.equal(153, seq(0))
      assert.same({ "0", "1", "2" }, names_of(seq:named_children()))
      local named = nn.Sequential({ { "first", Add(4) }, { "second", Add(6) } })
      assert.same({ "first", "second" }, names_of(named:named_children()))
      assert.equal(46, named(0))
      local listed = nn.Sequential({ Add(7), Add(8) })
      assert.equal(78, listed(0))
      local ok, err = pcall(function() nn.Sequential(nn.ReLU(), 3) end)
      assert.is_false(ok)
      assert.matches("Sequential: argument 2 is not a Module", err)
    end)

    it("ModuleList holds modules with names 0, 1, ... and inserts renaming", function()
      local ml = nn.ModuleList({ nn.Linear(1, 2), nn.Linear(2, 3) })
      ml:append(nn.Linear(3, 4))
      assert.equal(3, ml:len())
      assert.equal(4, ml[3].out_features)
      ml:insert(1, nn.Identity())
      assert.equal("Identity", ml[1]:_get_name())
      assert.equal(2, ml[2].out_features)
      assert.same({ "1.weight", "1.bias", "2.weight", "2.bias", "3.weight", "3.bias" },
        names_of(ml:named_parameters()))
      assert.equal(4, #ml:list())
      local ok, err = pcall(function() ml(1) end)
      assert.is_false(ok)
      assert.matches("ModuleList: it has no forward", err)
    end)

    it("ModuleDict keeps insertion order (pairs list) or sorted names (a map)", function()
      local md = nn.ModuleDict({ { "b", nn.Linear(1, 1) }, { "a", nn.ReLU() } })
      assert.same({ "b", "a" }, md:keys())
      md.c = nn.Tanh()
      md:set("d", nn.Identity())
      assert.same({ "b", "a", "c", "d" }, md:keys())
      assert.equal("Tanh", md:get("c"):_get_name())
      assert.equal(md:get("b"), md.b)
      assert.equal(4, md:len())
      assert.equal("ReLU", md:pop("a"):_get_name())
      assert.same({ "b", "c", "d" }, names_of(md:items()))
      local sorted = nn.ModuleDict({ z = nn.ReLU(), m = nn.Tanh(), a = nn.Identity() })
      assert.same({ "a", "m", "z" }, sorted:keys())
      assert.same({ "b.weight", "b.bias" }, names_of(md:named_parameters()))
    end)
  end)
  describe("nn.utils", function()
    it("parameters_to_vector and vector_to_parameters round-trip in parameter order", function()
      local m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
      local ps = m:parameters()
      local v = nn.utils.parameters_to_vector(ps)
      assert.same({ 6 + 3 + 3 + 1 }, v:size())
      assert.equal(ps[1]:get(2, 1), v:get(3))
      assert.equal(ps[2]:get(1), v:get(7))
      assert.equal(ps[4]:get(1), v:get(13))
      local target = dl.arange(13, { dtype = "f32" })
      nn.utils.vector_to_parameters(target, ps)
      assert.same({ { 0, 1 }, { 2, 3 }, { 4, 5 } }, m[1].weight:tolist())
      assert.same({ 12 }, m[2].bias:tolist())
      assert.is_true(m[1].weight.is_leaf)
      local ok, err = pcall(function() nn.utils.vector_to_parameters(dl.zeros({ 5 }), ps) end)
      assert.is_false(ok)
      assert.matches("expected a 1%-d vector of 13 elements", err)
    end)
  end)
end)
