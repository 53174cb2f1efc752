-- Specs for ddplua.utils.metrics_file: header, formatted rows, appending on resume, no
-- temporary file left behind, and a missing column.
local MetricsFile = require "ddplua.utils.metrics_file"
local files = require "files"

local COLUMNS = { { "epoch", "%d" }, { "lr", "%.6g" }, { "loss", "%.3f" } }

describe("ddplua.utils.metrics_file", function()
  local dir
  before_each(function() dir = files.tmpdir("metrics") end)
  after_each(function() files.remove(dir) end)

  it("writes the header and one formatted row per write, whole on disk after each", function()
    local path = dir .. "/m.csv"
    local m = MetricsFile.open(path, COLUMNS)
    assert.are.equal("epoch,lr,loss\n", files.read(path))
    m:write { epoch = 1, lr = 0.05, loss = 0.61234 }
    assert.are.equal("epoch,lr,loss\n1,0.05,0.612\n", files.read(path))
    m:write { epoch = 2, lr = 1e-4, loss = 0.5 }
    m:close()
    assert.are.equal("epoch,lr,loss\n1,0.05,0.612\n2,0.0001,0.500\n", files.read(path))
    assert.is_nil(io.open(path .. ".tmp"))
  end)

  it("keeps earlier rows when appending, and starts afresh otherwise", function()
    local path = dir .. "/m.csv"
    MetricsFile.open(path, COLUMNS):write { epoch = 1, lr = 1, loss = 1 }
    MetricsFile.open(path, COLUMNS, { append = true }):write { epoch = 2, lr = 1, loss = 1 }
    assert.are.equal("epoch,lr,loss\n1,1,1.000\n2,1,1.000\n", files.read(path))
    MetricsFile.open(path, COLUMNS)
    assert.are.equal("epoch,lr,loss\n", files.read(path))
    MetricsFile.open(dir .. "/new.csv", COLUMNS, { append = true })
    assert.are.equal("epoch,lr,loss\n", files.read(dir .. "/new.csv"))
  end)

  it("raises naming a missing column or an unwritable folder", function()
    local m = MetricsFile.open(dir .. "/m.csv", COLUMNS)
    assert.has_error(function() m:write { epoch = 1, lr = 1 } end, "metrics_file: no value for column 'loss'")
    local ok, err = pcall(MetricsFile.open, dir .. "/no/such/m.csv", COLUMNS)
    assert.is_false(ok)
    assert.matches("metrics_file: cannot write .*no/such/m.csv.tmp", err)
  end)
end)
