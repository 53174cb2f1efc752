--- models/cnn.lua: the Fashion-MNIST CNN. conv 1→32 3×3 pad 1, ReLU, max-pool 2, conv 32→64
-- 3×3 pad 1, ReLU, max-pool 2, flatten, linear 3136→128, ReLU, linear 128→10.
-- require("models.cnn")() -> an nn.Module taking (N, 1, 28, 28), giving logits (N, 10).
local nn = require "ddplua.nn"

return function()
  return nn.Sequential(
    nn.Conv2d(1, 32, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
    nn.Linear(128, 10))
end
