--- ddplua.nn.window_args: the checks a layer with a sliding window (Conv2d, MaxPool2d,
-- AvgPool2d) runs on kernel_size, stride, padding and dilation when it is constructed, so
-- nn.Conv2d(3, 4, 0) raises where it is written rather than at the first forward (or
-- never: a kernel of size 0 made an empty weight). The messages are PyTorch 1.13's (its
-- ATen shape checks for convolution and for pooling), prefixed with the layer's name and
-- followed by the values given.
local lib = require "ddplua.lib"

local M = {}

local function show(p) return ("(%d, %d)"):format(p[1], p[2]) end

--- window_args.pair(v, layer, what) -> {h, w}: v is an integer (both) or a {h, w} pair of
-- integers. Raises "layer: what must be an integer or a {h, w} pair of integers, got v".
function M.pair(v, layer, what)
  if type(v) == "number" and v % 1 == 0 then return { v, v } end
  if type(v) == "table" and #v == 2 and type(v[1]) == "number" and type(v[2]) == "number"
      and v[1] % 1 == 0 and v[2] % 1 == 0 then
    return { v[1], v[2] }
  end
  lib.raise(("%s: %s must be an integer or a {h, w} pair of integers, got %s"):format(
    layer, what, tostring(v)))
end

--- window_args.conv(layer, kernel, stride, padding, dilation): check {h, w} pairs for a
-- convolution: kernel >= 1, stride >= 1, padding >= 0, dilation >= 1 (PyTorch's
-- "kernel size should be greater than zero, ...", "non-positive stride is not supported",
-- "negative padding is not supported", "dilation should be greater than zero, ...").
-- padding may be nil (not known yet: Conv2d derives padding = "same" from the others).
function M.conv(layer, kernel, stride, padding, dilation)
  if kernel[1] < 1 or kernel[2] < 1 then
    lib.raise(("%s: kernel size should be greater than zero, but got kernel_height: %d "
      .. "kernel_width: %d"):format(layer, kernel[1], kernel[2]))
  end
  if stride[1] < 1 or stride[2] < 1 then
    lib.raise(("%s: non-positive stride is not supported (stride=%s)"):format(layer, show(stride)))
  end
  if padding and (padding[1] < 0 or padding[2] < 0) then
    lib.raise(("%s: negative padding is not supported (padding=%s)"):format(layer, show(padding)))
  end
  if dilation[1] < 1 or dilation[2] < 1 then
    lib.raise(("%s: dilation should be greater than zero, but got [%d, %d]"):format(
      layer, dilation[1], dilation[2]))
  end
end

--- window_args.pool(layer, kernel, stride, padding, dilation): check {h, w} pairs for a
-- pooling window: kernel >= 1, stride >= 1, 0 <= padding <= kernel / 2, dilation >= 1
-- (PyTorch's pooling texts: "kernel size should be greater than zero, but got kH: .. kW:
-- ..", "stride should be greater than zero, ...", "pad must be non-negative, ...", "pad
-- should be at most half of kernel size, ...", "dilation should be greater than zero,
-- ..."). dilation may be nil (AvgPool2d has none).
function M.pool(layer, kernel, stride, padding, dilation)
  if kernel[1] < 1 or kernel[2] < 1 then
    lib.raise(("%s: kernel size should be greater than zero, but got kH: %d kW: %d"):format(
      layer, kernel[1], kernel[2]))
  end
  if stride[1] < 1 or stride[2] < 1 then
    lib.raise(("%s: stride should be greater than zero, but got dH: %d dW: %d"):format(
      layer, stride[1], stride[2]))
  end
  for i = 1, 2 do
    if padding[i] < 0 then
      lib.raise(("%s: pad must be non-negative, but got pad: %d"):format(layer, padding[i]))
    end
    if padding[i] > kernel[i] / 2 then
      lib.raise(("%s: pad should be at most half of kernel size, but got pad=%d and "
        .. "kernel_size=%d"):format(layer, padding[i], kernel[i]))
    end
  end
  if dilation and (dilation[1] < 1 or dilation[2] < 1) then
    lib.raise(("%s: dilation should be greater than zero, but got dilationH: %d dilationW: %d")
      :format(layer, dilation[1], dilation[2]))
  end
end

return M
