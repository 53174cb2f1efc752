-- Specs for the elastic launcher, `ddplua --nnodes=MIN:MAX --rdzv_endpoint=H:P` (Note
-- [elastic rendezvous] in runtime/cli/rendezvous.c): the command line (MIN:MAX and its
-- errors), then the rendezvous rounds with several agents on this one host, each agent a
-- real launcher process standing for a node: the environment of a round's workers, a node
-- joining a running round (the others restart at the larger world size), an agent killed
-- (the others go on from the last commit), a round that cannot gather MIN nodes, and the
-- restart budget. Each takes a few seconds.
local files = require "files"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

-- A free TCP port on 127.0.0.1 (the kernel picks it) for one spec's rendezvous.
local function free_port()
  local lib = require "ddplua.lib"
  local port = lib.ffi.new("int[1]")
  lib.check(lib.C.ddp_process_free_port(port))
  return port[0]
end

-- Run `cmd` (a shell command line) with the job's secret; returns exit status and output.
local function run(cmd)
  return files.run("export DDPLUA_STORE_SECRET=elastic-spec; " .. cmd .. " < /dev/null")
end

-- The launcher command of one agent (node) of job `id` on rendezvous port `port`.
local function agent(port, id, nnodes, extra, script)
  return ("%s --nnodes=%s --rdzv_endpoint=127.0.0.1:%d --rdzv_id=%s --nproc_per_node=1 %s %s")
    :format(q(exe), nnodes, port, id, extra or "", q(script))
end

-- The workers' environment and a one-element all-reduce (the round's group works).
local ENV = [[
local dist = require "ddplua.distributed"
local dl = require "ddplua"
dist.init_process_group { backend = "gloo", timeout = 20 }
local t = dl.ones { 1 }
dist.all_reduce(t)
print(("env RANK=%s WORLD_SIZE=%s GROUP_RANK=%s GROUP_WORLD_SIZE=%s ROLE_RANK=%s RESTART=%s MAX=%s RUN=%s SUM=%d")
  :format(os.getenv("RANK"), os.getenv("WORLD_SIZE"), os.getenv("GROUP_RANK"), os.getenv("GROUP_WORLD_SIZE"),
    os.getenv("ROLE_RANK"), os.getenv("TORCHELASTIC_RESTART_COUNT"), os.getenv("TORCHELASTIC_MAX_RESTARTS"),
    os.getenv("TORCHELASTIC_RUN_ID"), t:sum():item()))
dist.destroy_process_group()
]]

