--- ddplua.nn.weight_init: nn.init, PyTorch's torch.nn.init. Every function fills a tensor
-- in place under no_grad (so it works on leaf parameters that require grad) and returns it.
-- Random draws come from opts.generator (a dl.Generator) or the default generator, so
-- dl.manual_seed makes them reproducible. Formulas: He et al. 2015 ("Delving Deep into
-- Rectifiers", kaiming_*), Glorot & Bengio 2010 ("Understanding the difficulty of training
-- deep feedforward neural networks", xavier_*), gains and fans as torch/nn/init.py.
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"

local M = {}

local function gen_of(opts) return type(opts) == "table" and opts.generator or nil end

local function under_no_grad(fn, t, ...)
  if not dl.is_tensor(t) then lib.raise("nn.init: expected a tensor, got " .. type(t)) end
  dl.no_grad(fn, t, ...)
  return t
end

--- nn.init.calculate_gain(nonlinearity[, param]) -> the recommended gain: 1 for linear,
-- conv*, sigmoid; 5/3 for tanh; sqrt(2) for relu; sqrt(2 / (1 + slope^2)) for leaky_relu
-- (param = negative slope, default 0.01); 3/4 for selu. Raises for another name.
function M.calculate_gain(nonlinearity, param)
  local linear = { linear = true, conv1d = true, conv2d = true, conv3d = true, conv_transpose1d = true,
    conv_transpose2d = true, conv_transpose3d = true, sigmoid = true }
  if linear[nonlinearity] then return 1 end
  if nonlinearity == "tanh" then return 5 / 3 end
  if nonlinearity == "relu" then return math.sqrt(2) end
  if nonlinearity == "leaky_relu" then
    local slope = 0.01
    if param ~= nil then
      if type(param) ~= "number" then
        lib.raise("nn.init.calculate_gain: negative_slope " .. tostring(param) .. " is not a valid number")
      end
      slope = param
    end
    return math.sqrt(2 / (1 + slope * slope))
  end
  if nonlinearity == "selu" then return 3 / 4 end
  lib.raise("nn.init.calculate_gain: unsupported nonlinearity " .. tostring(nonlinearity))
end

--- nn.init.calculate_fan_in_and_fan_out(t) -> fan_in, fan_out: for t (out, in, *k),
-- fan_in = in * prod(k), fan_out = out * prod(k) (PyTorch's _calculate_fan_in_and_fan_out).
-- Raises for fewer than 2 dimensions.
function M.calculate_fan_in_and_fan_out(t)
  local s = t:size()
  if #s < 2 then
    lib.raise(("nn.init: fan in and fan out can not be computed for a tensor with fewer than 2 "
      .. "dimensions (shape (%s))"):format(table.concat(s, ", ")))
  end
  local receptive = 1
  for i = 3, #s do receptive = receptive * s[i] end
  return s[2] * receptive, s[1] * receptive
end

local function fan_of(t, mode)
  mode = mode or "fan_in"
  if mode ~= "fan_in" and mode ~= "fan_out" then
    lib.raise("nn.init: mode " .. tostring(mode) .. " not supported, please use one of fan_in, fan_out")
  end
  local fan_in, fan_out = M.calculate_fan_in_and_fan_out(t)
  return mode == "fan_in" and fan_in or fan_out
end

--- nn.init.uniform_(t[, a[, b[, opts]]]): U(a, b), default U(0, 1). opts.generator.
function M.uniform_(t, a, b, opts)
  return under_no_grad(function() t:uniform_(a or 0, b or 1, gen_of(opts)) end, t)
end

--- nn.init.normal_(t[, mean[, std[, opts]]]): N(mean, std^2), default N(0, 1).
function M.normal_(t, mean, std, opts)
  return under_no_grad(function() t:normal_(mean or 0, std or 1, gen_of(opts)) end, t)
end

--- nn.init.constant_(t, val) / zeros_(t) / ones_(t).
function M.constant_(t, val)
  return under_no_grad(function() t:fill_(val) end, t)
end
function M.zeros_(t) return M.constant_(t, 0) end
function M.ones_(t) return M.constant_(t, 1) end

-- opts for xavier_*: a number (the gain) or {gain = g, generator = gen}.
local function gain_opts(opts)
  if type(opts) == "number" then return opts, nil end
  return (opts and opts.gain) or 1, gen_of(opts)
end

--- nn.init.xavier_uniform_(t[, opts]): U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
-- opts: the gain as a number, or {gain = 1, generator = g}.
function M.xavier_uniform_(t, opts)
  local gain, gen = gain_opts(opts)
  local fan_in, fan_out = M.calculate_fan_in_and_fan_out(t)
  local std = gain * math.sqrt(2 / (fan_in + fan_out))
  local a = math.sqrt(3) * std
  return under_no_grad(function() t:uniform_(-a, a, gen) end, t)
end

--- nn.init.xavier_normal_(t[, opts]): N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
function M.xavier_normal_(t, opts)
  local gain, gen = gain_opts(opts)
  local fan_in, fan_out = M.calculate_fan_in_and_fan_out(t)
  local std = gain * math.sqrt(2 / (fan_in + fan_out))
  return under_no_grad(function() t:normal_(0, std, gen) end, t)
end

-- std of the kaiming initialisations: gain(nonlinearity, a) / sqrt(fan); nil for an empty t.
local function kaiming_std(t, opts)
  opts = opts or {}
  if t:numel() == 0 then return nil end
  local gain = M.calculate_gain(opts.nonlinearity or "leaky_relu", opts.a or 0)
  return gain / math.sqrt(fan_of(t, opts.mode))
end

--- nn.init.kaiming_uniform_(t[, opts]): U(-bound, bound), bound = sqrt(3) * gain / sqrt(fan).
-- opts.a (0: the negative slope for leaky_relu), opts.mode ("fan_in" or "fan_out"),
-- opts.nonlinearity ("leaky_relu"), opts.generator. An empty tensor is left as is.
-- Linear and Conv2d use a = sqrt(5), which gives bound = 1 / sqrt(fan_in).
function M.kaiming_uniform_(t, opts)
  local std = kaiming_std(t, opts)
  if not std then return t end
  local bound = math.sqrt(3) * std
  return under_no_grad(function() t:uniform_(-bound, bound, gen_of(opts)) end, t)
end

--- nn.init.kaiming_normal_(t[, opts]): N(0, std^2), std = gain / sqrt(fan); options as
-- kaiming_uniform_.
function M.kaiming_normal_(t, opts)
  local std = kaiming_std(t, opts)
  if not std then return t end
  return under_no_grad(function() t:normal_(0, std, gen_of(opts)) end, t)
end

--- nn.init.default_affine_(weight, bias[, generator]): PyTorch's default initialisation of
-- Linear and ConvNd (their reset_parameters): weight kaiming_uniform_(a = sqrt(5)), bias
-- (may be nil) U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in of the weight (bound 0 when
-- fan_in is 0).
function M.default_affine_(weight, bias, generator)
  M.kaiming_uniform_(weight, { a = math.sqrt(5), generator = generator })
  if bias ~= nil then
    local fan_in = M.calculate_fan_in_and_fan_out(weight)
    local bound = fan_in > 0 and 1 / math.sqrt(fan_in) or 0
    M.uniform_(bias, -bound, bound, { generator = generator })
  end
end

return M
