-- Specs for train.lua --device on the simulated device (build/libddplua_cuda_sim.so, run in
-- a child `ddplua` with DDPLUA_CUDA_PLUGIN set): a few steps with --device cuda give the
-- same losses and weights as --device cpu (the simulated device runs the CPU kernels, so
-- any difference is a front-end mistake: a batch, the model or the loss left behind or
-- moved wrongly), the device is chosen as documented, and LOCAL_RANK without a device is
-- an error naming both numbers.
require "ddplua" -- tensor methods (t:to) for the weight comparisons
local files = require "files"
local cuda = require "cuda"
local checkpoint = require "ddplua.checkpoint"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- Run `ddplua train.lua <args>` with the simulated device; returns (status, output).
local function train(args, env)
  return files.run(("env DDPLUA_CUDA_PLUGIN=%s DDPLUA_SIM_DEVICES=2 DDP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 %s %s train.lua %s")
    :format(files.quote(cuda.sim_plugin()), env or "", exe, args))
end

describe("train.lua --device on the simulated device", function()
  local dir
  before_each(function() dir = files.tmpdir("train-device") end)
  after_each(function() files.remove(dir) end)

  for _, config in ipairs { "fashion_mnist_mlp", "fashion_mnist_cnn" } do
    it("gives the same losses and weights with --device cuda as with --device cpu (" .. config .. ")", function()
      local common = ("--config configs/%s.lua --subset 192 --test-subset 64 --epochs 1 --threads 1 --quiet --seed 3 ")
        :format(config)
      local st_cpu, out_cpu = train(common .. "--device cpu --out " .. dir .. "/cpu")
      assert.are.equal(0, st_cpu, out_cpu)
      assert.matches("device cpu", out_cpu)
      local st_dev, out_dev = train(common .. "--device cuda --out " .. dir .. "/cuda")
      assert.are.equal(0, st_dev, out_dev)
      assert.matches("device cuda:0", out_dev)
      local pattern = "epoch 1/1 train loss ([%d%.]+) acc ([%d%.]+) | test loss ([%d%.]+) acc ([%d%.]+)"
      local a = { out_cpu:match(pattern) }
      local b = { out_dev:match(pattern) }
      assert.are.equal(4, #a, out_cpu)
      assert.are.equal(4, #b, out_dev)
      for i = 1, 4 do
        assert.is_true(math.abs(tonumber(a[i]) - tonumber(b[i])) <= 2e-4,
          ("value %d: cpu %s, cuda %s"):format(i, a[i], b[i]))
      end
      -- the saved model: host copies of the device weights, equal to the CPU run's
      local wa = checkpoint.load(dir .. "/cpu/model.safetensors")
      local wb = checkpoint.load(dir .. "/cuda/model.safetensors")
      for name, t in pairs(wa) do
        assert.is_truthy(wb[name], name)
        local d = (t:to("f64") - wb[name]:to("f64")):abs():max():item()
        assert.is_true(d <= 1e-5, name .. " differs by " .. d)
      end
    end)
  end

  it("defaults to cuda when CUDA is available and resumes a device run", function()
    local common = "--config configs/fashion_mnist_mlp.lua --subset 128 --test-subset 64 --threads 1 --quiet "
    local st, out = train(common .. "--epochs 2 --stop-after 1 --out " .. dir .. "/r")
    assert.are.equal(0, st, out)
    assert.matches("device cuda:0", out)
    st, out = train(common .. "--epochs 2 --device cuda:1 --out " .. dir .. "/r --resume " .. dir .. "/r/checkpoint.safetensors")
    assert.are.equal(0, st, out)
    assert.matches("device cuda:1", out)
    assert.matches("resumed from", out)
  end)

  it("refuses a LOCAL_RANK without a device, naming both numbers, and bad --device values", function()
    local st, out = train("--subset 64 --epochs 1 --device cuda", "WORLD_SIZE=3 RANK=2 LOCAL_RANK=2")
    assert.are_not.equal(0, st)
    assert.matches("LOCAL_RANK 2 has no GPU: this host has 2 CUDA devices", out)
    st, out = train("--subset 64 --epochs 1 --device tpu")
    assert.are_not.equal(0, st)
    assert.matches("%-%-device must be cpu, cuda or cuda:K, got 'tpu'", out)
    st, out = train("--subset 64 --epochs 1 --device cuda:4")
    assert.are_not.equal(0, st)
    assert.matches("%-%-device cuda:4 does not exist: 2 CUDA devices", out)
    st, out = files.run(("env DDPLUA_CUDA_PLUGIN=/nonexistent/plugin.so %s train.lua --subset 64 --epochs 1 --device cuda")
      :format(exe))
    assert.are_not.equal(0, st)
    assert.matches("CUDA is not available", out)
  end)
end)
