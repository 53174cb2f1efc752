--- ddplua.utils.text_train: train.lua's loop for language models (configs with
-- `task = "text"`, e.g. configs/shakespeare_char_gpt.lua): nanoGPT's train.py on token
-- files, in one process or data-parallel under the launcher.
--
--   require("ddplua.utils.text_train").run(cfg, opts, "train.lua")
--
-- cfg (train_config.load's table; defaults as nanoGPT's shakespeare_char where it has one):
--   data_dir       folder of train.bin / val.bin / meta.json (ddplua.data.text.prepare); when
--                  train.bin is absent and dataset = "shakespeare_char", rank 0 writes them
--                  from the corpus `make data` fetched
--   model          a module under models/ (gpt), built with model_opts plus vocab_size (from
--                  meta.json) and block_size
--   block_size     context length T
--   batch_size     the GLOBAL batch of one iteration, in sequences: each of N ranks takes
--                  batch_size / (N * gradient_accumulation_steps) per micro-step
--   gradient_accumulation_steps (1): micro-steps per iteration (DDP synchronises on the last)
--   max_iters, eval_interval (250), eval_iters (20: eval over eval_iters * batch_size fixed
--                  windows of each file, text.evaluate), grad_clip (1.0; 0 = none)
--   optimizer      {lr, betas, weight_decay}: AdamW in the model's configure_optimizers groups
--   schedule       {warmup_iters, lr_decay_iters, min_lr}: optim.WarmupCosineLR (nil: constant)
--   amp            nil or "bf16" (autocast; "f16" adds a GradScaler), seed (1337)
--
-- Iterations as nanoGPT's loop: at iteration it (0 .. max_iters) the lr is get_lr(it); every
-- eval_interval iterations and at max_iters it evaluates both files and (rank 0) writes
-- out/checkpoint.safetensors (the whole state: --resume continues to the same weights as an
-- uninterrupted run), out/model.safetensors (the model alone, nanoGPT's names, Note [gpt
-- weight tying] in models/gpt.lua), out/model_config.json and out/meta.json (what `ddplua
-- sample` needs), and a row of out/metrics.csv; then it takes the step (none at max_iters).
-- opts.stop_after N stops after the evaluation at iteration N, as if interrupted. The loop
-- runs on the CPU (Gloo between the ranks); train.lua's --device is not read here.
--
-- Note [text resume windows]: each rank's training windows come from its own Philox stream
-- (text.RandomWindows); every rank draws local_batch windows per micro-step, so after `it`
-- iterations every stream has moved by it * accumulation * local_batch windows. The
-- checkpoint (written by rank 0 alone) stores that count, and a resumed rank puts its own
-- stream at its start plus the count: no per-rank state has to be saved.
local dl = require "ddplua.functions"
local clock = require "ddplua.clock"
local checkpoint = require "ddplua.checkpoint"
local optim = require "ddplua.optim"
local text = require "ddplua.data.text"
local train_state = require "ddplua.train_state"
local train_config = require "ddplua.utils.train_config"
local MetricsFile = require "ddplua.utils.metrics_file"
local mixed_precision = require "ddplua.utils.mixed_precision"
local RandomWindows = require "ddplua.data.text.random_windows"

local M = {}

local METRICS = { { "iter", "%d" }, { "lr", "%.6g" }, { "train_loss", "%.6f" }, { "val_loss", "%.6f" },
  { "seconds", "%.3f" }, { "tokens_per_s", "%.1f" } }

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Write train.bin / val.bin / meta.json into cfg.data_dir when missing (rank 0), then wait.
local function ensure_data(cfg, dist, rank, prog)
  if rank == 0 and not file_exists(cfg.data_dir .. "/train.bin") then
    if cfg.dataset ~= "shakespeare_char" then
      error(("%s: %s/train.bin is missing (write it with `ddplua prepare --out %s FILE...`)"):format(prog,
        cfg.data_dir, cfg.data_dir), 0)
    end
    local files, why = text.shakespeare_files()
    if not files then error(prog .. ": no Shakespeare corpus (" .. tostring(why) .. "); run `make data`", 0) end
    local info = text.prepare { input = files, out_dir = cfg.data_dir }
    print(("%s: wrote %s (%d train, %d val tokens)"):format(prog, cfg.data_dir, info.train_tokens, info.val_tokens))
  end
  if dist then dist.barrier() end
