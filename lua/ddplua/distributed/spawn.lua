--- ddplua.distributed.spawn: torch.multiprocessing.spawn for Lua scripts.
--
--   local spawn = require "ddplua.distributed.spawn"
--   spawn(function(rank, path)
--     local dist = require "ddplua.distributed"
--     dist.init_process_group{backend = "gloo"}   -- env:// from the variables set below
--     ...
--   end, 2, {args = {"out.txt"}})
--
-- Forks `nprocs` children through the runtime's process supervision API (ddplua/process.h,
-- the one the `ddplua --nproc_per_node` launcher uses too): ddp_procs_fork returns twice,
-- like fork. Child `rank` has the torchrun variables in its environment (RANK, LOCAL_RANK,
-- WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...: Note [worker
-- environment]), so init_process_group's env:// works inside, and the thread counts
-- (DDP_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS = cores / nprocs unless already
-- set; dl.set_num_threads when ddplua is loaded); it runs fn(rank, ...args) with stdout line
-- buffered (a rank stopped because another failed keeps every line it wrote), flushes
-- io.stdout / io.stderr and leaves with _exit(0) (no finalizers: close your own files
-- inside fn). When fn raises, the child sends the message and traceback to the parent
-- (ddp_procs_report) and leaves with _exit(1).
--
-- The parent waits. At the first child that fails (non-zero exit or a signal) it stops the
-- others (SIGTERM, SIGKILL after 3 s), reaps them all and raises a Lua error naming the rank
-- and carrying the child's message, like mp.spawn's ProcessRaisedException /
-- ProcessExitedException. Children have PR_SET_PDEATHSIG = SIGKILL: they die with the
-- parent. The child is a copy of the parent: everything fn needs is already there (upvalues,
-- loaded modules), nothing is pickled.
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local GRACE_S = 3         -- SIGTERM to SIGKILL
local POLL_S = 0.01       -- how often the parent looks at its children
local MAX_MESSAGE = 59000 -- a child's error fits what ddp_procs_report passes on (60000)

local int_box = ffi.new("int[1]")
local code_box, sig_box = ffi.new("int[1]"), ffi.new("int[1]")
local len_box = ffi.new("size_t[1]")
local name_buf = ffi.new("char[32]")

local function last_error()
  return "spawn: " .. ffi.string(C.ddp_last_error())
end

--- spawn.free_port(): a port nobody listens on now (bind port 0 on 127.0.0.1), or nil
-- and the reason.
local function free_port()
  if C.ddp_process_free_port(int_box) ~= 0 then return nil, last_error() end
  return int_box[0]
end

