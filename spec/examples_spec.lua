-- Specs for examples/: every script runs as its header says and trains (a few steps on
-- Fashion-MNIST, chosen with --steps so the suite stays fast). The DDP examples run under
-- the launcher (torchrun style) and with dl.spawn; only rank 0 prints. embed_linear.c is
-- built and run by spec/embed_spec.lua.
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- The examples this spec runs; a new example must be added here (checked below).
local COVERED = { ["amp_ddp_overview.lua"] = true, ["ddp_minimal.lua"] = true, ["ddp_spawn.lua"] = true, ["single_process.lua"] = true }

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
