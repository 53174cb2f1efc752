--- ddplua.distributed.store: the key-value rendezvous of the distributed layer (PyTorch's
-- TCPStore and FileStore), over runtime/comm/store.c (C API: ddplua/store.h).
--
--   local store = require "ddplua.distributed.store"
--   local s = store.TCPStore("127.0.0.1", 29500, {is_server = rank == 0, rank = rank, timeout = 60})
--   s:set("addr/" .. rank, my_address)
--   local peer = s:get("addr/0")              -- waits (up to the timeout) until rank 0 set it
--   local n = s:add("arrived", 1)             -- atomic counter, kept as decimal text ("3")
--   s:wait({"go"}, 5)                         -- waits for keys, 5 s here
--   s:close()
--
-- Keys are non-empty strings; values are byte strings (up to 1 GiB). Every blocking call
-- gives up after the store's timeout (default 300 s, as PyTorch) with an error naming the
-- key(s), the timeout and the rank; a lost server raises naming host:port. Errors are raised
-- at the caller's line.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local ffi, C = lib.ffi, lib.C
local check, raise = lib.check, lib.raise

local M = {}

--- PyTorch's default store timeout, in seconds.
M.DEFAULT_TIMEOUT = 300

local Store = {}
Store.__index = Store

local store_box = ffi.new("ddp_store*[1]")
local value_box = ffi.new("void*[1]")
local len_box = ffi.new("size_t[1]")
local i64_box = ffi.new("int64_t[1]")
local int_box = ffi.new("int[1]")

local function free_store(p) C.ddp_store_free(p) end

local function new_store(kind, desc, rank, timeout)
  local s = setmetatable({ _ptr = ffi.gc(store_box[0], free_store), kind = kind, desc = desc,
                           rank = rank, timeout = timeout }, Store)
  return s
end

local function opt_timeout(opts)
  local t = opts.timeout
  if t == nil then return M.DEFAULT_TIMEOUT end
  if type(t) ~= "number" or not (t > 0) then
    raise("store: timeout must be a number of seconds > 0, got " .. tostring(t))
  end
  return t
end

local function opt_rank(opts)
  local r = opts.rank
  if r ~= nil and (type(r) ~= "number" or r ~= math.floor(r) or r < 0) then
    raise("store: rank must be an integer >= 0, got " .. tostring(r))
  end
  return r
end

local tcp_opts = ffi.new("ddp_store_tcp_options")

local function opt_number(opts, name, what)
  local v = opts[name]
  if v ~= nil and (type(v) ~= "number" or not (v >= 0)) then
    raise(("TCPStore: %s must be %s >= 0, got %s"):format(name, what, tostring(v)))
  end
  return v or 0
end

local TCP_KNOWN = options.known { "is_server", "is_master", "timeout", "rank", "secret", "idle_timeout",
  "max_memory", "max_connections" }
local FILE_KNOWN = options.known { "timeout", "rank" }

