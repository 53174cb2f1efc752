--- bench/fsdp.lua: step time and memory of FSDP (fully_shard per block + root) against DDP
-- on the GPT (models/gpt.lua), and FSDP with its all-gather prefetch on and off (the
-- all-gather / compute overlap). Run under the launcher (bench/fsdp.sh runs every mode):
--   build/ddplua --nproc_per_node=2 --standalone bench/fsdp.lua --mode fsdp \
--     [--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 8 --steps 20 --warmup 5]
-- --mode: ddp (DistributedDataParallel), ddp-tp and fsdp-tp (DDP / FSDP over dp of a (dp, 2)
-- mesh whose tp pairs cut the GPT by GPT.tp_plan; tokens_per_s counts the dp groups' batches),
-- fsdp (prefetch on, the default), fsdp-noprefetch
-- (set_prefetch(false)), fsdp-keep (reshard_after_forward = false), fsdp-ab (prefetch on in
-- odd timed steps and off in even ones, in one process: a paired comparison that load from
-- other jobs moves alike; prints "fsdp mode=fsdp-ab on_ms=.. off_ms=.. on_wait_ms=..
-- off_wait_ms=..", medians of each half). A step: uniform random
-- tokens (batch-size windows per rank, the same on every run), forward with the loss,
-- backward, AdamW (lr 1e-3). One line from rank 0: "fsdp mode=.. step_ms=<median> min_ms=..
-- max_ms=.. state_bytes=.. peak_bytes=..": state_bytes = the allocator's live bytes held
-- after a step (parameters, gradients, AdamW state, DDP's buckets) above those before the
-- model was built; peak_bytes = the highest live bytes during the timed steps above the same
-- base (activations and gathered parameters included); allgather_wait_ms = the milliseconds
-- per step rank 0 spent blocked waiting for all-gathers (the all-gather time computation
-- did not hide: what prefetching removes).
local dl = require "ddplua"
local clock = require "ddplua.clock"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local GPT = require "models.gpt"

local o = { n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch_size = 8, steps = 20, warmup = 5 }
local mode = "fsdp"
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--mode" then mode, i = arg[i + 1], i + 2
  else
    local key = a:match("^%-%-([%w-]+)$")
    key = key and key:gsub("-", "_")
    if not key or o[key] == nil then error("bench/fsdp.lua: unknown option " .. a, 0) end
    o[key] = tonumber(arg[i + 1]) or error("bench/fsdp.lua: " .. a .. " needs a number", 0)
    i = i + 2
  end
end
local MODES = { ddp = true, fsdp = true, ["fsdp-noprefetch"] = true, ["fsdp-keep"] = true, ["fsdp-ab"] = true,
  ["ddp-tp"] = true, ["fsdp-tp"] = true }
if not MODES[mode] then
  error("bench/fsdp.lua: --mode must be ddp, fsdp, fsdp-noprefetch, fsdp-keep, fsdp-ab, ddp-tp or fsdp-tp", 0)
end
-- ddp-tp / fsdp-tp: a (dp, tp) mesh with tp = 2 (an even world size): the GPT cut by
-- GPT.tp_plan over tp, then DDP / FSDP (per block + root) over dp; each dp group its batch.
local TP = (mode == "ddp-tp" or mode == "fsdp-tp") and 2 or 1

dl.set_num_threads(1)
dist.init_process_group { backend = "gloo" }
local rank = dist.get_rank()
local V = 65

-- live bytes of what the script still reaches (dl.empty_cache collects first)
local function live() dl.empty_cache(); return dl.memory_stats().live end
local base = live()

dl.manual_seed(1)
local model = GPT { n_layer = o.n_layer, n_head = o.n_head, n_embd = o.n_embd, block_size = o.block_size,
  vocab_size = V, dropout = 0.0, bias = false }
local net = model
local dp_rank, dp_size = rank, dist.get_world_size()
if TP > 1 then
  local tp = require "ddplua.distributed.tensor.parallel"
  local mesh = dist.init_device_mesh("cpu", { dist.get_world_size() / TP, TP }, { mesh_dim_names = { "dp", "tp" } })
  dp_rank, dp_size = mesh:get_coordinate()[1], mesh:size("dp")
  tp.parallelize_module(model, mesh["tp"], GPT.tp_plan({ n_head = o.n_head }, TP))
  if mode == "ddp-tp" then
    net = dist.DistributedDataParallel(model, { device_mesh = mesh["dp"] })
  else
    for _, b in ipairs(model.transformer.h:list()) do dist.fsdp.fully_shard(b, { mesh = mesh["dp"] }) end
    dist.fsdp.fully_shard(model, { mesh = mesh["dp"] })
  end
elseif mode == "ddp" then
  net = dist.DistributedDataParallel(model)
else
  local fsdp = dist.fsdp
  local opts = { reshard_after_forward = mode ~= "fsdp-keep" }
  for _, b in ipairs(model.transformer.h:list()) do fsdp.fully_shard(b, opts) end
  fsdp.fully_shard(model, opts)
  if mode == "fsdp-noprefetch" then model:set_prefetch(false) end
end
local opt = optim.AdamW(net:parameters(), { lr = 1e-3 })

dl.manual_seed(100 + dp_rank)
local xs, ys = {}, {}
for s = 1, 4 do
  xs[s] = dl.randint(0, V, { o.batch_size, o.block_size })
  ys[s] = dl.randint(0, V, { o.batch_size, o.block_size })
end

local function step(s)
  opt:zero_grad()
  local _, loss = net(xs[(s - 1) % 4 + 1], ys[(s - 1) % 4 + 1])
  loss:backward()
  opt:step()
end

-- seconds blocked on all-gathers so far, over every FSDP group (rank 0's)
local function waited()
  local w = 0
  for _, m in ipairs(model:modules()) do
    if dist.fsdp.is_fsdp_module(m) then w = w + m:_get_fsdp_state().group.all_gather_wait_s end
  end
  return w
end

local function median(list)
  table.sort(list)
  return list[math.floor((#list + 1) / 2)]
end

for s = 1, o.warmup do step(s) end
if mode == "fsdp-ab" then
  local ms, wait = { on = {}, off = {} }, { on = {}, off = {} }
  for s = 1, 2 * o.steps do
    local key = s % 2 == 1 and "on" or "off"
    model:set_prefetch(key == "on")
    dist.barrier()
    local w0, t0 = waited(), clock.now()
    step(s)
    ms[key][#ms[key] + 1] = (clock.now() - t0) * 1e3
    wait[key][#wait[key] + 1] = (waited() - w0) * 1e3
  end
  if rank == 0 then
    print(("fsdp mode=fsdp-ab procs=%d layers=%d embd=%d block=%d batch=%d on_ms=%.2f off_ms=%.2f on_wait_ms=%.2f off_wait_ms=%.2f")
      :format(dist.get_world_size(), o.n_layer, o.n_embd, o.block_size, o.batch_size, median(ms.on), median(ms.off),
        median(wait.on), median(wait.off)))
  end
  dist.destroy_process_group()
  return
end
local state_bytes = live() - base
dl.reset_peak_memory()
local times = {}
for s = 1, o.steps do
  dist.barrier()
  local t0 = clock.now()
  step(s)
  times[s] = (clock.now() - t0) * 1e3
end
local peak = dl.memory_stats().peak - base
-- the all-gather time no computation hid: seconds blocked in the groups' waits, per step
local wait_ms = mode:match("^fsdp") and waited() * 1e3 / (o.warmup + o.steps) or 0
table.sort(times)
if rank == 0 then
  local med = times[math.floor((#times + 1) / 2)]
  print(("fsdp mode=%s procs=%d layers=%d embd=%d block=%d batch=%d step_ms=%.2f min_ms=%.2f max_ms=%.2f state_bytes=%d peak_bytes=%d allgather_wait_ms=%.2f tokens_per_s=%.0f")
    :format(mode, dist.get_world_size(), o.n_layer, o.n_embd, o.block_size, o.batch_size,
      med, times[1], times[#times], state_bytes, peak, wait_ms, dp_size * o.batch_size * o.block_size / (med / 1e3)))
end
dist.destroy_process_group()
