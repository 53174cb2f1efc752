-- Specs for examples/: every script runs as its header says and trains (a few steps on
-- Fashion-MNIST, chosen with --steps so the suite stays fast). The DDP examples run under
-- the launcher (torchrun style) and with dl.spawn; only rank 0 prints. embed_linear.c is
-- built and run by spec/embed_spec.lua.
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- The examples this spec runs; a new example must be added here (checked below).
local COVERED = { ["amp_ddp_overview.lua"] = true, ["ddp_minimal.lua"] = true, ["ddp_spawn.lua"] = true, ["single_process.lua"] = true,
  ["multigpu_demo_v1.lua"] = true, ["multigpu_demo_v2.lua"] = true, ["multigpu_demo_v3.lua"] = true, ["compare_demos.lua"] = true,
  ["hpo.lua"] = true, ["tensor_parallel_example.lua"] = true, ["sequence_parallel_example.lua"] = true, ["fsdp_tp_example.lua"] = true,
  ["elastic_train.lua"] = "spec/multinode/elastic_spec.lua (three namespace nodes, one killed and back)" }

describe("examples/", function()
  it("trains with DDP under `ddplua --nproc_per_node=2` (ddp_minimal.lua) #dist", function()
    local status, out = files.run(exe .. " --nproc_per_node=2 --standalone examples/ddp_minimal.lua --steps 60")
    assert.are.equal(0, status, out)
    local loss = tonumber(out:match("%[rank 0%]: epoch 1 done: 60 steps per rank, last loss ([%d.]+) %(mean over 2 ranks%)"))
    assert.is_truthy(loss, out)
    assert.is_true(loss < 1.5, "loss after 60 steps: " .. loss) -- chance is ln 10 = 2.30
    assert.not_matches("%[rank 1%]: epoch", out)
  end)

  for _, case in ipairs { { "tensor_parallel_example.lua", "Tensor Parallel iter %d completed", "Tensor Parallel training completed!" },
    { "sequence_parallel_example.lua", "Sequence Parallel iter %d completed", "Sequence Parallel training completed!" },
    { "fsdp_tp_example.lua", "2D iter %d complete", "2D training successfully completed!" } } do
    it(("runs pytorch/examples' %s on 4 ranks with the losses of one process #dist"):format(case[1]), function()
      local status, out = files.run(exe .. " --nproc_per_node=4 --standalone examples/" .. case[1] .. " --iters 5 --check")
      assert.are.equal(0, status, out)
      local _, iters = out:gsub("%[rank 0%]: " .. case[2], "")
      assert.are.equal(5, iters, out)
      local diff = tonumber(out:match("largest relative loss difference against one process: (%S+)"))
      assert.is_truthy(diff, out)
      assert.is_true(diff <= 1e-5, out)
      assert.matches(case[3], out, 1, true)
    end)
  end

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

  -- The seed ddp-in-hpo-propulate.txt's multi-rank workers (hpo.lua) with a tiny budget: 4
  -- ranks = 2 workers × 2 ranks, 2 generations of 2 individuals per worker, 5 steps of 2
  -- epochs each. A second run after "losing" the last round's results resumes from the
  -- population file and trains exactly those two individuals again, to the same losses; a
  -- run killed with SIGTERM mid-generation resumes with what it had evaluated kept.
  describe("HPO with multi-rank workers (hpo.lua, seed ddp-in-hpo-propulate.txt) #dist", function()
    local dir = files.tmpdir("hpo")
    teardown(function() files.remove(dir) end)
    local function run()
      return files.run(("timeout 300 %s --nproc_per_node=4 --standalone examples/hpo.lua --generations 2 --per_worker 2 "
        .. "--epochs 2 --steps 5 --batch_size 16 --subset 400 --val_subset 200 --out %s/out --save_models %s/models")
        :format(exe, dir, dir))
    end
    local function population()
      local rows = {}
      for line in files.read(dir .. "/out/population.txt"):gmatch("[^\n]+") do
        local c = {}
        for v in line:gmatch("%S+") do c[#c + 1] = v end
        rows[#rows + 1] = c
      end
      return rows
    end
    local first

    it("searches 2 generations on 2 workers × 2 ranks, prints the best and writes the population and the plot", function()
      local status, out = run()
      assert.are.equal(0, status, out)
      first = out
      assert.matches("[rank 0]: hpo: 2 workers x 2 ranks, 4 individuals per generation, 2 generations", out, 1, true)
      -- each worker's group rank 0 reports its individuals: worker 0 on world rank 0, worker 1 on rank 2
      local _, w0 = out:gsub("%[rank 0%]: hpo: worker 0 trained generation %d individual %d", "")
      local _, w1 = out:gsub("%[rank 2%]: hpo: worker 1 trained generation %d individual %d", "")
      assert.are.same({ 4, 4 }, { w0, w1 }, out)
      assert.not_matches("%[rank [13]%]: hpo", out)                  -- group rank 1 stays quiet
      local _, identical = out:gsub("replicas identical", "")
      assert.are.equal(8, identical, out)                           -- verify_sync passed in each group
      assert.matches("[rank 0]: hpo: 8 individuals trained in this run, 8 evaluated in all; best 5:", out, 1, true)
      assert.matches("| # | generation | conv_layers | activation | lr | gamma | loss | epochs |", out, 1, true)
      local losses = {}
      for l in out:gmatch("%[rank 0%]: | %d | [12] | %d+ | %a+ | [%d.e-]+ | [%d.]+ | ([%d.]+) | [12] |") do losses[#losses + 1] = tonumber(l) end
      assert.are.equal(5, #losses, out)
      for i = 2, 5 do assert.is_true(losses[i - 1] <= losses[i], out) end -- sorted, best first
      local pop = population()
      assert.are.same({ "generation", "index", "conv_layers", "activation", "lr", "gamma", "loss", "epochs" }, pop[1])
      assert.are.equal(9, #pop)
      for i = 2, 9 do
        local c = pop[i]
        local layers, lr, gamma = tonumber(c[3]), tonumber(c[5]), tonumber(c[6])
        assert.is_true(layers >= 2 and layers <= 10 and lr >= 1e-4 and lr <= 1e-2 and gamma >= 0.5 and gamma <= 0.999, table.concat(c, " "))
        assert.is_truthy(({ relu = true, sigmoid = true, tanh = true })[c[4]], c[4])
        assert.is_true(tonumber(c[7]) > 0 and tonumber(c[8]) == 2, table.concat(c, " "))
      end
      assert.is_nil(io.open(dir .. "/out/population.txt.tmp", "r"), "the temporary file is renamed")
      local dat = files.read(dir .. "/out/loss.dat")
      assert.matches("^# generation best mean best_so_far\n1 [%d.]+ [%d.]+ [%d.]+\n2 [%d.]+ [%d.]+ [%d.]+\n$", dat)
      if os.execute("command -v gnuplot >/dev/null 2>&1") == 0 then
        assert.matches("hpo: wrote " .. dir:gsub("%p", "%%%0") .. "/out/loss.png", out)
        assert.are.equal("\137PNG", files.read(dir .. "/out/loss.png"):sub(1, 4))
      else
        assert.matches("gnuplot is not installed", out)
      end
      -- the two ranks of each worker end with the same weights; the two workers do not
      for w = 0, 1 do
        local s, v = files.run(("%s verify %s/models/worker%d_rank0.safetensors %s/models/worker%d_rank1.safetensors")
          :format(exe, dir, w, dir, w))
        assert.are.equal(0, s, v)
        assert.matches("tensors identical across 2 files", v)
      end
      local s, v = files.run(("%s verify %s/models/worker0_rank0.safetensors %s/models/worker1_rank0.safetensors"):format(exe, dir, dir))
      assert.are_not.equal(0, s, v)
    end)

    it("resumes from the population file: trains only what was not evaluated, to the same losses", function()
      assert.is_truthy(first, "needs the first run")
      local full = population()
      local f = assert(io.open(dir .. "/out/population.txt", "w"))   -- the last round's results "lost"
      for i, c in ipairs(full) do
        local row = { unpack(c) }
        if i > 1 and c[1] == "2" and tonumber(c[2]) >= 3 then row[7], row[8] = "-", "-" end
        f:write(table.concat(row, " "), "\n")
      end
      f:close()
      local status, out = run()
      assert.are.equal(0, status, out)
      assert.matches("[rank 0]: hpo: resuming from " .. dir .. "/out/population.txt: 8 individuals, 6 evaluated", out, 1, true)
      local _, n = out:gsub("hpo: worker %d trained generation 2 individual [34] ", "")
      local _, all = out:gsub("hpo: worker %d trained", "")
      assert.are.same({ 2, 2 }, { n, all }, out)
      assert.matches("hpo: 2 individuals trained in this run, 8 evaluated in all", out, 1, true)
      local again = population()
      for i = 2, 9 do
        for k = 1, 6 do assert.are.equal(full[i][k], again[i][k]) end -- nothing re-bred
        local a, b = tonumber(full[i][7]), tonumber(again[i][7])
        assert.is_true(math.abs(a - b) <= 1e-5 * a, full[i][7] .. " vs " .. again[i][7])
      end
      status, out = run()                                            -- nothing left to do
      assert.are.equal(0, status, out)
      assert.matches("hpo: 0 individuals trained in this run, 8 evaluated in all", out, 1, true)
    end)

    it("resumes a search killed mid-generation: what was evaluated is kept, the rest trained", function()
      local args = ("--nproc_per_node=4 --standalone examples/hpo.lua --generations 2 --per_worker 2 --epochs 2 "
        .. "--steps 20 --subset 400 --val_subset 200 --out %s/killed"):format(dir)
      local status, out = files.run(("%s %s > %s/killed.out 2>&1 & echo $! > %s/killed.pid"):format(exe, args, dir, dir))
      assert.are.equal(0, status, out)
      local pid = assert(tonumber(files.read(dir .. "/killed.pid")))
      local pop_path = dir .. "/killed/population.txt"
      local function evaluated_rows()                             -- "generation index" -> the whole line
        local rows, f = {}, io.open(pop_path, "r")
        if not f then return rows, 0 end
        local n = 0
        for line in f:lines() do
          local c = {}
          for v in line:gmatch("%S+") do c[#c + 1] = v end
          if c[1] ~= "generation" and c[7] and c[7] ~= "-" then rows[c[1] .. " " .. c[2]] = line; n = n + 1 end
        end
        f:close()
        return rows, n
      end
      local before, n = {}, 0
      for _ = 1, 600 do                                           -- at most 120 s
        before, n = evaluated_rows()
        if n >= 1 then break end
        os.execute("sleep 0.2")
      end
      os.execute("kill -TERM " .. pid)                            -- the launcher stops its workers
      for _ = 1, 150 do
        if os.execute("kill -0 " .. pid .. " 2>/dev/null") ~= 0 then break end
        os.execute("sleep 0.2")
      end
      assert.are_not.equal(0, os.execute("kill -0 " .. pid .. " 2>/dev/null"), "the launcher did not stop")
      before, n = evaluated_rows()                                -- what the killed run left
      assert.is_true(n >= 1 and n < 8, files.read(dir .. "/killed.out"))
      status, out = files.run(exe .. " " .. args)
      assert.are.equal(0, status, out)
      assert.matches(("hpo: resuming from %s: %%d individuals, %d evaluated"):format(pop_path:gsub("%p", "%%%0"), n), out)
      local _, trained = out:gsub("hpo: worker %d trained", "")
      assert.are.equal(8 - n, trained, out)
      local after, total = evaluated_rows()
      assert.are.equal(8, total)
      for key, line in pairs(before) do assert.are.equal(line, after[key]) end -- kept exactly
    end)

    it("stops an individual early after 5 epochs without a better validation loss", function()
      local status, out = files.run(("timeout 300 %s --nproc_per_node=4 --standalone examples/hpo.lua --generations 1 "
        .. "--per_worker 2 --epochs 40 --steps 2 --subset 64 --val_subset 64 --out %s/early"):format(exe, dir))
      assert.are.equal(0, status, out)
      local early = 0
      for epochs in out:gmatch("hpo: worker %d trained generation 1 individual %d [^\n]*after (%d+) epoch%(s%)") do
        epochs = tonumber(epochs)
        assert.is_true(epochs >= 6 and epochs <= 40, out)       -- a stop needs a best epoch and 5 after it
        if epochs < 40 then early = early + 1 end
      end
      assert.is_true(early >= 1, out) -- lr decays by gamma < 1 every epoch: the loss levels off
    end)

    it("refuses a world that does not split into workers", function()
      local status, out = files.run(("timeout 60 %s --nproc_per_node=3 --standalone examples/hpo.lua --out %s/odd"):format(exe, dir))
      assert.are_not.equal(0, status, out)
      assert.matches("hpo.lua: the world size 3 is not a multiple of %-%-ranks_per_worker 2", out)
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
