--- ddplua.distributed.fsdp.state_dict: state dicts of a fully_shard'ed model, after PyTorch's
-- torch.distributed.checkpoint.state_dict (get_model_state_dict / set_model_state_dict with
-- StateDictOptions{full_state_dict}). Reached through ddplua.distributed.fsdp:
--
--   local full = fsdp.get_model_state_dict(model, {full_state_dict = true})  -- collective
--   if dist.get_rank() == 0 then dl.save(full, "model.safetensors") end
--   local sharded = fsdp.get_sharded_state_dict(model)   -- this rank's rows, no collective
--   fsdp.set_model_state_dict(model, full)               -- every rank takes its rows
--
-- Keys are those of the unwrapped model's state_dict() (the same names, in the same order:
-- nn.state_dict_keys gives it), parameters and persistent buffers.
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local options = require "ddplua.options"
local c10d = require "ddplua.distributed.distributed_c10d"

local M = {}

-- The state_dict()'s entries {key, tensor, is_param} in its order (Note [registration
-- order] in ddplua.nn.module), with the registered tensors themselves (not detached).
local function entries(model)
  local out = {}
  local function visit(m, prefix)
    local function key(name) return prefix == "" and name or (prefix .. "." .. name) end
    local params = rawget(m, "_parameters")
    for _, name in ipairs(params.names) do
      local p = params.values[name]
      if p ~= nil then out[#out + 1] = { key(name), p, true } end
    end
    local buffers, np = rawget(m, "_buffers"), rawget(m, "_non_persistent")
    for _, name in ipairs(buffers.names) do
      local b = buffers.values[name]
      if b ~= nil and not np[name] then out[#out + 1] = { key(name), b, false } end
    end
    local mods = rawget(m, "_modules")
    for _, name in ipairs(mods.names) do
      local child = mods.values[name]
      if child then visit(child, key(name)) end
    end
  end
  visit(model, "")
  return out
end

-- The full tensor (the original shape and dtype) of an FSDPParam: an all-gather of the
-- padded shards (a collective over the param's group), the padding cut off.
local function full_tensor(fp)
  local pad = fp.padded_numel
  local input = dl.zeros({ pad }, { dtype = fp.dtype, device = fp.sharded.device })
  dl.no_grad(function() fp:copy_in(input, 0) end)
  local out = dl.empty({ pad * fp.world }, { dtype = fp.dtype, device = fp.sharded.device })
  c10d.all_gather_into_tensor(out, input, { group = fp.group })
  input:free()
  local full = dl.empty(fp.shape, { dtype = fp.dtype, device = fp.sharded.device })
  dl.no_grad(function()
    for r = 0, fp.world - 1 do
      local rows = fp:rows_of(r)
      if rows > 0 then
        local s = { rows }
        for i = 2, #fp.shape do s[i] = fp.shape[i] end
        full:narrow(1, r * fp.chunk_rows + 1, rows):copy_(out:narrow(1, r * pad + 1, rows * fp.row_numel):view(s))
      end
    end
  end)
  out:free()
  return full
end

local GET_KNOWN = options.known { "full_state_dict", "rank0_only" }

--- get_model_state_dict(model, fsdp_param_of, {full_state_dict = false, rank0_only = false})
-- -> table key -> tensor. full_state_dict: every parameter all-gathered into a new tensor of
-- its original shape (a collective: every rank of the model's groups must call it, in the
-- same order); rank0_only (with full_state_dict): ranks other than 0 take part in the
-- collectives but return an empty table (FullStateDictConfig's rank0_only). Without
-- full_state_dict: the registered tensors detached (this rank's shards; see
-- get_sharded_state_dict for their place in the whole). Buffers as the module holds them.
function M.get_model_state_dict(model, fsdp_param_of, opts)
  opts = options.check("get_model_state_dict", opts, GET_KNOWN) or {}
  local keep = not (opts.rank0_only and c10d.get_rank() ~= 0)
  local sd, gathered = {}, {}
  for _, e in ipairs(entries(model)) do
    local key, t = e[1], e[2]
    local fp = e[3] and fsdp_param_of[t]
    local v
    if fp then
      if opts.full_state_dict then
        v = gathered[fp] or full_tensor(fp)
        gathered[fp] = v
      else
        v = fp.sharded:detach()
      end
    else
      v = t:detach()
    end
    if keep then sd[key] = v end
  end
  return sd
end

--- get_sharded_state_dict(model, fsdp_param_of) -> table key -> {tensor = this rank's shard
-- (detached; (rows, ...) with rows possibly 0), global_shape = the full shape (a list),
-- offsets = where the shard starts in the full tensor (a list, 0-based element offsets per
-- dimension: {first row, 0, ...})}. Buffers and unmanaged parameters are whole: offsets all
-- 0. No collective.
function M.get_sharded_state_dict(model, fsdp_param_of)
  local sd = {}
  for _, e in ipairs(entries(model)) do
    local key, t = e[1], e[2]
    local fp = e[3] and fsdp_param_of[t]
    if fp then
      local offsets = { fp.shard_offset }
      for i = 2, #fp.shape do offsets[i] = 0 end
      local shape = {}
      for i, v in ipairs(fp.shape) do shape[i] = v end
      if fp.local_rows == 0 then offsets[1] = math.min(fp.shard_offset, fp.rows) end
      sd[key] = { tensor = fp.sharded:detach(), global_shape = shape, offsets = offsets }
    else
      local shape, offsets = t:size(), {}
      for i = 1, #shape do offsets[i] = 0 end
      sd[key] = { tensor = t:detach(), global_shape = shape, offsets = offsets }
    end
  end
  return sd
end

--- set_model_state_dict(model, fsdp_param_of, sd): load a full state dict (key -> tensor of
-- the full shape, as get_model_state_dict{full_state_dict = true} or the unwrapped model's
-- state_dict() give) into the model: each rank copies its rows into its shards; buffers are
-- copied whole. No collective. Raises naming a missing key or a shape that differs.
function M.set_model_state_dict(model, fsdp_param_of, sd)
  if type(sd) ~= "table" then lib.raise("set_model_state_dict: state_dict must be a table of tensors") end
  dl.no_grad(function()
    for _, e in ipairs(entries(model)) do
      local key, t = e[1], e[2]
      local v = sd[key]
      if v == nil then lib.raise(("set_model_state_dict: missing key '%s'"):format(key)) end
      local fp = e[3] and fsdp_param_of[t]
      local shape = fp and fp.shape or t:size()
      local given = v:size()
      local same = #given == #shape
      for i = 1, #shape do same = same and given[i] == shape[i] end
      if not same then
        lib.raise(("set_model_state_dict: '%s' has shape (%s), the model's is (%s)"):format(
          key, table.concat(given, ", "), table.concat(shape, ", ")))
      end
      if fp then
        if fp.local_rows > 0 then fp.sharded:detach():copy_(v:narrow(1, fp.shard_offset + 1, fp.local_rows)) end
      else
        t:detach():copy_(v)
      end
    end
  end)
end

return M
