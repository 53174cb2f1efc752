--- bench/gpt.lua: training throughput of nanoGPT's GPT (models/gpt.lua) on Shakespeare
-- characters, for the side-by-side comparison with PyTorch (bench/gpt_torch.py does the same
-- there).
--   build/ddplua bench/gpt.lua --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 \
--     --steps 100 --warmup 20 --threads 2 [--amp bf16] [--profile]
--   build/ddplua --nproc_per_node=2 bench/gpt.lua ... --threads 1          # DDP
-- One training step as train.lua's text loop takes it: a batch of --batch-size random windows
-- PER PROCESS (text.RandomWindows; the token files of data/shakespeare_char, written from the
-- corpus of `make data` when missing, or uniform random tokens over 65 characters when the
-- corpus is absent too; over --vocab-size tokens when that is given, e.g. GPT-2's 50257 for
-- llm.c's shape), forward with the loss, backward (DDP's all-reduce under the
-- launcher), clip_grad_norm_ 1.0, AdamW (nanoGPT's groups, lr 1e-3). No dropout, no bias
-- (the shakespeare_char config's). --amp bf16 runs the forward under autocast.
-- Prints one line (rank 0): "gpt layers=.. heads=.. embd=.. block=.. batch=.. procs=..
-- threads=.. amp=.. tokens_per_s=.. step_ms=.."; tokens/s counts every rank's tokens over
-- the timed steps (after --warmup untimed ones); cpu_tokens_per_s divides them by the CPU
-- seconds of rank 0's process (all its threads, os.clock) times the number of processes:
-- the work per token, which other jobs on a shared machine barely move. --profile adds a line with the mean
-- milliseconds of forward, backward (with the exposed all-reduce) and optimizer (clip + step).
local dl = require "ddplua"
local clock = require "ddplua.clock"
local optim = require "ddplua.optim"
local text = require "ddplua.data.text"
local GPT = require "models.gpt"

local o = { n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch_size = 12, steps = 100, warmup = 20,
  threads = 1, vocab_size = 0 }
local amp_mode, profile = nil, false
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--amp" then amp_mode, i = arg[i + 1], i + 2
  elseif a == "--profile" then profile, i = true, i + 1
  else
    local key = a:match("^%-%-([%w-]+)$")
    key = key and key:gsub("-", "_")
    if not key or o[key] == nil then error("bench/gpt.lua: unknown option " .. a, 0) end
    o[key] = tonumber(arg[i + 1]) or error("bench/gpt.lua: " .. a .. " needs a number", 0)
    i = i + 2
  end
end
dl.set_num_threads(o.threads)

local world, dist = tonumber(os.getenv("WORLD_SIZE") or "1"), nil
if world > 1 then
  dist = require "ddplua.distributed"
  dist.init_process_group { backend = "gloo" }
end
local rank = dist and dist.get_rank() or 0

-- the training tokens: Shakespeare characters, or random ones without the corpus
local DATA = "data/shakespeare_char"
local V, batches = 65, nil
local have = o.vocab_size == 0 and io.open(DATA .. "/train.bin", "rb")
if have then have:close() end
if o.vocab_size > 0 then V = o.vocab_size end
if o.vocab_size == 0 and not have and rank == 0 and text.shakespeare_files() then
  text.prepare { input = text.shakespeare_files(), out_dir = DATA }
  have = true
end
if dist then dist.barrier() end
have = o.vocab_size == 0 and io.open(DATA .. "/train.bin", "rb")
if have then
  have:close()
  V = text.load_tokenizer(DATA).vocab_size
  local tf = text.TokenFile(DATA .. "/train.bin", { vocab_size = V })
  batches = text.RandomWindows(tf, { block_size = o.block_size, batch_size = o.batch_size, seed = 1337 })
end
local gen = dl.Generator(1337 + rank)
local function next_batch()
  if batches then return batches:next() end
  local t = (dl.rand({ o.batch_size, o.block_size + 1 }, { generator = gen }) * V):to("i64")
  return t:narrow(2, 1, o.block_size):contiguous(), t:narrow(2, 2, o.block_size):contiguous()
end

dl.manual_seed(1337)
local model = GPT { n_layer = o.n_layer, n_head = o.n_head, n_embd = o.n_embd, block_size = o.block_size,
  vocab_size = V, dropout = 0.0, bias = false }
local net = dist and dist.DistributedDataParallel(model) or model
local opt = model:configure_optimizers(0.1, 1e-3, { 0.9, 0.99 })
local amp = require("ddplua.utils.mixed_precision").new(amp_mode, "cpu", "bench/gpt.lua")
local params = model:parameters()

local t_fwd, t_bwd, t_opt = 0, 0, 0
local t0, cpu0
for step = 1, o.warmup + o.steps do
  if step == o.warmup + 1 then
    t0, cpu0, t_fwd, t_bwd, t_opt = clock.now(), os.clock(), 0, 0, 0
  end
  local x, y = next_batch()
  local a = clock.now()
  opt:zero_grad()
  local _, loss = amp:run(function() return net(x, y) end)
  local b = clock.now()
  amp:backward(loss)
  local c = clock.now()
  optim.clip_grad_norm_(params, 1.0)
  amp:step(opt)
  local d = clock.now()
  t_fwd, t_bwd, t_opt = t_fwd + (b - a), t_bwd + (c - b), t_opt + (d - c)
end
local seconds, cpu_seconds = clock.now() - t0, os.clock() - cpu0
local tokens = o.steps * o.batch_size * o.block_size * world
if rank == 0 then
  print(("gpt layers=%d heads=%d embd=%d block=%d batch=%d procs=%d threads=%d amp=%s tokens_per_s=%.1f step_ms=%.2f cpu_tokens_per_s=%.1f")
    :format(o.n_layer, o.n_head, o.n_embd, o.block_size, o.batch_size, world, o.threads, amp_mode or "f32",
      tokens / seconds, seconds / o.steps * 1e3, tokens / (cpu_seconds * world)))
  if profile then
    print(("profile forward_ms=%.2f backward_ms=%.2f optimizer_ms=%.2f"):format(t_fwd / o.steps * 1e3,
      t_bwd / o.steps * 1e3, t_opt / o.steps * 1e3))
  end
end
if dist then dist.destroy_process_group() end
