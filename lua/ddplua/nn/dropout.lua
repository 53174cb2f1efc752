--- ddplua.nn.dropout: nn.Dropout([p[, opts]]), PyTorch's: in training mode zeroes each
-- element with probability p (0.5) and scales the rest by 1 / (1 - p); in eval mode returns
-- x. opts.generator: a dl.Generator for the masks (default generator). Raises for p
-- outside [0, 1].
local dl = require "ddplua.functions"
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"

local Dropout = module.Module:extend("Dropout")

local KNOWN = options.known { "generator" }

function Dropout:init(p, opts)
  opts = options.check("Dropout", opts, KNOWN)
  p = p or 0.5
  if type(p) ~= "number" or p < 0 or p > 1 then
    lib.raise("Dropout: dropout probability has to be between 0 and 1, but got " .. tostring(p))
  end
  self.p = p
  self.generator = opts and opts.generator
end

function Dropout:forward(x)
  return dl.dropout(x, self.p, { training = self.training, generator = self.generator })
end

function Dropout:extra_repr() return ("p=%s, inplace=False"):format(module.repr_float(self.p)) end

return Dropout
