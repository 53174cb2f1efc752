-- Specs for Slurm launches, run for real on a private cluster of two namespace nodes
-- (tools/slurm_local.sh --nodes 2, Note [local Slurm]): the README's sbatch script and its
-- "one launcher per node" srun line each train train.lua on node0 and node1, ending with
-- identical replicas on every rank that follow the single-process run. The script is taken
-- from README.md as written; only train.lua's arguments are shortened (a small subset) and
-- the #SBATCH resources are overridden on the sbatch command line to fit this machine
-- (2 nodes x 2 tasks x 1 cpu). Pending, with the reason, without Slurm and munge or where
-- namespace nodes cannot be made.
local files = require "files"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

local tool_check = require "tool_check"
local unavailable = tool_check.unavailable("tools/slurm_local.sh")
if not unavailable then
  local why = tool_check.unavailable("tools/netns_nodes.sh")
  unavailable = why and "namespace nodes: " .. why
end

-- The README's sbatch script (the ```bash block with #SBATCH lines).
local function readme_sbatch()
  for text in files.read("README.md"):gmatch("```bash\n(.-)```") do
    if text:find("#SBATCH", 1, true) then return text end
  end
  error("README.md has no sbatch script")
end

-- The README's "one launcher per node" srun line (inline code after the sbatch script).
local function readme_srun_launcher()
  local line = files.read("README.md"):match("`(srun %-%-ntasks%-per%-node=1 bash %-c '[^']*')`")
  assert(line, "README.md has no one-launcher-per-node srun line")
  return (line:gsub("%s*\n%s*", " "))
end

local SHORT = "train.lua --subset 640 --test-subset 200 --epochs 2 --quiet --save-all-ranks"

-- Run `script` (text) with sbatch --wait on the 2-node cluster; returns the job's output.
local function sbatch(dir, script, overrides)
  local path = dir .. "/job.sh"
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local status, out = files.run(("timeout 500 tools/slurm_local.sh run --nodes 2 sbatch --wait %s -o %s %s")
    :format(overrides, q(dir .. "/job.out"), q(path)))
  local job_out = io.open(dir .. "/job.out") and files.read(dir .. "/job.out") or "(no job output)"
  assert.equal(0, status, out .. "\n--- job output:\n" .. job_out)
  return job_out
end

-- The replicas in dir/<sub> are identical and follow the single-process run in dir/one.
local function check_replicas(dir, sub, ranks)
  local paths = {}
  for r = 0, ranks - 1 do paths[#paths + 1] = ("%s/%s/model_rank%d.safetensors"):format(dir, sub, r) end
  local status, out = files.run(exe .. " verify " .. table.concat(paths, " "))
  assert.equal(0, status, out)
  assert.matches("8 tensors identical across " .. ranks .. " files", out)
  status, out = files.run(("%s verify --atol 1e-5 %s/one/model.safetensors %s"):format(exe, dir, paths[1]))
  assert.equal(0, status, out)
end

describe("Slurm launch #slurm #dist", function()
  local dir
  before_each(function()
    if unavailable then return end
    dir = files.tmpdir("slurm")
    local status, out = files.run(exe .. " " .. SHORT:gsub(" %-%-save%-all%-ranks", "") .. " --threads 1 --out "
      .. q(dir .. "/one"))
    assert.equal(0, status, out)
  end)
  after_each(function() files.remove(dir) end)

  it("runs the README's sbatch script on 2 nodes x 2 tasks", function()
    if unavailable then
      pending("no local Slurm cluster here: " .. unavailable)
      return
    end
    local script = readme_sbatch()
    local n
    script, n = script:gsub("srun build/ddplua train%.lua[^\n]*", "srun build/ddplua " .. SHORT .. " --out " .. q(dir .. "/sb"))
    assert.equal(1, n, "the README's sbatch script no longer ends with srun build/ddplua train.lua")
    local out = sbatch(dir, script, "--nodes=2 --ntasks-per-node=2 --cpus-per-task=1")
    assert.matches("batch 64 %(16 per process%), 2 epochs, 4 process%(es%) x 1 thread", out)
    check_replicas(dir, "sb", 4)
  end)

  it("runs the README's one-launcher-per-node srun line on 2 nodes", function()
    if unavailable then
      pending("no local Slurm cluster here: " .. unavailable)
      return
    end
    -- the README script's environment (rendezvous, threads, secret), then the srun line
    local script = readme_sbatch():gsub("\nsrun [^\n]*", "")
    local line = readme_srun_launcher()
    local n
    line, n = line:gsub("train%.lua[^']*", SHORT .. " --threads 1 --out " .. dir .. "/perl")
    assert.equal(1, n, line)
    local out = sbatch(dir, script .. line .. "\n", "--nodes=2 --ntasks-per-node=1 --cpus-per-task=1")
    assert.matches("%[rank 0%]: training .* batch 64 %(8 per process%), 2 epochs, 8 process%(es%)", out)
    check_replicas(dir, "perl", 8)
  end)
end)
