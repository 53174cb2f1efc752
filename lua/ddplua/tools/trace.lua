--- ddplua.tools.trace: `ddplua trace merge|summary|plot`, the command-line side of the
-- profiler (ddplua.profiler) for the Chrome traces it exports.
--
--   ddplua trace merge DIR [-o OUT]     join every rank's trace in DIR into one timeline
--                                       (default OUT: DIR/merged.pt.trace.json)
--   ddplua trace summary FILE [--sort KEY] [--rows N]
--                                       the key_averages table of FILE (every rank of a
--                                       merged file together) and each step's coverage
--   ddplua trace plot FILE OUT.png      per-rank timeline: compute / communication / data
--                                       loading, idle left blank (gnuplot)
--
-- merge reads the *.json files of DIR written by export_chrome_trace (or
-- tensorboard_trace_handler), each naming its rank and its clock's offset to rank 0's in
-- its "ddplua" metadata, adds the offset to every timestamp (Note [trace clock alignment]
-- in lua/ddplua/profiler.lua) and writes one trace with one process per rank (pid = rank).
-- The merged metadata lists the ranks, offsets and error bounds. Exit status 0, or 1 with
-- a message naming the file at fault.
local profiler = require "ddplua.profiler"

local M = {}

local USAGE = [[usage: ddplua trace merge DIR [-o OUT]
       ddplua trace summary FILE [--sort self_cpu_time_total|cpu_time_total|cpu_time|count] [--rows N]
       ddplua trace plot FILE OUT.png]]

local function fail(msg)
  io.stderr:write("ddplua trace: ", msg, "\n")
  return 1
end

local function quote(s) return "'" .. s:gsub("'", [['\'']]) .. "'" end

