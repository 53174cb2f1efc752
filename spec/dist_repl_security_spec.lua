-- Specs for the distributed REPL's protocol under attack and under failure
-- (runtime/cli/dist_repl.c: Note [no partial frames], Note [REPL handshakes concurrent],
-- Note [REPL listen address], Note [REPL drop log]): what a local user or a host that can
-- reach the prompt's port sends before proving the job's secret, a rank that dies in the
-- middle of its answer, a prompt that answers a rank with half a frame, and a prompt that
-- is killed. Each was an abort, a crash or a hang before.
--
-- Most of them use the --nnodes=2 form: node 0 holds the prompt on master_port + 1 and waits
-- for node 1's ranks, so the spec knows the port and decides how long the prompt waits.
local rs = require "raw_store_client"
local mp = require "multiproc"
local files = require "files"
local ffi = require "ffi"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local SECRET = string.rep("cd", 32)

-- A background bash command in its own session; returns its pid. It closes every inherited
-- descriptor above 2 first: the spec's end of a prompt's input FIFO must not live on in
-- another process, or the prompt never sees the end of its input.
local function background(cmd)
  local closing = [[for f in /proc/$$/fd/*; do f=${f##*/}; [ "$f" -gt 2 ] && eval "exec $f>&-"; done 2>/dev/null; ]]
  local p = io.popen(("setsid bash -c %s > /dev/null 2>&1 < /dev/null & echo $!"):format(rs.sh(closing .. cmd)))
  local pid = tonumber(p:read("*l"))
  p:close()
  return pid
end

local function shell(cmd)
  local p = io.popen(cmd)
  local s = p:read("*a")
  p:close()
  return s
end

-- Wait until pred() is true or `timeout` s passed; returns pred's last value.
local function wait_until(pred, timeout)
  local deadline = rs.now() + timeout
  local v = pred()
  while not v and rs.now() < deadline do
    rs.sleep(0.05)
    v = pred()
  end
  return v
end

