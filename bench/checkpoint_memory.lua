--- bench/checkpoint_memory.lua: the peak memory and step time of one training step (forward,
-- backward, SGD step) of a deep MLP with and without activation checkpointing (issue 25
-- part 5; dl.utils.checkpoint, Note [checkpoint node] in lua/ddplua/nn/checkpoint.lua).
--
--   build/ddplua bench/checkpoint_memory.lua [--depth 16] [--width 512] [--batch 1024]
--       [--steps 5] [--threads 2] [--gpt]
--
-- Model: depth × (Linear(width, width), GELU), then Linear(width, 10) and cross-entropy,
-- f32, batch `batch` (the defaults make activations, not parameters, the bulk of memory,
-- as in a transformer trained on long sequences). Modes: none (no checkpointing); sequential:S (checkpoint_sequential
-- with S segments; S = sqrt(depth) is the classic choice); per_layer (every block in an
-- nn.CheckpointWrapper). Peak: dl.memory_stats().peak (CPU tensor bytes the runtime's
-- allocator holds for live tensors, the highest point), reset before each step with the
-- parameters and their gradients already allocated (zero_grad keeps them: set_to_none =
-- false, so activations_mib = peak - parameters - gradients is what the step added); the median over `steps` steps (each
-- measured alone) and the median step time are printed, one line per mode:
--   mode=<m> peak_mib=<p> activations_mib=<p - params and grads> step_ms=<t>
-- --gpt: models/gpt.lua instead (depth layers, default 6; width n_embd, default 256; 4 heads;
-- block 256; vocabulary 65; batch sequences, default 8; AdamW's step replaced by SGD as
-- above), modes none and per_layer (each Block in an nn.CheckpointWrapper).
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "checkpoint_memory.lua" }
parser:add_argument("--depth", { type = "number", metavar = "L", help = "hidden blocks (default 16)" })
parser:add_argument("--width", { type = "number", metavar = "W", help = "hidden width (default 512)" })
parser:add_argument("--batch", { type = "number", metavar = "B", help = "batch size (default 1024)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "measured steps per mode (default 5)" })
parser:add_argument("--threads", { type = "number", metavar = "T", help = "threads (default 2)" })
parser:add_argument("--gpt", { action = "store_true", help = "the GPT of models/gpt.lua instead of the MLP" })
local args = parser:parse_args(arg)
local GPT_MODE = args.gpt == true
local depth = args.depth or (GPT_MODE and 6 or 16)
local width = args.width or (GPT_MODE and 256 or 512)
local batch = args.batch or (GPT_MODE and 8 or 1024)
local steps = args.steps or 5
dl.set_num_threads(args.threads or 2)

local function model()
  dl.manual_seed(1)
  local blocks = {}
  for i = 1, depth do blocks[i] = nn.Sequential(nn.Linear(width, width), nn.GELU()) end
  return nn.Sequential(blocks), nn.Linear(width, 10)
end

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

local x = dl.randn({ batch, width }, { generator = dl.Generator(2) })
local y = dl.randint(0, 10, { batch }, { generator = dl.Generator(3) })
local loss_fn = nn.CrossEntropyLoss()
local segments = math.max(1, math.floor(math.sqrt(depth) + 0.5))

local modes = { "none", "sequential:" .. segments, "per_layer" }
if GPT_MODE then modes = { "none", "per_layer" } end
local GPT = GPT_MODE and require "models.gpt"
local idx = GPT_MODE and dl.randint(0, 65, { batch, 257 }, { generator = dl.Generator(4) })
for _, mode in ipairs(modes) do
  local body, head = model()
  local forward
  if GPT_MODE then -- the whole GPT as `body`, its loss as the step's; head unused
    dl.manual_seed(1)
    local gpt = GPT { n_layer = depth, n_head = 4, n_embd = width, block_size = 256, vocab_size = 65, bias = false }
    if mode == "per_layer" then
      local h = gpt.transformer.h
      for i = 1, depth do h[i] = nn.CheckpointWrapper(h[i]) end
    end
    body, head = gpt, nn.Identity()
    local x_in, y_in = idx:narrow(2, 1, 256), idx:narrow(2, 2, 256)
    forward = function() local _, loss = gpt(x_in, y_in); return loss end
  elseif mode == "none" then
    forward = function() return head(body(x)) end
  elseif mode == "per_layer" then
    for i = 1, depth do body[i] = nn.CheckpointWrapper(body[i]) end
    forward = function() return head(body(x)) end
  else
    forward = function() return head(dl.utils.checkpoint_sequential(body, segments, x)) end
  end
  local params = body:parameters()
  for _, p in ipairs(head:parameters()) do params[#params + 1] = p end
  local opt = optim.SGD(params, { lr = 1e-3 })
  local param_bytes = 0
  for _, p in ipairs(params) do param_bytes = param_bytes + p:numel() * 4 end
  -- one step first: the gradients exist from then on, as in training
  local function step_loss() if GPT_MODE then return forward() end return loss_fn(forward(), y) end
  step_loss():backward()
  opt:step()
  local peaks, times = {}, {}
  for s = 1, steps do
    collectgarbage("collect") -- the bench, not the step, starts each measure clean
    dl.reset_peak_memory()
    local t0 = clock.now()
    opt:zero_grad({ set_to_none = false }) -- gradients stay allocated: peak - 2 x params is the rest
    step_loss():backward()
    opt:step()
    times[s] = clock.now() - t0
    peaks[s] = dl.memory_stats().peak
  end
  local peak = median(peaks)
  print(("mode=%s peak_mib=%.1f activations_mib=%.1f step_ms=%.1f"):format(mode, peak / 2 ^ 20,
    (peak - 2 * param_bytes) / 2 ^ 20, median(times) * 1e3))
end
