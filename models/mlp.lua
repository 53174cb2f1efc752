--- models/mlp.lua: the Fashion-MNIST MLP, 784-256-128-10 with ReLU.
-- require("models.mlp")() -> an nn.Module taking (N, 1, 28, 28) or (N, 784), giving logits (N, 10).
local nn = require "ddplua.nn"

return function()
  return nn.Sequential(
    nn.Flatten(),
    nn.Linear(784, 256), nn.ReLU(),
    nn.Linear(256, 128), nn.ReLU(),
    nn.Linear(128, 10))
end
