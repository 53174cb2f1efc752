-- Specs for ddplua.utils.train_config: defaults and command-line overrides, the model (built
-- through the caller's find_model: the library never requires models/), the optimizer and
-- schedule built from a config, and the messages for bad configs.
local train_config = require "ddplua.utils.train_config"
local files = require "files"

describe("ddplua.utils.train_config", function()
  local dir
  before_each(function() dir = files.tmpdir("config") end)
  after_each(function() files.remove(dir) end)

  local function write(name, text) return files.write(dir, name, text) end

  it("fills defaults and applies overrides", function()
    local path = write("tiny.lua", 'return { model = "mlp", optimizer = { name = "Adam", lr = 0.001 } }')
    local cfg = train_config.load(path, { epochs = 5, lr = 0.01, subset = 100 })
    assert.are.equal("tiny", cfg.name)
    assert.are.equal("runs/tiny", cfg.out)
    assert.are.equal(5, cfg.epochs)
    assert.are.equal(64, cfg.batch_size)
    assert.are.equal(0, cfg.seed)
    assert.are.equal(100, cfg.subset)
    assert.are.equal(0.01, cfg.optimizer.lr)
    cfg = train_config.load("configs/fashion_mnist_cnn.lua", { out = dir .. "/o" })
    assert.are.equal("fashion_mnist_cnn", cfg.name)
    assert.are.equal(dir .. "/o", cfg.out)
    assert.are.equal(3, cfg.epochs)
  end)

  it("builds the model, the optimizer and the schedule over all steps", function()
    local cfg = train_config.load("configs/fashion_mnist_mlp.lua", { epochs = 2 })
    local model = train_config.model(cfg, function(name) return require("models." .. name) end)
    assert.is_true(#model:parameters() > 0)
    local opt = train_config.optimizer(cfg, model:parameters())
    assert.are.equal(cfg.optimizer.lr, opt.param_groups[1].lr)
    cfg.schedule = { name = "CosineAnnealingLR" }
    local sched = train_config.scheduler(cfg, opt, 10)
    assert.are.equal(20, sched.T_max)
    cfg.schedule = nil
    assert.is_nil(train_config.scheduler(cfg, opt, 10))
  end)

  it("takes the model constructor from the caller's find_model, never from models/ itself", function()
    -- a name no file under models/ has: only the caller's lookup knows it
    local cfg = train_config.load(write("own.lua", 'return { model = "caller_only_net", model_opts = { width = 3 } }'))
    local asked, built_with
    local model = train_config.model(cfg, function(name)
      asked = name
      return function(opts) built_with = opts return { kind = "caller's model" } end
    end)
    assert.are.equal("caller_only_net", asked)
    assert.are.same({ width = 3 }, built_with)
    assert.are.equal("caller's model", model.kind)
    local ok, err = pcall(train_config.model, cfg, nil, "t.lua")
    assert.is_false(ok)
    assert.matches("^t.lua: train_config.model%(cfg, find_model%): find_model must be a function", err)
    ok, err = pcall(train_config.model, cfg, function() return nil end, "t.lua")
    assert.is_false(ok)
    assert.matches("^t.lua: no model named 'caller_only_net'", err)
  end)

  it("names the file or the field at fault", function()
    local ok, err = pcall(train_config.load, dir .. "/missing.lua", {}, "t.lua")
    assert.is_false(ok)
    assert.matches("^t.lua: cannot load config .*missing.lua", err)
    ok, err = pcall(train_config.load, write("num.lua", "return 3"), {}, "t.lua")
    assert.matches("must return a table", err)
    local cfg = train_config.load(write("bad.lua", 'return { model = "mlp", dataset = "imagenet", optimizer = { name = "Lion" } }'))
    ok, err = pcall(train_config.datasets, cfg)
    assert.matches("unknown dataset 'imagenet'", err)
    ok, err = pcall(train_config.optimizer, cfg, {})
    assert.matches("unknown optimizer 'Lion'", err)
    cfg.schedule = { name = "Nope" }
    ok, err = pcall(train_config.scheduler, cfg, nil, 1)
    assert.matches("unknown schedule 'Nope'", err)
    cfg.dataset, cfg.data_root = "cifar10", nil
    ok, err = pcall(train_config.datasets, cfg)
    assert.matches("CIFAR%-10 needs %-%-data%-root", err)
  end)
end)
