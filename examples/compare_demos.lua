--- examples/compare_demos.lua: the comparison step of the multi-GPU demos (seed
-- multigpu-demos.txt, "Performance comparisons"): reads the rows the demos wrote with
-- --results and prints the seed's table (method, epoch time, batch time), with the number
-- of processes and devices, the test accuracy, and each batch time relative to the
-- "single" row (multigpu_demo_v1.lua --single) when there is one.
--
--   ddplua examples/multigpu_demo_v1.lua --single --results runs/demos/single.csv
--   ddplua examples/multigpu_demo_v1.lua --results runs/demos/v1.csv
--   ddplua --nproc_per_node=2 examples/multigpu_demo_v2.lua --results runs/demos/v2.csv
--   (three processes of examples/multigpu_demo_v3.lua ... --results runs/demos/v3.csv)
--   ddplua examples/compare_demos.lua runs/demos/single.csv runs/demos/v1.csv runs/demos/v2.csv runs/demos/v3.csv
--
-- Each file is a CSV with a header line naming at least method, processes, devices,
-- batch_size, steps, epoch_time_s, batch_time_s, test_accuracy and test_samples, and one row
-- or more. Rows are shown in the seed's order (single, v1, v2, v3, then any other). Exits 1
-- naming the file and what is missing when a file cannot be read or lacks a column.
local USAGE = "usage: ddplua examples/compare_demos.lua RESULTS.csv [RESULTS.csv ...]\n" ..
  "  prints the demos' timing and accuracy table from the --results files of\n" ..
  "  multigpu_demo_v1.lua (and --single), multigpu_demo_v2.lua and multigpu_demo_v3.lua\n"

local NEEDED = { "method", "processes", "devices", "batch_size", "steps", "epoch_time_s", "batch_time_s",
  "test_accuracy", "test_samples" }
local ORDER = { single = 1, v1 = 2, v2 = 3, v3 = 4 }
local LABEL = { single = "single", v1 = "v1 (DataParallel)", v2 = "v2 (one node, launched)",
  v3 = "v3 (file://, --rank/--world_size)" }

local function fail(msg)
  io.stderr:write("compare_demos.lua: ", msg, "\n")
  os.exit(1)
end

local function split(line)
  local cells = {}
  for c in (line .. ","):gmatch("([^,]*),") do cells[#cells + 1] = c end
  return cells
end

-- The rows of one results file, each a table keyed by column name (numbers converted).
local function read_rows(path)
  local f, err = io.open(path, "r")
  if not f then fail("cannot open " .. path .. ": " .. tostring(err)) end
  local header = f:read("*l")
  if not header then fail(path .. " is empty") end
  local columns = split(header)
  local index = {}
  for i, c in ipairs(columns) do index[c] = i end
  for _, c in ipairs(NEEDED) do
    if not index[c] then fail(path .. " lacks the column '" .. c .. "' (written by the demos' --results)") end
  end
  local rows = {}
  for line in f:lines() do
    if line ~= "" then
      local cells, row = split(line), {}
      if #cells ~= #columns then fail(("%s: a row has %d cells, the header %d"):format(path, #cells, #columns)) end
      for i, c in ipairs(columns) do row[c] = tonumber(cells[i]) or cells[i] end
      rows[#rows + 1] = row
    end
  end
  f:close()
  if #rows == 0 then fail(path .. " has no rows") end
  return rows
end

-- Seconds as the seed writes an epoch time, m:ss (with hundredths: short runs).
local function minutes(s) return ("%d:%05.2f"):format(math.floor(s / 60), s % 60) end

if #arg == 0 then fail("no results files\n" .. USAGE) end
if arg[1] == "--help" or arg[1] == "-h" then
  io.write(USAGE)
  os.exit(0)
end
local rows = {}
for _, path in ipairs(arg) do
  for _, row in ipairs(read_rows(path)) do rows[#rows + 1] = row end
end
for i, r in ipairs(rows) do r.seq = i end
table.sort(rows, function(a, b)
  local oa, ob = ORDER[a.method] or 99, ORDER[b.method] or 99
  if oa ~= ob then return oa < ob end
  return a.seq < b.seq
end)
local base
for _, r in ipairs(rows) do if r.method == "single" then base = base or r end end

print("| method | processes | devices | batch | steps | epoch time | batch time | vs single | test accuracy |")
print("|--------|-----------|---------|-------|-------|------------|------------|-----------|---------------|")
for _, r in ipairs(rows) do
  print(("| %s | %d | %d | %d | %d | %s | %.4fs | %s | %.4f (%d samples) |"):format(
    LABEL[r.method] or tostring(r.method), r.processes, r.devices, r.batch_size, r.steps, minutes(r.epoch_time_s),
    r.batch_time_s, base and ("%.2fx"):format(r.batch_time_s / base.batch_time_s) or "-", r.test_accuracy,
    r.test_samples))
end
