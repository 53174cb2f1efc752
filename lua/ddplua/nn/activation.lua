--- ddplua.nn.activation: the activation layers, PyTorch's (torch/nn/modules/activation.py):
-- ReLU(), LeakyReLU([negative_slope = 0.01]), GELU([{approximate = "none" | "tanh"}]),
-- Tanh(), Sigmoid(), SiLU(), Softmax(dim), LogSoftmax(dim) (dim 1-based, -1 the last;
-- required: PyTorch's implicit dim is deprecated). Each is element-wise (or along dim) on
-- any shape; see the dl functions of the same names. Small stateless classes, kept in
-- one file as PyTorch keeps them.
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local Module = module.Module

local M = {}

M.ReLU = Module:extend("ReLU")
function M.ReLU:forward(x) return dl.relu(x) end

M.LeakyReLU = Module:extend("LeakyReLU")
function M.LeakyReLU:init(negative_slope) self.negative_slope = negative_slope or 0.01 end
function M.LeakyReLU:forward(x) return dl.leaky_relu(x, self.negative_slope) end
function M.LeakyReLU:extra_repr() return "negative_slope=" .. module.repr_float(self.negative_slope) end

M.GELU = Module:extend("GELU")
function M.GELU:init(opts)
  local a = type(opts) == "table" and opts.approximate or opts or "none"
  if a ~= "none" and a ~= "tanh" then
    lib.raise("GELU: approximate must be 'none' or 'tanh', got " .. tostring(a))
  end
  self.approximate = a
end
function M.GELU:forward(x) return dl.gelu(x, { approximate = self.approximate }) end
function M.GELU:extra_repr() return "approximate=" .. module.repr(self.approximate) end

M.Tanh = Module:extend("Tanh")
function M.Tanh:forward(x) return dl.tanh(x) end

M.Sigmoid = Module:extend("Sigmoid")
function M.Sigmoid:forward(x) return dl.sigmoid(x) end

M.SiLU = Module:extend("SiLU")
function M.SiLU:forward(x) return dl.silu(x) end

local function dim_init(name)
  return function(self, dim)
    if type(dim) ~= "number" or dim % 1 ~= 0 or dim == 0 then
      lib.raise(name .. ": dim must be a non-zero integer (1-based, -1 the last), got " .. tostring(dim))
    end
    self.dim = dim
  end
end
local function dim_repr(self) return "dim=" .. self.dim end

M.Softmax = Module:extend("Softmax")
M.Softmax.init = dim_init("Softmax")
function M.Softmax:forward(x) return x:softmax(self.dim) end
M.Softmax.extra_repr = dim_repr

M.LogSoftmax = Module:extend("LogSoftmax")
M.LogSoftmax.init = dim_init("LogSoftmax")
function M.LogSoftmax:forward(x) return x:log_softmax(self.dim) end
M.LogSoftmax.extra_repr = dim_repr

return M
