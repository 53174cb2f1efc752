--- bench/conv_layers.lua: conv2d forward + backward per layer shape of ResNet-20 (batch 128,
-- 3x3 stride 1, padding 1) and the Fashion-MNIST CNN's second layer (batch 64), in ms per
-- call (median) and GFLOP/s counted as direct convolution (2 N O C 9 OH OW per pass, three
-- passes: forward, input gradient, weight gradient).
-- Run: build/ddplua bench/conv_layers.lua [--threads N] [--reps R]
-- To compare two builds, run it alternately with DDPLUA_LIB pointing at each library.
local dl = require "ddplua"
local clock = require "ddplua.clock"

local threads, reps = nil, 5
for i = 1, #arg do
  if arg[i] == "--threads" then threads = tonumber(arg[i + 1]) end
  if arg[i] == "--reps" then reps = tonumber(arg[i + 1]) end
end
if threads then dl.set_num_threads(threads) end

local cases = {
  { "ResNet-20 128x16x32x32 -> 16", 128, 16, 16, 32 },
  { "ResNet-20 128x32x16x16 -> 32", 128, 32, 32, 16 },
  { "ResNet-20 128x64x8x8 -> 64", 128, 64, 64, 8 },
  { "CNN 64x32x14x14 -> 64", 64, 32, 64, 14 },
}
for _, c in ipairs(cases) do
  local name, n, cin, cout, hw = c[1], c[2], c[3], c[4], c[5]
  local x = dl.randn({ n, cin, hw, hw }, { requires_grad = true })
  local w = dl.randn({ cout, cin, 3, 3 }, { requires_grad = true })
  local gout = dl.randn { n, cout, hw, hw }
  local flops = 3 * 2 * n * cout * cin * 9 * hw * hw
  local t = clock.median_time(function()
    local y = dl.conv2d(x, w, nil, { padding = 1 })
    y:backward(gout)
    w.grad, x.grad = nil, nil
  end, reps, 5)
  print(string.format("| %s | %.2f ms | %.1f GFLOP/s |", name, t * 1e3, flops / t / 1e9))
end