-- The *.json files of dir (sorted), or nil and a message.
local function json_files(dir)
  local p = io.popen("ls -1 " .. quote(dir) .. " 2>/dev/null")
  local names = {}
  for line in p:lines() do
    if line:match("%.json$") then names[#names + 1] = dir .. "/" .. line end
  end
  local ok = p:close()
  if not ok then return nil, "cannot list " .. dir .. " (no such folder?)" end
  table.sort(names)
  return names
end

--- trace.merge(dir, out) -> out path, the list of ranks merged; raises naming the file at
-- fault (not a trace, no rank in its metadata). Files written by an earlier merge are
-- skipped.
function M.merge(dir, out)
  out = out or (dir .. "/merged.pt.trace.json")
  local files, err = json_files(dir)
  if not files then error(err, 0) end
  local events, ranks, offsets, errors, world = {}, {}, {}, {}, nil
  for _, path in ipairs(files) do
    if path ~= out then
      local evs, meta = profiler.read_chrome_trace(path)
      if not meta.merged then
        if type(meta.rank) ~= "number" then
          error(path .. ": no ddplua.rank in its metadata (not exported by ddplua.profiler)", 0)
        end
        local shift = meta.clock_offset_ns or 0
        for _, e in ipairs(evs) do
          e.ts = e.ts + shift
          e.pid = meta.rank
          events[#events + 1] = e
        end
        if not offsets[meta.rank + 1] then ranks[#ranks + 1] = meta.rank end
        offsets[meta.rank + 1] = shift
        errors[meta.rank + 1] = meta.clock_error_ns or 0
        world = math.max(world or 0, meta.world_size or 1)
      end
    end
  end
  if #ranks == 0 then error("no rank's trace in " .. dir .. " (*.json from export_chrome_trace)", 0) end
  table.sort(ranks)
  table.sort(events, function(a, b)
    if a.ts ~= b.ts then return a.ts < b.ts end
    return a.dur > b.dur
  end)
  local off_list, err_list = {}, {}
  for i, r in ipairs(ranks) do off_list[i] = offsets[r + 1]; err_list[i] = errors[r + 1] end
  profiler.write_chrome_trace(out, events, {
    merged = true, ranks = ranks, world_size = world, clock_offsets_ns = off_list,
    clock_errors_ns = err_list, aligned = true,
  })
  return out, ranks, world
end

local function summary(path, sort_by, rows)
  local events, meta = profiler.read_chrome_trace(path)
  io.write(profiler.key_averages(events):table { sort_by = sort_by, row_limit = rows })
  local cov = profiler.step_coverage(events)
  if #cov > 0 then
    io.write("\nStep coverage (share of each ProfilerStep's wall time inside op, autograd,\n"
      .. "collective, bucket, loader, optimizer or memory events, all threads of the rank):\n")
    table.sort(cov, function(a, b) if a.pid ~= b.pid then return a.pid < b.pid end return a.ts < b.ts end)
    for _, c in ipairs(cov) do
      io.write(("  rank %d  %-18s %10.3f ms  %6.1f%%\n"):format(c.pid, c.step, c.dur / 1e6, 100 * c.fraction))
    end
  end
  if meta.dropped and meta.dropped > 0 then
    io.write(("\n%d events were dropped (full buffers: raise events_per_thread)\n"):format(meta.dropped))
  end
  return 0
end

-- Lanes of the timeline: which categories draw where.
local LANES = {
  { name = "compute", cats = { op = true, autograd = true, optimizer = true, memory = true }, color = "#4e79a7" },
  { name = "communication", cats = { collective = true, bucket = true }, color = "#e15759" },
  { name = "data", cats = { loader = true }, color = "#59a14f" },
}

--- trace.plot(path, out): draw the timeline PNG of trace `path` (one rank or merged) with
-- gnuplot: for each rank three lanes (compute: op, autograd, optimizer, memory; communication:
-- collectives and DDP buckets; data: loader waits), time in ms from the first event, the
-- ProfilerStep boundaries as dashed lines; blank is idle. Raises when gnuplot is missing
-- or fails.
function M.plot(path, out)
  if os.execute("command -v gnuplot >/dev/null 2>&1") ~= 0 then
    error("gnuplot is not installed (apt-get install gnuplot-nox, or `make deps`)", 0)
  end
  local events = profiler.read_chrome_trace(path)
  if #events == 0 then error(path .. " has no events to plot", 0) end
  local t0 = math.huge
  local pids, seen = {}, {}
  for _, e in ipairs(events) do
    t0 = math.min(t0, e.ts)
    if not seen[e.pid] then seen[e.pid] = true; pids[#pids + 1] = e.pid end
  end
  table.sort(pids)
  local row_of = {}
  for i, pid in ipairs(pids) do row_of[pid] = (i - 1) * (#LANES + 1) end
  local data = os.tmpname()
  local f = assert(io.open(data, "w"))
  local tics, steps = {}, {}
  for li, lane in ipairs(LANES) do
    f:write("# ", lane.name, "\n")
    for _, e in ipairs(events) do
      if lane.cats[e.cat] and e.dur > 0 then
        local y = row_of[e.pid] + (#LANES - li + 1)
        f:write(("%.6f %.6f %d\n"):format((e.ts - t0) / 1e6, (e.ts + e.dur - t0) / 1e6, y))
      end
    end
    f:write("\n\n")
    for _, pid in ipairs(pids) do
      tics[#tics + 1] = ('"rank %d %s" %d'):format(pid, lane.name, row_of[pid] + (#LANES - li + 1))
    end
  end
  f:close()
  for _, e in ipairs(events) do
    if e.cat == "step" then steps[#steps + 1] = (e.ts - t0) / 1e6 end
  end
  local lines = {
    ("set terminal pngcairo size 1400,%d noenhanced"):format(120 + 90 * #pids),
    ("set output %s"):format(quote(out)),
    "set xlabel 'time (ms)'",
    ("set ytics (%s)"):format(table.concat(tics, ", ")),
    ("set yrange [0:%d]"):format(#pids * (#LANES + 1)),
    "set grid xtics",
    "set title " .. quote("ddplua trace: " .. path:match("[^/]*$") .. " (blank: idle)"),
    "set style fill solid 1.0 noborder",
    "set key outside top center horizontal",
  }
  for _, x in ipairs(steps) do
    lines[#lines + 1] = ("set arrow from %.6f, graph 0 to %.6f, graph 1 nohead dt 2 lc rgb '#888888'"):format(x, x)
  end
  local plots = {}
  for li, lane in ipairs(LANES) do
    plots[#plots + 1] = ("%s index %d using (($1+$2)/2):3:(($2-$1)/2):(0.4) with boxxyerror lc rgb '%s' title '%s'")
      :format(li == 1 and quote(data) or "''", li - 1, lane.color, lane.name)
  end
  lines[#lines + 1] = "plot " .. table.concat(plots, ", ")
  local p = io.popen("gnuplot 2>&1", "w")
  p:write(table.concat(lines, "\n"), "\n")
  local ok = p:close()
  os.remove(data)
  if not ok then error("gnuplot failed drawing " .. path, 0) end
  return out
end

--- main(args) -> exit status (0, or 1 with a message on stderr).
function M.main(args)
  local cmd = args[1]
  if cmd == nil or cmd == "--help" or cmd == "-h" then
    print(USAGE)
    return cmd and 0 or 1
  end
  local ok, res = pcall(function()
    if cmd == "merge" then
      local dir, out = nil, nil
      local i = 2
      while i <= #args do
        if args[i] == "-o" or args[i] == "--out" then out = args[i + 1]; i = i + 1
        else dir = args[i] end
        i = i + 1
      end
      if not dir then return fail(USAGE) end
      local path, ranks, world = M.merge(dir, out)
      print(("wrote %s (ranks %s)"):format(path, table.concat(ranks, ", ")))
      if world and #ranks < world then
        io.stderr:write(("ddplua trace: warning: %d of %d ranks found in %s\n"):format(#ranks, world, dir))
      end
      return 0
    elseif cmd == "summary" then
      local file, sort_by, rows
      local i = 2
      while i <= #args do
        if args[i] == "--sort" then sort_by = args[i + 1]; i = i + 1
        elseif args[i] == "--rows" then rows = tonumber(args[i + 1]); i = i + 1
        else file = args[i] end
        i = i + 1
      end
      if not file then return fail(USAGE) end
      return summary(file, sort_by, rows)
    elseif cmd == "plot" then
      if not args[2] or not args[3] then return fail(USAGE) end
      print("wrote " .. M.plot(args[2], args[3]))
      return 0
    end
    return fail("unknown command " .. tostring(cmd) .. "\n" .. USAGE)
  end)
  if not ok then return fail(tostring(res)) end
  return res
end

return M
