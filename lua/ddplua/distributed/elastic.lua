--- ddplua.distributed.elastic: the training state of an elastic job, as Horovod's
-- hvd.elastic.State (commit / restore / sync), for workers started by the elastic launcher
-- (`ddplua --nnodes=MIN:MAX ...`, README "Elastic training").
--
--   local elastic = require "ddplua.distributed.elastic"
--   dist.init_process_group()
--   local sampler = DistributedSampler(train_ds)
--   local state = elastic.State { model = model, optimizer = opt, sampler = sampler,
--                                 epoch = 0, step = 0, path = "ckpt/elastic.safetensors" }
--   state:sync()                          -- the latest commit, on every rank
--   for epoch = state.epoch, epochs - 1 do
--     state.epoch = epoch
--     sampler:set_epoch(epoch)            -- a resumed epoch keeps its position
--     for x, y in loader:iter() do
--       ... forward, backward, opt:step() ...
--       sampler:record_batch(x:size(1)); state.step = state.step + 1
--       if state.step % 10 == 0 then state:commit() end
--     end
--     state:commit()
--   end
--
-- Note [elastic state]: the launcher restarts the workers of every node whenever the
-- membership changes or a worker fails (Note [elastic rendezvous] in
-- runtime/cli/rendezvous.c), so what a worker held in memory is gone after a restart, unlike
-- Horovod, whose workers live on. A commit therefore keeps the state twice: in memory (for
-- restore(), after an error the script caught) and, on rank 0 when `path` is given, in a
-- safetensors file written atomically (checkpoint.save: temporary file, fsync, rename), so
-- a crash mid-write leaves the previous commit whole. Each commit has a serial number (1,
-- 2, ...). sync() finds the newest commit any rank holds (in memory, or in the file as
-- that rank sees it: a shared file system, or rank 0's node), lets the lowest rank holding
-- it load it, and broadcasts it to every rank: model parameters and buffers, optimizer
-- state, epoch, step and the sampler's position (Note [elastic resume] in sampler.lua), so
-- the epoch goes on where the commit left it, split over the new world size. Steps trained
-- after the last commit are lost and trained again: commit as often as a rollback may cost.
-- With no commit anywhere, sync() broadcasts rank 0's state (all ranks start equal).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local fn = require "ddplua.functions"
local tensor = require "ddplua.tensor"
local checkpoint = require "ddplua.checkpoint"
local objects = require "ddplua.distributed.objects"
local dist = require "ddplua.distributed.distributed_c10d"

local M = {}

local State = {}
State.__index = State

local FORMAT = "ddplua.elastic/1"
local KNOWN = options.known { "model", "optimizer", "sampler", "epoch", "step", "path" }

-- Copies of the tensors inside a (nested) table; other values as they are.
local function deep_copy(v)
  if tensor.is_tensor(v) then return v:clone() end
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deep_copy(x) end
  return out
end

-- v with every tensor replaced by {["$t"] = i, shape, dtype}, the tensors in `list`.
local function skeleton(v, list)
  if tensor.is_tensor(v) then
    list[#list + 1] = v:contiguous()
    return { ["$t"] = #list, shape = v:size(), dtype = v:type() }
  end
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = skeleton(x, list) end
  return out
end

-- The inverse of skeleton: placeholders replaced by list[i] (or, without a list, by new
-- zero tensors of their shape and dtype, appended to `made`).
local function flesh(v, list, made)
  if type(v) ~= "table" then return v end
  if v["$t"] then
    if list then return list[v["$t"]] end
    local t = fn.zeros(v.shape, { dtype = v.dtype })
    made[v["$t"]] = t
    return t
  end
  local out = {}
  for k, x in pairs(v) do out[k] = flesh(x, list, made) end
  return out
end

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end
local function unhex(h) return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end

local function rank()
  if dist.is_initialized() then return dist.get_rank() end
  return tonumber(os.getenv("RANK")) or 0
end

--- elastic.State(opts) -> state. opts.model (nn.Module), opts.optimizer (an optimizer with
-- state_dict / load_state_dict), opts.sampler (a DistributedSampler, Note [elastic
-- resume]), opts.epoch and opts.step (numbers, default 0: the loop updates state.epoch and
-- state.step), opts.path (where rank 0 writes each commit; nil: memory only). Every field
-- is optional. Raises for unknown options.
function M.State(opts)
  opts = options.check("elastic.State", opts, KNOWN)
  if opts.path ~= nil then lib.path(opts.path, "elastic.State: path") end
  return setmetatable({
    model = opts.model, optimizer = opts.optimizer, sampler = opts.sampler,
    epoch = opts.epoch or 0, step = opts.step or 0, path = opts.path,
    serial = 0,      -- the commit this state is at (0: none)
    snapshot = nil,  -- the last commit in memory
  }, State)
end

-- The state as tensors and a plain table (what a commit, the file and sync carry).
function State:_capture()
  local plain = { epoch = self.epoch, step = self.step, serial = self.serial }
  if self.sampler then plain.sampler = self.sampler:state_dict() end
  local model = {}
  if self.model then
    for name, t in pairs(self.model:state_dict()) do model[name] = t:clone() end
  end
  if self.optimizer then plain.optimizer = self.optimizer:state_dict() end
  return model, plain
end

-- Put a captured state into the live objects.
function State:_apply(model, plain)
  if self.model then self.model:load_state_dict(model) end
  if self.optimizer and plain.optimizer then self.optimizer:load_state_dict(deep_copy(plain.optimizer)) end
  if self.sampler and plain.sampler then self.sampler:load_state_dict(plain.sampler) end
  self.epoch, self.step, self.serial = plain.epoch, plain.step, plain.serial
end

--- state:commit(): the state as it is now becomes the one restore() and sync() go back to:
-- copied in memory and, on rank 0 with a path, written to the file atomically (Note
-- [elastic state]). Raises when the file cannot be written (naming it).
function State:commit()
  self.serial = self.serial + 1
  local model, plain = self:_capture()
  self.snapshot = { model = model, plain = plain }
  if self.path and rank() == 0 then
    local tensors = {}
    for name, t in pairs(model) do tensors["model." .. name] = t end
    local opt_tensors = {}
    local meta = {
      format = FORMAT, serial = plain.serial, epoch = plain.epoch, step = plain.step,
      sampler_epoch = plain.sampler and plain.sampler.epoch, sampler_processed = plain.sampler and plain.sampler.processed,
      optimizer = plain.optimizer and hex(objects.encode(skeleton(plain.optimizer, opt_tensors), "elastic.State:commit")),
    }
    for i, t in ipairs(opt_tensors) do tensors["optimizer." .. i] = t end
    checkpoint.save(self.path, tensors, meta)
  end
end

--- state:restore(): back to the last commit in memory (model, optimizer, sampler, epoch,
-- step), as Horovod's State.restore after a failed step. Raises when nothing was committed
-- in this process.
function State:restore()
  if not self.snapshot then lib.raise("elastic.State:restore: nothing was committed in this process") end
  self:_apply(self.snapshot.model, deep_copy(self.snapshot.plain))
end

-- The commit in the file (model tensors, plain table), or nil when there is none.
function State:_read_file()
  if not self.path then return nil end
  local f = io.open(self.path, "rb")
  if not f then return nil end
  f:close()
  local tensors, meta = checkpoint.load(self.path)
  if meta.format ~= FORMAT then
    lib.raise(self.path .. ": not an elastic state commit (format " .. tostring(meta.format) .. ")")
  end
  local model, opt_tensors = {}, {}
  for name, t in pairs(tensors) do
    local plain_name = name:match("^model%.(.*)$")
    if plain_name then model[plain_name] = t end
    local i = name:match("^optimizer%.(%d+)$")
    if i then opt_tensors[tonumber(i)] = t end
  end
  local plain = { epoch = meta.epoch, step = meta.step, serial = meta.serial }
  if meta.sampler_epoch then plain.sampler = { epoch = meta.sampler_epoch, processed = meta.sampler_processed } end
  if meta.optimizer then
    local bytes = unhex(meta.optimizer)
    local p = require("ffi").cast("const uint8_t *", bytes)
    plain.optimizer = flesh(objects.decode(p, #bytes, "elastic.State:sync"), opt_tensors)
  end
  return model, plain
end

-- The serial of the commit in the file (0: none), reading only what it must.
function State:_file_serial()
  if not self.path then return 0 end
  local ok, model, plain = pcall(self._read_file, self)
  if not ok or not model then return 0 end
  return plain.serial or 0
end

--- state:sync() -> state: every rank takes the newest commit held by any rank (Note
-- [elastic state]), broadcast from the lowest rank that holds it: model parameters and
-- buffers (in place), optimizer state, epoch, step and the sampler's position. Collective:
-- every rank of the default group calls it. Raises before init_process_group, and when a
-- rank's model or optimizer does not take the state (naming what differs).
function State:sync()
  if not dist.is_initialized() then lib.raise("elastic.State:sync: call dist.init_process_group first") end
  local me = dist.get_rank()
  local held = {}
  objects.all_gather_object(held, { memory = self.serial, file = self:_file_serial() })
  local best, src = 0, 0
  for r = 0, #held - 1 do
    local h = held[r + 1]
    local s = math.max(h.memory, h.file)
    if s > best then best, src = s, r end
  end
  if me == src and best > 0 then
    if self.serial == best and self.snapshot then
      self:restore()
    elseif held[me + 1].file == best then
      self:_apply(self:_read_file())
    end
  end
  -- the model in place, tensor by tensor in name order
  if self.model then
    local sd = self.model:state_dict()
    local names = {}
    for name in pairs(sd) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do dist.broadcast(sd[name], src) end
  end
  -- everything else: a plain table, then the optimizer's tensors
  local _, plain = self:_capture()
  local list = {}
  local msg = { skeleton(plain, list) }
  objects.broadcast_object_list(msg, src)
  local made = {}
  local got = me == src and plain or flesh(msg[1], nil, made)
  local carried = me == src and list or made -- the optimizer's tensors, in skeleton order
  for i = 1, #carried do dist.broadcast(carried[i], src) end
  if me ~= src then
    if self.optimizer and got.optimizer then self.optimizer:load_state_dict(got.optimizer) end
    if self.sampler and got.sampler then self.sampler:load_state_dict(got.sampler) end
    self.epoch, self.step = got.epoch, got.step
  end
  self.serial = best
  -- the synced state is this process's commit from now on (restore() goes back to it)
  local model, now = self:_capture()
  self.snapshot = { model = model, plain = now }
  return self
end

return M
