-- Layers check their window arguments when constructed (issue 23, item 3): nn.Conv2d(3, 4,
-- 0) was accepted (an empty weight), as were a zero or negative stride, a negative padding
-- or a zero dilation, for Conv2d and for the pooling layers; they now raise at the
-- constructor's line with PyTorch 1.13's texts (checked against its ATen messages).
local nn = require "ddplua.nn"

local function raises(text, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "accepted; expected: " .. text)
  assert.matches(text, tostring(err), 1, true)
  assert.matches("window_args_spec.lua", tostring(err), 1, true) -- at the constructor's line
end

describe("nn layer window arguments", function()
  it("Conv2d refuses a kernel, stride, padding or dilation out of range", function()
    raises("Conv2d: kernel size should be greater than zero, but got kernel_height: 0 kernel_width: 0",
      function() return nn.Conv2d(3, 4, 0) end)
    raises("Conv2d: kernel size should be greater than zero, but got kernel_height: 3 kernel_width: 0",
      function() return nn.Conv2d(3, 4, { 3, 0 }) end)
    raises("Conv2d: kernel size should be greater than zero, but got kernel_height: -1",
      function() return nn.Conv2d(3, 4, -1) end)
    raises("Conv2d: non-positive stride is not supported (stride=(0, 0))",
      function() return nn.Conv2d(3, 4, 3, { stride = 0 }) end)
    raises("Conv2d: non-positive stride is not supported (stride=(1, -1))",
      function() return nn.Conv2d(3, 4, 3, { stride = { 1, -1 } }) end)
    raises("Conv2d: negative padding is not supported (padding=(1, -2))",
      function() return nn.Conv2d(3, 4, 3, { padding = { 1, -2 } }) end)
    raises("Conv2d: dilation should be greater than zero, but got [0, 0]",
      function() return nn.Conv2d(3, 4, 3, { dilation = 0 }) end)
    -- a zero kernel with padding = "same" names the kernel, not the padding it implies
    raises("Conv2d: kernel size should be greater than zero",
      function() return nn.Conv2d(3, 4, 0, { padding = "same" }) end)
    -- the channel and group checks that were there stay
    raises("Conv2d: in_channels must be a positive integer, got 0", function() return nn.Conv2d(0, 4, 3) end)
    raises("Conv2d: out_channels must be a positive integer, got -4", function() return nn.Conv2d(3, -4, 3) end)
    raises("Conv2d: in_channels (3) must be divisible by groups (2)",
      function() return nn.Conv2d(3, 4, 3, { groups = 2 }) end)
    raises("Conv2d: out_channels (3) must be divisible by groups (2)",
      function() return nn.Conv2d(4, 3, 3, { groups = 2 }) end)
    raises("Conv2d: groups must be a positive integer, got 0",
      function() return nn.Conv2d(4, 4, 3, { groups = 0 }) end)
    -- in range: built, and it runs
    local conv = nn.Conv2d(3, 4, { 3, 1 }, { stride = { 2, 1 }, padding = { 1, 0 }, dilation = { 1, 2 } })
    assert.same({ 4, 3, 3, 1 }, conv.weight:size())
  end)

  it("MaxPool2d and AvgPool2d refuse a kernel, stride, padding or dilation out of range", function()
    raises("MaxPool2d: kernel size should be greater than zero, but got kH: 0 kW: 0",
      function() return nn.MaxPool2d(0) end)
    raises("AvgPool2d: kernel size should be greater than zero, but got kH: -1 kW: -1",
      function() return nn.AvgPool2d(-1) end)
    raises("MaxPool2d: stride should be greater than zero, but got dH: 0 dW: 0",
      function() return nn.MaxPool2d(2, { stride = 0 }) end)
    raises("AvgPool2d: stride should be greater than zero, but got dH: -1 dW: -1",
      function() return nn.AvgPool2d(2, { stride = -1 }) end)
    raises("MaxPool2d: pad must be non-negative, but got pad: -1",
      function() return nn.MaxPool2d(2, { padding = -1 }) end)
    raises("AvgPool2d: pad should be at most half of kernel size, but got pad=2 and kernel_size=2",
      function() return nn.AvgPool2d(2, { padding = 2 }) end)
    raises("MaxPool2d: dilation should be greater than zero, but got dilationH: 0 dilationW: 0",
      function() return nn.MaxPool2d(2, { dilation = 0 }) end)
    raises("MaxPool2d: kernel_size must be an integer or a {h, w} pair of integers, got 1.5",
      function() return nn.MaxPool2d(1.5) end)
    assert.is_truthy(nn.MaxPool2d({ 3, 2 }, { stride = 1, padding = { 1, 1 } }))
  end)

  it("AdaptiveAvgPool2d and LayerNorm refuse negative sizes; Linear and Embedding still do", function()
    raises("AdaptiveAvgPool2d: elements of output_size must be greater than or equal to 0 but received {-1, -1}",
      function() return nn.AdaptiveAvgPool2d(-1) end)
    raises("LayerNorm: normalized_shape entry 2 must be a non-negative integer, got -3",
      function() return nn.LayerNorm({ 4, -3 }, { elementwise_affine = false }) end)
    raises("Linear: in_features must be a non-negative integer, got -1", function() return nn.Linear(-1, 3) end)
    raises("Linear: out_features must be a non-negative integer, got -1", function() return nn.Linear(3, -1) end)
    raises("Embedding: num_embeddings must be a non-negative integer, got -1", function() return nn.Embedding(-1, 3) end)
    raises("Embedding: embedding_dim must be a non-negative integer, got -1", function() return nn.Embedding(3, -1) end)
  end)
end)
