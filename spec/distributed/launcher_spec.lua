-- Specs for the launcher of the ddplua executable (runtime/cli/launcher.c), torchrun's job:
-- the environment of the workers, the "[rank N]: " prefixes, multi-node arithmetic, failure
-- handling (a raising worker, a worker killed by a signal, survivors stopped), restarts, log
-- files, --standalone and bad flag values. The workers are small Lua scripts run by real
-- processes; each spec takes well under a few seconds.
local ffi = require "ffi"
pcall(ffi.cdef, "int kill(int pid, int sig);")
pcall(ffi.cdef, "long sysconf(int name);")

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local function sh(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function temp_file(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

local files = require "files"
local read_file = files.read_if_exists

-- A fresh directory (removed by the caller).
local function temp_dir() return files.tmpdir("launcher") end

-- Run the executable with `args` (already quoted) and the environment prefix `env` (e.g.
-- "env -u X"). Returns stdout, stderr, exit status and the wall time in seconds.
local function run(args, env)
  local err_path = os.tmpname()
  local cmd = (env and env .. " " or "") .. sh(exe) .. " " .. args .. " < /dev/null 2> " .. sh(err_path)
  local p = assert(io.popen("s=$(date +%s.%N); " .. cmd .. "; echo \"exit status $?\"; "
    .. "echo \"times $s $(date +%s.%N)\"", "r"))
  local out = p:read("*a")
  p:close()
  local err = read_file(err_path) or ""
  os.remove(err_path)
  local status = tonumber(out:match("exit status (%d+)\n"))
  local t0, t1 = out:match("times ([%d.]+) ([%d.]+)\n$")
  out = out:gsub("exit status %d+\ntimes [^\n]*\n$", "")
  -- under the sanitizer build, a report from the launcher or a worker fails the spec
  assert(not (err .. out):find("Sanitizer", 1, true), err)
  assert(not (err .. out):find("runtime error:", 1, true), err)
  return out, err, status, tonumber(t1) - tonumber(t0)
end

-- Lines of `text` printed by rank r, without the prefix.
local function lines_of(text, r)
  local lines = {}
  for line in text:gmatch("[^\n]*\n") do
    local rank, rest = line:match("^%[rank (%d+)%]: (.*)\n$")
    assert(rank, "line without a rank prefix: " .. line)
    if tonumber(rank) == r then lines[#lines + 1] = rest end
  end
  return lines
end

-- Environment variables that rank r printed as NAME=value lines.
local function env_of(text, r)
  local env = {}
  for _, line in ipairs(lines_of(text, r)) do
    local k, v = line:match("^([%u_]+)=(.*)$")
    if k then env[k] = v end
  end
  return env
end

-- Whether process `pid` is still running (a zombie left to an init that does not reap
-- counts as gone: it runs nothing).
local function alive(pid)
  if ffi.C.kill(pid, 0) ~= 0 then return false end
  local stat = read_file("/proc/" .. pid .. "/stat")
  return stat ~= nil and not stat:match("^%d+ %b() Z")
end

local cores = tonumber(ffi.C.sysconf(84)) -- _SC_NPROCESSORS_ONLN

local print_env = [[
for _, k in ipairs{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "DDP_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                   "DDPLUA_RESTART_COUNT", "GROUP_WORLD_SIZE", "ROLE_NAME",
                   "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                   "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"} do
  print(k .. "=" .. tostring(os.getenv(k)))
end
print("ARGS=" .. table.concat({...}, ","))
io.stderr:write("to stderr from " .. os.getenv("RANK") .. "\n")
io.write("no newline at the end")
]]

local no_threads = "env -u DDP_NUM_THREADS -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS"

describe("ddplua launcher #dist", function()
  for _, n in ipairs { 2, 3 } do
    it("starts " .. n .. " workers with the torchrun environment and prefixed output", function()
      local script = temp_file(print_env)
      finally(function() os.remove(script) end)
      local out, err, status = run("--nproc_per_node=" .. n .. " " .. sh(script) .. " a 'b c'",
        no_threads)
      assert.equal(0, status, err)
      local threads = tostring(math.max(1, math.floor(cores / n)))
      for r = 0, n - 1 do
        local env = env_of(out, r)
        assert.same({
          RANK = tostring(r), LOCAL_RANK = tostring(r), WORLD_SIZE = tostring(n),
          LOCAL_WORLD_SIZE = tostring(n), GROUP_RANK = "0", ROLE_RANK = tostring(r),
          ROLE_WORLD_SIZE = tostring(n), MASTER_ADDR = "127.0.0.1", MASTER_PORT = "29500",
          DDP_NUM_THREADS = threads, OMP_NUM_THREADS = threads, OPENBLAS_NUM_THREADS = threads,
          DDPLUA_RESTART_COUNT = "0", ARGS = "a,b c",
          -- torchrun's own names, which scripts written for torchrun read
          GROUP_WORLD_SIZE = "1", ROLE_NAME = "default", TORCHELASTIC_RESTART_COUNT = "0",
          TORCHELASTIC_MAX_RESTARTS = "0", TORCHELASTIC_RUN_ID = "none",
          TORCHELASTIC_USE_AGENT_STORE = "False",
        }, env)
        local l = lines_of(out, r)
        -- a partial last line is printed whole, with a newline, when the stream ends
        assert.equal("no newline at the end", l[#l])
        assert.matches("[rank " .. r .. "]: to stderr from " .. r .. "\n", err, 1, true)
      end
    end)
  end

  it("keeps thread counts the user set and takes --flag value forms and -e", function()
    local out, err, status = run("--nproc-per-node 2 --master_addr localhost --master_port 4321 "
      .. "-e " .. sh('print(os.getenv("DDP_NUM_THREADS"), os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT"))'),
      "env DDP_NUM_THREADS=7")
    assert.equal(0, status, err)
    for r = 0, 1 do
      assert.same({ "7\tlocalhost\t4321" }, lines_of(out, r))
    end
  end)

  it("offsets RANK by node_rank * nproc_per_node with --nnodes", function()
    local script = temp_file(print_env)
    finally(function() os.remove(script) end)
    local out, err, status = run("--nnodes 2 --node_rank 1 --master_addr 10.1.2.3 "
      .. "--master_port=29999 --nproc_per_node 2 " .. sh(script), "DDPLUA_STORE_SECRET=multi-node-secret")
    assert.equal(0, status, err)
    assert.equal("", out:match("%[rank [01]%]") or "", "node 1 runs ranks 2 and 3 only")
    for local_rank = 0, 1 do
      local env = env_of(out, 2 + local_rank)
      assert.equal(tostring(2 + local_rank), env.RANK)
      assert.equal(tostring(local_rank), env.LOCAL_RANK)
      assert.equal("4", env.WORLD_SIZE)
      assert.equal("2", env.LOCAL_WORLD_SIZE)
      assert.equal("1", env.GROUP_RANK)
      assert.equal("10.1.2.3", env.MASTER_ADDR)
      assert.equal("29999", env.MASTER_PORT)
    end
  end)

  -- rank 1 fails once rank 0 (and rank 2 when there is one) wrote its pid and went to sleep
  local failing = [[
    local ffi = require "ffi"
    ffi.cdef "int getpid(void); int kill(int, int); int usleep(unsigned int);"
    local dir, how = ...
    local rank = tonumber(os.getenv("RANK"))
    local world = tonumber(os.getenv("WORLD_SIZE"))
    if rank == 1 then
      for r = 0, world - 1 do
        while r ~= 1 and not io.open(dir .. "/pid" .. r) do ffi.C.usleep(10000) end
      end
      if how == "raise" then error("rank one gives up") end
      if how == "kill" then ffi.C.kill(ffi.C.getpid(), 9) end
    end
    local f = io.open(dir .. "/pid" .. rank .. ".tmp", "w")
    f:write(ffi.C.getpid())
    f:close()
    os.rename(dir .. "/pid" .. rank .. ".tmp", dir .. "/pid" .. rank)
    while true do ffi.C.usleep(20000) end
  ]]

  local function check_survivors_gone(dir, ranks)
    for _, r in ipairs(ranks) do
      local pid = tonumber(read_file(dir .. "/pid" .. r))
      assert.is_number(pid)
      assert.is_false(alive(pid), "rank " .. r .. " (pid " .. pid .. ") is still running")
    end
  end

  it("stops the others and exits 1 naming the rank when a worker raises", function()
    local script, dir = temp_file(failing), temp_dir()
    finally(function() os.remove(script); os.execute("rm -rf " .. sh(dir)) end)
    local _, err, status, elapsed = run("--nproc_per_node=3 " .. sh(script) .. " " .. sh(dir) .. " raise")
    assert.equal(1, status, err)
    assert.is_true(elapsed < 10, "took " .. elapsed .. " s")
    assert.matches("ddplua: worker rank 1 %(local rank 1, pid %d+%) failed with exit code 1: "
      .. "[^\n]*: rank one gives up\n", err)
    check_survivors_gone(dir, { 0, 2 })
  end)

  it("stops the others and exits 1 naming the signal when a worker is killed", function()
    local script, dir = temp_file(failing), temp_dir()
    finally(function() os.remove(script); os.execute("rm -rf " .. sh(dir)) end)
    local _, err, status, elapsed = run("--nproc_per_node 2 " .. sh(script) .. " " .. sh(dir) .. " kill")
    assert.equal(1, status, err)
    assert.is_true(elapsed < 10, "took " .. elapsed .. " s")
    assert.matches("ddplua: worker rank 1 (local rank 1, pid ", err, 1, true)
    assert.matches("was killed by signal 9 (SIGKILL)", err, 1, true)
    check_survivors_gone(dir, { 0 })
  end)

  it("restarts the group with --max_restarts and counts attempts in DDPLUA_RESTART_COUNT", function()
    local script = temp_file([[
      local count = os.getenv("DDPLUA_RESTART_COUNT")
      assert(os.getenv("TORCHELASTIC_RESTART_COUNT") == count, "TORCHELASTIC_RESTART_COUNT")
      assert(os.getenv("TORCHELASTIC_MAX_RESTARTS") == os.getenv("DDPLUA_MAX_RESTARTS"),
        "TORCHELASTIC_MAX_RESTARTS")
      print("attempt " .. count .. " run " .. os.getenv("TORCHELASTIC_RUN_ID"))
      if os.getenv("RANK") == "1" and count == "0" then
        os.execute("sleep 1") -- let rank 0 print before the launcher stops it (a loaded machine)
        error("flaky first attempt")
      end
    ]])
    finally(function() os.remove(script) end)
    local out, err, status = run("--standalone --nproc_per_node=2 --max_restarts=1 " .. sh(script))
    assert.equal(0, status, err)
    assert.matches("worker rank 1 %(local rank 1, pid %d+%) failed with exit code 1: [^\n]*flaky first attempt", err)
    assert.matches("restarting all 2 workers (restart 1 of 1)", err, 1, true)
    -- --standalone: TORCHELASTIC_RUN_ID is a random UUID (as torchrun's), one for the launch
    local run_id = lines_of(out, 0)[1]:match("run (.*)$")
    assert.matches("^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-" .. ("%x"):rep(12) .. "$", run_id)
    for _, r in ipairs { 0, 1 } do
      assert.same({ "attempt 0 run " .. run_id, "attempt 1 run " .. run_id }, lines_of(out, r))
    end

    -- without restarts left, the same failure ends the launch
    local _, err2, status2 = run("--nproc_per_node=2 --max_restarts=0 " .. sh(script))
    assert.equal(1, status2)
    assert.matches("flaky first attempt", err2, 1, true)
  end)

  it("writes per-rank log files with --log_dir, --redirects and --tee", function()
    local dir = temp_dir()
    finally(function() os.execute("rm -rf " .. sh(dir)) end)
    local code = sh('print("out " .. os.getenv("RANK")); io.stderr:write("err " .. os.getenv("RANK") .. "\\n")')

    -- --log_dir alone: files, and the console as well
    local out, err, status = run("--nproc_per_node=2 --log_dir " .. sh(dir .. "/a") .. " -e " .. code)
    assert.equal(0, status, err)
    for r = 0, 1 do
      assert.equal("out " .. r .. "\n", read_file(dir .. "/a/rank_" .. r .. "/stdout.log"))
      assert.equal("err " .. r .. "\n", read_file(dir .. "/a/rank_" .. r .. "/stderr.log"))
      assert.matches("[rank " .. r .. "]: out " .. r .. "\n", out, 1, true)
      assert.matches("[rank " .. r .. "]: err " .. r .. "\n", err, 1, true)
    end

    -- --redirects=1 --tee=2: stdout to the files only, stderr to the files and the console
    out, err, status = run("--nproc_per_node=2 --log_dir=" .. sh(dir .. "/b") .. " --redirects=1 --tee=2 -e " .. code)
    assert.equal(0, status, err)
    assert.equal("", out)
    for r = 0, 1 do
      assert.equal("out " .. r .. "\n", read_file(dir .. "/b/rank_" .. r .. "/stdout.log"))
      assert.equal("err " .. r .. "\n", read_file(dir .. "/b/rank_" .. r .. "/stderr.log"))
      assert.matches("[rank " .. r .. "]: err " .. r .. "\n", err, 1, true)
    end

    -- with restarts, one folder per attempt; a failure summary names the log file
    out, err, status = run("--nproc_per_node=1 --max_restarts=1 --redirects 3 --log_dir "
      .. sh(dir .. "/c") .. " -e " .. sh('print("try " .. os.getenv("DDPLUA_RESTART_COUNT")); error("always")'))
    assert.equal(1, status)
    assert.equal("", out)
    assert.equal("try 0\n", read_file(dir .. "/c/attempt_0/rank_0/stdout.log"))
    assert.equal("try 1\n", read_file(dir .. "/c/attempt_1/rank_0/stdout.log"))
    assert.matches("always", read_file(dir .. "/c/attempt_1/rank_0/stderr.log"), 1, true)
    assert.matches("last lines of its stderr (" .. dir .. "/c/attempt_1/rank_0/stderr.log):", err, 1, true)
  end)

  it("picks a free port on 127.0.0.1 with --standalone", function()
    local out, err, status = run("--standalone --nproc_per_node=2 --master_addr=10.9.9.9 -e "
      .. sh('print(os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT"), os.getenv("WORLD_SIZE"))'))
    assert.equal(0, status, err)
    local a, b = lines_of(out, 0)[1], lines_of(out, 1)[1]
    assert.equal(a, b)
    local addr, port, world = a:match("^(%S+)\t(%d+)\t(%d+)$")
    assert.equal("127.0.0.1", addr)
    assert.equal("2", world)
    assert.is_true(tonumber(port) >= 1024 and tonumber(port) <= 65535)
  end)

  it("forwards SIGTERM to the workers and leaves no process behind", function()
    local script, dir = temp_file(failing), temp_dir()
    finally(function() os.remove(script); os.execute("rm -rf " .. sh(dir)) end)
    -- both ranks write their pid and sleep ("sleep" is neither raise nor kill)
    local p = assert(io.popen("exec 2> /dev/null; " .. sh(exe) .. " --nproc_per_node=2 " .. sh(script) .. " " .. sh(dir)
      .. " sleep > /dev/null 2>&1 & echo $!; wait $!; echo \"exit status $?\"", "r"))
    local launcher = tonumber(p:read("*l"))
    for _ = 1, 500 do
      if read_file(dir .. "/pid0") and read_file(dir .. "/pid1") then break end
      os.execute("sleep 0.01")
    end
    ffi.C.kill(launcher, 15)
    local rest = p:read("*a")
    p:close()
    assert.equal("exit status 143\n", rest) -- ended by the forwarded signal itself
    check_survivors_gone(dir, { 0, 1 })
  end)

  it("refuses bad launcher flag values with exit status 2 and a message", function()
    local cases = {
      { "--nproc_per_node=0 x.lua", "option '--nproc_per_node' needs a count of workers >= 1" },
      { "--nproc_per_node=two x.lua", "got 'two'" },
      { "--nnodes=2 --node_rank=2 x.lua", "--node_rank' must be below --nnodes" },
      { "--master_port=0 x.lua", "option '--master_port' needs a port in 1..65535, got '0'" },
      { "--redirects=4 x.lua", "option '--redirects' needs 0 (none)" },
      { "--standalone --nnodes 2 x.lua", "option '--standalone' runs one node" },
      { "--nproc_per_node=2", "the launcher needs a script to run" },
      { "--nproc_per_node=2 -i x.lua", "option '-i' cannot be used with the launcher" },
      { "--nproc_per_node", "option '--nproc_per_node' needs a value" },
      { "--nproc_per_nod=2 x.lua", "unknown option '--nproc_per_nod=2'" },
    }
    for _, case in ipairs(cases) do
      local out, err, status = run(case[1])
      assert.equal(2, status, case[1])
      assert.equal("", out, case[1])
      assert.matches(case[2], err, 1, true)
    end
  end)

  -- Before, SIGUSR1 had its default action in the launcher: it died, and its workers with it.
  it("passes SIGUSR1 on to every worker, which dumps its flight recorder and goes on #faults", function()
    local script = temp_file([[
local dist = require "ddplua.distributed"
local dl = require "ddplua"
dist.init_process_group{backend = "gloo"}
dist.all_reduce(dl.ones{4})
dist.barrier()
if dist.get_rank() == 0 then
  -- this worker's parent is the launcher (field 4 of /proc/self/stat)
  local f = io.open("/proc/self/stat")
  local launcher = f:read("*a"):match("^%d+ %b() %a (%d+)")
  f:close()
  os.execute("kill -USR1 " .. launcher .. "; sleep 1.5")
end
dist.barrier()
print("done")
]])
    finally(function() os.remove(script) end)
    local out, err, status = run("--nproc_per_node=2 --standalone " .. sh(script))
    assert.equal(0, status, err)
    assert.same({ "done" }, lines_of(out, 0))
    assert.same({ "done" }, lines_of(out, 1))
    assert.matches("flight recorder of rank 0", err, 1, true)
    assert.matches("flight recorder of rank 1", err, 1, true)
    assert.matches("all_reduce f32%[4%]", err)
  end)
end)
