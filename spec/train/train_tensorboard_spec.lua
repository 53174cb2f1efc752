-- Specs for `train.lua --tensorboard DIR`: a 2-rank run leaves one event file (rank 0's)
-- whose per-step loss scalars equal the losses train.lua printed (--log-every 1), with the
-- learning rate, samples/s, gradient norm and communication time at every step and the
-- epoch's metrics.csv row; read by spec/fixtures/tfevents_read.py, which shares no code
-- with the writer.
local ffi = require "ffi"
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local function f32(x) return tonumber(ffi.new("float[1]", x)[0]) end

describe("train.lua --tensorboard", function()
  local dir
  before_each(function() dir = files.tmpdir("train-tb") end)
  after_each(function() files.remove(dir) end)

  it("logs per-step scalars on rank 0 equal to the losses printed #dist", function()
    local status, out = files.run(exe .. " --nproc_per_node=2 --standalone train.lua --config configs/fashion_mnist_mlp.lua " ..
      "--subset 256 --test-subset 64 --epochs 1 --quiet --threads 1 --log-every 1 " ..
      "--tensorboard " .. dir .. "/tb --out " .. dir .. "/out")
    assert.are.equal(0, status, out)
    local printed = {}
    for step, loss in out:gmatch("%[rank 0%]: step (%d+) loss (%S+)") do printed[tonumber(step)] = tonumber(loss) end
    assert.are.equal(4, #printed) -- 256 samples, global batch 64
    assert.not_matches("%[rank 1%]: step", out)

    local names = {}
    local p = io.popen("ls " .. files.quote(dir .. "/tb"))
    for name in p:lines() do names[#names + 1] = name end
    p:close()
    assert.are.equal(1, #names, table.concat(names, " ")) -- rank 1 wrote nothing
    assert.matches("^events%.out%.tfevents%.", names[1])
    local st, lua = files.run("/usr/bin/python3 spec/fixtures/tfevents_read.py " .. files.quote(dir .. "/tb/" .. names[1]))
    assert.are.equal(0, st, lua)
    local events = assert(loadstring(lua))()

    local by_tag = {}
    for _, ev in ipairs(events) do
      for _, v in ipairs(ev.values) do
        by_tag[v.tag] = by_tag[v.tag] or {}
        by_tag[v.tag][ev.step] = v.simple_value
      end
    end
    for step = 1, 4 do
      assert.are.equal(f32(printed[step]), by_tag["train/loss"][step], "step " .. step)
      assert.is_true(by_tag["train/lr"][step] > 0)
      assert.is_true(by_tag["train/samples_per_s"][step] > 0)
      assert.is_true(by_tag["train/grad_norm"][step] > 0)
      assert.is_true(by_tag["comm/exposed_seconds"][step] >= 0)
      assert.is_true(by_tag["comm/avg_backward_comm_seconds"][step] > 0)
    end
    local cfg = dofile("configs/fashion_mnist_mlp.lua")
    assert.are.equal(f32(cfg.optimizer.lr), by_tag["train/lr"][1]) -- the config's rate at step 1
    -- the epoch's scalars are the metrics.csv row (printed there to 6 decimals)
    local csv = files.read(dir .. "/out/metrics.csv")
    local header, row = csv:match("^([^\n]+)\n([^\n]+)")
    local cols, vals = {}, {}
    for c in header:gmatch("[^,]+") do cols[#cols + 1] = c end
    for v in row:gmatch("[^,]+") do vals[#vals + 1] = tonumber(v) end
    for i, c in ipairs(cols) do
      if c == "train_loss" or c == "test_loss" or c == "test_acc" or c == "train_acc" then
        assert.is_true(math.abs(by_tag["epoch/" .. c][4] - vals[i]) < 1e-6, c)
      end
    end
  end)
end)