--- A TCP store client of the server at host:port, connected once it proved the job's secret
-- (README, "Security").
-- opts.is_server (default false; opts.is_master is PyTorch's name for it, and giving both
-- with different truth values raises): also run the server in this process (a background
-- thread), listening at the address `host` names and no other ("127.0.0.1": this machine
-- only; "0.0.0.0": every interface) on `port` (0 picks a free port: read it with s:port()).
-- Clients retry connecting until the timeout (the server may start later).
-- opts.timeout: seconds for every blocking call (default 300). opts.rank: rank named in
-- error messages. opts.secret: the job's secret (a string; default $DDPLUA_STORE_SECRET,
-- else none), the same on the server and every client.
-- Server bounds (0 or nil: the defaults): opts.idle_timeout (seconds, default 30: a
-- connection that has not proved the secret, or a partial request idle that long, is
-- closed), opts.max_memory (bytes of keys, values and buffers, default 2 GiB),
-- opts.max_connections (default min(1024, half the descriptor limit)).
-- Raises on a bad port or option, a port already in use, no server within the timeout
-- (naming host:port), or a server that refused this client's secret.
function M.TCPStore(host, port, opts)
  opts = options.check("TCPStore", opts, TCP_KNOWN)
  if host ~= nil and type(host) ~= "string" then
    raise("TCPStore: host must be a string, got " .. type(host))
  end
  if type(port) ~= "number" or port ~= math.floor(port) then
    raise("TCPStore: port must be an integer, got " .. tostring(port))
  end
  local timeout, rank = opt_timeout(opts), opt_rank(opts)
  if opts.secret ~= nil and type(opts.secret) ~= "string" then
    raise("TCPStore: secret must be a string, got " .. type(opts.secret))
  end
  local is_server = opts.is_server
  if opts.is_master ~= nil then
    if is_server ~= nil and (not is_server) ~= (not opts.is_master) then
      raise(("TCPStore: is_master (%s) and is_server (%s) disagree; is_master is PyTorch's "
        .. "name for is_server: give one of them"):format(tostring(opts.is_master), tostring(is_server)))
    end
    is_server = opts.is_master
  end
  tcp_opts.is_server = is_server and 1 or 0
  tcp_opts.timeout_s = timeout
  tcp_opts.rank = rank or -1
  tcp_opts.secret = opts.secret -- nil: the environment's
  tcp_opts.idle_timeout_s = opt_number(opts, "idle_timeout", "a number of seconds")
  tcp_opts.max_memory = opt_number(opts, "max_memory", "a number of bytes")
  tcp_opts.max_connections = opt_number(opts, "max_connections", "a count")
  local st = C.ddp_store_tcp_open(store_box, host or "127.0.0.1", port, tcp_opts)
  tcp_opts.secret = nil -- the Lua string is not kept alive by the struct
  check(st)
  local s = new_store("tcp", (host or "127.0.0.1") .. ":", rank, timeout)
  s.desc = s.desc .. C.ddp_store_port(s._ptr)
  return s
end

