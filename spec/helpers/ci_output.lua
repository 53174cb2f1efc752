-- spec/helpers/ci_output.lua: busted output handler for CI. Prints what busted's plain
-- terminal handler prints, then one last line CI reads: "N passed, N failed, N skipped",
-- counted from the run (errors count as failures; pending specs as skipped).
return function(options)
  local busted = require "busted"
  local plain = require "busted.outputHandlers.utfTerminal"(options)
  local passed, failed, skipped = 0, 0, 0

  busted.subscribe({ "test", "end" }, function(element, parent, status)
    if status == "success" then passed = passed + 1
    elseif status == "pending" then skipped = skipped + 1
    else failed = failed + 1 end
    return nil, true
  end)
  -- errors outside a test (a spec file that fails to load, a failing setup)
  busted.subscribe({ "error", "file" }, function() failed = failed + 1; return nil, true end)
  busted.subscribe({ "error", "describe" }, function() failed = failed + 1; return nil, true end)

  busted.subscribe({ "suite", "end" }, function()
    io.write(("\n%d passed, %d failed, %d skipped\n"):format(passed, failed, skipped))
    io.flush()
    return nil, true
  end, { priority = 1 })

  return plain
end
