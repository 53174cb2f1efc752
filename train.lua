--- train.lua: train a model from a config on Fashion-MNIST (or CIFAR-10), in one process
-- or data-parallel under the launcher.
--
--   ddplua train.lua [--config FILE] [--epochs N] [--batch-size N] [--lr X] [--seed N]
--                    [--out DIR] [--resume CKPT] [--subset N] [--test-subset N]
--                    [--stop-after N] [--threads N] [--data-root DIR] [--quiet]
--                    [--save-all-ranks] [--profile] [--device cpu|cuda|cuda:K]
--   ddplua --nproc_per_node=2 train.lua ...      # DDP over 2 processes (gloo, or nccl on GPUs)
--
-- Devices: --device cuda (or `device = "cuda"` in the config; the default when
-- dl.cuda.is_available(), else cpu) puts the model, every batch and the loss on a GPU. In
-- one process that is the current device (cuda:0 unless --device cuda:K names another).
-- Under the launcher each process takes cuda:LOCAL_RANK (as torchrun scripts do with
-- torch.cuda.set_device(LOCAL_RANK)); it is an error when LOCAL_RANK is not below the
-- number of devices. The process group uses "nccl" on CUDA and "gloo" on the CPU. The
-- loader's prefetch thread puts batches in pinned host memory and they are copied with
-- non_blocking: the host does not wait for the copy and goes on queuing the step's kernels
-- behind it on the same stream. The model is moved before the optimizer is built (Note
-- [module to] in ddplua/nn/module.lua); checkpoints hold host copies and load onto
-- whichever device the run uses, so a run on one device can resume on another.
-- DDPLUA_CUDA_PLUGIN selects another CUDA plug-in (the specs run --device cuda on the
-- simulated device build/libddplua_cuda_sim.so).
--
-- Under the launcher (WORLD_SIZE > 1) it joins the process group (env://), wraps the model
-- in DistributedDataParallel, shards the training set with DistributedSampler (set_epoch
-- every epoch) and the test set with the evaluation sampler (each test sample counted
-- once), reduces loss and accuracy across ranks, and only rank 0 prints and writes files.
-- The config's batch_size is the GLOBAL batch: each rank takes batch_size / world_size, so
-- a run on N processes follows the same trajectory as one process (DDP equivalence).
--
-- Command-line values override the config (configs/fashion_mnist_cnn.lua by default).
-- Writes runs/<name>/metrics.csv (one row per epoch), runs/<name>/checkpoint.safetensors
-- (the whole training state after each epoch: --resume continues from it to the same
-- result as an uninterrupted run) and runs/<name>/model.safetensors (the model alone).
-- On a terminal each epoch shows a progress bar with loss and samples/s; otherwise plain
-- log lines. Evaluates on the test set after each epoch.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local data = require "ddplua.data"
local clock = require "ddplua.clock"
local train_state = require "ddplua.train_state"
local ffi = require "ffi"

local USAGE = [[
usage: ddplua train.lua [options]
  --config FILE      config file (default configs/fashion_mnist_cnn.lua)
  --epochs N         number of epochs
  --batch-size N     batch size
  --lr X             learning rate
  --seed N           seed of the model initialisation and of the data order
  --out DIR          output folder (default runs/<config name>)
  --resume CKPT      continue from a checkpoint.safetensors written by an earlier run
  --subset N         train on the first N training samples only (quick runs, specs)
  --test-subset N    evaluate on the first N test samples only
  --stop-after N     stop after epoch N of the planned ones, as if interrupted (the
                     schedule still spans all epochs; --resume continues)
  --threads N        threads for the kernels and OpenBLAS
  --data-root DIR    dataset folder (CIFAR-10 binary batches; Fashion-MNIST has a default)
  --quiet            no progress output (the epoch summaries still print)
  --save-all-ranks   every rank writes runs/<name>/model_rank<R>.safetensors after each
                     epoch (for `ddplua verify`)
  --profile          print a per-step time breakdown (data, forward, backward, exposed
                     communication, optimizer) after each epoch
  --device D         cpu, cuda (the current device) or cuda:K; default cuda when CUDA is
                     available, else cpu. Under the launcher cuda means cuda:LOCAL_RANK
]]

-- ---- options ------------------------------------------------------------------------------

local function parse_args(argv)
  local opts = {}
  local flags = {
    ["--config"] = "config", ["--epochs"] = "epochs", ["--batch-size"] = "batch_size",
    ["--lr"] = "lr", ["--seed"] = "seed", ["--out"] = "out", ["--resume"] = "resume",
    ["--subset"] = "subset", ["--test-subset"] = "test_subset", ["--threads"] = "threads",
    ["--data-root"] = "data_root", ["--stop-after"] = "stop_after", ["--device"] = "device",
  }
  local numeric = { epochs = true, batch_size = true, lr = true, seed = true, subset = true,
    test_subset = true, threads = true, stop_after = true }
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local key, value = a:match("^(%-%-[%w%-]+)=(.*)$")
    key = key or a
    if key == "--help" or key == "-h" then
      io.write(USAGE)
      os.exit(0)
    elseif key == "--quiet" then
      opts.quiet = true
    elseif key == "--save-all-ranks" then
      opts.save_all_ranks = true
    elseif key == "--profile" then
      opts.profile = true
    elseif flags[key] then
      if not value then
        i = i + 1
        value = argv[i]
      end
      if value == nil then error("train.lua: " .. key .. " needs a value\n" .. USAGE, 0) end
      local name = flags[key]
      if numeric[name] then
        local n = tonumber(value)
        if not n then error("train.lua: " .. key .. " expects a number, got '" .. value .. "'", 0) end
        value = n
      end
      opts[name] = value
    else
      error("train.lua: unknown option '" .. a .. "'\n" .. USAGE, 0)
    end
    i = i + 1
  end
  return opts
end

local function load_config(opts)
  local path = opts.config or "configs/fashion_mnist_cnn.lua"
  local chunk, err = loadfile(path)
  if not chunk then error("train.lua: cannot load config " .. path .. ": " .. err, 0) end
  local cfg = chunk()
  if type(cfg) ~= "table" then error("train.lua: config " .. path .. " must return a table", 0) end
  cfg.optimizer = cfg.optimizer or { name = "SGD", lr = 0.05, momentum = 0.9 }
  for _, k in ipairs { "epochs", "batch_size", "seed", "subset", "test_subset", "data_root" } do
    if opts[k] ~= nil then cfg[k] = opts[k] end
  end
  if opts.lr then cfg.optimizer.lr = opts.lr end
  cfg.name = cfg.name or path:match("([^/]+)%.lua$")
  cfg.out = opts.out or ("runs/" .. cfg.name)
  cfg.epochs = cfg.epochs or 3
  cfg.batch_size = cfg.batch_size or 64
  cfg.seed = cfg.seed or 0
  return cfg
end

-- ---- data ----------------------------------------------------------------------------------

local DistributedSampler = require "ddplua.distributed.sampler"
local function datasets(cfg)
  if cfg.dataset == "fashion_mnist" or cfg.dataset == nil then
    return data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
  elseif cfg.dataset == "mnist" then
    return data.MNIST { train = true, root = cfg.data_root }, data.MNIST { train = false, root = cfg.data_root }
  elseif cfg.dataset == "cifar10" then
    if not cfg.data_root then
      error("train.lua: CIFAR-10 needs --data-root DIR (or $CIFAR10_ROOT): its binary batches are not shipped by Debian", 0)
    end
    local train_tf = nil
    if cfg.augment then
      train_tf = data.Compose { data.RandomCrop(32, { padding = 4 }), data.RandomHorizontalFlip(0.5),
        data.ToFloat(), data.Normalize({ 0.4914, 0.4822, 0.4465 }, { 0.2470, 0.2435, 0.2616 }) }
    end
    return data.CIFAR10 { train = true, root = cfg.data_root, transform = train_tf },
        data.CIFAR10 { train = false, root = cfg.data_root }
  end
  error("train.lua: unknown dataset '" .. tostring(cfg.dataset) .. "'", 0)
end

-- ---- optimizer and schedule ------------------------------------------------------------------

local function make_optimizer(cfg, params)
  local o = {}
  for k, v in pairs(cfg.optimizer) do if k ~= "name" then o[k] = v end end
  local ctor = optim[cfg.optimizer.name or "SGD"]
  if not ctor then error("train.lua: unknown optimizer '" .. tostring(cfg.optimizer.name) .. "'", 0) end
  return ctor(params, o)
end

local function make_scheduler(cfg, opt, steps_per_epoch)
  local s = cfg.schedule
  if not s then return nil end
  local o = {}
  for k, v in pairs(s) do if k ~= "name" then o[k] = v end end
  if s.name == "CosineAnnealingLR" and not o.T_max then o.T_max = cfg.epochs * steps_per_epoch end
  if s.name == "OneCycleLR" and not o.total_steps then o.total_steps = cfg.epochs * steps_per_epoch end
  local ctor = optim[s.name]
  if not ctor then error("train.lua: unknown schedule '" .. tostring(s.name) .. "'", 0) end
  return ctor(opt, o)
end

-- ---- output ---------------------------------------------------------------------------------

pcall(ffi.cdef, "int isatty(int fd);")
local on_terminal = ffi.C.isatty(1) == 1

local function progress(epoch, epochs, done, total, loss, samples_per_s)
  local width = 30
  local filled = math.floor(width * done / math.max(total, 1))
  io.write(("\repoch %d/%d [%s%s] %3d%% loss %.4f %6.0f samples/s"):format(epoch, epochs,
    string.rep("=", filled), string.rep(" ", width - filled), math.floor(100 * done / math.max(total, 1)),
    loss, samples_per_s))
  io.flush()
end

local function mkdir_p(dir)
  local ok = os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'")
  if ok ~= 0 and ok ~= true then error("train.lua: cannot create " .. dir, 0) end
end

-- ---- training -------------------------------------------------------------------------------

--- The device this process trains on, as a string: "cpu" or "cuda:k". `requested` is
-- --device (nil: cuda when available, else cpu). Under the launcher (local_rank set) a
-- CUDA device is cuda:LOCAL_RANK. Raises when CUDA is asked for but missing, or when
-- LOCAL_RANK has no device.
local function choose_device(requested, local_rank)
  if requested == nil then requested = dl.cuda.is_available() and "cuda" or "cpu" end
  if requested == "cpu" then return "cpu" end
  if not dl.cuda.is_device(requested) then
    error("train.lua: --device must be cpu, cuda or cuda:K, got '" .. tostring(requested) .. "'", 0)
  end
  if not dl.cuda.is_available() then
    error("train.lua: --device " .. requested .. ": CUDA is not available: " .. dl.cuda.unavailable_reason(), 0)
  end
  local count = dl.cuda.device_count()
  local k
  if local_rank ~= nil then
    k = local_rank
    if requested ~= "cuda" and requested ~= "cuda:" .. local_rank then
      error(("train.lua: --device %s under the launcher: each process uses cuda:LOCAL_RANK (cuda:%d); pass --device cuda"):format(
        requested, local_rank), 0)
    end
    if k >= count then
      error(("train.lua: LOCAL_RANK %d has no GPU: this host has %d CUDA device%s (cuda:0 .. cuda:%d); "
        .. "start at most %d process%s per node"):format(k, count, count == 1 and "" or "s", count - 1, count,
        count == 1 and "" or "es"), 0)
    end
  else
    k = requested == "cuda" and dl.cuda.current_device() or tonumber(requested:match("^cuda:(%d+)$"))
    if k >= count then
      error(("train.lua: --device %s does not exist: %d CUDA device%s"):format(requested, count, count == 1 and "" or "s"), 0)
    end
  end
  dl.cuda.set_device(k)
  return "cuda:" .. k
end

--- Sums of (loss, correct, count) over the test samples this rank holds, then over ranks.
local function evaluate(model, loader, dist, device)
  model:eval()
  local loss_sum, correct, count = 0, 0, 0
  dl.no_grad(function()
    for x, y in loader:iter() do
      x, y = x:to(device, { non_blocking = true }), y:to(device, { non_blocking = true })
      local logits = model(x)
      loss_sum = loss_sum + dl.cross_entropy(logits, y, { reduction = "sum" }):item()
      correct = correct + logits:argmax(2):eq(y):sum():item()
      count = count + y:numel()
    end
  end)
  model:train()
  if dist then loss_sum, correct, count = unpack(dist.sum_over_ranks { loss_sum, correct, count }) end
  return loss_sum / math.max(count, 1), correct / math.max(count, 1), count
end

--- The process group when launched with WORLD_SIZE > 1 ("nccl" when training on CUDA,
-- "gloo" on the CPU), with a helper summing numbers over ranks; nil in a single process.
local function join_process_group(device)
  if tonumber(os.getenv("WORLD_SIZE") or "1") <= 1 then return nil end
  local dist = require "ddplua.distributed"
  dist.init_process_group { backend = device == "cpu" and "gloo" or "nccl" }
  function dist.sum_over_ranks(values)
    local t = dl.tensor(values, { dtype = "f64", device = device })
    dist.all_reduce(t)
    return t:tolist()
  end
  return dist
end

--- Accumulates seconds per phase of a step for --profile.
local function new_profile()
  local p = { data = 0, forward = 0, backward = 0, comm = 0, optimizer = 0, steps = 0 }
  function p.report(epoch)
    local n = math.max(p.steps, 1)
    local ms = function(v) return 1000 * v / n end
    print(("profile epoch %d (ms per step, %d steps): data %.2f | forward %.2f | backward %.2f " ..
      "(of which exposed communication %.2f) | optimizer %.2f"):format(epoch, p.steps, ms(p.data),
      ms(p.forward), ms(p.backward), ms(p.comm), ms(p.optimizer)))
    p.data, p.forward, p.backward, p.comm, p.optimizer, p.steps = 0, 0, 0, 0, 0, 0
  end
  return p
end

local function main(argv)
  io.stdout:setvbuf("line") -- log lines appear as they happen, also through pipes and files
  local opts = parse_args(argv)
  local cfg = load_config(opts)
  if opts.threads then dl.set_num_threads(opts.threads) end
  local launched = tonumber(os.getenv("WORLD_SIZE") or "1") > 1
  local device = choose_device(opts.device or cfg.device, launched and tonumber(os.getenv("LOCAL_RANK") or "0") or nil)
  local dist = join_process_group(device)
  local world = dist and dist.get_world_size() or 1
  local rank = dist and dist.get_rank() or 0
  local is_main = rank == 0
  local function say(...) if is_main then print(...) end end
  if cfg.batch_size % world ~= 0 then
    error(("train.lua: the batch size %d (global) does not divide over %d processes"):format(cfg.batch_size, world), 0)
  end
  local local_batch = math.floor(cfg.batch_size / world)

  dl.manual_seed(cfg.seed) -- the same initial model on every rank (DDP also broadcasts rank 0's)
  -- Random transforms: a stream per rank, reseeded from (seed, epoch, rank) at every epoch,
  -- so a resumed run needs no per-rank generator state.
  local data_gen = dl.Generator(0)
  local train_set, test_set = datasets(cfg)
  local n_train = math.min(cfg.subset or #train_set, #train_set)
  local n_test = math.min(cfg.test_subset or #test_set, #test_set)
  -- The same sampler with world size 1 in a single process: a run on N processes then sees
  -- exactly the global batches of the single-process run.
  local sampler = DistributedSampler(n_train, { num_replicas = world, rank = rank, shuffle = true, seed = cfg.seed })
  local pin = device ~= "cpu"
  local loader = data.DataLoader(train_set, { batch_size = local_batch, sampler = sampler, generator = data_gen,
    pin_memory = pin })
  local test_loader = data.DataLoader(test_set, { batch_size = 256,
    sampler = DistributedSampler.DistributedEvalSampler(n_test, { num_replicas = world, rank = rank }),
    pin_memory = pin })

  local model = require("models." .. cfg.model)(cfg.model_opts)
  model:to(device) -- before the optimizer and DDP take its parameters (Note [module to])
  local net = model
  if dist then net = require("ddplua.distributed.ddp")(model) end
  local opt = make_optimizer(cfg, model:parameters())
  local sched = make_scheduler(cfg, opt, #loader)
  local state = { model = model, optimizer = opt, scheduler = sched,
    generators = { default = dl.default_generator } }

  if is_main then mkdir_p(cfg.out) end
  local start_epoch, step = 1, 0
  if opts.resume then
    local p = train_state.load(opts.resume, state)
    start_epoch, step = (p.epoch or 0) + 1, p.step or 0
    say(("resumed from %s after epoch %d (step %d)"):format(opts.resume, p.epoch or 0, step))
  end
  local metrics
  if is_main then
    metrics = assert(io.open(cfg.out .. "/metrics.csv", start_epoch > 1 and "a" or "w"))
    if start_epoch == 1 then
      metrics:write("epoch,step,lr,train_loss,train_acc,test_loss,test_acc,seconds,samples_per_s\n")
    end
  end

  say(("training %s: %s on %s, %d samples, batch %d (%d per process), %d epochs, %d process(es) x %d thread(s), device %s"):format(
    cfg.name, cfg.model, cfg.dataset or "fashion_mnist", n_train, cfg.batch_size, local_batch, cfg.epochs, world,
    dl.get_num_threads(), device == "cpu" and "cpu" or (device .. (world > 1 and " (cuda:LOCAL_RANK)" or ""))))
  local profile = opts.profile and new_profile()
  -- Kernels run asynchronously on a GPU: --profile waits for them at each phase boundary so
  -- that a phase's time is its own (this costs some overlap; plain runs never wait).
  local now = clock.now
  if profile and device ~= "cpu" then now = function() dl.cuda.synchronize(); return clock.now() end end
  local show_progress = is_main and not opts.quiet
  local test_acc
  model:train()
  local last_epoch = math.min(cfg.epochs, opts.stop_after or cfg.epochs)
  for epoch = start_epoch, last_epoch do
    sampler:set_epoch(epoch)
    data_gen:manual_seed((cfg.seed * 100003 + epoch) * 1024 + rank)
    local t0 = clock.now()
    local loss_sum, correct, seen, batches = 0, 0, 0, #loader
    local next_log = 0.1
    local b = 0
    local t_data = now()
    for x, y in loader:iter() do
      x, y = x:to(device, { non_blocking = true }), y:to(device, { non_blocking = true })
      local t_fwd = now()
      opt:zero_grad()
      local logits = net(x)
      local loss = dl.cross_entropy(logits, y)
      local t_bwd = now()
      loss:backward()
      local t_opt = now()
      opt:step()
      if sched then sched:step() end
      step, b = step + 1, b + 1
      local n = y:numel()
      loss_sum = loss_sum + loss:item() * n
      correct = correct + logits:argmax(2):eq(y):sum():item()
      seen = seen + n
      if profile then
        local t_end = now()
        profile.data = profile.data + (t_fwd - t_data)
        profile.forward = profile.forward + (t_bwd - t_fwd)
        profile.backward = profile.backward + (t_opt - t_bwd)
        profile.comm = profile.comm + (net.exposed_comm_seconds and net:exposed_comm_seconds() or 0)
        profile.optimizer = profile.optimizer + (t_end - t_opt)
        profile.steps = profile.steps + 1
      end
      if show_progress then
        local rate = seen * world / math.max(clock.now() - t0, 1e-9)
        if on_terminal then
          progress(epoch, cfg.epochs, b, batches, loss_sum / seen, rate)
        elseif b / batches >= next_log then
          print(("epoch %d/%d %3d%% loss %.4f %.0f samples/s"):format(epoch, cfg.epochs,
            math.floor(100 * b / batches), loss_sum / seen, rate))
          next_log = next_log + 0.1
        end
      end
      t_data = now()
    end
    local seconds = clock.now() - t0
    if on_terminal and show_progress then io.write("\n") end
    if dist then loss_sum, correct, seen = unpack(dist.sum_over_ranks { loss_sum, correct, seen }) end
    local test_loss
    test_loss, test_acc = evaluate(model, test_loader, dist, device)
    local lr = opt.param_groups[1].lr
    say(("epoch %d/%d train loss %.4f acc %.4f | test loss %.4f acc %.4f | %.1f s, %.0f samples/s"):format(
      epoch, cfg.epochs, loss_sum / seen, correct / seen, test_loss, test_acc, seconds, seen / seconds))
    if profile and is_main then profile.report(epoch) end
    if is_main then
      metrics:write(("%d,%d,%.6g,%.6f,%.6f,%.6f,%.6f,%.3f,%.1f\n"):format(epoch, step, lr, loss_sum / seen,
        correct / seen, test_loss, test_acc, seconds, seen / seconds))
      metrics:flush()
      train_state.save(cfg.out .. "/checkpoint.safetensors", {
        model = model, optimizer = opt, scheduler = sched, generators = state.generators,
        progress = { epoch = epoch, step = step, test_acc = test_acc },
      })
      train_state.save_model(cfg.out .. "/model.safetensors", model)
    end
    if dist then net:verify_sync() end -- raises naming a tensor whose replicas drifted apart
    if opts.save_all_ranks then
      if dist then dist.barrier() end -- rank 0 made the folder
      train_state.save_model(("%s/model_rank%d.safetensors"):format(cfg.out, rank), model)
    end
  end
  if metrics then metrics:close() end
  loader:close()
  test_loader:close()
  if test_acc then say(("final test accuracy %.4f"):format(test_acc)) end
  if dist then dist.destroy_process_group() end
end

main(arg)
