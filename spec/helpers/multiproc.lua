--- multiproc: start N ranks of a Lua script as `build/ddplua` children on 127.0.0.1 with the
-- torchrun environment, collect their outputs and exit statuses, and always clean up.
--
--   local mp = require "multiproc"
--   local r = mp.run{code = "...", nprocs = 2, timeout = 20}
--   r[1].status, r[1].output   -- rank 0: exit status (nil when killed), stdout + stderr
--   r.ok                       -- every rank exited 0
--   r.timed_out                -- the run was killed at its timeout
--
-- Each child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
-- MASTER_PORT (a free port, also in r.port), DDP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1,
-- then opts.env (a table; a value of false unsets the variable) and opts.rank_env(rank) (a
-- table per rank) on top. Each child runs in its own session (setsid), so killing it kills
-- whatever it started too. On timeout, or when a rank fails and opts.kill_on_failure is
-- not false, the survivors are killed (after opts.grace seconds, default 0). The temporary
-- directory (script, outputs) is removed before run returns, whatever happened.
local ffi = require "ffi"

local M = {}

-- ffi declarations of libc, each only once (busted reloads helpers per spec file).
local function cdef_once(probe, text)
  if not pcall(ffi.typeof, probe) then ffi.cdef(text) end
end
cdef_once("struct ddp_mp_sockaddr_in", [[
struct ddp_mp_sockaddr_in { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
]])
-- One declaration at a time: another helper may have declared some of them already, and
-- LuaJIT refuses a whole block at its first repeat (the rest of the block would be lost).
for _, decl in ipairs {
  "int usleep(unsigned int usec);",
  "int getpid(void);",
  "int socket(int domain, int type, int protocol);",
  "int bind(int fd, const void *addr, unsigned int len);",
  "int getsockname(int fd, void *addr, unsigned int *len);",
  "int close(int fd);",
} do
  pcall(ffi.cdef, decl)
end
local C = ffi.C

local function sleep(seconds) C.usleep(math.floor(seconds * 1e6)) end

local function quote(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

local read_file = require("files").read_if_exists

local function write_file(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function shell_read(cmd)
  local p = assert(io.popen(cmd, "r"))
  local s = p:read("*a")
  p:close()
  return s
end

--- A TCP port on 127.0.0.1 free right now (bind to port 0, read the port the kernel chose,
-- close). Falls back to a port derived from the pid.
function M.free_port()
  local fd = C.socket(2, 1, 0) -- AF_INET, SOCK_STREAM
  if fd >= 0 then
    local sa = ffi.new("struct ddp_mp_sockaddr_in")
    sa.family = 2
    sa.addr = 0x0100007f -- 127.0.0.1 in network order on little-endian
    local len = ffi.new("unsigned int[1]", ffi.sizeof(sa))
    if C.bind(fd, sa, ffi.sizeof(sa)) == 0 and C.getsockname(fd, sa, len) == 0 then
      local port = bit.bor(bit.lshift(bit.band(sa.port, 0xff), 8), bit.rshift(sa.port, 8))
      C.close(fd)
      return port
    end
    C.close(fd)
  end
  return 20000 + (C.getpid() * 7) % 20000
end

--- Path of the ddplua executable the children run: $DDPLUA_EXE, else ./build/ddplua.
function M.exe()
  return os.getenv("DDPLUA_EXE") or "./build/ddplua"
end

local function alive(pid)
  return os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0
end

-- (os.execute runs dash, whose kill takes no "--": "kill -9 -- -PID" failed with "Illegal
-- number", only the session's shell died, and its rank lived on, forever when stopped)
local function kill_session(pid)
  os.execute("kill -9 -" .. pid .. " 2>/dev/null; kill -9 " .. pid .. " 2>/dev/null")
end

--- Run opts.nprocs (default 2) ranks of opts.script (a path) or opts.code (Lua source),
-- with opts.args (a list) after it. opts.timeout: seconds for the whole run (default 30).
-- Returns the results table described at the top.
function M.run(opts)
  local n = opts.nprocs or 2
  local timeout = opts.timeout or 30
  local dir = shell_read("mktemp -d /tmp/ddplua-mp.XXXXXX"):gsub("%s+$", "")
  assert(dir ~= "", "multiproc: mktemp failed")
  local port = opts.port or M.free_port()
  local pids = {}
  local results = { port = port, dir = nil }

  local ok, err = pcall(function()
    local script = opts.script
    if not script then
      script = dir .. "/script.lua"
      write_file(script, assert(opts.code, "multiproc.run: give script or code"))
    end
    local args = {}
    for _, a in ipairs(opts.args or {}) do args[#args + 1] = quote(a) end
    for rank = 0, n - 1 do
      local env = {
        RANK = rank, WORLD_SIZE = n, LOCAL_RANK = rank, LOCAL_WORLD_SIZE = n,
        MASTER_ADDR = "127.0.0.1", MASTER_PORT = port,
        DDP_NUM_THREADS = 1, OPENBLAS_NUM_THREADS = 1, OMP_NUM_THREADS = 1,
      }
      for k, v in pairs(opts.env or {}) do env[k] = v end
      for k, v in pairs(opts.rank_env and opts.rank_env(rank) or {}) do env[k] = v end
      -- env takes its -u options before the assignments
      local unset, set = {}, {}
      for k, v in pairs(env) do
        if v == false then unset[#unset + 1] = "-u " .. k
        else set[#set + 1] = k .. "=" .. quote(v) end
      end
      local parts = { "env", table.concat(unset, " "), table.concat(set, " ") }
      local out = dir .. "/out" .. rank
      local status = dir .. "/status" .. rank
      local cmd = table.concat(parts, " ") .. " " .. quote(M.exe()) .. " " .. quote(script) ..
                  " " .. table.concat(args, " ") .. " >" .. quote(out) .. " 2>&1; echo $? >" ..
                  quote(status .. ".tmp") .. "; mv " .. quote(status .. ".tmp") .. " " ..
                  quote(status)
      local pid = shell_read("setsid sh -c " .. quote(cmd) .. " >/dev/null 2>&1 </dev/null & echo $!")
      pids[rank] = assert(tonumber(pid:match("%d+")), "multiproc: could not start rank " .. rank)
    end

    -- Poll for the exit statuses until all are in, the timeout passes, or a rank fails.
    local deadline = os.time() + timeout
    local waited = 0
    local failed_at
    while true do
      local done = 0
      for rank = 0, n - 1 do
        local r = results[rank + 1]
        if not r then
          local s = read_file(dir .. "/status" .. rank)
          if s and s:match("%d+") then
            r = { status = tonumber(s:match("%d+")) }
            results[rank + 1] = r
            if r.status ~= 0 and not failed_at then failed_at = waited end
          end
        end
        if r then done = done + 1 end
      end
      if done == n then break end
      if failed_at and opts.kill_on_failure ~= false and waited - failed_at >= (opts.grace or 0) then
        results.killed_on_failure = true
        break
      end
      if os.time() >= deadline then
        results.timed_out = true
        break
      end
      sleep(0.02)
      waited = waited + 0.02
    end
  end)

  -- Always: kill whatever is left, read the outputs, remove the directory.
  for rank = 0, n - 1 do
    local pid = pids[rank]
    if pid then
      if not results[rank + 1] or alive(pid) then kill_session(pid) end
    end
  end
  for rank = 0, n - 1 do
    local r = results[rank + 1] or { status = nil, killed = true }
    r.output = read_file(dir .. "/out" .. rank) or ""
    results[rank + 1] = r
  end
  os.execute("rm -rf " .. quote(dir))
  if not ok then error(err, 0) end

  results.ok = not results.timed_out
  for rank = 1, n do
    if results[rank].status ~= 0 then results.ok = false end
  end
  return results
end

--- All outputs joined with "--- rank k (status s) ---" headers: for assertion messages.
function M.describe(results)
  local parts = {}
  for i, r in ipairs(results) do
    parts[#parts + 1] = ("--- rank %d (status %s) ---\n%s"):format(i - 1, tostring(r.status), r.output)
  end
  if results.timed_out then parts[#parts + 1] = "--- timed out ---" end
  return table.concat(parts, "\n")
end

return M
