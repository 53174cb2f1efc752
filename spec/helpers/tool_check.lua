-- spec/helpers/tool_check.lua: whether a tools/ script can do its job here, asked through
-- its own `check` subcommand (tools/netns_nodes.sh, tools/slurm_local.sh), for the specs
-- that mark themselves pending with the reason when it cannot.
local files = require "files"

local M = {}

--- M.unavailable(script) -> nil when `script check` succeeds here, else its message (why
-- not: not root, a tool missing, a kernel or container that forbids namespaces).
function M.unavailable(script)
  local status, out = files.run(script .. " check")
  if status == 0 then return nil end
  return (out:gsub("%s+$", ""))
end

return M
