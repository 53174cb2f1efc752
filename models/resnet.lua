--- models/resnet.lua: ResNet-20 for 32×32 inputs (He et al., "Deep Residual Learning for
-- Image Recognition", 2015, section 4.2: 3 stages of n = 3 basic blocks with 16, 32, 64
-- channels, 3×3 convolutions, BatchNorm, global average pooling, one linear layer). The
-- shortcut between stages is a 1×1 convolution with stride 2 and BatchNorm (option B of
-- the paper), as most PyTorch ports do.
-- require("models.resnet")({num_classes = 10, in_channels = 3, depth = 20}) -> nn.Module
-- taking (N, in_channels, 32, 32), giving logits (N, num_classes).
local nn = require "ddplua.nn"
local dl = require "ddplua"

local BasicBlock = nn.Module:extend("BasicBlock")

function BasicBlock:init(in_planes, planes, stride)
  self.conv1 = nn.Conv2d(in_planes, planes, 3, { stride = stride, padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(planes)
  self.conv2 = nn.Conv2d(planes, planes, 3, { stride = 1, padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(planes)
  if stride ~= 1 or in_planes ~= planes then
    self.shortcut = nn.Sequential(
      nn.Conv2d(in_planes, planes, 1, { stride = stride, bias = false }),
      nn.BatchNorm2d(planes))
  else
    self.shortcut = nn.Identity()
  end
end

-- relu(bn(conv)) and relu(bn(conv) + shortcut) run as fused batch norm + ReLU (+ add)
-- (BatchNorm:forward_relu): the same values and parameters as the three separate layers.
function BasicBlock:forward(x)
  local out = self.bn1:forward_relu(self.conv1(x))
  return self.bn2:forward_relu(self.conv2(out), self.shortcut(x))
end

local ResNet = nn.Module:extend("ResNet")

function ResNet:init(opts)
  opts = opts or {}
  local depth = opts.depth or 20
  assert((depth - 2) % 6 == 0, "resnet: depth must be 6n + 2 (20, 32, 44, 56, 110)")
  local n = (depth - 2) / 6
  self.conv1 = nn.Conv2d(opts.in_channels or 3, 16, 3, { padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(16)
  local in_planes = 16
  local function stage(planes, stride)
    local blocks = {}
    for i = 1, n do
      blocks[i] = BasicBlock(in_planes, planes, i == 1 and stride or 1)
      in_planes = planes
    end
    return nn.Sequential(unpack(blocks))
  end
  self.layer1 = stage(16, 1)
  self.layer2 = stage(32, 2)
  self.layer3 = stage(64, 2)
  self.pool = nn.AdaptiveAvgPool2d(1)
  self.flatten = nn.Flatten()
  self.fc = nn.Linear(64, opts.num_classes or 10)
  -- kaiming_normal_ (fan_out, relu) for convolutions, as torchvision's ResNets
  for _, m in ipairs(self:modules()) do
    if m.__name == "Conv2d" then nn.init.kaiming_normal_(m.weight, { mode = "fan_out", nonlinearity = "relu" }) end
  end
  local _ = dl -- (keeps the require local for users reading the model)
end

function ResNet:forward(x)
  local out = self.bn1:forward_relu(self.conv1(x))
  out = self.layer3(self.layer2(self.layer1(out)))
  return self.fc(self.flatten(self.pool(out)))
end

return function(opts) return ResNet(opts) end
