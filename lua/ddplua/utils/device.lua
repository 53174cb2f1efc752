--- ddplua.utils.device: which device a training process runs on, as torchrun scripts
-- decide it (`torch.cuda.set_device(LOCAL_RANK)`).
--
--   local device = require("ddplua.utils.device").choose(opts.device)   -- "cpu" or "cuda:k"
local options = require "ddplua.options"
local dl = require "ddplua.functions"

local M = {}

--- The process's local rank when it was started by a launcher (a world size > 1 in the
-- environment): the local rank as a number (0 when unset); nil in a single process. The
-- variables are those init_process_group reads (dist.env_info): torchrun's and ddplua's
-- launcher (WORLD_SIZE, LOCAL_RANK), Slurm's srun (SLURM_NTASKS, SLURM_LOCALID) and Open
-- MPI's mpirun (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK), so a script that asks
-- this before init_process_group joins the job under each of them.
function M.launcher_local_rank()
  local env = require("ddplua.distributed").env_info()
  if (env.world_size or 1) <= 1 then return nil end
  return env.local_rank or 0
end

local KNOWN = options.known { "device", "local_rank", "prog" }

--- device.choose(requested, opts) -> "cpu" or "cuda:k", and makes cuda:k the current device.
-- requested: "cpu", "cuda" (the current device) or "cuda:k"; nil picks "cuda" when
-- dl.cuda.is_available(), else "cpu". opts.local_rank (default launcher_local_rank()): under
-- a launcher each process takes cuda:LOCAL_RANK, and "cuda:k" must name that one; false:
-- choose as a single process.
-- opts.prog prefixes messages (default "ddplua"). Raises (error(msg, 0)) for a malformed
-- name, when CUDA is asked for but not available (with the reason), when cuda:k does not
-- exist, and when LOCAL_RANK is not below the number of devices (naming both numbers).
function M.choose(requested, opts)
  opts = options.check("device.choose", opts, KNOWN)
  local prog = opts.prog or "ddplua"
  local local_rank = opts.local_rank
  if local_rank == nil then local_rank = M.launcher_local_rank() end
  if local_rank == false then local_rank = nil end
  local function fail(fmt, ...) error(prog .. ": " .. fmt:format(...), 0) end
  if requested == nil then requested = dl.cuda.is_available() and "cuda" or "cpu" end
  if requested == "cpu" then return "cpu" end
  if not dl.cuda.is_device(requested) then
    fail("--device must be cpu, cuda or cuda:K, got '%s'", tostring(requested))
  end
  if not dl.cuda.is_available() then
    fail("--device %s: CUDA is not available: %s", requested, dl.cuda.unavailable_reason())
  end
  local count = dl.cuda.device_count()
  local s = count == 1 and "" or "s"
  local k
  if local_rank ~= nil then
    k = local_rank
    if requested ~= "cuda" and requested ~= "cuda:" .. local_rank then
      fail("--device %s under the launcher: each process uses cuda:LOCAL_RANK (cuda:%d); pass --device cuda",
        requested, local_rank)
    end
    if k >= count then
      fail("LOCAL_RANK %d has no GPU: this host has %d CUDA device%s (cuda:0 .. cuda:%d); start at most %d process%s per node",
        k, count, s, count - 1, count, count == 1 and "" or "es")
    end
  else
    k = requested == "cuda" and dl.cuda.current_device() or tonumber(requested:match("^cuda:(%d+)$"))
    if k >= count then fail("--device %s does not exist: %d CUDA device%s", requested, count, s) end
  end
  dl.cuda.set_device(k)
  return "cuda:" .. k
end

return M
