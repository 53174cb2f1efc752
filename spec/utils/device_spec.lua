-- Specs for ddplua.utils.device on machines as they come (its CUDA paths run on the
-- simulated device in spec/cuda/train_device_spec.lua, through train.lua): cpu, bad names,
-- and the launcher's LOCAL_RANK.
local device = require "ddplua.utils.device"
local dl = require "ddplua"

describe("ddplua.utils.device", function()
  it("chooses the cpu when asked, or when CUDA is missing", function()
    assert.are.equal("cpu", device.choose("cpu"))
    if not dl.cuda.is_available() then assert.are.equal("cpu", device.choose(nil)) end
  end)

  it("rejects malformed names, naming the program", function()
    local ok, err = pcall(device.choose, "tpu", { prog = "x.lua" })
    assert.is_false(ok)
    assert.are.equal("x.lua: --device must be cpu, cuda or cuda:K, got 'tpu'", err)
  end)

  it("reads LOCAL_RANK only under a launcher (WORLD_SIZE > 1)", function()
    local ws = tonumber(os.getenv("WORLD_SIZE") or "1")
    if ws > 1 then return end -- the specs themselves run under a launcher
    assert.is_nil(device.launcher_local_rank())
  end)
end)
