--- bench/attention_memory.lua: how the memory of scaled_dot_product_attention grows with the
-- sequence length T (issue 25 part 6: "attention memory linear in T"). For T = 256 .. 4096
-- (batch 1, 4 heads, head dim 64, causal, f32) it measures the allocator's peak bytes above
-- the inputs over one forward + backward, for the fused op and for the explicit formula
-- softmax(q k^T / sqrt(d) + mask) v (which holds (T, T) scores per head), and prints one line
-- per T: T, fused MiB, explicit MiB, fused bytes per T. Run: build/ddplua bench/attention_memory.lua
local dl = require "ddplua"

local B, H, D = 1, 4, 64
local MiB = 1024 * 1024

local function peak_of(fn)
  dl.reset_peak_memory()
  local base = dl.memory_stats().live
  fn()
  return dl.memory_stats().peak - base
end

local function explicit(q, k, v, T)
  local pos = dl.arange(0, T)
  local mask = pos:view(T, 1):lt(pos:view(1, T)):to("f32") * -1e30 -- key after query: masked
  local s = q:matmul(k:transpose(3, 4)) / math.sqrt(D) + mask
  return s:softmax(4):matmul(v)
end

print("T fused_MiB explicit_MiB fused_bytes_per_T explicit_bytes_per_T2")
for _, T in ipairs { 256, 512, 1024, 2048, 4096 } do
  dl.manual_seed(T)
  local q = dl.randn({ B, H, T, D }, { requires_grad = true })
  local k = dl.randn({ B, H, T, D }, { requires_grad = true })
  local v = dl.randn({ B, H, T, D }, { requires_grad = true })
  local g = dl.randn({ B, H, T, D })
  local fused = peak_of(function()
    dl.scaled_dot_product_attention(q, k, v, { is_causal = true }):backward(g)
  end)
  q.grad, k.grad, v.grad = nil, nil, nil
  local expl = T <= 2048 and peak_of(function() explicit(q, k, v, T):backward(g) end) or nil
  q.grad, k.grad, v.grad = nil, nil, nil
  print(("%d %.2f %s %.0f %s"):format(T, fused / MiB, expl and ("%.2f"):format(expl / MiB) or "-",
    fused / T, expl and ("%.1f"):format(expl / (T * T)) or "-"))
end