describe("elastic launcher #dist", function()
  local dir
  before_each(function() dir = files.tmpdir("elastic") end)
  after_each(function() if not os.getenv("KEEP") then files.remove(dir) end end)

  it("refuses bad --nnodes ranges and flags an elastic job cannot take", function()
    local cases = {
      { "--nnodes=3:2 x.lua", "option '--nnodes' needs a range MIN:MAX with MIN <= MAX, got '3:2'" },
      { "--nnodes=0:2 x.lua", "option '--nnodes' needs a range MIN:MAX with MIN >= 1, got '0'" },
      { "--nnodes=1:x x.lua", "option '--nnodes' needs a range MIN:MAX with MAX >= 1, got 'x'" },
      { "--nnodes=:2 x.lua", "option '--nnodes' needs a range MIN:MAX of node counts, got ':2'" },
      { "--nnodes=two x.lua", "option '--nnodes' needs a count of nodes >= 1 or a range MIN:MAX, got 'two'" },
      { "--nnodes=1:2 --node_rank=1 x.lua", "option '--node_rank' cannot be given to an elastic job" },
      { "--nnodes=1:2 --standalone x.lua", "option '--standalone' runs one node, not an elastic job" },
      { "--rdzv_endpoint=h:0 x.lua", "option '--rdzv_endpoint' needs HOST:PORT with a port in 1..65535, got '0'" },
      { "--nnodes=1:2 --rdzv_conf=timeout=3 x.lua", "the keys last_call_timeout and join_timeout" },
      { "--nnodes=1:2 --rdzv_conf=last_call_timeout=-1 x.lua", "a number of seconds > 0" },
      { "--nnodes=1:2 --rdzv_backend=etcd x.lua", "c10d or static" },
      { "--nnodes=1:2 --rdzv_backend=static x.lua", "option '--rdzv_backend=static' runs a fixed job" },
      { "--nnodes=1:2 --rdzv_id='a b' x.lua", "a job id of letters, digits" },
    }
    for _, case in ipairs(cases) do
      local status, out = run(q(exe) .. " " .. case[1])
      assert.equal(2, status, case[1] .. "\n" .. out)
      assert.matches(case[2], out, 1, true)
    end
    -- more than one node needs the job's secret on every node (README, "Security")
    local status, out = files.run("env -u DDPLUA_STORE_SECRET " .. q(exe) .. " --nnodes=1:2 x.lua")
    assert.equal(1, status, out)
    assert.matches("--nnodes=2: set DDPLUA_STORE_SECRET", out, 1, true)
  end)

  it("ranks two agents in join order and gives their workers the round's environment", function()
    local script = files.write(dir, "env.lua", ENV)
    local port = free_port()
    local cmd = agent(port, "job-a", "1:2", "--rdzv_conf=last_call_timeout=3", script)
    local status, out = run(("(%s > %s/a.log 2>&1 & sleep 0.3; %s > %s/b.log 2>&1; wait $!) ; cat %s/a.log %s/b.log")
      :format(cmd, dir, cmd, dir, dir, dir))
    assert.equal(0, status, out)
    local a, b = files.read(dir .. "/a.log"), files.read(dir .. "/b.log")
    assert.matches("rendezvous at 127.0.0.1:" .. port .. " (hosted here)", a, 1, true)
    assert.not_matches("hosted here", b, 1, true)
    -- the first agent to join is node rank 0, the second node rank 1
    assert.matches("round 0: node rank 0 of 2 nodes, world size 2", a, 1, true)
    assert.matches("round 0: node rank 1 of 2 nodes, world size 2", b, 1, true)
    assert.matches("[rank 0]: env RANK=0 WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=2 ROLE_RANK=0 RESTART=0 MAX=0 RUN=job-a SUM=2",
      a, 1, true)
    assert.matches("[rank 1]: env RANK=1 WORLD_SIZE=2 GROUP_RANK=1 GROUP_WORLD_SIZE=2 ROLE_RANK=1 RESTART=0 MAX=0 RUN=job-a SUM=2",
      b, 1, true)
  end)

  it("restarts a running round at the larger world size when a node joins", function()
    -- at world size 1 the worker trains "forever"; once a second node is in, it ends
    local script = files.write(dir, "grow.lua", [[
local dist = require "ddplua.distributed"
local dl = require "ddplua"
dist.init_process_group { backend = "gloo", timeout = 20 }
print("running at world size " .. dist.get_world_size())
while dist.get_world_size() == 1 do dist.all_reduce(dl.ones { 1 }); os.execute("sleep 0.05") end
local t = dl.ones { 1 }
dist.all_reduce(t)
print(("env RANK=%s WORLD_SIZE=%s GROUP_RANK=%s GROUP_WORLD_SIZE=%s ROLE_RANK=%s RESTART=%s MAX=%s RUN=%s SUM=%d")
  :format(os.getenv("RANK"), os.getenv("WORLD_SIZE"), os.getenv("GROUP_RANK"), os.getenv("GROUP_WORLD_SIZE"),
    os.getenv("ROLE_RANK"), os.getenv("TORCHELASTIC_RESTART_COUNT"), os.getenv("TORCHELASTIC_MAX_RESTARTS"),
    os.getenv("TORCHELASTIC_RUN_ID"), t:sum():item()))
dist.destroy_process_group()
]])
    local port = free_port()
    local cmd = agent(port, "job-grow", "1:2", "--max_restarts=1 --rdzv_conf=last_call_timeout=1", script)
    local status, out = run(([[
      %s > %s/a.log 2>&1 & a=$!
      for i in $(seq 200); do grep -q "running at world size 1" %s/a.log && break; sleep 0.05; done
      t0=$(date +%%s.%%N)
      %s > %s/b.log 2>&1; sb=$?
      wait $a; sa=$?
      echo "statuses $sa $sb took $(awk -v a="$t0" -v b="$(date +%%s.%%N)" 'BEGIN {print b - a}')"]])
      :format(cmd, dir, dir, cmd, dir))
    assert.equal(0, status, out)
    local a, b = files.read(dir .. "/a.log"), files.read(dir .. "/b.log")
    assert.matches("statuses 0 0", out, 1, true)
    assert.is_true(tonumber(out:match("took ([%d.]+)")) < 10, out)
    -- the running agent was told through the store, stopped its worker, joined round 1
    assert.matches("round 0: node rank 0 of 1 nodes, world size 1", a, 1, true)
    assert.matches("round 0: stopping the workers: membership changed: node [^\n]* waits to join round 1", a)
    assert.matches("round 0 ended; joining round 1 (restart 1 of 1)", a, 1, true)
    -- the newcomer came first to round 1: node rank 0 there
    assert.matches("round 1: node rank 0 of 2 nodes, world size 2", b, 1, true)
    assert.matches("round 1: node rank 1 of 2 nodes, world size 2", a, 1, true)
    assert.matches("env RANK=1 WORLD_SIZE=2 GROUP_RANK=1 GROUP_WORLD_SIZE=2 ROLE_RANK=1 RESTART=1 MAX=1 RUN=job-grow SUM=2", a, 1, true)
    assert.matches("env RANK=0 WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=2 ROLE_RANK=0 RESTART=1 MAX=1 RUN=job-grow SUM=2", b, 1, true)
  end)

  it("goes on with the other agents when one is killed, resuming from the last commit", function()
    local port = free_port()
    local state = dir .. "/state.safetensors"
    local cmd = agent(port, "job-kill", "2:3", "--max_restarts=2 --rdzv_conf=last_call_timeout=1",
      "examples/elastic_train.lua") .. " --epochs 3 --step_sleep 0.02 --state " .. q(state)
    local status, out = run(([[
      %s > %s/a.log 2>&1 & a=$!
      sleep 0.2
      %s > %s/b.log 2>&1 & b=$!
      %s > %s/c.log 2>&1 & c=$!
      for i in $(seq 400); do [ -e %s ] && break; sleep 0.05; done
      kill -KILL $c
      wait $a; sa=$?
      wait $b; sb=$?
      echo "statuses $sa $sb"]]):format(cmd, dir, cmd, dir, cmd, dir, q(state)))
    local logs = files.read(dir .. "/a.log") .. files.read(dir .. "/b.log")
    assert.equal(0, status, out .. logs)
    assert.matches("statuses 0 0", out, 1, true)
    assert.matches("round 0: node rank %d of 3 nodes, world size 3", logs)
    assert.matches("round 1: node rank %d of 2 nodes, world size 2", logs)
    -- the workers of round 1 resumed from a commit of round 0, and finished the job
    local serial = logs:match("round 1: world size 2, resuming epoch %d+ at sample %d+ of 240 %(commit (%d+)%)")
    assert.is_truthy(serial, logs)
    assert.is_true(tonumber(serial) >= 1, logs)
    assert.matches("epoch 2 done at world size 2", logs, 1, true)
  end)

  it("ends a round that cannot gather MIN nodes within join_timeout, naming who came", function()
    local script = files.write(dir, "env.lua", ENV)
    local port = free_port()
    local status, out = run(agent(port, "job-short", "2:3", "--rdzv_conf=join_timeout=1", script) .. " 2>&1")
    assert.equal(1, status, out)
    assert.matches("rendezvous of job 'job-short' at 127.0.0.1:" .. port .. ": round 0 waited 1 s "
      .. "(join_timeout) for at least 2 nodes; 1 joined (", out, 1, true)
    assert.not_matches("env RANK", out, 1, true)
  end)

  it("counts failures against --max_restarts and ends the job for every node", function()
    local script = files.write(dir, "fail.lua", [[
local dist = require "ddplua.distributed"
dist.init_process_group { backend = "gloo", timeout = 20 }
print("attempt " .. os.getenv("TORCHELASTIC_RESTART_COUNT") .. " at world size " .. dist.get_world_size())
if dist.get_rank() == 1 then error("rank 1 gives up") end
dist.barrier()
]])
    local port = free_port()
    local cmd = agent(port, "job-fail", "2:2", "--max_restarts=1 --rdzv_conf=last_call_timeout=0.2", script)
    local status, out = run(("%s > %s/a.log 2>&1 & a=$!; %s > %s/b.log 2>&1; sb=$?; wait $a; echo \"statuses $? $sb\"")
      :format(cmd, dir, cmd, dir))
    assert.equal(0, status, out)
    assert.matches("statuses 1 1", out, 1, true)
    local both = files.read(dir .. "/a.log") .. files.read(dir .. "/b.log")
    -- two rounds (the first and its one restart), then the budget is spent
    assert.matches("attempt 0 at world size 2", both, 1, true)
    assert.matches("attempt 1 at world size 2", both, 1, true)
    assert.not_matches("attempt 2", both, 1, true)
    assert.matches("rank 1 gives up", both, 1, true)
    assert.matches("round 1 ended and no restarts are left (--max_restarts=1", both, 1, true)
  end)
end)
