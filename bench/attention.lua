--- bench/attention.lua: scaled_dot_product_attention forward + backward (causal, f32) on
-- the CPU at the nanoGPT CPU shape (batch 12, 4 heads, T 64, head dim 32) and a GPT-2-small
-- shape (batch 4, 12 heads, T 256, head dim 64): milliseconds per call (median of 7 runs),
-- to set beside bench/attention_torch.py (PyTorch 1.13's explicit formula, same shapes).
-- Run: build/ddplua bench/attention.lua [--threads N]
local dl = require "ddplua"
local clock = require "ddplua.clock"

local threads = 1
for i = 1, #arg do
  if arg[i] == "--threads" then threads = tonumber(arg[i + 1]) end
end
dl.set_num_threads(threads)

local SHAPES = {
  { name = "nanogpt", B = 12, H = 4, T = 64, D = 32 },
  { name = "gpt2-small", B = 4, H = 12, T = 256, D = 64 },
}

for _, s in ipairs(SHAPES) do
  local q = dl.randn({ s.B, s.H, s.T, s.D }, { requires_grad = true })
  local k = dl.randn({ s.B, s.H, s.T, s.D }, { requires_grad = true })
  local v = dl.randn({ s.B, s.H, s.T, s.D }, { requires_grad = true })
  local g = dl.randn({ s.B, s.H, s.T, s.D })
  local function step(fwd_only)
    local out = dl.scaled_dot_product_attention(q, k, v, { is_causal = true })
    if not fwd_only then
      out:backward(g)
      q.grad, k.grad, v.grad = nil, nil, nil
    end
  end
  local function median(fn, reps)
    for _ = 1, 3 do fn() end
    local times = {}
    for r = 1, 7 do
      local t0 = clock.now()
      for _ = 1, reps do fn() end
      times[r] = (clock.now() - t0) / reps
    end
    table.sort(times)
    return times[4] * 1e3
  end
  local reps = s.T >= 256 and 5 or 20
  local fwd = median(function() step(true) end, reps)
  local both = median(function() step(false) end, reps)
  print(("attention %s threads=%d fwd_ms=%.3f fwd_bwd_ms=%.3f"):format(s.name, threads, fwd, both))
end
