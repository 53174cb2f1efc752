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

return M
