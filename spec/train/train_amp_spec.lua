-- Specs for train.lua's mixed precision (--amp / the config's amp field, through
-- ddplua.utils.mixed_precision): bf16 autocast trains, f16 adds a GradScaler whose state
-- goes into the checkpoint and comes back on --resume; a bad value is refused.
local files = require "files"
local checkpoint = require "ddplua.checkpoint"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local function run(args)
  local status, out = files.run(exe .. " " .. args)
  return status == 0, out
end

describe("train.lua --amp", function()
  local dir
  before_each(function() dir = files.tmpdir("train_amp") end)
  after_each(function() files.remove(dir) end)
  local common = "train.lua --subset 320 --test-subset 100 --quiet --threads 1 "

  it("trains with bf16 autocast; the checkpoint has no scaler", function()
    local ok, out = run(common .. "--epochs 1 --amp bf16 --out " .. dir .. "/b")
    assert.is_true(ok, out)
    local loss = tonumber(out:match("epoch 1/1 train loss ([%d.]+)"))
    assert.is_true(loss ~= nil and loss < 2.3, out) -- below log(10): it learns
    local _, meta = checkpoint.load(dir .. "/b/checkpoint.safetensors")
    assert.is_nil(meta.scaler)
  end)

  it("f16 saves the GradScaler's state and --resume restores it", function()
    local ok, out = run(common .. "--epochs 2 --stop-after 1 --amp f16 --out " .. dir .. "/h")
    assert.is_true(ok, out)
    local _, meta = checkpoint.load(dir .. "/h/checkpoint.safetensors")
    assert.is_table(meta.scaler)
    local saved = {}
    for _, kv in ipairs(meta.scaler["$k"]) do saved[kv[1]] = kv[2] end
    assert.equal(2000, saved.growth_interval)
    assert.is_true(saved.scale > 0 and saved.scale <= 65536)
    assert.equal(5, saved._growth_tracker + 0) -- 5 steps of 64 without overflow
    ok, out = run(common .. "--epochs 2 --amp f16 --resume " .. dir .. "/h/checkpoint.safetensors --out " .. dir .. "/h")
    assert.is_true(ok, out)
    assert.matches("resumed from .* after epoch 1", out)
    _, meta = checkpoint.load(dir .. "/h/checkpoint.safetensors")
    for _, kv in ipairs(meta.scaler["$k"]) do saved[kv[1]] = kv[2] end
    assert.equal(10, saved._growth_tracker) -- counted on from the restored 5
  end)

  it("refuses an unknown amp value", function()
    local ok, out = run(common .. "--epochs 1 --amp f8 --out " .. dir .. "/x")
    assert.is_false(ok)
    assert.matches("train.lua: amp must be bf16, f16 or f32, got f8", out, 1, true)
  end)
end)
