--- bench/zero_optimizer.lua: ZeroRedundancyOptimizer against the plain optimizer under DDP:
-- optimizer-state bytes per rank, and time per training step and per optimizer step.
--   build/ddplua --nproc_per_node=2 --standalone bench/zero_optimizer.lua [--steps 20] [--runs 5]
--     [--models mlp,cnn,resnet] [--optimizer adam|sgd]
-- For each model (models/<name>.lua; resnet = ResNet-20 on 3x32x32), three DDP copies train
-- side by side on the same synthetic batches (64 per rank, random inputs and labels: the
-- question is the optimizer's cost, not accuracy): DDP + the plain optimizer, DDP + ZeRO
-- (one broadcast per parameter), DDP + ZeRO with parameters_as_bucket_view (one broadcast
-- per rank), DDP + ZeRO with partition = "elements" (each param group cut into equal
-- element ranges, one all-gather per group). Timing alternates the four, `steps` steps each, `runs` times; medians of the
-- per-run figures, and of the per-run ratios. State bytes: every tensor of the optimizers'
-- state after the first step (Adam: exp_avg and exp_avg_sq), on each rank.
-- Prints (rank 0) one Markdown table row per model for each of the three tables (the third:
-- partition = "elements" against the plain optimizer and PyTorch's partition).
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local clock = require "ddplua.clock"

local steps, runs, model_list, opt_name = 20, 5, "mlp,cnn,resnet", "adam"
for i = 1, #arg do
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--runs" then runs = tonumber(arg[i + 1]) end
  if arg[i] == "--models" then model_list = arg[i + 1] end
  if arg[i] == "--optimizer" then opt_name = arg[i + 1] end
end
dl.set_num_threads(1)
dist.init_process_group { backend = "gloo" }
local rank, world = dist.get_rank(), dist.get_world_size()
local ZeRO = dist.optim.ZeroRedundancyOptimizer
local cls = opt_name == "sgd" and optim.SGD or optim.Adam
local args = opt_name == "sgd" and { lr = 0.01, momentum = 0.9 } or { lr = 1e-3 }

local INPUT = { mlp = { 1, 28, 28 }, cnn = { 1, 28, 28 }, resnet = { 3, 32, 32 } }

local function make(name)
  dl.manual_seed(0)
  if name == "resnet" then return require("models.resnet")({ num_classes = 10 }) end
  return require("models." .. name)()
end

local function state_bytes(opt)
  local n = 0
  for _, st in opt.state:items() do
    for _, v in st:items() do
      if dl.is_tensor(v) then n = n + v:numel() * (v:type() == "f64" and 8 or 4) end
    end
  end
  return n
end

local function median(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

local state_rows, time_rows, elem_rows = {}, {}, {}
for name in model_list:gmatch("[^,]+") do
  local variants = {}
  for v, kind in ipairs { "plain", "zero", "zero_bucket", "zero_elements" } do
    local model = dist.DistributedDataParallel(make(name))
    local opt
    if kind == "plain" then
      opt = cls(model:parameters(), args)
    else
      local o = { optimizer_class = cls, parameters_as_bucket_view = kind == "zero_bucket",
        partition = kind == "zero_elements" and "elements" or "parameters" }
      for k, x in pairs(args) do o[k] = x end
      opt = ZeRO(model:parameters(), o)
    end
    variants[v] = { kind = kind, model = model, opt = opt, step_s = {}, opt_s = {} }
  end
  local shape = { 64 }
  for _, d in ipairs(INPUT[name]) do shape[#shape + 1] = d end
  dl.manual_seed(10 + rank)
  local xs, ys = {}, {}
  for s = 1, 4 do xs[s], ys[s] = dl.randn(shape), dl.randint(0, 10, { 64 }) end
  local crit = nn.CrossEntropyLoss()
  local function train(v, k)
    local opt_time = 0
    for s = 1, k do
      v.opt:zero_grad()
      crit(v.model(xs[(s - 1) % 4 + 1]), ys[(s - 1) % 4 + 1]):backward()
      local t0 = clock.now()
      v.opt:step()
      opt_time = opt_time + clock.now() - t0
    end
    return opt_time
  end
  for _, v in ipairs(variants) do train(v, 2) end -- warm-up; the state exists from here
  local bytes = {}
  for i, v in ipairs(variants) do
    local local_opt = v.kind == "plain" and v.opt or v.opt.optim
    local got = {}
    dist.all_gather_object(got, state_bytes(local_opt))
    bytes[i] = got
  end
  for _ = 1, runs do
    for _, v in ipairs(variants) do
      dist.barrier()
      local t0 = clock.now()
      local opt_time = train(v, steps)
      v.step_s[#v.step_s + 1] = (clock.now() - t0) / steps
      v.opt_s[#v.opt_s + 1] = opt_time / steps
    end
  end
  if rank == 0 then
    local function largest(i)
      local m = 0
      for r = 1, world do m = math.max(m, bytes[i][r]) end
      return m
    end
    local function shares(i)
      local t = {}
      for r = 1, world do t[r] = ("%.2f MiB"):format(bytes[i][r] / 2 ^ 20) end
      return table.concat(t, " / ")
    end
    local plain = bytes[1][1]
    local per_rank = {}
    for r = 1, world do per_rank[r] = ("%.2f MiB"):format(bytes[2][r] / 2 ^ 20) end
    local max_zero = 0
    for r = 1, world do max_zero = math.max(max_zero, bytes[2][r]) end
    state_rows[#state_rows + 1] = ("| %s | %.2f MiB | %s | %.3f | %.3f |"):format(name, plain / 2 ^ 20,
      table.concat(per_rank, " / "), max_zero / plain, (function()
        local m = math.huge
        for r = 1, world do m = math.min(m, bytes[2][r]) end
        return m / plain
      end)())
    local function ratio(a, b, field)
      local rs = {}
      for i = 1, #a[field] do rs[i] = a[field][i] / b[field][i] end
      return median(rs)
    end
    local p, z, zb = variants[1], variants[2], variants[3]
    time_rows[#time_rows + 1] = ("| %s | %.2f | %.2f | %.2f | %.2f× | %.2f× | %.2f | %.2f | %.2f | %.2f× | %.2f× |"):format(
      name, median(p.step_s) * 1e3, median(z.step_s) * 1e3, median(zb.step_s) * 1e3,
      ratio(z, p, "step_s"), ratio(zb, p, "step_s"),
      median(p.opt_s) * 1e3, median(z.opt_s) * 1e3, median(zb.opt_s) * 1e3,
      ratio(z, p, "opt_s"), ratio(zb, p, "opt_s"))
    local ze = variants[4]
    elem_rows[#elem_rows + 1] = ("| %s | %s | %.3f | %.3f | %.2f | %.2f | %.2f× | %.2f× | %.2f | %.2f | %.2f× |"):format(
      name, shares(4), largest(4) / plain, largest(2) / plain,
      median(p.step_s) * 1e3, median(ze.step_s) * 1e3, ratio(ze, p, "step_s"), ratio(ze, zb, "step_s"),
      median(p.opt_s) * 1e3, median(ze.opt_s) * 1e3, ratio(ze, p, "opt_s"))
  end
  -- The parameters of each copy must still agree across ranks (ZeRO keeps the replicas in
  -- sync; BatchNorm's running stats differ per rank, as without ZeRO, so only parameters).
  for _, v in ipairs(variants) do
    local sums = {}
    for i, p in ipairs(v.model:parameters()) do sums[i] = ("%.17g"):format(p:double():sum():item()) end
    local got = {}
    dist.all_gather_object(got, table.concat(sums, ","))
    for r = 2, world do
      if got[r] ~= got[1] then error(("%s/%s: the ranks' parameters differ"):format(name, v.kind)) end
    end
  end
end

if rank == 0 then
  print(("optimizer %s, %d ranks, %d steps x %d runs"):format(opt_name, world, steps, runs))
  print("| model | plain state per rank | ZeRO state, rank 0 / rank 1 | largest / plain | smallest / plain |")
  print("|---|---|---|---|---|")
  for _, r in ipairs(state_rows) do print(r) end
  print()
  print("| model | step ms plain | step ms ZeRO | step ms ZeRO bucket | ZeRO / plain | bucket / plain | opt.step ms plain | ZeRO | ZeRO bucket | ZeRO / plain | bucket / plain |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for _, r in ipairs(time_rows) do print(r) end
  print()
  print('partition = "elements":')
  print("| model | state, rank 0 / rank 1 | largest / plain | by parameters: largest / plain | step ms plain | step ms elements | elements / plain | elements / bucket | opt.step ms plain | elements | elements / plain |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for _, r in ipairs(elem_rows) do print(r) end
end
dist.destroy_process_group()
