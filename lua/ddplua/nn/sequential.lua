--- ddplua.nn.sequential: nn.Sequential(m1, m2, ...), PyTorch's: forward(x) feeds x through
-- the children in order. The children are named "0", "1", ... as PyTorch's, so state_dict
-- keys match PyTorch's ("0.weight"). nn.Sequential({{"conv", m1}, {"relu", m2}}) names them
-- (PyTorch's OrderedDict form); nn.Sequential({m1, m2}) is nn.Sequential(m1, m2).
-- seq[i] is the i-th child (1-based as Lua, negative from the end; nil past the end),
-- seq[i] = m replaces it; seq:len() counts them (Lua 5.1's # cannot be overridden).
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local Sequential = module.Module:extend("Sequential")

function Sequential:init(...)
  local n, first = select("#", ...), ...
  if n == 1 and type(first) == "table" and not module.is_module(first) then
    if type(first[1]) == "table" and type(first[1][1]) == "string" then
      for _, pair in ipairs(first) do self:add_module(pair[1], pair[2]) end
    else
      for i, m in ipairs(first) do self:add_module(tostring(i - 1), m) end
    end
    return
  end
  for i = 1, n do
    local m = select(i, ...)
    if not module.is_module(m) then
      lib.raise(("Sequential: argument %d is not a Module (%s)"):format(i, type(m)))
    end
    self:add_module(tostring(i - 1), m)
  end
end

-- The name at 1-based position i (negative from the end), or nil.
local function name_at(self, i, what)
  local names = rawget(self, "_modules").names
  if i % 1 ~= 0 then lib.raise(what .. ": index must be an integer, got " .. tostring(i)) end
  if i < 0 then i = #names + i + 1 end
  return names[i]
end

function Sequential:__getitem(i)
  local name = name_at(self, i, "Sequential")
  return name and rawget(self, "_modules").values[name]
end

function Sequential:__setitem(i, m)
  local name = name_at(self, i, "Sequential")
  if not name then lib.raise(("Sequential: index %d is out of range for %d modules"):format(i, self:len())) end
  self:add_module(name, m)
end

--- seq:len() -> the number of children.
function Sequential:len() return #rawget(self, "_modules").names end

--- seq:append(m) -> seq: add m at the end (named by its position, from 0).
function Sequential:append(m)
  self:add_module(tostring(self:len()), m)
  return self
end

--- seq:extend(list) -> seq: append each module of a list.
function Sequential:extend(list)
  for _, m in ipairs(list) do self:append(m) end
  return self
end

-- Note [sequential relu pooling]: a ReLU followed by a MaxPool2d (the CNN's activation and
-- pooling) runs as one dl.relu_max_pool2d, which gives the same output and gradients bit
-- for bit without writing relu's output or running its backward. Only modules of exactly
-- these classes, with the forwards they had when this file loaded (none replaced on the
-- class or the instance), and a MaxPool2d not returning indices, are fused; anything else
-- runs module by module.
local ReLU, MaxPool2d = require "ddplua.nn.activation".ReLU, require "ddplua.nn.max_pool2d"
local relu_forward, max_pool_forward = ReLU.forward, MaxPool2d.forward

local function fusable(m, nxt)
  return getmetatable(m) == ReLU and m.forward == relu_forward and getmetatable(nxt) == MaxPool2d
    and nxt.forward == max_pool_forward and not nxt.return_indices
end

-- Note [sequential linear relu]: a Linear followed by a ReLU (the MLP's layers) runs as the
-- linear then relu_ in place on its output, which no one else holds (dl.linear always makes
-- a new tensor and records only its inputs for backward): the same output and gradients
-- bit for bit (relu_'s backward masks by the output, > 0 exactly where the input was), and
-- one (N, out_features) tensor fewer a layer. That tensor was garbage until the next Lua
-- collection: the MLP bench made ~390 KB of dead tensors a step, 96 KB of them these; the
-- fusion gave +1-5% samples/s (1 x 2 and DDP 2 x 1, alternating runs). Only the stock
-- classes with their forwards as this file loaded them, as above.
local Linear = require "ddplua.nn.linear"
local linear_forward = Linear.forward

local function linear_then_relu(m, nxt)
  return getmetatable(m) == Linear and m.forward == linear_forward and getmetatable(nxt) == ReLU
    and nxt.forward == relu_forward
end

function Sequential:forward(x)
  local mods = rawget(self, "_modules")
  local names, values = mods.names, mods.values
  local i, n = 1, #names
  while i <= n do
    local m = values[names[i]]
    local nxt = i < n and values[names[i + 1]]
    if m and nxt and fusable(m, nxt) then
      x = dl.relu_max_pool2d(x, nxt.kernel_size, { stride = nxt.stride, padding = nxt.padding,
        dilation = nxt.dilation, ceil_mode = nxt.ceil_mode })
      i = i + 2
    elseif m and nxt and linear_then_relu(m, nxt) then
      x = linear_forward(m, x)
      x:relu_()
      i = i + 2
    else
      if m then x = m(x) end
      i = i + 1
    end
  end
  return x
end

return Sequential
