-- Specs for ddplua.distributed.store (runtime/comm/store*.c): the TCP store (server thread +
-- clients) and the file store, in one process and across real processes on 127.0.0.1.
-- Children are `build/ddplua` (or $DDPLUA_EXE) running small scripts written to temp files,
-- each in its own process group so cleanup can kill it even when a spec fails.
local ffi = require "ffi"
local store = require "ddplua.distributed.store"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local raw = require "raw_store_client"
local sleep, now, sh, read_file, write_file = raw.sleep, raw.now, raw.sh, raw.read_file, raw.write_file
local u32le, hmac, recv_exact, closed_by_peer, authenticate =
  raw.u32le, raw.hmac, raw.recv_exact, raw.closed_by_peer, raw.authenticate
local function raw_connect(port, unauthenticated) return raw.connect(port, not unauthenticated) end



-- Children started by a spec; after_each kills whatever is still running.
local children = {}

-- Start `code` in a child ddplua with the environment `env` (table). Returns a handle with
-- :wait(timeout) -> exit status (nil when it did not end), :stderr(), :stdout().
local function spawn(code, env)
  local child = raw.spawn(exe, code, env)
  children[#children + 1] = child
  return child
end

-- Wait for a child to end with status 0; the failure message shows its stderr.
local function assert_exit_ok(child, timeout)
  local status = child:wait(timeout)
  assert(status == 0, ("child exited with %s; stderr:\n%s\nstdout:\n%s"):format(tostring(status),
    child:stderr(), child:stdout()))
end

local stores = {}
local function keep(s) stores[#stores + 1] = s; return s end

-- A server store of this process on a free port.
local function server(opts)
  opts = opts or {}
  opts.is_server = true
  return keep(store.TCPStore("127.0.0.1", 0, opts))
end


-- A child script's preamble: the store module and the environment it was given.
local PRE = [[
local store = require "ddplua.distributed.store"
local ffi = require "ffi"
pcall(ffi.cdef, "int usleep(unsigned int usec); int kill(int pid, int sig); int getpid(void);")
local RANK = tonumber(os.getenv("RANK") or "0")
local WORLD = tonumber(os.getenv("WORLD_SIZE") or "1")
local PORT = tonumber(os.getenv("STORE_PORT") or "0")
]]

describe("ddplua.distributed.store #dist", function()
  after_each(function()
    for _, s in ipairs(stores) do s:close() end
    stores = {}
    for _, c in ipairs(children) do c:cleanup() end
    children = {}
  end)

  describe("TCPStore in one process (server + clients)", function()
    it("sets, gets, adds, compare_sets, deletes, counts and checks keys", function()
      local s = server({ rank = 0, timeout = 5 })
      local port = s:port()
      assert.is_true(port > 0 and port < 65536)
      local c = keep(store.TCPStore("127.0.0.1", port, { rank = 1, timeout = 5 }))
      assert.equals(port, c:port())

      s:set("a", "hello")
      assert.equals("hello", c:get("a"))
      local bin = "x\0y\255\0" .. string.rep("z", 100000)
      c:set("bin", bin)
      assert.equals(bin, s:get("bin"))
      c:set("empty", "")
      assert.equals("", s:get("empty"))
      s:set("n", 42)
      assert.equals("42", c:get("n"))

      assert.equals(5, s:add("counter", 5))
      assert.equals(2, c:add("counter", -3))
      assert.equals("2", s:get("counter")) -- decimal text, as PyTorch
      assert.equals(3, c:add("counter"))
      assert.equals(2 ^ 40 + 3, s:add("counter", 2 ^ 40))

      -- compare_set: missing key with "" expected sets; wrong expected leaves and returns current
      assert.equals("first", s:compare_set("cas", "", "first"))
      assert.equals("first", c:compare_set("cas", "other", "second"))
      assert.equals("second", c:compare_set("cas", "first", "second"))
      assert.equals("second", s:get("cas"))
      -- missing key, non-empty expected: nothing set, expected comes back (PyTorch)
      assert.equals("exp", s:compare_set("nocas", "exp", "des"))
      assert.is_false(s:check({ "nocas" }))

      assert.equals(6, c:num_keys()) -- a, bin, empty, n, counter, cas
      assert.is_true(c:delete_key("a"))
      assert.is_false(s:check({ "a" }))
      assert.equals(5, s:num_keys())
    end)

    it("counts keys exactly and deletes them", function()
      local s = server({ timeout = 5 })
      assert.equals(0, s:num_keys())
      for i = 1, 5 do s:set("k" .. i, tostring(i)) end
      s:add("ctr", 1)
      assert.equals(6, s:num_keys())
      assert.is_true(s:check({ "k1", "k5", "ctr" }))
      assert.is_false(s:check({ "k1", "k6" }))
      assert.is_true(s:check({}))
      assert.is_true(s:delete_key("k1"))
      assert.is_false(s:delete_key("k1"))
      assert.is_false(s:check({ "k1" }))
      assert.equals(5, s:num_keys())
    end)

    it("wakes a waiting get when another client sets the key", function()
      local s = server({ timeout = 5 })
      local c = keep(store.TCPStore("127.0.0.1", s:port(), { timeout = 5 }))
      -- The waiting side is a child (this process can only block in one call at a time).
      local child = spawn(PRE .. [[
local c = store.TCPStore("127.0.0.1", PORT, {timeout = 10, rank = 1})
ffi.C.usleep(200000)
c:set("late", "arrived")
c:close()
]], { STORE_PORT = s:port() })
      local t0 = now()
      assert.equals("arrived", c:get("late"))
      assert.is_true(now() - t0 < 5)
      assert_exit_ok(child)
      c:wait({ "late" }, 1)
    end)

    it("raises on bad arguments at the caller's line", function()
      local s = server()
      assert.has_error(function() s:set("", "v") end)
      local ok, err = pcall(function() s:set("", "v") end)
      assert.is_false(ok)
      assert.matches("store_spec.lua:%d+: .*key is empty", err)
      assert.matches("key must be a string", select(2, pcall(s.get, s, 3)))
      assert.matches("add: amount must be an integer", select(2, pcall(s.add, s, "k", 1.5)))
      s:set("text", "abc")
      assert.matches("add to key 'text'.*not a decimal integer", select(2, pcall(s.add, s, "text", 1)))
      assert.matches("port 70000 out of range", select(2, pcall(store.TCPStore, "127.0.0.1", 70000)))
      assert.matches("timeout must be", select(2, pcall(store.TCPStore, "127.0.0.1", 1, { timeout = -1 })))
      -- the store still works after the refused calls
      s:set("ok", "1")
      assert.equals("1", s:get("ok"))
      s:close()
      assert.matches("store is closed", select(2, pcall(s.get, s, "ok")))
    end)

    it("takes PyTorch's is_master as the name of is_server", function()
      -- TCPStore(host, port, {is_master = true}) is what a PyTorch user types; it used to
      -- raise "unknown option 'is_master'".
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_master = true, timeout = 5 }))
      local c = keep(store.TCPStore("127.0.0.1", s:port(), { is_master = false, timeout = 5 }))
      c:set("k", "v")
      assert.equals("v", s:get("k"))
      -- both names agreeing is fine; disagreeing is an error naming both
      keep(store.TCPStore("127.0.0.1", 0, { is_master = true, is_server = true, timeout = 5 }))
      local ok, err = pcall(store.TCPStore, "127.0.0.1", 0, { is_master = true, is_server = false })
      assert.is_false(ok)
      assert.matches("store_spec.lua:%d+: TCPStore: is_master %(true%) and is_server %(false%)", err)
    end)

    it("refuses a port already in use, naming it", function()
      local s = server()
      local ok, err = pcall(store.TCPStore, "127.0.0.1", s:port(), { is_server = true, timeout = 1 })
      assert.is_false(ok)
      assert.matches("cannot listen on 127.0.0.1:" .. s:port(), err)
    end)
  end)

  describe("timeouts", function()
    it("a wait on a missing key times out naming the key, the timeout and the rank", function()
      local s = server({ rank = 1, timeout = 5 })
      local t0 = now()
      local ok, err = pcall(s.wait, s, { "never" }, 0.5)
      local dt = now() - t0
      assert.is_false(ok)
      assert.matches("store %(rank 1%): wait for key 'never' timed out after 0.5 s", err)
      assert.is_true(dt >= 0.45 and dt < 3, "took " .. dt .. " s")
      -- several keys: all named
      ok, err = pcall(s.wait, s, { "there", "never" }, 0.3)
      assert.matches("wait for keys 'there', 'never' timed out after 0.3 s", err)
      -- a get uses the store's timeout
      s:set_timeout(0.5)
      t0 = now()
      ok, err = pcall(s.get, s, "missing")
      dt = now() - t0
      assert.matches("store %(rank 1%): get: wait for key 'missing' timed out after 0.5 s", err)
      assert.is_true(dt >= 0.45 and dt < 3, "took " .. dt .. " s")
      -- the connection stays in step after a cancelled wait
      s:set("missing", "now here")
      assert.equals("now here", s:get("missing"))
      assert.equals(1, s:add("after", 1))
    end)

    it("waits that time out just as their key arrives keep the connection in step", function()
      -- A child sets race/1..N every 0.1 s. This process waits for odd keys generously (they
      -- must arrive) and for even keys with a timeout close to 0.1 s, right where the key's
      -- arrival and the client's cancel cross (Note [parked waits]). Whichever wins, the
      -- replies must stay in order: a counter and a compare_set read back right every time.
      local s = server({ timeout = 5 })
      local N = 10
      local child = spawn(PRE .. [[
local s = store.TCPStore("127.0.0.1", PORT, {timeout = 10})
s:wait({"go"})
for i = 1, tonumber(os.getenv("N")) do ffi.C.usleep(100000); s:set("race/" .. i, "x") end
s:close()
]], { STORE_PORT = s:port(), N = N })
      s:set("go", "1")
      local won = 0
      for i = 1, N do
        local timeout = i % 2 == 1 and 2 or 0.09 + 0.005 * i
        local ok, err = pcall(s.wait, s, { "race/" .. i }, timeout)
        if ok then won = won + 1 else
          assert.is_true(i % 2 == 0, err)
          assert.matches("wait for key 'race/" .. i .. "' timed out", err)
        end
        assert.equals(i, s:add("in_step", 1))
        assert.equals("v" .. i, s:compare_set("cas", i == 1 and "" or "v" .. (i - 1), "v" .. i))
      end
      assert_exit_ok(child)
      assert.is_true(won >= N / 2)
    end)

    it("uses an answer that crossed its cancel (scripted server)", function()
      -- A fake server (raw sockets in a child) leaves a WAIT unanswered until the client's
      -- CANCEL comes, then sends the answer and only then CANCELLED: the client must return
      -- success and stay in step for the next request (Note [parked waits]).
      local child = spawn(PRE .. [[
pcall(ffi.cdef, [=[
struct fake_sa { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
int socket(int d, int t, int p); int bind(int fd, const void *a, unsigned l);
int listen(int fd, int n); int accept(int fd, void *a, void *l);
int getsockname(int fd, void *a, unsigned *l);
long recv(int fd, void *b, size_t n, int f); long send(int fd, const void *b, size_t n, int f);
int close(int fd);
]=])
local C = ffi.C
local fd = C.socket(2, 1, 0)
local sa = ffi.new("struct fake_sa"); sa.family = 2; sa.addr = 0x0100007f
assert(C.bind(fd, sa, ffi.sizeof(sa)) == 0 and C.listen(fd, 4) == 0)
local len = ffi.new("unsigned[1]", ffi.sizeof(sa))
C.getsockname(fd, sa, len)
local port = bit.bor(bit.lshift(bit.band(sa.port, 0xff), 8), bit.rshift(sa.port, 8))
local f = io.open(os.getenv("PORT_FILE"), "w"); f:write(port); f:close()
local c = C.accept(fd, nil, nil)
local buf = ffi.new("uint8_t[64]")
local function read_exact(n)
  local got = 0
  while got < n do
    local r = tonumber(C.recv(c, buf + got, n - got, 0)); assert(r > 0, "client left"); got = got + r
  end
  return ffi.string(buf, n)
end
-- the server's half of the handshake (Note [store handshake]), with no secret
local ns = string.rep("n", 32)
C.send(c, "DDPSTOR1" .. ns, 40, 0)
local nc = read_exact(64):sub(1, 32)
local proof = ffi.new("uint8_t[32]")
local msg = "server" .. ns .. nc
require("ddplua.lib").C.ddp_hmac_sha256(proof, "", 0, msg, #msg)
C.send(c, proof, 32, 0)
assert(read_exact(10) == "\5\1\0\0\0\1\0\0\0k", "expected WAIT 'k'")
assert(read_exact(5) == "\9\0\0\0\0", "expected CANCEL")
local answer = "\0\0\0\0\0" .. "\2\0\0\0\0" -- OK (the wait's answer), then CANCELLED
C.send(c, answer, #answer, 0)
assert(read_exact(5) == "\8\0\0\0\0", "expected NUMKEYS")
local n = "\0\8\0\0\0" .. "\42\0\0\0\0\0\0\0"
C.send(c, n, #n, 0)
read_exact(0)
C.close(c); C.close(fd)
]])
      local port = child:port()
      local s = keep(store.TCPStore("127.0.0.1", port, { timeout = 5 }))
      s:wait({ "k" }, 0.2) -- times out on the client, then gets the answer: success
      assert.equals(42, s:num_keys())
      assert_exit_ok(child)
    end)

    it("a client started before the server connects once the server appears", function()
      -- Find a free port, release it, start the client, then the server on that port.
      local probe = store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 1 })
      local port = probe:port()
      probe:close()
      local child = spawn(PRE .. [[
local c = store.TCPStore("127.0.0.1", PORT, {timeout = 10, rank = 1})
c:set("hello", "from the early client")
c:wait({"bye"})
c:close()
]], { STORE_PORT = port })
      sleep(0.5)
      assert.is_nil(read_file(child.base .. ".status"), "the early client gave up") -- still trying
      local s = keep(store.TCPStore("127.0.0.1", port, { is_server = true, timeout = 10 }))
      assert.equals("from the early client", s:get("hello"))
      s:set("bye", "1")
      assert_exit_ok(child)
    end)

    it("a client with no server gives up after its timeout naming host:port", function()
      local probe = store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 1 })
      local port = probe:port()
      probe:close()
      local t0 = now()
      local ok, err = pcall(store.TCPStore, "127.0.0.1", port, { timeout = 0.5, rank = 2 })
      local dt = now() - t0
      assert.is_false(ok)
      assert.matches("store %(rank 2%)", err)
      assert.matches("could not connect to the store server at 127.0.0.1:" .. port .. " within 0.5 s", err)
      assert.is_true(dt >= 0.45 and dt < 3, "took " .. dt .. " s")
    end)

    it("the server dying makes a waiting client fail naming host:port, not hang", function()
      local child = spawn(PRE .. [[
local s = store.TCPStore("127.0.0.1", 0, {is_server = true, timeout = 10})
local f = io.open(os.getenv("PORT_FILE"), "w"); f:write(s:port()); f:close()
s:wait({"client_waiting"})
ffi.C.usleep(300000)
ffi.C.kill(ffi.C.getpid(), 9) -- die the hard way: no close, the kernel drops the sockets
]])
      local port = child:port()
      local c = keep(store.TCPStore("127.0.0.1", port, { timeout = 20, rank = 1 }))
      c:set("client_waiting", "1")
      local t0 = now()
      local ok, err = pcall(c.wait, c, { "never" })
      local dt = now() - t0
      assert.is_false(ok)
      assert.matches("store %(rank 1%): lost the connection to the store server at 127.0.0.1:" .. port, err)
      assert.matches("wait for key 'never'", err)
      assert.is_true(dt < 10, "took " .. dt .. " s")
      child:wait(5)
      -- later calls fail at once with the same cause
      assert.matches("connection to the store server at 127.0.0.1:" .. port .. " is lost",
        select(2, pcall(c.get, c, "x")))
    end)
  end)

  describe("malformed requests", function()
    it("close that connection, are logged, and the server keeps serving others", function()
      local child = spawn(PRE .. [[
local s = store.TCPStore("127.0.0.1", 0, {is_server = true, timeout = 20})
local f = io.open(os.getenv("PORT_FILE"), "w"); f:write(s:port()); f:close()
s:wait({"stop"})
s:set("stopped", "1")
ffi.C.usleep(100000)
s:close()
]])
      local port = child:port()
      local good = keep(store.TCPStore("127.0.0.1", port, { timeout = 10 }))
      good:set("before", "1")
      -- an unknown opcode
      local fd1 = raw_connect(port)
      local junk = "\77garbage that is no request at all"
      ffi.C.send(fd1, junk, #junk, 0)
      -- a SET whose key claims 4 GiB
      local fd2 = raw_connect(port)
      local big_key = "\1" .. u32le(2) .. u32le(0xffffffff)
      ffi.C.send(fd2, big_key, #big_key, 0)
      -- a SET whose value claims 2 GiB (over the 1 GiB cap), key fine
      local fd3 = raw_connect(port)
      local big_value = "\1" .. u32le(2) .. u32le(1) .. "k" .. u32le(0x80000000)
      ffi.C.send(fd3, big_value, #big_value, 0)
      -- a GET with 5 arguments
      local fd4 = raw_connect(port)
      local bad_count = "\2" .. u32le(5)
      ffi.C.send(fd4, bad_count, #bad_count, 0)
      -- half a request, left hanging: the server must not wait for the rest
      local fd5 = raw_connect(port)
      local half = "\1" .. u32le(2) .. u32le(3) .. "ke"
      ffi.C.send(fd5, half, #half, 0)
      for _, fd in ipairs({ fd1, fd2, fd3, fd4 }) do
        assert.is_true(closed_by_peer(fd, 5), "the server kept a malformed connection open")
        ffi.C.close(fd)
      end
      -- the well-behaved client is still served, while the half request waits
      assert.equals("1", good:get("before"))
      assert.equals(1, good:add("after", 1))
      good:set("big", string.rep("v", 3 * 1024 * 1024))
      assert.equals(3 * 1024 * 1024, #good:get("big"))
      ffi.C.close(fd5)
      good:set("stop", "1")
      good:wait({ "stopped" }, 5)
      assert_exit_ok(child)
      local log = child:stderr()
      assert.matches("closing the connection from 127.0.0.1:%d+: unknown opcode 77", log)
      assert.matches("key of 4294967295 bytes", log)
      assert.matches("value of 2147483648 bytes", log)
      assert.matches("opcode 2 with 5 arguments", log)
    end)
  end)

  describe("several processes", function()
    -- Every rank adds to a counter; the rank that completes it sets "all_arrived"; every rank
    -- waits for that and for the key its right neighbour sets, then reports done.
    local RANK_SCRIPT = PRE .. [[
local s = store.TCPStore("127.0.0.1", PORT, {timeout = 15, rank = RANK})
s:set("rank/" .. RANK, "hello from " .. RANK)
if s:add("counter", 1) == WORLD then s:set("all_arrived", "yes") end
s:wait({"all_arrived"})
local right = (RANK + 1) % WORLD
assert(s:get("rank/" .. right) == "hello from " .. right)
s:add("done", 1)
s:close()
]]

    local function run_world(world)
      local s = server({ rank = 0, timeout = 15 })
      local kids = {}
      for r = 1, world - 1 do
        kids[r] = spawn(RANK_SCRIPT, { RANK = r, WORLD_SIZE = world, STORE_PORT = s:port() })
      end
      -- rank 0 is this process
      s:set("rank/0", "hello from 0")
      if s:add("counter", 1) == world then s:set("all_arrived", "yes") end
      s:wait({ "all_arrived" })
      assert.equals("hello from 1", s:get("rank/1"))
      for r = 1, world - 1 do assert_exit_ok(kids[r]) end
      assert.equals(tostring(world), s:get("counter"))
      assert.equals(tostring(world - 1), s:get("done"))
    end

    it("two processes meet through the store", function() run_world(2) end)
    it("three processes meet through the store", function() run_world(3) end)
  end)

  describe("FileStore", function()
    local path
    before_each(function() path = os.tmpname(); os.remove(path) end)
    after_each(function() os.remove(path) end)

    it("sets, gets, adds, compare_sets, deletes and counts in one process", function()
      local s = keep(store.FileStore(path, { timeout = 5, rank = 0 }))
      local t = keep(store.FileStore(path, { timeout = 5 })) -- a second user of the same file
      assert.is_nil(s:port())
      assert.equals(0, s:num_keys())
      s:set("a", "x\0y")
      assert.equals("x\0y", t:get("a"))
      assert.equals(3, t:add("c", 3))
      assert.equals(1, s:add("c", -2))
      assert.equals("1", t:get("c"))
      assert.equals("v1", s:compare_set("cas", "", "v1"))
      assert.equals("v1", t:compare_set("cas", "zz", "v2"))
      assert.equals("v2", t:compare_set("cas", "v1", "v2"))
      assert.equals("e", t:compare_set("none", "e", "d"))
      assert.equals(3, t:num_keys())
      assert.is_true(s:check({ "a", "c", "cas" }))
      assert.is_true(t:delete_key("a"))
      assert.is_false(s:delete_key("a"))
      assert.is_false(s:check({ "a" }))
      assert.equals(2, s:num_keys())
      local ok, err = pcall(s.wait, s, { "never" }, 0.3)
      assert.matches("store %(rank 0%): wait for key 'never' timed out after 0.3 s %(file store " .. path, err)
      s:close()
      assert.is_not_nil(read_file(path)) -- t still uses it
      t:close()
      assert.is_nil(read_file(path)) -- the last user removed it
    end)

    it("refuses a corrupt file, naming it and the offset", function()
      write_file(path, "S" .. u32le(1) .. "k" .. u32le(1) .. "v" .. "Qjunk")
      local ok, err = pcall(store.FileStore, path, { timeout = 1 })
      assert.is_false(ok)
      assert.matches("file store " .. path .. " has a corrupt record at offset 11", err)
    end)

    it("is shared by two processes", function()
      local s = keep(store.FileStore(path, { timeout = 10, rank = 0 }))
      local child = spawn(PRE .. [[
local s = store.FileStore(os.getenv("STORE_PATH"), {timeout = 10, rank = 1})
s:add("counter", 1)
s:set("child_key", "from the child")
assert(s:get("parent_key") == "from the parent")
s:wait({"bye"})
s:close()
]], { STORE_PATH = path })
      s:add("counter", 1)
      s:set("parent_key", "from the parent")
      assert.equals("from the child", s:get("child_key"))
      s:set("bye", "1")
      assert_exit_ok(child)
      assert.equals("2", s:get("counter"))
    end)
  end)
end)
