--- ddplua.tools.plot: `ddplua plot runs/<name> [--out FILE]` draws the loss and accuracy
-- curves of a training run (its metrics.csv, one row per epoch, written by train.lua) to a
-- PNG with gnuplot (Debian package gnuplot-nox). Default output: runs/<name>/curves.png.
local M = {}

local function fail(msg)
  io.stderr:write("ddplua plot: ", msg, "\n")
  return 1
end

--- Read metrics.csv into {columns = {...}, rows = {{...}, ...}}; nil and a message on error.
function M.read_metrics(path)
  local f, err = io.open(path, "r")
  if not f then return nil, "cannot open " .. path .. ": " .. tostring(err) end
  local header = f:read("*l")
  if not header then f:close(); return nil, path .. " is empty" end
  local columns = {}
  for c in header:gmatch("[^,]+") do columns[#columns + 1] = c end
  local rows = {}
  for line in f:lines() do
    local row = {}
    for v in line:gmatch("[^,]+") do row[#row + 1] = tonumber(v) end
    if #row == #columns then rows[#rows + 1] = row end
  end
  f:close()
  if #rows == 0 then return nil, path .. " has no complete rows" end
  return { columns = columns, rows = rows }
end

--- main(args) -> exit status.
function M.main(args)
  local run, out
  local i = 1
  while i <= #args do
    if args[i] == "--out" then out = args[i + 1]; i = i + 1
    elseif args[i] == "--help" or args[i] == "-h" then
      print("usage: ddplua plot runs/<name> [--out FILE.png]")
      return 0
    else run = args[i] end
    i = i + 1
  end
  if not run then return fail("usage: ddplua plot runs/<name> [--out FILE.png]") end
  local csv = run .. "/metrics.csv"
  local m, err = M.read_metrics(csv)
  if not m then return fail(err) end
  out = out or (run .. "/curves.png")
  if os.execute("command -v gnuplot >/dev/null 2>&1") ~= 0 then
    return fail("gnuplot is not installed (apt-get install gnuplot-nox, or `make deps`)")
  end
  local col = {}
  for k, name in ipairs(m.columns) do col[name] = k end
  for _, need in ipairs { "epoch", "train_loss", "test_loss", "train_acc", "test_acc" } do
    if not col[need] then return fail(csv .. " lacks the column " .. need) end
  end
  local script = table.concat({
    "set terminal pngcairo size 1000,420 noenhanced",
    ("set output '%s'"):format(out:gsub("'", "")),
    "set datafile separator ','",
    "set key autotitle columnhead",
    "set multiplot layout 1,2 title '" .. run:gsub("'", "") .. "'",
    "set xlabel 'epoch'; set ylabel 'loss'; set grid",
    ("plot '%s' using %d:%d with linespoints title 'train', '' using %d:%d with linespoints title 'test'")
      :format(csv, col.epoch, col.train_loss, col.epoch, col.test_loss),
    "set ylabel 'accuracy'",
    ("plot '%s' using %d:%d with linespoints title 'train', '' using %d:%d with linespoints title 'test'")
      :format(csv, col.epoch, col.train_acc, col.epoch, col.test_acc),
    "unset multiplot",
  }, "\n")
  local p = io.popen("gnuplot 2>&1", "w")
  p:write(script, "\n")
  local ok = p:close()
  if not ok then return fail("gnuplot failed on " .. csv) end
  print("wrote " .. out)
  return 0
end

return M
