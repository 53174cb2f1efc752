-- Specs for examples/: every script runs as its header says and trains (a few steps on
-- Fashion-MNIST, chosen with --steps so the suite stays fast). The DDP examples run under
-- the launcher (torchrun style) and with dl.spawn; only rank 0 prints. embed_linear.c is
-- built and run by spec/embed_spec.lua.
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- The examples this spec runs; a new example must be added here (checked below).
local COVERED = { ["amp_ddp_overview.lua"] = true, ["ddp_minimal.lua"] = true, ["ddp_spawn.lua"] = true, ["single_process.lua"] = true,
  ["multigpu_demo_v1.lua"] = true, ["multigpu_demo_v2.lua"] = true, ["multigpu_demo_v3.lua"] = true, ["compare_demos.lua"] = true }

describe("examples/", function()
  it("trains with DDP under `ddplua --nproc_per_node=2` (ddp_minimal.lua) #dist", function()
    local status, out = files.run(exe .. " --nproc_per_node=2 --standalone examples/ddp_minimal.lua --steps 60")
    assert.are.equal(0, status, out)
    local loss = tonumber(out:match("%[rank 0%]: epoch 1 done: 60 steps per rank, last loss ([%d.]+) %(mean over 2 ranks%)"))
    assert.is_truthy(loss, out)
    assert.is_true(loss < 1.5, "loss after 60 steps: " .. loss) -- chance is ln 10 = 2.30
    assert.not_matches("%[rank 1%]: epoch", out)
  end)

  it("trains with DDP in the dl.spawn style (ddp_spawn.lua) #dist", function()
    local status, out = files.run(exe .. " examples/ddp_spawn.lua --nprocs 2 --steps 60")
    assert.are.equal(0, status, out)
    local loss = tonumber(out:match("epoch 1 done: 60 steps per rank, last loss ([%d.]+) %(mean over 2 ranks%)"))
    assert.is_truthy(loss, out)
    assert.is_true(loss < 1.5, "loss after 60 steps: " .. loss)
    assert.matches("all workers finished\n$", out)
    local _, n = out:gsub("done:", "")
    assert.are.equal(1, n, out) -- rank 0 alone prints
  end)

  it("trains with DDP, SyncBatchNorm, autocast and GradScaler and validates over ranks (amp_ddp_overview.lua) #dist", function()
    local status, out = files.run(exe .. " --nproc_per_node=2 --standalone examples/amp_ddp_overview.lua --steps 40 --subset 1000")
    assert.are.equal(0, status, out)
    assert.matches("%[rank 0%]: epoch 1: 2 ranks", out)
    assert.matches("[rank 0]: convert_sync_batchnorm: 1 SyncBatchNorm layer(s)", out, 1, true)
    local loss = tonumber(out:match("%[rank 0%]: epoch 1 step 40 loss ([%d.]+) scale"))
    assert.is_truthy(loss, out)
    assert.is_true(loss == loss and loss < math.huge, "loss: " .. tostring(loss)) -- finite
    local vloss, acc = out:match("%[rank 0%]: epoch 1 validation loss ([%d.]+) accuracy ([%d.]+) on 1000 samples")
    assert.is_truthy(acc, out)
    assert.is_true(tonumber(vloss) < math.huge and tonumber(acc) > 0.5, out) -- chance is 0.1
    assert.not_matches("%[rank 1%]: epoch", out)
  end)

  it("trains and evaluates in one process (single_process.lua)", function()
    local status, out = files.run(exe .. " examples/single_process.lua --steps 100")
    assert.are.equal(0, status, out)
    local acc = tonumber(out:match("test accuracy ([%d.]+) on 10000 samples"))
    assert.is_truthy(acc, out)
    assert.is_true(acc > 0.7, "test accuracy after 100 steps: " .. acc)
  end)

  -- The seed multigpu-demos.txt's three demos and its comparison, on a Fashion-MNIST subset
  -- (15 steps of a global batch of 66 over the first 990 training samples; 500 test
  -- samples). Every demo sees the same global batches from the same initial weights, so all
  -- follow the single-device trajectory: their last losses agree up to float sums.
  describe("the multi-GPU demos (seed multigpu-demos.txt)", function()
    local cuda = require "cuda"
    local COMMON = " --steps 15 --batch_size 66 --subset 990 --test_subset 500"
    local dir = files.tmpdir("demos")
    local runs = {} -- name -> {status, out}, each demo run once and shared by the tests below
    teardown(function() files.remove(dir) end)

    local function last_loss(out)
      return tonumber(out:match("epoch 1: 15 steps, last loss ([%d.]+), epoch time [%d.]+ s, batch time [%d.]+ s"))
    end

    local function run_v3()
      local cmd = {}
      for r = 0, 2 do -- three processes started one by one, as on three nodes
        cmd[#cmd + 1] = ("(DDP_NUM_THREADS=1 timeout 60 %s examples/multigpu_demo_v3.lua --init_method file://%s/store "
          .. "--rank %d --world_size 3 --results %s/v3.csv%s > %s/v3_rank%d.out 2>&1; echo $? > %s/v3_rank%d.status) &")
          :format(exe, dir, r, dir, COMMON, dir, r, dir, r)
      end
      files.run(table.concat(cmd, " ") .. " wait")
      local status, out = 0, ""
      for r = 0, 2 do
        local s = tonumber(files.read(("%s/v3_rank%d.status"):format(dir, r)))
        if s ~= 0 then status = s end
        out = out .. ("--- rank %d (exit %s)\n"):format(r, tostring(s)) .. files.read(("%s/v3_rank%d.out"):format(dir, r))
      end
      return status, out
    end

    local DEMOS = {
      single = function() return files.run(exe .. " examples/multigpu_demo_v1.lua --single --results " .. dir .. "/single.csv" .. COMMON) end,
      v1 = function() -- DataParallel over the two devices of the simulated CUDA plug-in
        return files.run("DDPLUA_CUDA_PLUGIN=" .. cuda.sim_plugin() .. " " .. exe .. " examples/multigpu_demo_v1.lua --results "
          .. dir .. "/v1.csv" .. COMMON)
      end,
      v2 = function()
        return files.run(exe .. " --nproc_per_node=2 --standalone examples/multigpu_demo_v2.lua --results " .. dir
          .. "/v2.csv --save_models " .. dir .. "/models" .. COMMON)
      end,
      v3 = run_v3,
    }
    local function demo(name)
      if not runs[name] then
        local status, out = DEMOS[name]()
        runs[name] = { status = status, out = out }
      end
      assert.are.equal(0, runs[name].status, runs[name].out)
      return runs[name].out
    end

    it("demo 1: nn.DataParallel over two (simulated) devices follows one device (multigpu_demo_v1.lua)", function()
      local single, v1 = demo("single"), demo("v1")
      assert.matches("single: one device, 1 device%(s%) %(cpu%), batch 66", single)
      assert.matches("v1: DataParallel, 2 device%(s%) %(cuda:0%), batch 66", v1)
      local a, b = last_loss(single), last_loss(v1)
      assert.is_truthy(a and b, single .. v1)
      assert.is_true(math.abs(a - b) <= 1e-4 * a, single .. v1)
      assert.is_true(a < 1.6, "loss after 15 steps: " .. a) -- chance is ln 10 = 2.30
      assert.matches("test accuracy [%d.]+ on 500 samples", v1)
    end)

    it("demo 2: two processes launched on one node, replicas identical (multigpu_demo_v2.lua) #dist", function()
      local out = demo("v2")
      assert.matches("%[rank 0%]: v2: 2 processes on one node %(cpu%), global batch 66", out)
      assert.not_matches("%[rank 1%]: epoch", out)
      local loss = last_loss(out)
      assert.is_true(loss and math.abs(loss - last_loss(demo("single"))) <= 1e-4 * loss, out)
      -- the seed's compare_models.py step: the two ranks' final models hold the same tensors
      local status, verify = files.run(("%s verify %s/models/final_model_rank0.safetensors %s/models/final_model_rank1.safetensors")
        :format(exe, dir, dir))
      assert.are.equal(0, status, verify)
      assert.matches("8 tensors identical across 2 files", verify)
    end)

    it("demo 3: three processes started by hand, file:// init, --rank/--world_size (multigpu_demo_v3.lua) #dist", function()
      local out = demo("v3")
      assert.matches("v3: 3 processes joined through file://" .. dir:gsub("%p", "%%%0") .. "/store %(cpu%), global batch 66", out)
      local loss = last_loss(out)
      assert.is_true(loss and math.abs(loss - last_loss(demo("single"))) <= 1e-4 * loss, out)
      local _, n = out:gsub("test accuracy", "")
      assert.are.equal(1, n, out) -- rank 0 alone prints
      assert.is_nil(io.open(dir .. "/store", "r"), "the store file is removed after training")
      local status, missing = files.run(exe .. " examples/multigpu_demo_v3.lua --rank 0")
      assert.are.equal(1, status, missing)
      assert.matches("%-%-init_method, %-%-rank and %-%-world_size are required", missing)
    end)

    it("compare step: the seed's table of the demos' timing and accuracy (compare_demos.lua)", function()
      for _, name in ipairs { "v3", "v2", "v1", "single" } do demo(name) end
      local status, out = files.run(("%s examples/compare_demos.lua %s/v3.csv %s/v1.csv %s/single.csv %s/v2.csv")
        :format(exe, dir, dir, dir, dir))
      assert.are.equal(0, status, out)
      local rows = {}
      for line in out:gmatch("[^\n]+") do rows[#rows + 1] = line end
      assert.are.equal(6, #rows, out) -- header, rule, single, v1, v2, v3 (the seed's order)
      assert.matches("^| method | processes | devices | batch | steps | epoch time | batch time | vs single | test accuracy |$", rows[1])
      local want = { { "single", 1, 1 }, { "v1 %(DataParallel%)", 1, 2 }, { "v2 %(one node, launched%)", 2, 2 },
        { "v3 %(file://, %-%-rank/%-%-world_size%)", 3, 3 } }
      local accuracy = {}
      for i, w in ipairs(want) do
        local row = rows[i + 2]
        assert.matches(("^| %s | %d | %d | 66 | 15 | 0:%%d%%d%%.%%d%%d | [%%d.]+s | [%%d.]+x | [%%d.]+ %%(500 samples%%) |$")
          :format(w[1], w[2], w[3]), row)
        accuracy[i] = tonumber(row:match("| ([%d.]+) %(500 samples%)"))
      end
      assert.matches("| 1.00x |", rows[3], 1, true)
      for i = 2, 4 do assert.is_true(math.abs(accuracy[i] - accuracy[1]) <= 0.01, out) end -- the same trajectory
      local bad = dir .. "/bad.csv"
      local f = assert(io.open(bad, "w"))
      f:write("method,steps\nv1,3\n")
      f:close()
      status, out = files.run(exe .. " examples/compare_demos.lua " .. bad)
      assert.are.equal(1, status, out)
      assert.matches("bad%.csv lacks the column 'processes'", out)
    end)
  end)

  it("says how to call each script (--help) and has a spec for every one", function()
    local p = io.popen("ls examples/*.lua")
    for path in p:lines() do
      local name = path:match("([^/]+)$")
      assert.is_true(COVERED[name] ~= nil, name .. " has no spec in spec/examples_spec.lua")
      local status, out = files.run(exe .. " " .. path .. " --help")
      assert.are.equal(0, status, out)
      assert.matches("^usage: ", out)
    end
    p:close()
  end)
end)