--- A store kept in the file at `path` (file:// init), shared by every process opening the
-- same path (append-only log under flock(); the last store closed removes the file).
-- opts.timeout (seconds, default 300), opts.rank (named in errors). Raises when the file
-- cannot be opened or locked.
function M.FileStore(path, opts)
  opts = options.check("FileStore", opts, FILE_KNOWN)
  if type(path) ~= "string" or path == "" then
    raise("FileStore: path must be a non-empty string, got " .. tostring(path))
  end
  lib.path(path, "FileStore")
  local timeout, rank = opt_timeout(opts), opt_rank(opts)
  check(C.ddp_store_file_new_ranked(store_box, path, timeout, rank or -1))
  return new_store("file", path, rank, timeout)
end

--- A fresh job secret: 64 hex digits (256 random bits), for DDPLUA_STORE_SECRET or
-- opts.secret. Raises when the kernel gives no random bytes.
function M.new_secret()
  local buf = ffi.new("char[65]")
  check(C.ddp_store_new_secret(buf, 65))
  return ffi.string(buf)
end

--- True when v is a store object.
function M.is_store(v)
  return getmetatable(v) == Store
end

local function ptr(self, op)
  if getmetatable(self) ~= Store then raise("store:" .. op .. ": call it with ':' on a store") end
  local p = self._ptr
  if p == nil then raise("store:" .. op .. ": the store is closed") end
  return p
end

-- A key C can take whole (a NUL byte would cut it short: two keys would meet).
local function key_arg(key, op)
  return lib.c_string(key, "store:" .. op, "key")
end

local function value_arg(v, op, what)
  if type(v) == "number" then return tostring(v) end
  if type(v) ~= "string" then
    raise("store:" .. op .. ": " .. what .. " must be a string, got " .. type(v))
  end
  return v
end

--- Set key to value (a string; a number is stored as its text). Wakes waiters on the key.
function Store:set(key, value)
  local p = ptr(self, "set")
  value = value_arg(value, "set", "value")
  check(C.ddp_store_set(p, key_arg(key, "set"), value, #value))
end

local function take_value()
  local v = ffi.string(value_box[0], len_box[0])
  C.ddp_store_free_value(value_box[0])
  return v
end

--- The value of key as a string, waiting up to the store's timeout for it to be set.
-- Raises (timeout) naming the key, the timeout and the rank.
function Store:get(key)
  local p = ptr(self, "get")
  check(C.ddp_store_get(p, key_arg(key, "get"), value_box, len_box))
  return take_value()
end

--- Atomically add n (an integer, default 1) to the counter at key (missing counts as 0) and
-- return the new value. The value is stored as decimal text, as in PyTorch. Raises when the
-- key holds something that is not an integer.
function Store:add(key, n)
  local p = ptr(self, "add")
  n = n or 1
  if type(n) ~= "number" or n ~= math.floor(n) then
    raise("store:add: amount must be an integer, got " .. tostring(n))
  end
  check(C.ddp_store_add(p, key_arg(key, "add"), n, i64_box))
  return tonumber(i64_box[0])
end

--- PyTorch's compare_set: when key holds `expected` (or is missing and expected is ""), set
-- it to `desired`. Returns the value stored afterwards (for a missing key and a non-empty
-- expected: expected itself).
function Store:compare_set(key, expected, desired)
  local p = ptr(self, "compare_set")
  expected = value_arg(expected, "compare_set", "expected")
  desired = value_arg(desired, "compare_set", "desired")
  check(C.ddp_store_compare_set(p, key_arg(key, "compare_set"), expected, #expected, desired,
                                #desired, value_box, len_box))
  return take_value()
end

local function key_array(keys, op)
  if type(keys) == "string" then keys = { keys } end
  if type(keys) ~= "table" then raise("store:" .. op .. ": keys must be a table of strings") end
  local n = #keys
  local arr = ffi.new("const char*[?]", n > 0 and n or 1)
  for i = 1, n do arr[i - 1] = key_arg(keys[i], op) end
  return arr, n
end

--- Wait until every key of `keys` (a table of strings, or one string) is set, up to
-- `timeout` seconds (default: the store's timeout). Raises (timeout) naming the keys.
function Store:wait(keys, timeout)
  local p = ptr(self, "wait")
  if timeout ~= nil and (type(timeout) ~= "number" or not (timeout >= 0)) then
    raise("store:wait: timeout must be a number of seconds >= 0, got " .. tostring(timeout))
  end
  local arr, n = key_array(keys, "wait")
  check(C.ddp_store_wait(p, arr, n, timeout or -1))
end

--- True when every key of `keys` is set now (never waits).
function Store:check(keys)
  local p = ptr(self, "check")
  local arr, n = key_array(keys, "check")
  check(C.ddp_store_check(p, arr, n, int_box))
  return int_box[0] ~= 0
end

--- Delete key; true when it existed.
function Store:delete_key(key)
  local p = ptr(self, "delete_key")
  check(C.ddp_store_delete_key(p, key_arg(key, "delete_key"), int_box))
  return int_box[0] ~= 0
end

--- Number of keys set now.
function Store:num_keys()
  check(C.ddp_store_num_keys(ptr(self, "num_keys"), i64_box))
  return tonumber(i64_box[0])
end

--- The TCP port (the server's real port when made with port 0); nil for a file store.
function Store:port()
  local port = C.ddp_store_port(ptr(self, "port"))
  return port >= 0 and port or nil
end

--- What the server run by this store holds now: bytes (keys, values and connection
-- buffers) and open connections. Raises when this store runs no server.
function Store:server_stats()
  check(C.ddp_store_server_stats(ptr(self, "server_stats"), i64_box, int_box))
  return { bytes = tonumber(i64_box[0]), connections = int_box[0] }
end

--- Change the timeout (seconds > 0) of later blocking calls.
function Store:set_timeout(timeout)
  local p = ptr(self, "set_timeout")
  if type(timeout) ~= "number" then raise("store:set_timeout: timeout must be a number") end
  check(C.ddp_store_set_timeout(p, timeout))
  self.timeout = timeout
end

--- Change the rank named in error messages.
function Store:set_rank(rank)
  local p = ptr(self, "set_rank")
  rank = opt_rank({ rank = rank })
  C.ddp_store_set_rank(p, rank or -1)
  self.rank = rank
end

--- The C handle (ddp_store*) for other modules (process groups); valid until close().
function Store:handle()
  return ptr(self, "handle")
end

--- Close the connection (or file). A store running the server stops it at once: agree with
-- the other ranks first (a barrier, or a key every rank waits for). Calling it twice is fine.
function Store:close()
  local p = self._ptr
  if p == nil then return end
  self._ptr = nil
  ffi.gc(p, nil)
  C.ddp_store_free(p)
end

function Store:__tostring()
  return ("%sStore(%s%s)"):format(self.kind == "tcp" and "TCP" or "File", self.desc,
    self._ptr == nil and ", closed" or "")
end

return M
