--- ddplua.repl.ranks: what a rank of the distributed REPL (`ddplua --nproc_per_node=N -i`,
-- runtime/cli/dist_repl.c) puts at its prompt.
local help = require "ddplua.repl.help"

local M = {}

-- Collectives that work in place on their first argument.
local IN_PLACE = { all_reduce = true, broadcast = true, reduce = true }

--- ranks.prompt_dist(dist) -> the `dist` of the prompt: ddplua.distributed whose in-place
-- collectives (all_reduce, broadcast, reduce) return their tensor when they would return
-- nothing, so `dist.all_reduce(dl.ones{2})` typed at the prompt shows the result. Scripts
-- keep PyTorch's nil; an async call still returns its Work. Everything else is dist's own
-- (an __index table, so Tab completion sees dist's names), and `?dist`, `?dist.all_reduce`
-- show the same doc comments as in the plain REPL (help.same_doc).
function M.prompt_dist(dist)
  local prompt = setmetatable({}, { __index = dist })
  for name in pairs(IN_PLACE) do
    local f = dist[name]
    if type(f) == "function" then
      prompt[name] = help.same_doc(function(t, ...)
        local result = f(t, ...)
        if result == nil then return t end
        return result
      end, f)
    end
  end
  return help.same_doc(prompt, dist)
end

-- Note [REPL group abort]: a collective blocked at the prompt ends with Ctrl-C: each rank's
-- interrupt thread aborts the process groups with a collective pending
-- (ddp_pg_abort_pending, runtime/cli/dist_repl.c), which aborts them on every rank (Note
-- [group abort] in runtime/comm/pg.c), and the input ends with the error. The group
-- is then unusable, so before the next input that every rank runs (not a `%rank K` one:
-- making a group needs every rank) each rank checks whether the default group was aborted,
-- here or on any rank (its abort key in the store: a rank that was not in the collective
-- may not have heard of it yet), and if so they free it and make a new one together, under
-- the next name (repl/0, repl/1, ...: the abort stays recorded under the old one), over the
-- store this module made and keeps (destroy_process_group leaves a store it was given). Every
-- rank decides alike: the key is written before the aborting rank answers its input, and
-- the prompt sends the next input only once every rank answered.
local state = { generation = 0 }

local function group_name() return "repl/" .. state.generation end

--- ranks.init(): join the job's default process group (gloo, from the launcher's
-- environment, as dist.init_process_group() does) over a TCP store kept here, so that
-- ranks.heal can make the group again after an abort. Without MASTER_ADDR / MASTER_PORT /
-- RANK / WORLD_SIZE: dist.init_process_group(), which raises naming what is missing.
function M.init()
  local dist = require "ddplua.distributed"
  if dist.is_initialized() then return end
  local env = dist.env_info()
  local addr, port = os.getenv("MASTER_ADDR"), tonumber(os.getenv("MASTER_PORT") or "")
  if not (addr and addr ~= "" and port and env.rank and env.world_size) then
    dist.init_process_group()
    return
  end
  state.store = require("ddplua.distributed.store").TCPStore(addr, port,
    { is_server = env.rank == 0, rank = env.rank })
  state.rank, state.world_size = env.rank, env.world_size
  dist.init_process_group { store = state.store, rank = env.rank, world_size = env.world_size,
                            group_name = group_name() }
  state.group = dist.get_default_group()
end

--- ranks.heal() -> true when it made the default group again (Note [REPL group abort]):
-- run by every rank before an input that every rank runs. Prints "ddplua: the process group
-- was aborted (<first failure>); made a new one". Raises when the new group cannot be made.
function M.heal()
  local dist = require "ddplua.distributed"
  -- only the group made here (not one the user made at the prompt instead)
  if not state.store or not dist.is_initialized() or dist.get_default_group() ~= state.group then
    return false
  end
  local key = group_name() .. "/abort"
  local why
  if dist.is_aborted() then
    local lib = require "ddplua.lib"
    why = lib.ffi.string(lib.C.ddp_pg_error(dist.get_default_group().handle))
  elseif state.store:check(key) then
    why = state.store:get(key)
  else
    return false
  end
  dist.destroy_process_group()
  state.generation = state.generation + 1
  dist.init_process_group { store = state.store, rank = state.rank, world_size = state.world_size,
                            group_name = group_name() }
  state.group = dist.get_default_group()
  print(("ddplua: the process group was aborted (%s); made a new one"):format(why))
  return true
end

return M
