-- spec/helpers/ci_output.lua: busted output handler for CI. Prints what busted's plain
-- terminal handler prints, then one last line CI reads: "N passed, N failed, N skipped",
-- counted from the run (errors count as failures; pending specs as skipped).
-- tools/run_specs.sh runs several of these at once and prints the total.
--
-- Each failure and error is also written, one line each ("FAILED: <full name> (<file>:<line>):
-- <first line of the message>"), to the file $DDPLUA_SPEC_FAILURES when that is set: the runner
-- and .ci/run repeat them just above the last line, where a log cut to its tail still shows
-- which spec failed.
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
    local failures_path = os.getenv("DDPLUA_SPEC_FAILURES")
    if failures_path then
      local f = io.open(failures_path, "w")
      if f then
        for _, list in ipairs({ plain.failures or {}, plain.errors or {} }) do
          for _, e in ipairs(list) do
            local where = e.trace and e.trace.short_src
              and (" (%s:%s)"):format(e.trace.short_src, tostring(e.trace.currentline)) or ""
            local msg = tostring(e.message or ""):match("[^\n]*")
            f:write(("FAILED: %s%s: %s\n"):format(e.name or "?", where, msg))
          end
        end
        f:close()
      end
    end
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
