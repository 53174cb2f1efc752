--- examples/single_process.lua: training in one process, the PyTorch way: a model class,
-- an optimizer and a schedule, a DataLoader over Fashion-MNIST, and a test evaluation.
--
--   ddplua examples/single_process.lua [--epochs N] [--steps N]
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "single_process.lua" }
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "epochs (default 1)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "steps per epoch (default: all)" })
local args = parser:parse_args(arg)
local epochs = args.epochs or 1

local Net = nn.Module:extend("Net")                      -- a model: a class with init and forward
function Net:init() self.fc1 = nn.Linear(784, 128); self.fc2 = nn.Linear(128, 10) end
function Net:forward(x) return self.fc2(self.fc1(x:flatten(2)):relu()) end

dl.manual_seed(0)
local model = Net()
local train_loader = data.DataLoader(data.FashionMNIST { train = true }, { batch_size = 64, shuffle = true })
local test_loader = data.DataLoader(data.FashionMNIST { train = false }, { batch_size = 256 })
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
local steps_per_epoch = math.min(args.steps or #train_loader, #train_loader)
local sched = optim.CosineAnnealingLR(opt, { T_max = epochs * steps_per_epoch })

for epoch = 1, epochs do
  local step, loss_sum = 0, 0
  for x, y in train_loader:iter() do                     -- x (64, 1, 28, 28) f32, y (64) i64
    opt:zero_grad()
    local loss = nn.functional.cross_entropy(model(x), y)
    loss:backward()
    opt:step(); sched:step()
    step, loss_sum = step + 1, loss_sum + loss:item()
    if step == steps_per_epoch then break end
  end
  print(("epoch %d: %d steps, mean train loss %.4f"):format(epoch, step, loss_sum / step))
end

-- Test accuracy over the 10 000 test samples, without recording the tape.
local correct, count = 0, 0
model:eval()
dl.no_grad(function()
  for x, y in test_loader:iter() do
    correct, count = correct + model(x):argmax(2):eq(y):sum():item(), count + y:numel()
  end
end)
print(("test accuracy %.4f on %d samples"):format(correct / count, count))
train_loader:close()
test_loader:close()
