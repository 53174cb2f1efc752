--- ddplua.distributed.checkpoint: distributed checkpoints, after torch.distributed.checkpoint
-- (DCP): every rank writes its own pieces, one metadata file says where each piece of each
-- tensor lies, and loading onto any world size or mesh reads the pieces each rank needs.
--
--   local dcp = require "ddplua.distributed.checkpoint"
--   dcp.save(dcp.get_model_state_dict(model), {checkpoint_id = "ckpt/step_100"})
--   dcp.load(dcp.get_model_state_dict(model2), {checkpoint_id = "ckpt/step_100"})  -- in place
--
-- Note [DCP layout]: a checkpoint is a folder. `__<rank>_0.safetensors` holds the pieces rank
-- <rank> wrote, one safetensors tensor per piece, named "<name>" for a whole tensor and
-- "<name>@<o1>,<o2>,..." for the piece at those 0-based offsets; `.metadata` is a
-- safetensors file without tensors whose __metadata__ "dcp" is the JSON plan: per tensor
-- name its global shape, dtype and chunks {file, key, offsets, lengths}. Every file is
-- written atomically (temporary file, fsync, rename), the metadata last, by rank 0, after
-- every rank wrote its pieces: a folder with a `.metadata` is complete. Values of the state
-- dict: a plain tensor is taken as the same on every rank and offered by rank 0; a DTensor
-- offers its local piece (a Partial one is reduced first) from the rank at coordinate 0 of
-- every mesh dimension it is replicated on; {pieces, shape} (get_model_state_dict's form of
-- FSDP shards and tensor-parallel pieces) offers its regions from every rank. The ranks exchange what they offer
-- (all_gather_object) and each chunk is written once, by the lowest rank offering it
-- (replicas the DTensor's mesh does not show, such as the dp ranks of a tensor-parallel
-- model, offer the same chunk), as PyTorch's DCP deduplicates its save plans. Loading copies into the given state dict's tensors (in place, no_grad)
-- the part of each saved chunk that overlaps this rank's piece, so the saving and the
-- loading layouts are independent.
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local checkpoint = require "ddplua.checkpoint"
local options = require "ddplua.options"
local DTensor = require "ddplua.distributed.tensor.dtensor"
local placement_types = require "ddplua.distributed.tensor.placement_types"

local raise = lib.raise

local M = {}

local function dist() return require "ddplua.distributed.distributed_c10d" end

local function rank_and_world(group)
  local d = dist()
  if not d.is_initialized() then return 0, 1 end
  return d.get_rank(group), d.get_world_size(group)
end

