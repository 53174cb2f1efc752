-- Specs for the hierarchical all-reduce (Note [hierarchical all-reduce] in
-- runtime/comm/pg_gloo.c) on namespace nodes (tools/netns_nodes.sh): a gloo group of
-- 2 nodes x 2 ranks all-reduces within each node through shared memory, between the nodes'
-- leaders through Gloo, then broadcasts within each node. Checked against the exact sums,
-- bitwise across the ranks, and seen from outside the library: the world group maps a
-- shared-memory segment (its node's) and each node's eth0 carries one tensor size per
-- all-reduce (the leaders' ring of 2) instead of the flat ring's 1.5 (4 ranks). The flat
-- ring ($DDPLUA_HIERARCHICAL=0) is run beside it for the comparison. train.lua over 2 x 2
-- (with replicas identical) is netns_spec.lua's, which now goes this way. Pending, with the
-- reason, where namespaces cannot be made.
local files = require "files"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local nodes = "tools/netns_nodes.sh"
local q = files.quote

local unavailable = require("tool_check").unavailable(nodes)

-- Each rank: an all-reduce of rank-dependent values whose sums are exact in f32 (wrong:
-- elements that differ from the sum over ranks), one of random values (differ: elements
-- of the all-gathered results that differ from this rank's, compared as numbers: bitwise
-- for finite values), the shared-memory segments this process maps (/proc/self/maps), and
-- the bytes its node's eth0 sent during one all-reduce of a 16 MiB tensor.
local SCRIPT = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
dist.init_process_group {}
local rank, world = dist.get_rank(), dist.get_world_size()
local function segments()
  local n = 0
  for line in io.lines("/proc/self/maps") do
    if line:find("/ddplua.", 1, true) then n = n + 1 end
  end
  return n
end
local function tx()
  local f = assert(io.open("/sys/class/net/eth0/statistics/tx_bytes"))
  local v = tonumber(f:read("*l"))
  f:close()
  return v
end
local n = 1000
local function value(r, i) return (r + 1) * ((i * 7) % 1000) - r * 0.5 end
local vals = {}
for i = 1, n do vals[i] = value(rank, i) end
local t = dl.tensor(vals, { dtype = "float32" })
dist.all_reduce(t)
local got, wrong = t:tolist(), 0
for i = 1, n do
  local e = 0
  for r = 0, world - 1 do e = e + value(r, i) end
  if got[i] ~= e then wrong = wrong + 1 end
end
dl.manual_seed(100 + rank)
local x = dl.randn({ 4096 })
dist.all_reduce(x)
local all = {}
for r = 1, world do all[r] = dl.zeros({ 4096 }) end
dist.all_gather(all, x)
local mine, differ = x:tolist(), 0
for r = 1, world do
  local other = all[r]:tolist()
  for i = 1, #mine do if other[i] ~= mine[i] then differ = differ + 1 end end
end
local big = dl.ones({ 4 * 1024 * 1024 })
dist.all_reduce(big)
dist.barrier()
local before = tx()
dist.all_reduce(big)
dist.barrier()
local sent = tx() - before
print(("wrong %d differ %d segments %d sent %d bytes %d"):format(wrong, differ, segments(), sent, 4 * big:numel()))
dist.destroy_process_group()
]]

-- The job on 2 nodes x 2 ranks with environment `env`: per rank {wrong, differ, segments,
-- sent, bytes}.
local function run_job(env)
  local dir = files.tmpdir("hier")
  finally(function() files.remove(dir) end)
  local script = dir .. "/hier.lua"
  local f = assert(io.open(script, "w"))
  f:write(SCRIPT)
  f:close()
  local status, out = files.run(("%s DDPLUA_STORE_SECRET=hier-spec-%d timeout 180 %s run 2 sh -c %s"):format(
    env, math.random(1e9), nodes, q(("exec %s --nnodes=2 --node_rank=$NODE_RANK --nproc_per_node=2 "
      .. "--master_addr=$NODE0_ADDR --master_port=29500 %s"):format(q(exe), q(script)))))
  assert.equal(0, status, out)
  local ranks = {}
  for r = 0, 3 do
    local w, d, s, sent, bytes = out:match(("%%[node %d%%] %%[rank %d%%]: wrong (%%d+) differ (%%d+) "
      .. "segments (%%d+) sent (%%d+) bytes (%%d+)"):format(math.floor(r / 2), r))
    assert.is_truthy(w, out)
    ranks[r] = { wrong = tonumber(w), differ = tonumber(d), segments = tonumber(s),
                 sent = tonumber(sent), bytes = tonumber(bytes), out = out }
  end
  return ranks
end

describe("hierarchical all-reduce on namespace nodes #dist", function()
  it("2 nodes x 2 ranks: exact sums, identical bits, node segments, leaders' traffic only", function()
    if unavailable then
      pending("namespace nodes are not available here: " .. unavailable)
      return
    end
    local hier = run_job("")
    local flat = run_job("DDPLUA_HIERARCHICAL=0")
    for r = 0, 3 do
      for _, job in ipairs({ hier, flat }) do
        assert.equal(0, job[r].wrong, job[r].out)
        assert.equal(0, job[r].differ, job[r].out)
      end
      -- the world group maps its node's segment; flat, none (the nodes share no memory)
      assert.equal(1, hier[r].segments, hier[r].out)
      assert.equal(0, flat[r].segments, flat[r].out)
      -- one tensor size leaves each node between the leaders (2-rank ring: 2 x 1/2), where
      -- the flat 4-rank ring sends 1.5 (2 x 3/4) across each node boundary; a few KiB of
      -- fingerprints, barriers and TCP acknowledgements besides
      local n = hier[r].bytes
      assert.is_true(hier[r].sent >= n and hier[r].sent < 1.2 * n,
        ("rank %d: hierarchical sent %d bytes for a %d-byte tensor"):format(r, hier[r].sent, n))
      assert.is_true(flat[r].sent >= 1.4 * n,
        ("rank %d: flat sent %d bytes for a %d-byte tensor"):format(r, flat[r].sent, n))
    end
  end)
end)
