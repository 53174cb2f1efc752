--- bench/gpu_train.lua: training throughput (samples/s) of one model on one GPU, ddplua's
-- side of the comparison with PyTorch eager (bench/gpu_train_torch.py does the same there;
-- bench/run_gpu.sh alternates the two and takes medians).
--
--   build/ddplua bench/gpu_train.lua --model cnn|resnet20 [--batch N] [--steps 50]
--       [--warmup 10] [--device cuda:0] [--tf32] [--max-seconds 60] [--threads N]
--   build/ddplua bench/gpu_train.lua --dry      # 1 tiny step on the CPU: proves the script runs
--
-- Models: cnn = configs/fashion_mnist_cnn.lua's model (models/cnn.lua), input (N, 1, 28, 28),
-- batch 256 by default, SGD lr 0.05 momentum 0.9; resnet20 = configs/cifar10_resnet20.lua's
-- (models/resnet.lua, depth 20), input (N, 3, 32, 32), batch 128, SGD lr 0.1 momentum 0.9
-- weight decay 1e-4. Data: 4 batches of random normal images and random labels made on the
-- device before timing and used in turn (the data pipeline is not measured).
-- One step = zero_grad, forward, cross_entropy, backward, optimizer step. The warm-up steps
-- are not timed; the timed steps are bracketed by device synchronisations and read with a
-- host clock. TF32 is off unless --tf32 (then f32 matmuls and convolutions may use it).
-- --max-seconds stops the timed loop early (at least 3 steps) so a slow build cannot eat
-- the device lease; the line says how many steps were timed. --threads sets the CPU threads
-- (dl.set_num_threads; default: DDP_NUM_THREADS, else the cores), which is what the CPU rows
-- of bench/reference_table.sh (--device cpu) measure.
--
-- Prints one line:
--   framework=ddplua model=cnn batch=256 device=cuda:0 tf32=0 steps=50 samples_per_s=...
--   step_ms=... peak_mem_mb=... loss=...
-- Exits non-zero with a message naming what is missing when the device or an op is not
-- available.
local G = require "bench.gpu_common"
local dl = require "ddplua"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"

local ok_args, opts = pcall(G.parse_args, arg or {}, {
  model = "cnn", steps = 50, warmup = 10, device = "cuda:0", max_seconds = 60,
})
if not ok_args then
  io.stderr:write("gpu_train: " .. tostring(opts) .. "\n")
  os.exit(2)
end

local MODELS = {
  cnn = {
    config = "configs/fashion_mnist_cnn.lua", batch = 256, input = { 1, 28, 28 },
    build = function(cfg) return require("models." .. cfg.model)() end,
  },
  resnet20 = {
    config = "configs/cifar10_resnet20.lua", batch = 128, input = { 3, 32, 32 },
    build = function(cfg) return require("models." .. cfg.model)(cfg.model_opts) end,
  },
}
local spec = MODELS[opts.model]
if not spec then
  io.stderr:write(("gpu_train: unknown model '%s' (cnn, resnet20)\n"):format(tostring(opts.model)))
  os.exit(2)
end
if opts.threads ~= nil then
  if type(opts.threads) ~= "number" or opts.threads < 1 or opts.threads % 1 ~= 0 then
    io.stderr:write(("gpu_train: --threads must be a positive integer, got %s\n"):format(tostring(opts.threads)))
    os.exit(2)
  end
  dl.set_num_threads(opts.threads)
end
local cfg = dofile(spec.config)
local batch = opts.batch or spec.batch
local dev = opts.device
if opts.dry then
  dev, batch, opts.steps, opts.warmup = "cpu", 4, 1, 1
end

local function fail(msg)
  io.stderr:write("gpu_train: " .. msg .. "\n")
  os.exit(1)
end

if dev ~= "cpu" then
  local ok, why = G.cuda_available()
  if not ok then fail("no CUDA device: " .. tostring(why)) end
  if G.backend_name() == "cuda-sim" and not opts.allow_sim then
    fail("the CUDA plug-in is the simulated device (cuda-sim): no GPU timing to take (--allow-sim runs anyway)")
  end
  G.set_tf32(opts.tf32 == true)
end

local ok, err = pcall(function()
  dl.manual_seed(cfg.seed or 0)
  local model = spec.build(cfg)
  if dev ~= "cpu" then G.module_to(model, dev) end
  model:train()
  local o = cfg.optimizer
  local opt = optim.SGD(model:parameters(), { lr = o.lr, momentum = o.momentum or 0,
    weight_decay = o.weight_decay or 0 })

  local gen = dl.Generator(1)
  local xs, ys = {}, {}
  local shape = { batch, spec.input[1], spec.input[2], spec.input[3] }
  for i = 1, 4 do
    xs[i] = G.to(dl.randn(shape, { generator = gen }), dev)
    ys[i] = G.to(dl.randint(0, 10, { batch }, { generator = gen }), dev)
  end

  local loss
  local function step(i)
    local k = (i - 1) % 4 + 1
    opt:zero_grad()
    loss = dl.cross_entropy(model(xs[k]), ys[k])
    loss:backward()
    opt:step()
    G.collect_device_garbage(dev)
  end

  for i = 1, opts.warmup do step(i) end
  G.synchronize(dev)
  local t0 = clock.now()
  local done = 0
  for i = 1, opts.steps do
    step(i)
    done = i
    if done >= 3 and clock.now() - t0 > opts.max_seconds then break end
  end
  G.synchronize(dev)
  local seconds = clock.now() - t0
  local l = loss:item()
  if l ~= l then error("the loss is NaN after the timed steps") end
  print(("framework=ddplua model=%s batch=%d device=%s tf32=%d steps=%d samples_per_s=%.1f step_ms=%.3f "
    .. "peak_mem_mb=%.1f loss=%.4f"):format(opts.model, batch, dev, opts.tf32 and 1 or 0, done,
    done * batch / seconds, seconds / done * 1e3, G.max_memory_allocated(dev) / 2 ^ 20, l))
end)
if not ok then fail(tostring(err)) end
