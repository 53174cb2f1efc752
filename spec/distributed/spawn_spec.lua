-- Specs for ddplua.distributed.spawn (torch.multiprocessing.spawn): children forked from the
-- spec runner itself compute and write files, raise, or kill themselves; the parent raises
-- naming the rank, and no child is left running.
local ffi = require "ffi"
local spawn = require "ddplua.distributed.spawn"
pcall(ffi.cdef, "int getpid(void);")
pcall(ffi.cdef, "int kill(int pid, int sig);")
pcall(ffi.cdef, "int usleep(unsigned int usec);")
pcall(ffi.cdef, "long sysconf(int name);")

local files = require "files"
local read_file = files.read_if_exists

local function write_file(path, text)
  local f = assert(io.open(path .. ".tmp", "w"))
  f:write(text)
  f:close()
  assert(os.rename(path .. ".tmp", path))
end

local function temp_dir() return files.tmpdir("spawn") end

-- Running, not a zombie left to an init that does not reap.
local function alive(pid)
  if ffi.C.kill(pid, 0) ~= 0 then return false end
  local stat = read_file("/proc/" .. pid .. "/stat")
  return stat ~= nil and not stat:match("^%d+ %b() Z")
end

-- Child body for the failure specs: rank `bad` waits until every other rank wrote its pid,
-- then fails as `how` says; the others write their pid and sleep until stopped.
local function failing(rank, dir, bad, how, nprocs)
  if rank == bad then
    for r = 0, nprocs - 1 do
      while r ~= bad and not read_file(dir .. "/pid" .. r) do ffi.C.usleep(5000) end
    end
    if how == "raise" then error("child " .. rank .. " cannot go on") end
    ffi.C.kill(ffi.C.getpid(), 9)
  end
  write_file(dir .. "/pid" .. rank, tostring(ffi.C.getpid()))
  while true do ffi.C.usleep(10000) end
end

local function check_gone(dir, ranks)
  for _, r in ipairs(ranks) do
    local pid = tonumber(read_file(dir .. "/pid" .. r))
    assert.is_number(pid)
    assert.is_false(alive(pid), "rank " .. r .. " (pid " .. pid .. ") is still running")
  end
end

describe("ddplua.distributed.spawn #dist", function()
  local dir
  before_each(function() dir = temp_dir() end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("runs fn(rank, ...args) in nprocs children with the env:// variables set", function()
    local before = os.getenv("RANK")
    spawn(function(rank, d, k)
      local sum = 0
      for i = 1, 1000 * (rank + 1) do sum = sum + i * k end
      write_file(d .. "/result" .. rank, table.concat({
        sum, os.getenv("RANK"), os.getenv("LOCAL_RANK"), os.getenv("WORLD_SIZE"),
        os.getenv("LOCAL_WORLD_SIZE"), os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT"),
        os.getenv("EXTRA"),
      }, " "))
    end, 2, { args = { dir, 3 }, master_port = 23456, env = { EXTRA = "yes" } })
    for rank = 0, 1 do
      local n = 1000 * (rank + 1)
      local expected = 3 * n * (n + 1) / 2
      assert.equal(("%d %d %d 2 2 127.0.0.1 23456 yes"):format(expected, rank, rank),
        read_file(dir .. "/result" .. rank))
    end
    assert.equal(before, os.getenv("RANK"), "the parent's environment is untouched")
  end)

  it("sets the children's threads to cores / nprocs and runs ddplua there", function()
    local dl = require "ddplua"
    local saved = dl.get_num_threads()
    finally(function() dl.set_num_threads(saved) end)
    dl.set_num_threads(2)
    local x = dl.ones { 2 ^ 20 } -- big enough to start the parent's thread pool before fork
    assert.equal(2 ^ 20, x:sum():item())
    spawn(function(rank, d)
      local y = dl.ones { 2 ^ 20 } * (rank + 1)
      write_file(d .. "/threads" .. rank, dl.get_num_threads() .. " " .. y:sum():item())
    end, 2, { args = { dir } })
    local cores = tonumber(ffi.C.sysconf(84)) -- _SC_NPROCESSORS_ONLN
    local threads = tonumber(os.getenv("DDP_NUM_THREADS")) or math.max(1, math.floor(cores / 2))
    for rank = 0, 1 do
      assert.equal(("%d %d"):format(threads, (rank + 1) * 2 ^ 20), read_file(dir .. "/threads" .. rank))
    end
  end)

  it("picks a free master port and returns a context with join = false", function()
    local ctx = spawn(function(rank, d)
      write_file(d .. "/port" .. rank, os.getenv("MASTER_PORT"))
    end, 2, { args = { dir }, join = false })
    assert.equal(2, #ctx.pids)
    assert.is_true(ctx:join(10))
    local port = tonumber(read_file(dir .. "/port0"))
    assert.is_true(port >= 1 and port <= 65535)
    assert.equal(tostring(port), read_file(dir .. "/port1"))
  end)

  it("raises naming the rank and carrying the child's error, and stops the others", function()
    local ok, err = pcall(spawn, failing, 3, { args = { dir, 1, "raise", 3 } })
    assert.is_false(ok)
    assert.matches("^spawn: process 1 %(rank 1, pid %d+%) terminated with the following error:\n", err)
    assert.matches("child 1 cannot go on", err, 1, true)
    assert.matches("stack traceback:", err, 1, true)
    check_gone(dir, { 0, 2 })
  end)

  it("names the signal of a child that was killed, and stops the others", function()
    local ok, err = pcall(spawn, failing, 2, { args = { dir, 0, "kill", 2 } })
    assert.is_false(ok)
    assert.matches("^spawn: process 0 %(rank 0, pid %d+%) terminated with signal SIGKILL$", err)
    check_gone(dir, { 1 })
  end)

  it("reports a child's exit code and checks its arguments", function()
    local ok, err = pcall(spawn, function() os.exit(3) end, 1)
    assert.is_false(ok)
    assert.matches("terminated with exit code 3$", err)
    ok, err = pcall(spawn, function() end, 0)
    assert.is_false(ok)
    assert.matches("spawn: nprocs must be a count >= 1, got 0", err, 1, true)
    ok, err = pcall(spawn, 42, 1)
    assert.is_false(ok)
    assert.matches("spawn: fn must be a function, got number", err, 1, true)
  end)
end)
