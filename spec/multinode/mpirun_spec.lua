-- Specs for launching train.lua with Open MPI's mpirun instead of ddplua's launcher: the
-- ranks take their rank, world size and local rank from OMPI_COMM_WORLD_RANK / _SIZE /
-- _LOCAL_RANK (dist.env_info), the rendezvous from MASTER_ADDR / MASTER_PORT forwarded with
-- `mpirun -x`, and the run must end with the same weights, bit for bit, as
-- `ddplua --nproc_per_node=2` on the same configuration (the same global batches reduced in
-- the same order). Pending where mpirun is not installed (`make deps` installs openmpi-bin).
local files = require "files"
local multiproc = require "multiproc"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

local function have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == 0 end

-- The value of column `name` in the last line of a metrics.csv.
local function last_metric(csv, name)
  local header = csv:match("^[^\n]*")
  local last = csv:match("([^\n]+)\n?$")
  local col = 0
  for h in header:gmatch("[^,]+") do
    col = col + 1
    if h == name then
      local i = 0
      for v in last:gmatch("[^,]+") do
        i = i + 1
        if i == col then return v end
      end
    end
  end
  error("no column " .. name .. " in " .. header)
end

describe("mpirun launch #dist", function()
  it("runs train.lua on 2 ranks to the launcher's weights, bit for bit", function()
    if not have("mpirun") then
      pending("mpirun is not installed (make deps installs openmpi-bin)")
      return
    end
    local dir = files.tmpdir("mpirun")
    finally(function() files.remove(dir) end)
    local common = "train.lua --subset 640 --test-subset 200 --epochs 2 --threads 1 --quiet --save-all-ranks "

    local status, out = files.run(exe .. " --nproc_per_node=2 --standalone " .. common .. "--out " .. q(dir .. "/launcher"))
    assert.equal(0, status, out)

    -- As a user runs it (README "Several machines"): the rendezvous in MASTER_ADDR and
    -- MASTER_PORT, the store secret, each forwarded to the ranks with -x. Root needs
    -- --allow-run-as-root; --oversubscribe lets 2 ranks start on a 1-core machine.
    local root = io.popen("id -u"):read("*l") == "0"
    local mpirun = "mpirun -np 2 --oversubscribe " .. (root and "--allow-run-as-root " or "")
      .. "-x MASTER_ADDR -x MASTER_PORT -x DDPLUA_STORE_SECRET "
    status, out = files.run(("MASTER_ADDR=127.0.0.1 MASTER_PORT=%d DDPLUA_STORE_SECRET=mpirun-spec-%d "
      .. "timeout 300 %s%s %s--out %s"):format(multiproc.free_port(), math.random(1e9), mpirun, exe, common,
        q(dir .. "/mpirun")))
    assert.equal(0, status, out)
    -- one job of 2 processes, not 2 single-process runs
    assert.matches("batch 64 %(32 per process%), 2 epochs, 2 process%(es%)", out)
    local _, count = out:gsub("training fashion_mnist_cnn", "")
    assert.equal(1, count, "only rank 0 logs:\n" .. out)

    status, out = files.run(("%s verify %s/mpirun/model_rank0.safetensors %s/mpirun/model_rank1.safetensors "
      .. "%s/launcher/model_rank0.safetensors"):format(exe, dir, dir, dir))
    assert.equal(0, status, out)
    assert.matches("8 tensors identical across 3 files", out)
    assert.is_true(files.read(dir .. "/mpirun/model.safetensors") == files.read(dir .. "/launcher/model.safetensors"),
      "mpirun's final model differs from the launcher's")
    local a, b = files.read(dir .. "/mpirun/metrics.csv"), files.read(dir .. "/launcher/metrics.csv")
    for _, col in ipairs { "train_loss", "train_acc", "test_loss", "test_acc" } do
      assert.equal(last_metric(b, col), last_metric(a, col), col)
    end
  end)
end)