local function sorted_names(sd, op)
  if type(sd) ~= "table" then raise(op .. ": state_dict must be a table name -> tensor or DTensor, got " .. type(sd)) end
  local names = {}
  for k, v in pairs(sd) do
    if type(k) ~= "string" then raise(op .. ": state_dict keys must be strings, got " .. type(k)) end
    if not dl.is_tensor(v) and not DTensor.is_dtensor(v) and not (type(v) == "table" and rawget(v, "pieces")) then
      raise(("%s: state_dict['%s'] must be a tensor or a DTensor, got %s"):format(op, k, type(v)))
    end
    names[#names + 1] = k
  end
  table.sort(names)
  return names
end

-- The regions of the global tensor that this rank holds of state dict value v, each
-- {offsets (0-based), lengths, tensor (the local view holding it)}, and whether this rank
-- offers them (Note [DCP layout]). v: a tensor (one region, the whole; rank 0 offers it), a
-- DTensor (its piece), or {pieces = {regions}, shape = global shape} (what
-- get_model_state_dict makes of FSDP shards and tensor-parallel pieces; every rank offers).
local function regions_of(v, rank)
  if dl.is_tensor(v) then
    local offsets = {}
    for d = 1, v:dim() do offsets[d] = 0 end
    return { { offsets = offsets, lengths = v:size(), tensor = v } }, rank == 0
  end
  if not DTensor.is_dtensor(v) then return v.pieces, true end
  local mesh, shape = v.device_mesh, v:size()
  local coord = mesh:get_coordinate()
  local offsets, lengths, writer = {}, { unpack(shape) }, true
  for d = 1, #shape do offsets[d] = 0 end
  for i, p in ipairs(v.placements) do -- Note [nested shards]: mesh dimension order
    if p.kind == "shard" then
      local start, len = placement_types.local_range(lengths[p.dim], mesh.shape[i], coord[i])
      offsets[p.dim] = offsets[p.dim] + start
      lengths[p.dim] = len
    elseif coord[i] ~= 0 then
      writer = false -- a replica: the rank at coordinate 0 offers it
    end
  end
  return { { offsets = offsets, lengths = lengths, tensor = v:to_local() } }, writer
end

local function global_shape(v)
  if dl.is_tensor(v) or DTensor.is_dtensor(v) then return v:size() end
  return { unpack(v.shape) }
end

local function file_name(rank) return ("__%d_0.safetensors"):format(rank) end

-- v with every Partial placement reduced (a DTensor); other values as they are.
local function without_partial(v)
  if not DTensor.is_dtensor(v) then return v end
  local want, change = {}, false
  for i, p in ipairs(v.placements) do
    want[i] = p
    if p.kind == "partial" then want[i], change = placement_types.Replicate(), true end
  end
  return change and v:redistribute(v.device_mesh, want) or v
end

local SAVE = options.known { "checkpoint_id", "process_group" }

-- The first part of a save, collective: check the arguments, agree on who writes which
-- chunk (Note [DCP layout]). Returns the plan: dir, group, rank, world, names, owned (every
-- chunk with its writer), mine (this rank's chunks: key -> tensor, the model's views).
local function plan_save(state_dict, opts, op)
  opts = options.check(op, opts, SAVE)
  local dir = opts.checkpoint_id
  if type(dir) ~= "string" or dir == "" then raise(op .. ": checkpoint_id must be a folder path") end
  local group = opts.process_group
  local rank, world = rank_and_world(group)
  local names = sorted_names(state_dict, op)
  require("ddplua.os").mkdir_p(dir)
  local local_chunks, plan = {}, {}
  for _, name in ipairs(names) do
    local v = without_partial(state_dict[name])
    local regions, writer = regions_of(v, rank)
    if writer then
      for _, r in ipairs(regions) do
        local key = dl.is_tensor(v) and name or (name .. "@" .. table.concat(r.offsets, ","))
        local_chunks[key] = r.tensor
        plan[#plan + 1] = { name = name, key = key, offsets = r.offsets, lengths = r.lengths,
          shape = global_shape(v), dtype = r.tensor.dtype }
      end
    end
  end
  local plans = { plan }
  if world > 1 then
    plans = {}
    require("ddplua.distributed.objects").all_gather_object(plans, plan, { group = group })
  end
  -- Each chunk is written once, by the lowest rank that holds it: replicas a DTensor's mesh
  -- does not show (the dp ranks of a tensor-parallel model) offer the same chunk.
  local owner, owned = {}, {}
  for r, p in ipairs(plans) do
    for _, c in ipairs(p) do
      local id = c.key .. "/" .. table.concat(c.lengths, ",")
      if not owner[id] then
        owner[id] = r - 1
        owned[#owned + 1] = { rank = r - 1, chunk = c }
      end
    end
  end
  local mine = {}
  for _, o in ipairs(owned) do
    if o.rank == rank then
      local t = local_chunks[o.chunk.key]
      mine[o.chunk.key] = dl.no_grad(function() return t:detach():contiguous() end)
    end
  end
  return { dir = dir, group = group, rank = rank, world = world, names = names, owned = owned, mine = mine,
    file = dir .. "/" .. file_name(rank) }
end

-- The last part of a save, collective: once every rank wrote its file, rank 0 writes the
-- metadata; returns when it is on disk.
local function finish_save(p)
  if p.world > 1 then dist().barrier({ group = p.group }) end -- every piece is on disk
  if p.rank == 0 then
    local meta = {}
    for _, o in ipairs(p.owned) do
      local c = o.chunk
      local m = meta[c.name]
      if not m then
        m = { shape = c.shape, dtype = c.dtype, chunks = {} }
        meta[c.name] = m
      end
      m.chunks[#m.chunks + 1] = { file = file_name(o.rank), key = c.key, offsets = c.offsets, lengths = c.lengths }
    end
    for _, name in ipairs(p.names) do
      if not meta[name] then raise(("dcp.save: no rank wrote a piece of '%s'"):format(name)) end
    end
    checkpoint.save(p.dir .. "/.metadata", {}, { dcp = { version = 1, world_size = p.world, tensors = meta } })
  end
  if p.world > 1 then dist().barrier({ group = p.group }) end
end

--- dcp.save(state_dict, {checkpoint_id = DIR, process_group = }) -> nil: write state_dict
-- (name -> tensor, DTensor, or what get_model_state_dict gives) to the folder DIR (created)
-- as Note [DCP layout] says. Collective over process_group (default: the world; without a
-- process group, one process writes everything): every rank calls it with the same names.
-- Returns when the whole checkpoint is written (its .metadata last). Raises naming the
-- tensor or the file.
function M.save(state_dict, opts)
  local p = plan_save(state_dict, opts, "dcp.save")
  if next(p.mine) then checkpoint.save(p.file, p.mine, nil) end
  finish_save(p)
end

--- dcp.async_save(state_dict, opts) -> a Future (ddplua.futures), as PyTorch's
-- dist.checkpoint.async_save: the ranks agree on the chunks now (a collective), each rank's
-- chunks are copied and written on a thread of its own (checkpoint.save_async, Note [async
-- save snapshot]) while training goes on, and fut:wait() (every rank must call it, before
-- the next save) waits for the write and then has rank 0 write the metadata (collective).
-- The checkpoint is complete when wait returns. Errors of the write are raised by wait.
function M.async_save(state_dict, opts)
  local p = plan_save(state_dict, opts, "dcp.async_save")
  local pending = next(p.mine) and checkpoint.save_async(p.file, p.mine, nil) or nil
  p.mine = nil -- the write holds its own copies
  local finished = false
  local work = {
    wait = function(_, timeout)
      if finished then return end
      if pending then pending:wait(timeout) end
      finish_save(p)
      finished = true
    end,
    is_completed = function() return finished or pending == nil or pending:done() end,
  }
  return require("ddplua.futures").from_work(work, p.dir)
end

--- dcp.read_metadata(dir) -> the plan of Note [DCP layout]: {world_size =, tensors = {name =
-- {shape, dtype, chunks}}}. Raises naming the folder when it holds no complete checkpoint.
function M.read_metadata(dir)
  local f = io.open(dir .. "/.metadata", "rb")
  if not f then raise(("dcp.load: %s holds no checkpoint (no .metadata: not written, or the save did not finish)"):format(dir)) end
  f:close()
  local _, meta = checkpoint.load(dir .. "/.metadata")
  if type(meta) ~= "table" or type(meta.dcp) ~= "table" or type(meta.dcp.tensors) ~= "table" then
    raise(("dcp.load: %s/.metadata is not a ddplua distributed checkpoint's metadata"):format(dir))
  end
  return meta.dcp
end

-- Copy into `dst` (lengths `dl_len` at offsets `d_off` of the global tensor) the overlap of
-- the chunk `src` (at c_off, c_len); returns the number of elements copied.
local function copy_overlap(dst, d_off, d_len, src, c_off, c_len)
  local a, b = dst, src
  local count = 1
  for d = 1, #d_off do
    local lo = math.max(d_off[d], c_off[d])
    local hi = math.min(d_off[d] + d_len[d], c_off[d] + c_len[d])
    if hi <= lo then return 0 end
    a = a:narrow(d, lo - d_off[d] + 1, hi - lo)
    b = b:narrow(d, lo - c_off[d] + 1, hi - lo)
    count = count * (hi - lo)
  end
  a:copy_(b)
  return count
end

local LOAD = options.known { "checkpoint_id", "process_group" }

--- dcp.load(state_dict, {checkpoint_id = DIR}) -> state_dict, its tensors (and DTensors'
-- local tensors) overwritten in place with the saved values of their pieces, whatever the
-- world size, mesh or placements the checkpoint was saved with (Note [DCP layout]). Every
-- name of state_dict must be in the checkpoint with the same global shape. Needs no
-- process group (no collectives). Raises naming the tensor and the folder for a missing
-- name, another shape, or a piece no saved chunk covers.
function M.load(state_dict, opts)
  opts = options.check("dcp.load", opts, LOAD)
  local dir = opts.checkpoint_id
  if type(dir) ~= "string" or dir == "" then raise("dcp.load: checkpoint_id must be a folder path") end
  local meta = M.read_metadata(dir)
  local rank = rank_and_world(opts.process_group)
  local files = {}
  local function chunk(file, key)
    if not files[file] then files[file] = checkpoint.load(dir .. "/" .. file) end
    local t = files[file][key]
    if not t then raise(("dcp.load: %s/%s has no tensor '%s' (the metadata names it)"):format(dir, file, key)) end
    return t
  end
  dl.no_grad(function()
    for _, name in ipairs(sorted_names(state_dict, "dcp.load")) do
      local v = state_dict[name]
      local m = meta.tensors[name]
      if not m then raise(("dcp.load: '%s' is not in the checkpoint %s"):format(name, dir)) end
      local shape = global_shape(v)
      if table.concat(shape, ",") ~= table.concat(m.shape, ",") then
        raise(("dcp.load: '%s' has shape (%s) but the checkpoint %s holds (%s)"):format(name,
          table.concat(shape, ", "), dir, table.concat(m.shape, ", ")))
      end
      for _, r in ipairs((regions_of(v, rank))) do
        local want, got = 1, 0
        for _, n in ipairs(r.lengths) do want = want * n end
        for _, c in ipairs(m.chunks) do
          got = got + copy_overlap(r.tensor, r.offsets, r.lengths, chunk(c.file, c.key), c.offsets, c.lengths)
        end
        if got ~= want then
          raise(("dcp.load: the chunks of '%s' in %s cover %d of the %d elements this rank needs"):format(name, dir,
            got, want))
        end
      end
    end
  end)
  return state_dict
end

-- The regions of the global tensor held by `t`, the piece at `offsets` (0-based) of this
-- rank's tensor-parallel piece (shape local_shape) of a parameter cut as `spec` says (nil:
-- not cut, the piece lies in the whole tensor).
local function tp_regions(t, offsets, spec)
  if not spec then return { { offsets = offsets, lengths = t:size(), tensor = t } } end
  local d = spec.placements[1].dim
  local k = spec.fused or 1
  local n = spec.shape[d] / k -- the size of a block along d (the whole dimension when not fused)
  local start, len = placement_types.local_range(n, spec.mesh:size(), spec.mesh:get_local_rank())
  local size = t:size()
  local lo_t, hi_t = offsets[d], offsets[d] + size[d] -- t's rows of this rank's piece along d
  local out = {}
  for j = 0, k - 1 do -- block j: rows [j len, (j+1) len) of the piece, [j n + start, ...) globally
    local lo, hi = math.max(lo_t, j * len), math.min(hi_t, (j + 1) * len)
    if hi > lo then
      local o, l = { unpack(offsets) }, { unpack(size) }
      o[d], l[d] = j * n + start + (lo - j * len), hi - lo
      out[#out + 1] = { offsets = o, lengths = l, tensor = t:narrow(d, lo - lo_t + 1, hi - lo) }
    end
  end
  return out
end

--- dcp.get_model_state_dict(model) -> name -> what save writes and load fills for model: its
-- state dict, with each parameter that tensor parallelism (ddplua.distributed.tensor.parallel)
-- or fully_shard (ddplua.distributed.fsdp) cut given as this rank's regions of the whole
-- tensor (FSDP's rows of a tensor-parallel piece, a fused projection's blocks: any
-- combination). The tensors share the model's data (load writes into the model).
function M.get_model_state_dict(model)
  local parallel = require "ddplua.distributed.tensor.parallel"
  local fsdp = require "ddplua.distributed.fsdp"
  local specs = parallel.specs_by_name(model)
  local shards = fsdp.is_fsdp_module(model) and fsdp.get_sharded_state_dict(model) or {}
  local out = {}
  for name, t in pairs(model:state_dict()) do
    local spec, shard = specs[name], shards[name]
    local managed = shard and shard.offsets and table.concat(shard.global_shape, ",") ~= table.concat(shard.tensor:size(), ",")
    if not spec and not managed then
      out[name] = t
    else
      local piece, offsets = t, {}
      for d = 1, t:dim() do offsets[d] = 0 end
      local shape = t:size()
      if managed then piece, offsets, shape = shard.tensor, { unpack(shard.offsets) }, { unpack(shard.global_shape) } end
      out[name] = { pieces = tp_regions(piece, offsets, spec), shape = spec and { unpack(spec.shape) } or shape }
    end
  end
  return out
end

--- dcp.dcp_to_safetensors(dir, path) -> nil: the checkpoint in folder dir as one
-- safetensors file of whole tensors at path (what `ddplua verify`, checkpoint.load and
-- PyTorch's safetensors read), as PyTorch's format_utils.dcp_to_torch_save. One process;
-- raises as load.
function M.dcp_to_safetensors(dir, path)
  local meta = M.read_metadata(dir)
  local whole = {}
  for name, m in pairs(meta.tensors) do whole[name] = dl.zeros(m.shape, { dtype = m.dtype }) end
  M.load(whole, { checkpoint_id = dir })
  checkpoint.save(path, whole, nil)
end

--- dcp.safetensors_to_dcp(path, dir) -> nil: a safetensors file of whole tensors as a
-- distributed checkpoint (PyTorch's format_utils.torch_save_to_dcp). Collective as save when
-- a process group exists.
function M.safetensors_to_dcp(path, dir)
  local tensors = checkpoint.load(path)
  M.save(tensors, { checkpoint_id = dir })
end

return M