-- The pids of every descendant of pid.
local function descendants(pid)
  local out = {}
  local function walk(p)
    for child in shell("ps -o pid= --ppid " .. p):gmatch("%d+") do
      out[#out + 1] = tonumber(child)
      walk(child)
    end
  end
  walk(pid)
  return out
end

local function alive(pid) return os.execute(("kill -0 %d 2>/dev/null"):format(pid)) == 0 end

-- A prompt (`ddplua <flags> -i`) reading its input from a FIFO the spec writes to. Its
-- output (stdout and stderr) is in session:output(); session:status() is its exit status once
-- it ended; session:close() ends the input (Ctrl-D); session:cleanup() kills what is left.
local function start_prompt(flags, env)
  local dir = files.tmpdir("repl-sec")
  assert(os.execute("mkfifo " .. rs.sh(dir .. "/in")) == 0)
  local s = { dir = dir }
  local vars = "DDP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
  for k, v in pairs(env or {}) do vars = vars .. " " .. k .. "=" .. rs.sh(v) end
  s.shell_pid = background(("env %s %s %s -i < %s > %s 2>&1; echo $? > %s"):format(vars, rs.sh(exe),
    flags, rs.sh(dir .. "/in"), rs.sh(dir .. "/out"), rs.sh(dir .. "/status")))
  s.input = assert(io.open(dir .. "/in", "w"))
  function s:send(text)
    self.input:write(text)
    self.input:flush()
  end
  function s:output() return rs.read_file(dir .. "/out") or "" end
  function s:wait_output(plain, timeout)
    return wait_until(function() return self:output():find(plain, 1, true) ~= nil end, timeout or 30)
  end
  function s:prompt_pid()
    return tonumber(shell("ps -o pid= --ppid " .. self.shell_pid):match("%d+"))
  end
  function s:close()
    if self.input then self.input:close() end
    self.input = nil
  end
  function s:status(timeout)
    local st
    wait_until(function()
      st = tonumber((rs.read_file(dir .. "/status") or ""):match("%d+"))
      return st
    end, timeout or 30)
    return st
  end
  function s:cleanup()
    pcall(function() self:close() end)
    os.execute(("kill -9 -%d 2>/dev/null"):format(self.shell_pid))
    files.remove(dir)
  end
  return s
end

-- The --nnodes=2 form's flags on `port`, one rank per node.
local function two_node_flags(port, node)
  return ("--nnodes=2 --node_rank=%d --master_addr=127.0.0.1 --master_port=%d --nproc_per_node=1")
    :format(node, port)
end

-- Node 1 of a two-node job (its launcher and its one rank), in the background.
local function start_node1(port)
  local log = os.tmpname()
  local pid = background(("env DDPLUA_STORE_SECRET=%s DDP_NUM_THREADS=1 timeout 120 %s %s -i > %s 2>&1")
    :format(SECRET, rs.sh(exe), two_node_flags(port, 1), rs.sh(log)))
  return pid, log
end

-- Is anything listening on port (any address)? The "Local Address:Port" column of ss.
local function listening_on(port)
  local line = shell(("ss -ltnH 'sport = :%d'"):format(port))
  return line:match("(%S+:%d+)%s+%S+%s*$") or (line ~= "" and line) or nil
end

describe("distributed REPL under attack #faults", function()
  local port, prompt, node1

  -- A port whose successor (the prompt's, master_port + 1) nobody listens on now.
  local function pick_port()
    local p = mp.free_port()
    while p >= 65000 or listening_on(p + 1) do p = mp.free_port() end
    return p
  end

  before_each(function() port = pick_port() end)

  after_each(function()
    if prompt then prompt:cleanup() end
    if node1 then os.execute(("kill -9 -%d 2>/dev/null"):format(node1)) end
    prompt, node1 = nil, nil
  end)

  -- The specs run in shards side by side, so another process may take port + 1 between the
  -- pick and the bind: then the prompt says so and the start is tried again on another port.
  local function start_two_node_prompt()
    for attempt = 1, 3 do
      prompt = start_prompt(two_node_flags(port, 0), { DDPLUA_STORE_SECRET = SECRET })
      local function taken() return prompt:output():find("Address already in use", 1, true) end
      local up = wait_until(function() return taken() or listening_on(port + 1) end, 30)
      if up and not taken() then return end
      if attempt == 3 or not taken() then break end
      prompt:cleanup()
      port = pick_port()
    end
    error("the prompt never listened:\n" .. prompt:output())
  end

  local function join_node1_and_run(line, expect)
    local log
    node1, log = start_node1(port)
    prompt:send(line)
    local ok = prompt:wait_output(expect, 40)
    local node1_log = rs.read_file(log) or ""
    os.remove(log)
    assert(ok, "no answer from the ranks:\n" .. prompt:output() .. "\nnode 1:\n" .. node1_log)
    prompt:close()
    return prompt:status(30)
  end

  it("survives a pre-authentication frame that announces more bytes than it sends", function()
    start_two_node_prompt()
    -- eleven bytes, then close: the frame promised 10 payload bytes
    local fd = rs.connect(port + 1)
    rs.send(fd, "H0000000010")
    ffi.C.close(fd)
    -- and a length that is no number, and one far past any limit
    for _, bytes in ipairs { "H-000000001", "H9999999999xyz", "H 000000004abcd" } do
      local f2 = rs.connect(port + 1)
      rs.send(f2, bytes)
      assert.is_true(rs.closed_by_peer(f2, 5), "the prompt kept a connection that sent " .. bytes)
      ffi.C.close(f2)
    end
    local status = join_node1_and_run("print('still here')\n", "[all ranks] still here")
    assert.equal(0, status, prompt:output())
    assert.not_matches("double free", prompt:output(), 1, true)
  end)

  it("lets the ranks join while a connection sends a byte every 8 s", function()
    start_two_node_prompt()
    local slow = background(("exec 3<>/dev/tcp/127.0.0.1/%d; for b in H 0 0 0 0 0 0 0 0; do printf %%s $b >&3; sleep 8; done")
      :format(port + 1))
    rs.sleep(0.5)
    local t0 = rs.now()
    local status = join_node1_and_run("print('joined')\n", "[all ranks] joined")
    -- the slow connection held the prompt's only handshake for 10 s per byte before
    assert.is_true(rs.now() - t0 < 30)
    os.execute(("kill -9 -%d 2>/dev/null"):format(slow))
    assert.equal(0, status, prompt:output())
  end)

  it("logs failed handshakes at a bounded rate, with the count of those not logged", function()
    start_two_node_prompt()
    os.execute(("bash -c \"for i in \\$(seq 200); do printf X0000000000 > /dev/tcp/127.0.0.1/%d; done\" 2>/dev/null")
      :format(port + 1))
    local status = join_node1_and_run("print('ok')\n", "[all ranks] ok")
    assert.equal(0, status)
    local out = prompt:output()
    local lines = select(2, out:gsub("dropped the connection from", ""))
    assert.is_true(lines >= 1 and lines <= 12, ("%d drop lines:\n%s"):format(lines, out))
    assert.matches("more connections? dropped, not logged", out)
  end)

  it("listens on master_addr, not on every interface", function()
    start_two_node_prompt()
    assert.equal("127.0.0.1:" .. (port + 1), listening_on(port + 1))
  end)

  it("names a rank that dies in the middle of its answer and ends without a crash", function()
    start_two_node_prompt()
    -- rank 1 writes the head of a 100000-byte answer and 10 bytes of it on its connection to
    -- the prompt (found by the connection's remote port in /proc/net/tcp), then dies
    local code = ([[%%rank 1 local ffi = require 'ffi'; pcall(ffi.cdef, 'long write(int, const void *, size_t); void _exit(int);'); ]] ..
      [[local want = ('%%04X'):format(%d); local inode; for l in io.lines('/proc/net/tcp') do ]] ..
      [[local rem, ino = l:match('^%%s*%%d+: %%x+:%%x+ %%x+:(%%x+) %%x+ %%S+ %%S+ %%S+ %%S+ %%S+ (%%d+)'); ]] ..
      [[if rem == want then inode = ino end end; for fd = 3, 255 do local f = io.popen('readlink /proc/self/fd/' .. fd .. ' 2>/dev/null'); ]] ..
      [[local t = f:read('*l') or ''; f:close(); if t == 'socket:[' .. tostring(inode) .. ']' then ]] ..
      [[local b = 'O0000100000' .. ('x'):rep(10); ffi.C.write(fd, b, #b) end end; ffi.C._exit(9)]] .. "\n")
      :format(port + 1)
    node1 = start_node1(port)
    prompt:send("print('up')\n")
    assert(prompt:wait_output("[all ranks] up", 40), prompt:output())
    prompt:send(code)
    local status = prompt:status(40)
    local out = prompt:output()
    assert.equal(1, status, out)
    assert.matches("rank 1 of the distributed REPL is gone (its connection closed before its answer was whole)",
      out, 1, true)
  end)
end)

describe("distributed REPL prompt and ranks #faults", function()
  it("ends the launcher and the ranks within 2 s of the prompt's death", function()
    local prompt = start_prompt("--nproc_per_node=2 --standalone")
    finally(function() prompt:cleanup() end)
    prompt:send("print('ready')\n")
    assert(prompt:wait_output("[all ranks] ready", 40), prompt:output())
    -- both ranks busy in Lua for a long while: nothing but the prompt's death can stop them
    prompt:send("local t = os.time() + 60 while os.time() < t do end\n")
    rs.sleep(0.5)
    local pid = prompt:prompt_pid()
    local rest = descendants(pid)
    assert.is_true(#rest >= 3, "launcher and two ranks expected, got " .. #rest)
    os.execute("kill -9 " .. pid)
    local t0 = rs.now()
    local gone = wait_until(function()
      for _, p in ipairs(rest) do if alive(p) then return false end end
      return true
    end, 5)
    assert.is_true(gone, "still running 5 s after the prompt died")
    assert.is_true(rs.now() - t0 <= 2.5, ("took %.2f s"):format(rs.now() - t0))
  end)

  -- A stand-in prompt (Python) answers the rank's hello with the head of a 129-byte answer
  -- and 20 bytes of it, then closes and stops listening: the rank must refuse cleanly (it
  -- freed the partial answer twice before).
  it("a rank given half an answer by its prompt ends with a clear error", function()
    local port, store_port = mp.free_port(), mp.free_port()
    local ready = os.tmpname()
    local fake = background(([[/usr/bin/python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", %d)); s.listen(1); open("%s", "w").write("1")
c, _ = s.accept(); s.close()
head = c.recv(11); n = int(head[1:]); got = b""
while len(got) < n: got += c.recv(n - len(got))
c.sendall(b"A0000000129" + b"a" * 20); c.close()
']]):format(port, ready))
    finally(function() os.execute(("kill -9 -%d 2>/dev/null"):format(fake)); os.remove(ready) end)
    assert(wait_until(function() return (rs.read_file(ready) or "") == "1" end, 20), "the stand-in never listened")
    local out = shell(("env DDPLUA_REPL_CONNECT=127.0.0.1:%d RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 " ..
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=%d DDP_NUM_THREADS=1 timeout 60 %s -i < /dev/null 2>&1; echo status=$?")
      :format(port, store_port, rs.sh(exe)))
    assert.matches("status=1\n$", out)
    assert.matches("rank 0: cannot join the REPL prompt at 127.0.0.1:" .. port, out, 1, true)
    assert.not_matches("double free", out, 1, true)
  end)
end)
