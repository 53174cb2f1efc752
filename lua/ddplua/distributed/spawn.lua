--- ddplua.distributed.spawn: torch.multiprocessing.spawn for Lua scripts.
--
--   local spawn = require "ddplua.distributed.spawn"
--   spawn(function(rank, path)
--     local dist = require "ddplua.distributed"
--     dist.init_process_group{backend = "gloo"}   -- env:// from the variables set below
--     ...
--   end, 2, {args = {"out.txt"}})
--
-- Forks `nprocs` children with LuaJIT's FFI (fork, waitpid, pipe2, kill, prctl from libc).
-- Child `rank` sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR
-- and MASTER_PORT in its environment (so init_process_group's env:// works inside), sets the
-- thread counts (DDP_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS = cores / nprocs
-- unless already set, and dl.set_num_threads when ddplua is loaded), runs fn(rank, ...args),
-- flushes io.stdout / io.stderr and leaves with _exit(0) (no finalizers: close your own
-- files inside fn). When fn raises, the child writes the message and traceback into a pipe
-- and leaves with _exit(1).
--
-- The parent waits. At the first child that fails (non-zero exit or a signal) it stops the
-- others (SIGTERM, SIGKILL after 3 s), reaps them all and raises a Lua error naming the rank
-- and carrying the child's message, like mp.spawn's ProcessRaisedException /
-- ProcessExitedException. Children have PR_SET_PDEATHSIG = SIGKILL: they die with the
-- parent. The child is a copy of the parent: everything fn needs is already there (upvalues,
-- loaded modules), nothing is pickled.
local ffi = require "ffi"
local bit = require "bit"

-- Declared one by one: another module may have declared some of them already (LuaJIT keeps
-- the first declaration of a function and accepts an identical repeat).
for _, decl in ipairs {
  "int fork(void);",
  "int waitpid(int pid, int *status, int options);",
  "int pipe2(int fds[2], int flags);",
  "int kill(int pid, int sig);",
  "int prctl(int option, ...);",
  "int getpid(void);",
  "int getppid(void);",
  "int setenv(const char *name, const char *value, int overwrite);",
  "long read(int fd, void *buf, size_t count);",
  "long write(int fd, const void *buf, size_t count);",
  "int close(int fd);",
  "void _exit(int status);",
  "int usleep(unsigned int usec);",
  "long sysconf(int name);",
  "int socket(int domain, int type, int protocol);",
  "int bind(int fd, const void *addr, unsigned int len);",
  "int getsockname(int fd, void *addr, unsigned int *len);",
  "char *strerror(int errnum);",
  [[typedef struct ddp_spawn_sockaddr_in {
      uint16_t family; uint8_t port[2]; uint8_t addr[4]; uint8_t zero[8];
    } ddp_spawn_sockaddr_in;]],
} do
  pcall(ffi.cdef, decl)
end
local C = ffi.C

-- Linux x86-64 / aarch64 values.
local WNOHANG, EINTR, EAGAIN = 1, 4, 11
local O_NONBLOCK, O_CLOEXEC = 0x800, 0x80000
local PR_SET_PDEATHSIG = 1
local SIGKILL, SIGTERM = 9, 15
local SC_NPROCESSORS_ONLN = 84
local AF_INET, SOCK_STREAM = 2, 1
local GRACE_S = 3         -- SIGTERM to SIGKILL
local POLL_US = 10000     -- how often the parent looks at its children
local MAX_MESSAGE = 60000 -- a child's error fits the pipe (64 KiB) in one write

local signal_names = {
  [1] = "SIGHUP", [2] = "SIGINT", [3] = "SIGQUIT", [4] = "SIGILL", [5] = "SIGTRAP",
  [6] = "SIGABRT", [7] = "SIGBUS", [8] = "SIGFPE", [9] = "SIGKILL", [10] = "SIGUSR1",
  [11] = "SIGSEGV", [12] = "SIGUSR2", [13] = "SIGPIPE", [14] = "SIGALRM", [15] = "SIGTERM",
}

local function signal_name(sig)
  return signal_names[sig] or ("signal " .. sig)
end

local function errno_message(what)
  local e = ffi.errno()
  return ("spawn: %s failed: %s"):format(what, ffi.string(C.strerror(e)))
end

-- A port nobody listens on now (bind port 0 on 127.0.0.1); nil when that fails.
local function free_port()
  local fd = C.socket(AF_INET, SOCK_STREAM + O_CLOEXEC, 0)
  if fd < 0 then return nil end
  local a = ffi.new("ddp_spawn_sockaddr_in")
  a.family = AF_INET
  a.addr[0], a.addr[1], a.addr[2], a.addr[3] = 127, 0, 0, 1
  local len = ffi.new("unsigned int[1]", ffi.sizeof(a))
  local port
  if C.bind(fd, ffi.cast("void *", a), len[0]) == 0
      and C.getsockname(fd, ffi.cast("void *", a), len) == 0 then
    port = a.port[0] * 256 + a.port[1] -- network byte order
  end
  C.close(fd)
  return port
end

-- The thread count each child gets: the cores shared by the children, at least 1.
local function threads_per_child(nprocs)
  local cores = tonumber(C.sysconf(SC_NPROCESSORS_ONLN)) or 1
  return math.max(1, math.floor(cores / nprocs))
end

-- Write all of `s` to fd (the pipe is non-blocking and empty: one write normally does).
local function write_all(fd, s)
  local off = 0
  for _ = 1, 100 do
    if off >= #s then return end
    local n = tonumber(C.write(fd, ffi.cast("const char *", s) + off, #s - off))
    if n > 0 then off = off + n
    elseif ffi.errno() == EAGAIN then C.usleep(1000)
    elseif ffi.errno() ~= EINTR then return end
  end
end

-- Everything a child does; never returns (a child must never run the parent's code after
-- spawn, e.g. a test runner's next test).
local function run_child(fn, rank, nprocs, opts, env, err_fd, parent, other_fds)
  local code = 1
  local ok, err = pcall(function()
    for _, fd in ipairs(other_fds) do C.close(fd) end
    C.prctl(PR_SET_PDEATHSIG, ffi.cast("unsigned long", SIGKILL))
    if C.getppid() ~= parent then error("spawn: the parent ended before the child started", 0) end
    for k, v in pairs(env) do C.setenv(k, tostring(v), 1) end
    local threads = threads_per_child(nprocs)
    for _, k in ipairs { "DDP_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS" } do
      C.setenv(k, tostring(threads), 0)
    end
    local dl = package.loaded["ddplua"]
    if type(dl) == "table" and dl.set_num_threads then
      dl.set_num_threads(tonumber(os.getenv("DDP_NUM_THREADS")) or threads)
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
    write_all(err_fd, msg)
  end
  C._exit(code)
end

-- Everything the pipe holds now (non-blocking), appended to child.message.
local function drain(child)
  if not child.fd then return end
  local buf = ffi.new("char[?]", 4096)
  while true do
    local n = tonumber(C.read(child.fd, buf, 4096))
    if n > 0 then
      child.message[#child.message + 1] = ffi.string(buf, n)
    elseif n == 0 or ffi.errno() ~= EINTR then
      if n == 0 then
        C.close(child.fd)
        child.fd = nil
      end
      return
    end
  end
end

local status_buf = ffi.new("int[1]")

-- Reap the child if it ended. Returns true when it has been reaped (now or before).
local function reap(child, block)
  if child.status then return true end
  local r
  repeat
    r = C.waitpid(child.pid, status_buf, block and 0 or WNOHANG)
  until r >= 0 or ffi.errno() ~= EINTR
  if r == 0 then return false end
  child.status = r > 0 and status_buf[0] or 256 -- lost (ECHILD): call it exit code 1
  drain(child)
  return true
end

local function failed(status)
  return status ~= 0 -- exit code 0 is the only wait status 0
end

-- Why a child failed, in words.
local function failure_message(child)
  local st = child.status
  local sig = bit.band(st, 0x7f)
  local head = ("spawn: process %d (rank %d, pid %d) "):format(child.rank, child.rank, child.pid)
  if sig ~= 0 then return head .. "terminated with signal " .. signal_name(sig) end
  local code = bit.band(bit.rshift(st, 8), 0xff)
  local msg = table.concat(child.message)
  if msg ~= "" then return head .. "terminated with the following error:\n" .. msg end
  return head .. "terminated with exit code " .. code
end

-- Stop the children still running: SIGTERM, then SIGKILL after the grace period; reap all.
local function stop(children)
  for _, c in ipairs(children) do
    if not c.status then C.kill(c.pid, SIGTERM) end
  end
  local waited = 0 -- in microseconds of sleep (os.clock counts CPU time, not wall time)
  while waited < GRACE_S * 1e6 do
    local running = false
    for _, c in ipairs(children) do
      if not reap(c) then running = true end
    end
    if not running then break end
    C.usleep(POLL_US)
    waited = waited + POLL_US
  end
  for _, c in ipairs(children) do
    if not c.status then C.kill(c.pid, SIGKILL) end
    reap(c, true)
    if c.fd then C.close(c.fd); c.fd = nil end
  end
end

local Context = {}
Context.__index = Context

--- ctx:join(timeout): wait up to `timeout` seconds (nil: until the end) for the children.
-- Returns true once all exited 0, false on timeout. At the first failure, stops the others
-- and raises "spawn: process R (rank R, pid P) terminated with ..." (the child's error
-- message and traceback, its signal, or its exit code).
function Context:join(timeout)
  local children = self.children
  local waited = 0
  local ok, err = pcall(function()
    while true do
      local running = false
      for _, c in ipairs(children) do
        drain(c)
        if reap(c) then
          if failed(c.status) then return c end
        else
          running = true
        end
      end
      if not running then return nil end
      if timeout and waited >= timeout * 1e6 then return false end
      C.usleep(POLL_US)
      waited = waited + POLL_US
    end
  end)
  if not ok then -- e.g. Ctrl-C ("interrupted!") in the parent: take the children along
    stop(children)
    error(err, 0)
  end
  if err == false then return false end
  if err then
    stop(children)
    error(failure_message(err), 0)
  end
  for _, c in ipairs(children) do
    if c.fd then C.close(c.fd); c.fd = nil end
  end
  return true
end

--- ctx.pids: the children's process ids, by rank + 1.

--- spawn(fn, nprocs, opts): run fn(rank, ...opts.args) in `nprocs` forked children, rank
-- 0 .. nprocs-1, as torch.multiprocessing.spawn.
-- opts.args: a list of extra arguments for fn (default none).
-- opts.join: wait for the children (default true); false returns a context with
--   ctx:join(timeout) and ctx.pids.
-- opts.master_addr (default $MASTER_ADDR or "127.0.0.1"), opts.master_port (default
--   $MASTER_PORT, else a free port on 127.0.0.1): the rendezvous for env://.
-- opts.env: more environment variables for the children ({NAME = value}).
-- Raises when nprocs is not a count >= 1, when a fork fails, and (join) when a child fails.
local function spawn(fn, nprocs, opts)
  opts = opts or {}
  nprocs = nprocs == nil and 1 or nprocs
  if type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error("spawn: fn must be a function, got " .. type(fn), 2)
  end
  if type(nprocs) ~= "number" or nprocs < 1 or nprocs % 1 ~= 0 then
    error("spawn: nprocs must be a count >= 1, got " .. tostring(nprocs), 2)
  end
  local port = opts.master_port or tonumber(os.getenv("MASTER_PORT")) or free_port()
  if not port then error(errno_message("finding a free port"), 2) end
  local addr = opts.master_addr or os.getenv("MASTER_ADDR") or "127.0.0.1"
  local parent = C.getpid()
  local children = {}
  local read_fds = {}
  io.stdout:flush() -- or the children would print the parent's buffered output again
  io.stderr:flush()
  for rank = 0, nprocs - 1 do
    local env = {
      RANK = rank, LOCAL_RANK = rank, WORLD_SIZE = nprocs, LOCAL_WORLD_SIZE = nprocs,
      GROUP_RANK = 0, MASTER_ADDR = addr, MASTER_PORT = port,
    }
    for k, v in pairs(opts.env or {}) do env[k] = v end
    local fds = ffi.new("int[2]")
    if C.pipe2(fds, O_CLOEXEC + O_NONBLOCK) ~= 0 then
      local msg = errno_message("pipe2")
      stop(children)
      error(msg, 2)
    end
    local pid = C.fork()
    if pid == 0 then
      run_child(fn, rank, nprocs, opts, env, fds[1], parent, read_fds)
    end
    C.close(fds[1])
    if pid < 0 then
      local msg = errno_message("fork")
      C.close(fds[0])
      stop(children)
      error(msg, 2)
    end
    children[#children + 1] = { rank = rank, pid = pid, fd = fds[0], message = {} }
    read_fds[#read_fds + 1] = fds[0]
  end
  local pids = {}
  for i, c in ipairs(children) do pids[i] = c.pid end
  local ctx = setmetatable({ children = children, pids = pids }, Context)
  if opts.join == false then return ctx end
  ctx:join()
end

return setmetatable({ spawn = spawn, free_port = free_port }, {
  __call = function(_, ...) return spawn(...) end,
})
