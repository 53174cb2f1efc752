-- Spec for elastic training across namespace nodes (tools/netns_nodes.sh): three nodes run
-- examples/elastic_train.lua under `ddplua --nnodes=2:3` (one worker each, the rendezvous
-- store hosted by node 0's agent, Note [elastic rendezvous] in runtime/cli/rendezvous.c).
-- Mid-epoch, node 2 dies (every process in it SIGKILLed, its agent included): nodes 0 and 1
-- must go on at world size 2 within 30 s. Node 2's agent is started again: it joins, the
-- others restart their workers, and the job finishes at world size 3.
--
-- Exactly once: each worker records the sample indices of every step it trains (with the
-- epoch and the epoch's position before the step), and rank 0 of each round records where
-- the round resumed (the commit that elastic.State:sync brought back). Steps trained after
-- the last commit before a round ended are rolled back and trained again, so a step of round
-- K counts only when it lies before round K+1's resume point (epoch, position); every step of
-- the last round counts. Counted that way, every sample index of every epoch must have been
-- trained exactly once (Note [elastic resume]: 240 samples, commits every 24, so every
-- remainder divides by 2 and by 3 and nothing is padded). Pending where namespaces cannot
-- be made.
local files = require "files"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

local unavailable = require("tool_check").unavailable("tools/netns_nodes.sh")

local N, EPOCHS = 240, 5

-- The step records of round `round` (every rank's file): {epoch, pos, world, indices}.
local function steps_of(dir, round)
  local out = {}
  for r = 0, 2 do
    local text = files.read_if_exists(("%s/rank%d_round%d.txt"):format(dir, r, round))
    for line in (text or ""):gmatch("[^\n]+") do
      local e, p, w, list = line:match("^step (%d+) (%d+) (%d+) ([%d,]+)$")
      assert(e, "bad record: " .. line)
      local idx = {}
      for i in list:gmatch("%d+") do idx[#idx + 1] = tonumber(i) end
      out[#out + 1] = { epoch = tonumber(e), pos = tonumber(p), world = tonumber(w), idx = idx }
    end
  end
  return out
end

describe("elastic training across namespace nodes #dist", function()
  local dir
  before_each(function() dir = files.tmpdir("elastic-nodes") end)
  after_each(function() if not os.getenv("KEEP") then files.remove(dir) end end)

  it("goes on at world size 2 when a node dies, takes it back, and trains every sample once", function()
    if unavailable then
      pending("namespace nodes are not available here: " .. unavailable)
      return
    end
    local rec = dir .. "/rec"
    assert(os.execute("mkdir -p " .. q(rec)))
    local job = ("exec %s --nnodes=2:3 --rdzv_endpoint=$NODE0_ADDR:29400 --rdzv_id=elastic-spec --max_restarts=3 "
      .. "--rdzv_conf=last_call_timeout=1,join_timeout=30 --nproc_per_node=1 examples/elastic_train.lua "
      .. "--epochs %d --samples %d --step_sleep 0.05 --state %s/state.safetensors --record %s")
      :format(q(exe), EPOCHS, N, q(dir), q(rec))
    local status, out = files.run(([[
      set -u
      export DDPLUA_STORE_SECRET=elastic-spec DDP_NUM_THREADS=1
      now() { date +%%s.%%N; }
      id=$(tools/netns_nodes.sh up 3 --owner $$) || exit 2
      trap 'tools/netns_nodes.sh down $id' EXIT
      for k in 0 1 2; do
        tools/netns_nodes.sh exec $id $k sh -c %s > %s/node$k.log 2>&1 &
        eval "pid$k=\$!"
      done
      # mid-epoch 0 at world size 3: node 2 dies
      for i in $(seq 1200); do [ "$(cat %s/rank0_round0.txt 2>/dev/null | wc -l)" -ge 5 ] && break; sleep 0.05; done
      [ "$(cat %s/rank0_round0.txt 2>/dev/null | wc -l)" -ge 5 ] || { echo "the job did not start"; exit 3; }
      t0=$(now)
      tools/netns_nodes.sh kill $id 2
      wait $pid2
      # nodes 0 and 1 train at world size 2
      for i in $(seq 1200); do cat %s/rank*_round*.txt | grep -q "^step [0-9]* [0-9]* 2 " && break; sleep 0.05; done
      t1=$(now)
      # 4 steps each (positions move by 8 a step from a multiple of 24: a commit at world size 2)
      for i in $(seq 1200); do [ "$(cat %s/rank*_round*.txt | grep -c "^step [0-9]* [0-9]* 2 ")" -ge 8 ] && break; sleep 0.05; done
      # node 2 comes back
      tools/netns_nodes.sh exec $id 2 sh -c %s > %s/node2b.log 2>&1 &
      pid2=$!
      wait $pid0; s0=$?
      wait $pid1; s1=$?
      wait $pid2; s2=$?
      echo "statuses $s0 $s1 $s2 shrink $(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}') total $(awk -v a="$t0" -v b="$(now)" 'BEGIN {print b - a}')"
    ]]):format(q(job), q(dir), q(rec), q(rec), q(rec), q(rec), q(job), q(dir)))
    local logs = ""
    for _, name in ipairs { "node0", "node1", "node2", "node2b" } do
      logs = logs .. "---- " .. name .. "\n" .. (files.read_if_exists(dir .. "/" .. name .. ".log") or "")
    end
    assert.equal(0, status, out .. logs)
    local s0, s1, s2, shrink = out:match("statuses (%d+) (%d+) (%d+) shrink ([%d.]+)")
    assert.is_truthy(s0, out .. logs)
    assert.same({ "0", "0", "0" }, { s0, s1, s2 }, logs)
    assert.is_true(tonumber(shrink) < 30, ("world size 2 came %s s after node 2 died\n%s"):format(shrink, logs))
    -- the survivors were told, and the newcomer's arrival restarted them
    assert.matches("round 0: node rank %d of 3 nodes, world size 3", logs)
    assert.matches("node rank %d of 2 nodes, world size 2 %([^\n]*%); gone since the last round: node2 %(10%.213%.0%.3%)", logs)
    assert.matches("membership changed: node node2 %(10%.213%.0%.3%) waits to join round", logs)

    -- the rounds, their world sizes and resume points
    local rounds, resume = {}, {}
    for k = 0, 3 do
      local text = files.read_if_exists(("%s/resume_round%d.txt"):format(rec, k))
      if text then
        local e, p = text:match("^resume (%d+) (%d+)")
        resume[k] = { epoch = tonumber(e), pos = tonumber(p) }
        rounds[#rounds + 1] = k
      end
    end
    local last = rounds[#rounds]
    local worlds = {}
    for _, k in ipairs(rounds) do worlds[k] = (steps_of(rec, k)[1] or {}).world end
    assert.equal(3, worlds[0], logs)
    assert.equal(3, worlds[last], logs) -- the job finished at world size 3
    local shrunk = false
    for _, k in ipairs(rounds) do shrunk = shrunk or worlds[k] == 2 end
    assert.is_true(shrunk, logs)

    -- every sample of every epoch trained once, counting committed steps only
    local seen, kept_at = {}, {}
    for e = 0, EPOCHS - 1 do seen[e] = {} end
    for _, k in ipairs(rounds) do
      local stop = resume[k + 1]
      for _, s in ipairs(steps_of(rec, k)) do
        local finish = s.pos + #s.idx * s.world
        local kept = k == last or s.epoch < stop.epoch or (s.epoch == stop.epoch and finish <= stop.pos)
        if kept then
          kept_at[s.world] = true
          for _, i in ipairs(s.idx) do seen[s.epoch][i] = (seen[s.epoch][i] or 0) + 1 end
        end
      end
    end
    assert.is_true(kept_at[2], "no step at world size 2 was committed\n" .. logs)
    for e = 0, EPOCHS - 1 do
      for i = 0, N - 1 do
        assert.equal(1, seen[e][i], ("epoch %d, sample %d\n%s"):format(e, i, logs))
      end
    end
  end)
end)
