-- Fault specs for the store's security (issue 10, part 3): the handshake that proves the job's
-- secret (Note [store handshake]), binding only the address asked for, the server's bounds
-- (Note [store bounds]: memory, idle partial frames, connections, descriptor exhaustion),
-- checked ADD overflow, the launcher's secret, and shared-memory segment names (Note [shm
-- segment names]). Every case is what an attacker on the same host did before the fix.
local ffi = require "ffi"
local store = require "ddplua.distributed.store"
local mp = require "multiproc"
local C = require("ddplua.lib").C

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local raw = require "raw_store_client"
local files = require "files"
local sleep, now, sh, read_file, write_file = raw.sleep, raw.now, raw.sh, raw.read_file, raw.write_file
local u32le, hex, hmac, send, recv_exact = raw.u32le, raw.hex, raw.hmac, raw.send, raw.recv_exact
local closed_by_peer, authenticate = raw.closed_by_peer, raw.authenticate
local function raw_connect(port) return raw.connect(port, false) end

local function set_frame(key, value)
  return "\1" .. u32le(2) .. u32le(#key) .. key .. u32le(#value) .. value
end

-- Listening sockets of this machine on `port`: their local addresses as /proc/net/tcp{,6}
-- writes them ("0100007F" is 127.0.0.1, "00000000" every interface).
local function listeners(port)
  local found = {}
  local want = (":%04X"):format(port)
  for _, f in ipairs({ "/proc/net/tcp", "/proc/net/tcp6" }) do
    for line in (read_file(f) or ""):gmatch("[^\n]+") do
      local addr, p, st = line:match("^%s*%d+: (%x+)(:%x+) %x+:%x+ (%x%x)")
      if addr and p == want and st == "0A" then found[#found + 1] = addr end
    end
  end
  return found
end

local stores = {}
local function keep(s) stores[#stores + 1] = s; return s end

-- Background ddplua children: { pid file, status file, stderr file }.
local children = {}
local function spawn(code, prefix_cmd, env)
  local child = raw.spawn(exe, code, env, prefix_cmd)
  children[#children + 1] = child
  return child
end

describe("store security #faults #dist", function()
  after_each(function()
    for _, s in ipairs(stores) do pcall(s.close, s) end
    stores = {}
    for _, c in ipairs(children) do c:cleanup() end
    children = {}
  end)

  describe("HMAC-SHA256", function()
    it("matches RFC 4231's test cases (short key, text key, key longer than a block)", function()
      assert.equal("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        hex(hmac(string.rep("\11", 20), "Hi There")))
      assert.equal("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        hex(hmac("Jefe", "what do ya want for nothing?")))
      assert.equal("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        hex(hmac(string.rep("\170", 131), "Test Using Larger Than Block-Size Key - Hash Key First")))
      -- a message over several blocks (test case 7)
      assert.equal("9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        hex(hmac(string.rep("\170", 131), "This is a test using a larger than block-size key and a "
          .. "larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.")))
    end)

    it("new_secret gives 64 hex digits, fresh each time", function()
      local a, b = store.new_secret(), store.new_secret()
      assert.matches("^%x+$", a)
      assert.equal(64, #a)
      assert.not_equal(a, b)
    end)
  end)

  describe("the handshake", function()
    it("a raw client sending a well-formed SET without the secret changes nothing", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "job-secret",
                                                       idle_timeout = 1 }))
      local port = s:port()
      -- straight to a request, no handshake (shorter than an answer: closed at the idle timeout)
      local a = raw_connect(port)
      send(a, set_frame("weights", "NaN"))
      -- a handshake with the wrong secret, then the request
      local b = raw_connect(port)
      local ok = pcall(authenticate, b, "guessed")
      assert.is_false(ok)
      send(b, set_frame("weights", "NaN"))
      -- a replayed answer of an earlier, genuine handshake: the nonces differ
      local c = raw_connect(port)
      local hello = recv_exact(c, 40)
      local nc = string.rep("r", 32)
      local genuine_for_other_nonce = hmac("job-secret", "client" .. string.rep("x", 32) .. nc)
      send(c, nc .. genuine_for_other_nonce .. set_frame("weights", "NaN"))
      assert.equal(40, #hello)
      for _, fd in ipairs({ a, b, c }) do
        assert.is_true(closed_by_peer(fd, 3), "the server kept an unauthenticated connection")
        ffi.C.close(fd)
      end
      assert.is_false(s:check({ "weights" }))
      assert.equal(0, s:num_keys())
      -- the genuine secret gets in, on a raw socket too
      local d = raw_connect(port)
      authenticate(d, "job-secret")
      send(d, set_frame("ok", "1"))
      assert.equal("\0\0\0\0\0", recv_exact(d, 5))
      ffi.C.close(d)
      assert.equal("1", s:get("ok"))
    end)

    it("a client with the wrong secret fails at once, naming the secret", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "right" }))
      local t0 = now()
      local ok, err = pcall(store.TCPStore, "127.0.0.1", s:port(), { timeout = 5, secret = "wrong", rank = 1 })
      assert.is_false(ok)
      assert.matches("store %(rank 1%): the store server at 127.0.0.1:%d+ refused this process's secret", err)
      assert.matches("DDPLUA_STORE_SECRET", err)
      assert.is_true(now() - t0 < 3)
      local good = keep(store.TCPStore("127.0.0.1", s:port(), { timeout = 5, secret = "right" }))
      good:set("k", "v")
      assert.equal("v", s:get("k"))
    end)

    it("a client refuses a server that does not know the secret", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "server-only" }))
      local ok, err = pcall(store.TCPStore, "127.0.0.1", s:port(), { timeout = 2, secret = "" })
      assert.is_false(ok)
      assert.matches("refused this process's secret", err)
    end)
  end)

  describe("binding", function()
    it("a server asked for 127.0.0.1 listens on loopback only; 0.0.0.0 on every interface", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5 }))
      assert.same({ "0100007F" }, listeners(s:port()))
      local l = keep(store.TCPStore("localhost", 0, { is_server = true, timeout = 5 }))
      assert.same({ "0100007F" }, listeners(l:port()))
      local any = keep(store.TCPStore("0.0.0.0", 0, { is_server = true, timeout = 5, secret = "k" }))
      assert.same({ "00000000" }, listeners(any:port()))
    end)

    -- Note [no open listener without a secret]: srun, mpirun and hand-started ranks give
    -- MASTER_ADDR a cluster address; without a secret the server must not listen there.
    it("refuses to listen beyond loopback without a secret, saying what to set", function()
      local ok, err = pcall(store.TCPStore, "0.0.0.0", 0, { is_server = true, timeout = 5, secret = "" })
      assert.is_false(ok)
      assert.matches("refusing to listen on 0.0.0.0", err, 1, true)
      assert.matches("Set DDPLUA_STORE_SECRET", err, 1, true)
    end)

    it("an srun-style rank with MASTER_ADDR off loopback and no secret refuses to start", function()
      local p = io.popen("hostname -I 2>/dev/null")
      local addr = (p:read("*a") or ""):match("^(%d+%.%d+%.%d+%.%d+)") or "0.0.0.0"
      p:close()
      local path = os.tmpname()
      write_file(path, "require('ddplua.distributed').init_process_group{timeout = 10}; print('joined')")
      local out = io.popen(("env -u DDPLUA_STORE_SECRET -u RANK -u WORLD_SIZE SLURM_PROCID=0 SLURM_NTASKS=1 " ..
        "SLURM_LOCALID=0 MASTER_ADDR=%s MASTER_PORT=%d timeout 30 %s %s 2>&1; echo status=$?")
        :format(addr, mp.free_port(), sh(exe), sh(path))):read("*a")
      os.remove(path)
      assert.matches("refusing to listen on " .. addr, out, 1, true)
      assert.matches("Set DDPLUA_STORE_SECRET", out, 1, true)
      assert.not_matches("joined", out, 1, true)
      assert.matches("status=1\n$", out)
    end)

    -- rank 1 of the same job: it listens on nothing, but would wait out its whole timeout
    -- for a store that rank 0 refused to start
    it("an srun-style rank > 0 with MASTER_ADDR off loopback and no secret stops at once, saying what to set", function()
      local p = io.popen("hostname -I 2>/dev/null")
      local addr = (p:read("*a") or ""):match("^(%d+%.%d+%.%d+%.%d+)") or "0.0.0.0"
      p:close()
      local path = os.tmpname()
      write_file(path, "require('ddplua.distributed').init_process_group{timeout = 20}; print('joined')")
      local t0 = now()
      local out = io.popen(("env -u DDPLUA_STORE_SECRET -u RANK -u WORLD_SIZE SLURM_PROCID=1 SLURM_NTASKS=2 " ..
        "SLURM_LOCALID=1 MASTER_ADDR=%s MASTER_PORT=%d timeout 60 %s %s 2>&1; echo status=$?")
        :format(addr, mp.free_port(), sh(exe), sh(path))):read("*a")
      os.remove(path)
      assert.is_true(now() - t0 < 10, ("took %.1f s:\n%s"):format(now() - t0, out))
      assert.matches("refusing to join the store at " .. addr, out, 1, true)
      assert.matches("Set DDPLUA_STORE_SECRET", out, 1, true)
      assert.matches("status=1\n$", out)
    end)

    it("warns once when it listens on loopback without a secret", function()
      local out = files.run_fresh("store-nosecret", [[
        local store = require "ddplua.distributed.store"
        local a = store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "" })
        local b = store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "" })
        print("served " .. tostring(a:port() > 0 and b:port() > 0))
      ]])
      assert.matches("served true", out, 1, true)
      local _, warnings = out:gsub("has no secret", "")
      assert.equal(1, warnings, out)
    end)
  end)

  describe("bounds", function()
    it("3 connections declaring 1 GiB values hold nothing without the secret, and are closed at the idle timeout", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "k", idle_timeout = 0.5 }))
      s:set("warm", "1")
      sleep(0.05)
      local before = s:server_stats().bytes -- the server's own client's buffers
      local fds = {}
      local chunk = string.rep("x", 1048576)
      for i = 1, 3 do
        fds[i] = raw_connect(s:port())
        send(fds[i], "\1" .. u32le(2) .. u32le(1) .. "k" .. u32le(0x40000000))
        for _ = 1, 8 do send(fds[i], chunk) end
      end
      local stats = s:server_stats()
      assert.is_true(stats.bytes - before < 4096, ("the server holds %d bytes more"):format(stats.bytes - before))
      for i = 1, 3 do
        assert.is_true(closed_by_peer(fds[i], 3), "an unauthenticated connection outlived the idle timeout")
        ffi.C.close(fds[i])
      end
    end)

    it("authenticated connections stay under max_memory; partial frames close at the idle timeout", function()
      local limit = 8 * 1024 * 1024
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "k",
                                                       idle_timeout = 0.5, max_memory = limit }))
      local fds, chunk = {}, string.rep("x", 1048576)
      local peak = 0
      for i = 1, 3 do
        fds[i] = raw_connect(s:port())
        authenticate(fds[i], "k")
        send(fds[i], "\1" .. u32le(2) .. u32le(1) .. "k" .. u32le(0x40000000))
        for _ = 1, 6 do
          if send(fds[i], chunk) <= 0 then break end
        end
        sleep(0.05)
        peak = math.max(peak, s:server_stats().bytes)
      end
      assert.is_true(peak <= limit, ("held %d bytes, over the %d limit"):format(peak, limit))
      for i = 1, 3 do
        assert.is_true(closed_by_peer(fds[i], 3), "a partial request outlived the idle timeout")
        ffi.C.close(fds[i])
      end
      sleep(0.1)
      assert.is_true(s:server_stats().bytes < 1024 * 1024, "memory not released: " .. s:server_stats().bytes)
      -- a set past the limit is refused with an error; the store still serves
      local ok, err = pcall(s.set, s, "big", string.rep("v", 10 * 1024 * 1024)) -- refused before it comes
      assert.is_false(ok)
      assert.matches("would pass the store's memory limit of 8388608 bytes", err)
      s:set("five", string.rep("v", 5 * 1024 * 1024))
      ok, err = pcall(s.set, s, "five again", string.rep("v", 5 * 1024 * 1024)) -- the table would pass it
      assert.is_false(ok)
      assert.matches("memory limit of 8388608 bytes", err)
      assert.equal(5 * 1024 * 1024, #s:get("five"))
      s:set("small", "1")
      assert.equal("1", s:get("small"))
    end)

    it("a slow frame (one byte at a time, no secret) is closed at the idle timeout from accept", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, secret = "k", idle_timeout = 0.6 }))
      local fd = raw_connect(s:port())
      recv_exact(fd, 40)
      local t0 = now()
      local closed = false
      for _ = 1, 40 do
        if send(fd, "z") <= 0 or closed_by_peer(fd, 0.1) then closed = true; break end
      end
      ffi.C.close(fd)
      assert.is_true(closed, "a trickling connection was kept")
      assert.is_true(now() - t0 < 3)
    end)

    it("ADD that would overflow int64 is an error and leaves the value (TCP and file)", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5 }))
      local path = os.tmpname()
      os.remove(path)
      local f = keep(store.FileStore(path, { timeout = 5 }))
      for _, st in ipairs({ s, f }) do
        st:set("max", "9223372036854775807")
        local ok, err = pcall(st.add, st, "max", 1)
        assert.is_false(ok)
        assert.matches("overflows a 64%-bit integer", err)
        assert.equal("9223372036854775807", st:get("max"))
        st:set("min", "-9223372036854775808")
        assert.is_false(pcall(st.add, st, "min", -1))
        assert.equal("-9223372036854775808", st:get("min"))
        assert.equal(9223372036854775806, st:add("max", -1))
      end
      f:close()
      os.remove(path)
    end)

    it("descriptor exhaustion (ulimit -n) neither spins the server nor stops it serving afterwards", function()
      local child = spawn([[
local store = require "ddplua.distributed.store"
local s = store.TCPStore("127.0.0.1", 0, {is_server = true, timeout = 20, max_connections = 1000})
local f = io.open(os.getenv("PORT_FILE"), "w"); f:write(s:port()); f:close()
s:wait({"t0"}); local c0 = os.clock()
s:wait({"t1"}); local c1 = os.clock()
s:set("cpu", tostring(c1 - c0))
s:wait({"stop"})
s:set("stopped", "1")
s:close()
]], "ulimit -n 48")
      local port = child:port()
      local legit = keep(store.TCPStore("127.0.0.1", port, { timeout = 10 }))
      local fds = {}
      for i = 1, 80 do fds[i] = raw_connect(port) end
      legit:set("t0", "1")
      sleep(1)
      legit:set("t1", "1")
      local cpu = tonumber(legit:get("cpu"))
      assert.is_true(cpu < 0.3, ("the server used %.2f s of CPU in 1 s while out of descriptors"):format(cpu))
      for i = 1, 80 do ffi.C.close(fds[i]) end
      -- served again once descriptors are back
      local late = keep(store.TCPStore("127.0.0.1", port, { timeout = 5 }))
      late:set("stop", "1")
      assert.equal(0, child:wait(10))
      assert.matches("not accepting connections for now: Too many open files", child:stderr())
    end)

    -- Note [store close log]: one client failing handshakes in a loop wrote a line each
    -- (39,953 lines in 5 s); now at most one a second, with the count of those left out.
    it("logs failed handshakes at a bounded rate, with the count of those not logged", function()
      local child = spawn([[
local store = require "ddplua.distributed.store"
local s = store.TCPStore("127.0.0.1", 0, {is_server = true, timeout = 20, secret = "k"})
local f = io.open(os.getenv("PORT_FILE"), "w"); f:write(s:port()); f:close()
s:wait({"stop"})
s:close()
]])
      local port = child:port()
      local t0 = now()
      for _ = 1, 300 do
        local fd = raw_connect(port)
        recv_exact(fd, 40)
        send(fd, string.rep("\0", 64)) -- a proof made without the secret
        closed_by_peer(fd, 2)
        ffi.C.close(fd)
      end
      local seconds = now() - t0
      local stop = keep(store.TCPStore("127.0.0.1", port, { timeout = 5, secret = "k" }))
      stop:set("stop", "1")
      assert.equal(0, child:wait(10))
      local err = child:stderr()
      local _, lines = err:gsub("closing the connection from", "")
      assert.is_true(lines >= 1 and lines <= seconds + 2, ("%d lines in %.1f s:\n%s"):format(lines, seconds, err))
      if seconds > 1.2 then assert.matches("more closed, not logged, in the last second", err, 1, true) end
    end)

    it("the connection cap: silent connections make way for ranks; proven ones make them wait", function()
      local s = keep(store.TCPStore("127.0.0.1", 0, { is_server = true, timeout = 5, max_connections = 4,
                                                       idle_timeout = 30, secret = "k" }))
      local silent = {}
      for i = 1, 3 do silent[i] = raw_connect(s:port()) end -- with the server's own client: 4
      sleep(0.2)
      assert.equal(4, s:server_stats().connections)
      local a = keep(store.TCPStore("127.0.0.1", s:port(), { timeout = 2, secret = "k" }))
      a:set("a", "1") -- got in by replacing the oldest silent connection
      assert.is_true(closed_by_peer(silent[1], 1))
      local proven = {}
      for i = 1, 2 do
        proven[i] = raw_connect(s:port())
        authenticate(proven[i], "k") -- replaces the other silent ones
      end
      assert.equal(4, s:server_stats().connections)
      local ok = pcall(store.TCPStore, "127.0.0.1", s:port(), { timeout = 0.5, secret = "k" })
      assert.is_false(ok) -- every connection proved the secret: it waits in the backlog
      ffi.C.close(proven[1])
      local c = keep(store.TCPStore("127.0.0.1", s:port(), { timeout = 5, secret = "k" }))
      c:set("in", "1")
      assert.equal("1", s:get("in"))
      ffi.C.close(proven[2])
      for i = 1, 3 do ffi.C.close(silent[i]) end
    end)
  end)

  describe("a job", function()
    it("of the launcher has a secret, listens on loopback only, and a raw SET changes nothing", function()
      local base = os.tmpname()
      finally(function()
        for _, ext in ipairs({ "", ".lua", ".ready", ".go", ".listen" }) do os.remove(base .. ext) end
      end)
      write_file(base .. ".lua", ([[
local dist = require "ddplua.distributed"
local dl = require "ddplua"
local base = %q
dist.init_process_group{backend = "gloo", timeout = 20}
local rank = dist.get_rank()
local secret = os.getenv("DDPLUA_STORE_SECRET")
assert(secret and #secret == 64, "no secret from the launcher")
if rank == 0 then
  local f = io.open(base .. ".ready", "w"); f:write(os.getenv("MASTER_PORT")); f:close()
  local deadline = os.time() + 15
  while not io.open(base .. ".go") and os.time() < deadline do os.execute("sleep 0.05") end
end
dist.barrier()
local t = dl.tensor({rank + 1, 10})
dist.all_reduce(t)
assert(t:tolist()[1] == 3 and t:tolist()[2] == 20)
assert(not dist.get_store():check({"attack"}), "the attacker's key is in the store")
print("secret " .. secret)
print("finished")
dist.destroy_process_group()
]]):format(base))
      local cmd = ("%s --nproc_per_node=2 --standalone %s > %s 2>&1 & echo $!"):format(sh(exe), sh(base .. ".lua"), sh(base .. ".out"))
      local p = io.popen(cmd)
      p:read("*l")
      p:close()
      local port
      local deadline = now() + 20
      repeat
        port = tonumber(read_file(base .. ".ready") or "")
        if not port then sleep(0.05) end
      until port or now() > deadline
      assert(port, "the job never got ready: " .. (read_file(base .. ".out") or ""))
      assert.same({ "0100007F" }, listeners(port))
      local fd = raw_connect(port)
      send(fd, set_frame("attack", string.rep("1", 100))) -- read as a (wrong) answer: closed at once
      assert.is_true(closed_by_peer(fd, 3))
      ffi.C.close(fd)
      write_file(base .. ".go", "")
      local out
      deadline = now() + 30
      repeat
        out = read_file(base .. ".out") or ""
        if not out:find("finished.*finished") then sleep(0.1) end
      until out:find("finished.*finished") or now() > deadline
      assert.matches("%[rank 0%]: finished", out)
      assert.matches("%[rank 1%]: finished", out)
      local s0 = out:match("%[rank 0%]: secret (%x+)")
      assert.equal(s0, out:match("%[rank 1%]: secret (%x+)"))
      os.remove(base .. ".out")
    end)

    it("of several nodes refuses to start without DDPLUA_STORE_SECRET", function()
      local p = io.popen(("env -u DDPLUA_STORE_SECRET %s --nnodes 2 --node_rank 1 --master_addr 10.1.2.3 "
        .. "--master_port 29999 --nproc_per_node 1 /dev/null 2>&1; echo \"exit $?\""):format(sh(exe)))
      local out = p:read("*a")
      p:close()
      assert.matches("set DDPLUA_STORE_SECRET to the same secret on every node", out)
      assert.matches("exit 1\n", out)
    end)
  end)

  describe("shared-memory segments", function()
    it("a pre-planted /dev/shm name published through the store is not used", function()
      -- The planted segment has the size rank 1 expects and our name form, but another owner
      -- and mode 0666 (what an attacker on the host can make). Rank 1 puts its name in the
      -- store before joining (a compromised store); the group must not map it.
      local name = "ddplua.1.0000000000000000.00000000000000000000000000000000"
      local path = "/dev/shm/" .. name
      local len = 4096 + 3 * 4 * 1024 * 1024
      finally(function() os.remove(path) end)
      for attempt = 1, 3 do
        os.execute(("rm -f %s; head -c %d /dev/zero > %s; chmod 666 %s; chown 65534 %s"):format(
          path, len, path, path, path))
        local r = mp.run {
          nprocs = 2, timeout = 30,
          code = ([[
local dist = require "ddplua.distributed"
local dl = require "ddplua"
local store = require "ddplua.distributed.store"
local rank = tonumber(os.getenv("RANK"))
if rank == 1 then
  local s = store.TCPStore(os.getenv("MASTER_ADDR"), tonumber(os.getenv("MASTER_PORT")), {timeout = 20})
  s:set("pg/ddp_shm/name", "/%s")
end
dist.init_process_group{backend = "gloo", timeout = 20}
local t = dl.ones({1000})
dist.all_reduce(t)
assert(t:tolist()[1000] == 2)
print("mapped " .. dist.get_store():get("pg/ddp_shm/mapped/1"))
dist.destroy_process_group()
]]):format(name),
        }
        assert(r.ok, mp.describe(r))
        local planted = read_file(path)
        assert.equal(len, #planted)
        assert.is_nil(planted:find("[^%z]"), "the planted segment was written to")
        if r[2].output:find("mapped 0") then return end -- rank 1 read the planted name and refused it
      end
      print("note: rank 0 published its own segment name first in every attempt")
    end)
  end)
end)
