--- bench/optim_step.lua: the cost of one optimizer step (opt:step()) on the parameters of
-- the bench models (and of 64 small tensors), alone: gradients set once, then N steps timed, for SGD (lr 0.05,
-- momentum 0.9: bench/train.lua's) and Adam (amsgrad off). The question it answers: what
-- the optimizer-state store (Note [optimizer state store], ddplua/optim_state.h) costs or
-- saves per step against the Lua-table state it replaced; run it with two builds
-- (bench/before_after.sh's checkouts) one after the other.
--   build/ddplua bench/optim_step.lua [--threads 1] [--steps 2000] [--repeats 7]
--                                     [--models mlp,cnn,small64] [--optims SGD,Adam]
-- Prints one line per model and optimizer: "model=<m> optim=<o> params=<n> us_per_step=<median>"
-- (the median of --repeats timings of --steps steps, after --steps / 10 warm-up steps).
local dl = require "ddplua"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"

local threads, steps, repeats = 1, 2000, 7
local models, optims = "mlp,cnn,small64", "SGD,Adam"
for i = 1, #arg do
  if arg[i] == "--models" then models = arg[i + 1] end
  if arg[i] == "--optims" then optims = arg[i + 1] end
  if arg[i] == "--threads" then threads = tonumber(arg[i + 1]) end
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--repeats" then repeats = tonumber(arg[i + 1]) end
end
dl.set_num_threads(threads)
dl.manual_seed(0)

-- "small64": 64 parameters of 16 elements, where the per-parameter bookkeeping (state
-- lookups, calls), not the kernels' memory traffic, is the step's cost.
local function small(n)
  local ps = {}
  for i = 1, n do ps[i] = dl.randn({ 16 }):requires_grad_() end
  return ps
end

local function listed(list, name) return ("," .. list .. ","):find("," .. name .. ",", 1, true) ~= nil end

for _, model_name in ipairs { "mlp", "cnn", "small64" } do
  if not listed(models, model_name) then goto next_model end
  local params = model_name == "small64" and small(64) or require("models." .. model_name)():parameters()
  for _, p in ipairs(params) do p.grad = dl.randn(p:size()) * 1e-3 end
  for _, case in ipairs { { "SGD", optim.SGD, { lr = 0.05, momentum = 0.9 } }, { "Adam", optim.Adam, { lr = 1e-4 } } } do
    if not listed(optims, case[1]) then goto next_optim end
    local opt = case[2](params, case[3])
    for _ = 1, math.max(1, math.floor(steps / 10)) do opt:step() end
    local times = {}
    for r = 1, repeats do
      local t0 = clock.now()
      for _ = 1, steps do opt:step() end
      times[r] = (clock.now() - t0) / steps * 1e6
    end
    table.sort(times)
    print(("model=%s optim=%s params=%d us_per_step=%.2f"):format(model_name, case[1], #params,
      times[math.floor((repeats + 1) / 2)]))
    ::next_optim::
  end
  ::next_model::
end
