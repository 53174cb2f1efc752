-- spec/helpers/raw_store_client.lua: a raw TCP client of the store for the store specs
-- (spec/distributed/store_spec.lua, store_security_spec.lua), to send what no real client
-- would: sockets through the FFI, the client's half of the handshake (Note [store
-- handshake] in runtime/comm/store_wire.h), frame pieces, child processes, and small
-- file helpers.
local ffi = require "ffi"
local bit = require "bit"
local C = require("ddplua.lib").C

pcall(ffi.cdef, [[
int usleep(unsigned int usec);
int kill(int pid, int sig);
]])
pcall(ffi.cdef, [[
struct ddp_spec_sockaddr_in { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
struct ddp_spec_pollfd { int fd; short events; short revents; };
int socket(int domain, int type, int protocol);
int connect(int fd, const void *addr, unsigned int len);
long send(int fd, const void *buf, size_t n, int flags);
long recv(int fd, void *buf, size_t n, int flags);
int poll(struct ddp_spec_pollfd *fds, unsigned long n, int timeout);
int close(int fd);
]])

local M = {}

--- Sleep s seconds.
function M.sleep(s) ffi.C.usleep(math.floor(s * 1e6)) end

--- Wall-clock seconds with sub-second resolution (os.clock counts CPU time, not waiting).
function M.now()
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("*l"))
  p:close()
  return t
end

--- s quoted for the shell.
function M.sh(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- The bytes of the file at path, or nil.
function M.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local t = f:read("*a")
  f:close()
  return t
end

--- Write text to the file at path.
function M.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

--- n as 4 little-endian bytes (the frames' lengths).
function M.u32le(n)
  return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 16777216) % 256)
end

--- The bytes of s in lower-case hex.
function M.hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

--- HMAC-SHA256 through the runtime (ddp_hmac_sha256), as a 32-byte string.
function M.hmac(key, msg)
  local out = ffi.new("uint8_t[32]")
  C.ddp_hmac_sha256(out, key, #key, msg, #msg)
  return ffi.string(out, 32)
end

--- Send the string s on fd (MSG_NOSIGNAL): bytes sent, or -1.
function M.send(fd, s) return tonumber(ffi.C.send(fd, s, #s, 0x4000)) end

--- Exactly n bytes from fd, or fewer when the peer closed or `timeout` s (default 5) passed.
function M.recv_exact(fd, n, timeout)
  local buf, got = ffi.new("uint8_t[?]", n), 0
  local pfd = ffi.new("struct ddp_spec_pollfd[1]")
  local deadline = M.now() + (timeout or 5)
  while got < n and M.now() < deadline do
    pfd[0].fd, pfd[0].events, pfd[0].revents = fd, 1, 0 -- POLLIN
    if ffi.C.poll(pfd, 1, 100) > 0 then
      local r = tonumber(ffi.C.recv(fd, buf + got, n - got, 0))
      if r <= 0 then break end
      got = got + r
    end
  end
  return ffi.string(buf, got)
end

--- Does the server close fd within `timeout` seconds (draining what it sends)?
function M.closed_by_peer(fd, timeout)
  local pfd = ffi.new("struct ddp_spec_pollfd[1]")
  local buf = ffi.new("char[256]")
  local deadline = M.now() + timeout
  while M.now() < deadline do
    pfd[0].fd, pfd[0].events, pfd[0].revents = fd, 1, 0
    if ffi.C.poll(pfd, 1, 50) > 0 then
      if ffi.C.recv(fd, buf, 256, 0) <= 0 then return true end
    end
  end
  return false
end

--- The client's half of the handshake on fd with `secret` (default: the environment's
-- DDPLUA_STORE_SECRET, else none). Raises when the server sends no handshake or a wrong
-- proof.
function M.authenticate(fd, secret)
  secret = secret or os.getenv("DDPLUA_STORE_SECRET") or ""
  local hello = M.recv_exact(fd, 40)
  assert(hello:sub(1, 8) == "DDPSTOR1", "no handshake from the server")
  local nc = string.rep("c", 32)
  M.send(fd, nc .. M.hmac(secret, "client" .. hello:sub(9) .. nc))
  assert(M.recv_exact(fd, 32) == M.hmac(secret, "server" .. hello:sub(9) .. nc),
    "the server's proof is wrong")
end

--- A raw TCP connection to 127.0.0.1:port; authenticated (with the environment's secret)
-- when `authenticated`.
function M.connect(port, authenticated)
  local fd = ffi.C.socket(2, 1, 0) -- AF_INET, SOCK_STREAM
  assert(fd >= 0, "socket failed")
  local sa = ffi.new("struct ddp_spec_sockaddr_in")
  sa.family = 2
  sa.port = bit.rshift(port, 8) + bit.lshift(bit.band(port, 0xff), 8) -- htons
  sa.addr = 0x0100007f -- 127.0.0.1 in network order on a little-endian machine
  assert(ffi.C.connect(fd, sa, ffi.sizeof(sa)) == 0, "connect failed")
  if authenticated then M.authenticate(fd) end
  return fd
end

--- A child `ddplua` running the Lua `code` in its own session (so cleanup can kill its
-- process group), after the shell command `prefix_cmd` (e.g. "ulimit -n 48"), with
-- DDP_NUM_THREADS=1, PORT_FILE and the variables of `env`. The child object:
-- child:wait(timeout) -> exit status or nil after timeout s (default 20); child:port(timeout)
-- -> the port it wrote to $PORT_FILE (raises after timeout s, default 10, with its stderr);
-- child:stdout(), child:stderr(); child:cleanup() kills it if still running and removes
-- its files. `exe` is the ddplua executable.
function M.spawn(exe, code, env, prefix_cmd)
  local sh = M.sh
  local base = os.tmpname()
  M.write_file(base .. ".lua", code)
  local vars = "DDP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PORT_FILE=" .. sh(base .. ".port")
  for k, v in pairs(env or {}) do vars = vars .. " " .. k .. "=" .. sh(v) end
  local inner = ("%s; %s %s %s > %s 2> %s; echo $? > %s"):format(prefix_cmd or ":", vars, sh(exe),
    sh(base .. ".lua"), sh(base .. ".out"), sh(base .. ".err"), sh(base .. ".status"))
  local p = io.popen(("setsid sh -c %s > /dev/null 2>&1 < /dev/null & echo $!"):format(sh(inner)))
  local child = { pid = tonumber(p:read("*l")), base = base }
  p:close()
  function child:wait(timeout)
    local deadline = M.now() + (timeout or 20)
    repeat
      local st = M.read_file(base .. ".status")
      if st and st:match("%d") then self.done = true; return tonumber(st:match("%d+")) end
      M.sleep(0.02)
    until M.now() > deadline
    return nil
  end
  function child:port(timeout)
    local deadline = M.now() + (timeout or 10)
    repeat
      local v = tonumber(M.read_file(base .. ".port") or "")
      if v then return v end
      M.sleep(0.02)
    until M.now() > deadline
    error("the child wrote no port; stderr:\n" .. self:stderr())
  end
  function child:stderr() return M.read_file(base .. ".err") or "" end
  function child:stdout() return M.read_file(base .. ".out") or "" end
  function child:cleanup()
    if not self.done and self.pid then ffi.C.kill(-self.pid, 9) end
    for _, ext in ipairs({ "", ".lua", ".out", ".err", ".status", ".port" }) do os.remove(base .. ext) end
  end
  return child
end

return M