end

local function write_file(path, s)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "wb"))
  f:write(s)
  f:close()
  assert(os.rename(tmp, path))
end

--- text_train.run(cfg, opts, prog, find_model): the training job (see the top). opts:
-- train.lua's parsed flags (resume, stop_after, quiet, threads, device are read here);
-- find_model(name) -> the model constructor of models/<name> (the caller's lookup:
-- train_config.model's contract). Raises (error(msg, 0))
-- on a batch that does not divide over the ranks and micro-steps, or missing data.
function M.run(cfg, opts, prog, find_model)
  prog = prog or "train.lua"
  local dist
  if require("ddplua.utils.device").launcher_local_rank() then -- under the launcher with WORLD_SIZE > 1
    dist = require "ddplua.distributed"
    dist.init_process_group { backend = "gloo" }
  end
  local world, rank = dist and dist.get_world_size() or 1, dist and dist.get_rank() or 0
  local is_main = rank == 0
  local function say(...) if is_main then print(...) end end
  local accum = cfg.gradient_accumulation_steps or 1
  for _, k in ipairs { "block_size", "batch_size", "max_iters" } do
    local v = cfg[k]
    if type(v) ~= "number" or v < (k == "max_iters" and 0 or 1) or v % 1 ~= 0 then
      error(("%s: the config's %s must be a %s integer, got %s"):format(prog, k, k == "max_iters" and "non-negative"
        or "positive", tostring(v)), 0)
    end
  end
  if cfg.batch_size % (world * accum) ~= 0 then
    error(("%s: the batch size %d (global) does not divide over %d processes x %d accumulation steps"):format(prog,
      cfg.batch_size, world, accum), 0)
  end
  local B, T = cfg.batch_size / (world * accum), cfg.block_size
  local max_iters, eval_interval = cfg.max_iters, cfg.eval_interval or 250
  local eval_windows = (cfg.eval_iters or 20) * cfg.batch_size
  local grad_clip = cfg.grad_clip == nil and 1.0 or cfg.grad_clip

  ensure_data(cfg, dist, rank, prog)
  local tok = text.load_tokenizer(cfg.data_dir)
  local V = tok.vocab_size
  local train_file = text.TokenFile(cfg.data_dir .. "/train.bin", { vocab_size = V })
  local val_file = text.TokenFile(cfg.data_dir .. "/val.bin", { vocab_size = V })

  dl.manual_seed(cfg.seed) -- the same initial model on every rank
  local model_cfg = {}
  for k, v in pairs(cfg.model_opts or {}) do model_cfg[k] = v end
  model_cfg.vocab_size, model_cfg.block_size = V, T
  local model = train_config.model({ model = cfg.model, model_opts = model_cfg }, find_model, prog)
  local net = dist and require("ddplua.distributed.ddp")(model) or model
  local o = cfg.optimizer
  local opt = model:configure_optimizers(o.weight_decay or 0.1, o.lr, o.betas or { 0.9, 0.99 })
  local sched = cfg.schedule and optim.WarmupCosineLR(opt, { warmup_iters = cfg.schedule.warmup_iters,
    lr_decay_iters = cfg.schedule.lr_decay_iters or max_iters, min_lr = cfg.schedule.min_lr }) or nil
  local amp = mixed_precision.new(cfg.amp, "cpu", prog)
  local batches = RandomWindows(train_file, { block_size = T, batch_size = B, seed = cfg.seed })

  if is_main then require("ddplua.os").mkdir_p(cfg.out) end
  local start = 0
  if opts.resume then
    local p = train_state.load(opts.resume, { model = model, optimizer = opt, scheduler = sched,
      generators = { default = dl.default_generator }, scaler = amp.scaler })
    start = p.iter
    batches.generator:set_state { seed = cfg.seed, -- Note [text resume windows]
      offset = rank * RandomWindows.RANK_STRIDE + p.windows_drawn }
    say(("resumed from %s at iteration %d"):format(opts.resume, start))
  end
  local metrics = is_main and MetricsFile.open(cfg.out .. "/metrics.csv", METRICS,
    { append = start > 0, resume_after = start })

  local function loss_fn(x, y)
    local _, loss = amp:run(function() return model(x, y) end)
    return loss
  end
  local function estimate(file)
    return (text.evaluate(loss_fn, file, { block_size = T, batch_size = B * accum, max_windows = eval_windows }))
  end

  say(("training %s: %s (%d parameters) on %s, %d train tokens, batch %d x %d tokens (%d per process%s), %d iterations, %d process(es) x %d thread(s)%s"):format(
    cfg.name, cfg.model, model:get_num_params(), cfg.data_dir, #train_file, cfg.batch_size, T, B,
    accum > 1 and (" x " .. accum .. " micro-steps") or "", max_iters, world, dl.get_num_threads(),
    cfg.amp and (", amp " .. cfg.amp) or ""))
  local t0, t_last, tokens_since = clock.now(), clock.now(), 0
  local stop = math.min(max_iters, opts.stop_after or max_iters)
  model:train()
  for it = start, stop do
    local resumed_here = opts.resume and it == start -- evaluated and saved before the interruption
    if not resumed_here and (it % eval_interval == 0 or it == max_iters or it == stop) then
      model:eval()
      collectgarbage()
      local train_loss, val_loss = estimate(train_file), estimate(val_file)
      model:train()
      local now = clock.now()
      local row = { iter = it, lr = opt.param_groups[1].lr, train_loss = train_loss, val_loss = val_loss,
        seconds = now - t0, tokens_per_s = tokens_since / math.max(now - t_last, 1e-9) }
      say(("step %d: train loss %.4f, val loss %.4f (lr %.3g, %.1f s, %.0f tokens/s)"):format(it, train_loss,
        val_loss, row.lr, row.seconds, row.tokens_per_s))
      if is_main then
        metrics:write(row)
        train_state.save(cfg.out .. "/checkpoint.safetensors", { model = model, optimizer = opt, scheduler = sched,
          scaler = amp.scaler, generators = { default = dl.default_generator },
          progress = { iter = it, windows_drawn = it * accum * B, val_loss = val_loss } })
        train_state.save_model(cfg.out .. "/model.safetensors", model)
        write_file(cfg.out .. "/model_config.json", checkpoint.json_encode(model_cfg))
        tok:save(cfg.out .. "/meta.json")
      end
      t_last, tokens_since = clock.now(), 0
    end
    if it == stop then break end
    opt:zero_grad()
    for micro = 1, accum do
      local x, y = batches:next()
      local function fwd_bwd()
        local _, loss = amp:run(function() return net(x, y) end)
        amp:backward(accum > 1 and loss / accum or loss)
      end
      if dist and micro < accum then net:no_sync(fwd_bwd) else fwd_bwd() end
    end
    if grad_clip > 0 then
      if amp.scaler then amp.scaler:unscale_(opt) end
      optim.clip_grad_norm_(model:parameters(), grad_clip)
    end
    amp:step(opt)
    if sched then sched:step() end
    tokens_since = tokens_since + cfg.batch_size * T
  end
  if metrics then metrics:close() end
  say(("done in %.1f s"):format(clock.now() - t0))
  if dist then dist.destroy_process_group() end
end

return M
