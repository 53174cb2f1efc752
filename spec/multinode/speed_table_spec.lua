-- Specs for the seeds' speed table (bench/speed_table.sh, bench/speed_table.lua): with a tiny
-- budget (1 round, 1 batch of 16) the script prints its bench/RESULTS.md section with every
-- row of seed multigpu-demos.txt's table, each ddplua row timed (the two-node row over
-- namespace nodes, or skipped with the reason where they cannot be made); one row's program
-- reports what it ran and rejects a bad model. No timing is asserted.
local files = require "files"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- The table row whose method cell starts with `method`, split into its cells.
local function row(out, method)
  for line in out:gmatch("[^\n]+") do
    if line:sub(1, #method + 2) == "| " .. method then
      local cells = {}
      for c in line:gmatch("|%s*([^|]-)%s*%f[|]") do cells[#cells + 1] = c end
      return cells
    end
  end
end

describe("speed table #bench", function()
  it("bench/speed_table.lua reports the row it ran: single process, DataParallel on the simulated devices, DDP", function()
    local args = " bench/speed_table.lua --model cnn --batches 2 --warmup 1 --batch_size 16"
    local status, out = files.run(exe .. args)
    assert.equal(0, status, out)
    assert.truthy(out:match("model=cnn method=single processes=1 devices=1 batches=2 epoch_time_s=[%d.]+ batch_time_s=[%d.]+"), out)
    status, out = files.run("DDPLUA_CUDA_PLUGIN=$PWD/build/libddplua_cuda_sim.so DDPLUA_SIM_DEVICES=2 " .. exe ..
      args .. " --data_parallel")
    assert.equal(0, status, out)
    assert.truthy(out:match("method=dp processes=1 devices=2 batches=2"), out)
    status, out = files.run(exe .. " --nproc_per_node=2 --standalone" .. args:gsub("cnn", "resnet20"))
    assert.equal(0, status, out)
    assert.truthy(out:match("model=resnet20 method=ddp processes=2 devices=2 batches=2"), out)
  end)

  it("bench/speed_table.lua rejects an unknown model and a batch that does not divide", function()
    local status, out = files.run(exe .. " bench/speed_table.lua --model vgg --batches 1")
    assert.are_not.equal(0, status)
    assert.truthy(out:find("--model must be cnn or resnet20, got vgg", 1, true), out)
    status, out = files.run(exe .. " --nproc_per_node=2 --standalone bench/speed_table.lua --batch_size 15 --batches 1")
    assert.are_not.equal(0, status)
    assert.truthy(out:find("--batch_size 15 does not divide over 2 processes", 1, true), out)
  end)

  it("bench/speed_table.sh prints its section with every row timed (tiny budget)", function()
    local status, out = files.run("(ROUNDS=1 MODELS=cnn CNN_BATCHES=1 WARMUP=1 BATCH=16 bench/speed_table.sh 2>/dev/null)")
    assert.equal(0, status, out)
    assert.truthy(out:match("^## The seeds' speed table"), out)   -- bench/run.sh replaces the section by this heading
    assert.truthy(out:find("epoch = 1 batches", 1, true), out)
    for _, method in ipairs { "single process", "DataParallel", "DDP, one node", "DDP, two namespace nodes" } do
      local cells = row(out, method)
      assert.truthy(cells, method .. " row missing:\n" .. out)
      if method:find("two namespace") and cells[2]:find("^skipped: ") then
        assert.truthy(#cells[2] > #"skipped: ", out)                -- the reason is stated
      else
        assert.truthy(cells[2]:match("^%d+:%d%d%.%d%d$"), method .. " epoch time:\n" .. out)
        assert.truthy(cells[3]:match("^[%d.]+ s$"), method .. " batch time:\n" .. out)
      end
    end
  end)
end)
