--- ddplua.distributed.group: a process group (the default world group or one made by
-- new_group), over the C handle ddp_pg* (ddplua/pg.h). Holds the global ranks of its
-- members so the front end can translate the global ranks users pass (src, dst, as in
-- PyTorch) into group ranks.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local Group = {}
Group.__index = Group

--- Group.new(handle, ranks, opts): wrap a ddp_pg* (owned; may be nil for a rank that is not
-- a member). ranks: the members' global ranks in group-rank order. opts.parent / opts.store:
-- kept alive as long as this group. opts.backend: its name.
function Group.new(handle, ranks, opts)
  local self = setmetatable({
    handle = handle ~= nil and ffi.gc(handle, C.ddp_pg_free) or nil,
    ranks = ranks,
    index = {},
    parent = opts.parent,
    store = opts.store,
    backend = handle ~= nil and ffi.string(C.ddp_pg_backend(handle)) or opts.backend or "gloo",
    children = {},
  }, Group)
  for i, r in ipairs(ranks) do self.index[r] = i - 1 end
  return self
end

--- True when this process belongs to the group.
function Group:is_member() return self.handle ~= nil end

--- This process's rank in the group (-1 when not a member, as PyTorch).
function Group:rank()
  if not self.handle then return -1 end
  return C.ddp_pg_rank(self.handle)
end

--- Number of ranks in the group.
function Group:size() return #self.ranks end

--- The group rank of global rank `r`; raises naming `what` when r is not a member.
function Group:group_rank(r, what)
  if type(r) ~= "number" or r ~= math.floor(r) then
    lib.raise(("%s must be an integer rank, got %s"):format(what, tostring(r)))
  end
  local g = self.index[r]
  if not g then
    lib.raise(("%s rank %d is not in the group (global ranks %s)"):format(what, r,
              table.concat(self.ranks, ", ")))
  end
  return g
end

--- The live handle; raises naming `op` for a destroyed group or a non-member.
function Group:ptr(op)
  if self.destroyed then lib.raise(op .. ": the process group was destroyed") end
  if not self.handle then
    lib.raise(op .. ": this rank is not a member of the group (global ranks " ..
              table.concat(self.ranks, ", ") .. ")")
  end
  return self.handle
end

--- Free the group now (subgroups first): its communication thread ends after the queued
-- work, its connections close.
function Group:destroy()
  if self.destroyed then return end
  for _, child in ipairs(self.children) do child:destroy() end
  if self.handle then
    local h = self.handle
    ffi.gc(h, nil)
    C.ddp_pg_free(h)
    self.handle = nil
  end
  self.destroyed = true
end

function Group:__tostring()
  return ("ProcessGroup(%s, ranks {%s})"):format(self.backend, table.concat(self.ranks, ", "))
end

return Group
