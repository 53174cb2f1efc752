--- ddplua.utils.train_config: training configs (plain Lua tables, configs/*.lua) and the
-- objects they describe: datasets, optimizer, learning-rate schedule, model.
--
--   local train_config = require "ddplua.utils.train_config"
--   local cfg = train_config.load("configs/fashion_mnist_cnn.lua", { epochs = 5, lr = 0.1 })
--   local train_set, test_set = train_config.datasets(cfg)
--   local model = train_config.model(cfg, function(name) return require("models." .. name) end)
--   local opt = train_config.optimizer(cfg, model:parameters())
--   local sched = train_config.scheduler(cfg, opt, #loader)   -- nil when cfg.schedule is nil
--
-- A config's fields: name (default: the file's name), model (the name of a model, such as a
-- module under models/, which the caller's find_model turns into a constructor called with
-- model_opts), dataset ("fashion_mnist" (default), "mnist", "cifar10"),
-- data_root, augment (CIFAR-10 random crop and flip), batch_size (64), epochs (3), seed (0),
-- subset / test_subset (first N samples), optimizer ({name = "SGD", lr = 0.05, momentum =
-- 0.9} by default; any ddplua.optim class with its options), schedule (nil or {name = a
-- scheduler class, options...}; CosineAnnealingLR's T_max and OneCycleLR's total_steps
-- default to all steps of all epochs), device, amp (nil, "bf16" or "f16": mixed precision,
-- ddplua/utils/mixed_precision.lua). A config with task = "text" trains a language model on
-- token files instead (its fields: ddplua/utils/text_train.lua).
--
-- Every function takes an optional `prog` (default "ddplua") that prefixes its messages;
-- errors are raised with error(msg, 0) (a user's file or flag is at fault, not a line).
local data = require "ddplua.data"
local lib = require "ddplua.lib"
local optim = require "ddplua.optim"

local M = {}

-- The fields a command line may override directly (opts key = config key).
local OVERRIDES = { "epochs", "batch_size", "seed", "subset", "test_subset", "data_root", "amp", "max_iters",
  "eval_interval", "eval_iters", "gradient_accumulation_steps", "data_dir" }

--- train_config.load(path, overrides, prog) -> cfg: run the config file at `path` and
-- apply `overrides` (a table as ddplua.utils.argparse returns: epochs, batch_size, seed,
-- subset, test_subset, data_root, amp, and for text configs max_iters, eval_interval,
-- eval_iters, gradient_accumulation_steps, data_dir replace the config's; lr replaces optimizer.lr; out is the
-- output folder, default "runs/<name>"), then fill the defaults (see the top). Raises when
-- the file cannot be loaded or does not return a table.
function M.load(path, overrides, prog)
  prog = prog or "ddplua"
  overrides = overrides or {}
  lib.path(path, prog .. ": train_config.load")
  local chunk, err = loadfile(path)
  if not chunk then error(prog .. ": cannot load config " .. path .. ": " .. err, 0) end
  local cfg = chunk()
  if type(cfg) ~= "table" then error(prog .. ": config " .. path .. " must return a table", 0) end
  cfg.optimizer = cfg.optimizer or { name = "SGD", lr = 0.05, momentum = 0.9 }
  for _, k in ipairs(OVERRIDES) do
    if overrides[k] ~= nil then cfg[k] = overrides[k] end
  end
  if overrides.lr then cfg.optimizer.lr = overrides.lr end
  cfg.name = cfg.name or path:match("([^/]+)%.lua$")
  cfg.out = overrides.out or ("runs/" .. cfg.name)
  cfg.epochs = cfg.epochs or 3
  cfg.batch_size = cfg.batch_size or 64
  cfg.seed = cfg.seed or 0
  return cfg
end

--- train_config.datasets(cfg, prog) -> train_set, test_set (ddplua.data datasets). CIFAR-10
-- needs cfg.data_root (Debian does not ship it); Fashion-MNIST reads Debian's files.
-- Raises for an unknown dataset or a missing CIFAR-10 root.
function M.datasets(cfg, prog)
  prog = prog or "ddplua"
  if cfg.dataset == "fashion_mnist" or cfg.dataset == nil then
    return data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
  elseif cfg.dataset == "mnist" then
    return data.MNIST { train = true, root = cfg.data_root }, data.MNIST { train = false, root = cfg.data_root }
  elseif cfg.dataset == "cifar10" then
    if not cfg.data_root then
      error(prog .. ": CIFAR-10 needs --data-root DIR (or $CIFAR10_ROOT): its binary batches are not shipped by Debian", 0)
    end
    local train_tf = nil
    if cfg.augment then
      train_tf = data.Compose { data.RandomCrop(32, { padding = 4 }), data.RandomHorizontalFlip(0.5),
        data.ToFloat(), data.Normalize({ 0.4914, 0.4822, 0.4465 }, { 0.2470, 0.2435, 0.2616 }) }
    end
    return data.CIFAR10 { train = true, root = cfg.data_root, transform = train_tf },
        data.CIFAR10 { train = false, root = cfg.data_root }
  end
  error(prog .. ": unknown dataset '" .. tostring(cfg.dataset) .. "'", 0)
end

--- train_config.model(cfg, find_model, prog) -> a new nn.Module:
-- find_model(cfg.model)(cfg.model_opts). find_model(name) returns the constructor of the
-- model `name`; the caller supplies it (train.lua: function(name) return require("models."
-- .. name) end), because models/ is the user's code and a library module never requires
-- user code (Note [lua layers] in tools/check_layers.lua). Raises when find_model is not a
-- function or finds no constructor for cfg.model.
function M.model(cfg, find_model, prog)
  prog = prog or "ddplua"
  if type(find_model) ~= "function" then
    error(("%s: train_config.model(cfg, find_model): find_model must be a function (name -> "
      .. "model constructor), got %s"):format(prog, type(find_model)), 0)
  end
  local ctor = find_model(cfg.model)
  if ctor == nil then
    error(("%s: no model named '%s' (find_model returned nil)"):format(prog, tostring(cfg.model)), 0)
  end
  return ctor(cfg.model_opts)
end

-- A copy of a {name = ..., options...} table without its name.
local function options(t)
  local o = {}
  for k, v in pairs(t) do if k ~= "name" then o[k] = v end end
  return o
end

--- train_config.optimizer(cfg, params, prog) -> a ddplua.optim optimizer over `params`
-- built from cfg.optimizer. Raises for an unknown optimizer name.
function M.optimizer(cfg, params, prog)
  local ctor = optim[cfg.optimizer.name or "SGD"]
  if not ctor then error((prog or "ddplua") .. ": unknown optimizer '" .. tostring(cfg.optimizer.name) .. "'", 0) end
  return ctor(params, options(cfg.optimizer))
end

--- train_config.scheduler(cfg, opt, steps_per_epoch, prog) -> a scheduler stepped once per
-- step, or nil when cfg.schedule is nil. Raises for an unknown schedule name.
function M.scheduler(cfg, opt, steps_per_epoch, prog)
  local s = cfg.schedule
  if not s then return nil end
  local o = options(s)
  if s.name == "CosineAnnealingLR" and not o.T_max then o.T_max = cfg.epochs * steps_per_epoch end
  if s.name == "OneCycleLR" and not o.total_steps then o.total_steps = cfg.epochs * steps_per_epoch end
  local ctor = optim[s.name]
  if not ctor then error((prog or "ddplua") .. ": unknown schedule '" .. tostring(s.name) .. "'", 0) end
  return ctor(opt, o)
end

return M
