--- ddplua.repl.ranks: what a rank of the distributed REPL (`ddplua --nproc_per_node=N -i`,
-- runtime/cli/dist_repl.c) puts at its prompt.
local M = {}

-- Collectives that work in place on their first argument.
local IN_PLACE = { all_reduce = true, broadcast = true, reduce = true }

--- ranks.prompt_dist(dist) -> the `dist` of the prompt: ddplua.distributed whose in-place
-- collectives (all_reduce, broadcast, reduce) return their tensor when they would return
-- nothing, so `dist.all_reduce(dl.ones{2})` typed at the prompt shows the result. Scripts
-- keep PyTorch's nil; an async call still returns its Work.
function M.prompt_dist(dist)
  return setmetatable({}, { __index = function(_, k)
    local f = dist[k]
    if not IN_PLACE[k] or type(f) ~= "function" then return f end
    return function(t, ...)
      local result = f(t, ...)
      if result == nil then return t end
      return result
    end
  end })
end

return M
