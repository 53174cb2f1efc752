-- Specs for ddplua.autograd.engine's queue_callback and is_running (PyTorch's
-- Variable._execution_engine.queue_callback): what FSDP's end-of-backward relies on.
local dl = require "ddplua"
-- The engine the tensor methods run: busted loads the modules afresh for each spec file
-- while the tensor metatype (ffi.metatype, once per process) keeps the methods of the first
-- load, so a plain require here may give another instance of the engine than backward uses.
local function engine_of_backward()
  local backward = dl.tensor({ 1 }).backward
  for i = 1, 50 do
    local name, v = debug.getupvalue(backward, i)
    if name == nil then break end
    if name == "engine" then return v end
  end
  return require "ddplua.autograd.engine"
end
local engine = engine_of_backward()

describe("autograd engine queue_callback", function()
  it("runs a callback queued from a hook once, after every hook of the outermost walk", function()
    local events = {}
    local a = dl.tensor({ 1, 2 }, { requires_grad = true })
    local b = dl.tensor({ 3, 4 }, { requires_grad = true })
    local y = (a * 2):sum() + (b * 3):sum()
    a:register_post_accumulate_grad_hook(function()
      events[#events + 1] = "a"
      assert.is_true(engine.is_running())
      engine.queue_callback(function()
        events[#events + 1] = "done"
        engine.queue_callback(function() events[#events + 1] = "more" end) -- one queued by one
      end)
    end)
    b:register_post_accumulate_grad_hook(function() events[#events + 1] = "b" end)
    y:backward()
    assert.same({ "a", "b" }, { events[1] < events[2] and events[1] or events[2], events[1] < events[2] and events[2] or events[1] })
    assert.equal("done", events[3])
    assert.equal("more", events[4])
    assert.equal(4, #events)
    assert.is_false(engine.is_running())
    -- nothing left over for the next backward: a's hook queues anew, each runs once
    local z = (a * 1):sum()
    z:backward()
    assert.same({ "a", "done", "more" }, { events[5], events[6], events[7] })
    assert.equal(7, #events)
  end)

  it("raises outside a backward, and drops the queue when the walk fails", function()
    local ok, err = pcall(engine.queue_callback, function() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("queue_callback: no backward is running", 1, true))
    local ran = false
    local a = dl.tensor({ 1, 2 }, { requires_grad = true })
    local y = (a * 2):sum()
    y:register_hook(function()
      engine.queue_callback(function() ran = true end)
      error("hook failed")
    end)
    ok = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.is_false(ran)
    local z = (a * 3):sum()
    z:backward()
    assert.is_false(ran)
  end)
end)
