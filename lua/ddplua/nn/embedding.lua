--- ddplua.nn.embedding: nn.Embedding(num_embeddings, embedding_dim[, opts]), PyTorch's: a
-- lookup table weight (num_embeddings, embedding_dim), initialised N(0, 1) (opts.generator
-- or the default generator); ids (any shape, i64, values 0-based in [0, num_embeddings)) ->
-- (*ids.shape, embedding_dim). opts.padding_idx: a row (0-based data value; negative counts
-- from the end, stored normalised) set to zero at init and given no gradient.
-- opts.dtype ("f32"); opts.device ("cpu"; "cuda", "cuda:k": initialised on the CPU, then
-- moved).
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local init = require "ddplua.nn.weight_init"

local Embedding = module.Module:extend("Embedding")

local KNOWN = options.known { "padding_idx", "dtype", "device", "generator" }
function Embedding:init(num_embeddings, embedding_dim, opts)
  opts = options.check("Embedding", opts, KNOWN)
  for what, v in pairs { num_embeddings = num_embeddings, embedding_dim = embedding_dim } do
    if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
      lib.raise("Embedding: " .. what .. " must be a non-negative integer, got " .. tostring(v))
    end
  end
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  local padding_idx = opts.padding_idx
  if padding_idx ~= nil then
    if padding_idx >= num_embeddings or padding_idx < -num_embeddings then
      lib.raise(("Embedding: padding_idx %d must be within num_embeddings (%d)"):format(padding_idx, num_embeddings))
    end
    if padding_idx < 0 then padding_idx = num_embeddings + padding_idx end
  end
  self.padding_idx = padding_idx
  self.weight = module.Parameter(dl.empty({ num_embeddings, embedding_dim }, { dtype = opts.dtype or "f32" }))
  self:reset_parameters(opts.generator)
  if opts.device ~= nil then self:to(opts.device) end -- initialised on the CPU, then moved
end

--- emb:reset_parameters([generator]): N(0, 1), the padding row zero.
function Embedding:reset_parameters(generator)
  init.normal_(self.weight, 0, 1, { generator = generator })
  if self.padding_idx ~= nil then
    local row = self.padding_idx + 1
    dl.no_grad(function()
      for j = 1, self.embedding_dim do self.weight:set(row, j, 0) end
    end)
  end
end

function Embedding:forward(ids) return dl.embedding(ids, self.weight, { padding_idx = self.padding_idx }) end

function Embedding:extra_repr()
  local s = ("%d, %d"):format(self.num_embeddings, self.embedding_dim)
  if self.padding_idx ~= nil then s = s .. ", padding_idx=" .. self.padding_idx end
  return s
end

return Embedding
