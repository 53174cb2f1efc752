-- Specs for train.lua end to end (run as `ddplua train.lua ...` in a subprocess): the loss
-- falls on a subset, the same seed gives bitwise identical weights, and resuming from a
-- checkpoint equals an uninterrupted run; --profile-trace; plus `ddplua plot`.
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local read_file = files.read

-- Run `ddplua <args>`; returns (exit status was 0, output).
local function run(args)
  local status, out = files.run(exe .. " " .. args)
  return status == 0, out
end

describe("train.lua", function()
  local dir
  before_each(function() dir = files.tmpdir("train") end)
  after_each(function() files.remove(dir) end)

  it("brings the loss of the MLP under a bound within a few hundred steps", function()
    -- 6400 samples, batch 64: 100 steps per epoch, 2 epochs
    local ok, out = run(("train.lua --config configs/fashion_mnist_mlp.lua --subset 6400 --test-subset 2000 " ..
      "--epochs 2 --threads 1 --quiet --out %s/mlp"):format(dir))
    assert.is_true(ok, out)
    local loss = tonumber(out:match("epoch 2/2 train loss ([%d%.]+)"))
    local acc = tonumber(out:match("final test accuracy ([%d%.]+)"))
    assert.is_truthy(loss, out)
    assert.is_true(loss < 0.6, "train loss " .. loss)
    assert.is_true(acc > 0.75, "test accuracy " .. acc)
    local csv = read_file(dir .. "/mlp/metrics.csv")
    assert.matches("^epoch,step,lr,train_loss,train_acc,test_loss,test_acc", csv)
    assert.matches("\n2,200,", csv)
  end)

  it("--profile-trace DIR records steps 3-5 as a Chrome trace and prints key_averages", function()
    local ok, out = run(("train.lua --config configs/fashion_mnist_mlp.lua --subset 640 --test-subset 100 " ..
      "--epochs 1 --threads 1 --quiet --out %s/run --profile-trace %s/trace"):format(dir, dir))
    assert.is_true(ok, out)
    assert.matches("profile: steps 3%-5 of every rank in", out)
    assert.matches("Name%s+Self CPU %%", out)
    local events, meta = require("ddplua.profiler").read_chrome_trace(dir .. "/trace/rank0.5.pt.trace.json")
    assert.equal(0, meta.rank)
    local steps, linear = {}, 0
    for _, e in ipairs(events) do
      if e.cat == "step" then steps[#steps + 1] = e.name end
      if e.name == "linear" then linear = linear + 1 end
    end
    table.sort(steps)
    assert.same({ "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4" }, steps)
    assert.is_true(linear >= 3, "the MLP's linear ops are in the trace")
  end)

  it("gives bitwise identical weights for the same seed and different ones for another", function()
    local common = "train.lua --subset 640 --test-subset 200 --epochs 1 --threads 1 --quiet "
    assert.is_true((run(common .. "--seed 5 --out " .. dir .. "/a")))
    assert.is_true((run(common .. "--seed 5 --out " .. dir .. "/b")))
    assert.is_true((run(common .. "--seed 6 --out " .. dir .. "/c")))
    local a = read_file(dir .. "/a/model.safetensors")
    assert.is_true(a == read_file(dir .. "/b/model.safetensors"), "same seed, different weights")
    assert.is_true(a ~= read_file(dir .. "/c/model.safetensors"), "different seeds, same weights")
  end)

  it("resumes from a checkpoint to the same weights as an uninterrupted run", function()
    local common = "train.lua --subset 640 --test-subset 200 --threads 1 --quiet "
    assert.is_true((run(common .. "--epochs 2 --out " .. dir .. "/full")))
    assert.is_true((run(common .. "--epochs 2 --stop-after 1 --out " .. dir .. "/part")))
    local ok, out = run(common .. "--epochs 2 --out " .. dir .. "/part --resume " .. dir .. "/part/checkpoint.safetensors")
    assert.is_true(ok, out)
    assert.matches("resumed from .* after epoch 1", out)
    assert.is_true(read_file(dir .. "/full/model.safetensors") == read_file(dir .. "/part/model.safetensors"),
      "the resumed run's model differs from the uninterrupted run's")
    assert.equal(read_file(dir .. "/full/metrics.csv"):match("\n2,[^\n]*"):match("^\n2,%d+,[^,]+,([^,]+)"),
      read_file(dir .. "/part/metrics.csv"):match("\n2,[^\n]*"):match("^\n2,%d+,[^,]+,([^,]+)"))
  end)

  it("trains under the launcher with identical replicas that match one process #dist", function()
    local common = "train.lua --subset 640 --test-subset 200 --epochs 2 --quiet "
    assert.is_true((run(common .. "--threads 1 --out " .. dir .. "/one")))
    local ok, out = run("--nproc_per_node=2 --standalone " .. common .. "--save-all-ranks --out " .. dir .. "/two")
    assert.is_true(ok, out)
    assert.matches("%[rank 0%]: training .* batch 64 %(32 per process%)", out)
    assert.not_matches("%[rank 1%]: epoch", out) -- only rank 0 logs
    -- the ranks' replicas are bitwise identical (ddplua verify exits 0) ...
    ok, out = run(("verify %s/two/model_rank0.safetensors %s/two/model_rank1.safetensors"):format(dir, dir))
    assert.is_true(ok, out)
    assert.matches("8 tensors identical across 2 files", out)
    -- ... and follow the single-process run over the same global batches (sums in another order)
    ok, out = run(("verify --atol 1e-5 %s/one/model.safetensors %s/two/model_rank0.safetensors"):format(dir, dir))
    assert.is_true(ok, out)
  end)

  it("rejects unknown options and bad values with a message", function()
    local ok, out = run("train.lua --bogus 1")
    assert.is_false(ok)
    assert.matches("unknown option '%-%-bogus'", out)
    ok, out = run("train.lua --epochs many")
    assert.is_false(ok)
    assert.matches("%-%-epochs expects a number", out)
    ok, out = run("train.lua --resume " .. dir .. "/missing.safetensors --subset 64 --epochs 1 --quiet --out " .. dir .. "/r")
    assert.is_false(ok)
    assert.matches("missing.safetensors", out)
  end)

  it("plots a run's curves with gnuplot, or says why not", function()
    assert.is_true((run("train.lua --subset 320 --test-subset 100 --epochs 2 --threads 1 --quiet --out " .. dir .. "/p")))
    local ok, out = run("plot " .. dir .. "/p")
    if os.execute("command -v gnuplot >/dev/null 2>&1") == 0 then
      assert.is_true(ok, out)
      local png = read_file(dir .. "/p/curves.png")
      assert.equal("\137PNG", png:sub(1, 4))
    else
      assert.is_false(ok)
      assert.matches("gnuplot is not installed", out)
    end
    ok, out = run("plot " .. dir .. "/nothing")
    assert.is_false(ok)
    assert.matches("cannot open", out)
  end)
end)
