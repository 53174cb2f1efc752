--- bench/fused_optim.lua: DDP step time and peak memory of the optimizer in backward
-- (ddp:register_optimizer_in_backward, Note [optimizer in backward]) against the plain path
-- (backward, then the optimizer's step over .grad), 2 ranks under the launcher:
--   build/ddplua --nproc_per_node=2 --standalone bench/fused_optim.lua --mode plain|fused \
--     [--optim sgd|adam] [--width 2048] [--depth 3] [--steps 30] [--warmup 5]
-- MLP 784 -> width (x depth, tanh) -> 10 on a fixed random batch of 64 per rank, f32, one
-- BLAS thread per rank, SGD (lr 0.01, momentum 0.9) or Adam (lr 1e-3).
-- Prints one line (rank 0): "mode=<m> optim=<o> params=<n> step_ms=<median ms per step>
-- peak_rss_mb=<getrusage peak RSS, MiB> base_rss_mb=<peak RSS before the model was built>
-- tensor_peak_mb=<highest bytes of live CPU tensors, dl.memory_stats().peak, MiB>
-- during=<bucket steps that ran during backward> at_end=<after the final wait>".
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local dos = require "ddplua.os"

local mode, opt_name, width, depth, steps, warmup = "plain", "sgd", 2048, 3, 30, 5
for i = 1, #arg do
  if arg[i] == "--mode" then mode = arg[i + 1] end
  if arg[i] == "--optim" then opt_name = arg[i + 1] end
  if arg[i] == "--width" then width = tonumber(arg[i + 1]) end
  if arg[i] == "--depth" then depth = tonumber(arg[i + 1]) end
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--warmup" then warmup = tonumber(arg[i + 1]) end
end
assert(mode == "plain" or mode == "fused", "--mode plain|fused")
dl.set_num_threads(1)
dist.init_process_group { backend = "gloo" }
local base_rss = dos.resource_usage().peak_rss_bytes

dl.manual_seed(0)
local layers, d_in = {}, 784
for _ = 1, depth do
  layers[#layers + 1] = nn.Linear(d_in, width)
  layers[#layers + 1] = nn.Tanh()
  d_in = width
end
layers[#layers + 1] = nn.Linear(d_in, 10)
local model = DDP(nn.Sequential(unpack(layers)))
local cls = opt_name == "adam" and optim.Adam or optim.SGD
local args = opt_name == "adam" and { lr = 1e-3 } or { lr = 0.01, momentum = 0.9 }
local opt
if mode == "fused" then model:register_optimizer_in_backward(cls, args)
else opt = cls(model:parameters(), args) end
local n_params = 0
for _, p in ipairs(model:parameters()) do n_params = n_params + p:numel() end

local x, y = dl.randn({ 64, 784 }), dl.randn({ 64, 10 })
local times = {}
for s = 1, warmup + steps do
  dist.barrier()
  local t0 = dos.monotonic()
  if opt then opt:zero_grad() end
  local loss = (model(x) - y):pow(2):mean()
  loss:backward()
  if opt then opt:step() end
  local dt = dos.monotonic() - t0
  if s > warmup then times[#times + 1] = dt end
end
table.sort(times)
local during, at_end = 0, 0
if mode == "fused" then during, at_end = model:fused_optim_counts() end
if dist.get_rank() == 0 then
  print(("mode=%s optim=%s params=%d step_ms=%.3f peak_rss_mb=%.1f base_rss_mb=%.1f tensor_peak_mb=%.1f during=%d at_end=%d"):format(
    mode, opt_name, n_params, 1000 * times[math.floor((#times + 1) / 2)],
    dos.resource_usage().peak_rss_bytes / 2 ^ 20, base_rss / 2 ^ 20, dl.memory_stats().peak / 2 ^ 20,
    during, at_end))
end
dist.destroy_process_group()
