-- Specs for ddplua.utils.progress: the terminal bar and the plain log lines every 10%.
local Progress = require "ddplua.utils.progress"

-- Run fn with io.write, io.flush and print captured; returns the text written.
local function capture(fn)
  local out = {}
  local write, prnt, flush = io.write, print, io.flush
  io.write = function(...) for _, s in ipairs { ... } do out[#out + 1] = s end end
  _G.print = function(s) out[#out + 1] = s .. "\n" end
  io.flush = function() end
  local ok, err = pcall(fn)
  io.write, _G.print, io.flush = write, prnt, flush
  assert(ok, err)
  return table.concat(out)
end

describe("ddplua.utils.progress", function()
  it("redraws a bar in place on a terminal and ends its line on close", function()
    local text = capture(function()
      local bar = Progress.new { label = "epoch 1/3", total = 10, terminal = true }
      bar:update(3, 0.51234, 812.4)
      bar:close()
    end)
    assert.are.equal("\repoch 1/3 [=========                     ]  30% loss 0.5123    812 samples/s\n", text)
  end)

  it("writes a plain line every 10% elsewhere", function()
    local text = capture(function()
      local bar = Progress.new { label = "epoch 2/2", total = 20, terminal = false }
      for b = 1, 20 do bar:update(b, 1.0, 100) end
      bar:close()
    end)
    local lines = {}
    for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.is_true(#lines >= 9 and #lines <= 10, text)
    assert.are.equal("epoch 2/2  10% loss 1.0000 100 samples/s", lines[1])
    assert.are.equal("epoch 2/2 100% loss 1.0000 100 samples/s", lines[#lines])
  end)

  it("shows nothing when disabled", function()
    assert.are.equal("", capture(function()
      local bar = Progress.new { total = 5, terminal = true, enabled = false }
      bar:update(1, 1, 1)
      bar:close()
    end))
  end)
end)
