-- Tensor lifetimes a script never sees (Note [step lifetimes] in lua/ddplua/lib.lua, issue 24
-- part 6): without any collectgarbage call, the runtime's live bytes return after each
-- backward to their level before the forward (the forward's intermediates freed, whether
-- the graph saved them or only a dropped handle held them), a handle the script keeps stays
-- readable, and an evaluation loop's per-batch temporaries (no backward there) and those of
-- dl.no_grad(fn) are released too. Each check runs in a fresh process: the suite's own Lua
-- heap (over 10 MiB after many spec files) would set the rule's bound by itself.
local files = require "files"

-- The shared prelude: a small model whose forward on 2048 samples makes ~10 MiB of
-- intermediates (two (2048, 640) f32 activations of 5 MiB, then small ones), beside a 64
-- MiB tensor kept live as a dataset is: more than the rule's bound in a fresh process (8
-- MiB and 8 Lua heaps), less than collector pressure's headroom with that much live (a
-- quarter of it: Note [collector pressure]), which alone left them to pile up.
local PRELUDE = [[
local dl = require "ddplua"
local nn = require "ddplua.nn"
local MiB = 2 ^ 20
dl.manual_seed(0)
local dataset = dl.zeros({ 64 * MiB / 4 }) -- stays live, as a training set does
local lin1, lin2 = nn.Linear(64, 640), nn.Linear(640, 1)
local function model(input) return lin2(lin1(input):relu()) end
local x = dl.randn({ 2048, 64 })
local function live() return dl.memory_stats().live end
local function report(name, v) print(("%s=%d"):format(name, v)) end
print(("heap=%d"):format(collectgarbage("count") * 1024))
]]

-- value of `name=<integer>` in out
local function field(out, name)
  local v = out:match(name .. "=(%-?%d+)")
  assert(v, "no " .. name .. " in:\n" .. out)
  return tonumber(v)
end

local MiB = 2 ^ 20

describe("tensor lifetimes", function()
  it("returns the live bytes to their level before the forward after every backward", function()
    local out = files.run_fresh("lifetimes_backward", PRELUDE .. [[
local function step() -- the intermediates' handles die when model() returns
  local loss = model(x):pow(2):mean()
  loss:backward()
  return loss
end
step() -- allocates the parameters' .grad, which later steps accumulate into
local worst = 0
for i = 1, 5 do
  local before = live()
  local loss = step()
  local grown = live() - before
  if math.abs(grown) > math.abs(worst) then worst = grown end
  assert(loss:item() == loss:item()) -- the returned loss stays readable
end
report("worst", worst)
]])
    assert(field(out, "heap") < MiB, "a fresh process's Lua heap is too large for the check:\n" .. out)
    -- what stays: the returned loss (one f32) and its graph's node blocks (not tensor bytes)
    local worst = field(out, "worst")
    assert(math.abs(worst) <= 1024, ("after a backward the runtime held %.2f MiB more than "
      .. "before the forward"):format(worst / MiB))
  end)

  it("keeps the data of an intermediate the script holds readable after backward", function()
    local out = files.run_fresh("lifetimes_kept", PRELUDE .. [[
local kept, kept_sum
local function forward(keep) -- a model's forward: its intermediates die when it returns
  local a = lin1(x):relu()
  if keep then -- but the script keeps this one
    kept = a
    kept_sum = a:sum():item()
  end
  return lin2(a):pow(2):mean()
end
local function step(keep)
  local loss = forward(keep)
  loss:backward()
end
step(false) -- allocates the parameters' .grad
step(false)
local plain = live()
step(true)
report("grown", live() - plain)
report("bytes", kept:numel() * 4)
report("same", kept:sum():item() == kept_sum and 1 or 0)
kept = nil -- dropped: the next backward frees it
step(false)
report("dropped", live() - plain)
]])
    local grown, bytes = field(out, "grown"), field(out, "bytes")
    assert.equal(1, field(out, "same"))
    -- the kept activation and nothing else, until the script drops it
    assert(math.abs(grown - bytes) <= 1024, ("held %.2f MiB after backward, the kept "
      .. "activation is %.2f MiB"):format(grown / MiB, bytes / MiB))
    local dropped = field(out, "dropped")
    assert(math.abs(dropped) <= 1024, ("%.2f MiB still held after the script dropped the "
      .. "kept activation and ran another step"):format(dropped / MiB))
  end)

  it("releases an evaluation loop's per-batch temporaries and those of no_grad", function()
    local out = files.run_fresh("lifetimes_eval", PRELUDE .. [[
local data = require "ddplua.data"
local set = data.TensorDataset(dl.randn({ 2048 * 6, 64 }), dl.zeros({ 2048 * 6 }, { dtype = "i64" }))
local loader = data.DataLoader(set, { batch_size = 2048 })
local first, worst
dl.no_grad(function()
  for xb in loader:iter() do
    local at = live()
    first = first or at
    worst = math.max(worst or at, at)
    local logits = model(xb)
    assert(logits:size(1) == 2048)
  end
end)
report("batch_growth", worst - first)
local before = live()
dl.no_grad(function() for _ = 1, 3 do model(x) end end)
report("no_grad_growth", live() - before)
]])
    local batch_growth, no_grad_growth = field(out, "batch_growth"), field(out, "no_grad_growth")
    -- a batch's input (0.5 MiB) and logits may still sit in the loop's slots; not a forward
    assert(batch_growth <= 1 * MiB, ("per-batch temporaries piled up: %.2f MiB"):format(batch_growth / MiB))
    assert(no_grad_growth <= 1024, ("no_grad(fn) left %.2f MiB of fn's temporaries"):format(no_grad_growth / MiB))
  end)
end)
