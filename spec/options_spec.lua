-- Specs for ddplua.options: every constructor that takes an options table rejects a key it
-- does not know, naming it (and the closest known one), instead of silently keeping the
-- default (issue 10: DDP accepted `bucket_cap_mbb`).
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local data = require "ddplua.data"
local options = require "ddplua.options"
local DistributedSampler = require "ddplua.distributed.sampler"

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "no error")
  return tostring(err)
end

describe("ddplua.options #faults", function()
  it("check passes known keys and nil, and names an unknown key with a suggestion", function()
    local known = options.known { "bucket_cap_mb", "timeout" }
    assert.same({}, options.check("X", nil, known))
    local t = { timeout = 1 }
    assert.equal(t, options.check("X", t, known))
    local err = err_of(options.check, "DistributedDataParallel", { bucket_cap_mbb = 1 }, known)
    assert.matches("DistributedDataParallel: unknown option 'bucket_cap_mbb' (did you mean 'bucket_cap_mb'? "
      .. "known options: bucket_cap_mb, timeout)", err, 1, true)
    assert.matches("unknown option 'zzzzzzzzzz' (known options: bucket_cap_mb, timeout)",
      err_of(options.check, "X", { zzzzzzzzzz = 1 }, known), 1, true)
    assert.matches("X: options must be a table, got number", err_of(options.check, "X", 3, known), 1, true)
    -- the first unknown key in sorted order, whatever the traversal
    assert.matches("unknown option 'a'", err_of(options.check, "X", { b = 1, a = 1, c = 1 }, known), 1, true)
  end)

  it("the error points at the caller's line", function()
    local err = err_of(function() nn.Linear(2, 3, { biass = false }) end)
    assert.matches("options_spec.lua:%d+: Linear: unknown option 'biass' %(did you mean 'bias'%?", err)
  end)

  local cases = {
    { "zeros", function() dl.zeros({ 2 }, { dtyp = "f64" }) end },
    { "ones", function() dl.ones({ 2 }, { requires_gradient = true }) end },
    { "full", function() dl.full({ 2 }, 1, { requires_gradient = true }) end },
    { "tensor", function() dl.tensor({ 1, 2 }, { bogus = 1 }) end },
    { "arange", function() dl.arange(0, 4, { bogus = 1 }) end },
    { "randn", function() dl.randn({ 2 }, { bogus = 1 }) end },
    { "zeros_like", function() dl.zeros_like(dl.ones({ 2 }), { bogus = 1 }) end },
    { "Linear", function() nn.Linear(2, 3, { bogus = 1 }) end },
    { "Conv2d", function() nn.Conv2d(1, 1, 3, { bogus = 1 }) end },
    { "BatchNorm2d", function() nn.BatchNorm2d(3, { bogus = 1 }) end },
    { "BatchNorm1d", function() nn.BatchNorm1d(3, { bogus = 1 }) end },
    { "LayerNorm", function() nn.LayerNorm(3, { bogus = 1 }) end },
    { "Embedding", function() nn.Embedding(3, 2, { bogus = 1 }) end },
    { "MaxPool2d", function() nn.MaxPool2d(2, { bogus = 1 }) end },
    { "AvgPool2d", function() nn.AvgPool2d(2, { bogus = 1 }) end },
    { "Dropout", function() nn.Dropout(0.5, { bogus = 1 }) end },
    { "CrossEntropyLoss", function() nn.CrossEntropyLoss { bogus = 1 } end },
    { "NLLLoss", function() nn.NLLLoss { label_smoothing = 0.1 } end },
    { "MSELoss", function() nn.MSELoss { bogus = 1 } end },
    { "DataParallel", function() nn.DataParallel(nn.Linear(2, 2), { bogus = 1 }) end },
    { "SGD", function() optim.SGD({ dl.zeros({ 2 }, { requires_grad = true }) }, { bogus = 1 }) end },
    { "StepLR", function()
      local opt = optim.SGD({ dl.zeros({ 2 }, { requires_grad = true }) }, { lr = 0.1 })
      optim.StepLR(opt, { step_size = 1, bogus = 1 })
    end },
    { "DataLoader", function() data.DataLoader(data.TensorDataset(dl.zeros({ 4, 2 })), { num_worker = 2 }) end },
    { "DistributedSampler", function() DistributedSampler(10, { num_replicas = 1, rank = 0, bogus = 1 }) end },
    { "FashionMNIST", function() data.FashionMNIST { bogus = 1 } end },
    { "CIFAR10", function() data.CIFAR10 { bogus = 1 } end },
    { "spawn", function() require("ddplua.distributed.spawn")(function() end, 1, { bogus = 1 }) end },
    { "init_process_group", function() require("ddplua.distributed").init_process_group { bogus = 1 } end },
    { "TCPStore", function() require("ddplua.distributed.store").TCPStore("127.0.0.1", 1, { secrett = "x" }) end },
    { "FileStore", function() require("ddplua.distributed.store").FileStore("/nonexistent/f", { bogus = 1 }) end },
    { "new_group", function() require("ddplua.distributed").new_group({ 0 }, { timout = 1 }) end },
    { "DistributedDataParallel", function()
      require("ddplua.distributed.ddp")(nn.Linear(2, 2), { static_graf = true })
    end },
    { "ArgumentParser", function() require("ddplua.utils.argparse").ArgumentParser { bogus = 1 } end },
    { "StepProfiler", function() require("ddplua.utils.step_profiler").new { bogus = 1 } end },
    { "Progress", function() require("ddplua.utils.progress").new { bogus = 1 } end },
    { "MetricsFile", function() require("ddplua.utils.metrics_file").open("/nonexistent/m.csv", {}, { bogus = 1 }) end },
  }
  -- Every option a constructor documents passes its check (the lists are kept by hand).
  it("init_process_group takes every option it documents", function()
    local err = err_of(require("ddplua.distributed").init_process_group, { backend = "gloo",
      init_method = "file:///nonexistent-dir/store", rank = 0, world_size = 1, timeout = 1,
      device_id = "cpu", group_name = "g", store_secret = "s" })
    assert.not_matches("unknown option", err, 1, true)
  end)

  for _, c in ipairs(cases) do
    it(c[1] .. " rejects an unknown option naming it", function()
      local err = err_of(c[2])
      assert.matches(c[1] .. ": unknown option '", err, 1, true)
    end)
  end
end)
