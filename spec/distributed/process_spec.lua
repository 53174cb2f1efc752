-- Specs for the process supervision C API (ddplua/process.h, runtime/distributed/process.c)
-- driven straight through the FFI: what the launcher and dl.spawn build on. Workers are
-- forked from the spec runner itself and always leave through ddp_process_exit.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local files = require "files"
local read_file = files.read_if_exists

local function temp_dir() return files.tmpdir("process") end

local function new_group(fields)
  local cfg = ffi.new("ddp_procs_config", fields)
  local box = ffi.new("ddp_procs*[1]")
  local status = C.ddp_procs_new(box, cfg)
  return status, box[0]
end

local function last_error() return ffi.string(C.ddp_last_error()) end

-- Fork worker `rank` of p; the worker runs body(rank) and exits with its result (1 when it
-- raised, after reporting the error). Never returns in the worker.
local function fork(p, rank, body)
  local is_child = ffi.new("int[1]")
  assert.equal(0, C.ddp_procs_fork(p, rank, is_child), last_error())
  if is_child[0] == 1 then
    local ok, code = pcall(body, rank)
    if not ok then
      local msg = tostring(code)
      C.ddp_procs_report(p, msg, #msg)
      code = 1
    end
    io.stdout:flush()
    C.ddp_process_exit(tonumber(code) or 0)
  end
end

local function run_to_end(p)
  while C.ddp_procs_poll(p, 0.05, -1, nil) ~= 0 do end
end

describe("ddplua process supervision #dist", function()
  local dir
  before_each(function() dir = temp_dir() end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("finds a free port, counts threads per worker and names signals", function()
    local port = ffi.new("int[1]")
    assert.equal(0, C.ddp_process_free_port(port))
    assert.is_true(port[0] >= 1 and port[0] <= 65535)
    assert.is_true(C.ddp_process_threads_per_worker(1) >= 1)
    assert.equal(1, C.ddp_process_threads_per_worker(100000))
    local buf = ffi.new("char[32]")
    C.ddp_process_signal_name(9, buf, 32)
    assert.equal("SIGKILL", ffi.string(buf))
    C.ddp_process_signal_name(15, buf, 32)
    assert.equal("SIGTERM", ffi.string(buf))
  end)

  it("refuses bad configurations with a message", function()
    local status = new_group { nprocs = 0, nnodes = 1, master_port = 29500 }
    assert.equal(C.DDP_ERR_ARG, status)
    assert.matches("nprocs must be >= 1, got 0", last_error(), 1, true)
    status = new_group { nprocs = 1, nnodes = 2, node_rank = 2, master_port = 29500 }
    assert.equal(C.DDP_ERR_ARG, status)
    assert.matches("node rank 2 is out of range for 2 nodes", last_error(), 1, true)
    status = new_group { nprocs = 1, nnodes = 1, master_port = 0 }
    assert.equal(C.DDP_ERR_ARG, status)
    status = new_group { nprocs = 1, nnodes = 1, master_port = 29500, capture = 3, log = 3 }
    assert.equal(C.DDP_ERR_ARG, status)
    assert.matches("without a log folder", last_error(), 1, true)
    local ok, p = new_group { nprocs = 1, nnodes = 1, master_port = 29500 }
    assert.equal(0, ok)
    assert.equal(C.DDP_ERR_ARG, C.ddp_procs_add_env(p, "A=B", "x"))
    C.ddp_procs_free(p)
  end)

  it("gives forked workers the torchrun environment and logs their captured output", function()
    local status, p = new_group {
      nprocs = 2, nnodes = 2, node_rank = 1, master_addr = "10.1.2.3", master_port = 23456,
      attempt = 2, max_restarts = 3, grace_s = 3, capture = 3, console = 0, log = 3,
      log_dir = dir,
    }
    assert.equal(0, status, last_error())
    assert.equal(0, C.ddp_procs_add_env(p, "EXTRA", "yes"))
    local names = { "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
      "GROUP_WORLD_SIZE", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "DDPLUA_RESTART_COUNT",
      "DDPLUA_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
      "DDPLUA_UNBUFFERED", "EXTRA" }
    for rank = 0, 1 do
      fork(p, rank, function()
        local values = {}
        for i, k in ipairs(names) do values[i] = tostring(os.getenv(k)) end
        io.stdout:write(table.concat(values, " "), "\n")
        io.stderr:write("err of ", rank, "\n")
        return 0
      end)
    end
    run_to_end(p)
    assert.equal(-1, C.ddp_procs_failed(p))
    for rank = 0, 1 do
      local global = 2 + rank
      assert.equal(("%d %d 4 2 1 2 %d 10.1.2.3 23456 2 3 2 3 1 yes\n"):format(global, rank, global),
        read_file(("%s/rank_%d/stdout.log"):format(dir, global)))
      assert.equal("err of " .. rank .. "\n", read_file(("%s/rank_%d/stderr.log"):format(dir, global)))
      assert.equal(("%s/rank_%d/stderr.log"):format(dir, global),
        ffi.string(C.ddp_procs_log_path(p, rank, C.DDP_PROCS_STDERR)))
      assert.equal("err of " .. rank .. "\n", ffi.string(C.ddp_procs_stderr_tail(p, rank, nil)))
      local code, sig = ffi.new("int[1]"), ffi.new("int[1]")
      assert.equal(1, C.ddp_procs_exit_status(p, rank, code, sig))
      assert.equal(0, code[0])
      assert.equal(0, sig[0])
    end
    C.ddp_procs_free(p)
  end)

  it("reports the first failure with its message and stops the survivors", function()
    local status, p = new_group { nprocs = 3, nnodes = 1, master_port = 23456, grace_s = 3,
      max_restarts = -1 }
    assert.equal(0, status, last_error())
    local marker = dir .. "/started"
    for rank = 0, 2 do
      fork(p, rank, function(r)
        if r == 1 then
          while not read_file(marker .. 0) or not read_file(marker .. 2) do
            os.execute("sleep 0.01")
          end
          error("worker 1 cannot go on")
        end
        local f = assert(io.open(marker .. r, "w"))
        f:close()
        while true do os.execute("sleep 0.05") end
      end)
    end
    run_to_end(p)
    assert.equal(1, C.ddp_procs_failed(p))
    local len = ffi.new("size_t[1]")
    local msg = ffi.string(C.ddp_procs_message(p, 1, len), len[0])
    assert.matches("worker 1 cannot go on", msg, 1, true)
    local code, sig = ffi.new("int[1]"), ffi.new("int[1]")
    assert.equal(1, C.ddp_procs_exit_status(p, 1, code, sig))
    assert.equal(1, code[0])
    for _, r in ipairs { 0, 2 } do
      assert.equal(1, C.ddp_procs_exit_status(p, r, code, sig))
      assert.equal(-1, code[0])
      assert.is_true(sig[0] == 15 or sig[0] == 9, "stopped by SIGTERM or SIGKILL")
    end
    C.ddp_procs_free(p)
  end)

  -- Note [first failure]: a worker that dies without a report is seen only when the parent
  -- polls; a peer's report carries its own, earlier, stamp. Before, a parent slow to poll
  -- (a loaded machine) named the peer that lost the dead worker instead of the dead one.
  it("names a worker killed by a signal before the peer whose error it caused, however late the parent polls #faults", function()
    local status, p = new_group { nprocs = 2, nnodes = 1, master_port = 23457, grace_s = 3,
      max_restarts = -1 }
    assert.equal(0, status, last_error())
    fork(p, 1, function()
      os.execute("kill -9 $PPID") -- the shell's parent is this worker
    end)
    fork(p, 0, function()
      -- wait until worker 1 is dead (a zombie: the parent has not reaped it), then fail
      local stat = "/proc/" .. C.ddp_procs_pid(p, 1) .. "/stat"
      while not (read_file(stat) or ""):match("^%d+ %b() Z") do os.execute("sleep 0.01") end
      error("peer worker 1 disconnected")
    end)
    os.execute("sleep 1") -- a parent slow to notice: both ends are waiting when it polls
    run_to_end(p)
    assert.equal(1, C.ddp_procs_failed(p))
    C.ddp_procs_free(p)
  end)
end)
