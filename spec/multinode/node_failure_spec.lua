-- Specs for failures across nodes, on the namespace nodes of tools/netns_nodes.sh: a job of
-- 2 nodes x 2 ranks runs all-reduces in a loop; then node 1's link is cut (`link ID 1
-- down`: its packets are dropped, nobody is told) or node 1 dies (every process SIGKILLed).
-- The job must end on every node within the collective timeout (20 s here), and for the cut
-- link node 0's stall report (DDPLUA_STALL_REPORT_S=5) must name node 1's host and ranks as
-- behind (Note [stall report hosts] in runtime/comm/pg_recorder.c), and node 1's
-- ranks, cut off from the store, must report too (Note [stall report store]). With
-- --max_restarts on both nodes, the job resumes when the link comes back. Pending where
-- namespaces cannot be made.
local files = require "files"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

local unavailable = require("tool_check").unavailable("tools/netns_nodes.sh")

local LOOP = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group { timeout = 20 }
local t = dl.ones({ 1000 })
for i = 1, 1e9 do
  dist.all_reduce(t)
  if i == 50 then print("running") end
  os.execute("sleep 0.01")
end
]]

-- After a restart (DDPLUA_RESTART_COUNT > 0) the loop runs 20 all-reduces of ones, checks
-- the sum and ends.
local RESTARTABLE = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group { timeout = 20 }
local restart = tonumber(os.getenv("DDPLUA_RESTART_COUNT"))
local t = dl.ones({ 1000 })
for i = 1, restart == 0 and 1e9 or 20 do
  t:fill_(1)
  dist.all_reduce(t)
  if i == 50 then print("running") end
  os.execute("sleep 0.01")
end
assert(t:sum():item() == 1000 * dist.get_world_size())
print(("resumed after restart %d on %d ranks"):format(restart, dist.get_world_size()))
dist.destroy_process_group()
]]

-- Start `code` on 2 nodes x 2 ranks (launcher flags `flags`), wait until it runs, run the
-- shell snippet `fault` ($id: the nodes' run; $dir: the folder with node0.log and
-- node1.log), wait for both launchers. Returns node 0's and node 1's output, both launchers'
-- exit statuses and the seconds from the fault to the end of the job.
local function run_with_fault(dir, fault, code, flags)
  local script = dir .. "/loop.lua"
  local f = assert(io.open(script, "w"))
  f:write(code or LOOP)
  f:close()
  local job = ("exec %s --nnodes=2 --node_rank=$NODE_RANK --nproc_per_node=2 --master_addr=$NODE0_ADDR "
    .. "--master_port=29500 %s %s"):format(q(exe), flags or "", q(script))
  local status, out = files.run(([[
    set -u
    export DDPLUA_STORE_SECRET=failure-spec DDPLUA_STALL_REPORT_S=5
    id=$(tools/netns_nodes.sh up 2 --owner $$) || exit 2
    trap 'tools/netns_nodes.sh down $id' EXIT
    for k in 0 1; do
      tools/netns_nodes.sh exec $id $k sh -c %s > %s/node$k.log 2>&1 &
      eval "pid$k=\$!"
    done
    for i in $(seq 1200); do grep -q running %s/node0.log && break; sleep 0.1; done
    grep -q running %s/node0.log || { echo "the job did not start"; exit 3; }
    t0=$(date +%%s.%%N)
    dir=%s
    %s
    wait $pid0; s0=$?
    wait $pid1; s1=$?
    echo "statuses $s0 $s1 elapsed $(awk -v a="$t0" -v b="$(date +%%s.%%N)" 'BEGIN {print b - a}')"
  ]]):format(q(job), q(dir), q(dir), q(dir), q(dir), fault))
  assert.equal(0, status, out)
  local s0, s1, elapsed = out:match("statuses (%d+) (%d+) elapsed ([%d.]+)")
  assert.is_truthy(s0, out)
  return files.read(dir .. "/node0.log"), files.read(dir .. "/node1.log"), tonumber(s0), tonumber(s1),
    tonumber(elapsed)
end

describe("failures across namespace nodes #dist #faults", function()
  local dir
  before_each(function() dir = files.tmpdir("nodefail") end)
  after_each(function() files.remove(dir) end)

  it("a cut link ends the job on both nodes within the timeout; the stall report names the node", function()
    if unavailable then
      pending("namespace nodes are not available here: " .. unavailable)
      return
    end
    local n0, n1, s0, s1, elapsed = run_with_fault(dir, "tools/netns_nodes.sh link $id 1 down")
    assert.are_not.equal(0, s0, n0)
    assert.are_not.equal(0, s1, n1)
    -- 20 s collective timeout, plus the launchers stopping their workers
    assert.is_true(elapsed < 40, ("the job ended %.1f s after the link was cut"):format(elapsed))
    -- node0's stall reports name node1's ranks as the ones behind. Which node0 rank reports
    -- first, whether its node0 peer is in the same collective or one behind ("waits too" or
    -- "is BEHIND: waiting in collective"), and which rank of a node reaches the timeout first
    -- (its peer then sees it leave) depend on scheduling, so the patterns allow either.
    for _, r in ipairs { 2, 3 } do
      assert.matches("%[rank [01]%]:   %[host node1%] rank " .. r .. " is BEHIND", n0)
    end
    assert.matches("%[rank [01]%]:   %[host node0%] rank [01] [wi][as]", n0)
    -- node1's ranks, cut off from the store on node0, report too (they printed nothing)
    assert.matches("%[rank [23]%]: ddplua: stall report %(rank [23], group 'pg'%): all_reduce #%d+ called at", n1)
    assert.matches("%[rank [23]%]:   the position of rank [01] is unknown: this rank cannot reach the store: "
      .. "[^\n]*10%.213%.0%.1:29500", n1)
    -- the group's first failure, as each node's ranks report it: a timeout. On node0 it may
    -- instead be a node0 rank that saw its node0 peer close its connections as that peer
    -- gave up, when that was seen before the peer stored its reason (Note [group abort]:
    -- the first writer wins); seen once in CI under load, not reproduced since. Either names
    -- a rank and ends the job; which of the two comes first is scheduling.
    local first0 = n0:match("timed out on rank [01] after 20 s") or
      n0:match("all_reduce failed on rank [01]: peer rank [01] disconnected")
    assert(first0, "node0 names neither a timeout nor a disconnected peer:\n" .. n0)
    assert.matches("timed out on rank [23] after 20 s", n1)
  end)

  it("a killed node ends the job on the other node at once, naming its address", function()
    if unavailable then
      pending("namespace nodes are not available here: " .. unavailable)
      return
    end
    local n0, n1, s0, _, elapsed = run_with_fault(dir, "tools/netns_nodes.sh kill $id 1")
    assert.are_not.equal(0, s0, n0)
    -- Gloo sees the connections closed at once: a dead peer, named by node 1's address
    assert.is_true(elapsed < 20, ("node 0 ended %.1f s after node 1 died"):format(elapsed))
    assert.matches("disconnected %(its process died or closed the group%)", n0)
    assert.matches("10.213.0.2", n0, 1, true)
  end)

  it("with --max_restarts on both nodes, resumes once the cut link comes back", function()
    if unavailable then
      pending("namespace nodes are not available here: " .. unavailable)
      return
    end
    -- cut the link; once both launchers restart their workers, mend it
    local n0, n1, s0, s1 = run_with_fault(dir, [[
      tools/netns_nodes.sh link $id 1 down
      for i in $(seq 900); do
        grep -q restarting "$dir/node0.log" && grep -q restarting "$dir/node1.log" && break
        sleep 0.1
      done
      tools/netns_nodes.sh link $id 1 up]], RESTARTABLE, "--max_restarts=1")
    assert.equal(0, s0, n0)
    assert.equal(0, s1, n1)
    for _, r in ipairs { 0, 1 } do assert.matches("restarting all 2 workers %(restart 1 of 1%)", ({ n0, n1 })[r + 1]) end
    for r = 0, 3 do
      assert.matches("%[rank " .. r .. "%]: resumed after restart 1 on 4 ranks", r < 2 and n0 or n1)
    end
  end)
end)
