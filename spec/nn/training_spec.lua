-- Specs for training through nn modules: gradients of module parameters against finite
-- differences (spec/helpers/gradcheck.lua, f64), and a small MLP that learns a separable
-- problem with plain SGD updates written here under no_grad.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local gradcheck = require("gradcheck").gradcheck

-- The model's parameters followed by `extra` inputs, for gradcheck's input list.
local function inputs_of(model, ...)
  local list = {}
  for _, p in ipairs(model:parameters()) do list[#list + 1] = p end
  for i = 1, select("#", ...) do list[#list + 1] = select(i, ...) end
  return list
end

describe("ddplua.nn training", function()
  it("gradients of a 2-layer model's parameters and input match finite differences (f64)", function()
    dl.manual_seed(3)
    local model = nn.Sequential(nn.Linear(3, 4, { dtype = "f64" }), nn.Tanh(), nn.Linear(4, 2, { dtype = "f64" }))
    local x = dl.randn({ 5, 3 }, { dtype = "f64", generator = dl.Generator(8) })
    local inputs = inputs_of(model, x)
    assert.equal(5, #inputs)
    assert.is_true(gradcheck(function() return model(x) end, inputs))
    for _, p in ipairs(model:parameters()) do assert.is_not_nil(p.grad) end
  end)

  it("gradients through Conv2d, BatchNorm2d, pooling, Flatten, Linear and a loss (f64)", function()
    dl.manual_seed(4)
    local model = nn.Sequential(
      nn.Conv2d(2, 3, 3, { padding = 1, dtype = "f64" }), nn.BatchNorm2d(3, { dtype = "f64" }), nn.SiLU(),
      nn.AvgPool2d(2), nn.Flatten(), nn.Linear(12, 3, { dtype = "f64" }), nn.LayerNorm(3, { dtype = "f64" }))
    local x = dl.randn({ 2, 2, 4, 4 }, { dtype = "f64", generator = dl.Generator(9) })
    local target = dl.tensor({ 2, 0 }, { dtype = "i64" })
    local loss_fn = nn.CrossEntropyLoss()
    assert.is_true(gradcheck(function() return loss_fn(model(x), target) end, inputs_of(model)))
  end)

  it("a small MLP learns a separable problem with plain SGD", function()
    dl.manual_seed(0)
    local gen = dl.Generator(21)
    -- Two classes: label 1 when x1 + 2 x2 > 0.5, points kept off the boundary by 0.2.
    local pts, labels = {}, {}
    for _, a in ipairs(dl.rand({ 1024, 2 }, { generator = gen }):tolist()) do
      local p1, p2 = a[1] * 4 - 2, a[2] * 4 - 2
      local s = p1 + 2 * p2 - 0.5
      if math.abs(s) > 0.2 and #pts < 256 then
        pts[#pts + 1] = { p1, p2 }
        labels[#labels + 1] = s > 0 and 1 or 0
      end
    end
    assert.equal(256, #pts)
    local x = dl.tensor(pts)
    local y = dl.tensor(labels, { dtype = "i64" })

    local MLP = nn.Module:extend("MLP")
    function MLP:init()
      self.fc1 = nn.Linear(2, 16)
      self.act = nn.ReLU()
      self.fc2 = nn.Linear(16, 2)
    end
    function MLP:forward(t) return self.fc2(self.act(self.fc1(t))) end
    local model = MLP()
    local criterion = nn.CrossEntropyLoss()
    local lr = 0.2

    local first, last
    for step = 1, 300 do
      model:zero_grad()
      local loss = criterion(model(x), y)
      loss:backward()
      dl.no_grad(function()
        for _, p in ipairs(model:parameters()) do p:sub_(p.grad:mul(lr)) end
      end)
      local v = loss:item()
      if step == 1 then first = v end
      last = v
    end
    assert.is_true(first > 0.4)
    assert.is_true(last < 0.1, "final loss " .. last)
    model:eval()
    local logits = dl.no_grad(function() return model(x) end):tolist()
    local correct = 0
    for i, row in ipairs(logits) do
      if (row[2] > row[1] and 1 or 0) == labels[i] then correct = correct + 1 end
    end
    assert.is_true(correct / #labels > 0.97, "accuracy " .. correct / #labels)
  end)
end)