-- Everything a child does; never returns (a child must never run the parent's code after
-- spawn, e.g. a test runner's next test).
local function run_child(procs, fn, nprocs, rank, opts)
  local code = 1
  -- When another rank fails, this one is stopped with SIGTERM (SIGKILL after the grace
  -- period), which ended it without flushing what io.write left in stdout's buffer; into a
  -- pipe or a file that buffer holds whole blocks, so a survivor's last lines were lost.
  -- SIGTERM now flushes first (Note [flush on SIGTERM] in process.c), and line buffering
  -- (what the launcher's DDPLUA_UNBUFFERED asks of its workers) sends each line as it is
  -- written, which also covers a child busy in C when SIGKILL comes.
  C.ddp_process_flush_on_sigterm()
  pcall(io.stdout.setvbuf, io.stdout, "line")
  local ok, err = pcall(function()
    local dl = package.loaded["ddplua"]
    if type(dl) == "table" and dl.set_num_threads then
      dl.set_num_threads(tonumber(os.getenv("DDP_NUM_THREADS"))
        or C.ddp_process_threads_per_worker(nprocs))
    end
    local args = opts.args or {}
    local fn_ok, fn_err = xpcall(function()
      return fn(rank, unpack(args, 1, args.n or #args))
    end, function(e)
      -- the frames below fn (spawn's own, then the parent's) say nothing about the error
      local tb = debug.traceback(tostring(e), 2)
      return (tb:gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
    end)
    if not fn_ok then error(fn_err, 0) end
    code = 0
  end)
  pcall(io.stdout.flush, io.stdout)
  pcall(io.stderr.flush, io.stderr)
  if not ok then
    local msg = tostring(err)
    if #msg > MAX_MESSAGE then msg = msg:sub(1, MAX_MESSAGE) .. "\n(message cut)" end
    C.ddp_procs_report(procs, msg, #msg)
  end
  C.ddp_process_exit(code)
end

-- Why child `rank` failed, in words.
local function failure_message(procs, rank)
  local pid = C.ddp_procs_pid(procs, rank)
  C.ddp_procs_exit_status(procs, rank, code_box, sig_box)
  local head = ("spawn: process %d (rank %d, pid %d) "):format(rank, rank, pid)
  if sig_box[0] ~= 0 then
    C.ddp_process_signal_name(sig_box[0], name_buf, 32)
    return head .. "terminated with signal " .. ffi.string(name_buf)
  end
  local msg = ffi.string(C.ddp_procs_message(procs, rank, len_box), len_box[0])
  if msg ~= "" then return head .. "terminated with the following error:\n" .. msg end
  return head .. "terminated with exit code " .. code_box[0]
end

local Context = {}
Context.__index = Context

-- Stop the children still running (SIGTERM, SIGKILL after the grace period), reap them
-- all and let the group go.
function Context:_release()
  local procs = self.procs
  if not procs then return end
  self.procs = nil
  C.ddp_procs_stop(procs)
  C.ddp_procs_free(procs)
end

--- ctx:join(timeout): wait up to `timeout` seconds (nil: until the end) for the children.
-- Returns true once all exited 0, false on timeout. At the first failure, stops the others
-- and raises "spawn: process R (rank R, pid P) terminated with ..." (the child's error
-- message and traceback, its signal, or its exit code).
function Context:join(timeout)
  local procs = self.procs
  if not procs then return true end
  local waited = 0
  local ok, outcome = pcall(function()
    while true do
      local more = C.ddp_procs_poll(procs, POLL_S, -1, nil)
      if C.ddp_procs_failed(procs) >= 0 then return "failed" end
      if more == 0 then return "done" end
      if timeout and waited >= timeout then return "timeout" end
      waited = waited + POLL_S
    end
  end)
  if not ok then -- e.g. Ctrl-C ("interrupted!") in the parent: take the children along
    self:_release()
    error(outcome, 0)
  end
  if outcome == "timeout" then return false end
  if outcome == "failed" then
    C.ddp_procs_stop(procs) -- the failure's report is kept: read it after the others ended
    local msg = failure_message(procs, C.ddp_procs_failed(procs))
    self:_release()
    error(msg, 0)
  end
  self:_release()
  return true
end

--- ctx.pids: the children's process ids, by rank + 1.

local KNOWN = options.known { "args", "join", "master_addr", "master_port", "env" }

--- spawn(fn, nprocs, opts): run fn(rank, ...opts.args) in `nprocs` forked children, rank
-- 0 .. nprocs-1, as torch.multiprocessing.spawn.
-- opts.args: a list of extra arguments for fn (default none).
-- opts.join: wait for the children (default true); false returns a context with
--   ctx:join(timeout) and ctx.pids.
-- opts.master_addr (default $MASTER_ADDR or "127.0.0.1"), opts.master_port (default
--   $MASTER_PORT, else a free port on 127.0.0.1): the rendezvous for env://.
-- opts.env: more environment variables for the children ({NAME = value}).
-- The children share a fresh store secret (DDPLUA_STORE_SECRET, README "Security") unless
-- the environment or opts.env already gives one.
-- Raises when nprocs is not a count >= 1, when a fork fails, and (join) when a child fails.
local function spawn(fn, nprocs, opts)
  opts = options.check("spawn", opts, KNOWN)
  nprocs = nprocs == nil and 1 or nprocs
  if type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error("spawn: fn must be a function, got " .. type(fn), 2)
  end
  if type(nprocs) ~= "number" or nprocs < 1 or nprocs % 1 ~= 0 then
    error("spawn: nprocs must be a count >= 1, got " .. tostring(nprocs), 2)
  end
  local port, why = opts.master_port or tonumber(os.getenv("MASTER_PORT"))
  if not port then port, why = free_port() end
  if not port then error(why, 2) end
  local addr = opts.master_addr or os.getenv("MASTER_ADDR") or "127.0.0.1"
  local cfg = ffi.new("ddp_procs_config", {
    nprocs = nprocs, nnodes = 1, node_rank = 0, master_addr = addr, master_port = port,
    max_restarts = -1, grace_s = GRACE_S,
  })
  local box = ffi.new("ddp_procs*[1]")
  if C.ddp_procs_new(box, cfg) ~= 0 then error(last_error(), 2) end
  -- No ffi.gc: a context dropped without join leaves its children running, as before; the
  -- group is freed by join.
  local procs = box[0]
  local ctx = setmetatable({ procs = procs, pids = {} }, Context)
  local env = {}
  for k, v in pairs(opts.env or {}) do env[tostring(k)] = tostring(v) end
  if not env.DDPLUA_STORE_SECRET and (os.getenv("DDPLUA_STORE_SECRET") or "") == "" then
    local secret = ffi.new("char[65]")
    if C.ddp_store_new_secret(secret, 65) ~= 0 then error(last_error(), 2) end
    env.DDPLUA_STORE_SECRET = ffi.string(secret)
  end
  for k, v in pairs(env) do
    if C.ddp_procs_add_env(procs, k, v) ~= 0 then error(last_error(), 2) end
  end
  io.stdout:flush() -- or the children would print the parent's buffered output again
  io.stderr:flush()
  for rank = 0, nprocs - 1 do
    if C.ddp_procs_fork(procs, rank, int_box) ~= 0 then
      local msg = last_error()
      ctx:_release()
      error(msg, 2)
    end
    if int_box[0] == 1 then run_child(procs, fn, nprocs, rank, opts) end
    ctx.pids[rank + 1] = C.ddp_procs_pid(procs, rank)
  end
  if opts.join == false then return ctx end
  ctx:join()
end

return setmetatable({ spawn = spawn, free_port = free_port }, {
  __call = function(_, ...) return spawn(...) end,
})
