--- ddplua.distributed.tensor.parallel.style: the tensor-parallel styles of PyTorch's
-- torch.distributed.tensor.parallel.style, applied by parallelize_module to one module each:
--
--   ColwiseParallel{input_layouts = Replicate(), output_layouts = Shard(-1),
--                   use_local_output = true}
--       nn.Linear: weight and bias cut by rows (Shard(1): the output features); the input
--       made Replicate; the output Shard(-1). nn.Embedding: weight cut by columns (Shard(2)).
--       ddplua's fused = k (Linear only): the output features are k equal blocks (a fused
--       q, k, v projection), each cut by rows, so every rank holds its part of each block
--       and its local output is k blocks of out/k/W features (use_local_output only).
--   RowwiseParallel{input_layouts = Shard(-1), output_layouts = Replicate(),
--                   use_local_output = true}
--       nn.Linear: weight cut by columns (Shard(2): the input features), bias replicated;
--       the input made Shard(-1), the Partial output reduced to output_layouts.
--       nn.Embedding: weight cut by rows (the vocabulary), ids replicated (input_layouts
--       default Replicate()), the Partial output reduced.
--   SequenceParallel{sequence_dim = 2, use_local_output = false}
--       nn.LayerNorm, nn.RMSNorm, nn.Dropout or any module computing position by position:
--       parameters replicated (their gradients all-reduced over the tp ranks), the input taken
--       as Shard(sequence_dim) (a plain tensor) or redistributed to it (a DTensor), the output
--       a DTensor of that placement.
--   PrepareModuleInput{input_layouts = {...}, desired_input_layouts = {...},
--                      use_local_output = false}
--   PrepareModuleOutput{output_layouts = {...}, desired_output_layouts = {...},
--                       use_local_output = true}
--       the positional inputs / outputs of any module: a plain tensor is taken with
--       input_layouts[i] (nil: left alone), then redistributed to desired_*_layouts[i].
--
-- Dimensions count from 1 (ddplua's rule): PyTorch's Shard(0) on a weight is Shard(1) here,
-- its sequence_dim = 1 is 2. Every layout is one placement (the mesh is 1-D: the tp
-- dimension). A parallelized parameter keeps its identity (the same tensor takes its local
-- piece, as Module:to does: Note [module to]), so tied weights stay tied and optimizers built
-- before still hold them; ddplua.distributed.tensor.parallel.param_spec tells its placement.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local placement_types = require "ddplua.distributed.tensor.placement_types"
local DTensor = require "ddplua.distributed.tensor.dtensor"
local ops = require "ddplua.distributed.tensor.ops"
local coll = require "ddplua.distributed.tensor._collectives"

local raise = lib.raise
local Shard, Replicate = placement_types.Shard, placement_types.Replicate

local M = {}

-- Note [parallel parameters]: what parallelize_module did to a parameter: {mesh, placements,
-- shape = the global shape, fused = k or nil}, kept by the module and the parameter's name
-- there (module_specs[module][name]: what the styles' forwards read, whatever tensor the
-- name holds at the time, as FSDP swaps shards and unsharded tensors in and out), and by the
-- tensor it was first applied to (specs[tensor]: tied parameters are cut once). Weak keys.
local specs = setmetatable({}, { __mode = "k" })
local module_specs = setmetatable({}, { __mode = "k" })
M.specs, M.module_specs = specs, module_specs

local function remember(mod, name, spec)
  module_specs[mod] = module_specs[mod] or {}
  module_specs[mod][name] = spec
end

-- Replace the data of mod's parameter `name` by this rank's piece (placement `pl`, fused
-- blocks k), once per tensor.
local function shard_param(mod, name, mesh, pl, fused, who)
  local p = mod[name]
  if p == nil then return end
  local shape = p:size()
  pl = placement_types.normalize(pl, #shape)
  local spec = specs[p]
  if spec then -- a tied parameter, already cut: the same cut or an error
    if spec.placements[1] ~= pl or spec.fused ~= fused then
      raise(("%s: a parameter shared with another parallelized module is cut as %s there, not %s")
            :format(who, tostring(spec.placements[1]), tostring(pl)))
    end
    remember(mod, name, spec)
    return
  end
  local k = mesh:get_local_rank()
  local W = mesh:size()
  local piece
  require("ddplua.functions").no_grad(function()
    if fused then
      local n = shape[pl.dim]
      if n % fused ~= 0 then raise(("%s: fused = %d does not divide dimension %d of size %d"):format(who, fused, pl.dim, n)) end
      local parts = {}
      for b = 0, fused - 1 do
        local start, len = placement_types.local_range(n / fused, W, k)
        parts[#parts + 1] = p:narrow(pl.dim, b * (n / fused) + start + 1, len)
      end
      piece = require("ddplua.functions").cat(parts, pl.dim)
    else
      local start, len = placement_types.local_range(shape[pl.dim], W, k)
      piece = p:narrow(pl.dim, start + 1, len):clone()
    end
  end)
  local g = p.grad
  lib.check(lib.C.ddp_tensor_set_data(p, piece))
  if g ~= nil then p.grad = nil end
  specs[p] = { mesh = mesh, placements = { pl }, shape = shape, fused = fused }
  remember(mod, name, specs[p])
end

-- mod's parameter `name` (the tensor it holds now) as a DTensor: its spec from shard_param,
-- or Replicate.
local function param_dt(mod, name, mesh)
  local p = mod[name]
  if p == nil then return nil end
  local spec = module_specs[mod] and module_specs[mod][name]
  if spec then return DTensor.from_local(p, mesh, spec.placements, { shape = spec.shape }) end
  return DTensor.from_local(p, mesh, { Replicate() })
end
M.param_dt = param_dt

-- x as a DTensor laid out `layout` (a plain tensor taken as that layout), redistributed to
-- `desired` when given.
local function to_dt(x, mesh, layout, desired)
  if not DTensor.is_dtensor(x) then x = DTensor.from_local(x, mesh, { layout }) end
  if desired and x.placements[1] ~= placement_types.normalize(desired, x:dim()) then
    x = x:redistribute(mesh, { desired })
  end
  return x
end

local function finish(y, mesh, layout, use_local)
  if layout then y = to_dt(y, mesh, layout, layout) end
  if use_local and DTensor.is_dtensor(y) then return y:to_local() end
  return y
end

-- Replace mod's forward by fn(self, original_forward, ...), in a class of its own (so other
-- instances of the class are untouched).
local function wrap_forward(mod, fn)
  local cls = getmetatable(mod)
  local original = cls.forward
  local sub = cls:extend(cls.__name)
  sub.forward = function(self, ...) return fn(self, original, ...) end
  setmetatable(mod, sub)
end

local function check_placement(v, what, style)
  if v ~= nil and not placement_types.is_placement(v) then
    raise(("%s: %s must be a placement (Shard(d), Replicate(), Partial()), got %s"):format(style, what, tostring(v)))
  end
  return v
end

local Style = {}
Style.__index = Style

local COLWISE = options.known { "input_layouts", "output_layouts", "use_local_output", "fused" }
--- ColwiseParallel(opts) -> a style (see the top of this file).
function M.ColwiseParallel(opts)
  opts = options.check("ColwiseParallel", opts, COLWISE)
  local s = setmetatable({ name = "ColwiseParallel",
    input_layouts = check_placement(opts.input_layouts, "input_layouts", "ColwiseParallel") or Replicate(),
    output_layouts = check_placement(opts.output_layouts, "output_layouts", "ColwiseParallel") or Shard(-1),
    use_local_output = opts.use_local_output ~= false, fused = opts.fused }, Style)
  if s.fused and not s.use_local_output then
    raise("ColwiseParallel: fused blocks give a local output only (use_local_output = false is not supported)")
  end
  s.apply = function(self, mod, mesh)
    local kind = mod:_get_name()
    if kind == "Linear" then
      shard_param(mod, "weight", mesh, Shard(1), self.fused, "ColwiseParallel")
      shard_param(mod, "bias", mesh, Shard(1), self.fused, "ColwiseParallel")
      wrap_forward(mod, function(m, _, x)
        local xd = to_dt(x, mesh, self.input_layouts, Replicate())
        if self.fused then -- local blocks: the input's gradient summed over the ranks
          local lx = coll.copy(xd:to_local(), mesh:get_group())
          return require("ddplua.functions").linear(lx, m.weight, m.bias)
        end
        return finish(ops.linear(xd, param_dt(m, "weight", mesh), param_dt(m, "bias", mesh)), mesh,
          self.output_layouts, self.use_local_output)
      end)
    elseif kind == "Embedding" then
      if self.fused then raise("ColwiseParallel: fused applies to nn.Linear only") end
      shard_param(mod, "weight", mesh, Shard(2), nil, "ColwiseParallel")
      wrap_forward(mod, function(m, _, ids)
        local y = ops.embedding(to_dt(ids, mesh, self.input_layouts, Replicate()), param_dt(m, "weight", mesh),
          { padding_idx = m.padding_idx })
        return finish(y, mesh, self.output_layouts, self.use_local_output)
      end)
    else
      raise("ColwiseParallel: applies to nn.Linear and nn.Embedding, got " .. kind)
    end
  end
  return s
end

local ROWWISE = options.known { "input_layouts", "output_layouts", "use_local_output" }
--- RowwiseParallel(opts) -> a style (see the top of this file).
function M.RowwiseParallel(opts)
  opts = options.check("RowwiseParallel", opts, ROWWISE)
  local s = setmetatable({ name = "RowwiseParallel",
    input_layouts = check_placement(opts.input_layouts, "input_layouts", "RowwiseParallel"),
    output_layouts = check_placement(opts.output_layouts, "output_layouts", "RowwiseParallel") or Replicate(),
    use_local_output = opts.use_local_output ~= false }, Style)
  s.apply = function(self, mod, mesh)
    local kind = mod:_get_name()
    if kind == "Linear" then
      shard_param(mod, "weight", mesh, Shard(2), nil, "RowwiseParallel")
      wrap_forward(mod, function(m, _, x)
        local xd = to_dt(x, mesh, self.input_layouts or Shard(-1), Shard(-1))
        local y = ops.linear(xd, param_dt(m, "weight", mesh), param_dt(m, "bias", mesh))
        return finish(y, mesh, self.output_layouts, self.use_local_output)
      end)
    elseif kind == "Embedding" then
      shard_param(mod, "weight", mesh, Shard(1), nil, "RowwiseParallel")
      wrap_forward(mod, function(m, _, ids)
        local y = ops.embedding(to_dt(ids, mesh, self.input_layouts or Replicate(), Replicate()),
          param_dt(m, "weight", mesh), { padding_idx = m.padding_idx })
        return finish(y, mesh, self.output_layouts, self.use_local_output)
      end)
    else
      raise("RowwiseParallel: applies to nn.Linear and nn.Embedding, got " .. kind)
    end
  end
  return s
end

local SEQUENCE = options.known { "sequence_dim", "use_local_output" }
--- SequenceParallel(opts) -> a style (see the top of this file).
function M.SequenceParallel(opts)
  opts = options.check("SequenceParallel", opts, SEQUENCE)
  local s = setmetatable({ name = "SequenceParallel", sequence_dim = opts.sequence_dim or 2,
    use_local_output = opts.use_local_output == true }, Style)
  s.apply = function(self, mod, mesh)
    local kind = mod:_get_name()
    local run
    if kind == "Dropout" then -- the whole tensor's mask, each rank its piece (Note [DTensor dropout])
      run = function(m, _, x) return ops.dropout(x, m.p, { training = m.training, generator = m.generator }) end
    else
      -- Any other module computing position by position (LayerNorm, RMSNorm, activations):
      -- its forward on this rank's piece, each parameter through a copy whose gradient is
      -- all-reduced over the tp ranks (each holds the gradient of its positions only: Note
      -- [DTensor gradients]).
      run = function(m, original, x)
        local params = rawget(m, "_parameters")
        local saved = {}
        for _, name in ipairs(params.names) do
          local p = params.values[name]
          if p ~= nil then
            saved[name] = p
            params.values[name] = coll.copy(p, mesh:get_group())
          end
        end
        local ok, y = pcall(original, m, x:to_local())
        for name, p in pairs(saved) do params.values[name] = p end
        if not ok then error(y, 0) end
        local shape = y:dim() == x:dim() and x:size() or nil
        return DTensor.from_local(y, mesh, x.placements, shape and { shape = shape } or nil)
      end
    end
    wrap_forward(mod, function(m, original, x)
      local seq = Shard(self.sequence_dim)
      local xd = to_dt(x, mesh, seq, seq)
      return finish(run(m, original, xd), mesh, nil, self.use_local_output)
    end)
  end
  return s
end

local function layouts(v, what, style)
  if v == nil then return {} end
  if placement_types.is_placement(v) then return { v } end
  if type(v) ~= "table" then raise(("%s: %s must be a placement or a list of them"):format(style, what)) end
  return v
end

-- The values of a list of tensors converted per position.
local function convert_all(values, n, mesh, from, to, use_local)
  for i = 1, n do
    local v = values[i]
    if from[i] ~= nil and (require("ddplua.functions").is_tensor(v) or DTensor.is_dtensor(v)) then
      v = to_dt(v, mesh, from[i], to[i])
      if use_local then v = v:to_local() end
      values[i] = v
    end
  end
  return values
end

-- The two layout lists of PrepareModuleInput / PrepareModuleOutput, of equal length.
local function layout_lists(opts, from_key, to_key, style)
  local from, to = layouts(opts[from_key], from_key, style), layouts(opts[to_key], to_key, style)
  if #from ~= #to then
    raise(("%s: %s and %s should have same length! (%d and %d)"):format(style, from_key, to_key, #from, #to))
  end
  return from, to
end

local PREP_IN = options.known { "input_layouts", "desired_input_layouts", "use_local_output" }
--- PrepareModuleInput(opts) -> a style (see the top of this file).
function M.PrepareModuleInput(opts)
  opts = options.check("PrepareModuleInput", opts, PREP_IN)
  local from, to = layout_lists(opts, "input_layouts", "desired_input_layouts", "PrepareModuleInput")
  local s = setmetatable({ name = "PrepareModuleInput" }, Style)
  s.apply = function(_, mod, mesh)
    wrap_forward(mod, function(m, original, ...)
      local n = select("#", ...)
      local args = convert_all({ ... }, n, mesh, from, to, opts.use_local_output == true)
      return original(m, unpack(args, 1, n))
    end)
  end
  return s
end

local PREP_OUT = options.known { "output_layouts", "desired_output_layouts", "use_local_output" }
--- PrepareModuleOutput(opts) -> a style (see the top of this file).
function M.PrepareModuleOutput(opts)
  opts = options.check("PrepareModuleOutput", opts, PREP_OUT)
  local from, to = layout_lists(opts, "output_layouts", "desired_output_layouts", "PrepareModuleOutput")
  local s = setmetatable({ name = "PrepareModuleOutput" }, Style)
  s.apply = function(_, mod, mesh)
    wrap_forward(mod, function(m, original, ...)
      local outs = { original(m, ...) }
      return unpack(convert_all(outs, math.max(#outs, #from), mesh, from, to, opts.use_local_output ~= false),
        1, math.max(#outs, 1))
    end)
  end
  return s
end

--- is_style(v) -> true for a value made by the constructors above.
function M.is_style(v) return getmetatable(v) == Style end

return M
