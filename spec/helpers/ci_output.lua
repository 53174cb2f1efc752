-- spec/helpers/ci_output.lua: busted output handler for CI. Prints what busted's plain
-- terminal handler prints, then one last line CI reads: "N passed, N failed, N skipped",
-- counted from the run (errors count as failures; pending specs as skipped).
-- tools/run_specs.sh runs two of these at once and prints the total.
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

  -- Under tools/run_specs.sh (two shards at once) the counts also go to the file
  -- $DDPLUA_SPEC_COUNTS, and the shard's own line is labelled so that only the total,
  -- printed last by the runner, reads as the suite's result.
  busted.subscribe({ "suite", "end" }, function()
    local shard, counts = os.getenv("DDPLUA_SPEC_SHARD"), os.getenv("DDPLUA_SPEC_COUNTS")
    local line = ("%d passed, %d failed, %d skipped"):format(passed, failed, skipped)
    io.write("\n", shard and ("spec shard " .. shard .. ": " .. line) or line, "\n")
    io.flush()
    if counts then
      local f = io.open(counts, "w")
      if f then
        f:write(("%d %d %d\n"):format(passed, failed, skipped))
        f:close()
      end
    end
    return nil, true
  end, { priority = 1 })

  return plain
end
