--- train.lua: train a model from a config (configs/*.lua) on Fashion-MNIST (or MNIST,
-- CIFAR-10), in one process or data-parallel under the launcher.
--
--   ddplua train.lua [options]                     # `--help` lists them
--   ddplua --nproc_per_node=2 train.lua ...        # DDP over 2 processes (gloo, or nccl on GPUs)
--
-- Command-line values override the config (configs/fashion_mnist_cnn.lua by default). The
-- config's batch_size is the GLOBAL batch: each of N ranks takes batch_size / N, and the
-- sampler is a DistributedSampler also in one process (world size 1), so N processes see
-- the global batches of the single-process run (DDP equivalence).
-- Under the launcher (WORLD_SIZE > 1) it joins the process group (env://), wraps the model
-- in DDP, shards the test set with the evaluation sampler (each sample counted once), sums
-- the metrics over ranks, and only rank 0 prints and writes files.
-- Devices (ddplua.utils.device): --device cuda is the default when CUDA is available; under
-- the launcher each process takes cuda:LOCAL_RANK. Batches come from pinned memory and are
-- copied with non_blocking. The model moves before the optimizer is built (Note [module
-- to] in ddplua/nn/module.lua); checkpoints hold host copies, so a run may resume on
-- another device.
-- Writes runs/<name>/metrics.csv (a row per epoch), checkpoint.safetensors (the whole
-- training state: --resume continues to the same weights as an uninterrupted run) and
-- model.safetensors (the model alone). --tensorboard DIR also writes TensorBoard event files
-- (rank 0, ddplua.utils.tensorboard): per step the loss (rank 0's batch), the learning
-- rate, samples/s, the gradient norm and the communication time; per epoch the metrics.
-- A config with task = "text" (configs/shakespeare_char_gpt.lua) trains a language model
-- on token files instead, nanoGPT's loop: ddplua/utils/text_train.lua.
local dl = require "ddplua"
local data = require "ddplua.data"
local clock = require "ddplua.clock"
local train_state = require "ddplua.train_state"
local argparse = require "ddplua.utils.argparse"
local train_config = require "ddplua.utils.train_config"
local device_util = require "ddplua.utils.device"
local Progress = require "ddplua.utils.progress"
local MetricsFile = require "ddplua.utils.metrics_file"
local StepProfiler = require "ddplua.utils.step_profiler"
local profiler = require "ddplua.profiler"
local mixed_precision = require "ddplua.utils.mixed_precision"
local DistributedSampler = require "ddplua.distributed.sampler"
local SummaryWriter = require("ddplua.utils.tensorboard").SummaryWriter
local clip_grad = require "ddplua.optim.clip_grad"

local PROG = "train.lua"
-- The constructor of the model a config names: models/<name>.lua, this script's own code
-- (the library's train_config never requires it; Note [lua layers] in tools/check_layers.lua).
local function find_model(name) return require("models." .. name) end
local parser = argparse.ArgumentParser { prog = PROG, usage = "ddplua train.lua [options]" }
for _, a in ipairs {
  { "--config", "FILE", "config file (default configs/fashion_mnist_cnn.lua)" },
  { "--epochs", "N", "number of epochs", "number" },
  { "--batch-size", "N", "batch size", "number" },
  { "--lr", "X", "learning rate", "number" },
  { "--seed", "N", "seed of the model initialisation and of the data order", "number" },
  { "--out", "DIR", "output folder (default runs/<config name>)" },
  { "--resume", "CKPT", "continue from a checkpoint.safetensors written by an earlier run" },
  { "--subset", "N", "train on the first N training samples only (quick runs, specs)", "number" },
  { "--test-subset", "N", "evaluate on the first N test samples only", "number" },
  { "--stop-after", "N", "stop after epoch N of the planned ones, as if interrupted (the\n"
    .. "schedule still spans all epochs; --resume continues); iteration N for text configs", "number" },
  { "--threads", "N", "threads for the kernels and OpenBLAS", "number" },
  { "--amp", "DTYPE", "mixed precision: bf16 (autocast) or f16 (autocast + GradScaler)" },
  { "--data-root", "DIR", "dataset folder (CIFAR-10 binary batches; Fashion-MNIST has a default)" },
  { "--quiet", nil, "no progress output (the epoch summaries still print)" },
  { "--save-all-ranks", nil, "every rank writes runs/<name>/model_rank<R>.safetensors after each\n"
    .. "epoch (for `ddplua verify`)" },
  { "--profile", nil, "print a per-step time breakdown (data, forward, backward, exposed\n"
    .. "communication, optimizer) after each epoch" },
  { "--tensorboard", "DIR", "write TensorBoard event files into DIR (rank 0): per step train/loss,\n"
    .. "train/lr, train/samples_per_s, train/grad_norm, comm/exposed_seconds (and\n"
    .. "comm/avg_backward_comm_seconds under DDP); per epoch epoch/* (the metrics.csv row)" },
  { "--log-every", "N", "print rank 0's loss every N steps (\"step S loss L\", L to 9 digits)", "number" },
  { "--profile-trace", "DIR", "record steps 3-5 with ddplua.profiler on every rank: Chrome traces\n"
    .. "DIR/rank<R>.5.pt.trace.json (`ddplua trace merge DIR`) and rank 0's key_averages table" },
  { "--device", "D", "cpu, cuda (the current device) or cuda:K; default cuda when CUDA is\n"
    .. "available, else cpu. Under the launcher cuda means cuda:LOCAL_RANK" },
  -- language models (configs with task = "text": ddplua/utils/text_train.lua)
  { "--max-iters", "N", "text: number of iterations (--stop-after N counts iterations there)", "number" },
  { "--eval-interval", "N", "text: evaluate and checkpoint every N iterations", "number" },
  { "--eval-iters", "N", "text: evaluate over N * batch_size fixed windows of each file", "number" },
  { "--gradient-accumulation-steps", "N", "text: micro-steps per iteration (the batch is split)", "number" },
  { "--data-dir", "DIR", "text: folder of train.bin, val.bin and meta.json" },
} do
  parser:add_argument(a[1], { metavar = a[2], help = a[3], type = a[4], action = a[2] and "store" or "store_true" })
end

-- Note [evaluation memory]: the script never collects: the library frees the temporaries a
-- step dropped at the next backward and at each batch the loader hands out (Note [step
-- lifetimes] in ddplua/lib.lua), and the gradients and saved tensors as the backward runs.
-- What is left to the script is the CPU block cache: the test pass starts and ends by
-- emptying it (dl.empty_cache), so the evaluation's blocks come from the training's and go
-- back after; and the short last batch of either phase needs blocks of sizes the cache does
-- not hold, so it also starts with an empty_cache. The test batches are each process's
-- training batch (64 in one process, 32 per rank of 2): a forward of the CNN on 256 samples
-- held ~90 MB of activations, the run's peak RSS (the test metrics are sums over the same
-- samples; only the f32 rounding of each batch's loss sum changes with the grouping).
-- Values are untouched: only when memory returns changes.

--- Sums of (loss, correct, count) over the test samples of every rank; `loader` makes
-- batches of `eval_batch` (the last may be shorter).
local function evaluate(model, loader, dist, device, eval_batch)
  model:eval()
  dl.empty_cache() -- Note [evaluation memory]
  local loss_sum, correct, count = 0, 0, 0
  dl.no_grad(function()
    for x, y in loader:iter() do
      if y:numel() ~= eval_batch then dl.empty_cache() end -- Note [evaluation memory]
      x, y = x:to(device, { non_blocking = true }), y:to(device, { non_blocking = true })
      local logits = model(x)
      loss_sum = loss_sum + dl.cross_entropy(logits, y, { reduction = "sum" }):item()
      correct = correct + logits:argmax(2):eq(y):sum():item()
      count = count + y:numel()
    end
  end)
  dl.empty_cache()
  model:train()
  if dist then loss_sum, correct, count = unpack(dist.sum_over_ranks({ loss_sum, correct, count }, { device = device })) end
  return loss_sum / math.max(count, 1), correct / math.max(count, 1)
end

local METRICS = { { "epoch", "%d" }, { "step", "%d" }, { "lr", "%.6g" }, { "train_loss", "%.6f" },
  { "train_acc", "%.6f" }, { "test_loss", "%.6f" }, { "test_acc", "%.6f" }, { "seconds", "%.3f" },
  { "samples_per_s", "%.1f" } }

local function main(argv)
  io.stdout:setvbuf("line") -- log lines appear as they happen, also through pipes and files
  local opts = parser:parse_args(argv)
  local cfg = train_config.load(opts.config or "configs/fashion_mnist_cnn.lua", opts, PROG)
  if opts.threads then dl.set_num_threads(opts.threads) end
  if cfg.task == "text" then return require("ddplua.utils.text_train").run(cfg, opts, PROG, find_model) end
  local device = device_util.choose(opts.device or cfg.device, { prog = PROG })
  local dist
  if device_util.launcher_local_rank() then
    dist = require "ddplua.distributed"
    dist.init_process_group { backend = device == "cpu" and "gloo" or "nccl" }
  end
  local world, rank = dist and dist.get_world_size() or 1, dist and dist.get_rank() or 0
  local is_main = rank == 0
  local function say(...) if is_main then print(...) end end
  if cfg.batch_size % world ~= 0 then
    error(("%s: the batch size %d (global) does not divide over %d processes"):format(PROG, cfg.batch_size, world), 0)
  end
  local local_batch = math.floor(cfg.batch_size / world)

  dl.manual_seed(cfg.seed) -- the same initial model on every rank (DDP also broadcasts rank 0's)
  -- Random transforms: a stream per rank, reseeded from (seed, epoch, rank) every epoch, so
  -- a resumed run needs no per-rank generator state.
  local data_gen = dl.Generator(0)
  local train_set, test_set = train_config.datasets(cfg, PROG)
  local n_train = math.min(cfg.subset or #train_set, #train_set)
  local n_test = math.min(cfg.test_subset or #test_set, #test_set)
  local sampler = DistributedSampler(n_train, { num_replicas = world, rank = rank, shuffle = true, seed = cfg.seed })
  local pin = device ~= "cpu"
  local loader = data.DataLoader(train_set, { batch_size = local_batch, sampler = sampler, generator = data_gen,
    pin_memory = pin })
  local test_loader = data.DataLoader(test_set, { batch_size = local_batch, pin_memory = pin,
    sampler = DistributedSampler.DistributedEvalSampler(n_test, { num_replicas = world, rank = rank }) })

  local model = train_config.model(cfg, find_model, PROG)
  model:to(device) -- before the optimizer and DDP take its parameters (Note [module to])
  local net = dist and require("ddplua.distributed.ddp")(model) or model
  local opt = train_config.optimizer(cfg, model:parameters(), PROG)
  local sched = train_config.scheduler(cfg, opt, #loader, PROG)
  local generators = { default = dl.default_generator }
  local amp = mixed_precision.new(cfg.amp, device, PROG) -- autocast (+ GradScaler for f16), or nothing

  if is_main then require("ddplua.os").mkdir_p(cfg.out) end
  local start_epoch, step = 1, 0
  if opts.resume then
    local p = train_state.load(opts.resume, { model = model, optimizer = opt, scheduler = sched, generators = generators,
      scaler = amp.scaler })
    start_epoch, step = (p.epoch or 0) + 1, p.step or 0
    say(("resumed from %s after epoch %d (step %d)"):format(opts.resume, p.epoch or 0, step))
  end
  local metrics = is_main and MetricsFile.open(cfg.out .. "/metrics.csv", METRICS,
    { append = start_epoch > 1, resume_after = start_epoch - 1 }) -- Note [metrics rows on resume]

  say(("training %s: %s on %s, %d samples, batch %d (%d per process), %d epochs, %d process(es) x %d thread(s), device %s"):format(
    cfg.name, cfg.model, cfg.dataset or "fashion_mnist", n_train, cfg.batch_size, local_batch, cfg.epochs, world,
    dl.get_num_threads(), device == "cpu" and "cpu" or (device .. (world > 1 and " (cuda:LOCAL_RANK)" or ""))))
  -- TensorBoard (Note [summary writer ranks]: a writer that writes nothing on ranks > 0)
  local tb = opts.tensorboard and SummaryWriter(opts.tensorboard, { rank = rank })
  local log_every = opts.log_every
  if log_every and (log_every < 1 or log_every ~= math.floor(log_every)) then
    error(("%s: --log-every must be a positive integer, got %s"):format(PROG, tostring(log_every)), 0)
  end
  local prof = StepProfiler.new { enabled = opts.profile == true, synchronize = device ~= "cpu" and dl.cuda.synchronize or nil }
  -- --profile-trace: torch.profiler's usual schedule (skip a step, warm up one, record three)
  local tracer = opts.profile_trace and profiler.profile {
    schedule = profiler.schedule { wait = 1, warmup = 1, active = 3, ["repeat"] = 1 },
    on_trace_ready = function(p)
      profiler.tensorboard_trace_handler(opts.profile_trace)(p)
      say(("profile: steps 3-5 of every rank in %s (merge: ddplua trace merge %s)"):format(opts.profile_trace,
        opts.profile_trace))
      say(p:key_averages():table { sort_by = "self_cpu_time_total", row_limit = 15 })
    end,
  }
  if tracer then tracer:start() end
  local test_acc
  model:train()
  for epoch = start_epoch, math.min(cfg.epochs, opts.stop_after or cfg.epochs) do
    sampler:set_epoch(epoch)
    data_gen:manual_seed((cfg.seed * 100003 + epoch) * 1024 + rank)
    local bar = Progress.new { label = ("epoch %d/%d"):format(epoch, cfg.epochs), total = #loader,
      enabled = is_main and not opts.quiet }
    local t0 = clock.now()
    local t_step = t0
    local loss_sum, correct, seen, b = 0, 0, 0, 0
    prof:start()
    for x, y in loader:iter() do
      if y:numel() ~= local_batch then dl.empty_cache() end -- the short last batch: Note [evaluation memory]
      x, y = x:to(device, { non_blocking = true }), y:to(device, { non_blocking = true })
      prof:lap("data")
      opt:zero_grad()
      local logits, loss = amp:run(function() local l = net(x); return l, dl.cross_entropy(l, y) end)
      prof:lap("forward")
      amp:backward(loss)
      prof:lap("backward")
      local lr = opt.param_groups[1].lr -- this step's rate (the scheduler moves it below)
      -- the gradients' total 2-norm (after DDP's all-reduce: every rank's), unscaled under f16
      local grad_norm = tb and tb.enabled and clip_grad.clip_grad_norm_(model:parameters(), math.huge)
        / (amp.scaler and amp.scaler:get_scale() or 1)
      amp:step(opt)
      if sched then sched:step() end
      step, b = step + 1, b + 1
      local loss_value = loss:item()
      loss_sum = loss_sum + loss_value * y:numel()
      correct = correct + logits:argmax(2):eq(y):sum():item()
      seen = seen + y:numel()
      prof:lap("optimizer")
      prof:add("comm", net.exposed_comm_seconds and net:exposed_comm_seconds() or 0)
      prof:step_done()
      local now = clock.now()
      if log_every and step % log_every == 0 then say(("step %d loss %.9g"):format(step, loss_value)) end
      if tb and tb.enabled then
        tb:add_scalar("train/loss", loss_value, step)
        tb:add_scalar("train/lr", lr, step)
        tb:add_scalar("train/samples_per_s", y:numel() * world / math.max(now - t_step, 1e-9), step)
        tb:add_scalar("train/grad_norm", grad_norm, step)
        if dist then
          tb:add_scalar("comm/exposed_seconds", net:exposed_comm_seconds(), step)
          tb:add_scalar("comm/avg_backward_comm_seconds", net:_get_ddp_logging_data().avg_backward_comm_time * 1e-9, step)
        else
          tb:add_scalar("comm/exposed_seconds", 0, step)
        end
      end
      t_step = now
      if tracer then tracer:step() end
      bar:update(b, loss_sum / seen, seen * world / math.max(clock.now() - t0, 1e-9))
      prof:start()
    end
    local seconds = clock.now() - t0
    bar:close()
    if dist then loss_sum, correct, seen = unpack(dist.sum_over_ranks({ loss_sum, correct, seen }, { device = device })) end
    local test_loss
    test_loss, test_acc = evaluate(model, test_loader, dist, device, local_batch)
    local row = { epoch = epoch, step = step, lr = opt.param_groups[1].lr, train_loss = loss_sum / seen,
      train_acc = correct / seen, test_loss = test_loss, test_acc = test_acc, seconds = seconds,
      samples_per_s = seen / seconds }
    say(("epoch %d/%d train loss %.4f acc %.4f | test loss %.4f acc %.4f | %.1f s, %.0f samples/s"):format(
      epoch, cfg.epochs, row.train_loss, row.train_acc, test_loss, test_acc, seconds, row.samples_per_s))
    prof:report("profile epoch " .. epoch, say)
    if tb then
      for _, c in ipairs(METRICS) do
        if c[1] ~= "epoch" and c[1] ~= "step" then tb:add_scalar("epoch/" .. c[1], row[c[1]], step) end
      end
      tb:flush()
    end
    if is_main then
      metrics:write(row)
      train_state.save(cfg.out .. "/checkpoint.safetensors", { model = model, optimizer = opt, scheduler = sched,
        scaler = amp.scaler, generators = generators, progress = { epoch = epoch, step = step, test_acc = test_acc } })
      train_state.save_model(cfg.out .. "/model.safetensors", model)
    end
    if dist then net:verify_sync() end -- raises naming a tensor whose replicas drifted apart
    if opts.save_all_ranks then
      if dist then dist.barrier() end -- rank 0 made the folder
      train_state.save_model(("%s/model_rank%d.safetensors"):format(cfg.out, rank), model)
    end
  end
  if tracer then tracer:stop() end
  if metrics then metrics:close() end
  if tb then tb:close() end
  loader:close()
  test_loader:close()
  if test_acc then say(("final test accuracy %.4f"):format(test_acc)) end
  if dist then dist.destroy_process_group() end
end

main(arg)
